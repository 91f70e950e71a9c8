"""Files: every read, write, sync, rename and removal a dict kept in files makes.

Why one module: the durability of a dict in files rests on the order of a few
system calls (``_disk/layout.py``), and that order can only be tested if every
one of them passes one place.  :data:`observer`, when set (by tests only), is
called before and after each call that changes what a power loss would
leave -- a file created, data synced, a rename, a removal, a directory synced --
so that a test can rebuild, at any of those points, every disk state a power
loss could leave (tests/powerloss.py).  Writes into a mapping are plain
stores and are not reported one by one: the observer compares the file's
bytes with what was last synced, which is what a mapping's dirty pages are.

Errors are the system's (``OSError``); the callers name the file in theirs.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import sys
from typing import Callable, Optional

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: every open refuses first (_platform/segments.py)
    fcntl = None  # type: ignore[assignment]

from ..errors import CorruptSegment, NotFound
from . import layout as D

#: Whether this system has ``flock`` (not Windows): every open refuses without it.
LOCKS = fcntl is not None

__all__ = [
    "LOCKS",
    "observer",
    "create",
    "adopt",
    "open_rw",
    "mark_open",
    "marked_open",
    "sync_file",
    "sync_range",
    "sync_data",
    "sync_dir",
    "absolute",
    "make_directories",
    "remove_directories",
    "sync_ancestors",
    "rename",
    "remove",
    "write_whole",
    "write_in_place",
    "sync_path",
    "read_whole",
    "still_the_dicts",
    "where_now",
    "PAGE",
    "dicts_file",
    "read_head",
    "FileBytes",
]

#: ``observer(event, path, done, span)`` -- event one of "create", "sync",
#: "range" (span: the bytes ``(start, end)`` synced), "rename" (the source
#: before, the target after), "replace" (the target, before a rename: the
#: file it may replace is still there), "remove", "syncdir"; called with
#: done=False before the call and done=True after it (tests only; None in use).
observer: Optional[Callable[[str, str, bool, Optional[tuple[int, int]]], None]] = None

PAGE = mmap.PAGESIZE
_MODE = 0o600


def _note(event: str, path: str, done: bool, span: Optional[tuple[int, int]] = None) -> None:
    if observer is not None:
        observer(event, path, done, span)


def create(path: str) -> int:
    """A descriptor of the new file ``path`` (``FileExistsError`` if it exists),
    owned as its directory is (:func:`adopt`)."""
    _note("create", path, False)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, _MODE)
    try:  # (first thing after the open: an interrupt in any call after it leaks nothing)
        adopt(fd, os.path.dirname(path))
        _note("create", path, True)
    except BaseException:
        os.close(fd)
        os.remove(path)
        raise
    return fd


def adopt(fd: int, directory: str) -> None:
    """A file root makes for a dict whose directory another user owns becomes
    that user's.  Why: a file of mode 0600 owned by root -- the ``clean`` a
    root ``ultradict-ng show PATH`` leaves, a checkpoint, a value -- would
    lock the dict's owner out of their own dict.  Other users cannot make
    files in a directory they do not own (mode 0700), nor give them away."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        st = os.stat(directory)
        if st.st_uid != 0:
            os.fchown(fd, st.st_uid, st.st_gid)


def open_rw(path: str, writable: bool = True) -> int:
    """A descriptor of the existing file ``path`` (``FileNotFoundError`` if it
    is not there; ``CorruptSegment`` if it is no regular file)."""
    return _open_regular(path, os.O_RDWR if writable else os.O_RDONLY)


def _open_regular(path: str, flags: int) -> int:
    """``os.open`` of a dict's file, refusing what is no regular file with
    ``CorruptSegment`` naming it: a directory, or a FIFO, whose open for
    reading would block -- under the directory lock, every opener with it --
    until some writer opened it (hence ``O_NONBLOCK``, which a regular file
    ignores)."""
    try:
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NONBLOCK | _NOFOLLOW)
    except IsADirectoryError:
        raise not_regular(path, stat.S_IFDIR) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and _NOFOLLOW:
            raise not_regular(path, stat.S_IFLNK) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise not_regular(path, mode)
    return fd


#: A dict's files are never symbolic links: one followed would have the
#: dict write into whatever file it names (its last component only: the
#: directory itself may be reached through links).
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def not_regular(path: str, mode: int) -> CorruptSegment:
    """The error for what is no regular file where a dict's file must be."""
    kind = (
        "a directory"
        if stat.S_ISDIR(mode)
        else "a symbolic link"
        if stat.S_ISLNK(mode)
        else "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a special file"
    )
    return CorruptSegment(f"{path} is {kind}, not a dict's file; nothing was changed")


def mark_open(fd: int) -> None:
    """A handle's mark on its dict while it is open: ``flock(LOCK_SH)`` on its
    descriptor of the stream (``_disk/layout.py``, "Limits").  Dropped when the
    descriptor closes -- by the handle's close, by the kernel when its process
    dies -- so it never outlives a process, as a file or word written would."""
    fcntl.flock(fd, fcntl.LOCK_SH)


def marked_open(path: str) -> bool:
    """Whether some descriptor of the file ``path`` holds :func:`mark_open` now
    (the caller holds the directory lock, under which every mark is taken)."""
    try:
        fd = _open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)  # (before the close: a child forked meanwhile would keep it)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


if sys.platform == "darwin":

    def _flush(fd: int) -> None:
        """macOS's ``fsync`` leaves the data in the drive's cache; ``F_FULLFSYNC``
        flushes that too (what SQLite's ``fullfsync`` and LMDB use there)."""
        try:
            fcntl.fcntl(fd, getattr(fcntl, "F_FULLFSYNC", 51))
        except OSError:  # (a filesystem without it: the best there is)
            os.fsync(fd)

else:
    _flush = getattr(os, "fdatasync", None) or os.fsync


def dicts_file(directory: str, file: str) -> bool:
    """Whether ``file`` of ``directory`` is the dict's: named as one of its
    files, and a finished dump or blob beginning with its magic
    (``layout.is_own``, ``layout.magics_of``)."""
    if not D.is_own(file):
        return False
    magics = D.magics_of(file)
    return not magics or read_head(os.path.join(directory, file), 8) in magics


def read_head(path: str, size: int) -> Optional[bytes]:
    """The first ``size`` bytes of ``path`` (fewer if it is shorter), or None
    where it cannot be read: what tells a dict's file from another's."""
    try:
        fd = _open_regular(path, os.O_RDONLY)
    except (OSError, CorruptSegment):
        return None
    try:
        return os.pread(fd, size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)


def sync_file(fd: int, path: str) -> None:
    """``fdatasync``: the file's data, and what reading it back needs (its
    size, its blocks), reach the disk before this returns."""
    _note("sync", path, False)
    _flush(fd)
    _note("sync", path, True)


def sync_range(buf: mmap.mmap, path: str, start: int, end: int) -> None:
    """Bytes ``start .. end`` of a shared mapping of ``path`` reach the disk
    (``msync(MS_SYNC)``: on Linux the range's ``fdatasync``)."""
    if end <= start:
        return
    first = start - start % PAGE
    end = min(end, len(buf))
    _note("range", path, False, (first, end))
    buf.flush(first, end - first)
    if sys.platform == "darwin":  # (msync there, as fsync, stops short of the drive's cache)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _flush(fd)
        finally:
            os.close(fd)
    _note("range", path, True, (first, end))


def sync_data(fd: int, path: str, start: int, end: int) -> None:
    """Bytes ``start .. end`` of ``path`` (open as ``fd``), written through a shared
    mapping or not, reach the disk: ``fdatasync``, which syncs every dirty page
    of the file (a superset) and, unlike ``msync``, lets other threads run."""
    if end <= start:
        return
    _note("range", path, False, (start, end))
    _flush(fd)
    _note("range", path, True, (start, end))


def sync_dir(path: str) -> None:
    """The directory's entries (files created, renamed, removed) reach the disk."""
    _note("syncdir", path, False)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if sys.platform == "darwin":
            _flush(fd)
        else:
            os.fsync(fd)
    except OSError as exc:  # some filesystems refuse fsync on a directory: their entries are durable
        if exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)
    _note("syncdir", path, True)


def absolute(path: str) -> str:
    """``path`` made absolute as the system resolves it: a ``..`` after a
    symbolic link goes up from where the link leads (``os.path.abspath``
    drops the link's name instead, and two processes would open two
    directories for one path).  The part up to the last ``..`` is resolved,
    the rest kept as given (links in it too, checked where they are used)."""
    given = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    names = given.split(os.sep)
    if ".." not in names:
        return os.path.abspath(given)
    last = len(names) - names[::-1].index("..")
    head = os.sep.join(names[:last])
    try:
        os.stat(head)  # (the system's own walk: through every link, then up)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) or any(
            os.path.islink(os.sep.join(names[:i])) and not os.path.exists(os.sep.join(names[:i]))
            for i in range(2, last)
        ):
            return given  # (a loop, a link to nothing: the system refuses it, and so do the callers)
    return os.path.abspath(os.path.join(os.path.realpath(head), *names[last:]))


def make_directories(directory: str) -> None:
    """``directory`` and the parents it lacks made; their entries are synced
    when a dict is created in it (:func:`sync_ancestors`)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)


def remove_directories(made: list[str], held: bool = True) -> None:
    """The directories an open made (deepest first) removed again, those
    still empty: a creation refused leaves the disk as it found it.  The
    first is the dict's, which the caller holds locked (unless not
    ``held``: its making failed); each other only under its own directory
    lock, taken without waiting (an opener holding it creates a dict there:
    it stays).  An opener that waited for a lock of one removed finds it
    gone and starts over (``dirlock``)."""
    for i, directory in enumerate(made):
        fd = -1
        try:
            if i or not held:
                fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rmdir(directory)
        except OSError:
            return  # (not empty, gone, or in use: the ones above hold it)
        finally:
            if fd >= 0:
                os.close(fd)


def sync_ancestors(path: str) -> None:
    """:func:`sync_dir` of every directory above ``path``, up to the root: the
    entry of each in its parent durable.  Every one, not only those this
    process made: a directory made by another opener racing this one, or by
    the user just before, may have its entry only in the page cache, and a
    new dict must outlive a power loss with the writes acknowledged in it
    -- above the path as given and above the one its symbolic links lead
    to.  (A directory whose entry is on the disk syncs at no cost.)  One this user
    cannot read (``/home`` at 0711) cannot be opened to sync: its entry is as
    durable as the filesystem makes it."""
    synced: set[str] = set()
    for start in (path, os.path.realpath(path)):  # (and where a symbolic link on the way leads)
        here = os.path.dirname(start)
        while here not in synced:
            synced.add(here)
            try:
                sync_dir(here)
            except PermissionError:
                pass
            here = os.path.dirname(here)


def rename(src: str, dst: str) -> None:
    """Atomically replace ``dst`` by ``src`` (durable once the directory is synced)."""
    _note("rename", src, False)
    _note("replace", dst, False)
    os.rename(src, dst)
    _note("rename", dst, True)


def remove(path: str) -> bool:
    """Remove ``path``; False if it was not there."""
    _note("remove", path, False)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    finally:
        _note("remove", path, True)
    return True


def write_whole(path: str, data: bytes) -> None:
    """``path`` holds ``data`` or what it held before, whatever crashes: written to
    ``path.tmp``, synced, renamed over ``path``, the directory synced."""
    tmp = path + ".tmp"
    remove(tmp)
    fd = create(tmp)
    try:
        view, done = memoryview(data), 0
        while done < len(data):
            done += os.write(fd, view[done:])
        sync_file(fd, tmp)
    except BaseException:
        os.close(fd)
        remove(tmp)
        raise
    os.close(fd)
    rename(tmp, path)
    sync_dir(os.path.dirname(path))


def write_in_place(path: str, offset: int, data: bytes) -> bool:
    """Write ``data`` at ``offset`` of the existing file ``path``, not synced
    (a word another process maps); False if there is no such file."""
    try:
        fd = _open_regular(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)
    return True


def sync_path(path: str) -> bool:
    """``fsync`` the existing file ``path`` (also what other processes wrote
    through their mappings of it); False if there is no such file."""
    try:
        fd = _open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        sync_file(fd, path)
    finally:
        os.close(fd)
    return True


def read_whole(path: str, limit: int) -> bytes:
    """The first ``limit`` bytes of the small file ``path`` (``FileNotFoundError``
    if absent): one ``open``, ``fstat``, ``read`` and ``close`` each.  (A buffered
    ``open`` adds an ``fstat`` and an ``ioctl``, and its ``read`` allocates
    ``limit`` bytes first: 40 us of a reopen's ~500 for a 1 MiB limit.)"""
    fd = _open_regular(path, os.O_RDONLY)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def still_the_dicts(directory: str, control: str) -> None:
    """``NotFound`` unless ``directory`` is still the directory of the dict
    whose control segment is ``control`` (named by its device and inode).

    A dict writes its files by its directory's path: moved while it is open
    (which the guide does not allow, but a deploy that re-points a symlink
    does), the path names another directory -- perhaps another dict's, whose
    value files and checkpoint a rename there would replace -- or none.  A
    file is made or renamed there only after this check: the write fails
    before it is published, naming the path, instead of landing elsewhere."""
    try:
        st = os.stat(directory)
        there = D.control_name(st.st_dev, st.st_ino)
    except OSError:
        there = None
    if there != control:
        raise NotFound(
            f"{directory} is no longer the dict's directory (moved or removed while the dict was open): "
            "nothing was written; reopen the dict where it is now"
        )


def where_now(path: str, fd: int) -> Optional[str]:
    """The directory of the file open as ``fd``: ``path``'s, if ``path`` still
    names that file; else (its directory moved while open) where Linux's
    ``/proc`` says it is now -- None where that cannot be told."""
    with contextlib.suppress(OSError):  # (nothing at the path: moved, as below)
        if os.path.samestat(os.stat(path), os.fstat(fd)):
            return os.path.dirname(path)
    try:
        now = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return os.path.dirname(now) if now.startswith("/") and not now.endswith(" (deleted)") else None


class FileBytes:
    """A file's bytes read with ``pread``, sliced as a mapping of it is.

    Why not the mapping: past what a dict wrote (a scan looking beyond a
    stream's end, a recovery clearing its tail), a file may have holes, and
    on tmpfs (``/tmp`` on many systems) touching a hole through a mapping
    allocates a page -- which, on a full filesystem, kills the process with
    SIGBUS.  ``pread`` reads holes as zeros without allocating."""

    __slots__ = ("fd", "size")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, span: slice) -> bytes:
        start, stop, _ = span.indices(self.size)
        return os.pread(self.fd, max(0, stop - start), start)
