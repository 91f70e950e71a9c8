"""``with d.transaction():`` -- all of a block's writes or none.

Backend-neutral tests take the ``backend`` fixture (shared memory and Redis);
those about the shared-memory engine's machinery (the stream, dumps, blobs,
fault points) carry ``shm_only``, those about Redis's (one log entry per
block, the lease) take ``redis_url``.  The bank test: movers keep
"the sum of the accounts is constant" only between their two writes, auditors
check every snapshot, and movers are SIGKILLed at random instants.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.conftest import unique_name
from tests.transaction_workers import ACCOUNTS
from ultradict_ng import (
    Closed,
    LockTimeout,
    SharedDict,
    TransactionAborted,
    Unlinked,
    UnsupportedType,
    speedups,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CI = bool(os.environ.get("CI"))


def ours(name: str) -> list[str]:
    return sorted(e for e in os.listdir("/dev/shm") if e == name or e.startswith(name + "@"))


def worker(*args: str, env: dict[str, str] = None) -> subprocess.Popen:  # type: ignore[assignment]
    e = dict(os.environ)
    e.pop("ULTRADICT_NG_FAULT", None)
    e.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "tests.transaction_workers", *args],
        cwd=ROOT,
        env=e,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def backend(each_backend: str) -> str:
    """Every backend: shared memory and Redis."""
    return each_backend


def test_redis_a_block_is_one_log_entry_and_cached_readers_never_see_part_of_it(redis_url, name, dicts):
    """A cached-mode reader applies the log entry by entry: each block must be
    one entry, however large (also past Lua's 8,000-value unpack limit)."""
    import redis as redis_py

    from ultradict_ng._redis import layout as RL

    d = dicts(name, backend=redis_url)
    reader = SharedDict(name, backend=redis_url, reads="cached")
    r = redis_py.Redis.from_url(redis_url)
    log = RL.keys_of(name).log
    block = 3000
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(len(reader.copy()))

    t = threading.Thread(target=watch)
    t.start()
    try:
        for b in range(3):
            before = r.xlen(log)
            with d.transaction():
                for i in range(block):
                    d[b * block + i] = i
            assert r.xlen(log) == before + 1
            time.sleep(0.05)
        with d.transaction():
            for i in range(10_000):
                d[f"big{i}"] = i
        deadline = time.monotonic() + 10
        while len(reader.copy()) != 3 * block + 10_000 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        t.join(10)
    assert reader.copy() == d.copy()
    assert all(n % block == 0 or n == 3 * block + 10_000 for n in seen), sorted(set(seen))
    assert len(set(seen)) > 2
    reader.close()
    r.close()
    d.unlink()


def test_redis_a_block_whose_lease_lapsed_publishes_nothing(redis_url, redis_server, name, dicts):
    """The lease lapses inside the block and another client takes the lock and
    writes: the block's publish is fenced (LeaseLost), nothing of it lands."""
    from ultradict_ng import LeaseLost
    from ultradict_ng._redis import layout as RL

    d = dicts(name, backend=redis_url, lease=1.0)
    d["a"] = 1
    other = SharedDict(name, backend=redis_url)
    with pytest.raises(LeaseLost):
        with d.transaction():
            d["a"] = 2
            d["b"] = 2
            redis_server.execute("DEL", RL.keys_of(name).lock)  # as if it had expired
            other["c"] = 3  # takes the free lock, writes
            assert d["a"] == 2  # the block still reads its own writes
    assert other.copy() == {"a": 1, "c": 3}
    assert d.copy() == {"a": 1, "c": 3}
    d["after"] = 4  # the handle goes on
    assert other.copy() == {"a": 1, "c": 3, "after": 4}
    other.close()
    d.unlink()


def test_redis_a_block_larger_than_the_server_takes_is_refused_and_changes_nothing(
    redis_url, redis_server, name, dicts
):
    from ultradict_ng import OutOfSpace

    d = dicts(name, backend=redis_url)
    d["a"] = 1
    old = redis_server.execute("CONFIG", "GET", "proto-max-bulk-len")[1]
    redis_server.execute("CONFIG", "SET", "proto-max-bulk-len", str(1 << 20))
    try:
        with pytest.raises(OutOfSpace, match="proto-max-bulk-len"):
            with d.transaction():
                for i in range(3000):
                    d[f"k{i}"] = "x" * 500  # ~1.5 MB encoded
    finally:
        redis_server.execute("CONFIG", "SET", "proto-max-bulk-len", old)
    other = SharedDict(name, backend=redis_url)
    assert d.copy() == {"a": 1} and other.copy() == {"a": 1}
    with d.transaction():  # the handle, the lock and the connection go on
        d["b"] = 2
    assert other.copy() == {"a": 1, "b": 2}
    other.close()
    d.unlink()


# -- the promise --------------------------------------------------------------------------------


def test_writes_are_invisible_until_the_block_ends_then_all_at_once(backend, name, dicts):
    d = dicts(name, recurse=True)
    d["a"] = 1
    other = SharedDict(name)
    with d.transaction() as t:
        assert t is d
        d["a"] = 2
        d["n"] = {"x": 1}
        d["n"]["y"] = 2
        d.update(b=3, c=4)
        del d["b"]
        assert d["a"] == 2 and d["n"]["y"] == 2 and "b" not in d  # its own writes
        assert dict(d.items()) == d.copy() == {"a": 2, "n": {"x": 1, "y": 2}, "c": 4}
        assert list(d) == ["a", "n", "c"]
        assert other.copy() == {"a": 1}  # another handle: nothing yet
    assert other.copy() == {"a": 2, "n": {"x": 1, "y": 2}, "c": 4}
    other.close()
    d.unlink()


def test_an_exception_discards_every_write_and_propagates(backend, name, dicts):
    d = dicts(name, recurse=True)
    d.update(a=1, n={"x": 1})
    other = SharedDict(name)
    with pytest.raises(ZeroDivisionError):
        with d.transaction():
            d["a"] = 2
            del d["n"]["x"]
            d["z"] = [1, 2]
            raise ZeroDivisionError("an error inside the block")
    assert d.copy() == other.copy() == {"a": 1, "n": {"x": 1}}
    assert d.lock.acquire(timeout=1)  # free again
    d.lock.release()
    d["a"] = 5  # and the handle writes on
    assert other["a"] == 5
    other.close()
    d.unlink()


def test_nested_blocks_join_and_an_inner_exception_dooms_the_whole(backend, name, dicts):
    d = dicts(name, recurse=True)
    d["sub"] = {}
    with d.transaction():
        d["x"] = 1
        with d["sub"].transaction():  # a nested view joins the root's transaction
            d["sub"]["y"] = 2
        assert d.copy() == {"sub": {"y": 2}, "x": 1}
    assert SharedDict(name).copy() == {"sub": {"y": 2}, "x": 1}
    with pytest.raises(TransactionAborted, match="nested"):
        with d.transaction():
            d["x"] = 10
            try:
                with d.transaction():
                    d["w"] = 1
                    raise KeyError("inner")
            except KeyError:
                pass
    assert d.copy() == {"sub": {"y": 2}, "x": 1}
    d.unlink()


def test_a_failed_write_inside_changes_nothing_and_the_block_goes_on(backend, name, dicts):
    d = dicts(name)
    with d.transaction():
        d["a"] = 1
        with pytest.raises(UnsupportedType):
            d["b"] = object()
        with pytest.raises(KeyError):
            del d["missing"]
        d["c"] = 3
    assert SharedDict(name).copy() == {"a": 1, "c": 3}
    d.unlink()


def test_lock_blocks_inside_are_reentrant_and_other_writers_wait(backend, name, dicts):
    d = dicts(name)
    d["n"] = 0
    done = []

    def other_writer() -> None:
        e = SharedDict(name)
        e["from_thread"] = e.get("n")  # (its write waits for the transaction's lock)
        done.append(e.copy())
        e.close()

    with d.transaction():
        with d.lock:
            d["n"] = 1
        t = threading.Thread(target=other_writer)
        t.start()
        time.sleep(0.3)
        assert not done  # its write waits for the transaction's lock
        d["n"] = 2
    t.join(10)
    assert done and done[0]["n"] == 2 and done[0]["from_thread"] in (0, 2)
    d.unlink()


def test_closed_and_unlinked_handles_raise_as_writes_do(backend, name):
    d = SharedDict(name)
    d.unlink()
    with pytest.raises(Unlinked):
        with d.transaction():
            pass
    d.close()
    with pytest.raises(Closed):
        with d.transaction():
            pass


def test_wait_for_change_and_the_feed_see_one_publish(backend, name, dicts):
    d = dicts(name)
    d["start"] = 0
    watcher = SharedDict(name)
    watcher.get("start")
    feed = watcher.changes(timeout=2)
    with d.transaction():
        for i in range(5):
            d[f"k{i}"] = i
        del d["start"]
    assert watcher.wait_for_change(timeout=5)
    assert watcher.copy() == {f"k{i}": i for i in range(5)}
    got = []
    for ch in feed:
        got.append((ch.op, ch.key, ch.value))
        if len(got) == 6:
            break
    assert got == [("set", f"k{i}", i) for i in range(5)] + [("delete", "start", None)]
    watcher.close()
    d.unlink()


def test_a_feed_opened_inside_a_block_reports_it_when_published_and_never_if_discarded(backend, name, dicts):
    """The handle's cache holds the block's unpublished writes: a feed it opens
    inside the block starts from the published state all the same."""
    d = dicts(name)
    d["a"] = 0
    with d.transaction():
        d["a"] = 1
        feed = d.changes(timeout=0.5)
        d["b"] = 2
    d["c"] = 3
    assert [(c.op, c.key, c.value, c.resync) for c in feed] == [
        ("set", "a", 1, False),
        ("set", "b", 2, False),
        ("set", "c", 3, False),
    ]
    with pytest.raises(RuntimeError):
        with d.transaction():
            d["x"] = 1
            feed = d.changes(timeout=0.5)
            raise RuntimeError
    d["y"] = 2
    assert [(c.op, c.key, c.value) for c in feed] == [("set", "y", 2)]


# -- shared memory: the stream, dumps and blobs ----------------------------------------------


@pytest.mark.shm_only
def test_a_block_larger_than_the_stream_is_published_as_one_dump(name, dicts):
    d = dicts(name, buffer_size=4096)
    other = SharedDict(name)
    d["old"] = 1
    gen = d.stats()["generation"]
    with d.transaction():
        for i in range(2000):
            d[i] = "v" * 20
        assert other.copy() == {"old": 1}
    assert d.stats()["generation"] == gen + 1  # one dump, not many
    assert len(other) == 2001 and other[1999] == "v" * 20
    other.close()
    d.unlink()


@pytest.mark.shm_only
def test_blobs_made_in_a_discarded_block_are_removed_and_dropped_ones_outlive_it(name, dicts):
    d = dicts(name, blob_threshold=1024)
    d["keep"] = b"k" * 4096
    before = ours(name)
    with pytest.raises(RuntimeError):
        with d.transaction():
            d["new"] = b"n" * 4096
            d["keep"] = b"r" * 4096  # drops the old blob: not before the publish
            assert len(ours(name)) == len(before) + 2
            raise RuntimeError
    assert ours(name) == before and d["keep"] == b"k" * 4096
    with d.transaction():
        d["keep"] = b"s" * 4096
        assert len(ours(name)) == len(before) + 1  # the old one is still published
    assert len(ours(name)) == len(before) and SharedDict(name)["keep"] == b"s" * 4096
    d.unlink()


@pytest.mark.parametrize("kept", ["memory", "files"])
@pytest.mark.parametrize("point", ["transaction-written", "transaction-published"])
def test_an_exception_in_the_publish_keeps_the_blobs_of_what_it_published(
    name, dicts, monkeypatch, tmp_path, kept, point
):
    """A KeyboardInterrupt inside the publish: before the STATE store nothing
    is published and the block's blobs go; after it the block is published,
    and its blobs -- which the published state references -- stay."""
    from ultradict_ng._platform import faults

    where = {"path": str(tmp_path / "d")} if kept == "files" else {"name": name}
    d = dicts(**where, blob_threshold=1024)
    d["a"] = 0

    def interrupted(at: str) -> None:
        if at == point:
            raise KeyboardInterrupt(f"Ctrl-C at {at}")

    monkeypatch.setattr(faults, "armed", point)
    monkeypatch.setattr(faults, "hit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with d.transaction():
            d["a"] = 1
            d["big"] = b"b" * 4096
    monkeypatch.undo()
    other = dicts(**where)
    if point == "transaction-written":
        assert dict(other) == {"a": 0} and dict(d) == {"a": 0}
    else:
        assert other["a"] == 1 and bytes(other["big"]) == b"b" * 4096
        assert d["a"] == 1 and bytes(d["big"]) == b"b" * 4096
    if kept == "files":
        d.unlink()


@pytest.mark.shm_only
def test_two_thousand_writes_in_a_transaction_are_not_slower_than_under_the_lock(name, dicts):
    """Both are buffered in the cache and cost about the same on shared memory
    (the publish is one atomic store either way); a regression that publishes or
    dumps per write inside a transaction would make it far slower."""
    d = dicts(name)

    def locked() -> float:
        t = time.perf_counter()
        with d.lock:
            for i in range(2000):
                d[i] = {"v": i}
        return time.perf_counter() - t

    def in_tx() -> float:
        t = time.perf_counter()
        with d.transaction():
            for i in range(2000):
                d[i] = {"v": i}
        return time.perf_counter() - t

    gen = d.stats()["generation"]
    best_lock = min(locked() for _ in range(3))
    best_tx = min(in_tx() for _ in range(3))
    assert best_tx < 3 * best_lock  # (generous: the machine is noisy; perf/ measures)
    assert d.stats()["generation"] - gen <= 6  # no dump per write
    d.unlink()


# -- shared memory: the compiled write path of a transaction (layout "Transactions") ------------

NATIVE = speedups.IMPLEMENTATION == "native"


@pytest.fixture
def slow_calls(monkeypatch):
    """The keys that went through ``SharedDict._setitem_slow`` (the Python path)."""
    keys: list[Any] = []
    slow = SharedDict._setitem_slow

    def counted(self: SharedDict, key: Any, value: Any) -> None:
        keys.append(key)
        slow(self, key, value)

    monkeypatch.setattr(SharedDict, "_setitem_slow", counted)
    if not NATIVE:  # (the twin ViewBase made _setitem_slow SharedDict's __setitem__ itself)
        monkeypatch.setattr(SharedDict, "__setitem__", counted)
    return keys


@pytest.mark.shm_only
def test_scalar_writes_of_the_transactions_thread_take_the_compiled_path(name, dicts, slow_calls):
    """Inside a block, root-level scalar sets of its thread are written by
    ViewBase itself (with the twins: all by the Python path); everything the
    compiled path does not cover still goes to the Python rules."""
    d = dicts(name, recurse=True)
    d["n"] = {}
    other = SharedDict(name)
    del slow_calls[:]
    with d.transaction():
        for i in range(50):
            d[f"k{i}"] = i
        d["s"], d[b"b"], d[2.5], d[None], d[True] = "x" * 300, b"y", -1.5, None, 2**64 - 1
        d[(1, 2)] = 1  # a tuple key: not a scalar
        d["big"] = 2**64  # beyond 64 bits: the codec's ext
        d["n"]["x"] = 1  # a nested view
        assert d["k49"] == 49 and d[True] == 2**64 - 1 and d["n"]["x"] == 1  # the block sees its writes
        assert other.copy() == {"n": {}}
    python = [(1, 2), "big", "x"]  # the nested view's write too
    taken = python if NATIVE else [f"k{i}" for i in range(50)] + ["s", b"b", 2.5, None, True] + python
    assert slow_calls == taken
    want = {
        "n": {"x": 1},
        **{f"k{i}": i for i in range(50)},
        "s": "x" * 300,
        b"b": b"y",
        2.5: -1.5,
        None: None,
        True: 2**64 - 1,
        (1, 2): 1,
        "big": 2**64,
    }
    assert other.copy() == want  # read from the stream by another handle
    later = SharedDict(name)  # and from the dump a new handle decodes, once one is written
    later._store.force_dump()
    assert SharedDict(name).copy() == want
    later.close()
    other.close()


@pytest.mark.shm_only
def test_the_compiled_path_writes_the_bytes_the_python_path_writes(name, dicts):
    """The records a block leaves in the stream are byte for byte those of the
    same writes through ``write_simple`` (the path outside transactions)."""
    import ultradict_ng._shm.layout as L

    values: list[Any] = [
        0,
        -1,
        127,
        128,
        -33,
        2**31,
        -(2**63),
        2**64 - 1,
        1.5,
        "",
        "é" * 40,
        b"",
        b"z" * 300,
        None,
        True,
        False,
    ]
    d = dicts(name)
    s = d._store
    with d.transaction():
        start = s.pos
        for i, v in enumerate(values):
            d[f"k{i}"] = v
            d[v] = i
        end = s.pos
        stream = bytes(s._map.stream_mv[start:end])
    expect = bytearray(end - start + 64)
    words = speedups.Words(expect)
    try:
        at = 0
        for i, v in enumerate(values):
            for key, value in ((f"k{i}", v), (v, i)):
                unit = at << L.UNIT_BACK_SHIFT  # (the offset from the transaction's first record)
                at = words.write_simple(at, s.gen & L.GEN_MASK, len(expect), L.OP_SET, key, value, 0, unit)
    finally:
        words.release()
    assert stream == bytes(expect[:at])


@pytest.mark.shm_only
def test_another_thread_of_the_same_handle_waits_for_the_block(name, dicts):
    """The compiled path belongs to the block's thread: another thread's write
    through the same handle waits for the lock, and lands after the block."""
    d = dicts(name)
    done: list[Any] = []

    def writer() -> None:
        d["t"] = 1
        done.append(True)

    with d.transaction():
        d["a"] = 1
        t = threading.Thread(target=writer)
        t.start()
        time.sleep(0.3)
        assert not done and "t" not in d
        d["b"] = 2
    t.join(10)
    assert done and SharedDict(name).copy() == {"a": 1, "b": 2, "t": 1}


@pytest.mark.shm_only
def test_a_scalar_over_a_blob_holding_value_drops_the_blob_at_the_publish(name, dicts):
    """Once blobs exist, a scalar replacing a value that holds one goes to the
    Python path, which unlinks the old blob when the block is published."""
    d = dicts(name, blob_threshold=1024)
    d["keep"] = [b"k" * 4096, 1]
    d["plain"] = 0
    before = ours(name)
    with d.transaction():
        d["plain"] = 1  # (old value a scalar: the compiled path)
        d["keep"] = 2
        assert ours(name) == before  # dropped only once published
    assert len(ours(name)) == len(before) - 1
    assert SharedDict(name).copy() == {"keep": 2, "plain": 1}
    with d.transaction():
        d["large"] = b"L" * 2048  # over the threshold: a blob, as outside a block
        d["small"] = b"s" * 1000
    assert len(ours(name)) == len(before)
    assert SharedDict(name).copy() == {"keep": 2, "plain": 1, "large": b"L" * 2048, "small": b"s" * 1000}


@pytest.mark.shm_only
def test_a_block_closed_inside_raises_closed_and_publishes_nothing(name, dicts):
    d = dicts(name)
    d["a"] = 0
    other = SharedDict(name)
    with pytest.raises(Closed):
        with d.transaction():
            d["a"] = 1
            d.close()
            d["a"] = 2
    assert other.copy() == {"a": 0}
    with other.lock(timeout=1):  # the lock was given back
        pass
    other.close()


@pytest.mark.shm_only
def test_a_child_forked_inside_a_block_writes_through_the_lock(name, dicts):
    """A child forked by the block's thread has the same thread id and the
    parent's armed state: its writes must wait for the lock and publish,
    never go past the parent's unpublished records."""
    d = dicts(name)
    r, w = os.pipe()
    with d.transaction():
        for i in range(20):
            d[f"p{i}"] = i
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.close(r)
                d["c"] = 3  # waits for the parent's block to end
                os.write(w, b"written")
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        time.sleep(0.3)
        d["p0"] = -1
    _, status = os.waitpid(pid, 0)
    assert os.read(r, 100) == b"written" and status == 0
    os.close(r)
    assert SharedDict(name).copy() == {"p0": -1, **{f"p{i}": i for i in range(1, 20)}, "c": 3}


# -- processes ---------------------------------------------------------------------------------


def _wait_line(p: subprocess.Popen, want: str, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = p.stdout.readline()  # type: ignore[union-attr]
        if line.strip() == want:
            return
        if not line and p.poll() is not None:
            break
    raise AssertionError(f"worker never printed {want!r}: {p.stderr.read()}")  # type: ignore[union-attr]


def test_a_process_killed_inside_a_block_publishes_nothing(backend, name, dicts):
    d = dicts(name)
    d["k0"] = "old"
    p = worker("block", name, "-", env={"TX_LEASE": "0.6"} if backend == "redis" else {})
    try:
        _wait_line(p, "inside")
        assert d.copy() == {"k0": "old"}
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.wait(10)
    t = time.monotonic()
    assert d.lock.acquire(timeout=5)  # the dead holder's lock is taken over
    d.lock.release()
    assert time.monotonic() - t < 1.0  # (on Redis: the dead worker's 0.6 s lease ran out)
    assert d.copy() == {"k0": "old"}
    d["after"] = 1
    assert SharedDict(name).copy() == {"k0": "old", "after": 1}
    d.unlink()
    assert ours(name) == []


@pytest.mark.shm_only
@pytest.mark.parametrize("point", ["transaction-written", "transaction-published"])
@pytest.mark.parametrize("stream", [None, 512])
def test_a_process_dying_in_the_publish_leaves_all_or_nothing(name, point, stream, dicts):
    d = dicts(name, buffer_size=stream, blob_threshold=1024)
    d["k0"] = "old"
    p = worker("block", name, "x", env={"ULTRADICT_NG_FAULT": f"{point}:kill"})
    out, err = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL, err
    got = d.copy()
    want = {**{f"k{i}": i for i in range(10)}, "blob": b"x" * 70_000}
    assert got == ({"k0": "old"} if point == "transaction-written" else want)
    assert d.lock.acquire(timeout=1)
    d.lock.release()
    d["after"] = 1  # the next writer continues from it (and sweeps the leftovers at a dump)
    d.unlink()
    assert ours(name) == []


def test_bank_auditors_never_see_a_broken_total_with_movers_sigkilled(backend, name, dicts):
    seconds = 3.0 if CI else 6.0
    d = dicts(name)
    d.update({a: 1000 for a in ACCOUNTS})
    env = {"TX_LEASE": "1.0"} if backend == "redis" else {}
    total = 1000 * len(ACCOUNTS)
    auditors = [worker("auditor", name, str(total), str(seconds), env=env) for _ in range(2)]
    movers: list[subprocess.Popen] = []
    killed = 0
    rnd = random.Random(7)
    end = time.monotonic() + seconds
    seed = 0
    try:
        while time.monotonic() < end:
            movers = [m for m in movers if m.poll() is None]
            while len(movers) < 3:
                seed += 1
                movers.append(worker("mover", name, str(seed), str(seconds), env=env))
            time.sleep(rnd.uniform(0.2, 0.8))
            victim = rnd.choice(movers)
            if victim.poll() is None:
                victim.kill()  # SIGKILL at a random instant (inside a block or not)
                killed += 1
        reports = [a.communicate(timeout=seconds + 60)[0] for a in auditors]
    finally:
        for p in movers + auditors:
            if p.poll() is None:
                p.kill()
            p.wait(30)
            p.stdout.close()  # type: ignore[union-attr]
            p.stderr.close()  # type: ignore[union-attr]
    audits = broken = 0
    for r in reports:
        fields = r.split()
        audits += int(fields[1])
        broken += int(fields[3])
    assert killed >= 3 and audits > 20
    assert broken == 0, f"{broken} of {audits} snapshots had a wrong total"
    assert sum(d[a] for a in ACCOUNTS) == total
    d.unlink()


# -- the model --------------------------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "c", 1, 2.5, (1, 2)])
VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.none(), st.binary(min_size=0, max_size=8))


class TransactionMachine(RuleBasedStateMachine):
    """Writes inside and outside transactions against a plain dict model:
    a committed block changes the model, a rolled-back one does not, and a
    second handle sees the model outside blocks and the old state inside."""

    #: Set by the test: the backend's extra arguments.
    options: dict[str, Any] = {}

    def __init__(self) -> None:
        super().__init__()
        self.name = unique_name("sm")
        self.d = SharedDict(self.name, **self.options)
        self.other = SharedDict(self.name)
        self.model: dict[Any, Any] = {}
        self.pending: Any = None  # the model inside an open block
        self.cm: Any = None

    def _m(self) -> dict[Any, Any]:
        return self.model if self.pending is None else self.pending

    @precondition(lambda self: self.cm is None)
    @rule()
    def begin(self) -> None:
        self.cm = self.d.transaction()
        self.cm.__enter__()
        self.pending = dict(self.model)

    @precondition(lambda self: self.cm is not None)
    @rule(commit=st.booleans())
    def end(self, commit: bool) -> None:
        cm, self.cm = self.cm, None
        if commit:
            cm.__exit__(None, None, None)
            self.model = self.pending
        else:
            err = RuntimeError("roll back")
            assert cm.__exit__(RuntimeError, err, None) is not True
        self.pending = None

    @rule(k=KEYS, v=VALUES)
    def set(self, k: Any, v: Any) -> None:
        self.d[k] = v
        self._m()[k] = v

    @rule(k=KEYS)
    def delete(self, k: Any) -> None:
        m = self._m()
        if k in m:
            del self.d[k]
            del m[k]
        else:
            with pytest.raises(KeyError):
                del self.d[k]

    @rule(items=st.dictionaries(KEYS, VALUES, max_size=4))
    def update(self, items: dict[Any, Any]) -> None:
        self.d.update(items)
        self._m().update(items)

    @rule(n=st.integers(1, 60))
    def many(self, n: int) -> None:  # (past a 2 KiB stream: the dump path)
        for i in range(n):
            self.d[f"m{i}"] = "x" * 30
            self._m()[f"m{i}"] = "x" * 30

    @rule()
    def clear(self) -> None:
        self.d.clear()
        self._m().clear()

    @invariant()
    def views(self) -> None:
        assert self.d.copy() == self._m()
        assert list(self.d.keys()) == list(self._m())
        assert self.other.copy() == self.model

    def teardown(self) -> None:
        if self.cm is not None:
            self.cm.__exit__(RuntimeError, RuntimeError("teardown"), None)
        self.other.close()
        self.d.unlink()
        self.d.close()


def test_transactions_against_a_dict_model(backend, monkeypatch):
    monkeypatch.setattr(TransactionMachine, "options", {"buffer_size": 2048} if backend == "shm" else {})
    state = TransactionMachine.TestCase
    runs = 25 if CI else 100
    state.settings = settings(
        max_examples=runs if backend == "shm" else runs // 2, stateful_step_count=30, deadline=None
    )
    state().runTest()


@pytest.mark.shm_only
def test_a_child_forked_inside_a_block_starts_outside_it_from_the_published_state(name, dicts):
    d = dicts(name)
    d["a"] = 1
    r, w = os.pipe()
    with d.transaction():
        d["a"] = 2
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.close(r)
                seen = d["a"]  # the published state, not the parent's block
                try:
                    d.lock.acquire(timeout=0.3)  # the parent's transaction holds the lock
                    held = "free"
                except LockTimeout:
                    held = "held"
                os.write(w, f"{seen} {held}".encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        _, status = os.waitpid(pid, 0)
    assert os.read(r, 100).decode() == "1 held" and status == 0
    os.close(r)
    assert SharedDict(name)["a"] == 2


@pytest.mark.shm_only
def test_the_pickle_serializer_and_blobs_publish_at_once(name, dicts):
    d = dicts(name, serializer="pickle", blob_threshold=1024, recurse=True)
    other = SharedDict(name)
    with d.transaction():
        d["when"] = {1, 2}
        d["big"] = bytearray(b"b" * 5000)
        d["n"] = {"x": b"y" * 3000}
        assert other.copy() == {}
    assert other.copy() == {"when": {1, 2}, "big": bytearray(b"b" * 5000), "n": {"x": b"y" * 3000}}
    other.close()
