"""The local executor: each recipe's plan through the graph's Executor, one recipe after another.
Steps two recipes share are built by the first and found in the store by the next."""

from __future__ import annotations

from typing import Any

from cosycompile.core.graph import BuildResult


def build(plans: list[Any], store: Any, reporter: Any, *, remote: Any, address: str | None,
          force: bool = False) -> list[BuildResult]:
    """Run every plan here; ``address`` is always None for this executor."""
    from cosycompile.plan import executor

    return [executor(plan, store, reporter, force=force, remote=remote).run() for plan in plans]
