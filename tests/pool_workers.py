"""Tasks, initializers and scripts of the process-pool leak tests
(``test_futures_leaks.py``): importable by spawned workers and runnable as
``python -m tests.pool_workers SCRIPT ...``.

Every task returns within a bounded time; the scripts end by themselves
(within their deadline) unless the test SIGKILLs them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import numpy as np

from ultradict_ng._platform import faults
from ultradict_ng._platform.owner import owner_word

SHM = "/dev/shm"
PARCELS = "@udp"


# -- looking at /dev/shm and /proc ---------------------------------------------------------------


def shm_names(prefix: str = PARCELS) -> list[str]:
    """Entries of /dev/shm starting with ``prefix``."""
    try:
        return sorted(e for e in os.listdir(SHM) if e.startswith(prefix))
    except OSError:
        return []


def mapped(pid: Any = "self", prefix: str = PARCELS) -> list[str]:
    """The lines of ``/proc/<pid>/maps`` that map a /dev/shm entry starting with ``prefix``
    (taken parcels show as ``/dev/shm/@udp... (deleted)``); [] if the process is gone."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return [line for line in f if f"{SHM}/{prefix}" in line]
    except OSError:
        return []


def maker_pid(name: str) -> int:
    """The pid of the process that made parcel ``name`` (``@udp<pool>.<maker36>-<seq36>``)."""
    return int(name.rsplit(".", 1)[1].split("-")[0], 36)


def pool_token() -> str:
    """In a worker: its pool's token (the prefix of the pool's parcel names)."""
    from ultradict_ng.futures import executor

    assert executor._worker is not None, "not in a pool worker"
    return executor._worker[0]


# -- tasks -----------------------------------------------------------------------------------------


def double(a: Any) -> Any:
    return a * 2


def transform(x: Any) -> Any:
    """A deterministic function of every payload kind the torture test sends (run
    in-process too, for the expected value)."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind in "mM":
            return x + np.timedelta64(1, "s")
        return x * 3 + 1
    if isinstance(x, bytearray):
        out = bytearray(x)
        out[:1] = b"!"
        return out
    if isinstance(x, bytes):
        return x[::-1]
    if isinstance(x, dict):
        return {k: transform(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(transform(v) for v in x)
    return x


def pid() -> int:
    return os.getpid()


def wait_for_file(started: str, gate: str, timeout: float = 60.0) -> int:
    """Say it started (a file), then block until ``gate`` exists (at most ``timeout``)."""
    with open(started, "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + timeout
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.getpid()


def sleep_then_ones(seconds: float, n: int) -> Any:
    time.sleep(seconds)
    return np.ones(n)


def die_when_queued(a: Any, gate: str, timeout: float = 10.0) -> None:
    """Hold the call's array; once ``gate`` exists and the pool has queued another
    call's parcel (packed, in the pipe), SIGKILL this worker."""
    prefix = f"{PARCELS}{pool_token()}."
    deadline = time.monotonic() + timeout
    while not (os.path.exists(gate) and shm_names(prefix)) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert a.size  # the call's array is mapped right now
    os.kill(os.getpid(), signal.SIGKILL)


def fail_with_array(a: Any) -> None:
    raise ValueError(f"failed on purpose with {a.nbytes} bytes")


def with_a_lock(a: Any) -> Any:
    """A result that cannot be pickled (after its array was taken out of band)."""
    import threading

    return [a * 2, threading.Lock()]


def die_at_gate(gate: str, timeout: float = 30.0, started: str = "") -> None:
    """Block until ``gate`` exists, then SIGKILL this worker."""
    if started:
        open(started, "w").close()
    deadline = time.monotonic() + timeout
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(os.getpid(), signal.SIGKILL)


def outlive_the_pool(started: str, workers: list[int], n: int, timeout: float = 30.0) -> Any:
    """Ignore SIGTERM (as a task may), say it started, wait until every other worker of
    the pool is dead, give the pool a second to fail its futures, then return a
    large result: its parcel is made after the pool gave up on this task."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    words = {p: owner_word(p) for p in workers if p != os.getpid()}
    with open(started, "w") as f:
        f.write(str(os.getpid()))
    from ultradict_ng._platform.owner import owner_alive

    deadline = time.monotonic() + timeout
    while any(owner_alive(w) for w in words.values()) and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(1.0)
    return np.ones(n)


# -- initializers ----------------------------------------------------------------------------------


def arm_fault(point: str, action: str = "kill", after: int = 1) -> None:
    faults.arm(point, action, after)


def disarm() -> None:
    """For a pool whose parent was armed through the environment: only the parent dies."""
    faults.disarm()


# -- scripts ---------------------------------------------------------------------------------------


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def parent(seconds: float) -> None:
    """A pool kept busy with array tasks for ``seconds`` (until SIGKILLed, by the test or
    by a fault point armed through ULTRADICT_NG_FAULT: the workers disarm).  Prints
    one line once its workers run: its pid, their pids and owner words, the pool's token."""
    from ultradict_ng.futures import ProcessPoolExecutor

    ex = ProcessPoolExecutor(2, initializer=disarm)
    workers = {p for p in (f.result() for f in [ex.submit(pid) for _ in range(4)])}
    workers |= set(ex._processes)
    _say(
        {
            "pid": os.getpid(),
            "token": ex._pool.token,
            "workers": {str(p): owner_word(p) for p in sorted(workers)},
        }
    )
    deadline = time.monotonic() + seconds
    rng = np.random.default_rng(os.getpid())
    inflight: list[Any] = []
    done = 0
    while time.monotonic() < deadline:
        while len(inflight) < 6:
            a = np.full(int(rng.integers(20_000, 200_000)), float(done))
            inflight.append((ex.submit(double, a), a))
        f, a = inflight.pop(0)
        assert np.array_equal(f.result(timeout=60), a * 2)
        done += 1
    ex.shutdown()
    _say({"done": done})


def exit_without_shutdown() -> None:
    """Three pools never shut down (or not waited for): one broken by a worker killed
    with a complete result parcel (``parcel-written``); one with tasks still running
    when the interpreter exits; one shut down without waiting, then broken while a
    worker that ignores SIGTERM still makes a result parcel (after the pool's own
    sweeps: only the exit sweep is left to remove it).  No name of any may be left."""
    import tempfile

    from ultradict_ng.futures import BrokenProcessPool, ProcessPoolExecutor

    broken = ProcessPoolExecutor(1, initializer=arm_fault, initargs=("parcel-written",))
    busy = ProcessPoolExecutor(2)
    late = ProcessPoolExecutor(2)
    tokens = [broken._pool.token, busy._pool.token, late._pool.token]
    f = broken.submit(np.ones, 100_000)
    try:
        f.result(timeout=60)
        outcome = "no error"
    except BrokenProcessPool:
        outcome = "BrokenProcessPool"
    for _ in range(4):
        busy.submit(sleep_then_ones, 0.2, 100_000)
    busy.submit(double, np.ones(100_000))

    tmp = tempfile.mkdtemp()
    started, gate = os.path.join(tmp, "started"), os.path.join(tmp, "gate")
    workers = {f.result(timeout=60) for f in [late.submit(pid) for _ in range(8)]} | set(late._processes)
    outliving = late.submit(outlive_the_pool, started, sorted(workers), 100_000)
    while not os.path.exists(started):
        time.sleep(0.005)
    dying = late.submit(die_at_gate, gate)
    procs = list(late._processes.values())
    late.shutdown(wait=False)
    open(gate, "w").close()
    for fut in (outliving, dying):
        try:
            fut.result(timeout=60)
        except BrokenProcessPool:
            pass
    for p in procs:
        p.join(60)
    left = shm_names(f"{PARCELS}{tokens[2]}.")  # made after the pool's sweeps, if any
    for name in (started, gate):
        os.unlink(name)
    os.rmdir(tmp)
    _say({"tokens": tokens, "outcome": outcome, "left_before_exit": left})


def _arrive(marker: str, seconds: float, payload: Any) -> Any:
    """Rebuilt in the pool's process: says so (a file), then takes ``seconds``."""
    open(marker, "w").close()
    time.sleep(seconds)
    return payload


class ArrivesSlowly:
    """A result whose rebuilding in the pool's process takes a while."""

    def __init__(self, marker: str, seconds: float, payload: Any) -> None:
        self.args = (marker, seconds, payload)

    def __reduce__(self) -> Any:
        return _arrive, self.args


def slow_on_arrival(marker: str, seconds: float, a: Any) -> Any:
    return ArrivesSlowly(marker, seconds, a * 2)


class SlowToPickle:
    """An argument whose pickling takes ``seconds``: keeps the pool's feeder thread busy."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __reduce__(self) -> Any:
        time.sleep(self.seconds)
        return SlowToPickle, (0.0,)


def size_of(x: Any) -> int:
    return len(x)


def broken_while_feeding() -> None:
    """A worker dies while the pool's feeder thread is still pickling a call (a slow
    argument) and another call waits behind it; the futures' done callbacks are slow
    (a user's), so the pool takes a while to fail them.  Prints how many futures
    completed within 8 s (all should: BrokenProcessPool), then leaves at once."""
    import concurrent.futures as cf
    import tempfile

    from ultradict_ng.futures import ProcessPoolExecutor

    tmp = tempfile.mkdtemp()
    gate, started = os.path.join(tmp, "gate"), os.path.join(tmp, "started")
    ex = ProcessPoolExecutor(1)
    first = ex.submit(die_at_gate, gate, 30.0, started)
    while not os.path.exists(started):
        time.sleep(0.005)
    workers = {str(p): owner_word(p) for p in ex._processes}
    slow = ex.submit(size_of, [np.ones(100_000), SlowToPickle(1.0)])  # the feeder pickles it for 1 s
    behind = ex.submit(size_of, np.ones(100_000))  # waits in the feeder's buffer
    rest = [ex.submit(size_of, np.ones(100_000)) for _ in range(30)]
    futures = [first, slow, behind, *rest]
    for f in futures:
        f.add_done_callback(lambda f: time.sleep(0.1))
    open(gate, "w").close()
    done, not_done = cf.wait(futures, timeout=8)
    kinds = sorted({type(f.exception()).__name__ for f in done if not f.cancelled()})
    manager = ex._executor_manager_thread
    _say(
        {
            "pid": os.getpid(),
            "token": ex._pool.token,
            "workers": workers,
            "done": len(done),
            "not_done": len(not_done),
            "exceptions": kinds,
            "manager_alive": bool(manager is not None and manager.is_alive()),
        }
    )
    os.unlink(gate)
    os.unlink(started)
    os.rmdir(tmp)
    os._exit(0)  # (a normal exit would wait for ever for a worker nobody ends: see the test)


def full_shm() -> None:
    """Run inside a private 2 MiB /dev/shm: a call or a result too large for it fails
    its own future with OutOfSpace, leaves nothing, and the pool goes on."""
    from ultradict_ng.errors import OutOfSpace
    from ultradict_ng.futures import ProcessPoolExecutor

    out: dict[str, Any] = {}

    def outcome(f: Any) -> str:
        try:
            r = f.result(timeout=60)
        except OutOfSpace as exc:
            return f"OutOfSpace/{isinstance(exc, OSError)}: {exc}"
        except BaseException as exc:
            return f"{type(exc).__name__}: {exc}"
        return f"ok {type(r).__name__}"

    with ProcessPoolExecutor(1) as ex:
        out["big_call"] = outcome(ex.submit(np.sum, np.ones(4 << 17)))  # 4 MiB argument
        out["after_big_call"] = shm_names("")
        out["big_result"] = outcome(ex.submit(np.ones, 4 << 17))  # 4 MiB result
        out["after_big_result"] = shm_names("")
        a = np.arange(64 << 10, dtype=np.float64)  # 512 KiB: fits
        r = ex.submit(double, a).result(timeout=60)
        out["medium_ok"] = bool(np.array_equal(r, a * 2))
        del r
        out["small_ok"] = ex.submit(sum, [1, 2, 3]).result(timeout=60) == 6
        out["big_again"] = outcome(ex.submit(np.sum, np.ones(4 << 17)))
        out["during"] = shm_names("")
    out["final"] = shm_names("")
    _say(out)


if __name__ == "__main__":
    script = sys.argv[1]
    if script == "parent":
        parent(float(sys.argv[2]))
    elif script == "exit":
        exit_without_shutdown()
    elif script == "full":
        full_shm()
    elif script == "feeding":
        broken_while_feeding()
    else:
        raise SystemExit(f"unknown script {script!r}")
