"""The Redis engine's own promises (_redis/layout.py), against a real
redis-server the session starts: what each read mode costs and returns, one
round trip per write, conflicts redone, snapshots bounding the server's
memory, the lease lock, removal and re-creation, handles across processes.

The API, state machine, multi-process and lifetime suites run on this engine
too (conftest: ``each_backend``); faults are in test_redis_faults.py and the
cluster in test_redis_cluster.py.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ultradict_ng import (
    IncompatibleLayout,
    LockTimeout,
    NotFound,
    ParameterMismatch,
    SharedDict,
    Unlinked,
    unlink_by_name,
)
from ultradict_ng._redis import layout as RL

spawn = multiprocessing.get_context("spawn")


@pytest.fixture
def r(redis_url: str) -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def open_dict(redis_url: str) -> Iterator[Any]:
    """``open_dict(**kwargs)``: a handle on the session server, closed after the test."""
    made: list[SharedDict] = []

    def make(*args: Any, **kwargs: Any) -> SharedDict:
        kwargs.setdefault("backend", redis_url)
        made.append(SharedDict(*args, **kwargs))
        return made[-1]

    yield make
    for d in reversed(made):
        d.close()


def calls(r: Any, command: str) -> int:
    """How often the server ran ``command`` so far (also from inside scripts)."""
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def round_trips(r: Any) -> dict[str, int]:
    return {c: calls(r, c) for c in ("evalsha", "hmget", "get", "xread")}


def test_fresh_reads_cost_one_round_trip_and_see_every_completed_write(open_dict, name, r):
    a = open_dict(name=name)
    b = open_dict(name=name)
    for i in range(200):
        a["k"] = i
        assert b["k"] == i  # a's write completed before b's read began
    before = round_trips(r)
    for _ in range(100):
        b["k"]
    after = round_trips(r)
    # One round trip per read: HMGET of the counter (nothing changed: no script).
    assert {c: after[c] - before[c] for c in after} == {"evalsha": 0, "hmget": 100, "get": 0, "xread": 0}


def test_writes_at_the_root_cost_one_round_trip(open_dict, name, r):
    d = open_dict(name=name)
    before = round_trips(r)
    for i in range(100):
        d[i % 7] = i
    d.update({"a": 1, "b": 2})
    d.clear()
    after = round_trips(r)
    # One WRITE script each (its own HMGET and GET of the lock run inside it).
    assert {c: after[c] - before[c] for c in after} == {"evalsha": 102, "hmget": 102, "get": 102, "xread": 0}


def test_reads_inside_the_lock_need_no_round_trip(open_dict, name, r):
    d = open_dict(name=name)
    d["n"] = 0
    with d.lock:
        before = round_trips(r)
        for _ in range(100):
            d["n"] += 1  # 100 reads (none remote) + 100 writes
        after = round_trips(r)
        assert after["evalsha"] - before["evalsha"] == 100
        assert after["hmget"] - before["hmget"] == 100  # all of them inside the WRITE scripts
    assert d["n"] == 100


def test_cached_reads_make_no_round_trip_and_follow_writes(open_dict, name, r):
    writer = open_dict(name=name)
    reader = open_dict(name=name, reads="cached", staleness=0.5)
    writer["k"] = 0
    deadline = time.monotonic() + 2
    while reader["k"] != 0:
        assert time.monotonic() < deadline
    for _ in range(3):  # (a loaded machine can stall a loop past the 0.5 s bound: reads then go out)
        before = round_trips(r)
        start, n = time.monotonic(), 0
        while n < 10000 and time.monotonic() - start < 0.2:
            reader["k"]
            n += 1
        after = round_trips(r)
        assert n > 100
        if after["evalsha"] == before["evalsha"] and after["hmget"] == before["hmget"]:
            break  # no read went out
    else:
        raise AssertionError(f"cached reads went out in three rounds: {before} -> {after}")
    for i in range(1, 50):
        writer["k"] = i
        sent = time.monotonic()
        while reader["k"] != i:
            assert time.monotonic() - sent < reader_bound(reader), "cached read stayed stale past its bound"
    assert reader.stats()["reads"] == "cached"


def reader_bound(d: SharedDict) -> float:
    return 0.5 + 1.0  # staleness plus scheduling slack on a loaded 2-core machine


def test_cached_handle_reads_its_own_writes(open_dict, name):
    d = open_dict(name=name, reads="cached")
    for i in range(200):
        d["k"] = i
        assert d["k"] == i
        d.setdefault(("s", i), i)
        assert d[("s", i)] == i


def test_conflicting_pops_give_each_value_to_exactly_one_process(open_dict, name):
    d = open_dict(name=name)
    d.update({i: i for i in range(300)})
    got = run_children(_pop_all, (name, d.stats()["backend"], 300), 3)
    popped = [k for part in got for k in part]
    assert sorted(popped) == list(range(300))  # each exactly once
    assert len(d) == 0


def run_children(target: Any, args: tuple, n: int) -> list[Any]:
    """``n`` spawned ``target(*args, queue)`` at once; what each put on the queue."""
    out = spawn.Queue()
    procs = [spawn.Process(target=target, args=(*args, out)) for _ in range(n)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return got


def _pop_all(name: str, backend: str, n: int, out: Any) -> None:
    d = SharedDict(name=name, backend=backend)
    mine = []
    for i in range(n):
        if d.pop(i, None) is not None:  # (values equal keys: 0 is not None)
            mine.append(i)
    d.close()
    out.put(mine)


def test_setdefault_race_agrees_on_one_value(open_dict, name):
    d = open_dict(name=name)
    got = run_children(_setdefault_all, (name, d.stats()["backend"], 100), 3)
    for i in range(100):
        values = {g[i] for g in got}
        assert len(values) == 1 and values == {d[i]}


def _setdefault_all(name: str, backend: str, n: int, out: Any) -> None:
    d = SharedDict(name=name, backend=backend)
    out.put([d.setdefault(i, os.getpid()) for i in range(n)])
    d.close()


def test_snapshots_bound_the_log_and_late_readers_catch_up(open_dict, name, r):
    d = open_dict(name=name, buffer_size=4096)
    late = open_dict(name=name)
    late["start"] = True
    assert late["start"] is True
    for i in range(2000):
        d[i % 50] = "x" * 100
    st = d.stats()
    assert st["snapshot_seq"] > 1000  # snapshots were taken
    assert st["log_bytes"] <= max(4096, RL.SNAP_RATIO * st["snapshot_bytes"]) + 200
    assert r.xlen(RL.keys_of(name).log) == st["log_entries"] < 2000
    assert late.copy() == d.copy()  # fell behind the snapshot: reloaded it
    assert open_dict(name=name).copy() == d.copy()


def test_handles_of_a_removed_dict_raise_and_never_mix_with_a_new_one(open_dict, name):
    a = open_dict(name=name, auto_unlink=False)
    b = open_dict(name=name)
    a["k"] = 1
    assert b["k"] == 1
    assert unlink_by_name(name, backend=a.stats()["backend"]) == 3
    with pytest.raises(Unlinked, match="no longer exists"):
        b["k"]
    with pytest.raises(Unlinked):
        a["k"] = 2
    c = open_dict(name=name)  # re-created under the same name
    c["k"] = "new"
    with pytest.raises(Unlinked):
        b["k"]  # another epoch: never the new dict's data through the old handle
    with pytest.raises(NotFound):
        SharedDict(name=name + "x", create=False, backend=c.stats()["backend"])


def test_attach_checks_version_and_parameters(open_dict, name, r):
    d = open_dict(name=name, recurse=True)
    with pytest.raises(ParameterMismatch, match="recurse=True"):
        open_dict(name=name, recurse=False)
    with pytest.raises(ParameterMismatch):
        open_dict(name=name, serializer="pickle")
    r.hset(RL.keys_of(name).meta, "version", 99)
    with pytest.raises(IncompatibleLayout, match="version 99"):
        open_dict(name=name)
    r.hset(RL.keys_of(name).meta, "version", RL.VERSION)
    assert d.recurse


def test_bad_backends_are_clear_errors(name, monkeypatch):
    with pytest.raises(ValueError, match="backend must be"):
        SharedDict(name=name, backend="memcached://x")
    with pytest.raises(ValueError, match="Redis backend only"):
        SharedDict(name=name, backend="shm", lease=1)
    monkeypatch.setenv("ULTRADICT_NG_BACKEND", "shm")
    d = SharedDict(name=name)
    assert d.stats()["engine"] == "shared memory"
    d.close()


def test_environment_selects_the_backend(redis_url, name, monkeypatch):
    monkeypatch.setenv("ULTRADICT_NG_BACKEND", redis_url)
    d = SharedDict(name=name)
    try:
        assert d.stats()["engine"] == "redis"
    finally:
        d.close()


def test_a_pickled_handle_attaches_to_the_same_redis_dict(open_dict, name):
    d = open_dict(name=name, recurse=True, reads="cached")
    d["n"] = {"x": 1}
    view = pickle.loads(pickle.dumps(d["n"]))
    assert view.path == ("n",) and view["x"] == 1 and view.stats()["reads"] == "cached"
    view.close()
    out = spawn.Queue()
    p = spawn.Process(target=_read_through_pickle, args=(d, out))
    p.start()
    assert out.get(timeout=60) == {"n": {"x": 1}}
    p.join(60)
    assert p.exitcode == 0
    assert d["from child"] is True


def _read_through_pickle(d: SharedDict, out: Any) -> None:
    d["from child"] = True
    out.put({"n": d["n"].copy()})


def test_lock_is_reentrant_exclusive_and_reports_its_holder(open_dict, name):
    a = open_dict(name=name, lease=1.0)
    b = open_dict(name=name, lease=1.0)
    with a.lock:
        with a.lock:
            a["x"] = 1
        assert b.lock.acquire(blocking=False) is False
        started = time.monotonic()
        with pytest.raises(LockTimeout) as info:
            with b.lock(timeout=0.3):
                pass
        assert 0.25 < time.monotonic() - started < 2.5
        assert info.value.pid == os.getpid()
        assert a.lock.owner_pid == os.getpid()
        assert a.stats()["lock_pid"] == os.getpid()
    with pytest.raises(RuntimeError):
        a.lock.release()
    with b.lock:
        assert b["x"] == 1


def test_lease_is_renewed_while_held(open_dict, name):
    a = open_dict(name=name, lease=0.3)
    b = open_dict(name=name, lease=0.3)
    with a.lock:
        time.sleep(1.0)  # three leases: the keeper renews it
        assert b.lock.acquire(blocking=False) is False
        a["still mine"] = True
    assert b["still mine"] is True


def test_writes_of_other_threads_wait_for_the_holder(open_dict, name):
    d = open_dict(name=name)
    d["n"] = 0
    order: list[str] = []

    def other() -> None:
        d["n"] = -1  # waits: the lock is held by the main thread
        order.append("other")

    with d.lock:
        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.3)
        assert d["n"] == 0
        order.append("holder")
        d["n"] = 1
    t.join(10)
    assert order == ["holder", "other"] and d["n"] == -1


def test_four_processes_increment_exactly(open_dict, name, redis_url, monkeypatch):
    from tests import helpers

    monkeypatch.setenv("ULTRADICT_NG_BACKEND", redis_url)  # the children attach through it
    d = open_dict(name=name)
    d["n"] = 0
    procs = [spawn.Process(target=helpers.increment, args=(name, "n", 100)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert d["n"] == 400


def test_wait_for_change_and_the_change_feed(open_dict, name):
    a = open_dict(name=name, recurse=True)
    b = open_dict(name=name, recurse=True)
    assert b.wait_for_change(0.2) is False
    threading.Timer(0.2, lambda: a.__setitem__("k", 1)).start()
    started = time.monotonic()
    assert b.wait_for_change(10) is True
    assert time.monotonic() - started < 5 and b["k"] == 1
    feed = b.changes(timeout=0.5)
    a["n"] = {"x": 1}
    a["n"]["y"] = 2
    del a["k"]
    got = [(c.op, c.path, c.key, c.value) for c in feed]
    assert got == [("set", (), "n", {"x": 1}), ("set", ("n",), "y", 2), ("delete", (), "k", None)]


def test_a_feed_behind_the_snapshot_resyncs(open_dict, name):
    a = open_dict(name=name, buffer_size=512)
    b = open_dict(name=name)
    a["gone"] = 1
    a["same"] = 2
    feed = b.changes(timeout=0.5)
    first = [next(feed), next(feed)]
    assert [(c.op, c.key, c.resync) for c in first] == [("set", "gone", False), ("set", "same", False)]
    for i in range(300):
        a[("k", i % 5)] = "v" * 50
    del a["gone"]
    rest = list(feed)
    assert all(c.resync for c in rest)
    assert {(c.op, c.key) for c in rest} == {("delete", "gone")} | {("set", ("k", i)) for i in range(5)}


def test_users_lists_attached_processes(open_dict, name):
    a = open_dict(name=name)
    users = a.users()
    assert [u.pid for u in users] == [os.getpid()]
    out = spawn.Queue()
    p = spawn.Process(target=_attach_and_report, args=(name, a.stats()["backend"], out))
    p.start()
    pids = out.get(timeout=60)
    assert sorted(pids) == sorted([os.getpid(), p.pid])
    p.join(60)
    assert [u.pid for u in a.users()] == [os.getpid()]


def _attach_and_report(name: str, backend: str, out: Any) -> None:
    d = SharedDict(name=name, backend=backend)
    out.put([u.pid for u in d.users()])
    d.close()


def test_auto_unlink_last_removes_with_the_last_user(open_dict, name, r):
    a = open_dict(name=name, auto_unlink="last")
    b = open_dict(name=name, auto_unlink="last")
    a["k"] = 1
    a.close()
    assert r.exists(RL.keys_of(name).meta)
    b.close()
    assert not r.exists(RL.keys_of(name).meta)


def test_forked_child_uses_its_own_connection(open_dict, name):
    d = open_dict(name=name)
    d["n"] = 0
    fork = multiprocessing.get_context("fork")
    procs = [fork.Process(target=_increment_handle, args=(d, 50)) for _ in range(2)]
    for p in procs:
        p.start()
    for _ in range(50):
        with d.lock:
            d["n"] += 1
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert d["n"] == 150


def _increment_handle(d: SharedDict, n: int) -> None:
    for _ in range(n):
        with d.lock:
            d["n"] += 1


def test_large_arrays_and_bytes_travel_inline(open_dict, name):
    np = pytest.importorskip("numpy")
    a = open_dict(name=name)
    b = open_dict(name=name)
    arr = np.arange(300_000, dtype=np.float64).reshape(1000, 300)
    a["arr"] = arr
    a["blob"] = b"z" * 1_000_000
    got = b["arr"]
    assert got.dtype == arr.dtype and (got == arr).all() and not got.flags.writeable
    assert bytes(b.view("blob")) == b"z" * 1_000_000


def test_the_asyncio_face_sleeps_in_xread_instead_of_polling(open_dict, name, r):
    """A coroutine waiting for a change costs the server one blocking read per
    slice of its helper thread, not a SYNC per poll (test_aio runs the whole
    face on this engine)."""
    import asyncio

    from ultradict_ng import SharedLock
    from ultradict_ng.aio import AsyncSharedDict

    d = open_dict(name=name)
    assert isinstance(d.lock, SharedLock)  # the one front end, over the lease
    ad = AsyncSharedDict.wrap(d)

    async def main() -> None:
        before = round_trips(r)
        assert await ad.wait_for_change(timeout=1.0) is False
        used = {k: v - before[k] for k, v in round_trips(r).items()}
        assert 2 <= used["xread"] <= 8, used  # slices of 0.2 s
        assert used["evalsha"] <= 1, used  # the catch-up before waiting, at most

    asyncio.run(main())


def test_closing_a_handle_that_holds_the_lock_gives_the_lease_back(open_dict, name):
    a = SharedDict(name=name, backend=open_dict(name=name).stats()["backend"])
    b = open_dict(name=name)
    a.lock.acquire()
    a.close()
    started = time.monotonic()
    with b.lock(timeout=2):
        assert time.monotonic() - started < 0.5  # not the 3 s lease


def test_a_cached_listener_that_missed_trimmed_entries_still_resyncs(open_dict, name):
    """The listener reads the log with XREAD, not a script: when a snapshot
    trimmed entries it had not fetched and nothing was written since, the
    snapshot's own entry (kept as a marker) still shows it the gap."""
    from ultradict_ng._redis.listener import Listener

    w = open_dict(name=name, buffer_size=256)
    c = open_dict(name=name, reads="cached", staleness=0.5)
    w["k"] = 0
    deadline = time.monotonic() + 2
    while c["k"] != 0:
        assert time.monotonic() < deadline
    old = c._store.listener
    old.stop()
    old._thread.join(5)
    for i in range(1, 200):
        w["k"] = i  # snapshots trim the log on the way
    w._store.force_dump()  # a snapshot at the last write: only its marker entry is left
    assert w.stats()["log_entries"] == 1
    resumed = Listener(c._store)
    resumed._after = old._after  # where the stopped one was
    c._store.listener = resumed
    resumed.start()
    deadline = time.monotonic() + 5
    while not resumed.vouched:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert c["k"] == 199
