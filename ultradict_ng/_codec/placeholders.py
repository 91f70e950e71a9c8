"""What the cache, the records and the dumps hold in place of large values and arrays.

A value at or above a dict's blob threshold -- ``bytes``, ``bytearray``, a
buffer, a numpy array, a CPU torch tensor -- lives in a segment of its own (a
"blob", layout: "Blobs") and is held as a :class:`BlobRef`; a smaller array
travels inline, as an :class:`InlineArray`; under the pickle serializer, a
value whose large buffers went out of band is a :class:`PickledBlobs`.

These are plain data, and they live with the codec because the serializers
encode and decode them: nothing here touches shared memory.  Turning a
placeholder into the user's value is the engine's work (for blobs,
``_shm/blobs.py``, through ``Store.materialize``); only an inline array can
rebuild itself, from its own bytes.

Their module path is part of the layout: the pickle serializer stores
``BlobRef`` and ``PickledBlobs`` by module and name (``LAYOUT_VERSION``,
layout: "Changing the layout"), and ``safe_pickle`` allows exactly them.
"""

from __future__ import annotations

import mmap
from typing import Any, Optional

from .arrays import dtype_from, numpy, torch

__all__ = [
    "BlobRef",
    "InlineArray",
    "PickledBlobs",
    "KINDS",
    "KIND_BYTES",
    "KIND_BYTEARRAY",
    "KIND_NDARRAY",
    "KIND_TENSOR",
]

#: What a blob's payload is, as its header and its reference say (layout: "Blobs").
KIND_BYTES = 1
KIND_BYTEARRAY = 2
KIND_NDARRAY = 3
KIND_TENSOR = 4
KINDS = (KIND_BYTES, KIND_BYTEARRAY, KIND_NDARRAY, KIND_TENSOR)


class BlobRef:
    """A blob as records, dumps and caches hold it: ``id`` (its segment is
    ``NAME@b<id>``), ``kind`` (KIND_*), ``length`` (payload bytes) and
    ``meta`` (numpy: ``[dtype descr, shape]``; else None).

    ``mapping`` and ``array`` are this process's alone, filled by the engine
    on first use and kept with the reference so that every read of it shares
    them: the read-only mapping of the segment, and for an array the
    read-only array on it.  They are neither compared nor pickled."""

    __slots__ = ("id", "kind", "length", "meta", "mapping", "array")

    def __init__(self, id: int, kind: int, length: int, meta: Any = None) -> None:
        self.id = id
        self.kind = kind
        self.length = length
        self.meta = meta
        self.mapping: Optional[mmap.mmap] = None
        self.array: Any = None

    def __repr__(self) -> str:
        return f"<blob {self.id}: {self.length} bytes, kind {self.kind}>"

    def __reduce__(self) -> Any:  # the pickle serializer stores the reference, not the data
        return (BlobRef, (self.id, self.kind, self.length, self.meta))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlobRef) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("blob", self.id))


class InlineArray:
    """A numpy array (or CPU torch tensor) below the blob threshold: its dtype
    descr, shape and bytes.  An array is the read-only array on those bytes,
    made on first use; a tensor is a new, writable one at each read."""

    __slots__ = ("descr", "shape", "data", "tensor", "_value")

    def __init__(self, descr: Any, shape: tuple[int, ...], data: bytes, tensor: bool = False) -> None:
        self.descr = descr
        self.shape = shape
        self.data = data
        self.tensor = tensor
        self._value: Any = None

    def __repr__(self) -> str:
        return f"<inline {'tensor' if self.tensor else 'array'} {self.descr!r} {self.shape}>"

    def value(self) -> Any:
        """The user's value (needs numpy, and torch for a tensor)."""
        if self._value is None:
            np = numpy()
            arr = np.frombuffer(self.data, dtype=dtype_from(self.descr))
            self._value = arr.reshape(self.shape)
        if self.tensor:
            return torch().from_numpy(self._value.copy())
        return self._value


class PickledBlobs:
    """A value of the pickle serializer whose large buffers went out of band
    (pickle protocol 5) into blobs: the pickle stream ``data`` and the blobs
    ``refs``, in the order the stream asks for them.  The engine unpickles it
    at each read, with the blobs' read-only mappings as the buffers: the
    arrays in it are zero-copy (numpy rebuilds them on those buffers)."""

    __slots__ = ("refs", "data")

    def __init__(self, refs: list[BlobRef], data: bytes) -> None:
        self.refs = refs
        self.data = data

    def __repr__(self) -> str:
        return f"<pickled value with {len(self.refs)} blob(s)>"

    def __reduce__(self) -> Any:
        return (PickledBlobs, (self.refs, self.data))
