"""The asyncio face of a shared dict: waiting, the change feed and the lock, awaitable.

>>> from ultradict_ng.aio import AsyncSharedDict
>>> d = AsyncSharedDict(name="jobs")          # or AsyncSharedDict.wrap(shared_dict)
>>> d["x"]                                    # reads stay synchronous: they never block
>>> await d.wait_for_change(timeout=5)        # the event loop runs meanwhile
>>> async for change in d.changes():          # the change feed
...     ...
>>> async with d.lock:                        # the cross-process lock
...     d["n"] = d["n"] + 1

Why a face and not ``async def`` methods on SharedDict: a read is answered
from the process's cache in well under a microsecond and never waits, so an
``await`` would only cost; what can wait -- another process's write, the
lock -- is awaitable here (the convention of ``redis.asyncio`` and
filelock's ``AsyncFileLock``).  Writes take the lock: the synchronous ones
(``d[k] = v``) wait for it like any code that calls ``with d.lock``, the
awaitable ones (``await d.set(k, v)``) take it without blocking the loop.

How it waits without blocking the loop: one daemon thread per channel and
dict in this process (a :class:`_Watcher`) sleeps on the futex of that
channel (layout: "Waiting and waking") on behalf of every coroutine waiting
on it, and completes their futures through ``call_soon_threadsafe``.  It
exits when nobody waits.  Cancelling a coroutine removes its future; a
cancelled ``acquire`` holds nothing: the shared lock is only ever taken by a
synchronous compare-and-swap in the event loop's thread, between awaits.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import TracebackType
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple, Type

from . import layout as L
from .changes import Change
from .errors import LockTimeout, Unlinked
from ._shm.lock import SharedLock
from .shareddict import SharedDict
from ._shm.waiting import Backoff

__all__ = ["AsyncSharedDict", "AsyncSharedLock"]

_W_STATE, _W_STATUS, _UNLINKED, _W_LOCK = L.W_STATE, L.W_STATUS, L.STATUS_UNLINKED, L.W_LOCK


class _Watcher:
    """Sleeps on one channel's futex for the coroutines of this process and
    wakes each whose condition holds (module docstring)."""

    def __init__(self, store: Any, waiters: int, seq: int) -> None:
        self._store = store
        self._waiters_index = waiters
        self._seq = seq
        self._guard = threading.Lock()
        self._pending: List[Tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]", Callable[[], bool]]] = []
        self._thread: Optional[threading.Thread] = None

    def add(self, loop: asyncio.AbstractEventLoop, ready: Callable[[], bool]) -> "asyncio.Future[None]":
        """A future completed once ``ready()`` is true (checked now, and in the
        watcher after every wake-up)."""
        fut: "asyncio.Future[None]" = loop.create_future()
        with self._guard:
            self._pending.append((loop, fut, ready))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ultradict_ng-aio-watcher",
                                                daemon=True)
                self._thread.start()
        if ready():  # already true: no need for the thread to see a change
            fut.set_result(None)
        return fut

    def _run(self) -> None:
        store = self._store
        atomic = store._map.atomic
        waiters = self._waiters_index
        registered = False
        backoff = Backoff()
        try:
            registered = store.waits.enter(atomic, waiters)
            woken = False
            while True:
                seq = atomic.load(self._seq) if registered else 0
                with self._guard:
                    keep = []
                    for item in self._pending:
                        loop, fut, ready = item
                        if fut.done():
                            continue
                        try:
                            done = ready()
                        except Exception:  # e.g. Closed: let the coroutine find out
                            done = True
                        if done:
                            loop.call_soon_threadsafe(_complete, fut)
                        else:
                            keep.append(item)
                    self._pending = keep
                    if not keep:
                        self._thread = None
                        return
                if registered:
                    if woken and self._seq == L.W_LOCK_SEQ:
                        # A wake for the lock reached this thread: consume it (the
                        # coroutines retry), so that the next release may wake again.
                        atomic.cas(L.W_LOCK_WAKING, 1, 0)
                    atomic.wait(self._seq, seq, 0.05)
                    woken = True
                else:
                    backoff.sleep(0.05)
        except BaseException:
            with self._guard:
                for loop, fut, _ in self._pending:
                    loop.call_soon_threadsafe(_complete, fut)
                self._pending = []
                self._thread = None
        finally:
            if registered:
                try:
                    if self._seq == L.W_LOCK_SEQ:
                        atomic.cas(L.W_LOCK_WAKING, 1, 0)
                    store.waits.exit(atomic, waiters)
                except Exception:
                    pass  # the handle was closed meanwhile


def _complete(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


async def _await(fut: "asyncio.Future[None]", timeout: Optional[float]) -> bool:
    """Wait for ``fut`` at most ``timeout`` seconds; False on timeout.  The
    future is cancelled on the way out whatever happens (so the watcher drops it)."""
    try:
        if timeout is None:
            await fut
            return True
        await asyncio.wait_for(asyncio.shield(fut), max(timeout, 0.0))
        return True
    except asyncio.TimeoutError:
        return False
    finally:
        if not fut.done():
            fut.cancel()


class AsyncSharedLock:
    """The dict's cross-process lock for coroutines: ``async with d.lock:``,
    ``await d.lock.acquire(timeout=...)``, ``d.lock.release()``.

    Coroutines of one event loop take turns through an ``asyncio.Lock`` first
    (the shared lock belongs to a thread, and they all run in one), then the
    shared word is taken by the same compare-and-swap as the synchronous lock,
    with dead-owner recovery at the same pace."""

    def __init__(self, lock: SharedLock, watcher: _Watcher) -> None:
        self._lock = lock
        self._watcher = watcher
        self._turns: Dict[int, asyncio.Lock] = {}

    def _turn(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        turn = self._turns.get(id(loop))
        if turn is None:
            turn = self._turns[id(loop)] = asyncio.Lock()
        return turn

    async def acquire(self, timeout: Optional[float] = None) -> bool:
        """Take the lock without blocking the event loop; :class:`LockTimeout`
        after ``timeout`` seconds."""
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 or None")
        deadline = None if timeout is None else time.monotonic() + timeout
        turn = self._turn()
        try:
            if deadline is None or not turn.locked():
                await turn.acquire()  # (free: returns without suspending)
            else:
                await asyncio.wait_for(turn.acquire(), max(deadline - time.monotonic(), 0.0))
        except asyncio.TimeoutError:
            raise self._timeout(timeout) from None
        try:
            loop = asyncio.get_running_loop()
            lock = self._lock
            words = lock._words
            next_check = time.monotonic() + L.LOCK_FIRST_CHECK
            while True:
                now = time.monotonic()
                check = now >= next_check
                if lock.try_acquire(recover=check):
                    return True
                if check:
                    next_check = now + L.LOCK_CHECK_INTERVAL
                if deadline is not None and now >= deadline:
                    raise self._timeout(timeout)
                limit = next_check - now if deadline is None else min(next_check, deadline) - now
                fut = self._watcher.add(loop, lambda: words.load(_W_LOCK) == 0)
                if fut.done():  # free now, but this process's other thread may be taking it
                    await asyncio.sleep(0.0002)
                    continue
                await _await(fut, limit)
        except BaseException:
            turn.release()
            raise

    def release(self) -> None:
        """Release the lock (from the coroutine that holds it)."""
        self._lock.release()
        turn = self._turns.get(id(asyncio.get_running_loop()))
        if turn is not None and turn.locked():
            turn.release()

    def locked(self) -> bool:
        """True if some process holds the lock now (a snapshot)."""
        return self._lock.owner_pid is not None

    def _timeout(self, timeout: Optional[float]) -> LockTimeout:
        pid = self._lock.owner_pid
        return LockTimeout(f"could not acquire the lock of shared dict {self._lock._name!r} "
                           f"within {timeout}s" + (f" (held by pid {pid})" if pid else ""),
                           name=self._lock._name, pid=pid or 0)

    async def __aenter__(self) -> "AsyncSharedLock":
        await self.acquire()
        return self

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        self.release()


class AsyncSharedDict:
    """A shared dict for asyncio code (module docstring).  Takes the arguments
    of :class:`~ultradict_ng.SharedDict`, or wraps one with :meth:`wrap`; the
    synchronous handle is ``.dict``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        d = SharedDict(*args, **kwargs)
        try:
            self._setup(d)
        except BaseException:
            d.close()
            raise

    @classmethod
    def wrap(cls, d: SharedDict) -> "AsyncSharedDict":
        """The asyncio face of an open :class:`~ultradict_ng.SharedDict` (same handle)."""
        self = cls.__new__(cls)
        self._setup(d)
        return self

    def _setup(self, d: SharedDict) -> None:
        if getattr(d._store, "backend", None) is not None:
            raise TypeError("AsyncSharedDict works on shared memory only; on Redis use the "
                            "SharedDict (or redis.asyncio) from a thread")
        self.dict = d
        store = d._store
        self._store = store
        self._changes = _Watcher(store, L.W_CHANGE_WAITERS, L.W_CHANGE_SEQ)
        self.lock = AsyncSharedLock(store.lock, _Watcher(store, L.W_LOCK_WAITERS, L.W_LOCK_SEQ))

    # -- reads: synchronous, as on SharedDict ------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        return self.dict[key]

    def get(self, key: Any, default: Any = None) -> Any:
        return self.dict.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.dict

    def __len__(self) -> int:
        return len(self.dict)

    def __iter__(self) -> Any:
        return iter(self.dict)

    def keys(self) -> Any:
        return self.dict.keys()

    def values(self) -> Any:
        return self.dict.values()

    def items(self) -> Any:
        return self.dict.items()

    def copy(self) -> Dict[Any, Any]:
        return self.dict.copy()

    def __setitem__(self, key: Any, value: Any) -> None:
        self.dict[key] = value  # (waits for the lock like ``with d.lock``; ``await set`` does not)

    def __delitem__(self, key: Any) -> None:
        del self.dict[key]

    # -- writes that never block the loop ------------------------------------------------------

    async def set(self, key: Any, value: Any) -> None:
        """``d[key] = value``, taking the lock without blocking the loop."""
        async with self.lock:
            self.dict[key] = value

    async def delete(self, key: Any) -> None:
        """``del d[key]`` (KeyError if missing), taking the lock without blocking the loop."""
        async with self.lock:
            del self.dict[key]

    async def update(self, other: Any = (), /, **kwargs: Any) -> None:
        """``d.update(...)``, all or nothing, taking the lock without blocking the loop."""
        async with self.lock:
            self.dict.update(other, **kwargs)

    async def clear(self) -> None:
        async with self.lock:
            self.dict.clear()

    async def pop(self, key: Any, *default: Any) -> Any:
        async with self.lock:
            return self.dict.pop(key, *default)

    # -- changes ------------------------------------------------------------------------------------

    async def wait_for_change(self, timeout: Optional[float] = None) -> bool:
        """``SharedDict.wait_for_change`` without blocking the event loop."""
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 or None")
        store = self._store
        words = store.words  # Closed on a closed handle
        seen = store.seen
        if words[_W_STATE] == seen:
            if words[_W_STATUS] & _UNLINKED:
                raise Unlinked(f"shared dict {store.name!r} was unlinked")
            fut = self._changes.add(asyncio.get_running_loop(),
                                    lambda: words[_W_STATE] != seen or bool(words[_W_STATUS] & _UNLINKED))
            if not await _await(fut, timeout):
                return False
            if words[_W_STATE] == seen:
                raise Unlinked(f"shared dict {store.name!r} was unlinked")
        store.sync()
        return True

    async def changes(self, timeout: Optional[float] = None) -> AsyncIterator[Change]:
        """``SharedDict.changes`` as an async iterator: ``async for change in d.changes():``."""
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 or None")
        feed = self._store.feed()
        words = feed.words
        loop = asyncio.get_running_loop()
        while True:
            batch = feed.poll()
            if batch:
                for change in batch:
                    yield change
                continue
            if feed.ended:
                return
            fut = self._changes.add(loop, lambda: words[_W_STATE] != feed.seen
                                    or bool(words[_W_STATUS] & _UNLINKED))
            if not await _await(fut, timeout):
                return

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        self.dict.close()

    def unlink(self) -> int:
        return self.dict.unlink()

    async def __aenter__(self) -> "AsyncSharedDict":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<AsyncSharedDict {self.dict!r}>"
