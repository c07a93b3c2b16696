"""``cosycompile report BUNDLE``: re-render a bundle's report.md (and plot) from its report.json."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

ORDER = 60


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """This command's entry in the ``cosycompile`` parser."""
    p = sub.add_parser("report", help="re-render a bundle's report.md (and plot) from its report.json")
    p.add_argument("bundle", type=Path, help="bundle dir")
    return p


def run(args: argparse.Namespace) -> int:
    """The ``report`` command."""
    from cosycompile.validate.gate import load_report
    from cosycompile.validate.report import render_bundle

    load_report(args.bundle)
    out = render_bundle(args.bundle)
    print((args.bundle / "report.md").read_text())
    print(f"rendered: {', '.join(str(p) for p in out)}")
    return 0
