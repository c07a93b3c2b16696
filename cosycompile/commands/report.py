"""``cosycompile report BUNDLE``: re-render a bundle's report.md (and plot) from its report.json."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cosycompile.errors import UserError

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
    from cosycompile.core.bounded_read import BoundError, read_text
    from cosycompile.validate.gate import MAX_REPORT_BYTES

    try:
        print(read_text(args.bundle / "report.md", MAX_REPORT_BYTES, "a report"))
    except (BoundError, OSError, ValueError) as exc:
        raise UserError(f"{args.bundle / 'report.md'}: unreadable ({exc})") from None
    print(f"rendered: {', '.join(str(p) for p in out)}")
    return 0
