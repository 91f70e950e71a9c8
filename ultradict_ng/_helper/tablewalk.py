"""Pure-Python twins of tablewalk.c, a table's entries written and walked:
``table_fill`` (a bulk load's entries from one packed map), ``table_index``
(the index of the entries), ``table_merge`` (an old table's entries with
changes, into a new one), ``table_chunk`` (entries as one packed map, for
the serializer) and ``table_rows`` (a lookup table's rows decoded into a
dict), with the entry check they share with the probe's twins.

Re-exported by :mod:`.twins`; tests/test_native.py and
tests/test_unpack_simple.py compare them with the compiled ones.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Optional, Union

import msgpack  # type: ignore[import-untyped, unused-ignore]

from .._shm import table_layout as TL
from .unpack import unpack_simple

__all__ = ["table_fill", "table_index", "table_chunk", "table_rows", "table_merge", "entry_checked"]

_table_entry = struct.Struct(TL.TABLE_ENTRY_FORMAT)
_map_header = msgpack.Packer().pack_map_header
_TE = TL.TABLE_ENTRY_HEADER
_declined: Any = object()


def entry_checked(buf: Any, start: int, end: int, off: int, crc: bool = True) -> tuple[int, int, int]:
    """``(hash, key length, value length)`` of the entry at ``off`` once it is
    checked (aligned, inside the entries, zero word, and with ``crc`` its
    crc); ValueError saying what is wrong (its message starts "table
    entry", as the compiled walks')."""
    if off & 7 or off < start or off + _TE > end:
        raise ValueError("table entry offset outside the entries")
    eh, kl, vl, stored, zero = _table_entry.unpack_from(buf, off)
    if zero:
        raise ValueError("table entry has a nonzero reserved word")
    if off + _TE + kl + vl > end:
        raise ValueError("table entry runs past the entries")
    if crc and zlib.crc32(buf[off + _TE : off + _TE + kl + vl], zlib.crc32(buf[off : off + 16])) != stored:
        raise ValueError("table entry fails its checksum")
    return eh, kl, vl


def table_chunk(buf: Any, start: int, end: int, off: int, most: int) -> tuple[bytes, int]:
    """Up to ``most`` entries from ``off``, each checked, as one msgpack map
    of their keys' and values' bytes; and the offset after them."""
    if (
        start < TL.TABLE_HEADER
        or not start <= end <= len(buf)
        or not start <= off <= end
        or not 0 < most <= 0xFFFFFFFF
    ):
        raise ValueError("table_chunk: bounds do not fit the buffer")
    parts: list[bytes] = []
    n = 0
    with memoryview(buf) as mv:
        while off < end and n < most:
            _, kl, vl = entry_checked(mv, start, end, off)
            body = mv[off + _TE : off + _TE + kl + vl]
            parts.append(bytes(body))
            off = (off + _TE + kl + vl + 7) & ~7
            n += 1
    return _map_header(n) + b"".join(parts), off


def table_rows(
    buf: Any,
    start: int,
    end: int,
    off: int,
    out: Union[dict[Any, Any], list[tuple[Any, Any]]],
    skip: Optional[set[Any]] = None,
    subst: Optional[dict[Any, Any]] = None,
) -> int:
    """Decode the entries from ``off`` into ``out`` (a dict, or a list of
    pairs) while the key and (unless left out or replaced: not decoded) the
    value are :func:`unpack_simple`'s, leaving out the keys in ``skip`` and
    taking ``subst``'s values; the offset where it stopped."""
    if (
        type(out) not in (dict, list)
        or not (skip is None or type(skip) in (set, frozenset))
        or not (subst is None or type(subst) is dict)
    ):
        raise TypeError(
            "table_rows(buf, start, end, off, out: dict | list, skip: set | None = None, "
            "subst: dict | None = None)"
        )
    if start < TL.TABLE_HEADER or not start <= end <= len(buf) or not start <= off <= end:
        raise ValueError("table_rows: bounds do not fit the buffer")
    with memoryview(buf) as mv:
        while off < end:
            _, kl, vl = entry_checked(mv, start, end, off)
            key = unpack_simple(bytes(mv[off + _TE : off + _TE + kl]), _declined)
            if key is _declined:
                break
            if not skip or key not in skip:  # (a value left out or replaced is not decoded)
                value = subst.get(key, _declined) if subst else _declined
                if value is _declined:
                    value = unpack_simple(bytes(mv[off + _TE + kl : off + _TE + kl + vl]), _declined)
                    if value is _declined:
                        break
                if isinstance(out, dict):
                    out[key] = value
                else:
                    out.append((key, value))
            off = (off + _TE + kl + vl + 7) & ~7
    return off


def table_merge(
    dst: Any, off: int, src: Any, start: int, end: int, changes: list[tuple[int, Optional[bytes]]]
) -> int:
    """The entries ``src[start:end]`` with ``changes`` ((offset, new value
    bytes, or None to drop the entry), sorted by offset) written to ``dst``
    from ``off`` (None: only counted); the offset after them.  Unchanged runs
    are copied as bytes.  A damaged changed entry: ValueError whose message
    starts "table entry" (``table_chunk``'s form)."""
    if (
        off < 0
        or off & 7
        or (dst is not None and off > len(dst))
        or start < TL.TABLE_HEADER
        or start & 7
        or not start <= end <= len(src)
    ):
        raise ValueError("table_merge: bounds do not fit the buffers")
    room = len(dst) if dst is not None else None
    pos = start
    with memoryview(src) as mv:
        for i in range(len(changes) + 1):
            at, value = end, None
            if i < len(changes):
                change = changes[i]
                if type(change) is not tuple or len(change) != 2:
                    raise ValueError("table_merge: a change is not an (offset, value) pair")
                at, value = change
                if value is not None and type(value) is not bytes:
                    raise ValueError("table_merge: a new value is not bytes")
                if at < pos:
                    raise ValueError("table_merge: offsets not sorted, or not the start of an entry")
            if at < pos:  # (the last changed entry's padding past an unaligned end)
                raise ValueError("table entry runs past the entries")
            if room is not None and at - pos > room - off:
                raise ValueError("table_merge: the buffer is too small")
            if dst is not None:
                dst[off : off + at - pos] = mv[pos:at]
            off += at - pos
            if i == len(changes):
                break
            eh, kl, vl = entry_checked(mv, start, end, at)
            pos = (at + _TE + kl + vl + 7) & ~7
            if value is None:
                continue
            if len(value) > 0xFFFFFFFF:
                raise ValueError("a key or value of 4 GiB or more cannot go in a table entry")
            size = (_TE + kl + len(value) + 7) & ~7
            if room is not None and size > room - off:
                raise ValueError("table_merge: the buffer is too small")
            if dst is not None:
                body = bytes(mv[at + _TE : at + _TE + kl]) + value
                head = _table_entry.pack(eh, kl, len(value), 0, 0)[:16]
                crc = zlib.crc32(body, zlib.crc32(head))
                dst[off : off + size] = (
                    _table_entry.pack(eh, kl, len(value), crc, 0) + body + bytes(size - _TE - len(body))
                )
            off += size
    return off


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
