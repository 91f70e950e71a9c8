"""Child-process workers, their test-side helpers, and a fault-injecting proxy for the
Redis fault and cluster tests (``test_redis_faults.py``, ``test_redis_cluster.py``).

Test side: ``wait_until`` (poll a condition up to a deadline, then fail), ``outcome``
(a call's value or exception), ``Child`` (a spawn child with a pipe).  The workers
run in ``spawn`` children (importable module, picklable arguments) and report to
the test through a ``multiprocessing`` pipe end: every message is a tuple
whose first item says what it is.  An exception is reported by its class name and
module, so the test can tell ``BackendUnavailable`` from a raw redis-py error.

``ReplyDropper`` is a TCP proxy on loopback between the engine and a real server that
forwards everything, except that it can be told to swallow the reply of the next
command carrying a given byte string (a script's sha): the server runs the command,
the client never hears back -- the "reply lost" fault that ``CLIENT KILL`` cannot aim.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any, Callable, Optional

#: Every worker gives up after this long, so a lost test never leaves a child running.
WORKER_DEADLINE = 60.0


def _spawn() -> Any:
    import multiprocessing

    return multiprocessing.get_context("spawn")


# ---------------------------------------------------------------------------- test side


def wait_until(pred: Callable[[], Any], timeout: float, what: Any, step: float = 0.005) -> Any:
    """Poll ``pred`` until it returns something truthy; fail after ``timeout`` seconds
    saying ``what`` (a string, or a callable giving one at that moment)."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() >= deadline:
            _fail(f"not within {timeout} s: {what() if callable(what) else what}")
        time.sleep(step)


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", value)`` or ``("raised", exception)``."""
    try:
        return "ok", fn()
    except Exception as exc:
        return "raised", exc


class Child:
    """A spawn child running a worker of ``redis_workers`` with one end of a pipe."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        self.conn, child_end = _spawn().Pipe()
        self.proc = _spawn().Process(target=target, args=(*args, child_end), daemon=True)
        self.proc.start()
        child_end.close()
        self.messages: list[tuple[Any, ...]] = []

    def expect(self, kind: str, timeout: float = 30.0) -> tuple[Any, ...]:
        """The next message of ``kind`` (earlier ones are kept in ``messages``)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.conn.poll(left):
                _fail(
                    f"child {self.proc.pid} sent no {kind!r} within {timeout} s "
                    f"(exit code {self.proc.exitcode}; got {self.messages[-5:]})"
                )
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                _fail(
                    f"child {self.proc.pid} exited (code {self.proc.exitcode}) before "
                    f"sending {kind!r}; got {self.messages[-5:]}"
                )
            self.messages.append(msg)
            if msg[0] == kind:
                return msg

    def drain(self) -> None:
        while True:
            try:
                if not self.conn.poll():
                    return
                self.messages.append(self.conn.recv())
            except (EOFError, OSError):  # the child exited
                return

    def end(self) -> None:
        """SIGCONT (in case it is stopped), SIGKILL, reap."""
        if self.proc.is_alive():
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.proc.kill()
        self.proc.join(10)
        self.conn.close()


def _fail(message: str) -> None:
    import pytest

    pytest.fail(message)


# ---------------------------------------------------------------------------- workers


def _err(exc: BaseException) -> tuple[str, str, str]:
    return (type(exc).__module__, type(exc).__name__, str(exc))


def numbered_writer(backend: str, name: str, conn: Any) -> None:
    """Write ``k<i> = i`` for i = 0, 1, ... and report each acknowledged write.

    Messages: ``("ack", i)`` after ``d[k<i>] = i`` returned; ``("err", i, module, class,
    text)`` when it raised (then the same ``i`` is tried again after a short pause);
    ``("done", next_i)`` once the test sent anything (stop).  Connection failures
    while opening are retried too.
    """
    from ultradict_ng import SharedDict

    deadline = time.monotonic() + WORKER_DEADLINE
    d = SharedDict(name, backend=backend, create=False)
    i = 0
    try:
        while time.monotonic() < deadline and not conn.poll():
            try:
                d[f"k{i}"] = i
            except Exception as exc:  # BackendUnavailable, or whatever else: the test judges
                conn.send(("err", i) + _err(exc))
                time.sleep(0.02)
                continue
            conn.send(("ack", i))
            i += 1
        conn.send(("done", i))
    finally:
        try:
            d.close()
        except Exception:
            pass


def hold_lock(backend: str, name: str, lease: Optional[float], conn: Any) -> None:
    """Take ``with d.lock:``, report ``("held", pid)``, then wait to be killed."""
    import os

    from ultradict_ng import SharedDict

    kwargs = {} if lease is None else {"lease": lease}
    d = SharedDict(name, backend=backend, create=False, **kwargs)
    with d.lock:
        conn.send(("held", os.getpid()))
        conn.poll(WORKER_DEADLINE)  # the test SIGKILLs us long before this


def fenced_holder(backend: str, name: str, lease: float, conn: Any) -> None:
    """Take the lock, report ``("held",)``, wait for ``"go"``, then write inside the lock.

    Reports ``("write", "ok")`` or ``("write", module, class, text)`` for the write inside
    ``with d.lock:``, then ``("release", "ok")`` or ``("release", module, class, text)``
    for leaving the block, then ``("read", value_of_k)`` as this handle sees it afterwards.
    """
    from ultradict_ng import SharedDict

    d = SharedDict(name, backend=backend, create=False, lease=lease)
    try:
        with d.lock:
            conn.send(("held",))
            if not conn.poll(WORKER_DEADLINE):
                return
            conn.recv()  # "go"
            try:
                d["k"] = "child"
                d["child_only"] = True
            except Exception as exc:
                conn.send(("write",) + _err(exc))
            else:
                conn.send(("write", "ok"))
    except Exception as exc:
        conn.send(("release",) + _err(exc))
    else:
        conn.send(("release", "ok"))
    try:
        conn.send(("read", d.get("k")))
    except Exception as exc:
        conn.send(("read",) + _err(exc))
    d.close()


def locked_increments(backend: str, name: str, times: int, conn: Any) -> None:
    """Report ``("ready", pid)``, wait for ``"go"``, then ``with d.lock: d["n"] += 1``
    ``times`` times and record ``seen-by-<pid>``; reports ``("done", pid)`` or ``("err", ...)``."""
    import os

    from ultradict_ng import SharedDict

    try:
        d = SharedDict(name, backend=backend, create=False)
        conn.send(("ready", os.getpid()))
        conn.poll(WORKER_DEADLINE)
        conn.recv()  # "go": start together
        for _ in range(times):
            with d.lock:
                d["n"] += 1
        d[f"seen-by-{os.getpid()}"] = d["n"]
        d.close()
    except Exception as exc:
        conn.send(("err",) + _err(exc))
        return
    conn.send(("done", os.getpid()))


def set_and_report(backend: str, name: str, key: str, value: Any, conn: Any) -> None:
    """Attach, set one key, report ``("set", key)``."""
    from ultradict_ng import SharedDict

    d = SharedDict(name, backend=backend, create=False)
    d[key] = value
    conn.send(("set", key))
    d.close()


# ---------------------------------------------------------------------------- the proxy


class ReplyDropper:
    """A loopback TCP proxy to ``127.0.0.1:port`` that can lose one reply on purpose.

    ``drop_reply_of(marker)``: the next client->server chunk that contains ``marker`` is
    forwarded; then the proxy waits for the server's first reply bytes (the command ran)
    and closes that client's connection without passing them on.  ``dropped`` is set when
    it happened.  Threads are daemons and ``close()`` ends them (use ``with``).
    """

    def __init__(self, port: int) -> None:
        self.target = port
        self._listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listen.bind(("127.0.0.1", 0))
        self._listen.listen(64)
        self.port = self._listen.getsockname()[1]
        self._marker: Optional[bytes] = None
        self._guard = threading.Lock()
        self.dropped = threading.Event()
        self._socks: list[socket.socket] = []
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def drop_reply_of(self, marker: bytes) -> None:
        with self._guard:
            self._marker = marker
            self.dropped.clear()

    def _spawn(self, target: Any, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True, name="reply-dropper")
        self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listen.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._guard:
                self._socks += [client, server]
            pair = {"drop": False}
            self._spawn(self._upstream, client, server, pair)
            self._spawn(self._downstream, server, client, pair)

    def _upstream(self, client: socket.socket, server: socket.socket, pair: dict) -> None:
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                with self._guard:
                    if self._marker is not None and self._marker in data:
                        self._marker = None
                        pair["drop"] = True
                server.sendall(data)
        except OSError:
            pass
        self._shut(client, server)

    def _downstream(self, server: socket.socket, client: socket.socket, pair: dict) -> None:
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    break
                if pair["drop"]:
                    self.dropped.set()
                    break  # the command ran on the server; its reply is lost
                client.sendall(data)
        except OSError:
            pass
        self._shut(client, server)

    @staticmethod
    def _shut(*socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True
        try:
            self._listen.shutdown(socket.SHUT_RDWR)  # wakes accept()
        except OSError:
            pass
        try:
            self._listen.close()
        except OSError:
            pass
        with self._guard:
            socks, self._socks = self._socks, []
        self._shut(*socks)
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> ReplyDropper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
