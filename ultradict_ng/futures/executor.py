"""``ProcessPoolExecutor``: the standard pool, with large buffers in shared memory.

It *is* a :class:`concurrent.futures.ProcessPoolExecutor` (a subclass): workers,
queues, ``map`` and chunking, shutdown, ``BrokenProcessPool`` and the futures
``submit`` returns are the standard library's own.  Only the transport of what
is large changes, so that a program that swaps the import pays nothing for the
tasks that carry no array:

* **results**: the workers' result queue is a :class:`_ResultQueue`, whose
  ``put`` pickles the result item with protocol 5 (``parcel.pack``).  That
  pickle *is* the check: when it set no buffer aside and is small, it goes into
  the pipe as it is -- one pickle, as the standard pool sends it.  Otherwise
  the buffers and the large stream go into a parcel, and the pipe carries a
  reference whose unpickling -- in the pool's result thread, where the standard
  pool unpickles every result -- rebuilds the item over the parcel.  So the
  standard future is completed with the rebuilt result, and nobody can see a
  result before it is rebuilt;
* **calls**: ``submit`` hands the standard pool, as it is, a call that its
  types alone show to hold no buffer (:func:`_plain_call`: a function pickled
  by its name, or a ``partial`` of one as ``map`` submits; numbers, short
  strings, small tuples of them; and ``map``'s chunks, too many values to
  survey one by one, when ``marshal`` takes them whole in a few bytes).
  Any other call travels as a :class:`_Call`, which the call queue's feeder
  thread pickles with protocol 5 -- just before a worker can take it, so at
  most ``max_workers + 1`` calls are ever in shared memory, as in the standard
  pool, and a call that fails to pickle fails its future as it does there.
  Small, that pickle travels in the pipe; else it goes into a parcel.  The
  worker opens it only when the task starts (:class:`_Run`), so that a parcel
  it cannot take fails that task, not the worker.

Two things make a small task cheaper here than in the standard pool, with
the same messages in the same pipes: the call queue writes a small plain call
into the pipe itself instead of waking its feeder thread for it
(``callqueue.py``: a thread hop per task saved, while the workers wait), and
``submit`` wakes the result thread with one message at most instead of one
per call (``wakeup.py``: no write per ``submit``, no polling per result).

No future is wrapped, no callback added, nothing counted per task: what a
task left in shared memory is found by its name prefix, once the pool can make
no parcel any more (its result thread has ended, which it does only after
joining every worker and the feeder thread).  One thing differs from the
standard pool on purpose: ``shutdown(cancel_futures=True)`` also notifies the
futures it cancels, so that ``wait`` and ``as_completed`` count them done.

Lifetime of the shared memory, where a user looks for it:

* a result's arrays are views of a segment whose name is already gone: its
  memory is returned when the last array (or the future holding them) is
  collected; nothing needs closing;
* a call's parcel is removed by the worker as its task starts; one that no
  worker took (the pool broke) is removed with the pool's other names;
* once the pool's result thread has ended (after ``shutdown``, with or
  without waiting, or after the pool broke), at ``shutdown(wait=True)``, and
  at interpreter exit, the pool removes every parcel that still has its
  prefix (left by a worker killed while writing one);
* after a crash of the pool's own process: ``ultradict-ng clean`` or
  :func:`ultradict_ng.futures.remove_leftovers`; its workers notice within
  ``POOL_WATCH_INTERVAL`` and exit.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import errno
import functools
import marshal
import os
import pickle
import queue
import secrets
import threading
import time
import types
import warnings
from multiprocessing.queues import SimpleQueue
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Optional

from .._platform.forks import on_fork_in_child
from .._platform.listing import listed
from .._platform.owner import owner_alive, owner_word
from .._platform.segments import SUPPORTED, unlink
from .._shm import layout as L
from . import layout as PL
from .callqueue import install as install_call_queue
from .parcel import Parcel, Span, pack, pool_prefix, unpack
from .wakeup import install as install_wakeup

__all__ = ["ProcessPoolExecutor", "Future", "DEFAULT_SHM_THRESHOLD"]

#: Buffers (and pickle streams) this large or larger travel in shared memory.
#: Below it a pipe is cheaper than a segment's create, map and unlink (~50 µs).
DEFAULT_SHM_THRESHOLD = L.DEFAULT_BLOB_THRESHOLD

#: The future ``submit`` returns: the standard library's own (re-exported so that
#: ``ultradict_ng.futures`` replaces ``concurrent.futures`` name for name).
Future = cf.Future


class _Pool:
    """What a pool's parcels share: the name prefix, the owner word and the
    threshold; and the sweep of every name with that prefix."""

    def __init__(self, threshold: int) -> None:
        self.token = secrets.token_hex(5)
        self.owner = owner_word()
        self.pid = os.getpid()
        self.threshold = threshold
        self.lock = threading.Lock()
        self.watched = False  # the pool's result thread has a sweep waiting for its end
        self.shut = False

    def sweep(self) -> int:
        """Unlink every parcel name of this pool (only when no task can still
        make or take one: see "Pool parcels")."""
        if os.getpid() != self.pid:  # a forked child inherited this object
            return 0
        return sum(unlink(n) for n in listed(pool_prefix(self.token)))

    def last_sweep(self) -> None:
        """The pool can make no parcel any more: sweep, and not again at exit."""
        self.sweep()
        _live.discard(self)

    def watch(self, manager: threading.Thread) -> None:
        """Sweep once ``manager`` (the pool's result thread) has ended: it ends
        only after joining every worker and the feeder thread, whether the pool
        was shut down (waiting or not), broke, or was collected."""
        threading.Thread(
            target=self._sweep_after, args=(manager,), daemon=True, name="ultradict_ng pool sweep"
        ).start()

    def _sweep_after(self, manager: threading.Thread) -> None:
        manager.join()
        self.last_sweep()


#: Pools of this process not yet swept for the last time, for the sweep at
#: interpreter exit.  That sweep runs after the standard library has joined
#: every pool's threads (``threading``'s exit hooks run before ``atexit``'s).
_live: set[_Pool] = set()


@atexit.register
def _sweep_at_exit() -> None:
    for pool in list(_live):
        pool.sweep()


on_fork_in_child("pools", _live.clear)


# -- calls -----------------------------------------------------------------------------------------

#: Values whose pickle holds no buffer and stays small: numbers, and functions
#: (pickled by their name).  ``str`` and ``bytes`` count when short, tuples when
#: made of such values, two levels deep (``map``'s chunks: tuples of argument tuples).
_ATOMS = frozenset({int, float, bool, complex, type(None), types.FunctionType})
_TEXT = frozenset({str, bytes})
#: At most this many values are surveyed by type for one call.  A call with
#: more (``map``'s chunks of 100) whose surveyed values all passed is checked
#: whole by ``marshal`` instead (:func:`_marshals_small`), which is C code:
#: about 1.7 µs for a chunk of 100 one-argument tuples, where the type survey
#: takes about 5 µs and the pickle about 3.
_SURVEYED = 16
_NOT, _OVER = -1, -2  # (what :func:`_plain` returns: not plain; too many to survey)


def _plain(values: tuple[Any, ...], limit: int, depth: int, budget: int) -> int:
    """What is left of ``budget`` (one per value) after surveying ``values``:
    ``_NOT`` when pickling them could set a buffer aside or a ``str`` or
    ``bytes`` in them reaches ``limit``; ``_OVER`` when the budget ran out
    before a value said so.  A loop over the values' types, cheaper than any
    pickle (a call of one argument: about 0.2 µs)."""
    for v in values:
        budget -= 1
        if budget < 0:
            return _OVER
        t = type(v)
        if t in _ATOMS:
            continue
        if t in _TEXT:
            if len(v) >= limit:
                return _NOT
        elif t is tuple and depth:
            budget = _plain(v, limit, depth - 1, budget)
            if budget < 0:
                return budget
        else:
            return _NOT
    return budget


def _marshals_small(values: Any, limit: int) -> bool:
    """True when ``marshal`` takes ``values`` whole in fewer than ``limit`` bytes:
    then they are made of builtin values only (numbers, strings, bytes, tuples,
    lists, dicts, sets; and buffers, which the size bounds), so their pickle
    sets nothing aside that shared memory would carry, and stays small.  (A
    large array past the surveyed values is copied once by ``marshal`` before
    its size refuses it: the price of not surveying every value.)"""
    try:
        return len(marshal.dumps(values, 2)) < limit
    except ValueError:  # (an object marshal does not take, or nested too deep)
        return False


def _plain_call(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], limit: int) -> bool:
    """True when ``fn(*args, **kwargs)`` can travel as the standard pool sends it:
    a function pickled by its name (a plain or a module's builtin function, or a
    ``partial`` of one with plain arguments -- what ``map`` submits), plain
    arguments.  Anything else is pickled once, by :class:`_Call`, and that
    pickle decides."""
    t = type(fn)
    budget = _SURVEYED
    if t is functools.partial:
        if type(fn.func) is not types.FunctionType or fn.__dict__:
            return False
        budget = _plain(fn.args, limit, 0, budget)
        if fn.keywords and budget >= 0:
            budget = _plain(tuple(fn.keywords.values()), limit, 0, budget)
        if budget < 0:
            return False
    elif t is not types.FunctionType and not (
        t is types.BuiltinFunctionType and type(fn.__self__) is types.ModuleType
    ):
        return False
    budget = _plain(args, limit, 2, budget)
    if kwargs and budget >= 0:
        budget = _plain(tuple(kwargs.values()), limit, 0, budget)
    if budget >= 0:
        return True
    return budget == _OVER and _marshals_small((args, kwargs), limit)


class _Call:
    """A call the feeder thread pickles into a parcel (large) or the pipe (small)."""

    __slots__ = ("pool", "fn", "args", "kwargs")

    def __init__(
        self, pool: _Pool, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.pool = pool
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def __reduce__(self) -> Any:
        pool = self.pool
        return _Run, tuple(pack((self.fn, self.args, self.kwargs), pool.token, pool.owner, pool.threshold))


def _needs_feeder(fn: Any) -> bool:
    """Whether the call queue must leave a call of ``fn`` to its feeder thread."""
    return type(fn) is _Call


class _Run:
    """In a worker: a call as it arrived, taken (its parcel opened and unlinked,
    its pickle loaded) only when its task runs, so that whatever fails there
    fails the task, as an exception of the function would."""

    __slots__ = ("parcel",)

    def __init__(self, name: str, data: bytes, spans: tuple[Span, ...]) -> None:
        self.parcel = Parcel(name, data, spans)

    def __call__(self) -> Any:
        if _worker is None:
            raise RuntimeError("ultradict_ng.futures task run outside the pool's workers")
        fn, args, kwargs = unpack(self.parcel, _worker[1])
        # (the call's arrays go with this frame: before the worker packs the result)
        return fn(*args, **kwargs)


# -- results ---------------------------------------------------------------------------------------


class _ResultQueue(SimpleQueue):  # type: ignore[type-arg]
    """The workers' result queue: the standard one, pickling with protocol 5
    and putting large buffers in a parcel (see the module docstring)."""

    def put(self, obj: Any) -> None:
        # Pickled before the lock is taken, as the standard queue does; a failure
        # (unpicklable result, full /dev/shm) propagates to the standard worker,
        # which sends the exception instead.
        data = _result_message(obj)
        wlock = getattr(self, "_wlock", None)
        writer = self._writer  # type: ignore[attr-defined]  # (SimpleQueue's: not in typeshed)
        if wlock is None:
            writer.send_bytes(data)
        else:
            with wlock:
                writer.send_bytes(data)


def _result_message(obj: Any) -> bytes:
    """What goes into the result pipe for ``obj`` (a result item, or a worker's
    pid as it exits): its own pickle when small, else a reference to a parcel."""
    if _worker is None:  # (not one of our workers: the standard pool's pickle)
        return bytes(ForkingPickler.dumps(obj))
    token, owner, threshold = _worker
    parcel = pack(obj, token, owner, threshold)
    if not parcel.name:
        return parcel.data
    fields = getattr(obj, "__dict__", None)
    if fields is not None:  # (what a failed rebuild needs to fail this task alone)
        fields = {k: v for k, v in fields.items() if k not in ("result", "exception")}
    return pickle.dumps(_Arrival(tuple(parcel), type(obj), fields), 5)


class _Arrival:
    """The pipe's reference to a result item in a parcel: unpickled in the pool's
    result thread as the item itself (:func:`_arrive`)."""

    __slots__ = ("args",)

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __reduce__(self) -> Any:
        return _arrive, self.args


def _arrive(ref: tuple[str, bytes, tuple[Span, ...]], cls: Any, fields: Optional[dict[str, Any]]) -> Any:
    """Rebuild a result item from its parcel.  If that fails (the parcel was
    removed from outside, no memory to map it, a class that does not load
    here), the item fails its own task with the error, rather than the pool's
    result thread (which would break the pool)."""
    try:
        return unpack(Parcel(*ref), owner_word())
    except Exception as exc:
        if fields is None:
            raise
        item = cls.__new__(cls)
        item.__dict__.update(fields, result=None, exception=exc)
        return item


# -- the executor ----------------------------------------------------------------------------------


class ProcessPoolExecutor(cf.ProcessPoolExecutor):
    """:class:`concurrent.futures.ProcessPoolExecutor` with large arguments and
    results in shared memory.

    Same parameters, plus ``shm_threshold``: a buffer (numpy array, ``bytearray``,
    or the pickle of the call or result itself, e.g. a large ``bytes``) of this
    many bytes or more travels in shared memory, smaller ones through the pipe.
    Arrays anywhere in arguments and results (in lists, tuples, dicts, objects)
    are found by pickle itself (protocol 5).  Results arrive as writable
    arrays over shared memory, zero-copy (see the module docstring for how
    long that memory lives).  Calls and results with nothing large in them
    travel as in the standard pool.  Linux and macOS (POSIX shared memory).
    """

    def __init__(
        self,
        max_workers: Optional[int] = None,
        mp_context: Any = None,
        initializer: Optional[Callable[..., object]] = None,
        initargs: tuple[Any, ...] = (),
        *,
        max_tasks_per_child: Optional[int] = None,
        shm_threshold: int = DEFAULT_SHM_THRESHOLD,
    ) -> None:
        if not SUPPORTED:  # pragma: no cover - Windows
            raise OSError(
                errno.ENOSYS,
                "ultradict_ng.futures needs POSIX shared memory (Linux, "
                "macOS); use concurrent.futures.ProcessPoolExecutor here",
            )
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if not isinstance(shm_threshold, int) or shm_threshold < 1:
            raise ValueError(f"shm_threshold must be a positive int, not {shm_threshold!r}")
        extra: dict[str, Any] = {}
        if max_tasks_per_child is not None:
            extra["max_tasks_per_child"] = max_tasks_per_child
        pool = _Pool(shm_threshold)
        config = (pool.token, pool.owner, shm_threshold)
        super().__init__(max_workers, mp_context, _init_worker, (config, initializer, initargs), **extra)
        # The result queue, before any worker exists to inherit it: ours.
        standard = self._result_queue
        ctx = self._mp_context  # the base's __init__ set it (its default when None was given)
        assert ctx is not None
        self._result_queue = _ResultQueue(ctx=ctx.get_context())
        standard.close()
        #: Which of the fast paths patched into the standard pool are in place:
        #: both, unless this Python's concurrent.futures internals differ from
        #: those they patch (then the pool runs as the standard one, and says so).
        self.fast_paths = {
            "wakeup": install_wakeup(self),
            "call_queue": install_call_queue(self, _needs_feeder),
        }
        if not all(self.fast_paths.values()):
            missing = ", ".join(k for k, v in self.fast_paths.items() if not v)
            warnings.warn(
                f"ultradict_ng.futures: this Python's concurrent.futures internals differ from those "
                f"the pool patches; running without its fast {missing} (as the standard pool does)",
                RuntimeWarning,
                stacklevel=2,
            )
        self._pool = pool
        self._text_limit = shm_threshold // 4  # (a str pickles to at most 4 bytes a character)
        _live.add(pool)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        pool = self._pool
        call: Any
        if _plain_call(fn, args, kwargs, self._text_limit):
            call, args, kwargs = fn, args, kwargs
        else:
            call, args, kwargs = _Call(pool, fn, args, kwargs), (), {}
        if pool.watched:
            return super().submit(call, *args, **kwargs)
        with pool.lock:  # the first task starts the pool's result thread: watch it
            future = super().submit(call, *args, **kwargs)
            if not pool.watched:
                pool.watched = True
                # (a Thread: typeshed says _ThreadWakeup, which is _executor_manager_thread_wakeup)
                pool.watch(self._executor_manager_thread)  # type: ignore[arg-type]
        return future

    submit.__doc__ = cf.Executor.submit.__doc__

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            self._cancel_pending()
        pool = self._pool
        with pool.lock:
            first, pool.shut = not pool.shut, True
        super().shutdown(wait=wait, cancel_futures=cancel_futures)
        if wait and first:
            # Every worker is joined, and the result thread: no parcel of this pool
            # can appear any more (a broken pool's workers may have made one after
            # its futures failed), so sweep whatever swept before.  (A later
            # shutdown does not wait: the result thread's end sweeps then.)
            pool.last_sweep()

    shutdown.__doc__ = cf.Executor.shutdown.__doc__

    def _cancel_pending(self) -> None:
        """Cancel the tasks no worker has taken, as ``cancel_futures`` asks, and
        notify their futures, so that ``wait`` and ``as_completed`` count them
        done (the standard pool leaves them CANCELLED, never notified: see
        https://github.com/python/cpython/issues/109934 and
        https://github.com/python/cpython/issues/87893).  Each work id is taken
        from the queue the result thread takes them from, so exactly one of the
        two handles each task; the tasks taken here leave the pending ones at
        once (a task left there would keep the result thread waiting for it, and
        one the pool then fails as broken would be failed twice), under the lock
        ``submit`` adds them with."""
        ids = getattr(self, "_work_ids", None)
        items = getattr(self, "_pending_work_items", None)
        lock = getattr(self, "_shutdown_lock", None)
        if ids is None or items is None or lock is None:  # pragma: no cover - another stdlib
            return
        taken = []
        with lock:
            while True:
                try:
                    work_id = ids.get_nowait()
                except queue.Empty:
                    break
                item = items.pop(work_id, None)
                if item is not None:
                    taken.append(item.future)
        for future in taken:  # (a task the broken pool failed meanwhile is done: not cancelled)
            if future.cancel():
                future.set_running_or_notify_cancel()


# -- in the worker -------------------------------------------------------------------------------

_worker: Optional[tuple[str, int, int]] = None  # (pool token, owner word, threshold)


def _init_worker(
    config: tuple[str, int, int], initializer: Optional[Callable[..., object]], initargs: tuple[Any, ...]
) -> None:
    global _worker
    _worker = config
    watch = threading.Thread(target=_watch, args=(config[1],), name="ultradict_ng pool watch", daemon=True)
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
