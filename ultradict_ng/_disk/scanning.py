"""The stream's scan: where its whole units of a generation end, and why.

Recovery (``_disk/layout.py``, "Opening and recovery", step 4c) and
``doctor`` read a stream file so; both must tell an ordinary end -- zeros,
an older generation's records past a checkpoint -- from damage that looks
like one (a zeroed page, a flipped bit in a record's generation word),
which loses the writes after it and must be reported.
"""

from __future__ import annotations

import os
import zlib
from typing import Any, NamedTuple, Optional

from .._shm import layout as L
from ..speedups import scan_stream
from . import files

__all__ = [
    "NORMAL_ENDS",
    "Scanned",
    "scan",
    "looked_past",
    "looked_past_file",
    "records_after",
    "whole_record",
]

#: Where a scan stops in a stream written to the end and synced: zeros (never
#: written), or an older generation's record (the stream restarted at a
#: checkpoint).  Any other stop is a torn or unfinished tail, worth a warning.
NORMAL_ENDS = ("", "zeros", "a record of another generation")


class Scanned(NamedTuple):
    """What a scan of the stream found: the end of the last whole unit, the
    whole units before it, and why the scan stopped there ("" at the file's end)."""

    end: int
    units: int
    stopped: str


def scan(buf: Any, generation: int) -> Scanned:
    """Step 4c: the records of ``generation`` from offset 0 that form whole units.

    One compiled pass (``speedups.scan_stream``; its twin is the same loop in
    Python): a full stream holds a million records or more, which a Python
    loop takes seconds to check."""
    return Scanned(*scan_stream(buf, generation & L.GEN_MASK))


#: How far past a scan's stop :func:`records_after` looks for records of the generation.
_LOOK_AFTER = 64 << 10


def looked_past(buf: Any, scanned: Scanned, generation: int) -> Scanned:
    """``scanned``, with why it stopped told anew when it stopped as at the
    stream's end but :func:`records_after` finds a record past it, or the
    record it stopped at is one of the generation whose tag alone is damaged
    (recovery and ``doctor`` report it then)."""
    stopped = scanned.stopped
    if stopped == NORMAL_ENDS[2] and whole_record(buf, scanned.end, generation) >= 0:  # (even the last one)
        stopped = "a record of this generation whose generation word is damaged"
    after = records_after(buf, scanned.end, generation) if scanned.stopped in NORMAL_ENDS else -1
    if after >= 0:
        stopped = f"{stopped or 'the end'}, then records from byte {after}"
    return scanned if stopped == scanned.stopped else scanned._replace(stopped=stopped)


def looked_past_file(buf: Any, scanned: Scanned, generation: int, path: str) -> Scanned:
    """:func:`looked_past` of the stream file ``path`` (mapped as ``buf``),
    read past the scan's stop with ``pread`` (``files.FileBytes``)."""
    if scanned.stopped not in NORMAL_ENDS:
        return scanned
    fd = files.open_rw(path, writable=False)
    try:
        return looked_past(files.FileBytes(fd), scanned, generation)
    finally:
        os.close(fd)


def records_after(buf: Any, end: int, generation: int) -> int:
    """The offset of a whole record of ``generation`` within ``_LOOK_AFTER``
    bytes past ``end`` (-1: none), where a scan stopped at what looks like
    the stream's end -- zeros, or a record of another generation.

    Why: a stream ends so after a clean write or a checkpoint, and also
    where damage in its middle looks the same (a page zeroed, a flipped bit
    in a record's generation word): the scan then keeps the prefix, as it
    must, but the records after it are lost and the loss must be logged, not
    taken for the end.  A whole record of the generation right after the
    stop is what tells them apart (one of another generation, or bytes that
    only carry the tag, fail its crc)."""
    tag = (generation & L.GEN_MASK).to_bytes(4, "little")
    chunk = bytes(buf[end : min(len(buf), end + _LOOK_AFTER)])
    at = chunk.find(tag, 4)
    while at >= 0:
        off = end + at - 4
        if whole_record(buf, off) == generation & L.GEN_MASK:
            return off
        at = chunk.find(tag, at + 1)
    return -1


def whole_record(buf: Any, off: int, generation: Optional[int] = None) -> int:
    """The generation tag of the record at ``off`` if it is whole (its length
    fits, its crc holds), else -1; or, given ``generation``, whether it is
    whole as a record of that generation whatever its tag says (one whose
    tag alone was damaged: its crc covers the tag it was written with)."""
    header = bytes(buf[off : off + L.RECORD_HEADER])
    if len(header) < L.RECORD_HEADER:
        return -1
    length = int.from_bytes(header[:4], "little")
    if not 0 < length <= len(buf) - off - L.RECORD_HEADER:
        return -1
    if generation is not None:
        header = header[:4] + (generation & L.GEN_MASK).to_bytes(4, "little") + header[8:]
    body = buf[off + L.RECORD_HEADER : off + L.RECORD_HEADER + length]
    if zlib.crc32(body, zlib.crc32(header[:8])) != int.from_bytes(header[8:12], "little"):
        return -1
    return int.from_bytes(header[4:8], "little")
