"""How this process's engine threads wait between ops: spinning (ONNX Runtime's default) or asleep.

A spinning intra-op thread stays on its core for a while after each op, so the next op starts at
once; that pays when one session has the cores to itself, as in a build's timed runs. In a Triton
server the instances share the cores with each other, with the server's own threads and with the
stub's Python between engine calls, and spinning threads take the time those need (measured in
docs/bench-log/2026-11-28-idle-spinning.md). The server's models call :func:`set_spinning` with
False before they load a bundle; builds and ``cosycompile synthesize`` keep the default.
"""

from __future__ import annotations

_spinning = True


def spinning() -> bool:
    """Whether engine sessions this process creates from now on may spin while they wait for work."""
    return _spinning


def set_spinning(on: bool) -> None:
    """Let engine sessions created from now on spin while idle (``on``) or sleep (ONNX Runtime's
    ``session.intra_op.allow_spinning``); sessions already loaded keep what they had."""
    global _spinning
    _spinning = on
