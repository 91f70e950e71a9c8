"""``d.lock`` on every backend: one front end that owns the lock's policy.

:class:`SharedLock` is what users hold (``with d.lock:``, ``with
d.lock(timeout=2):``, ``acquire``/``release``, ``held()``, ``locked()``,
``owner_pid``) and what the asyncio face waits on (``try_acquire``,
``wait_until_free``).  Everything a user can observe is decided here, once:

* reentrancy: the holding thread takes the lock again without waiting, and
  only its last ``release`` gives it back;
* threads: the lock belongs to one thread, and only one thread of a process
  competes for the shared part at a time (the others wait on a process-local
  mutex first), so a process never races itself over the network or the
  shared word;
* ``blocking=False``, timeouts and the :class:`~ultradict_ng.errors.LockTimeout`
  that names the holder, ``ValueError`` for a negative timeout;
* ``release`` by a thread that does not hold it is a ``RuntimeError``;
* fork: a child starts holding nothing (the stage "threads" of ``_forks``).

A backend subclass implements only the shared part -- filelock's shape,
where ``BaseFileLock`` holds the policy and each platform class only locks
and unlocks a file: ``_take`` (wait for it, up to a deadline), ``_try_take``
(once, never sleeping), ``_give``, ``_wait_free`` (sleep until it may be
free, taking nothing), and who holds it (``_holder``, ``_holder_pid``).  The
shared-memory lock is :class:`ultradict_ng._shm.lock.ShmLock`, the Redis lease
:class:`ultradict_ng._redis.lease.LeaseLock`.

Why the per-process state is a ``speedups.ProcessState``: a backend whose
shared part is one word (shared memory) subclasses :class:`WordLock`, the
same front end whose hot paths -- ``with d.lock:``, ``acquire()``,
``release()`` -- run that policy through the compiled helper's
``ProcessState.enter``/``exit`` (reentrancy, the mutex and the
compare-and-swap in one call each; written apart, not behind a branch, so
that they cost what they did before the front end existed).  A backend
without such a word (Redis) takes the Python steps of :class:`SharedLock`,
which manipulate the same state.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Hashable
from types import TracebackType
from typing import Optional

from ..errors import LockTimeout
from ..speedups import ProcessState, Words
from .directories import shown
from .forks import on_fork_in_child
from .owner import owner_word

__all__ = ["SharedLock", "WordLock"]

log = logging.getLogger("ultradict_ng")
_get_ident = threading.get_ident

# This process's owner word (``_owner.owner_word``), cached: one global load
# on the hot path.  Reset in a forked child (another pid).
_my_word = 0


def _mine() -> int:
    global _my_word
    _my_word = owner_word()
    return _my_word


# -- per-process state ---------------------------------------------------------
#
# One ProcessState per lock and process: which thread holds the lock, how
# often, and the mutex through which one thread at a time competes for the
# shared part.  Locks made with the same ``share`` key (the handles of one
# shared-memory dict) share one.

_shared: weakref.WeakValueDictionary[Hashable, ProcessState] = weakref.WeakValueDictionary()
_every: weakref.WeakSet[ProcessState] = weakref.WeakSet()
_guard = threading.Lock()


def _state_for(share: Optional[Hashable]) -> ProcessState:
    with _guard:
        state = _shared.get(share) if share is not None else None
        if state is None:
            state = ProcessState()
            if share is not None:
                _shared[share] = state
            _every.add(state)
        return state


def _after_fork_in_child() -> None:
    # The child has one thread; whatever the parent's threads held is not the
    # child's.  The shared part still names the parent, so the child waits for
    # the parent's release like any other process.
    global _guard, _my_word
    _guard = threading.Lock()
    _my_word = 0
    for state in list(_every):
        state.mutex = threading.Lock()
        state.owner = None
        state.count = 0


on_fork_in_child("threads", _after_fork_in_child)


# -- the front end ---------------------------------------------------------------


class SharedLock:
    """Cross-process, reentrant, thread-safe lock of one shared dict tree.

    ``with d.lock:`` (or ``with d:``) holds it; ``with d.lock(timeout=2):``
    gives up after 2 s with :class:`~ultradict_ng.errors.LockTimeout`, whose
    ``pid`` is the holder.  On shared memory a holder that died (SIGKILL,
    crash) is detected while waiting and its lock taken over within about
    ``LOCK_FIRST_CHECK + LOCK_CHECK_INTERVAL`` seconds, with a warning
    logged; on Redis its lease runs out.
    """

    __slots__ = ("_name", "_state")

    #: The LockTimeout message (each backend kept the wording it had).
    _MESSAGE = "could not acquire the lock of shared dict {name!r} within {timeout}s ({holder})"

    def __init__(self, name: str, share: Optional[Hashable] = None) -> None:
        """``share``: locks with the same key share their per-process state
        (None: this lock's own)."""
        self._name = name
        self._state = _state_for(share)

    # -- what a backend implements --------------------------------------------------

    def _take(self, blocking: bool, deadline: Optional[float], timeout: Optional[float]) -> bool:
        """Take the shared part for this process (the caller holds the mutex).
        ``blocking``: wait for it until ``deadline`` (time.monotonic; None: no
        limit), then raise ``self._timeout_error(timeout, ...)``; otherwise
        one attempt.  True when taken."""
        raise NotImplementedError

    def _try_take(self, recover: bool) -> bool:
        """One attempt that never sleeps (``recover``: a dead holder's lock
        may be taken over now)."""
        raise NotImplementedError

    def _give(self) -> None:
        """Give the shared part back (the last release; the caller holds the
        mutex).  (A :class:`WordLock`'s is in ``ProcessState.exit``.)"""
        raise NotImplementedError

    def _seize(self) -> None:
        """Take the shared part even from a live holder (the caller holds the mutex)."""
        raise NotImplementedError

    def _wait_free(self, timeout: float) -> bool:
        """Sleep until the shared part is free or may be (True), at most
        ``timeout`` seconds (False); take nothing."""
        raise NotImplementedError

    def _holder(self) -> tuple[Optional[str], Optional[int]]:
        """``("held by ...", pid)`` for a timeout message, or ``(None, None)``
        when the holder is another thread of this process or unknown."""
        raise NotImplementedError

    def _holder_pid(self) -> Optional[int]:
        raise NotImplementedError

    # -- public API ------------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take the lock.

        Returns True when taken.  ``blocking=False`` returns False at once if
        another process or thread holds it.  With a ``timeout`` (seconds),
        raises :class:`LockTimeout` naming the holder's pid when it runs out.
        """
        state = self._state
        me = _get_ident()
        if state.owner == me:
            state.count += 1
            return True
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 or None")
        deadline = None if timeout is None else time.monotonic() + timeout
        # First wait for our other threads (only one of them competes for the
        # shared part), then for other processes.
        if not blocking:
            if not state.mutex.acquire(False):
                return False
        elif not state.mutex.acquire(True, -1 if timeout is None else timeout):
            holder, pid = self._holder()
            raise self._timeout_error(timeout, holder, pid)
        try:
            taken = self._take(blocking, deadline, timeout)
        except BaseException:
            state.mutex.release()
            raise
        if taken:
            state.owner = me
            state.count = 1
            return True
        state.mutex.release()
        return False

    def try_acquire(self, recover: bool = True) -> bool:
        """Take the lock if that needs no waiting: it is free, this thread holds
        it already, or (with ``recover``) its holder is dead.  Never sleeps;
        False if another thread or process holds it.  (The asyncio lock's step:
        it takes the lock in the event loop's thread, between awaits.)"""
        state = self._state
        me = _get_ident()
        if state.owner == me:
            state.count += 1
            return True
        if not state.mutex.acquire(False):
            return False
        try:
            taken = self._try_take(recover)
        except BaseException:
            state.mutex.release()
            raise
        if taken:
            state.owner = me
            state.count = 1
            return True
        state.mutex.release()
        return False

    def wait_until_free(self, timeout: float) -> bool:
        """Block the calling thread until the lock is free or may be (a release,
        a lease running out: True), or for ``timeout`` seconds (False).  Takes
        nothing: the thread that wants the lock calls :meth:`try_acquire` next.
        For a helper thread that waits on behalf of an event loop (the asyncio face)."""
        if timeout < 0:
            raise ValueError("timeout must be >= 0")
        return self._wait_free(timeout)

    def release(self) -> None:
        """Release one level of ownership; the last release frees the shared part."""
        state = self._state
        if state.owner != _get_ident():
            raise self._not_held()
        state.count -= 1
        if state.count:
            return
        state.owner = None
        try:
            self._give()
        finally:
            state.mutex.release()

    def take_over(self) -> None:
        """Acquire even if a *live* process holds the lock, replacing it.

        This breaks mutual exclusion with that process; it exists for
        UltraDict's ``steal=True`` and is not used by ultradict_ng itself.
        """
        state = self._state
        me = _get_ident()
        if state.owner == me:
            state.count += 1
            return
        state.mutex.acquire()
        try:
            self._seize()
        except BaseException:
            state.mutex.release()
            raise
        state.owner = me
        state.count = 1

    def held(self) -> bool:
        """True if the calling thread holds the lock."""
        return self._state.owner == _get_ident()

    def locked(self) -> bool:
        """True if some thread of some process holds the lock now (a snapshot)."""
        return self._holder_pid() is not None

    @property
    def owner_pid(self) -> Optional[int]:
        """Pid of the process holding the lock now, or None (a snapshot: it may change)."""
        return self._holder_pid()

    def __call__(self, timeout: Optional[float] = None) -> _TimedHold:
        """``with d.lock(timeout=...):`` -- the same lock with a timeout."""
        return _TimedHold(self, timeout)

    def __enter__(self) -> SharedLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        pid = self.owner_pid
        return f"<SharedLock of {shown(self._name)!r} {f'held by pid {pid}' if pid else 'free'}>"

    # -- internals -----------------------------------------------------------------------

    def _not_held(self) -> RuntimeError:
        return RuntimeError(f"release of the lock of {shown(self._name)!r}, which this thread does not hold")

    def _timeout_error(
        self, timeout: Optional[float], holder: Optional[str], pid: Optional[int]
    ) -> LockTimeout:
        """The LockTimeout for ``timeout``: ``holder`` as ``_holder`` answers."""
        text = holder or "held by another thread of this process"
        return LockTimeout(
            self._MESSAGE.format(name=shown(self._name), timeout=timeout, holder=text),
            name=self._name,
            pid=pid if pid else os.getpid(),
        )


class WordLock(SharedLock):
    """The front end for a backend whose shared part is one word: word
    ``index`` of ``words`` holds 0 or the holder's owner word.  The policy of
    :class:`SharedLock`, with its hot paths through the compiled
    ``ProcessState.enter``/``exit``, whose release side also wakes the
    sleepers of the lock channel (layout: "Waiting and waking")."""

    __slots__ = ("_words", "_index")

    def __init__(self, name: str, share: Optional[Hashable], words: Words, index: int) -> None:
        super().__init__(name, share)
        self._words = words
        self._index = index

    def _woke_nobody(self) -> None:
        """``ProcessState.exit`` woke nobody although a waiter was registered."""

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        if blocking and timeout is None:
            if not self._state.enter(self._words, self._index, _my_word or _mine()):
                self._take_after_enter()
            return True
        return SharedLock.acquire(self, blocking, timeout)

    acquire.__doc__ = SharedLock.acquire.__doc__

    def release(self) -> None:
        """Release one level of ownership; the last release frees the word."""
        done = self._state.exit(self._words, self._index, _my_word or _mine())
        if done is True:
            return
        if done == 2:  # released; a registered waiter was not asleep (or is dead)
            self._woke_nobody()
            return
        if done is None:
            raise self._not_held()
        log.warning(
            "lock of shared dict %r was taken over by another process while pid %d held it",
            self._name,
            os.getpid(),
        )

    def __enter__(self) -> WordLock:
        # acquire(), blocking without timeout, inlined: ``with d.lock:`` is a hot loop shape.
        if not self._state.enter(self._words, self._index, _my_word or _mine()):
            self._take_after_enter()
        return self

    def _take_after_enter(self) -> None:
        """``ProcessState.enter`` returned False: this thread holds the mutex but
        another process holds the word; wait for it."""
        state = self._state
        try:
            self._take(True, None, None)
        except BaseException:
            state.mutex.release()
            raise
        state.owner = _get_ident()
        state.count = 1


class _TimedHold:
    __slots__ = ("_lock", "_timeout")

    def __init__(self, lock: SharedLock, timeout: Optional[float]) -> None:
        self._lock = lock
        self._timeout = timeout

    def __enter__(self) -> SharedLock:
        self._lock.acquire(timeout=self._timeout)
        return self._lock

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self._lock.release()
