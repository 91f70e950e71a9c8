"""SharedCache and cached() across real processes (unrelated interpreters):
expiry seen by others, bounds under 4 writers, add races, exact incr,
stampede protection (also with the computing process SIGKILLed), and the
cache's crash points."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from ultradict_ng import SharedDict
from ultradict_ng.cache import SharedCache, cached

from .conftest import unique_name
from .torture_workers import check_side, dead_batch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow


def start(*args: str, env: dict = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.cache_workers", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def finish(procs, timeout=60.0):
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err
        outs.append(out)
    return outs


class Grid:
    computed = 0

    def __init__(self, n):
        self.n = n

    @cached(name="udng-test-grid-" + str(os.getpid()))
    def area(self, scale):
        Grid.computed += 1
        return self.n * self.n * scale


@pytest.fixture
def owned(name):
    yield name
    SharedCache.unlink_by_name(name)


def test_expiry_written_by_one_process_is_seen_by_another(owned):
    c = SharedCache(owned, auto_unlink=False)
    p = start("expiry", owned)
    try:
        assert p.stdout.readline().strip() == "set"
        assert c["short"] == "s" and c["long"] == "l"
        time.sleep(0.6)
        assert "short" not in c and c["long"] == "l"
        assert c.expire() == 1
        assert sorted(SharedDict(owned, create=False).keys()) == ["long"]
    finally:
        p.kill()
        p.communicate()
        c.close()


def test_size_bound_holds_under_four_writers(owned):
    c = SharedCache(owned, maxsize=64, auto_unlink=False)
    watcher = start("bound", owned, "64", "3")
    writers = [start("writer", owned, str(w), "400", "-") for w in range(4)]
    finish(writers)
    (out,) = finish([watcher])
    assert int(out.split()[1]) <= 64
    assert len(c) == 64 and c.stats()["evictions"] == 4 * 400 - 64
    for key in c:  # every survivor is whole
        wid, i = c[key]
        assert key == f"w{wid}-{i}"
    c.close()


def test_processes_opening_a_new_cache_at_once_all_succeed():
    """Creators race: each sees no side segment, one makes it and writes a key
    before another decides (under the lock) whether the dict is a cache."""
    names = [unique_name() for _ in range(2)]
    try:
        for name in names:
            at = str(time.time() + 1.0)
            outs = finish([start("opener", name, at) for _ in range(6)])
            assert [o.strip() for o in outs] == ["opened"] * 6
            with SharedCache(name) as c:
                assert len(c) == 6
    finally:
        for name in names:
            SharedCache.unlink_by_name(name)


def test_add_race_has_exactly_one_winner(owned):
    c = SharedCache(owned, auto_unlink=False)
    at = str(time.time() + 1.5)
    outs = finish([start("adder", owned, at) for _ in range(8)])
    assert sorted(o.strip() for o in outs) == ["lost"] * 7 + ["won"]
    c.close()


def test_add_races_over_many_keys_each_won_once(owned):
    c = SharedCache(owned, auto_unlink=False)
    at = str(time.time() + 1.5)
    outs = finish([start("adders", owned, "2000", at) for _ in range(4)])
    assert sum(int(o.split()[1]) for o in outs) == 2000
    assert all(c[f"k{i}"] for i in range(2000))
    c.close()


def test_incr_from_several_processes_is_exact(owned):
    c = SharedCache(owned, maxsize=10, auto_unlink=False)
    finish([start("incr", owned, "300") for _ in range(4)])
    assert c["n"] == 1200
    c.close()


def test_stampede_eight_processes_one_computation(owned, tmp_path):
    log = tmp_path / "log"
    at = str(time.time() + 2.0)
    outs = finish([start("memo", owned, str(log), "0.5", at) for _ in range(8)])
    assert [o.strip() for o in outs] == ["result 70"] * 8
    assert len(log.read_text().split()) == 1


def test_stampede_computing_process_killed_hands_over(owned, tmp_path):
    log = tmp_path / "log"
    at = str(time.time() + 1.5)
    first = start("memo", owned, str(log), "30", at)  # computes for 30 s: killed meanwhile
    deadline = time.monotonic() + 20
    while not (log.exists() and log.read_text()):
        assert time.monotonic() < deadline, "the first process never started computing"
        time.sleep(0.01)
    waiters = [start("memo", owned, str(log), "0.3", "0") for _ in range(3)]
    time.sleep(0.5)
    assert len(log.read_text().split()) == 1  # the waiters wait
    first.send_signal(signal.SIGKILL)
    first.communicate()
    outs = finish(waiters)
    assert [o.strip() for o in outs] == ["result 70"] * 3
    assert len(log.read_text().split()) == 2  # the killed one, and one waiter


def test_cached_in_process_features(owned):
    calls = []

    @cached(name=owned, maxsize=16)
    def square(x):
        calls.append(x)
        if x < 0:
            raise ValueError("negative")
        return x * x

    try:
        assert square(3) == 9 and square(3) == 9 and calls == [3]
        for _ in range(2):
            with pytest.raises(ValueError):
                square(-1)
        assert calls == [3, -1, -1]  # an exception is not cached
        info = square.cache_info()
        assert (info.hits, info.misses, info.maxsize, info.currsize) == (1, 3, 16, 1)
        assert square.__wrapped__(4) == 16 and square.cache_parameters()["maxsize"] == 16
        square.cache_clear()
        assert square.cache_info().currsize == 0

        assert Grid(3).area(2) == 18 and Grid(3).area(2) == 18 and Grid(4).area(2) == 32
        assert Grid.computed == 2  # keyed by the instance's state
        Grid.area.cache().unlink()

        class Local:
            @cached(name=owned + "l")
            def m(self):
                return 1

        with pytest.raises(TypeError, match="key="):
            Local().m()
        Local.m.cache().unlink()

        @cached(name=owned + "k", key=lambda obj, x: x)
        def keyed(obj, x):
            return x + 1

        assert keyed(object(), 1) == 2 and keyed(object(), 1) == 2 and keyed.cache_info().hits == 1
        keyed.cache().unlink()

        @cached(name=owned + "a")
        async def fetch(x):
            calls.append("fetch")
            await asyncio.sleep(0.01)
            return [x]

        async def both():
            return await asyncio.gather(fetch(1), fetch(1))

        assert asyncio.run(both()) == [[1], [1]] and calls.count("fetch") == 1
        fetch.cache().unlink()
    finally:
        square.cache().close()


@pytest.mark.parametrize("point", ["cache-slot-taken", "cache-entry-removed"])
def test_writer_killed_at_a_cache_point_leaves_a_cache_others_use(owned, point):
    c = SharedCache(owned, maxsize=20, auto_unlink=False)
    for i in range(20):
        c[f"pre{i}"] = i
    p = start("writer", owned, "9", "200", "-", env={"ULTRADICT_NG_FAULT": f"{point}:kill:5"})
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL
    for i in range(200):  # the survivors write on: lock recovered, bound kept, slots rebuilt
        c[f"after{i}"] = i
        assert len(c) <= 20
    assert len(c) == 20 and c["after199"] == 199
    assert all(c[k] == int(k[5:]) for k in c if k.startswith("after"))
    c.close()


def test_claimer_killed_at_cache_claimed_hands_over(owned, tmp_path):
    log = tmp_path / "log"
    p = start("memo", owned, str(log), "0.1", "0", env={"ULTRADICT_NG_FAULT": "cache-claimed:kill"})
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL and not log.exists()
    outs = finish([start("memo", owned, str(log), "0.1", "0")])
    assert outs[0].strip() == "result 70" and len(log.read_text().split()) == 1


def test_writer_killed_between_publish_and_size_leaves_no_under_count(owned):
    """A writer killed right after its entry is published (before the side segment
    records its size): a rebuild (``expire()``) must not count that entry as 0
    bytes, or maxbytes stops holding (regression: the size was recorded after the
    write)."""
    c = SharedCache(owned, maxbytes=10_000, auto_unlink=False)
    c["pre"] = "x" * 100  # the killed writer's key takes a fresh slot: its size cell is 0
    p = start("writer", owned, "7", "5", "-", env={"ULTRADICT_NG_FAULT": "record-published:kill:1"})
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL
    assert c.get("w7-0") == [7, 0]  # published
    with c.lock:
        check_side(c)  # every entry's size cell covers it, bytes covers them all
    c.expire()  # (a rebuild recounts the sizes anyway)
    with c.lock:
        check_side(c)
    c.close()


@pytest.mark.parametrize("cull", [None, 0])
def test_a_writer_killed_emptying_the_cache_leaves_bytes_to_be_recounted(owned, cull):
    """A ``clear()`` -- or an emptying cull (``cull_frequency=0``) -- killed
    after the dict's clear is published, before the side's slots and bytes
    are reset: ``bytes`` counted every entry gone, and the survivors evicted
    live entries of a cache far below maxbytes.  Marked a batch meanwhile,
    the next writer rebuilds the side from the entries instead."""
    bounds = {"maxsize": 10, "cull_frequency": 0} if cull == 0 else {}
    c = SharedCache(owned, maxbytes=1000, auto_unlink=False, **bounds)
    for i in range(10):
        c.set(f"k{i}", "v" * 50)  # (~90 bytes each: 900 of 1000)
    if cull is None:
        p = start("clear", owned, env={"ULTRADICT_NG_FAULT": "record-published:kill:1"})
    else:  # (the writer's 11th key empties the cache first)
        p = start("writer", owned, "7", "1", "-", env={"ULTRADICT_NG_FAULT": "record-published:kill:1"})
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL and len(c) == 0
    for i in range(4):
        c.set(f"n{i}", "x")
    assert sorted(c) == [f"n{i}" for i in range(4)]  # (none evicted: far below maxbytes)
    with c.lock:
        assert check_side(c) == (0, 0)
    c.close()


def test_a_writer_killed_evicting_for_bytes_overcounts_one_entry_at_most(owned):
    """A writer killed between an eviction's delete and the slot's release,
    while it made room for a new entry: ``bytes`` is too high by the evicted
    entry only (cache_layout, "Crashes") -- the new entry's size, never
    written, was counted in it while the writer evicted."""
    c = SharedCache(owned, maxbytes=1000, auto_unlink=False)
    for i in range(10):
        c.set(f"k{i}", "v" * 50)
    c.set("fill", "v" * (1000 - 10 * c._side.sizes[c._d["k0"][1]] - 40))  # (no room for the writer's)
    sizes = {k: c._side.sizes[c._d[k][1]] for k in c}
    p = start("writer", owned, "7", "1", "-", env={"ULTRADICT_NG_FAULT": "cache-entry-removed:kill:1"})
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL
    (victim,) = set(sizes) - set(c)
    with c.lock:
        assert check_side(c) == (1, sizes[victim])  # (its slot leaked, its bytes still counted)
    c.close()


def test_writer_killed_inside_a_rebuild_double_books_nothing(owned):
    """A writer killed while ``expire()`` rewrites the free stack (after its first
    cell): the others must never hand one slot to two keys (regression: the stack
    was rewritten under the old count, which then held a slot twice)."""
    c = SharedCache(owned, maxsize=10, auto_unlink=False)
    for i in range(10):
        c[f"k{i}"] = i  # slots 0..9
    del c["k5"], c["k3"]  # the free stack: [5, 3]; a rebuild writes 3 first
    p = start("rebuild_killed", owned)
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL
    for i in range(40):
        c[f"new{i}"] = i
        with c.lock:
            check_side(c)
    c.close()


@pytest.mark.parametrize("how", ["exception", "SIGKILL"])
def test_a_failed_delete_many_leaves_no_slot_double_booked(owned, how):
    """delete_many(["a", "b"]) that ends without publishing -- an unhashable second
    key, or its process SIGKILLed after deleting "a" -- leaves "a" with its slot
    while the batch freed that slot: the rebuild (at once, or by the next writer,
    which finds the batch word set) must take it back, or the next new key gets it
    too.  (A writer killed earlier leaked a slot, so the count of free and used
    slots looks right: only the batch word reveals it.)"""
    c = SharedCache(owned, maxsize=10, auto_unlink=False)
    try:
        c["a"], c["b"] = 1, 2
        p = start("writer", owned, "9", "5", "-", env={"ULTRADICT_NG_FAULT": "cache-slot-taken:kill:1"})
        p.communicate(timeout=60)
        assert p.returncode == -signal.SIGKILL
        if how == "exception":
            with pytest.raises(TypeError):
                c.delete_many(["a", ["unhashable"]])
        else:
            p = start("delete_many", owned, env={"ULTRADICT_NG_FAULT": "cache-entry-removed:kill:2"})
            p.communicate(timeout=60)
            assert p.returncode == -signal.SIGKILL
        assert "a" in c
        c["new"] = 3
        with c.lock:
            check_side(c)  # no two entries share a slot
    finally:
        c.close()


def test_a_writer_killed_in_a_batch_leaves_the_side_segment_to_the_next_writer(owned):
    """Killed inside delete_many after freeing "a"'s slot (size cell 0, slot on
    the free stack) but before the batch published: "a" is still there, the batch
    word is set, and until a writer rebuilds, the side segment disagrees with the
    entries (what a reader checking under the lock may see: dead_batch tells it).
    expire(), a write like any other, rebuilds first: the word is cleared and the
    side segment exact."""
    c = SharedCache(owned, maxsize=10, maxbytes=10_000, auto_unlink=False)
    try:
        c["a"], c["b"] = "x" * 50, "y" * 50
        p = start("delete_many", owned, env={"ULTRADICT_NG_FAULT": "cache-entry-removed:kill:2"})
        p.communicate(timeout=60)
        assert p.returncode == -signal.SIGKILL
        with c.lock:
            assert "a" in c and dead_batch(c)
            with pytest.raises(AssertionError):
                check_side(c)  # "a"'s slot was freed with its entry still there
            c.expire()
            assert not dead_batch(c)
            assert check_side(c) == (0, 0)
        assert c["a"] == "x" * 50
    finally:
        c.close()
