"""Tensor exchange with Triton's python stub that does not depend on the stub's numpy ABI.

The stub of tritonserver 2.51 (the ``nvidia-pytriton`` 0.7.0 wheel) builds numpy arrays through a
pybind11 compiled for numpy 1.x. Under numpy 2 the dtype struct changed, and those arrays read wrong:
``Tensor.as_numpy()`` of ``[1, 2, 3, 4]`` gives ``[1, 1, 1, 1]``, an output made from a numpy array
arrives empty, and a BYTES input crashes the stub while it is deserialized (``unpack_from requires a
buffer of at least 707406382 bytes``: the length prefix read as four copies of its first byte).
DLPack (``np.from_dlpack`` / ``Tensor.from_dlpack``) goes around pybind11's numpy code and is right
with either numpy. BYTES tensors have no DLPack form and reach Python already garbled (every byte a
copy of the first), so under such a stub text goes in as UTF-8 ``UINT8`` tensors instead
(:func:`numpy_bridge_ok` tells which case a model is in); the patched deserializer only keeps a
BYTES request from killing the stub, so that the model can answer it with an error.
"""

from __future__ import annotations

import contextlib
import io
import sys
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np


def _deserialize_bytes_tensor(encoded_tensor: Any) -> Any:
    """``triton_python_backend_utils.deserialize_bytes_tensor`` reading the buffer by its address.

    Installed as the code of the stub's function (which the stub holds a reference to), so it runs
    with that module's globals: everything it needs is imported here.
    """
    import ctypes
    import struct

    import numpy

    # A uint8 array of the serialized size; read by address, which is right when pybind11 matches numpy.
    n = int(encoded_tensor.shape[0]) if encoded_tensor.ndim else 0
    buf = ctypes.string_at(encoded_tensor.__array_interface__["data"][0], n) if n else b""
    strs, offset = [], 0
    while offset < len(buf):
        (length,) = struct.unpack_from("<I", buf, offset)
        offset += 4
        strs.append(buf[offset:offset + length])
        offset += length
        if offset > len(buf):  # a garbled length prefix: keep the stub alive, the model reports it
            break
    return numpy.array(strs, dtype=numpy.object_)


def patch_stub(pb_utils: Any) -> None:
    """Make the stub's BYTES deserializer read raw memory (idempotent).

    The stub looked the function up before any model loaded, so rebinding the module attribute
    would not reach it: the function object's code is replaced instead.
    """
    fn = pb_utils.deserialize_bytes_tensor
    if fn.__code__ is not _deserialize_bytes_tensor.__code__:
        fn.__code__ = _deserialize_bytes_tensor.__code__


def numpy_bridge_ok(pb_utils: Any) -> bool:
    """Whether the stub's numpy arrays read right (False: a stub built for numpy 1.x under numpy 2)."""
    probe = np.arange(1, 5, dtype=np.float32)
    try:
        # In through DLPack, out through pybind11's numpy code: the path a request's input takes
        # (a tensor made from a numpy array keeps that array and would hide the fault).
        with _without_capsule_noise():
            tensor = pb_utils.Tensor.from_dlpack("probe", probe)
        return bool(np.array_equal(tensor.as_numpy(), probe))
    except Exception:  # any failure of the bridge means: do not trust it
        return False


def input_text(pb_utils: Any, request: Any, name: str, bytes_ok: bool) -> str | None:
    """Text input ``name``: the UTF-8 ``UINT8`` tensor ``<name>_utf8`` or the BYTES tensor ``name``.

    ValueError when only BYTES was sent and this stub garbles BYTES (``bytes_ok`` False).
    """
    raw = input_array(pb_utils, request, f"{name}_utf8")
    if raw is not None:
        return raw.astype(np.uint8).tobytes().decode("utf-8")
    values = input_strings(pb_utils, request, name)
    if values is None:
        return None
    if not bytes_ok:
        raise ValueError(f"{name}: this server's python stub garbles BYTES tensors under numpy {np.__version__} "
                         f"(its pybind11 was built for numpy 1.x); send {name}_utf8 (UINT8, the UTF-8 bytes) instead")
    return values[0] if values else None


def input_array(pb_utils: Any, request: Any, name: str) -> np.ndarray | None:
    """The request's numeric input ``name`` as a numpy array (a copy), or None when the request lacks it."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else np.array(np.from_dlpack(tensor))


def input_strings(pb_utils: Any, request: Any, name: str) -> list[str] | None:
    """The request's BYTES input ``name`` as UTF-8 strings, or None when the request lacks it."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    # The stub made this object array in Python (the patched deserializer), so as_numpy is safe here.
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in tensor.as_numpy().reshape(-1)]


_CAPSULE_NOISE = "PyCapsule_GetPointer called with incorrect name"


@contextmanager
def _without_capsule_noise() -> Iterator[None]:
    """Drop the one traceback the stub prints on every ``Tensor.from_dlpack`` of a numpy 2 array.

    The stub (pybind11 built for numpy 1.x) consumes the capsule, then numpy 2's capsule destructor
    finds a name it does not expect and reports ``PyCapsule_GetPointer called with incorrect name``
    as a traceback, although the tensor is complete and right (the tests compare every sample).
    That is one traceback per response in the server log. Anything else written meanwhile is
    passed on unchanged."""
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        yield
    text = buf.getvalue()
    if text and _CAPSULE_NOISE not in text:
        sys.stderr.write(text)


def output_tensor(pb_utils: Any, name: str, array: np.ndarray) -> Any:
    """A response tensor from a numeric numpy array, through DLPack."""
    with _without_capsule_noise():
        return pb_utils.Tensor.from_dlpack(name, np.ascontiguousarray(array))
