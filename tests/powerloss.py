"""A power loss, simulated: what the disk may hold at any sync point of a workload.

:class:`Disk` is set as ``ultradict_ng._disk.files.observer`` (the one module
through which a dict kept in files syncs, renames and removes) and keeps, for
one directory, what has certainly reached the disk: each file's synced bytes
(``fdatasync``, or a synced range of a mapping) and the directory's entries as
of its last sync.  Before each call it records disk states a power loss at
that instant could leave, by the rules of SQLite's crash-test VFS and of the
ALICE study: the synced bytes, plus each unsynced 512-byte sector of a file
either written or not; a file created, renamed or removed counts once its
directory was synced, and before that in the states where a prefix of the
directory's operations since its last sync reached the disk (a journal
commits them in order, ahead of any directory sync).  Writes into a mapping
are not calls: the unsynced sectors are found by comparing a file's bytes
now with its synced bytes.
"""

from __future__ import annotations

import os
import random
import threading
from typing import Optional

SECTOR = 512


class Image:
    """One disk state: the files and their bytes, and how far the workload had got."""

    __slots__ = ("label", "files", "acked")

    def __init__(self, label: str, files: dict[str, bytes], acked: int) -> None:
        self.label = label
        self.files = files
        self.acked = acked

    def write(self, directory: str) -> None:
        os.makedirs(directory)
        for name, data in self.files.items():
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)


class Disk:
    def __init__(self, directory: str, seed: int) -> None:
        self.dir = directory
        self.rng = random.Random(seed)
        self.uid = 0
        self.current: dict[str, int] = {}  # name -> file id, as the directory is now
        self.durable_names: dict[str, int] = {}  # name -> file id, as of the last directory sync
        self.synced: dict[int, bytes] = {}  # file id -> its bytes known on the disk
        self.last_seen: dict[int, bytes] = {}  # file id -> its bytes when it left the directory
        self.images: list[Image] = []
        self.acked = 0
        # The directory's operations since its last sync, in order: (a name made
        # (the new one's id), a name gone) -- a create, a rename, a remove.
        self.pending: list[tuple[Optional[str], int, Optional[str]]] = []
        # A file's bytes as a sync of it began (thread, name): what it certainly
        # writes -- bytes written while it runs (another thread's) may miss it.
        self.flushing: dict[tuple[int, str], bytes] = {}
        self.renaming: dict[int, str] = {}  # thread -> the source of its rename under way
        self.mutex = threading.RLock()  # (threads' calls observed one at a time)
        for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
            # (a disk state the test wrote before recording: on the disk, all of it)
            self.uid += 1
            self.current[name] = self.durable_names[name] = self.uid
            self.synced[self.uid] = self._read(name)

    def _read(self, name: str) -> bytes:
        try:
            with open(os.path.join(self.dir, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return b""

    def observe(self, event: str, path: str, done: bool, span: Optional[tuple[int, int]]) -> None:
        if os.path.dirname(path) != self.dir and path != self.dir:
            return
        with self.mutex:
            self._observe(event, os.path.basename(path), path, done, span)

    def _observe(self, event: str, name: str, path: str, done: bool, span: Optional[tuple[int, int]]) -> None:
        if event == "replace":  # (a rename's target, while the file it replaces is still there)
            if name in self.current:
                self.last_seen[self.current[name]] = self._read(name)
            return
        if not done:
            self.capture(f"before {event} {name}")
            if event in ("remove", "rename") and name in self.current:
                self.last_seen[self.current[name]] = self._read(name)
            if event == "rename":
                self.renaming[threading.get_ident()] = name
            if event in ("sync", "range"):
                self.flushing[threading.get_ident(), name] = self._read(name)
            return
        if event == "create":
            self.uid += 1
            self.current[name] = self.uid
            self.pending.append((name, self.uid, None))
        elif event == "rename":
            src = self.renaming.pop(threading.get_ident())
            self.current[name] = self.current.pop(src)
            self.pending.append((name, self.current[name], src))
        elif event == "remove":
            self.current.pop(name, None)
            self.pending.append((None, 0, name))
        elif event == "sync" and name in self.current:
            self.synced[self.current[name]] = self.flushing.pop((threading.get_ident(), name))
        elif event == "range" and name in self.current and span is not None:
            uid = self.current[name]
            now = self.flushing.pop((threading.get_ident(), name))
            old = bytearray(self.synced.get(uid, b"").ljust(len(now), b"\0"))
            old[span[0] : span[1]] = now[span[0] : span[1]]
            self.synced[uid] = bytes(old)
        elif event == "syncdir" and path == self.dir:
            self.durable_names = {n: u for n, u in self.current.items()}
            self.pending = []

    def capture(self, label: str) -> None:
        """The states at this instant: only what is synced; each unsynced sector
        at random; and, for each prefix of the directory's operations since its
        last sync, those names with each unsynced sector at random."""
        self._state(f"{label} (synced)", self.durable_names, False)
        self._state(f"{label} (random)", self.durable_names, True)
        names = dict(self.durable_names)
        for k, (made, uid, gone) in enumerate(self.pending, 1):
            if gone is not None:
                names.pop(gone, None)
            if made is not None:
                names[made] = uid
            self._state(f"{label} (random, {k} of {len(self.pending)} directory operations)", names, True)

    def _state(self, label: str, names: dict[str, int], mixed: bool) -> None:
        files: dict[str, bytes] = {}
        for name, uid in names.items():
            base = self.synced.get(uid, b"")
            if uid in self.current.values():
                now = self._read(next(n for n, u in self.current.items() if u == uid))
            else:
                now = self.last_seen.get(uid, base)
            files[name] = self._mix(base, now) if mixed else base
        self.images.append(Image(label, files, self.acked))

    def _mix(self, base: bytes, now: bytes) -> bytes:
        size = len(now) if self.rng.random() < 0.5 else max(len(base), len(now))
        out = bytearray(base.ljust(size, b"\0")[:size])
        for start in range(0, size, SECTOR):
            new = now[start : start + SECTOR]
            if new != out[start : start + len(new)] and self.rng.random() < 0.5:
                out[start : start + len(new)] = new
        return bytes(out)
