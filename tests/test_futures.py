"""``ultradict_ng.futures``: a process pool that moves large buffers in shared memory.

1. What the standard library expects of a process executor (after CPython's
   ``Lib/test/test_concurrent_futures``), run against the standard pool *and*
   ours (``make_pool`` is parametrized), so each test shows "behaves as the
   standard pool";
2. arrays, bytes and containers: dtypes, shapes, layouts, thresholds, identity
   (pickle's memo), writability, and results that are mappings of a parcel
   whose name is already gone;
3. a property test: any nest of arrays and buffers comes back equal;
4. parcels themselves (pack/unpack) and what a crashed pool leaves behind.

Every task lives in ``tests/pool_tasks.py`` (spawned workers import it).
Blocking tasks wait for a gate file, so no test depends on timing except
through generous timeouts.
"""

from __future__ import annotations

import concurrent.futures as cf
import gc
import multiprocessing
import os
import pickle
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

import pytest

np = pytest.importorskip("numpy")

import hypothesis.strategies as st  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

import ultradict_ng.futures as uf  # noqa: E402
from tests import pool_tasks as T  # noqa: E402
from ultradict_ng._platform.owner import owner_word  # noqa: E402
from ultradict_ng.errors import CorruptSegment  # noqa: E402
from ultradict_ng.futures import layout as PL  # noqa: E402
from ultradict_ng.futures.parcel import ARRAY, DATA, VIEW, pack, unpack  # noqa: E402

pytestmark = pytest.mark.skipif(
    not os.path.isdir("/dev/shm") or not os.path.exists("/proc/self/maps"),
    reason="needs /dev/shm and /proc (Linux)",
)

#: Generous: a result that takes this long means the pool hangs.
TIMEOUT = 60.0
#: shm_threshold of our pools in these tests (arrays of 128 float64 or more go to shared memory).
THR = 1024
FORK = multiprocessing.get_context("fork")
SHM = "/dev/shm"


def wait_until(predicate: Callable[[], Any], limit: float = 30.0) -> Any:
    deadline = time.monotonic() + limit
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {limit} s: {predicate}")
        time.sleep(0.005)


def process_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


class Gate:
    """A file a gated task waits for; opened at the latest when the ``with`` ends,
    so that a failing test never leaves a task (and its pool's shutdown) waiting."""

    def __init__(self, directory: Any) -> None:
        self.path = os.path.join(str(directory), f"gate-{secrets.token_hex(4)}")

    def open(self) -> None:
        with open(self.path, "w"):
            pass

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.open()


@pytest.fixture(params=["stdlib", "ours"])
def make_pool(request: Any) -> Any:
    """``make_pool(max_workers, **kwargs)``: the standard pool or ours (the fork
    context unless ``mp_context`` is given; ours with ``shm_threshold=THR``, so that
    the arrays of these tests travel in shared memory)."""
    ours = request.param == "ours"

    def make(max_workers: Any = 1, **kwargs: Any) -> Any:
        kwargs.setdefault("mp_context", FORK)
        if ours:
            kwargs.setdefault("shm_threshold", THR)
            return uf.ProcessPoolExecutor(max_workers, **kwargs)
        return cf.ProcessPoolExecutor(max_workers, **kwargs)

    make.ours = ours  # type: ignore[attr-defined]
    return make


def _warm(ex: Any) -> Any:
    ex.submit(T.pid).result(TIMEOUT)  # fork: every worker starts at the first submit
    return ex


@pytest.fixture(scope="module")
def apool() -> Iterator[Any]:
    """Our pool shared by the array tests (started before any test's leftover check)."""
    with uf.ProcessPoolExecutor(2, mp_context=FORK, shm_threshold=THR) as ex:
        yield _warm(ex)


@pytest.fixture(scope="module")
def spool() -> Iterator[Any]:
    """The standard pool, to compare what a worker sees."""
    with cf.ProcessPoolExecutor(1, mp_context=FORK) as ex:
        yield _warm(ex)


def parcel_backed(a: Any) -> bool:
    return T.parcel_backed(a)


def assert_same(expected: Any, got: Any, where: str = "value") -> None:
    """``got`` is what ``expected`` is: same types all the way down, arrays of the
    same dtype, shape and bytes (NaN and NaT included), writable."""
    assert type(got) is type(expected), f"{where}: {type(got)} is not {type(expected)}"
    if isinstance(expected, np.ndarray):
        assert got.dtype == expected.dtype, f"{where}: dtype {got.dtype} != {expected.dtype}"
        assert got.shape == expected.shape, f"{where}: shape {got.shape} != {expected.shape}"
        if expected.dtype.hasobject:
            assert got.tolist() == expected.tolist(), where
        else:
            assert got.tobytes() == expected.tobytes(), f"{where}: values differ"
        if expected.dtype.kind in "fc":
            assert np.array_equal(got, expected, equal_nan=True), where
        assert got.flags.writeable, f"{where}: result array is read-only"
    elif isinstance(expected, dict):
        assert list(got) == list(expected), f"{where}: keys {list(got)} != {list(expected)}"
        for k in expected:
            assert_same(expected[k], got[k], f"{where}[{k!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), f"{where}: length"
        for i, (e, g) in enumerate(zip(expected, got)):
            assert_same(e, g, f"{where}[{i}]")
    elif isinstance(expected, (T.Box, T.Holder)):
        assert_same(vars(expected), vars(got), f"{where}.__dict__")
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}"


def big(n: int = 4000, fill: Any = None) -> Any:
    """An array above THR (``n`` float64)."""
    return np.arange(n, dtype=np.float64) if fill is None else np.full(n, fill, dtype=np.float64)


# ================================================================================================
# 1. The standard library's expectations, for the standard pool and ours
# ================================================================================================


def test_reexports_are_the_standard_librarys() -> None:
    for name in (
        "wait",
        "as_completed",
        "TimeoutError",
        "CancelledError",
        "ALL_COMPLETED",
        "FIRST_COMPLETED",
        "FIRST_EXCEPTION",
        "Executor",
        "ThreadPoolExecutor",
    ):
        assert getattr(uf, name) is getattr(cf, name), name
    assert uf.BrokenProcessPool is BrokenProcessPool
    assert issubclass(uf.ProcessPoolExecutor, cf.ProcessPoolExecutor)
    assert uf.Future is cf.Future
    assert uf.DEFAULT_SHM_THRESHOLD == 64 << 10


def test_submit_returns_the_result(make_pool: Any) -> None:
    a = big()
    with make_pool(2) as ex:
        f = ex.submit(pow, 2, 10)
        g = ex.submit(T.add, a, 1)
        # a keyword named like submit's own first parameter reaches the task
        h = ex.submit(T.kwargs_echo, 1, fn="f", x=a[:3])
        assert f.result(timeout=TIMEOUT) == 1024
        assert np.array_equal(g.result(TIMEOUT), a + 1)
        args, kwargs = h.result(TIMEOUT)
        assert args == (1,) and sorted(kwargs) == ["fn", "x"] and kwargs["fn"] == "f"
        assert np.array_equal(kwargs["x"], a[:3])
        assert f.done() and not f.running() and not f.cancelled()
        assert f.exception(0) is None
        assert type(f) is cf.Future and type(g) is cf.Future  # ours too: the standard futures


def test_small_tasks_travel_as_in_the_standard_pool(make_pool: Any) -> None:
    """A call and a result with nothing large in them travel as the standard pool sends
    them: the worker loop calls the task itself (nothing wraps it), and every object is
    pickled once -- also where ours puts large buffers in shared memory."""
    with make_pool(1) as ex:
        assert ex.submit(T.caller).result(TIMEOUT) == "_process_worker"
        arg = T.Counted()
        assert ex.submit(T.identity, arg).result(TIMEOUT) == T.Rebuilt(1)
        assert arg.n == 1  # pickled once, in this process (the call queue's feeder thread)
        assert ex.submit(T.counted).result(TIMEOUT) == (T.Rebuilt(1), None)  # once, in the worker
        a = big()
        arg = T.Counted()
        got, same = ex.submit(T.identity, (arg, a)).result(TIMEOUT)
        assert got == T.Rebuilt(1) and arg.n == 1
        got, same = ex.submit(T.counted, a).result(TIMEOUT)
        assert got == T.Rebuilt(1) and np.array_equal(same, a)
        assert parcel_backed(same) == make_pool.ours


def test_a_result_the_pool_cannot_load_breaks_it_as_the_standard_pool(make_pool: Any) -> None:
    """A small result travels as in the standard pool, and so fails as there: an
    object that does not load in the pool's process breaks the pool."""
    with make_pool(1) as ex:
        with pytest.raises(BrokenProcessPool):
            ex.submit(T.refusing_result, 10).result(TIMEOUT)


def test_exception_propagates_with_type_message_and_remote_traceback(make_pool: Any) -> None:
    with make_pool(1) as ex:
        f = ex.submit(T.fail, "boom 42")
        with pytest.raises(ValueError, match="^boom 42$") as info:
            f.result(TIMEOUT)
        exc = info.value
        assert f.exception(0) is exc
        cause = exc.__cause__
        assert isinstance(cause, cf.process._RemoteTraceback)
        assert "raise ValueError(msg)" in str(cause) and "in fail" in str(cause)
        g = ex.submit(T.fail_custom, "bad", 7)
        e = g.exception(TIMEOUT)
        assert type(e) is T.CustomError and e.args == ("bad", 7) and e.code == 7
        # the pool still works after a task failed
        assert ex.submit(T.square, 3).result(TIMEOUT) == 9


def test_unpicklable_arguments_and_results_fail_their_future_only(make_pool: Any) -> None:
    with make_pool(1) as ex:
        bad_arg = ex.submit(T.identity, threading.Lock())
        with pytest.raises(TypeError, match="pickle"):
            bad_arg.result(TIMEOUT)
        # the same with a large array next to it (ours: nothing may be left in /dev/shm)
        bad_arg2 = ex.submit(T.identity, (big(), threading.Lock()))
        with pytest.raises(TypeError, match="pickle"):
            bad_arg2.result(TIMEOUT)
        for with_array in (False, True):
            bad_result = ex.submit(T.return_unpicklable, with_array)
            with pytest.raises(TypeError, match="pickle"):
                bad_result.result(TIMEOUT)
        assert np.array_equal(ex.submit(T.add, big(), 2).result(TIMEOUT), big() + 2)


def test_map_preserves_order(make_pool: Any) -> None:
    with make_pool(2) as ex:
        assert list(ex.map(T.square, range(30))) == [i * i for i in range(30)]
        assert list(ex.map(T.square, range(30), chunksize=7)) == [i * i for i in range(30)]
        # several iterables, zipped (the shortest ends it)
        assert list(ex.map(T.add, range(10), range(100, 130))) == [i + 100 + i for i in range(10)]
        assert list(ex.map(T.add, range(10), range(100, 130), chunksize=3)) == [
            i + 100 + i for i in range(10)
        ]
        assert list(ex.map(T.square, [])) == []
        arrays = [big(300 + i, i) for i in range(7)]
        for chunksize in (1, 3):
            out = list(ex.map(T.identity, arrays, chunksize=chunksize))
            assert len(out) == len(arrays)
            for sent, got in zip(arrays, out):
                assert_same(sent, got)
                if make_pool.ours:
                    assert parcel_backed(got)
        with pytest.raises(ValueError):
            ex.map(T.square, range(3), chunksize=0)


def test_map_timeout(make_pool: Any, tmp_path: Any) -> None:
    with make_pool(2) as ex, Gate(tmp_path) as gate:
        _warm(ex)
        it = ex.map(T.gated, [0, 1, 2], [None, None, gate.path], timeout=2)
        assert next(it) == 0
        assert next(it) == 1
        with pytest.raises(cf.TimeoutError):
            next(it)


def test_result_and_exception_timeout(make_pool: Any, tmp_path: Any) -> None:
    with make_pool(1) as ex, Gate(tmp_path) as gate:
        f = ex.submit(T.gated, big(), gate.path)
        with pytest.raises(cf.TimeoutError):
            f.result(timeout=0.2)
        with pytest.raises(cf.TimeoutError):
            f.exception(timeout=0.05)
        assert not f.done()
        gate.open()
        assert np.array_equal(f.result(TIMEOUT), big())


def test_shutdown_wait_completes_pending_work(make_pool: Any) -> None:
    ex = make_pool(1)
    futures = [ex.submit(T.sleep_return, 0.01, big(200, i)) for i in range(8)]
    ex.shutdown(wait=True)
    assert all(f.done() for f in futures)
    for i, f in enumerate(futures):
        assert_same(big(200, i), f.result(0))
    ex.shutdown(wait=True)  # a second shutdown is harmless


def test_shutdown_cancel_futures(make_pool: Any, tmp_path: Any) -> None:
    ex = make_pool(1)
    gate = Gate(tmp_path)
    try:
        blocker = ex.submit(T.gated_pid, gate.path)
        wait_until(blocker.running)
        rest = [ex.submit(T.identity, big(500, i)) for i in range(10)]
        ex.shutdown(wait=False, cancel_futures=True)
        # at most max_workers + 1 == 2 calls were in the call queue: the rest is cancelled
        wait_until(lambda: sum(f.cancelled() for f in rest) >= 8)
        cancelled = [f for f in rest if f.cancelled()]
        if make_pool.ours:
            # ours notifies them, so wait/as_completed see them done (while the blocker
            # still blocks).  The standard pool leaves them CANCELLED, never
            # CANCELLED_AND_NOTIFIED: its wait() calls them not done and as_completed
            # never yields them (CPython gh-109934 / gh-87893, open).
            done, not_done = uf.wait(cancelled, timeout=0)
            assert done == set(cancelled) and not not_done
            assert set(uf.as_completed(cancelled, timeout=5)) == set(cancelled)
        assert not blocker.done()
        for f in cancelled:
            assert f.done() and not f.running()
            with pytest.raises(cf.CancelledError):
                f.result(0)
    finally:
        gate.open()
        ex.shutdown(wait=False)  # (a shutdown(wait=True) here would not wait: see below)
    worker = blocker.result(TIMEOUT)
    for i, f in enumerate(rest):
        if not f.cancelled():
            assert_same(big(500, i), f.result(TIMEOUT))
    wait_until(lambda: process_gone(worker))  # the pool ends its worker by itself


@pytest.mark.parametrize("which", ["stdlib", "ours"])
def test_shutdown_wait_after_shutdown_nowait_keeps_queued_work(which: str, tmp_path: Any) -> None:
    """``shutdown(wait=False)`` inside ``with``: the ``with``'s own shutdown(wait=True)
    must not harm the work still queued (it completes in the standard pool)."""
    cls: Any = uf.ProcessPoolExecutor if which == "ours" else cf.ProcessPoolExecutor
    kwargs: Any = {"shm_threshold": THR} if which == "ours" else {}
    gate = Gate(tmp_path)
    outcomes: list[Any] = []
    # only a safety net, should a future standard pool wait in the second shutdown
    safety = threading.Timer(10, gate.open)
    safety.start()
    try:
        with cls(1, mp_context=FORK, **kwargs) as ex:
            blocker = ex.submit(T.gated_pid, gate.path)
            wait_until(blocker.running)
            queued = [ex.submit(T.identity, big(2000, i)) for i in range(3)]
            # a call is in the call queue (ours: pickled into its parcel)
            wait_until(lambda: queued[0].running())
            if which == "ours":
                prefix = f"@udp{ex._pool.token}."
                wait_until(lambda: [e for e in os.listdir(SHM) if e.startswith(prefix)])
            ex.shutdown(wait=False)
        # the with's shutdown(wait=True) returned at once: the calls are still queued
        assert not any(f.done() for f in queued)
    finally:
        gate.open()
        safety.cancel()
        worker = blocker.result(TIMEOUT)
        for f in queued:
            try:
                outcomes.append(f.result(TIMEOUT))
            except Exception as exc:  # reported below, after the pool has ended
                outcomes.append(exc)
        wait_until(lambda: process_gone(worker))
    for i, got in enumerate(outcomes):
        assert not isinstance(got, BaseException), repr(got)
        assert_same(big(2000, i), got)


def test_submit_after_shutdown_raises(make_pool: Any) -> None:
    ex = make_pool(1)
    assert ex.submit(T.square, 2).result(TIMEOUT) == 4
    ex.shutdown()
    with pytest.raises(RuntimeError):
        ex.submit(T.square, 2)
    with pytest.raises(RuntimeError):
        ex.map(T.square, [1, 2])


def test_context_manager(make_pool: Any) -> None:
    pool = make_pool(2)
    with pool as ex:
        assert ex is pool
        pids = {ex.submit(T.pid).result(TIMEOUT) for _ in range(4)}
        assert os.getpid() not in pids
    with pytest.raises(RuntimeError):
        ex.submit(T.pid)
    for pid in pids:  # the workers were joined
        assert process_gone(pid)


@pytest.mark.parametrize("max_workers", [0, -1])
def test_max_workers_must_be_positive(make_pool: Any, max_workers: int) -> None:
    with pytest.raises(ValueError):
        make_pool(max_workers)


@pytest.mark.parametrize("threshold", [0, -1, 1.5, "1024", None])
def test_shm_threshold_must_be_a_positive_int(threshold: Any) -> None:
    with pytest.raises(ValueError):
        uf.ProcessPoolExecutor(1, shm_threshold=threshold)


def test_initializer_runs_in_each_worker(make_pool: Any, tmp_path: Any) -> None:
    with make_pool(2, initializer=T.init_record, initargs=(str(tmp_path), "hello")) as ex:
        seen = [ex.submit(T.init_value).result(TIMEOUT) for _ in range(6)]
    inits = {int(p.name.split("-")[1]) for p in tmp_path.iterdir() if p.name.startswith("init-")}
    assert len(inits) == 2  # fork: both workers started, each ran the initializer once
    for pid, value in seen:
        assert value == "hello" and pid in inits


def test_failing_initializer_breaks_the_pool(make_pool: Any) -> None:
    with make_pool(2, initializer=T.init_fail) as ex:
        futures: list[Any] = []
        for i in range(4):  # the pool may break (and refuse) before the last submit
            try:
                futures.append(ex.submit(T.square, i))
            except BrokenProcessPool:
                break
        assert futures  # the first submit starts the workers: nothing can be broken yet
        for f in futures:
            with pytest.raises(BrokenProcessPool):
                f.result(TIMEOUT)

        def refused() -> bool:
            try:
                ex.submit(T.square, 1).cancel()
            except BrokenProcessPool:
                return True
            return False

        wait_until(refused)


def test_initializer_must_be_callable(make_pool: Any) -> None:
    with pytest.raises(TypeError):
        make_pool(1, initializer=5)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="max_tasks_per_child is new in 3.11")
def test_max_tasks_per_child(make_pool: Any) -> None:
    # without a context the standard pool picks spawn (fork cannot replace workers)
    with make_pool(1, mp_context=None, max_tasks_per_child=2) as ex:
        seen = [ex.submit(T.pid_and, big(300, i)).result(TIMEOUT) for i in range(4)]
    pids = [p for p, _ in seen]
    assert pids[0] == pids[1] != pids[2] == pids[3]
    for i, (_, arr) in enumerate(seen):
        assert_same(big(300, i), arr)
    with pytest.raises(ValueError):
        make_pool(1, mp_context=FORK, max_tasks_per_child=2)
    with pytest.raises(ValueError):
        make_pool(1, mp_context=None, max_tasks_per_child=0)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_start_methods_round_trip_arrays(method: str) -> None:
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {method} here")
    a = np.arange(6000, dtype=np.float64).reshape(60, 100)
    with uf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method), shm_threshold=THR) as ex:
        seen = ex.submit(T.describe, a).result(TIMEOUT)
        out = ex.submit(T.add, a, 1).result(TIMEOUT)
    assert seen["parcel"] and seen["writeable"] and seen["shape"] == (60, 100)
    assert_same(a + 1, out)
    assert parcel_backed(out)


def test_cancel_running_done(make_pool: Any, tmp_path: Any) -> None:
    with make_pool(1) as ex, Gate(tmp_path) as gate:
        blocker = ex.submit(T.gated, "b", gate.path)
        wait_until(blocker.running)
        later = [ex.submit(T.identity, big(400, i)) for i in range(5)]
        last = later[-1]  # at most 2 calls are in the call queue: the last one is pending
        assert not last.running() and not last.done()
        calls: list[Any] = []
        last.add_done_callback(calls.append)
        assert last.cancel()
        assert calls == [last]
        assert last.cancelled() and last.done() and not last.running()
        assert last.cancel()  # cancelling again still says cancelled
        with pytest.raises(cf.CancelledError):
            last.result(0)
        with pytest.raises(cf.CancelledError):
            last.exception(0)
        assert not blocker.cancel()  # running: cannot be cancelled
        assert blocker.running() and not blocker.done() and not blocker.cancelled()
        gate.open()
        assert blocker.result(TIMEOUT) == "b"
        assert not blocker.running() and not blocker.cancel() and not blocker.cancelled()
        for i, f in enumerate(later[:-1]):
            assert_same(big(400, i), f.result(TIMEOUT))
        assert calls == [last]


def test_add_done_callback_sees_the_rebuilt_result(make_pool: Any) -> None:
    with make_pool(1) as ex:
        seen: list[Any] = []
        fired = threading.Event()

        def callback(f: Any) -> None:
            seen.append((f, f.result(0)))
            fired.set()

        a = big()
        f = ex.submit(T.add, a, 1)
        f.add_done_callback(callback)
        assert fired.wait(TIMEOUT)
        fut, res = seen[0]
        assert fut is f and res is f.result(0)
        assert_same(a + 1, res)
        if make_pool.ours:
            assert parcel_backed(res)
        # added after completion: runs at once, in the caller's thread
        late: list[Any] = []
        f.add_done_callback(lambda g: late.append((g, threading.get_ident())))
        assert late == [(f, threading.get_ident())]
        # a failed task: the callback sees the exception
        errors: list[Any] = []
        bad = ex.submit(T.fail, "cb")
        done = threading.Event()

        def on_error(g: Any) -> None:
            errors.append(g.exception(0))
            done.set()

        bad.add_done_callback(on_error)
        assert done.wait(TIMEOUT)
        assert type(errors[0]) is ValueError and str(errors[0]) == "cb"
        assert len(seen) == 1


def test_as_completed(make_pool: Any, tmp_path: Any) -> None:
    with make_pool(2) as ex, Gate(tmp_path) as gate:
        slow = ex.submit(T.gated, "slow", gate.path)
        quick = [ex.submit(T.sleep_return, 0.01 * i, big(300, i)) for i in range(4)]
        done, _ = uf.wait(quick, timeout=TIMEOUT)
        assert done == set(quick)
        got: list[Any] = []
        with pytest.raises(cf.TimeoutError):
            for f in uf.as_completed(quick + [slow, quick[0]], timeout=0.3):
                got.append(f)
        assert sorted(map(id, got)) == sorted(map(id, quick))  # each once, not the slow one
        gate.open()
        assert list(uf.as_completed([slow], timeout=TIMEOUT)) == [slow]
        assert slow.result(0) == "slow"
        for i, f in enumerate(quick):
            assert_same(big(300, i), f.result(0))


def test_wait_return_when(make_pool: Any, tmp_path: Any) -> None:
    with make_pool(2) as ex, Gate(tmp_path) as gate:
        slow = ex.submit(T.gated, "slow", gate.path)
        quick = ex.submit(T.identity, big())
        done, not_done = uf.wait([slow, quick], timeout=TIMEOUT, return_when=uf.FIRST_COMPLETED)
        assert done == {quick} and not_done == {slow}
        bad = ex.submit(T.fail, "x")
        done, not_done = uf.wait([slow, bad], timeout=TIMEOUT, return_when=uf.FIRST_EXCEPTION)
        assert done == {bad} and not_done == {slow}
        done, not_done = uf.wait([slow, quick], timeout=0.2, return_when=uf.ALL_COMPLETED)
        assert done == {quick} and not_done == {slow}
        gate.open()
        done, not_done = uf.wait([slow, quick, bad], timeout=TIMEOUT, return_when=uf.ALL_COMPLETED)
        assert done == {slow, quick, bad} and not not_done
        assert_same(big(), quick.result(0))


def test_killed_worker_breaks_the_pool(make_pool: Any) -> None:
    with make_pool(2) as ex:
        assert ex.submit(T.square, 3).result(TIMEOUT) == 9
        pending = [ex.submit(T.sleep_return, 0.05, big(2000, i)) for i in range(4)]
        doomed = ex.submit(T.kill_self)
        with pytest.raises(BrokenProcessPool):
            doomed.result(TIMEOUT)
        for i, f in enumerate(pending):
            try:
                assert_same(big(2000, i), f.result(TIMEOUT))
            except BrokenProcessPool:
                pass
        with pytest.raises(BrokenProcessPool):
            ex.submit(T.square, 2)


# ================================================================================================
# 2. Arrays, buffers and containers
# ================================================================================================

STRUCT = np.dtype([("a", "<i4"), ("b", "<f8"), ("c", "<U2")])
DTYPES = ["<f8", "|i1", "|b1", "<c16", "struct", "<M8[s]", "<m8[ms]", "<U5", "<f2"]
SHAPES = [(), (37,), (5, 7, 11), (40, 10, 9)]


def sample(dtype: str, shape: Any, order: str = "C") -> Any:
    """Deterministic, non-trivial values of ``dtype`` (NaN, NaT, empty strings included)."""
    n = int(np.prod(shape))
    i = np.arange(n)
    if dtype == "struct":
        a = np.zeros(n, STRUCT)
        a["a"], a["b"], a["c"] = i * 3 - 7, i / 3, [f"{k % 97:x}" for k in range(n)]
    elif dtype == "<f8":
        a = (i - n / 2) / 7.0
        if n:
            a[0] = np.nan
    elif dtype == "<f2":
        a = ((i % 300) / 3.0).astype("<f2")
    elif dtype == "<c16":
        a = i + 1j * (n - i)
    elif dtype == "|b1":
        a = i % 3 == 0
    elif dtype == "|i1":
        a = (i % 256 - 128).astype("|i1")
    elif dtype == "<M8[s]":
        a = (i * 86399 + 10**9).astype("<M8[s]")
        if n:
            a[-1] = np.datetime64("NaT")
    elif dtype == "<m8[ms]":
        a = (i * 1001 - 50).astype("<m8[ms]")
    elif dtype == "<U5":
        a = np.array([f"{k:x}"[-5:] if k % 5 else "" for k in range(n)], dtype="<U5")
    else:
        raise ValueError(dtype)
    a = a.astype(STRUCT if dtype == "struct" else dtype).reshape(shape)
    return np.asfortranarray(a) if order == "F" else np.ascontiguousarray(a)


def _array_cases() -> Iterator[Any]:
    for dtype in DTYPES:
        for shape in SHAPES:
            for order in ("C", "F"):
                if order == "F" and len(shape) < 2:
                    continue  # the same array as C
                yield pytest.param(
                    dtype, shape, order, id=f"{dtype}-{'x'.join(map(str, shape)) or '0d'}-{order}"
                )


@pytest.mark.parametrize("dtype,shape,order", list(_array_cases()))
def test_array_round_trip(apool: Any, spool: Any, dtype: str, shape: Any, order: str) -> None:
    a = sample(dtype, shape, order)
    above = a.nbytes >= THR
    out = apool.submit(T.identity, a).result(TIMEOUT)
    assert_same(a, out)
    assert out.flags.c_contiguous == a.flags.c_contiguous
    assert out.flags.f_contiguous == a.flags.f_contiguous
    assert parcel_backed(out) == above
    seen = apool.submit(T.describe, a).result(TIMEOUT)
    assert seen["parcel"] == above and seen["writeable"]
    # the worker sees the array as a worker of the standard pool does
    expected = spool.submit(T.describe, a).result(TIMEOUT)
    for key in ("type", "dtype", "shape", "writeable", "c", "f"):
        assert seen[key] == expected[key], key


def test_zero_d_datetime_above_a_tiny_threshold_keeps_its_shape() -> None:
    a = np.array(1_700_000_000, dtype="<M8[s]")  # 8 bytes: at or above a threshold of 8
    with uf.ProcessPoolExecutor(1, mp_context=FORK, shm_threshold=8) as ex:
        f = np.array(2.5)  # other 0-d arrays keep their shape
        assert_same(f, ex.submit(T.identity, f).result(TIMEOUT))
        shape = ex.submit(T.describe, a).result(TIMEOUT)["shape"]
        out = ex.submit(T.identity, a).result(TIMEOUT)
    assert (shape, out.shape) == ((), ())
    assert_same(a, out)


STRUCT_ARRAY = sample("struct", (400,))


def _strided_inputs() -> Iterator[Any]:
    m = np.arange(120 * 40, dtype=np.float64).reshape(120, 40)
    cube = np.arange(30 * 20 * 12, dtype=np.int32).reshape(30, 20, 12)
    dt = (np.arange(4000) * 3600).astype("<M8[s]")
    for size, scale in (("big", 1), ("small", 8)):
        yield pytest.param(m[:: 3 * scale, 1], id=f"step-{size}")
        yield pytest.param(m[::scale].T, id=f"transpose-{size}")
        yield pytest.param(m[::scale, ::2], id=f"columns-{size}")
        yield pytest.param(m[::-scale], id=f"reversed-{size}")
        yield pytest.param(cube[1::scale, ::2, ::3], id=f"cube-{size}")
        yield pytest.param(dt[:: 2 * scale], id=f"datetime-step-{size}")
        yield pytest.param(STRUCT_ARRAY[:: scale * 2], id=f"struct-step-{size}")


@pytest.mark.parametrize("a", list(_strided_inputs()))
def test_non_contiguous_inputs(apool: Any, spool: Any, a: Any) -> None:
    assert not a.flags.c_contiguous  # (what this test is about)
    out = apool.submit(T.identity, a).result(TIMEOUT)
    assert out.dtype == a.dtype and out.shape == a.shape
    assert out.tobytes() == a.tobytes() and out.flags.writeable
    assert parcel_backed(out) == (a.nbytes >= THR)
    seen = apool.submit(T.describe, a).result(TIMEOUT)
    expected = spool.submit(T.describe, a).result(TIMEOUT)
    for key in ("type", "dtype", "shape", "writeable", "c", "f"):
        assert seen[key] == expected[key], key
    assert seen["parcel"] == (a.nbytes >= THR)


@pytest.mark.parametrize("kind", ["step", "transpose", "columns", "reversed"])
@pytest.mark.parametrize("n", [3, 300])
def test_non_contiguous_results(apool: Any, kind: str, n: int) -> None:
    expected = T.make_strided(kind, n)
    out = apool.submit(T.make_strided, kind, n).result(TIMEOUT)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert np.array_equal(out, expected) and out.flags.writeable
    assert parcel_backed(out) == (expected.nbytes >= THR)
    out[...] = -1  # writable for real
    assert (out == -1).all()


@pytest.mark.parametrize("dtype", ["<f8", "<U5", "struct", "<M8[s]"])
@pytest.mark.parametrize("shape", [(0,), (3, 0, 2), (0, 0)])
@pytest.mark.parametrize("order", ["C", "F"])
def test_zero_size_arrays(apool: Any, dtype: str, shape: Any, order: str) -> None:
    a = sample(dtype, shape, order)
    out = apool.submit(T.identity, a).result(TIMEOUT)
    assert_same(a, out)
    assert out.size == 0


#: Both pools, an array below and above the threshold.
READ_ONLY_CASES = [
    pytest.param(which, n, id=f"{which}-{size}")
    for which in ("stdlib", "ours")
    for n, size in ((100, "small"), (4000, "big"))
]


@pytest.mark.parametrize("which,n", READ_ONLY_CASES)
def test_read_only_input_arrives_writable(apool: Any, spool: Any, which: str, n: int) -> None:
    a = np.arange(n, dtype=np.float64)
    a.setflags(write=False)
    ex = apool if which == "ours" else spool
    assert ex.submit(T.write_and_sum, a, 2.0).result(TIMEOUT) == 2.0 * n
    assert np.array_equal(a, np.arange(n))  # the parent's array is untouched


@pytest.mark.parametrize("which,n", READ_ONLY_CASES)
def test_read_only_result_arrives_writable(apool: Any, spool: Any, which: str, n: int) -> None:
    ex = apool if which == "ours" else spool
    out = ex.submit(T.make_readonly, n).result(TIMEOUT)
    assert np.array_equal(out, np.arange(n))
    assert out.flags.writeable


def test_read_only_big_input_is_still_sent_through_shared_memory(apool: Any) -> None:
    a = big()
    a.setflags(write=False)
    seen = apool.submit(T.describe, a).result(TIMEOUT)
    assert seen["parcel"] and seen["dtype"] == "<f8" and seen["shape"] == a.shape


@pytest.mark.parametrize("nbytes,above", [(THR - 1, False), (THR, True), (THR + 1, True)])
def test_threshold_boundary(apool: Any, nbytes: int, above: bool) -> None:
    a = (np.arange(nbytes) % 251).astype(np.uint8)
    seen = apool.submit(T.describe, a).result(TIMEOUT)
    assert seen["parcel"] == above
    out = apool.submit(T.identity, a).result(TIMEOUT)
    assert_same(a, out)
    assert parcel_backed(out) == above
    # results made in the worker: nbytes float64 bytes, at and around the threshold
    # results made in the worker: float64 arrays at and just below the threshold
    if nbytes == THR:
        assert parcel_backed(apool.submit(T.make_array, THR // 8).result(TIMEOUT))
        assert not parcel_backed(apool.submit(T.make_array, THR // 8 - 1).result(TIMEOUT))


def test_default_threshold_is_64_kib() -> None:
    at, below = np.ones(8192), np.ones(8191)  # 65536 and 65528 bytes
    with uf.ProcessPoolExecutor(1, mp_context=FORK) as ex:
        assert ex.submit(T.describe, at).result(TIMEOUT)["parcel"]
        assert not ex.submit(T.describe, below).result(TIMEOUT)["parcel"]
        assert parcel_backed(ex.submit(T.make_array, 8192).result(TIMEOUT))
        assert not parcel_backed(ex.submit(T.make_array, 8191).result(TIMEOUT))


def test_arrays_in_containers(apool: Any) -> None:
    a, s = big(), np.arange(5, dtype=np.int16)
    dt = sample("<M8[s]", (500,))
    value: Any = {
        "list": [a, s, "text"],
        "tuple": (s, a, 3),
        "dict": {"x": {"deep": [(dt, a[::2])]}, 1: None},
        "box": T.Box(array=big(3000, 1.5), meta={"k": s}),
        "holder": T.Holder(first=[dt], second={"b": big(200, 2)}),
    }
    out = apool.submit(T.identity, value).result(TIMEOUT)
    assert_same(value, out)
    assert parcel_backed(out["list"][0]) and not parcel_backed(out["list"][1])
    assert parcel_backed(out["dict"]["x"]["deep"][0][0])
    assert parcel_backed(out["box"].array) and parcel_backed(out["holder"].second["b"])
    seen = apool.submit(T.describe_tree, value).result(TIMEOUT)
    assert seen["list"][0]["parcel"] and not seen["list"][1]["parcel"]
    assert seen["tuple"][1]["parcel"] and seen["tuple"][2] == "int"
    assert seen["dict"]["x"]["deep"][0][0]["parcel"] and seen["dict"]["x"]["deep"][0][1]["parcel"]
    assert seen["box"][0] == "Box" and seen["box"][1]["array"]["parcel"]
    assert seen["holder"][0] == "Holder" and seen["holder"][1]["second"]["b"]["parcel"]
    # tasks on custom objects
    box = apool.submit(T.box_twice, value["box"]).result(TIMEOUT)
    assert_same(T.Box(big(3000, 3.0), {"k": s, "doubled": True}), box)
    h = apool.submit(T.swap_holder, value["holder"]).result(TIMEOUT)
    assert_same(T.Holder(value["holder"].second, value["holder"].first), h)


@pytest.mark.parametrize(
    "a",
    [
        pytest.param(big(), id="big"),
        pytest.param(np.arange(10.0), id="small"),
        pytest.param(big(12000)[::3], id="strided"),
        pytest.param(sample("<M8[s]", (600,)), id="datetime"),
        pytest.param(np.asfortranarray(big().reshape(40, 100)), id="fortran"),
        pytest.param(bytearray(5000), id="bytearray"),
    ],
)
def test_same_object_twice_arrives_as_one(apool: Any, a: Any) -> None:
    assert apool.submit(T.is_same, a, a).result(TIMEOUT) is True
    assert apool.submit(
        T.same_in_nest, {"x": a, "y": [a, a[:] if not isinstance(a, bytearray) else bytearray(a)], "z": (a,)}
    ).result(TIMEOUT) == [True, False, True]
    assert apool.submit(T.is_same, a, a.copy()).result(TIMEOUT) is False


def test_result_holding_one_array_twice(apool: Any) -> None:
    a, (b,), d = apool.submit(T.twice, 3000).result(TIMEOUT)
    assert a is b is d["a"]
    assert parcel_backed(a)
    a[0] = 99
    assert d["a"][0] == 99


def test_bytes_and_bytearray_keep_their_types(apool: Any) -> None:
    raw = bytes(range(256)) * 40  # 10 KiB: above THR
    value = (raw, bytearray(raw), [bytearray(b"tiny")], {"k": raw[:10]})
    out = apool.submit(T.identity, value).result(TIMEOUT)
    assert_same(value, out)
    original = bytearray(raw)
    kind, head, n = apool.submit(T.mutate_bytearray, original).result(TIMEOUT)
    assert (kind, head, n) == ("bytearray", bytes([1, 1, 2, 3]), len(raw))
    assert original == bytearray(raw)  # the parent's bytearray is untouched
    made_bytes, made_array = apool.submit(T.make_bytes, 8192).result(TIMEOUT)
    assert type(made_bytes) is bytes and made_bytes == bytes(range(256)) * 32
    assert type(made_array) is bytearray and made_array == bytearray(b"\x07" * 8192)
    made_array[0] = 1  # a bytearray owns its memory


def test_results_are_mappings_of_a_removed_parcel(apool: Any) -> None:
    f = apool.submit(T.make_pair, 5000)
    a, b = f.result(TIMEOUT)
    path = T.mapping_path(T.data_address(a))
    assert path is not None and path.startswith("/dev/shm/@udp") and path.endswith("(deleted)")
    assert T.mapping_path(T.data_address(b)) == path  # one segment for the whole result
    assert T.backing(a) == "mmap" and T.backing(b) == "mmap"
    name = path[len("/dev/shm/") :].split()[0]
    assert not os.path.exists(os.path.join(SHM, name))  # taken: the name is gone
    assert a.flags.writeable and b.flags.writeable
    assert np.array_equal(a, np.arange(5000)) and np.array_equal(b, np.arange(5000))
    a[:] = 1.5
    b[:] = 3
    assert a.sum() == 7500 and b.sum() == 15000
    assert path in T.shm_mappings()
    del a, b, f
    gc.collect()
    assert path not in T.shm_mappings()  # the memory went with the last array


def test_worker_lets_go_of_a_call_when_its_task_ends() -> None:
    with uf.ProcessPoolExecutor(1, mp_context=FORK, shm_threshold=THR) as ex:
        path = ex.submit(T.arg_mapping, big()).result(TIMEOUT)
        assert path and path.startswith("/dev/shm/@udp") and path.endswith("(deleted)")
        assert path not in ex.submit(T.shm_mappings).result(TIMEOUT)
        # a failed task too (its traceback held the arguments)
        with pytest.raises(ValueError) as info:
            ex.submit(T.fail_with_mapping, big()).result(TIMEOUT)
        failed = str(info.value)
        assert failed.startswith("/dev/shm/@udp") and failed != path
        assert failed not in ex.submit(T.shm_mappings).result(TIMEOUT)


def test_a_large_result_the_pool_cannot_rebuild_fails_its_own_future() -> None:
    """A result in a parcel is rebuilt in the pool's result thread as it is read;
    when that fails, its own future fails with the error (the standard pool would
    break), the pool goes on, and the parcel's name is gone."""
    with uf.ProcessPoolExecutor(1, mp_context=FORK, shm_threshold=THR) as ex:
        with pytest.raises(T.ArrivalError):
            ex.submit(T.refusing_result, 4000).result(TIMEOUT)
        assert ex.submit(T.square, 3).result(TIMEOUT) == 9
        assert not [n for n in os.listdir(SHM) if n.startswith(f"@udp{ex._pool.token}.")]


def test_small_results_are_not_in_shared_memory(apool: Any) -> None:
    out = apool.submit(T.make_array, 10).result(TIMEOUT)
    assert T.backing(out) != "mmap" and not parcel_backed(out)
    assert out.flags.writeable


@pytest.mark.parametrize(
    "a",
    [
        pytest.param(big(), id="big"),
        pytest.param(np.arange(10.0), id="small"),
        pytest.param(big(12000)[::3], id="strided"),
        pytest.param(np.asfortranarray(big().reshape(40, 100)), id="fortran"),
        pytest.param(sample("<M8[s]", (600,)), id="datetime"),
    ],
)
def test_worker_writes_do_not_reach_the_parent(apool: Any, a: Any) -> None:
    before = a.copy()
    value = before.flat[1]
    out = apool.submit(T.fill_and_return, a, value).result(TIMEOUT)
    assert out.shape == a.shape and (out == value).all()  # the worker could write
    assert a.tobytes() == before.tobytes()  # the parent's array did not change
    out[...] = before  # and the parent can write into the result
    assert out.tobytes() == before.tobytes()


def test_object_arrays_still_work(apool: Any) -> None:
    a = np.empty(5000, dtype=object)
    a[:] = [{"i": i} if i % 3 else (i, None) for i in range(5000)]
    out = apool.submit(T.identity, a).result(TIMEOUT)
    assert_same(a, out)
    assert not parcel_backed(out)
    mixed = {"objects": a[:100], "floats": big()}
    got = apool.submit(T.identity, mixed).result(TIMEOUT)
    assert_same(mixed, got)
    assert parcel_backed(got["floats"])


# ================================================================================================
# 3. Property: any nest of arrays and buffers comes back as it was sent
# ================================================================================================

_H_DTYPES = [
    np.dtype(d)
    for d in (
        "<f8",
        "<f4",
        "<f2",
        "|i1",
        "<u2",
        ">i4",
        "<i8",
        "|b1",
        "<c16",
        "<M8[ns]",
        "<m8[s]",
        "<U3",
        "|S4",
    )
] + [np.dtype([("a", "<i4"), ("b", "<f8")])]


@st.composite
def _arrays(draw: Any) -> Any:
    dtype = draw(st.sampled_from(_H_DTYPES))
    if draw(st.booleans()):  # small ones: 0-d, zero-size, a few elements
        a = draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)))
    else:  # above THR (some far above): a random block repeated along axis 0
        shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
        block = draw(hnp.arrays(dtype, shape))
        target = draw(st.sampled_from([THR, 3 * THR, 40 * THR]))
        a = np.concatenate([block] * -(-target // block.nbytes))
    layout = draw(st.sampled_from(["C", "F", "step", "T", "reversed"]))
    if layout == "F":
        a = np.asfortranarray(a)
    elif layout == "step" and a.ndim:
        a = a[::2]
    elif layout == "T":
        a = a.T
    elif layout == "reversed" and a.ndim:
        a = a[::-1]
    return a


#: bytes of 0 to 6000 bytes (a short random pattern repeated: sizes around THR are common)
_blobs = st.tuples(st.integers(0, 6000), st.binary(min_size=1, max_size=8)).map(
    lambda t: (t[1] * (t[0] // len(t[1]) + 1))[: t[0]]
)
_leaves = st.one_of(
    _arrays(),
    _arrays(),
    _arrays(),
    _blobs,
    _blobs.map(bytearray),
    st.integers() | st.none() | st.text(max_size=5),
)
_nests = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=8,
)


def _result_arrays(obj: Any) -> Iterator[Any]:
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _result_arrays(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _result_arrays(v)


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(value=_nests)
def test_any_nest_comes_back_as_sent(apool: Any, value: Any) -> None:
    out = apool.submit(T.identity, value).result(TIMEOUT)
    assert_same(value, out)
    for arr in _result_arrays(out):
        if arr.size:
            assert parcel_backed(arr) == (arr.nbytes >= THR), (arr.dtype, arr.shape)


# ================================================================================================
# 4. Parcels themselves, and what a crashed pool leaves behind
# ================================================================================================


@pytest.fixture
def token() -> str:
    return secrets.token_hex(5)


def _ours(token: str) -> list[str]:
    return sorted(e for e in os.listdir(SHM) if e.startswith(f"@udp{token}."))


def test_pack_small_objects_travel_in_the_pipe(token: str) -> None:
    me = owner_word()
    p = pack({"x": [1, 2], "a": np.arange(4)}, token, me, THR)
    assert p.name == "" and p.spans == () and p.data
    out = unpack(p, me)
    assert out["x"] == [1, 2] and np.array_equal(out["a"], np.arange(4))
    assert _ours(token) == []


class PacksOnPickling:
    """An object whose pickling packs another object (a pickler in use meanwhile)."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __reduce__(self) -> Any:
        inner = pack([big(), "inner"], self.token, owner_word(), THR)
        return tuple, ((inner.name, len(inner.spans)),)


def test_one_threads_packs_share_nothing(token: str) -> None:
    """A thread reuses its pickler from pack to pack: nothing of one pickling (the
    memo, the buffers set aside, the stream) reaches the next, whatever the
    threshold, and a pack made while another is under way has a pickler of its own."""
    me = owner_word()
    shared = [1, "two", (3,)]
    first = pack([shared, shared], token, me, THR)
    again = pack(shared, token, me, THR)  # (a memo left over would refer to the first pickle)
    assert unpack(again, me) == shared and unpack(first, me) == [shared, shared]
    large = pack(big(), token, me, THR)
    assert large.name and len(large.spans) == 1
    small = pack("after", token, me, THR)
    assert (small.name, small.spans, unpack(small, me)) == ("", (), "after")
    assert small.data == pickle.dumps("after", 5)  # (nothing of the longer pickle before)
    assert_same(big(), unpack(large, me))
    assert pack(big(), token, me, 1 << 20).name == ""  # another threshold: its own pickler
    nested = pack([PacksOnPickling(token), big(300)], token, me, THR)
    (inner_name, inner_spans), arr = unpack(nested, me)
    assert inner_name and inner_spans == 1 and parcel_backed(arr)
    os.unlink(os.path.join(SHM, inner_name))
    assert _ours(token) == []


def test_pack_large_stream_goes_to_the_segment(token: str) -> None:
    me = owner_word()
    data = bytes(range(256)) * 64
    p = pack(data, token, me, THR)
    assert p.name.startswith(f"@udp{token}.") and p.data == b""
    assert [kind for _, _, kind in p.spans] == [DATA]
    assert _ours(token) == [p.name]
    with open(os.path.join(SHM, p.name), "rb") as f:
        assert f.read(8) == PL.PARCEL_MAGIC
    out = unpack(p, me)
    assert type(out) is bytes and out == data
    assert _ours(token) == []  # the taker removed the name


def test_pack_buffers_out_of_band(token: str) -> None:
    me = owner_word()
    arr, fortran = big(3000), np.asfortranarray(big(3000).reshape(30, 100))
    p = pack((arr, fortran, np.arange(3), b"small"), token, me, THR)
    try:
        assert p.name and p.data  # the buffers in the segment, the small stream in the pipe
        assert [kind for _, _, kind in p.spans] == [ARRAY, ARRAY]
        for offset, _, _ in p.spans:
            assert offset >= PL.PARCEL_HEADER and offset % PL.PARCEL_ALIGN == 0
        assert [length for _, length, _ in p.spans] == [arr.nbytes, fortran.nbytes]
        assert os.path.getsize(os.path.join(SHM, p.name)) >= p.spans[-1][0] + p.spans[-1][1]
    finally:
        a2, f2, small, raw = unpack(p, me)
    assert_same(arr, a2)
    assert_same(fortran, f2)
    assert f2.flags.f_contiguous
    assert_same(np.arange(3), small)
    assert raw == b"small"
    assert T.backing(a2) == "mmap" and T.backing(f2) == "mmap" and T.backing(small) != "mmap"
    assert _ours(token) == []


def test_pack_sends_a_large_bytearray_in_the_stream(token: str) -> None:
    """The C pickler writes an exact bytearray in-band before any hook sees it:
    it travels in the stream, which is large, so in the segment (DATA)."""
    me = owner_word()
    ba = bytearray(b"\x05" * 20_000)
    p = pack((ba, 1), token, me, THR)
    try:
        kinds = [kind for _, _, kind in p.spans]
    finally:
        out, one = unpack(p, me)
    assert type(out) is bytearray and out == ba and one == 1
    assert kinds == [DATA] and not p.data


class Carrier:
    """An object that hands pickle its buffer out of band itself (PickleBuffer)."""

    def __init__(self, buf: Any) -> None:
        self.buf = buf

    def __reduce_ex__(self, protocol: Any) -> Any:
        return Carrier, (pickle.PickleBuffer(self.buf),)


def test_pack_sends_a_picklebuffer_out_of_band(token: str) -> None:
    me = owner_word()
    raw = bytearray(os.urandom(50_000))
    p = pack(Carrier(raw), token, me, THR)
    out = unpack(p, me)
    assert [kind for _, _, kind in p.spans] == [VIEW]
    assert isinstance(out.buf, memoryview) and out.buf == raw  # a view of the mapping


def test_pack_sends_large_arrays_as_array_buffers(token: str) -> None:
    """A large ndarray goes through reducer_override (ARRAY), read-only,
    strided and datetime ones included; a small one stays in the stream."""
    me = owner_word()
    ro = np.arange(5000.0)
    ro.setflags(write=False)
    items = (ro, np.arange(20000)[::2], np.arange(4000).astype("M8[s]"), np.arange(3))
    p = pack(items, token, me, THR)
    kinds = [kind for _, _, kind in p.spans]
    out = unpack(p, me)
    assert kinds == [ARRAY, ARRAY, ARRAY] and p.data
    for a, b in zip(items, out):
        assert_same(a, b)
    assert all(b.flags.writeable for b in out)


def test_unpack_refuses_a_parcel_of_another_owner(token: str) -> None:
    me = owner_word()
    p = pack(big(), token, me, THR)
    with pytest.raises(CorruptSegment):
        unpack(p, me + 1)
    assert _ours(token) == []  # opened, so removed all the same
    with pytest.raises(CorruptSegment, match="gone"):
        unpack(p, me)


def test_pack_of_an_unpicklable_object_leaves_nothing(token: str) -> None:
    with pytest.raises(TypeError):
        pack((big(), threading.Lock()), token, owner_word(), THR)
    assert _ours(token) == []


def test_live_parcels_are_listed_and_never_removed(tmp_path: Any) -> None:
    with uf.ProcessPoolExecutor(1, mp_context=FORK, shm_threshold=THR) as ex, Gate(tmp_path) as gate:
        blocker = ex.submit(T.gated, 0, gate.path)
        wait_until(blocker.running)
        queued = [ex.submit(T.identity, big(1000, i)) for i in range(3)]
        prefix = f"@udp{ex._pool.token}."

        def mine() -> list[Any]:
            found = [r for r in uf.parcels() if r.name.startswith(prefix)]
            # (a parcel caught between its creation and its header reads "creating")
            return found if all(r.status != "creating" for r in found) else []

        live = wait_until(mine)
        assert all(r.status == "live" and r.owner_pid == os.getpid() for r in live)
        assert all(r.maker_pid == os.getpid() for r in live)  # calls: made by the pool
        removed = uf.remove_leftovers()
        assert not [r for r in removed if r.name.startswith(prefix)]
        # the worker is blocked: nobody took these calls, so they must all still be there
        for r in live:
            assert os.path.exists(os.path.join(SHM, r.name)), r.name
        gate.open()
        for i, f in enumerate(queued):
            assert_same(big(1000, i), f.result(TIMEOUT))


_CRASHING_POOL = textwrap.dedent("""
    import os, signal, sys, time
    import multiprocessing as mp
    import numpy as np
    from ultradict_ng.futures import ProcessPoolExecutor, parcels
    from tests import pool_tasks as T

    if __name__ == "__main__":
        directory, gate = sys.argv[1], sys.argv[2]
        ex = ProcessPoolExecutor(1, mp_context=mp.get_context("fork"), shm_threshold=1024,
                                 initializer=T.init_record, initargs=(directory, 0))
        started = os.path.join(directory, "started")
        first = ex.submit(T.started_then_gated, started, gate, np.ones(5000))  # never opened
        deadline = time.monotonic() + 30
        while not os.path.exists(started) and time.monotonic() < deadline:
            time.sleep(0.01)  # the worker took (and unlinked) the first call
        more = [ex.submit(T.identity, np.full(1000, i)) for i in range(3)]
        prefix = "@udp" + ex._pool.token + "."
        def settled():
            found = [p for p in parcels() if p.name.startswith(prefix)]
            return more[0].running() and found and all(p.status == "live" for p in found)
        while not settled() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # no call is being packed now (the call queue is full) ...
        while not settled() and time.monotonic() < deadline:
            time.sleep(0.01)  # ... or it is written by now
        print("ready", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
""")


def test_workers_of_a_killed_pool_exit_and_its_parcels_are_removable(tmp_path: Any) -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    gate = os.path.join(str(tmp_path), "never")
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_POOL, str(tmp_path), gate],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, err
    assert "ready" in out
    workers = [int(p.name.split("-")[1]) for p in tmp_path.iterdir() if p.name.startswith("init-")]
    assert len(workers) == 1
    # the worker is blocked in its task (the gate never opens); its watch thread ends it
    wait_until(lambda: process_gone(workers[0]), limit=30)
    crashed = [r for r in uf.parcels() if r.owner_pid == proc.pid]
    assert crashed, "the crashed pool left no parcel (its queued calls) behind"
    assert all(r.status == "abandoned" for r in crashed)
    removed = {r.name for r in uf.remove_leftovers()}
    assert {r.name for r in crashed} <= removed
    assert not [r for r in uf.parcels() if r.owner_pid == proc.pid]
