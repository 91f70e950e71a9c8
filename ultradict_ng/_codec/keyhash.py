"""A key hash every process agrees on, with ``dict``'s key identity.

Why: an index of keys that lives in shared memory (a big dict's table) is
probed by processes that did not build it, so it cannot use ``hash()``:
``str``, ``bytes`` and ``datetime`` hashes are salted per process
(``PYTHONHASHSEED``).  Nor can it hash the encoded key: ``1``, ``1.0``,
``True`` and ``Decimal(1)`` are one ``dict`` key but encode differently
(``_codec/ext.py``), as do ``(1, 2)`` and ``(1.0, 2)``, equal aware datetimes
in two time zones, and equal frozensets built in different orders.

:func:`key_hash` is a 64-bit hash of the keys the msgpack serializer stores
such that ``a == b`` implies ``key_hash(a) == key_hash(b)``, the same in
every process, Python version and hash seed (on 64-bit CPython).  It is a
format: once an index is built with it, it must not change (the tests pin
values).  How each kind of key is hashed, and why it keeps ``==``:

* numbers (``int``, ``bool``, ``float``, ``complex``, ``Decimal``): Python's
  numeric hash, which is defined arithmetically (modulo 2**61 - 1), unsalted,
  and equal for equal numbers of any of these types; NaNs (never equal to
  anything, hashed by identity since Python 3.10) hash to one constant;
* ``str`` (its UTF-8) and ``bytes``: the bytes as little-endian u64 words
  (the last one zero-padded), each folded in with xxHash64's round
  (``acc = rotl(acc ^ w * P2, 31) * P1``) from a start that holds a tag per
  type (``"a"`` and ``b"a"`` are never equal, and rarely collide) and the
  length (so padding is never ambiguous).  Not BLAKE2b, which this module
  used first: measured ~0.25 us per short key compiled, most of a lookup's
  budget, against ~0.03 us for this; neither is keyed, so neither resists
  keys chosen to collide, and this one spreads the keys of a table as well
  (the tests check the spread);
* ``tuple``: the items' hashes combined in order (xxHash's round, as
  CPython's tuple hash); ``frozenset``: the sum of the members' mixed hashes,
  which does not depend on the order the set iterates in;
* ``datetime``: the instant in microseconds since 0001-01-01 -- in UTC for
  an aware one (so equal instants in two time zones agree), local for a
  naive one, ``fold`` ignored (as ``==`` ignores it) -- tagged naive or aware
  (never equal to each other); ``date``: its ordinal; ``time``: microseconds
  of the day, minus the offset when aware; ``timedelta``: its microseconds;
  ``timezone``: its offset (``==`` ignores the name);
* ``None``: a constant.

Each kind is tagged, and every result goes through a 64-bit finaliser
(SplitMix64's), so that sequential ints spread over an index.  Any other
type raises :class:`UnsupportedType` (the serializer does not store it),
an unhashable one ``TypeError`` as ``dict`` does.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import struct
from typing import Any, Callable

from ..errors import UnsupportedType

__all__ = ["key_hash"]

M64 = (1 << 64) - 1
# Tags: one per kind of key (arbitrary odd constants, fixed forever).
_T_NUMBER = 0x9E3779B97F4A7C15
_T_NAN = 0x632BE59BD9B4E019
_T_NONE = 0x85EBCA77C2B2AE63
_T_TUPLE = 0x27D4EB2F165667C5
_T_FROZENSET = 0x165667B19E3779F9
_T_NAIVE = 0xC2B2AE3D27D4EB4F
_T_AWARE = 0xD6E8FEB86659FD93
_T_DATE = 0xA0761D6478BD642F
_T_TIME = 0xE7037ED1A0B428DB
_T_AWARE_TIME = 0x8EBC6AF09C88C6E3
_T_TIMEDELTA = 0x589965CC75374CC3
_T_TIMEZONE = 0x1D8E4E27C47D124F
_T_STR = 0x3C6EF372FE94F82B
_T_BYTES = 0xA54FF53A5F1D36F1
# xxHash64's primes (the tuple combination).
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P5 = 0x27D4EB2F165667C5
_DAY_US = 86_400_000_000


def mix(h: int) -> int:
    """SplitMix64's finaliser: every input bit affects every output bit."""
    h &= M64
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & M64
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & M64
    return h ^ (h >> 31)


def _words(data: bytes, tag: int) -> int:
    """The str/bytes hash (module docstring); ``_helper/keyhash.c`` has its twin."""
    n = len(data)
    acc = (tag ^ (n * _P5)) & M64
    if n:
        count = (n + 7) >> 3
        for w in struct.unpack(f"<{count}Q", data + bytes(-n % 8)):
            acc ^= (w * _P2) & M64
            acc = (((acc << 31) | (acc >> 33)) & M64) * _P1 & M64
    return mix(acc)


def _number(x: Any) -> int:
    if x != x:  # NaN (float, complex or Decimal): never equal, one bucket
        return mix(_T_NAN)
    return mix(hash(x) ^ _T_NUMBER)


def _decimal(x: decimal.Decimal) -> int:
    if x.is_nan():  # (a signalling NaN cannot even be hashed by Python)
        return mix(_T_NAN)
    return mix(hash(x) ^ _T_NUMBER)


def _str(x: str) -> int:
    try:
        data = x.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsupportedType("a str key with lone surrogates cannot be stored") from None
    return _words(data, _T_STR)


def _bytes(x: bytes) -> int:
    return _words(x, _T_BYTES)


def _tuple(x: tuple) -> int:  # type: ignore[type-arg]
    acc = _P5
    for item in x:
        acc = (acc + key_hash(item) * _P2) & M64
        acc = ((acc << 31) | (acc >> 33)) & M64
        acc = (acc * _P1) & M64
    return mix(acc ^ len(x) ^ _T_TUPLE)


def _frozenset(x: frozenset) -> int:  # type: ignore[type-arg]
    total = 0
    for member in x:
        total += mix(key_hash(member) ^ _T_FROZENSET)
    return mix((total & M64) ^ len(x) ^ _T_FROZENSET)


def _offset_us(tz: Any, value: Any) -> int:
    if type(tz) is not _dt.timezone:
        raise UnsupportedType(f"only datetime.timezone time zones can be stored, not {type(tz).__name__}")
    off = tz.utcoffset(value)
    return (off.days * 86_400 + off.seconds) * 1_000_000 + off.microseconds


def _datetime(x: _dt.datetime) -> int:
    us = x.toordinal() * _DAY_US + ((x.hour * 60 + x.minute) * 60 + x.second) * 1_000_000 + x.microsecond
    if x.tzinfo is None:
        return mix(us ^ _T_NAIVE)
    return mix((us - _offset_us(x.tzinfo, x)) ^ _T_AWARE)


def _date(x: _dt.date) -> int:
    return mix(x.toordinal() ^ _T_DATE)


def _time(x: _dt.time) -> int:
    us = ((x.hour * 60 + x.minute) * 60 + x.second) * 1_000_000 + x.microsecond
    if x.tzinfo is None:
        return mix(us ^ _T_TIME)
    return mix((us - _offset_us(x.tzinfo, None)) ^ _T_AWARE_TIME)


def _timedelta(x: _dt.timedelta) -> int:
    return mix(((x.days * 86_400 + x.seconds) * 1_000_000 + x.microseconds) ^ _T_TIMEDELTA)


def _timezone(x: _dt.timezone) -> int:
    return mix(_offset_us(x, None) ^ _T_TIMEZONE)


_BY_TYPE: dict[type, Callable[[Any], int]] = {
    int: _number,
    bool: _number,
    float: _number,
    complex: _number,
    decimal.Decimal: _decimal,
    str: _str,
    bytes: _bytes,
    tuple: _tuple,
    frozenset: _frozenset,
    _dt.datetime: _datetime,
    _dt.date: _date,
    _dt.time: _time,
    _dt.timedelta: _timedelta,
    _dt.timezone: _timezone,
    type(None): lambda _: mix(_T_NONE),
}


def key_hash(key: Any) -> int:
    """The 64-bit hash of ``key`` every process agrees on (module docstring):
    equal keys hash equal.  ``UnsupportedType`` for a type the msgpack
    serializer does not store, ``TypeError`` for an unhashable key."""
    f = _BY_TYPE.get(type(key))
    if f is not None:
        return f(key)
    hash(key)  # unhashable (list, dict, set, bytearray): TypeError, as dict raises
    raise UnsupportedType(f"keys of type {type(key).__name__} cannot be stored in a shared index")
