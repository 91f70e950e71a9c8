"""Closing and removing a dict kept in files (``_disk/layout.py``, "Closing and removal").

A handle's close syncs; the last process's close removes the control
segment -- never a file -- and leaves ``clean``, so that the next opener
trusts the files without a checkpoint.  ``unlink()`` removes it all.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import weakref
from typing import Any, Callable, Optional

from .._platform import directories, segments
from .._shm import layout as L
from .._shm import users
from .._shm.cleanup import mark_unlinked, unlink_tree
from .._shm.control import control_owner
from .._shm.lock import ShmLock
from .._shm.mapping import Mapping
from .._shm.store import Store
from ..errors import AlreadyExists, CorruptSegment, LockTimeout
from . import dirlock, files
from . import layout as D
from .recovery import clean_bytes, dicts_own, read_clean_record
from .scanning import whole_record
from .syncing import Durability

__all__ = ["arm", "unlink", "discard_created", "remove_unopenable", "directory_of"]

log = logging.getLogger("ultradict_ng")


def directory_of(store: Store) -> Optional[str]:
    return directories.directory_of(store.name) if store.durable is not None else None


def arm(store: Store, directory: str) -> None:
    """Replace the handle's finalizer by this module's closing."""
    old = store._finalizer
    if old is not None:
        old.detach()
    assert store.durable is not None
    store._finalizer = weakref.finalize(
        store, _finalize, store._map, store.name, store.token, store.registered, directory, store.durable
    )


def _finalize(
    mapping: Mapping, name: str, token: int, registered: bool, directory: str, durable: Durability
) -> None:
    """A close (or collection, or the process's normal exit): sync; the last one out removes the control."""
    try:
        try:
            if not mapping.words[L.W_STATUS] & L.STATUS_UNLINKED:  # (removed: nothing left to sync)
                durable.sync_all()
        except Exception as exc:  # (closing still detaches; the error is the disk's)
            log.warning("ultradict_ng: syncing %s at close failed: %s", directory, exc)
        durable.close(keep_mark=True)
    except BaseException:
        _leave(directory, name, mapping, token, registered, durable)
        raise

    def leave() -> None:
        _leave(directory, name, mapping, token, registered, durable)

    if not dirlock.after_unlock(directory, leave):  # (else: once this thread's open of it is done)
        leave()


def _leave(
    directory: str, name: str, mapping: Mapping, token: int, registered: bool, durable: Durability
) -> None:
    try:
        if registered:
            _close_registered(directory, name, mapping, token)
    finally:
        durable.close()  # (its mark on the stream last: "Limits")
        mapping.release()


def _close_registered(directory: str, name: str, mapping: Mapping, token: int) -> None:
    """Leave the register; the last one out closes the dict -- under the
    directory lock, and with the handle's mark still held: an opener (which
    checks under that lock) never sees a handle gone from the register while
    its mark stays, nor the mark gone while its last close is still to come."""
    key = (name, token)
    lock = dirlock.directory_lock(directory)
    try:
        lock.acquire()
    except FileNotFoundError:  # (removed by an unlink, or moved away)
        if users.detach(key, mapping.atomic):
            _close_moved(directory, mapping)
        return
    except OSError as exc:
        if users.detach(key, mapping.atomic):
            log.warning("ultradict_ng: closing %s: no lock (%s); the next open recovers", directory, exc)
        return
    with lock:
        assert lock.stat is not None
        if not users.detach(key, mapping.atomic):
            return
        if D.control_name(lock.stat.st_dev, lock.stat.st_ino) != name:  # (another directory at the path)
            _close_moved(directory, mapping)
            return
        try:
            if os.path.exists(os.path.join(directory, D.META_FILE)):  # (else unlinked meanwhile)
                _close_locked(directory, name, mapping, token)
        finally:
            # This process's last handle: its names are no longer its files (a
            # removal by name here, as ``clean``'s, would take them).  Under the
            # lock, which an opener registering them again holds; of any token
            # (a dict made since in the directory has the same names).
            if not users.attached(name):
                directories.forget_files(name)


def _close_moved(directory: str, mapping: Mapping) -> None:
    """The last close of a dict whose path no longer names its directory:
    removed (the remover removed the control segment too), or moved while
    open.  Moved, its stream is synced and nothing else done: no ``clean``
    (at the path it would land in another directory), and the control
    segment stays, as a crash leaves it -- removing it without the
    directory's lock, which an opener at the new path may hold as it
    attaches or recovers, would race that opener (it waiting on a CLOSING
    never cleared, or two segments over one stream), and so would clearing
    an unpublished record past STATE.  The next open where the dict is now
    takes the segment over, or recovers after a reboot; ``clean`` removes it."""
    if mapping.words[L.W_STATUS] & L.STATUS_UNLINKED:
        return
    stream = mapping.stream
    if stream is not None and stream.buf is not None:
        with contextlib.suppress(OSError):
            end = mapping.atomic.load(L.W_STATE) & L.END_MASK
            files.sync_range(stream.buf, os.path.join(directory, D.STREAM_FILE), 0, end)
    log.warning(
        "ultradict_ng: closing %s: the dict's directory is no longer at that path (moved while open); "
        "no clean close recorded: the next open, where it is now, takes it over",
        directory,
    )


def _close_locked(directory: str, name: str, mapping: Mapping, token: int) -> None:
    """The last close, under the lock: the control segment removed, the stream synced, ``clean`` written."""
    removed = users.remove_if_unused(name, mapping, token, remove=lambda: _remove_control(name, token))
    if not removed.removed:
        return
    state = mapping.atomic.load(L.W_STATE)
    stream = mapping.stream
    if mapping.atomic.load(L.W_STATUS) & L.STATUS_SYNC_FAILED:
        log.warning("ultradict_ng: closing %s: a sync failed; the next open recovers it", directory)
        return
    try:
        if stream is not None and stream.buf is not None:
            end = _unpublished_cleared(stream.buf, state)
            files.sync_range(stream.buf, os.path.join(directory, D.STREAM_FILE), 0, end)
        files.sync_path(os.path.join(directory, D.CACHE_FILE))  # (a SharedCache's side, if any)
        generation = state >> L.GEN_SHIFT
        dead = D.dead_of(mapping.atomic.load(L.W_DEAD), generation)  # (kept for the next opener)
        record = (generation, state & L.END_MASK, token, dead)
        if read_clean_record(directory) != record:  # (else already there: a reopen that only read)
            files.write_whole(os.path.join(directory, D.CLEAN_FILE), clean_bytes(*record))
    except (OSError, CorruptSegment) as exc:  # (a full disk, an I/O error, no regular file): recovered next
        log.warning(
            "ultradict_ng: closing %s: no clean close recorded (%s); the next open recovers",
            directory,
            exc,
        )


def _unpublished_cleared(buf: Any, state: int) -> int:
    """The end of the stream's bytes the last close syncs: STATE's end, or
    past the header of a whole record of STATE's generation lying there,
    which it zeroes first.  Such a record is a write never published (its
    writer killed between writing and publishing it), which every process
    went on and closed without: left whole, the next open would find it past
    the end ``clean`` names and replay it in a recovery, making the write
    appear after the dict was closed without it.  (A ``clean`` file cannot
    say "only up to here" instead: one put back from a backup names an end
    that later writes, published, lie past.)"""
    end = state & L.END_MASK
    if whole_record(buf, end) != (state >> L.GEN_SHIFT) & L.GEN_MASK:
        return end
    buf[end : end + L.RECORD_HEADER] = bytes(L.RECORD_HEADER)
    return end + L.RECORD_HEADER


def _remove_control(name: str, token: int) -> int:
    if control_owner(name, token) != "ours":
        return 0
    return 1 if segments.unlink(name) else 0


def unlink(store: Store, only_if: Optional[Callable[[], bool]] = None) -> int:
    """Remove the dict: its control segment, every file of it, then the directory if empty.

    The dict's lock first, then the directory's, as every other taker of
    both (an open or a last close under ``with d.lock:``): the other way
    round, a holder of the dict's lock opening its directory waited for the
    removal, which waited for it.  0 where another removal came first (its
    directory gone, or another made at its path meanwhile), or where
    ``only_if()``, asked under both locks (no opener registers meanwhile),
    is false."""
    directory = directories.directory_of(store.name)
    assert directory is not None
    lock = ShmLock(store._map.atomic, store.name, store.token)
    try:
        lock.acquire(timeout=D.REMOVE_LOCK_TIMEOUT)
    except LockTimeout as exc:
        raise LockTimeout(f"{exc}: nothing removed", name=exc.name, pid=exc.pid) from None
    try:
        if store._map.words[L.W_STATUS] & L.STATUS_UNLINKED:
            return 0
        held = dirlock.directory_lock(directory)
        try:
            held.acquire()
        except FileNotFoundError:
            return 0
        with held:
            assert held.stat is not None
            if D.control_name(held.stat.st_dev, held.stat.st_ino) != store.name:
                return 0  # (another directory at its path: not this dict's)
            if only_if is not None and not only_if():
                return 0
            # First: its handles write nothing more, here or in a dict made next at the path.
            mark_unlinked(store._map.atomic)
            _mark_removed(directory)
            removed = unlink_tree(
                store.name, store._map, store.token, D.REMOVE_LOCK_TIMEOUT
            )  # (held: at once)
            return removed + _remove_files(directory, True)
    finally:
        lock.release()


def discard_created(store: Store, directory: str) -> None:
    """A creation that failed -- its initial data refused, the disk full --
    undone by the creator, which holds the directory lock: the control
    segment and every file it made removed, the handle closed without a last
    close (which would take the lock again: flock does not know it is ours)."""
    unlink_tree(store.name, store._map, store.token)
    for f in os.listdir(directory):
        if files.dicts_file(directory, f):
            files.remove(os.path.join(directory, f))
    close_unarmed(store)


def close_unarmed(store: Store) -> None:
    """Close a handle whose opening failed before it was armed (this module's
    closing): it leaves the register and drops its mark at once -- its opener
    holds the directory lock, which a last close would take again."""
    if store._finalizer is not None:
        store._finalizer.detach()
        store._finalizer = None  # (closed as a handle not fully opened)
    if store.durable is not None:
        store.durable.close()
    store.close()


def remove_unopenable(directory: str) -> int:
    """``rm PATH`` of a dict that cannot be opened -- a damaged one, one of
    another version -- and that no process uses (the caller removed its
    control segment or found none): its files, matched by name and first
    bytes as :func:`unlink` matches them (without a ``dict.meta``, by their
    bytes also where a name alone would do: ``recovery.dicts_own``), then
    the directory if empty."""
    with dirlock.directory_lock(directory):
        return _remove_files(directory, os.path.exists(os.path.join(directory, D.META_FILE)))


def remove_unfinished(directory: str) -> int:
    """``rm PATH`` of what a creation or a removal killed midway left (a
    ``dict.meta`` that says ``"creating"``): its files, as the next creation
    there would remove them -- checked again under the lock, which waits out a
    creator at work (``AlreadyExists`` once it finished: a dict, not removed)."""
    with dirlock.directory_lock(directory):
        if not unfinished(directory):
            raise AlreadyExists(f"a dict was made in {directory!r} meanwhile: nothing removed")
        return _remove_files(directory, True)


def unfinished(directory: str) -> bool:
    """Whether ``directory``'s ``dict.meta`` says ``"creating"``: a creation or a removal killed midway."""
    try:
        meta = json.loads(files.read_whole(f"{directory}/{D.META_FILE}", 1 << 16))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("creating") is True


def _mark_removed(directory: str) -> None:
    """Before a removal: ``dict.meta`` says ``"creating"``, durably, so that a
    removal killed midway leaves what a creation killed midway does -- no
    dict (the next open makes a new one, or finds none) -- and never a dict
    that opens with some of its value files or its checkpoint gone.  With
    no room for that (a full disk, the usual reason to remove), ``dict.meta``
    goes first instead: the rest is refused as a dict that lost its
    description, which ``rm PATH`` removes."""
    path = f"{directory}/{D.META_FILE}"
    try:
        meta = json.loads(files.read_whole(path, 1 << 16))
        files.write_whole(path, json.dumps({**meta, "creating": True}, indent=1).encode())
    except (OSError, ValueError, TypeError):
        if files.remove(path):
            files.sync_dir(directory)


def _remove_files(directory: str, described: bool) -> int:
    """The dict's files removed, ``dict.meta`` last, then the directory if
    empty (the caller holds the lock)."""
    removed = 0
    for f in sorted(os.listdir(directory), key=lambda f: f == D.META_FILE):
        if dicts_own(directory, f, described):
            removed += files.remove(os.path.join(directory, f))
    try:  # (under the lock: an opener that waited finds the directory gone, not emptied)
        os.rmdir(os.path.realpath(directory))  # (the directory, not a symlink to it)
    except OSError:
        pass
    return removed
