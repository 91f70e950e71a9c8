"""numpy arrays and CPU torch tensors as values: their description and rebuilding.

Nothing here imports numpy or torch at import time: a value is recognised by
``sys.modules`` (a process that has an array has imported numpy), and
decoding imports numpy only when a value is one.  A stored array is
described as numpy's ``.npy`` format describes it (``dtype_to_descr``): plain
data, rebuilt by ``descr_to_dtype``, never by pickle; dtype object is refused
both ways (its items are pointers: reading them from shared memory would
crash the reader).
"""

from __future__ import annotations

import sys
from typing import Any

from ..errors import CorruptSegment, UnsupportedType

__all__ = ["is_ndarray", "is_tensor", "array_meta", "dtype_from", "tensor_as_array", "numpy", "torch"]


def numpy() -> Any:
    try:
        import numpy
    except ImportError:
        raise CorruptSegment(
            "this shared dict holds a numpy array, and numpy is not installed in this process "
            "(pip install 'ultradict_ng[numpy]')"
        ) from None
    return numpy


def is_ndarray(value: Any) -> bool:
    """True for a numpy ndarray (exact type), without importing numpy."""
    np = sys.modules.get("numpy")
    return np is not None and type(value) is np.ndarray


def array_meta(arr: Any) -> tuple[Any, list[int]]:
    """``(descr, shape)`` of an array numpy can describe without pickle."""
    if arr.dtype.hasobject:
        raise UnsupportedType(
            "cannot store a numpy array of dtype object (its items are Python objects, not "
            'data): convert it, or use serializer="pickle"'
        )
    from numpy.lib.format import dtype_to_descr

    return _listify(dtype_to_descr(arr.dtype)), list(arr.shape)


def _listify(descr: Any) -> Any:
    if isinstance(descr, (list, tuple)):
        return [_listify(x) for x in descr]
    return descr


def _tuplify_fields(descr: Any) -> Any:
    """The inverse of ``_listify`` for a structured descr: fields are tuples."""
    if isinstance(descr, list):
        return [
            tuple(_tuplify_fields(x) if isinstance(x, list) else x for x in field)
            if isinstance(field, list)
            else field
            for field in descr
        ]
    return descr


def dtype_from(descr: Any) -> Any:
    """The dtype a stored descr names; CorruptSegment for one that needs pickle."""
    np = numpy()
    from numpy.lib.format import descr_to_dtype

    try:
        dtype = descr_to_dtype(_tuplify_fields(descr))
    except Exception as exc:
        raise CorruptSegment(f"invalid numpy dtype in a shared dict: {descr!r} ({exc})") from None
    if dtype.hasobject:  # raw bytes read as object pointers would crash the reader
        raise CorruptSegment("a numpy array of dtype object in a shared dict: refused")
    return np.dtype(dtype)


def is_tensor(value: Any) -> bool:
    """True for a torch Tensor (exact type), without importing torch."""
    torch_module = sys.modules.get("torch")
    return torch_module is not None and type(value) is torch_module.Tensor


def torch() -> Any:
    try:
        import torch as torch_module
    except ImportError:
        raise CorruptSegment(
            "this shared dict holds a torch tensor, and torch is not installed in this process"
        ) from None
    return torch_module


def tensor_as_array(tensor: Any) -> Any:
    """The numpy array sharing a CPU tensor's memory (contiguous); UnsupportedType
    for a tensor on another device, sparse, or of a dtype numpy has not (bfloat16)."""
    if tensor.device.type != "cpu" or tensor.layout is not sys.modules["torch"].strided:
        raise UnsupportedType(
            f"cannot store a torch tensor on {tensor.device} with layout {tensor.layout}: only "
            "dense CPU tensors (move it with .cpu(), or .to_dense())"
        )
    try:
        return tensor.detach().contiguous().numpy()
    except (TypeError, RuntimeError) as exc:
        raise UnsupportedType(
            f"cannot store a torch tensor of dtype {tensor.dtype}: {exc} (convert it, e.g. .float())"
        ) from None
