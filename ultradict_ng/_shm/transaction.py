"""An open transaction's state (layout: "Transactions"), kept by the writer.

Why apart: the writer (``writer.py``) runs the protocol; this is only what a
transaction's end needs to know -- where its records begin, who opened it,
how deep it is nested, whether it must end with a dump or publish nothing,
and the blobs its writes made and dropped.
"""

from __future__ import annotations

from threading import get_ident

from .._codec.placeholders import BlobRef

__all__ = ["Transaction"]


class Transaction:
    """An open ``transaction()`` of one handle (layout: "Transactions"): what
    its end publishes, or discards."""

    __slots__ = ("start", "thread", "depth", "dump", "doomed", "broken", "created", "dropped")

    def __init__(self, start: int) -> None:
        #: The stream end when it began: its records lie in ``start .. pos``.
        self.start = start
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
