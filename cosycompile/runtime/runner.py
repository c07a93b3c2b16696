"""The Runner contract shared by every backend (and by the PyTorch reference)."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Runner(Protocol):
    """Runs one graph: named numpy inputs in, named numpy outputs out."""

    input_names: list[str]
    output_names: list[str]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the graph once."""
        ...
