"""The shared-memory engine: one process's attachment to one dict tree.

A :class:`Store` is a process's handle on a dict: its mappings of the control
and stream segments (:mod:`mapping`), its local cache (``data``, a tree of
plain dicts) and the position in the shared history that cache reflects
(``seen``, ``gen``, ``pos``).  It implements the backend interface of
:mod:`ultradict_ng._engine`.  The algorithms live in their own modules and
follow :mod:`ultradict_ng._shm.layout`, the specification:

* :mod:`reader` -- catching up lock-free (layout: "Reader");
* :mod:`writer` -- publishing records and dumps under the lock ("Writer");
* :mod:`control` -- the header ("Control segment", "Creation and attach");
* :mod:`cleanup` -- unlink and crash cleanup ("Unlink and cleanup register").

This module holds what ties them together: creating and attaching
(:meth:`Store.open`) and the handle's lifetime (close, auto-unlink, fork).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Optional, cast

from .._codec import records as R
from .._codec.codec import CUSTOM_ID, Codec, MsgpackCodec, codec_by_id, codec_for
from .._codec.copies import IMMUTABLE_TYPES
from .._codec.placeholders import BlobRef, InlineArray
from .._engine import BlobGone, ClosedWords, Engine, Initial, Options, User, check_open
from .._facade.arguments import pairs
from .._platform import directories, segments
from .._platform.directories import shown
from .._platform.forks import on_fork_in_child
from .._platform.names import generate_name, validate_name
from .._platform.segments import Segment
from ..errors import AlreadyExists, Closed, CorruptSegment, NotFound, ParameterMismatch, Unlinked
from ..speedups import pack_map
from . import blobs, tablecache, users
from . import layout as L
from .blobs import BlobMissing
from .cleanup import unlink_blobs, unlink_dumps, unlink_tree
from .control import Header, attach_control
from .feed import Feed, wait_until_changed
from .lock import ShmLock, owner_word
from .mapping import Mapping
from .options import blob_threshold as _blob_threshold
from .options import check_options as _check_options
from .options import validate_options
from .reader import INVALID
from .writer import Writer

__all__ = ["Store", "validate_options"]

Path = tuple[Any, ...]


def _finalize(mapping: Mapping, name: str, token: int, unlink_pid: int, registered: bool, last: bool) -> None:
    """Runs when a store is closed, collected, or its process exits (weakref.finalize):
    leave the user register, unlink if this handle was told to, unmap."""
    try:
        alone = users.detach((name, token), mapping.atomic) if registered else False
        if unlink_pid == os.getpid():  # auto_unlink, and not in a forked child
            unlink_tree(name, mapping, token)
        elif last and alone:  # auto_unlink="last": if no other process uses it
            users.remove_if_unused(name, mapping, token)
    finally:
        mapping.release()


_live_stores: weakref.WeakSet[Store] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_live_stores):
        store.mutex = threading.RLock()
        if store.tx is not None:
            # Forked inside a transaction: the child does not hold the lock, and its
            # cache holds the parent's unpublished writes: it starts from the
            # published state, outside any transaction.
            store.tx = None
            store._tx_fast(None)
            store.gen = store.seen = INVALID


on_fork_in_child("threads", _after_fork_in_child)


class Store(Writer):
    """One process's attachment to a shared dict tree (see the module docstring).

    Its bases hold the algorithms and their fields: ``speedups.StoreBase``
    (``seen`` and ``data``, where the compiled read hit path finds them), then
    :class:`~ultradict_ng.reader.Reader`, then :class:`~ultradict_ng.writer.Writer`.
    """

    __slots__ = ("created", "registered", "max_decoded", "_finalizer", "__weakref__")

    def __init__(
        self,
        mapping: Mapping,
        name: str,
        codec: Codec,
        header: Header,
        created: bool,
        max_decoded: Optional[int] = None,
    ) -> None:
        self._map = mapping
        self.max_decoded = max_decoded
        self.words = mapping.words
        stream = mapping.stream_words
        # Root-level scalar sets go straight into the stream when its bytes are msgpack's.
        self.write_simple = (
            stream.write_simple if stream is not None and codec.id == MsgpackCodec.id else None
        )
        self.name = name
        self.codec = codec
        self.recurse = bool(header.recurse)
        self._immutable_types = IMMUTABLE_TYPES  # (what the compiled hit path hands out as it is)
        self.stream_size = header.stream_size
        self.grows = header.grows
        self.dump_limit = header.dump_limit
        self.blob_threshold = header.blob_threshold
        self.token = header.token
        self.created = created
        self.registered = False  # counted in the user register (layout: "Users")
        self.lock = ShmLock(mapping.atomic, name, header.token)
        self.waits = self.lock.waits
        self.tx = None
        self.durable = None
        self.mutex = threading.RLock()
        self.data = {}
        self.gen = INVALID
        self.pos = 0
        self.seen = INVALID
        self._bind_state(mapping.atomic, L.W_STATE)
        self._finalizer: Optional[weakref.finalize[Any, Any]] = None
        _live_stores.add(self)

    # -- opening -----------------------------------------------------------------

    @classmethod
    def open(
        cls, name: Optional[str], create: Optional[bool], options: Options, initial: Initial = None
    ) -> Store:
        """Create or attach (see :class:`~ultradict_ng.SharedDict` and :class:`Options`)."""
        if create not in (None, True, False):
            raise TypeError("create must be None, True or False")
        if name is None:
            if create is False:
                raise NotFound("create=False needs the name of an existing shared dict")
            name = generate_name()
        validate_name(name)
        validate_options(options)
        codec = codec_for(options.serializer) if options.serializer is not None else None
        # A dict can vanish between our failed create and our attach (unlinked
        # by someone else), in which case we create it; while its removal is
        # still under way (STATUS.unlinked, the control not yet gone) creating
        # fails again, so we retry for up to INIT_TIMEOUT.
        deadline = time.monotonic() + L.INIT_TIMEOUT
        attempts = 0
        while attempts < 3 or time.monotonic() < deadline:
            if attempts >= 2:
                time.sleep(L.CLOSING_POLL)
            attempts += 1
            if create is not False:
                try:
                    store = cls._create(name, options, initial)
                except FileExistsError:
                    if create is True:
                        raise AlreadyExists(f"a shared dict named {name!r} already exists") from None
                else:
                    auto = options.for_create("auto_unlink")
                    store._arm_finalizer(True if auto is None else auto)
                    return store
            try:
                store = cls._attach(name, codec, options)
            except FileNotFoundError:
                if create is False:
                    raise NotFound(f"no shared dict named {name!r} exists") from None
                continue
            store._arm_finalizer(options.auto_unlink)
            return store
        raise NotFound(f"shared dict {name!r} kept disappearing while attaching to it")

    @classmethod
    def _create(cls, name: str, options: Options, initial: Initial) -> Store:
        """Create the dict; no buffer_size makes a growing stream (layout: "Stream size")."""
        codec = codec_for(options.for_create("serializer"))
        buffer_size = options.for_create("buffer_size")
        header = Header(
            recurse=bool(options.for_create("recurse")),
            grows=buffer_size is None,
            serializer_id=codec.id,
            stream_size=L.GROWING_STREAM_CAP if buffer_size is None else buffer_size,
            stream_limit=L.DEFAULT_STREAM_SIZE if buffer_size is None else buffer_size,
            token=secrets.randbits(64),
            creator=owner_word(),  # pid + start time: liveness-checkable
            dump_limit=options.for_create("dump_limit") or 0,
            blob_threshold=_blob_threshold(options.for_create("blob_threshold")),
        )
        ctrl = Segment.create(name, L.CONTROL_SIZE)  # FileExistsError: someone else won
        stream: Optional[Segment] = None
        mapping: Optional[Mapping] = None
        store: Optional[Store] = None
        try:
            sname = L.stream_name(name)
            try:
                stream = Segment.create(sname, header.stream_size, reserve=header.stream_limit)
            except FileExistsError:
                # Left by a creator that died before its control segment was
                # ready; we own the control name now, so it is garbage.
                segments.unlink(sname)
                stream = Segment.create(sname, header.stream_size, reserve=header.stream_limit)
            mapping = Mapping(ctrl, stream)
            header.write(mapping.words)
            store = cls(mapping, name, codec, header, created=True, max_decoded=options.max_decoded)
            store.gen, store.pos, store.seen = 0, 0, 0
            users.register((name, header.token), mapping.atomic)  # before MAGIC: never unowned
            store.registered = True
            if type(initial) is dict:  # (a dict given whole: _arguments.split_arguments)
                if initial and not (store._loadable(initial) and store._load(initial)):
                    store.commit(R.update((), pairs(initial)))
            elif initial:
                # (fresh [key, value] lists, made by _arguments.pairs: no copy)
                store.commit(R.update((), cast(list[list[Any]], initial)))
            mapping.atomic.store(L.W_MAGIC, L.CONTROL_MAGIC)  # ready: published last
            return store
        except BaseException:
            if store is not None and mapping is not None and store.registered:
                users.detach((name, header.token), mapping.atomic)
            if mapping is not None:
                unlink_dumps(name, mapping.words)
                unlink_blobs(name, mapping.words)
                mapping.release()
            else:
                ctrl.close()
                if stream is not None:
                    stream.close()
            segments.unlink(L.stream_name(name))
            segments.unlink(name)
            raise

    @classmethod
    def _attach(cls, name: str, codec: Optional[Codec], options: Options) -> Store:
        ctrl = attach_control(name)  # FileNotFoundError propagates
        stream: Optional[Segment] = None
        words = memoryview(ctrl.buf).cast("Q")  # type: ignore[arg-type]
        try:
            header = Header.read(name, words)
            if header.serializer_id == CUSTOM_ID:
                # Shared memory cannot name a Python object: the attacher brings it.
                if codec is None or codec.id != CUSTOM_ID:
                    raise ParameterMismatch(
                        f"shared dict {name!r} uses a custom serializer object; pass the same "
                        "serializer= to attach to it"
                    )
                stored_codec = codec
            else:
                stored_codec = codec_by_id(header.serializer_id)
            if words[L.W_STATUS] & L.STATUS_UNLINKED:
                raise FileNotFoundError(name)
            _check_options(name, header, stored_codec, codec, options)
            sname = L.stream_name(name)
            stream = Segment.attach(sname)  # FileNotFoundError: unlinked meanwhile
            if stream.size < header.stream_size:
                raise CorruptSegment(
                    f"stream segment {sname!r} holds {stream.size} bytes, its header says "
                    f"{header.stream_size}"
                )
        except BaseException:
            words.release()
            ctrl.close()
            if stream is not None:
                stream.close()
            raise
        words.release()
        store = cls(
            Mapping(ctrl, stream), name, stored_codec, header, created=False, max_decoded=options.max_decoded
        )
        try:
            users.attach((name, header.token), store._map.atomic)  # FileNotFoundError: removed
            store.registered = True
            store.sync()
        except BaseException:
            store.close()
            raise
        return store

    def _arm_finalizer(self, auto_unlink: Any) -> None:
        """``auto_unlink``: truthy -- unlink at close; "last" -- unlink at close if
        no other process is attached; falsy -- never."""
        last = auto_unlink == "last"
        unlink_pid = os.getpid() if auto_unlink and not last else 0
        self._finalizer = weakref.finalize(
            self, _finalize, self._map, self.name, self.token, unlink_pid, self.registered, last
        )

    def keep_at_close(self) -> None:
        """This handle's close only detaches, whatever its ``auto_unlink``: a
        handle that failed to become what its caller opened (a cache refused
        its side) removes nothing of a dict that is, or may now be, another
        opener's.  (A dict kept in files has its own closing, which removes nothing.)"""
        if self.durable is None and self._finalizer is not None and self._finalizer.detach() is not None:
            self._arm_finalizer(False)

    # -- reading -------------------------------------------------------------------

    def load(self, mapping: dict[Any, Any]) -> bool:
        """``update(mapping)`` at the root as a bulk load straight from a ``dict``:
        published as a dump (layout: "Writer", step 4: a load of ``PARTIAL_FROM``
        pairs or more, no fewer than the dict holds), True; or False, nothing
        changed, where the record path must do it -- a smaller ``mapping``,
        another serializer, an open transaction, or a key or value other than
        a scalar or a tuple of scalars (``pack_map`` declines: blobs, nested
        dicts, handles take the record path).

        Why: the record path makes a [key, value] list per pair, encodes them
        as a record a load never writes, and fills the cache from the lists:
        ~0.45 s of a 1 s load at a million keys.  Here the cache of an empty
        dict becomes a copy of ``mapping`` (one compiled clone), and the dump's
        payload is ``mapping`` packed once."""
        if not self._loadable(mapping):
            return False
        self.begin_write()
        try:
            return self._load(mapping)
        finally:
            self.end_write()

    def _loadable(self, mapping: Any) -> bool:
        return (
            type(mapping) is dict
            and len(mapping) >= tablecache.PARTIAL_FROM
            and self.codec.id == MsgpackCodec.id
        )

    def _load(self, mapping: dict[Any, Any]) -> bool:
        """:meth:`load`'s work, in ``begin_write`` (or creating the dict)."""
        if self.tx is not None or len(mapping) < len(self.data):
            return False
        packed = pack_map(mapping, self.blob_threshold)  # (the dump's payload if the dict is empty)
        if packed is None:
            return False
        try:
            if self.data:  # (a reload over keys it holds: in their places, as update() does)
                if type(self.data) is not dict:  # (a big dict's: most of it is overwritten)
                    self.data = cast(Any, self.data).full()
                self.data.update(mapping)
                self._write_dump()
            else:
                self.data = dict(mapping)
                self._write_dump(packed)
        except BaseException:
            self.gen = self.seen = INVALID  # the cache may differ from shared memory: reload
            raise
        return True

    def materialize(self, stored: Any, seen: Optional[int] = None) -> Any:
        """The user's value of a cache placeholder (see the Engine interface).
        ``seen``: the state of the reader asking, if not this handle's -- a
        change feed replays states behind it, in which a value a later write
        dropped is gone (``BlobGone``), not lost."""
        try:
            return blobs.materialize(stored, self.name, self.token)
        except BlobMissing as exc:
            self._blob_missing(exc, self.seen if seen is None else seen)
            raise  # not reached

    def view(self, stored: Any) -> memoryview:
        """A read-only memoryview of a placeholder's bytes, without a copy."""
        if type(stored) is InlineArray:
            return memoryview(stored.data)
        if type(stored) is not BlobRef:
            raise TypeError(f"a {type(stored).__name__} has no single buffer to view")
        try:
            return blobs.blob_view(stored, self.name, self.token)
        except BlobMissing as exc:
            self._blob_missing(exc, self.seen)
            raise  # not reached

    def _blob_missing(self, exc: BlobMissing, seen: int) -> None:
        """Layout "Blobs", reader: gone because a newer state than ``seen``
        dropped it (read again), or the dict was unlinked, or the segment is
        damaged."""
        if self.words[L.W_STATE] != seen:
            raise BlobGone(str(exc)) from None
        value = directories.shown_file(str(exc))  # (its file, if kept in files)
        if self.words[L.W_STATUS] & L.STATUS_UNLINKED:
            raise Unlinked(f"shared dict {shown(self.name)!r} was unlinked; its large value {value} is gone")
        raise CorruptSegment(
            f"shared dict {shown(self.name)!r}: large value {value} is referenced but does not exist"
        )

    @property
    def buffer_size(self) -> int:
        """Bytes of the update stream: fixed when given at creation, else the
        current LIMIT of the growing stream."""
        return self.limit() if self.grows and not self.closed else self.stream_size

    # -- changes (layout: "Waiting and waking") ----------------------------------------

    def wait_for_change(self, timeout: Optional[float]) -> bool:
        """Sleep until the tree changes after the state the cache reflects, then
        catch up (True); False if ``timeout`` seconds pass first."""
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 or None")
        words = self.words  # Closed on a closed handle
        # The state to move past is the one the cache held at the call: another
        # thread on this handle may catch up meanwhile, and must not make us
        # sleep through the change that woke it.
        seen = self.seen
        if words[L.W_STATE] == seen:
            deadline = None if timeout is None else time.monotonic() + timeout
            if not wait_until_changed(self._map.atomic, words, self.waits, lambda: seen, deadline):
                return False
            if words[L.W_STATE] == seen:  # woken by unlink(), nothing new
                raise Unlinked(f"shared dict {shown(self.name)!r} was unlinked")
        self.sync()
        return True

    def change_mark(self) -> int:
        """The STATE ``data`` reflects (Engine interface: ``wait_past``)."""
        check_open(self.words)
        return self.seen

    def wait_past(self, mark: int, timeout: float) -> bool:
        """Sleep on the change channel until STATE differs from ``mark`` or the
        dict is unlinked (True), at most ``timeout`` seconds (False); touches
        neither ``data`` nor the mutex."""
        return wait_until_changed(
            self._map.atomic, self.words, self.waits, lambda: mark, time.monotonic() + timeout
        )

    def feed(self) -> Feed:
        """A change feed starting at the state this handle's cache reflects."""
        check_open(self.words)
        return Feed(self)

    def stats(self) -> dict[str, Any]:
        """The dict's shared state as this handle sees it now (a snapshot)."""
        words = self.words
        state = words[L.W_STATE]  # Closed on a closed handle
        lock_word = words[L.W_LOCK]
        with self.mutex:
            keys = len(self.data) if self.seen == state else None
        return {
            "name": self.name,
            "engine": "shared memory" if self.durable is None else "files",
            "layout_version": L.LAYOUT_VERSION,
            "serializer": self.codec.name,
            "recurse": self.recurse,
            "generation": state >> L.GEN_SHIFT,
            "stream_end": state & L.END_MASK,
            "stream_limit": self.limit(),
            "stream_size": self.stream_size,
            "stream_grows": self.grows,
            "dump_limit": self.dump_limit or None,
            "blob_threshold": self.blob_threshold,
            "blob_next_id": words[L.W_BLOB_NEXT],
            "keys": keys,
            "lock_holder_pid": lock_word & L.PID_MASK if lock_word else None,
            "creator_pid": words[L.W_CREATOR] & L.PID_MASK,
            "token": self.token,
            "users": sum(1 for u in users.read_users(self._map.atomic) if u.alive),
            "unregistered_users": words[L.W_USER_OVERFLOW],
            "unlinked": bool(words[L.W_STATUS] & L.STATUS_UNLINKED),
            **({} if self.durable is None else self.durable.stats()),
        }

    def users(self) -> list[User]:
        """The processes attached to the dict now, alive and dead (layout: "Users")."""
        check_open(self.words)
        return users.read_users(self._map.atomic)

    def reopen_arguments(self) -> dict[str, Any]:
        """Another process finds the dict by name in shared memory, or by its
        directory if kept in files (Engine interface)."""
        directory = directories.directory_of(self.name) if self.durable is not None else None
        if directory is None:
            return {"backend": "shm"}
        return {"path": directory, "name": f"{self.name}#{self.token:x}"}  # (the token: this dict only)

    # -- lifetime ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return isinstance(self.words, ClosedWords)

    def close(self) -> None:
        """Detach this handle (and unlink the dict if this is the auto-unlinking creator)."""
        with self.mutex:
            if self.closed:
                return
            self.words = ClosedWords(shown(self.name))
            self._bind_state(None, 0)
            self._tx_fast(None)
            self.data = {}
            self.seen = INVALID
        if self._finalizer is not None:
            self._finalizer()
        else:  # not fully opened
            _finalize(self._map, self.name, self.token, 0, self.registered, False)

    def unlink(self) -> int:
        """Remove every segment of the dict (and its files, if kept in files);
        this handle stays usable for reads only."""
        if self.closed:
            raise Closed(f"this handle of shared dict {shown(self.name)!r} is closed")
        if self.durable is not None:
            return self.durable.remove(self)
        return unlink_tree(self.name, self._map, self.token)


if TYPE_CHECKING:

    def _implements_the_engine_interface(store: Store) -> Engine:
        return store  # mypy checks Store against the Protocol here
