"""Pure-Python twins of the compiled helper's walks over a table's entries
(table.c): ``table_chunk`` (entries as one packed map, for the serializer),
``table_rows`` (a lookup table's rows decoded into a dict) and
``table_merge`` (an old table's entries with changes, into a new one), with
the entry check they share with the probe's twins.

Re-exported by :mod:`.twins`; tests/test_native.py and
tests/test_unpack_simple.py compare them with the compiled ones.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Optional, Union

import msgpack  # type: ignore[import-untyped, unused-ignore]

from .. import table_layout as TL
from .packing import unpack_simple

__all__ = ["table_chunk", "table_rows", "table_merge", "entry_checked"]

_table_entry = struct.Struct(TL.TABLE_ENTRY_FORMAT)
_map_header = msgpack.Packer().pack_map_header
_TE = TL.TABLE_ENTRY_HEADER
_declined: Any = object()


def entry_checked(buf: Any, start: int, end: int, off: int) -> Union[str, tuple[int, int, int]]:
    """``(hash, key length, value length)`` of the entry at ``off`` once it is
    checked (aligned, inside the entries, zero word, crc), or what is wrong."""
    if off & 7 or off < start or off + _TE > end:
        return "table entry offset outside the entries"
    eh, kl, vl, crc, zero = _table_entry.unpack_from(buf, off)
    if zero:
        return "table entry has a nonzero reserved word"
    if off + _TE + kl + vl > end:
        return "table entry runs past the entries"
    if zlib.crc32(buf[off + _TE : off + _TE + kl + vl], zlib.crc32(buf[off : off + 16])) != crc:
        return "table entry fails its checksum"
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
            checked = entry_checked(mv, start, end, off)
            if isinstance(checked, str):
                raise ValueError(checked)
            _, kl, vl = checked
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
    pairs) while key and value are :func:`unpack_simple`'s, leaving out the
    keys in ``skip`` and taking ``subst``'s values; the offset where it stopped."""
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
            checked = entry_checked(mv, start, end, off)
            if isinstance(checked, str):
                raise ValueError(checked)
            _, kl, vl = checked
            key = unpack_simple(bytes(mv[off + _TE : off + _TE + kl]), _declined)
            value = unpack_simple(bytes(mv[off + _TE + kl : off + _TE + kl + vl]), _declined)
            if key is _declined or value is _declined:
                break
            if not skip or key not in skip:
                if subst:
                    value = subst.get(key, value)
                if isinstance(out, dict):
                    out[key] = value
                else:
                    out.append((key, value))
            off = (off + _TE + kl + vl + 7) & ~7
    return off


def table_merge(
    dst: Any, off: int, src: Any, start: int, end: int, changes: list[tuple[int, Optional[bytes]]]
) -> Union[int, str]:
    """The entries ``src[start:end]`` with ``changes`` ((offset, new value
    bytes, or None to drop the entry), sorted by offset) written to ``dst``
    from ``off`` (None: only counted); the offset after them, or the reason
    a changed entry is damaged.  Unchanged runs are copied as bytes."""
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
                return "table entry runs past the entries"
            if room is not None and at - pos > room - off:
                raise ValueError("table_merge: the buffer is too small")
            if dst is not None:
                dst[off : off + at - pos] = mv[pos:at]
            off += at - pos
            if i == len(changes):
                break
            checked = entry_checked(mv, start, end, at)
            if isinstance(checked, str):
                return checked
            eh, kl, vl = checked
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
