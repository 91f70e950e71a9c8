"""Opening a dict kept in files, steps 3 and 4: attach to the shared memory
its processes share, or rebuild that from the files.

Follows ``_disk/layout.py``, "Opening and recovery", steps 3 and 4; the
opener holds the directory lock (``opening.py``).  ``clean`` is the one
process that removes a dict's control segment without that lock (it knows
no directory: it finds the segment of a dict whose users all died), by
name, holding the segment's own lock.  So an attach whose segment went
meanwhile looks again, and a rebuild holds the old segment's lock while it
replaces it under the same name and token: a ``clean`` that reached the old
one then never removes the new one.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
from collections.abc import Iterator
from typing import Any, Optional

from .._codec.codec import codec_for
from .._engine import Options
from .._platform import segments
from .._platform.owner import owner_alive, owner_word, pid_of
from .._shm import layout as L
from .._shm.control import Header
from .._shm.mapping import Mapping
from .._shm.store import Store
from ..errors import CorruptSegment, LockTimeout
from . import layout as D
from . import recovery, sharing

log = logging.getLogger("ultradict_ng")


def attach_or_recover(directory: str, base: str, meta: dict[str, Any], options: Options) -> Store:
    """Steps 3 and 4; again if the segment step 3 chose was removed before the
    attach took it (a ``clean``), which then finds it gone or flagged."""
    token = int(meta["token"])
    try:
        ctrl = segments.Segment.attach(base)
    except FileNotFoundError:
        ctrl = None
    except PermissionError:
        raise PermissionError(errno.EACCES, sharing.not_ours(directory, base)) from None
    replacing: Optional[Mapping] = None
    if ctrl is not None:
        ours, usable = sharing.standing(ctrl, token)
        try:
            alone = usable and not sharing.users_alive(ctrl.buf)
            if alone:  # (its users all gone here: is the dict open outside this shared memory?)
                sharing.refuse_shared(directory)
            stale = recovery.stale_control(directory, base, ctrl.buf) if alone else ""
        except BaseException:
            ctrl.close()
            raise
        if stale:
            log.warning(
                "ultradict_ng: %s: the shared memory its processes left (all gone) does not match its files "
                "(%s): rebuilt from the files",
                directory,
                stale,
            )
            usable = False
        if usable:
            ctrl.close()
            given = codec_for(options.serializer) if options.serializer is not None else None
            try:
                return Store._attach(base, given, _plain(options))
            except FileNotFoundError as exc:  # (removed since, or flagged while this waited for it)
                sharing.refuse_missing(directory, base, token, exc)
                return attach_or_recover(directory, base, meta, options)
        if ours:
            replacing = Mapping(ctrl, None)
        else:
            ctrl.close()
    with _held(directory, base, replacing):
        if ctrl is not None:
            segments.unlink(base)  # half-created, another dict's, or unlinked: rebuilt below
        sharing.refuse_shared(directory)
        return recovery.recover(directory, base, meta, _header(meta), options)


@contextlib.contextmanager
def _held(directory: str, base: str, old: Optional[Mapping]) -> Iterator[None]:
    """The lock of ``old``, the dict's segment a rebuild replaces, held
    meanwhile (its LOCK word, taken over from a dead holder; none to take if
    the dict had no segment of its token).  A ``clean`` removing ``old``
    holds it: waited for until the name is gone, up to ``INIT_TIMEOUT``.
    A plain word, not the dict's lock object, whose per-process state the
    new segment's lock (same name and token) shares."""
    if old is None:
        yield
        return
    words, mine = old.atomic, owner_word()
    held = False
    deadline = time.monotonic() + L.INIT_TIMEOUT
    try:
        while not held:
            held, seen = words.cas(L.W_LOCK, 0, mine)
            if held or not segments.exists(base):  # (gone: its remover is done with the name)
                break
            if not owner_alive(seen):
                held, _ = words.cas(L.W_LOCK, seen, mine)
            elif time.monotonic() > deadline:
                raise LockTimeout(
                    f"{directory!r}: its shared memory is held by pid {pid_of(seen)}, which did not let it "
                    f"go within {L.INIT_TIMEOUT} s (a clean removing it?)",
                    name=base,
                    pid=pid_of(seen),
                )
            else:
                time.sleep(L.CLOSING_POLL)
        yield
    finally:
        if held:
            words.cas(L.W_LOCK, mine, 0)
        old.release()


def _header(meta: dict[str, Any]) -> Header:
    try:
        return Header(
            recurse=bool(meta["recurse"]),
            grows=bool(meta["grows"]),
            serializer_id=int(meta["serializer"]),
            stream_size=int(meta["stream_size"]),
            stream_limit=int(meta["stream_limit"]),
            token=int(meta["token"]),
            creator=owner_word(),
            dump_limit=int(meta["dump_limit"]),
            blob_threshold=int(meta["blob_threshold"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptSegment(f"{D.META_FILE} lacks or garbles a field ({exc!r})") from None


def _plain(options: Options) -> Options:
    """The options a shared-memory attach checks (the rest are the files')."""
    return Options(
        recurse=options.recurse,
        buffer_size=options.buffer_size,
        serializer=options.serializer,
        dump_limit=options.dump_limit,
        blob_threshold=options.blob_threshold,
        max_decoded=options.max_decoded,
    )
