"""The shared-memory filesystem seen as a directory (Linux): our names
listed, and what lies under a name read, for the engine's sweeps and the
tools that judge what they did not make.  For a dict kept in files, its
derived names are the files of its directory (``directories.file_of``).

Apart from :mod:`.segments`, which makes and removes segments, because
nothing here changes anything: it only looks.  macOS has no such directory:
every listing there is empty.
"""

from __future__ import annotations

import os
import stat
from typing import Optional

from .._disk import files
from .._disk import layout as D
from .directories import directory_of, file_of
from .segments import SHM_DIR

__all__ = ["listable", "listed", "entry_stat", "read_entry"]


def listable() -> bool:
    """Whether this platform's shared-memory filesystem can be listed (asked now)."""
    return os.path.isdir(SHM_DIR)


def listed(prefix: str) -> list[str]:
    """Names starting with ``prefix`` in the shared-memory filesystem, where it can be
    listed (Linux); an empty list elsewhere (macOS has no such directory).  For a
    dict kept in files, its derived names whose files are in its directory."""
    at = prefix.find("@")
    directory = directory_of(prefix) if at >= 0 else None
    if directory is not None:
        try:
            entries = os.listdir(directory)
        except OSError:
            return []
        names = {
            prefix[:at] + s
            for s, f in ((D.suffix_of(f), f) for f in entries)
            if s is not None and (D.aside_of(f) is not None or files.dicts_file(directory, f))
        }
        return sorted(n for n in names if n.startswith(prefix))
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    return [e for e in entries if e.startswith(prefix)]


def entry_stat(name: str) -> Optional[os.stat_result]:
    """The listed entry's ``stat`` (sizes, blocks, times); None if it cannot be
    had (gone, or nothing to list here)."""
    try:
        return os.stat(file_of(name) or os.path.join(SHM_DIR, name))
    except OSError:
        return None


def read_entry(name: str, length: int) -> tuple[Optional[os.stat_result], bytes]:
    """The ``stat`` and first ``length`` bytes of the listed entry ``name``, for
    tools that judge files they did not make: ``FileNotFoundError`` if it is
    gone; ``(None, b"")`` if it is not a regular file or cannot be read.

    Opened non-blocking and without following links: a FIFO or a symlink
    under a name like ours must neither hang the caller nor be read through.
    """
    path = file_of(name) or os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise
    except OSError:
        return None, b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, b""
        return st, os.pread(fd, length, 0)
    except OSError:
        return None, b""
    finally:
        os.close(fd)
