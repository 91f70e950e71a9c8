"""Decoding of the msgpack serializer: bytes to values.

The format and its ext types are specified in :mod:`ultradict_ng._codec.ext`.
Decoding never runs code chosen by the writer of the bytes: ext hooks, one
per ext nesting level, build plain data only, and a msgpack Timestamp (which
msgpack decodes itself, without calling a hook) is searched for afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import re
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable, NoReturn, Optional

from ..errors import CorruptSegment
from ..speedups import contains_type as _contains_type
from ..speedups import tuple_hook
from . import ext as msgpack_ext
from .ext import (
    EXT_BIGINT,
    EXT_BLOB,
    EXT_BYTEARRAY,
    EXT_COMPLEX,
    EXT_DATE,
    EXT_DATETIME,
    EXT_DECIMAL,
    EXT_FROZENSET,
    EXT_NDARRAY,
    EXT_SET,
    EXT_TIME,
    EXT_TIMEDELTA,
    EXT_TIMEZONE,
    EXT_TUPLE,
    MAX_EXT_NESTING,
    Timestamp,
    unpackb,
)
from .placeholders import KINDS, BlobRef, InlineArray

# Bound by assignment, not imported by name: CPython (3.11+) compiles
# ``name.method(...)`` on a name bound by an import as an attribute load
# and a call (it takes the name for a module), slower than a method call.
DOUBLES = msgpack_ext.DOUBLES


def _no_ext(code: int, data: bytes) -> NoReturn:
    raise CorruptSegment(f"unexpected msgpack ext type {code} inside a scalar payload")


def _scalar_payload(data: bytes, min_len: int, max_len: int, n_ints: int) -> list[Any]:
    fields = unpackb(data, raw=False, strict_map_key=False, ext_hook=_no_ext)
    if type(fields) is not list or not min_len <= len(fields) <= max_len:
        raise CorruptSegment("malformed ext payload")
    for i in range(n_ints):
        if type(fields[i]) is not int:
            raise CorruptSegment("malformed ext payload")
    return fields


def _tz_from(fields: list[Any], start: int) -> Optional[timezone]:
    n = len(fields) - start
    if n == 0:
        return None
    micros = fields[start]
    if type(micros) is not int:
        raise CorruptSegment("malformed timezone offset")
    if n == 1:
        return timezone(timedelta(microseconds=micros))
    name = fields[start + 1]
    if type(name) is not str:
        raise CorruptSegment("malformed timezone name")
    return timezone(timedelta(microseconds=micros), name)


def _decode_scalar(code: int, data: bytes) -> Any:
    if code == EXT_BIGINT:
        return int.from_bytes(data, "big", signed=True)
    if code == EXT_DATETIME:
        f = _scalar_payload(data, 8, 10, 8)
        return datetime(f[0], f[1], f[2], f[3], f[4], f[5], f[6], _tz_from(f, 8), fold=f[7])
    if code == EXT_DECIMAL:
        return Decimal(data.decode("ascii"))
    if code == EXT_COMPLEX:
        real, imag = DOUBLES.unpack(data)
        return complex(real, imag)
    if code == EXT_BYTEARRAY:
        return bytearray(data)
    if code == EXT_DATE:
        f = _scalar_payload(data, 3, 3, 3)
        return date(f[0], f[1], f[2])
    if code == EXT_TIME:
        f = _scalar_payload(data, 5, 7, 5)
        return time(f[0], f[1], f[2], f[3], _tz_from(f, 5), fold=f[4])
    if code == EXT_TIMEDELTA:
        f = _scalar_payload(data, 3, 3, 3)
        return timedelta(f[0], f[1], f[2])
    if code == EXT_TIMEZONE:
        f = _scalar_payload(data, 1, 2, 0)
        return _tz_from(f, 0)
    if code == EXT_BLOB:
        f = _scalar_payload(data, 4, 4, 3)
        if f[0] < 1 or f[1] not in KINDS or f[2] < 0 or not (f[3] is None or _array_meta_ok(f[3], 2)):
            raise CorruptSegment("malformed blob reference")
        return BlobRef(f[0], f[1], f[2], f[3])
    if code == EXT_NDARRAY:  # [descr, shape, bytes] or, for a torch tensor, [..., True]
        f = _scalar_payload(data, 3, 4, 0)
        if not _array_meta_ok(f, len(f)) or type(f[2]) is not bytes or f[3:] not in ([], [True]):
            raise CorruptSegment("malformed inline array")
        return InlineArray(f[0], tuple(f[1]), f[2], tensor=len(f) == 4)
    raise CorruptSegment(f"unknown msgpack ext type {code}")


def _array_meta_ok(meta: Any, n: int) -> bool:
    """``[descr, shape, ...]`` of n items, shape a list of non-negative ints (the
    descr itself is checked by numpy when the array is made)."""
    return (
        type(meta) is list
        and len(meta) == n
        and type(meta[0]) in (str, list)
        and type(meta[1]) is list
        and all(type(d) is int and d >= 0 for d in meta[1])
    )


def _make_hook(level: int) -> Callable[[int, bytes], Any]:
    nxt = level + 1

    def ext_hook(code: int, data: bytes) -> Any:
        if EXT_TUPLE <= code <= EXT_FROZENSET:
            if nxt > MAX_EXT_NESTING:
                raise CorruptSegment("tuple/set/frozenset nested too deeply")
            items = unpackb(data, raw=False, strict_map_key=False, ext_hook=_HOOKS[nxt])
            if type(items) is not list:
                raise CorruptSegment("malformed container payload")
            if code == EXT_TUPLE:
                return tuple(items)
            if code == EXT_SET:
                return set(items)
            return frozenset(items)
        return _decode_scalar(code, data)

    return ext_hook


# _HOOKS[n] decodes ext objects found inside n enclosing ext containers.
_HOOKS = [_make_hook(level) for level in range(MAX_EXT_NESTING + 1)]
# The hook msgpack calls for ext objects outside any other: a tuple of
# scalars (a lookup table's row) is decoded by one compiled call
# (speedups.tuple_hook: ~6x faster than the nested unpackb above, the same
# tuple), anything else by _HOOKS[0].
ROOT_HOOK = functools.partial(tuple_hook, _HOOKS[0])

# msgpack decodes its Timestamp ext (-1) itself, without calling ext_hook.
# These are all the encodings a Timestamp can have (fixext 4/8, ext 8/16/32
# of length 4, 8 or 12); data without any of them cannot hold a Timestamp,
# otherwise (rare, e.g. such bytes inside a str) the result is searched.
TIMESTAMP_RE = re.compile(
    rb"[\xd6\xd7]\xff|\xc7[\x04\x08\x0c]\xff|\xc8\x00[\x04\x08\x0c]\xff|\xc9\x00\x00\x00[\x04\x08\x0c]\xff"
)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while decoding a large buffer.

    Decoding creates containers by the hundred thousand, and each few hundred
    of them trigger a collection that traverses everything decoded so far:
    with it, replaying 700k records took 1.05 s here, without 0.29 s (the
    msgpack documentation recommends the same).  Nothing decoded can form a
    cycle, so there is nothing to collect; the collector is re-enabled at
    once afterwards, and left alone if someone else had disabled it.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# Deeper than anything msgpack decodes (its stack) plus our ext levels: the
# compiled walk reports such data as suspect instead of recursing further.
_DECODED_DEPTH_LIMIT = 4096


def contains_timestamp(obj: Any) -> bool:
    """True if a Timestamp is anywhere in the decoded ``obj`` (one walk of
    ``speedups.contains_type``; data nested deeper than any decode is suspect)."""
    return _contains_type(obj, Timestamp, _DECODED_DEPTH_LIMIT)
