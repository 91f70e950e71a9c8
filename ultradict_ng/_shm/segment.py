"""POSIX shared-memory segments, created and attached the way ultradict_ng needs.

Why not :class:`multiprocessing.shared_memory.SharedMemory`:

* Before Python 3.13 it registers every segment it creates *or attaches* with
  the process's resource tracker, which unlinks them (or warns about "leaked"
  segments) when that process exits.  Our segments outlive their creator and
  are shared with unrelated processes, so we never register them: this module
  calls the same ``_posixshmem`` functions without the tracker, for our
  segments only (the tracker itself is left alone).
* It only ``ftruncate``s.  On tmpfs that makes a sparse file, and the first
  write to a page the kernel cannot back kills the process with SIGBUS.  We
  ``posix_fallocate`` the whole size first, so a full ``/dev/shm`` becomes an
  :class:`~ultradict_ng.errors.OutOfSpace` error before anything is written.

Lifetime: :meth:`Segment.close` unmaps this process's view (other processes are
unaffected); :func:`unlink` removes the name (mappings stay valid until they
are closed).  Windows has no POSIX shared memory and is not supported.
"""

from __future__ import annotations

import errno
import mmap
import os
from typing import List, Optional

from ..errors import OutOfSpace

try:
    import _posixshmem  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

__all__ = ["Segment", "unlink", "exists", "listed", "create_empty", "holds", "SUPPORTED"]

SUPPORTED = _posixshmem is not None
_MODE = 0o600


def _path(name: str) -> str:
    return "/" + name


def _require_posix() -> None:
    if _posixshmem is None:  # pragma: no cover - Windows
        raise OSError(errno.ENOSYS, "ultradict_ng needs POSIX shared memory (Linux, macOS)")


class Segment:
    """One mapped segment: ``name``, ``size`` (bytes mapped) and ``buf`` (an mmap)."""

    __slots__ = ("name", "size", "buf")

    def __init__(self, name: str, size: int, buf: Optional[mmap.mmap]) -> None:
        self.name = name
        self.size = size
        self.buf = buf

    @classmethod
    def create(cls, name: str, size: int, reserve: Optional[int] = None) -> "Segment":
        """Create ``name`` exclusively with ``size`` bytes, zero-filled, the first
        ``reserve`` of them (default: all) reserved.

        Raises ``FileExistsError`` if the name exists and :class:`OutOfSpace`
        if the pages cannot be reserved; nothing is left behind on failure.
        Reserving (``posix_fallocate``) is what turns a full ``/dev/shm`` into
        an error here instead of a SIGBUS at the first write to a page; bytes
        past ``reserve`` must be reserved with :func:`reserve` before use.
        """
        _require_posix()
        flags = os.O_CREAT | os.O_EXCL | os.O_RDWR
        fd = _posixshmem.shm_open(_path(name), flags, mode=_MODE)
        try:
            os.ftruncate(fd, size)
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size if reserve is None else min(reserve, size))
            buf = mmap.mmap(fd, size)
        except BaseException as exc:
            os.close(fd)
            _posixshmem.shm_unlink(_path(name))
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                raise OutOfSpace(
                    f"no room in shared memory for segment {name!r} ({size} bytes): {exc.strerror}"
                ) from exc
            raise
        os.close(fd)  # the mapping keeps its own reference
        return cls(name, size, buf)

    @classmethod
    def attach(cls, name: str) -> "Segment":
        """Map an existing segment read-write; ``FileNotFoundError`` if it does not exist.

        A segment whose size is still 0 (its creator is between ``shm_open``
        and ``ftruncate``) is returned unmapped, with ``buf`` None.
        """
        _require_posix()
        fd = _posixshmem.shm_open(_path(name), os.O_RDWR, mode=_MODE)
        try:
            size = os.fstat(fd).st_size
            buf = mmap.mmap(fd, size) if size else None
        finally:
            os.close(fd)
        return cls(name, size, buf)

    def close(self) -> None:
        """Unmap; every memoryview or ctypes object over ``buf`` must be released first."""
        if self.buf is not None:
            self.buf.close()
            self.buf = None


def reserve(name: str, length: int) -> None:
    """Reserve the first ``length`` bytes of the existing segment ``name``.

    Raises :class:`OutOfSpace` if shared memory is full (nothing changes) and
    ``FileNotFoundError`` if the segment is gone.
    """
    _require_posix()
    fd = _posixshmem.shm_open(_path(name), os.O_RDWR, mode=_MODE)
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, length)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise OutOfSpace(
                f"no room in shared memory to grow segment {name!r} to {length} bytes: {exc.strerror}"
            ) from exc
        raise
    finally:
        os.close(fd)


def create_empty(name: str) -> int:
    """Create ``name`` exclusively with size 0 (``FileExistsError`` if it exists);
    its inode number, to check with :func:`holds` that the name is still it."""
    _require_posix()
    fd = _posixshmem.shm_open(_path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=_MODE)
    try:
        return os.fstat(fd).st_ino
    finally:
        os.close(fd)


def holds(name: str, inode: int) -> bool:
    """Whether ``name`` is still the segment of inode ``inode`` (where it can be
    checked: the listing directory; elsewhere True)."""
    try:
        return os.stat(os.path.join(_LISTING, name)).st_ino == inode
    except FileNotFoundError:
        return False
    except OSError:
        return True


def unlink(name: str) -> bool:
    """Remove the segment's name; True if it existed."""
    _require_posix()
    try:
        _posixshmem.shm_unlink(_path(name))
    except FileNotFoundError:
        return False
    return True


def exists(name: str) -> bool:
    _require_posix()
    try:
        fd = _posixshmem.shm_open(_path(name), os.O_RDONLY, mode=_MODE)
    except FileNotFoundError:
        return False
    os.close(fd)
    return True


_LISTING = "/dev/shm"
#: Whether the shared-memory filesystem can be listed here (Linux: yes).
LISTABLE = os.path.isdir(_LISTING)


def listed(prefix: str) -> List[str]:
    """Names starting with ``prefix`` in the shared-memory filesystem, where it can be
    listed (Linux); an empty list elsewhere (macOS has no such directory)."""
    try:
        entries = os.listdir(_LISTING)
    except OSError:
        return []
    return [e for e in entries if e.startswith(prefix)]
