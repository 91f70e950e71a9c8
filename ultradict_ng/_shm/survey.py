"""Every ultradict_ng dict on the machine, read from outside.

What the command line's ``ls``, ``stats`` and ``clean`` stand on.  The
shared-memory filesystem is listed once (Linux: ``/dev/shm``; elsewhere it
cannot be listed), each name is sorted by the layout's naming rule (a user
name never contains ``@``; derived names are ``NAME@s``, ``NAME@d<gen>``,
``NAME@b<id>``), each control segment is read (MAGIC, layout version,
header, register) and, for a healthy dict, its contents are loaded through a
:class:`~ultradict_ng.peek.Peek` to count keys.  Nothing here writes,
registers or locks.

Bytes are real use (``st_blocks``), not a segment's size: a growing stream
is a 64 MiB sparse file of which a few pages may be used.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .._disk import layout as D
from .._engine import User
from .._platform.listing import entry_stat, listed
from .._platform.owner import owner_alive, pid_of
from .._platform.segments import Segment
from ..cache import layout as C
from ..errors import CorruptSegment, SharedDictError
from ..futures import layout as PL
from . import layout as L
from .control import looks_half_created
from .peek import Peek
from .users import read_users

__all__ = ["Holder", "DictReport", "Orphan", "Survey", "survey", "report"]

#: The control segment of a dict kept in files (``_disk/layout.py``: ``udng+<device>-<inode>``).
_FILES_CONTROL = re.compile(re.escape(D.CONTROL_PREFIX) + r"[0-9a-f]+-[0-9a-f]+")
_DERIVED = re.compile(r"^(?P<base>[A-Za-z0-9_.\-]+)@(?P<kind>[sdbc])(?P<num>[0-9a-z]*)$")


def real_bytes(st: os.stat_result) -> int:
    """Bytes a segment really occupies (allocated blocks, not its sparse size)."""
    blocks = getattr(st, "st_blocks", None)
    return blocks * 512 if blocks is not None else st.st_size


@dataclass
class Holder:
    """A process named in a shared word: pid and whether it is alive."""

    pid: int
    alive: bool

    @classmethod
    def of(cls, word: int) -> Optional[Holder]:
        return cls(pid_of(word), owner_alive(word)) if word else None


@dataclass
class DictReport:
    """One dict as ``ls`` and ``stats`` show it.

    ``status``: "ok"; "unlinked" (its removal was interrupted: the flag is set,
    segments remain); "creating" (its creator is still at work); "abandoned"
    (its creator died before finishing it); "incompatible" (another layout
    version); "damaged" (a control segment that is not one, or cannot be read
    consistently).  ``problem`` says what is wrong in words.
    """

    name: str
    status: str = "ok"
    problem: Optional[str] = None
    segments: list[str] = field(default_factory=list)
    bytes: int = 0
    created: Optional[float] = None
    layout_version: Optional[int] = None
    serializer: Optional[str] = None
    recurse: Optional[bool] = None
    keys: Optional[int] = None
    generation: Optional[int] = None
    stream_end: Optional[int] = None
    stream_limit: Optional[int] = None
    stream_size: Optional[int] = None
    stream_grows: Optional[bool] = None
    stream_bytes: int = 0
    dumps: int = 0
    dump_bytes: int = 0
    blobs: int = 0
    blob_bytes: int = 0
    blob_threshold: Optional[int] = None
    #: A SharedCache's value serializer ("msgpack", "pickle"; "?" unreadable)
    #: when the dict has a side segment ``N@c``; None for a plain dict.
    cache: Optional[str] = None
    creator: Optional[Holder] = None
    users: list[User] = field(default_factory=list)
    unregistered_users: int = 0
    lock: Optional[Holder] = None
    lock_waiters: int = 0
    change_waiters: int = 0
    closing: Optional[Holder] = None

    @property
    def live_users(self) -> list[int]:
        return [u.pid for u in self.users if u.alive]

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.__dict__.items():
            if isinstance(value, Holder):
                value = {"pid": value.pid, "alive": value.alive}
            elif key == "users":
                value = [{"pid": u.pid, "start_time": u.start_time, "alive": u.alive} for u in value]
            out[key] = value
        return out


@dataclass
class Orphan:
    """Segments named like a dict's (``NAME@...``) whose control segment is
    gone: left by a crash during creation or removal; nothing can reach them."""

    base: str
    segments: list[str]
    bytes: int


@dataclass
class Survey:
    """The shared-memory filesystem, sorted: our dicts, orphans, and the rest
    (other programs' files: counted, never touched)."""

    dicts: list[DictReport]
    orphans: list[Orphan]
    foreign: list[tuple[str, int]]


def survey(load_keys: bool = True) -> Survey:
    """Read every dict on the machine (see the module docstring)."""
    entries = sorted(listed(""))  # (empty where the filesystem cannot be listed)
    derived: dict[str, list[str]] = {}
    plain: list[str] = []
    foreign: list[tuple[str, int]] = []
    for entry in entries:
        if entry.startswith(PL.POOL_PREFIX):
            continue  # the process pool's parcels: futures/leftovers.py reports them
        m = _DERIVED.match(entry)
        if m:
            derived.setdefault(m.group("base"), []).append(entry)
        elif "@" not in entry and (L.NAME_PATTERN.fullmatch(entry) or _FILES_CONTROL.fullmatch(entry)):
            plain.append(
                entry
            )  # (a dict's control segment; of a dict kept in files: its name, no derived ones here)
        else:
            st = entry_stat(entry)
            foreign.append((entry, real_bytes(st) if st else 0))
    dicts: list[DictReport] = []
    for name in plain:
        rep = report(name, derived.get(name, []), load_keys)
        if rep is None:
            st = entry_stat(name)
            foreign.append((name, real_bytes(st) if st else 0))
        else:
            dicts.append(rep)
    known = {d.name for d in dicts}
    orphans = []
    for base, names in sorted(derived.items()):
        if base not in known and base not in plain:
            used = sum(real_bytes(st) for st in map(entry_stat, names) if st)
            orphans.append(Orphan(base, names, used))
        elif base not in known:  # a foreign file under a name whose derived names are ours
            dicts.append(
                DictReport(
                    name=base,
                    status="damaged",
                    segments=[base, *names],
                    problem=f"{base!r} is not an ultradict_ng control segment, yet segments named "
                    f"like a dict's exist beside it ({', '.join(names[:3])})",
                )
            )
    foreign.sort()
    return Survey(sorted(dicts, key=lambda d: d.name), orphans, foreign)


def _read_head(name: str) -> Optional[bytes]:
    """The first CONTROL_SIZE bytes of segment ``name`` (through shm_open, so this
    works where the filesystem cannot be listed), or None if it does not exist."""
    try:
        seg = Segment.attach(name)
    except (OSError, CorruptSegment):  # (CorruptSegment: no segment -- a directory, a link)
        return None
    try:
        return bytes(seg.buf[: L.CONTROL_SIZE]) if seg.buf is not None else b""
    finally:
        seg.close()


def report(name: str, derived: Optional[list[str]] = None, load_keys: bool = True) -> Optional[DictReport]:
    """The report of the dict ``name``; None if ``name`` is not ours at all (a
    foreign file with no segment named like a dict's beside it)."""
    if derived is None:
        derived = sorted(listed(name + "@"))
    head = _read_head(name)
    if head is None:
        return None
    st = entry_stat(name)  # None where the filesystem cannot be listed (macOS)
    rep = DictReport(name=name, segments=[name, *derived], created=st.st_ctime if st else None)
    _count_segments(rep, derived)
    rep.bytes += real_bytes(st) if st else 0
    words = [int.from_bytes(head[i : i + 8], sys.byteorder) for i in range(0, len(head) - 7, 8)]
    magic = words[0] if words else 0
    if magic == L.CONTROL_MAGIC:
        rep.layout_version = words[L.W_LAYOUT] & 0xFFFFFFFF
        if rep.layout_version != L.LAYOUT_VERSION:
            rep.status = "incompatible"
            rep.problem = (
                f"layout version {rep.layout_version}; this ultradict_ng reads version "
                f"{L.LAYOUT_VERSION} (remove it with the version that made it)"
            )
            return rep
        _fill_from_words(rep, words)
        if words[L.W_STATUS] & L.STATUS_UNLINKED:
            rep.status = "unlinked"
            rep.problem = "being removed, or its removal was interrupted"
            return rep
        if _FILES_CONTROL.fullmatch(name):  # (its data are files somewhere: not read from here)
            rep.status = "files"
            rep.problem = (
                "the shared memory of a dict kept in files (its directory: device "
                + " inode ".join(name[len(D.CONTROL_PREFIX) :].split("-"))
                + " in hex); removing it when unused loses nothing: the next open rebuilds it"
            )
            return rep
        if load_keys:
            _load(rep)
        return rep
    if (len(head) == 0 and derived) or (len(head) == L.CONTROL_SIZE and looks_half_created(words)):
        creator = words[L.W_CREATOR] if len(words) > L.W_CREATOR else 0
        rep.creator = Holder.of(creator)
        recent = st is None or time.time() - st.st_ctime < L.INIT_TIMEOUT
        if (rep.creator is not None and rep.creator.alive) or (rep.creator is None and recent):
            rep.status, rep.problem = "creating", "its creator has not finished creating it"
        elif rep.creator is None and not derived:
            return None  # an empty file of someone else's
        else:
            rep.status, rep.problem = "abandoned", "its creator died while creating it"
        return rep
    if not derived:
        return None
    rep.status = "damaged"
    rep.problem = f"{name!r} is not an ultradict_ng control segment (foreign magic bytes)"
    return rep


def _count_segments(rep: DictReport, derived: list[str]) -> None:
    for seg in derived:
        st = entry_stat(seg)
        if st is None:
            continue
        used = real_bytes(st)
        rep.bytes += used
        kind = seg[len(rep.name) + 1]
        if kind == "s":
            rep.stream_bytes = used
        elif kind == "d":
            rep.dumps += 1
            rep.dump_bytes += used
        elif kind == "c":
            rep.cache = _cache_serializer(seg)
        else:
            rep.blobs += 1
            rep.blob_bytes += used


def _cache_serializer(name: str) -> str:
    """The value serializer a cache's side segment records (cache/layout.py word 7)."""
    try:
        seg = Segment.attach(name)
    except (OSError, CorruptSegment):  # (CorruptSegment: no segment -- a directory, a link)
        return "?"
    try:
        head = bytes(seg.buf[: 8 * (C.W_SERIALIZER + 1)]) if seg.buf is not None else b""
    finally:
        seg.close()
    words = [int.from_bytes(head[i : i + 8], sys.byteorder) for i in range(0, len(head) - 7, 8)]
    if len(words) <= C.W_SERIALIZER or words[C.W_MAGIC] != C.SIDE_MAGIC:
        return "?"
    names = {v: k for k, v in C.SERIALIZERS.items()}
    return names.get(words[C.W_SERIALIZER], "?")


def _fill_from_words(rep: DictReport, words: list[int]) -> None:
    config = words[L.W_CONFIG]
    rep.recurse = bool(config & L.FLAG_RECURSE)
    rep.stream_grows = bool(config & L.FLAG_GROWS)
    rep.serializer = {1: "msgpack", 2: "pickle", 3: "custom"}.get(config >> 32, f"unknown ({config >> 32})")
    state = words[L.W_STATE]
    rep.generation = state >> L.GEN_SHIFT
    rep.stream_end = state & L.END_MASK
    rep.stream_size = words[L.W_STREAM_SIZE]
    rep.stream_limit = words[L.W_STREAM_LIMIT]
    rep.blob_threshold = words[L.W_BLOB_THRESHOLD]
    rep.creator = Holder.of(words[L.W_CREATOR])
    rep.lock = Holder.of(words[L.W_LOCK])
    rep.lock_waiters = bin(words[L.W_LOCK_WAITERS]).count("1")
    rep.change_waiters = bin(words[L.W_CHANGE_WAITERS]).count("1")
    rep.closing = Holder.of(words[L.W_CLOSING])
    rep.unregistered_users = words[L.W_USER_OVERFLOW]
    rep.users = [
        User(pid_of(w), w >> L.PID_BITS, owner_alive(w))
        for w in words[L.W_USER_SLOTS : L.W_USER_SLOTS + L.USER_SLOTS]
        if w
    ]


def _load(rep: DictReport) -> None:
    """Count the keys through a Peek (and re-read the register through it)."""
    try:
        with Peek.open(rep.name) as peek:
            rep.users = read_users(peek._map.atomic)
            if peek.codec is None:
                return  # custom serializer: keys unknown here
            rep.keys = len(peek.load())
    except (SharedDictError, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            rep.status, rep.problem = "unlinked", "removed while being read"
        else:
            rep.status, rep.problem = "damaged", str(exc)
