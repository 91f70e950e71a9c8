"""Large values in their own immutable segments ("blobs"): the shared-memory
engine's side of them -- writing, mapping, reading, sweeping.

A value at or above the dict's blob threshold -- ``bytes``, ``bytearray``,
a ``memoryview`` or other contiguous buffer, a numpy array, a CPU torch
tensor -- is written once into a segment of its own (layout: "Blobs") and
the record, the cache and the dumps hold only a small ``BlobRef``.  Why:
writing it then costs O(value) -- one ``pwrite`` into the shared-memory
filesystem, no encoding, no dump of the whole dict -- and a reader maps the
segment read-only: a numpy array read from the dict *is* the shared memory,
in every process, at any size.  Smaller arrays travel inline, as
``InlineArray``.

The placeholders themselves are plain data in
:mod:`ultradict_ng._codec.placeholders` (the serializers encode them); this
module turns them into the user's values (:func:`materialize` and
:func:`blob_view`, which ``Store.materialize`` and ``Store.view`` call) and
makes, finds and walks blobs for the writer -- whose steps of layout "Blobs"
are here too (:func:`extract_blobs`, :func:`dropped_blobs`,
:func:`sweep_blobs`), so that ``_shm/writer.py`` holds the order of a write
and this module everything a write does to blobs.  Every call on shared memory
goes through :mod:`ultradict_ng._platform.segments`.  Nothing here imports numpy
unless a value needs it.

Lifetime of what a reader gets (what docs/guide/large-values.md states):

* a numpy array or ``memoryview`` of a blob keeps its mapping -- and so the
  segment's memory -- alive until it is garbage-collected, whatever happens
  to the dict (overwritten, deleted, cleared, unlinked, its writer killed):
  POSIX keeps a mapping valid after the name is unlinked, and a blob is never
  reused for new data (ids only grow; a name is never written twice);
* ``bytes`` and ``bytearray`` values are copies.
"""

from __future__ import annotations

import mmap
import operator
import pickle
import struct
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable, Optional

from .._codec.arrays import array_meta, dtype_from, is_ndarray, is_tensor, numpy, tensor_as_array, torch
from .._codec.ext import MAX_NESTING, too_deep
from .._codec.placeholders import KIND_BYTEARRAY, KIND_BYTES, KIND_NDARRAY, KIND_TENSOR, BlobRef, PickledBlobs
from .._platform import directories, faults, listing, segments
from ..errors import CorruptSegment, Unlinked
from ..speedups import contains_type, types_within
from . import layout as L
from .tablecache import TableCache

if TYPE_CHECKING:
    from .mapping import Mapping

__all__ = [
    "BlobMissing",
    "materialize",
    "blob_value",
    "blob_view",
    "pickled_value",
    "blob_kind",
    "write_blob",
    "map_blob",
    "read_payload",
    "array_on",
    "blob_ids",
    "refs_within",
    "may_hold_blobs",
    "pairs_may_hold_blobs",
    "extract",
    "extract_blobs",
    "dropped_blobs",
    "unlink_blobs",
    "sweep_blobs",
]

_header = struct.Struct(L.BLOB_FORMAT)
#: Types that are never a blob and hold nothing that could be one.
_PLAIN = frozenset({type(None), bool, int, float, str, complex})
#: Types ``extract`` walks or leaves as they are (bytes below the threshold ...).
_HANDLED = frozenset({list, tuple, dict, bytes, bytearray, memoryview})
#: Container levels the quick scan looks into: a cache entry (expires, slot,
#: {"tags": [...]}) is three.  (A set or frozenset of plain members it also
#: passes holds no buffer either: nothing for a blob or pickle's out-of-band.)
_LEVELS = 3


class BlobMissing(Exception):
    """A referenced blob's segment does not exist (internal: the store decides
    whether a newer state dropped it -- read again -- or something is wrong)."""


# -- the user's value of a placeholder ---------------------------------------------------------


def materialize(stored: Any, name: str, token: int) -> Any:
    """The user's value of a cache placeholder of the dict ``name`` (creation
    token ``token``); :class:`BlobMissing` if a blob it needs is gone."""
    tp = type(stored)
    if tp is BlobRef:
        return blob_value(stored, name, token)
    if tp is PickledBlobs:
        return pickled_value(stored, name, token)
    return stored.value()  # an InlineArray: its own bytes


def _mapping(ref: BlobRef, name: str, token: int) -> mmap.mmap:
    """The reference's read-only mapping, made once per reference and then shared."""
    mm = ref.mapping
    if mm is None:
        mm = map_blob(name, token, ref)
        if mm is None:
            raise BlobMissing(L.blob_name(name, ref.id))
        ref.mapping = mm
    return mm


def blob_value(ref: BlobRef, name: str, token: int) -> Any:
    """The user's value of a blob: a read-only array on the shared memory (made
    once, then shared: it cannot change); a tensor on a private copy-on-write
    mapping of it (torch has no read-only tensors: writes to it stay in this
    process, and it costs no copy until then); or a bytes/bytearray copy.
    :class:`BlobMissing` if the segment is gone."""
    if ref.array is not None:
        return ref.array
    if ref.kind == KIND_TENSOR:
        private = map_blob(name, token, ref, mmap.ACCESS_COPY)
        if private is None:
            raise BlobMissing(L.blob_name(name, ref.id))
        return torch().from_numpy(array_on(ref, private))
    mm = _mapping(ref, name, token)  # (validates the segment against the reference)
    if ref.kind == KIND_NDARRAY:
        ref.array = array_on(ref, mm)
        return ref.array
    try:
        return read_payload(name, ref)
    except (BlobMissing, OSError):
        # Unlinked since we mapped it, or not readable through a descriptor
        # (macOS): the mapping holds it.
        with memoryview(mm) as whole, whole[L.BLOB_HEADER : L.BLOB_HEADER + ref.length] as body:
            return bytearray(body) if ref.kind == KIND_BYTEARRAY else body.tobytes()


def blob_view(ref: BlobRef, name: str, token: int) -> memoryview:
    """A read-only memoryview of a blob's payload: no copy."""
    return memoryview(_mapping(ref, name, token))[L.BLOB_HEADER : L.BLOB_HEADER + ref.length]


def pickled_value(stored: PickledBlobs, name: str, token: int) -> Any:
    """Unpickled at each read, with the blobs' read-only mappings as the
    out-of-band buffers: the arrays in it are zero-copy."""
    buffers = [blob_view(ref, name, token) for ref in stored.refs]
    return pickle.loads(stored.data, buffers=buffers)


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

        The payload goes in first, then the header, with ``pwrite`` (see
        :func:`ultradict_ng._platform.segments.create_written`: no page faults in the
        writer, and a full filesystem is
    :class:`~ultradict_ng.errors.OutOfSpace`, never SIGBUS).
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
    if isinstance(value, memoryview) and not value.c_contiguous:
        value = value.tobytes()  # (a cast needs a C-contiguous view: one copy, as below the threshold)
    with memoryview(value) as raw, raw.cast("B") as data:
        length = data.nbytes
        header = _header.pack(L.BLOB_MAGIC, token, blob_id, length, kind, 0)
        segments.create_written(
            L.blob_name(name, blob_id),
            L.BLOB_HEADER + length,
            [(L.BLOB_HEADER, data), (0, header)],
            f"no room in shared memory for a {length}-byte value of shared dict {directories.shown(name)!r}",
        )
    return BlobRef(blob_id, kind, length, meta)


def map_blob(name: str, token: int, ref: BlobRef, access: int = mmap.ACCESS_READ) -> Optional[mmap.mmap]:
    """The read-only mapping of ``ref``'s segment after checking its header
    against the reference; None if the segment does not exist (a newer state
    replaced it: the caller syncs and retries); CorruptSegment if it is not
    what the reference says."""
    seg = L.blob_name(name, ref.id)
    try:
        opened = segments.Opened(seg)
    except FileNotFoundError:
        return None
    with opened:
        size = opened.size()
        if size < L.BLOB_HEADER + ref.length:
            raise CorruptSegment(
                f"blob {directories.file_of(seg) or seg!r} holds {size} bytes, "
                f"its reference says {L.BLOB_HEADER + ref.length}"
            )
        mm = opened.map(size, access)
    magic, btoken, bid, length, kind, _ = _header.unpack_from(mm, 0)
    if (magic, btoken, bid, length, kind) != (L.BLOB_MAGIC, token, ref.id, ref.length, ref.kind):
        mm.close()
        raise CorruptSegment(
            f"blob {directories.file_of(seg) or seg!r} does not hold what its reference says"
        )
    return mm


def read_payload(name: str, ref: BlobRef) -> Any:
    """A copy of a blob's payload as bytes (or bytearray), read with ``pread``.

    Why not a copy from the mapping: that faults in every page of the mapping
    and of the new object; ``pread`` copies in the kernel, and measured ~2x
    faster for 100 MiB here.  What remains is the cost of the new object's
    fresh pages (see docs/guide/large-values.md)."""
    seg = L.blob_name(name, ref.id)
    try:
        opened = segments.Opened(seg)
    except FileNotFoundError:
        raise BlobMissing(seg) from None
    with opened:
        if ref.kind == KIND_BYTEARRAY:
            out: Any = bytearray(ref.length)
            done = 0
            with memoryview(out) as dst:
                while done < ref.length:
                    n = opened.readinto(dst[done:], L.BLOB_HEADER + done)
                    if n <= 0:
                        raise CorruptSegment(
                            f"blob {directories.file_of(seg) or seg!r} ended before its length"
                        )
                    done += n
            return out
        data = opened.pread(ref.length, L.BLOB_HEADER)
        if len(data) < ref.length:  # pread of a regular file returns it all, or less at its end
            raise CorruptSegment(f"blob {directories.file_of(seg) or seg!r} ended before its length")
        return data


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


def blob_ids(name: str, low: int, nxt: int) -> list[int]:
    """Ids of ``low .. nxt`` whose blob segments may exist: those listed in
    /dev/shm where it can be listed, else the range itself (at most
    ``MAX_BLOB_SWEEP`` of them)."""
    if segments.LISTABLE:
        prefix = name + L.BLOB_SUFFIX
        ids = []
        for entry in listing.listed(prefix):
            try:
                blob_id = int(entry[len(prefix) :], 36)
            except ValueError:
                continue
            if low <= blob_id < nxt:
                ids.append(blob_id)
        return sorted(ids)
    return list(range(low, min(nxt, low + L.MAX_BLOB_SWEEP)))


def refs_within(value: Any, out: Optional[list[BlobRef]] = None) -> list[BlobRef]:
    """Every BlobRef inside ``value`` (lists, tuples, dict values; iterative)."""
    found: list[BlobRef] = [] if out is None else out
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
        return not types_within(value, _PLAIN, _LEVELS)
    return True


def pairs_may_hold_blobs(pairs: list[Any], threshold: int) -> bool:
    """``any(may_hold_blobs(v, threshold) for _, v in pairs)`` for an update
    record's pairs (``[[key, value], ...]``), decided for the common case by
    compiled scans instead of a call per pair: when every key and value is
    plain, or a list, tuple or dict of plain members within ``_LEVELS``
    levels (the pair lists and the values are the two levels above those),
    and no set or frozenset is anywhere (a set value is never plain to
    :func:`may_hold_blobs`; nested ones make the scans only more careful),
    no value holds anything for a blob.  Otherwise the per-pair check."""
    if (
        types_within(pairs, _PLAIN, _LEVELS + 2)
        and not contains_type(pairs, set, _LEVELS + 3)
        and not contains_type(pairs, frozenset, _LEVELS + 3)
    ):
        return False
    return any(may_hold_blobs(v, threshold) for _, v in pairs)


def extract(
    value: Any,
    threshold: int,
    store_blob: Callable[[Any, int], BlobRef],
    other: Optional[Callable[[Any], Any]] = None,
) -> Any:
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
    if (tp is list or tp is tuple or tp is dict) and (
        types_within(value, _PLAIN, _LEVELS) or _plain_throughout(value)
    ):
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


def _plain_throughout(value: Any) -> bool:
    """Whether ``value`` holds plain scalars only, in lists, tuples and dicts
    at any depth: with an explicit stack, so that a value as deep as the
    codec takes (500 levels) is no deeper for the interpreter's recursion
    limit -- the walk below takes two frames a level, and whether a value fit
    depended on how deep its caller's stack already was.  A container met
    twice (a cycle, or one shared) or past the codec's depth: False, and the
    walk below decides (a cycle or too deep: refused)."""
    stack, seen = [(value, 0)], {id(value)}
    while stack:
        item, depth = stack.pop()
        if depth > MAX_NESTING:
            return False
        for members in (item.keys(), item.values()) if type(item) is dict else (item,):
            found = set(map(type, members))
            if found <= _PLAIN:
                continue
            if not found <= _PLAIN_OR_TREES:
                return False
            for m in members:
                if type(m) in _TREES:
                    if id(m) in seen:
                        return False
                    seen.add(id(m))
                    stack.append((m, depth + 1))
    return True


_TREES = frozenset({list, tuple, dict})
_PLAIN_OR_TREES = _PLAIN | _TREES


# -- the writer's steps (layout: "Blobs" a-d) -------------------------------------------------


def extract_blobs(
    rec: list[Any],
    created: list[BlobRef],
    name: str,
    token: int,
    mapping: Mapping,
    threshold: int,
    pickled: bool,
) -> list[Any]:
    """``rec`` with its large buffers and arrays written to blobs (steps a-b)
    and replaced by references; the blobs made are appended to ``created``.
    With ``pickled`` (the dict's serializer is pickle) any other value keeps
    its large buffers out of band, in blobs, as a :class:`PickledBlobs`.  The
    writer calls this under the lock; on an error the blobs made are gone."""

    def store_blob(value: Any, kind: int) -> BlobRef:
        if mapping.words[L.W_STATUS] & L.STATUS_UNLINKED:  # (by this process, inside its own transaction)
            raise Unlinked(
                f"shared dict {directories.shown(name)!r} was unlinked; it can no longer be written"
            )
        blob_id = mapping.words[L.W_BLOB_NEXT]
        mapping.atomic.store(L.W_BLOB_NEXT, blob_id + 1)  # a: before the segment exists
        if faults.armed is not None:
            faults.hit("blob-registered")
        ref = write_blob(name, token, blob_id, kind, value)  # b
        created.append(ref)
        if faults.armed is not None:
            faults.hit("blob-written")
        return ref

    def out_of_band(value: Any) -> Any:
        """Under pickle: the value pickled with protocol 5, its large buffers in blobs."""
        refs: list[BlobRef] = []

        def callback(buffer: pickle.PickleBuffer) -> bool:
            try:
                raw = buffer.raw()
            except BufferError:  # not contiguous: it stays in band
                return True
            if raw.nbytes < threshold:
                return True
            refs.append(store_blob(raw, KIND_BYTES))
            return False

        try:
            data = pickle.dumps(value, protocol=5, buffer_callback=callback)
        except Exception:  # the codec reports it, with its own error
            unlink_blobs(name, refs)
            del created[len(created) - len(refs) :]
            return value
        return PickledBlobs(refs, data) if refs else value

    other = out_of_band if pickled else None
    try:
        if rec[0] == L.OP_SET:
            value = extract(rec[3], threshold, store_blob, other)
            return rec if value is rec[3] else [rec[0], rec[1], rec[2], value]
        if rec[0] == L.OP_UPDATE:
            pairs = [[k, extract(v, threshold, store_blob, other)] for k, v in rec[2]]
            return [rec[0], rec[1], pairs]
    except RecursionError:
        unlink_blobs(name, created)
        raise too_deep() from None
    except BaseException:
        unlink_blobs(name, created)
        raise
    return rec


def dropped_blobs(node: Any, rec: list[Any]) -> list[BlobRef]:
    """The blobs record ``rec`` removes from ``node``, the dict it changes (the
    values it replaces or deletes): unlinked once it is published (step d)."""
    op = rec[0]
    refs: list[BlobRef] = []
    if op == L.OP_CLEAR:
        return refs_within(_walkable(node))
    keys = [k for k, _ in rec[2]] if op == L.OP_UPDATE else [rec[2]]
    for key in keys:
        try:
            old = node.get(key)
        except TypeError:  # unhashable: the record fails later, with the real error
            continue
        refs_within(old, refs)
    return refs


def unlink_blobs(name: str, refs: Iterable[BlobRef]) -> None:
    for ref in refs:
        segments.unlink(L.blob_name(name, ref.id))


def sweep_blobs(name: str, tree: Any, mapping: Mapping) -> None:
    """At a dump of ``tree``: unlink the blobs of ids BLOB_LOW..BLOB_NEXT that it
    does not reference (left by writers that died), and raise BLOB_LOW."""
    referenced = {ref.id for ref in refs_within(_walkable(tree))}
    words = mapping.words
    low, nxt = words[L.W_BLOB_LOW], words[L.W_BLOB_NEXT]
    for blob_id in blob_ids(name, low, nxt):
        if blob_id not in referenced:
            segments.unlink(L.blob_name(name, blob_id))
    mapping.atomic.store(L.W_BLOB_LOW, min(referenced) if referenced else nxt)


def _walkable(tree: Any) -> Any:
    """What :func:`refs_within` walks for a dict: a big dict's cache gives its
    values (every one decoded for the walk, none kept)."""
    return tree.values() if type(tree) is TableCache else tree
