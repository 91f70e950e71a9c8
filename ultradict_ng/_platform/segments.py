"""POSIX shared memory: the one module that creates, opens, writes, maps, lists
and removes segments -- the dict's (control, stream, dumps), its blobs, and
the process pool's parcels.

Why one module: the details below are easy to get subtly wrong (a SIGBUS, a
leaked name, a tracker that unlinks our segments), and each kind of segment
needs the same ones; what differs between them (names, headers, the words of
an error) stays with the caller.

Why not :class:`multiprocessing.shared_memory.SharedMemory`:

* Before Python 3.13 it registers every segment it creates *or attaches* with
  the process's resource tracker, which unlinks them (or warns about "leaked"
  segments) when that process exits.  Our segments outlive their creator and
  are shared with unrelated processes, so we never register them: this module
  calls the same ``_posixshmem`` functions without the tracker, for our
  segments only (the tracker itself is left alone).
* It only ``ftruncate``s.  On tmpfs that makes a sparse file, and the first
  write to a page the kernel cannot back kills the process with SIGBUS.  We
  ``posix_fallocate`` before writing through a mapping, or write with
  ``pwrite`` (which fails with ENOSPC instead), so a full ``/dev/shm`` becomes
  an :class:`~ultradict_ng.errors.OutOfSpace` error before anything is
  published.

Lifetime: :meth:`Segment.close` unmaps this process's view (other processes are
unaffected); :func:`unlink` removes the name (mappings stay valid until they
are closed).  Windows has no POSIX shared memory and is not supported.

A dict kept in files (``_disk/layout.py``) registers its directory in
:mod:`.directories`: its derived names (stream, dumps, blobs) are
then files of that directory, through ``_disk/files.py``, and everything
below works on them unchanged; a dump or blob is written to a ``.tmp`` file
and made whole on the disk by :func:`finish` (or :func:`create_written`).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from collections.abc import Sequence
from typing import Any, Callable, NoReturn, Optional

from .._disk import files
from .._disk import layout as D
from ..errors import CorruptSegment, OutOfSpace, SharedDictError, SyncFailed
from .directories import directory_of, file_of

try:
    import _posixshmem  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

__all__ = [
    "Segment",
    "Opened",
    "create_written",
    "reserve",
    "raise_if_full",
    "unlink",
    "discard_aside",
    "exists",
    "create_empty",
    "holds",
    "SUPPORTED",
    "LISTABLE",
    "SHM_DIR",
    "discard_unpublished",
    "finish",
]

SUPPORTED = _posixshmem is not None
_MODE = 0o600
#: Where the shared-memory filesystem can be listed (Linux); absent on macOS.
SHM_DIR = "/dev/shm"
#: Whether it can be listed here, decided once at import (for the engine's
#: sweeps; :func:`listable` asks again, for tools).
LISTABLE = os.path.isdir(SHM_DIR)
#: errno values that mean "no room in shared memory".
_FULL = (errno.ENOSPC, errno.ENOMEM, errno.EFBIG, errno.EDQUOT)  # (EDQUOT: a user's disk quota)
#: What opening a name that is no segment (a directory, a symbolic link, a device) gives.
_NOT_A_SEGMENT = (errno.EINVAL, errno.EISDIR, errno.ELOOP, errno.ENXIO, errno.ENODEV)
#: pwrite's answers where shared memory cannot be written through its descriptor
#: (macOS allows only ftruncate and mmap on it).
_NO_WRITE = {getattr(errno, n) for n in ("ENXIO", "EINVAL", "ENODEV", "EOPNOTSUPP") if hasattr(errno, n)}


def _path(name: str) -> str:
    return "/" + name


def _still_its_directory(name: str, path: str) -> None:
    """Before a file of the derived segment ``name`` is made or renamed at
    ``path``: ``NotFound`` if its directory is no longer the dict's (moved)."""
    files.still_the_dicts(os.path.dirname(path), name[: name.find("@")])


def _aside(name: str, path: str) -> str:
    """Where a new derived segment is written: its ``.tmp`` file for dumps and blobs."""
    return path + D.TMP_SUFFIX if D.written_aside(name[name.find("@") :]) else path


def _open_fd(name: str, flags: int) -> int:
    path = file_of(name)
    if path is not None:
        return files.open_rw(path, bool(flags & os.O_RDWR))
    _require_posix()
    return int(_posixshmem.shm_open(_path(name), flags, mode=_MODE))


def finish(segment: Segment) -> None:
    """Make a new dump, written through its mapping, whole on the disk and
    reachable under its name (``_disk/layout.py``, "Writes and syncs"); nothing
    for shared memory."""
    path = file_of(segment.name)
    if path is None or segment.buf is None:
        return
    aside = _aside(segment.name, path)
    try:
        files.sync_range(segment.buf, aside, 0, segment.size)
    except OSError as exc:
        _not_synced(exc, path)
    _still_its_directory(segment.name, path)
    try:
        files.rename(aside, path)
    except OSError as exc:  # (a new entry may need a block the disk has not)
        raise_if_full(exc, f"no room on the disk for {path}")
        raise_if_refused(exc, path)
        raise
    try:
        files.sync_dir(os.path.dirname(path))
    except OSError as exc:
        _not_synced(exc, path)


def _not_synced(exc: OSError, path: str) -> NoReturn:
    """A new file's sync failed: the caller discards it, unpublished, so the
    error is this write's (``OutOfSpace`` for a full disk, else ``SyncFailed``)
    and the dict's earlier writes are not in doubt (no failure bit).  One
    that could not start -- no descriptor left to open the directory -- is
    the process's limit, not the disk's: its own error."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        raise exc
    raise_if_full(exc, f"no room on the disk for {path}")
    raise SyncFailed(
        f"syncing {path} failed ({exc.strerror or exc}): it is discarded, nothing of it published",
        exc.errno or errno.EIO,
    ) from exc


def discard_aside(name: str) -> None:
    """Remove what a creator of the derived segment ``name`` killed before its
    rename left (its ``.tmp`` file); nothing for shared memory."""
    path = file_of(name)
    if path is not None and _aside(name, path) != path:
        files.remove(_aside(name, path))


def _require_posix() -> None:
    if _posixshmem is None:  # pragma: no cover - Windows
        raise OSError(errno.ENOSYS, "ultradict_ng needs POSIX shared memory (Linux, macOS)")


def raise_if_full(exc: BaseException, no_room: str) -> None:
    """:class:`OutOfSpace` (``no_room``, then the system's words) if ``exc`` says
    shared memory is full; else nothing (the caller re-raises ``exc``)."""
    if isinstance(exc, OSError) and exc.errno in _FULL:
        raise OutOfSpace(f"{no_room}: {exc.strerror}") from exc


def raise_if_refused(exc: BaseException, path: Optional[str]) -> None:
    """The system's error, of its own class, naming ``path`` -- not the
    ``.tmp`` name -- and saying that nothing was published, if the disk
    refused to make or name a dict's file for a reason other than room (a
    filesystem gone read-only, an immutable or append-only directory);
    else nothing.  A name already there, a missing directory (the dict
    removed: its callers say so) and our own errors pass unchanged."""
    if (
        path is not None
        and isinstance(exc, OSError)
        and not isinstance(exc, (SharedDictError, FileExistsError, FileNotFoundError))
        and exc.errno is not None
    ):
        raise OSError(
            exc.errno, f"{exc.strerror or exc}: {path} could not be made; nothing of this write is published"
        ) from exc


def _create_fd(name: str) -> int:
    """A descriptor of the new segment ``name`` (``FileExistsError`` if it exists)."""
    path = file_of(name)
    if path is not None:
        _still_its_directory(name, path)
        try:
            return files.create(_aside(name, path))
        except OSError as exc:  # (no inode, no block for the entry, a quota: the disk is full)
            raise_if_full(exc, f"no room on the disk for {path}")
            raise_if_refused(exc, path)
            raise
    _require_posix()
    fd = int(_posixshmem.shm_open(_path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=_MODE))
    directory = directory_of(name)
    if directory is not None:  # (a dict kept in files: its control words owned as its directory)
        try:
            files.adopt(fd, directory)
        except BaseException:
            os.close(fd)
            _posixshmem.shm_unlink(_path(name))
            raise
    return fd


def _abandon(name: str, fd: int) -> None:
    """Undo a creation that failed: nothing of it is left."""
    os.close(fd)
    path = file_of(name)
    if path is not None:
        with contextlib.suppress(OSError):  # (a directory refusing it too must not hide the error; the
            files.remove(_aside(name, path))  # next recovery removes a .tmp file)
    else:
        _posixshmem.shm_unlink(_path(name))


class Segment:
    """One mapped segment: ``name``, ``size`` (bytes mapped) and ``buf`` (an mmap)."""

    __slots__ = ("name", "size", "buf")

    def __init__(self, name: str, size: int, buf: Optional[mmap.mmap]) -> None:
        self.name = name
        self.size = size
        self.buf = buf

    @classmethod
    def create(cls, name: str, size: int, reserve: Optional[int] = None) -> Segment:
        """Create ``name`` exclusively with ``size`` bytes, zero-filled, the first
        ``reserve`` of them (default: all) reserved, and map it.

        Raises ``FileExistsError`` if the name exists and :class:`OutOfSpace`
        if the pages cannot be reserved; nothing is left behind on failure.
        Reserving (``posix_fallocate``) is what turns a full ``/dev/shm`` into
        an error here instead of a SIGBUS at the first write to a page; bytes
        past ``reserve`` must be reserved with :func:`reserve` before use.
        """
        fd = _create_fd(name)
        try:
            os.ftruncate(fd, size)
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size if reserve is None else min(reserve, size))
        except BaseException as exc:
            _abandon(name, fd)
            path = file_of(name)
            where = f"on the disk for {path}" if path else f"in shared memory for segment {name!r}"
            wanted = size if reserve is None else min(reserve, size)  # (reserved: not a sparse rest)
            raise_if_full(exc, f"no room {where} ({wanted} bytes)")
            raise_if_refused(exc, path)
            raise
        try:
            buf = mmap.mmap(fd, size)
        except BaseException:  # (ENOMEM here is the process's address space, not a full /dev/shm)
            _abandon(name, fd)
            raise
        os.close(fd)  # the mapping keeps its own reference
        return cls(name, size, buf)

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map an existing segment read-write; ``FileNotFoundError`` if it does not exist.

        A segment whose size is still 0 (its creator is between ``shm_open``
        and ``ftruncate``) is returned unmapped, with ``buf`` None.
        """
        try:
            fd = _open_fd(name, os.O_RDWR)
        except OSError as exc:  # (a directory, a symbolic link: anyone may make one in /dev/shm)
            if exc.errno not in _NOT_A_SEGMENT:
                raise  # (missing, not ours, out of descriptors: the system's error)
            where = file_of(name) or f"{SHM_DIR}{_path(name)}"
            raise CorruptSegment(f"{where} is not a segment ({exc.strerror or exc}): remove it") from exc
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


def create_written(
    name: str,
    size: int,
    pieces: Sequence[tuple[int, Any]],
    no_room: str,
    reserve: bool = False,
    created: Optional[Callable[[], None]] = None,
) -> None:
    """Create ``name`` exclusively with ``size`` bytes and write ``pieces``
    (``(offset, bytes-like)``, in that order) into it; nothing is mapped here.

    Why ``pwrite`` and no mapping: the writer then takes no page faults
    (measured 60-70 ms for 100 MiB, against 110-250 ms to map a fresh segment
    and copy), and a page the filesystem cannot give is ENOSPC, never SIGBUS.
    Where shared memory refuses ``pwrite`` before the first byte is written
    (macOS takes only ``ftruncate`` and ``mmap`` on it), the pieces go in
    through a mapping instead, the whole size reserved first.

    ``reserve``: reserve (``posix_fallocate``) the whole size before writing.
    ``created()``, if given, runs between the creation and the first write.
    Raises ``FileExistsError`` if the name exists, :class:`OutOfSpace`
    (``no_room``, then the system's words) when shared memory is full, or the
    error of ``created``; nothing is left behind on any failure.
    """
    fd = _create_fd(name)
    try:
        os.ftruncate(fd, size)
        if reserve and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
        if created is not None:
            created()
        _write_pieces(fd, size, pieces, reserve)
        path = file_of(name)
        if path is not None:  # (a blob of a dict kept in files: whole on the disk before it is named)
            try:
                files.sync_file(fd, _aside(name, path))
            except OSError as exc:
                _not_synced(exc, path)
            _still_its_directory(name, path)
            files.rename(_aside(name, path), path)
            try:
                files.sync_dir(os.path.dirname(path))
            except OSError as exc:
                files.remove(path)  # (named already: what follows removes the aside name only)
                _not_synced(exc, path)
    except BaseException as exc:
        _abandon(name, fd)
        path = file_of(name)
        if path is not None:
            no_room = no_room.replace("in shared memory", f"on the disk for {path}")
        raise_if_full(exc, no_room)
        raise_if_refused(exc, path)
        raise
    os.close(fd)


def _write_pieces(fd: int, size: int, pieces: Sequence[tuple[int, Any]], reserved: bool) -> None:
    written = False  # whether any byte went in: a refusal after that is a real error
    try:
        for offset, piece in pieces:
            with memoryview(piece) as raw, raw.cast("B") as data:
                done, length = 0, data.nbytes
                while done < length:
                    n = os.pwrite(fd, data[done:], offset + done)
                    if n <= 0:
                        raise OSError(errno.EIO, "pwrite wrote nothing")
                    done += n
                    written = True
    except OSError as exc:
        if exc.errno not in _NO_WRITE or written:
            raise
        # Reserve first, so that a full filesystem is ENOSPC here, not SIGBUS below.
        if not reserved and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
        with mmap.mmap(fd, size) as mm:
            for offset, piece in pieces:
                with memoryview(piece) as raw, raw.cast("B") as data:
                    mm[offset : offset + data.nbytes] = data


class Opened:
    """An open descriptor of an existing segment, for what a plain mapping does
    not give: its size before mapping it, a ``pread`` (a copy made by the
    kernel, without faulting in a mapping), a mapping of a chosen access.

    ``FileNotFoundError`` if there is no such segment.  Use it in ``with``: the
    descriptor is closed at the end; a mapping made from it stays valid.
    """

    __slots__ = ("name", "_fd")

    def __init__(self, name: str, writable: bool = False) -> None:
        self.name = name
        self._fd: int = _open_fd(name, os.O_RDWR if writable else os.O_RDONLY)

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def pread(self, length: int, offset: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def readinto(self, buffer: memoryview, offset: int) -> int:
        """Bytes read into ``buffer`` from ``offset`` (``preadv``)."""
        return os.preadv(self._fd, [buffer], offset)

    def map(self, size: int, access: int = mmap.ACCESS_DEFAULT) -> mmap.mmap:
        return mmap.mmap(self._fd, size, access=access)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Opened:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def reserve(name: str, length: int) -> None:
    """Reserve the first ``length`` bytes of the existing segment ``name``.

    Raises :class:`OutOfSpace` if shared memory is full (nothing changes) and
    ``FileNotFoundError`` if the segment is gone.
    """
    fd = _open_fd(name, os.O_RDWR)
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, length)
    except OSError as exc:
        path = file_of(name)
        where = f"on the disk to grow {path}" if path else f"in shared memory to grow segment {name!r}"
        raise_if_full(exc, f"no room {where} to {length} bytes")
        raise
    finally:
        os.close(fd)


def create_empty(name: str) -> int:
    """Create ``name`` exclusively with size 0 (``FileExistsError`` if it exists);
    its inode number, to check with :func:`holds` that the name is still it."""
    fd = _create_fd(name)
    try:
        return os.fstat(fd).st_ino
    finally:
        os.close(fd)


def holds(name: str, inode: int) -> bool:
    """Whether ``name`` is still the segment of inode ``inode`` (where it can be
    checked: the listing directory; elsewhere True)."""
    try:
        return os.stat(os.path.join(SHM_DIR, name)).st_ino == inode
    except FileNotFoundError:
        return False
    except OSError:
        return True


def unlink(name: str, missing_ok: bool = True) -> bool:
    """Remove the segment's name; True if it existed (``missing_ok=False``:
    ``FileNotFoundError`` if it did not)."""
    path = file_of(name)
    if path is not None:
        found = False
        if not D.magics_of(os.path.basename(path)) or files.dicts_file(*os.path.split(path)):
            found = files.remove(path)  # (else a file of that name that is not the dict's: left as it is)
        if path != _aside(name, path):
            found = files.remove(path + D.TMP_SUFFIX) or found
        if not found and not missing_ok:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return found
    _require_posix()
    try:
        _posixshmem.shm_unlink(_path(name))
    except FileNotFoundError:
        if not missing_ok:
            raise
        return False
    return True


def discard_unpublished(name: str) -> None:
    """Remove the dump ``name`` a writer that died left unpublished (layout:
    "Writer", step 4b finds it too); in files, with the directory synced.

    Why at once, and synced, for a dict kept in files: a dump renamed into
    place is a checkpoint to a recovery, which takes the newest.  The
    processes that go on write their records in the published generation,
    behind it: left there, after a reboot it would stand for the dict and
    hide every one of them.  Only the named file counts: one whose ``.tmp``
    name alone stays (the directory refusing its removal) is no checkpoint,
    and the next recovery removes it."""
    path = file_of(name)
    try:
        removed = unlink(name)
    except OSError:
        if path is None or os.path.lexists(path):
            raise
        removed = True  # (the named one gone, perhaps by this call: its removal synced)
    if removed and path is not None:
        files.sync_dir(os.path.dirname(path))


def exists(name: str) -> bool:
    path = file_of(name)
    if path is not None:
        return os.path.exists(path)
    _require_posix()
    try:
        fd = _posixshmem.shm_open(_path(name), os.O_RDONLY, mode=_MODE)
    except FileNotFoundError:
        return False
    os.close(fd)
    return True
