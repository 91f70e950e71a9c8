"""The change feed of a dict on Redis (``SharedDict.changes``).

A private reader with its own cache tree and sequence number: ``poll`` runs
``SYNC`` from its position and turns the records it gets into
:class:`~ultradict_ng.changes.Change` items before applying them; when it fell
behind the snapshot (the records it missed were trimmed) it gets the snapshot
instead and yields the difference, marked ``resync=True`` -- never a gap,
never a duplicate, as on shared memory.  ``wait`` sleeps in ``XREAD BLOCK``
on the log after its position, waking every ``WAIT_SLICE`` to notice a
removed dict (the feed then ends).
"""

from __future__ import annotations

import time
from typing import Any, Optional

from .._codec import records as R
from .._codec.codec import copy_value
from .._codec.placeholders import InlineArray
from ..changes import Change, changes_of_dump, changes_of_records, skeleton
from ..errors import Closed, CorruptSegment
from . import layout as RL
from .state import EngineState
from .transaction import entry_records

__all__ = ["RedisFeed"]


class RedisFeed:
    """``poll`` / ``wait`` / ``ended``: a ``changes.ChangeSource``."""

    def __init__(self, engine: EngineState) -> None:
        self._engine = engine
        with engine.mutex:
            self.data: dict[Any, Any] = skeleton(engine.data)
            self.known = engine.known
        self._ended = False

    def _check_open(self) -> None:
        if self._engine.closed:
            raise Closed(
                f"the handle of shared dict {self._engine.name!r} this feed reads through was closed"
            )

    def _export(self, value: Any) -> Any:
        if type(value) is InlineArray:
            return value.value()
        return copy_value(value, lambda stored: stored.value())

    def poll(self) -> list[Change]:
        self._check_open()
        if self._ended:
            return []
        engine = self._engine
        reply = engine.link.call("sync", [engine.epoch, self.known])
        if reply[0] == RL.GONE:
            self._ended = True
            return []
        delta = reply[1]
        seq = delta[0]
        out: list[Change] = []
        try:
            self._apply(delta, out)
        except R.Inconsistent as exc:
            raise CorruptSegment(
                f"shared dict {engine.name!r}: a record on Redis does not apply: {exc}"
            ) from None
        self.known = seq
        return out

    def _apply(self, delta: list[Any], out: list[Change]) -> None:
        engine = self._engine
        codec = engine.codec
        kind = delta[1]
        if kind == RL.ENTRIES:
            for rec in entry_records(codec, delta[2:]):
                changes_of_records(out, self._export, [rec])
                R.apply(self.data, rec)
        elif kind == RL.SNAPSHOT:
            tree = codec.loads(delta[3])
            if type(tree) is not dict:
                raise CorruptSegment(f"the snapshot of {engine.keys.snap} is not a dict")
            for rec in entry_records(codec, delta[4:]):
                R.apply(tree, rec)
            changes_of_dump(out, self._export, codec.dumps, self.data, tree)
            self.data = skeleton(tree)

    @property
    def ended(self) -> bool:
        self._check_open()
        return self._ended

    def wait(self, deadline: Optional[float]) -> bool:
        """Sleep until there may be more to poll (True) or ``deadline`` (False)."""
        self._check_open()
        engine = self._engine
        while True:
            left = RL.WAIT_SLICE if deadline is None else min(RL.WAIT_SLICE, deadline - time.monotonic())
            if left <= 0:
                return False
            if engine.link.xread(engine.keys.log, f"{self.known}-1", left, left + 5.0):
                return True
            got = engine.link.command("HGET", engine.keys.meta, "epoch")
            if got is None or got.decode() != engine.epoch:
                return True  # removed: the next poll ends the feed
