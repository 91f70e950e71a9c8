"""The shared part of a dict's lock on Redis: a lease with a fencing token
(layout: "Lock").

:class:`LeaseLock` is the Redis backend of the lock front end
(:class:`ultradict_ng._platform.lock.SharedLock`, which owns reentrancy, threads,
timeouts and the context managers).  Here is only what the lease needs: the
server holds ``"<token>|<holder>"`` with an expiry, a keeper thread renews
every held lease, and the server refuses writes that carry a token that is
no longer the lock's -- a holder that stalled past its lease cannot write
afterwards.  Waiters sleep in ``XREAD BLOCK`` on the release stream, so a
release wakes them at once and a dead holder's lease is taken over when it
expires.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
import weakref
from typing import Any, Optional

from .._platform import faults
from .._platform.lock import SharedLock
from ..errors import BackendUnavailable, LeaseLost, Unlinked
from . import layout as RL
from .identity import HOST, pid_of_holder
from .state import EngineState

__all__ = ["LeaseLock"]

log = logging.getLogger("ultradict_ng")
_get_ident = threading.get_ident


class LeaseLock(SharedLock):
    """Cross-process (and cross-host), reentrant, thread-safe lease lock of one
    dict tree; per handle (two handles of one dict in a process are two
    clients of the server)."""

    __slots__ = ("_engine", "_value", "_valid_until", "lease", "_lost", "_keeper", "__weakref__")

    _MESSAGE = "could not acquire the lock of shared dict {name!r} within {timeout} s: {holder}"

    def __init__(self, engine: EngineState, lease: float) -> None:
        super().__init__(engine.name)
        self._engine = engine
        self._value = ""  # the lock's value while we hold it: our fencing token
        self._valid_until = 0.0
        self.lease = lease
        self._lost = False
        self._keeper = _Keeper()

    def __repr__(self) -> str:
        return f"<LeaseLock of {self._name!r} (lease {self.lease} s)>"

    def take_over(self) -> None:
        raise NotImplementedError("the Redis lock cannot be stolen: its lease expires instead")

    # -- the front end's hooks -------------------------------------------------------

    def _take(self, blocking: bool, deadline: Optional[float], timeout: Optional[float]) -> bool:
        """``ACQUIRE`` until granted: it answers the lock and a current cache in
        one round trip, or ``LOCKED`` with what to wait for (``wait_release``)."""
        engine = self._engine
        holder = f"{HOST}:{os.getpid()}:{secrets.token_hex(4)}"
        lease_ms = max(1, int(self.lease * 1000))
        while True:
            with engine.mutex:
                sent = time.monotonic()
                reply = engine.link.call("acquire", [engine.epoch, engine.known, holder, lease_ms])
                code = reply[0]
                if code == RL.OK:
                    self._value = reply[1].decode()
                    self._lost = False
                    self.renewed(sent)
                    engine.apply_delta(reply[2])
                    self._keeper.add(self)
                    if faults.armed is not None:
                        faults.hit("redis-lease-taken")
                    return True
            if code == RL.GONE:
                engine.raise_gone()
            if code != RL.LOCKED:
                raise BackendUnavailable(f"unexpected ACQUIRE answer {reply!r}")
            if not blocking:
                return False
            if deadline is not None and time.monotonic() >= deadline:
                value = engine.link.command("GET", engine.keys.lock)
                raise self._timeout_error(
                    timeout,
                    f"held by {value.decode() if value else 'nobody now'}",
                    pid_of_holder(value.decode()) if value else None,
                )
            self.wait_release(reply[2], reply[1], deadline)

    def _try_take(self, recover: bool) -> bool:
        return self._take(False, None, None)  # (a dead holder's lease expires on the server)

    def _give(self) -> None:
        value, lost = self._value, self._lost
        self._keeper.forget(self)
        self._value = ""
        self._valid_until = 0.0
        reply = self._engine.link.call("release", [self._engine.epoch, value, RL.LOCKEV_MAX])
        if reply[0] == RL.FENCED or lost:
            raise LeaseLost(
                f"the lease on the lock of shared dict {self._name!r} expired while this thread held "
                f"it (lease {self.lease} s): another client may have held the lock meanwhile"
            )

    def _wait_free(self, timeout: float) -> bool:
        """The last release event, then the lock's expiry, then ``XREAD BLOCK``
        after that event: a release after the first read wakes us at once."""
        engine = self._engine
        link, keys = engine.link, engine.keys
        start = time.monotonic()
        last = link.command("XREVRANGE", keys.lockev, "+", "-", "COUNT", 1)
        pttl = int(link.command("PTTL", keys.lock))
        if pttl == -2:  # no lock key: free (or the dict is gone, which the next attempt reports)
            return True
        last_id = last[0][0] if last else b"0-0"
        if self.wait_release(last_id, pttl, start + timeout):
            return True
        return pttl >= 0 and time.monotonic() >= start + pttl / 1000  # its lease ran out meanwhile

    def _holder(self) -> tuple[Optional[str], Optional[int]]:
        return None, None  # (another thread of ours holds our side of it)

    def _holder_pid(self) -> Optional[int]:
        value = self._engine.link.command("GET", self._engine.keys.lock)
        return pid_of_holder(value.decode()) if value else None

    # -- for the engine --------------------------------------------------------------------

    def token_of_this_thread(self) -> str:
        """The fencing token to send with a write: ours if this thread holds the lease."""
        return self._value if self.held() else ""

    def vouches(self) -> bool:
        """This process holds the lease with local time left: no other client can publish."""
        return self._state.owner is not None and not self._lost and time.monotonic() < self._valid_until

    def fenced(self) -> None:
        """The server refused our token: the lease is gone."""
        self._lost = True
        self._valid_until = 0.0

    def renewed(self, sent: float) -> None:
        self._valid_until = sent + self.lease * RL.LEASE_SAFETY

    def wait_release(self, last: Any, pttl: int, deadline: Optional[float]) -> bool:
        """Sleep until the lock is released (an entry after ``last`` on the
        release stream: True), its lease runs out (``pttl`` ms; -1: no
        expiry), or ``deadline``.  A dead holder's lease ends within ``lease``."""
        wait = RL.WAIT_SLICE if pttl is None or pttl < 0 else min(RL.WAIT_SLICE, pttl / 1000 + 0.002)
        if deadline is not None:
            wait = min(wait, deadline - time.monotonic())
        if wait <= 0:
            return False
        last_id = last.decode() if isinstance(last, bytes) else str(last)
        return bool(self._engine.link.xread(self._engine.keys.lockev, last_id, wait, wait + 5.0))

    def forget(self) -> None:
        """Stop renewing (the lease expires on the server)."""
        self._keeper.forget(self)

    def drop(self) -> None:
        """The handle closed while this process held the lock: give the lease
        back now rather than make everybody wait for it to expire."""
        self._keeper.forget(self)
        value, self._value = self._value, ""
        state = self._state
        state.owner, state.count, self._valid_until = None, 0, 0.0
        if value:
            try:
                self._engine.link.call("release", [self._engine.epoch, value, RL.LOCKEV_MAX])
            except Exception as exc:  # the server is gone: the lease expires there
                log.warning("could not release the lock of %r at close: %s", self._name, exc)
            try:
                state.mutex.release()
            except RuntimeError:  # not held (released meanwhile)
                pass

    def after_fork(self) -> None:
        """In a forked child (the front end reset the holder thread and mutex)."""
        self._value = ""
        self._valid_until = 0.0


class _Keeper:
    """A thread that renews a held lease each ``lease / 3`` seconds.  One per
    lock (per handle that took it), so that a stalled server delays only the
    renewals of its own leases; it ends after ``IDLE_EXIT`` seconds without
    a lease to renew and starts again with the next one."""

    IDLE_EXIT = 10.0

    def __init__(self) -> None:
        self._held: weakref.WeakSet[LeaseLock] = weakref.WeakSet()
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._pid = os.getpid()

    def add(self, lock: LeaseLock) -> None:
        with self._cond:
            if self._pid != os.getpid():  # a forked child: the parent's thread is not here
                self._pid, self._thread = os.getpid(), None
                self._held = weakref.WeakSet()
            self._held.add(lock)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="ultradict_ng-lease-keeper", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def forget(self, lock: LeaseLock) -> None:
        with self._cond:
            self._held.discard(lock)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._held:
                    self._cond.wait(self.IDLE_EXIT)
                    if not self._held:
                        self._thread = None
                        return
                leases = [lock.lease for lock in self._held]  # (weak: may be empty now)
            if not leases:
                continue
            time.sleep(min(leases) / 3)  # (a lease was just granted or renewed: renew it a period later)
            with self._cond:
                locks = list(self._held)
            for lock in locks:
                self._renew(lock)

    def _renew(self, lock: LeaseLock) -> None:
        value = lock._value
        if not value or lock._lost:
            return
        engine = lock._engine
        sent = time.monotonic()
        try:
            reply = engine.link.call_aside(
                "renew", [engine.epoch, value, max(1, int(lock.lease * 1000))], max(0.05, lock.lease / 3)
            )
        except (BackendUnavailable, Unlinked) as exc:
            log.warning("could not renew the lease on %s: %s", engine.keys.lock, exc)
            return
        except Exception:  # a closed handle, a dying interpreter: stop renewing it
            self.forget(lock)
            return
        if lock._value != value:
            return  # released meanwhile
        if reply[0] == RL.OK:
            lock.renewed(sent)
        else:
            lock.fenced()
            log.warning("the lease on %s was lost while held", engine.keys.lock)
