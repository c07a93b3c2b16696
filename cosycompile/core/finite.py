"""No step commits a NaN or an Inf: the numbers a step writes are checked before its cache entry exists.

A later build trusts a cached entry without looking inside it, and NaN compares as "no error", so
one poisoned array (a reference, a calibration range, a quantized scale) would pass every check
that reads it. The check reads what the file formats hold as numbers: ``.npy`` and ``.npz`` arrays
and ONNX initializers (inline or in external data files, memory-mapped). Other files are opaque.

One exception: a graph may hold an infinite one-element constant, the fill value of an attention
mask (``masked_fill(-inf)`` folded by the exporter); NaN is refused there too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from cosycompile.errors import UserError

_CHUNK = 1 << 24  # elements checked at a time: a 0.5B model's external data is never in memory at once


class NonFiniteOutput(UserError):
    """A step wrote NaN or Inf; the message names the step, the file and the array."""


def _all_finite(a: "object", fill_values: bool) -> bool:
    """Whether array ``a`` has no NaN and no Inf (with ``fill_values``, a one-element array may be ±Inf)."""
    import numpy as np

    arr = np.asarray(a)
    if arr.dtype.kind not in "fc":
        return True
    flat = arr.reshape(-1)
    if fill_values and flat.size == 1:
        return not np.isnan(flat).any()
    return all(np.isfinite(flat[i:i + _CHUNK]).all() for i in range(0, flat.size, _CHUNK))


def _npy(path: Path) -> Iterator[tuple[str, "object"]]:
    import numpy as np

    yield "", np.load(path, mmap_mode="r", allow_pickle=False)


def _npz(path: Path) -> Iterator[tuple[str, "object"]]:
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        for name in z.files:
            yield name, z[name]


def _onnx(path: Path) -> Iterator[tuple[str, "object"]]:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path), load_external_data=False)
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
            if dtype.kind not in "fc":
                continue
            offset, length = int(info.get("offset", 0)), info.get("length")
            count = (int(length) if length is not None else os.path.getsize(path.parent / info["location"]) - offset)
            yield t.name, np.memmap(path.parent / info["location"], dtype=dtype, mode="r", offset=offset,
                                    shape=(count // dtype.itemsize,))
        else:
            yield t.name, numpy_helper.to_array(t)


_READERS = {".npy": _npy, ".npz": _npz, ".onnx": _onnx}


def check_finite_outputs(step: str, data: Path) -> None:
    """Raise :class:`NonFiniteOutput` if any array under ``data`` (a step's staged outputs) holds NaN or Inf."""
    for path in sorted(data.rglob("*")):
        read = _READERS.get(path.suffix)
        if read is None or not path.is_file() or path.is_symlink():
            continue
        for name, arr in read(path):
            if not _all_finite(arr, fill_values=path.suffix == ".onnx"):
                where = f"{path.relative_to(data)}" + (f" ('{name}')" if name else "")
                raise NonFiniteOutput(f"step {step}: {where} holds NaN or Inf; nothing was cached (a later build "
                                      f"would trust it): check the model's weights and the calibration data")
