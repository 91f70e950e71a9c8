"""Who else uses a dict kept in files: handles this process cannot see, and
shared memory left under its name.

Follows ``_disk/layout.py``, "Limits": every open handle marks the stream
(``files.mark_open``); an opener about to rebuild the dict from its files,
or to attach to shared memory whose users are all gone, first checks that
no handle outside this shared memory has it open -- a container with its
own ``/dev/shm``, or a process whose shared memory was removed while it ran
-- since both sides would then write the same files, each over the other's
records.  A creation retires shared memory left under the dict's name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from typing import Any

from .._platform import segments
from .._platform.owner import owner_alive
from .._shm import layout as L
from .._shm.cleanup import mark_unlinked
from .._shm.control import read_word
from .._shm.mapping import Mapping
from ..errors import CorruptSegment, InUseElsewhere, NotADict
from . import files
from . import layout as D

__all__ = ["refuse_shared", "retire", "not_ours", "users_alive", "MARK_PATIENCE"]

#: Seconds an opener waits for a mark to go before it refuses: a process
#: killed shows as dead (its main thread a zombie) while another of its
#: threads, inside a system call (an ``fdatasync``), still holds its files.
MARK_PATIENCE = 1.0


def refuse_shared(directory: str) -> None:
    """Before step 4 rebuilds the dict from its files: refused if a handle
    outside this shared memory has it open (its mark on the stream), or if
    a file written in place is another directory's too (a hard link)."""
    stream = f"{directory}/{D.STREAM_FILE}"
    deadline = time.monotonic() + MARK_PATIENCE
    marked = files.marked_open(stream)
    while marked and time.monotonic() < deadline:
        time.sleep(0.01)  # (a process killed keeps its descriptors until its last thread has exited)
        marked = files.marked_open(stream)
    if marked:
        raise InUseElsewhere(
            f"the dict kept in {directory!r} is open in processes that do not share this one's shared "
            "memory (another container or IPC namespace; or its shared memory was removed while they ran): "
            "rebuilt here beside theirs, each side would overwrite the other's writes; nothing was changed"
        )
    for name in (D.STREAM_FILE, D.CACHE_FILE):
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(f"{directory}/{name}")
            if not stat.S_ISREG(st.st_mode):  # (a directory has 2 links: no copy by linking)
                raise files.not_regular(f"{directory}/{name}", st.st_mode)
            links = st.st_nlink
            if links > 1:
                raise NotADict(
                    f"{directory}/{name} has {links} hard links: the directory was copied by linking its "
                    f"files (cp -al, rsync --link-dest), and another dict writes this file in place too; in "
                    f"the copy, give it its own (cp {name} {name}.own && mv {name}.own {name}); nothing was "
                    "changed"
                )


def retire(directory: str, base: str) -> None:
    """Before a creation: a control segment left under the name -- of a dict
    whose directory had this inode before, or of one whose removal was
    killed midway -- is flagged unlinked, then removed: handles still open
    on it then write nothing more (their files would land in the new dict)."""
    try:
        ctrl = segments.Segment.attach(base)
    except FileNotFoundError:
        return
    except PermissionError:
        raise PermissionError(errno.EACCES, not_ours(directory, base)) from None
    if (
        ctrl.buf is not None
        and ctrl.size >= L.CONTROL_SIZE
        and read_word(ctrl.buf, L.W_MAGIC) == L.CONTROL_MAGIC
    ):
        mapping = Mapping(ctrl, None)
        try:
            mark_unlinked(mapping.atomic)
        finally:
            mapping.release()
    else:
        ctrl.close()
    segments.unlink(base)


def standing(ctrl: segments.Segment, token: int) -> tuple[bool, bool]:
    """Whether ``ctrl`` is the dict's control segment (published, of its
    token), and whether it stands unflagged (not being removed)."""
    ours = (
        ctrl.buf is not None
        and ctrl.size >= L.CONTROL_SIZE
        and read_word(ctrl.buf, L.W_MAGIC) == L.CONTROL_MAGIC
        and read_word(ctrl.buf, L.W_TOKEN) == token
    )
    return ours, ours and not read_word(ctrl.buf, L.W_STATUS) & L.STATUS_UNLINKED


def refuse_missing(directory: str, base: str, token: int, exc: FileNotFoundError) -> None:
    """An attach that found a file or segment missing: nothing if the control
    segment was removed or flagged meanwhile (a ``clean``: step 3 again);
    else ``CorruptSegment`` -- there and not being removed, it names a file
    of the dict that is gone."""
    try:
        ctrl = segments.Segment.attach(base)
    except FileNotFoundError:
        return
    try:
        unflagged = standing(ctrl, token)[1]
    finally:
        ctrl.close()
    if unflagged:
        raise CorruptSegment(
            f"{exc.filename or exc}: missing, though the shared memory of {directory!r} names it "
            "(put it back, or remove the dict); nothing was changed"
        ) from None


def users_alive(buf: Any) -> bool:
    """Whether a process registered in the control segment ``buf`` is alive
    (or unregistered users are counted: taken as alive)."""
    for i in range(L.USER_SLOTS):
        word = read_word(buf, L.W_USER_SLOTS + i)
        if word and owner_alive(word):
            return True
    return bool(read_word(buf, L.W_USER_OVERFLOW))


def not_ours(directory: str, base: str) -> str:
    """Why a control segment left under the name of ``directory``'s dict cannot be used or removed."""
    try:
        owner = f"user {os.stat(os.path.join(segments.SHM_DIR, base)).st_uid}"
    except OSError:
        owner = "another user"
    return (
        f"{directory!r}: the shared memory {segments.SHM_DIR}/{base} left by a dict that was kept in a "
        f"directory of the same inode belongs to {owner}, and this user cannot use or remove it: "
        "that user (or root) removes it with `ultradict-ng clean`"
    )
