"""``RedisEngine``: the engine (``_engine.Engine``) that keeps a dict on
Redis, with a local cache kept coherent by the protocol of
``_redis/layout.py`` (the sections named below are there).

The facade works on it unchanged: ``data`` is the local cache tree,
``words[W_STATE]`` a process-local counter the compiled hit path compares with
``seen``.  In the "fresh" read mode the counter never matches (``seen`` stays
-1), so every read calls :meth:`sync`, which runs ``SYNC`` -- one round trip --
unless this process holds the lease with local time left.  In the "cached"
mode the listener thread bumps the counter when entries arrive and ``sync``
applies them without a round trip.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from threading import get_ident
from typing import TYPE_CHECKING, Any, NoReturn, Optional

from .._codec import records as R
from .._codec.codec import Codec
from .._codec.copies import IMMUTABLE_TYPES
from .._engine import ClosedWords, Conflict, Options, User, check_open
from .._platform.forks import on_fork_in_child
from .._platform.names import validate_name
from .._shm import layout as L
from ..errors import (
    BackendUnavailable,
    Closed,
    CorruptSegment,
    LeaseLost,
    PathGone,
    Unlinked,
)
from ..speedups import StoreBase, Words
from . import census
from . import layout as RL
from . import transaction as T
from .feed import RedisFeed
from .lease import LeaseLock
from .link import Link, connect_client, describe
from .listener import Listener
from .opening import open_redis

__all__ = ["RedisEngine", "unlink_by_name"]

log = logging.getLogger("ultradict_ng")
_W_STATE = L.W_STATE


def _finalize(link: Link, epoch: str, unlink_pid: int, listener: Any) -> None:
    """Runs when an engine is closed, collected, or its process exits."""
    try:
        if listener is not None:
            listener.stop()
        if unlink_pid == os.getpid():
            try:
                link.call("unlink", [epoch])
            except Exception as exc:  # the server is gone: nothing to remove
                log.warning("could not remove %s at close: %s", link.keys.meta, exc)
    finally:
        link.close()


_live: weakref.WeakSet[RedisEngine] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The parent's sockets are not ours (redis-py closes them without a
    # shutdown in another pid); threads did not survive the fork.
    for engine in list(_live):
        engine._after_fork()


on_fork_in_child("connections", _after_fork_in_child)


class RedisEngine(StoreBase):
    """One process's attachment to one dict on Redis."""

    def __init__(
        self,
        link: Link,
        name: str,
        codec: Codec,
        recurse: bool,
        epoch: str,
        created: bool,
        backend: str,
        reads: str,
        lease: float,
        staleness: float,
        minlog: int,
    ) -> None:
        self.link = link
        self.name = name
        self.codec = codec
        self.recurse = recurse
        self._immutable_types = IMMUTABLE_TYPES  # (what the compiled hit path hands out as it is)
        self.epoch = epoch
        self.created = created
        self.backend = backend
        self.reads = reads
        self.staleness = staleness
        self.minlog = minlog
        self.keys = link.keys
        self._epoch = epoch.encode()
        self._kb_for, self._kb = -1, b"-1"
        self._buf = bytearray(8 * (_W_STATE + 1))
        self._atomic = Words(self._buf)
        self.words: Any = memoryview(self._buf).cast("Q")
        self.seen = -1
        self.data = {}
        #: the sequence number ``data`` reflects (-1: nothing loaded)
        self.known = -1
        #: the cache may lag the server for a reason the counter does not show
        #: (a write with a lost reply, a gap the listener saw): sync remotely
        self.stale = True
        self.gone = False
        self.mutex = threading.RLock()
        self._gen_guard = threading.Lock()
        self.lock = LeaseLock(self, lease)
        self.listener: Any = None
        #: The open transaction (its thread holds the lease), or None.
        self.tx: Optional[T.RedisTransaction] = None
        self._finalizer: Optional[weakref.finalize[Any, Any]] = None
        self._bind_state(self._atomic, _W_STATE)
        _live.add(self)

    # -- opening -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        name: Optional[str],
        create: Optional[bool],
        options: Options,
        initial: Optional[Sequence[Sequence[Any]]],
        backend: Any,
        reads: Optional[str],
        lease: Optional[float],
        staleness: Optional[float],
    ) -> RedisEngine:
        """Create or attach (``opening.py``)."""
        return open_redis(cls, name, create, options, initial, backend, reads, lease, staleness)

    def arm_finalizer(self, auto_unlink: Any) -> None:
        self._last = auto_unlink == "last"
        unlink_pid = os.getpid() if auto_unlink and not self._last else 0
        self._finalizer = weakref.finalize(self, _finalize, self.link, self.epoch, unlink_pid, self.listener)

    # -- reading -------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return isinstance(self.words, ClosedWords)

    @property
    def buffer_size(self) -> int:
        return self.minlog

    def sync(self) -> None:
        """Bring ``data`` up to what this read mode promises (module docstring)."""
        with self.mutex:
            if self.reads == "fresh":
                if not self.stale and self.lock.vouches():
                    return  # holding the lease: nobody else can publish
                self.sync_remote()
                return
            gen = self._atomic.load(_W_STATE)
            listener = self.listener
            if listener is None or not listener.vouched or self.stale or not listener.drain(self):
                if listener is None and not self.closed:
                    self._restart_listener()
                self.sync_remote()
                listener = self.listener
                if listener is None or not listener.vouched:
                    self.seen = -1  # not vouched: the next read syncs again
                    return
            self.seen = gen

    def sync_remote(self) -> None:
        """``SYNC``: one round trip; applies what changed since ``known``."""
        with self.mutex:
            check_open(self.words)
            if not self.stale and self.known >= 0:
                seq, epoch = self.link.peek()
                if epoch == self._epoch and seq == self._known_bytes():
                    return  # nothing published since (the common case of a hot read)
            reply = self.link.call("sync", [self.epoch, self.known])
            if reply[0] == RL.GONE:
                self.raise_gone()
            self.apply_delta(reply[1])

    def _known_bytes(self) -> bytes:
        known = self.known
        if known != self._kb_for:
            self._kb_for, self._kb = known, str(known).encode()
        return self._kb

    def apply_delta(self, delta: list[Any]) -> None:
        """Apply a ``SYNC`` answer (layout: "Reading"); the caller holds the mutex."""
        if type(delta) is not list or len(delta) < 2 or type(delta[0]) is not int:
            raise CorruptSegment(f"shared dict {self.name!r}: Redis answered {delta!r} to SYNC")
        seq, kind = delta[0], delta[1]
        try:
            if kind == RL.ENTRIES:
                records = T.entry_records(self.codec, delta[2:])
                for rec in records:
                    R.apply(self.data, rec)
            elif kind == RL.SNAPSHOT:
                tree = self.codec.loads(delta[3])
                if type(tree) is not dict:
                    raise CorruptSegment(f"the snapshot of {self.keys.snap} is not a dict")
                for rec in T.entry_records(self.codec, delta[4:]):
                    R.apply(tree, rec)
                self.data = tree
            elif kind != RL.CURRENT:
                raise CorruptSegment(f"unexpected SYNC answer kind {kind!r} for {self.keys.meta}")
        except R.Inconsistent as exc:
            self.known = -1
            self.stale = True
            raise CorruptSegment(
                f"shared dict {self.name!r}: a record on Redis does not apply: {exc}"
            ) from None
        except BaseException:
            self.known = -1
            self.stale = True
            raise
        self.known = seq
        self.stale = False

    def node(self, path: tuple[Any, ...]) -> dict[Any, Any]:
        node: Any = self.data
        for key in path:
            node = node.get(key) if type(node) is dict else None
            if type(node) is not dict:
                raise PathGone(f"no nested dict at {list(path)!r} in shared dict {self.name!r}")
        found: dict[Any, Any] = node
        return found

    def reload(self) -> None:
        with self.mutex:
            self.known = -1
            self.data = {}
            self.sync_remote()

    def materialize(self, stored: Any) -> Any:
        return stored.value()  # an InlineArray: this engine keeps no blobs

    def view(self, stored: Any) -> memoryview:
        return memoryview(stored.data).toreadonly()

    def raise_gone(self) -> NoReturn:
        """The dict is not on the server any more (GONE): Unlinked, now and for every later call."""
        self.gone = True
        raise Unlinked(
            f"shared dict {self.name!r} no longer exists on {describe(self.backend)} (unlinked, "
            "re-created, or lost by a server restarted without persistence)"
        )

    # -- writing -------------------------------------------------------------------

    def begin_write(self) -> None:
        check_open(self.words)
        self.mutex.acquire()
        try:
            self.sync()
        except BaseException:
            self.mutex.release()
            raise

    def end_write(self) -> None:
        self.mutex.release()

    def load(self, mapping: dict[Any, Any]) -> bool:
        """Declined: a load is one update record here, written in one transaction."""
        return False

    def commit(self, rec: list[Any]) -> None:
        """A write whose decision used the cache: conditional on ``known``
        (layout: "Writing", step 3); ``Conflict`` if another client wrote first."""
        tx = self.tx
        if tx is not None and tx.thread == get_ident():
            T.buffer(self, tx, rec)  # (the lease makes the decision final)
            return
        payload, decoded = self.codec.encode_record(rec)
        self._publish(payload, decoded, self.known)

    def write(self, rec: list[Any]) -> None:
        """A write whose effect does not depend on the state: never conflicts."""
        check_open(self.words)
        tx = self.tx
        if tx is not None and tx.thread == get_ident():
            with self.mutex:
                T.buffer(self, tx, rec)
            return
        payload, decoded = self.codec.encode_record(rec)
        with self.mutex:
            self._publish(payload, decoded, None)

    def set_root(self, key: Any, value: Any) -> None:
        self.write(R.set_((), key, value))

    def begin_transaction(self) -> None:
        T.begin(self)

    def end_transaction(self, publish: bool) -> None:
        T.end(self, publish)

    def _publish(self, payload: bytes, decoded: Any, expect: Optional[int]) -> None:
        lock = self.lock
        while True:
            token = lock.token_of_this_thread()
            try:
                reply = self.link.call(
                    "write", [self.epoch, "" if expect is None else expect, token, payload, self.minlog]
                )
            except BackendUnavailable:
                self.stale = True  # the write may have landed: never trust the cache now
                self.seen = -1
                raise
            if type(reply) is int:  # published (layout: "Writing", step 4)
                seq = reply >> 1
                if seq == self.known + 1 and not self.stale:
                    try:
                        R.apply(self.data, decoded)
                        self.known = seq
                    except BaseException:
                        self.stale = True
                        self.seen = -1
                        raise
                else:
                    self.stale = True
                    self.seen = -1
                if reply & 1:
                    self._snapshot_quietly()
                return
            code = reply[0]
            if code == RL.GONE:
                self.raise_gone()
            if code == RL.FENCED:
                lock.fenced()
                raise LeaseLost(
                    f"the lease on the lock of shared dict {self.name!r} expired while this thread "
                    "held it; the server refused the write (another client may hold the lock)"
                )
            if code == RL.CONFLICT:
                self.sync_remote()
                raise Conflict()
            if code == RL.LOCKED:
                # Another client (or thread) holds the lock: wait for its release
                # without the mutex, so that our own holder thread can read.
                pttl, last = reply[1], reply[2]
                self.mutex.release()
                try:
                    lock.wait_release(last, pttl, None)
                finally:
                    self.mutex.acquire()
                continue
            raise CorruptSegment(f"unexpected WRITE answer {reply!r} for {self.keys.meta}")

    def _snapshot_quietly(self) -> None:
        try:
            self.force_dump()
        except BackendUnavailable as exc:  # the write stands; a later one will snapshot
            log.warning("snapshot of %s failed: %s", self.keys.meta, exc)

    def force_dump(self) -> None:
        """Store the whole dict as the snapshot and trim the log (layout: "Snapshots")."""
        with self.mutex:
            if self.stale or self.known < 0:
                self.sync_remote()
            blob = self.codec.dumps(self.data)
            reply = self.link.call("snapshot", [self.epoch, self.known, blob])
            if reply[0] == RL.GONE:
                self.raise_gone()

    # -- waiting ----------------------------------------------------------------------

    def wait_for_change(self, timeout: Optional[float]) -> bool:
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 or None")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.mutex:
            before = self.known
        while True:
            with self.mutex:
                self.sync_remote()
                if self.known != before:
                    self.seen = -1 if self.reads == "fresh" else self.seen
                    return True
                after = f"{self.known}-1"
            left = RL.WAIT_SLICE if deadline is None else min(RL.WAIT_SLICE, deadline - time.monotonic())
            if left <= 0:
                return False
            self.link.xread(self.keys.log, after, left, left + 5.0)

    def change_mark(self) -> int:
        """The sequence number ``data`` reflects (-1: none loaded yet)."""
        check_open(self.words)
        return self.known

    def wait_past(self, mark: int, timeout: float) -> bool:
        """``XREAD BLOCK`` on the log after entry ``mark``: True as soon as the
        server holds a later one (at once if it already does) or the dict is
        gone; False after ``timeout`` seconds.  Touches neither ``data`` nor
        the mutex: a helper thread waits here while others use the handle."""
        check_open(self.words)
        if mark < 0:
            return True  # nothing loaded: any state is news
        if self.link.xread(self.keys.log, f"{mark}-1", timeout, timeout + 5.0):
            return True
        epoch = self.link.command("HGET", self.keys.meta, "epoch")
        return epoch is None or epoch.decode() != self.epoch  # removed: the caller's sync says so

    def feed(self) -> Any:
        return RedisFeed(self)

    # -- facts -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return census.stats(self)

    def users(self) -> list[User]:
        out: list[User] = []
        for _, _, user in self._connections():
            if user not in out:
                out.append(user)
        return out

    def reopen_arguments(self) -> dict[str, Any]:
        """The same server, in the same read mode (Engine interface)."""
        return {"backend": self.backend, "reads": self.reads}

    def _connections(self) -> list[tuple[int, str, User]]:
        return census.connections(self)

    def _others_attached(self) -> bool:
        """Whether any handle but this one (in any process) is attached."""
        me = int(self.link.command("CLIENT", "ID"))
        return any(cid != me for cid, _, _ in self._connections())

    # -- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        with self.mutex:
            if self.closed:
                return
            self.words = ClosedWords(self.name)
            self._bind_state(None, 0)
            self.data = {}
            self.seen = -1
        self.lock.drop()
        if getattr(self, "_last", False):
            try:
                if not self._others_attached():
                    self.link.call("unlink", [self.epoch])
            except Exception as exc:
                log.warning("could not check the users of %s at close: %s", self.keys.meta, exc)
        if self._finalizer is not None:
            self._finalizer()
        else:
            _finalize(self.link, self.epoch, 0, self.listener)

    def unlink(self) -> int:
        if self.closed:
            raise Closed(f"this handle of shared dict {self.name!r} is closed")
        removed: int = self.link.call("unlink", [self.epoch])
        return removed

    def _restart_listener(self) -> None:
        self.listener = Listener(self)
        self.listener.start()

    def _after_fork(self) -> None:
        self.mutex = threading.RLock()
        self._gen_guard = threading.Lock()
        self.link.after_fork()
        self.lock.after_fork()
        self.tx = None  # (forked inside a block: the child is outside it, and reloads)
        self.known = -1
        self.stale = True
        self.seen = -1
        if self.listener is not None:
            self.listener = None  # restarted by the first read in the child
        if self._finalizer is not None:
            self._finalizer.detach()  # the parent's finalizer is the parent's
            self._finalizer = weakref.finalize(self, _finalize, self.link, self.epoch, 0, None)

    def bump(self) -> None:
        """The listener saw something: make the next read call :meth:`sync`."""
        with self._gen_guard:
            self._atomic.store(_W_STATE, (self._atomic.load(_W_STATE) + 1) & ((1 << 63) - 1))


def unlink_by_name(name: str, backend: Any) -> int:
    """Remove every key of the dict ``name`` on ``backend``, whatever its epoch."""
    validate_name(name)
    client, _ = connect_client(backend)
    link = Link(client, RL.keys_of(name), None)
    try:
        removed: int = link.call("unlink", [""])
        return removed
    finally:
        link.close()


if TYPE_CHECKING:  # mypy checks the engine against the Protocols here
    from .._engine import Engine, Transactional
    from .state import EngineState

    def _is_the_state_its_helpers_see(engine: RedisEngine) -> EngineState:
        return engine

    def _implements_the_engine_interface(engine: RedisEngine) -> Engine:
        return engine

    def _has_transactions(engine: RedisEngine) -> Transactional:
        return engine
