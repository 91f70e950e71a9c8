"""Pure-Python twins of every entry point of the compiled helper ``_native``.

Same names, same signatures, same results, same bytes in shared memory:
:mod:`ultradict_ng.speedups` exports either ``_native``'s objects or these,
and no other module knows which (the msgpack ``fallback.py`` / py-lmdb
``cffi.py`` shape).  ``_native.pyi`` describes both; tests/test_native.py
compares each pair on generated inputs, and CI runs the whole suite on both.
The atomic words are in :mod:`.words`, the packers of big dicts and
their values' decoder in :mod:`.packing`, the walks over a table's entries
in :mod:`.tablewalk`, the copies a read hands out in :mod:`.copytree`, the
probe of a table in :mod:`.tableprobe`, recovery's scan of a stream file in
:mod:`.streamscan` (all re-exported here).
"""

from __future__ import annotations

import itertools
import struct
import threading
import zlib
from typing import Any, Callable, Optional, Union

import msgpack  # type: ignore[import-untyped, unused-ignore]

from .. import layout as L
from .. import table_layout as TL
from .copytree import copy_plain, first_to_export, set_immutable_types
from .packing import pack_map, pack_pairs, tuple_hook, unpack_simple
from .streamscan import scan_stream
from .tableprobe import key_hash_common, table_candidates, table_changes, table_get
from .tablewalk import table_chunk, table_merge, table_rows
from .words import FUTEX, RECORD_HEADER, SCALAR_TYPES, BoundWords, PublicWords, Words

__all__ = [
    "Words",
    "BoundWords",
    "PublicWords",
    "ProcessState",
    "StoreBase",
    "TableCacheBase",
    "ViewBase",
    "CacheGet",
    "parse_records",
    "scan_stream",
    "apply_sets",
    "apply_simple",
    "types_within",
    "contains_type",
    "msgpack_length",
    "crc32",
    "set_immutable_types",
    "copy_plain",
    "set_root_write",
    "key_hash_common",
    "table_get",
    "table_candidates",
    "table_fill",
    "table_merge",
    "table_changes",
    "table_index",
    "table_chunk",
    "SCALAR_TYPES",
    "RECORD_HEADER",
    "FUTEX",
    "pack_map",
    "pack_pairs",
    "unpack_simple",
    "tuple_hook",
    "table_rows",
    "first_to_export",
]

_header = struct.Struct(L.RECORD_FORMAT)


# -- the lock's per-process state ------------------------------------------------------


class ProcessState:
    """What every handle of one dict in this process shares: which thread holds
    the lock and how often (reentrancy), and the mutex that lets only one of our
    threads compete for the shared word at a time.

    :meth:`enter` and :meth:`exit` are the common cases of acquire and release;
    every other case (waiting for another process, timeouts, recovery) is in
    :mod:`ultradict_ng._shm.lock` and manipulates the same attributes.
    """

    __slots__ = ("mutex", "owner", "count", "__weakref__")

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.owner: Optional[int] = None
        self.count = 0

    def enter(self, words: Words, index: int, mine: int) -> bool:
        """True: the calling thread holds the lock (reentered, or the word was
        free and is now ``mine``).  False: the calling thread now holds the
        mutex but another process holds the word; the caller waits for the
        word, then sets ``owner`` and ``count``."""
        me = threading.get_ident()
        if self.owner == me:
            self.count += 1
            return True
        self.mutex.acquire()
        try:
            ok = words.cas(index, 0, mine)[0]
        except BaseException:
            self.mutex.release()
            raise
        if ok:
            self.owner = me
            self.count = 1
        return ok

    def exit(self, words: Words, index: int, mine: int) -> Union[bool, int, None]:
        """Release one level.  None: the calling thread does not hold the lock
        (nothing changed).  False: the last level was released but the word
        was no longer ``mine`` (taken over meanwhile).  After the last level,
        if LOCK_WAITERS (word ``index + 1``) is not 0 and LOCK_WAKING (``index + 3``)
        goes from 0 to 1: LOCK_SEQ (``index + 2``) += 1 and one sleeper is
        woken; 2 if that woke nobody."""
        if self.owner != threading.get_ident():
            return None
        self.count -= 1
        if self.count:
            return True
        self.owner = None
        woke_nobody = False
        try:
            ok = words.cas(index, mine, 0)[0]
            if ok and index + 3 < words._nwords and words.load(index + 1):
                if words.cas(index + 3, 0, 1)[0]:
                    words.add(index + 2, 1)
                    woke_nobody = FUTEX == 0 or words.wake(index + 2, 1) == 0
        finally:
            self.mutex.release()
        if ok and woke_nobody:
            return 2
        return ok


# -- the bases carrying the read hit path -------------------------------------------------


class StoreBase:
    """What the read hit path needs from a store (``seen`` and ``data``), and
    the stream offset the cache reflects (``pos``)."""

    __slots__ = ("seen", "data", "pos", "recurse")

    seen: int
    #: Nested dicts are live views (a dict value is read as a view, not copied).
    recurse: bool
    #: The cache: a dict, or for a big dict a reader's ``_shm/tablecache.TableCache``
    #: (the read API of a dict; a writer turns it into a dict before it writes).
    data: dict[Any, Any]
    pos: int

    def _bind_state(self, words: Optional[Words], index: int) -> None:
        """Where the compiled hit path loads STATE; here the store's own
        memoryview does (see ``SharedDict._getitem_slow``)."""

    def _tx_fast(self, *args: Any) -> None:
        """Arms the compiled transaction write path; the twins have none: a
        transaction's writes all take ``SharedDict._setitem_slow``."""

    @property
    def _tx_last(self) -> int:
        """Where the compiled path's last record begins: it wrote none."""
        return -1


class TableCacheBase:
    """The state of a big dict's cache (``_shm/tablecache.TableCache``); its
    compiled twin sets str and int keys itself, here every set and delete is
    the subclass's ``_setitem`` / ``_delitem``: the same rule, one call more."""

    __slots__ = ("hot", "dead", "fresh", "changed", "_probe", "_limit")

    hot: dict[Any, Any]
    dead: set[Any]
    fresh: dict[Any, None]
    changed: set[Any]
    _probe: Optional[tuple[Any, int, int, int]]
    _limit: Optional[int]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._setitem(key, value)  # type: ignore[attr-defined]

    def __delitem__(self, key: Any) -> None:
        self._delitem(key)  # type: ignore[attr-defined]


class ViewBase:
    """The two fields of a ``SharedDict`` handle: its store and its path.

    The compiled ``ViewBase.__getitem__`` answers a hit itself and calls the
    subclass's ``_getitem_slow`` otherwise; its ``__setitem__`` writes a
    scalar inside an open transaction itself and calls ``_setitem_slow``
    otherwise, and its ``__delitem__`` is ``_delitem_slow``.  Their twins: a
    subclass that defines ``_getitem_slow`` (``_setitem_slow``,
    ``_delitem_slow``) gets it as ``__getitem__`` (``__setitem__``,
    ``__delitem__``) directly, the same rules at the cost of one call.
    """

    __slots__ = ("_store", "_path")

    _store: Any
    _path: tuple[Any, ...]
    # The subclass's (SharedDict's): what the dunders below fall back on.
    _getitem_slow: Callable[[Any], Any]
    _setitem_slow: Callable[[Any, Any], None]
    _delitem_slow: Callable[[Any], None]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for slow, dunder in (
            ("_getitem_slow", "__getitem__"),
            ("_setitem_slow", "__setitem__"),
            ("_delitem_slow", "__delitem__"),
        ):
            method = cls.__dict__.get(slow)
            if method is not None:
                setattr(cls, dunder, method)

    def __getitem__(self, key: Any) -> Any:
        return self._getitem_slow(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._setitem_slow(key, value)

    def __delitem__(self, key: Any) -> None:
        self._delitem_slow(key)


def set_root_write(func: Callable[..., None]) -> None:
    """Registers ``SharedDict._setitem_slow`` with the compiled ``ViewBase``,
    which makes its root set of an immutable value itself; the twin
    ``ViewBase`` calls it as ``__setitem__`` already: nothing to do."""
    if not callable(func):
        raise TypeError("set_root_write needs a function")


class CacheGet:
    """A SharedCache handle's ``get(key, default=None)``.  The compiled one
    answers a hit on a view in sync itself (clock, expiry, recency store,
    copy); this twin asks ``slow(key)`` -- the Python rules, which return the
    value or ``missing`` -- every time, and counts the same way (it never
    reads ``view``, so it takes any handle, compiled or not)."""

    __slots__ = ("hits", "misses", "_slow", "_missing")

    def __init__(self, view: Any, recency: Any, loads: Any, slow: Any, missing: Any) -> None:
        if not callable(slow) or (loads is not None and not callable(loads)):
            raise TypeError("CacheGet: slow and loads (unless None) must be callable")
        self.hits = self.misses = 0
        self._slow = slow
        self._missing = missing

    def __call__(self, key: Any, default: Any = None) -> Any:
        value = self._slow(key)
        if value is self._missing:
            self.misses += 1
            return default
        self.hits += 1
        return value

    def release(self) -> None:
        """(The compiled one gives back its recency buffer here.)"""


# -- the reader's checks and replay --------------------------------------------------------


def parse_records(chunk: bytes, tag: int, base: int, one_msgpack: bool = False) -> Union[list[bytes], str]:
    """The payloads of the records in ``chunk`` (stream bytes from offset
    ``base``), or a str saying what is wrong: reader step 4's checks (header
    complete, payload within the chunk, generation tag, crc and, with
    ``one_msgpack``, each payload exactly one msgpack object)."""
    out: list[bytes] = []
    pos, n = 0, len(chunk)
    size = L.RECORD_HEADER
    with memoryview(chunk) as mv:
        while pos < n:
            if n - pos < size:
                return f"truncated record header at stream offset {base + pos}"
            length, rtag, crc, _ = _header.unpack_from(chunk, pos)
            start = pos + size
            if length > n - start:
                return f"record at stream offset {base + pos} overruns the published end"
            if rtag != tag & 0xFFFFFFFF:
                return f"record at stream offset {base + pos} belongs to another generation"
            body = mv[start : start + length]
            if zlib.crc32(body, zlib.crc32(mv[pos : pos + 8])) != crc:
                return f"record at stream offset {base + pos} fails its checksum"
            if one_msgpack and msgpack_length(body) != length:
                return f"record at stream offset {base + pos} is not exactly one msgpack object"
            out.append(bytes(body))
            pos = start + length
    return out


def msgpack_length(data: Any) -> int:
    """The length of the one msgpack object at the start of ``data``, or -1 if
    it does not start with a complete, well-formed object (ext payloads are
    opaque)."""
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(data), 1))
    try:
        unpacker.feed(data)
        unpacker.skip()
    except Exception:
        return -1
    end: int = unpacker.tell()
    return end


def apply_sets(
    data: dict[Any, Any], records: list[Any], start: int, op_set: int, key_types: frozenset[type]
) -> int:
    """Apply ``records[start:]`` to ``data`` while each is a root-level set of a
    key of ``key_types`` (``[op_set, [], key, value]``); the index of the first
    record not applied."""
    i, n = start, len(records)
    while 0 <= i < n:
        rec = records[i]
        if (
            type(rec) is not list
            or len(rec) != 4
            or type(rec[0]) is not int
            or rec[0] != op_set
            or type(rec[1]) is not list
            or rec[1]
            or type(rec[2]) not in key_types
        ):
            break
        data[rec[2]] = rec[3]
        i += 1
    return i


_SIMPLE_MISSING: Any = object()


def apply_simple(data: dict[Any, Any], payloads: list[Any], start: int, op_set: int) -> int:
    """Apply the record ``payloads[start:]`` to ``data`` while each is a
    root-level set of a scalar key to a scalar or a tuple of scalars as
    msgpack wrote it (fixarray 4, fixint ``op_set``, fixarray 0, key, value),
    decoded as the codec decodes them; the index of the first one not applied."""
    i, n = start, len(payloads)
    if not 0 <= op_set <= 0x7F:
        return i
    head = bytes((0x94, op_set, 0x90))
    while 0 <= i < n:
        p = payloads[i]
        if type(p) is not bytes or len(p) < 5 or p[:3] != head:
            break
        kl = msgpack_length(p[3:])
        if kl <= 0 or kl >= len(p) - 3:
            break
        key = unpack_simple(p[3 : 3 + kl], _SIMPLE_MISSING)
        if key is _SIMPLE_MISSING or type(key) is tuple:
            break
        value = unpack_simple(p[3 + kl :], _SIMPLE_MISSING)
        if value is _SIMPLE_MISSING:
            break
        data[key] = value
        i += 1
    return i


# -- the codec's type scans ----------------------------------------------------------------


def types_within(container: Any, types: frozenset[type], levels: int = 0) -> bool:
    """Whether every member of a dict (keys and values), list, tuple, set or
    frozenset is of one of the exact ``types`` -- or, within ``levels`` more
    levels, is an exact dict, list, tuple, set or frozenset whose members are."""
    if not 0 <= levels <= 16:
        raise ValueError("types_within: levels must be 0..16")
    tp = type(container)
    if tp is dict:
        if types.issuperset(map(type, container)) and types.issuperset(map(type, container.values())):
            return True
        members: Any = itertools.chain(container, container.values())
    elif tp in _SEQUENCES:
        if types.issuperset(map(type, container)):
            return True
        members = container
    else:
        raise TypeError("types_within: container must be a dict, list, tuple, set or frozenset")
    if not levels:
        return False
    for m in members:
        if type(m) not in types and not (type(m) in _CONTAINERS and types_within(m, types, levels - 1)):
            return False
    return True


_SEQUENCES = frozenset({list, tuple, set, frozenset})
_CONTAINERS = frozenset({list, tuple, set, frozenset, dict})


def contains_type(obj: Any, tp: type, max_depth: int) -> bool:
    """Whether an object of exactly ``tp`` is anywhere inside ``obj`` (lists,
    tuples, sets, frozensets, dict keys and values), or containers nest deeper
    than ``max_depth`` (treated as found).  A container at a time:
    ``set(map(type, members))`` runs in C, so a million scalars cost two passes
    at C speed; only nested containers are visited further."""
    if type(obj) is tp:
        return True
    containers = _CONTAINERS
    stack = [(obj, max_depth)] if type(obj) in containers else []
    while stack:
        item, depth = stack.pop()
        if depth < 0:
            return True
        groups = (item.keys(), item.values()) if type(item) is dict else (item,)
        for members in groups:
            found = set(map(type, members))
            if tp in found:
                return True
            if not found.isdisjoint(containers):
                stack.extend((m, depth - 1) for m in members if type(m) in containers)
    return False


def crc32(data: Any, value: int = 0) -> int:
    """zlib's CRC-32."""
    return zlib.crc32(data, value)


_table_entry = struct.Struct(TL.TABLE_ENTRY_FORMAT)
_TE = TL.TABLE_ENTRY_HEADER


def _map_count(packed: Any) -> tuple[int, int]:
    """(pair count, header length) of the msgpack map ``packed`` starts with."""
    first = packed[0] if len(packed) else -1
    if first & 0xF0 == 0x80:
        return first & 0x0F, 1
    if first == 0xDE and len(packed) >= 3:
        return int.from_bytes(packed[1:3], "big"), 3
    if first == 0xDF and len(packed) >= 5:
        return int.from_bytes(packed[1:5], "big"), 5
    raise ValueError("table_fill: packed is not a msgpack map")


def table_fill(buf: Any, off: int, packed: Any, hashes: list[int]) -> int:
    """Write an entry per pair of the msgpack map ``packed`` with ``hashes[i]``
    from ``off`` (``buf`` None: only the resulting offset); return the offset
    after them (table_layout.py, "entries")."""
    with memoryview(packed) as raw, raw.cast("B") as p:
        count, pos = _map_count(p)
        if count != len(hashes):
            raise ValueError("table_fill: the map's pair count differs from the hashes'")
        size_of = len(buf) if buf is not None else 1 << 62
        if off < TL.TABLE_HEADER or off & 7 or off > size_of:
            raise ValueError("table_fill: offset outside the buffer")
        unpacker = msgpack.Unpacker(max_buffer_size=max(len(p), 1))
        unpacker.feed(p[pos:])
        base = pos
        for h in hashes:
            try:
                unpacker.skip()
                kend = base + unpacker.tell()
                unpacker.skip()
                vend = base + unpacker.tell()
            except Exception:
                raise ValueError("table_fill: a malformed pair in the map") from None
            kl, vl = kend - pos, vend - kend
            if kl > 0xFFFFFFFF or vl > 0xFFFFFFFF:
                raise ValueError("a key or value of 4 GiB or more cannot go in a table entry")
            size = (_TE + kl + vl + 7) & ~7
            if size > size_of - off:
                raise ValueError("table_fill: the buffer is too small")
            if buf is not None:
                body = off + _TE
                buf[body : body + kl + vl] = p[pos:vend]
                buf[body + kl + vl : off + size] = bytes(size - _TE - kl - vl)
                _table_entry.pack_into(buf, off, h, kl, vl, 0, 0)
                crc = zlib.crc32(buf[body : body + kl + vl], zlib.crc32(bytes(buf[off : off + 16])))
                _table_entry.pack_into(buf, off, h, kl, vl, crc, 0)
            pos = vend
            off += size
        if pos != len(p):
            raise ValueError("table_fill: bytes after the map")
    return off


def table_index(buf: Any, slots: int, start: int, end: int, count: int) -> None:
    """Write the index of the entries between ``start`` and ``end`` (table_layout.py, "index")."""
    if (
        slots < 8
        or slots & (slots - 1)
        or start != TL.TABLE_HEADER + 8 * slots
        or not start <= end <= len(buf)
        or end > TL.TABLE_OFFSET_MASK
        or count >= slots
    ):
        raise ValueError("table_index: bounds do not fit the buffer")
    with memoryview(buf) as mv, mv[TL.TABLE_HEADER : start].cast("Q") as idx:
        for i in range(slots):
            idx[i] = 0
        mask = slots - 1
        off = seen = 0
        off = start
        while off < end:
            if off + _TE > end or seen == count:
                raise ValueError("table_index: the entries do not add up to count")
            h, kl, vl, _, _ = _table_entry.unpack_from(mv, off)
            nxt = (off + _TE + kl + vl + 7) & ~7
            if nxt > end:
                raise ValueError("table_index: an entry runs past the end")
            i = h & mask
            while idx[i]:
                i = (i + 1) & mask
            idx[i] = (h & TL.TABLE_TAG_MASK) | off
            off = nxt
            seen += 1
        if seen != count:
            raise ValueError("table_index: the entries do not add up to count")
