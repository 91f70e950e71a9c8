"""The shared part of a dict's lock on shared memory: one 64-bit word in the
control segment.

:class:`ShmLock` is the shared-memory backend of the lock front end
(:class:`ultradict_ng._platform.lock.SharedLock`, which owns reentrancy, threads,
timeouts and the context managers; its :class:`~ultradict_ng._platform.lock.WordLock`
shape, for a shared part that is one word).  This module holds only what the word
needs: taking it (waiting and waking on the lock channel, back-off) and
recovering it from a dead owner.  The front end's hot paths run through the
compiled helper's ``ProcessState.enter``/``exit`` on this word.  The word's
format and the recovery rule are specified in :mod:`ultradict_ng._shm.layout`
("Lock"), the sleeping in "Waiting and waking".
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from .._platform import directories, segments
from .._platform.lock import SharedLock, WordLock
from .._platform.owner import owner_alive, owner_word, pid_of
from ..speedups import Words
from . import layout as L
from .waiting import Backoff, ProcessWaits, waits_for

# SharedLock: the front end, named here too for the modules that type with it.
__all__ = ["ShmLock", "SharedLock", "owner_word", "pid_of", "owner_alive", "set_status"]

log = logging.getLogger("ultradict_ng")
_WAKE_PENDING = 1  # LOCK_WAKING: a release woke a sleeper that has not claimed the role yet
_W_LOCK, _W_LOCK_WAITERS, _W_LOCK_SEQ, _W_LOCK_WAKING = (
    L.W_LOCK,
    L.W_LOCK_WAITERS,
    L.W_LOCK_SEQ,
    L.W_LOCK_WAKING,
)


class ShmLock(WordLock):
    """The lock of one shared-memory dict: the LOCK word of its control
    segment (``words``), shared per process by every handle of the dict
    (keyed by name and creation token)."""

    __slots__ = ("waits",)

    def __init__(self, words: Words, name: str, token: int) -> None:
        super().__init__(name, (name, token), words, _W_LOCK)
        #: The dict's ProcessWaits (the store's too).
        self.waits: ProcessWaits = waits_for((name, token))

    # -- the front end's hooks -------------------------------------------------------

    def _take(self, blocking: bool, deadline: Optional[float], timeout: Optional[float]) -> bool:
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
        waits = self.waits
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
                    raise self._timeout_error(timeout, *_holder_of(seen))
                limit = next_check - now if deadline is None else min(next_check, deadline) - now
                if not registered:
                    # Polling: yield first, then sleep up to 1 ms.
                    spins += 1
                    time.sleep(0 if spins < 20 else min(0.001, 0.00002 * (spins - 19), max(limit, 0.0)))
                elif designated:
                    words.wait(_W_LOCK_SEQ, seq, max(min(limit, L.LOCK_HANDOFF_POLL), 0.0))
                else:
                    if (
                        words.load(_W_LOCK_WAKING) == _WAKE_PENDING
                        and words.cas(_W_LOCK_WAKING, _WAKE_PENDING, mine)[0]
                    ):
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

    def _try_take(self, recover: bool) -> bool:
        mine = owner_word()
        ok, seen = self._words.cas(_W_LOCK, 0, mine)
        if not ok and recover:
            ok = self._recover_if_dead(seen, mine)
        return ok

    def _woke_nobody(self) -> None:
        self.waits.woke_nobody(self._words)

    def _seize(self) -> None:
        words = self._words
        mine = owner_word()
        while True:
            seen = words.load(_W_LOCK)
            if words.cas(_W_LOCK, seen, mine)[0]:
                break
        if seen and seen != mine:
            log.warning("lock of shared dict %r taken over from pid %d", self._name, pid_of(seen))
            self._after_a_dead_holder()

    def _wait_free(self, timeout: float) -> bool:
        """Sleep on the lock channel until the word is 0 (True) or ``timeout``
        passes (False), as a registered waiter that never takes the
        designated role."""
        words = self._words
        deadline = time.monotonic() + timeout
        waits = self.waits
        if not waits.enter(words, _W_LOCK_WAITERS):
            backoff = Backoff()
            while words.load(_W_LOCK) != 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                backoff.sleep(left)
            return True
        try:
            while True:
                seq = words.load(_W_LOCK_SEQ)
                if words.load(_W_LOCK) == 0:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                words.wait(_W_LOCK_SEQ, seq, left)
        finally:
            # A release that woke this thread left LOCK_WAKING at 1 for it to
            # claim; it claims nothing (the caller retries elsewhere), so give
            # the flag back, or releases would stop waking anyone.
            words.cas(_W_LOCK_WAKING, _WAKE_PENDING, 0)
            waits.exit(words, _W_LOCK_WAITERS)

    def _holder(self) -> tuple[Optional[str], Optional[int]]:
        return _holder_of(self._words.load(_W_LOCK))

    def _holder_pid(self) -> Optional[int]:
        word = self._words.load(_W_LOCK)
        return pid_of(word) if word else None

    # -- internals -----------------------------------------------------------------

    def _recover_if_dead(self, seen: int, mine: int) -> bool:
        """Take the lock over from ``seen`` if that owner is dead; True if we now hold it."""
        if seen == 0:
            ok, _ = self._words.cas(_W_LOCK, 0, mine)
            return ok
        if seen == mine:
            # Our own word, yet no thread of ours holds it: a handle that held
            # the lock was closed or collected without releasing it.
            alive = False
        else:
            alive = owner_alive(seen)
        if alive:
            return False
        ok, _ = self._words.cas(_W_LOCK, seen, mine)
        if ok:
            log.warning(
                "lock of shared dict %r recovered from dead process %d",
                directories.shown(self._name),
                pid_of(seen),
            )
            self._after_a_dead_holder()
        return ok

    def _after_a_dead_holder(self) -> None:
        """What a holder that died may have left half done, undone before the
        lock is used: a dump it made but never published (REG_HIGH past
        STATE's generation: writer steps 4a-4c)."""
        words = self._words
        high, gen = words.load(L.W_REG_HIGH), words.load(L.W_STATE) >> L.GEN_SHIFT
        if high > gen:
            try:
                segments.discard_unpublished(L.dump_name(self._name, high))
            except OSError as exc:  # (the lock is ours now: an error here must not keep it)
                log.warning("shared dict %r: its unpublished dump %d stays (%s)", self._name, high, exc)
                if directories.file_of(L.dump_name(self._name, high)) is not None:  # (a recovery would
                    set_status(words, L.STATUS_SYNC_FAILED)  # take it: no write is durable any more)


def set_status(words: Words, bit: int) -> None:
    """``bit`` set in STATUS, whatever other bits another process sets at the
    same time (a CAS from the word seen; a bit already set is left alone)."""
    status = words.load(L.W_STATUS)
    while not status & bit:
        _, status = words.cas(L.W_STATUS, status, status | bit)


def _holder_of(word: int) -> tuple[Optional[str], Optional[int]]:
    """What a timeout message says about the LOCK word ``word``."""
    pid = pid_of(word) if word else None
    return (f"held by pid {pid}", pid) if pid else (None, None)
