"""The pool's wakeup of its result thread, coalesced: one message at most.

The standard pool wakes its result thread (the "executor manager thread")
through a pipe: every ``submit`` writes a message into it, and every turn of
that thread's loop empties it, polling the pipe until it is empty.  A poll
builds a selector (a few µs), and the thread polls at least once a turn (one
turn per result), twice when a message was waiting; a program that submits
3,000 small tasks writes 3,000 messages and makes the thread read them.  Yet
the thread needs to know only *that* something changed since it last looked:
it looks at the state itself (the queue of work ids, the shutdown flags)
after emptying the pipe.

:class:`CoalescedWakeup` keeps a flag next to the pipe: a wakeup writes a
message only when none is waiting, and emptying reads that one message only
when the flag says it is there -- no poll at all on a turn with nothing to
read.  The pipe, the reader the thread waits on, and ``close`` stay the
standard ones, so the thread still sleeps in the same ``wait`` on the same
reader.

Why no wakeup is lost: a waker changes the pool's state first, then wakes.
If it finds the flag set, the message written by whoever set it is still
unread -- the thread has not emptied the pipe since -- so the thread will
return from its wait, empty the pipe and only then look at the state, which
already holds the change.  The flag and the pipe change together under one
lock, so a message is in the pipe exactly when the flag is set: emptying never
blocks on a read, and never leaves a stale message behind (which would make
the thread spin).

A process forked from the pool's (a worker, with the fork start method)
inherits the wakeup and, through the standard library's exit hook, wakes
every pool it knows of as it exits.  Its copy of the lock is whatever the
lock was at the fork: held forever if a thread of the pool's process held it
then -- and the worker, and the pool joining it, would hang at exit.  A
process other than the wakeup's own therefore never takes the lock: it has no
pool thread to wake (its copies of them do not run), so it does nothing.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import process as _process
from typing import Any

__all__ = ["CoalescedWakeup", "install"]


class CoalescedWakeup(_process._ThreadWakeup):
    """The standard wakeup pipe with at most one message in it."""

    def __init__(self) -> None:
        super().__init__()
        # Guards the flag, the one message and ``close``: the pool's shutdown
        # at interpreter exit wakes without the pool's own lock, and a waker
        # racing ``close`` must not write into a closed pipe.
        self._coalesce = threading.Lock()
        self._waiting = False
        self._pid = os.getpid()  # (a forked child's copy never takes the lock: module docstring)

    def wakeup(self) -> None:
        if os.getpid() != self._pid:
            return
        with self._coalesce:
            if self._closed or self._waiting:
                return
            # (never blocks: the pipe holds no other message)
            self._writer.send_bytes(b"")
            self._waiting = True

    def clear(self) -> None:
        if os.getpid() != self._pid:
            return
        with self._coalesce:
            if self._closed or not self._waiting:
                return
            self._reader.recv_bytes()  # (written before the flag was set: there)
            self._waiting = False

    def close(self) -> None:
        if os.getpid() != self._pid:  # (this process's copies of the pipe's ends only)
            super().close()
            return
        with self._coalesce:
            super().close()


def install(executor: Any) -> bool:
    """Give ``executor`` (a standard pool, before it has started its result
    thread) a coalesced wakeup, where its call queue also wakes the thread
    (a call that failed to pickle): True.  Leaves a pool of another standard
    library, whose internals differ, as it is: False (the caller says so)."""
    old: Any = getattr(executor, "_executor_manager_thread_wakeup", None)
    calls: Any = getattr(executor, "_call_queue", None)
    standard = (
        type(old) is _process._ThreadWakeup
        and calls is not None
        and getattr(calls, "thread_wakeup", None) is old
        and getattr(executor, "_executor_manager_thread", None) is None
    )
    if not standard:
        return False
    new = CoalescedWakeup()
    executor._executor_manager_thread_wakeup = new
    calls.thread_wakeup = new
    old.close()
    return True
