"""Who has a dict open: the user register, and removing a dict nobody uses.

Follows layout: "Users".  Shared memory has no reference count a crash
cannot break: a process killed with SIGKILL never says it left.  So every
process that has a dict open writes its owner word (pid and start time, as
the lock does) into a slot of the control segment, and "is anyone still
using this dict?" becomes a liveness check per slot -- the question the
command line's ``clean`` and ``auto_unlink="last"`` must answer without ever
removing a dict under a live user.

One slot per process and dict, shared by all its handles (counted here, in
process memory), so that 256 slots hold 256 processes however many handles
each opens.  ``/proc/<pid>/maps`` is the second witness: it also shows a
process that attached while the register was full, or that maps the segment
without registering at all (an older version, a raw ``mmap``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Callable, NamedTuple, Optional

from .._engine import User
from .._platform import faults
from .._platform.forks import on_fork_in_child
from .._platform.owner import owner_alive, owner_word, pid_of
from ..errors import LockTimeout
from ..speedups import Words
from . import layout as L
from .cleanup import unlink_tree
from .mapping import Mapping

__all__ = [
    "User",
    "read_users",
    "register",
    "attach",
    "detach",
    "free_dead",
    "mappers",
    "mapped_by",
    "Verdict",
    "remove_if_unused",
]

Key = tuple[str, int]  # (name, creation token)


def read_users(words: Words) -> list[User]:
    """Every process in the register (seq_cst loads), alive or dead, by slot order."""
    out = []
    for i in range(L.USER_SLOTS):
        word = words.load(L.W_USER_SLOTS + i)
        if word:
            out.append(User(pid_of(word), word >> L.PID_BITS, owner_alive(word)))
    return out


class _Attachment:
    """This process's registration for one dict: its slot (-1: counted in
    USER_OVERFLOW instead) and the control words of each open handle (any of
    them reaches the slot; each stays mapped until its handle detaches)."""

    __slots__ = ("slot", "handles")

    def __init__(self) -> None:
        self.slot = -1
        self.handles: list[Words] = []


_attached: dict[Key, _Attachment] = {}
_guard = threading.Lock()


def _claim(atomic: Words) -> int:
    """Attach step 1: a free slot taken with our owner word, or -1 (overflow counted)."""
    mine = owner_word()
    for attempt in range(2):
        start = os.getpid() % L.USER_SLOTS
        for k in range(L.USER_SLOTS):
            i = (start + k) % L.USER_SLOTS
            if atomic.cas(L.W_USER_SLOTS + i, 0, mine)[0]:
                return i
        if attempt == 0 and not free_dead(atomic):
            break
    atomic.add(L.W_USER_OVERFLOW, 1)
    return -1


def _release(atomic: Words, slot: int) -> None:
    if slot >= 0:
        atomic.cas(L.W_USER_SLOTS + slot, owner_word(), 0)
    else:
        atomic.add(L.W_USER_OVERFLOW, -1 & 0xFFFFFFFFFFFFFFFF)


def register(key: Key, atomic: Words) -> None:
    """Count one more open handle of ``key`` in this process (step 1 for the first)."""
    with _guard:
        att = _attached.get(key)
        if att is None:
            att = _attached[key] = _Attachment()
            att.slot = _claim(atomic)
        att.handles.append(atomic)


def attach(key: Key, atomic: Words) -> None:
    """Attach steps 1-3: register, then make sure the dict is not being removed.

    ``FileNotFoundError`` (and nothing registered) if it was removed because it
    had no users: to the caller the name no longer holds that dict.
    """
    register(key, atomic)
    if faults.armed is not None:
        faults.hit("user-registered")
    try:
        deadline = time.monotonic() + L.INIT_TIMEOUT
        while True:
            closing = atomic.load(L.W_CLOSING)  # step 2 (after step 1's CAS: seq_cst)
            if atomic.load(L.W_STATUS) & L.STATUS_UNLINKED:
                raise FileNotFoundError(key[0])
            if closing == 0:
                return
            if not owner_alive(closing):
                atomic.cas(L.W_CLOSING, closing, 0)
                continue
            if time.monotonic() > deadline:
                raise LockTimeout(
                    f"shared dict {key[0]!r} is being removed as unused by pid {pid_of(closing)}, "
                    f"which has not finished within {L.INIT_TIMEOUT} s",
                    name=key[0],
                    pid=pid_of(closing),
                )
            time.sleep(L.CLOSING_POLL)
    except BaseException:
        detach(key, atomic)
        raise


def detach(key: Key, atomic: Words) -> bool:
    """The handle with control words ``atomic`` leaves; True if it was this
    process's last handle of ``key`` (then its slot is free again)."""
    with _guard:
        att = _attached.get(key)
        if att is None:
            return True
        att.handles = [h for h in att.handles if h is not atomic]
        if att.handles:
            return False
        del _attached[key]
        _release(atomic, att.slot)
        return True


def attached(name: str) -> bool:
    """Whether this process has a handle of a dict named ``name`` open, of
    any token (a dict made again under the name: its directory's inode)."""
    with _guard:
        return any(key[0] == name for key in _attached)


def handles(key: Key) -> int:
    """How many handles of ``key`` this process has open."""
    with _guard:
        att = _attached.get(key)
        return 0 if att is None else len(att.handles)


def free_dead(atomic: Words) -> int:
    """Free the slots of dead users (a dead owner never comes back: a reused
    pid has another start time); how many were freed."""
    freed = 0
    for i in range(L.USER_SLOTS):
        word = atomic.load(L.W_USER_SLOTS + i)
        if word and not owner_alive(word) and atomic.cas(L.W_USER_SLOTS + i, word, 0)[0]:
            freed += 1
    return freed


_SHM = b" /dev/shm/"


def _shm_maps() -> Optional[list[tuple[int, bytes]]]:
    """``(pid, the text of /proc/<pid>/maps)`` of every process that maps a
    shared-memory segment, or None where /proc cannot be listed.  Read as
    bytes in a few calls, skipped whole when no line names /dev/shm: the
    kernel's making of the text is most of the cost (~10 us a process)."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    if not pids:
        return None
    out = []
    for pid in pids:
        try:
            fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        parts = []
        try:
            while part := os.read(fd, 1 << 17):
                parts.append(part)
        except OSError:
            continue
        finally:
            os.close(fd)
        text = b"".join(parts)
        if _SHM in text:
            out.append((pid, text))
    return out


def mappers() -> Optional[dict[str, set[int]]]:
    """Which processes map which shared-memory segment: ``{segment name: {pid}}``
    from ``/proc/<pid>/maps``, or None where that cannot be listed (no /proc).

    Processes whose maps cannot be read (another user's, without root) are
    left out: they could not open a segment of mode 0600 either.
    """
    maps = _shm_maps()
    if maps is None:
        return None
    out: dict[str, set[int]] = {}
    for pid, text in maps:
        for line in text.split(b"\n"):
            at = line.find(_SHM)
            if at < 0 or line.endswith(b" (deleted)"):
                continue  # (unlinked: not the segment now under that name)
            out.setdefault(os.fsdecode(line[at + len(_SHM) :]), set()).add(pid)
    return out


def mapped_by(name: str) -> Optional[set[int]]:
    """:func:`mappers` of the segment ``name`` alone: no line split or decoded."""
    maps = _shm_maps()
    if maps is None:
        return None
    line = _SHM + os.fsencode(name) + b"\n"
    return {pid for pid, text in maps if line in text}


class Verdict(NamedTuple):
    """What :func:`remove_if_unused` did: ``removed`` segments (0 if it kept
    the dict), the pids that use it (when kept because of them), and why."""

    removed: int
    users: list[int]
    reason: str


#: Seconds step b waits for processes that map the dict without a user slot to
#: unmap it or register, before it calls the dict in use.
SETTLE = 0.2
_MAPPED = "mapped by live processes"


def _users_now(name: str, atomic: Words, me: int) -> tuple[list[int], str]:
    """Step b's witnesses: live registered users, else processes mapping ``name``."""
    users = sorted({u.pid for u in read_users(atomic) if u.alive and u.pid != me})
    if users:
        return users, "registered users are alive"
    fresh = mapped_by(name)
    if fresh is None:
        if atomic.load(L.W_USER_OVERFLOW):
            return [0], "unregistered users, and no /proc to see them"
        return [], ""
    return sorted(fresh - {me}), _MAPPED


def remove_if_unused(
    name: str,
    mapping: Mapping,
    token: int,
    maps: Optional[dict[str, set[int]]] = None,
    remove: Optional[Callable[[], int]] = None,
) -> Verdict:
    """Steps a-c of layout "Users": unlink the dict only if no live process
    other than this one uses it.  ``maps`` (from :func:`mappers`) may be
    passed by a caller checking many dicts; it is read again for this one
    after CLOSING is set either way, so it only saves work when it shows users.
    ``remove``: what step c does instead of unlinking the dict (a dict kept in
    files removes its control segment only: ``_disk/lifetime.py``).
    """
    atomic = mapping.atomic
    me = os.getpid()
    mine = owner_word()
    if maps is not None:
        early = sorted(maps.get(name, set()) - {me})
        if early:
            return Verdict(0, early, "mapped by live processes")
    closing = atomic.load(L.W_CLOSING)
    patience = time.monotonic() + 2 * SETTLE
    while True:  # step a
        if closing == mine:
            break
        if closing and owner_alive(closing):
            # Another remover: wait for its verdict (two last users closing at
            # once each claim CLOSING in turn; the one that sees the other's
            # slot stops, and the other must still get its turn).
            if atomic.load(L.W_STATUS) & L.STATUS_UNLINKED:
                return Verdict(0, [], "removed by another process")
            if time.monotonic() >= patience:
                return Verdict(0, [pid_of(closing)], "another process is removing it")
            time.sleep(0.001)
            closing = atomic.load(L.W_CLOSING)
            continue
        ok, closing = atomic.cas(L.W_CLOSING, closing, mine)
        if ok:
            break
    try:  # (an exception -- a KeyboardInterrupt -- gives CLOSING back: a live holder is waited for)
        if faults.armed is not None:
            faults.hit("closing-claimed")
        users, reason = _users_now(name, atomic, me)  # step b
        settle = time.monotonic() + SETTLE
        while users and reason == _MAPPED and time.monotonic() < settle:
            # Mapped, but by no registered user: most often a process that has
            # just left the register and unmaps right after (two last users
            # closing at once would otherwise each see the other, and neither
            # remove the dict), or one attaching (its slot store follows).
            time.sleep(0.002)
            users, reason = _users_now(name, atomic, me)
        with _guard:  # (another thread of this process opened it since this one's last handle left)
            if not users and (name, token) in _attached:
                users, reason = [me], "opened again in this process"
        if users:
            atomic.cas(L.W_CLOSING, mine, 0)
            return Verdict(0, users, reason)
        if faults.armed is not None:
            faults.hit("closing-checked")
        return Verdict(unlink_tree(name, mapping, token) if remove is None else remove(), [], "unused")
    except BaseException:
        with contextlib.suppress(ValueError):  # (the mapping released already)
            atomic.cas(L.W_CLOSING, mine, 0)
        raise


def _after_fork_in_child() -> None:
    """A forked child maps every dict its parent had open: it registers itself."""
    global _guard
    _guard = threading.Lock()
    for key, att in list(_attached.items()):
        try:
            att.slot = _claim(att.handles[-1])
        except ValueError:  # (its words released without a detach: not the child's to register in)
            del _attached[key]  # (and the dicts after it are registered still)


on_fork_in_child("registrations", _after_fork_in_child)
