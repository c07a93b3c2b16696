"""The Runner contract shared by every backend (and by the PyTorch reference)."""

from __future__ import annotations

from typing import Any, Protocol

# A feed or result: a numpy array on the host, or a device array (e.g. a CUDA torch tensor) for
# backends that take one, so a GPU pipeline can keep the CFM loop on the device between calls.
Array = Any


class Runner(Protocol):
    """Runs one graph: named arrays in, named arrays out, names as the graph's spec declares them.

    CPU backends take and return numpy arrays. A GPU backend may also accept device arrays and then
    returns arrays on the same device; the numpy control flow in ``runtime.pipeline`` only ever hands
    a runner what an earlier runner returned, or numpy.
    """

    input_names: list[str]
    output_names: list[str]

    def run(self, feeds: dict[str, Array]) -> dict[str, Array]:
        """Run the graph once."""
        ...
