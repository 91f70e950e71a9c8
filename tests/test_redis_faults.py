"""The Redis backend under faults: real servers killed, restarted, paused, connections cut,
lock holders killed or stalled past their lease, replies lost, garbage in the keys.

Every scenario runs against real ``redis-server`` processes (``tests/redis_servers.py``)
and, where a second process matters, ``spawn`` children (``tests/redis_workers.py``).
Nothing waits for a fixed time and hopes: every wait polls a condition up to a deadline
and then asserts, and every bound the protocol promises (lease, staleness) is measured.

Tests marked ``xfail(strict=True, reason="bug: ...")`` show a bug of the backend: they
fail now and will pass (and then need the mark removed) once it is fixed.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import threading
import time
from typing import Any, Optional

import pytest

from tests import redis_workers as workers
from tests.redis_servers import RedisServer, require_redis
from tests.redis_workers import Child, outcome, wait_until
from ultradict_ng import SharedDict
from ultradict_ng.errors import (
    BackendUnavailable,
    LeaseLost,
    LockTimeout,
    SharedDictError,
    Unlinked,
)

#: Slack on every measured bound: a 2-core VM shared with other jobs.
MARGIN = 0.5


@pytest.fixture(autouse=True)
def _needs_redis() -> None:
    require_redis()


# ---------------------------------------------------------------------------- helpers


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def blocked_clients(server: RedisServer, command: str) -> int:
    """Clients of ``server`` blocked in ``command`` right now (``CLIENT LIST`` flags b)."""
    listing = server.execute("CLIENT", "LIST")
    assert isinstance(listing, bytes)
    count = 0
    for line in listing.decode().splitlines():
        fields = dict(f.split("=", 1) for f in line.split(" ") if "=" in f)
        if "b" in fields.get("flags", "") and fields.get("cmd") == command:
            count += 1
    return count


# ---------------------------------------------------------------------------- 1. kill, persistence


def test_kill_with_persistence_loses_no_acknowledged_write(name: str) -> None:
    """A writer process writes numbered keys while the server is SIGKILLed and restarted
    (AOF, appendfsync always): every write it saw acknowledged is there afterwards, the
    write in flight raised BackendUnavailable, and the other handles -- fresh and cached
    -- resynchronise and never show a state older than the last acknowledged write."""
    staleness = 0.3
    with RedisServer.start(persistence=True) as srv:
        d = SharedDict(name, backend=srv.url)  # creator: removes the dict at close
        fresh = SharedDict(name, backend=srv.url)
        cached = SharedDict(name, backend=srv.url, reads="cached", staleness=staleness)
        writer = Child(workers.numbered_writer, srv.url, name)
        try:
            acked: list[int] = []

            def pump() -> None:
                writer.drain()
                acked[:] = [m[1] for m in writer.messages if m[0] == "ack"]

            wait_until(lambda: (pump(), len(acked) >= 30)[1], 30, "30 acknowledged writes")
            srv.kill()
            t_kill = time.monotonic()

            # The writer's write in flight (or the next one) fails with our error.  The acks
            # it reported before that failure are the writes the server acknowledged before
            # it died (an ack may reach us after the kill: the writer reports after the reply).
            def failed() -> bool:
                pump()
                return any(m[0] == "err" for m in writer.messages)

            wait_until(
                failed,
                10,
                lambda: (
                    "the writer reporting a failed write while the server "
                    f"is down (alive: {writer.proc.is_alive()}, last: {writer.messages[-3:]})"
                ),
            )
            first_err = next(i for i, m in enumerate(writer.messages) if m[0] == "err")
            before_kill = {m[1] for m in writer.messages[:first_err] if m[0] == "ack"}
            assert acked == list(range(len(acked))), "acks out of order"

            # While it is down every handle says so: no raw redis-py error, no hang.
            t0 = time.monotonic()
            kind, exc = outcome(lambda: fresh["k0"])
            assert kind == "raised" and isinstance(exc, BackendUnavailable), exc
            kind, exc = outcome(lambda: fresh.__setitem__("down", 1))
            assert kind == "raised" and isinstance(exc, BackendUnavailable), exc
            assert time.monotonic() - t0 < 5
            # The cached handle stops answering from its cache within its bound.
            wait_until(
                lambda: isinstance(outcome(lambda: cached["k0"])[1], BackendUnavailable),
                staleness + MARGIN,
                "a cached read raising BackendUnavailable",
            )
            assert time.monotonic() - t_kill < staleness + MARGIN + 1.0

            pump()
            assert set(acked) == before_kill, "a write was acknowledged while the server was dead"
            srv.restart()
            t_restart = time.monotonic()

            # From now on a read either fails (reconnecting) or shows every write
            # acknowledged before the kill -- never an older state.
            def check_read(handle: SharedDict) -> bool:
                kind, got = outcome(handle.copy)
                if kind == "raised":
                    assert isinstance(got, BackendUnavailable), repr(got)
                    return False
                missing = sorted(i for i in before_kill if got.get(f"k{i}") != i)
                assert not missing, f"acknowledged writes missing after restart: {missing[:10]}"
                return True

            wait_until(lambda: check_read(fresh), 5, "a fresh read after the restart")
            wait_until(lambda: check_read(cached), staleness + 5, "a cached read after the restart")

            # The writer gets going again.
            last = max(before_kill)
            wait_until(
                lambda: (pump(), len(acked) > last + 20)[1],
                20,
                "20 more acknowledged writes after the restart",
            )
            writer.conn.send("stop")
            done = writer.expect("done")
            writer.proc.join(15)
            assert writer.proc.exitcode == 0
            pump()

            errors = [m for m in writer.messages if m[0] == "err"]
            raw = [m for m in errors if m[3] != "BackendUnavailable"]
            assert not raw, f"the writer saw errors that are not BackendUnavailable: {raw[:3]}"
            # The first failure is the write in flight when the server died (or the one right
            # after it): the next number after the last acknowledged write.
            assert errors[0][1] == max(before_kill) + 1

            expected = {f"k{i}": i for i in range(done[1])}
            assert acked == list(range(done[1]))
            assert fresh.copy() == expected  # every acknowledged write, nothing else
            assert d.copy() == expected
            wait_until(
                lambda: cached.copy() == expected,
                staleness + MARGIN,
                "the cached handle converging on the latest state",
            )
            assert fresh.stats()["seq"] >= done[1]
            assert time.monotonic() - t_restart < 60
        finally:
            writer.end()
            cached.close()
            fresh.close()
            d.close()
        assert srv.execute("KEYS", "*") == []


# ---------------------------------------------------------------------------- 2. kill, no persistence


def test_kill_without_persistence_makes_every_handle_unlinked(name: str) -> None:
    """The server restarts empty: every existing handle -- fresh, cached, the lock, a
    waiter -- raises Unlinked, whose message says it may be data loss, and never serves
    the pre-kill values again; the name can be created anew."""
    staleness = 0.3
    with RedisServer.start(persistence=False) as srv:
        d = SharedDict(name, backend=srv.url)
        other = SharedDict(name, backend=srv.url)
        cached = SharedDict(name, backend=srv.url, reads="cached", staleness=staleness)
        try:
            d["a"] = 1
            wait_until(lambda: cached.get("a") == 1, staleness + MARGIN, "cached sees a=1")
            srv.kill()
            t_kill = time.monotonic()
            srv.restart()
            t_restart = time.monotonic()

            for op in (
                lambda: d["a"],
                lambda: other["a"],
                lambda: d.copy(),
                lambda: len(other),
                lambda: d.__setitem__("b", 2),
                lambda: other.update(c=3),
                lambda: d.lock.acquire(timeout=1),
                lambda: other.wait_for_change(1),
            ):
                with pytest.raises(Unlinked, match="without persistence"):
                    op()

            # The cached handle: values only from reads begun within its bound of the kill.
            served: list[tuple[float, Any]] = []

            def cached_gone() -> bool:
                start = time.monotonic()
                kind, got = outcome(lambda: cached["a"])
                if kind == "ok":
                    served.append((start - t_kill, got))
                    return False
                if isinstance(got, BackendUnavailable):
                    return False
                assert isinstance(got, Unlinked), repr(got)
                assert "without persistence" in str(got)
                return True

            wait_until(cached_gone, staleness + MARGIN, "the cached handle raising Unlinked")
            late = [s for s in served if s[0] > staleness + MARGIN]
            assert not late, f"cached reads served the lost state past the bound: {late[:3]}"
            # ... and from then on, always: a window of 2 x staleness.
            until = time.monotonic() + 2 * staleness
            while time.monotonic() < until:
                with pytest.raises(Unlinked):
                    cached["a"]
                with pytest.raises(Unlinked):
                    cached.copy()
            assert time.monotonic() - t_restart < 10

            # The name is free: a new dict of that name works; the old handles stay gone.
            again = SharedDict(name, backend=srv.url)
            again["new"] = 1
            assert again.copy() == {"new": 1}
            for handle in (d, other, cached):
                with pytest.raises(Unlinked):
                    handle["new"]
            again.close()
        finally:
            cached.close()
            other.close()
            d.close()
        assert srv.execute("KEYS", "*") == []


# ---------------------------------------------------------------------------- 3. CLIENT KILL


def _reads_until(handle: SharedDict, want: Any, seen: list[Any]) -> bool:
    """Whether ``handle["v"]`` is ``want`` now; every value read is kept in ``seen``."""
    seen.append(handle["v"])
    return bool(seen[-1] == want)


def test_client_kill_reads_reconnect_and_return_current_data(
    name: str, redis_url: str, redis_server: RedisServer
) -> None:
    """Every connection cut, three times over (the server stays up): fresh and cached
    reads keep working without an error and return the current data."""
    staleness = 0.3
    d = SharedDict(name, backend=redis_url)
    fresh = SharedDict(name, backend=redis_url)
    cached = SharedDict(name, backend=redis_url, reads="cached", staleness=staleness)
    try:
        d["v"] = 0
        wait_until(lambda: cached.get("v") == 0, staleness + MARGIN, "cached sees v=0")
        for round_ in range(1, 4):
            assert redis_server.client_kill() >= 3  # d, fresh, the listener (and others)
            # A handle opened now writes (a handle whose connection was cut may refuse
            # its first write: see test_first_write_after_an_idle_connection_cut_succeeds).
            w = SharedDict(name, backend=redis_url)
            w["v"] = round_
            w.close()
            assert fresh["v"] == round_  # reconnects, no error, current
            assert d.get("v") == round_
            seen: list[Any] = []
            wait_until(
                functools.partial(_reads_until, cached, round_, seen),
                staleness + MARGIN,
                f"the cached handle seeing v={round_}",
            )
            assert set(seen) <= {round_ - 1, round_}
            assert fresh.copy() == cached.copy() == {"v": round_}
    finally:
        cached.close()
        fresh.close()
        d.close()


def test_client_kill_under_blocked_waiters_they_reconnect_and_wake(
    name: str, redis_url: str, redis_server: RedisServer
) -> None:
    """A ``wait_for_change`` and a ``changes()`` iterator blocked in ``XREAD`` when their
    connection is cut: reading is safe to repeat, so they block again on a new
    connection, and a write made afterwards wakes both -- with the new value, never a
    stale one, and the iterator yields the change exactly once."""
    d = SharedDict(name, backend=redis_url)
    waiter = SharedDict(name, backend=redis_url)
    watcher = SharedDict(name, backend=redis_url)
    results: dict[str, Any] = {}
    try:
        d["v"] = 0
        assert waiter["v"] == 0 and watcher["v"] == 0
        feed = watcher.changes(timeout=20)

        def wait() -> None:
            results["wait"] = outcome(lambda: waiter.wait_for_change(timeout=20))

        def watch() -> None:
            results["changes"] = outcome(lambda: next(feed))

        threads = [threading.Thread(target=wait, name="wait"), threading.Thread(target=watch, name="watch")]
        for t in threads:
            t.start()
        wait_until(lambda: blocked_clients(redis_server, "xread") >= 2, 5, "both waiters blocked in XREAD")
        redis_server.client_kill()
        wait_until(
            lambda: blocked_clients(redis_server, "xread") >= 2,
            5,
            "both waiters blocked again on new connections",
        )
        assert all(t.is_alive() for t in threads), results
        d["v"] = 1  # (d's connection was cut too: the write reconnects first)
        for t in threads:
            t.join(5)
        assert not any(t.is_alive() for t in threads), "a waiter did not wake"
        assert results["wait"] == ("ok", True), results
        kind, change = results["changes"]
        assert kind == "ok" and (change.op, change.key, change.value) == ("set", "v", 1)
        assert waiter["v"] == 1 and watcher.copy() == {"v": 1}
        d["v"] = 2
        change = next(feed)
        assert (change.op, change.key, change.value) == ("set", "v", 2)
        assert waiter.wait_for_change(timeout=5) is True and waiter["v"] == 2
    finally:
        for t in threading.enumerate():
            if t.name in ("wait", "watch"):
                t.join(25)
        watcher.close()
        waiter.close()
        d.close()


@pytest.mark.parametrize("fault", ["client_kill", "restart"])
def test_first_write_after_an_idle_connection_cut_succeeds(name: str, fault: str) -> None:
    with RedisServer.start(persistence=True) as srv:
        d = SharedDict(name, backend=srv.url)
        try:
            d["a"] = 1
            if fault == "client_kill":
                assert srv.client_kill() >= 1
            else:
                srv.kill()
                srv.restart()
            d["b"] = 2  # the server is up and healthy: this must just work
            assert d.copy() == {"a": 1, "b": 2}
        finally:
            d.close()


# ---------------------------------------------------------------------------- 4. pause


def test_paused_server_cached_reads_stop_within_staleness(name: str) -> None:
    """SIGSTOP the server: a cached handle (staleness 0.3) serves its cache only for reads
    begun within the bound; later reads block until the server is resumed (what the code
    does: the read's SYNC has no timeout) or raise BackendUnavailable -- never a value
    nobody confirmed within the bound.  A fresh read blocks too.  After SIGCONT all of
    them answer with the current data and writes work."""
    staleness = 0.3
    with RedisServer.start() as srv:
        d = SharedDict(name, backend=srv.url)
        cached = SharedDict(name, backend=srv.url, reads="cached", staleness=staleness)
        fresh = SharedDict(name, backend=srv.url)
        log: list[tuple[float, float, str, Any]] = []
        stop = threading.Event()
        fresh_result: dict[str, Any] = {}
        try:
            d["v"] = 1
            wait_until(lambda: cached.get("v") == 1, staleness + MARGIN, "cached sees v=1")

            def reader() -> None:
                while not stop.is_set():
                    start = time.monotonic()
                    kind, got = outcome(lambda: cached["v"])
                    log.append((start, time.monotonic(), kind, got))
                    time.sleep(0.002)

            t = threading.Thread(target=reader, name="cached-reader")
            t.start()
            wait_until(lambda: len(log) > 10, 5, "the reader running")
            srv.pause()
            t_pause = time.monotonic()

            f = threading.Thread(
                target=lambda: fresh_result.update(r=outcome(lambda: fresh["v"]), at=time.monotonic()),
                name="fresh-reader",
            )
            f.start()

            # Wait until the cached reader is stuck (or failing): it must get there
            # within the bound.
            def stuck() -> bool:
                if not log:
                    return False
                last = log[-1]
                return last[2] == "raised" or time.monotonic() - last[1] > 0.2

            wait_until(stuck, staleness + MARGIN + 1.0, "cached reads stopping during the pause")
            # Stay paused for a while longer: reads must not come back on their own.
            hold_until = time.monotonic() + 2 * staleness
            while time.monotonic() < hold_until:
                time.sleep(0.01)
            assert f.is_alive() or isinstance(fresh_result["r"][1], BackendUnavailable)
            srv.resume()
            t_resume = time.monotonic()
            f.join(10)
            assert not f.is_alive(), "a fresh read still blocked after the resume"

            d["v"] = 2
            wait_until(
                lambda: log and log[-1][2] == "ok" and log[-1][3] == 2,
                staleness + MARGIN + 1,
                "the cached reader seeing the write made after the resume",
            )
            stop.set()
            t.join(10)

            during = [e for e in log if t_pause <= e[1] < t_resume]
            served_late = [e for e in during if e[2] == "ok" and e[0] > t_pause + staleness + 0.2]
            assert not served_late, (
                f"cached reads begun {served_late[0][0] - t_pause:.3f} s after the pause "
                "answered from the cache while the server was stopped"
            )
            errors = [e[3] for e in log if e[2] == "raised"]
            assert all(isinstance(e, BackendUnavailable) for e in errors), errors[:3]
            blocked = [e for e in log if e[0] < t_resume <= e[1]]
            assert blocked or errors, "no cached read was held back during the pause"
            # The fresh read blocked until the resume and then answered.
            kind, got = fresh_result["r"]
            if kind == "ok":
                assert fresh_result["at"] >= t_resume and got in (1, 2)
            else:
                assert isinstance(got, BackendUnavailable)
            assert fresh["v"] == 2 and cached.copy() == {"v": 2}
        finally:
            stop.set()
            srv.resume()
            for th in threading.enumerate():
                if th.name in ("cached-reader", "fresh-reader"):
                    th.join(10)
            fresh.close()
            cached.close()
            d.close()


def test_a_stalled_server_does_not_cost_the_leases_held_on_another(name: str) -> None:
    with RedisServer.start() as stalled, RedisServer.start() as healthy:
        a = SharedDict(name, backend=stalled.url, lease=1.0)
        b = SharedDict(name, backend=healthy.url, lease=1.0)
        rival = SharedDict(name, backend=healthy.url, lease=1.0)
        try:
            a.lock.acquire()
            b.lock.acquire()
            stalled.pause()
            # The holder of b is alive and its server healthy: nobody else may take b's
            # lock for as long as it is held (3 leases here).
            with pytest.raises(LockTimeout):
                rival.lock.acquire(timeout=3.0)
        finally:
            stalled.resume()
            for lock in (b.lock, a.lock):
                try:
                    if lock.held():
                        lock.release()
                except LeaseLost:
                    pass
            if rival.lock.held():
                rival.lock.release()
            rival.close()
            b.close()
            a.close()


# ---------------------------------------------------------------------------- 5. killed holder


@pytest.mark.parametrize("lease, bound", [(1.0, 2.0), (None, 4.0)], ids=["lease1", "default-lease"])
def test_killed_lock_holder_is_taken_over_within_its_lease(
    name: str, redis_url: str, redis_server: RedisServer, lease: Optional[float], bound: float
) -> None:
    """A child holding ``with d.lock:`` is SIGKILLed: another handle gets the lock within
    the lease (plus scheduling slack), and a write that was waiting for the lock lands."""
    kwargs: dict[str, Any] = {} if lease is None else {"lease": lease}
    d = SharedDict(name, backend=redis_url, **kwargs)
    taker = SharedDict(name, backend=redis_url, **kwargs)
    writer = SharedDict(name, backend=redis_url, **kwargs)
    holder = Child(workers.hold_lock, redis_url, name, lease)
    done: dict[str, Any] = {}
    try:
        d["x"] = 0
        _, pid = holder.expect("held")
        assert d.stats()["lock_pid"] == pid

        def blocked_write() -> None:
            done["r"] = outcome(lambda: writer.__setitem__("x", 1))
            done["at"] = time.monotonic()

        w = threading.Thread(target=blocked_write, name="blocked-write")
        w.start()
        # The write waits for the lock (it cannot land while the holder lives).
        wait_until(
            lambda: blocked_clients(redis_server, "xread") >= 1, 5, "the write waiting for the release"
        )
        assert "r" not in done and d["x"] == 0
        holder.proc.kill()
        t_kill = time.monotonic()
        holder.proc.join(10)
        assert taker.lock.acquire(timeout=bound + 2)
        took = time.monotonic() - t_kill
        try:
            assert took < bound, f"lock taken over {took:.2f} s after the holder died"
            taker["y"] = 1  # the new holder writes with its token
        finally:
            taker.lock.release()
        w.join(bound + 2)
        assert not w.is_alive()
        assert done["r"] == ("ok", None)
        assert done["at"] - t_kill < bound + 0.5
        assert d.copy() == {"x": 1, "y": 1}
        assert d.stats()["lock_holder"] is None
    finally:
        holder.end()
        for t in threading.enumerate():
            if t.name == "blocked-write":
                t.join(10)
        writer.close()
        taker.close()
        d.close()


# ---------------------------------------------------------------------------- 6. fencing


def test_holder_paused_past_its_lease_is_fenced(name: str, redis_url: str) -> None:
    """A child holding the lock (lease 0.5 s) is SIGSTOPped; another handle takes the lock
    and writes, and still holds it when the child is continued.  The child's write inside
    its ``with d.lock:`` is refused with LeaseLost, leaving the block reports LeaseLost
    too, the dict has only the new holder's write, and the new holder's lock is intact."""
    d = SharedDict(name, backend=redis_url, lease=0.5)
    child = Child(workers.fenced_holder, redis_url, name, 0.5)
    try:
        d["k"] = "initial"
        child.expect("held")
        os.kill(child.proc.pid, signal.SIGSTOP)
        t_stop = time.monotonic()
        assert d.lock.acquire(timeout=5)
        took = time.monotonic() - t_stop
        try:
            assert took < 0.5 + 1.0, f"took {took:.2f} s to get a stopped holder's lock"
            d["k"] = "parent"
            child.conn.send("go")
            os.kill(child.proc.pid, signal.SIGCONT)
            write = child.expect("write", 15)
            release = child.expect("release", 15)
            read = child.expect("read", 15)
            assert write[1:3] == ("ultradict_ng.errors", "LeaseLost"), write
            assert release[1:3] == ("ultradict_ng.errors", "LeaseLost"), release
            assert read == ("read", "parent")
            # Our lease survived the fenced holder's release attempt.
            d["k2"] = "still ours"
            assert d.stats()["lock_holder"] is not None
        finally:
            d.lock.release()  # no LeaseLost: we held it all along
        child.proc.join(10)
        assert child.proc.exitcode == 0
        assert d.copy() == {"k": "parent", "k2": "still ours"}
    finally:
        child.end()
        d.close()


# ---------------------------------------------------------------------------- 7. opening


def test_unreachable_server_at_open_raises_quickly_and_leaves_nothing(name: str) -> None:
    threads = set(threading.enumerate())  # (another test's thread may end meanwhile: only new ones count)
    url = f"redis://127.0.0.1:{free_port()}/0"
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable, match="cannot reach"):
        SharedDict(name, backend=url)
    with pytest.raises(BackendUnavailable):
        SharedDict(name, backend=url, reads="cached")
    with pytest.raises(BackendUnavailable):
        SharedDict.unlink_by_name(name, backend=url)
    assert time.monotonic() - t0 < 3
    assert set(threading.enumerate()) <= threads


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:notaport/0",
        "redis://127.0.0.1:99999/0",
        "redis://[::1",
        "http://127.0.0.1:6379/0",
        "127.0.0.1:6379",
    ],
)
def test_bad_url_is_a_value_error(name: str, url: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(ValueError):
        SharedDict(name, backend=url)
    assert time.monotonic() - t0 < 1


def _foreign(kind: str, key: str, srv: RedisServer) -> None:
    if kind == "string-meta":
        srv.execute("SET", key, "somebody else's value")
    elif kind == "meta-missing-fields":
        srv.execute("HSET", key, "epoch", "0123456789abcdef", "owner", "another program")
    else:
        srv.execute(
            "HSET",
            key,
            "version",
            99,
            "epoch",
            "0123456789abcdef",
            "codec",
            1,
            "recurse",
            0,
            "minlog",
            1024,
            "seq",
            0,
            "snap",
            0,
        )


@pytest.mark.parametrize(
    "kind, create",
    [
        pytest.param("string-meta", None),
        pytest.param("string-meta", False),
        pytest.param("meta-missing-fields", None),
        pytest.param("meta-missing-fields", False),
        pytest.param("other-version", None),
        pytest.param("other-version", False),
    ],
)
def test_foreign_data_under_the_dicts_name_is_a_clear_error(
    name: str, redis_url: str, redis_server: RedisServer, kind: str, create: Optional[bool]
) -> None:
    """``{ud:NAME}:meta`` holding something this protocol did not write: opening the dict
    (creating or attaching) raises one of our errors, naming the key, and leaves the
    foreign data alone."""
    key = "{ud:" + name + "}:meta"
    _foreign(kind, key, redis_server)
    try:
        with pytest.raises(SharedDictError) as info:
            SharedDict(name, backend=redis_url, create=create)
        assert name in str(info.value)
        assert redis_server.execute("EXISTS", key) == 1
    finally:
        redis_server.execute("DEL", key)


# ---------------------------------------------------------------------------- lost replies


@pytest.fixture
def proxied(name: str) -> Any:
    """A fresh server behind a proxy that can drop one reply: (server, proxy)."""
    from ultradict_ng._redis.layout import SCRIPTS
    from ultradict_ng._redis.link import _SHAS

    with RedisServer.start() as srv, workers.ReplyDropper(srv.port) as proxy:
        proxy.shas = _SHAS  # type: ignore[attr-defined]
        for body in SCRIPTS.values():  # so that the reply dropped is the script's, not NOSCRIPT
            srv.execute("SCRIPT", "LOAD", body)
        yield srv, proxy
        for key in srv.execute("KEYS", "*") or []:
            srv.execute("DEL", key)


def _drop(proxy: Any, script: str) -> None:
    proxy.drop_reply_of(proxy.shas[script].encode())


def test_lost_write_reply_raises_backend_unavailable_and_the_cache_resyncs(name: str, proxied: Any) -> None:
    srv, proxy = proxied
    d = SharedDict(name, backend=proxy.url)
    try:
        d["a"] = 1
        _drop(proxy, "write")
        with pytest.raises(BackendUnavailable, match="may or may not"):
            d["b"] = 2
        assert proxy.dropped.is_set()
        assert d.copy() == {"a": 1, "b": 2}  # it had landed: the next read shows it
    finally:
        d.close()


def test_lost_acquire_reply_is_repeated_as_the_same_holder(name: str, proxied: Any) -> None:
    srv, proxy = proxied
    d = SharedDict(name, backend=proxy.url, lease=1.0)
    try:
        _drop(proxy, "acquire")
        with d.lock:
            assert proxy.dropped.is_set()
            d["a"] = 1  # the token of the repeated acquire is the lock's
        assert d.stats()["fence"] == 1  # one token issued, not two
        assert srv.execute("EXISTS", "{ud:" + name + "}:lock") == 0
    finally:
        d.close()


def test_lost_release_reply_is_not_lease_lost(name: str, proxied: Any) -> None:
    srv, proxy = proxied
    d = SharedDict(name, backend=proxy.url, lease=1.0)
    try:
        d.lock.acquire()
        d["a"] = 1
        _drop(proxy, "release")
        d.lock.release()  # must not raise: the lease was never lost
    finally:
        assert proxy.dropped.is_set()
        assert srv.execute("EXISTS", "{ud:" + name + "}:lock") == 0
        d.close()


@pytest.mark.parametrize("create", [True, None])
def test_lost_create_reply_still_creates(name: str, proxied: Any, create: Optional[bool]) -> None:
    srv, proxy = proxied
    _drop(proxy, "create")
    d = SharedDict(name, backend=proxy.url, create=create)
    assert proxy.dropped.is_set()
    d["a"] = 1
    d.close()  # the creator's auto_unlink removes it
    assert srv.execute("KEYS", "*") == []


# ---------------------------------------------------------------------------- re-created dict


def test_cached_handle_never_mixes_a_recreated_dict_into_its_cache(name: str) -> None:
    """The old dict had 4 writes; while the cached handle's listener waits for entry 5, the
    dict is unlinked and re-created and the new one gets 5 writes.  The old handle may serve
    its old state (within its bound) or raise Unlinked -- never old keys mixed with new.
    (A server of its own: the only client blocked in XREAD is this handle's listener, and
    a long staleness keeps it blocked across the re-creation.)"""
    with RedisServer.start() as srv:
        old = SharedDict(name, backend=srv.url, auto_unlink=False)
        for i in range(3):
            old[f"old{i}"] = i
        cached = SharedDict(name, backend=srv.url, reads="cached", staleness=20.0)
        new: Optional[SharedDict] = None
        state = {"old0": 0, "old1": 1, "old2": 2, "old3": 3}
        try:
            # One entry delivered by the listener: from now on it vouches for the cache.
            wait_until(lambda: blocked_clients(srv, "xread") == 1, 5, "the listener blocked")
            old["old3"] = 3
            wait_until(lambda: cached.copy() == state, 5, "the listener delivering old3")
            wait_until(lambda: blocked_clients(srv, "xread") == 1, 5, "the listener blocked again")
            old.unlink()
            new = SharedDict(name, backend=srv.url)
            for i in range(5):
                new[f"new{i}"] = i
            seen: list[Any] = []
            until = time.monotonic() + 1.0
            while time.monotonic() < until:
                got = outcome(cached.copy)[1]
                seen.append(got)
                if isinstance(got, Unlinked):
                    break
                time.sleep(0.001)
            mixed = [s for s in seen if isinstance(s, dict) and any(k.startswith("new") for k in s)]
            assert not mixed, f"{len(mixed)} of {len(seen)} cached reads mixed two dicts, e.g. {mixed[0]}"
            assert all(isinstance(s, Unlinked) or s == state for s in seen)
        finally:
            cached.close()
            old.close()
            if new is not None:
                new.close()
