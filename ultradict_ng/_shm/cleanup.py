"""Removing a dict's segments: by a handle, by name, and after a crash.

Follows layout: "Unlink and cleanup register".  The register (REG_LOW ..
REG_HIGH, plus the published generation) names every dump generation that
may exist even after every user was SIGKILLed mid-write; where /dev/shm can
be listed, derived names are matched too, so a damaged register leaks
nothing.  Nothing that is provably someone else's is ever removed: a control
segment with another creation token is a dict re-created under the same name.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from .._platform import listing, segments
from .._platform.names import validate_name
from .._platform.segments import Segment
from ..cache.layout import cache_name
from ..errors import CorruptSegment, LockTimeout
from . import layout as L
from .blobs import blob_ids
from .control import check_layout, control_owner, looks_half_created, read_word
from .lock import ShmLock, owner_alive, set_status
from .mapping import Mapping
from .waiting import wake

__all__ = [
    "mark_unlinked",
    "unlink_dumps",
    "unlink_blobs",
    "unlink_tree",
    "unlink_by_name",
    "unlink_other_layout",
    "remove_orphans",
]

log = logging.getLogger("ultradict_ng")


def unlink_dumps(name: str, words: memoryview) -> int:
    """Unlink every dump generation the register names, and any other that exists."""
    low, high = words[L.W_REG_LOW], words[L.W_REG_HIGH]
    names = {L.dump_name(name, g) for g in range(max(low, high - L.MAX_RECLAIM), high + 1)}
    names.add(L.dump_name(name, words[L.W_STATE] >> L.GEN_SHIFT))
    names.discard(L.dump_name(name, 0))
    names.update(listing.listed(name + L.DUMP_SUFFIX))
    return sum(segments.unlink(n) for n in sorted(names))


def unlink_blobs(name: str, words: memoryview) -> int:
    """Unlink every blob the register (BLOB_LOW .. BLOB_NEXT) names, and every
    other ``NAME@b*`` where /dev/shm can be listed."""
    names = {L.blob_name(name, i) for i in blob_ids(name, words[L.W_BLOB_LOW], words[L.W_BLOB_NEXT])}
    names.update(listing.listed(name + L.BLOB_SUFFIX))
    return sum(segments.unlink(n) for n in sorted(names))


def mark_unlinked(atomic: Any) -> None:
    """STATUS.unlinked set: every handle's next write raises ``Unlinked``, and
    change waiters, woken, see it and stop (layout "Unlink", its first step)."""
    set_status(atomic, L.STATUS_UNLINKED)
    if atomic.load(L.W_CHANGE_WAITERS):
        wake(atomic, L.W_CHANGE_SEQ, 0x7FFFFFFF)


def unlink_tree(name: str, mapping: Mapping, token: int, locked_within: Optional[float] = None) -> int:
    """Layout "Unlink": flag, then dumps, stream, control.  Returns segments removed.

    ``locked_within``: remove only under the dict's lock, waited for that
    long (``LockTimeout``: nothing removed) -- a dict kept in files, whose
    writers make files by its directory's path: one that went on after a
    removal without the lock wrote them into the next dict made there."""
    lock = ShmLock(mapping.atomic, name, token)
    held = False
    if locked_within is not None:
        held = lock.acquire(timeout=locked_within)
    else:
        try:
            held = lock.acquire(timeout=L.UNLINK_LOCK_TIMEOUT)
        except LockTimeout as exc:
            log.warning("unlinking shared dict %r without its lock: %s", name, exc)
    try:
        mark_unlinked(mapping.atomic)
        if mapping.words[L.W_MAGIC] != L.CONTROL_MAGIC:
            # We only delete what is provably ours (the control could have been
            # unlinked and its name reused by a foreign segment meanwhile).
            return 0
        owner = control_owner(name, token, unlinked=True)
        if owner == "other":
            # The name was unlinked (by us or anyone) and a new dict now lives
            # under it: its stream and dumps have our names but are not ours.
            # (A second unlink of an old handle -- e.g. the auto-unlink of a
            # creator after unlink() -- must not touch the re-created dict,
            # nor a ``clean`` the control segment an opener of a dict kept in
            # files rebuilt under the same name and token meanwhile.)
            return 0
        # "ours", or "gone": no control under the name, so any stream or dump
        # left under it is ours (a creator makes its control first).
        removed = unlink_dumps(name, mapping.words)
        removed += unlink_blobs(name, mapping.words)
        removed += segments.unlink(L.stream_name(name))
        removed += segments.unlink(cache_name(name))
        if owner == "ours":
            removed += segments.unlink(name)
        return removed
    finally:
        if held:
            lock.release()


def unlink_by_name(name: str, control: bool = False) -> int:
    """Remove every segment of the dict ``name``; returns how many were removed (0 if none).

    Works when every process that used the dict is dead (crash cleanup): the
    control segment's register names every dump generation that may exist.
    A segment under that name that is not ours raises :class:`CorruptSegment`
    and nothing is removed.  ``control``: a dict kept in files' control
    segment, which ``clean`` removes when it was left abandoned or unlinked
    (its files are not touched; the public API refuses such a name: in a
    process that has the dict open, its derived names are its files).
    """
    validate_name(name, control=control)
    try:
        ctrl = Segment.attach(name)
    except FileNotFoundError:
        # No control: at most a stream left by a creator that died very early.
        return int(segments.unlink(L.stream_name(name))) + int(segments.unlink(cache_name(name)))
    if ctrl.buf is None or ctrl.size < L.CONTROL_SIZE:
        size = ctrl.size
        ctrl.close()
        if size == 0:  # abandoned between shm_open and ftruncate
            return int(segments.unlink(name)) + int(segments.unlink(L.stream_name(name)))
        raise CorruptSegment(f"segment {name!r} is not an ultradict_ng control segment ({size} bytes)")
    words = memoryview(ctrl.buf).cast("Q")
    try:
        magic = words[L.W_MAGIC]
        if magic == 0:
            if not looks_half_created(words):
                raise CorruptSegment(
                    f"segment {name!r} is not an ultradict_ng control segment; not unlinking it"
                )
            creator = words[L.W_CREATOR]
            if creator and owner_alive(creator):
                raise CorruptSegment(
                    f"shared dict {name!r} is being created by pid {creator & L.PID_MASK}; not unlinking it"
                )
            # Abandoned mid-creation: its register is still valid (zeroed or written).
            removed = unlink_dumps(name, words)
            removed += unlink_blobs(name, words)
            removed += segments.unlink(L.stream_name(name)) + segments.unlink(cache_name(name))
            return removed + int(segments.unlink(name))
        if magic != L.CONTROL_MAGIC:
            raise CorruptSegment(f"segment {name!r} is not an ultradict_ng control segment; not unlinking it")
        check_layout(name, words)
        token = words[L.W_TOKEN]
    except BaseException:
        words.release()
        ctrl.close()
        raise
    words.release()
    mapping = Mapping(ctrl, None)
    try:
        return unlink_tree(name, mapping, token)
    finally:
        mapping.release()


def unlink_other_layout(name: str) -> int:
    """Remove a dict made by another layout version of ultradict_ng (its MAGIC is
    ours, its version is not: :func:`unlink_by_name` refuses it); how many
    segments were removed.

    Nothing of its control segment but MAGIC and the version is read (the other
    words may mean other things there), so there is no lock and no register:
    every ``NAME@*`` the listing shows goes, then ``NAME`` (where /dev/shm
    cannot be listed, only the stream and the control).  For people upgrading,
    through ``ultradict-ng rm``; its users' writes fail afterwards.
    """
    validate_name(name, control=True)
    ctrl = Segment.attach(name)  # FileNotFoundError
    try:
        if ctrl.buf is None or ctrl.size < 16 or read_word(ctrl.buf, L.W_MAGIC) != L.CONTROL_MAGIC:
            raise CorruptSegment(f"segment {name!r} is not an ultradict_ng control segment; not unlinking it")
        if read_word(ctrl.buf, L.W_LAYOUT) & 0xFFFFFFFF == L.LAYOUT_VERSION:
            raise ValueError(f"shared dict {name!r} has this version's layout: use unlink_by_name")
    finally:
        ctrl.close()
    names = sorted(listing.listed(name + "@")) or [L.stream_name(name)]
    return sum(segments.unlink(n) for n in names) + int(segments.unlink(name))


def remove_orphans(base: str, names: list[str]) -> int:
    """Unlink ``names``, segments named like the dict ``base``'s whose control
    segment is gone (layout: "Unlink and cleanup register", orphans); how many.

    The name ``base`` is held meanwhile by an empty segment created
    exclusively, so that no creator makes a dict under it (and a new stream
    that these names would then denote) while they are removed; 0 if the name
    is taken -- a dict lives there now, and they are not orphans.
    """
    validate_name(base)
    try:
        placeholder = segments.create_empty(base)
    except FileExistsError:
        return 0
    try:
        removed = 0
        for name in names:
            if not name.startswith(base + "@") or not segments.holds(base, placeholder):
                break
            removed += segments.unlink(name)
        return removed
    finally:
        if segments.holds(base, placeholder):
            segments.unlink(base)
