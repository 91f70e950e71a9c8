"""The msgpack serializer's format: its ext types, its limits, what it accepts.

The msgpack serializer (:class:`ultradict_ng.codec.MsgpackCodec`) is this
format; :mod:`ultradict_ng._codec.encode` turns values into it and
:mod:`ultradict_ng._codec.decode` turns it back into values.

What the msgpack serializer stores
==================================

Values round-trip *exactly*: ``type(loads(dumps(x))) is type(x)``,
recursively, and the result compares equal (NaN excepted, it still comes back
as NaN; ``-0.0`` keeps its sign).  Only the exact types below are accepted;
subclasses (``IntEnum``, ``OrderedDict``, ``defaultdict``, namedtuples, ``str``
subclasses ...) raise :class:`UnsupportedType` instead of being silently
stored as their base type.

Native msgpack types: ``None``, ``bool``, ``int`` in ``[-2**63, 2**64)``,
``float`` (always as float 64), ``str`` (UTF-8, without lone surrogates),
``bytes`` (bin), ``list`` (array) and ``dict`` (map; keys may be any supported
hashable value and their order is kept).

Everything else is a msgpack *ext* object.  A code marked "msgpack" has a
payload that is itself encoded with this serializer (so a tuple inside a
frozenset inside a dict key works); "raw" payloads are plain bytes.

====  ==========================  =============================================
code  Python type                 payload
====  ==========================  =============================================
1     ``tuple``                   msgpack array of the items
2     ``set``                     msgpack array of the members, sorted by
                                  their encoded bytes
3     ``frozenset``               same as ``set``
4     ``int`` outside             raw: two's-complement big-endian bytes, the
      ``[-2**63, 2**64)``         fewest that hold the sign bit
5     ``bytearray``               raw: the bytes
6     ``complex``                 raw: 16 bytes, real then imaginary part as
                                  big-endian IEEE 754 doubles
7     ``decimal.Decimal``         raw: ASCII ``str(d)`` (exact, also for NaN,
                                  sNaN, Infinity, -0 and huge exponents)
8     ``datetime.datetime``       msgpack array ``[year, month, day, hour,
                                  minute, second, microsecond, fold]``
                                  followed by the *tz fields*
9     ``datetime.date``           msgpack array ``[year, month, day]``
10    ``datetime.time``           msgpack array ``[hour, minute, second,
                                  microsecond, fold]`` followed by the *tz
                                  fields*
11    ``datetime.timedelta``      msgpack array ``[days, seconds,
                                  microseconds]``
12    ``datetime.timezone``       msgpack array of the *tz fields* of the
                                  timezone itself
13    a large value in a blob     msgpack array ``[id, kind, length, meta]``:
      (``placeholders.BlobRef``)  the reference to segment ``NAME@b<id>``
                                  (layout: "Blobs")
14    ``numpy.ndarray`` below     msgpack array ``[descr, shape, bytes]``:
      the blob threshold          dtype as ``numpy.lib.format`` describes it,
                                  shape, C-order data
====  ==========================  =============================================

The *tz fields* are nothing for a naive datetime/time, ``[offset]`` for a
``datetime.timezone`` created without a name (``timezone.utc`` included) and
``[offset, name]`` for one created with a name, ``offset`` being the UTC
offset in whole microseconds.  Only ``tzinfo=None`` and exact
``datetime.timezone`` instances are accepted: other tzinfo classes
(``zoneinfo.ZoneInfo``, pytz, dateutil ...) carry rules that cannot be rebuilt
from plain data.

Decoding rejects every other ext code, including msgpack's own Timestamp
(-1), which the encoder never writes.

Encoding is deterministic: the same value gives the same bytes in every
process (set members are sorted by their encodings, so the per-process str
hash seed does not matter).  Values that are equal but not identical encode
differently: ``1``, ``1.0`` and ``True``; ``0.0`` and ``-0.0``;
``Decimal("1.0")`` and ``Decimal("1.00")``; the same instant in two time
zones; dicts with the same items in another order.

Limits: containers may nest at most :data:`MAX_NESTING` levels deep, and
tuple/set/frozenset (ext containers, each decoded by a nested msgpack call
that uses about 40 KiB of C stack) at most :data:`MAX_EXT_NESTING` levels.
"""

from __future__ import annotations

import struct
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable

import msgpack  # type: ignore[import-untyped, unused-ignore]

from ..errors import UnsupportedType

__all__ = ["MAX_NESTING", "MAX_EXT_NESTING"]

#: Deepest nesting of containers (list, dict, tuple, set, frozenset) that
#: ``MsgpackCodec.dumps`` accepts; the top-level container is level 1.
MAX_NESTING = 500
#: Deepest nesting of tuple/set/frozenset (ext containers) alone.
MAX_EXT_NESTING = 32

# Ext type codes (see the table in the module docstring).
EXT_TUPLE = 1
EXT_SET = 2
EXT_FROZENSET = 3
EXT_BIGINT = 4
EXT_BYTEARRAY = 5
EXT_COMPLEX = 6
EXT_DECIMAL = 7
EXT_DATETIME = 8
EXT_DATE = 9
EXT_TIME = 10
EXT_TIMEDELTA = 11
EXT_TIMEZONE = 12
EXT_BLOB = 13
EXT_NDARRAY = 14

ExtType: Any = msgpack.ExtType
Timestamp: Any = msgpack.Timestamp
Packer: Any = msgpack.Packer
unpackb: Callable[..., Any] = msgpack.unpackb
Unpacker: Any = msgpack.Unpacker
# ExtType.__new__ is a Python function that re-validates its arguments;
# building the namedtuple directly is several times faster and our
# arguments are always valid.
new_ext: Callable[..., Any] = tuple.__new__

DOUBLES = struct.Struct(">dd")

_NoneType = type(None)
# Types the msgpack packer handles natively and exactly (ints out of range
# come back to us through ``default``) plus the scalar types our ``default``
# converts.  Values of these types need no inspection before packing.
LEAF_TYPES: frozenset[type] = frozenset(
    {
        _NoneType,
        bool,
        int,
        float,
        str,
        bytes,
        complex,
        Decimal,
        datetime,
        date,
        time,
        timedelta,
        timezone,
    }
)

_SUPPORTED_TYPES = (
    _NoneType,
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    bytearray,
    list,
    tuple,
    dict,
    set,
    frozenset,
    Decimal,
    datetime,
    date,
    time,
    timedelta,
    timezone,
)

SUPPORTED_TEXT = (
    "it stores None, bool, int, float, complex, str, bytes, bytearray, list, "
    "tuple, dict, set, frozenset, decimal.Decimal and datetime's datetime, "
    "date, time, timedelta and timezone (exact types, not subclasses; "
    "tzinfo must be None or a datetime.timezone)"
)

PICKLE_HINT = (
    'To store other objects create the dict with SharedDict(..., serializer="pickle"); '
    "pickle trusts every process that can write the dict's segments: any of them "
    "can make every reader run arbitrary code."
)


def type_name(tp: type) -> str:
    module = getattr(tp, "__module__", "builtins")
    if module in ("builtins", "datetime", "decimal"):
        return tp.__qualname__
    return f"{module}.{tp.__qualname__}"


def unsupported_type(obj: Any) -> UnsupportedType:
    tp = type(obj)
    hint = ""
    for base in _SUPPORTED_TYPES:
        if base is not tp and isinstance(obj, base) and not tp.__module__.startswith("msgpack"):
            hint = f" (a subclass of {base.__qualname__}: convert it to a plain {base.__qualname__} first)"
            break
    return UnsupportedType(
        f"cannot store a value of type {type_name(tp)!r}{hint} with the msgpack serializer; "
        f"{SUPPORTED_TEXT}. {PICKLE_HINT}"
    )


def unsupported_tz(obj: Any, tz: Any) -> UnsupportedType:
    return UnsupportedType(
        f"cannot store a {type(obj).__name__} whose tzinfo is of type {type_name(type(tz))!r} "
        "with the msgpack serializer: only tzinfo=None or a datetime.timezone (fixed offset, "
        "e.g. timezone.utc) round-trips exactly; convert it first, e.g. with "
        f"dt.astimezone(timezone.utc). {PICKLE_HINT}"
    )


def too_deep() -> UnsupportedType:
    return UnsupportedType(
        f"cannot store a value nested more than {MAX_NESTING} containers deep (or more than "
        f"{MAX_EXT_NESTING} tuple/set/frozenset deep) with the msgpack serializer. {PICKLE_HINT}"
    )
