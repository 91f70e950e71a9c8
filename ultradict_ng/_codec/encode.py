"""Encoding of the msgpack serializer: values to bytes.

The format and its ext types are specified in :mod:`ultradict_ng.msgpack_ext`.
:func:`_prepare` checks a value (exact supported types, nesting limits) before
it is packed; a chain of msgpack Packers, one per ext nesting level, whose
``default`` callbacks turn the ext types into ext objects, packs it.  Each
thread keeps a small pool of chains.
"""

from __future__ import annotations

import operator
import threading
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable, Dict, List, Optional

from . import ext as msgpack_ext
from .arrays import array_meta, is_ndarray, is_tensor, tensor_as_array
from .._shm.blobs import BlobRef, InlineArray
from .records import SCALAR_TYPES
from ..speedups import types_within as _types_within
from .ext import (
    MAX_EXT_NESTING,
    MAX_NESTING,
    _BIGINT,
    _BLOB,
    _BYTEARRAY,
    _COMPLEX,
    _DATE,
    _DATETIME,
    _DECIMAL,
    _FROZENSET,
    _NDARRAY,
    _SET,
    _TIME,
    _TIMEDELTA,
    _TIMEZONE,
    _TUPLE,
    _ExtType,
    _new_ext,
    _Packer,
    _too_deep,
    _unsupported,
    _unsupported_tz,
)

# Bound by assignment, not imported by name: CPython (3.11+) compiles
# ``name.method(...)`` on a name bound by an import as an attribute load
# and a call (it takes the name for a module), slower than a method call.
_DOUBLES = msgpack_ext._DOUBLES
_LEAF_TYPES = msgpack_ext._LEAF_TYPES

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
# encode_record's fast path: these types pack natively, exactly, and decode
# to an equal object of the same type (record.py defines the set).
_RECORD_SCALARS = SCALAR_TYPES
_record_pack: Callable[[Any], bytes] = _Packer(**_PACKER_OPTIONS).pack

def _leaf_only(obj: Any) -> bool:
    """Whether every member of a list, tuple, set or dict (keys and values)
    is of a leaf type: the scan before packing (``speedups.types_within``)."""
    return _types_within(obj, _LEAF_TYPES)


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
    if tp is BlobRef:
        return _new_ext(_ExtType, (_BLOB, _plain_pack([obj.id, obj.kind, obj.length, obj.meta])))
    if tp is InlineArray:
        fields = [obj.descr, list(obj.shape), obj.data] + ([True] if obj.tensor else [])
        return _new_ext(_ExtType, (_NDARRAY, _plain_pack(fields)))
    tensor = is_tensor(obj)
    if tensor or is_ndarray(obj):
        arr = tensor_as_array(obj) if tensor else obj
        descr, shape = array_meta(arr)
        data = arr.tobytes()  # C order, whatever the array's own layout
        fields = [descr, shape, data] + ([True] if tensor else [])
        return _new_ext(_ExtType, (_NDARRAY, _plain_pack(fields)))
    raise _unsupported(obj)


# Packs the payloads of ext 13 and 14: lists of ints, strs, bytes and nil only.
_plain_pack: Callable[[Any], bytes] = msgpack_ext._Packer(use_bin_type=True, autoreset=True).pack


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
