"""What each stage exports of CosyVoice-300M's networks: graph modules, numpy assets, runtime constants.

One function per stage (``FamilyInfo.parts``), called on the models this family's loader loaded. The
graphs have the same inputs and outputs as every family's (the stages' graph specs); what is the
first generation's own sits around them as numpy assets its runtimes read: the LM's text encoder
(run once per utterance, before the decode steps), its sos/task_id rows and speaker projection, and
the flow's length regulator and fixed start noise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

Parts = tuple[Mapping[str, Any], dict[str, np.ndarray], dict[str, Any]]


def llm_parts(models: Any) -> Parts:
    """The decode step (Transformer + head, KV cache), the text encoder's weights, the embedding tables."""
    from .lm import DecodeStep, step_info, text_encoder_info, text_encoder_weights

    lm, c = models.llm, models.config.lm
    text = text_encoder_weights(lm)
    # The base runtime reads the text table as ``text_embedding`` (one copy: it is the largest array).
    assets = {"text_embedding": text.pop("text_embedding.weight"), **text,
              "speech_embedding": lm.speech_embedding.weight.detach().float().numpy(),
              "llm_embedding": lm.llm_embedding.weight.detach().float().numpy(),
              **{f"spk_embed_affine_layer.{k}": v.detach().float().numpy()
                 for k, v in lm.spk_embed_affine_layer.state_dict().items()}}
    info = {**step_info(c), "speech_token_size": c.speech_token_size, **text_encoder_info(c)}
    return {"llm_step": DecodeStep(lm).eval()}, assets, info


def flow_parts(models: Any) -> Parts:
    """The token-rate encoder step and the UNet estimator, the regulator's weights, the fixed noise."""
    from .flow import FlowEncoderStep, regulator_weights

    c, flow = models.config.flow, models.flow
    import torch

    gen = torch.Generator().manual_seed(c.noise_seed)
    noise = torch.randn(1, c.output_size, c.noise_frames, generator=gen).numpy()
    # Named as the state dict names them (the runtime strips the prefix for ``regulate``).
    assets = {"rand_noise": noise, **{f"length_regulator.model.{k}": v for k, v in regulator_weights(flow).items()}}
    modules = {"flow_encoder": FlowEncoderStep(flow).eval(), "flow_estimator": flow.decoder.estimator.eval()}
    info = {"n_timesteps": c.n_timesteps, "cfg_rate": c.inference_cfg_rate, "mel_bins": c.output_size,
            "spk_embed_dim": c.spk_embed_dim, "flow_vocab_size": c.vocab_size, "input_frame_rate": c.input_frame_rate,
            "mel_sample_rate": c.mel_sample_rate, "mel_hop": c.mel_hop, "regulator_edge_tokens": c.regulator_edge_tokens,
            "regulator_sampling_ratios": list(c.regulator_sampling_ratios)}
    return modules, assets, info


def llm_vocab(cfg: Any) -> dict[str, Any]:
    """No HF rewrite: the 300M LM is not a Qwen2 body, so vLLM / SGLang / TensorRT-LLM cannot serve it;
    its engines are the decode-step graph (ONNX Runtime, TensorRT). A one-line error says so."""
    from cosycompile.errors import RecipeError

    raise RecipeError("CosyVoice-300M's TransformerLM has no Hugging Face rewrite (it is not a Qwen2 body): "
                      "build its LLM as the decode-step graph (onnxruntime or tensorrt backends)")


def llm_vocab_rows(lm: Any) -> dict[str, Any]:
    """See :func:`llm_vocab`: never reached."""
    return llm_vocab(None)


def llm_quant_target(lm: Any) -> Any:
    """What the LLM quantizer quantizes of the 300M LM (``FamilyInfo.llm_quant_target``): the Transformer
    stack that runs every decode step (the head, the embeddings and the text encoder, which runs once
    per utterance in numpy, stay FP32), calibrated on the records' prefixes, exported as the decode step."""
    from cosycompile.families import LMQuantTarget

    from .lm import DecodeStep

    d = lm.cfg.decoder
    # The input layer's Linear stays FP32: its rows mix the encoded text with the speaker, sos/task_id
    # and speech-token embeddings, of scales apart by more than INT8's range, and one per-tensor
    # activation scale for all of them rounds away the speech tokens' rows every decode step feeds.
    return LMQuantTarget(module=lm.llm, calibrate=lambda x: lm.llm(x), decode_step=lambda: DecodeStep(lm),
                         widths=(d.output_size, d.linear_units), checkpoints=False, keep_fp32=("embed.*",),
                         # The relative-position attention folds linear_pos's weight into its queries.
                         weights_read=("*.linear_pos",))
