"""The sync policies of a dict kept in files: when published records reach the disk.

Follows ``_disk/layout.py``, "Sync policies".  A :class:`Durability` is one
handle's view of the policy: the writer calls :meth:`Durability.after_write`
once it has released the lock (``always`` waits there for the group commit;
``interval`` hands the dict to this process's flusher thread), and every
close calls :meth:`Durability.sync_all`.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any, Callable, Optional

from .._platform import faults
from .._platform.forks import on_fork_in_child
from .._shm import layout as L
from .._shm.lock import owner_alive, owner_word, set_status
from ..errors import SyncFailed
from . import files
from . import layout as D

__all__ = ["Durability", "deferred_syncs"]

log = logging.getLogger("ultradict_ng")

_LEADER_CHECK = L.LOCK_CHECK_INTERVAL  # how often a follower checks that the leader lives
_POLL_MAX = 0.001
_WAKE_ALL = 0x7FFFFFFF


class Durability:
    """One handle's sync policy over the dict's stream mapping."""

    __slots__ = (
        "mode",
        "interval",
        "atomic",
        "words",
        "fd",
        "path",
        "guard",
        "open",
        "queued",
        "due",
        "remove",
        "dead",
        "dump_bytes",
        "dump_gen",
        "deferred",
        "fd_later",
        "idle",
        "closed_at",
        "__weakref__",
    )

    def __init__(self, mode: str, interval: float, atomic: Any, words: Any, path: str) -> None:
        #: ``unlink()`` of the handle, given the handle's store: the dict and its
        #: files (set by ``opening.py``; not bound to the store, which this is
        #: part of -- a cycle through the store's finalizer never collected).
        self.remove: Callable[..., int] = _unset
        self.mode = mode
        self.interval = interval
        self.atomic = atomic
        self.words = words
        #: The stream's file, and a descriptor of it for ``fdatasync`` (closed by :meth:`close`).
        self.path = path
        self.fd = files.open_rw(path)
        try:
            files.mark_open(self.fd)  # (what a recovery checks: no process here shares its shared memory)
        except BaseException:
            os.close(self.fd)
            raise
        #: Held while syncing: a close waits for a sync of the flusher thread in flight.
        self.guard = threading.RLock()  # (a close run inside this thread's own sync: a finalizer)
        #: Syncs in flight by thread (:meth:`sync_deferred`, a leader's), which a close waits for.
        self.deferred: dict[int, int] = {}
        #: A close made inside this handle's own sync (a collection) left the descriptor to it.
        self.fd_later = False
        self.idle = threading.Condition(self.guard)
        #: SYNCED when the handle closed (-1: a sync had failed), for a write still waiting then.
        self.closed_at = -1
        self.open = True
        #: Handed to this process's flusher thread (``interval``).
        self.queued = False
        #: When this process's flusher syncs it next (``interval``).
        self.due = 0.0
        #: The size of the last dump this handle knows of, and its generation.
        self.dump_bytes, self.dump_gen = 0, -1
        _live.add(self)

    def after_write(self, state: int) -> None:
        """After a write that published ``state`` returned from under the lock."""
        if self.mode == "always":
            pending: Optional[list[tuple[Durability, int]]] = getattr(_deferral, "pending", None)
            if pending is not None:  # (an awaited write: its caller syncs in another thread)
                pending.append((self, state))
                return
            self.sync_to(state)
            return
        if self.words[L.W_STATUS] & L.STATUS_SYNC_FAILED:  # (a sync in the background, or a close's)
            raise self._failed_before()
        if self.mode == "interval" and not self.queued:
            _queue(self)

    def dropped(self, refs: Any) -> bool:
        """Blobs a write dropped, which in files stay until a dump's sweep
        (``_disk/layout.py``, "Blob"): whether it is time for a dump -- once
        the blobs every process dropped since (DEAD) outweigh the last dump
        (and ``STREAM_GRANULE``), so that the disk holds at most about twice
        the dict plus the stream (one key overwritten with 1 MiB values 300
        times kept 300 files before; a process opening the dict for each of
        its writes, while each handle counted its own, 2,000)."""
        generation = self.atomic.load(L.W_STATE) >> L.GEN_SHIFT
        if generation != self.dump_gen:  # (this handle's first, or a checkpoint of another process since)
            dump = os.path.join(os.path.dirname(self.path), D.DUMP_PREFIX + L.base36(generation))
            try:
                self.dump_bytes = os.stat(dump).st_size if generation else 0
            except OSError:
                self.dump_bytes = 0
            self.dump_gen = generation
        added = int(sum(ref.length for ref in refs))
        word: int = self.atomic.load(L.W_DEAD)
        while True:
            dead = D.dead_of(word, generation) + added
            ok, word = self.atomic.cas(L.W_DEAD, word, D.dead_word(generation, dead))
            if ok:
                return dead > max(self.dump_bytes, L.STREAM_GRANULE)

    def checkpointed(self, state: int, size: int) -> None:
        """A dump of ``size`` bytes published ``state`` and is on the disk
        (DEAD's count of the generations before it reads 0 now)."""
        raise_synced(self.atomic, state)
        self.dump_bytes, self.dump_gen = size, state >> L.GEN_SHIFT

    def close(self, keep_mark: bool = False) -> None:
        """No sync after this one (the handle is closing): waits for one in
        flight.  The descriptor -- the handle's mark on the stream -- is
        closed too, unless ``keep_mark`` (a later close closes it)."""
        me = threading.get_ident()
        with self.guard:
            while any(t != me for t in self.deferred):  # (others': they read the mapping released next)
                self.idle.wait()  # (not its own: a collection inside its sync cannot wait for it)
            if self.open:
                try:  # (what its close synced: a write that waited for it is on the disk up to here)
                    failed = self.words[L.W_STATUS] & L.STATUS_SYNC_FAILED
                    self.closed_at = -1 if failed else self.words[L.W_SYNCED]
                except ValueError:  # (the mapping released already)
                    self.closed_at = -1
                self.open = False
            if not keep_mark and self.fd >= 0:
                if me in self.deferred:  # (a close inside this thread's own sync: the fd is still in use)
                    self.fd_later = True
                else:
                    os.close(self.fd)
                    self.fd = -1

    def forget_clean(self) -> None:
        """Remove ``clean`` before the first write after a clean reopen (the writer,
        under the lock: ``_disk/layout.py``, "Opening and recovery", step f) --
        in the directory the stream is in now: moved while open, the path
        may name another dict's, whose ``clean`` is not this one's."""
        directory = files.where_now(self.path, self.fd)
        if directory is not None and files.remove(os.path.join(directory, D.CLEAN_FILE)):
            files.sync_dir(directory)
        self.atomic.store(L.W_CLEAN_PENDING, 0)

    def stats(self) -> dict[str, Any]:
        synced = self.words[L.W_SYNCED]
        return {
            "path": os.path.dirname(self.path),
            "sync": self.mode,
            "sync_interval": self.interval if self.mode == "interval" else None,  # (the others use none)
            "synced_generation": synced >> L.GEN_SHIFT,
            "synced_end": synced & L.END_MASK,
        }

    def sync_all(self) -> None:
        """Everything published so far reaches the disk (a close, an explicit ``sync()``)."""
        if self.open:
            self.sync_to(self.atomic.load(L.W_STATE))

    def sync_deferred(self, target: int) -> None:
        """:meth:`sync_to` for a write whose caller waits in another thread (an
        awaited write, ``deferred_syncs``): nothing once the handle closed --
        its close synced everything published -- and a close waits for it."""
        if not self._flying():
            self._synced_at_close(target)
            return
        try:
            self.sync_to(target)
        finally:
            self._landed()

    def _flying(self) -> bool:
        """Count a sync of this thread in flight, which a close waits for (it
        reads the mapping the close releases); False once closed."""
        with self.guard:
            if not self.open:
                return False
            me = threading.get_ident()
            self.deferred[me] = self.deferred.get(me, 0) + 1
            return True

    def _landed(self) -> None:
        with self.guard:
            me = threading.get_ident()
            left = self.deferred[me] - 1
            if left:
                self.deferred[me] = left
            else:
                del self.deferred[me]
                if self.fd_later and self.fd >= 0:  # (closed inside this sync: its descriptor now)
                    os.close(self.fd)
                    self.fd, self.fd_later = -1, False
            self.idle.notify_all()

    def sync_to(self, target: int) -> None:
        """Return once SYNCED >= ``target``, leading the group commit when no one
        else does (``_disk/layout.py``, "Sync policies")."""
        atomic, words = self.atomic, self.words
        if words[L.W_SYNCED] >= target:
            return
        mine = owner_word()
        check = time.monotonic() + _LEADER_CHECK
        delay = D.SYNC_POLL
        while words[L.W_SYNCED] < target:
            if not self.open:  # (closed by another thread: its close synced what was published)
                self._synced_at_close(target)
                return
            if words[L.W_STATUS] & L.STATUS_SYNC_FAILED:  # (the leader's sync failed: not ours either)
                raise self._failed_before()
            leader = atomic.load(L.W_SYNC_LEADER)
            if leader == 0:
                if not self._flying():  # (a close waits for a leader in flight: the mapping outlives it)
                    continue
                try:
                    _lead_count(self.path, 1)  # (before the claim: a word naming us is never seen unled)
                    ok, _ = atomic.cas(L.W_SYNC_LEADER, 0, mine)
                    if ok:
                        _here.paths = getattr(_here, "paths", ()) + (self.path,)
                        try:
                            self._lead()
                        finally:
                            _here.paths = _here.paths[:-1]
                            atomic.cas(L.W_SYNC_LEADER, mine, 0)
                            atomic.add(L.W_SYNC_SEQ, 1)  # (after SYNCED and the leader word: no lost wake)
                            atomic.wake(L.W_SYNC_SEQ, _WAKE_ALL)
                finally:
                    _lead_count(self.path, -1)
                    self._landed()
                continue
            if leader == mine and self.path in getattr(_here, "paths", ()):
                # (this thread leads already, suspended below us -- a finalizer
                # run by a collection inside its sync: it cannot wait for itself)
                self._lead()
                continue
            if time.monotonic() >= check:
                check = time.monotonic() + _LEADER_CHECK
                if not owner_alive(leader) if leader != mine else self.path not in _leading:
                    atomic.cas(L.W_SYNC_LEADER, leader, 0)  # (dead; or ours, with no thread leading)
                    continue
            seq = atomic.load(L.W_SYNC_SEQ)
            if words[L.W_SYNCED] >= target or atomic.load(L.W_SYNC_LEADER) == 0:
                continue
            try:  # until the leader's sync ends (it moves SYNC_SEQ), at most until the next liveness check
                atomic.wait(L.W_SYNC_SEQ, seq, _LEADER_CHECK)
            except NotImplementedError:  # (no futex here: poll)
                time.sleep(delay)
                delay = min(2 * delay, _POLL_MAX)

    def mark_failed(self) -> None:
        """STATUS_SYNC_FAILED: every later write and sync of the dict, in any
        process, raises ``SyncFailed`` ("Sync policies") -- a sync failed, or
        a file the disk must not keep could not be removed durably."""
        set_status(self.atomic, L.STATUS_SYNC_FAILED)

    def refuse_if_failed(self) -> None:
        """``SyncFailed`` once a sync of the dict failed: a checkpoint is a sync too."""
        if self.words[L.W_STATUS] & L.STATUS_SYNC_FAILED:
            raise self._failed_before()

    def _synced_at_close(self, target: int) -> None:
        """``SyncFailed`` unless the close synced the stream up to ``target``."""
        if self.closed_at < target:
            raise self._failed_before()

    def _failed_before(self) -> SyncFailed:
        return SyncFailed(
            f"an earlier sync of {self.path} failed: writes since may not be on the disk, and no "
            "sync can tell any more; reopen the dict once the disk is sound"
        )

    def _lead(self) -> None:
        """Sync the stream up to the STATE loaded now; raise SYNCED to it."""
        atomic = self.atomic
        state = atomic.load(L.W_STATE)
        synced = atomic.load(L.W_SYNCED)
        if synced >= state:
            return
        end = state & L.END_MASK
        start = synced & L.END_MASK if synced >> L.GEN_SHIFT == state >> L.GEN_SHIFT else 0
        if faults.armed is not None:
            faults.hit("sync-leading")
        with self.guard:
            if not self.open:
                return
            if atomic.load(L.W_STATUS) & L.STATUS_SYNC_FAILED:  # (an earlier leader's failed: no sync tells)
                raise self._failed_before()
            try:
                files.sync_data(self.fd, self.path, start, end)
            except OSError as exc:
                self.mark_failed()
                raise SyncFailed(
                    f"syncing {self.path} failed ({exc.strerror or exc}): writes since the last sync may "
                    "not be on the disk; reopen the dict once the disk is sound",
                    exc.errno or errno.EIO,
                ) from exc
        raise_synced(atomic, state)


_live: weakref.WeakSet[Durability] = weakref.WeakSet()
#: Threads of this process leading (or claiming to lead) a dict's sync now,
#: by stream path: a SYNC_LEADER naming this process while none is -- its
#: release lost -- is stale, as a dead process's is.
_leading: collections.Counter[str] = collections.Counter()
_leading_guard = threading.Lock()


def _lead_count(path: str, delta: int) -> None:
    with _leading_guard:
        _leading[path] += delta
        if not _leading[path]:
            del _leading[path]


_deferral = threading.local()
#: The stream paths this thread leads a sync of now (innermost last).
_here = threading.local()


@contextlib.contextmanager
def deferred_syncs() -> Iterator[list[tuple[Durability, int]]]:
    """The ``always`` syncs of the writes made in the block, in this thread,
    collected instead of waited for: an awaited write (``aio.py``) runs them
    in a helper thread, so that neither the ``fdatasync`` nor the wait for
    another process leading the group commit blocks the event loop."""
    pending: list[tuple[Durability, int]] = []
    _deferral.pending = pending
    try:
        yield pending
    finally:
        _deferral.pending = None


def _after_fork_in_child() -> None:
    """A thread of the parent may have held a guard at the fork: the child's are free."""
    global _flusher_guard, _leading_guard
    _flusher_guard = threading.Lock()  # (held by a parent's thread starting the flusher)
    _leading_guard = threading.Lock()
    _leading.clear()  # (the parent's leaders; the child's owner word is its own)
    for durability in list(_live):
        durability.guard = threading.RLock()
        durability.deferred, durability.idle = {}, threading.Condition(durability.guard)
        durability.queued = False  # (the parent's flusher thread is not the child's)


def _after_fork_in_parent() -> None:
    """The child may write to the parent's ``interval`` dicts and end with
    ``os._exit`` (as forked children do) or be terminated (a pool's workers)
    before its own flusher's first sync: the parent's flusher takes them on
    now, so that the child's writes reach the disk within the interval
    while the parent has the dict open, whether or not it writes itself."""
    for durability in list(_live):
        if durability.open and durability.mode == "interval" and not durability.queued:
            _queue(durability)


on_fork_in_child("threads", _after_fork_in_child)
if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_parent=_after_fork_in_parent)


def _unset(store: Any) -> int:
    raise RuntimeError("this handle was not fully opened")


def raise_synced(atomic: Any, state: int) -> None:
    """SYNCED = max(SYNCED, state)."""
    current = atomic.load(L.W_SYNCED)
    while current < state:
        ok, current = atomic.cas(L.W_SYNCED, current, state)
        if ok:
            return


class _Flusher:
    """This process's thread for ``interval`` dicts: syncs each one that has
    unsynced records once per its interval -- each on its own schedule, so a
    dict of a long interval never delays one of a short interval.  With no
    such dict open for ``_FLUSHER_IDLE`` seconds it ends; the next write
    starts another.

    A ``multiprocessing`` worker ends with ``os._exit`` (no ``atexit``, no
    ``weakref.finalize``), after running its own finalizers: the process
    registers one there (once), syncing what is due at once -- a write there
    is on the disk "also when its process exited normally"."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.dicts: weakref.WeakSet[Durability] = weakref.WeakSet()
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ultradict_ng sync", daemon=True)
        self.thread.start()
        global _finalizing
        mp_util = sys.modules.get("multiprocessing.util")  # (a worker has it; else no worker ends so)
        if mp_util is not None and _finalizing != self.pid:  # (once a process: flushers come and go)
            mp_util.Finalize(None, _sync_now, exitpriority=0)
            _finalizing = self.pid

    def add(self, durability: Durability) -> None:
        if durability not in self.dicts:
            durability.due = time.monotonic() + durability.interval
            self.dicts.add(durability)
            self.wake.set()

    def _run(self) -> None:
        global _the_flusher
        while True:
            self.wake.clear()  # (before the list: a dict added after it sets it again)
            dicts = [d for d in list(self.dicts) if d.open]
            if not dicts:
                if self.wake.wait(_FLUSHER_IDLE):
                    continue
                with _flusher_guard:  # (which every add holds: one after this starts a new thread)
                    if not any(d.open for d in list(self.dicts)):
                        if _the_flusher is self:
                            _the_flusher = None
                        return  # (no interval dict open here for a while: no thread left behind)
                continue
            now = time.monotonic()
            for d in dicts:
                if d.due <= now:
                    d.due = now + d.interval
                    self._sync(d)
            self.wake.wait(max(0.0, min(d.due for d in dicts) - time.monotonic()))

    def sync_now(self) -> None:
        for d in list(self.dicts):
            self._sync(d)

    @staticmethod
    def _sync(d: Durability) -> None:
        try:
            if d.open and d.words[L.W_SYNCED] < d.atomic.load(L.W_STATE):
                d.sync_all()
        except Exception as exc:  # a closed handle, a full or failing disk: logged, retried
            if d.open:
                log.warning("ultradict_ng: syncing %s failed: %s", d.path, exc)


_the_flusher: Optional[_Flusher] = None
_flusher_guard = threading.Lock()
#: Seconds the flusher thread stays with no ``interval`` dict open in the process, then ends.
_FLUSHER_IDLE = 1.0
#: The process that registered :func:`_sync_now` with ``multiprocessing``'s finalizers.
_finalizing = 0


def _sync_now() -> None:
    """A ``multiprocessing`` worker's end: what its flusher holds synced at once."""
    flusher = _the_flusher
    if flusher is not None and flusher.pid == os.getpid():
        flusher.sync_now()


def _queue(durability: Durability) -> None:
    """Hand ``durability`` to this process's flusher, started if none runs
    (none yet, one that ended idle, or forked: threads do not survive fork)."""
    global _the_flusher
    with _flusher_guard:
        flusher = _the_flusher
        if flusher is None or flusher.pid != os.getpid():
            flusher = _the_flusher = _Flusher()
        flusher.add(durability)
        durability.queued = True
