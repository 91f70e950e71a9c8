"""Sleeping until a shared word changes, and waking the sleepers.

Follows layout: "Waiting and waking".  Two channels share one mechanism --
*change* (a writer published STATE) and *lock* (a holder released LOCK) -- and
this module holds what they share: how a process registers that it has
sleepers (a slot and a bit, so that a waker with nobody to wake makes no
system call), how it sleeps (the kernel's futex through ``speedups.Words``,
or polling with back-off where there is none), how a waker wakes, and the
repair of registrations left by processes that died asleep.

Why a register instead of a plain counter of sleepers: a counter left
raised by a SIGKILLed waiter cannot be corrected (nobody knows whose part of
it is dead), so every later write would pay a futile system call forever.
A slot carries its owner's pid and start time, so a dead owner's bits can be
cleared by anyone, exactly once.

``ULTRADICT_NG_WAIT=poll`` makes this process poll instead of sleeping on
futexes (the fallback's test switch; it still wakes other processes' sleepers).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Optional

from .._platform.forks import on_fork_in_child
from .._platform.owner import owner_alive, owner_word
from ..errors import Closed
from ..speedups import FUTEX, Words
from . import layout as L

__all__ = ["MODE", "ENV_VAR", "ProcessWaits", "waits_for", "Backoff", "wake"]

ENV_VAR = "ULTRADICT_NG_WAIT"


def _choose_mode() -> str:
    forced = os.environ.get(ENV_VAR, "").strip().lower()
    if forced not in ("", "futex", "poll"):
        raise ImportError(f"{ENV_VAR}={forced!r}: expected futex or poll")
    if forced == "futex" and not FUTEX:
        raise ImportError(f"{ENV_VAR}=futex, but this platform has no futex")
    if forced:
        return forced
    return "futex" if FUTEX else "poll"


#: "futex" (waiters sleep in the kernel) or "poll" (waiters poll with back-off).
MODE: str = _choose_mode()
_ALL = 0x7FFFFFFF


class Backoff:
    """The polling fallback's sleeps: ``POLL_FIRST`` doubling up to ``POLL_MAX``."""

    __slots__ = ("step",)

    def __init__(self) -> None:
        self.step = L.POLL_FIRST

    def sleep(self, limit: Optional[float]) -> None:
        step = self.step
        time.sleep(step if limit is None else max(0.0, min(step, limit)))
        self.step = min(step * 2, L.POLL_MAX)


def wake(words: Words, seq_index: int, count: int) -> int:
    """A waker's part after it saw a WAITERS word != 0: SEQ += 1, then wake
    up to ``count`` sleepers; how many woke (0 without futex)."""
    words.add(seq_index, 1)
    return words.wake(seq_index, count) if FUTEX else 0


def _set_bit(words: Words, index: int, bit: int) -> None:
    seen = words.load(index)
    while not seen & bit:
        ok, seen = words.cas(index, seen, seen | bit)
        if ok:
            return


def _clear_bit(words: Words, index: int, bit: int) -> None:
    seen = words.load(index)
    while seen & bit:
        ok, seen = words.cas(index, seen, seen & ~bit)
        if ok:
            return


class ProcessWaits:
    """This process's registration in one dict's wait register: its slot (or
    -1) and how many of its threads wait on each channel.  One per dict and
    process, shared by every handle (as the lock's ProcessState)."""

    __slots__ = ("guard", "slot", "counts", "next_sweep", "__weakref__")

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.slot = -1
        self.counts: dict[int, int] = {L.W_CHANGE_WAITERS: 0, L.W_LOCK_WAITERS: 0}
        self.next_sweep = 0.0

    def enter(self, words: Words, waiters: int) -> bool:
        """Register a thread about to wait on the channel of WAITERS word
        ``waiters`` (waiter step 1).  True: it may sleep on the futex (and
        must call :meth:`exit`); False: it must poll (no futex here, or every
        slot taken) and nothing was registered."""
        if MODE != "futex":
            return False
        with self.guard:
            if self.counts[waiters] == 0:
                if self.slot < 0:
                    self.slot = self._claim(words)
                    if self.slot < 0:
                        return False
                _set_bit(words, waiters, 1 << self.slot)
            self.counts[waiters] += 1
            return True

    def exit(self, words: Words, waiters: int) -> None:
        """Undo one :meth:`enter` (waiter step 4)."""
        with self.guard:
            self.counts[waiters] -= 1
            if self.counts[waiters] or self.slot < 0:
                return
            slot = self.slot
            try:
                _clear_bit(words, waiters, 1 << slot)
                if not any(self.counts.values()):
                    self.slot = -1
                    words.cas(L.W_WAIT_SLOTS + slot, owner_word(), 0)
            except Closed:
                # The handle was closed under a waiting thread: its mapping is
                # gone, so the bit stays set, and the slot stays this process's
                # -- the next waiter, through another handle, sets the same bit
                # and clears it, and the slot, when it leaves (zeroing the
                # counts here made another handle's waiters count below zero,
                # and forgetting the slot left it claimed until the process
                # ended).
                pass

    @staticmethod
    def _claim(words: Words) -> int:
        mine = owner_word()
        start = os.getpid() % L.WAIT_SLOTS
        for k in range(L.WAIT_SLOTS):
            i = (start + k) % L.WAIT_SLOTS
            if words.cas(L.W_WAIT_SLOTS + i, 0, mine)[0]:
                return i
        return -1

    def woke_nobody(self, words: Words) -> None:
        """A waker's wake found no sleeper although a WAITERS word was set: a
        waiter about to sleep, or one that died registered.  Sweep the slots
        for dead owners, at most once per ``WAIT_SWEEP_INTERVAL``."""
        now = time.monotonic()
        if now < self.next_sweep:
            return
        self.next_sweep = now + L.WAIT_SWEEP_INTERVAL
        sweep(words)


def sweep(words: Words) -> int:
    """Clear the registrations of dead processes (layout: "Waiting and waking");
    how many slots were freed."""
    mine = owner_word()
    freed = 0
    for i in range(L.WAIT_SLOTS):
        index = L.W_WAIT_SLOTS + i
        word = words.load(index)
        if word == 0 or word == mine or owner_alive(word):
            continue
        if not words.cas(index, word, mine)[0]:
            continue  # another sweeper, or the slot changed hands
        _clear_bit(words, L.W_CHANGE_WAITERS, 1 << i)
        _clear_bit(words, L.W_LOCK_WAITERS, 1 << i)
        words.cas(index, mine, 0)
        freed += 1
    return freed


_registry: weakref.WeakValueDictionary[tuple[str, int], ProcessWaits] = weakref.WeakValueDictionary()
_registry_guard = threading.Lock()


def waits_for(key: tuple[str, int]) -> ProcessWaits:
    """The ProcessWaits of the dict ``key`` = (name, creation token) in this process."""
    with _registry_guard:
        waits = _registry.get(key)
        if waits is None:
            waits = _registry[key] = ProcessWaits()
        return waits


def _after_fork_in_child() -> None:
    # The parent's slot and sleepers are not the child's (another pid).
    global _registry_guard
    _registry_guard = threading.Lock()
    for waits in list(_registry.values()):
        waits.guard = threading.Lock()
        waits.slot = -1
        for key in waits.counts:
            waits.counts[key] = 0


on_fork_in_child("threads", _after_fork_in_child)
