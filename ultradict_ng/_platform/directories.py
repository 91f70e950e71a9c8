"""Which dicts kept in files this process has open, and where: their
control names mapped to their directories.

A dict kept in files names its segments as one in shared memory does; its
derived names (stream, dumps, blobs, the cache's side) then stand for files
of its directory (``_disk/layout.py``, "Directory"), which ``segments``
looks up here for every name it opens, makes or removes.  Messages name
such a dict by its directory.
"""

from __future__ import annotations

from typing import Optional

from .._disk import layout as D

__all__ = ["register_directory", "forget_files", "directory_of", "shown", "shown_file", "file_of"]

#: Dicts kept in files: control name -> directory, for this process (``_disk``).
_DIRECTORIES: dict[str, str] = {}
#: Those of them whose derived names are files here: a handle of the dict is open.
_FILES: set[str] = set()


def register_directory(base: str, directory: str) -> None:
    """Map the derived names of the dict ``base`` to files of ``directory``."""
    _DIRECTORIES[base] = directory
    _FILES.add(base)


def forget_files(base: str) -> None:
    """The derived names of ``base`` are shared memory's again (this
    process's last handle of its dict closed): a removal by name then never
    takes its files.  Messages still name the dict by its directory."""
    _FILES.discard(base)


def directory_of(name: str) -> Optional[str]:
    """The directory of the dict that ``name`` (a control or derived name) belongs to, if kept in files."""
    at = name.find("@")
    return _DIRECTORIES.get(name if at < 0 else name[:at])


def shown(name: str) -> str:
    """How messages name the dict ``name``: its directory if it is kept in
    files (what the user gave ``path=``), else the name."""
    return directory_of(name) or name


def shown_file(name: str) -> str:
    """How messages name the derived segment ``name`` (a dump, a blob): the
    file that holds it if its dict is kept in files, else the name."""
    return file_of(name) or name


def file_of(name: str) -> Optional[str]:
    """The file that holds the derived segment ``name``, if its dict is kept in files."""
    at = name.find("@")
    if at < 0 or not _FILES or name[:at] not in _FILES:
        return None
    directory = _DIRECTORIES[name[:at]]
    file = D.file_name(name[at:])
    return None if file is None else f"{directory}/{file}"  # (an absolute path: ``_disk`` registers one)
