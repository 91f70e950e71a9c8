"""UltraDict's lock API: :class:`UltraLock`, what ``ultra.lock`` is.

Split out of :mod:`ultradict_ng.compat` because it is a class of its own,
with its own API (UltraDict's ``SharedLock``: ``block=``, ``timeout=``,
``steal=``, ``steal_after_timeout=``, ``sleep_time=``, ``blocking_pid``),
over the dict's :class:`~ultradict_ng.SharedLock`.  Its methods raise
UltraDict's exception classes (:func:`~ultradict_ng.compat.errors.map_errors`).
"""

from __future__ import annotations

import os
import pprint
import time
import weakref
from typing import Any, Optional

from .. import errors
from .._platform.lock import SharedLock
from .._shm.store import Store
from .errors import AlreadyClosed, CannotAcquireLock, CannotAcquireLockTimeout, map_errors

__all__ = ["UltraLock", "DEFAULT_SLEEP_TIME"]

#: UltraDict's default ``sleep_time`` (accepted and ignored: waiting backs off by itself).
DEFAULT_SLEEP_TIME = 0.000001


@map_errors
class UltraLock:
    """UltraDict's lock API over the dict's :class:`~ultradict_ng.SharedLock`.

    Always cross-process (``shared_lock`` does not matter), reentrant per
    thread, and recovered automatically from a dead holder.

    * ``with ultra.lock:`` / ``acquire()`` / ``release()``.
    * ``with ultra.lock(block=True, timeout=None, sleep_time=1e-6,
      steal_after_timeout=False, steal=False):`` -- every keyword of
      :meth:`acquire`.
    """

    __slots__ = ("_lock", "_name", "_store", "__weakref__")

    def __init__(self, store: Store) -> None:
        self._lock: SharedLock = store.lock
        self._name: str = store.name
        # Weak: the store's finalizer (auto_unlink on GC) must not wait for lock objects.
        self._store: weakref.ref[Store] = weakref.ref(store)

    def _shared(self) -> SharedLock:
        store = self._store()
        if store is None or store.closed:
            raise AlreadyClosed(f"UltraDict {self._name!r} already closed")
        return self._lock

    def acquire(
        self,
        block: bool = True,
        sleep_time: float = DEFAULT_SLEEP_TIME,
        timeout: Optional[float] = None,
        steal_after_timeout: bool = False,
        steal: bool = False,
    ) -> bool:
        """Take the lock; returns True (or raises).

        * ``block=False``: :class:`CannotAcquireLock` (with ``blocking_pid``)
          at once if another process or thread holds it.
        * ``timeout`` (seconds): :class:`CannotAcquireLockTimeout` when it runs
          out.  As in UltraDict, ``None`` and ``0`` mean no timeout, and with a
          timeout ``block`` is ignored.
        * ``steal_after_timeout=True``: when the timeout runs out and the holder
          is *dead*, take its lock at once instead of raising.  A live holder's
          lock is never taken (UltraDict raises too in that case).
        * ``steal=True``: take the lock even from a *live* holder (UltraDict's
          ``steal``).  This breaks mutual exclusion; avoid it.  Dead holders
          are recovered without it.
        * ``sleep_time``: accepted and ignored; waiting backs off by itself.
        """
        lock = self._shared()
        if steal:
            lock.take_over()
            return True
        if timeout:
            start = time.monotonic()
            try:
                return lock.acquire(timeout=timeout)
            except errors.LockTimeout as exc:
                # A non-blocking attempt takes over from a dead holder at once
                # (the waiting loop only checks the holder every so often).
                if steal_after_timeout and lock.acquire(blocking=False):
                    return True
                raise CannotAcquireLockTimeout(
                    str(exc),
                    blocking_pid=exc.pid or 0,
                    timestamp=start,
                    name=exc.name,
                    time_passed=time.monotonic() - start,
                ) from None
        if block:
            return lock.acquire()
        pid = 0
        for _ in range(3):  # the holder may release between our attempt and our look
            if lock.acquire(blocking=False):
                return True
            pid = lock.owner_pid or 0
            if pid:
                break
        raise CannotAcquireLock(
            f"cannot acquire the lock of {self._name!r}: held by pid {pid}",
            blocking_pid=pid,
            name=self._name,
        )

    def release(self, *args: Any) -> bool:
        """Release one level; False (like UltraDict) if this thread does not hold it."""
        lock = self._shared()
        if not lock.held():
            return False
        lock.release()
        return True

    def __call__(
        self,
        block: bool = True,
        timeout: Optional[float] = None,
        sleep_time: float = DEFAULT_SLEEP_TIME,
        steal_after_timeout: bool = False,
        steal: bool = False,
    ) -> _LockHold:
        """``with ultra.lock(timeout=1.5, ...):`` -- the keywords of :meth:`acquire`."""
        return _LockHold(
            self,
            dict(
                block=block,
                timeout=timeout,
                sleep_time=sleep_time,
                steal_after_timeout=steal_after_timeout,
                steal=steal,
            ),
        )

    def __enter__(self) -> UltraLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    # -- the rest of UltraDict's SharedLock -------------------------------------------------

    @property
    def has_lock(self) -> int:
        """1 if the calling thread holds the lock, else 0."""
        return int(self._shared().held())

    @property
    def pid(self) -> int:
        return os.getpid()

    def held(self) -> bool:
        return self._shared().held()

    @property
    def owner_pid(self) -> Optional[int]:
        return self._shared().owner_pid

    def get_remote_pid(self) -> int:
        """Pid of the process holding the lock now, 0 if free (a snapshot)."""
        return self._shared().owner_pid or 0

    def get_remote_lock(self) -> int:
        return 1 if self.get_remote_pid() else 0

    def steal(self, from_pid: int = 0, release: bool = False) -> bool:
        """UltraDict's ``steal``: take the lock from ``from_pid`` even if it is alive.

        False if the lock is free or held by another pid.  Breaks mutual
        exclusion with a live holder: prefer :meth:`steal_from_dead`.
        """
        lock = self._shared()
        if lock.held():
            raise RuntimeError("cannot steal the lock: this thread already holds it; release() it")
        owner = lock.owner_pid or 0
        if not owner or owner != from_pid:
            return False
        lock.take_over()
        if release:
            lock.release()
        return True

    def steal_from_dead(self, from_pid: int = 0, release: bool = False) -> bool:
        """Take the lock from ``from_pid`` if that process is dead; False if it no longer holds it.

        Raises :class:`CannotAcquireLock` if ``from_pid`` is alive and holds it
        (UltraDict raises a plain ``Exception`` there).
        """
        lock = self._shared()
        owner = lock.owner_pid or 0
        if not owner or owner != from_pid:
            return False
        if not lock.acquire(blocking=False):  # recovers the lock only from a dead holder
            raise CannotAcquireLock(
                f"not stealing the lock of {self._name!r}: pid {owner} is alive",
                blocking_pid=owner,
                name=self._name,
            )
        if release:
            lock.release()
        return True

    def status(self) -> dict[str, Any]:
        pid = self.get_remote_pid()
        return {
            "has_lock": self.has_lock,
            "lock_remote": 1 if pid else 0,
            "pid": os.getpid(),
            "pid_remote": pid,
        }

    def print_status(self, status: Optional[dict[str, Any]] = None) -> None:
        pprint.pprint(status or self.status())

    def __repr__(self) -> str:
        store = self._store()
        if store is None or store.closed:
            return f"<UltraLock of {self._name!r} (closed)>"
        pid = self._lock.owner_pid
        return f"<UltraLock of {self._name!r} {f'held by pid {pid}' if pid else 'free'}>"


@map_errors
class _LockHold:
    """What ``ultra.lock(...)`` returns: a context manager with those keywords."""

    __slots__ = ("_lock", "_params")

    def __init__(self, lock: UltraLock, params: dict[str, Any]) -> None:
        self._lock = lock
        self._params = params

    def __enter__(self) -> UltraLock:
        self._lock.acquire(**self._params)
        return self._lock

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def acquire(self) -> bool:
        return self._lock.acquire(**self._params)

    def release(self) -> bool:
        return self._lock.release()
