"""The engine behind one attached dict tree: segments, local cache, sync, publish.

A :class:`Store` is one process's handle on a dict: its mappings of the
control and stream segments, its local cache (``data``, a tree of plain dicts)
and the position in the shared history that cache reflects (``seen``).  The
rules it follows -- who writes what in which order, what a reader does when a
check fails -- are specified in :mod:`ultradict_ng.layout`; comments here point
to the steps there.
"""

from __future__ import annotations

import logging
import os
import secrets
import struct
import threading
import time
import weakref
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import faults
from . import layout as L
from . import segment
from .atomicwords import NATIVE, AtomicWords, RecordWriter, make_record_writer, make_words, parse_records
from .codec import CUSTOM_ID, Codec, MsgpackCodec, codec_by_id, codec_for
from .fastpath import StoreBase
from .errors import (
    AlreadyExists,
    Closed,
    CorruptSegment,
    IncompatibleLayout,
    InvalidName,
    LockTimeout,
    NotFound,
    OutOfSpace,
    ParameterMismatch,
    PathGone,
    Unlinked,
)
from .lock import SharedLock, owner_alive, owner_word
from .segment import Segment

__all__ = ["Store", "unlink_by_name", "validate_name"]

log = logging.getLogger("ultradict_ng")

_INVALID = -1  # ``seen``/``gen`` value that forces a reload from the dump
# Hot-path constants as module globals (one dict lookup instead of two).
_W_STATE, _W_STATUS, _UNLINKED = L.W_STATE, L.W_STATUS, L.STATUS_UNLINKED
_GEN_SHIFT, _GEN_MASK, _RECORD_HEADER, _OP_SET = L.GEN_SHIFT, L.GEN_MASK, L.RECORD_HEADER, L.OP_SET
_MSGPACK_ID = MsgpackCodec.id
_W_STREAM_LIMIT = L.W_STREAM_LIMIT
# Key types for which ``dict[key] = value`` cannot raise (hashable, no __eq__ code).
_SCALAR_KEYS = frozenset({type(None), bool, int, float, str, bytes})
_apply_sets: Any = NATIVE.apply_sets if NATIVE is not None else None
_NATIVE_FRAMING = NATIVE is not None
_ATOMIC_WORDS = [L.W_MAGIC, L.W_STREAM_LIMIT, L.W_STATE, L.W_LOCK, L.W_REG_LOW, L.W_REG_HIGH, L.W_STATUS]
_dump_header = struct.Struct(L.DUMP_FORMAT)

Path = Tuple[Any, ...]


class _Inconsistent(Exception):
    """A validated record does not fit the cache: reload from the dump."""


def validate_name(name: Any) -> str:
    if not isinstance(name, str):
        raise InvalidName(f"a shared dict name must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidName("a shared dict name must not be empty")
    if len(name) > L.MAX_NAME_LENGTH:
        raise InvalidName(
            f"shared dict name {name!r} is {len(name)} characters long; at most "
            f"{L.MAX_NAME_LENGTH} fit in a segment name on this platform"
        )
    if not L.NAME_PATTERN.fullmatch(name):
        raise InvalidName(
            f"shared dict name {name!r} may only contain letters, digits, '_', '.' and '-' "
            "(no '/': it names a file in the shared-memory filesystem)"
        )
    return name


def _generate_name() -> str:
    return L.GENERATED_PREFIX + secrets.token_hex(6)


class _ClosedWords:
    """Stands in for the control words after close, so the hit path needs no extra check."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getitem__(self, index: int) -> int:
        raise Closed(f"this handle of shared dict {self._name!r} is closed")


class _Mapping:
    """Everything of one process's view of the control and stream segments.

    Kept apart from :class:`Store` so that a finalizer can release it without
    holding a reference to the store (which would keep the store alive).
    """

    def __init__(self, ctrl: Segment, stream: Optional[Segment]) -> None:
        self.ctrl = ctrl
        self.stream = stream
        assert ctrl.buf is not None
        self.words: memoryview = memoryview(ctrl.buf).cast("Q")
        self.atomic: AtomicWords = make_words(ctrl.buf, _ATOMIC_WORDS)
        self.stream_mv: Optional[memoryview] = (
            memoryview(stream.buf) if stream is not None and stream.buf is not None else None
        )
        self.writer: Optional[RecordWriter] = (
            make_record_writer(stream.buf) if stream is not None and stream.buf is not None else None
        )

    def release(self) -> None:
        self.atomic.release()
        if self.writer is not None:
            self.writer.release()
        self.words.release()
        if self.stream_mv is not None:
            self.stream_mv.release()
        self.ctrl.close()
        if self.stream is not None:
            self.stream.close()


def _finalize(mapping: _Mapping, name: str, token: int, unlink_pid: int) -> None:
    """Runs when a store is closed, collected, or its process exits (weakref.finalize)."""
    try:
        if unlink_pid == os.getpid():  # auto_unlink, and not in a forked child
            _unlink_tree(name, mapping, token)
    finally:
        mapping.release()


_live_stores: "weakref.WeakSet[Store]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_live_stores):
        store.mutex = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Store(StoreBase):
    """One process's attachment to a shared dict tree (see the module docstring).

    ``seen`` and ``data`` live in the base class (:mod:`ultradict_ng.fastpath`),
    where the compiled read hit path finds them.
    """

    # Hot-path fields first; __slots__ keeps attribute access cheap.
    __slots__ = (
        "words", "recurse", "codec", "name", "token", "lock", "mutex",
        "gen", "pos", "stream_size", "grows", "dump_limit", "created", "_map", "_simple", "_finalizer",
        "__weakref__",
    )

    words: Any
    seen: int
    data: Dict[Any, Any]

    def __init__(self, mapping: _Mapping, name: str, codec: Codec, recurse: bool,
                 stream_size: int, token: int, created: bool, dump_limit: int = 0,
                 grows: bool = False) -> None:
        self._map = mapping
        self.words = mapping.words
        # The compiled helper's write_simple on the stream when its bytes are
        # this codec's (msgpack), else None: set_root then takes commit().
        writer = mapping.writer
        self._simple: Any = (
            writer.simple if writer is not None and codec.id == MsgpackCodec.id else None
        )
        self.name = name
        self.codec = codec
        self.recurse = recurse
        self.stream_size = stream_size
        self.grows = grows
        self.dump_limit = dump_limit
        self.token = token
        self.created = created
        self.lock = SharedLock(mapping.atomic, name, token)
        self.mutex = threading.RLock()
        self.data = {}
        self.gen = _INVALID
        self.pos = 0
        self.seen = _INVALID
        self._bind_state(mapping.atomic.raw, L.W_STATE)
        self._finalizer: Optional["weakref.finalize[Any, Any]"] = None
        _live_stores.add(self)

    # -- opening -----------------------------------------------------------------

    @classmethod
    def open(cls, name: Optional[str], create: Optional[bool], *, recurse: Optional[bool],
             buffer_size: Optional[int], serializer: Any, auto_unlink: Optional[bool],
             initial: Optional[Sequence[Sequence[Any]]],
             dump_limit: Optional[int] = None) -> "Store":
        """Create or attach (see :class:`~ultradict_ng.SharedDict` for the parameters).

        ``dump_limit`` caps the size of a full dump in bytes (stored in the
        header; used by the UltraDict compatibility layer's ``full_dump_size``).
        """
        if create not in (None, True, False):
            raise TypeError("create must be None, True or False")
        if name is None:
            if create is False:
                raise NotFound("create=False needs the name of an existing shared dict")
            name = _generate_name()
        validate_name(name)
        if buffer_size is not None:
            if not isinstance(buffer_size, int) or isinstance(buffer_size, bool):
                raise TypeError("buffer_size must be an int (bytes)")
            if not L.MIN_STREAM_SIZE <= buffer_size <= L.MAX_STREAM_SIZE:
                raise ValueError(
                    f"buffer_size must be between {L.MIN_STREAM_SIZE} and {L.MAX_STREAM_SIZE} bytes"
                )
        if dump_limit is not None and (not isinstance(dump_limit, int) or dump_limit < 0):
            raise ValueError("dump_limit must be a non-negative int (bytes) or None")
        codec = codec_for(serializer) if serializer is not None else None
        # Two attempts at most: a dict can vanish between our failed create and
        # our attach (unlinked by someone else), in which case we create it.
        for _ in range(3):
            if create is not False:
                try:
                    store = cls._create(name, codec, bool(recurse), buffer_size, initial,
                                        dump_limit or 0)
                except FileExistsError:
                    if create is True:
                        raise AlreadyExists(f"a shared dict named {name!r} already exists") from None
                else:
                    store._arm_finalizer(True if auto_unlink is None else auto_unlink)
                    return store
            try:
                store = cls._attach(name, codec, recurse, buffer_size, dump_limit)
            except FileNotFoundError:
                if create is False:
                    raise NotFound(f"no shared dict named {name!r} exists") from None
                continue
            store._arm_finalizer(bool(auto_unlink))
            return store
        raise NotFound(f"shared dict {name!r} kept disappearing while attaching to it")

    @classmethod
    def _create(cls, name: str, codec: Optional[Codec], recurse: bool, buffer_size: Optional[int],
                initial: Optional[Sequence[Sequence[Any]]], dump_limit: int) -> "Store":
        """Create the dict; ``buffer_size`` None makes a growing stream (layout: "Stream size")."""
        codec = codec or codec_for(None)
        grows = buffer_size is None
        stream_size = L.GROWING_STREAM_CAP if buffer_size is None else buffer_size
        limit = L.DEFAULT_STREAM_SIZE if buffer_size is None else buffer_size
        ctrl = Segment.create(name, L.CONTROL_SIZE)  # FileExistsError: someone else won
        stream: Optional[Segment] = None
        mapping: Optional[_Mapping] = None
        try:
            sname = L.stream_name(name)
            try:
                stream = Segment.create(sname, stream_size, reserve=limit)
            except FileExistsError:
                # Left by a creator that died before its control segment was
                # ready; we own the control name now, so it is garbage.
                segment.unlink(sname)
                stream = Segment.create(sname, stream_size, reserve=limit)
            mapping = _Mapping(ctrl, stream)
            token = secrets.randbits(64)
            w = mapping.words
            w[L.W_LAYOUT] = L.LAYOUT_VERSION | (L.CONTROL_SIZE << 32)
            w[L.W_CONFIG] = (
                (L.FLAG_RECURSE if recurse else 0) | (L.FLAG_GROWS if grows else 0) | (codec.id << 32)
            )
            w[L.W_STREAM_SIZE] = stream_size
            w[L.W_STREAM_LIMIT] = limit
            w[L.W_TOKEN] = token
            w[L.W_CREATOR] = owner_word()  # pid + start time: liveness-checkable
            w[L.W_DUMP_LIMIT] = dump_limit
            store = cls(mapping, name, codec, recurse, stream_size, token, created=True,
                        dump_limit=dump_limit, grows=grows)
            store.gen, store.pos, store.seen = 0, 0, 0
            if initial:
                store.commit([L.OP_UPDATE, [], [list(kv) for kv in initial]])
            mapping.atomic.store(L.W_MAGIC, L.CONTROL_MAGIC)  # ready: published last
            return store
        except BaseException:
            if mapping is not None:
                _unlink_dumps(name, mapping.words)
                mapping.release()
            else:
                ctrl.close()
                if stream is not None:
                    stream.close()
            segment.unlink(L.stream_name(name))
            segment.unlink(name)
            raise

    @classmethod
    def _attach(cls, name: str, codec: Optional[Codec], recurse: Optional[bool],
                buffer_size: Optional[int], dump_limit: Optional[int]) -> "Store":
        ctrl = _attach_control(name)  # FileNotFoundError propagates
        stream: Optional[Segment] = None
        words = memoryview(ctrl.buf).cast("Q")  # type: ignore[arg-type]
        try:
            _check_layout(name, words)
            config = words[L.W_CONFIG]
            stored_limit = words[L.W_DUMP_LIMIT]
            if config >> 32 == CUSTOM_ID:
                # Shared memory cannot name a Python object: the attacher brings it.
                if codec is None or codec.id != CUSTOM_ID:
                    raise ParameterMismatch(
                        f"shared dict {name!r} uses a custom serializer object; pass the same "
                        "serializer= to attach to it"
                    )
                stored_codec = codec
            else:
                stored_codec = codec_by_id(config >> 32)
            stored_recurse = bool(config & L.FLAG_RECURSE)
            stored_grows = bool(config & L.FLAG_GROWS)
            stream_size = words[L.W_STREAM_SIZE]
            token = words[L.W_TOKEN]
            if words[L.W_STATUS] & L.STATUS_UNLINKED:
                raise FileNotFoundError(name)
            if not L.MIN_STREAM_SIZE <= stream_size <= L.MAX_STREAM_SIZE:
                raise CorruptSegment(f"control segment {name!r} records an invalid stream size {stream_size}")
            mismatches = []
            if recurse is not None and bool(recurse) != stored_recurse:
                mismatches.append(f"recurse={stored_recurse}")
            if codec is not None and codec.id != stored_codec.id:
                mismatches.append(f"serializer={stored_codec.name!r}")
            if buffer_size is not None and (stored_grows or buffer_size != stream_size):
                mismatches.append("buffer_size=None (a growing stream)" if stored_grows
                                  else f"buffer_size={stream_size}")
            if dump_limit is not None and dump_limit != stored_limit:
                mismatches.append(f"dump_limit={stored_limit}")
            if mismatches:
                raise ParameterMismatch(
                    f"shared dict {name!r} exists with {', '.join(mismatches)}; pass only the "
                    "name to attach with its stored configuration"
                )
            sname = L.stream_name(name)
            stream = Segment.attach(sname)  # FileNotFoundError: unlinked meanwhile
            if stream.size < stream_size:
                raise CorruptSegment(
                    f"stream segment {sname!r} holds {stream.size} bytes, its header says {stream_size}"
                )
        except BaseException:
            words.release()
            ctrl.close()
            if stream is not None:
                stream.close()
            raise
        words.release()
        mapping = _Mapping(ctrl, stream)
        store = cls(mapping, name, stored_codec, stored_recurse, stream_size, token, created=False,
                    dump_limit=stored_limit, grows=stored_grows)
        try:
            store.sync()
        except BaseException:
            store.close()
            raise
        return store

    def _arm_finalizer(self, auto_unlink: bool) -> None:
        unlink_pid = os.getpid() if auto_unlink else 0
        self._finalizer = weakref.finalize(self, _finalize, self._map, self.name, self.token, unlink_pid)

    # -- reading (layout: "Reader") ----------------------------------------------------

    def sync(self) -> None:
        """Bring the local cache up to the published STATE."""
        with self.mutex:
            if self.words[L.W_STATE] == self.seen or self._refresh(L.READER_RETRIES) is None:
                return
        # Last resort: under the lock nothing changes.  Order is lock, then mutex.
        with self.lock:
            with self.mutex:
                self._refresh_locked()

    def _refresh_locked(self) -> None:
        problem = self._refresh(1)
        if problem is None:
            return
        if self._map.words[L.W_STATUS] & L.STATUS_UNLINKED:
            raise Unlinked(f"shared dict {self.name!r} was unlinked")
        raise CorruptSegment(f"shared dict {self.name!r}: {problem}")

    def _refresh(self, rounds: int) -> Optional[str]:
        """Up to ``rounds`` rounds of the reader algorithm: None when caught up, else
        what went wrong in the last round."""
        words = self.words
        problem = "no progress"
        for attempt in range(rounds):
            st = words[L.W_STATE]
            if st == self.seen:
                return None
            gen, end = st >> L.GEN_SHIFT, st & L.END_MASK
            if gen != self.gen:  # step 2: a new generation
                data = self._load_dump(gen)
                if isinstance(data, str):
                    problem = data
                    _pause(attempt)
                    continue
                self.data, self.gen, self.pos, self.seen = data, gen, 0, gen << L.GEN_SHIFT
            if end < self.pos or end > self.stream_size:
                problem = f"STATE end {end} outside 0..{self.stream_size} (cached position {self.pos})"
                self.gen = self.seen = _INVALID
                _pause(attempt)
                continue
            mv = self._map.stream_mv
            assert mv is not None
            chunk = bytes(mv[self.pos:end])  # step 3
            if words[L.W_STATE] >> L.GEN_SHIFT != gen:
                problem = "stream restarted while it was being read"
                _pause(attempt)
                continue
            records = self._parse(chunk, gen)  # step 4
            if isinstance(records, str):
                problem = records
                _pause(attempt)
                continue
            try:
                data = self.data
                if _apply_sets is not None:
                    i, n = 0, len(records)
                    while i < n:  # runs of root-level scalar-key sets in C, the rest here
                        i = _apply_sets(data, records, i, _OP_SET, _SCALAR_KEYS)
                        if i < n:
                            self._apply(records[i])
                            i += 1
                else:
                    for rec in records:
                        self._apply(rec)
            except _Inconsistent as exc:
                problem = str(exc)
                self.gen = self.seen = _INVALID
                continue
            except BaseException:  # e.g. KeyboardInterrupt mid-batch: half applied
                self.gen = self.seen = _INVALID
                raise
            self.pos, self.seen = end, st
            return None
        return problem

    def _load_dump(self, gen: int) -> Any:
        """The decoded dump of ``gen``, or a str saying why it could not be loaded."""
        if gen == 0:
            return {}
        dname = L.dump_name(self.name, gen)
        try:
            seg = Segment.attach(dname)
        except FileNotFoundError:
            return f"dump {dname!r} does not exist"
        try:
            if seg.buf is None or seg.size < L.DUMP_HEADER:
                return f"dump {dname!r} is too small ({seg.size} bytes)"
            magic, dgen, length, crc, _ = _dump_header.unpack_from(seg.buf, 0)
            if magic != L.DUMP_MAGIC or dgen != gen or length > seg.size - L.DUMP_HEADER:
                return f"dump {dname!r} has an invalid header"
            with memoryview(seg.buf) as whole, whole[L.DUMP_HEADER:L.DUMP_HEADER + length] as body:
                if zlib.crc32(body) != crc:
                    return f"dump {dname!r} fails its checksum"
                try:
                    data = self.codec.loads(body)
                except CorruptSegment as exc:
                    return f"dump {dname!r} cannot be decoded: {exc}"
            if type(data) is not dict:
                return f"dump {dname!r} does not hold a dict"
            return data
        finally:
            seg.close()

    def _parse(self, chunk: bytes, gen: int) -> Any:
        """Decoded records of ``chunk``, or a str saying what is wrong (step 4)."""
        framed = _NATIVE_FRAMING and self.codec.id == _MSGPACK_ID
        if framed:  # the compiled parser also checks each payload is one msgpack object
            payloads = parse_records(chunk, gen & _GEN_MASK, self.pos, True)
        else:
            payloads = parse_records(chunk, gen & _GEN_MASK, self.pos)
        if isinstance(payloads, str):
            return payloads
        try:
            return self.codec.loads_many(payloads, framed)
        except CorruptSegment as exc:
            return f"records from stream offset {self.pos} cannot be decoded: {exc}"

    def _apply(self, rec: Any) -> None:
        """Apply one decoded record to the cache: the one code path for readers and writers."""
        try:
            op = rec[0]
            node = self.data
            for key in rec[1]:
                node = node[key]
            if type(node) is not dict:
                raise _Inconsistent(f"record path {rec[1]!r} does not lead to a dict")
            if op == _OP_SET:
                node[rec[2]] = rec[3]
            elif op == L.OP_DEL:
                del node[rec[2]]
            elif op == L.OP_CLEAR:
                node.clear()
            elif op == L.OP_UPDATE:
                for key, value in rec[2]:
                    node[key] = value
            else:
                raise _Inconsistent(f"unknown record operation {op!r}")
        except _Inconsistent:
            raise
        except Exception as exc:  # malformed record: wrong shapes, missing keys, unhashable keys
            raise _Inconsistent(f"record does not apply to the cached dict: {exc!r}") from None

    def node(self, path: Path) -> Dict[Any, Any]:
        """The cached dict at ``path`` (caller has synced); PathGone if it is not a dict now."""
        node = self.data
        for key in path:
            try:
                node = node[key]
            except (KeyError, TypeError):
                node = None  # type: ignore[assignment]
            if type(node) is not dict:
                raise PathGone(
                    f"nested dict at path {list(path)!r} of shared dict {self.name!r} no longer exists"
                )
        return node

    # -- writing (layout: "Writer") -----------------------------------------------------

    def begin_write(self) -> None:
        """Take the lock and the cache mutex, and catch up (writer steps 1-2)."""
        words = self.words
        words[_W_STATE]  # raises Closed on a closed handle, before touching the lock
        lock = self.lock
        lock.acquire()
        try:
            if faults.armed is not None:
                faults.hit("lock-held")
            self.mutex.acquire()
        except BaseException:
            lock.release()
            raise
        try:
            if words[_W_STATE] != self.seen:
                self._refresh_locked()
            if words[_W_STATUS] & _UNLINKED:
                raise Unlinked(f"shared dict {self.name!r} was unlinked; it can no longer be written")
        except BaseException:
            self.mutex.release()
            lock.release()
            raise

    def end_write(self) -> None:
        self.mutex.release()
        self.lock.release()

    def limit(self) -> int:
        """Bytes of the stream writers may use now (LIMIT, never past the stream);
        only meaningful under the lock, where it cannot change."""
        limit: int = self._map.words[_W_STREAM_LIMIT]
        return limit if limit < self.stream_size else self.stream_size

    def set_root(self, key: Any, value: Any) -> None:
        """``data[key] = value`` at the root: begin_write, commit, end_write in one.

        With the compiled helper and the msgpack codec, a scalar key and value
        are encoded straight into the stream by one C call
        (``Words.write_simple``, the same bytes as the general path); anything
        else, a record that does not fit, or an armed fault point goes through
        :meth:`commit`.
        """
        self.begin_write()
        try:
            simple = self._simple
            if simple is not None and faults.armed is None:
                new_end = simple(self.pos, self.gen & _GEN_MASK, self.limit(), _OP_SET, key, value)
                if new_end is not None:
                    state = (self.gen << _GEN_SHIFT) | new_end
                    self._map.atomic.store(_W_STATE, state)  # publish after the payload
                    try:
                        self.data[key] = value  # a scalar decodes to an equal object
                    except BaseException:  # published but not applied here: reload
                        self.gen = self.seen = _INVALID
                        raise
                    self.pos, self.seen = new_end, state
                    return
            self.commit([_OP_SET, [], key, value])
        finally:
            self.end_write()

    def commit(self, record: List[Any]) -> None:
        """Encode, publish and apply one record (writer steps 2-5); caller is in begin_write."""
        # UnsupportedType here changes nothing.  ``decoded`` is what every
        # reader will decode (the record itself when that is provably equal).
        payload, decoded = self.codec.encode_record(record)
        end = self.pos
        if end + _RECORD_HEADER + len(payload) <= self.limit():
            mapping = self._map
            writer = mapping.writer
            assert writer is not None
            new_end = writer.write(end, self.gen & _GEN_MASK, payload)
            if faults.armed is not None:
                faults.hit("record-written")
            state = (self.gen << _GEN_SHIFT) | new_end
            mapping.atomic.store(_W_STATE, state)  # publish after the payload
            if faults.armed is not None:
                faults.hit("record-published")
            try:
                self._apply(decoded)
            except BaseException:  # published but not applied here: reload
                self.gen = self.seen = _INVALID
                raise
            self.pos, self.seen = new_end, state
            return
        try:
            self._apply(decoded)
            self._write_dump()
        except BaseException:
            self.gen = self.seen = _INVALID  # the cache may differ from shared memory: reload
            raise

    def _write_dump(self) -> None:
        """Writer step 4: snapshot the cache into generation gen+1 and publish it."""
        payload = self.codec.dumps(self.data)
        if self.dump_limit and L.DUMP_HEADER + len(payload) > self.dump_limit:
            raise OutOfSpace(
                f"shared dict {self.name!r}: a full dump would take {L.DUMP_HEADER + len(payload)} "
                f"bytes, over the dict's dump size limit of {self.dump_limit}"
            )
        gen = self.gen + 1 if self.gen < L.GEN_MASK else 1
        atomic = self._map.atomic
        atomic.store(L.W_REG_HIGH, gen)  # 4a
        if faults.armed is not None:
            faults.hit("dump-registered")
        dname = L.dump_name(self.name, gen)
        size = L.DUMP_HEADER + len(payload)
        try:
            seg = Segment.create(dname, size)  # 4b
        except FileExistsError:
            segment.unlink(dname)  # unpublished leftover of a writer that died
            seg = Segment.create(dname, size)
        try:
            assert seg.buf is not None
            if faults.armed is not None:
                faults.hit("dump-created")
            seg.buf[L.DUMP_HEADER:size] = payload
            seg.buf[0:L.DUMP_HEADER] = _dump_header.pack(
                L.DUMP_MAGIC, gen, len(payload), zlib.crc32(payload), 0
            )
        except BaseException:
            seg.close()
            segment.unlink(dname)
            raise
        seg.close()
        if faults.armed is not None:
            faults.hit("dump-written")
        if self.grows:
            self._grow_stream(size)
        state = gen << L.GEN_SHIFT
        atomic.store(L.W_STATE, state)  # 4c: publishes the dump, restarts the stream
        if faults.armed is not None:
            faults.hit("dump-published")
        self.gen, self.pos, self.seen = gen, 0, state
        low = atomic.load(L.W_REG_LOW)  # 4d
        for old in range(max(low, gen - L.MAX_RECLAIM), gen):
            segment.unlink(L.dump_name(self.name, old))
        atomic.store(L.W_REG_LOW, gen)
        if atomic.load(L.W_STATUS) & L.STATUS_UNLINKED:
            segment.unlink(dname)  # unlinked while we were dumping: do not leak ours

    def _grow_stream(self, dump_size: int) -> None:
        """Raise LIMIT for a dump of ``dump_size`` bytes (layout: "Stream size")."""
        granule = L.STREAM_GRANULE
        wanted = -(-L.STREAM_GROWTH * dump_size // granule) * granule
        wanted = min(wanted, self.stream_size)
        if wanted <= self.limit():
            return
        try:
            segment.reserve(L.stream_name(self.name), wanted)
        except (OutOfSpace, FileNotFoundError) as exc:
            log.info("shared dict %r: stream stays at %d bytes (%s)", self.name, self.limit(), exc)
            return
        self._map.atomic.store(_W_STREAM_LIMIT, wanted)

    def force_dump(self) -> None:
        """Write a full dump now (restarting the stream), under the lock."""
        self.begin_write()
        try:
            self._write_dump()
        finally:
            self.end_write()

    def reload(self) -> None:
        """Drop the cache and load the shared state again from the current dump."""
        with self.mutex:
            self.gen = self.seen = _INVALID
        self.sync()

    # -- lifetime ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return isinstance(self.words, _ClosedWords)

    def close(self) -> None:
        """Detach this handle (and unlink the dict if this is the auto-unlinking creator)."""
        with self.mutex:
            if self.closed:
                return
            self.words = _ClosedWords(self.name)
            self._bind_state(None, 0)
            self.data = {}
            self.seen = _INVALID
        if self._finalizer is not None:
            self._finalizer()
        else:
            self._map.release()

    def unlink(self) -> int:
        """Remove every segment of the dict; this handle stays usable for reads only."""
        if self.closed:
            raise Closed(f"this handle of shared dict {self.name!r} is closed")
        return _unlink_tree(self.name, self._map, self.token)


def _pause(attempt: int) -> None:
    """Back-off between reader rounds: yield first, then sleep briefly."""
    time.sleep(0 if attempt < 10 else 0.0001 * min(attempt, 50))


# -- helpers shared by attach and unlink_by_name ----------------------------------------


def _attach_control(name: str) -> Segment:
    """Map ``name`` once its creator has published MAGIC (layout: "Creation and attach")."""
    deadline = time.monotonic() + L.INIT_TIMEOUT
    while True:
        ctrl = Segment.attach(name)  # FileNotFoundError propagates
        if ctrl.buf is not None and ctrl.size >= L.CONTROL_SIZE:
            magic = int.from_bytes(ctrl.buf[0:8], "little")
            if magic == L.CONTROL_MAGIC:
                return ctrl
            if magic != 0:
                ctrl.close()
                raise CorruptSegment(
                    f"segment {name!r} exists but is not an ultradict_ng control segment "
                    "(foreign magic bytes)"
                )
            creator = int.from_bytes(ctrl.buf[8 * L.W_CREATOR:8 * L.W_CREATOR + 8], "little")
            if creator and not owner_alive(creator):
                ctrl.close()  # no point waiting for a creator that is dead
                raise CorruptSegment(
                    f"shared dict {name!r} was never initialised: its creator (pid "
                    f"{creator & L.PID_MASK}) died while creating it; remove it with "
                    f"unlink_by_name({name!r})"
                )
        elif ctrl.size != 0:
            ctrl.close()
            raise CorruptSegment(
                f"segment {name!r} exists but is not an ultradict_ng control segment "
                f"({ctrl.size} bytes)"
            )
        ctrl.close()
        if time.monotonic() > deadline:
            raise CorruptSegment(
                f"segment {name!r} was never initialised (its creator probably died while "
                f"creating it); remove it with unlink_by_name({name!r})"
            )
        time.sleep(0.001)


def _check_layout(name: str, words: memoryview) -> None:
    version = words[L.W_LAYOUT] & 0xFFFFFFFF
    size = words[L.W_LAYOUT] >> 32
    if version != L.LAYOUT_VERSION or size != L.CONTROL_SIZE:
        raise IncompatibleLayout(
            f"shared dict {name!r} uses layout version {version} (control size {size}); this "
            f"ultradict_ng reads version {L.LAYOUT_VERSION}"
        )


def _unlink_dumps(name: str, words: memoryview) -> int:
    """Unlink every dump generation the register names, and any other that exists.

    The register (REG_LOW..REG_HIGH plus the published generation) is what works
    everywhere; where the shared-memory filesystem can be listed (/dev/shm on
    Linux) derived names are matched too, so a damaged register leaks nothing.
    """
    low, high = words[L.W_REG_LOW], words[L.W_REG_HIGH]
    names = {L.dump_name(name, g) for g in range(max(low, high - L.MAX_RECLAIM), high + 1)}
    names.add(L.dump_name(name, words[L.W_STATE] >> L.GEN_SHIFT))
    names.discard(L.dump_name(name, 0))
    names.update(segment.listed(name + L.DUMP_SUFFIX))
    return sum(segment.unlink(n) for n in sorted(names))


def _unlink_tree(name: str, mapping: _Mapping, token: int) -> int:
    """Layout "Unlink": flag, then dumps, stream, control.  Returns segments removed."""
    lock = SharedLock(mapping.atomic, name, token)
    held = False
    try:
        held = lock.acquire(timeout=L.UNLINK_LOCK_TIMEOUT)
    except LockTimeout as exc:
        log.warning("unlinking shared dict %r without its lock: %s", name, exc)
    try:
        atomic = mapping.atomic
        while True:
            status = atomic.load(L.W_STATUS)
            ok, _ = atomic.cas(L.W_STATUS, status, status | L.STATUS_UNLINKED)
            if ok:
                break
        if mapping.words[L.W_MAGIC] != L.CONTROL_MAGIC:
            # We only delete what is provably ours (the control could have been
            # unlinked and its name reused by a foreign segment meanwhile).
            return 0
        owner = _control_owner(name, token)
        if owner == "other":
            # The name was unlinked (by us or anyone) and a new dict now lives
            # under it: its stream and dumps have our names but are not ours.
            # (A second unlink of an old handle -- e.g. the auto-unlink of a
            # creator after unlink() -- must not touch the re-created dict.)
            return 0
        # "ours", or "gone": no control under the name, so any stream or dump
        # left under it is ours (a creator makes its control first).
        removed = _unlink_dumps(name, mapping.words)
        removed += segment.unlink(L.stream_name(name))
        if owner == "ours":
            removed += segment.unlink(name)
        return removed
    finally:
        if held:
            lock.release()


def _control_owner(name: str, token: int) -> str:
    """Whose control segment ``name`` is: "ours" (creation token ``token``),
    "gone" (no segment under the name) or "other"."""
    try:
        ctrl = Segment.attach(name)
    except FileNotFoundError:
        return "gone"
    try:
        if ctrl.buf is None or ctrl.size < L.CONTROL_SIZE:
            return "other"
        same = int.from_bytes(ctrl.buf[8 * L.W_TOKEN:8 * L.W_TOKEN + 8], "little") == token
        return "ours" if same else "other"
    finally:
        ctrl.close()


def unlink_by_name(name: str) -> int:
    """Remove every segment of the dict ``name``; returns how many were removed (0 if none).

    Works when every process that used the dict is dead (crash cleanup): the
    control segment's register names every dump generation that may exist.
    A segment under that name that is not ours raises :class:`CorruptSegment`
    and nothing is removed.
    """
    validate_name(name)
    try:
        ctrl = Segment.attach(name)
    except FileNotFoundError:
        # No control: at most a stream left by a creator that died very early.
        return int(segment.unlink(L.stream_name(name)))
    if ctrl.buf is None or ctrl.size < L.CONTROL_SIZE:
        size = ctrl.size
        ctrl.close()
        if size == 0:  # abandoned between shm_open and ftruncate
            return int(segment.unlink(name)) + int(segment.unlink(L.stream_name(name)))
        raise CorruptSegment(f"segment {name!r} is not an ultradict_ng control segment ({size} bytes)")
    words = memoryview(ctrl.buf).cast("Q")
    try:
        magic = words[L.W_MAGIC]
        if magic == 0:
            creator = words[L.W_CREATOR]
            if creator and owner_alive(creator):
                raise CorruptSegment(
                    f"shared dict {name!r} is being created by pid {creator}; not unlinking it"
                )
            # Abandoned mid-creation: its register is still valid (zeroed or written).
            removed = _unlink_dumps(name, words)
            removed += segment.unlink(L.stream_name(name))
            return removed + int(segment.unlink(name))
        if magic != L.CONTROL_MAGIC:
            raise CorruptSegment(
                f"segment {name!r} is not an ultradict_ng control segment; not unlinking it"
            )
        _check_layout(name, words)
        token = words[L.W_TOKEN]
    finally:
        words.release()
    mapping = _Mapping(ctrl, None)
    try:
        return _unlink_tree(name, mapping, token)
    finally:
        mapping.release()
