"""The cross-process lock: reentrancy, threads, timeouts, dead owners, fork."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time

import pytest

from tests import helpers
from tests.conftest import soak_scaled
from ultradict_ng import LockTimeout, SharedDict

spawn = multiprocessing.get_context("spawn")


@pytest.fixture
def d(name):
    d = SharedDict({"n": 0}, name=name)
    yield d
    d.close()


def test_reentrant_and_shared_by_handles_of_one_process(d):
    other = SharedDict(name=d.name)
    with d.lock:
        with d.lock:
            with other.lock:  # a second handle of the same dict in the same thread
                other["n"] += 1
                assert d.lock.held() and other.lock.held()
            assert d.lock.held()
        assert d.lock.held()
    assert not d.lock.held()
    assert d.lock.owner_pid is None
    with d:  # `with d:` takes the same lock
        assert d.lock.owner_pid == os.getpid()
    other.close()
    assert d["n"] == 1


def test_release_without_holding_raises(d):
    with pytest.raises(RuntimeError):
        d.lock.release()


def test_threads_exclude_each_other(d):
    def work():
        for _ in range(300):
            with d.lock:
                d["n"] += 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert d["n"] == 1200


def test_nonblocking_and_timeout_name_the_holder(d):
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=helpers.hold_lock_forever, args=(d.name, ready))
    p.start()
    try:
        assert ready.wait(10)
        assert d.lock.acquire(blocking=False) is False
        t0 = time.monotonic()
        with pytest.raises(LockTimeout) as info:
            d.lock.acquire(timeout=0.3)
        assert 0.25 <= time.monotonic() - t0 < 3
        assert isinstance(info.value, TimeoutError)
        assert info.value.pid == p.pid and str(p.pid) in str(info.value)
        with pytest.raises(LockTimeout):
            with d.lock(timeout=0.1):
                pass
    finally:
        p.kill()
        p.join()


def test_timeout_from_another_thread_of_this_process(d):
    taken, done = threading.Event(), threading.Event()

    def holder():
        with d.lock:
            taken.set()
            done.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    taken.wait(10)
    try:
        assert d.lock.acquire(blocking=False) is False
        with pytest.raises(LockTimeout) as info:
            d.lock.acquire(timeout=0.1)
        assert info.value.pid == os.getpid()
    finally:
        done.set()
        t.join()


def test_dead_holder_is_recovered_within_a_second(d, caplog):
    ready = spawn.Event()
    p = spawn.Process(target=helpers.hold_lock_forever, args=(d.name, ready))
    p.start()
    assert ready.wait(30)
    os.kill(p.pid, signal.SIGKILL)
    time.sleep(0.05)  # the child is now a zombie until joined: that must count as dead
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="ultradict_ng"):
        with d.lock(timeout=5):
            waited = time.monotonic() - t0
            d["n"] += 1
    p.join()
    assert waited < 1.0, waited
    warnings = [r for r in caplog.records if "recovered" in r.getMessage()]
    assert len(warnings) == 1 and str(p.pid) in warnings[0].getMessage()
    assert d["n"] == 1


def test_nonblocking_acquire_recovers_dead_holder(d):
    ready = spawn.Event()
    p = spawn.Process(target=helpers.hold_lock_forever, args=(d.name, ready))
    p.start()
    assert ready.wait(30)
    p.kill()
    p.join()
    assert d.lock.acquire(blocking=False) is True
    d.lock.release()


def test_pid_reuse_is_detected(d):
    """A lock word naming a live pid with another start time belongs to a dead process."""
    from ultradict_ng._shm import layout as L
    from ultradict_ng._shm.lock import owner_alive, owner_word

    mine = owner_word()
    assert owner_alive(mine)
    fake = (os.getpid() & L.PID_MASK) | (((mine >> L.PID_BITS) + 12345) << L.PID_BITS)
    assert not owner_alive(fake)
    d._store._map.atomic.store(L.W_LOCK, fake)  # as if a previous owner with our pid died
    with d.lock(timeout=2):
        d["n"] += 1
    assert d["n"] == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_does_not_inherit_holding(d):
    ctx = multiprocessing.get_context("fork")
    with d.lock:
        p = ctx.Process(target=helpers.increment, args=(d.name, "n", 5))
        p.start()  # forked while the parent holds the lock
        time.sleep(0.3)
        assert d["n"] == 0  # the child is waiting for us, not holding a copy of our lock
    p.join(30)
    assert p.exitcode == 0
    assert d["n"] == 5


def test_fork_child_handle_works(d):
    ctx = multiprocessing.get_context("fork")
    d["n"] = 10

    def child():
        with d.lock:
            d["n"] += 1

    p = ctx.Process(target=child)
    p.start()
    p.join(30)
    assert p.exitcode == 0
    assert d["n"] == 11


def test_contention_between_spawned_processes_is_exact(d):
    per = soak_scaled(200)
    procs = [spawn.Process(target=helpers.increment, args=(d.name, "n", per)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert d["n"] == 4 * per


def _hold_then_release(
    name: str, held: multiprocessing.synchronize.Event, release: multiprocessing.synchronize.Event
) -> None:
    d = SharedDict(name=name)
    with d.lock:
        held.set()
        release.wait(30)
    d.close()


@pytest.mark.parametrize("stale", ["pending", "dead designated"])
def test_a_stale_wake_in_flight_delays_a_sleeping_waiter_by_at_most_a_liveness_check(d, stale):
    """LOCK_WAKING left set -- a woken sleeper killed before it claimed the wake
    (1), or a designated waiter killed before it cleared it (its owner word) --
    stops releases from waking sleepers; a sleeper's own time limit must then
    take the released lock within about LOCK_CHECK_INTERVAL, and clear the flag."""
    import subprocess
    import sys

    from ultradict_ng._shm import layout as L
    from ultradict_ng._shm import waiting
    from ultradict_ng._shm.lock import owner_word

    if stale == "pending":
        flag = 1
    else:
        dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        flag = owner_word(dead.pid)
        dead.kill()
        dead.wait(10)

    ctx = multiprocessing.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_then_release, args=(d.name, held, release))
    holder.start()
    try:
        assert held.wait(30)
        words = d._store._map.words
        got = []

        def wait_for_lock() -> None:
            got.append((d.lock.acquire(timeout=10), time.monotonic()))
            d.lock.release()

        waiter = threading.Thread(target=wait_for_lock)
        waiter.start()
        time.sleep(0.3)  # asleep on the futex by now (registered, where there is one)
        if waiting.MODE == "futex":
            assert words[L.W_LOCK_WAITERS] != 0
        words[L.W_LOCK_WAKING] = flag  # as a dead waiter leaves it
        t0 = time.monotonic()
        release.set()
        waiter.join(10)
        assert got and got[0][0] is True
        assert got[0][1] - t0 < L.LOCK_CHECK_INTERVAL + 0.3
        assert words[L.W_LOCK_WAITERS] == 0
        if waiting.MODE == "futex":  # (pollers never take the designated role)
            assert words[L.W_LOCK_WAKING] == 0
    finally:
        release.set()
        holder.join(30)
    assert holder.exitcode == 0


# -- the front end, on every backend ----------------------------------------------------------


@pytest.fixture
def bd(each_backend, name):
    """A dict on each backend (conftest: each_backend)."""
    d = SharedDict({"n": 0}, name=name)
    yield d
    d.close()


def test_one_front_end_owns_the_policy():
    """Reentrancy, threads, timeouts and the context managers are written once:
    no backend class overrides them (each implements only its shared part)."""
    from ultradict_ng import SharedLock
    from ultradict_ng._redis.lease import LeaseLock
    from ultradict_ng._shm.lock import ShmLock

    policy = [
        "acquire",
        "try_acquire",
        "release",
        "held",
        "locked",
        "owner_pid",
        "wait_until_free",
        "__call__",
        "__enter__",
        "__exit__",
        "_take_after_enter",
        "_timeout_error",
    ]
    for cls in (ShmLock, LeaseLock):
        assert issubclass(cls, SharedLock)
        assert [m for m in policy if m in vars(cls)] == [], cls


def test_reentrancy_owner_checks_and_locked_on_every_backend(bd):
    from ultradict_ng import SharedLock

    lock = bd.lock
    assert isinstance(lock, SharedLock)
    assert not lock.locked() and lock.owner_pid is None
    with lock:
        with lock(timeout=1):
            assert lock.held() and lock.locked() and lock.owner_pid == os.getpid()
            bd["n"] += 1
        assert lock.held()
    assert not lock.held() and not lock.locked()
    with pytest.raises(RuntimeError, match="which this thread does not hold"):
        lock.release()
    with pytest.raises(ValueError):
        lock.acquire(timeout=-1)
    assert lock.try_acquire() and lock.try_acquire()  # (reentrant too)
    lock.release()
    lock.release()
    assert not lock.locked() and bd["n"] == 1


def test_another_thread_of_this_process_on_every_backend(bd, each_backend):
    lock = bd.lock
    taken, done = threading.Event(), threading.Event()

    def holder():
        with lock:
            taken.set()
            done.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert taken.wait(10)
    try:
        assert lock.acquire(blocking=False) is False
        assert lock.try_acquire() is False
        with pytest.raises(LockTimeout) as info:
            lock.acquire(timeout=0.1)
        assert info.value.pid == os.getpid()
        if each_backend == "shm":  # (the wording each backend always had)
            assert f"within 0.1s (held by pid {os.getpid()})" in str(info.value)
        else:
            assert "within 0.1 s: held by another thread of this process" in str(info.value)
        assert lock.wait_until_free(0.1) is False
    finally:
        done.set()
        t.join()


def test_wait_until_free_wakes_at_the_release_on_every_backend(bd):
    """What the asyncio face's helper thread sleeps in: it returns at the
    release, not at its timeout, and takes nothing."""
    lock = bd.lock
    lock.acquire()
    got = []

    def waiter():
        t0 = time.monotonic()
        got.append((lock.wait_until_free(5), time.monotonic() - t0))

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)
    assert not got  # the lock is held: still waiting
    lock.release()
    t.join(10)
    assert got and got[0][0] is True and 0.25 <= got[0][1] < 1.5, got
    assert not lock.locked() and lock.wait_until_free(0) is True
