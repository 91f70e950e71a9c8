"""Opening a dict kept in files: the directory checked and locked, the dict
created, attached, or recovered from its files.

Follows ``_disk/layout.py``, "Directory" and "Opening and recovery", step
by step; the scan of the stream is ``recovery.py``.  Every opener holds the
directory lock from its first look at the files to the moment its handle is
ready, so no process ever sees a half-created or half-recovered dict.
"""

from __future__ import annotations

import errno
import json
import logging
import operator
import os
import stat
from typing import Any, Optional, cast

from .._codec import records as R
from .._engine import Initial, Options
from .._facade.arguments import pairs
from .._platform import directories, segments
from .._shm import layout as L
from .._shm import users
from .._shm.mapping import Mapping
from .._shm.store import Store, validate_options
from ..errors import (
    AlreadyExists,
    CorruptSegment,
    IncompatibleLayout,
    NotADict,
    NotFound,
    ParameterMismatch,
)
from . import attaching, dirlock, files, lifetime, recovery, sharing
from . import layout as D
from .syncing import Durability

__all__ = ["open_durable", "control_of", "check_sync"]

log = logging.getLogger("ultradict_ng")

#: Options that make no sense for a dict kept in files.
_REFUSED = ("backend", "reads", "lease", "staleness")


def check_sync(sync: Any, interval: Any) -> None:
    if sync is not None and sync not in D.SYNC_MODES:
        raise ValueError(f"sync must be one of {', '.join(map(repr, D.SYNC_MODES))}, not {sync!r}")
    if interval is not None and (
        isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 < interval <= 3600
    ):
        raise ValueError(f"sync_interval must be a number of seconds in (0, 3600], not {interval!r}")
    if interval is not None and sync is not None and sync != "interval":  # (it would be stored, unused)
        raise ValueError(f"sync_interval= is for sync='interval', not sync={sync!r}")


def control_of(directory: str) -> str:
    st = os.stat(directory)
    return D.control_name(st.st_dev, st.st_ino)


def check_name(name: Any, directory: Any) -> Optional[int]:
    """``name=`` beside ``path=``: only a handle sent to another process gives
    both, its control segment's name with its directory, and the dict's
    token after a ``#``; returns that token.  Any other name is the caller's
    mistake.  The directory gone, or another one at its path (the dict
    removed, or moved away), is the dict that handle was of not there:
    ``NotFound``, as for a dict in shared memory unlinked meanwhile.  The
    directory's inode number reused for a new one -- filesystems do -- the
    name agrees: the token, checked once it is open, tells (:func:`gone`)."""
    if not isinstance(name, str) or not name.startswith(D.CONTROL_PREFIX):
        raise ValueError("give a dict kept in files its path=, not a name")
    base, _, token = name.partition("#")
    try:
        now: Optional[str] = control_of(os.fsdecode(directory))
        expected = int(token, 16) if token else None
    except (OSError, TypeError, ValueError):
        now = expected = None
    if now != base:
        raise NotFound(gone(directory))
    return expected


def gone(directory: Any) -> str:
    """The message of a handle whose dict is no longer at ``directory``."""
    return f"the dict kept in {directory!r} this handle was of is gone (removed, or moved away)"


def _check_directory(directory: str, create: Optional[bool]) -> tuple[str, os.stat_result, list[str]]:
    """The directory's absolute path and its ``stat``, made if missing and
    allowed (with the directories made, deepest first); its problems as
    errors.  (One ``stat`` answers "a directory?", the filesystem's device
    and the control segment's name: a reopen's work is mostly such calls.)"""
    made: list[str] = []
    given = os.fsdecode(directory)  # (bytes too, as os.open takes them)
    if not given:
        raise ValueError("path= is empty: give the dict's directory")
    directory = files.absolute(given)
    try:
        st = os.stat(directory)
    except NotADirectoryError:  # (a file on the way to it)
        raise NotADict(f"{directory!r} cannot be a directory: a file is on its path") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotADict(f"{directory!r} cannot be a directory: symbolic links on its path loop") from None
        if exc.errno == errno.ENAMETOOLONG:
            raise NotADict(f"{directory!r} cannot be a directory: {exc.strerror}") from None
        if not isinstance(exc, FileNotFoundError):
            raise
        if os.path.islink(directory):
            target = os.readlink(directory)
            raise NotADict(f"{directory!r} is a symbolic link to nothing ({target!r})") from None
        if create is False:
            raise NotFound(f"no dict is kept in {directory!r}: it does not exist") from None
        made.append(directory)
        there = os.path.dirname(directory)  # (refused before anything is made)
        while not os.path.isdir(there) and os.path.dirname(there) != there:
            made.append(there)
            there = os.path.dirname(there)
        _refuse_network(directory, there, os.stat(there).st_dev)
        try:
            _make(directory)
        except BaseException:  # (a name too long below, a full disk, an interrupt): none left made
            files.remove_directories([d for d in made if os.path.lexists(d)], held=False)
            raise
        st = os.stat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADict(f"{directory!r} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        if os.statvfs(directory).f_flag & os.ST_RDONLY:  # (the mount's, not the directory's: said so)
            said = "a dict kept in files needs a writable directory; this one is read-only"
            raise OSError(errno.EROFS, said, directory)
        raise PermissionError(
            errno.EACCES, "a dict kept in files needs a writable directory; this one is not", directory
        )
    _refuse_network(directory, directory, st.st_dev)
    return directory, st, made


def _make(directory: str) -> None:
    """``directory`` and its missing parents made; a link to nothing or a loop
    of links on the way is ``NotADict``.  A parent gone as this made it (a
    refused creation removing what it made) is made again."""
    for attempt in range(_RACES):
        try:
            return files.make_directories(directory)
        except OSError as exc:
            segments.raise_if_full(exc, f"no room on the disk to make {directory}")
            if exc.errno == errno.ENOENT and attempt < _RACES - 1:
                continue
            if exc.errno in (errno.ENOENT, errno.EEXIST, errno.ELOOP, errno.ENOTDIR, errno.ENAMETOOLONG):
                raise NotADict(f"{directory!r} cannot be made: {exc.filename!r}: {exc.strerror}") from None
            raise


def _refuse_network(directory: str, there: str, device: int) -> None:
    kind = _network_filesystem(there, device)
    if kind is not None:
        raise NotADict(
            f"{directory!r} is on a network filesystem ({kind}): processes on other machines could not "
            "share its lock and control segment, so a dict is not kept there"
        )


#: Devices already found local in this process (the mount table read once per filesystem).
_LOCAL_DEVICES: set[int] = set()
#: The mount table read when a directory's device is not a block device's.
_MOUNTINFO = "/proc/self/mountinfo"


def _network_filesystem(directory: str, device: int) -> Optional[str]:
    """The name of the network filesystem ``directory`` (on ``device``) is on (Linux), else None.

    A filesystem on a block device (a major device number other than 0) is
    one this machine mounted from its own disk: local, without reading the
    mount table, which costs ~0.2 ms (the kernel writes it out as text) --
    most of a process's first open.  Network filesystems, like tmpfs,
    overlays and FUSE mounts, have anonymous devices (major 0)."""
    if device in _LOCAL_DEVICES or os.major(device) != 0:
        return None
    try:
        with open(_MOUNTINFO, "rb") as f:
            table = os.fsdecode(f.read())  # (a mount point's name may be any bytes, as a path's)
    except OSError:
        return None
    kind = mounted_kind(table, os.path.realpath(directory))
    base, _, sub = kind.partition(".")  # (a FUSE mount counts by its subtype: fuse.sshfs)
    if (sub if base in ("fuse", "fuseblk") else base) not in D.NETWORK_FILESYSTEMS:
        _LOCAL_DEVICES.add(device)
        return None
    return kind


def _memory_filesystem(directory: str, device: int) -> Optional[str]:
    """``tmpfs`` or ``ramfs`` where ``directory`` (on ``device``) is on one
    (Linux), else None: files there live in memory, and are gone at a reboot
    as the shared memory is -- ``/dev/shm``, ``/run``, and ``/tmp`` on many
    systems.  (Read at a creation only: a reopen costs no mount table.)"""
    if os.major(device) != 0:
        return None
    try:
        with open(_MOUNTINFO, "rb") as f:
            kind = mounted_kind(os.fsdecode(f.read()), os.path.realpath(directory))
    except OSError:
        return None
    return kind if kind in ("tmpfs", "ramfs") else None


def mounted_kind(table: str, real: str) -> str:
    """The type of the filesystem that mounts the absolute path ``real``,
    from the mount table ``table`` (``/proc/self/mountinfo``'s text; "" if
    none does).  The innermost mount holding ``real`` decides."""
    best, kind = "", ""
    for line in table.splitlines():
        fields = line.split(" - ")
        if len(fields) != 2:
            continue
        mount = _unescaped(fields[0].split()[4])
        fstype = fields[1].split()[0]
        if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
            best, kind = mount, fstype
    return kind


def _unescaped(field: str) -> str:
    """A mount table's path as it is (the kernel writes space, tab, newline and backslash as octal)."""
    if "\\" not in field:
        return field
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


#: The most bytes of ``dict.meta`` read: a dict's is ~300 (a longer file is garbled).
_META_LIMIT = 1 << 16


def read_meta(directory: str) -> Optional[dict[str, Any]]:
    """``dict.meta`` of ``directory`` checked as every open checks it (None: no such file)."""
    path = f"{directory}/{D.META_FILE}"
    try:
        raw = files.read_whole(path, _META_LIMIT)
    except FileNotFoundError:
        return None
    try:
        meta = json.loads(raw.decode("utf-8"))
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise CorruptSegment(f"{path}: not a dict's description ({exc})") from None
    if meta.get("format") != D.META_FORMAT:
        raise NotADict(f"{path} does not describe an ultradict_ng dict")
    version, layout = meta.get("version"), meta.get("layout")
    if not D.readable_version(version, layout):
        if version is None or layout is None:  # (not another version's: damage, or not a dict's)
            missing = "version" if version is None else "layout"
            raise CorruptSegment(f"{path} has no {missing}: a damaged description; nothing was changed")
        raise IncompatibleLayout(
            f"{path}: the dict's files are of version {version!r} (layout {layout!r}); "
            f"this ultradict_ng reads version {D.DISK_VERSION} (layout {L.LAYOUT_VERSION})"
        )
    # A well-formed file checked in one pass at C speed (every process's first open reads it):
    values: tuple[Any, ...] = tuple(map(meta.get, _NAMES))
    if (
        tuple(map(type, values)) != _TYPES
        or not all(map(operator.le, _LOWS, values))
        or not all(map(operator.le, values, _HIGHS))
    ):
        for field, kinds, low, high, what in _META_FIELDS:  # (which, and an int sync_interval passes)
            value: Any = meta.get(field)
            if type(value) not in kinds or not low <= value <= high:
                raise CorruptSegment(f"{path}: {field} is {value!r}, not {what}; nothing was changed")
    if meta.get("sync") not in D.SYNC_MODES:
        raise CorruptSegment(
            f"{path}: sync is {meta.get('sync')!r}, not one of {', '.join(D.SYNC_MODES)}; nothing was changed"
        )
    if meta["stream_limit"] > meta["stream_size"]:
        raise CorruptSegment(f"{path}: stream_limit is past stream_size; nothing was changed")
    return meta


_INT, _BOOL = (int,), (bool,)

#: Each field of ``dict.meta`` but ``sync``: the types it may have, its
#: range, and that in words (checked before anything is made from it: a file
#: edited by hand is refused whole).  A number of seconds must be above 0:
#: ``5e-324`` is the least float that is.
_META_FIELDS: tuple[tuple[str, tuple[type, ...], Any, Any, str], ...] = (
    ("token", _INT, 1, 2**64 - 1, "the dict's creation token"),
    ("serializer", _INT, 1, 3, "a serializer's id: 1 (msgpack), 2 (pickle) or 3 (custom)"),
    ("recurse", _BOOL, False, True, "true or false"),
    ("grows", _BOOL, False, True, "true or false"),
    ("stream_size", _INT, L.MIN_STREAM_SIZE, L.MAX_STREAM_SIZE, "a stream size in bytes"),
    ("stream_limit", _INT, L.MIN_STREAM_SIZE, L.MAX_STREAM_SIZE, "a stream limit in bytes"),
    ("dump_limit", _INT, 0, 2**63 - 1, "a size in bytes, or 0"),
    ("blob_threshold", _INT, 0, 2**63 - 1, "a size in bytes"),
    ("sync_interval", (int, float), 5e-324, 3600, "a number of seconds in (0, 3600]"),
)
_NAMES = tuple(f[0] for f in _META_FIELDS)
_TYPES = tuple(f[1][-1] for f in _META_FIELDS)  # (float for the seconds: how the dict writes them)
_LOWS = tuple(f[2] for f in _META_FIELDS)
_HIGHS = tuple(f[3] for f in _META_FIELDS)


def open_durable(path: Any, create: Optional[bool], options: Options, initial: Initial) -> Store:
    """``SharedDict(path=...)``: create, attach to or recover the dict kept in ``path``."""
    for option in _REFUSED:
        if getattr(options, option) is not None and not (option == "backend" and options.backend == "shm"):
            raise ValueError(f"{option}= is not for a dict kept in files (path=)")
    if options.auto_unlink:
        raise ValueError("a dict kept in files is never removed automatically: auto_unlink= is not for path=")
    check_sync(options.sync, options.sync_interval)
    validate_options(options)
    if not segments.SUPPORTED or not files.LOCKS:  # pragma: no cover - Windows: nothing made
        raise OSError(errno.ENOSYS, "ultradict_ng needs POSIX shared memory and file locks (Linux, macOS)")
    for _ in range(_RACES):
        directory, st, made = _check_directory(path, create)
        lock = dirlock.directory_lock(directory)  # (it makes nothing: foreign files are refused under it)
        try:
            lock.acquire()
            break
        except FileNotFoundError:  # (an unlink removed it while we waited: as if we came after)
            if create is False:
                raise NotFound(f"no dict in {directory!r}: it was removed as this opened it") from None
    else:
        raise NotFound(f"{directory!r} was removed {_RACES} times while this opened it")
    with lock:
        assert lock.stat is not None
        st = lock.stat  # (the directory locked: it may have been removed and made again while we waited)
        base = D.control_name(st.st_dev, st.st_ino)  # (control_of's)
        directories.register_directory(base, directory)
        try:
            return _open_locked(directory, base, st, made, create, options, initial)
        except BaseException:  # (refused: unless a handle of it is open here, its names are no files)
            if not users.attached(base):
                directories.forget_files(base)
            raise


def _open_locked(
    directory: str,
    base: str,
    st: os.stat_result,
    made: list[str],
    create: Optional[bool],
    options: Options,
    initial: Initial,
) -> Store:
    """``open_durable`` under the directory lock, the dict's names its files."""
    meta = read_meta(directory)
    if meta is None or meta.get("creating"):
        if meta is None:
            _refuse_orphaned(directory)
        if create is False:
            _refuse_foreign(directory, meta is not None)  # (a directory of other files is no dict's)
            raise NotFound(f"no dict is kept in {directory!r}")
        try:
            store, meta = _create(directory, base, options, meta is not None)
        except BaseException:
            files.remove_directories(made)  # (this open's, refused: as if never made)
            raise
        try:
            _arm(store, directory, meta)
            if initial:  # (as writes of the dict in files: its rules for dumps and the stream)
                _write_meta(directory, {**meta, "creating": True})
                _fill(store, initial)
            # dict.meta last: the dict exists once its initial data is in.  A creator killed
            # before leaves files the next creator removes (step 1), as a refused one does here.
            _write_meta(directory, meta)
        except BaseException:
            lifetime.discard_created(store, directory)
            files.remove_directories(made)
            raise
        memory = _memory_filesystem(directory, st.st_dev)
        if memory is not None:
            log.warning(
                "ultradict_ng: %s is on %s, in memory: the dict outlives its processes, not a reboot "
                "or a power loss (keep it on a disk for that)",
                directory,
                memory,
            )
        return store
    else:
        if create is True:
            raise AlreadyExists(f"a dict is already kept in {directory!r}")
        _check_stored(directory, meta, options)
        store = attaching.attach_or_recover(directory, base, meta, options)
        try:
            _arm(store, directory, meta)
        except BaseException:  # (an interrupt, EMFILE): closed as a handle not fully opened
            lifetime.close_unarmed(store)
            raise
    return store


#: Times an opener starts over when the directory is removed while it waits for its lock.
_RACES = 8


def _write_meta(directory: str, meta: dict[str, Any]) -> None:
    """``dict.meta`` written whole; a full disk is :class:`OutOfSpace`, as for the other files."""
    path = f"{directory}/{D.META_FILE}"
    try:
        files.write_whole(path, json.dumps(meta, indent=1).encode())
    except OSError as exc:
        segments.raise_if_full(exc, f"no room on the disk for {path}")
        raise


def _refuse_orphaned(directory: str) -> None:
    """No ``dict.meta``, yet a dict's data -- a checkpoint, a value's file, a
    clean close's record, the cache's side, or records in the stream: its
    description is what was lost (deleted, or missed by a restore), and step
    1 would remove the dict as the leftovers of a creation that died.  Those
    are a stream of zeros (a creator writes initial data only under a
    ``dict.meta`` that says ``"creating"``, and that one is removed)."""
    data = sorted(
        f
        for f in os.listdir(directory)
        if f != D.STREAM_FILE and D.aside_of(f) is None and recovery.dicts_own(directory, f, False)
    )
    if recovery.dicts_own(directory, D.STREAM_FILE, False):  # (zeros, or a whole record: the dict's)
        if (files.read_head(os.path.join(directory, D.STREAM_FILE), L.RECORD_HEADER) or b"").strip(b"\0"):
            data.append(f"{D.STREAM_FILE} (its records)")
    if data:
        raise CorruptSegment(
            f"{directory}/{D.META_FILE} is missing, but the directory holds a dict's files "
            f"({', '.join(data[:4])}{', ...' if len(data) > 4 else ''}): put it back from a backup, or "
            "remove the dict (ultradict-ng rm PATH); nothing was changed"
        )


def _check_stored(directory: str, meta: dict[str, Any], options: Options) -> None:
    """``ParameterMismatch`` for a sync policy given that is not the stored one,
    or an interval given for a dict whose policy takes none."""
    for option, key in (("sync", "sync"), ("sync_interval", "sync_interval")):
        given = getattr(options, option)
        if option == "sync_interval" and meta.get("sync") != "interval":
            if given is not None:  # (as at a creation: an interval goes with "interval" only)
                raise ParameterMismatch(
                    f"the dict kept in {directory!r} was created with sync={meta.get('sync')!r}, "
                    f"which takes no sync_interval= (given {given!r})"
                )
            continue
        if given is not None and given != meta.get(key):
            raise ParameterMismatch(
                f"the dict kept in {directory!r} was created with {option}={meta.get(key)!r}, not {given!r}"
            )


def _fill(store: Store, initial: Initial) -> None:
    """The initial data of a new dict kept in files, written as its first writes."""
    if type(initial) is dict:
        if not store.load(initial):
            store.write(R.update((), pairs(initial)))
    else:
        store.write(R.update((), cast(list[list[Any]], initial)))


def _create(directory: str, base: str, options: Options, described: bool) -> tuple[Store, dict[str, Any]]:
    """Step 1: a new dict in an empty (or leftover-only) directory, and what
    its ``dict.meta`` will say (written by the caller once the initial data is in)."""
    _refuse_foreign(directory, described)
    for f in os.listdir(directory):
        files.remove(os.path.join(directory, f))
    sharing.retire(directory, base)
    store = Store._create(base, options, None)
    try:
        stream = store._map.stream
        assert stream is not None and stream.buf is not None
        files.sync_range(stream.buf, os.path.join(directory, D.STREAM_FILE), 0, stream.size)
        files.sync_dir(directory)
        files.sync_ancestors(directory)  # (their entries: made by this open, another, or the user)
        header = store._map.words
        meta = {
            "format": D.META_FORMAT,
            "version": D.DISK_VERSION,
            "layout": L.LAYOUT_VERSION,
            "token": store.token,
            "serializer": store.codec.id,
            "recurse": store.recurse,
            "grows": store.grows,
            "stream_size": store.stream_size,
            "stream_limit": header[L.W_STREAM_LIMIT],
            "dump_limit": store.dump_limit,
            "blob_threshold": store.blob_threshold,
            "sync": options.sync or D.DEFAULT_SYNC,
            "sync_interval": float(options.sync_interval or D.DEFAULT_SYNC_INTERVAL),
        }
        store._map.atomic.store(L.W_SYNCED, store._map.atomic.load(L.W_STATE))
    except BaseException:
        store._arm_finalizer(True)
        store.close()
        raise
    return store, meta


def _refuse_foreign(directory: str, described: bool) -> None:
    """``described``: a ``dict.meta`` that says "creating" vouches for the
    files a name alone marks (``recovery.dicts_own``)."""
    foreign = sorted(f for f in os.listdir(directory) if not recovery.dicts_own(directory, f, described))
    if foreign:
        raise NotADict(
            f"{directory!r} holds files that are not a dict's ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}): give an empty or new directory"
        )


def _arm(store: Store, directory: str, meta: dict[str, Any]) -> None:
    """Give the handle its sync policy and its closing (``lifetime.py``)."""
    mapping: Mapping = store._map
    store.durable = Durability(
        str(meta["sync"]),
        float(meta["sync_interval"]),
        mapping.atomic,
        mapping.words,
        f"{directory}/{D.STREAM_FILE}",
    )
    store.durable.remove = lifetime.unlink
    lifetime.arm(store, directory)
