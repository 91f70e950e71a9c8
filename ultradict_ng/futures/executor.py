"""``ProcessPoolExecutor``: the standard pool, with large buffers in shared memory.

It *is* a :class:`concurrent.futures.ProcessPoolExecutor` (a subclass): workers,
queues, ``map`` and chunking, shutdown, ``BrokenProcessPool`` are the standard
library's own.  Only the transport of one task changes:

* ``submit`` wraps the call in a :class:`_Call`, which the call queue's feeder
  thread pickles -- just before a worker can take it, so at most
  ``max_workers + 1`` calls are ever in shared memory, as in the standard
  pool, and a call that fails to pickle fails its future as it does there --
  into a parcel (``parcel.py``);
* the worker rebuilds the call over the mapped parcel (arrays zero-copy),
  runs it and packs the result into a parcel of its own;
* the pool rebuilds the result in its result thread and completes the
  :class:`Future` it returned.  That future is ours, not the inner one the
  standard pool completes, so nobody can see a result before it is rebuilt.

Lifetime of the shared memory, where a user looks for it:

* a result's arrays are views of a segment whose name is already gone: its
  memory is returned when the last array (or the future holding them) is
  collected; nothing needs closing;
* a call's parcel is removed by the worker as it takes it, or by the pool
  when the task ends any other way (cancelled, failed, pool broken);
* at shutdown, when the pool is idle after ``shutdown(wait=False)``, and at
  interpreter exit, the pool removes every parcel that still has its prefix
  (left by a worker killed while writing one);
* after a crash of the pool's own process: ``ultradict-ng clean`` or
  :func:`ultradict_ng.futures.remove_leftovers`; its workers notice within
  ``POOL_WATCH_INTERVAL`` and exit.
"""

from __future__ import annotations

import atexit
import errno
import concurrent.futures as cf
import os
import secrets
import threading
import time
import weakref
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._forks import on_fork_in_child
from .. import layout as L
from . import layout as PL
from .._owner import owner_alive, owner_word
from .._segments import SUPPORTED, listed, unlink
from .parcel import Parcel, pack, pool_prefix, unpack

__all__ = ["ProcessPoolExecutor", "Future", "DEFAULT_SHM_THRESHOLD"]

#: Buffers (and pickle streams) this large or larger travel in shared memory.
#: Below it a pipe is cheaper than a segment's create, map and unlink (~50 µs).
DEFAULT_SHM_THRESHOLD = L.DEFAULT_BLOB_THRESHOLD


class _Pool:
    """What a pool's tasks share: its parcel prefix, owner word and threshold,
    the count of tasks not yet settled (for the idle sweep), and how to find
    its workers (for the sweep after it broke)."""

    def __init__(self, threshold: int) -> None:
        self.token = secrets.token_hex(5)
        self.owner = owner_word()
        self.pid = os.getpid()
        self.threshold = threshold
        self.lock = threading.Lock()
        self.unsettled = 0
        self.shut = False
        self.swept = False
        self.broke = False
        self.workers: Callable[[], List[int]] = list

    def sweep(self) -> int:
        """Unlink every parcel name of this pool (only when no task can still
        make or take one: see "Pool parcels")."""
        if os.getpid() != self.pid:  # a forked child inherited this object
            return 0
        with self.lock:
            self.swept = True
        return sum(unlink(n) for n in listed(pool_prefix(self.token)))

    def broken(self) -> None:
        """The pool broke: every task has failed, but its other workers are
        being terminated only now, and one still running may yet write a result
        parcel; sweep once they are all gone (a thread waits for that)."""
        with self.lock:
            if self.broke:
                return
            self.broke = True
        words = [owner_word(pid) for pid in self.workers()]
        threading.Thread(target=self._sweep_when_gone, args=(words,), daemon=True,
                         name="ultradict_ng pool sweep").start()

    def _sweep_when_gone(self, words: List[int]) -> None:
        delay = 0.01
        while any(owner_alive(w) for w in words):
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
        self.sweep()


#: Pools of this process, for the sweep at interpreter exit (each again: a
#: worker of a broken pool may have written a parcel after the pool's sweep).
#: That sweep runs after the standard library has joined every pool's threads
#: (``threading``'s exit hooks run before ``atexit``'s), so no task is left.
_live: "set[_Pool]" = set()


@atexit.register
def _sweep_at_exit() -> None:
    for pool in list(_live):
        pool.sweep()


on_fork_in_child("pools", _live.clear)


class _Call:
    """A call, pickled lazily into a parcel; released when its task ends."""

    __slots__ = ("pool", "item", "name", "released", "lock")

    def __init__(self, pool: _Pool, item: Tuple[Any, Tuple[Any, ...], Dict[str, Any]]) -> None:
        self.pool = pool
        self.item: Optional[Tuple[Any, Tuple[Any, ...], Dict[str, Any]]] = item
        self.name = ""
        self.released = False
        self.lock = threading.Lock()

    def __reduce__(self) -> Any:
        item = self.item
        if item is None:
            # The task already ended (its pool broke while this call waited in
            # the queue): send nothing.  Raising here would make the feeder
            # thread fail a work item the broken pool is iterating over.
            return Parcel, ("", b"", ())
        parcel = pack(item, self.pool.token, self.pool.owner, self.pool.threshold)
        with self.lock:
            self.name = parcel.name
            late = self.released
        if late and parcel.name:  # the task ended (pool broken) while we packed
            unlink(parcel.name)
        return Parcel, tuple(parcel)

    def release(self) -> None:
        with self.lock:
            self.released = True
            name, self.item = self.name, None
        if name:
            unlink(name)  # a no-op if the worker took it


class Future(cf.Future):  # type: ignore[type-arg]
    """The future ``submit`` returns: a :class:`concurrent.futures.Future`
    completed with the *rebuilt* result; cancelling it cancels the task."""

    _inner: "Optional[cf.Future[Any]]" = None

    def cancel(self) -> bool:
        inner = self._inner
        if inner is None:
            return super().cancel()
        # A cancelled inner future settles this one (in _settle) before it returns.
        return inner.cancel() and super().cancel()

    def running(self) -> bool:
        inner = self._inner
        return inner.running() if inner is not None and not self.done() else super().running()


def _settle(ref: "weakref.ref[Future]", call: _Call, pool: _Pool, inner: "cf.Future[Any]") -> None:
    """The inner future is done: release the call, rebuild the result.

    The outer future is reached through a weak reference, so that outer ->
    inner -> this callback is no cycle: a result's memory goes back when its
    arrays are dropped, not at the next cyclic collection.  If the caller
    dropped the outer future, its result parcel is only unlinked."""
    call.release()
    outer = ref()
    try:
        if inner.cancelled():
            if outer is not None:
                cf.Future.cancel(outer)
                outer.set_running_or_notify_cancel()
            return
        exc = inner.exception()
        if exc is not None:
            if isinstance(exc, BrokenProcessPool):
                pool.broken()
            if outer is not None:
                outer.set_exception(exc)
            return
        parcel = inner.result()
        if outer is None:
            if parcel.name:
                unlink(parcel.name)
            return
        try:
            result = unpack(parcel, pool.owner)
        except BaseException as exc:
            outer.set_exception(exc)
        else:
            outer.set_result(result)
    finally:
        if outer is not None:
            # Only now: until the outer future is complete, cancel() must ask the
            # inner one (done: it refuses), not cancel the outer one under us.
            outer._inner = None
        with pool.lock:
            pool.unsettled -= 1
            idle = pool.shut and not pool.unsettled and not pool.swept
        if idle:
            pool.sweep()


class ProcessPoolExecutor(cf.ProcessPoolExecutor):
    """:class:`concurrent.futures.ProcessPoolExecutor` with large arguments and
    results in shared memory.

    Same parameters, plus ``shm_threshold``: a buffer (numpy array, ``bytearray``,
    or the pickle of the call or result itself, e.g. a large ``bytes``) of this
    many bytes or more travels in shared memory, smaller ones through the pipe.
    Arrays anywhere in arguments and results (in lists, tuples, dicts, objects)
    are found by pickle itself (protocol 5).  Results arrive as writable
    arrays over shared memory, zero-copy (see the module docstring for how
    long that memory lives).  Linux and macOS (POSIX shared memory).
    """

    def __init__(self, max_workers: Optional[int] = None, mp_context: Any = None,
                 initializer: Optional[Callable[..., object]] = None, initargs: Tuple[Any, ...] = (),
                 *, max_tasks_per_child: Optional[int] = None,
                 shm_threshold: int = DEFAULT_SHM_THRESHOLD) -> None:
        if not SUPPORTED:  # pragma: no cover - Windows
            raise OSError(errno.ENOSYS, "ultradict_ng.futures needs POSIX shared memory (Linux, "
                          "macOS); use concurrent.futures.ProcessPoolExecutor here")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if not isinstance(shm_threshold, int) or shm_threshold < 1:
            raise ValueError(f"shm_threshold must be a positive int, not {shm_threshold!r}")
        extra: Dict[str, Any] = {}
        if max_tasks_per_child is not None:
            extra["max_tasks_per_child"] = max_tasks_per_child
        pool = _Pool(shm_threshold)
        config = (pool.token, pool.owner, shm_threshold)
        super().__init__(max_workers, mp_context, _init_worker, (config, initializer, initargs), **extra)
        # The standard pool's {pid: process} dict, shared with its manager thread;
        # held here because shutdown(wait=False) drops the executor's reference.
        processes: Dict[int, Any] = getattr(self, "_processes", {})  # (empty: no "or")
        pool.workers = lambda: list(processes)
        self._pool = pool
        _live.add(pool)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> "cf.Future[Any]":
        call = _Call(self._pool, (fn, args, kwargs))
        inner = super().submit(_work, call)  # type: ignore[arg-type]  # pickled into a Parcel
        outer = Future()
        outer._inner = inner
        pool, ref = self._pool, weakref.ref(outer)
        with pool.lock:
            pool.unsettled += 1
        inner.add_done_callback(lambda f: _settle(ref, call, pool, f))
        return outer

    submit.__doc__ = cf.Executor.submit.__doc__

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=wait, cancel_futures=cancel_futures)
        pool = self._pool
        with pool.lock:
            joined = wait and not pool.shut  # a first shutdown that waited: workers are gone
            pool.shut = True
            idle = not pool.unsettled and not pool.swept
        if joined and not pool.unsettled:
            # Every worker is joined and every task settled: no parcel of this pool
            # can appear any more, so sweep once more whatever swept before (a
            # broken pool's sweep may have run before a dying worker's last parcel
            # was visible), and the exit sweep can skip it.
            pool.sweep()
            pool.workers = list
            _live.discard(pool)
        elif idle:  # else the last task to settle sweeps (a second shutdown may not wait)
            pool.sweep()

    shutdown.__doc__ = cf.Executor.shutdown.__doc__


# -- in the worker -------------------------------------------------------------------------------

_worker: Optional[Tuple[str, int, int]] = None  # (pool token, owner word, threshold)


def _init_worker(config: Tuple[str, int, int], initializer: Optional[Callable[..., object]],
                 initargs: Tuple[Any, ...]) -> None:
    global _worker
    _worker = config
    watch = threading.Thread(target=_watch, args=(config[1],), name="ultradict_ng pool watch",
                             daemon=True)
    watch.start()
    if initializer is not None:
        initializer(*initargs)


def _watch(owner: int) -> None:
    """Exit when the pool's process is gone: nobody will take a result, and a
    worker left waiting for a call would keep its last parcel mapped for ever."""
    while True:
        time.sleep(PL.POOL_WATCH_INTERVAL)
        if not owner_alive(owner):
            os._exit(1)


def _work(parcel: Parcel) -> Parcel:
    """Run one call in a worker: rebuild it, call it, pack the result."""
    if _worker is None:
        raise RuntimeError("ultradict_ng.futures task run outside the pool's workers")
    if not parcel.name and not parcel.data:
        raise cf.CancelledError("the call was released before it was sent")
    token, owner, threshold = _worker
    fn, args, kwargs = unpack(Parcel(*parcel), owner)
    result = fn(*args, **kwargs)
    del fn, args, kwargs  # the call's arrays are released before the result is packed
    return pack(result, token, owner, threshold)
