"""Encoding of the msgpack serializer: values to bytes.

The format and its ext types are specified in :mod:`ultradict_ng._codec.ext`.
:func:`prepare` checks a value (exact supported types, nesting limits) before
it is packed; a chain of msgpack Packers, one per ext nesting level, whose
``default`` callbacks turn the ext types into ext objects, packs it.  Each
thread keeps a small pool of chains.
"""

from __future__ import annotations

import operator
import threading
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable, Optional

from ..speedups import types_within as _types_within
from . import ext as msgpack_ext
from .arrays import array_meta, is_ndarray, is_tensor, tensor_as_array
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
    MAX_NESTING,
    ExtType,
    Packer,
    new_ext,
    too_deep,
    unsupported_type,
    unsupported_tz,
)
from .placeholders import BlobRef, InlineArray
from .records import SCALAR_TYPES

# Bound by assignment, not imported by name: CPython (3.11+) compiles
# ``name.method(...)`` on a name bound by an import as an attribute load
# and a call (it takes the name for a module), slower than a method call.
DOUBLES = msgpack_ext.DOUBLES
LEAF_TYPES = msgpack_ext.LEAF_TYPES

# Options of every Packer we create.  buf_size (msgpack >= 1.1) keeps the
# per-thread packers small; older versions start with 1 MiB buffers.
_PACKER_OPTIONS: dict[str, Any] = {
    "use_bin_type": True,
    "datetime": False,
    "autoreset": True,
    "buf_size": 4096,
}
try:
    Packer(**_PACKER_OPTIONS)
except TypeError:  # pragma: no cover - msgpack < 1.1
    del _PACKER_OPTIONS["buf_size"]
# Packer.pack_ext_type returns the bytes (autoreset) only in recent msgpack;
# older versions leave them in the buffer, to be prepended to the next pack.
PACK_EXT_TYPE_RETURNS = Packer(**_PACKER_OPTIONS).pack_ext_type(1, b"x") == b"\xd4\x01x"
# encode_record's fast path: these types pack natively, exactly, and decode
# to an equal object of the same type (records.py defines the set).
RECORD_SCALARS = SCALAR_TYPES
record_pack: Callable[[Any], bytes] = Packer(**_PACKER_OPTIONS).pack
# encode_record's path for JSON-like values: strict, so that it refuses (raises)
# anything but exact dicts, lists and scalars -- a tuple, a set, a subclass.
strict_pack: Callable[[Any], bytes] = Packer(strict_types=True, **_PACKER_OPTIONS).pack

#: How many container levels below a container :func:`_plain_below` scans at
#: once: a lookup table's rows (a dict of tuples) are one, an update record's
#: pairs with tuple values ([op, path, [[key, (..)], ...]]) three.
SCAN_LEVELS = 3


def _plain_below(obj: Any, depth: int, ext_depth: int) -> bool:
    """Whether :func:`prepare` would return ``obj`` (a list, tuple, set or dict
    at ``depth``/``ext_depth``, already counted) as it is, decided by one
    compiled scan instead of a call per nested container: every member is a
    leaf, or a plain list, tuple, set or dict of them within ``SCAN_LEVELS``
    levels -- none needs converting -- and no nesting limit is within reach.
    False says only that the walk must decide."""
    return (
        depth + SCAN_LEVELS <= MAX_NESTING
        and ext_depth + SCAN_LEVELS <= MAX_EXT_NESTING
        and _types_within(obj, LEAF_TYPES, SCAN_LEVELS)
    )


def prepare(obj: Any, depth: int, ext_depth: int) -> Any:
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
        raise too_deep()
    if tp is list:
        if _plain_below(obj, depth, ext_depth):
            return obj
        out: Optional[list[Any]] = None
        for i, item in enumerate(obj):
            if type(item) in LEAF_TYPES:
                continue
            new = prepare(item, depth, ext_depth)
            if new is not item:
                if out is None:
                    out = list(obj)
                out[i] = new
        return obj if out is None else out
    if tp is dict:
        if _plain_below(obj, depth, ext_depth):
            return obj
        changed = False
        items = []
        for key, value in obj.items():
            new_key = key if type(key) in LEAF_TYPES else prepare(key, depth, ext_depth)
            new_value = value if type(value) in LEAF_TYPES else prepare(value, depth, ext_depth)
            changed = changed or new_key is not key or new_value is not value
            items.append((new_key, new_value))
        return dict(items) if changed else obj
    if tp is tuple or tp is set or tp is frozenset:
        ext_depth += 1
        if ext_depth > MAX_EXT_NESTING:
            raise too_deep()
        if _plain_below(obj, depth, ext_depth):
            return obj
        new_items = [item if type(item) in LEAF_TYPES else prepare(item, depth, ext_depth) for item in obj]
        if all(map(operator.is_, new_items, obj)):
            return obj
        # Only a bytearray is ever converted, and sets cannot hold one.
        return tuple(new_items) if tp is tuple else tp(new_items)
    if tp is bytearray:
        return new_ext(ExtType, (EXT_BYTEARRAY, bytes(obj)))
    if tp in LEAF_TYPES:
        return obj
    if tp is BlobRef:
        return new_ext(ExtType, (EXT_BLOB, _plain_pack([obj.id, obj.kind, obj.length, obj.meta])))
    if tp is InlineArray:
        fields = [obj.descr, list(obj.shape), obj.data] + ([True] if obj.tensor else [])
        return new_ext(ExtType, (EXT_NDARRAY, _plain_pack(fields)))
    tensor = is_tensor(obj)
    if tensor or is_ndarray(obj):
        arr = tensor_as_array(obj) if tensor else obj
        descr, shape = array_meta(arr)
        data = arr.tobytes()  # C order, whatever the array's own layout
        fields = [descr, shape, data] + ([True] if tensor else [])
        return new_ext(ExtType, (EXT_NDARRAY, _plain_pack(fields)))
    raise unsupported_type(obj)


# Packs the payloads of ext 13 and 14: lists of ints, strs, bytes and nil only.
_plain_pack: Callable[[Any], bytes] = msgpack_ext.Packer(use_bin_type=True, autoreset=True).pack


def _tz_fields(tz: timezone) -> list[Any]:
    args = tz.__getinitargs__()  # type: ignore[attr-defined]  # (offset,) or (offset, name): not in typeshed
    offset: timedelta = args[0]
    micros = (offset.days * 86400 + offset.seconds) * 1_000_000 + offset.microseconds
    return [micros] if len(args) == 1 else [micros, args[1]]


class Chain(list[Any]):
    """One msgpack Packer per ext nesting level (``chain[n]`` packs the
    payloads of ext objects nested in ``n`` others), plus ``fast``: a
    non-strict twin of level 1 that packs an all-scalar tuple directly."""

    __slots__ = ("fast",)
    fast: Any


def _make_default(chain: Chain, level: int) -> Callable[[Any], Any]:
    nxt = level + 1

    def default(obj: Any) -> Any:
        tp = type(obj)
        payload: Any
        if tp is tuple:
            code = EXT_TUPLE
            payload = list(obj)
        elif tp is int:
            return new_ext(
                ExtType, (EXT_BIGINT, obj.to_bytes((obj.bit_length() + 8) // 8, "big", signed=True))
            )
        elif tp is datetime:
            code = EXT_DATETIME
            payload = [
                obj.year,
                obj.month,
                obj.day,
                obj.hour,
                obj.minute,
                obj.second,
                obj.microsecond,
                obj.fold,
            ]
            tz = obj.tzinfo
            if tz is not None:
                if type(tz) is not timezone:
                    raise unsupported_tz(obj, tz)
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
            return new_ext(
                ExtType,
                (
                    EXT_FROZENSET if tp is frozenset else EXT_SET,
                    packer.pack_array_header(len(members)) + b"".join(members),
                ),
            )
        elif tp is Decimal:
            return new_ext(ExtType, (EXT_DECIMAL, str(obj).encode("ascii")))
        elif tp is complex:
            return new_ext(ExtType, (EXT_COMPLEX, DOUBLES.pack(obj.real, obj.imag)))
        elif tp is date:
            code = EXT_DATE
            payload = [obj.year, obj.month, obj.day]
        elif tp is time:
            code = EXT_TIME
            payload = [obj.hour, obj.minute, obj.second, obj.microsecond, obj.fold]
            tz = obj.tzinfo
            if tz is not None:
                if type(tz) is not timezone:
                    raise unsupported_tz(obj, tz)
                payload += _tz_fields(tz)
        elif tp is timedelta:
            code = EXT_TIMEDELTA
            payload = [obj.days, obj.seconds, obj.microseconds]
        elif tp is timezone:
            code = EXT_TIMEZONE
            payload = _tz_fields(obj)
        else:
            raise unsupported_type(obj)
        # The packer running this callback is busy: payloads go to the next
        # one (a Packer is not reentrant, its buffer would be clobbered).
        try:
            packer = chain[nxt]
        except IndexError:
            packer = _add_level(chain)
        return new_ext(ExtType, (code, packer.pack(payload)))

    return default


def _add_level(chain: Chain) -> Any:
    level = len(chain)
    if level > MAX_EXT_NESTING + 1:  # prepare guarantees this never happens
        raise too_deep()
    packer = Packer(default=_make_default(chain, level), strict_types=True, **_PACKER_OPTIONS)
    chain.append(packer)
    return packer


def new_chain() -> Chain:
    chain = Chain()
    _add_level(chain)
    _add_level(chain)
    # Used only on values whose items were all checked to be exact scalar
    # types, for which non-strict packing is exact too; it packs the tuple
    # itself as an array, saving a list() copy.
    chain.fast = Packer(default=_make_default(chain, 1), strict_types=False, **_PACKER_OPTIONS)
    return chain


# Per-thread pool of packer chains.  A chain is taken out of the pool while
# it is in use, so a reentrant dumps() in the same thread (a __del__ or a
# signal handler storing something) gets a fresh chain instead of clobbering
# the buffers of the one in use.
packers = threading.local()
# A chain whose root output exceeded this is dropped instead of pooled, so a
# thread that once stored a huge value does not keep huge buffers forever.
KEEP_BUFFERS_UP_TO = 1 << 20
