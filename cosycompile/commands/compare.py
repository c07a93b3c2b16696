"""``cosycompile compare A B``: two builds' metrics side by side."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

ORDER = 70


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    p = sub.add_parser("compare", help="print two builds' metrics side by side")
    p.add_argument("a", type=Path, help="bundle dir or report.json")
    p.add_argument("b", type=Path, help="bundle dir or report.json")
    return p


def run(args: argparse.Namespace) -> int:
    """The ``compare`` command."""
    from cosycompile.validate.gate import load_report, metric_values
    from cosycompile.validate.registry import registry

    a, b = metric_values(load_report(args.a)), metric_values(load_report(args.b))
    rows = [("metric", str(args.a.name), str(args.b.name), "better")]
    for name in registry():
        if name in a or name in b:
            va, vb = a.get(name), b.get(name)
            better = "-"
            if va is not None and vb is not None and va != vb:
                higher = registry()[name].metric.higher
                better = "A" if (va > vb) == higher else "B"
            rows.append((name, "-" if va is None else f"{va:.4g}", "-" if vb is None else f"{vb:.4g}", better))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0
