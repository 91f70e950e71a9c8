"""How far a writer lets the stream fill before it dumps (layout: "Stream size").

Why apart from ``writer.py``: the writer runs the protocol of one write;
this is only the arithmetic of LIMIT -- how much of the stream segment a
generation may use before its next dump, grown with the dict -- and the
reservation of the room behind it, which differs for a dict in shared memory
(raised once per dump) and one kept in files (reserved as it fills).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from .._platform import listing, segments
from ..errors import OutOfSpace
from . import layout as L
from .mapping import Mapping

__all__ = ["grow_stream", "reserve_again", "reserve_more"]

log = logging.getLogger("ultradict_ng")


class Growing(Protocol):
    """What of a writer the stream's size depends on."""

    durable: Any
    grows: bool
    name: str
    gen: int
    stream_size: int
    _map: Mapping

    def limit(self) -> int: ...


def reserve_more(w: Growing, needed: int) -> bool:
    """A dict kept in files reserves its growing stream as it fills, a granule
    at a time, up to ``STREAM_GROWTH`` times its dump (layout: "Stream size"):
    whether LIMIT now covers ``needed``.  False (the caller dumps) in shared
    memory, past the target, or when the disk is full."""
    if w.durable is None or not w.grows:
        return False
    granule = L.STREAM_GRANULE
    st = listing.entry_stat(L.dump_name(w.name, w.gen)) if w.gen else None
    target = -(-L.STREAM_GROWTH * (st.st_size if st is not None else 0) // granule) * granule
    wanted = min(max(target, L.DEFAULT_STREAM_SIZE), w.stream_size, -(-needed // granule) * granule)
    if needed > wanted or wanted <= w.limit():
        return False
    try:
        segments.reserve(L.stream_name(w.name), wanted)
    except (OutOfSpace, FileNotFoundError):
        return False
    w._map.atomic.store(L.W_STREAM_LIMIT, wanted)
    return True


def grow_stream(w: Growing, dump_size: int) -> None:
    """Raise LIMIT for a dump of ``dump_size`` bytes (layout: "Stream size");
    a dict kept in files reserves as it fills instead (``reserve_more``)."""
    if w.durable is not None:
        return
    granule = L.STREAM_GRANULE
    wanted = -(-L.STREAM_GROWTH * dump_size // granule) * granule
    wanted = min(wanted, w.stream_size)
    if wanted <= w.limit():
        return
    try:
        segments.reserve(L.stream_name(w.name), wanted)
    except (OutOfSpace, FileNotFoundError) as exc:
        log.info("shared dict %r: stream stays at %d bytes (%s)", w.name, w.limit(), exc)
        return
    w._map.atomic.store(L.W_STREAM_LIMIT, wanted)


def reserve_again(name: str, limit: int, end: int) -> int:
    """The LIMIT of a stream file mapped anew by a recovery, its first
    ``limit`` bytes allocated again.  A copy made by ``cp`` (sparse), or a
    stream cut short and extended, has holes there; a write through the
    mapping into a hole that a full disk has no block for is SIGBUS, not an
    error.  With no room for them: only the granules the records ``end``
    takes (the disk mostly has those), else none -- writes past that reserve
    as they fill (``reserve_more``) and fail with ``OutOfSpace``.  A
    filesystem that refuses the call itself keeps ``limit``, as before."""
    granule = L.STREAM_GRANULE
    for wanted in (limit, min(limit, -(-end // granule) * granule)):
        if wanted > 0:
            try:
                segments.reserve(name, wanted)
                return wanted
            except OutOfSpace:
                pass
            except OSError as exc:  # (not a full disk: nothing to learn here)
                log.info("ultradict_ng: %s: the stream's room not reserved again (%s)", name, exc)
                return limit
    return 0
