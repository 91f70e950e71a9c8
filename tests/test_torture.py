"""Torture: writers and readers in spawned processes on one dict with a tiny stream.

Writers mutate their own nested subtree with every operation kind (set, delete,
pop, clear, nested updates, update, values larger than the stream) and a shared
counter under the lock; readers check every snapshot.  Zero errors allowed; at
the end each subtree equals its writer's model and the counter is exact.

The shared cache gets its own (``test_cache_torture``): writers and readers of a
full, bounded SharedCache, with victim writers SIGKILLed at random instants.

Runs for a few seconds in CI; ``ULTRADICT_NG_SOAK=<seconds>`` makes it a soak.
"""

from __future__ import annotations

import multiprocessing
import random
import signal
import time

import pytest

from tests import torture_workers
from tests.conftest import SOAK_SECONDS, unique_name
from ultradict_ng import SharedDict, speedups
from ultradict_ng._shm import layout as L

spawn = multiprocessing.get_context("spawn")
SECONDS = SOAK_SECONDS or 4.0


#: Rows of the big variant (a dict that readers read in place); with the
#: pure-Python twins, whose table building walks every entry in Python, 20,000
#: (still read in place: over PARTIAL_FROM), so that writers dump within the run.
BALLAST = 200_000 if speedups.IMPLEMENTATION == "native" else 20_000


@pytest.mark.parametrize("stream", ["1KiB", "growing", "blobs", "big", "redis", "files"])
def test_torture(name, stream, request, monkeypatch):
    """``1KiB``: a fixed tiny stream, so dumps are constant.  ``growing``: the
    default stream, with occasional values large enough that dumps outgrow it,
    so the stream grows while readers read (values inline).  ``blobs``: the
    tiny stream with every value of 1 KiB or more in a blob -- bytes, and numpy
    arrays of a checksum pattern that readers check, and hold, while writers
    overwrite them.  ``redis``: the same on the Redis engine, with 1 KiB of log
    allowed before a snapshot (a snapshot every few writes, readers catching up
    through snapshots while writers conflict and redo).  ``big``: the same beside
    200,000 rows (BALLAST) that nobody writes, with a 16 KiB stream (a dump every hundred or so
    writes): readers read every dump in place (a TableCache) and check
    subtrees, random rows, absent keys and ``len``, and a whole copy every 25th pass;
    one of them keeps at most 64 rows decoded (``max_decoded``).  ``files``: the
    1 KiB variant on a dict kept in files (``sync="interval"``: every process's
    flusher syncing while the others write, and every dump a checkpoint)."""
    writers, readers = 3, 2
    if stream == "redis":
        monkeypatch.setenv("ULTRADICT_NG_BACKEND", request.getfixturevalue("redis_url"))
    growing, arrays, big = stream == "growing", stream == "blobs", stream == "big"
    if arrays:
        pytest.importorskip("numpy")
    if stream == "files":
        name = request.getfixturevalue("durable_dir")
    d = torture_workers.open_dict(
        name,
        {f"b{i:06d}": torture_workers.ballast_row(i) for i in range(BALLAST)} if big else {},
        recurse=True,
        buffer_size=None if growing else 16 * 1024 if big else 1024,
        blob_threshold=1024 if arrays else (0 if growing else None),
    )
    for wid in range(writers):
        d[f"w{wid}"] = {}
    d["total"] = 0
    results = spawn.Queue()
    procs = [
        spawn.Process(target=torture_workers.writer, args=(name, w, SECONDS, results, growing, arrays))
        for w in range(writers)
    ]
    if big:
        procs += [
            spawn.Process(
                target=torture_workers.big_reader,  # (one keeps every row, one 64)
                args=(name, writers, SECONDS + 1, BALLAST, results, [None, 64][i % 2]),
            )
            for i in range(readers)
        ]
    else:
        procs += [
            spawn.Process(target=torture_workers.reader, args=(name, writers, SECONDS + 1, results))
            for _ in range(readers)
        ]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    got = [results.get(timeout=SECONDS + 120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    elapsed = time.monotonic() - t0
    writer_results = [g for g in got if g[0] == "writer"]
    reader_results = [g for g in got if g[0] == "reader"]
    errors = [e for r in reader_results for e in r[2]]
    assert not errors, errors[:5]
    for _, wid, model, _, _ in writer_results:
        got = d[f"w{wid}"].copy()
        if "arr" in model:
            import numpy as np

            assert np.array_equal(got.pop("arr"), torture_workers.array_for(model.pop("arr")[1]))
        assert got == model, wid
    assert d["total"] == sum(r[4] for r in writer_results)
    ops = sum(r[3] for r in writer_results)
    passes = sum(r[1] for r in reader_results)
    dumps = torture_workers.dumps_of(d)
    assert passes > 0 and dumps > (1 if growing or big else 10)
    if big:
        assert all(r[4] > 0 for r in reader_results), "a reader never read a dump in place"
        assert [d[f"b{i:06d}"] for i in (0, BALLAST - 1)] == [
            torture_workers.ballast_row(i) for i in (0, BALLAST - 1)
        ]
    if growing:
        assert d.buffer_size > L.DEFAULT_STREAM_SIZE  # it grew under load
    blobs = d.stats().get("blob_next_id", 1) - 1
    print(
        f"\ntorture ({stream} stream, now {d.buffer_size:,} bytes, {blobs} blobs written): "
        f"{writers} writers, {readers} readers, {elapsed:.1f}s: {ops} writes ({ops / elapsed:,.0f}/s), "
        f"{passes} checked reader passes, {dumps} dumps, 0 errors"
    )
    if stream == "files":
        d.unlink()
    d.close()


@pytest.mark.parametrize("backend", ["shm", "redis"])
def test_torture_followers(name, backend, request, monkeypatch):
    """Writers as above on the 1 KiB stream (a dump every few writes), followed by a
    change feed replaying every item onto a replica, and by a waiter looping on
    ``wait_for_change`` (checking each state it wakes to), both in spawned
    processes.  When the writers are done the test sets ``done``: the feed's replica
    must equal the dict, the waiter must have woken to the final state."""
    writers = 3
    if backend == "redis":
        monkeypatch.setenv("ULTRADICT_NG_BACKEND", request.getfixturevalue("redis_url"))
    d = SharedDict(name=name, recurse=True, buffer_size=1024)
    for wid in range(writers):
        d[f"w{wid}"] = {}
    d["total"] = 0
    results, ready = spawn.Queue(), spawn.Queue()
    followers = [
        spawn.Process(target=torture_workers.feed_follower, args=(name, ready, results)),
        spawn.Process(target=torture_workers.wait_follower, args=(name, writers, ready, results)),
    ]
    procs = [
        spawn.Process(target=torture_workers.writer, args=(name, w, SECONDS, results)) for w in range(writers)
    ]
    try:
        for p in followers:
            p.start()
        assert sorted(ready.get(timeout=120) for _ in followers) == ["feed", "wait"]
        t0 = time.monotonic()
        for p in procs:
            p.start()
        got = [results.get(timeout=SECONDS + 120) for _ in procs]
        d["done"] = True
        got += [results.get(timeout=60) for _ in followers]
        for p in procs + followers:
            p.join(60)
            assert p.exitcode == 0
    finally:
        for p in procs + followers:
            if p.is_alive():
                p.kill()
            p.join(10)
    elapsed = time.monotonic() - t0
    follow = {g[0]: g for g in got if g[0] in ("feed", "wait")}
    errors = follow["feed"][3] + follow["wait"][3]
    assert not errors, errors[:5]
    for _, wid, model, _, _ in (g for g in got if g[0] == "writer"):
        assert d[f"w{wid}"].copy() == model, wid
    ops = sum(g[3] for g in got if g[0] == "writer")
    assert follow["feed"][2] > 0 and follow["wait"][1] > 0
    print(
        f"\ntorture followers, {elapsed:.1f}s: {ops} writes, {torture_workers.dumps_of(d)} dumps; "
        f"feed: {follow['feed'][1]} items ({follow['feed'][2]} resync); "
        f"waiter: {follow['wait'][1]} wake-ups; 0 errors"
    )
    d.close()


CACHE_BOUNDS = {
    "maxsize": {"maxsize": 48},
    "maxbytes": {"maxbytes": 3000},
    "kills": {"maxsize": 40, "maxbytes": 3500},
}
CACHE_SECONDS = SOAK_SECONDS or 3.0


@pytest.mark.parametrize("variant", [*sorted(CACHE_BOUNDS), "kills-files"])
def test_cache_torture(name, variant, tmp_path):
    """A SharedCache always full (96 keys, bound 48 entries or 3,000 bytes): 3 writer
    and 2 reader spawned processes (torture_workers: "the shared cache").  Readers
    check every value (whole, this key's, never read after its expiry nor when
    written with a ttl <= 0), counters never going back, ``len``/stats within the
    bounds, and every 64 passes, under the lock, the side segment against the
    entries (no leaked slot, exact bytes).  ``kills``: meanwhile victim writers are
    SIGKILLed at random instants; they may leak a slot each until a rebuild, never
    break a bound (``kills-files``: the same on caches kept in files).  At the
    end: exact counters (the writers' own, and the total in a second, unbounded
    cache that all of them incr), the bounds, the side segment exact after
    ``expire()`` (a rebuild), every live value whole.  (Victims die
    inside set_many and delete_many too: 6cbd1d0's batch word.)"""
    writers, readers = 3, 2
    total_name = unique_name()
    label = variant
    if variant == "kills-files":  # the same, both caches kept in files
        variant, name, total_name = "kills", str(tmp_path / "cache"), str(tmp_path / "totals")
    c = torture_workers.open_cache(name, buffer_size=4096, **CACHE_BOUNDS[variant])
    totals = torture_workers.open_cache(total_name)
    results = spawn.Queue()
    procs = [
        spawn.Process(target=torture_workers.cache_writer, args=(name, total_name, w, CACHE_SECONDS, results))
        for w in range(writers)
    ]
    procs += [
        spawn.Process(
            target=torture_workers.cache_reader,
            args=(name, total_name, writers, CACHE_SECONDS + 0.5, variant != "kills", results),
        )
        for _ in range(readers)
    ]
    victims: list = []
    kills = 0
    rng = random.Random()
    try:
        t0 = time.monotonic()
        for p in procs:
            p.start()
        while variant == "kills" and time.monotonic() - t0 < CACHE_SECONDS - 0.5:
            ready = spawn.Event()
            victims.append(
                spawn.Process(
                    target=torture_workers.cache_writer,
                    args=(name, total_name, 100 + len(victims), 60.0, None, ready),
                )
            )
            victims[-1].start()
            assert ready.wait(60)
            time.sleep(rng.uniform(0.0, 0.2))
            victims[-1].kill()
            victims[-1].join(30)
            kills += victims[-1].exitcode == -signal.SIGKILL
        got = [results.get(timeout=CACHE_SECONDS + 120) for _ in procs]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        elapsed = time.monotonic() - t0
        writer_results = [g for g in got if g[0] == "writer"]
        stalls = {tuple(s) for g in writer_results for s in g[5]}
        reads = [(msg, value) for g in got if g[0] == "reader" for msg, value in g[2]]
        errors = [e for g in writer_results for e in g[6]]
        errors += [msg for msg, value in reads if value is None or tuple(value) not in stalls]
        assert not errors, errors[:5]
        for _, wid, mine, _, _, _, _ in writer_results:
            assert c.get(f"n{wid}") in (None, mine), wid  # evicted, or exact
        assert totals["total"] == sum(g[3] for g in writer_results)
        maxsize, maxbytes = c.maxsize, c.maxbytes
        with c.lock:
            assert maxsize is None or len(c) <= maxsize
            assert maxbytes is None or c.stats()["bytes"] <= maxbytes
            if torture_workers.dead_batch(c):  # the last victim died in a batch: no writer since
                assert variant == "kills"
            else:
                leaked, excess = torture_workers.check_side(c)
                assert variant == "kills" and leaked <= kills or (leaked, excess) == (0, 0), (leaked, excess)
            c.expire()  # rebuilds the free stack and bytes from the entries (a dead batch's first)
            assert not torture_workers.dead_batch(c)
            assert torture_workers.check_side(c) == (0, 0)
        now = time.time()
        for key in c:
            if key[0] == "k":
                torture_workers.check_cache_value(key, c.get(key), now, errors)
        assert not errors, errors[:5]
        ops = sum(g[4] for g in writer_results)
        passes = sum(g[1] for g in got if g[0] == "reader")
        s = c.stats()
        assert passes > 0 and s["evictions"] > 0 and s["expirations"] > 0
        print(
            f"\ncache torture ({label}), {elapsed:.1f}s: {ops} writes by {writers} writers "
            f"({ops / elapsed:,.0f}/s), {passes} checked reader passes, {s['evictions']} evictions, "
            f"{s['expirations']} expirations, {kills} victims SIGKILLed ({leaked} slots leaked), "
            f"{len(stalls)} stalled writes ({len(reads)} reads excused), 0 errors"
        )
    finally:
        for p in procs + victims:
            if p.is_alive():
                p.kill()
            p.join(10)
        for cache in (c, totals):
            cache.unlink()
            cache.close()
