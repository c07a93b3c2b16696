"""The last step of a build whose engines cannot run on this machine: a report saying so.

``cosycompile gate`` fails such a bundle unless ``--allow-unvalidated``; ``cosycompile validate
BUNDLE`` runs the checks later on a machine that can.
"""

from __future__ import annotations

import json
from typing import Any

from cosycompile.core.graph import StepContext
from cosycompile.runtime.loading import read_passport
from cosycompile.validate.report import REPORT_SCHEMA, render_markdown

# What a smoke decode records that is evidence, not its raw material.
_SMOKE_RAW = ("tokens", "prompt", "first_logprobs")


def run(ctx: StepContext) -> dict[str, Any]:
    """The ``pipeline.check`` step of an unvalidated build."""
    p = ctx.params
    why = "; ".join(f"{s}: {r}" for s, r in sorted(p["reasons"].items()))
    report = {
        "schema": REPORT_SCHEMA,
        "validated": False,
        "not_validated": p["reasons"],
        "stages": {s: {"backend": p["backends"][s], "precision": p["precisions"][s]} for s in p["stages"]},
        "checks": {},
        "speed": {},
        "items": [],
        "gate": {"passed": False, "thresholds": p["thresholds"],
                 "findings": [{"metric": "validation", "value": None, "limit": 0.0, "rule": "run",
                               "shortfall": f"built, not validated here ({why})"}]},
    }
    # What the engine builds checked themselves (a checkpoint server's smoke decode) is all the
    # evidence such a bundle has: the report shows it.
    for s in p["stages"]:
        smoke = read_passport(ctx.inputs[f"{s}.engine"]).get("smoke")
        if smoke:
            report["stages"][s]["smoke"] = {k: v for k, v in smoke.items() if k not in _SMOKE_RAW}
    (ctx.out / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    (ctx.out / "report.md").write_text(render_markdown(report, title="cosycompile build report: built, not validated here"))
    ctx.log(f"built, not validated here: {why}")
    return {"validated": False}
