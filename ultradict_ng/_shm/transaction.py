"""An open transaction's state (layout: "Transactions"), kept by the writer.

Why apart: the writer (``writer.py``) runs the protocol; this is only what a
transaction's end needs to know -- where its records begin, who opened it,
how deep it is nested, whether it must end with a dump or publish nothing,
and the blobs its writes made and dropped.
"""

from __future__ import annotations

import struct
from threading import get_ident
from typing import Any

from .._codec.placeholders import BlobRef
from . import layout as L

__all__ = ["Transaction", "mark_last", "unwrite"]

_length = struct.Struct("<I")


class Transaction:
    """An open ``transaction()`` of one handle (layout: "Transactions"): what
    its end publishes, or discards."""

    __slots__ = ("start", "last", "thread", "depth", "dump", "doomed", "broken", "created", "dropped")

    def __init__(self, start: int) -> None:
        #: The stream end when it began: its records lie in ``start .. pos``.
        self.start = start
        #: Where the last record the Python path wrote begins (-1: none).
        self.last = -1
        #: The thread that opened it and holds the lock for it.
        self.thread = get_ident()
        #: Levels of nested ``transaction()`` blocks inside the outermost.
        self.depth = 0
        #: The records no longer fit in the stream: its end publishes a dump.
        self.dump = False
        #: A nested level ended with an exception: its end publishes nothing.
        self.doomed = False
        #: The cache may lack one of its writes: its end publishes nothing.
        self.broken = False
        #: Blobs its writes made (unlinked if it publishes nothing) ...
        self.created: list[BlobRef] = []
        #: ... and blobs they dropped (unlinked only once it is published).
        self.dropped: list[BlobRef] = []


def mark_last(stream: Any, last: int, end: int) -> None:
    """Set the last-record bit in the unit word of the record at ``last``, which
    must end at ``end`` (layout: "Stream record"): the last record a
    transaction wrote, marked before the STATE store that publishes them, so
    that files (``_disk``) never hold its end marked while a record of it is
    missing.  ``stream``: the stream's bytes, writable."""
    if last < 0 or last + L.RECORD_HEADER + _length.unpack_from(stream, last)[0] != end:
        # (the records are this process's own, under the lock: a bug, not damage)
        raise AssertionError(f"the transaction's last record is not at {last}, ending at {end}")
    unit = _length.unpack_from(stream, last + 12)[0]
    _length.pack_into(stream, last + 12, unit | L.UNIT_LAST)


def unwrite(stream: Any, start: int, end: int) -> None:
    """Zero ``stream[start:end]``, the records of a transaction that published
    nothing.  No reader looks past the published end, but a recovery of a dict
    kept in files scans the whole stream file: left there, a later write's
    record would be followed by the rest of them, which the scan stops at and
    warns of as a torn tail after every crash -- for a rollback, the normal
    end of a ``transaction()`` block that raised."""
    if stream is not None and start < end:
        stream[start:end] = bytes(end - start)
