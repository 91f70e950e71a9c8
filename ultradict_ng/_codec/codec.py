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

The msgpack format (its ext types, what round-trips exactly, the limits)
is specified in :mod:`ultradict_ng._codec.ext`; :mod:`ultradict_ng._codec.encode`
and :mod:`ultradict_ng._codec.decode` implement it.  This module holds the
codecs built on them and on pickle, and the copies the local cache hands out.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any, Union

from .._shm.layout import OP_UPDATE
from ..errors import CorruptSegment, UnsupportedType
from ..speedups import copy_plain, pack_map, pack_pairs, types_within, unpack_simple
from . import decode as msgpack_decode
from .copies import IMMUTABLE_TYPES, copy_value
from .decode import ROOT_HOOK, contains_timestamp, gc_paused
from .encode import (
    KEEP_BUFFERS_UP_TO,
    PACK_EXT_TYPE_RETURNS,
    RECORD_SCALARS,
    Chain,
    new_chain,
    packers,
    prepare,
    record_pack,
    strict_pack,
)
from .ext import (
    EXT_TUPLE,
    LEAF_TYPES,
    MAX_EXT_NESTING,
    MAX_NESTING,
    PICKLE_HINT,
    SUPPORTED_TEXT,
    ExtType,
    Unpacker,
    new_ext,
    too_deep,
    type_name,
    unpackb,
)

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

# Bound by assignment, not imported by name: CPython (3.11+) compiles
# ``name.method(...)`` on a name bound by an import as an attribute load
# and a call (it takes the name for a module), slower than a method call.
TIMESTAMP_RE = msgpack_decode.TIMESTAMP_RE

_BytesLike = Union[bytes, bytearray, memoryview]
# Data longer than this (a dump) is decoded with the collector paused, and
# searched for a Timestamp by the compiled walk without the regex pre-filter.
_SCAN_WITHOUT_REGEX = 1 << 16
#: What ``unpack_simple`` returns for data that is not a scalar or a tuple of them.
_NOT_SIMPLE: Any = object()


def describe_error(exc: BaseException) -> str:
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

    def loads_many(self, payloads: list[bytes], framed: bool = False) -> list[Any]:
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

    def encode_record(self, record: list[Any]) -> tuple[bytes, Any]:
        """``(payload, decoded)``: the encoding of a stream record and what every
        reader decodes from it -- the writer applies ``decoded`` to its own
        cache, so that it holds exactly what other processes hold."""
        payload = self.dumps(record)
        return payload, self.loads(payload)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} (id {self.id})>"


# encode_record's JSON-like values: the containers at the top, and how deep
# types_within looks (deeper trees take the general path).
_JSON_TREES = frozenset({dict, list, tuple})
_JSON_LEVELS = 16


class MsgpackCodec(Codec):
    """The default, safe serializer: msgpack plus the ext types of :mod:`ultradict_ng._codec.ext`.

    Decoding never runs code chosen by the writer of the bytes.  Encoding is
    thread-safe; it reuses a msgpack Packer per thread.
    """

    id = 1
    name = "msgpack"

    def __reduce__(self) -> Any:
        return (codec_for, (self.name,))

    def dumps(self, obj: Any) -> bytes:
        tp = type(obj)
        leaf = LEAF_TYPES
        try:
            try:
                pool: list[Chain] = packers.pool
            except AttributeError:
                pool = packers.pool = []
            chain = pool.pop() if pool else new_chain()
            if tp in leaf:
                out: bytes = chain[0].pack(obj)
            elif tp is tuple:
                # Fast path for the typical composite key: a tuple of scalars
                # needs neither the walk nor a default() callback for itself.
                for item in obj:
                    if type(item) not in leaf:
                        out = chain[0].pack(prepare(obj, 0, 0))
                        break
                else:
                    if PACK_EXT_TYPE_RETURNS:
                        out = chain[0].pack_ext_type(EXT_TUPLE, chain.fast.pack(obj))
                    else:  # pragma: no cover - old msgpack
                        out = chain[0].pack(new_ext(ExtType, (EXT_TUPLE, chain.fast.pack(obj))))
            elif tp is dict:
                # A dump, or a lookup table's rows: scalar keys and scalar or
                # scalar-tuple values are packed by one compiled call, to the
                # same bytes (None: something else is in it).
                packed = pack_map(obj, 0)
                out = chain[0].pack(prepare(obj, 0, 0)) if packed is None else packed
            else:
                out = chain[0].pack(prepare(obj, 0, 0))
        except UnsupportedType:
            raise
        except RecursionError as exc:
            raise too_deep() from exc
        except Exception as exc:
            if isinstance(exc, ValueError) and "recursion limit" in str(exc):
                raise too_deep() from exc
            raise UnsupportedType(
                f"cannot store this value with the msgpack serializer ({describe_error(exc)}); "
                f"{SUPPORTED_TEXT}. {PICKLE_HINT}"
            ) from exc
        if len(out) <= KEEP_BUFFERS_UP_TO:
            pool.append(chain)
        return out

    def encode_record(self, record: list[Any]) -> tuple[bytes, Any]:
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
        scalar = RECORD_SCALARS
        n = len(record)
        if (
            (n == 4 and type(record[3]) in scalar and type(record[2]) in scalar)
            or (n == 3 and type(record[2]) in scalar)
            or n == 2
        ) and (not record[1] or scalar.issuperset(map(type, record[1]))):
            try:
                return record_pack(record), record
            except Exception:
                pass
        elif (
            n == 3
            and record[0] == OP_UPDATE
            and type(record[0]) is int
            and type(record[1]) is list
            and (not record[1] or scalar.issuperset(map(type, record[1])))
        ):
            # ``[OP_UPDATE, path, [[k, v], ...]]`` (an update(), a bulk load)
            # whose keys are scalars and values scalars or tuples of at most
            # 15 of them: the pairs are packed by one compiled call, to the
            # bytes dumps gives, and decode to an equal record of the same
            # types (ext 1 decodes to a tuple) -- no decode either.
            pairs = pack_pairs(record[2], 0)
            if pairs is not None:
                try:
                    return b"\x93" + record_pack(record[0]) + record_pack(record[1]) + pairs, record
                except Exception:  # a path int beyond 64 bits, a str with lone surrogates
                    pass
        path_ok = not record[1] or scalar.issuperset(map(type, record[1]))
        if n == 4 and type(record[2]) in scalar and path_ok:
            # A set of a JSON-like value: dicts and lists of these scalars (a
            # session, a user record), or a tuple of such items (a cache's
            # entry).  Their msgpack bytes are the general path's (no ext type
            # below, and an ext tuple's payload is its items' array), packed by
            # a strict Packer that raises on anything else; readers decode them
            # to the same tree, which a copy makes without decoding.
            value = record[3]
            if type(value) in _JSON_TREES and types_within(value, scalar, _JSON_LEVELS):
                try:
                    if type(value) is tuple:
                        inner = ExtType(EXT_TUPLE, strict_pack(list(value)))
                        payload = record_pack([record[0], record[1], record[2], inner])
                    else:
                        payload = strict_pack(record)
                except Exception:  # a tuple or set below, an int beyond 64 bits, lone surrogates
                    pass
                else:
                    return payload, [record[0], record[1], record[2], copy_plain(value)]
        payload = self.dumps(record)
        return payload, self.loads(payload)

    def loads_many(self, payloads: list[bytes], framed: bool = False) -> list[Any]:
        # A reader replaying a long stream decodes every record.  When the
        # caller has checked that every payload is exactly one msgpack object
        # (``framed``: the compiled parse_records does), one Unpacker decodes
        # them all in one C loop instead of a loads() call per record (~2 µs
        # each).  Anything unusual takes the per-record path for its error.
        if not framed or len(payloads) < 8:
            return super().loads_many(payloads)
        data = b"".join(payloads)
        unpacker = Unpacker(
            raw=False, strict_map_key=False, ext_hook=ROOT_HOOK, max_buffer_size=max(len(data), 1)
        )
        unpacker.feed(data)
        try:
            with gc_paused():
                out = list(unpacker)
        except Exception:
            return super().loads_many(payloads)
        if len(out) != len(payloads) or (b"\xff" in data and contains_timestamp(out)):
            return super().loads_many(payloads)  # names the record
        return out

    def loads(self, data: _BytesLike) -> Any:
        try:
            if type(data) is not bytes:
                # One copy: also gives a stable snapshot of a shared buffer.
                # (memoryview() first: bytes(12) would make 12 zero bytes.)
                data = bytes(memoryview(data))
            # A scalar or a tuple of scalars (most values of big dicts: one
            # per first read of a key) in one compiled call, no Unpacker and
            # no ext hook; anything else is declined, in a few nanoseconds.
            value = unpack_simple(data, _NOT_SIMPLE)
            if value is not _NOT_SIMPLE:
                return value
            if len(data) > _SCAN_WITHOUT_REGEX:  # a dump: many containers at once
                with gc_paused():
                    obj = unpackb(data, raw=False, strict_map_key=False, ext_hook=ROOT_HOOK)
            else:
                obj = unpackb(data, raw=False, strict_map_key=False, ext_hook=ROOT_HOOK)
            # The regex only pre-filters: on large data (a dump) the walk is
            # cheaper than the scan (compiled, 1 MB: ~1 ms against ~8 ms).
            if (
                b"\xff" in data
                and (len(data) > _SCAN_WITHOUT_REGEX or TIMESTAMP_RE.search(data) is not None)
                and contains_timestamp(obj)
            ):
                raise CorruptSegment("msgpack Timestamp ext found; this serializer never writes one")
            return obj
        except CorruptSegment:
            raise
        except Exception as exc:
            raise CorruptSegment(f"cannot decode msgpack data: {describe_error(exc)}") from exc


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
        except RecursionError as exc:
            raise UnsupportedType(
                "cannot store this value: it is nested too deeply for the pickle serializer "
                "(pickling recurses once per level of nesting, up to Python's recursion limit "
                f"of {sys.getrecursionlimit()} frames)"
            ) from exc
        except Exception as exc:
            raise UnsupportedType(
                f"cannot store a value of type {type_name(type(obj))!r} with the pickle "
                f"serializer ({describe_error(exc)})"
            ) from exc

    def loads(self, data: _BytesLike) -> Any:
        try:
            return pickle.loads(data)
        except Exception as exc:
            raise CorruptSegment(f"cannot decode pickle data: {describe_error(exc)}") from exc


MSGPACK = MsgpackCodec()
PICKLE = PickleCodec()

_BY_NAME: dict[str, Codec] = {MSGPACK.name: MSGPACK, PICKLE.name: PICKLE}


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
                f"cannot store a value of type {type_name(type(obj))!r} with the {self.name} "
                f"serializer ({describe_error(exc)})"
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
            raise CorruptSegment(
                f"{self.name} serializer cannot decode the bytes ({describe_error(exc)})"
            ) from exc

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectCodec) and other.serializer is self.serializer

    def __hash__(self) -> int:
        return hash(id(self.serializer))


#: Header id of every :class:`ObjectCodec`.
CUSTOM_ID = ObjectCodec.id

_BY_ID: dict[int, Codec] = {MSGPACK.id: MSGPACK, PICKLE.id: PICKLE}


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
