"""The Redis backend on a real 3-master Redis Cluster (``tests/redis_servers.RedisCluster``).

One cluster per module (AOF with appendfsync always, so a killed node comes back with
its data; ``cluster-require-full-coverage no``, so the other masters keep serving
while one is down -- a test that needs the default flips it and flips it back).
Every test leaves no key behind on any node.

Tests marked ``xfail(strict=True, reason="bug: ...")`` show a bug of the backend.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests import redis_workers as workers
from tests.conftest import SERVICE_PIDS, unique_name
from tests.redis_servers import RedisCluster, RedisServer, key_slot, require_redis
from tests.redis_workers import Child, outcome, wait_until
from ultradict_ng import SharedDict
from ultradict_ng.errors import BackendUnavailable

MARGIN = 0.5


def _pids(cluster: RedisCluster) -> list[int]:
    return [node.pid for node in cluster.nodes if node.pid is not None]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    require_redis()
    started = RedisCluster.start(persistence=True, extra=["--cluster-require-full-coverage", "no"])
    SERVICE_PIDS.update(_pids(started))
    try:
        yield started
    finally:
        SERVICE_PIDS.difference_update(_pids(started))
        started.stop()


def restart_node(cluster: RedisCluster, i: int) -> None:
    """``restart_node`` that keeps the new server process out of the leftover check."""
    old = cluster.nodes[i].pid
    try:
        cluster.restart_node(i)
    finally:
        SERVICE_PIDS.discard(old)  # type: ignore[arg-type]
        SERVICE_PIDS.update(_pids(cluster))


def _keys(cluster: RedisCluster) -> list[tuple[int, bytes]]:
    out = []
    for i, node in enumerate(cluster.nodes):
        if node.running:
            out += [(i, k) for k in node.execute("KEYS", "*") or []]
    return out


@pytest.fixture
def cl(cluster: RedisCluster) -> Iterator[RedisCluster]:
    """The module's cluster, all nodes up; the test fails if it leaves keys behind."""
    for i, node in enumerate(cluster.nodes):
        if not node.running:
            restart_node(cluster, i)
    before = set(_keys(cluster))
    yield cluster
    import gc

    gc.collect()
    left = [k for k in _keys(cluster) if k not in before]
    for i, key in left:
        cluster.nodes[i].execute("DEL", key)
    assert not left, f"test left keys on the cluster: {left}"


def name_on(cluster: RedisCluster, node: int) -> str:
    """A unique dict name whose keys live on master ``node``."""
    while True:
        name = unique_name()
        if cluster.node_index("{ud:" + name + "}:meta") == node:
            return name


def tag(name: str) -> str:
    return "{ud:" + name + "}"


# ---------------------------------------------------------------------------- 8. working


def test_dict_on_the_cluster_by_url_and_by_client(cl: RedisCluster) -> None:
    """The engine detects the cluster from a URL of any node, and takes a ready
    ``RedisCluster`` client too; every key of the dict is in one hash slot, on the node
    that owns it, and nowhere else."""
    from redis.cluster import ClusterNode
    from redis.cluster import RedisCluster as Client

    name = name_on(cl, 2)
    # The URL of node 0: not the node that holds the dict.
    d = SharedDict(name, backend=cl.nodes[0].url)
    client = Client(startup_nodes=[ClusterNode(h, p) for h, p in cl.startup_nodes])
    try:
        assert d._store.link.cluster
        d["a"] = 1
        with d.lock:
            d["b"] = [1, 2]
        by_client = SharedDict(name, backend=client)
        assert by_client._store.link.cluster
        assert by_client.copy() == {"a": 1, "b": [1, 2]}
        by_client["c"] = 3
        assert d["c"] == 3

        slot = key_slot(tag(name))
        owner = cl.nodes[2]
        held = sorted(k.decode() for k in owner.execute("KEYS", tag(name) + "*") or [])
        assert held == sorted(tag(name) + s for s in (":lockev", ":log", ":meta", ":snap"))
        for key in held:
            assert owner.execute("CLUSTER", "KEYSLOT", key) == slot
            assert key_slot(key) == slot
        for other in (cl.nodes[0], cl.nodes[1]):
            assert other.execute("KEYS", tag(name) + "*") == []
        # A handle opened with a client travels (pickled) by the client's URL.
        again = pickle.loads(pickle.dumps(by_client))
        assert again.copy() == {"a": 1, "b": [1, 2], "c": 3}
        assert again._store.link.cluster
        again.close()
        by_client.close()
    finally:
        d.close()
        client.close()


def test_dicts_spread_over_the_masters(cl: RedisCluster) -> None:
    names = [name_on(cl, i) for i in range(3)]
    handles = [SharedDict(n, backend=cl.url) for n in names]
    try:
        for i, h in enumerate(handles):
            h["node"] = i
        for i, n in enumerate(names):
            for j, node in enumerate(cl.nodes):
                held = node.execute("KEYS", tag(n) + "*")  # (KEYS looks at this node only)
                assert bool(held) == (i == j), (n, j, held)
        assert [h["node"] for h in handles] == [0, 1, 2]
        # Names spread by themselves: 60 random names land on every master.
        owners = {cl.node_index(tag(unique_name()) + ":meta") for _ in range(60)}
        assert owners == {0, 1, 2}
    finally:
        for h in handles:
            h.close()


def test_two_processes_share_a_dict_on_the_cluster(cl: RedisCluster) -> None:
    """Two spawned processes and this one increment under the lock: the count is exact;
    fresh and cached handles see it, and a waiter wakes on another process's write."""
    name = name_on(cl, 1)
    times = 40
    d = SharedDict(name, backend=cl.url)
    cached = SharedDict(name, backend=cl.url, reads="cached", staleness=0.3)
    children = [Child(workers.locked_increments, cl.url, name, times) for _ in range(2)]
    try:
        d["n"] = 0
        pids = [c.expect("ready")[1] for c in children]
        for c in children:
            c.conn.send("go")
        for _ in range(times):
            with d.lock:
                d["n"] += 1
        for c in children:
            c.expect("done")
            c.proc.join(15)
            assert c.proc.exitcode == 0
        assert d["n"] == 3 * times
        assert all(0 < d[f"seen-by-{pid}"] <= 3 * times for pid in pids)
        wait_until(lambda: cached.get("n") == 3 * times, 0.3 + MARGIN, "the cached handle's count")

        # wait_for_change wakes on another process's write.
        woke: dict[str, Any] = {}
        waiter = threading.Thread(
            target=lambda: woke.update(r=outcome(lambda: d.wait_for_change(timeout=20)), at=time.monotonic()),
            name="waiter",
        )
        waiter.start()
        wait_until(
            lambda: any(
                b"cmd=xread" in line and b"flags=b" in line
                for line in (cl.nodes[1].execute("CLIENT", "LIST") or b"").splitlines()
            ),
            5,
            "the waiter blocked on node 1",
        )
        setter = Child(workers.set_and_report, cl.url, name, "from-child", 7)
        children.append(setter)
        setter.expect("set")
        t_set = time.monotonic()
        waiter.join(5)
        assert woke["r"] == ("ok", True)
        assert woke["at"] - t_set < 1.0
        assert d["from-child"] == 7
        wait_until(lambda: cached.get("from-child") == 7, 0.3 + MARGIN, "cached sees the child's write")
    finally:
        for c in children:
            c.end()
        cached.close()
        d.close()


# ---------------------------------------------------------------------------- 9. a node dies


def test_killed_node_fails_its_dicts_only_and_they_come_back(cl: RedisCluster) -> None:
    """The master holding a dict's slot is SIGKILLed: every operation on that dict raises
    BackendUnavailable within a bound (no raw redis-py error, no hang), dicts on the other
    masters keep working, and after the node restarts (AOF) the dict is back with its data."""
    victim = name_on(cl, 0)
    survivor = name_on(cl, 1)
    d = SharedDict(victim, backend=cl.url, lease=1.0)
    cached = SharedDict(victim, backend=cl.url, reads="cached", staleness=0.3)
    other = SharedDict(survivor, backend=cl.url, lease=1.0)
    try:
        d["a"] = 1
        other["a"] = 1
        wait_until(lambda: cached.get("a") == 1, 0.3 + MARGIN, "cached sees a=1")
        cl.kill_node(0)
        t_kill = time.monotonic()
        ops = {
            "read": lambda: d["a"],
            "copy": d.copy,
            "write": lambda: d.__setitem__("b", 2),
            "update": lambda: d.update(c=3),
            "lock": lambda: d.lock.acquire(timeout=2),
            "wait": lambda: d.wait_for_change(timeout=2),
            "stats": d.stats,
        }
        for what, op in ops.items():
            t0 = time.monotonic()
            kind, got = outcome(op)
            assert kind == "raised" and isinstance(got, BackendUnavailable), (what, got)
            assert time.monotonic() - t0 < 3.0, what
        wait_until(
            lambda: isinstance(outcome(lambda: cached["a"])[1], BackendUnavailable),
            0.3 + MARGIN,
            "the cached handle raising BackendUnavailable",
        )
        assert time.monotonic() - t_kill < 10

        # The other masters serve on, also past the node timeout (2 s) when the rest of
        # the cluster has marked the dead node failed.
        deadline = time.monotonic() + 2.5
        n = 0
        while True:
            n += 1
            other["n"] = n
            with other.lock:
                other["n"] += 1
            assert other["n"] == n + 1
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)

        restart_node(cl, 0)
        # Back, with every acknowledged write (AOF); the handles reconnect.
        wait_until(lambda: outcome(lambda: d["a"]) == ("ok", 1), 5, "the dict back after the restart")
        d["b"] = 2
        assert d.copy() == {"a": 1, "b": 2}
        wait_until(
            lambda: outcome(cached.copy) == ("ok", {"a": 1, "b": 2}),
            0.3 + 5,
            "the cached handle back after the restart",
        )
        with d.lock:
            d["c"] = 3
        assert other["a"] == 1
    finally:
        other.close()
        cached.close()
        d.close()


def test_cluster_down_is_backend_unavailable(cl: RedisCluster) -> None:
    """With ``cluster-require-full-coverage yes`` one dead master takes the whole cluster
    down: operations on dicts of the live masters -- blocked waiters included -- raise
    BackendUnavailable, not redis-py's ClusterDownError, and work again after the restart."""
    name = name_on(cl, 1)
    d = SharedDict(name, backend=cl.url)
    results: dict[str, Any] = {}
    threads = [
        threading.Thread(
            target=lambda: results.update(wait=outcome(lambda: d.wait_for_change(20))), name="down-wait"
        ),
        threading.Thread(
            target=lambda: results.update(changes=outcome(lambda: list(d.changes(20)))), name="down-changes"
        ),
    ]
    for node in cl.nodes:
        node.execute("CONFIG", "SET", "cluster-require-full-coverage", "yes")
    try:
        d["a"] = 1
        for t in threads:
            t.start()
        wait_until(
            lambda: (
                sum(
                    b"cmd=xread" in line and b"flags=b" in line
                    for line in (cl.nodes[1].execute("CLIENT", "LIST") or b"").splitlines()
                )
                >= 2
            ),
            5,
            "both waiters blocked",
        )
        cl.kill_node(0)
        cl.wait_down(15)
        for t in threads:
            t.join(10)
        for key in ("wait", "changes"):
            kind, got = results[key]
            assert kind == "raised" and isinstance(got, BackendUnavailable), (key, got)
        for op in (lambda: d["a"], lambda: d.__setitem__("b", 2)):
            kind, got = outcome(op)
            assert kind == "raised" and isinstance(got, BackendUnavailable), got
    finally:
        if not cl.nodes[0].running:
            restart_node(cl, 0)
        for node in cl.nodes:
            node.execute("CONFIG", "SET", "cluster-require-full-coverage", "no")
        for t in threads:
            t.join(10)
        d.close()


def _migrate_slot(cl: RedisCluster, slot: int, src: int, dst: int) -> None:
    """Move ``slot`` with its keys from master ``src`` to master ``dst`` (what
    ``redis-cli --cluster reshard`` does), and tell every master."""
    source, target = cl.nodes[src], cl.nodes[dst]
    src_id = source.execute("CLUSTER", "MYID")
    dst_id = target.execute("CLUSTER", "MYID")
    assert isinstance(src_id, bytes) and isinstance(dst_id, bytes)
    target.execute("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    source.execute("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    while True:
        keys = source.execute("CLUSTER", "GETKEYSINSLOT", slot, 100)
        assert isinstance(keys, list)
        if not keys:
            break
        source.execute("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)  # type: ignore[arg-type]
    for node in (target, source, *[n for n in cl.nodes if n not in (source, target)]):
        node.execute("CLUSTER", "SETSLOT", slot, "NODE", dst_id)


def test_a_moved_slot_is_followed(cl: RedisCluster) -> None:
    """A resharding moves the dict's slot to another master: the handles follow the
    ``MOVED`` redirection (refresh the slot map, send again) and keep working."""
    name = name_on(cl, 0)
    slot = key_slot(tag(name))
    d = SharedDict(name, backend=cl.url)
    cached = SharedDict(name, backend=cl.url, reads="cached", staleness=0.3)
    moved = False
    try:
        d["a"] = 1
        wait_until(lambda: cached.get("a") == 1, 0.3 + MARGIN, "cached sees a=1")
        _migrate_slot(cl, slot, 0, 1)
        moved = True
        assert cl.nodes[1].execute("EXISTS", tag(name) + ":meta") == 1
        assert d["a"] == 1
        d["b"] = 2
        with d.lock:
            d["c"] = 3
        assert d.copy() == {"a": 1, "b": 2, "c": 3}
        wait_until(
            lambda: outcome(cached.copy) == ("ok", {"a": 1, "b": 2, "c": 3}),
            0.3 + 2,
            "the cached handle following the slot",
        )
    finally:
        if moved:
            _migrate_slot(cl, slot, 1, 0)
            cl.wait_ok(15)
        cached.close()
        d.close()


def test_unlink_by_name_removes_everything_on_the_cluster(cl: RedisCluster) -> None:
    from redis.cluster import ClusterNode
    from redis.cluster import RedisCluster as Client

    for node in range(3):
        name = name_on(cl, node)
        d = SharedDict(name, backend=cl.url, auto_unlink=False)
        d["a"] = 1
        with d.lock:  # a release leaves the lockev stream
            d["b"] = 2
        d.close()
        owner = cl.nodes[node]
        assert len(owner.execute("KEYS", tag(name) + "*") or []) == 4
        if node == 2:
            client = Client(startup_nodes=[ClusterNode(h, p) for h, p in cl.startup_nodes])
            try:
                assert SharedDict.unlink_by_name(name, backend=client) == 4
            finally:
                client.close()
        else:
            # Through a node that does not hold the dict.
            assert SharedDict.unlink_by_name(name, backend=cl.nodes[(node + 1) % 3].url) == 4
        for n in cl.nodes:
            assert n.execute("KEYS", tag(name) + "*") == []
        assert SharedDict.unlink_by_name(name, backend=cl.url) == 0


_ = RedisServer  # (the type of cl.nodes[i])
