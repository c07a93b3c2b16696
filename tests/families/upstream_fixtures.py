"""What the family tests against upstream's recorded fixtures share: reading a fixture's arrays and
state dict (stored as float16 where exact, widened to float32 here) and the relative error they are
judged by. Each family's fixtures live in ``tests/data/<family>_upstream``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def rel_err(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    """max|a - b| / max|b|, in float64: robust where b has values near zero."""
    a, b = (torch.as_tensor(x).detach().to(torch.float64) for x in (a, b))
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def read_npz(data: Path, name: str) -> dict[str, torch.Tensor]:
    """The arrays of fixture ``data/<name>.npz`` as tensors (float16 ones widened to float32, exactly)."""
    with np.load(data / f"{name}.npz") as z:
        return {k: torch.from_numpy(z[k].astype(np.float32) if z[k].dtype == np.float16 else z[k]) for k in z.files}


def read_state(data: Path, name: str) -> dict[str, torch.Tensor]:
    """Upstream's state dict ``data/<name>.pt`` (parameters stored as float16, exact) widened to float32."""
    sd = torch.load(data / f"{name}.pt", map_location="cpu", weights_only=True)
    return {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}
