"""Real, throw-away ``redis-server`` processes for the test suite, and the faults to inject.

``RedisServer.start()`` runs one server, ``RedisCluster.start()`` three cluster masters
that share the 16384 slots.  Both talk to the servers through a tiny raw-RESP client of
their own, so the harness needs no redis-py (the tests of the Redis backend bring that).

Lifetime rules -- nothing is left behind:

* every server runs in its own session (``start_new_session=True``), so a Ctrl-C in the
  terminal reaches pytest only and pytest decides when the servers end;
* every server gets ``PR_SET_PDEATHSIG = SIGKILL`` (Linux), so it dies with the test
  process even when that is SIGKILLed.  The kernel sends it when the *thread* that
  forked the server ends, so servers are forked by the main thread or, when started
  from another thread (``asyncio.to_thread(RedisServer.start)``), by a daemon thread
  that lives as long as the process.  SIGKILL, not SIGTERM, because a server paused
  with SIGSTOP (``pause()``) would not act on a SIGTERM until continued;
* ``stop()`` ends the process by its pid (only processes started here) and removes its
  work dir; an ``atexit`` hook stops whatever a test forgot;
* work dirs are named ``ultradict-redis-<pid of pytest>-*``: dirs of a pytest that was
  itself SIGKILLed (no atexit ran) are removed by the next run's first ``start()``.

Faults: ``kill()`` (SIGKILL, keeps port and data for ``restart()``), ``pause()`` /
``resume()`` (SIGSTOP / SIGCONT: the server stalls, connections stay open),
``client_kill()`` (cuts the clients' connections, the server stays up),
``RedisCluster.kill_node()``.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Optional, Union

import pytest

__all__ = [
    "HOST",
    "RedisCluster",
    "RedisReplyError",
    "RedisServer",
    "Reply",
    "key_slot",
    "redis_binary",
    "require_redis",
]

#: Every server binds loopback only (and keeps protected mode on).
HOST = "127.0.0.1"
#: Number of hash slots of a Redis Cluster.
SLOTS = 16384
_DIR_PREFIX = "ultradict-redis-"
_INSTALL_HINT = "apt-get install redis-server"

#: A RESP2 reply as the raw client returns it (errors are raised, not returned).
Reply = Union[None, int, str, bytes, list["Reply"]]


class RedisReplyError(Exception):
    """The server answered a command with an error (``-ERR ...``); the message is the text."""


# ---------------------------------------------------------------------------- binary


def redis_binary() -> Optional[str]:
    """The ``redis-server`` on PATH, or None."""
    return shutil.which("redis-server")


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_redis(*, client: bool = True) -> str:
    """The path of ``redis-server``; skips the calling test when it is missing -- or fails it in CI.

    Locally a missing server is a skip, with a reason that says how to fix it.  With
    ``CI=true`` it is a failure: a CI image that lost its redis-server must not turn every
    Redis test into a green skip.  ``client=True`` (the default) also requires redis-py,
    which every test that talks to the servers through the real client needs.
    """
    binary = redis_binary()
    problems = []
    if binary is None:
        problems.append(f"no redis-server on PATH (fix: {_INSTALL_HINT})")
    if client:
        try:
            import redis  # noqa: F401
        except ImportError:
            problems.append("redis-py is not installed (fix: pip install redis)")
    if problems:
        reason = "REDIS TESTS NOT RUN: " + "; ".join(problems)
        if _ci():
            pytest.fail(reason + " -- CI=true, so this is a failure, not a skip", pytrace=False)
        pytest.skip(reason)
    assert binary is not None
    return binary


# ---------------------------------------------------------------------------- raw RESP


def _encode(args: Sequence[Union[str, bytes, int]]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class _Conn:
    """One blocking RESP2 connection: enough for health checks and fault injection."""

    def __init__(self, port: int, timeout: float) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self._rfile = self.sock.makefile("rb")

    def call(self, *args: Union[str, bytes, int]) -> Reply:
        self.sock.sendall(_encode(args))
        return self._read()

    def _read(self) -> Reply:
        line = self._rfile.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("redis-server closed the connection")
        kind, body = line[:1], line[1:-2]
        if kind == b"+":
            return body.decode()
        if kind == b"-":
            raise RedisReplyError(body.decode(errors="replace"))
        if kind == b":":
            return int(body)
        if kind == b"$":
            size = int(body)
            if size < 0:
                return None
            data = self._rfile.read(size + 2)
            if len(data) != size + 2:
                raise ConnectionError("redis-server closed the connection")
            return data[:-2]
        if kind == b"*":
            count = int(body)
            return None if count < 0 else [self._read() for _ in range(count)]
        raise ConnectionError(f"unexpected RESP reply {line[:40]!r}")

    def close(self) -> None:
        self._rfile.close()
        self.sock.close()

    def __enter__(self) -> _Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parse_info(text: Reply) -> dict[str, str]:
    """``INFO`` / ``CLUSTER INFO`` text -> {field: value} (section headers dropped)."""
    if not isinstance(text, bytes):
        raise RedisReplyError(f"INFO answered {text!r}")
    fields = {}
    for line in text.decode(errors="replace").splitlines():
        if line and not line.startswith("#") and ":" in line:
            key, value = line.split(":", 1)
            fields[key] = value
    return fields


# ---------------------------------------------------------------------------- processes

#: Servers whose process may run or whose work dir exists: what the atexit hook ends.
_LIVE: set[RedisServer] = set()
_LIVE_LOCK = threading.Lock()
_swept = False


def _load_prctl() -> Optional[ctypes._NamedFuncPointer]:
    """libc's prctl, looked up in the parent: the child between fork and exec only calls it."""
    if not sys.platform.startswith("linux"):
        return None  # no parent-death signal there: the atexit hook is the only net
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in the child
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    # The parent may have died between fork and prctl: then no signal will ever come.
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def _spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=functools.partial(_die_with_parent, os.getpid()),
    )


class _Spawner:
    """Forks servers for threads other than the main one.

    PR_SET_PDEATHSIG fires when the forking *thread* ends: a server forked by a
    short-lived thread (a thread pool's worker, ``asyncio.to_thread``) would be killed
    as soon as that thread exits.  This daemon thread never ends before the process.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[list[str], Future[subprocess.Popen[bytes]]]] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="redis-servers-spawner", daemon=True).start()

    def _run(self) -> None:
        while True:
            argv, future = self._jobs.get()
            try:
                future.set_result(_spawn(argv))
            except BaseException as e:  # handed to the waiting thread, which raises it
                future.set_exception(e)

    def spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        future: Future[subprocess.Popen[bytes]] = Future()
        self._jobs.put((argv, future))
        return future.result()


_spawner: Optional[_Spawner] = None


def _start_process(argv: list[str]) -> subprocess.Popen[bytes]:
    """Fork a server from a thread that lives as long as the process (see _Spawner)."""
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return _spawn(argv)
    with _LIVE_LOCK:
        if _spawner is None:
            _spawner = _Spawner()
    return _spawner.spawn(argv)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free right now.  All are bound at once, so none repeats;
    another program may still take one before redis binds it -- start() retries then."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((HOST, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale_workdirs() -> None:
    """Remove work dirs of test runs that died without their atexit hook (SIGKILLed pytest).

    Only dirs with our prefix, owned by this user, whose creating process is gone: a
    second test session running at the same time keeps its own.  Their servers are gone
    too -- they died with that process (PDEATHSIG).
    """
    global _swept
    if _swept:
        return
    _swept = True
    tmp = tempfile.gettempdir()
    pattern = re.compile(re.escape(_DIR_PREFIX) + r"(\d+)-")
    try:
        entries = os.listdir(tmp)
    except OSError:
        return
    for entry in entries:
        match = pattern.match(entry)
        if not match or int(match.group(1)) == os.getpid() or _pid_alive(int(match.group(1))):
            continue
        path = os.path.join(tmp, entry)
        try:
            if os.stat(path).st_uid == os.getuid():
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


class RedisServer:
    """One ``redis-server`` on a free loopback port, in its own work dir.

    ``start()`` returns once the server answers and has loaded its data; ``stop()`` ends
    it and removes the work dir (idempotent).  ``kill()`` / ``restart()`` keep the port and
    the work dir, so a server started with ``persistence=True`` comes back with every
    write it acknowledged before the kill.  Usable as a context manager (stops on exit).
    """

    def __init__(
        self, argv: list[str], port: int, workdir: str, binary: str, bus_port: Optional[int] = None
    ) -> None:
        self._argv = argv
        self.port = port
        #: Cluster bus port (``--cluster-port``) of a cluster node, else None.
        self.bus_port = bus_port
        self.workdir = workdir
        self.binary = binary
        self.logfile = os.path.join(workdir, "redis.log")
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.paused = False

    # -- starting ----------------------------------------------------------------

    @classmethod
    def start(
        cls,
        *,
        persistence: bool = False,
        port: Optional[int] = None,
        extra: Sequence[str] = (),
        binary: Optional[str] = None,
        wait: float = 10.0,
    ) -> RedisServer:
        """A running server.

        ``persistence=False``: ``--save '' --appendonly no``, a kill loses everything.
        ``persistence=True``: ``--appendonly yes --appendfsync always --save ''``: every
        write is in the AOF (fsynced) before its reply is sent, so every acknowledged
        write survives ``kill()``.  (``everysec`` would not do: when an fsync is slow,
        Redis postpones the AOF write by up to 2 s while it keeps replying.)
        ``port=None`` picks a free port (a given port that is in use is retried for
        about 1 s); ``extra`` is appended to the command line, so its flags win
        (``["--maxmemory", "1mb"]``).
        """
        return cls._start(
            persistence=persistence, port=port, extra=extra, binary=binary, wait=wait, cluster=False
        )

    @classmethod
    def _start(
        cls,
        *,
        persistence: bool,
        port: Optional[int],
        extra: Sequence[str],
        binary: Optional[str],
        wait: float,
        cluster: bool,
    ) -> RedisServer:
        binary = binary or redis_binary()
        if not binary:
            raise FileNotFoundError(f"redis-server not found on PATH (fix: {_INSTALL_HINT})")
        _sweep_stale_workdirs()
        last_error = ""
        for _ in range(5):  # a probed port can be taken before redis binds it: new ports
            ports = _free_ports(2 if cluster else 1)
            if port is not None:
                ports[0] = port
            workdir = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-")
            argv = [
                binary,
                "--port",
                str(ports[0]),
                "--bind",
                HOST,
                "--protected-mode",
                "yes",
                "--daemonize",
                "no",
                "--dir",
                workdir,
                "--logfile",
                os.path.join(workdir, "redis.log"),
                "--save",
                "",
            ]
            if persistence:
                argv += ["--appendonly", "yes", "--appendfsync", "always"]
            else:
                argv += ["--appendonly", "no"]
            if cluster:
                argv += [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    str(ports[1]),
                    "--cluster-announce-ip",
                    HOST,
                ]
            argv += list(extra)
            server = cls(argv, ports[0], workdir, binary, ports[1] if cluster else None)
            with _LIVE_LOCK:
                _LIVE.add(server)
            try:
                if server._launch(wait):
                    return server
            except BaseException:
                server.stop()
                raise
            last_error = server.log_tail()
            server.stop()
            if port is not None and "already in use" not in last_error:
                break
            if port is not None:
                time.sleep(0.2)  # a fixed port: wait for its holder to let go
        raise RuntimeError(f"redis-server did not start: {last_error}")

    def _launch(self, wait: float) -> bool:
        """Spawn the process and wait until it serves; False if it exited (port taken...)."""
        self.proc = _start_process(self._argv)
        self.paused = False
        deadline = time.monotonic() + wait
        delay = 0.005
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if self._ready():
                return True
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        self._end(signal.SIGKILL)
        raise RuntimeError(
            f"redis-server on port {self.port} did not get ready in {wait} s: {self.log_tail()}"
        )

    def _ready(self) -> bool:
        """Serving, data loaded, and it is *our* process on the port.

        The pid check matters: if our server died on a port another test's server
        grabbed, a bare PING would be answered by the wrong server.
        """
        assert self.proc is not None
        try:
            with _Conn(self.port, 0.5) as conn:
                info = _parse_info(conn.call("INFO", "server", "persistence"))
        except (OSError, RedisReplyError):
            return False
        return info.get("process_id") == str(self.proc.pid) and info.get("loading") == "0"

    def restart(self, wait: float = 10.0) -> RedisServer:
        """Start again on the same port with the same work dir (and AOF) after kill()/stop().

        Redis binds with SO_REUSEADDR, so the old connections in TIME_WAIT do not block
        the port; this retries only while some other process holds it.
        """
        if self.running:
            raise RuntimeError(f"redis-server on port {self.port} is still running")
        if not os.path.isdir(self.workdir):
            raise RuntimeError(
                f"work dir {self.workdir} was removed (stop() without keep_workdir=True): nothing to restart"
            )
        with _LIVE_LOCK:
            _LIVE.add(self)
        deadline = time.monotonic() + wait
        while True:
            if self._launch(max(deadline - time.monotonic(), 1.0)):
                return self
            self._reap()
            if time.monotonic() >= deadline:
                raise RuntimeError(f"redis-server did not restart on port {self.port}: {self.log_tail()}")
            time.sleep(0.1)

    # -- ending ------------------------------------------------------------------

    def stop(self, *, keep_workdir: bool = False) -> None:
        """SIGTERM (SIGKILL after 5 s), then remove the work dir.  Idempotent.

        ``keep_workdir=True`` keeps data and log for a ``restart()`` in this process;
        the atexit hook still removes the dir at the end of the session.
        """
        self._end(signal.SIGTERM)
        if not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def kill(self) -> None:
        """SIGKILL: the crash fault.  Port and work dir are kept for ``restart()``."""
        self._end(signal.SIGKILL)

    def _end(self, sig: signal.Signals) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            self._reap()
            return
        proc.send_signal(sig)
        if self.paused:
            proc.send_signal(signal.SIGCONT)  # a stopped process acts on SIGTERM only now
            self.paused = False
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.poll()
        self.paused = False

    # -- stalls and cut connections ---------------------------------------------

    def pause(self) -> None:
        """SIGSTOP: the server stalls -- connections stay open, nothing is answered."""
        if not self.running:
            raise RuntimeError(f"redis-server on port {self.port} is not running")
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT: the stalled server answers again (queued commands run now)."""
        if self.proc is not None and self.paused:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def client_kill(self, *, name: Optional[str] = None, types: Iterable[str] = ("normal", "pubsub")) -> int:
        """Cut client connections, the server stays up; returns how many were cut.

        ``name=None``: every client of the given types (``CLIENT KILL TYPE t SKIPME yes``:
        normal clients, blocked ones included, and subscribers) except the connection
        issuing the kill.  ``name="x"``: only the clients that ran ``CLIENT SETNAME x``.
        The server closes the sockets before it answers.
        """
        with _Conn(self.port, 5.0) as conn:
            if name is None:
                killed = 0
                for kind in types:
                    count = conn.call("CLIENT", "KILL", "TYPE", kind, "SKIPME", "yes")
                    killed += count if isinstance(count, int) else 0
                return killed
            me = conn.call("CLIENT", "ID")
            listing = conn.call("CLIENT", "LIST")
            assert isinstance(listing, bytes)
            ids = []
            for line in listing.decode(errors="replace").splitlines():
                fields = dict(f.split("=", 1) for f in line.split(" ") if "=" in f)
                if fields.get("name") == name and fields.get("id") != str(me):
                    ids.append(fields["id"])
            killed = 0
            for client_id in ids:
                try:
                    count = conn.call("CLIENT", "KILL", "ID", client_id)
                except RedisReplyError:  # it disconnected by itself meanwhile
                    continue
                killed += count if isinstance(count, int) else 0
            return killed

    # -- plain commands ----------------------------------------------------------

    def execute(self, *args: Union[str, bytes, int], timeout: float = 5.0) -> Reply:
        """Run one command on a fresh raw connection (no redis-py involved)."""
        with _Conn(self.port, timeout) as conn:
            return conn.call(*args)

    def flushall(self) -> None:
        self.execute("FLUSHALL", "SYNC")

    def info(self, *sections: str) -> dict[str, str]:
        """``INFO [section ...]`` as a dict of fields."""
        return _parse_info(self.execute("INFO", *sections))

    def log_tail(self, chars: int = 800) -> str:
        """The end of the server's log: what to put in a failure message."""
        try:
            with open(self.logfile, errors="replace") as f:
                return f.read()[-chars:].strip()
        except OSError:
            status = None if self.proc is None else self.proc.poll()
            return f"(no log; exit status {status})"

    # -- state -------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> Optional[int]:
        """The pid of the current process (None before the first start)."""
        return None if self.proc is None else self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"<RedisServer {HOST}:{self.port} pid={self.pid} {state}>"


@atexit.register
def _stop_all() -> None:
    """The safety net: stop every server a test forgot, and remove the work dirs."""
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        try:
            server.stop()
        except Exception:  # pragma: no cover - best effort at exit
            pass


# ---------------------------------------------------------------------------- cluster


def _crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), the hash of Redis Cluster key slots."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key: Union[str, bytes]) -> int:
    """The cluster slot of ``key``: only the part inside the first non-empty ``{...}``
    counts, so ``{user1}.a`` and ``{user1}.b`` share a slot (and a node)."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start != -1:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return _crc16(data) % SLOTS


def _slot_ranges(n: int) -> list[tuple[int, int]]:
    """The even split redis-cli --cluster create makes: 0-5460, 5461-10922, 10923-16383."""
    step = SLOTS / n
    return [(round(i * step), round((i + 1) * step) - 1) for i in range(n)]


class RedisCluster:
    """``n`` cluster masters (no replicas) on loopback that share all 16384 slots.

    Built by hand, not by ``redis-cli --cluster create``: every node gets a distinct
    config epoch and its slot range, every pair MEETs, then ``start()`` waits until each
    node reports ``cluster_state:ok`` and the same slot map.  Redis keeps a fresh master
    in state ``fail`` for 2 s after start (``CLUSTER_WRITABLE_DELAY``): that, not the
    joining, is most of the ~2 s ``start()`` takes.  Node ``i`` owns ``ranges[i]``.
    """

    def __init__(self, nodes: list[RedisServer]) -> None:
        self.nodes = nodes
        self.ranges = _slot_ranges(len(nodes))

    @classmethod
    def start(
        cls,
        n: int = 3,
        *,
        persistence: bool = False,
        node_timeout_ms: int = 2000,
        extra: Sequence[str] = (),
        wait: float = 30.0,
    ) -> RedisCluster:
        """A cluster in state ok.  A node killed for longer than ``node_timeout_ms`` is
        marked failed and, with no replicas, the whole cluster then refuses commands
        (``CLUSTERDOWN``) until it is back."""
        nodes: list[RedisServer] = []
        try:
            for _ in range(n):
                nodes.append(
                    RedisServer._start(
                        persistence=persistence,
                        port=None,
                        binary=None,
                        wait=10.0,
                        cluster=True,
                        extra=["--cluster-node-timeout", str(node_timeout_ms), *extra],
                    )
                )
            cluster = cls(nodes)
            for epoch, (node, (low, high)) in enumerate(zip(nodes, cluster.ranges), 1):
                node.execute("CLUSTER", "SET-CONFIG-EPOCH", epoch)
                node.execute("CLUSTER", "ADDSLOTSRANGE", low, high)
            for i, node in enumerate(nodes):
                for other in nodes[i + 1 :]:
                    assert other.bus_port is not None
                    node.execute("CLUSTER", "MEET", HOST, other.port, other.bus_port)
            cluster.wait_ok(wait)
            return cluster
        except BaseException:
            for node in nodes:
                node.stop()
            raise

    def _expected_map(self) -> set[tuple[int, int, int]]:
        return {(low, high, node.port) for node, (low, high) in zip(self.nodes, self.ranges)}

    def _node_ok(self, node: RedisServer) -> bool:
        try:
            info = _parse_info(node.execute("CLUSTER", "INFO", timeout=1.0))
            slots = node.execute("CLUSTER", "SLOTS", timeout=1.0)
        except (OSError, RedisReplyError):
            return False
        if (
            info.get("cluster_state") != "ok"
            or info.get("cluster_slots_ok") != str(SLOTS)
            or info.get("cluster_known_nodes") != str(len(self.nodes))
        ):
            return False
        seen = set()
        for entry in slots if isinstance(slots, list) else []:
            assert isinstance(entry, list)
            low, high, master = entry[0], entry[1], entry[2]
            assert isinstance(low, int) and isinstance(high, int) and isinstance(master, list)
            port = master[1]
            assert isinstance(port, int)
            seen.add((low, high, port))
        return seen == self._expected_map()

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every node says ``cluster_state:ok``, knows all nodes, and agrees on the
        slot map (then redis-py, which reads CLUSTER SLOTS from any node, sees it too)."""
        deadline = time.monotonic() + timeout
        while not all(self._node_ok(node) for node in self.nodes):
            if time.monotonic() >= deadline:
                states = {node.port: self._state(node) for node in self.nodes}
                raise RuntimeError(f"cluster not ok after {timeout} s: {states}")
            time.sleep(0.05)

    def wait_down(self, timeout: float = 30.0) -> None:
        """Until every running node says ``cluster_state:fail`` (after a ``kill_node``:
        node timeout, then the remaining majority agrees the node failed)."""
        deadline = time.monotonic() + timeout
        while not all(self._state(node) == "fail" for node in self.nodes if node.running):
            if time.monotonic() >= deadline:
                raise RuntimeError(f"cluster still up after {timeout} s")
            time.sleep(0.05)

    @staticmethod
    def _state(node: RedisServer) -> str:
        try:
            return _parse_info(node.execute("CLUSTER", "INFO", timeout=1.0)).get("cluster_state", "?")
        except (OSError, RedisReplyError) as e:
            return f"unreachable ({e})"

    def node_index(self, key: Union[str, bytes]) -> int:
        """Index in ``nodes`` of the node that owns ``key``'s slot (the map start() made)."""
        slot = key_slot(key)
        for i, (low, high) in enumerate(self.ranges):
            if low <= slot <= high:
                return i
        raise AssertionError(f"slot {slot} is in no range")  # pragma: no cover

    def node_for_key(self, key: Union[str, bytes]) -> RedisServer:
        return self.nodes[self.node_index(key)]

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i``; its work dir (nodes.conf, data) stays for ``restart_node``."""
        self.nodes[i].kill()

    def restart_node(self, i: int, wait: float = 30.0) -> None:
        """Restart node ``i`` on its ports with its nodes.conf and wait for state ok.

        About 2 s, whether or not the others had marked it failed: a restarted master
        keeps itself in state fail for 2 s (``CLUSTER_WRITABLE_DELAY``).
        """
        self.nodes[i].restart()
        self.wait_ok(wait)

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(HOST, node.port) for node in self.nodes]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def stop(self) -> None:
        """Stop every node and remove the work dirs (idempotent)."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisCluster:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<RedisCluster {[node.port for node in self.nodes]}>"
