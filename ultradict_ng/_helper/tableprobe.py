"""Pure-Python twins of tableprobe.c, the compiled probe of a shared table
(table_layout.py, "Probe"): ``table_get``, ``table_candidates``, ``table_entry`` and
``table_changes`` (a merge's changes for the keys the probe decides).

Re-exported by :mod:`.twins`; tests/test_native.py compares them with the
compiled ones.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any, Optional, Union

import msgpack  # type: ignore[import-untyped, unused-ignore]

from .._shm import table_layout as TL
from .keyhash import key_hash_common
from .packing import pack_value
from .tablewalk import entry_checked

__all__ = ["table_get", "table_candidates", "table_entry", "table_changes"]

_TE = TL.TABLE_ENTRY_HEADER


def table_bounds(buf: Any, slots: int, start: int, end: int) -> None:
    """The checks of (buf, slots, start, end) every compiled table call makes first (udng_table_view_args)."""
    if (
        slots < 8
        or slots & (slots - 1)
        or start != TL.TABLE_HEADER + 8 * slots
        or not start <= end <= len(buf)
    ):
        raise ValueError("table bounds do not fit the buffer")


def _table_chain(buf: Any, slots: int, start: int, end: int, h: int) -> Iterator[tuple[int, int, int]]:
    """The checked entries on ``h``'s chain whose full hash is ``h``, as
    ``(offset, key length, value length)``; ValueError for damage."""
    mask = slots - 1
    tag = h & TL.TABLE_TAG_MASK
    i = h & mask
    for _ in range(slots):
        s = int.from_bytes(buf[TL.TABLE_HEADER + 8 * i : TL.TABLE_HEADER + 8 * i + 8], sys.byteorder)
        if not s:
            return
        i = (i + 1) & mask
        if s & TL.TABLE_TAG_MASK != tag:
            continue
        off = s & TL.TABLE_OFFSET_MASK
        eh, kl, vl = entry_checked(buf, start, end, off)
        if eh == h:
            yield off, kl, vl
    raise ValueError("table index has no empty slot")


def table_get(
    buf: Any, slots: int, start: int, end: int, key: Union[str, bytes, int], offset: bool = False
) -> Union[bytes, int, None]:
    """The value bytes of a str or bytes ``key`` (compared as its msgpack
    encoding, which is exact for these types) or None; ValueError for damage.
    With ``offset``, the checked entry's offset instead (0: absent), and an
    int key too, by its own encoding: -1 when that does not decide (an entry
    of its hash holds other bytes -- an equal key of another type: 1.0,
    True -- or the int is outside the 64-bit range)."""
    is_int = offset and type(key) is int
    if offset and type(key) is int:
        if not -(1 << 63) <= key < (1 << 64):
            return -1
    elif type(key) not in (str, bytes):
        raise TypeError("table_get takes a str or bytes key")
    h = key_hash_common(key)
    if h is None:  # lone surrogates: never a key
        return 0 if offset else None
    table_bounds(buf, slots, start, end)
    encoded = msgpack.packb(key, use_bin_type=True)
    same_hash = False
    with memoryview(buf) as mv:
        for off, kl, vl in _table_chain(mv, slots, start, end, h):
            if mv[off + _TE : off + _TE + kl] == encoded:
                return off if offset else bytes(mv[off + _TE + kl : off + _TE + kl + vl])
            same_hash = True
    if offset:
        return -1 if is_int and same_hash else 0
    return None


def table_candidates(
    buf: Any, slots: int, start: int, end: int, h: int, offsets: bool = False
) -> Union[list[tuple[bytes, bytes]], list[tuple[int, bytes, bytes]]]:
    """``(key bytes, value bytes)`` of every entry whose full hash is ``h``
    on its chain (with ``offsets``: ``(offset, key bytes, value bytes)``);
    ValueError for damage."""
    table_bounds(buf, slots, start, end)
    out: list[Any] = []
    with memoryview(buf) as mv:
        for off, kl, vl in _table_chain(mv, slots, start, end, h):
            kb, vb = bytes(mv[off + _TE : off + _TE + kl]), bytes(mv[off + _TE + kl : off + _TE + kl + vl])
            out.append((off, kb, vb) if offsets else (kb, vb))
    return out


def table_entry(buf: Any, slots: int, start: int, end: int, off: int) -> tuple[int, int, int]:
    """``(hash, key length, value length)`` of the entry at ``off``, checked as
    the probe checks every entry; ValueError ("table entry ...") for damage."""
    table_bounds(buf, slots, start, end)
    return entry_checked(buf, start, end, off)


def table_changes(
    buf: Any, slots: int, start: int, end: int, dead: set[Any], changed: set[Any], hot: dict[Any, Any]
) -> tuple[list[tuple[int, Optional[bytes]]], list[Any], list[Any]]:
    """``(changes, rest_dead, rest_changed)``: ``(offset, None)`` for each key
    of ``dead`` and ``(offset, the codec's bytes of hot[key])`` for each of
    ``changed`` whose entry the offset probe finds (exact str and int keys)
    and, for a changed key, whose value :func:`.packing.pack_value` encodes;
    the keys left over, in two lists, for the caller's general path."""
    if type(dead) not in (set, frozenset) or type(changed) not in (set, frozenset) or type(hot) is not dict:
        raise TypeError("table_changes(buf, slots, start, end, dead: set, changed: set, hot: dict)")
    table_bounds(buf, slots, start, end)
    changes: list[tuple[int, Optional[bytes]]] = []
    rests: tuple[list[Any], list[Any]] = ([], [])
    for keys, rest, new in ((dead, rests[0], False), (changed, rests[1], True)):
        for key in keys:
            off, value = 0, None
            if type(key) is str or type(key) is int:
                if new and key in hot:
                    value = pack_value(hot[key])
                if not new or value is not None:
                    try:
                        got = table_get(buf, slots, start, end, key, True)
                    except ValueError:  # damage: the general path decides (and raises)
                        got = 0
                    off = got if type(got) is int and got > 0 else 0
            if off:
                changes.append((off, value))
            else:
                rest.append(key)
    return changes, rests[0], rests[1]
