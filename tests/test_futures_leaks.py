"""Nothing of ``ultradict_ng.futures`` leaks: every parcel (a shared-memory segment
``@udp<pool>.<maker>-<seq>``) is released however its task ends.

* consumed result, dropped future, cancelled future, failed task: no name is left
  *while the pool still runs* (the shutdown sweep would hide a leak), and the
  result's memory goes with its arrays (``/proc/self/maps``);
* a worker killed mid-task (SIGKILL in the task, or at the fault points
  ``parcel-created`` / ``parcel-written``): BrokenProcessPool, and nothing after
  ``shutdown()`` -- nor at interpreter exit without one;
* the pool's own process SIGKILLed (at random instants, and at both fault
  points): its workers exit by themselves, ``parcels()`` calls what is left
  ``abandoned`` (or ``creating`` until it is ``PARCEL_STALE`` old), and the
  documented one-liner removes it, never a live pool's parcel;
* ``shutdown(wait=False)`` with work in flight; a full ``/dev/shm``;
* torture: threads submitting, cancelling and consuming at once;
* fuzz: garbage files under the prefix for ``parcels()`` / ``remove_leftovers()``,
  corrupted parcels and descriptors for ``unpack``.

The conftest fails any test that leaves a ``@udp`` entry or a child process.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import gc
import json
import logging
import multiprocessing
import os
import pickle
import random
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import ultradict_ng.futures as F
from tests import pool_workers as W
from tests.conftest import SOAK_SECONDS, soak_scaled
from tests.pool_workers import maker_pid, mapped, shm_names
from tests.wait_workers import wait_until
from ultradict_ng._platform.owner import owner_alive, owner_word, pid_of
from ultradict_ng._shm import layout as L
from ultradict_ng.errors import CorruptSegment
from ultradict_ng.futures import BrokenProcessPool, ProcessPoolExecutor
from ultradict_ng.futures import layout as PL
from ultradict_ng.futures.parcel import Parcel, pack, unpack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHM = "/dev/shm"
BIG = 1 << 17  # float64 elements: 1 MiB, well over the 64 KiB threshold
ONE_LINER = "import ultradict_ng.futures as f; f.remove_leftovers()"
HEADER = struct.Struct(PL.PARCEL_FORMAT)

pytestmark = pytest.mark.skipif(
    not os.path.isdir(SHM) or not os.path.isdir("/proc/self"),
    reason="needs a listable /dev/shm and /proc (Linux)",
)


# -- helpers -------------------------------------------------------------------------------------


def prefix_of(ex: ProcessPoolExecutor) -> str:
    return f"{PL.POOL_PREFIX}{ex._pool.token}."


def names_of(ex: ProcessPoolExecutor) -> list[str]:
    return shm_names(prefix_of(ex))


def no_names(ex: ProcessPoolExecutor, timeout: float = 10.0, what: str = "") -> None:
    """The pool has no parcel name (within ``timeout``: the pool's threads may be
    finishing the last release)."""
    wait_until(lambda: not names_of(ex), timeout, f"no parcel name of the pool {what}: {names_of(ex)}")


def unmapped(pid: Any, prefix: str, timeout: float = 10.0) -> None:
    """``pid`` maps nothing of ``prefix`` within ``timeout``: what refers to a
    mapping may be a cycle that becomes garbage only as the pool's threads end,
    after a first collection (a full suite's process collects its oldest
    generation rarely): collect at every look."""

    def gone() -> bool:
        if pid == "self":
            gc.collect()
        return not mapped(pid, prefix)

    wait_until(gone, timeout, f"process {pid} maps no {prefix}*: {mapped(pid, prefix)}")


def workers_of(ex: ProcessPoolExecutor) -> list[int]:
    return sorted(ex._processes or {})


def started_workers(ex: ProcessPoolExecutor, n: int) -> list[int]:
    """Make the pool start its ``n`` workers (spawn starts them on demand) and return their pids."""
    pids = {f.result(timeout=60) for f in [ex.submit(W.pid) for _ in range(4 * n)]}
    wait_until(lambda: len(workers_of(ex)) == n, 60, f"{n} workers")
    assert pids <= set(workers_of(ex))
    return workers_of(ex)


class Finished:
    """Joins a pool's own threads and processes after ``shutdown(wait=False)`` (which
    forgets them): keep them before, ``join()`` after."""

    def __init__(self, ex: ProcessPoolExecutor) -> None:
        self.thread = ex._executor_manager_thread
        self.procs = list((ex._processes or {}).values())

    def join(self, timeout: float = 60) -> None:
        if self.thread is not None:
            self.thread.join(timeout)
            assert not self.thread.is_alive(), "the pool's manager thread did not end"
        for p in self.procs:
            p.join(timeout)
            assert p.exitcode is not None, f"worker {p.pid} did not end"


@contextlib.contextmanager
def opened_at_exit(gate: str) -> Iterator[None]:
    """Whatever happens, the gate is open at the end (no worker waits on it for long)."""
    try:
        yield
    finally:
        open(gate, "a").close()


def array(n: int = BIG, value: float = 1.0) -> np.ndarray:
    return np.full(n, value)


def read_line(proc: subprocess.Popen, timeout: float, err: Any = None) -> dict[str, Any]:
    """The next JSON line of ``proc``'s stdout (binary pipe), within ``timeout``."""
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no line from {proc.pid} within {timeout}s: {buf!r} {_text(err)}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(
                    f"{proc.pid} ended (rc {proc.wait()}) before a line: {buf!r} {_text(err)}"
                )
            buf += chunk
    return json.loads(buf.split(b"\n", 1)[0])


def _text(path: Any) -> str:
    try:
        with open(path) as f:
            return f.read()[-3000:]
    except (OSError, TypeError):
        return ""


def script(tmp_path: Any, *args: str, fault: str = "") -> subprocess.Popen:
    """``python -m tests.pool_workers ARGS`` with ULTRADICT_NG_FAULT=``fault`` (or none)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("ULTRADICT_NG_FAULT", None)
    if fault:
        env["ULTRADICT_NG_FAULT"] = fault
    err = open(tmp_path / f"stderr-{uuid.uuid4().hex[:6]}", "wb")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.pool_workers", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    finally:
        err.close()
    proc.err_path = err.name  # type: ignore[attr-defined]
    return proc


def end(proc: subprocess.Popen) -> None:
    """End a process this test started (by its handle) and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)
    if proc.stdout is not None:
        proc.stdout.close()


def wait_gone(words: dict[int, int], timeout: float) -> float:
    """Wait until none of the processes (pid -> owner word) is alive; the time it took.
    They are not our children: /proc tells (a zombie counts as gone)."""
    t0 = time.monotonic()
    wait_until(
        lambda: not [p for p, w in words.items() if owner_alive(w)],
        timeout,
        f"workers {sorted(p for p, w in words.items() if owner_alive(w))} exited",
    )
    return time.monotonic() - t0


def kill_if_alive(words: dict[int, int]) -> None:
    """Last resort of a failed test: SIGKILL the pool workers *it* started (through its
    script) that are still the same processes (pid and start time)."""
    for p, w in words.items():
        if owner_alive(w):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def age(name: str, seconds: float = PL.PARCEL_STALE + 60) -> None:
    then = time.time() - seconds
    os.utime(os.path.join(SHM, name), (then, then))


def header_of(name: str) -> bytes:
    with open(os.path.join(SHM, name), "rb") as f:
        return f.read(HEADER.size)


def one_liner() -> None:
    """The documented one-liner, as a user runs it after a crash."""
    r = subprocess.run(
        [sys.executable, "-c", ONE_LINER],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert r.returncode == 0, r.stdout + r.stderr


def reports(prefix: str) -> dict[str, F.ParcelReport]:
    return {r.name: r for r in F.parcels() if r.name.startswith(prefix)}


# -- a result consumed, a future dropped, a task failed ------------------------------------------


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_consumed_result_leaves_no_name_and_its_memory_goes_with_its_arrays(method):
    """After ``.result()``: the call's and the result's parcels have no name (pool still
    running), the worker maps nothing, and the result's mapping -- the only trace
    left -- goes when its arrays are dropped.  All three kinds of span: numpy
    buffers (views), a ``bytearray`` (read into memory it owns), a large pickle stream."""
    ctx = multiprocessing.get_context(method)
    with ProcessPoolExecutor(1, mp_context=ctx) as ex:
        prefix = prefix_of(ex)
        (worker,) = started_workers(ex, 1)
        a = np.arange(BIG, dtype=np.float64)
        payload = {
            "a": a,
            "f": np.asfortranarray(a.reshape(512, -1)),
            "strided": a[::2],
            "ba": bytearray(b"x" * (200 << 10)),
            "bytes": b"y" * (300 << 10),
        }
        for round_ in range(3):
            r = ex.submit(W.transform, payload).result(timeout=60)
            assert not names_of(ex), f"round {round_}: parcels left after result(): {names_of(ex)}"
            assert np.array_equal(r["a"], a * 3 + 1) and np.array_equal(r["strided"], a[::2] * 3 + 1)
            assert np.array_equal(r["f"], payload["f"] * 3 + 1) and r["f"].flags.f_contiguous
            assert (
                r["ba"] == bytearray(b"!" + b"x" * ((200 << 10) - 1)) and r["bytes"] == payload["bytes"][::-1]
            )
            assert r["a"].flags.writeable  # writable, as the standard pool's private copies are
            r["a"][0] = -1.0
            assert mapped("self", prefix), "the result's arrays are over a (deleted) parcel mapping"
            unmapped(worker, prefix)  # the worker released the call's mapping after the call
            del r
            unmapped("self", prefix)
    assert not shm_names(prefix)


def test_dropped_future_releases_its_result():
    """A future never consumed: its result's parcel has no name once the task is done,
    and its mapping goes with the future."""
    with ProcessPoolExecutor(2) as ex:
        prefix = prefix_of(ex)
        futures = [ex.submit(W.double, array(BIG, i)) for i in range(4)]
        done, not_done = cf.wait(futures, timeout=60)
        assert not not_done
        no_names(ex, what="with every result unconsumed")
        assert len(mapped("self", prefix)) >= 4  # the results are rebuilt, held by the futures
        del futures, done, not_done
        unmapped("self", prefix)
        assert not names_of(ex)


def test_future_dropped_before_its_task_ends(tmp_path):
    """Futures dropped while their tasks still wait or run: the results arrive for
    nobody, their parcels are unlinked and never stay mapped."""
    started, gate = str(tmp_path / "started"), str(tmp_path / "gate")
    with ProcessPoolExecutor(1) as ex, opened_at_exit(gate):
        prefix = prefix_of(ex)
        blocker = ex.submit(W.wait_for_file, started, gate)
        wait_until(lambda: os.path.exists(started), 30, "the worker blocked")
        for i in range(4):
            ex.submit(W.double, array(BIG, i))  # dropped at once
        gc.collect()
        open(gate, "w").close()
        last = ex.submit(W.double, array())  # one worker: done after the dropped ones
        assert np.array_equal(last.result(timeout=60), array() * 2)
        blocker.result(timeout=60)
        no_names(ex, what="with the dropped futures' results")
        del last
        unmapped("self", prefix)


def test_result_memory_goes_by_reference_counting_alone():
    """``ex.submit(f, a).result()`` drops the future at once; once the caller drops the
    result too, nothing holds the mapping -- unless a cycle does (gc disabled here)."""
    with ProcessPoolExecutor(1) as ex:
        prefix = prefix_of(ex)
        ex.submit(W.pid).result(timeout=60)
        gc.collect()
        gc.disable()
        try:
            r = ex.submit(W.double, array()).result(timeout=60)
            assert mapped("self", prefix)
            del r
            time.sleep(0.2)
            still = mapped("self", prefix)
        finally:
            gc.enable()
            gc.collect()
        assert not still, f"result memory still mapped after its only array was dropped: {still}"


def test_failed_tasks_leave_nothing():
    """A task that raises, a result that cannot be pickled, a call that cannot: the
    exception reaches the future, and no parcel name (nor worker mapping) is left."""
    with ProcessPoolExecutor(1) as ex:
        (worker,) = started_workers(ex, 1)
        prefix = prefix_of(ex)
        with pytest.raises(ValueError, match="failed on purpose"):
            ex.submit(W.fail_with_array, array()).result(timeout=60)
        with pytest.raises(TypeError, match="pickle"):  # a lock in the result: the worker's pack fails
            ex.submit(W.with_a_lock, array()).result(timeout=60)
        # A lambda in the call: the pool's pack fails (pickle raises AttributeError for a
        # local object, PicklingError for one it cannot find by name).
        with pytest.raises((AttributeError, pickle.PicklingError)):
            ex.submit(W.transform, [array(), lambda: 0]).result(timeout=60)
        no_names(ex, what="after failed tasks")
        unmapped(worker, prefix)
        assert np.array_equal(ex.submit(W.double, array()).result(timeout=60), array() * 2)
        no_names(ex)


# -- cancelled futures ----------------------------------------------------------------------------


def test_cancelled_futures_never_make_a_parcel(tmp_path):
    """One busy worker, six array tasks behind it: the ones still pending cancel, and
    only the calls already queued for the worker ever have a parcel (checked while
    the pool runs); the rest complete, and no name is left."""
    started, gate = str(tmp_path / "started"), str(tmp_path / "gate")
    with ProcessPoolExecutor(1) as ex, opened_at_exit(gate):
        blocker = ex.submit(W.wait_for_file, started, gate)
        wait_until(lambda: os.path.exists(started), 30, "the blocking task started")
        tasks = [(ex.submit(W.double, array(BIG, i)), i) for i in range(6)]
        time.sleep(0.3)  # the pool queues what it can (and packs those calls)
        cancelled = [f.cancel() for f, _ in tasks]
        queued = cancelled.count(False)
        assert cancelled.count(True) >= 3, cancelled  # call queue: max_workers + 1 items
        assert all(f.cancelled() == c for (f, _), c in zip(tasks, cancelled))
        wait_until(lambda: len(names_of(ex)) >= queued, 30, "the queued calls are packed")
        for _ in range(10):  # a cancelled call's parcel never appears
            assert len(names_of(ex)) == queued, (names_of(ex), cancelled)
            time.sleep(0.03)
        open(gate, "w").close()
        blocker.result(timeout=60)
        for (f, i), c in zip(tasks, cancelled):
            if c:
                with pytest.raises(cf.CancelledError):
                    f.result(timeout=0)
            else:
                assert np.array_equal(f.result(timeout=60), array(BIG, i) * 2)
        no_names(ex, what="once the non-cancelled tasks are done")
        del tasks, f
        unmapped("self", prefix_of(ex))
    assert not names_of(ex)


class _Errors(logging.Handler):
    """Collects what ``concurrent.futures`` logs (e.g. an exception in a done callback)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(
            f"{record.getMessage()}: {record.exc_info[1]!r}" if record.exc_info else record.getMessage()
        )


@contextlib.contextmanager
def futures_errors() -> Iterator[list[str]]:
    handler = _Errors()
    logger = logging.getLogger("concurrent.futures")
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)


def test_cancel_while_the_result_is_rebuilt(tmp_path):
    """``cancel()`` of a future whose task has finished -- its result being rebuilt --
    returns False, and the future gets its result; nothing fails in the pool's thread
    (cancel() once found no inner future there, cancelled the outer one, and the
    rebuilt result's set_result raised InvalidStateError in the pool's callback)."""
    marker = str(tmp_path / "arriving")
    with ProcessPoolExecutor(1) as ex, futures_errors() as errors:
        f = ex.submit(W.slow_on_arrival, marker, 0.5, array())
        wait_until(lambda: os.path.exists(marker), 30, "the result is being rebuilt")
        said = f.cancel()
        wait_until(f.done, 30, "the future is done")
        time.sleep(0.6)  # the rebuild ends
        outcome = "cancelled" if f.cancelled() else "result"
        del f
    assert (said, outcome, errors) == (False, "result", []), (said, outcome, errors)


@pytest.mark.parametrize("cancel_futures", [False, True])
def test_shutdown_without_waiting_removes_names_once_work_ends(tmp_path, cancel_futures):
    """``shutdown(wait=False)`` with calls queued (packed) and pending: every name is
    gone once the work ends (the idle sweep), without another shutdown.  The worker
    dies at ``parcel-written`` on its 2nd result, leaving a complete parcel that
    only a sweep removes.  (One worker: a second one making a parcel after the
    futures failed is the next test's case.)"""
    started, gate = str(tmp_path / "started"), str(tmp_path / "gate")
    ex = ProcessPoolExecutor(1, initializer=W.arm_fault, initargs=("parcel-written", "kill", 2))
    with opened_at_exit(gate):
        blocker = ex.submit(W.wait_for_file, started, gate)
        wait_until(lambda: os.path.exists(started), 30, "the worker blocked")
        futures = [ex.submit(W.double, array(BIG, i)) for i in range(8)]
        wait_until(lambda e=ex: len(names_of(e)) == 2, 30, "two calls packed in the call queue")
        finished = Finished(ex)
        ex.shutdown(wait=False, cancel_futures=cancel_futures)
        if cancel_futures:  # the pool's thread cancels them
            wait_until(
                lambda fs=futures: sum(f.cancelled() for f in fs) == 6, 30, "the pending six cancelled"
            )
    done, not_done = cf.wait([blocker, *futures], timeout=60)
    assert not not_done
    outcomes: Counter = Counter()
    for i, f in enumerate(futures):
        if f.cancelled():
            outcomes["cancelled"] += 1
        elif f.exception() is None:
            assert np.array_equal(f.result(), array(BIG, i) * 2)
            outcomes["ok"] += 1
        else:
            assert isinstance(f.exception(), BrokenProcessPool), repr(f.exception())
            outcomes["broken"] += 1
    assert outcomes == Counter(ok=1, broken=1, cancelled=6) if cancel_futures else Counter(ok=1, broken=7)
    no_names(ex, what="after shutdown(wait=False), once the work ended")
    finished.join()
    assert not names_of(ex)
    prefix = prefix_of(ex)
    # (With cancel_futures the standard pool keeps its old work-item dict, and so its
    # own futures, as long as the executor or its call queue lives: drop them too.)
    del futures, blocker, done, f, ex, finished
    unmapped("self", prefix)


def test_result_parcel_made_after_the_idle_sweep_of_a_broken_pool(tmp_path):
    """``shutdown(wait=False)``, then the pool breaks while another worker (one that
    ignores SIGTERM, as a task may make it) still runs and makes its result parcel
    after the futures failed: the pool still removes that name once its workers are
    gone (it once swept only as the futures failed: the name stayed until exit)."""
    started, gate = str(tmp_path / "started"), str(tmp_path / "gate")
    ex = ProcessPoolExecutor(2)
    workers = started_workers(ex, 2)
    late = ex.submit(W.outlive_the_pool, started, workers, BIG)
    wait_until(lambda: os.path.exists(started), 30, "the long task started")
    dying = ex.submit(W.die_at_gate, gate)
    finished = Finished(ex)
    ex.shutdown(wait=False)
    open(gate, "w").close()
    leaked: list[str] = []
    try:  # (the gate is open: every task ends by itself)
        for f in (late, dying):
            with pytest.raises(BrokenProcessPool):
                f.result(timeout=60)
        finished.join()  # the SIGTERM-proof worker made its result, then took its sentinel
        # The pool sweeps once its old workers are all gone (a thread polls for that).
        deadline = time.monotonic() + 10
        while names_of(ex) and time.monotonic() < deadline:
            time.sleep(0.05)
        leaked = names_of(ex)
    finally:
        for n in names_of(ex):
            os.unlink(os.path.join(SHM, n))
    assert not leaked, f"parcels of a shut-down pool left while its process lives: {leaked}"


# -- a worker killed mid-task ---------------------------------------------------------------------


def test_worker_sigkilled_in_its_task(tmp_path):
    """A worker SIGKILLs itself holding its call's array while the next call is packed
    in the pipe: every future fails with BrokenProcessPool, and the queued call's
    parcel is removed as its task fails -- before any shutdown."""
    gate = str(tmp_path / "gate")
    ex = ProcessPoolExecutor(1)
    try:
        started_workers(ex, 1)
        futures = [ex.submit(W.die_when_queued, array(), gate)]
        futures += [ex.submit(W.double, array(BIG, i)) for i in range(4)]
        open(gate, "w").close()
        done, not_done = cf.wait(futures, timeout=60)
        assert not not_done
        for f in futures:
            assert isinstance(f.exception(), BrokenProcessPool), repr(f.exception())
        no_names(ex, what="once the broken pool failed its tasks (no shutdown yet)")
        with pytest.raises(BrokenProcessPool):
            ex.submit(W.double, array())
        assert not names_of(ex)
    finally:
        ex.shutdown()
    assert not names_of(ex)


@pytest.mark.parametrize("point", ["parcel-created", "parcel-written"])
def test_worker_killed_at_fault_point(point):
    """A worker dies at a fault point while packing a result (its 2nd): every future
    fails with BrokenProcessPool, and the half-made (or whole) parcel it left is
    removed -- by the broken pool itself once its workers are gone, at the latest
    by ``shutdown()``; ``remove_leftovers()`` meanwhile never takes a live pool's."""
    ex = ProcessPoolExecutor(1, initializer=W.arm_fault, initargs=(point, "kill", 2))
    try:
        (worker,) = started_workers(ex, 1)
        assert np.array_equal(ex.submit(W.double, array()).result(timeout=60), array() * 2)  # 1st pass
        futures = []
        for i in range(3):
            try:
                futures.append(ex.submit(W.double, array(BIG, i)))
            except BrokenProcessPool:  # (the worker died on an earlier one, and the pool knows already)
                assert futures
        cf.wait(futures, timeout=60)
        for f in futures:
            assert isinstance(f.exception(timeout=0), BrokenProcessPool), repr(f.exception())
        for rep in reports(prefix_of(ex)).values():  # whatever is still there is not abandoned
            assert rep.status in ("live", "creating"), rep
        assert not [r for r in F.remove_leftovers() if r.name.startswith(prefix_of(ex))]
        wait_until(
            lambda: not owner_alive(owner_word(worker)) or not os.path.exists(f"/proc/{worker}"),
            10,
            "the worker is gone",
        )
    finally:
        ex.shutdown()
    assert not names_of(ex), "shutdown() left the killed worker's parcel"


def test_broken_pool_removes_a_killed_workers_parcel_without_shutdown():
    """A pool whose worker died with a complete result parcel (``parcel-written``)
    removes it once its workers are gone, before any shutdown; then
    ``shutdown(wait=False)`` of the idle pool leaves nothing either."""
    ex = ProcessPoolExecutor(1, initializer=W.arm_fault, initargs=("parcel-written",))
    with pytest.raises(BrokenProcessPool):
        ex.submit(W.double, array()).result(timeout=60)
    no_names(ex, what="of a broken pool, without shutdown")
    finished = Finished(ex)
    ex.shutdown(wait=False)
    assert not names_of(ex)
    finished.join()


def test_worker_killed_at_fault_point_armed_through_environment(monkeypatch):
    """ULTRADICT_NG_FAULT reaches spawned workers (read at their import): each result
    parcel kills its maker at ``parcel-written``; ``with`` (shutdown) leaves nothing."""
    monkeypatch.setenv("ULTRADICT_NG_FAULT", "parcel-written:kill:1")
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=ctx) as ex:
        prefix = prefix_of(ex)
        futures = [ex.submit(W.double, array(BIG, i)) for i in range(4)]
        for f in futures:
            with pytest.raises(BrokenProcessPool):
                f.result(timeout=60)
    assert not shm_names(prefix)


def test_interpreter_exit_without_shutdown_sweeps(tmp_path):
    """A script whose pools are never shut down (or not waited for) -- one broken
    with a killed worker's complete parcel, one still running tasks, one broken
    after ``shutdown(wait=False)`` while a worker still makes its result -- exits
    leaving no name of any."""
    proc = script(tmp_path, "exit")
    try:
        out = read_line(proc, 120, proc.err_path)
        assert proc.wait(120) == 0, _text(proc.err_path)
    finally:
        end(proc)
    assert out["outcome"] == "BrokenProcessPool", out
    # (left_before_exit: a parcel made after the pool's sweeps, removed only at exit --
    # see test_result_parcel_made_after_the_idle_sweep_of_a_broken_pool)
    for token in out["tokens"]:
        assert not shm_names(f"{PL.POOL_PREFIX}{token}."), token


# -- the pool's process SIGKILLed -----------------------------------------------------------------


def _leftovers_of_dead_pool(info: dict[str, Any]) -> dict[str, F.ParcelReport]:
    """What a SIGKILLed pool left: its workers exit by themselves, ``parcels()`` reports
    each parcel as ``abandoned`` (or ``creating``: zero header, made less than
    PARCEL_STALE ago -- ``abandoned`` once aged), and the one-liner removes them all."""
    words = {int(p): w for p, w in info["workers"].items()}
    took = wait_gone(words, 10)
    assert took < 10
    prefix = f"{PL.POOL_PREFIX}{info['token']}."
    seen = reports(prefix)
    assert set(seen) == set(shm_names(prefix))
    for name, rep in seen.items():
        assert rep.status in ("abandoned", "creating"), rep
        assert maker_pid(name) in {info["pid"], *words}, rep
        if rep.status == "creating":  # killed before its ftruncate (empty) or its header
            assert header_of(name) in (b"", bytes(HEADER.size)), rep
            age(name)
        elif rep.owner_pid:
            assert rep.owner_pid == info["pid"], rep
    assert all(r.status == "abandoned" for r in reports(prefix).values()), reports(prefix)
    one_liner()
    assert not shm_names(prefix), "the one-liner removed every parcel of the dead pool"
    return seen


@pytest.mark.slow
def test_pool_process_sigkilled_at_random_instants(tmp_path):
    rng = random.Random()
    kinds: Counter = Counter()
    for _ in range(soak_scaled(3)):
        proc = script(tmp_path, "parent", "30")
        words: dict[int, int] = {}
        try:
            info = read_line(proc, 60, proc.err_path)
            words = {int(p): w for p, w in info["workers"].items()}
            assert len(words) == 2 and all(owner_alive(w) for w in words.values())
            time.sleep(rng.uniform(0.05, 0.8))
            assert proc.poll() is None, _text(proc.err_path)
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(30) == -signal.SIGKILL
            seen = _leftovers_of_dead_pool(info)
            kinds.update(r.status for r in seen.values())
        finally:
            end(proc)
            kill_if_alive(words)
    # A busy pool always has calls in flight: complete parcels (abandoned) or half-made
    # ones (creating), by the instant of the kill -- on a slow implementation all three
    # kills once landed while parcels were being made; each kind is checked above.
    assert kinds["abandoned"] + kinds["creating"] >= 1, kinds


@pytest.mark.slow
@pytest.mark.parametrize("point", ["parcel-created", "parcel-written"])
def test_pool_process_killed_at_fault_point(tmp_path, point):
    """The pool's process dies at a fault point while packing a call (its workers are
    disarmed): the parcel it was making is reported and removed like the rest."""
    after = random.randint(1, 8)
    proc = script(tmp_path, "parent", "60", fault=f"{point}:kill:{after}")
    words: dict[int, int] = {}
    try:
        info = read_line(proc, 60, proc.err_path)
        words = {int(p): w for p, w in info["workers"].items()}
        assert proc.wait(60) == -signal.SIGKILL, _text(proc.err_path)
        seen = _leftovers_of_dead_pool(info)
    finally:
        end(proc)
        kill_if_alive(words)
    own = {n: r for n, r in seen.items() if maker_pid(n) == info["pid"]}
    if point == "parcel-created":
        assert [r.status for r in own.values()].count("creating") == 1, seen
    else:
        assert any(
            (r.status, r.owner_pid, r.maker_pid) == ("abandoned", info["pid"], info["pid"])
            for r in own.values()
        ), seen


def test_one_liner_spares_live_pools(tmp_path):
    """Beside a dead pool's parcel, a live pool's queued call parcel and a parcel of
    a live owner that no pool of this process knows survive the one-liner; the
    live pool then completes its work."""
    started, gate = str(tmp_path / "started"), str(tmp_path / "gate")
    token = "zz" + uuid.uuid4().hex[:8]
    dead = pack(array(), token, owner_word() ^ (1 << L.PID_BITS), 1024)  # not us: another start time
    alive = pack(array(), token, owner_word(), 1024)
    assert dead.name and alive.name
    ex = ProcessPoolExecutor(1)
    try:
        with opened_at_exit(gate):
            blocker = ex.submit(W.wait_for_file, started, gate)
            wait_until(lambda: os.path.exists(started), 30, "the blocking task started")
            queued = ex.submit(W.double, array(BIG, 7.0))
            wait_until(
                lambda: [r for r in reports(prefix_of(ex)).values() if r.status == "live"],
                30,
                "the queued call is packed (its header written)",
            )
            live = names_of(ex) + [alive.name]
            seen = reports(PL.POOL_PREFIX)
            assert [seen[n].status for n in live] == ["live", "live"], seen
            assert seen[dead.name].status == "abandoned", seen
            one_liner()
            assert names_of(ex) + shm_names(alive.name) == live
            assert not shm_names(dead.name)
        blocker.result(timeout=60)
        assert np.array_equal(queued.result(timeout=60), array(BIG, 7.0) * 2)
        no_names(ex)
    finally:
        ex.shutdown()
        for n in shm_names(f"{PL.POOL_PREFIX}{token}."):
            os.unlink(os.path.join(SHM, n))
    assert not names_of(ex)


def test_every_future_completes_when_a_worker_dies_while_calls_are_pickled(tmp_path):
    """A worker dies while the feeder thread still pickles a call and another waits
    behind it, and the futures' done callbacks are slow: every future still fails
    with BrokenProcessPool (a call released meanwhile must not make the feeder
    thread fail a work item the broken pool is iterating over: that killed the
    pool's thread, left futures pending for ever and hung the interpreter's exit)."""
    proc = script(tmp_path, "feeding")
    words: dict[int, int] = {}
    try:
        out = read_line(proc, 60, proc.err_path)
        words = {int(p): w for p, w in out["workers"].items()}
        assert proc.wait(30) == 0, _text(proc.err_path)
    finally:
        end(proc)
        if words:
            wait_gone(words, 10)  # the watchdog ends a worker the script left behind
        kill_if_alive(words)
        for n in shm_names(f"{PL.POOL_PREFIX}{out['token']}.") if "out" in locals() else []:
            os.unlink(os.path.join(SHM, n))
    assert out["not_done"] == 0, out
    assert out["exceptions"] == ["BrokenProcessPool"], out


# -- a full /dev/shm -------------------------------------------------------------------------------


@pytest.mark.slow
def test_full_dev_shm(tmp_path):
    """A private 2 MiB /dev/shm: a call or a result too large fails its own future with
    OutOfSpace (an OSError) and leaves nothing; the pool goes on with what fits."""
    if os.geteuid() != 0 or not os.path.exists("/usr/bin/unshare"):
        pytest.skip("SKIPPED LOUDLY: needs root and unshare to mount a private, tiny /dev/shm")
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("ULTRADICT_NG_FAULT", None)
    proc = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f"mount -t tmpfs -o size=2m tmpfs /dev/shm && exec {sys.executable} -m tests.pool_workers full",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    if proc.returncode != 0 and "mount" in proc.stderr and "tests.pool_workers" not in proc.stderr:
        pytest.skip(f"SKIPPED LOUDLY: cannot mount a private /dev/shm here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("big_call", "big_result", "big_again"):
        assert out[key].startswith("OutOfSpace/True"), (key, out[key])
    for key in ("after_big_call", "after_big_result", "during", "final"):
        assert not [n for n in out[key] if n.startswith(PL.POOL_PREFIX)], (key, out[key])
    assert out["medium_ok"] and out["small_ok"], out
    assert out["final"] == [], out


# -- torture ----------------------------------------------------------------------------------------


def _payload(rng: random.Random) -> Any:
    n = rng.choice([rng.randint(1, 8000), rng.randint(8192, 200_000)])  # below and above 64 KiB
    kind = rng.randrange(7)
    if kind == 0:
        return np.arange(n, dtype=np.float64) + rng.random()
    if kind == 1:
        return np.asfortranarray(np.arange(n * 4, dtype=np.int32).reshape(n, 4))
    if kind == 2:
        return np.arange(2 * n, dtype=np.int64)[::2]
    if kind == 3:
        return bytearray(rng.randbytes(n * 8))
    if kind == 4:
        return rng.randbytes(n * 8)
    if kind == 5:
        return np.arange(n, dtype=np.int64).astype("datetime64[s]")
    return {"a": np.full(n, rng.random()), "l": [bytearray(n), np.ones(rng.randint(1, 20_000))], "k": n}


def _same(got: Any, want: Any) -> bool:
    if type(got) is not type(want):
        return False
    if isinstance(want, np.ndarray):
        return got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    return bool(got == want)


@pytest.mark.slow
def test_torture_submit_cancel_consume_concurrently():
    """Three threads submit array tasks to one pool, one cancels random futures, two
    consume random futures: every result of a task not cancelled is right, every
    cancel that succeeded is honoured, and at the end no name, no mapping (here or in
    the workers) and -- after shutdown -- no process is left."""
    seconds = min(max(SOAK_SECONDS, 5.0), 600.0)
    ex = ProcessPoolExecutor(2)
    prefix = prefix_of(ex)
    workers = started_workers(ex, 2)
    lock = threading.Lock()
    outstanding: list[Any] = []
    cancelled_ok: set = set()  # the futures whose cancel() said True
    errors: list[str] = []
    stats: Counter = Counter()
    stop, drained = threading.Event(), threading.Event()

    def count(key: str) -> None:
        with lock:
            stats[key] += 1

    def guarded(fn: Any, seed: int) -> threading.Thread:
        def run() -> None:
            try:
                fn(random.Random(seed))
            except BaseException as exc:  # reported below
                errors.append(f"{fn.__name__}: {exc!r}")
                stop.set()
                drained.set()

        return threading.Thread(target=run, name=fn.__name__)

    def submitter(rng: random.Random) -> None:
        while not stop.is_set():
            with lock:
                full = len(outstanding) >= 30
            if full:
                time.sleep(0.002)
                continue
            x = _payload(rng)
            f = ex.submit(W.transform, x)
            with lock:
                outstanding.append((f, x))
                stats["submitted"] += 1

    def canceller(rng: random.Random) -> None:
        while not stop.is_set():
            with lock:  # a future still listed: no consumer has it yet
                pick = rng.choice(outstanding)[0] if outstanding else None
                if pick is not None and pick.cancel():
                    cancelled_ok.add(pick)
            time.sleep(rng.uniform(0, 0.004))

    def check(f: Any, x: Any) -> None:
        with lock:
            said = f in cancelled_ok
            cancelled_ok.discard(f)
        if said or f.cancelled():
            assert f.cancelled(), "cancel() returned True, the future is not cancelled"
            with pytest.raises(cf.CancelledError):
                f.result(timeout=60)
            count("cancelled")
            return
        got = f.result(timeout=60)
        assert _same(got, W.transform(x)), f"wrong result for a {type(x).__name__}"
        count("ok")

    def consumer(rng: random.Random) -> None:
        while True:
            with lock:
                pick = outstanding.pop(rng.randrange(len(outstanding))) if outstanding else None
            if pick is None:
                if drained.is_set():
                    return
                time.sleep(0.002)
                continue
            check(*pick)

    try:
        logged = contextlib.ExitStack()
        callback_errors = logged.enter_context(futures_errors())
        producers = [guarded(submitter, i) for i in range(3)] + [guarded(canceller, 10)]
        consumers = [guarded(consumer, 20 + i) for i in range(2)]
        for t in producers + consumers:
            t.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.05)
        stop.set()
        for t in producers:
            t.join(120)
        drained.set()  # nothing is added any more: consumers empty the list and end
        for t in producers + consumers:
            t.join(120)
            assert not t.is_alive(), f"thread {t.name} hung"
        logged.close()
        assert not errors, errors
        assert not callback_errors, callback_errors[:3]  # e.g. a cancel() racing a result's rebuild
        assert not outstanding and not cancelled_ok
        assert stats["ok"] >= 20 and stats["cancelled"] >= 1, stats
        assert stats["ok"] + stats["cancelled"] == stats["submitted"], stats
        no_names(ex, what="after the torture")
        del producers, consumers
        unmapped("self", prefix)
        for w in workers:
            unmapped(w, prefix)
    finally:
        stop.set()
        drained.set()
        ex.shutdown()
    assert not shm_names(prefix)


# -- fuzz: garbage under the prefix ---------------------------------------------------------------


def _dead_child_word() -> int:
    """The owner word of a process that has ended (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        word = owner_word(p.pid)
    finally:
        p.kill()
        p.wait()
    return word


_LIVE_WORDS = [owner_word(), owner_word(1)]
_DEAD_WORDS: list[int] = []  # filled on first use (a reaped child), plus words no live process has
_NOT_A_PID = (1 << 22) + 12345  # above Linux's largest pid_max


def _dead_words() -> list[int]:
    if not _DEAD_WORDS:
        _DEAD_WORDS.extend(
            [
                _dead_child_word(),
                owner_word() ^ (1 << L.PID_BITS),  # our pid, another start time: pid reused
                _NOT_A_PID | (5 << L.PID_BITS),
                0,
            ]
        )
    return _DEAD_WORDS


KINDS_OF_FILES = [
    "live",
    "dead",
    "foreign",
    "zero",
    "zero_aged",
    "empty",
    "empty_aged",
    "short",
    "dir",
    "fifo",
    "symlink",
]

file_spec = st.tuples(
    st.sampled_from(KINDS_OF_FILES),
    st.integers(0, 3),  # which owner word
    st.binary(min_size=HEADER.size, max_size=HEADER.size),  # random header material
    st.integers(0, 3000),  # bytes after the header
    st.booleans(),  # age the file (for kinds whose status must not depend on it)
    st.integers(0, 2**64 - 1),  # maker word / payload length field
)


def _expected(spec: Any) -> Any:
    """(status, removed by remove_leftovers) of the file ``_make`` makes of ``spec``."""
    kind, _, _, tail, _, _ = spec
    if kind in ("zero", "zero_aged") and HEADER.size + tail < PL.PARCEL_HEADER:
        return "foreign", False  # too short for a parcel: a maker's is 0 or >= a header long
    return {
        "live": ("live", False),
        "dead": ("abandoned", True),
        "foreign": ("foreign", False),
        "zero": ("creating", False),
        "zero_aged": ("abandoned", True),
        "empty": ("creating", False),
        "empty_aged": ("abandoned", True),
    }.get(kind, ("foreign", False))


def _make(path: str, spec: Any, target: str) -> None:
    kind, which, raw, tail, aged, field = spec
    if kind == "dir":
        os.mkdir(path, 0o700)
        return
    if kind == "fifo":
        os.mkfifo(path, 0o600)
        return
    if kind == "symlink":  # to an abandoned-looking parcel elsewhere: never read through, never removed
        with open(target, "wb") as f:
            f.write(HEADER.pack(PL.PARCEL_MAGIC, _dead_words()[which], field, 0) + bytes(64))
        os.symlink(target, path)
        return
    if kind == "live":
        head = HEADER.pack(PL.PARCEL_MAGIC, _LIVE_WORDS[which % 2], field, field ^ 0xFFFF)
    elif kind == "dead":
        head = HEADER.pack(PL.PARCEL_MAGIC, _dead_words()[which], field, field >> 3)
    elif kind == "foreign":
        head = raw if raw != bytes(len(raw)) else b"\x01" + raw[1:]
        if head[:8] == PL.PARCEL_MAGIC:
            head = b"X" + head[1:]
    elif kind in ("zero", "zero_aged"):
        head = bytes(HEADER.size)
    elif kind == "short":  # shorter than a header, not all zeros
        head, tail = (raw[: 1 + field % (HEADER.size - 1)].rstrip(b"\0") or b"\x07"), 0
    else:
        head, tail = b"", 0
    with open(path, "xb") as f:
        f.write(head + random.Random(field).randbytes(tail) if head else b"")
    if kind.endswith("_aged") or (aged and kind in ("live", "dead", "foreign", "short")):
        then = time.time() - PL.PARCEL_STALE - 5 - (field % 10_000)
        os.utime(path, (then, then))


def within(fn: Any, fifos: list[str], timeout: float = 5.0) -> Any:
    """``fn()`` in a thread; if it has not returned within ``timeout`` (blocked on a
    FIFO?), open each FIFO for writing to release it, and fail."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        for path in fifos:
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(10)
        pytest.fail(f"{getattr(fn, '__name__', fn)} blocked for {timeout}s (on a FIFO under the prefix?)")
    assert out, "the call raised (see the thread's exception above)"
    return out[0]


@settings(
    max_examples=soak_scaled(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(file_spec, min_size=1, max_size=8))
def test_fuzz_parcels_and_remove_leftovers(specs):
    """Entries under the prefix with random headers (ours with live and dead owners,
    zero headers fresh and aged, long enough or not, empty files, foreign and short
    ones, a directory, a FIFO, a symlink to an abandoned-looking parcel):
    ``parcels()`` never raises nor blocks and classifies each as expected, and
    ``remove_leftovers()`` removes exactly the abandoned ones."""
    token = "fz" + uuid.uuid4().hex[:10]
    prefix = f"{PL.POOL_PREFIX}{token}."
    made = {}
    fd, target = tempfile.mkstemp(prefix="fz-parcel-target-")
    os.close(fd)
    try:
        for i, spec in enumerate(specs):
            name = f"{prefix}{i:x}-{uuid.uuid4().hex[:4]}"
            _make(os.path.join(SHM, name), spec, target)
            made[name] = spec
        fifos = [os.path.join(SHM, n) for n, spec in made.items() if spec[0] == "fifo"]
        seen = within(lambda: reports(prefix), fifos)
        assert set(seen) == set(made)
        for name, spec in made.items():
            assert seen[name].status == _expected(spec)[0], (spec, seen[name])
            if spec[0] in ("live", "dead"):
                want = _LIVE_WORDS[spec[1] % 2] if spec[0] == "live" else _dead_words()[spec[1]]
                assert seen[name].owner_pid == pid_of(want)
        dry = {r.name for r in within(lambda: F.remove_leftovers(dry_run=True), fifos)} & set(made)
        assert set(shm_names(prefix)) == set(made)  # a dry run removes nothing
        removed = {r.name for r in within(F.remove_leftovers, fifos)} & set(made)
        want_removed = {n for n, spec in made.items() if _expected(spec)[1]}
        assert removed == dry == want_removed
        assert set(shm_names(prefix)) == set(made) - want_removed
        assert os.path.exists(target), "a symlink was followed"
    finally:
        for name in shm_names(prefix):
            path = os.path.join(SHM, name)
            os.rmdir(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
        os.unlink(target)


def test_short_foreign_file_is_never_removed():
    """A file under the prefix too short to be a parcel, not empty: foreign, kept."""
    name = f"{PL.POOL_PREFIX}fz{uuid.uuid4().hex[:10]}.short"
    path = os.path.join(SHM, name)
    with open(path, "xb") as f:
        f.write(b"not a parcel")
    try:
        age(name)
        assert reports(name)[name].status == "foreign"
        F.remove_leftovers()
        assert os.path.exists(path), "remove_leftovers() removed a foreign file"
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_fifo_under_the_prefix_does_not_hang_parcels():
    """A FIFO under the prefix: reported foreign at once (a blocking open() hung for ever)."""
    name = f"{PL.POOL_PREFIX}fz{uuid.uuid4().hex[:10]}.fifo"
    path = os.path.join(SHM, name)
    os.mkfifo(path, 0o600)
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(reports(name)), daemon=True)
    try:
        t.start()
        t.join(3)
        hung = t.is_alive()
        if hung:  # a writer releases the blocked open()
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            t.join(10)
        assert not hung, "parcels() hung on a FIFO named like a parcel"
        assert result[0][name].status == "foreign"
    finally:
        os.unlink(path)


# -- fuzz: corrupted parcels and descriptors given to unpack ---------------------------------------


def _fds() -> int:
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


obj_spec = st.lists(st.integers(128, 40_000), min_size=1, max_size=3).map(  # 1 KiB+: out of band
    lambda ns: [np.arange(n, dtype=np.float64) for n in ns] + [bytearray(ns[0] * 8), b"s" * (ns[-1] * 8)]
)


@settings(max_examples=soak_scaled(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    obj=obj_spec,
    corruption=st.sampled_from(["none", "magic", "owner", "truncate", "missing", "length"]),
    r=st.randoms(use_true_random=False),
)
def test_fuzz_unpack_corrupted_parcel(obj, corruption, r):
    """A real parcel, then a wrong magic, owner or length, a truncated file or no
    file: ``unpack`` raises CorruptSegment (a ValueError), leaves no name, no
    descriptor open; uncorrupted, it rebuilds the object."""
    token = "fz" + uuid.uuid4().hex[:10]
    owner = owner_word()
    fds = _fds()
    parcel = pack(obj, token, owner, 1024)
    path = os.path.join(SHM, parcel.name)
    try:
        assert parcel.name and os.path.exists(path)
        size = os.path.getsize(path)
        taker = owner
        if corruption == "magic":
            with open(path, "r+b") as f:
                i = r.randrange(8)
                f.seek(i)
                f.write(bytes([PL.PARCEL_MAGIC[i] ^ r.randint(1, 255)]))
        elif corruption == "owner":
            taker = owner ^ r.randint(1, 2**64 - 1)
        elif corruption == "truncate":
            os.truncate(path, r.randrange(size))
        elif corruption == "missing":
            os.unlink(path)
        elif corruption == "length":
            with open(path, "r+b") as f:
                f.seek(24)
                f.write(struct.pack("<Q", r.randint(size - PL.PARCEL_HEADER + 1, 2**64 - 1)))
        if corruption == "none":
            got = unpack(parcel, taker)
            assert _same(got, obj)
            del got
        else:
            with pytest.raises(CorruptSegment) as info:
                unpack(parcel, taker)
            assert isinstance(info.value, ValueError)
        assert not os.path.exists(path), "unpack left the name"
        assert _fds() == fds, "unpack left a descriptor open"
    finally:
        if os.path.exists(path):
            os.unlink(path)


span = st.tuples(st.integers(-(1 << 20), 1 << 20), st.integers(-(1 << 20), 1 << 20), st.integers(-1, 3))
KINDS = range(3)  # VIEW, ARRAY, DATA (parcel.py)


@settings(max_examples=soak_scaled(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    obj=obj_spec,
    spans=st.one_of(st.none(), st.lists(span, max_size=6)),
    name=st.sampled_from(["same", "missing", "slash", "no prefix", "too long"]),
)
def test_fuzz_unpack_garbage_descriptor(obj, spans, name):
    """A reference with random spans (offsets and lengths anywhere, unknown kinds)
    or a garbage name: ``unpack`` raises CorruptSegment for what it can tell is
    wrong (a name not a parcel's or missing, a span in the header, negative, of
    an unknown kind, or past the end of the file), else rebuilds something or
    raises an ordinary exception -- never crashes, never leaves a descriptor,
    and never leaves the name of a parcel it opened."""
    token = "fz" + uuid.uuid4().hex[:10]
    fds = _fds()
    parcel = pack(obj, token, owner_word(), 1024)
    path = os.path.join(SHM, parcel.name)
    size = os.path.getsize(path)
    ref_spans = tuple(spans) if spans is not None else parcel.spans
    ref_name = {
        "same": parcel.name,
        "missing": parcel.name + "x",
        "slash": f"{PL.POOL_PREFIX}{token}/x",
        "no prefix": "udp" + token,
        "too long": PL.POOL_PREFIX + "z" * 300,
    }[name]
    bad_spans = any(k not in KINDS or off < PL.PARCEL_HEADER or n < 0 for off, n, k in ref_spans)
    outside = max((off + n for off, n, _ in ref_spans), default=0) > size
    try:
        try:
            got = unpack(Parcel(ref_name, parcel.data, ref_spans), owner_word())
        except CorruptSegment:
            outcome = "corrupt"
        except OSError as exc:  # a name the system refuses outright
            outcome = f"OSError {exc.errno}"
        except Exception as exc:  # an ordinary error of the unpickling
            outcome = type(exc).__name__
        else:
            outcome = "rebuilt"
            del got
        if name == "too long":  # the system refuses the name (EINVAL, ENAMETOOLONG)
            assert outcome == "corrupt" or outcome.startswith("OSError"), outcome
        elif name != "same" or bad_spans or outside:
            assert outcome == "corrupt", (outcome, ref_name, ref_spans, size)
        else:
            assert not outcome.startswith("OSError"), outcome
        if name == "same" and not bad_spans:
            assert not os.path.exists(path), "unpack left the name of a parcel it opened"
        assert _fds() == fds
    finally:
        if os.path.exists(path):
            os.unlink(path)
