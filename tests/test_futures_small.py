"""``ultradict_ng.futures``: what a small task costs.

Calls and results that carry nothing large must travel as the standard pool
sends them, and the pool's own process must do no more per task than the
standard pool -- here less:

* a small plain call is written into the call pipe by the thread that puts it,
  not handed to the feeder thread (``callqueue.py``), unless that could block
  or reorder calls;
* ``map``'s chunks of plain values are recognised as plain (``marshal``),
  so they take that path too, with no wrapper;
* ``submit`` wakes the result thread with one message at most (``wakeup.py``).

Each test fails when its mechanism is switched off.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import multiprocessing
import os
import pickle
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import process as cfp
from typing import Any

import pytest

np = pytest.importorskip("numpy")

import ultradict_ng.futures as uf  # noqa: E402
from tests import pool_tasks as T  # noqa: E402
from ultradict_ng.futures import callqueue, executor, wakeup  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")

TIMEOUT = 60.0
FORK = multiprocessing.get_context("fork")


@pytest.fixture
def pool() -> Iterator[Any]:
    ex = uf.ProcessPoolExecutor(2, mp_context=FORK)
    try:
        yield ex
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def test_the_fast_paths_are_installed_on_this_python() -> None:
    """Both patches of the standard pool take on the running Python: a change
    of concurrent.futures' internals fails here, not as a pool that is quietly
    as slow as the standard one."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        ex = uf.ProcessPoolExecutor(1, mp_context=FORK)
    try:
        assert ex.fast_paths == {"wakeup": True, "call_queue": True}
        assert type(ex._call_queue) is callqueue.CallQueue
        assert type(ex._executor_manager_thread_wakeup) is wakeup.CoalescedWakeup
    finally:
        ex.shutdown(wait=True)


def test_a_pool_whose_internals_differ_says_so(monkeypatch: Any) -> None:
    """Where the standard pool's internals are not those the patches expect,
    the pool still runs, unpatched, and warns."""
    import types

    # (The check sees another queue class than the one the standard pool makes.)
    monkeypatch.setattr(callqueue, "_process", types.SimpleNamespace(_SafeQueue=type("Other", (), {})))
    with pytest.warns(RuntimeWarning, match="call_queue"):
        ex = uf.ProcessPoolExecutor(1, mp_context=FORK)
    try:
        assert ex.fast_paths == {"wakeup": True, "call_queue": False}
        assert ex.submit(pow, 2, 10).result(timeout=TIMEOUT) == 1024
    finally:
        ex.shutdown(wait=True)


def _feeder(ex: Any) -> Any:
    """The call queue's feeder thread (None: never started)."""
    return ex._call_queue._thread


def test_small_calls_skip_the_feeder_thread(pool: Any) -> None:
    assert type(pool._call_queue) is callqueue.CallQueue
    futures = [pool.submit(T.square, i) for i in range(300)]
    assert [f.result(TIMEOUT) for f in futures] == [i * i for i in range(300)]
    # keyword arguments, short strings, a builtin function of a module
    assert pool.submit(T.kwargs_echo, 1, "a", k=2.5).result(TIMEOUT) == ((1, "a"), {"k": 2.5})
    assert pool.submit(divmod, 7, 2).result(TIMEOUT) == (3, 1)
    assert _feeder(pool) is None


def test_map_chunks_of_plain_values_skip_the_feeder_thread(pool: Any) -> None:
    assert sum(pool.map(T.square, range(5000), chunksize=100)) == sum(i * i for i in range(5000))
    assert list(pool.map(T.add, range(300), range(300), chunksize=50)) == [2 * i for i in range(300)]
    # (chunks of 40: ~700-byte pickles, so that the max_workers + 1 = 3 the pipe
    # may hold unread fit in callqueue.ROOM whatever the workers' pace)
    out = list(pool.map(T.kwargs_echo, range(400), ["s"] * 400, [None, 1.5] * 200, chunksize=40))
    assert out == [((i, "s", (None, 1.5)[i % 2]), {}) for i in range(400)]
    assert _feeder(pool) is None


def test_which_calls_count_as_plain() -> None:
    limit = executor.DEFAULT_SHM_THRESHOLD // 4
    chunk = tuple((i,) for i in range(100))
    mapped = functools.partial(cfp._process_chunk, T.square)
    assert executor._plain_call(mapped, (chunk,), {}, limit)
    assert executor._plain_call(T.square, (3,), {}, limit)
    # a value marshal does not take, past the surveyed ones
    odd = chunk[:40] + ((T.Holder(1, 2),),) + chunk[40:]
    assert not executor._plain_call(mapped, (odd,), {}, limit)
    # a large buffer past the surveyed ones: marshal takes it, its size refuses it
    big = chunk[:40] + ((np.ones(limit),),)
    assert not executor._plain_call(mapped, (big,), {}, limit)
    # an array among the surveyed values: refused before marshal sees it
    assert not executor._plain_call(mapped, (((np.ones(4),),) + chunk,), {}, limit)
    assert not executor._plain_call(T.square, ("x" * limit,), {}, limit)


def test_large_plain_calls_leave_the_pipe_room_and_keep_their_order(tmp_path: Any) -> None:
    """Calls whose pickles do not fit next to what the pipe holds go to the
    feeder; whatever path each took, every call arrives once, in map's order."""
    gate = os.path.join(str(tmp_path), f"gate-{secrets.token_hex(4)}")
    with uf.ProcessPoolExecutor(1, mp_context=FORK) as ex:
        held = ex.submit(T.gated, "held", gate)  # the one worker waits: calls pile up
        texts = [f"{i:04d}" + "y" * 3000 for i in range(12)]  # ~3 KiB pickles: one fits, not two
        futures = [ex.submit(T.identity, t) for t in texts]
        small = [ex.submit(T.square, i) for i in range(20)]
        open(gate, "w").close()
        assert held.result(TIMEOUT) == "held"
        assert [f.result(TIMEOUT) for f in futures] == texts
        assert [f.result(TIMEOUT) for f in small] == [i * i for i in range(20)]
        assert _feeder(ex) is not None  # (some did not fit)
        assert list(ex.map(T.identity, texts, chunksize=3)) == texts


def test_a_put_never_waits_for_the_feeders_write_lock(pool: Any) -> None:
    """The feeder holds the call pipe's write lock while its write waits for room
    (workers busy writing results into a full result pipe).  The result thread,
    putting a small call, must not wait for that lock: blocked, it would read no
    result, and pool, workers and feeder would wait for each other forever (seen
    in the pool torture).  Held here by the test: the call goes to the feeder."""
    assert pool.submit(T.square, 2).result(TIMEOUT) == 4
    calls = pool._call_queue
    assert calls._wlock.acquire(timeout=TIMEOUT)
    try:
        f = pool.submit(T.square, 3)
        deadline = time.monotonic() + 10
        while calls._fed == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls._fed == 1  # (handed to the feeder: the result thread went on)
        assert not f.done()
    finally:
        calls._wlock.release()
    assert f.result(TIMEOUT) == 9


def test_a_plain_call_that_fails_to_pickle_fails_its_future_only(pool: Any) -> None:
    # (a lambda is a plain function by type; it pickles by name, which fails)
    bad = pool.submit(lambda: 1)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        bad.result(TIMEOUT)
    assert pool.submit(T.square, 4).result(TIMEOUT) == 16


def test_standard_pool_fails_the_same_lambda() -> None:
    with cf.ProcessPoolExecutor(1, mp_context=FORK) as ex:
        with pytest.raises((pickle.PicklingError, AttributeError)):
            ex.submit(lambda: 1).result(TIMEOUT)


def test_wakeups_coalesce_into_one_message() -> None:
    w = wakeup.CoalescedWakeup()
    try:
        w.clear()  # nothing to read: returns at once
        for _ in range(1000):
            w.wakeup()
        assert w._reader.poll(0)
        w.clear()
        assert not w._reader.poll(0)  # (the standard wakeup leaves 999 messages)
        w.wakeup()
        assert w._reader.poll(0)
    finally:
        w.close()
    w.wakeup()  # closed: nothing happens
    w.clear()


def test_a_forked_child_never_waits_for_the_wakeups_lock() -> None:
    """A process forked while a thread of its parent held a wakeup's lock (a
    pool's worker, forked as the pool's result thread empties the pipe) wakes
    it at its exit -- the standard library's exit hook wakes every pool -- and
    must not wait for that lock, which stays held in its copy forever (CI: a
    script's worker and the pool joining it hung at exit)."""
    import threading

    w = wakeup.CoalescedWakeup()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with w._coalesce:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(30)
        pid = os.fork()
        if pid == 0:  # the child: the lock's copy is held by a thread that does not exist here
            try:
                w.wakeup()
                w.clear()
                w.close()
            finally:
                os._exit(0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on the wakeup's lock")
        assert os.waitstatus_to_exitcode(status) == 0
        assert not w._reader.poll(0)  # (the child wrote nothing into the parent's pipe)
    finally:
        release.set()
        t.join(30)
        w.close()


def test_the_pool_uses_the_coalesced_wakeup(pool: Any) -> None:
    assert type(pool._executor_manager_thread_wakeup) is wakeup.CoalescedWakeup
    assert pool._call_queue.thread_wakeup is pool._executor_manager_thread_wakeup
    futures = [pool.submit(T.square, i) for i in range(500)]
    assert [f.result(TIMEOUT) for f in futures] == [i * i for i in range(500)]
