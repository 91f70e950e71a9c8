"""Serializers: how keys and values are turned into bytes in shared memory.

Why msgpack is the default
==========================

Every process that attaches to a dict reads bytes that *other* processes
wrote into a shared-memory segment.  If those bytes were pickles, any process
able to write the segment (any process of the same user, or anyone the
segment's permissions let in) could make every reader run code of its choosing,
because unpickling calls whatever callables the pickle names.  The default
serializer therefore never unpickles: it is msgpack plus a small, closed set
of extension types whose decoders only ever build plain data.  A damaged or
hostile segment can at worst produce a wrong value or :class:`CorruptSegment`.

Pickle stays available as an explicit opt-in (``serializer="pickle"``) for
applications that trust every process that can write their segments.

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
====  ==========================  =============================================

The *tz fields* are nothing for a naive datetime/time, ``[offset]`` for a
``datetime.timezone`` created without a name (``timezone.utc`` included) and
``[offset, name]`` for one created with a name, ``offset`` being the UTC
offset in whole microseconds.  Only ``tzinfo=None`` and exact
``datetime.timezone`` instances are accepted: other tzinfo classes
(``zoneinfo.ZoneInfo``, pytz, dateutil ...) carry rules that cannot be rebuilt
from plain data.

Decoding rejects every other ext code, including msgpack's own Timestamp
(-1), which this module never writes.

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

import contextlib
import copy
import gc
import operator
import pickle
import re
import struct
import threading
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable, Dict, Iterator, List, NoReturn, Optional, Tuple, Union

import msgpack  # type: ignore[import-untyped, unused-ignore]

from .record import SCALAR_TYPES
from .speedups import contains_type as _contains_type, types_within as _types_within

from .errors import CorruptSegment, UnsupportedType

__all__ = [
    "Codec",
    "MsgpackCodec",
    "PickleCodec",
    "MSGPACK",
    "PICKLE",
    "codec_for",
    "codec_by_id",
    "ObjectCodec",
    "CUSTOM_ID",
    "copy_value",
    "IMMUTABLE_TYPES",
    "MAX_NESTING",
    "MAX_EXT_NESTING",
]

#: Deepest nesting of containers (list, dict, tuple, set, frozenset) that
#: ``MsgpackCodec.dumps`` accepts; the top-level container is level 1.
MAX_NESTING = 500
#: Deepest nesting of tuple/set/frozenset (ext containers) alone.
MAX_EXT_NESTING = 32

_BytesLike = Union[bytes, bytearray, memoryview]

# Ext type codes (see the table in the module docstring).
_TUPLE = 1
_SET = 2
_FROZENSET = 3
_BIGINT = 4
_BYTEARRAY = 5
_COMPLEX = 6
_DECIMAL = 7
_DATETIME = 8
_DATE = 9
_TIME = 10
_TIMEDELTA = 11
_TIMEZONE = 12

_ExtType: Any = msgpack.ExtType
_Timestamp: Any = msgpack.Timestamp
_Packer: Any = msgpack.Packer
_unpackb: Callable[..., Any] = msgpack.unpackb
_Unpacker: Any = msgpack.Unpacker
# ExtType.__new__ is a Python function that re-validates its arguments;
# building the namedtuple directly is several times faster and our
# arguments are always valid.
_new_ext: Callable[..., Any] = tuple.__new__

_DOUBLES = struct.Struct(">dd")

# Options of every Packer we create.  buf_size (msgpack >= 1.1) keeps the
# per-thread packers small; older versions start with 1 MiB buffers.
_PACKER_OPTIONS: Dict[str, Any] = {
    "use_bin_type": True,
    "datetime": False,
    "autoreset": True,
    "buf_size": 4096,
}
try:
    _Packer(**_PACKER_OPTIONS)
except TypeError:  # pragma: no cover - msgpack < 1.1
    del _PACKER_OPTIONS["buf_size"]
# Packer.pack_ext_type returns the bytes (autoreset) only in recent msgpack;
# older versions leave them in the buffer, to be prepended to the next pack.
_PACK_EXT_TYPE_RETURNS = _Packer(**_PACKER_OPTIONS).pack_ext_type(1, b"x") == b"\xd4\x01x"
_NoneType = type(None)
# encode_record's fast path: these types pack natively, exactly, and decode
# to an equal object of the same type.
_RECORD_SCALARS = SCALAR_TYPES
_record_pack: Callable[[Any], bytes] = _Packer(**_PACKER_OPTIONS).pack

# Types the msgpack packer handles natively and exactly (ints out of range
# come back to us through ``default``) plus the scalar types our ``default``
# converts.  Values of these types need no inspection before packing.
_LEAF_TYPES: frozenset[type] = frozenset(
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

def _leaf_only(obj: Any) -> bool:
    """Whether every member of a list, tuple, set or dict (keys and values)
    is of a leaf type: the scan before packing."""
    return _types_within(obj, _LEAF_TYPES)


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

_SUPPORTED_TEXT = (
    "it stores None, bool, int, float, complex, str, bytes, bytearray, list, "
    "tuple, dict, set, frozenset, decimal.Decimal and datetime's datetime, "
    "date, time, timedelta and timezone (exact types, not subclasses; "
    "tzinfo must be None or a datetime.timezone)"
)

_PICKLE_HINT = (
    'To store other objects create the dict with SharedDict(..., serializer="pickle"); '
    "pickle trusts every process that can write the dict's segments: any of them "
    "can make every reader run arbitrary code."
)


def _type_name(tp: type) -> str:
    module = getattr(tp, "__module__", "builtins")
    if module in ("builtins", "datetime", "decimal"):
        return tp.__qualname__
    return f"{module}.{tp.__qualname__}"


def _unsupported(obj: Any) -> UnsupportedType:
    tp = type(obj)
    hint = ""
    for base in _SUPPORTED_TYPES:
        if base is not tp and isinstance(obj, base) and not tp.__module__.startswith("msgpack"):
            hint = f" (a subclass of {base.__qualname__}: convert it to a plain {base.__qualname__} first)"
            break
    return UnsupportedType(
        f"cannot store a value of type {_type_name(tp)!r}{hint} with the msgpack serializer; "
        f"{_SUPPORTED_TEXT}. {_PICKLE_HINT}"
    )


def _unsupported_tz(obj: Any, tz: Any) -> UnsupportedType:
    return UnsupportedType(
        f"cannot store a {type(obj).__name__} whose tzinfo is of type {_type_name(type(tz))!r} "
        "with the msgpack serializer: only tzinfo=None or a datetime.timezone (fixed offset, "
        "e.g. timezone.utc) round-trips exactly; convert it first, e.g. with "
        f"dt.astimezone(timezone.utc). {_PICKLE_HINT}"
    )


def _too_deep() -> UnsupportedType:
    return UnsupportedType(
        f"cannot store a value nested more than {MAX_NESTING} containers deep (or more than "
        f"{MAX_EXT_NESTING} tuple/set/frozenset deep) with the msgpack serializer. {_PICKLE_HINT}"
    )


# --------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------


def _prepare(obj: Any, depth: int, ext_depth: int) -> Any:
    """Check a non-leaf value before packing; return it, or a converted copy.

    The packer itself handles lists and dicts natively, and it packs a few
    types we must not accept without ever calling ``default``: ``bytearray``
    (as bin, so it would come back as ``bytes``), ``memoryview`` (same),
    ``msgpack.ExtType`` and ``msgpack.Timestamp`` (verbatim).  This walk
    rejects those (turning bytearrays into our ext), rejects every other
    unsupported type up front and enforces the nesting limits.
    """
    tp = type(obj)
    depth += 1
    if depth > MAX_NESTING:
        raise _too_deep()
    if tp is list:
        if _leaf_only(obj):
            return obj
        out: Optional[List[Any]] = None
        for i, item in enumerate(obj):
            if type(item) in _LEAF_TYPES:
                continue
            new = _prepare(item, depth, ext_depth)
            if new is not item:
                if out is None:
                    out = list(obj)
                out[i] = new
        return obj if out is None else out
    if tp is dict:
        if _leaf_only(obj):
            return obj
        changed = False
        items = []
        for key, value in obj.items():
            new_key = key if type(key) in _LEAF_TYPES else _prepare(key, depth, ext_depth)
            new_value = value if type(value) in _LEAF_TYPES else _prepare(value, depth, ext_depth)
            changed = changed or new_key is not key or new_value is not value
            items.append((new_key, new_value))
        return dict(items) if changed else obj
    if tp is tuple or tp is set or tp is frozenset:
        ext_depth += 1
        if ext_depth > MAX_EXT_NESTING:
            raise _too_deep()
        if _leaf_only(obj):
            return obj
        new_items = [item if type(item) in _LEAF_TYPES else _prepare(item, depth, ext_depth) for item in obj]
        if all(map(operator.is_, new_items, obj)):
            return obj
        # Only a bytearray is ever converted, and sets cannot hold one.
        return tuple(new_items) if tp is tuple else tp(new_items)
    if tp is bytearray:
        return _new_ext(_ExtType, (_BYTEARRAY, bytes(obj)))
    if tp in _LEAF_TYPES:
        return obj
    raise _unsupported(obj)


def _tz_fields(tz: timezone) -> List[Any]:
    args = getattr(tz, "__getinitargs__")()  # (offset,) or (offset, name)
    offset: timedelta = args[0]
    micros = (offset.days * 86400 + offset.seconds) * 1_000_000 + offset.microseconds
    return [micros] if len(args) == 1 else [micros, args[1]]


class _Chain(List[Any]):
    """One msgpack Packer per ext nesting level (``chain[n]`` packs the
    payloads of ext objects nested in ``n`` others), plus ``fast``: a
    non-strict twin of level 1 that packs an all-scalar tuple directly."""

    __slots__ = ("fast",)
    fast: Any


def _make_default(chain: _Chain, level: int) -> Callable[[Any], Any]:
    nxt = level + 1

    def default(obj: Any) -> Any:
        tp = type(obj)
        payload: Any
        if tp is tuple:
            code = _TUPLE
            payload = list(obj)
        elif tp is int:
            return _new_ext(_ExtType, (_BIGINT, obj.to_bytes((obj.bit_length() + 8) // 8, "big", signed=True)))
        elif tp is datetime:
            code = _DATETIME
            payload = [obj.year, obj.month, obj.day, obj.hour, obj.minute, obj.second, obj.microsecond, obj.fold]
            tz = obj.tzinfo
            if tz is not None:
                if type(tz) is not timezone:
                    raise _unsupported_tz(obj, tz)
                payload += _tz_fields(tz)
        elif tp is frozenset or tp is set:
            # Members in the order of their encodings, not in iteration order
            # (which depends on insertion history and, for str/bytes, on the
            # per-process hash seed): equal sets encode to equal bytes in
            # every process, so encoded keys can be compared and hashed.
            try:
                packer = chain[nxt]
            except IndexError:
                packer = _add_level(chain)
            members = sorted(map(packer.pack, obj))
            return _new_ext(
                _ExtType,
                (_FROZENSET if tp is frozenset else _SET, packer.pack_array_header(len(members)) + b"".join(members)),
            )
        elif tp is Decimal:
            return _new_ext(_ExtType, (_DECIMAL, str(obj).encode("ascii")))
        elif tp is complex:
            return _new_ext(_ExtType, (_COMPLEX, _DOUBLES.pack(obj.real, obj.imag)))
        elif tp is date:
            code = _DATE
            payload = [obj.year, obj.month, obj.day]
        elif tp is time:
            code = _TIME
            payload = [obj.hour, obj.minute, obj.second, obj.microsecond, obj.fold]
            tz = obj.tzinfo
            if tz is not None:
                if type(tz) is not timezone:
                    raise _unsupported_tz(obj, tz)
                payload += _tz_fields(tz)
        elif tp is timedelta:
            code = _TIMEDELTA
            payload = [obj.days, obj.seconds, obj.microseconds]
        elif tp is timezone:
            code = _TIMEZONE
            payload = _tz_fields(obj)
        else:
            raise _unsupported(obj)
        # The packer running this callback is busy: payloads go to the next
        # one (a Packer is not reentrant, its buffer would be clobbered).
        try:
            packer = chain[nxt]
        except IndexError:
            packer = _add_level(chain)
        return _new_ext(_ExtType, (code, packer.pack(payload)))

    return default


def _add_level(chain: _Chain) -> Any:
    level = len(chain)
    if level > MAX_EXT_NESTING + 1:  # _prepare guarantees this never happens
        raise _too_deep()
    packer = _Packer(default=_make_default(chain, level), strict_types=True, **_PACKER_OPTIONS)
    chain.append(packer)
    return packer


def _new_chain() -> _Chain:
    chain = _Chain()
    _add_level(chain)
    _add_level(chain)
    # Used only on values whose items were all checked to be exact scalar
    # types, for which non-strict packing is exact too; it packs the tuple
    # itself as an array, saving a list() copy.
    chain.fast = _Packer(default=_make_default(chain, 1), strict_types=False, **_PACKER_OPTIONS)
    return chain


# Per-thread pool of packer chains.  A chain is taken out of the pool while
# it is in use, so a reentrant dumps() in the same thread (a __del__ or a
# signal handler storing something) gets a fresh chain instead of clobbering
# the buffers of the one in use.
_tls = threading.local()
# A chain whose root output exceeded this is dropped instead of pooled, so a
# thread that once stored a huge value does not keep huge buffers forever.
_KEEP_BUFFERS_UP_TO = 1 << 20


# --------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------


def _no_ext(code: int, data: bytes) -> NoReturn:
    raise CorruptSegment(f"unexpected msgpack ext type {code} inside a scalar payload")


def _scalar_payload(data: bytes, min_len: int, max_len: int, n_ints: int) -> List[Any]:
    fields = _unpackb(data, raw=False, strict_map_key=False, ext_hook=_no_ext)
    if type(fields) is not list or not min_len <= len(fields) <= max_len:
        raise CorruptSegment("malformed ext payload")
    for i in range(n_ints):
        if type(fields[i]) is not int:
            raise CorruptSegment("malformed ext payload")
    return fields


def _tz_from(fields: List[Any], start: int) -> Optional[timezone]:
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
    if code == _BIGINT:
        return int.from_bytes(data, "big", signed=True)
    if code == _DATETIME:
        f = _scalar_payload(data, 8, 10, 8)
        return datetime(f[0], f[1], f[2], f[3], f[4], f[5], f[6], _tz_from(f, 8), fold=f[7])
    if code == _DECIMAL:
        return Decimal(data.decode("ascii"))
    if code == _COMPLEX:
        real, imag = _DOUBLES.unpack(data)
        return complex(real, imag)
    if code == _BYTEARRAY:
        return bytearray(data)
    if code == _DATE:
        f = _scalar_payload(data, 3, 3, 3)
        return date(f[0], f[1], f[2])
    if code == _TIME:
        f = _scalar_payload(data, 5, 7, 5)
        return time(f[0], f[1], f[2], f[3], _tz_from(f, 5), fold=f[4])
    if code == _TIMEDELTA:
        f = _scalar_payload(data, 3, 3, 3)
        return timedelta(f[0], f[1], f[2])
    if code == _TIMEZONE:
        f = _scalar_payload(data, 1, 2, 0)
        return _tz_from(f, 0)
    raise CorruptSegment(f"unknown msgpack ext type {code}")


def _make_hook(level: int) -> Callable[[int, bytes], Any]:
    nxt = level + 1

    def ext_hook(code: int, data: bytes) -> Any:
        if _TUPLE <= code <= _FROZENSET:
            if nxt > MAX_EXT_NESTING:
                raise CorruptSegment("tuple/set/frozenset nested too deeply")
            items = _unpackb(data, raw=False, strict_map_key=False, ext_hook=_HOOKS[nxt])
            if type(items) is not list:
                raise CorruptSegment("malformed container payload")
            if code == _TUPLE:
                return tuple(items)
            if code == _SET:
                return set(items)
            return frozenset(items)
        return _decode_scalar(code, data)

    return ext_hook


# _HOOKS[n] decodes ext objects found inside n enclosing ext containers.
_HOOKS = [_make_hook(level) for level in range(MAX_EXT_NESTING + 1)]
_ROOT_HOOK = _HOOKS[0]

# msgpack decodes its Timestamp ext (-1) itself, without calling ext_hook.
# These are all the encodings a Timestamp can have (fixext 4/8, ext 8/16/32
# of length 4, 8 or 12); data without any of them cannot hold a Timestamp,
# otherwise (rare, e.g. such bytes inside a str) the result is searched.
_TIMESTAMP_RE = re.compile(
    rb"[\xd6\xd7]\xff|\xc7[\x04\x08\x0c]\xff|\xc8\x00[\x04\x08\x0c]\xff|\xc9\x00\x00\x00[\x04\x08\x0c]\xff"
)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
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


_CONTAINER_TYPES = frozenset({list, tuple, set, frozenset, dict})
# Deeper than anything msgpack decodes (its stack) plus our ext levels: the
# compiled walk reports such data as suspect instead of recursing further.
_DECODED_DEPTH_LIMIT = 4096
_SCAN_WITHOUT_REGEX = 1 << 16


def _contains_timestamp(obj: Any) -> bool:
    """True if a Timestamp is anywhere in the decoded ``obj`` (one walk of
    ``speedups.contains_type``; data nested deeper than any decode is suspect)."""
    return _contains_type(obj, _Timestamp, _DECODED_DEPTH_LIMIT)


def _describe(exc: BaseException) -> str:
    detail = str(exc)
    text = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


# --------------------------------------------------------------------------
# Codecs
# --------------------------------------------------------------------------


class Codec:
    """Turns keys and values into bytes and back.

    ``id`` is stored in the shared control header so that every process
    attaching to a dict uses the serializer it was created with.
    """

    id: int = 0
    name: str = ""

    def dumps(self, obj: Any) -> bytes:
        """Encode *obj*; raises :class:`UnsupportedType` and nothing else."""
        raise NotImplementedError

    def loads(self, data: _BytesLike) -> Any:
        """Decode *data*; raises :class:`CorruptSegment` and nothing else."""
        raise NotImplementedError

    def loads_many(self, payloads: List[bytes], framed: bool = False) -> List[Any]:
        """``[loads(p) for p in payloads]``; raises :class:`CorruptSegment`
        naming the index of the first payload that cannot be decoded.
        ``framed``: the caller checked that each payload is exactly one
        object of the encoding (a hint a codec may use to decode faster)."""
        out = []
        for i, payload in enumerate(payloads):
            try:
                out.append(self.loads(payload))
            except CorruptSegment as exc:
                raise CorruptSegment(f"record {i}: {exc}") from exc
        return out

    def encode_record(self, record: List[Any]) -> Tuple[bytes, Any]:
        """``(payload, decoded)``: the encoding of a stream record and what every
        reader decodes from it -- the writer applies ``decoded`` to its own
        cache, so that it holds exactly what other processes hold."""
        payload = self.dumps(record)
        return payload, self.loads(payload)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} (id {self.id})>"


class MsgpackCodec(Codec):
    """The default, safe serializer: msgpack plus the ext types of this module.

    Decoding never runs code chosen by the writer of the bytes.  Encoding is
    thread-safe; it reuses a msgpack Packer per thread.
    """

    id = 1
    name = "msgpack"

    def __reduce__(self) -> Any:
        return (codec_for, (self.name,))

    def dumps(self, obj: Any) -> bytes:
        tp = type(obj)
        leaf = _LEAF_TYPES
        try:
            try:
                pool: List[_Chain] = _tls.pool
            except AttributeError:
                pool = _tls.pool = []
            chain = pool.pop() if pool else _new_chain()
            if tp in leaf:
                out: bytes = chain[0].pack(obj)
            elif tp is tuple:
                # Fast path for the typical composite key: a tuple of scalars
                # needs neither the walk nor a default() callback for itself.
                for item in obj:
                    if type(item) not in leaf:
                        out = chain[0].pack(_prepare(obj, 0, 0))
                        break
                else:
                    if _PACK_EXT_TYPE_RETURNS:
                        out = chain[0].pack_ext_type(_TUPLE, chain.fast.pack(obj))
                    else:  # pragma: no cover - old msgpack
                        out = chain[0].pack(_new_ext(_ExtType, (_TUPLE, chain.fast.pack(obj))))
            else:
                out = chain[0].pack(_prepare(obj, 0, 0))
        except UnsupportedType:
            raise
        except RecursionError as exc:
            raise _too_deep() from exc
        except Exception as exc:
            if isinstance(exc, ValueError) and "recursion limit" in str(exc):
                raise _too_deep() from exc
            raise UnsupportedType(
                f"cannot store this value with the msgpack serializer ({_describe(exc)}); "
                f"{_SUPPORTED_TEXT}. {_PICKLE_HINT}"
            ) from exc
        if len(out) <= _KEEP_BUFFERS_UP_TO:
            pool.append(chain)
        return out

    def encode_record(self, record: List[Any]) -> Tuple[bytes, Any]:
        # Fast path for records whose path, keys and values are all scalars
        # (``[OP_SET, path, key, value]``, ``[OP_DEL, path, key]``,
        # ``[OP_CLEAR, path]``): one plain Packer call, no type walk,
        # and no decode -- a scalar of these exact types decodes to an equal
        # object of the same type (tests/test_codec.py checks payload and
        # decoding against the general path).  The shared Packer has no
        # ``default`` callback, so pack() never runs Python code or releases
        # the GIL: no other thread can interleave with it.  Anything it cannot
        # pack (an int beyond 64 bits, a str with lone surrogates) raises and
        # takes the general path.
        scalar = _RECORD_SCALARS
        n = len(record)
        if (
            (n == 4 and type(record[3]) in scalar and type(record[2]) in scalar)
            or (n == 3 and type(record[2]) in scalar)
            or n == 2
        ) and (not record[1] or scalar.issuperset(map(type, record[1]))):
            try:
                return _record_pack(record), record
            except Exception:
                pass
        payload = self.dumps(record)
        return payload, self.loads(payload)

    def loads_many(self, payloads: List[bytes], framed: bool = False) -> List[Any]:
        # A reader replaying a long stream decodes every record.  When the
        # caller has checked that every payload is exactly one msgpack object
        # (``framed``: the compiled parse_records does), one Unpacker decodes
        # them all in one C loop instead of a loads() call per record (~2 µs
        # each).  Anything unusual takes the per-record path for its error.
        if not framed or len(payloads) < 8:
            return super().loads_many(payloads)
        data = b"".join(payloads)
        unpacker = _Unpacker(raw=False, strict_map_key=False, ext_hook=_ROOT_HOOK,
                             max_buffer_size=max(len(data), 1))
        unpacker.feed(data)
        try:
            with _gc_paused():
                out = list(unpacker)
        except Exception:
            return super().loads_many(payloads)
        if len(out) != len(payloads) or (b"\xff" in data and _contains_timestamp(out)):
            return super().loads_many(payloads)  # names the record
        return out

    def loads(self, data: _BytesLike) -> Any:
        try:
            if type(data) is not bytes:
                # One copy: also gives a stable snapshot of a shared buffer.
                # (memoryview() first: bytes(12) would make 12 zero bytes.)
                data = bytes(memoryview(data))
            if len(data) > _SCAN_WITHOUT_REGEX:  # a dump: many containers at once
                with _gc_paused():
                    obj = _unpackb(data, raw=False, strict_map_key=False, ext_hook=_ROOT_HOOK)
            else:
                obj = _unpackb(data, raw=False, strict_map_key=False, ext_hook=_ROOT_HOOK)
            # The regex only pre-filters: on large data (a dump) the compiled
            # walk is cheaper than the scan (1 MB: ~1 ms against ~8 ms).
            if b"\xff" in data and (
                len(data) > _SCAN_WITHOUT_REGEX
                or _TIMESTAMP_RE.search(data) is not None
            ) and _contains_timestamp(obj):
                raise CorruptSegment("msgpack Timestamp ext found; this serializer never writes one")
            return obj
        except CorruptSegment:
            raise
        except Exception as exc:
            raise CorruptSegment(f"cannot decode msgpack data: {_describe(exc)}") from exc


#: Pickle protocol used by :class:`PickleCodec`.
PICKLE_PROTOCOL = min(pickle.HIGHEST_PROTOCOL, 5)


class PickleCodec(Codec):
    """Opt-in serializer for arbitrary picklable objects.

    WARNING: loading a pickle executes code chosen by whoever wrote the
    bytes.  With this serializer every process that can write the dict's
    shared-memory segments can run arbitrary code in every process that
    reads the dict.  Use it only when all of them are trusted.
    """

    id = 2
    name = "pickle"

    def __reduce__(self) -> Any:
        return (codec_for, (self.name,))

    def dumps(self, obj: Any) -> bytes:
        try:
            return pickle.dumps(obj, protocol=PICKLE_PROTOCOL)
        except Exception as exc:
            raise UnsupportedType(
                f"cannot store a value of type {_type_name(type(obj))!r} with the pickle "
                f"serializer ({_describe(exc)})"
            ) from exc

    def loads(self, data: _BytesLike) -> Any:
        try:
            return pickle.loads(data)
        except Exception as exc:
            raise CorruptSegment(f"cannot decode pickle data: {_describe(exc)}") from exc


MSGPACK = MsgpackCodec()
PICKLE = PickleCodec()

_BY_NAME: Dict[str, Codec] = {MSGPACK.name: MSGPACK, PICKLE.name: PICKLE}
class ObjectCodec(Codec):
    """Any object with ``dumps(obj)`` and ``loads(data)`` (the ``json`` module, say).

    Its header id is :data:`CUSTOM_ID` whatever the object is: shared memory
    cannot name Python objects, so every process attaching to such a dict must
    pass the same ``serializer=`` itself.  What round-trips is up to the object
    (``json`` turns tuples into lists and int keys into strings).  ``dumps`` may
    return ``str`` (stored as UTF-8) or bytes; ``loads`` receives bytes.
    """

    id = 3

    def __init__(self, serializer: Any) -> None:
        self.serializer = serializer
        self.name = "custom:" + getattr(serializer, "__name__", type(serializer).__name__)

    def dumps(self, obj: Any) -> bytes:
        try:
            out = self.serializer.dumps(obj)
        except Exception as exc:
            raise UnsupportedType(
                f"cannot store a value of type {_type_name(type(obj))!r} with the {self.name} "
                f"serializer ({_describe(exc)})"
            ) from exc
        if isinstance(out, str):
            return out.encode("utf-8")
        if isinstance(out, (bytes, bytearray, memoryview)):
            return bytes(out)
        raise UnsupportedType(f"{self.name}.dumps returned {type(out).__name__}, not bytes or str")

    def loads(self, data: _BytesLike) -> Any:
        try:
            return self.serializer.loads(bytes(data))
        except Exception as exc:
            raise CorruptSegment(f"{self.name} serializer cannot decode the bytes ({_describe(exc)})") from exc

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectCodec) and other.serializer is self.serializer

    def __hash__(self) -> int:
        return hash(id(self.serializer))


#: Header id of every :class:`ObjectCodec`.
CUSTOM_ID = ObjectCodec.id

_BY_ID: Dict[int, Codec] = {MSGPACK.id: MSGPACK, PICKLE.id: PICKLE}


def codec_for(serializer: Any) -> Codec:
    """The codec for a ``serializer=`` argument.

    ``None`` or ``"msgpack"`` -> msgpack; ``"pickle"`` or the :mod:`pickle`
    module -> pickle; a :class:`Codec` -> itself; any other object with
    callable ``dumps`` and ``loads`` -> an :class:`ObjectCodec` around it.
    """
    if serializer is None:
        return MSGPACK
    if isinstance(serializer, Codec):
        return serializer
    if isinstance(serializer, str):
        found = _BY_NAME.get(serializer.lower())
        if found is not None:
            return found
    elif serializer is pickle:
        return PICKLE
    elif callable(getattr(serializer, "dumps", None)) and callable(getattr(serializer, "loads", None)):
        return ObjectCodec(serializer)
    raise ValueError(
        f"serializer must be 'msgpack' (the default, safe), 'pickle', None, a Codec, or an "
        f"object with dumps() and loads(); not {serializer!r}"
    )


def codec_by_id(codec_id: int) -> Codec:
    """The codec whose ``id`` is stored in a segment header."""
    found = _BY_ID.get(codec_id) if type(codec_id) is int else None
    if found is None:
        raise CorruptSegment(f"unknown serializer id {codec_id}")
    return found


# --------------------------------------------------------------------------
# Copies for the local cache
# --------------------------------------------------------------------------

#: Types whose values are immutable all the way down: the cache hands them out as they are.
IMMUTABLE_TYPES: frozenset[type] = _LEAF_TYPES | {frozenset}
_IMMUTABLE_TYPES = IMMUTABLE_TYPES


def _copy(value: Any) -> Any:
    tp = type(value)
    if tp in _IMMUTABLE_TYPES:
        return value
    if tp is list:
        if _IMMUTABLE_TYPES.issuperset(map(type, value)):
            return value.copy()
        return [_copy(item) for item in value]
    if tp is dict:
        if _IMMUTABLE_TYPES.issuperset(map(type, value.values())):
            return value.copy()
        return {key: _copy(item) for key, item in value.items()}
    if tp is tuple:
        if _IMMUTABLE_TYPES.issuperset(map(type, value)):
            return value
        items = [_copy(item) for item in value]
        if all(map(operator.is_, items, value)):
            return value
        return tuple(items)
    if tp is set:
        return value.copy()
    if tp is bytearray:
        return bytearray(value)
    return copy.deepcopy(value)


def copy_value(value: Any) -> Any:
    """Return a copy of *value* that shares no mutable object with it.

    Immutable values (and tuples holding only immutable values) are returned
    as they are.  Lists, dicts, sets and bytearrays are copied, recursively;
    dict keys and set members are hashable and so are not copied.  Any other
    type (possible only with the pickle serializer) is ``copy.deepcopy``-ed.
    """
    if type(value) in _IMMUTABLE_TYPES:
        return value
    try:
        return _copy(value)
    except RecursionError:  # self-referencing pickled value: let deepcopy's memo handle it
        return copy.deepcopy(value)
