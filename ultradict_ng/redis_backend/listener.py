"""The cached read mode's listener (layout: "Reading", ``reads="cached"``).

One daemon thread per engine keeps ``XREAD BLOCK`` open on the dict's log,
pipelined after an ``HGET`` of the epoch, and hands the entries it receives to
the cache through ``pending``; the engine's counter is bumped so that the
next read applies them (``drain``) without a round trip.  The request is
re-sent at least every ``staleness / 2`` seconds and its reply must come
within ``staleness``: when it does not (server gone, connection cut or
stalled) the cache is marked unvouched and reads run ``SYNC`` themselves --
so a cached read never serves a state that nobody confirmed within
``staleness`` seconds.
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Deque, Optional, Tuple

from .. import record as R
from ..errors import BackendUnavailable

if TYPE_CHECKING:
    from .engine import RedisEngine

__all__ = ["Listener"]


class Listener:
    """Feeds one engine's cache from the server's log."""

    def __init__(self, engine: "RedisEngine") -> None:
        self._engine = weakref.ref(engine)
        self.link = engine.link
        self.keys = engine.keys
        self.epoch = engine.epoch.encode()
        self.staleness = engine.staleness
        self.pending: Deque[Tuple[int, bytes]] = collections.deque()
        #: the last request was answered in time (and the dict still exists)
        self.vouched = False
        self.gone = False
        self._after = f"{max(engine.known, 0)}-1"
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"ultradict_ng-listener-{self.keys.meta}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def drain(self, engine: "RedisEngine") -> bool:
        """Apply pending entries (caller holds the mutex); False on a gap."""
        pending = self.pending
        codec = engine.codec
        while pending:
            seq, payload = pending.popleft()
            if seq <= engine.known:
                continue  # our own write, or already synced
            if seq != engine.known + 1:
                pending.clear()
                return False
            try:
                R.apply(engine.data, codec.loads(payload))
            except BaseException:  # (a corrupt entry: SYNC reports it)
                engine.known = -1
                engine.stale = True
                pending.clear()
                return False
            engine.known = seq
        return not self.gone

    def _unvouch(self) -> None:
        self.vouched = False
        engine = self._engine()
        if engine is not None:
            engine.bump()

    def _run(self) -> None:
        backoff = 0.05
        half = self.staleness / 2
        while not self._stop.is_set():
            engine = self._engine()
            if engine is None or engine.closed:
                return
            del engine
            try:
                with self.link.blocking(self.staleness) as conn:
                    conn.send_packed_command(conn.pack_commands([
                        ("HGET", self.keys.meta, "epoch"),
                        ("XREAD", "COUNT", 10000, "BLOCK", max(1, int(half * 1000)),
                         "STREAMS", self.keys.log, self._after),
                    ]), check_health=False)
                    epoch = conn.read_response()
                    reply = conn.read_response()
            except Exception:
                # BackendUnavailable, redis errors, a closed link: nobody vouches now.
                self._unvouch()
                if self.link.closed:
                    return
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            backoff = 0.05
            if epoch != self.epoch:
                self.gone = True
                self._unvouch()
                self._stop.wait(half)
                continue
            if reply:
                for entry_id, fields in reply[0][1]:
                    seq = int(entry_id.split(b"-", 1)[0])
                    payload = fields[1] if len(fields) > 1 else b""
                    self.pending.append((seq, payload))
                    self._after = entry_id.decode()
                self.vouched = True
                engine = self._engine()
                if engine is not None:
                    engine.bump()
                del engine
            else:
                self.vouched = True


_ = (time, BackendUnavailable)  # (re-exported names kept for readers of this module)
