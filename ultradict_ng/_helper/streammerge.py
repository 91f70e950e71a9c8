"""Pure-Python twin of streammerge.c: ``stream_merge_plan`` and
``stream_merge_write``, recovery's checkpoint merged from the bytes of a table
and of the stream's records (the C file says why and how).  Same arguments,
results, errors and bytes; tests/test_streammerge.py compares the two.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Optional

from .._codec.keyhash import key_hash
from .._shm import table_layout as TL
from .records import msgpack_length
from .tableprobe import table_bounds
from .tablewalk import entry_checked

__all__ = ["stream_merge_plan", "stream_merge_write"]

_TE = TL.TABLE_ENTRY_HEADER
_entry = struct.Struct(TL.TABLE_ENTRY_FORMAT)
#: First bytes of table keys a dict may take as equal to an int: bool, float,
#: and every ext type (``Decimal(1) == complex(1) == 1``).
_EQUAL_TO_INTS = frozenset((0xC2, 0xC3, 0xCA, 0xCB, *range(0xC7, 0xCA), *range(0xD4, 0xD9)))
_DROP = -1


class _Key:
    __slots__ = ("h", "kpos", "klen", "vpos", "vlen", "order", "live", "had_del", "first_del", "in_table")

    def __init__(self, h: int, kpos: int, klen: int) -> None:
        self.h, self.kpos, self.klen = h, kpos, klen
        self.vpos = self.vlen = self.order = 0
        self.live = self.had_del = self.first_del = self.in_table = False


class _Plan:
    """What ``stream_merge_write`` follows (the compiled one's is opaque too)."""

    __slots__ = ("keys", "decide", "appended", "nold", "bytes", "stream_len", "table_end")

    def __init__(self, keys: list[_Key], decide: list[int], appended: list[int], nold: int) -> None:
        self.keys, self.decide, self.appended, self.nold = keys, decide, appended, nold
        self.bytes = self.stream_len = self.table_end = 0


def _size(kl: int, vl: int) -> int:
    return (_TE + kl + vl + 7) & ~7


def _str_key(p: bytes, at: int, n: int) -> Optional[tuple[int, int]]:
    """``(length, hash)`` of the str key at ``p[at:n]`` in msgpack's
    shortest form of valid UTF-8, else None."""
    if at >= n:
        return None
    b = p[at]
    if b & 0xE0 == 0xA0:
        hl, length = 1, b & 0x1F
    elif b == 0xD9 and n - at >= 2:
        hl, length = 2, p[at + 1]
    elif b == 0xDA and n - at >= 3:
        hl, length = 3, int.from_bytes(p[at + 1 : at + 3], "big")
    elif b == 0xDB and n - at >= 5:
        hl, length = 5, int.from_bytes(p[at + 1 : at + 5], "big")
    else:
        return None
    if hl > 1 and length < (32, 256, 65536)[(2, 3, 5).index(hl)]:
        return None
    if length > n - at - hl:
        return None
    try:
        text = p[at + hl : at + hl + length].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return hl + length, key_hash(text)


#: msgpack's int types: first byte -> (length, signed, the least magnitude it is the shortest form for).
_INTS = {
    0xCC: (2, False, 0x80),
    0xCD: (3, False, 0x100),
    0xCE: (5, False, 0x10000),
    0xCF: (9, False, 0x100000000),
    0xD0: (2, True, 33),
    0xD1: (3, True, 129),
    0xD2: (5, True, 32769),
    0xD3: (9, True, 2147483649),
}


def _int_key(p: bytes, at: int, n: int) -> Optional[tuple[int, int]]:
    """``(length, hash)`` of the int key at ``p[at:n]`` in msgpack's shortest form, else None."""
    b = p[at]
    if b < 0x80 or b >= 0xE0:
        return 1, key_hash(b if b < 0x80 else b - 0x100)
    if b not in _INTS or n - at < _INTS[b][0]:
        return None
    length, signed, least = _INTS[b]
    value = int.from_bytes(p[at + 1 : at + length], "big", signed=signed)
    if abs(value) < least or (signed and value >= 0):
        return None
    return length, key_hash(value)


def stream_merge_plan(
    stream: Any, end: int, buf: Any, slots: int, start: int, tend: int, op_set: int, op_del: int
) -> Optional[tuple[int, int, object]]:
    """See streammerge.c (the same rules, one record and one entry at a time)."""
    table_bounds(buf, slots, start, tend)
    s = bytes(memoryview(stream)[: min(end, len(stream))]) if 0 <= end else b""
    if end < 0 or end > len(stream) or end > 0xFFFFFFFF or not 0 <= op_set <= 0x7F or op_del > 0x7F:
        raise ValueError("stream_merge_plan: end or ops out of range")
    nold = int.from_bytes(bytes(buf[16:24]), "little")
    if nold > (tend - start) // _TE:
        raise ValueError("table entry count does not fit the entries")
    keys: list[_Key] = []
    index: dict[bytes, int] = {}
    order, pos, absent, ints = 0, 0, False, False
    while pos < end:
        if end - pos < 16 or int.from_bytes(s[pos : pos + 4], "little") > end - pos - 16:
            raise ValueError("stream_merge_plan: the records do not fit the end")
        n = int.from_bytes(s[pos : pos + 4], "little")
        base, pos = pos + 16, pos + 16 + n
        p = s[base : base + n]
        if n >= 5 and p[0] == 0x94 and p[1] == op_set and p[2] == 0x90:
            is_set = True
        elif op_del >= 0 and n >= 4 and p[0] == 0x93 and p[1] == op_del and p[2] == 0x90:
            is_set = False
        else:
            return None
        got = _str_key(p, 3, n)
        if got is None:
            got = _int_key(p, 3, n)
            if got is None:
                return None
            ints = True
        kl, h = got
        if is_set:
            at = 3 + kl
            if at >= n or msgpack_length(p[at:]) != n - at:
                return None
        elif 3 + kl != n:
            return None
        kb = p[3 : 3 + kl]
        i = index.get(kb)
        if i is None:
            i = index[kb] = len(keys)
            keys.append(_Key(h, base + 3, kl))
        e = keys[i]
        if not is_set:
            if not e.live:
                absent = absent or e.had_del  # (deleted twice: told after the last record)
                e.first_del = True
            e.live, e.had_del = False, True
        else:
            if not e.live:
                order += 1
                e.order = order
            e.live = True
            e.vpos, e.vlen = base + 3 + kl, n - 3 - kl
    if absent:
        return None
    decide: list[int] = []
    off, nbytes, count = start, 0, 0
    while off < tend:
        eh, kl, vl = entry_checked(buf, start, tend, off, crc=False)
        if len(decide) == nold:
            raise ValueError("table entries outnumber the table's count")
        d = 0
        if ints and kl and buf[off + _TE] in _EQUAL_TO_INTS:
            return None  # (a bool, float or ext key may equal an int one: replayed)
        j = index.get(bytes(buf[off + _TE : off + _TE + kl]))
        if j is not None and keys[j].h == eh:
            keys[j].in_table = True
            d = _DROP if keys[j].had_del else j + 1
        if d == 0:  # (kept: copied as bytes, so checked; one dropped or given a new value matched its key)
            entry_checked(buf, start, tend, off)
        decide.append(d)
        if d == 0:
            nbytes += _size(kl, vl)
        elif d != _DROP:
            nbytes += _size(kl, keys[d - 1].vlen)
        count += d != _DROP
        off += _size(kl, vl)
    if off != tend or len(decide) != nold:
        raise ValueError("table entries do not add up to the table's count")
    by_order: dict[int, int] = {}
    for i, e in enumerate(keys):
        if not e.in_table and e.first_del:
            return None
        if not e.live or (e.in_table and not e.had_del):
            continue
        by_order[e.order] = i
        nbytes += _size(e.klen, e.vlen)
        count += 1
    plan = _Plan(keys, decide, [by_order[o] for o in sorted(by_order)], nold)
    plan.bytes, plan.stream_len, plan.table_end = nbytes, end, tend
    return count, nbytes, plan


def _put(out: Any, w: int, h: int, key: bytes, value: bytes) -> int:
    kl, vl = len(key), len(value)
    size = _size(kl, vl)
    head = _entry.pack(h, kl, vl, 0, 0)
    body = key + value
    crc = zlib.crc32(body, zlib.crc32(head[:16]))
    out[w : w + size] = _entry.pack(h, kl, vl, crc, 0) + body + bytes(size - _TE - kl - vl)
    return w + size


def stream_merge_write(
    plan: object, stream: Any, buf: Any, slots: int, start: int, tend: int, out: Any, at: int
) -> int:
    """See streammerge.c."""
    if not isinstance(plan, _Plan):
        raise TypeError("stream_merge_write: not a plan of stream_merge_plan")
    table_bounds(buf, slots, start, tend)
    if len(stream) < plan.stream_len or tend != plan.table_end or at > len(out) or plan.bytes > len(out) - at:
        raise ValueError("stream_merge_write: not the plan's buffers, or out too small")
    s = memoryview(stream)
    w, off = at, start
    for d in plan.decide:
        h, kl, vl, _, _ = _entry.unpack_from(buf, off)
        size = _size(kl, vl)
        if d == 0:
            out[w : w + size] = buf[off : off + size]
            w += size
        elif d != _DROP:
            e = plan.keys[d - 1]
            w = _put(out, w, h, bytes(buf[off + _TE : off + _TE + kl]), bytes(s[e.vpos : e.vpos + e.vlen]))
        off += size
    for i in plan.appended:
        e = plan.keys[i]
        w = _put(out, w, e.h, bytes(s[e.kpos : e.kpos + e.klen]), bytes(s[e.vpos : e.vpos + e.vlen]))
    return w
