"""The speakers a CosyVoice-300M model ships: ``spk2info.pt`` of the SFT model (an x-vector per name).

Upstream's SFT inference (``frontend_sft``) conditions the LM and the flow on the speaker's x-vector
alone: no prompt text, speech or mel. Each entry becomes a bundle speaker of that kind (empty tokens and
mel), so ``synthesize --speaker`` and the servers use it like any cached one. The file is read with
``weights_only=True``: a table of tensors, never unpickled code. Entries of other kinds (upstream's
``add_zero_shot_spk`` stores prompt features under other keys) are skipped with their names reported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cosycompile.errors import ModelError, UserError
from cosycompile.runtime.speakers import Speaker, check_name

SPK2INFO = "spk2info.pt"
MEL_BINS = 80


def _embedding(path: Path, name: str, entry: Any, dim: int) -> np.ndarray | None:
    import torch

    value = entry.get("embedding") if isinstance(entry, dict) else None
    if value is None:
        return None
    if not isinstance(value, torch.Tensor) or value.numel() != dim or not value.is_floating_point():
        raise ModelError(f"{path}: speaker {name!r}: 'embedding' must be {dim} floats")
    emb = value.detach().reshape(-1).float().numpy().copy()
    if not np.isfinite(emb).all():
        raise ModelError(f"{path}: speaker {name!r}: 'embedding' holds NaN or Inf")
    return emb


def model_speakers(frontend_dir: Path, dim: int = 192) -> list[Speaker]:
    """The x-vector speakers of ``frontend_dir``'s ``spk2info.pt`` (none without the file), by name; a
    file that is not such a table, or a name no file can carry, is a one-line :class:`ModelError`."""
    import torch

    path = Path(frontend_dir) / SPK2INFO
    if not path.is_file():
        return []
    try:
        table = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle/zip errors come in many types
        raise ModelError(f"{path}: not a readable speaker table ({exc.__class__.__name__})") from None
    if not isinstance(table, dict):
        raise ModelError(f"{path}: expected a table of speakers (a dict), got {type(table).__name__}")
    out = []
    for name in sorted(table):
        try:
            check_name(str(name))
        except UserError as exc:
            raise ModelError(f"{path}: {exc}") from None
        emb = _embedding(path, name, table[name], dim)
        if emb is not None:
            out.append(Speaker(str(name), "", np.zeros(0, np.int64), np.zeros((MEL_BINS, 0), np.float32), emb))
    return out


def write_builtin_speakers(out: Path, names: tuple[str, ...], seed: int, dim: int = 192) -> None:
    """``spk2info.pt`` in upstream's SFT form (``{name: {'embedding': [1, dim]}}``) with seeded x-vectors."""
    import torch

    gen = torch.Generator().manual_seed(seed * 1000 + 7)
    table = {n: {"embedding": torch.randn(1, dim, generator=gen)} for n in names}
    torch.save(table, Path(out) / SPK2INFO)
