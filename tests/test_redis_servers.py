"""The harness that runs real redis-server processes for the Redis backend's tests.

Each test drives real servers (skipped locally, failed in CI, without a redis-server)
and checks what the harness promises: nothing left behind, data kept or lost across a
kill as configured, stalls, cut connections, a working 3-master cluster.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from . import redis_servers
from .redis_servers import HOST, RedisCluster, RedisServer, key_slot, require_redis

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def redis_py() -> Any:
    """redis-py, after require_redis() (skip locally / fail in CI without a server)."""
    require_redis()
    import redis

    return redis


def no_retry_client(redis: Any, url: str, **kwargs: Any) -> Any:
    """A client that reports every connection fault (redis-py 6+ retries 3 times by default)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **kwargs)


def gone(pid: int, timeout: float = 5.0) -> bool:
    """True once ``pid`` no longer runs (absent, or a zombie someone else must reap)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def accepts(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=0.5).close()
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------- require_redis


def test_require_redis_skips_loudly_without_a_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty dir: no redis-server on PATH
    monkeypatch.delenv("CI", raising=False)
    assert redis_servers.redis_binary() is None
    with pytest.raises(pytest.skip.Exception) as info:
        require_redis()
    assert "apt-get install redis-server" in str(info.value)
    assert "REDIS TESTS NOT RUN" in str(info.value)


def test_require_redis_fails_in_ci_without_a_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as info:
        require_redis()
    assert "apt-get install redis-server" in str(info.value)


def test_require_redis_returns_the_binary(redis_py: Any) -> None:
    binary = require_redis()
    assert os.path.basename(binary) == "redis-server" and os.access(binary, os.X_OK)


# ---------------------------------------------------------------------------- one server


def test_start_stop_leaves_no_process_and_no_workdir(redis_py: Any) -> None:
    srv = RedisServer.start()
    pid, workdir, port = srv.pid, srv.workdir, srv.port
    assert pid is not None and srv.running
    assert os.path.isdir(workdir) and os.path.dirname(srv.logfile) == workdir
    assert srv.url == f"redis://127.0.0.1:{port}/0"
    client = redis_py.Redis.from_url(srv.url)
    assert client.ping() is True
    assert srv.info("server")["process_id"] == str(pid)
    assert srv.execute("CONFIG", "GET", "bind") == [b"bind", b"127.0.0.1"]
    assert srv.execute("CONFIG", "GET", "appendonly") == [b"appendonly", b"no"]
    client.close()
    srv.stop()
    assert not srv.running and gone(pid, 0)
    assert not os.path.exists(workdir)
    assert not accepts(port)
    assert srv not in redis_servers._LIVE
    srv.stop()  # idempotent


def test_context_manager_stops(redis_py: Any) -> None:
    with RedisServer.start() as srv:
        pid, workdir = srv.pid, srv.workdir
        assert srv.execute("PING") == "PONG"
    assert pid is not None and gone(pid, 0) and not os.path.exists(workdir)


def test_persistence_keeps_acknowledged_writes_across_kill(redis_py: Any) -> None:
    with RedisServer.start(persistence=True) as srv:
        assert srv.execute("CONFIG", "GET", "appendfsync") == [b"appendfsync", b"always"]
        client = no_retry_client(redis_py, srv.url)
        client.set("k", "v")
        client.hset("h", mapping={"a": "1", "b": "2"})
        old_pid, port = srv.pid, srv.port
        srv.kill()
        assert old_pid is not None and gone(old_pid, 0)
        assert os.path.isdir(srv.workdir)  # kill keeps the data
        srv.restart()
        assert srv.port == port and srv.pid != old_pid
        assert client.get("k") == b"v"  # the pool reconnects: same url
        assert client.hgetall("h") == {b"a": b"1", b"b": b"2"}
        # stop(keep_workdir=True) then restart: a clean shutdown keeps it too.
        client.set("k2", "v2")
        srv.stop(keep_workdir=True)
        srv.restart()
        assert client.get("k2") == b"v2"
        client.close()


def test_without_persistence_a_kill_loses_everything(redis_py: Any) -> None:
    with RedisServer.start() as srv:
        client = no_retry_client(redis_py, srv.url)
        client.set("k", "v")
        srv.kill()
        srv.restart()
        assert client.get("k") is None and client.dbsize() == 0
        client.close()


def test_a_server_started_by_a_thread_outlives_the_thread(redis_py: Any) -> None:
    # The parent-death signal fires when the forking thread ends: a naive harness would
    # lose a server started with asyncio.to_thread() or from a pool worker.
    started: list[RedisServer] = []
    thread = threading.Thread(target=lambda: started.append(RedisServer.start()))
    thread.start()
    thread.join()
    with started[0] as srv:
        time.sleep(0.2)
        assert srv.running and srv.execute("PING") == "PONG"
        srv.kill()
        restarter = threading.Thread(target=srv.restart)
        restarter.start()
        restarter.join()
        time.sleep(0.2)
        assert srv.running and srv.execute("PING") == "PONG"


def test_restart_needs_the_workdir(redis_py: Any) -> None:
    srv = RedisServer.start()
    with pytest.raises(RuntimeError, match="still running"):
        srv.restart()
    srv.stop()
    with pytest.raises(RuntimeError, match="removed"):
        srv.restart()
    assert not srv.running


def test_start_on_a_taken_port_fails_with_the_log(redis_py: Any) -> None:
    with RedisServer.start() as first:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="in use"):
            RedisServer.start(port=first.port)
        assert time.monotonic() - t0 < 5
        assert first.execute("PING") == "PONG"  # the wrong server was never mistaken for ours


def test_pause_stalls_and_resume_answers(redis_py: Any) -> None:
    with RedisServer.start() as srv:
        client = no_retry_client(redis_py, srv.url, socket_timeout=0.3)
        client.set("k", "v")
        srv.pause()
        t0 = time.monotonic()
        with pytest.raises(redis_py.exceptions.TimeoutError):
            client.get("k")
        assert 0.25 < time.monotonic() - t0 < 5
        srv.resume()
        assert client.get("k") == b"v"  # the timed-out connection was dropped: a new one
        client.close()


def test_stop_ends_a_paused_server(redis_py: Any) -> None:
    srv = RedisServer.start()
    pid = srv.pid
    srv.pause()
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 2  # SIGCONT after SIGTERM: no 5 s wait for SIGKILL
    assert pid is not None and gone(pid, 0) and not os.path.exists(srv.workdir)


def test_client_kill_cuts_every_connection(redis_py: Any) -> None:
    with RedisServer.start() as srv:
        held = no_retry_client(redis_py, srv.url, single_connection_client=True)
        pooled = no_retry_client(redis_py, srv.url)
        default = redis_py.Redis.from_url(srv.url)
        for client in (held, pooled, default):
            assert client.ping()
        pooled_id = pooled.client_id()
        blocked: dict[str, Any] = {}

        def block() -> None:
            reader = no_retry_client(redis_py, srv.url)
            try:
                blocked["reply"] = reader.xread({"s": "0-0"}, block=0)
            except redis_py.exceptions.ConnectionError as e:
                blocked["error"] = e
            reader.close()

        thread = threading.Thread(target=block)
        thread.start()
        deadline = time.monotonic() + 5
        while srv.info("clients")["blocked_clients"] != "1":
            assert time.monotonic() < deadline
            time.sleep(0.01)

        assert srv.client_kill() == 4  # held, pooled, default, the blocked reader
        thread.join(5)
        assert not thread.is_alive() and "error" in blocked
        # A connection the client holds sees the cut...
        with pytest.raises(redis_py.exceptions.ConnectionError):
            held.ping()
        # ...a pooled one does not: the pool finds the socket readable (EOF) when it hands
        # the connection out and reconnects first -- even with retries disabled.
        assert pooled.ping() and pooled.client_id() != pooled_id
        assert default.ping()
        for client in (held, pooled, default):
            client.close()


def test_client_kill_by_name(redis_py: Any) -> None:
    with RedisServer.start() as srv:
        victim = no_retry_client(redis_py, srv.url, single_connection_client=True, client_name="victim")
        bystander = no_retry_client(redis_py, srv.url, single_connection_client=True)
        victim.ping()
        bystander.ping()
        assert srv.client_kill(name="victim") == 1
        with pytest.raises(redis_py.exceptions.ConnectionError):
            victim.ping()
        assert bystander.ping()
        assert srv.client_kill(name="nobody") == 0
        victim.close()
        bystander.close()


def test_flushall_and_info(redis_py: Any) -> None:
    with RedisServer.start() as srv:
        srv.execute("SET", "a", "1")
        assert srv.info("keyspace")["db0"].startswith("keys=1,")
        srv.flushall()
        assert srv.execute("DBSIZE") == 0
        with pytest.raises(redis_servers.RedisReplyError, match="unknown command"):
            srv.execute("NOSUCHCOMMAND")


def _child(body: str) -> subprocess.Popen[str]:
    """A Python process that starts a server, runs ``body`` (which prints the server's
    pid and work dir) and ends -- the way a test session ends."""
    script = (
        f"import os, signal, sys; sys.path.insert(0, {TESTS!r})\n"
        "from redis_servers import RedisServer\n"
        "srv = RedisServer.start()\n"
        "def report(): print(srv.pid, srv.workdir, flush=True)\n" + body
    )
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


def _reported(child: subprocess.Popen[str]) -> list[str]:
    assert child.stdout is not None
    line = child.stdout.readline().split()
    child.stdout.read()
    child.stdout.close()
    return line


def test_servers_die_with_their_process(redis_py: Any) -> None:
    # A clean exit without stop(), even after kill + restart: the atexit hook ends the
    # server and removes its dir.
    child = _child("srv.kill(); srv.restart(); report()\n")
    pid, workdir = _reported(child)
    assert child.wait(10) == 0
    assert gone(int(pid)) and not os.path.exists(workdir)
    # SIGKILLed: no atexit; the parent-death signal ends the server...
    child = _child("report(); os.kill(os.getpid(), signal.SIGKILL)\n")
    pid, workdir = _reported(child)
    assert child.wait(10) == -9
    assert gone(int(pid)) and os.path.isdir(workdir)
    # ...and the next session's first start() sweeps the orphaned dir.
    child = _child("srv.stop()\n")
    _reported(child)
    assert child.wait(10) == 0
    assert not os.path.exists(workdir)


# ---------------------------------------------------------------------------- cluster


@pytest.mark.parametrize(
    "key",
    [
        "foo",
        "",
        "{user1000}.following",
        "{user1000}.followers",
        "foo{}{bar}",
        "foo{{bar}}zap",
        "foo{bar}{zap}",
        "{}",
        "a{",
        "}{a}",
        "\u00e9t\u00e9",
        b"\xff\x00{\x01}",
    ],
)
def test_key_slot_matches_redis_py(redis_py: Any, key: Any) -> None:
    from redis.crc import key_slot as redis_py_key_slot

    data = key.encode() if isinstance(key, str) else key
    assert key_slot(key) == redis_py_key_slot(data)


def test_cluster_spreads_keys_over_three_masters(redis_py: Any) -> None:
    from redis.cluster import ClusterNode
    from redis.cluster import RedisCluster as ClusterClient

    t0 = time.monotonic()
    cluster = RedisCluster.start()
    started = time.monotonic() - t0
    pids = [node.pid for node in cluster.nodes]
    workdirs = [node.workdir for node in cluster.nodes]
    try:
        assert len(cluster.nodes) == 3 and started < 10
        assert cluster.startup_nodes == [(HOST, node.port) for node in cluster.nodes]
        assert cluster.url == cluster.nodes[0].url
        client = ClusterClient(
            startup_nodes=[
                ClusterNode(h, p)  # type: ignore[no-untyped-call]
                for h, p in cluster.startup_nodes
            ]
        )
        keys = [f"key{i}" for i in range(30)]
        for key in keys:
            client.set(key, key.upper())
        assert [client.get(key) for key in keys] == [key.upper().encode() for key in keys]
        owners = set()
        for key in keys:
            node = cluster.node_for_key(key)
            owners.add(node.port)
            assert node.execute("CLUSTER", "KEYSLOT", key) == key_slot(key)
            assert node.execute("EXISTS", key) == 1  # really stored on the node we name
        assert owners == {node.port for node in cluster.nodes}
        sizes = [node.execute("DBSIZE") for node in cluster.nodes]
        assert sum(n for n in sizes if isinstance(n, int)) == len(keys)
        # Keys sharing a {tag} share a slot, hence a node -- and multi-key commands work.
        tagged = [f"{{user42}}.{field}" for field in ("a", "b", "c")]
        assert len({key_slot(k) for k in tagged}) == 1
        assert len({cluster.node_index(k) for k in tagged}) == 1
        assert cluster.nodes[0].execute("CLUSTER", "KEYSLOT", tagged[0]) == key_slot(tagged[0])
        client.mset({k: "x" for k in tagged})
        mget = client.execute_command("MGET", *tagged)  # type: ignore[no-untyped-call]
        assert mget == [b"x"] * 3
        client.close()
    finally:
        cluster.stop()
    assert all(pid is not None and gone(pid, 0) for pid in pids)
    assert not any(os.path.exists(d) for d in workdirs)
    cluster.stop()  # idempotent


def test_cluster_kill_node_and_restart(redis_py: Any) -> None:
    with RedisCluster.start() as cluster:
        key = next(f"k{i}" for i in range(100) if cluster.node_index(f"k{i}") == 1)
        other = next(f"k{i}" for i in range(100) if cluster.node_index(f"k{i}") == 0)
        cluster.nodes[1].execute("SET", key, "1")
        cluster.nodes[0].execute("SET", other, "kept")
        cluster.kill_node(1)
        assert not cluster.nodes[1].running
        with pytest.raises(ConnectionRefusedError):
            cluster.nodes[1].execute("PING")
        t0 = time.monotonic()
        cluster.restart_node(1)  # nodes.conf kept: it rejoins with its id and slots
        assert time.monotonic() - t0 < 10
        assert cluster.nodes[1].execute("GET", key) is None  # no persistence
        assert cluster.nodes[0].execute("GET", other) == b"kept"
