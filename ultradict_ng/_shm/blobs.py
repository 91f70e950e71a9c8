"""Large values in their own immutable segments ("blobs"), and numpy arrays.

A value at or above the dict's blob threshold -- ``bytes``, ``bytearray``,
a ``memoryview`` or other contiguous buffer, a numpy array -- is written once
into a segment of its own (layout: "Blobs") and the record, the cache and the
dumps hold only a small :class:`BlobRef`.  Why: writing it then costs
O(value) -- one ``pwrite`` into the shared-memory filesystem, no encoding, no
dump of the whole dict -- and a reader maps the segment read-only: a numpy
array read from the dict *is* the shared memory, in every process, at any
size.  Smaller arrays travel inline, as :class:`InlineArray`.

Both classes are placeholders in the cache: the facade turns them into the
user's value (their ``value()``, through the store) when it hands a value out.  Nothing here
imports numpy unless a value needs it.

Lifetime of what a reader gets (what the README states):

* a numpy array or ``memoryview`` of a blob keeps its mapping -- and so the
  segment's memory -- alive until it is garbage-collected, whatever happens
  to the dict (overwritten, deleted, cleared, unlinked, its writer killed):
  POSIX keeps a mapping valid after the name is unlinked, and a blob is never
  reused for new data (ids only grow; a name is never written twice);
* ``bytes`` and ``bytearray`` values are copies.
"""

from __future__ import annotations

import errno
import mmap
import operator
import os
import pickle
import struct
import sys
from typing import Any, Callable, List, Optional, Tuple

from .. import layout as L
from . import segment
from .._codec.arrays import array_meta, dtype_from, is_ndarray, is_tensor, numpy, tensor_as_array, torch
from ..errors import CorruptSegment, OutOfSpace
from ..speedups import types_within

try:
    import _posixshmem  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

__all__ = [
    "BlobRef", "InlineArray", "PickledBlobs", "KINDS", "KIND_TENSOR", "KIND_BYTES", "KIND_BYTEARRAY", "KIND_NDARRAY", "is_ndarray",
    "BlobMissing", "BlobGone", "blob_kind", "write_blob", "map_blob", "array_on", "blob_ids",
    "refs_within", "may_hold_blobs", "extract", "array_meta", "dtype_from",
]

KIND_BYTES = 1
KIND_BYTEARRAY = 2
KIND_NDARRAY = 3
KIND_TENSOR = 4
KINDS = (KIND_BYTES, KIND_BYTEARRAY, KIND_NDARRAY, KIND_TENSOR)
_header = struct.Struct(L.BLOB_FORMAT)
#: Types that are never a blob and hold nothing that could be one.
_PLAIN = frozenset({type(None), bool, int, float, str, complex})
#: Types ``extract`` walks or leaves as they are (bytes below the threshold ...).
_HANDLED = frozenset({list, tuple, dict, bytes, bytearray, memoryview})


class BlobRef:
    """A blob as records, dumps and caches hold it: ``id`` (its segment is
    ``NAME@b<id>``), ``kind`` (KIND_*), ``length`` (payload bytes) and
    ``meta`` (numpy: ``[dtype descr, shape]``; else None).  Process-local:
    the mapping and, for an array, the read-only array on it, made on first use."""

    __slots__ = ("id", "kind", "length", "meta", "_mm", "_array")

    def __init__(self, id: int, kind: int, length: int, meta: Any = None) -> None:
        self.id = id
        self.kind = kind
        self.length = length
        self.meta = meta
        self._mm: Optional[mmap.mmap] = None
        self._array: Any = None

    def _mapping(self, name: str, token: int) -> mmap.mmap:
        mm = self._mm
        if mm is None:
            mm = map_blob(name, token, self)
            if mm is None:
                raise BlobMissing(L.blob_name(name, self.id))
            self._mm = mm
        return mm

    def value(self, name: str, token: int) -> Any:
        """The user's value: a read-only array on the shared memory (made once,
        then shared: it cannot change); a tensor on a private copy-on-write
        mapping of it (torch has no read-only tensors: writes to it stay in
        this process, and it costs no copy until then); or a bytes/bytearray
        copy.  :class:`BlobMissing` if the segment is gone."""
        if self._array is not None:
            return self._array
        if self.kind == KIND_TENSOR:
            private = map_blob(name, token, self, mmap.ACCESS_COPY)
            if private is None:
                raise BlobMissing(L.blob_name(name, self.id))
            return torch().from_numpy(array_on(self, private))
        mm = self._mapping(name, token)  # (validates the segment against the reference)
        if self.kind == KIND_NDARRAY:
            self._array = array_on(self, mm)
            return self._array
        try:
            return read_payload(name, self)
        except (BlobMissing, OSError):
            # Unlinked since we mapped it, or not readable through a descriptor
            # (macOS): the mapping holds it.
            with memoryview(mm) as whole, whole[L.BLOB_HEADER:L.BLOB_HEADER + self.length] as body:
                return bytearray(body) if self.kind == KIND_BYTEARRAY else body.tobytes()

    def view(self, name: str, token: int) -> memoryview:
        """A read-only memoryview of the payload: no copy."""
        return memoryview(self._mapping(name, token))[L.BLOB_HEADER:L.BLOB_HEADER + self.length]

    def __repr__(self) -> str:
        return f"<blob {self.id}: {self.length} bytes, kind {self.kind}>"

    def __reduce__(self) -> Any:  # the pickle serializer stores the reference, not the data
        return (BlobRef, (self.id, self.kind, self.length, self.meta))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlobRef) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("blob", self.id))


class BlobMissing(Exception):
    """A referenced blob's segment does not exist (internal: the store decides
    whether a newer state dropped it -- read again -- or something is wrong)."""


class BlobGone(Exception):
    """A newer state than the one read dropped this blob: read again (internal)."""


class InlineArray:
    """A numpy array (or CPU torch tensor) below the blob threshold: its dtype
    descr, shape and bytes.  An array is the read-only array on those bytes,
    made on first use; a tensor is a new, writable one at each read."""

    __slots__ = ("descr", "shape", "data", "tensor", "_value")

    def __init__(self, descr: Any, shape: Tuple[int, ...], data: bytes, tensor: bool = False) -> None:
        self.descr = descr
        self.shape = shape
        self.data = data
        self.tensor = tensor
        self._value: Any = None

    def __repr__(self) -> str:
        return f"<inline {'tensor' if self.tensor else 'array'} {self.descr!r} {self.shape}>"

    def value(self, name: str = "", token: int = 0) -> Any:
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
    ``refs``, in the order the stream asks for them.  Its value is unpickled at
    each read, with the blobs' read-only mappings as the buffers: the arrays
    in it are zero-copy (numpy rebuilds them on those buffers)."""

    __slots__ = ("refs", "data")

    def __init__(self, refs: List[BlobRef], data: bytes) -> None:
        self.refs = refs
        self.data = data

    def __repr__(self) -> str:
        return f"<pickled value with {len(self.refs)} blob(s)>"

    def __reduce__(self) -> Any:
        return (PickledBlobs, (self.refs, self.data))

    def value(self, name: str, token: int) -> Any:
        buffers = [ref.view(name, token) for ref in self.refs]
        return pickle.loads(self.data, buffers=buffers)


def blob_kind(value: Any, threshold: int) -> int:
    """KIND_* if ``value`` goes to a blob at this threshold, else 0."""
    tp = type(value)
    if tp is bytes:
        return KIND_BYTES if len(value) >= threshold else 0
    if tp is bytearray:
        return KIND_BYTEARRAY if len(value) >= threshold else 0
    if tp is memoryview:
        return KIND_BYTES if value.nbytes >= threshold else 0
    if is_ndarray(value):
        return KIND_NDARRAY if value.nbytes >= threshold else 0
    if is_tensor(value):
        return KIND_TENSOR if value.element_size() * value.nelement() >= threshold else 0
    return 0


# -- writing and mapping a blob segment --------------------------------------------------------


def write_blob(name: str, token: int, blob_id: int, kind: int, value: Any) -> BlobRef:
    """Create the segment of blob ``blob_id`` holding ``value`` (layout: "Blobs",
    writer steps b-c) and return its reference; nothing is left on failure.

    The payload goes in with ``pwrite`` into the shared-memory filesystem: no
    mapping in the writer, so no page faults (measured 60-70 ms for 100 MiB,
    against 110-250 ms to map a fresh segment and copy), and a full
    filesystem is ENOSPC -> :class:`OutOfSpace`, never SIGBUS.
    """
    meta = None
    if kind == KIND_TENSOR:
        value = tensor_as_array(value)  # shares the tensor's memory
    if kind == KIND_NDARRAY or kind == KIND_TENSOR:
        descr, shape = array_meta(value)
        meta = [descr, shape]
        np = sys.modules["numpy"]
        # One copy only if it is not C-contiguous already; as bytes, because a
        # buffer of some dtypes (datetime64, ...) cannot be exported.
        value = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    with memoryview(value) as raw, raw.cast("B") as data:
        length = data.nbytes
        seg = L.blob_name(name, blob_id)
        fd = _posixshmem.shm_open("/" + seg, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            os.ftruncate(fd, L.BLOB_HEADER + length)
            _fill(fd, data, _header.pack(L.BLOB_MAGIC, token, blob_id, length, kind, 0))
        except BaseException as exc:
            os.close(fd)
            _posixshmem.shm_unlink("/" + seg)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                raise OutOfSpace(
                    f"no room in shared memory for a {length}-byte value of shared dict "
                    f"{name!r}: {exc.strerror}"
                ) from exc
            raise
        os.close(fd)
    return BlobRef(blob_id, kind, length, meta)


#: pwrite's answers where shared memory cannot be written through its descriptor
#: (macOS allows only ftruncate and mmap on it).
_NO_WRITE = {getattr(errno, n) for n in ("ENXIO", "EINVAL", "ENODEV", "EOPNOTSUPP") if hasattr(errno, n)}


def _fill(fd: int, data: memoryview, header: bytes) -> None:
    """The payload at BLOB_HEADER, then the header (layout: "Blobs", step b)."""
    length, done = data.nbytes, 0
    try:
        while done < length:
            n = os.pwrite(fd, data[done:], L.BLOB_HEADER + done)
            if n <= 0:
                raise OSError(errno.EIO, "pwrite wrote nothing")
            done += n
        os.pwrite(fd, header, 0)
    except OSError as exc:
        if exc.errno not in _NO_WRITE or done:
            raise
        # Reserve first, so that a full filesystem is ENOSPC here, not SIGBUS below.
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, L.BLOB_HEADER + length)
        with mmap.mmap(fd, L.BLOB_HEADER + length) as mm:
            mm[L.BLOB_HEADER:L.BLOB_HEADER + length] = data
            mm[0:len(header)] = header


def map_blob(name: str, token: int, ref: BlobRef, access: int = mmap.ACCESS_READ) -> Optional[mmap.mmap]:
    """The read-only mapping of ``ref``'s segment after checking its header
    against the reference; None if the segment does not exist (a newer state
    replaced it: the caller syncs and retries); CorruptSegment if it is not
    what the reference says."""
    seg = L.blob_name(name, ref.id)
    try:
        fd = _posixshmem.shm_open("/" + seg, os.O_RDONLY, mode=0o600)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size < L.BLOB_HEADER + ref.length:
            raise CorruptSegment(f"blob {seg!r} holds {size} bytes, its reference says "
                                 f"{L.BLOB_HEADER + ref.length}")
        mm = mmap.mmap(fd, size, access=access)
    finally:
        os.close(fd)
    magic, btoken, bid, length, kind, _ = _header.unpack_from(mm, 0)
    if (magic, btoken, bid, length, kind) != (L.BLOB_MAGIC, token, ref.id, ref.length, ref.kind):
        mm.close()
        raise CorruptSegment(f"blob {seg!r} does not hold what its reference says")
    return mm


def read_payload(name: str, ref: BlobRef) -> Any:
    """A copy of a blob's payload as bytes (or bytearray), read with ``pread``.

    Why not a copy from the mapping: that faults in every page of the mapping
    and of the new object; ``pread`` copies in the kernel, and measured ~2x
    faster for 100 MiB here.  What remains is the cost of the new object's
    fresh pages (see README, "Large values")."""
    seg = L.blob_name(name, ref.id)
    try:
        fd = _posixshmem.shm_open("/" + seg, os.O_RDONLY, mode=0o600)
    except FileNotFoundError:
        raise BlobMissing(seg) from None
    try:
        if ref.kind == KIND_BYTEARRAY:
            out: Any = bytearray(ref.length)
            done = 0
            with memoryview(out) as dst:
                while done < ref.length:
                    n = os.preadv(fd, [dst[done:]], L.BLOB_HEADER + done)
                    if n <= 0:
                        raise CorruptSegment(f"blob {seg!r} ended before its length")
                    done += n
            return out
        data = os.pread(fd, ref.length, L.BLOB_HEADER)
        if len(data) < ref.length:  # pread of a regular file returns it all, or less at its end
            raise CorruptSegment(f"blob {seg!r} ended before its length")
        return data
    finally:
        os.close(fd)


def array_on(ref: BlobRef, mm: mmap.mmap) -> Any:
    """The read-only numpy array a mapped blob holds (zero-copy)."""
    np = numpy()
    try:
        descr, shape = ref.meta
        dtype = dtype_from(descr)
        count = ref.length // dtype.itemsize if dtype.itemsize else 0
        return np.frombuffer(mm, dtype=dtype, count=count, offset=L.BLOB_HEADER).reshape(shape)
    except CorruptSegment:
        raise
    except Exception as exc:
        raise CorruptSegment(f"blob {ref.id} has an invalid array description: {exc}") from None


def blob_ids(name: str, low: int, nxt: int) -> List[int]:
    """Ids of ``low .. nxt`` whose blob segments may exist: those listed in
    /dev/shm where it can be listed, else the range itself (at most
    ``MAX_BLOB_SWEEP`` of them)."""
    if segment.LISTABLE:
        prefix = name + L.BLOB_SUFFIX
        ids = []
        for entry in segment.listed(prefix):
            try:
                blob_id = int(entry[len(prefix):], 36)
            except ValueError:
                continue
            if low <= blob_id < nxt:
                ids.append(blob_id)
        return sorted(ids)
    return list(range(low, min(nxt, low + L.MAX_BLOB_SWEEP)))


def refs_within(value: Any, out: Optional[List[BlobRef]] = None) -> List[BlobRef]:
    """Every BlobRef inside ``value`` (lists, tuples, dict values; iterative)."""
    found: List[BlobRef] = [] if out is None else out
    stack = [value]
    while stack:
        item = stack.pop()
        tp = type(item)
        if tp is BlobRef:
            found.append(item)
        elif tp is PickledBlobs:
            found.extend(item.refs)
        elif tp is dict:
            stack.extend(item.values())
        elif tp is list or tp is tuple:
            stack.extend(item)
    return found


def may_hold_blobs(value: Any, threshold: int) -> bool:
    """False when ``value`` certainly holds nothing for a blob (or for ``extract``'s
    ``other``): the quick test that keeps ordinary writes off ``extract``."""
    tp = type(value)
    if tp in _PLAIN:
        return False
    if tp is bytes or tp is bytearray:
        return len(value) >= threshold
    if tp is list or tp is tuple or tp is dict:
        return not types_within(value, _PLAIN)
    return True


def extract(value: Any, threshold: int, store_blob: Callable[[Any, int], BlobRef],
            other: Optional[Callable[[Any], Any]] = None) -> Any:
    """``value`` with every buffer, array or tensor at or above ``threshold``
    (at the top, or inside lists, tuples and dict values) replaced by the
    BlobRef that ``store_blob(buffer, kind)`` returns, and every other kind of
    object by what ``other(obj)`` returns (if given); ``value`` itself if
    nothing was replaced."""
    kind = blob_kind(value, threshold)
    if kind:
        return store_blob(value, kind)
    tp = type(value)
    if tp is memoryview:  # a buffer below the threshold: its bytes, as a blob would give back
        return value.tobytes()
    if other is not None and tp not in _PLAIN and tp not in _HANDLED:
        return other(value)
    if (tp is list or tp is tuple or tp is dict) and types_within(value, _PLAIN):
        return value  # the common case, scanned in C: nothing in it can be a blob
    if tp is list or tp is tuple:
        items = [extract(v, threshold, store_blob, other) for v in value]
        if all(map(operator.is_, items, value)):
            return value
        return items if tp is list else tuple(items)
    if tp is dict:
        new = {k: extract(v, threshold, store_blob, other) for k, v in value.items()}
        return value if all(new[k] is v for k, v in value.items()) else new
    return value

