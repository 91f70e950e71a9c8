"""Crash injection: a writer dies at every named point of the write and dump paths
(and at random instants), and everybody else carries on.

For each death we check what the protocol promises: the lock is recovered within
about a second; every write acknowledged before the death is still there; the
dict is consistent (a fresh handle sees exactly what the survivor sees); and
``unlink_by_name`` still finds and removes every segment.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import soak_scaled
from ultradict_ng import SharedDict, unlink_by_name
from ultradict_ng._platform import faults
from ultradict_ng._shm import layout as L
from ultradict_ng._shm import waiting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STREAM = 256  # small: a dump every few writes
BLOB_THRESHOLD = 256  # the worker's 300-byte values go to blobs


def ours(name: str):
    return sorted(e for e in os.listdir("/dev/shm") if e == name or e.startswith(name + "@"))


def start_writer(
    name: str, start: int, count: int, fault: str = "", locked: bool = False, transaction: bool = False
) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("ULTRADICT_NG_FAULT", None)
    if fault:
        env["ULTRADICT_NG_FAULT"] = fault
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash_worker", name, str(start), str(count)]
        + (["locked"] if locked else [])
        + (["transaction"] if transaction else []),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def acks(output: str) -> dict[str, int]:
    last: dict[str, int] = {}
    for line in output.splitlines():
        if line.startswith("ack "):
            _, key, value = line.split()
            last[key] = int(value)
    return last


def check_survivors(d: SharedDict, acked: dict[str, int], attempted_max: int) -> float:
    """Lock recovered fast, acknowledged writes present, state consistent. Returns the wait."""
    t0 = time.monotonic()
    with d.lock(timeout=5):
        waited = time.monotonic() - t0
        d["survivor"] = d.get("survivor", 0) + 1
    for key, value in acked.items():
        assert d[key] >= value, (key, d[key], value)  # nothing acknowledged was lost
        assert d[key] <= attempted_max
    fresh = SharedDict(name=d.name, create=False)
    assert fresh.copy() == d.copy()
    fresh.close()
    return waited


#: The points of the user register: an attacher or a remover dies there, not a
#: writer (see the tests at the end of this file).
USER_POINTS = ("user-registered", "closing-claimed", "closing-checked")
#: The process pool's points: a pool or a worker dies there (tests/test_futures_leaks.py).
POOL_POINTS = ("parcel-created", "parcel-written")
#: The Redis engine's points (test_redis_writer_dies_at_fault_point below).
REDIS_POINTS = tuple(p for p in faults.POINTS if p.startswith("redis-"))
#: The cache's points: a writer or a claimer dies there (tests/test_cache_processes.py).
CACHE_POINTS = tuple(p for p in faults.POINTS if p.startswith("cache-"))
#: Recovery of a dict kept in files (tests/test_durable_crash.py).
RECOVERY_POINTS = tuple(p for p in faults.POINTS if p.startswith(("recovery-", "sync-")))

#: Every fault point of the write path with inline values; and with the worker's
#: 300-byte values in blobs (threshold 256), which also passes the blob points.
FAULT_CASES = [
    pytest.param(point, threshold, id=f"{point}-{'blobs' if threshold else 'inline'}")
    for point in faults.POINTS
    if point not in USER_POINTS + POOL_POINTS + REDIS_POINTS + CACHE_POINTS + RECOVERY_POINTS
    for threshold in ((BLOB_THRESHOLD,) if point.startswith("blob") else (0, BLOB_THRESHOLD))
]


@pytest.mark.parametrize("action", ["kill", "exit"])
@pytest.mark.parametrize("point, threshold", FAULT_CASES)
def test_writer_dies_at_fault_point(name, point, threshold, action):
    d = SharedDict({"k0": -1}, name=name, buffer_size=STREAM, blob_threshold=threshold)
    # Dump and blob points are passed once per dump or blob (every ~4 writes): die at the 2nd.
    after = 2 if point.startswith(("dump", "blob")) else 5
    # The transaction points are passed only by a writer whose writes are in blocks.
    p = start_writer(name, 0, 40, f"{point}:{action}:{after}", transaction=point.startswith("transaction"))
    out, err = p.communicate(timeout=60)
    assert p.returncode == (-signal.SIGKILL if action == "kill" else 70), err
    acked = acks(out)
    assert acked, "the writer died before its first write: the fault point was not reached in time"
    waited = check_survivors(d, acked, 40)
    assert waited < 1.0, f"lock recovery took {waited:.2f}s"
    # The dead writer's debris does not break later writers (e.g. an orphan dump
    # segment with the next generation's name) ...
    p2 = start_writer(name, 100, 20)
    out2, err2 = p2.communicate(timeout=60)
    assert p2.returncode == 0, err2
    check_survivors(d, acks(out2), 120)
    # ... and crash cleanup still finds every segment.
    present = ours(name)
    d.close()  # creator's auto_unlink also goes through the register
    assert ours(name) == []
    assert len(present) >= 2


@pytest.mark.parametrize(
    "point", ["dump-created", "dump-written", "dump-registered", "blob-registered", "blob-written"]
)
def test_unlink_by_name_after_death_mid_dump(name, point):
    """The last user dies mid-dump or mid-blob: unlink_by_name removes the orphan too
    (a dump made and unpublished goes as the dead writer's lock is taken over)."""
    d = SharedDict(name=name, buffer_size=STREAM, auto_unlink=False, blob_threshold=BLOB_THRESHOLD)
    d.close()
    p = start_writer(name, 0, 40, f"{point}:kill:2")
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL
    present = ours(name)
    unpublished = point in ("dump-created", "dump-written")
    assert unlink_by_name(name) == len(present) - unpublished
    assert ours(name) == []


@pytest.mark.parametrize("threshold", [0, BLOB_THRESHOLD], ids=["inline", "blobs"])
def test_random_sigkills_of_writers(name, threshold):
    """Writers killed at random instants, again and again (>= 10 kills; more when soaking)."""
    rng = random.Random(1234)
    d = SharedDict(name=name, buffer_size=STREAM, blob_threshold=threshold)
    kills = 0
    start = 0
    waits = []
    target = soak_scaled(12)
    while kills < target:
        p = start_writer(name, start, 100_000)
        time.sleep(rng.uniform(0.15, 0.6))  # interpreter start-up is ~0.1 s
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate(timeout=60)
        if p.returncode != -signal.SIGKILL:
            continue
        kills += 1
        acked = acks(out)
        waits.append(check_survivors(d, acked, start + 100_000))
        start += 100_000
    assert max(waits) < 1.5, waits
    assert d["survivor"] == target
    waits.sort()
    print(
        f"\nrandom SIGKILLs: {kills} writers killed, {start // 100_000} runs; lock recovered "
        f"in median {waits[len(waits) // 2]:.3f}s, max {waits[-1]:.3f}s"
    )
    d.close()
    assert ours(name) == []


ARRAY_WRITER = """
import sys
import numpy as np
from ultradict_ng import SharedDict
d = SharedDict(name=sys.argv[1], create=False)
i = int(sys.argv[2])
while True:
    d["arr"] = np.full(10 << 17, i, dtype=np.int64)  # 10 MiB
    print(f"ack {i}", flush=True)
    i += 1
"""


def test_writer_killed_in_a_loop_writing_10mb_arrays(name):
    """SIGKILL at random instants of a loop of 10 MiB array writes (inside the blob's
    pwrite, between blob and publish, after it): every acknowledged array is there
    or superseded, never torn; after the survivors' next write no blob but the
    current one exists, and cleanup leaves nothing."""
    np = pytest.importorskip("numpy")
    rng = random.Random(99)
    d = SharedDict(name=name, buffer_size=STREAM)
    d["arr"] = np.full(10 << 17, -1, dtype=np.int64)
    start, kills = 0, 0
    while kills < soak_scaled(6):
        p = subprocess.Popen(
            [sys.executable, "-c", ARRAY_WRITER, name, str(start)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=ROOT),
        )
        time.sleep(rng.uniform(0.3, 0.9))
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate(timeout=60)
        acked = [int(line.split()[1]) for line in out.splitlines() if line.startswith("ack ")]
        if p.returncode != -signal.SIGKILL or not acked:
            continue
        kills += 1
        with d.lock(timeout=5):  # recovered from the dead holder, if it died holding it
            arr = d["arr"]
        assert int(arr.min()) == int(arr.max()), "torn array"
        assert acked[-1] <= int(arr[0]) <= acked[-1] + 1  # the last acknowledged, or the unacknowledged next
        start = acked[-1] + 2
    d["arr"] = np.zeros(8)  # drops the current blob; a dead writer's orphan waits for a dump...
    d._store.force_dump()  # ...which sweeps it
    assert [e for e in ours(name) if "@b" in e] == []
    d.close()
    assert ours(name) == []


def start_follower(name: str) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-m", "tests.crash_worker", "--follow", name],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert select.select([p.stdout], [], [], 60)[0] and p.stdout.readline() == "ready\n"
    return p


def registered_pids(d: SharedDict) -> set:
    w = d._store._map.words
    return {
        w[L.W_WAIT_SLOTS + i] & L.PID_MASK
        for i in range(L.WAIT_SLOTS)
        if w[L.W_WAIT_SLOTS + i] and w[L.W_CHANGE_WAITERS] >> i & 1
    }


@pytest.mark.parametrize("point", ["lock-held", "record-written", "dump-published"])
def test_writer_and_a_sleeping_waiter_die_while_others_wait(name, point):
    """Three processes sleep in wait_for_change; one is SIGKILLed asleep, then a
    writer dies at a fault point.  The lock is recovered, the survivors' writes wake
    the two live waiters, which end on the final state, and the dead waiter's
    registration is swept once a write wakes nobody."""
    d = SharedDict({"k0": -1}, name=name, buffer_size=STREAM)
    futex = waiting.MODE == "futex"  # the children's mode too (same environment)
    followers = []
    try:
        for _ in range(3):
            followers.append(start_follower(name))
        if futex:
            t0 = time.monotonic()
            while registered_pids(d) != {f.pid for f in followers}:
                assert time.monotonic() - t0 < 20, "the waiters did not register"
                time.sleep(0.01)
        time.sleep(0.2)  # asleep
        victim = followers.pop()
        victim.send_signal(signal.SIGKILL)
        victim.communicate(timeout=30)
        after = 2 if point.startswith("dump") else 5
        p = start_writer(name, 0, 40, f"{point}:kill:{after}")
        out, err = p.communicate(timeout=60)
        assert p.returncode == -signal.SIGKILL, err
        waited = check_survivors(d, acks(out), 40)
        assert waited < 1.0, f"lock recovery took {waited:.2f}s"
        p2 = start_writer(name, 100, 20)
        out2, err2 = p2.communicate(timeout=60)
        assert p2.returncode == 0, err2
        d["stop"] = True
        outs = [f.communicate(timeout=30) for f in followers]
    finally:
        for f in followers:
            if f.poll() is None:
                f.kill()
                f.communicate()
    expected = {k: v for k, v in d.items() if k.startswith("k")}
    for f, (fout, ferr) in zip(followers, outs):
        assert f.returncode == 0, ferr
        assert "timeout" not in fout, "a live waiter was not woken"
        assert json.loads(fout.split("final ", 1)[1]) == expected
    d["sweep"] = 1  # wakes nobody: sweeps (at most once a second per process)...
    time.sleep(1.1)
    d["sweep"] = 2  # ...so surely by now
    w = d._store._map.words
    assert w[L.W_CHANGE_WAITERS] == 0 and w[L.W_LOCK_WAITERS] == 0
    assert not any(w[L.W_WAIT_SLOTS + i] for i in range(L.WAIT_SLOTS))
    d.close()
    assert ours(name) == []


# -- the user register (layout: "Users") ---------------------------------------------------


def start_remover(name: str, fault: str = "") -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("ULTRADICT_NG_FAULT", None)
    if fault:
        env["ULTRADICT_NG_FAULT"] = fault
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash_worker", "--remove", name],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_attacher_dies_holding_its_user_slot(name):
    """An attacher killed right after claiming its slot (CLOSING not yet checked):
    the dict stays usable, the slot shows a dead user, and the remove protocol
    removes the dict once nobody alive uses it."""
    from ultradict_ng._shm.control import Header, attach_control
    from ultradict_ng._shm.mapping import Mapping
    from ultradict_ng._shm.users import remove_if_unused

    d = SharedDict({"k0": -1}, name=name, buffer_size=STREAM, auto_unlink=False)
    p = start_writer(name, 0, 5, "user-registered:kill")
    out, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, err
    assert acks(out) == {}
    assert {u.pid: u.alive for u in d.users()} == {os.getpid(): True, p.pid: False}
    assert d.stats()["users"] == 1
    check_survivors(d, {}, 0)
    p2 = start_writer(name, 100, 8)  # another attacher is not bothered by the dead slot
    out2, err2 = p2.communicate(timeout=60)
    assert p2.returncode == 0, err2
    check_survivors(d, acks(out2), 108)
    # This process keeps the control mapped (another session's ``clean`` then
    # leaves the dict alone); the protocol run here ignores this process.
    m = Mapping(attach_control(name), None)
    try:
        d.close()
        verdict = remove_if_unused(name, m, Header.read(name, m.words).token)
    finally:
        m.release()
    assert verdict.users == [] and verdict.removed >= 2, verdict
    assert ours(name) == []


@pytest.mark.parametrize("then", ["attach", "remove", "unlink_by_name"])
@pytest.mark.parametrize("point", ["closing-claimed", "closing-checked"])
def test_remover_dies_holding_closing(name, point, then):
    """A remover killed while it holds CLOSING (before or after its users check):
    an attacher does not hang (it takes the dead word over and attaches to the
    intact dict), a later remover takes over and removes it, and unlink_by_name
    still removes every segment."""
    from ultradict_ng._platform.owner import pid_of
    from ultradict_ng._shm.control import attach_control
    from ultradict_ng._shm.mapping import Mapping

    d = SharedDict({"a": 1}, name=name, buffer_size=STREAM, auto_unlink=False)
    d["big"] = b"x" * 400  # a dump segment too
    d.close()
    p = start_remover(name, f"{point}:kill")
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, f"the remover did not reach {point}: {err}"
    m = Mapping(attach_control(name), None)
    try:
        assert pid_of(m.words[L.W_CLOSING]) == p.pid  # left behind by the dead remover
        assert not m.words[L.W_STATUS] & L.STATUS_UNLINKED
        present = ours(name)
        assert len(present) >= 3
        if then == "attach":
            t0 = time.monotonic()
            r = SharedDict(name=name, create=None, auto_unlink=False)
            assert time.monotonic() - t0 < 1.0, "the attacher waited for a dead remover"
            assert not r._store.created and r["a"] == 1  # the same dict, intact
            assert m.words[L.W_CLOSING] == 0
            assert [u.pid for u in r.users() if u.alive] == [os.getpid()]
            r["b"] = 2
            r.close()
            left = ours(name)
            assert len(left) >= 3 and unlink_by_name(name) == len(left)
        elif then == "remove":
            p2 = start_remover(name)
            out2, err2 = p2.communicate(timeout=60)
            assert p2.returncode == 0, err2
            # This process maps the control: the remover must keep the dict ...
            assert out2.startswith("kept"), out2
            assert pid_of(m.words[L.W_CLOSING]) == 0  # ... after taking the dead word over
            m.release()
            m = None
            p3 = start_remover(name)
            out3, err3 = p3.communicate(timeout=60)
            assert p3.returncode == 0, err3
            assert out3.split() in (["removed", str(len(present))], ["gone"]), out3
        else:
            assert unlink_by_name(name) == len(present)
    finally:
        if m is not None:
            m.release()
    assert ours(name) == []


REDIS_CASES = [
    pytest.param(point, locked, id=f"{point}-{'locked' if locked else 'unlocked'}")
    for point in REDIS_POINTS
    for locked in (False, True)
    if locked or point != "redis-lease-taken"  # (unlocked writes take no lease)
]


@pytest.mark.parametrize("point, locked", REDIS_CASES)
def test_redis_writer_dies_at_fault_point(name, point, locked, redis_url, monkeypatch):
    """A writer SIGKILLed between sending a script and reading its reply (or
    holding a fresh lease): its write landed whole or not at all, every write
    it saw acknowledged is there, the lock is free again within the lease, and
    the log never outgrows its bound (snapshots every few writes: 256 bytes)."""
    from ultradict_ng._redis import layout as RL

    monkeypatch.setenv("ULTRADICT_NG_BACKEND", redis_url)
    d = SharedDict({"k0": -1}, name=name, buffer_size=256)
    after = 2 if point == "redis-snapshot-sent" else 5
    p = start_writer(name, 0, 40, f"{point}:kill:{after}", locked)
    out, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, err
    acked = acks(out)
    assert acked, "the writer died before its first write: the fault point was not reached in time"
    waited = check_survivors(d, acked, 40)
    assert waited < (RL.DEFAULT_LEASE + 1.0 if locked else 1.0), f"lock free after {waited:.2f}s"
    if not locked:
        for key in ("k0", "k1", "k2", "k3", "k4"):
            assert d.get(key, -1) <= 39
    p2 = start_writer(name, 100, 20, locked=locked)
    out2, err2 = p2.communicate(timeout=60)
    assert p2.returncode == 0, err2
    check_survivors(d, acks(out2), 120)
    st = d.stats()
    assert st["log_bytes"] <= max(256, RL.SNAP_RATIO * st["snapshot_bytes"]) + 400
    d.close()  # the creator's auto_unlink removes every key (redis_url checks)


BULK_LOADER = """
import sys
from ultradict_ng import SharedDict
d = SharedDict(name=sys.argv[1], create=False)
d.update({f"row{i}": (i, "r", i / 2) for i in range(5000)})
print("loaded", flush=True)
"""


@pytest.mark.parametrize(
    "point", ["lock-held", "dump-registered", "dump-created", "dump-written", "dump-published"]
)
def test_a_loader_killed_mid_bulk_load(name, point):
    """A bulk load (update() of a dict of >= PARTIAL_FROM rows: a dump, written
    by Store.load without a record) SIGKILLed at each point of its dump: the
    others recover the lock, see the dict before the load or with all of it
    (from "dump-published" on), never part; a reader that maps it reads every
    row; later writes work, and cleanup finds every segment."""
    d = SharedDict({"before": 1}, name=name, buffer_size=1 << 16)
    env = dict(os.environ, ULTRADICT_NG_FAULT=f"{point}:kill:1", PYTHONPATH=ROOT)
    p = subprocess.Popen(
        [sys.executable, "-c", BULK_LOADER, name],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, err
    assert "loaded" not in out
    with d.lock(timeout=5):
        state = d.copy()
    loaded = {"before": 1, **{f"row{i}": (i, "r", i / 2) for i in range(5000)}}
    assert state == (loaded if point == "dump-published" else {"before": 1}), sorted(state)[:3]
    fresh = SharedDict(name=name, create=False)
    assert fresh.copy() == state and fresh.get("row4999") == state.get("row4999")
    d["after"] = 2
    assert fresh["after"] == 2 and len(fresh) == len(state) + 1
    fresh.close()
    present = ours(name)
    assert unlink_by_name(name) == len(present) and ours(name) == []
    d.close()


MERGER = r"""
import sys
from ultradict_ng import SharedDict
from ultradict_ng._shm import dumps
from ultradict_ng._shm.tablecache import TableCache
real = dumps._merge
def merging(*args):
    print("merging", flush=True)
    return real(*args)
dumps._merge = merging
bound = None if sys.argv[3] == "all" else int(sys.argv[3])  # (max_decoded)
d = SharedDict(name=sys.argv[1], create=False, buffer_size=1 << 16, max_decoded=bound)
assert type(d._store.data) is TableCache
for i in range(0, 5000, 50):  # (rows decoded, and with a bound dropped, before the writes)
    assert d[f"row{i}"][0] == i
if sys.argv[2] == "records":  # published one by one, then merged into a dump
    del d["row1"]
    d["row2"] = "two"
    d["new"] = 1
    d._store.force_dump()
else:  # a transaction too big for the stream: published by its merged dump, or not at all
    with d.transaction():
        del d["row1"]
        for i in range(400):  # (8% of the rows, 80 KiB of records: a merged dump)
            d[f"row{i + 2}"] = ("changed", i, "x" * 200)
        d["new"] = 1
print("merged", flush=True)
"""


@pytest.mark.parametrize("how", ["records", "transaction"])
@pytest.mark.parametrize("point", ["dump-registered", "dump-created", "dump-written", "dump-published"])
@pytest.mark.parametrize("kept", ["all", "8"])
def test_a_writer_killed_mid_merge(name, point, how, kept):
    """A writer whose cache is read in place (a big dict: a TableCache) SIGKILLed
    at each point of its merged dump: the others recover the lock and see the
    dict as its records left it -- a transaction's writes all (from
    "dump-published" on) or none; a reader maps the dump and reads every row;
    later writes work, and cleanup finds every segment.  The writer keeps
    every row it decoded, or (``max_decoded=8``) drops all but a few."""
    rows = {f"row{i}": (i, "r", i / 2) for i in range(5000)}
    d = SharedDict(rows, name=name, buffer_size=1 << 16)
    env = dict(os.environ, ULTRADICT_NG_FAULT=f"{point}:kill:1", PYTHONPATH=ROOT)
    p = subprocess.Popen(
        [sys.executable, "-c", MERGER, name, how, kept],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, err
    assert "merging" in out and "merged" not in out
    with d.lock(timeout=5):
        state = d.copy()
    changed = dict(rows)
    del changed["row1"]
    if how == "records":
        changed.update({"row2": "two", "new": 1})
    else:
        changed.update({f"row{i + 2}": ("changed", i, "x" * 200) for i in range(400)})
        changed["new"] = 1
    want = changed if how == "records" or point == "dump-published" else rows
    assert state == want and list(state) == list(want)
    fresh = SharedDict(name=name, create=False)
    assert fresh.copy() == want and fresh.get("row4999") == want["row4999"]
    d["after"] = 2
    assert fresh["after"] == 2 and len(fresh) == len(want) + 1
    fresh.close()
    present = ours(name)
    assert unlink_by_name(name) == len(present) and ours(name) == []
    d.close()
