"""Pure-Python twins of packing.c's packers of big dicts: ``pack_map`` (a
dump of a dict) and ``pack_pairs`` (an update record's pairs).

Re-exported by :mod:`.twins`.  Same results as the compiled ones: the msgpack
bytes ``codec.dumps`` gives (tests/test_native.py compares both with the codec
on generated input), or None -- declined, the caller takes the codec's general
path -- for anything but scalar keys (``None``, ``bool``, ``int`` within 64
bits, ``float``, ``str``, ``bytes``: exact types) and values that are such
scalars or tuples of at most 15 of them (the codec's ext 1), with no ``bytes``
of ``threshold`` bytes or more when threshold > 0 (those go to blobs).  An
exact-type scalar packs the same with or without the codec's ``strict_types``.
"""

from __future__ import annotations

from typing import Any, Optional

import msgpack  # type: ignore[import-untyped, unused-ignore]

__all__ = ["pack_map", "pack_pairs", "pack_value"]

_SCALARS = frozenset({type(None), bool, int, float, str, bytes})
_packer = msgpack.Packer(use_bin_type=True, datetime=False, autoreset=True)
_pack = _packer.pack
_EXT_TUPLE = 1
_U32 = 0xFFFFFFFF


def _scalar(x: Any, threshold: int) -> bool:
    tp = type(x)
    return tp in _SCALARS and not (tp is bytes and 0 < threshold <= len(x))


def _packed_pair(key: Any, value: Any, threshold: int, out: list[bytes]) -> bool:
    """Append the encodings of one key and value to ``out``; False if they do not fit."""
    if not _scalar(key, threshold):
        return False
    if type(value) is tuple:
        if len(value) > 15 or not all(_scalar(x, threshold) for x in value):
            return False
        value = msgpack.ExtType(_EXT_TUPLE, _pack(list(value)))
    elif not _scalar(value, threshold):
        return False
    out.append(_pack(key))
    out.append(_pack(value))
    return True


def pack_value(value: Any) -> Optional[bytes]:
    """``codec.dumps(value)`` of a scalar or a tuple of at most 15 scalars;
    None (declined) for anything else (the compiled ``udng_pack_value``)."""
    out: list[bytes] = []
    try:
        if not _packed_pair(None, value, 0, out):
            return None
    except (OverflowError, ValueError, UnicodeEncodeError):
        return None
    return out[1]


def pack_map(obj: Any, threshold: int) -> Optional[bytes]:
    """``codec.dumps(obj)`` of a dict of scalar keys and scalar or scalar-tuple
    values; None (declined) for anything else."""
    threshold = int(threshold)
    if type(obj) is not dict or len(obj) > _U32:
        return None
    out = [_packer.pack_map_header(len(obj))]
    try:
        for key, value in obj.items():
            if not _packed_pair(key, value, threshold, out):
                return None
    except (OverflowError, ValueError, UnicodeEncodeError):  # an int beyond 64 bits, lone surrogates
        return None
    return b"".join(out)


def pack_pairs(pairs: Any, threshold: int) -> Optional[bytes]:
    """``codec.dumps(pairs)`` of a list of ``[key, value]`` lists with
    :func:`pack_map`'s keys and values; None (declined) for anything else."""
    threshold = int(threshold)
    if type(pairs) is not list or len(pairs) > _U32:
        return None
    out = [_packer.pack_array_header(len(pairs))]
    try:
        for pair in pairs:
            if type(pair) is not list or len(pair) != 2:
                return None
            out.append(b"\x92")
            if not _packed_pair(pair[0], pair[1], threshold, out):
                return None
    except (OverflowError, ValueError, UnicodeEncodeError):
        return None
    return b"".join(out)
