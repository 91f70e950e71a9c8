"""Pure-Python twin of lockstate.c: ``ProcessState``, the lock's per-process
state (which thread holds the dict's lock and how often).  tests/test_native.py
compares it with the compiled one.
"""

from __future__ import annotations

import threading
from typing import Optional, Union

from .words import FUTEX, Words

__all__ = ["ProcessState"]


class ProcessState:
    """What every handle of one dict in this process shares: which thread holds
    the lock and how often (reentrancy), and the mutex that lets only one of our
    threads compete for the shared word at a time.

    :meth:`enter` and :meth:`exit` are the common cases of acquire and release;
    every other case (waiting for another process, timeouts, recovery) is in
    :mod:`ultradict_ng._shm.lock` and manipulates the same attributes.
    """

    __slots__ = ("mutex", "owner", "count", "__weakref__")

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.owner: Optional[int] = None
        self.count = 0

    def enter(self, words: Words, index: int, mine: int) -> bool:
        """True: the calling thread holds the lock (reentered, or the word was
        free and is now ``mine``).  False: the calling thread now holds the
        mutex but another process holds the word; the caller waits for the
        word, then sets ``owner`` and ``count``."""
        me = threading.get_ident()
        if self.owner == me:
            self.count += 1
            return True
        self.mutex.acquire()
        try:
            ok = words.cas(index, 0, mine)[0]
        except BaseException:
            self.mutex.release()
            raise
        if ok:
            self.owner = me
            self.count = 1
        return ok

    def exit(self, words: Words, index: int, mine: int) -> Union[bool, int, None]:
        """Release one level.  None: the calling thread does not hold the lock
        (nothing changed).  False: the last level was released but the word
        was no longer ``mine`` (taken over meanwhile).  After the last level,
        if LOCK_WAITERS (word ``index + 1``) is not 0 and LOCK_WAKING (``index + 3``)
        goes from 0 to 1: LOCK_SEQ (``index + 2``) += 1 and one sleeper is
        woken; 2 if that woke nobody."""
        if self.owner != threading.get_ident():
            return None
        self.count -= 1
        if self.count:
            return True
        self.owner = None
        woke_nobody = False
        try:
            ok = words.cas(index, mine, 0)[0]
            if ok and index + 3 < words._nwords and words.load(index + 1):
                if words.cas(index + 3, 0, 1)[0]:
                    words.add(index + 2, 1)
                    woke_nobody = FUTEX == 0 or words.wake(index + 2, 1) == 0
        finally:
            self.mutex.release()
        if ok and woke_nobody:
            return 2
        return ok
