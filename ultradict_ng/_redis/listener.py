"""The cached read mode's listener (layout: "Reading", ``reads="cached"``).

One daemon thread per engine keeps ``XREAD BLOCK`` open on the dict's log
(after an ``HGET`` of the epoch whenever the last block was idle) and hands
the entries it receives to the cache through ``pending``; the engine's counter is bumped so that the
next read applies them (``drain``) without a round trip.  The request is
re-sent at least every ``staleness / 2`` seconds and its reply must come
within ``staleness`` (layout: "Reading"): when it does not (server gone, connection cut or
stalled) the cache is marked unvouched and reads run ``SYNC`` themselves --
so a cached read never serves a state that nobody confirmed within
``staleness`` seconds.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Optional

from .._codec import records as R
from .state import EngineState
from .transaction import entry_records

__all__ = ["Listener"]


class Listener:
    """Feeds one engine's cache from the server's log."""

    def __init__(self, engine: EngineState) -> None:
        self._engine = weakref.ref(engine)
        self.link = engine.link
        self.keys = engine.keys
        self.epoch = engine.epoch.encode()
        self.staleness = engine.staleness
        self.pending: collections.deque[tuple[int, bytes]] = collections.deque()
        #: the last request was answered in time (and the dict still exists)
        self.vouched = False
        self._after = f"{max(engine.known, 0)}-1"
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"ultradict_ng-listener-{self.keys.meta}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def drain(self, engine: EngineState) -> bool:
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
                for rec in entry_records(codec, [payload]):
                    R.apply(engine.data, rec)
            except BaseException:  # (a corrupt entry: SYNC reports it)
                engine.known = -1
                engine.stale = True
                pending.clear()
                return False
            engine.known = seq
        return True

    def _unvouch(self) -> None:
        self.vouched = False
        engine = self._engine()
        if engine is not None:
            engine.bump()

    def _run(self) -> None:
        backoff = 0.05
        # A timed-out block may come back up to 100 ms late (redis-server's
        # default hz 10): leave that much of the bound for it.
        block = max(0.001, min(self.staleness / 2, self.staleness - 0.12))
        check_epoch = True
        while not self._stop.is_set():
            engine = self._engine()
            if engine is None or engine.closed:
                return
            del engine
            try:
                with self.link.blocking(self.staleness) as conn:
                    if check_epoch:  # (only after an idle period: entries carry the epoch)
                        conn.send_command("HGET", self.keys.meta, "epoch", check_health=False)
                        if conn.read_response() != self.epoch:
                            self._unvouch()
                            self._stop.wait(block)
                            continue
                        check_epoch = False
                    conn.send_command(
                        "XREAD",
                        "COUNT",
                        10000,
                        "BLOCK",
                        max(1, int(block * 1000)),
                        "STREAMS",
                        self.keys.log,
                        self._after,
                        check_health=False,
                    )
                    reply = conn.read_response()
            except Exception:
                # BackendUnavailable, redis errors, a closed link: nobody vouches now.
                self._unvouch()
                check_epoch = True
                if self.link.closed:
                    return
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            backoff = 0.05
            if not reply:
                self.vouched = True  # nothing new while we waited
                check_epoch = True
                continue
            foreign = False
            for entry_id, fields in reply[0][1]:
                if not fields or fields[0] != self.epoch:
                    foreign = True  # another epoch's entry (or garbage): SYNC decides
                    break
                self.pending.append((int(entry_id.split(b"-", 1)[0]), fields[1]))
                self._after = entry_id.decode()
            if foreign:
                self._unvouch()
                check_epoch = True
                self._stop.wait(block)
                continue
            self.vouched = True
            engine = self._engine()
            if engine is not None:
                engine.bump()
            del engine
