"""Names of every compiled graph and its inputs/outputs, shared by export, engines and runners."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GraphIO:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


LLM_STEP = GraphIO("llm_step", ("inputs_embeds", "past_key_values"), ("logits", "present_key_values"))
FLOW_ENCODER = GraphIO("flow_encoder", ("token", "embedding"), ("mu", "spks"))
FLOW_ESTIMATOR = GraphIO("flow_estimator", ("x", "mask", "mu", "t", "spks", "cond"), ("estimator_out",))
HIFT = GraphIO("hift", ("mel", "rand_ini", "noise"), ("magnitude", "phase"))

STAGE_GRAPHS: dict[str, tuple[GraphIO, ...]] = {
    "llm": (LLM_STEP,),
    "flow": (FLOW_ENCODER, FLOW_ESTIMATOR),
    "hift": (HIFT,),
}
