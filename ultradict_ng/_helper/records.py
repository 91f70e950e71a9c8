"""Pure-Python twins of records.c: the reader's checks of copied stream bytes
(``parse_records``), the framing check (``msgpack_length``), the replay of
runs of root-level scalar sets (``apply_sets``, ``apply_simple``) and zlib's
CRC-32 (``crc32``).  tests/test_native.py compares each with the compiled one.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]

from .._shm import layout as L
from .tablecache import TableCacheBase
from .unpack import unpack_simple

__all__ = ["parse_records", "msgpack_length", "apply_sets", "apply_simple", "crc32"]


_header = struct.Struct(L.RECORD_FORMAT)


def parse_records(chunk: bytes, tag: int, base: int, one_msgpack: bool = False) -> list[bytes]:
    """The payloads of the records in ``chunk`` (stream bytes from offset
    ``base``); ValueError saying what is wrong: reader step 4's checks (header
    complete, payload within the chunk, generation tag, crc and, with
    ``one_msgpack``, each payload exactly one msgpack object)."""
    out: list[bytes] = []
    pos, n = 0, len(chunk)
    size = L.RECORD_HEADER
    with memoryview(chunk) as mv:
        while pos < n:
            if n - pos < size:
                raise ValueError(f"truncated record header at stream offset {base + pos}")
            length, rtag, crc, _ = _header.unpack_from(chunk, pos)
            start = pos + size
            if length > n - start:
                raise ValueError(f"record at stream offset {base + pos} overruns the published end")
            if rtag != tag & 0xFFFFFFFF:
                raise ValueError(f"record at stream offset {base + pos} belongs to another generation")
            body = mv[start : start + length]
            if zlib.crc32(body, zlib.crc32(mv[pos : pos + 8])) != crc:
                raise ValueError(f"record at stream offset {base + pos} fails its checksum")
            if one_msgpack and msgpack_length(body) != length:
                raise ValueError(f"record at stream offset {base + pos} is not exactly one msgpack object")
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


def _simple_key(data: bytes) -> Any:
    """The key ``data`` encodes as ``apply_simple`` takes it: a scalar (a tuple
    is no key here: ``apply_sets``' rule); else ``_SIMPLE_MISSING``."""
    key = unpack_simple(data, _SIMPLE_MISSING)
    return _SIMPLE_MISSING if type(key) is tuple else key


def apply_simple(data: Any, payloads: list[Any], start: int, op_set: int, op_del: int = -1) -> int:
    """Apply the record ``payloads[start:]`` to ``data`` (a dict, or a big
    dict's cache: a ``TableCacheBase``, through its own set and delete) while
    each is a root-level set of a scalar key to a scalar or a tuple of
    scalars as msgpack wrote it (fixarray 4, fixint ``op_set``, fixarray 0,
    key, value), or a root-level delete of a scalar key the cache holds
    (fixarray 3, fixint ``op_del``, fixarray 0, key), decoded as the codec
    decodes them; the index of the first one not applied."""
    if type(data) is not dict and not isinstance(data, TableCacheBase):
        raise TypeError("apply_simple(data: dict | TableCacheBase, payloads: list, start, op_set[, op_del])")
    i, n = start, len(payloads)
    if not 0 <= op_set <= 0x7F:
        return i
    if op_del > 0x7F or op_del == op_set:
        op_del = -1
    head = bytes((0x94, op_set, 0x90))
    drop = bytes((0x93, op_del, 0x90)) if op_del >= 0 else None
    while 0 <= i < n:
        p = payloads[i]
        if type(p) is not bytes:
            break
        if drop is not None and len(p) >= 4 and p[:3] == drop:
            if msgpack_length(p[3:]) != len(p) - 3:
                break
            key = _simple_key(p[3:])
            if key is _SIMPLE_MISSING:
                break
            try:
                del data[key]
            except KeyError:
                break  # (not held: the general path reports the record)
            i += 1
            continue
        if len(p) < 5 or p[:3] != head:
            break
        kl = msgpack_length(p[3:])
        if kl <= 0 or kl >= len(p) - 3:
            break
        key = _simple_key(p[3 : 3 + kl])
        if key is _SIMPLE_MISSING:
            break
        value = unpack_simple(p[3 + kl :], _SIMPLE_MISSING)
        if value is _SIMPLE_MISSING:
            break
        data[key] = value
        i += 1
    return i


def crc32(data: Any, value: int = 0) -> int:
    """zlib's CRC-32."""
    return zlib.crc32(data, value)
