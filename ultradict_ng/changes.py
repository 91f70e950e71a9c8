"""Knowing when the dict changed: waiting for a change, and the change feed.

Waiting follows layout: "Waiting and waking" (change channel): the condition
is "STATE differs from the state my cache reflects", checked against the
monotonic change counter itself, never a flag -- so a write that lands
between a handle's last read and its call to wait is seen at once.

The feed (layout: "Waiting and waking", last paragraph) is a private reader:
a :class:`Feed` has its own cache and position in the update stream, starts
where the handle that made it stands, and turns every record it replays into
:class:`Change` items before applying it.  When the writers have moved past a
full dump it has not read, the records it missed are gone; it yields the
difference between its cache and that dump instead, each item marked
``resync=True``.  It never writes and never takes the lock except in the
reader's last-resort step.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

from . import layout as L
from ._shm.blobs import BlobGone, BlobRef, InlineArray
from ._codec.codec import copy_value
from .errors import Closed
from ._shm.reader import INVALID, Reader
from ._shm.waiting import Backoff, ProcessWaits
from .speedups import Words

__all__ = ["Change", "SUPERSEDED", "wait_until_changed", "Feed", "iterate", "changes_of_records",
           "changes_of_dump", "skeleton"]

_W_STATE, _W_STATUS, _UNLINKED = L.W_STATE, L.W_STATUS, L.STATUS_UNLINKED
_W_CHANGE_WAITERS, _W_CHANGE_SEQ = L.W_CHANGE_WAITERS, L.W_CHANGE_SEQ


class _Superseded:
    """The value of a change to a large value that a later write has already
    replaced and removed from shared memory (its bytes are gone)."""

    _instance: Optional["_Superseded"] = None

    def __new__(cls) -> "_Superseded":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "SUPERSEDED"

    def __reduce__(self) -> str:
        return "SUPERSEDED"


SUPERSEDED: Any = _Superseded()


class Change(NamedTuple):
    """One mutation, as the change feed reports it.

    ``op`` is ``"set"``, ``"delete"`` or ``"clear"``; ``path`` the keys from
    the root to the nested dict it happened in (``()`` for the root); ``key``
    the key (None for a clear); ``value`` the new value for a set (None
    otherwise): a private copy (nested dicts as plain dicts), arrays
    zero-copy, or :data:`SUPERSEDED` for a large value a later write already
    removed.  ``resync`` is True for the items of a catch-up: the feed fell
    behind a full dump, and these are the difference between what it had and
    that dump, instead of the mutations it missed.
    """

    op: str
    path: Tuple[Any, ...]
    key: Any
    value: Any = None
    resync: bool = False


def wait_until_changed(atomic: Words, words: Any, waits: ProcessWaits, seen: Callable[[], int],
                       deadline: Optional[float]) -> bool:
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


def skeleton(node: Dict[Any, Any]) -> Dict[Any, Any]:
    """A copy of a cache tree's dicts, sharing its leaves.  Enough for a
    private cache: replaying records replaces leaves and mutates only dicts."""
    out: Dict[Any, Any] = {}
    stack: List[Tuple[Dict[Any, Any], Dict[Any, Any]]] = [(node, out)]
    while stack:
        src, dst = stack.pop()
        for k, v in src.items():
            if type(v) is dict:
                child: Dict[Any, Any] = {}
                dst[k] = child
                stack.append((v, child))
            else:
                dst[k] = v
    return out


def _same(a: Any, b: Any, dumps: Callable[[Any], bytes]) -> bool:
    """Whether a resync may skip ``b`` replacing ``a``: the same bytes under the
    dict's serializer.  Not ``==``: ``[1]`` and ``[True]``, ``0.0`` and ``-0.0``
    are equal but not the same value, and a NaN or an array is not equal to itself."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return dumps(a) == dumps(b)
    except Exception:  # (cannot tell: report it)
        return False


class Feed(Reader):
    """A private reader of one dict that records what it replays (module docstring)."""

    __slots__ = ("out", "waits", "_materialize", "_mark", "_owner")

    _feeding = True

    def __init__(self, store: Any) -> None:
        self._map = store._map
        self.words = store.words
        self.name = store.name
        self.codec = store.codec
        self.stream_size = store.stream_size
        self.lock = store.lock
        self.waits = store.waits
        self._materialize = store.materialize
        self._owner = store  # (its mapping is ours too: the feed keeps it open)
        self.mutex = threading.RLock()
        self.out: List[Change] = []
        self._mark = 0
        with store.mutex:
            self.data = skeleton(store.data)
            self.gen, self.pos, self.seen = store.gen, store.pos, store.seen
        if self.gen == INVALID:
            self.data = {}

    def _check_open(self) -> None:
        if self._owner.closed:
            raise Closed(f"the handle of shared dict {self.name!r} this feed reads through was closed")

    def poll(self) -> List[Change]:
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
                return self._materialize(value)
            return copy_value(value, self._materialize)
        except BlobGone:
            return SUPERSEDED

    def _feed_records(self, records: List[Any]) -> None:
        """Before ``records`` are applied: their changes, values copied now
        (a later record of the same batch may change a nested dict in place)."""
        self._mark = len(self.out)
        changes_of_records(self.out, self._export, records)

    def _feed_undo(self) -> None:
        del self.out[self._mark:]

    def _feed_dump(self, new: Dict[Any, Any]) -> None:
        """Before the cache is replaced by a dump: the difference, as resync changes."""
        changes_of_dump(self.out, self._export, self.codec.dumps, self.data, new)


def changes_of_records(out: List[Change], export: Callable[[Any], Any], records: List[Any]) -> None:
    """Append the changes ``records`` make (before they are applied: a later
    record of the batch may change a nested dict in place)."""
    for rec in records:
        op, path = rec[0], tuple(rec[1])
        if op == L.OP_SET:
            out.append(Change("set", path, rec[2], export(rec[3])))
        elif op == L.OP_DEL:
            out.append(Change("delete", path, rec[2]))
        elif op == L.OP_CLEAR:
            out.append(Change("clear", path, None))
        elif op == L.OP_UPDATE:
            out.extend(Change("set", path, k, export(v)) for k, v in rec[2])


def changes_of_dump(out: List[Change], export: Callable[[Any], Any], dumps: Callable[[Any], bytes],
                    old: Dict[Any, Any], new: Dict[Any, Any]) -> None:
    """Append the difference from tree ``old`` to tree ``new``, as resync changes."""
    stack: List[Tuple[Tuple[Any, ...], Dict[Any, Any], Dict[Any, Any]]] = [((), old, new)]
    while stack:
        path, old_node, new_node = stack.pop()
        for k in old_node:
            if k not in new_node:
                out.append(Change("delete", path, k, None, True))
        for k, v in new_node.items():
            if k in old_node:
                ov = old_node[k]
                if type(ov) is dict and type(v) is dict:
                    stack.append((path + (k,), ov, v))
                    continue
                if _same(ov, v, dumps):
                    continue
            out.append(Change("set", path, k, export(v), True))


def iterate(feed: Feed, timeout: Optional[float]) -> Iterator[Change]:
    """``SharedDict.changes``: the feed's changes as they come; ends when none
    arrives for ``timeout`` seconds (None: never) or the dict is unlinked."""
    while True:
        batch = feed.poll()
        if batch:
            yield from batch
            continue
        if feed.ended:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        if not feed.wait(deadline):
            return
