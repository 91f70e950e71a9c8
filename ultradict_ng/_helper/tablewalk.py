"""Pure-Python twins of the compiled helper's walks over a table's entries
(table.c): ``table_chunk`` (entries as one packed map, for the serializer)
and ``table_rows`` (a lookup table's rows decoded into a dict), with the
entry check they share with the probe's twins.

Re-exported by :mod:`.twins`; tests/test_native.py and
tests/test_unpack_simple.py compare them with the compiled ones.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Dict, List, Optional, Set, Tuple, Union

import msgpack  # type: ignore[import-untyped, unused-ignore]

from .. import table_layout as TL
from .packing import unpack_simple

__all__ = ["table_chunk", "table_rows", "entry_checked"]

_table_entry = struct.Struct(TL.TABLE_ENTRY_FORMAT)
_map_header = msgpack.Packer().pack_map_header
_TE = TL.TABLE_ENTRY_HEADER
_declined: Any = object()


def entry_checked(buf: Any, start: int, end: int, off: int) -> Union[str, Tuple[int, int, int]]:
    """``(hash, key length, value length)`` of the entry at ``off`` once it is
    checked (aligned, inside the entries, zero word, crc), or what is wrong."""
    if off & 7 or off < start or off + _TE > end:
        return "table entry offset outside the entries"
    eh, kl, vl, crc, zero = _table_entry.unpack_from(buf, off)
    if zero:
        return "table entry has a nonzero reserved word"
    if off + _TE + kl + vl > end:
        return "table entry runs past the entries"
    if zlib.crc32(buf[off + _TE:off + _TE + kl + vl], zlib.crc32(buf[off:off + 16])) != crc:
        return "table entry fails its checksum"
    return eh, kl, vl


def table_chunk(buf: Any, start: int, end: int, off: int, most: int) -> Tuple[bytes, int]:
    """Up to ``most`` entries from ``off``, each checked, as one msgpack map
    of their keys' and values' bytes; and the offset after them."""
    if (start < TL.TABLE_HEADER or not start <= end <= len(buf) or not start <= off <= end
            or not 0 < most <= 0xFFFFFFFF):
        raise ValueError("table_chunk: bounds do not fit the buffer")
    parts: List[bytes] = []
    n = 0
    with memoryview(buf) as mv:
        while off < end and n < most:
            checked = entry_checked(mv, start, end, off)
            if isinstance(checked, str):
                raise ValueError(checked)
            _, kl, vl = checked
            body = mv[off + _TE:off + _TE + kl + vl]
            parts.append(bytes(body))
            off = (off + _TE + kl + vl + 7) & ~7
            n += 1
    return _map_header(n) + b"".join(parts), off


def table_rows(buf: Any, start: int, end: int, off: int, out: Union[Dict[Any, Any], List[Tuple[Any, Any]]],
               skip: Optional[Set[Any]] = None, subst: Optional[Dict[Any, Any]] = None) -> int:
    """Decode the entries from ``off`` into ``out`` (a dict, or a list of
    pairs) while key and value are :func:`unpack_simple`'s, leaving out the
    keys in ``skip`` and taking ``subst``'s values; the offset where it stopped."""
    if type(out) not in (dict, list) or not (skip is None or type(skip) in (set, frozenset)) or not (
            subst is None or type(subst) is dict):
        raise TypeError("table_rows(buf, start, end, off, out: dict | list, skip: set | None = None, "
                        "subst: dict | None = None)")
    if start < TL.TABLE_HEADER or not start <= end <= len(buf) or not start <= off <= end:
        raise ValueError("table_rows: bounds do not fit the buffer")
    with memoryview(buf) as mv:
        while off < end:
            checked = entry_checked(mv, start, end, off)
            if isinstance(checked, str):
                raise ValueError(checked)
            _, kl, vl = checked
            key = unpack_simple(bytes(mv[off + _TE:off + _TE + kl]), _declined)
            value = unpack_simple(bytes(mv[off + _TE + kl:off + _TE + kl + vl]), _declined)
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
