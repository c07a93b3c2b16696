"""report.md's rendering of what only the engine builds checked: a checkpoint server's smoke decode
is listed under its stage, its raw material left out by the unvalidated step."""

from __future__ import annotations

from cosycompile.validate.report import render_markdown


def test_smoke_decodes_are_listed_per_stage() -> None:
    report = {"stages": {"llm": {"backend": "vllm", "precision": "int8_dyn",
                                 "smoke": {"identical_prefix": 64, "max_abs_logprob_error": 7.4e-07, "vllm": "0.32.0"}},
                         "flow": {"backend": "onnxruntime", "precision": "fp32"}},
              "gate": {"passed": False, "findings": []}}
    md = render_markdown(report)
    head, table = md.split("## Smoke decodes of the built engines (by their own servers, at build time)\n\n")
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in table.split("\n\n")[0].splitlines()[2:]]
    assert rows == [["llm", "identical_prefix", "64"], ["llm", "max_abs_logprob_error", rows[1][2]],
                    ["llm", "vllm", "0.32.0"]]
    assert float(rows[1][2]) == 7.4e-07 and "## Stages" in head


def test_no_smoke_no_section() -> None:
    report = {"stages": {"flow": {"backend": "onnxruntime", "precision": "fp32"}}, "gate": {"passed": True}}
    assert "Smoke decodes" not in render_markdown(report)
