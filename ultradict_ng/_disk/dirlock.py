"""The directory lock of a dict kept in files: who opens, recovers, closes
and removes it, one at a time (``_disk/layout.py``, "Opening and
recovery"), and the work a thread queues for after its own hold.

Apart from ``files.py`` because it is about exclusion, not about what
reaches the disk: it takes ``flock`` on the directory and changes nothing
a power loss could see.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Callable, Optional

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: every open refuses first (_platform/segments.py)
    fcntl = None  # type: ignore[assignment]

from .._platform.forks import on_fork_in_child

__all__ = ["directory_lock", "after_unlock"]


class directory_lock:
    """The directory lock: ``flock`` on the directory itself, held for the
    ``with`` block.  (A class, not a generator: every open and close of a
    dict kept in files takes it, and a generator's context manager cost 6-8
    us of a ~250 us reopen.)

    Why the directory and not a lock file in it: a lock file can be removed
    while held -- by ``unlink()``, by a cleaner of old files (systemd-tmpfiles
    in /tmp) -- and the next process then makes and locks a new one while
    the first still works: two openers at once, each recovering or creating
    over the other's files.  A directory is not removed while it holds the
    dict.  A process that waited while ``unlink()`` removed the directory
    (and perhaps another made it again) holds a lock nobody else takes, so
    it checks, once it holds it, that the path still names the directory it
    locked, and starts over if not (``FileNotFoundError`` once it is gone).

    A ``flock`` belongs to the open file description, which a fork shares
    with the child: closing the parent's descriptor would not release it
    while a child forked meanwhile (by another thread) keeps its copy --
    every later open of the dict would wait for that child to end.  So the
    release unlocks before it closes, and a forked child closes the copies
    it inherited of the descriptors held (closing them there releases
    nothing of the parent's)."""

    __slots__ = ("path", "fd", "stat")

    def __init__(self, directory: str) -> None:
        self.path = directory
        self.fd = -1
        #: The directory's ``stat`` once locked (the locked one's).
        self.stat: Optional[os.stat_result] = None

    def __enter__(self) -> None:
        if self.fd < 0:  # (taken already by acquire(): the block only releases it)
            self.acquire()

    def acquire(self) -> None:
        """Take the lock (``FileNotFoundError`` once the directory is gone)."""
        while True:
            mine = _mine()
            entry: Optional[tuple[tuple[int, int], list[Callable[[], None]]]] = None
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:  # (an interrupt before the lock is handed over must not keep it: every opener would wait)
                fcntl.flock(fd, fcntl.LOCK_EX)
                held = os.fstat(fd)
                named = os.stat(self.path)
                if (named.st_ino, named.st_dev) == (held.st_ino, held.st_dev):
                    entry = ((held.st_dev, held.st_ino), [])
                    mine.append(entry)
                    _held.add(fd)
                    self.fd, self.stat = fd, held
                    return
            except BaseException:
                mine[:] = [e for e in mine if e is not entry]
                _held.discard(fd)
                os.close(fd)
                raise
            os.close(fd)  # (removed and made again while we waited: lock the one named now)

    def __exit__(self, *exc: object) -> None:
        fd, self.fd = self.fd, -1
        later: list[Callable[[], None]] = []
        try:  # (an interrupt in the bookkeeping must not keep the lock: every opener would wait)
            mine, held = _mine(), self.stat
            queued = next(
                (i for i, (ident, _) in enumerate(mine) if held and ident == (held.st_dev, held.st_ino)), None
            )
            later = mine.pop(queued)[1] if queued is not None else []
        finally:
            try:
                _held.discard(fd)
            finally:
                try:
                    fcntl.flock(fd, fcntl.LOCK_UN)  # (a forked child's copy of fd would keep it locked)
                finally:
                    os.close(fd)
        for work in later:  # (after the unlock: each takes the lock itself)
            work()


def after_unlock(directory: str, work: Callable[[], None]) -> bool:
    """If this thread holds ``directory``'s lock, run ``work`` once it lets it
    go (True); else False, and the caller runs it.  Why: a handle collected
    (a garbage collection, a signal handler) while this thread opens the
    same dict closes inside the open's critical section, and a close that
    took the lock would wait for ever -- ``flock`` does not know it is ours."""
    mine = _mine()
    if not mine:
        return False
    try:
        st = os.stat(directory)
    except OSError:
        return False
    for ident, later in mine:
        if ident == (st.st_dev, st.st_ino):
            later.append(work)
            return True
    return False


_Held = list[tuple[tuple[int, int], list[Callable[[], None]]]]


def _mine() -> _Held:
    """The directory locks this thread holds (device, inode), each with the work queued for after it."""
    held: Optional[_Held] = getattr(_local, "held", None)
    if held is None:
        held = _local.held = []
    return held


#: Descriptors of the directory locks this process holds now.
_held: set[int] = set()
_local = threading.local()


def _after_fork_in_child() -> None:
    """The parent's threads hold these: the child closes its copies (unlocking nothing)."""
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()
    _local.held = []


on_fork_in_child("threads", _after_fork_in_child)
