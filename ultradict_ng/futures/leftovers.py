"""Pool parcels seen from outside: which are live, which a crash left behind.

A pool removes its own parcels, even after a worker was killed (layout: "Pool
parcels").  What only a crash of the pool's *own* process can leave is a
parcel whose owner is dead; nothing will ever take it, so removing it is
always safe -- a process that still maps it keeps its mapping, and a parcel
is never opened by name twice.  That is what :func:`remove_leftovers` (and
``ultradict-ng clean``) removes, and nothing else: a live pool's parcels
are never touched, nor a file that only looks like a parcel by its name.
"""

from __future__ import annotations

import struct
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from .._platform.listing import listed, read_entry
from .._platform.owner import owner_alive, pid_of
from .._platform.segments import unlink
from . import layout as PL

__all__ = ["ParcelReport", "parcels", "remove_leftovers"]

_header = struct.Struct(PL.PARCEL_FORMAT)


@dataclass
class ParcelReport:
    """One parcel: its ``status`` is ``live`` (the pool's process is alive),
    ``creating`` (header not written yet, made less than ``PARCEL_STALE`` ago),
    ``abandoned`` (owner dead, or header never written: removable) or
    ``foreign`` (a name like a parcel's, content not ours: never touched)."""

    name: str
    bytes: int
    status: str
    owner_pid: int = 0
    maker_pid: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _report(name: str, now: float) -> ParcelReport | None:
    try:
        st, head = read_entry(name, _header.size)  # (a FIFO or a symlink is not read through)
    except FileNotFoundError:
        return None  # taken meanwhile
    if st is None:
        return ParcelReport(name, 0, "foreign")
    used = getattr(st, "st_blocks", 0) * 512 or st.st_size
    # A maker's parcel is empty (before its ftruncate) or at least a header
    # long; only then can a zero header be one that was never written.
    if st.st_size == 0 or (st.st_size >= PL.PARCEL_HEADER and head == bytes(_header.size)):
        young = now - st.st_mtime < PL.PARCEL_STALE
        return ParcelReport(name, used, "creating" if young else "abandoned")
    if len(head) < _header.size:
        return ParcelReport(name, used, "foreign")
    magic, owner, maker, _ = _header.unpack(head)
    if magic != PL.PARCEL_MAGIC:
        return ParcelReport(name, used, "foreign")
    status = "live" if owner_alive(owner) else "abandoned"
    return ParcelReport(name, used, status, pid_of(owner), pid_of(maker))


def parcels() -> list[ParcelReport]:
    """Every pool parcel on this machine (empty where ``/dev/shm`` cannot be listed)."""
    now = time.time()
    found = (_report(n, now) for n in sorted(listed(PL.POOL_PREFIX)))
    return [r for r in found if r is not None]


def remove_leftovers(
    dry_run: bool = False, chosen: Optional[Callable[[str], bool]] = None
) -> list[ParcelReport]:
    """Remove the parcels of pools whose process died (see the module
    docstring) and return them; ``dry_run`` only lists them, ``chosen`` (a
    test on the name) narrows them.

    The documented one-liner after a crash::

        python -c "import ultradict_ng.futures as f; f.remove_leftovers()"
    """
    gone = [r for r in parcels() if r.status == "abandoned" and (chosen is None or chosen(r.name))]
    if not dry_run:
        gone = [r for r in gone if unlink(r.name)]
    return gone
