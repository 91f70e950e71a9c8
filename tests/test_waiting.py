"""Waiting for a change (layout: "Waiting and waking", change channel):
``wait_for_change`` in threads, spawned processes and unrelated interpreters,
on the futex and polling; no lost wake-ups; timeouts, unlink, close.  The
lock's sleeping waiters and the wait register are in test_wait_register.py,
the change feed in test_feed.py.

A futex waiter re-checks its condition every ``WAIT_SLICE`` seconds, and a wait
re-checks STATE before giving up at its deadline, so a lost wake-up shows only as
a waiter that returns late.  Tests that must catch one raise ``WAIT_SLICE`` (in
this process with the ``slow_slice`` fixture, in children through the workers'
``slice_`` argument) and bound how long after the write the waiter returns.
Every wait, join and queue read is bounded.

The ``mode`` fixture runs a test with this process's waiters on the futex and
polling (``waiting.MODE``, what ``ULTRADICT_NG_WAIT=poll`` sets at import).
"""

from __future__ import annotations

import multiprocessing
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from tests import wait_workers
from tests.conftest import unique_name
from tests.wait_workers import in_thread, registered, slots, stop, words
from ultradict_ng import Closed, SharedDict, Unlinked
from ultradict_ng._shm import layout as L
from ultradict_ng._shm import waiting
from ultradict_ng._shm.lock import owner_word
from ultradict_ng.speedups import FUTEX

spawn = multiprocessing.get_context("spawn")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_futex = pytest.mark.skipif(not FUTEX, reason="no futex on this platform")


@pytest.fixture
def slow_slice(monkeypatch: Any) -> None:
    monkeypatch.setattr(L, "WAIT_SLICE", 60.0)


@pytest.fixture
def pair(name: str):
    """The creator ``d`` (writes) and an attached handle ``r`` (waits), recurse, small stream."""
    d = SharedDict(name=name, recurse=True, buffer_size=4096)
    r = SharedDict(name=name, create=False)
    yield d, r
    r.close()
    d.close()


# -- a change since the last read is never missed ------------------------------------------


def test_write_from_another_handle_then_wait_returns_at_once(pair, mode):
    d, r = pair
    assert r.get("k") is None
    d["k"] = 1
    t0 = time.monotonic()
    assert r.wait_for_change(timeout=5) is True
    assert time.monotonic() - t0 < 0.5
    assert r._store.seen == words(r)[L.W_STATE]  # up to date before any read
    assert r["k"] == 1
    assert r.wait_for_change(timeout=0) is False  # nothing new since


def test_own_write_is_not_a_change(pair, mode):
    d, r = pair
    d["k"] = 1
    t0 = time.monotonic()
    assert d.wait_for_change(timeout=0.1) is False
    assert time.monotonic() - t0 >= 0.1


@pytest.mark.parametrize("between", ["set", "dump", "update", "nested", "delete", "clear"])
def test_write_between_last_read_and_wait(pair, mode, slow_slice, between):
    """The deterministic race: the write lands after the handle's last read and before
    its call to wait; the wait (no timeout) must return True at once."""
    d, r = pair
    d.update({"k": 0, "n": {"x": 0}})
    assert r["k"] == 0  # the last read
    {
        "set": lambda: d.__setitem__("k", 1),
        "dump": d._store.force_dump,
        "update": lambda: d.update({"k": 2, "j": 3}),
        "nested": lambda: d["n"].__setitem__("x", 1),
        "delete": lambda: d.__delitem__("k"),
        "clear": d["n"].clear,
    }[between]()
    t0 = time.monotonic()
    assert in_thread(lambda: r.wait_for_change(timeout=None), 5) is True
    assert time.monotonic() - t0 < 1.0
    assert r.copy() == d.copy()
    assert r.wait_for_change(timeout=0) is False


def test_nested_view_waits_for_the_whole_tree(pair, mode, slow_slice):
    d, r = pair
    d["a"] = {"b": 1}
    view = r["a"]
    assert view["b"] == 1

    def later() -> None:
        time.sleep(0.1)
        d["elsewhere"] = 1

    threading.Thread(target=later).start()
    t0 = time.monotonic()
    assert in_thread(lambda: view.wait_for_change(timeout=10), 10) is True
    assert time.monotonic() - t0 < 2.0
    assert r["elsewhere"] == 1


# -- no lost wake-ups: hypothesis-driven interleavings -------------------------------------

DELAYS = st.sampled_from([0.0, 0.0, 0.0, 1e-5, 1e-4, 5e-4, 2e-3])
OPS = st.sampled_from(["set", "set", "dump", "update", "nested"])
SCRIPTS = st.lists(st.tuples(DELAYS, OPS), min_size=1, max_size=25)


def follow_until(r: SharedDict, last: int, pause: float, failures: list[Any]) -> None:
    """The waiter: wait (pausing ``pause`` between its read and its wait) until seq == last.

    The writer never pauses for more than a few ms, so a wait that lasts a second
    was not woken: a lost wake-up (the wait still returns True at its deadline,
    because it re-checks STATE before giving up)."""
    seen = r.get("seq", 0)
    while seen < last:
        if pause:
            time.sleep(pause)
        t0 = time.monotonic()
        ok = r.wait_for_change(timeout=3)
        waited = time.monotonic() - t0
        if not ok or waited > 1.0:
            failures.append(
                f"a wait at seq {seen} of {last} returned {ok} after {waited:.2f}s: a lost wake-up"
            )
            return
        now = r.get("seq", 0)
        if now < seen:
            failures.append(f"seq went back from {seen} to {now}")
        seen = now


def run_script(d: SharedDict, script: list[Any]) -> None:
    for i, (delay, op) in enumerate(script, 1):
        if delay:
            time.sleep(delay)
        if op == "update":
            d.update({"seq": i, "x": i})
        elif op == "nested":
            d["n"] = {"v": i}
            d["seq"] = i
        else:
            d["seq"] = i
            if op == "dump":
                d._store.force_dump()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(script=SCRIPTS, pause=DELAYS)
def test_no_lost_wakeups_between_threads(mode, slow_slice, script, pause):
    name = unique_name()
    d = SharedDict(name=name, buffer_size=256)
    r = SharedDict(name=name, create=False)
    failures: list[Any] = []
    try:
        waiter = threading.Thread(target=follow_until, args=(r, len(script), pause, failures))
        waiter.start()
        run_script(d, script)
        waiter.join(10)
        assert not waiter.is_alive(), "the waiter is still waiting after the last write"
        assert not failures, failures
        assert r["seq"] == len(script)
    finally:
        r.close()
        d.close()


def test_no_lost_wakeups_from_a_writer_process(mode, slow_slice):
    """As above with the writer in a spawned process (one server for every example)."""
    here, there = spawn.Pipe()
    server = spawn.Process(target=wait_workers.script_server, args=(there,))
    server.start()
    try:

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        @given(script=SCRIPTS, pause=DELAYS)
        def examples(script: list[Any], pause: float) -> None:
            name = unique_name()
            d = SharedDict(name=name, buffer_size=256)
            failures: list[Any] = []
            try:
                ops = [
                    (delay, "update", {"seq": i, "x": i}) if op == "update" else (delay, "seq", i)
                    for i, (delay, op) in enumerate(script, 1)
                ]
                ops[len(ops) // 2 : len(ops) // 2] = [(0.0, "dump", None)]
                here.send((name, ops))
                follow_until(d, len(script), pause, failures)
                assert here.poll(10), "the writer did not finish"
                last_write = here.recv()
                assert not failures, failures
                assert time.monotonic() - last_write < 2.5
                assert d["seq"] == len(script)
            finally:
                d.close()

        examples()
        here.send(None)
        server.join(10)
        assert server.exitcode == 0
    finally:
        stop(server)


# -- many waiters, one write ---------------------------------------------------------------


def test_one_write_wakes_every_waiting_process(dicts, name):
    d = dicts(name=name)
    ready, out = spawn.Queue(), spawn.Queue()
    procs = [
        spawn.Process(target=wait_workers.change_waiter, args=(name, ready, out, 20.0, 60.0))
        for _ in range(6)
    ]
    try:
        for p in procs:
            p.start()
        pids = [ready.get(timeout=60) for _ in procs]
        if waiting.MODE == "futex":  # (the children's mode: they share our environment)
            for pid in pids:
                registered(d, pid, L.W_CHANGE_WAITERS)
        time.sleep(0.2)  # asleep in the kernel
        t0 = time.monotonic()
        d["k"] = "go"
        results = [out.get(timeout=10) for _ in procs]
        for p in procs:
            p.join(10)
            assert p.exitcode == 0
    finally:
        stop(*procs)
    for pid, ok, when, value, _ in results:
        assert ok is True and value == "go", (pid, ok, value)
        assert when - t0 < 2.0, f"pid {pid} woke {when - t0:.2f}s after the write"
    assert words(d)[L.W_CHANGE_WAITERS] == 0 and not any(slots(d))
    d.close()


@pytest.mark.parametrize("handles", ["one-handle-each", "one-shared-handle"])
def test_one_write_wakes_every_waiting_thread(pair, mode, slow_slice, handles):
    """Eight threads wait, on handles of their own or on one shared handle: one write
    made after they all started waiting wakes every one of them."""
    d, r = pair
    mine = [SharedDict(name=d.name, create=False) if handles == "one-handle-each" else r for _ in range(8)]
    for h in mine:
        h.get("k")
    results: list[Any] = []

    def wait(h: SharedDict) -> None:
        t = time.monotonic()
        ok = h.wait_for_change(timeout=3)
        results.append((ok, time.monotonic() - t))

    threads = [threading.Thread(target=wait, args=(h,)) for h in mine]
    for t in threads:
        t.start()
    time.sleep(0.3)  # all of them asleep (or polling)
    d["k"] = "go"
    for t in threads:
        t.join(10)
    try:
        assert len(results) == 8
        missed = [ok for ok, _ in results if ok is not True]
        assert not missed, f"{len(missed)} of 8 waiting threads missed the write"
        assert max(t for _, t in results) < 2.0
        assert all(h["k"] == "go" for h in mine)
    finally:
        for h in mine:
            if h is not r:
                h.close()


# -- waiters in unrelated interpreters, and the polling fallback ---------------------------

WAITER = """
import sys, time
from ultradict_ng import SharedDict
from ultradict_ng._shm import waiting
from ultradict_ng._shm.lock import owner_word
from ultradict_ng._shm import layout as L
L.WAIT_SLICE = 60.0
d = SharedDict(name=sys.argv[1], create=False)
d.get("k")
print("ready", waiting.MODE, flush=True)
ok = d.wait_for_change(float(sys.argv[2]))
print("result", ok, repr(d.get("k")), time.monotonic(), flush=True)
d.close()
"""


def env_with(wait_mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop(waiting.ENV_VAR, None)
    if wait_mode:
        env[waiting.ENV_VAR] = wait_mode
    return env


@pytest.mark.parametrize("child_mode", ["futex", "poll"])
def test_waiter_in_an_unrelated_interpreter(dicts, name, child_mode):
    if child_mode == "futex" and not FUTEX:
        pytest.skip("no futex on this platform")
    d = dicts(name=name)
    p = subprocess.Popen(
        [sys.executable, "-c", WAITER, name, "20"],
        cwd=ROOT,
        env=env_with(child_mode),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert select.select([p.stdout], [], [], 30)[0], "the waiter did not start"
        assert p.stdout.readline().split() == ["ready", child_mode]
        if child_mode == "futex":
            registered(d, p.pid, L.W_CHANGE_WAITERS)
        else:
            time.sleep(0.2)
            assert words(d)[L.W_CHANGE_WAITERS] == 0  # a polling waiter registers nothing
        time.sleep(0.1)
        t0 = time.monotonic()
        d["k"] = "go"  # this process may be on either mode: wakes futex sleepers regardless
        out, err = p.communicate(timeout=15)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    _, ok, value, when = out.split()
    assert ok == "True" and value == "'go'"
    assert float(when) - t0 < 2.0
    assert words(d)[L.W_CHANGE_WAITERS] == 0 and not any(slots(d))
    d.close()


@needs_futex
def test_a_polling_writer_wakes_sleeping_waiters(dicts, name, slow_slice, monkeypatch):
    monkeypatch.setattr(waiting, "MODE", "futex")
    d = dicts(name=name)
    d.get("k")
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(d.wait_for_change(timeout=20)))
    t.start()
    registered(d, os.getpid(), L.W_CHANGE_WAITERS)
    out = subprocess.run(
        [sys.executable, "-m", "tests.helpers", "set", name, "k", "v"],
        cwd=ROOT,
        env=env_with("poll"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    t0 = time.monotonic()
    t.join(10)
    assert not t.is_alive() and box == [True], "a writer in polling mode did not wake the sleeper"
    assert time.monotonic() - t0 < 2.0 and d["k"] == "v"
    d.close()


# -- timeouts ------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [0, 0.05, 0.3])
def test_timeout_returns_false_after_about_the_timeout(pair, mode, timeout):
    d, r = pair
    r.get("k")
    t0 = time.monotonic()
    assert r.wait_for_change(timeout=timeout) is False
    elapsed = time.monotonic() - t0
    assert timeout <= elapsed < timeout + 1.0


def test_timeout_longer_than_a_slice(pair, mode, monkeypatch):
    monkeypatch.setattr(L, "WAIT_SLICE", 0.05)  # several futex sleeps in one wait
    d, r = pair
    r.get("k")
    t0 = time.monotonic()
    assert r.wait_for_change(timeout=0.3) is False
    assert 0.3 <= time.monotonic() - t0 < 1.3


def test_negative_timeout_raises_value_error(pair):
    d, r = pair
    with pytest.raises(ValueError):
        r.wait_for_change(timeout=-1)
    with pytest.raises(ValueError):
        r.changes(timeout=-0.1)
    d["k"] = 1  # nothing was registered or broken
    assert r.wait_for_change(timeout=0) is True


# -- unlink and close ----------------------------------------------------------------------


def test_unlink_while_a_thread_waits_raises_unlinked(pair, mode, slow_slice):
    d, r = pair
    r.get("k")
    box: list[Any] = []

    def wait() -> None:
        try:
            box.append(r.wait_for_change(timeout=20))
        except Unlinked as exc:
            box.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    if mode == "futex":
        registered(d, os.getpid(), L.W_CHANGE_WAITERS)
    time.sleep(0.1)
    t0 = time.monotonic()
    d.unlink()
    t.join(5)
    assert not t.is_alive() and len(box) == 1 and isinstance(box[0], Unlinked), box
    assert time.monotonic() - t0 < 2.0
    with pytest.raises(Unlinked):  # and at once afterwards
        r.wait_for_change(timeout=5)


def test_unlink_while_a_process_waits_raises_unlinked(dicts, name):
    d = dicts(name=name)
    ready, out = spawn.Queue(), spawn.Queue()
    p = spawn.Process(target=wait_workers.change_waiter, args=(name, ready, out, 20.0, 60.0))
    try:
        p.start()
        pid = ready.get(timeout=60)
        if waiting.MODE == "futex":
            registered(d, pid, L.W_CHANGE_WAITERS)
        time.sleep(0.1)
        t0 = time.monotonic()
        d.unlink()
        _, ok, when, _, _ = out.get(timeout=10)
        p.join(10)
        assert p.exitcode == 0
    finally:
        stop(p)
    assert ok == "unlinked" and when - t0 < 2.0
    d.close()


def test_closed_handle_raises_closed(pair):
    d, r = pair
    d["n"] = {}
    view = r["n"]
    r.close()
    for call in (
        lambda: r.wait_for_change(timeout=0),
        lambda: r.wait_for_change(timeout=None),
        lambda: view.wait_for_change(timeout=1),
        lambda: r.changes(timeout=1),
    ):
        with pytest.raises(Closed):
            in_thread(call, 5)


def test_a_handle_closed_under_its_waiter_leaves_no_wait_slot_behind(pair, mode):
    """Two handles of one dict in one process share its wait registration:
    the waiter of the one closed under it leaves last, and the slot and bit
    it could not clear through its closed mapping are the next waiter's to
    clear -- not a slot kept claimed until the process ends."""
    if waiting.MODE != "futex":
        pytest.skip("polling: no wait slots")
    d, r = pair
    mine = owner_word()
    box: list[Any] = []

    def wait(handle: Any, timeout: float) -> None:
        try:
            box.append(handle.wait_for_change(timeout=timeout))
        except Closed as exc:
            box.append(exc)

    long = threading.Thread(target=wait, args=(r, 10))
    short = threading.Thread(target=wait, args=(d, 0.3))
    long.start()
    short.start()
    short.join(5)  # (it leaves first: the closed handle's waiter is the last one out)
    r.close()
    long.join(L.WAIT_SLICE + 2)
    assert not long.is_alive() and isinstance(box[-1], Closed), box
    wait(d, 0.2)  # (a later waiter, through the open handle)
    words = d._store._map.words
    owned = [i for i in range(L.WAIT_SLOTS) if words[L.W_WAIT_SLOTS + i] == mine]
    assert owned == [] and words[L.W_CHANGE_WAITERS] == 0


def test_handle_closed_under_a_waiting_thread(pair, mode):
    """The waiter ends with Closed (within a slice), and the dict is still usable."""
    d, r = pair
    r.get("k")
    box: list[Any] = []

    def wait() -> None:
        try:
            box.append(r.wait_for_change(timeout=10))
        except Closed as exc:
            box.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.1)
    r.close()
    t.join(L.WAIT_SLICE + 2)
    assert not t.is_alive() and len(box) == 1 and isinstance(box[0], Closed), box
    d["k"] = 1
    assert d["k"] == 1
