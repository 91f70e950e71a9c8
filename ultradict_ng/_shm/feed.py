"""Knowing when a shared-memory dict changed: waiting for a change, and the change feed.

Waiting follows layout: "Waiting and waking" (change channel): the condition
is "STATE differs from the state my cache reflects", checked against the
monotonic change counter itself, never a flag -- so a write that lands
between a handle's last read and its call to wait is seen at once.

The feed (layout: "Waiting and waking", last paragraph) is a private reader:
a :class:`Feed` has its own cache and position in the update stream, starts
where the handle that made it stands, and turns every record it replays into
:class:`~ultradict_ng.Change` items before applying it.  When the writers have
moved past a full dump it has not read, the records it missed are gone; it
yields the difference between its cache and that dump instead, each item
marked ``resync=True``.  It never writes and never takes the lock except in
the reader's last-resort step.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from .._codec.codec import copy_value
from .._codec.placeholders import BlobRef, InlineArray
from .._engine import BlobGone
from .._platform.directories import shown
from ..changes import SUPERSEDED, Change, changes_of_dump, changes_of_records, skeleton
from ..errors import Closed
from ..speedups import Words
from . import layout as L
from .reader import INVALID, Reader
from .waiting import Backoff, ProcessWaits

__all__ = ["wait_until_changed", "Feed"]

_W_STATE, _W_STATUS, _UNLINKED = L.W_STATE, L.W_STATUS, L.STATUS_UNLINKED
_W_CHANGE_WAITERS, _W_CHANGE_SEQ = L.W_CHANGE_WAITERS, L.W_CHANGE_SEQ


def wait_until_changed(
    atomic: Words, words: Any, waits: ProcessWaits, seen: Callable[[], int], deadline: Optional[float]
) -> bool:
    """Sleep until STATE != ``seen()`` or the dict is unlinked (True), or until
    ``deadline`` (time.monotonic; None: no limit) passes (False).

    Waiter steps 1-4 of layout "Waiting and waking", change channel."""
    if words[_W_STATE] != seen() or words[_W_STATUS] & _UNLINKED:
        return True
    registered = waits.enter(atomic, _W_CHANGE_WAITERS)
    backoff = None if registered else Backoff()
    try:
        while True:
            seq = atomic.load(_W_CHANGE_SEQ) if registered else 0
            if atomic.load(_W_STATE) != seen() or words[_W_STATUS] & _UNLINKED:
                return True
            limit = None
            if deadline is not None:
                limit = deadline - time.monotonic()
                if limit <= 0:
                    return False
            if backoff is None:
                atomic.wait(_W_CHANGE_SEQ, seq, L.WAIT_SLICE if limit is None else min(limit, L.WAIT_SLICE))
            else:
                backoff.sleep(limit)
    finally:
        if registered:
            waits.exit(atomic, _W_CHANGE_WAITERS)


class Feed(Reader):
    """A private reader of one dict that records what it replays (module docstring)."""

    __slots__ = ("out", "waits", "_materialize", "_mark", "_owner")

    _feeding = True
    _partial = False

    def __init__(self, store: Any) -> None:
        self._map = store._map
        self.words = store.words
        self.name = store.name
        self.token = store.token
        self.codec = store.codec
        self.stream_size = store.stream_size
        self.lock = store.lock
        self.waits = store.waits
        self._materialize = store.materialize
        self._owner = store  # (its mapping is ours too: the feed keeps it open)
        self.mutex = threading.RLock()
        self.out: list[Change] = []
        self._mark = 0
        in_block = getattr(store, "tx", None) is not None  # (a Peek of the command line has none)
        with store.mutex:
            if in_block:  # (below)
                self.gen, self.pos, self.seen = INVALID, 0, INVALID
            else:
                data = store.data  # (a TableCache: the whole tree, decoded once)
                self.data = skeleton(data if type(data) is dict else data.full())
                self.gen, self.pos, self.seen = store.gen, store.pos, store.seen
        if self.gen == INVALID:
            self.data = {}
        if in_block:
            # Made inside an open transaction of its handle: that cache and
            # position hold the block's unpublished writes, which the feed
            # must report when they are published (and never, if discarded).
            # It starts from the published state instead, read silently.
            self.sync()
            del self.out[:]

    def _check_open(self) -> None:
        if self._owner.closed:
            raise Closed(f"the handle of shared dict {shown(self.name)!r} this feed reads through was closed")

    def poll(self) -> list[Change]:
        """The changes published since the last call (or since the feed's
        start), oldest first; empty if there are none now.  Never blocks."""
        self._check_open()
        if self.words[_W_STATE] != self.seen:
            self.sync()
        out, self.out = self.out, []
        return out

    @property
    def ended(self) -> bool:
        """The dict was unlinked and every change before that was reported."""
        self._check_open()
        return bool(self.words[_W_STATUS] & _UNLINKED) and self.words[_W_STATE] == self.seen

    def wait(self, deadline: Optional[float]) -> bool:
        """Sleep until there may be more to poll (True) or ``deadline`` (False)."""
        self._check_open()
        return wait_until_changed(self._map.atomic, self.words, self.waits, lambda: self.seen, deadline)

    # -- hooks called by Reader._refresh ----------------------------------------------

    def _export(self, value: Any) -> Any:
        try:
            if type(value) is BlobRef or type(value) is InlineArray:
                return self._materialize(value, self.seen)
            return copy_value(value, lambda stored: self._materialize(stored, self.seen))
        except BlobGone:
            return SUPERSEDED

    def _feed_records(self, records: list[Any]) -> None:
        """Before ``records`` are applied: their changes, values copied now
        (a later record of the same batch may change a nested dict in place)."""
        self._mark = len(self.out)
        changes_of_records(self.out, self._export, records)

    def _feed_undo(self) -> None:
        del self.out[self._mark :]

    def _feed_dump(self, new: dict[Any, Any]) -> None:
        """Before the cache is replaced by a dump: the difference, as resync changes."""
        changes_of_dump(self.out, self._export, self.codec.dumps, self.data, new)
