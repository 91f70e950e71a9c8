"""The table: one dict's entries in a hash-indexed form read in place.

Why: a dump (layout: "Dump") is one serializer payload, so a process must
decode all of it before it can answer one lookup -- at a million keys, a
second and hundreds of MiB per process.  A table is the same data
laid out so that a process that only *maps* it can answer ``key in d`` and
``d[key]`` with a hash, a probe and the decoding of one entry, and can walk the
entries in insertion order without an index of its own.  It never changes once
written, so readers need no lock and no retry while they hold it.

Layout: "Table" in layout.py is the format (header, index slots, entries);
this module writes and reads it and does nothing else:

* :func:`map_size` / :func:`write_map` build a table from a dict packed whole
  by the serializer, :func:`table_size` / :func:`write_table` from encoded
  entries ``(hash, key bytes, value bytes)``, into a caller's buffer (the
  caller makes the segment); the entries and the index are written by the
  compiled helper (``speedups.table_fill`` / ``table_index``) or its twins;
* :class:`Table` reads one: header checks at open (O(1): nothing is decoded
  or summed over the whole table), :meth:`Table.find` to probe, each entry's
  checksum verified when it is read;
* :class:`Merge` plans a new table from an old one and the changes since,
  copying the bytes of every unchanged entry: reorganising costs memory
  bandwidth and one compiled pass over the entry headers, never a decode or
  encode of an unchanged key or value.

Keys are hashed with :func:`~ultradict_ng._codec.keyhash.key_hash` (the same in
every process) by the caller, which also supplies the serializer's ``loads``
for the key comparison a probe ends with: the table itself never interprets
a key or a value.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any, Callable, Optional, Union, cast

import msgpack  # type: ignore[import-untyped, unused-ignore]

from .._codec.decode import gc_paused
from .._codec.keyhash import key_hash
from ..errors import CorruptSegment, UnsupportedType
from ..speedups import (
    key_hash_common,
    stream_merge_plan,
    stream_merge_write,
    table_candidates,
    table_chunk,
    table_entry,
    table_fill,
    table_get,
    table_index,
    table_merge,
    table_rows,
)
from . import layout as L
from . import table_layout as TL

__all__ = [
    "Table",
    "Merge",
    "StreamMerge",
    "table_size",
    "write_table",
    "write_map",
    "map_size",
    "entry_size",
    "slots_for",
    "hash_key",
    "root_hashes",
    "encode_entries",
    "pack_pairs",
]

_Buffer = Union[bytes, bytearray, memoryview]
Entry = tuple[int, _Buffer, _Buffer]
_first = itemgetter(0)

_header = struct.Struct(TL.TABLE_FORMAT)
_map_header: Callable[[int], bytes] = msgpack.Packer().pack_map_header
_entry = struct.Struct(TL.TABLE_ENTRY_FORMAT)
_EH = TL.TABLE_ENTRY_HEADER
_OFF = TL.TABLE_OFFSET_MASK


def hash_key(key: Any) -> int:
    """The table hash of ``key`` (``_codec/keyhash.py``): compiled for the
    common key types, the Python definition for the rest and for errors."""
    h = key_hash_common(key)
    return key_hash(key) if h is None else h


def root_hashes(data: dict[Any, Any]) -> Optional[list[int]]:
    """The table hashes of ``data``'s keys in its order, or None if a key has
    none (the msgpack serializer stores no such key; a dump of one would take
    the payload form, which holds any)."""
    hashes: list[Any] = list(map(key_hash_common, data))  # (compiled; None: not a common key type)
    if None in hashes:
        try:
            hashes = [key_hash(k) if h is None else h for k, h in zip(data, hashes)]
        except (UnsupportedType, TypeError):
            return None
    return hashes


def entry_size(key_len: int, value_len: int) -> int:
    """Bytes an entry takes, header and padding to 8 included."""
    return (_EH + key_len + value_len + 7) & ~7


def slots_for(count: int) -> int:
    """Index slots for ``count`` entries: the least power of two keeping the
    load at most ``TABLE_MAX_LOAD`` (and at least 8)."""
    slots = 8
    while count > slots * TL.TABLE_MAX_LOAD:
        slots <<= 1
    return slots


def table_size(count: int, entries_bytes: int) -> int:
    """Size of a table of ``count`` entries taking ``entries_bytes`` together."""
    return TL.TABLE_HEADER + 8 * slots_for(count) + entries_bytes


def pack_pairs(entries: Sequence[Entry]) -> bytes:
    """``entries`` as the msgpack map ``table_fill`` writes entries from: a map
    header, then each key's and value's encoding as they are."""
    return _map_header(len(entries)) + b"".join(bytes(k) + bytes(v) for _, k, v in entries)


def _finish(buf: memoryview, count: int, slots: int, entries_end: int, generation: int, token: int) -> None:
    """Index the entries, then write the header last (its crc covers the rest of it)."""
    start = TL.TABLE_HEADER + 8 * slots
    if entries_end > _OFF:
        raise ValueError("a table of 1 TiB or more cannot be indexed")
    table_index(buf, slots, start, entries_end, count)
    fields = (TL.TABLE_MAGIC, generation, count, slots, start, entries_end, token)
    crc = zlib.crc32(_header.pack(*fields, 0, 0)[:-8])
    _header.pack_into(buf, 0, *fields, crc, 0)


def write_table(buf: memoryview, entries: Sequence[Entry], generation: int, token: int) -> int:
    """Write a table of ``entries`` (unique keys, in the order they keep) into
    ``buf``, which holds at least :func:`table_size` bytes; return that size."""
    return write_map(buf, pack_pairs(entries), [h for h, _, _ in entries], generation, token)


def map_size(packed: _Buffer, hashes: list[int]) -> int:
    """Size of the table :func:`write_map` makes of ``packed`` (nothing written)."""
    slots = slots_for(len(hashes))
    return table_fill(None, TL.TABLE_HEADER + 8 * slots, packed, hashes)


def write_map(buf: memoryview, packed: _Buffer, hashes: list[int], generation: int, token: int) -> int:
    """Write the table of a dict packed whole by the serializer (a msgpack map,
    its keys unique under ``==``) into ``buf`` (at least :func:`map_size`
    bytes), ``hashes`` being its keys' in order; return its size.

    Why from one packed map: packing a dict in one call and splitting it into
    entries in compiled code costs memory copies, not an object per entry --
    how a bulk load of a million keys stays below a second."""
    slots = slots_for(len(hashes))
    end = table_fill(buf, TL.TABLE_HEADER + 8 * slots, packed, hashes)
    _finish(buf, len(hashes), slots, end, generation, token)
    return end


class Table:
    """A table mapped by this process (read only; layout: "Table").

    Opening checks the header against the buffer (``CorruptSegment`` when
    anything is off) and decodes nothing else.  Every entry read is checked
    (bounds, checksum) before its bytes are handed out, so a damaged table
    raises ``CorruptSegment`` where it is damaged rather than returning
    garbage.  The views returned point into the buffer: they stay valid while
    the table is open.
    """

    __slots__ = ("buf", "generation", "count", "slots", "start", "end", "token", "where")

    def __init__(self, buf: memoryview, token: int, where: str = "table") -> None:
        if len(buf) < TL.TABLE_HEADER:
            raise CorruptSegment(f"{where}: {len(buf)} bytes is too short for a table")
        (magic, gen, count, slots, start, end, tok, crc, _) = _header.unpack_from(buf, 0)
        if magic != TL.TABLE_MAGIC:
            raise CorruptSegment(f"{where} is not an ultradict_ng table")
        if zlib.crc32(bytes(buf[: _header.size - 8])) != crc:
            raise CorruptSegment(f"{where}: the table header fails its checksum")
        if tok != token:
            raise CorruptSegment(f"{where} belongs to another dict (token {tok:#x})")
        if (
            slots < 8
            or slots & (slots - 1)
            or count > slots * TL.TABLE_MAX_LOAD
            or start != TL.TABLE_HEADER + 8 * slots
            or not start <= end <= len(buf)
            or end > _OFF
            or end - start < count * _EH
        ):
            raise CorruptSegment(
                f"{where}: impossible table header "
                f"(count {count}, slots {slots}, entries {start}..{end}, "
                f"{len(buf)} bytes)"
            )
        self.buf = buf
        self.generation, self.count, self.slots = gen, count, slots
        self.start, self.end, self.token = start, end, tok
        self.where = where  # (names the table in every error: "dump 'N@d3'")

    def close(self) -> None:
        """Nothing of ``buf`` is held here (the probes read it through the
        helper, per call): the caller releases ``buf`` and its segment.  Kept
        so that every holder of a table ends it the same way."""

    def _damaged(self, exc: ValueError) -> CorruptSegment:
        """The helper's account of damage (its message starts "table"), said of this table."""
        return CorruptSegment(f"{self.where}: {exc}")

    def entry(self, off: int) -> tuple[int, memoryview, memoryview, int]:
        """``(hash, key bytes, value bytes, next offset)`` of the entry at ``off``,
        checked by the helper (``table_entry``) as its probe checks entries."""
        try:
            h, kl, vl = table_entry(self.buf, self.slots, self.start, self.end, off)
        except ValueError as exc:
            raise self._damaged(exc) from None
        body = off + _EH
        end = body + kl + vl
        return h, self.buf[body : body + kl], self.buf[body + kl : end], (end + 7) & ~7

    def find(self, key: Any, h: int, loads: Callable[[Any], Any]) -> int:
        """Offset of the entry whose key equals ``key`` (hashed ``h``), or 0:
        the helper's probe (``table_candidates``, with offsets) gives the
        entries of that full hash, checked; each key is decoded and compared
        (``==``, as a dict compares keys whose hashes agree)."""
        try:
            found = table_candidates(self.buf, self.slots, self.start, self.end, h, True)
        except ValueError as exc:
            raise self._damaged(exc) from None
        for off, kb, _ in cast(list[tuple[int, bytes, bytes]], found):
            k = loads(kb)
            if k is key or k == key:
                return off
        return 0

    def locate(self, key: Any, loads: Callable[[Any], Any]) -> int:
        """:meth:`find` hashing ``key`` itself: the offset of its checked
        entry, or 0.  A str, bytes or int key is probed by its encoding in
        compiled code, which leaves an int to :meth:`find` only when an entry
        of its hash holds another encoding (an equal float or bool may)."""
        t = type(key)
        if t is str or t is bytes or t is int:
            try:
                got = table_get(self.buf, self.slots, self.start, self.end, key, True)
            except ValueError as exc:
                raise self._damaged(exc) from None
            if got != -1:
                return cast(int, got)
        return self.find(key, hash_key(key), loads)

    def lookup(self, key: Any, loads: Callable[[Any], Any]) -> Optional[bytes]:
        """The value bytes of ``key``, or None: a hash, a probe, one entry
        checked, the value left encoded for the caller -- compiled where
        the helper is (``speedups.table_get`` / ``table_candidates``).  A
        str or bytes key is compared as its encoding; any other is decoded
        from each entry of its full hash (rarely more than one) and compared
        with ``==``, as a dict compares keys whose hashes agree."""
        t = type(key)
        try:
            if t is str or t is bytes:
                return cast(Optional[bytes], table_get(self.buf, self.slots, self.start, self.end, key))
            found = table_candidates(self.buf, self.slots, self.start, self.end, hash_key(key))
        except ValueError as exc:
            raise self._damaged(exc) from None
        for kb, vb in cast(list[tuple[bytes, bytes]], found):
            k = loads(kb)
            if k is key or k == key:
                return vb
        return None

    def offsets(self) -> Iterator[int]:
        """Offsets of the entries in their order (headers checked as walked)."""
        off, seen, end, buf = self.start, 0, self.end, self.buf
        unpack = _entry.unpack_from
        while off < end:
            if off > end - _EH:
                raise CorruptSegment(f"{self.where}: table entries end inside an entry header at {off}")
            _, kl, vl, _, _ = unpack(buf, off)
            nxt = (off + _EH + kl + vl + 7) & ~7
            if nxt > end:
                raise CorruptSegment(f"{self.where}: table entry at {off} runs past the entries")
            yield off
            seen += 1
            off = nxt
        if seen != self.count:
            raise CorruptSegment(f"{self.where}: table holds {seen} entries, its header says {self.count}")

    def decoded(self, loads: Callable[[Any], Any], chunk: int = 4096) -> Iterator[tuple[Any, Any]]:
        """Every ``(key, value)`` in order, decoded ``chunk`` entries per
        serializer call (``speedups.table_chunk`` packs them as one map):
        a walk of a million entries costs a few hundred decoder calls, and
        holds one chunk decoded at a time."""
        off, seen = self.start, 0
        while off < self.end:
            try:
                packed, off = table_chunk(self.buf, self.start, self.end, off, chunk)
            except ValueError as exc:
                raise CorruptSegment(f"{self.where}: {exc}") from None
            part = loads(packed)
            seen += len(part)
            yield from part.items()
        if seen != self.count:
            raise CorruptSegment(f"{self.where}: table holds {seen} entries, its header says {self.count}")

    def decode_all(
        self,
        loads: Callable[[Any], Any],
        rows: bool = True,
        skip: Optional[set[Any]] = None,
        subst: Optional[dict[Any, Any]] = None,
    ) -> dict[Any, Any]:
        """Every entry, each checked, in order, the keys in ``skip`` (entries
        of this table) left out and ``subst``'s values taken.  With ``rows``
        (the msgpack serializer's table: every dump's) the compiled
        ``table_rows`` decodes the entries whose key and value are scalars or
        tuples of them -- a lookup table, whole -- and the serializer the
        rest, as one map in one call (from the first entry that is not such
        a row on).  Into a ``dict`` directly: a big dict's copy makes no list
        of a million pairs first (a third of its time)."""
        data: dict[Any, Any] = {}
        skip = skip or None
        rest = self._walk(loads, rows, data, skip, subst)
        if rest is not None:
            if not (data or skip or subst):
                data = rest
            else:
                get = (subst or {}).get
                for k, v in rest.items():
                    if not skip or k not in skip:
                        data[k] = get(k, v)
        self._added_up(len(data) + len(skip or ()))  # (every key of skip is an entry's)
        return data

    def decode_pairs(
        self, loads: Callable[[Any], Any], rows: bool, skip: set[Any], subst: Optional[dict[Any, Any]]
    ) -> tuple[list[tuple[Any, Any]], int]:
        """:meth:`decode_all`'s walk as a list of ``(key, value)`` pairs, the keys
        in ``skip`` (entries of this table) left out and ``subst``'s values
        taken: what a walk of a big dict hands out, without the dict that
        applying those changes would need.  Also how many leading pairs are
        rows the compiled walk decoded and nothing replaced: scalars or tuples
        of them, which a snapshot hands out without checking them again."""
        out: list[tuple[Any, Any]] = []
        rest = self._walk(loads, rows, out, skip, subst)
        known = 0 if subst else len(out)
        if rest is not None:
            get = (subst or {}).get
            out.extend([(k, get(k, v)) for k, v in rest.items() if k not in skip])
        self._added_up(len(out) + len(skip))  # (every key of skip is an entry's)
        return out, known

    def _walk(
        self,
        loads: Callable[[Any], Any],
        rows: bool,
        out: Any,
        skip: Optional[set[Any]],
        subst: Optional[dict[Any, Any]],
    ) -> Optional[dict[Any, Any]]:
        """The entries' compiled walk into ``out`` (``table_rows``, with ``rows``),
        then the rest decoded by the serializer, returned (None: nothing left)."""
        off = self.start
        try:
            if rows:
                with gc_paused():  # (a million rows are a million tracked tuples)
                    off = table_rows(self.buf, self.start, self.end, off, out, skip, subst)
            end = off
            if off < self.end:
                packed, end = table_chunk(self.buf, self.start, self.end, off, max(self.count, 1))
        except ValueError as exc:
            raise CorruptSegment(f"{self.where}: {exc}") from None
        if end != self.end:  # (the walk ended short of the entries' end)
            raise self._not_added_up()
        if off == self.end:
            return None
        rest = loads(packed)
        if type(rest) is not dict:
            raise CorruptSegment(f"{self.where}: its entries are not a map")
        return rest

    def check(self) -> None:
        """Every entry checked (bounds, reserved word, crc) and counted, nothing
        decoded.  Why: a merge copies the entries it does not change as bytes,
        crc and all, so a damaged one would pass into the new table unseen; a
        recovery checks the table it merges into its checkpoint first."""
        off, entries = self.start, 0
        try:
            while off < self.end:
                packed, off = table_chunk(self.buf, self.start, self.end, off, 1 << 16)
                head = packed[0]
                entries += (
                    head & 0x0F
                    if head < 0x90
                    else int.from_bytes(packed[1 : 3 if head == 0xDE else 5], "big")
                )
        except ValueError as exc:
            raise CorruptSegment(f"{self.where}: {exc}") from None
        self._added_up(entries)

    def check_index(self) -> None:
        """The index rebuilt from the entries (as every writer builds it: the
        same slots, byte for byte) and compared with the table's.  Why apart
        from :meth:`check`: it costs a pass and a copy of the table, which an
        open never pays -- the index is not checksummed (table_layout.py) --
        while on a disk, damage there makes present keys read as absent;
        ``doctor`` finds it."""
        scratch = bytearray(self.end)
        scratch[self.start : self.end] = self.buf[self.start : self.end]
        try:
            table_index(scratch, self.slots, self.start, self.end, self.count)
        except ValueError as exc:
            raise CorruptSegment(f"{self.where}: {exc}") from None
        if scratch[TL.TABLE_HEADER : self.start] != self.buf[TL.TABLE_HEADER : self.start]:
            raise CorruptSegment(f"{self.where}: its hash index does not match its entries (damaged)")

    def _added_up(self, entries: int) -> None:
        if entries != self.count:
            raise self._not_added_up()

    def _not_added_up(self) -> CorruptSegment:
        return CorruptSegment(
            f"{self.where}: its entries do not add up to the {self.count} its header counts"
        )

    def items(self) -> Iterator[tuple[memoryview, memoryview]]:
        """``(key bytes, value bytes)`` of every entry in order, each checked."""
        for off in self.offsets():
            _, kb, vb, _ = self.entry(off)
            yield kb, vb


class Merge:
    """A new table planned from an old one and the changes made since.

    The caller says, in the old table's terms, what became of its entries --
    ``changes``, ``(offset, None)`` for an entry deleted (also one deleted and
    set again, which moves to the end as a ``dict`` moves it) and ``(offset,
    new value bytes)`` for one overwritten (it keeps the key's place), in any
    order, one per entry -- and lists the ``appended`` entries in insertion
    order.  Both planning and
    writing are one compiled pass over the changes (``table_merge``): the
    changed entries are read and checked, the runs of unchanged entries
    between them copied as bytes, never walked; an entry whose value
    changed keeps its key bytes and gets a new checksum.
    """

    def __init__(
        self, old: Table, changes: list[tuple[int, Optional[bytes]]], appended: Sequence[Entry]
    ) -> None:
        self.old = old
        changes.sort(key=_first)  # (table_merge refuses an entry changed twice)
        self._changes = changes
        removed = sum(1 for _, v in changes if v is None)
        self._appended = list(appended)
        size = self._merged(None, 0)  # (the old entries' bytes after the changes: counted, not written)
        for _, kb, vb in self._appended:
            size += entry_size(len(kb), len(vb))
        self.count = old.count - removed + len(appended)
        self.entries_bytes = size
        self.size = table_size(self.count, size)

    def _merged(self, buf: Optional[memoryview], off: int) -> int:
        old = self.old
        problem = ""
        try:
            return table_merge(buf, off, old.buf, old.start, old.end, self._changes)
        except ValueError as exc:
            if not str(exc).startswith("table entry"):
                raise  # (a caller's mistake, not damage)
            problem = str(exc)  # (dropped here: a twin's frames may hold views of the segments)
        raise CorruptSegment(f"{old.where}: {problem}")

    def write(self, buf: memoryview, generation: int, token: int) -> int:
        """Write the new table into ``buf`` (at least ``size`` bytes); return its size.

        The old entries (merged) first, then the appended ones, each entry's
        checksum with it, so whoever reads an entry of the new table checks
        it then.  The index is built afresh by walking the new entries'
        headers in compiled code (offsets moved), which also checks that
        they add up to ``count``."""
        slots = slots_for(self.count)
        off = self._merged(buf, TL.TABLE_HEADER + 8 * slots)
        if self._appended:
            off = table_fill(buf, off, pack_pairs(self._appended), [h for h, _, _ in self._appended])
        _finish(buf, self.count, slots, off, generation, token)
        return off


class StreamMerge:
    """A new table planned from an old one and a stream's records, as bytes
    (``stream_merge_plan``: root-level sets and deletes of str and int keys; recovery's
    checkpoint, ``_disk/layout.py`` step e).  Like :class:`Merge`, nothing
    is decoded or encoded: the old entries are kept, given a record's value
    bytes or dropped, and the keys the table did not hold appended in the
    order the records made them present.  None of :meth:`planned` when a
    record does not qualify: the caller decodes and replays instead."""

    __slots__ = ("old", "stream", "count", "size", "_plan")

    def __init__(self, old: Table, stream: Any, count: int, entries_bytes: int, plan: object) -> None:
        self.old, self.stream, self._plan = old, stream, plan
        self.count = count
        self.size = table_size(count, entries_bytes)

    @classmethod
    def planned(cls, old: Table, stream: Any, end: int) -> Optional[StreamMerge]:
        """The merge of the records ``stream[0:end]`` (whole, of the table's
        generation: recovery's scan) into ``old``; a damaged entry of ``old``
        is ``CorruptSegment``."""
        try:
            got = stream_merge_plan(stream, end, old.buf, old.slots, old.start, old.end, L.OP_SET, L.OP_DEL)
        except ValueError as exc:
            if not str(exc).startswith("table entr"):
                raise
            raise CorruptSegment(f"{old.where}: {exc}") from None
        return None if got is None else cls(old, stream, got[0], got[1], got[2])

    def write(self, buf: memoryview, generation: int, token: int) -> int:
        """Write the new table into ``buf`` (at least ``size`` bytes), header last; its size."""
        old, slots = self.old, slots_for(self.count)
        off = stream_merge_write(
            self._plan, self.stream, old.buf, old.slots, old.start, old.end, buf, TL.TABLE_HEADER + 8 * slots
        )
        _finish(buf, self.count, slots, off, generation, token)
        return off


def encode_entries(items: Iterable[tuple[Any, Any]], dumps: Callable[[Any], bytes]) -> list[Entry]:
    """``(hash, key bytes, value bytes)`` for each of ``items`` (a dict's, so
    keys are unique under ``==``), in their order."""
    return [(hash_key(k), dumps(k), dumps(v)) for k, v in items]
