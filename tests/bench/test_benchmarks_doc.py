"""docs/benchmarks.md stays a page a user reads: short, and every table block that names a run folder
holds exactly what bench/print_tables.py prints for that folder (nobody edits a table by hand)."""

from __future__ import annotations

import importlib.util
import re

from helpers import REPO

DOC = REPO / "docs" / "benchmarks.md"
BLOCK = re.compile(r"^<!-- tables: (\S+) \((.*?)\) -->\n(.*?)^<!-- end tables -->", re.S | re.M)


def _printer():
    spec = importlib.util.spec_from_file_location("print_tables", REPO / "bench" / "print_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_is_short() -> None:
    assert len(DOC.read_text().splitlines()) <= 300


def test_every_generated_block_is_what_the_printer_prints_for_its_run() -> None:
    render = _printer().render
    blocks = BLOCK.findall(DOC.read_text())
    assert blocks, "no table block in docs/benchmarks.md"
    generated = 0
    for slug, note, body in blocks:
        run = re.search(r"from (docs/bench-log/runs/\d{8}-\d{6})", note)
        if run is None:  # a machine class with no kept run yet: its block is empty
            assert not body.strip(), f"block {slug} names no run folder but holds text"
            continue
        generated += 1
        assert body.strip() == render(REPO / run.group(1)).strip(), f"block {slug} differs from its run's tables"
    assert generated, "no block is generated from a kept run"
