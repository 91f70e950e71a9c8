"""The dict's cross-process lock: one 64-bit word in the control segment.

One class owns every policy: waiting and back-off, timeouts, reentrancy,
threads, fork, and recovery from a dead owner.  The atomic primitive under it
(``Words`` from :mod:`ultradict_ng.speedups`) only loads, stores and
compares-and-swaps.
The word's format and the recovery rule are specified in
:mod:`ultradict_ng.layout` ("Lock").
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from types import TracebackType
from typing import Optional, Tuple, Type

from .. import layout as L
from ..errors import LockTimeout
from .._owner import owner_alive, owner_word, pid_of
from ..speedups import ProcessState, Words
from .waiting import ProcessWaits, waits_for

__all__ = ["SharedLock", "owner_word", "pid_of", "owner_alive"]

log = logging.getLogger("ultradict_ng")
_get_ident = threading.get_ident
_WAKE_PENDING = 1  # LOCK_WAKING: a release woke a sleeper that has not claimed the role yet
_W_LOCK, _W_LOCK_WAITERS, _W_LOCK_SEQ, _W_LOCK_WAKING = (
    L.W_LOCK, L.W_LOCK_WAITERS, L.W_LOCK_SEQ, L.W_LOCK_WAKING)

# This process's owner word, cached (owner_word caches it too; this copy is
# one global load on the write path).  Reset in a forked child.
_my_word = 0


def _mine() -> int:
    global _my_word
    _my_word = owner_word()
    return _my_word


# -- per-process lock state ----------------------------------------------------
#
# ``speedups.ProcessState`` (compiled, or its twin in fallback.py): which thread
# of this process holds the lock and how often, and the mutex through which only
# one of our threads competes for the shared word.  One per dict and process,
# shared by every handle (keyed by name and creation token).

_states: "weakref.WeakValueDictionary[Tuple[str, int], ProcessState]" = weakref.WeakValueDictionary()
_states_guard = threading.Lock()


def _state_for(key: Tuple[str, int]) -> ProcessState:
    with _states_guard:
        state = _states.get(key)
        if state is None:
            state = ProcessState()
            _states[key] = state
        return state


def _after_fork_in_child() -> None:
    # The child has one thread; whatever the parent's threads held is not the
    # child's.  The shared word still names the parent, so the child waits for
    # the parent's release like any other process.
    global _states_guard, _my_word
    _states_guard = threading.Lock()
    _my_word = 0
    for state in list(_states.values()):
        state.mutex = threading.Lock()
        state.owner = None
        state.count = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# -- the lock ------------------------------------------------------------------


class SharedLock:
    """Cross-process, reentrant, thread-safe lock of one shared dict tree.

    ``with d.lock:`` (or ``with d:``) holds it; ``with d.lock(timeout=2):``
    gives up after 2 s with :class:`~ultradict_ng.errors.LockTimeout`, whose
    ``pid`` is the holder.  A holder that died (SIGKILL, crash) is detected
    while waiting and its lock taken over within about
    ``LOCK_FIRST_CHECK + LOCK_CHECK_INTERVAL`` seconds, with a warning logged.
    """

    __slots__ = ("_words", "_name", "_state", "_waits")

    def __init__(self, words: Words, name: str, token: int) -> None:
        self._words = words
        self._name = name
        self._state = _state_for((name, token))
        self._waits: ProcessWaits = waits_for((name, token))

    # -- public API ------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take the lock.

        Returns True when taken.  ``blocking=False`` returns False at once if
        another process or thread holds it.  With a ``timeout`` (seconds),
        raises :class:`LockTimeout` naming the holder's pid when it runs out.
        """
        state = self._state
        if blocking and timeout is None:
            if not state.enter(self._words, _W_LOCK, _my_word or _mine()):
                self._wait_for_word()
            return True
        me = _get_ident()
        if state.owner == me:
            state.count += 1
            return True
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 or None")
        deadline = None if timeout is None else time.monotonic() + timeout
        # First wait for our other threads (only one of them competes for
        # the word), then for other processes.
        if not blocking:
            if not state.mutex.acquire(False):
                return False
        elif not state.mutex.acquire(True, -1 if timeout is None else timeout):
            raise self._timeout_error(timeout)
        try:
            if self._take_word(blocking, deadline, timeout):
                state.owner = me
                state.count = 1
                return True
        except BaseException:
            state.mutex.release()
            raise
        state.mutex.release()
        return False

    def try_acquire(self, recover: bool = True) -> bool:
        """Take the lock if that needs no waiting: it is free, this thread holds
        it already, or (with ``recover``) its holder is dead.  Never sleeps;
        False if another thread or process holds it.  (The asyncio lock's step.)"""
        state = self._state
        me = _get_ident()
        if state.owner == me:
            state.count += 1
            return True
        if not state.mutex.acquire(False):
            return False
        try:
            mine = _my_word or _mine()
            ok, seen = self._words.cas(_W_LOCK, 0, mine)
            if not ok and recover:
                ok = self._recover_if_dead(seen, mine)
        except BaseException:
            state.mutex.release()
            raise
        if ok:
            state.owner = me
            state.count = 1
            return True
        state.mutex.release()
        return False

    def release(self) -> None:
        """Release one level of ownership; the last release frees the shared word."""
        done = self._state.exit(self._words, _W_LOCK, _my_word or _mine())
        if done is True:
            return
        if done == 2:  # released; a registered waiter was not asleep (or is dead)
            self._waits.woke_nobody(self._words)
            return
        if done is None:
            raise RuntimeError(f"release of the lock of {self._name!r}, which this thread does not hold")
        log.warning(
            "lock of shared dict %r was taken over by another process while pid %d held it",
            self._name, os.getpid(),
        )

    def _wait_for_word(self) -> None:
        """After ``enter`` returned False: we hold the mutex; wait for the word."""
        state = self._state
        try:
            self._take_word(True, None, None)
        except BaseException:
            state.mutex.release()
            raise
        state.owner = _get_ident()
        state.count = 1

    def take_over(self) -> None:
        """Acquire even if a *live* process holds the lock, replacing its word.

        This breaks mutual exclusion with that process; it exists for
        UltraDict's ``steal=True`` and is not used by ultradict_ng itself.
        """
        me = threading.get_ident()
        state = self._state
        if state.owner == me:
            state.count += 1
            return
        state.mutex.acquire()
        mine = owner_word()
        while True:
            seen = self._words.load(L.W_LOCK)
            ok, _ = self._words.cas(L.W_LOCK, seen, mine)
            if ok:
                break
        state.owner = me
        state.count = 1
        if seen and seen != mine:
            log.warning("lock of shared dict %r taken over from pid %d", self._name, pid_of(seen))

    def held(self) -> bool:
        """True if the calling thread holds the lock."""
        return self._state.owner == threading.get_ident()

    @property
    def owner_pid(self) -> Optional[int]:
        """Pid of the process holding the lock now, or None (a snapshot: it may change)."""
        word = self._words.load(L.W_LOCK)
        return pid_of(word) if word else None

    def __call__(self, timeout: Optional[float] = None) -> "_TimedHold":
        """``with d.lock(timeout=...):`` — the same lock with a timeout."""
        return _TimedHold(self, timeout)

    def __enter__(self) -> "SharedLock":
        # acquire(), blocking without timeout, inlined: ``with d.lock:`` is a hot loop shape.
        if not self._state.enter(self._words, _W_LOCK, _my_word or _mine()):
            self._wait_for_word()
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        pid = self.owner_pid
        return f"<SharedLock of {self._name!r} {'held by pid %d' % pid if pid else 'free'}>"

    # -- internals ---------------------------------------------------------------

    def _take_word(self, blocking: bool, deadline: Optional[float], timeout: Optional[float]) -> bool:
        """CAS the shared word from 0 to ours; sleep until a release, recover dead owners.

        Waiting follows layout: "Waiting and waking" (lock channel): register,
        read LOCK_SEQ, try the CAS and sleep on LOCK_SEQ -- never longer than
        the next owner-liveness check.  A waiter woken by a release is the one
        wake in flight (LOCK_WAKING): while the lock stays taken it keeps that
        role, re-trying every ``LOCK_HANDOFF_POLL``, so that releases in the
        meantime wake nobody else.  Why: every woken process that fails to take
        the lock is CPU taken from the holder, and every spinning one slows
        the holder's atomics (measured: layout.py).
        """
        words = self._words
        mine = owner_word()
        ok, seen = words.cas(_W_LOCK, 0, mine)
        if ok:
            return True
        if not blocking:
            return self._recover_if_dead(seen, mine)
        start = time.monotonic()
        next_check = start + L.LOCK_FIRST_CHECK
        waits = self._waits
        registered = waits.enter(words, _W_LOCK_WAITERS)
        spins = 0
        designated = False
        try:
            while True:
                seq = words.load(_W_LOCK_SEQ) if registered else 0
                ok, seen = words.cas(_W_LOCK, 0, mine)
                if ok:
                    return True
                now = time.monotonic()
                if now >= next_check:
                    if self._recover_if_dead(seen, mine):
                        return True
                    next_check = now + L.LOCK_CHECK_INTERVAL
                if deadline is not None and now >= deadline:
                    raise self._timeout_error(timeout, seen)
                limit = next_check - now if deadline is None else min(next_check, deadline) - now
                if not registered:
                    # Polling: yield first, then sleep up to 1 ms.
                    spins += 1
                    time.sleep(0 if spins < 20 else min(0.001, 0.00002 * (spins - 19), max(limit, 0.0)))
                elif designated:
                    words.wait(_W_LOCK_SEQ, seq, max(min(limit, L.LOCK_HANDOFF_POLL), 0.0))
                else:
                    if words.load(_W_LOCK_WAKING) == _WAKE_PENDING and words.cas(
                            _W_LOCK_WAKING, _WAKE_PENDING, mine)[0]:
                        # A release woke nobody (or someone about to find it):
                        # take the role now, or nobody would, and releases
                        # would stop waking anyone.
                        designated = True
                        continue
                    woken = words.wait(_W_LOCK_SEQ, seq, max(limit, 0.0))
                    flag = words.load(_W_LOCK_WAKING)
                    if flag == _WAKE_PENDING:  # a release woke one of us: claim the role
                        designated = words.cas(_W_LOCK_WAKING, flag, mine)[0]
                    elif not woken and flag and flag != mine and not owner_alive(flag):
                        designated = words.cas(_W_LOCK_WAKING, flag, mine)[0]  # a dead one's role
        finally:
            # Designated: the next release may wake another.  Otherwise a wake
            # meant for us may be pending and nobody else would claim it.
            words.cas(_W_LOCK_WAKING, mine if designated else _WAKE_PENDING, 0)
            if registered:
                waits.exit(words, _W_LOCK_WAITERS)

    def _recover_if_dead(self, seen: int, mine: int) -> bool:
        """Take the lock over from ``seen`` if that owner is dead; True if we now hold it."""
        if seen == 0:
            ok, _ = self._words.cas(L.W_LOCK, 0, mine)
            return ok
        if seen == mine:
            # Our own word, yet no thread of ours holds it: a handle that held
            # the lock was closed or collected without releasing it.
            alive = False
        else:
            alive = owner_alive(seen)
        if alive:
            return False
        ok, _ = self._words.cas(L.W_LOCK, seen, mine)
        if ok:
            log.warning(
                "lock of shared dict %r recovered from dead process %d",
                self._name, pid_of(seen),
            )
        return ok

    def _timeout_error(self, timeout: Optional[float], seen: Optional[int] = None) -> LockTimeout:
        if seen is None:
            seen = self._words.load(L.W_LOCK)
        pid = pid_of(seen) if seen else None
        holder = f"held by pid {pid}" if pid else "held by another thread of this process"
        return LockTimeout(
            f"could not acquire the lock of shared dict {self._name!r} within {timeout}s ({holder})",
            name=self._name,
            pid=pid if pid else os.getpid(),
        )


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
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self._lock.release()
