"""The asyncio face of a shared dict: waiting, the change feed and the lock, awaitable.

>>> from ultradict_ng.aio import AsyncSharedDict
>>> d = AsyncSharedDict(name="jobs")          # or AsyncSharedDict.wrap(shared_dict)
>>> d["x"]                                    # reads stay synchronous: they never wait
>>> await d.wait_for_change(timeout=5)        # the event loop runs meanwhile
>>> async for change in d.changes():          # the change feed
...     ...
>>> async with d.lock:                        # the cross-process lock
...     d["n"] = d["n"] + 1

Why a face and not ``async def`` methods on SharedDict: a read never waits
for another process -- on shared memory it is answered from the process's
cache in well under a microsecond, on Redis it is one round trip -- so an
``await`` would only cost; what can wait -- another process's write, the
lock -- is awaitable here (the convention of ``redis.asyncio`` and
filelock's ``AsyncFileLock``).  Writes take the lock: the synchronous ones
(``d[k] = v``) wait for it like any code that calls ``with d.lock``, the
awaitable ones (``await d.set(k, v)``) take it without blocking the loop.

How it waits without blocking the loop, on every backend: whatever can wait
is a blocking call of the engine interface (``_engine/__init__.py``) -- ``wait_past``
(the change counter moves past a value), a feed's ``wait``, the lock's
``wait_until_free`` -- made by a daemon helper thread (a :class:`_Wait`) in
slices of a fraction of a second, which completes the coroutines' futures
through ``call_soon_threadsafe``.  On shared memory the thread sleeps on the
channel's futex, on Redis in ``XREAD BLOCK``.  Coroutines that wait for the
same thing share one thread (every ``wait_for_change`` of a handle from one
state).  Cancelling a coroutine, or its timeout, removes its future; a
thread left with none ends after its slice and keeps nothing registered.
The lock is only ever taken in the event loop's thread, by ``try_acquire``
between awaits (a lock belongs to a thread, and the coroutine's writes are
made from that one): a cancelled ``acquire`` holds nothing.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import AsyncIterator, Hashable
from types import TracebackType
from typing import Any, Callable, Optional

from ._disk.syncing import deferred_syncs
from ._platform.directories import shown
from ._platform.lock import SharedLock
from .changes import Change
from .errors import LockTimeout
from .shareddict import SharedDict

__all__ = ["AsyncSharedDict", "AsyncSharedLock"]

#: Longest blocking call of a helper thread: how long a thread that nobody
#: waits for any more (cancelled, timed out) may live on.
_SLICE = 0.2
#: The lock's: also how soon an acquire re-tries when no release woke it (a
#: dead holder, or a release whose one wake went to a waiter elsewhere).
_LOCK_SLICE = 0.05


class _Wait:
    """A helper thread that calls ``step(slice)`` -- a blocking wait of at most
    ``slice`` seconds, True once what it waits for happened -- until it
    returns True, then completes every future that joined; or ends, after a
    slice, when no future is left.  An exception from ``step`` goes to the
    futures."""

    def __init__(
        self, key: Hashable, step: Callable[[float], bool], slice_: float, ended: Callable[[_Wait], None]
    ) -> None:
        self.key = key
        self._step = step
        self._slice = slice_
        self._ended = ended
        self._guard = threading.Lock()
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._ending = False

    def join(self, loop: asyncio.AbstractEventLoop) -> Optional[asyncio.Future[None]]:
        """A future completed when the wait is over; None if this thread is ending."""
        with self._guard:
            if self._ending:
                return None
            fut: asyncio.Future[None] = loop.create_future()
            self._futures.append((loop, fut))
            return fut

    def leave(self, fut: asyncio.Future[None]) -> None:
        with self._guard:
            self._futures = [item for item in self._futures if item[1] is not fut]

    def start(self) -> None:
        threading.Thread(target=self._run, name="ultradict_ng-aio-wait", daemon=True).start()

    def _run(self) -> None:
        error: Optional[BaseException] = None
        try:
            while True:
                with self._guard:
                    if not self._futures:
                        break  # nobody waits any more
                if self._step(self._slice):
                    break
        except BaseException as exc:  # Closed, Unlinked, BackendUnavailable: the coroutines get it
            error = exc
        with self._guard:
            self._ending = True
            futures, self._futures = self._futures, []
        self._ended(self)
        for loop, fut in futures:
            try:
                loop.call_soon_threadsafe(_settle, fut, error)
            except RuntimeError:  # that loop was closed meanwhile
                pass


def _settle(fut: asyncio.Future[None], error: Optional[BaseException]) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)


class _Waits:
    """The helper threads of one handle's face, by what they wait for."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._running: dict[Hashable, _Wait] = {}

    async def wait(
        self, key: Hashable, step: Callable[[float], bool], slice_: float, timeout: Optional[float]
    ) -> bool:
        """Until ``step`` (see :class:`_Wait`) returned True in a helper thread
        (True), or ``timeout`` seconds (False; None: no limit).  Joins the
        thread already waiting for ``key``, if any."""
        loop = asyncio.get_running_loop()
        with self._guard:
            wait = self._running.get(key)
            fut = wait.join(loop) if wait is not None else None
            if wait is None or fut is None:
                wait = self._running[key] = _Wait(key, step, slice_, self._ended)
                fut = wait.join(loop)
                assert fut is not None
                wait.start()
        try:
            if timeout is None:
                await fut
                return True
            done, _ = await asyncio.wait((fut,), timeout=max(timeout, 0.0))
            if not done:
                return False
            fut.result()  # (raises what the step raised)
            return True
        finally:
            wait.leave(fut)
            if not fut.done():
                fut.cancel()  # (a result the thread settles later is dropped, not left unretrieved)

    def _ended(self, wait: _Wait) -> None:
        with self._guard:
            if self._running.get(wait.key) is wait:
                del self._running[wait.key]


class _Turn:
    """One event loop's turn at one dict's lock in this process: the
    ``asyncio.Lock`` its coroutines queue on, and the task that holds the
    lock with how many holds -- reentrant in that task, as the synchronous
    lock is in its thread (an awaited write inside ``async with d.lock``
    takes it again; through the turn it would wait for itself)."""

    __slots__ = ("queue", "task", "holds", "waiting")

    def __init__(self) -> None:
        self.queue = asyncio.Lock()
        self.task: Optional[asyncio.Task[Any]] = None
        self.holds = 0
        #: Coroutines queued on it: an idle turn is dropped (it would keep its loop alive).
        self.waiting = 0


#: The turns of each dict's lock in this process, by loop: every face and
#: handle of one dict shares them, as they share the lock's per-process state
#: (its holder thread): with a turn of its own, a second face (``wrap`` again,
#: another handle) found the lock its thread held free to take, and wrote
#: inside another coroutine's ``async with d.lock`` block.
_TURNS: weakref.WeakKeyDictionary[Any, dict[int, _Turn]] = weakref.WeakKeyDictionary()


class AsyncSharedLock:
    """The dict's cross-process lock for coroutines: ``async with d.lock:``,
    ``await d.lock.acquire(timeout=...)``, ``d.lock.release()``.

    Coroutines of one event loop take turns through an ``asyncio.Lock`` first
    (the shared lock belongs to a thread, and they all run in one), then the
    lock is taken with ``try_acquire`` in the loop's thread -- which recovers
    a dead holder's lock on shared memory, as the synchronous lock does -- and
    a helper thread sleeps until it may be free."""

    def __init__(self, lock: SharedLock, name: str, waits: _Waits) -> None:
        self._lock = lock
        self._name = name
        self._waits = waits
        state = getattr(lock, "_state", None)  # (what the handles of one dict share)
        self._turns: dict[int, _Turn] = {} if state is None else _TURNS.setdefault(state, {})

    def _turn(self) -> _Turn:
        loop = id(asyncio.get_running_loop())
        turn = self._turns.get(loop)
        if turn is None:
            turn = self._turns[loop] = _Turn()
        return turn

    async def acquire(self, timeout: Optional[float] = None) -> bool:
        """Take the lock without blocking the event loop; :class:`LockTimeout`
        after ``timeout`` seconds."""
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 or None")
        deadline = None if timeout is None else time.monotonic() + timeout
        turn, task = self._turn(), asyncio.current_task()
        if turn.holds and turn.task is task and self._lock.held():
            self._lock.try_acquire()  # (one more hold of this thread's: it cannot fail)
            turn.holds += 1
            return True
        queue = turn.queue
        turn.waiting += 1
        try:
            if deadline is None or not queue.locked():
                await queue.acquire()  # (free: returns without suspending)
            else:
                await asyncio.wait_for(queue.acquire(), max(deadline - time.monotonic(), 0.0))
        except asyncio.TimeoutError:
            raise self._timeout(timeout) from None
        finally:
            turn.waiting -= 1
        try:
            lock = self._lock
            while True:
                if lock.try_acquire():
                    turn.task, turn.holds = task, 1
                    return True
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise self._timeout(timeout)
                limit = _LOCK_SLICE if deadline is None else min(_LOCK_SLICE, deadline - now)
                await self._waits.wait("lock", lock.wait_until_free, _LOCK_SLICE, limit)
        except BaseException:
            queue.release()
            raise

    def release(self) -> None:
        """Release the lock (from the coroutine that holds it)."""
        held = self._lock.held()
        turn = self._turns.get(id(asyncio.get_running_loop()))
        if held and turn is not None and turn.holds > 1:  # (an inner hold: the turn stays)
            self._lock.release()
            turn.holds -= 1
            return
        try:
            self._lock.release()  # (RuntimeError if not held; LeaseLost after giving it back)
        finally:
            if held and turn is not None:
                turn.task, turn.holds = None, 0
                if turn.queue.locked():
                    turn.queue.release()  # the next coroutine's turn, whatever the release raised
                if not turn.queue.locked() and not turn.waiting:  # (idle: its loop may end, and go)
                    self._turns.pop(id(asyncio.get_running_loop()), None)

    def locked(self) -> bool:
        """True if some process holds the lock now (a snapshot)."""
        return self._lock.locked()

    def _timeout(self, timeout: Optional[float]) -> LockTimeout:
        pid = self._lock.owner_pid
        return LockTimeout(
            f"could not acquire the lock of shared dict {shown(self._name)!r} "
            f"within {timeout}s" + (f" (held by pid {pid})" if pid else ""),
            name=self._name,
            pid=pid or 0,
        )

    async def __aenter__(self) -> AsyncSharedLock:
        await self.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.release()


class AsyncSharedDict:
    """A shared dict for asyncio code (module docstring), on any backend.
    Takes the arguments of :class:`~ultradict_ng.SharedDict`, or wraps one
    with :meth:`wrap`; the synchronous handle is ``.dict``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        d = SharedDict(*args, **kwargs)
        try:
            self._setup(d)
        except BaseException:
            d.close()
            raise

    @classmethod
    def wrap(cls, d: SharedDict) -> AsyncSharedDict:
        """The asyncio face of an open :class:`~ultradict_ng.SharedDict` (same handle)."""
        self = cls.__new__(cls)
        self._setup(d)
        return self

    def _setup(self, d: SharedDict) -> None:
        self.dict = d
        self._store = d._store  # the engine (Engine interface)
        self._waits = _Waits()
        self.lock = AsyncSharedLock(self._store.lock, d.name, self._waits)

    def __reduce__(self) -> tuple[Any, ...]:
        # Travels as its dict's handle does; the receiver wraps it again.
        return (_rewrap, (self.dict,))

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

    def copy(self) -> dict[Any, Any]:
        return self.dict.copy()

    def __setitem__(self, key: Any, value: Any) -> None:
        self.dict[key] = value  # (waits for the lock like ``with d.lock``; ``await set`` does not)

    def __delitem__(self, key: Any) -> None:
        del self.dict[key]

    # -- writes that never block the loop ------------------------------------------------------

    async def _write(self, write: Callable[[], Any]) -> Any:
        """``write()`` under the lock taken without blocking the loop; in a
        dict kept in files under ``sync="always"``, the wait for its sync
        (an ``fdatasync``, or another process leading the group commit) in a
        helper thread too, after the lock is released."""
        async with self.lock:
            with deferred_syncs() as pending:
                result = write()
        for durability, state in pending:
            await asyncio.get_running_loop().run_in_executor(None, durability.sync_deferred, state)
        return result

    async def set(self, key: Any, value: Any) -> None:
        """``d[key] = value``, taking the lock without blocking the loop."""
        await self._write(lambda: self.dict.__setitem__(key, value))

    async def delete(self, key: Any) -> None:
        """``del d[key]`` (KeyError if missing), taking the lock without blocking the loop."""
        await self._write(lambda: self.dict.__delitem__(key))

    async def update(self, other: Any = (), /, **kwargs: Any) -> None:
        """``d.update(...)``, all or nothing, taking the lock without blocking the loop."""
        await self._write(lambda: self.dict.update(other, **kwargs))

    async def clear(self) -> None:
        await self._write(self.dict.clear)

    async def pop(self, key: Any, *default: Any) -> Any:
        return await self._write(lambda: self.dict.pop(key, *default))

    # -- changes ------------------------------------------------------------------------------------

    async def wait_for_change(self, timeout: Optional[float] = None) -> bool:
        """``SharedDict.wait_for_change`` without blocking the event loop:
        True once the dict changed after the state this handle's cache
        reflects (the cache then reflects the change), False after
        ``timeout`` seconds; :class:`~ultradict_ng.errors.Unlinked` if the
        dict is removed meanwhile."""
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 or None")
        store = self._store
        mark = store.change_mark()  # Closed on a closed handle
        if store.wait_for_change(0):  # changed already: caught up (Unlinked if removed)
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if not await self._waits.wait(("change", mark), lambda t: store.wait_past(mark, t), _SLICE, left):
                return False
            if store.change_mark() == mark:
                # What the helper saw is not in the cache yet (no other thread
                # caught up meanwhile): catch up now; Unlinked if it was a removal.
                store.wait_for_change(0)
            if store.change_mark() != mark:
                return True

    async def changes(self, timeout: Optional[float] = None) -> AsyncIterator[Change]:
        """``SharedDict.changes`` as an async iterator: ``async for change in d.changes():``."""
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 or None")
        feed = self._store.feed()
        key = object()  # (this feed's own helper thread)
        while True:
            batch = feed.poll()
            if batch:
                for change in batch:
                    yield change
                continue
            if feed.ended:
                return
            if not await self._waits.wait(key, lambda t: feed.wait(time.monotonic() + t), _SLICE, timeout):
                return

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        self.dict.close()

    def unlink(self) -> int:
        return self.dict.unlink()

    async def __aenter__(self) -> AsyncSharedDict:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<AsyncSharedDict {self.dict!r}>"


def _rewrap(d: SharedDict) -> AsyncSharedDict:
    """Unpickling an AsyncSharedDict: the handle its dict's pickle opened, wrapped."""
    return AsyncSharedDict.wrap(d)
