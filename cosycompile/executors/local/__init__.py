"""Every step in this process, one after another in dependency order (the default executor)."""

from __future__ import annotations

from cosycompile.executors import ExecutorInfo

PLUGIN = ExecutorInfo(summary="every step in this process, in dependency order (default)")
