"""Who a process is, for words in shared memory: pid and start time.

The LOCK word, the creator word and the wait slots (layout: "Lock", "Waiting
and waking") hold ``pid | start_time << PID_BITS``, so that a dead process
can be told from a live one, and a reused pid from its first owner.
"""

from __future__ import annotations

import os
from typing import Optional

from .._shm import layout as L
from .forks import on_fork_in_child

__all__ = ["owner_word", "pid_of", "owner_alive"]


def _stat_fields(pid: int) -> Optional[tuple[str, int]]:
    """(state letter, start time in clock ticks) from /proc, or None if unavailable."""
    try:  # (os.open and one read: a buffered open costs ~20 us of a process's first open of a dict)
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.read(fd, 4096)  # (the whole line: 52 numbers and a name of 16 bytes at most)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return ("X", 0)  # no such process (any more)
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return rest[0].decode(), int(rest[19])  # fields 3 and 22 of proc(5)
    except (IndexError, ValueError):
        return None


_HAS_PROC = os.path.exists(f"/proc/{os.getpid()}/stat")
# This process's owner word, computed on first use; reset in a forked child
# (which has another pid).  Caching it keeps os.getpid() and /proc off the
# write path.
_my_word = 0


def owner_word(pid: Optional[int] = None) -> int:
    """The LOCK word value meaning "held by process ``pid``" (default: this process)."""
    global _my_word
    if pid is None:
        if _my_word:
            return _my_word
        pid = os.getpid()
    start = 0
    if _HAS_PROC:
        fields = _stat_fields(pid)
        start = fields[1] if fields else 0
    word = (pid & L.PID_MASK) | ((start & L.START_MASK) << L.PID_BITS)
    if pid == os.getpid():
        _my_word = word
    return word


def pid_of(word: int) -> int:
    return word & L.PID_MASK


def owner_alive(word: int) -> bool:
    """False only when we are sure the process that stored ``word`` is gone.

    Dead means: no such pid; a zombie (killed but not yet reaped by its
    parent, which would otherwise keep the lock until the parent calls
    wait()); or the pid now belongs to a process with a different start time
    (pid reuse).
    """
    pid = pid_of(word)
    if pid == 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    except OSError:
        return True
    if _HAS_PROC:
        fields = _stat_fields(pid)
        if fields is not None:
            state, start = fields
            if state in ("Z", "X"):
                return False
            if (start & L.START_MASK) != (word >> L.PID_BITS):
                return False
    return True


def _after_fork_in_child() -> None:
    global _my_word
    _my_word = 0


on_fork_in_child("identity", _after_fork_in_child)
