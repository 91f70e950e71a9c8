"""The wait register (layout: "Waiting and waking"): sleeping lock waiters (exact
counts with waiters on the futex, polling and both), waiters and holders
SIGKILLed while others sleep, registrations of dead processes swept, a full
register falling back to polling, and uncontended paths that never touch it.

Lost wake-ups are hidden by the lock sleepers' periodic owner-liveness checks
(every 0.2 s), so the tests that must see them use ``patient`` workers, whose
checks come every 30 s: only a wake hands them the lock in time.  Change waiters
get a 60 s ``WAIT_SLICE`` for the same reason.  Every wait is bounded.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time
from typing import Any

import pytest

from tests import wait_workers
from tests.wait_workers import in_thread, registered, slot_of, slots, stop, wait_until, words
from ultradict_ng import SharedDict
from ultradict_ng._platform.owner import owner_word
from ultradict_ng._shm import layout as L
from ultradict_ng._shm import waiting
from ultradict_ng.speedups import FUTEX

spawn = multiprocessing.get_context("spawn")
WAIT_WORDS = (L.W_CHANGE_WAITERS, L.W_CHANGE_SEQ, L.W_LOCK_WAITERS, L.W_LOCK_SEQ, L.W_LOCK_WAKING)


@pytest.fixture
def pair(name: str):
    """The creator ``d`` (writes) and an attached handle ``r`` (waits)."""
    d = SharedDict(name=name, recurse=True, buffer_size=4096)
    r = SharedDict(name=name, create=False)
    yield d, r
    r.close()
    d.close()


@pytest.fixture
def futex_children(monkeypatch: Any) -> None:
    """Children (which inherit our environment) wait on the futex."""
    if not FUTEX:
        pytest.skip("no futex on this platform")
    monkeypatch.delenv(waiting.ENV_VAR, raising=False)


def start(target: Any, *args: Any) -> Any:
    p = spawn.Process(target=target, args=args)
    p.start()
    return p


def assert_register_empty(d: SharedDict) -> None:
    """No registration left, and no lock wake in flight.  LOCK_WAKING may be a
    pending 1: a release's WAITERS load races with a waiter that has just taken the
    lock and cleared LOCK_WAKING but not yet its bit; that release takes the wake
    and wakes nobody (layout: "Waiting and waking"), and the next waiter about to
    sleep claims it.  A process's owner word there would be a designated waiter
    that never gave its role back: releases would stop waking anyone."""
    w = words(d)
    assert (w[L.W_LOCK_WAITERS], w[L.W_CHANGE_WAITERS]) == (0, 0)
    assert not any(slots(d)), [hex(s) for s in slots(d) if s]
    assert w[L.W_LOCK_WAKING] in (0, 1), f"LOCK_WAKING left at {w[L.W_LOCK_WAKING]:#x}"


@pytest.mark.parametrize(
    "modes", [("futex",) * 4, ("poll",) * 4, ("futex", "poll") * 2], ids=["futex", "poll", "mixed"]
)
def test_lock_contention_is_exact_in_every_wait_mode(dicts, name, monkeypatch, modes):
    """Four spawned processes, ``with d.lock: d["n"] += 1``; the futex sleepers are
    patient, so only wake-ups hand the lock over in time."""
    if "futex" in modes and not FUTEX:
        pytest.skip("no futex on this platform")
    per = 150
    d = dicts({"n": 0}, name=name)
    out = spawn.Queue()
    procs = []
    try:
        for m in modes:
            monkeypatch.setenv(waiting.ENV_VAR, m)  # read by the child at import
            procs.append(start(wait_workers.locked_increments, name, per, True, out))
        t0 = time.monotonic()
        got = sorted(out.get(timeout=60) for _ in procs)
        elapsed = time.monotonic() - t0
        for p in procs:
            p.join(10)
            assert p.exitcode == 0
    finally:
        stop(*procs)
    assert got == sorted(modes)
    assert d["n"] == per * len(modes)
    assert elapsed < 20, f"{elapsed:.1f}s: a sleeper waited for its 30 s liveness check (lost wake-up)"
    assert_register_empty(d)
    d.close()


def test_a_lock_waiter_that_returned_leaves_no_registration(dicts, name, mode):
    d = dicts({"n": 0}, name=name)
    ready, release = spawn.Event(), spawn.Event()
    holder = None
    try:
        holder = start(wait_workers.lock_holder, name, ready, release)
        assert ready.wait(60)
        threading.Timer(0.3, release.set).start()
        with d.lock(timeout=10):  # sleeps (futex) or polls until the holder releases
            d["n"] += 1
        holder.join(10)
        assert holder.exitcode == 0
    finally:
        release.set()
        if holder is not None:
            stop(holder)
    assert_register_empty(d)
    w = words(d)
    seq = w[L.W_LOCK_SEQ]
    for _ in range(5):  # uncontended: no wake, LOCK_SEQ stays
        with d.lock:
            d["n"] += 1
    assert w[L.W_LOCK_SEQ] == seq and d["n"] == 6
    d.close()


def kill_sleeping_lock_waiter(d: SharedDict) -> int:
    """Start a process that blocks in ``with d.lock`` (the lock must be held), let it
    fall asleep, SIGKILL it; its slot index (its registration stays behind)."""
    started, done = spawn.Queue(), spawn.Queue()
    p = start(wait_workers.lock_sleeper, d.name, started, done)
    try:
        pid = started.get(timeout=60)
        slot = registered(d, pid, L.W_LOCK_WAITERS)
        time.sleep(0.2)  # asleep in the kernel
        os.kill(pid, signal.SIGKILL)
        p.join(10)
    finally:
        stop(p)
    assert done.empty()
    assert slot_of(d, pid) == slot and words(d)[L.W_LOCK_WAITERS] >> slot & 1  # left behind
    return slot


def test_lock_waiter_killed_asleep_is_swept_by_the_next_release(dicts, name, futex_children):
    """A holder process, a waiter process asleep in ``with d.lock``, SIGKILLed; the
    holder's release wakes nobody, so it sweeps: the dead slot and bit are cleared."""
    d = dicts({"n": 0}, name=name)
    ready, release = spawn.Event(), spawn.Event()
    holder = start(wait_workers.lock_holder, name, ready, release)
    try:
        assert ready.wait(60)
        slot = kill_sleeping_lock_waiter(d)
        release.set()
        holder.join(10)
        assert holder.exitcode == 0
    finally:
        release.set()
        stop(holder)
    wait_until(lambda: words(d)[L.W_WAIT_SLOTS + slot] == 0, 3, "the dead waiter's slot freed")
    assert_register_empty(d)
    with d.lock(timeout=5):
        d["n"] += 1
    d["m"] = 1
    assert d["n"] == 1 and d.copy() == {"n": 1, "m": 1}
    d.close()


@pytest.mark.parametrize("cause", ["waiter-killed-asleep", "waiter-took-it-awake"])
def test_a_release_that_woke_nobody_does_not_strand_later_sleepers(dicts, name, futex_children, cause):
    """A release takes the one wake in flight (LOCK_WAKING 0 -> 1) and wakes nobody:

    * the waiter it meant was killed asleep: as for a dead designated waiter, the
      flag may stay set, and the next sleeper's own liveness check must then take
      the lock within about LOCK_CHECK_INTERVAL (and clear the flag);
    * the waiter had registered but not yet slept (paused right after waiter step
      1), and then took the free lock without sleeping: it was alive and never the
      designated one, so no wake is in flight any more -- the next release must
      wake the next sleeper (a patient one: its liveness check is 30 s away), or
      that wake-up is lost.
    """
    patient = cause == "waiter-took-it-awake"
    d = dicts({"n": 0}, name=name)
    d.lock.acquire()
    if not patient:
        kill_sleeping_lock_waiter(d)
        d.lock.release()  # wakes nobody (and sweeps the dead slot)
    else:
        registered_, go, done0 = spawn.Event(), spawn.Event(), spawn.Queue()
        p0 = start(wait_workers.lock_waiter_paused, name, registered_, go, done0)
        try:
            assert registered_.wait(60)
            assert words(d)[L.W_LOCK_WAITERS] != 0
            d.lock.release()  # sees the bit: takes LOCK_WAKING, wakes... nobody is asleep
            go.set()
            done0.get(timeout=30)  # the waiter took the lock without sleeping
            p0.join(10)
            assert p0.exitcode == 0
            # It was sent the wake and stopped undesignated: it cleared it (no release
            # raced with its exit here: ours came before it went on).
            assert words(d)[L.W_LOCK_WAKING] == 0
        finally:
            go.set()
            stop(p0)
    assert_register_empty(d)
    d.lock.acquire()
    started, done = spawn.Queue(), spawn.Queue()
    p = start(wait_workers.lock_sleeper, name, started, done, patient)
    try:
        pid = started.get(timeout=60)
        registered(d, pid, L.W_LOCK_WAITERS)
        time.sleep(0.3)  # asleep, past its first liveness check
        t0 = time.monotonic()
        d.lock.release()
        try:
            _, when = done.get(timeout=5)
        except queue.Empty:
            pytest.fail(
                f"the sleeper was not woken by the release (LOCK_WAKING = "
                f"{words(d)[L.W_LOCK_WAKING]:#x}, left set by the release that woke nobody)"
            )
        bound = 2.0 if patient else L.LOCK_CHECK_INTERVAL + 0.5
        assert when - t0 < bound, f"the sleeper took the lock {when - t0:.2f}s after the release"
        p.join(10)
        assert p.exitcode == 0
    finally:
        stop(p)
    assert d["n"] == (2 if patient else 1)
    assert_register_empty(d)
    d.close()


def test_a_waiter_registered_before_a_wake_for_nobody_is_not_stranded(dicts, name, futex_children):
    """The interleaving that strands a live waiter, step by step: waiter A registers
    (and is descheduled before it reads LOCK_SEQ); the holder releases, sees A's bit,
    takes the one wake in flight (LOCK_WAKING 0 -> 1) and wakes nobody; the lock is
    taken again before A runs; A reads the new LOCK_SEQ, fails its CAS and sleeps.
    The next release must wake A (a patient waiter: its liveness check is 30 s away)."""
    d = dicts({"n": 0}, name=name)
    registered_, go, done = spawn.Event(), spawn.Event(), spawn.Queue()
    d.lock.acquire()
    p = start(wait_workers.lock_waiter_paused, name, registered_, go, done, True)
    try:
        assert registered_.wait(60)
        d.lock.release()  # sees A's bit: takes the wake in flight, wakes nobody
        d.lock.acquire()  # taken again before A goes on
        go.set()
        time.sleep(0.3)  # A failed its CAS and sleeps
        t0 = time.monotonic()
        d.lock.release()
        try:
            _, when = done.get(timeout=5)
        except queue.Empty:
            pytest.fail(
                f"the waiter was not woken by the release (LOCK_WAKING = "
                f"{words(d)[L.W_LOCK_WAKING]:#x}: a wake for nobody still counts as in flight)"
            )
        assert when - t0 < 2.0
        p.join(10)
        assert p.exitcode == 0
    finally:
        go.set()
        stop(p)
    assert d["n"] == 1
    assert_register_empty(d)
    d.close()


def test_dead_holder_recovered_while_waiters_sleep(dicts, name):
    """The holder is SIGKILLed while two processes sleep in ``with d.lock``: one of
    them takes the lock over within about a second, the other follows."""
    d = dicts({"n": 0}, name=name)
    ready, release = spawn.Event(), spawn.Event()
    started, done = spawn.Queue(), spawn.Queue()
    holder = start(wait_workers.lock_holder, name, ready, release)
    sleepers: list[Any] = []
    try:
        assert ready.wait(60)
        sleepers = [start(wait_workers.lock_sleeper, name, started, done) for _ in range(2)]
        pids = [started.get(timeout=60) for _ in sleepers]
        if waiting.MODE == "futex":
            for pid in pids:
                registered(d, pid, L.W_LOCK_WAITERS)
        time.sleep(0.5)  # past their first liveness check: asleep
        t0 = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        whens = sorted(done.get(timeout=10)[1] for _ in sleepers)
        for p in sleepers:
            p.join(10)
            assert p.exitcode == 0
    finally:
        stop(holder, *sleepers)
    assert whens[0] - t0 < 1.0, f"lock recovered {whens[0] - t0:.2f}s after the holder died"
    assert whens[1] - t0 < 2.0
    with d.lock(timeout=5):
        d["n"] += 1
    assert d["n"] == 3
    assert_register_empty(d)
    d.close()


def test_change_waiter_killed_asleep_is_swept(dicts, name, futex_children):
    """A process killed asleep in wait_for_change leaves its bit: the next writes
    wake nobody and sweep it (rate-limited to once a second); after that a write
    makes no futile wake any more."""
    d = dicts(name=name)
    ready, out = spawn.Queue(), spawn.Queue()
    p = start(wait_workers.change_waiter, name, ready, out, 60.0, 60.0)
    try:
        pid = ready.get(timeout=60)
        slot = registered(d, pid, L.W_CHANGE_WAITERS)
        time.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
        p.join(10)
    finally:
        stop(p)
    w = words(d)
    assert w[L.W_CHANGE_WAITERS] == 1 << slot and slot_of(d, pid) == slot
    d["k"] = 1
    time.sleep(1.1)
    d["k"] = 2
    assert_register_empty(d)
    seq = w[L.W_CHANGE_SEQ]
    d["k"] = 3
    assert w[L.W_CHANGE_SEQ] == seq
    # and a new waiter still works
    r = SharedDict(name=name, create=False)
    r.get("k")
    threading.Timer(0.1, lambda: d.__setitem__("k", 4)).start()
    t0 = time.monotonic()
    assert r.wait_for_change(timeout=5) is True and r["k"] == 4
    assert time.monotonic() - t0 < 2.0
    r.close()
    d.close()


def test_sweep_leaves_live_registrations_alone(dicts, name, futex_children):
    """A sweep frees only dead owners' slots: a live waiter in another process
    keeps its bit and is still woken by the next write."""
    from ultradict_ng._shm.waiting import sweep

    d = dicts(name=name)
    ready, out = spawn.Queue(), spawn.Queue()
    p = start(wait_workers.change_waiter, name, ready, out, 20.0, 60.0)
    try:
        pid = ready.get(timeout=60)
        slot = registered(d, pid, L.W_CHANGE_WAITERS)
        assert sweep(d._store._map.atomic) == 0
        assert words(d)[L.W_CHANGE_WAITERS] == 1 << slot and slot_of(d, pid) == slot
        time.sleep(0.1)
        t0 = time.monotonic()
        d["k"] = "go"
        _, ok, when, value, _ = out.get(timeout=10)
        p.join(10)
        assert p.exitcode == 0
    finally:
        stop(p)
    assert ok is True and value == "go" and when - t0 < 2.0
    assert_register_empty(d)
    d.close()


def test_no_free_slot_falls_back_to_polling(pair, monkeypatch):
    """Every slot taken by a live process: a waiter registers nothing and polls."""
    monkeypatch.setattr(L, "WAIT_SLICE", 60.0)  # a sleeper would miss the write: it must poll
    d, r = pair
    w = words(d)
    live = owner_word(os.getppid())
    for i in range(L.WAIT_SLOTS):
        d._store._map.atomic.store(L.W_WAIT_SLOTS + i, live)
    try:
        r.get("k")
        threading.Timer(0.2, lambda: d.__setitem__("k", 1)).start()
        t0 = time.monotonic()
        assert in_thread(lambda: r.wait_for_change(timeout=10), 10) is True
        assert time.monotonic() - t0 < 2.0 and r["k"] == 1
        assert w[L.W_CHANGE_WAITERS] == 0
    finally:
        for i in range(L.WAIT_SLOTS):
            d._store._map.atomic.store(L.W_WAIT_SLOTS + i, 0)


# -- an uncontended write or release touches no wait word ----------------------------------


def test_uncontended_writes_and_releases_make_no_wake(dicts, name, mode):
    d = dicts(name=name, recurse=True, buffer_size=256)  # dumps every few writes
    w = words(d)
    before = [w[i] for i in WAIT_WORDS], slots(d)
    assert before == ([0] * len(WAIT_WORDS), [0] * L.WAIT_SLOTS)
    for i in range(50):
        d["k"] = i
        d["n"] = {"i": i}
        d["n"]["j"] = i
        with d.lock:
            d["c"] = d.get("c", 0) + 1
        d.update({"u": i, "v": [i]})
        del d["u"]
    d.lock.acquire(blocking=False)
    d.lock.release()
    d._store.force_dump()
    # SEQ moves only when a waker saw a WAITERS word set: it never tried to wake anyone
    assert ([w[i] for i in WAIT_WORDS], slots(d)) == before
    d.close()


def test_a_change_waiter_that_returned_leaves_no_registration(pair, mode):
    d, r = pair
    r.get("k")
    threading.Timer(0.2, lambda: d.__setitem__("k", 1)).start()
    t0 = time.monotonic()
    assert in_thread(lambda: r.wait_for_change(timeout=10), 10) is True
    assert time.monotonic() - t0 < 2.0
    w = words(d)
    assert w[L.W_CHANGE_WAITERS] == 0 and not any(slots(d))
    seq = w[L.W_CHANGE_SEQ]
    assert seq == (1 if mode == "futex" else 0)  # one wake, for the one write with a sleeper
    d["k"] = 2
    d["k"] = 3
    assert w[L.W_CHANGE_SEQ] == seq
