"""``cosycompile gate BUNDLE``: pass or fail a bundle on its recipe's thresholds and a baseline."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cosycompile.errors import UserError

ORDER = 40
EXAMPLES = (
    ('cosycompile gate BUNDLE --baseline OLD', 'pass or fail a bundle, also against a baseline'),
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    p = sub.add_parser("gate", help="pass/fail a bundle on quality and speed (exit 0 pass, 1 regression, 2 bad input)",
                       description="Apply the bundle recipe's validation.gate thresholds, and optionally compare "
                                   "against a baseline report: quality may drop by at most --max-quality-drop "
                                   "(relative), speed-ups may shrink by at most --max-slowdown (relative).")
    p.add_argument("bundle", type=Path, nargs="?", help="bundle dir or report.json")
    p.add_argument("--baseline", type=Path, help="baseline bundle dir or report.json")
    p.add_argument("--max-quality-drop", type=float, default=None, help="relative, e.g. 0.05 = 5%% (default: recipe's)")
    p.add_argument("--max-slowdown", type=float, default=None, help="relative, e.g. 0.25 = 25%% (default: recipe's)")
    p.add_argument("--list-metrics", action="store_true", help="list the metric names a gate can use")
    p.add_argument("--allow-unvalidated", action="store_true",
                   help="pass a bundle whose engines were built but not validated (no check could run)")
    return p


def apply_gate(bundle: Path, baseline: Path | None, minimum: dict, maximum: dict, max_drop: float,
               max_slowdown: float, allow_unvalidated: bool = False) -> int:
    """Print the gate's verdict on ``bundle``: 0 pass, 1 fail (a finding, or engines not validated)."""
    from cosycompile.validate.gate import check_baseline, check_thresholds, findings_table, load_report

    report = load_report(bundle)
    if report.get("validated") is False:
        why = "; ".join(f"{s}: {r}" for s, r in report.get("not_validated", {}).items())
        if allow_unvalidated:
            print(f"gate: PASS (built, not validated here: {why}; --allow-unvalidated)")
            return 0
        print(f"gate: FAIL (built, not validated here: {why}); run `cosycompile validate {bundle}` on a machine "
              "that can run these engines, or pass --allow-unvalidated")
        return 1
    findings = check_thresholds(report, minimum, maximum)
    if baseline is not None:
        findings += check_baseline(report, load_report(baseline), max_drop, max_slowdown)
    if findings:
        print(f"gate: FAIL ({len(findings)} finding{'s' if len(findings) > 1 else ''})")
        print(findings_table(findings))
        return 1
    print("gate: PASS" + (f" (baseline {baseline})" if baseline else ""))
    return 0


def run(args: argparse.Namespace) -> int:
    """The ``gate`` command."""
    from cosycompile.validate.gate import allowance

    if args.list_metrics:
        from cosycompile.validate.registry import registry

        for name, reg in registry().items():
            m = reg.metric
            print(f"{name:<34} {m.kind:<8} {'higher' if m.higher else 'lower'} is better  {m.unit:<7} {m.description}")
        return 0
    if args.bundle is None:
        raise UserError("gate: give a bundle dir or report.json (or --list-metrics)")
    bundle: Path = args.bundle
    recipe_file = (bundle if bundle.is_dir() else bundle.parent) / "recipe.json"
    gate: dict = {}
    if recipe_file.is_file():
        from cosycompile.core.bounded_read import MAX_MANIFEST_BYTES, read_json

        body = read_json(recipe_file, MAX_MANIFEST_BYTES, "a bundle's recipe")
        gate = body.get("validation", {}).get("gate", {}) if isinstance(body, dict) else None
        if not isinstance(gate, dict) or not all(isinstance(gate.get(k, {}), dict) for k in ("min", "max")):
            raise UserError(f"{recipe_file}: 'validation.gate' is not a gate section")
    # argparse's float takes "nan" and "inf": refused here, before any report is read, whether a flag or
    # the bundle's recipe.json gave the value.
    max_drop = allowance("--max-quality-drop", args.max_quality_drop) if args.max_quality_drop is not None \
        else allowance(f"{recipe_file}: max_quality_drop", gate.get("max_quality_drop", 0.05))
    max_slow = allowance("--max-slowdown", args.max_slowdown) if args.max_slowdown is not None \
        else allowance(f"{recipe_file}: max_slowdown", gate.get("max_slowdown", 0.25))
    minimum = {k: v for k, v in gate.get("min", {}).items() if v is not None}
    maximum = {k: v for k, v in gate.get("max", {}).items() if v is not None}
    return apply_gate(bundle, args.baseline, minimum, maximum, max_drop, max_slow, args.allow_unvalidated)
