"""Every exception ultradict_ng raises.

Each one subclasses :class:`SharedDictError` *and* the builtin a caller would
naturally catch (``FileExistsError``, ``TimeoutError``, ``TypeError`` ...), so
code written against plain dicts and files keeps working, and code that wants
to handle only our failures can catch :class:`SharedDictError`.

Messages name the shared-memory segment involved: with many dicts on one
machine, "segment corrupt" alone is useless.
"""

from __future__ import annotations

import errno
from typing import Any, Optional

__all__ = [
    "SharedDictError",
    "AlreadyExists",
    "NotFound",
    "Unlinked",
    "InvalidName",
    "ParameterMismatch",
    "CorruptSegment",
    "IncompatibleLayout",
    "NotADict",
    "LockTimeout",
    "Closed",
    "UnsupportedType",
    "OutOfSpace",
    "SyncFailed",
    "InUseElsewhere",
    "PathGone",
    "BackendUnavailable",
    "LeaseLost",
    "TransactionAborted",
    "BadDumpFile",
    "TooLarge",
]


class SharedDictError(Exception):
    """Base class of every error raised by ultradict_ng."""


class AlreadyExists(SharedDictError, FileExistsError):
    """``create=True`` was passed but a dict of that name already exists."""


class NotFound(SharedDictError, FileNotFoundError):
    """``create=False`` was passed (or a handle was unpickled) but no dict of that name exists."""


class Unlinked(NotFound):
    """The dict was unlinked by some process; this handle can no longer write to it."""


class InvalidName(SharedDictError, ValueError):
    """A dict name that cannot be used as a segment name on this platform."""


class ParameterMismatch(SharedDictError, ValueError):
    """An attacher passed a configuration value that differs from the stored one."""


class CorruptSegment(SharedDictError, ValueError):
    """A segment does not hold what the protocol says it must (foreign, damaged, half-made)."""


class IncompatibleLayout(CorruptSegment):
    """The segment is ours but was written by an incompatible layout version."""


class NotADict(CorruptSegment):
    """A directory given as a dict's ``path=`` is not one and cannot become one
    (other files in it, a network filesystem, not a directory, a path that
    cannot name one: a name too long, a link to nothing, links in a loop)."""


class LockTimeout(SharedDictError, TimeoutError):
    """The dict's lock could not be taken within the timeout.

    ``pid``, as the lock sets it when it gives up, is the pid stored in the
    lock's shared word at that instant: the process holding the lock (this
    process's own pid if one of its threads holds it).  If the word was free
    at that instant -- because another thread of this process held the
    process-local mutex for the whole timeout, or because the holder had just
    released -- ``pid`` is this process's pid (``os.getpid()``) as well, and
    the message says "held by another thread of this process".  The lock
    never raises it with ``pid=None``; ``None`` is only the constructor's default.
    """

    def __init__(self, message: str, *, name: str = "", pid: Optional[int] = None) -> None:
        super().__init__(message)
        self.name = name
        self.pid = pid


class Closed(SharedDictError, ValueError):
    """An operation on a handle after :meth:`SharedDict.close`."""


class UnsupportedType(SharedDictError, TypeError):
    """A key or value the configured serializer cannot round-trip exactly."""


class SyncFailed(SharedDictError, OSError):
    """A sync of a dict kept in files failed (the disk's I/O error): what was
    published since the last sync that succeeded may not be on the disk, and
    no later sync can tell -- Linux reports a failed writeback once, then
    forgets the pages -- so every later sync of the dict fails too, until it
    is reopened from its files."""

    def __init__(self, message: str, code: int = errno.EIO) -> None:
        super().__init__(code, message)

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> Any:
        return (type(self), (self.strerror, self.errno), self.__dict__ or None)


class _OneErrno(OSError):
    """An ``OSError`` of one errno (``CODE``), made from its message alone."""

    CODE = errno.EIO

    def __init__(self, message: str) -> None:
        super().__init__(self.CODE, message)

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> Any:
        # OSError pickles its args, (CODE, message); the constructor takes the message only.
        return (type(self), (self.strerror,), self.__dict__ or None)


class OutOfSpace(SharedDictError, _OneErrno):
    """Shared memory is full (``/dev/shm`` or the platform's equivalent)."""

    CODE = errno.ENOSPC


class InUseElsewhere(SharedDictError, _OneErrno):
    """A dict kept in files is open in processes that do not share this one's
    shared memory -- another container or IPC namespace (each has its own
    ``/dev/shm``) -- or whose shared memory was removed while they ran.  This
    process would rebuild the dict from its files beside theirs, and each
    side would overwrite the other's writes: refused instead (``EBUSY``)."""

    CODE = errno.EBUSY


class PathGone(SharedDictError, KeyError):
    """A nested view's dict was deleted or replaced by a non-dict value."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class BackendUnavailable(SharedDictError, ConnectionError):
    """The Redis server holding the dict cannot be reached or cannot serve it
    now (refused, cut, timed out, loading, cluster down).  Raised instead of
    answering from a cache nobody can vouch for; on a write the message says
    when the write may or may not have been applied."""


class LeaseLost(SharedDictError, RuntimeError):
    """The lock's lease on Redis expired while this thread held it (the
    process stalled past the lease, or the server could not be reached to
    renew it): another client may have taken the lock, so the server refused
    this write (the lease's fencing token is stale) or the release."""


class TransactionAborted(SharedDictError, RuntimeError):
    """A ``transaction()`` block published nothing although it ended normally:
    a nested block of it ended with an exception (it joins the outer one, so
    the whole transaction is rolled back), or its buffered writes were lost
    to an error inside it (the cache could no longer be trusted)."""


class BadDumpFile(SharedDictError, ValueError):
    """A file given to ``ultradict-ng load`` is not a whole, valid dump (a
    header of another format or a newer version, a truncated or damaged entry,
    a bad JSON line, a value a dump never holds); the message names the line or
    entry.  Nothing was changed."""


class TooLarge(SharedDictError, ValueError):
    """A value for a SharedCache whose entry alone would exceed its ``maxbytes``
    (storing it would break the bound, or evict everything for one entry, as
    cachetools refuses it too).  Nothing was changed."""
