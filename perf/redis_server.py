"""A private, throw-away ``redis-server`` on a free loopback port.

Started only when the binary exists (the harness never installs anything),
without persistence (``--save '' --appendonly no``), bound to 127.0.0.1, in its
own session (a Ctrl-C in the terminal reaches the harness, which stops it) and
with a parent-death signal so that it also ends if the harness is killed.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional


def redis_binary() -> Optional[str]:
    return shutil.which("redis-server")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except Exception:
        pass


def _ping(port: int, timeout: float = 0.2) -> bool:
    """A raw RESP PING: no dependency on redis-py for the health check."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """``RedisServer.start()`` -> running server; ``stop()`` ends it (idempotent)."""

    def __init__(self, proc: subprocess.Popen, port: int, workdir: str, binary: str) -> None:
        self.proc, self.port, self.workdir, self.binary = proc, port, workdir, binary

    @classmethod
    def start(cls, binary: Optional[str] = None, wait: float = 10.0) -> RedisServer:
        binary = binary or redis_binary()
        if not binary:
            raise FileNotFoundError("redis-server not found on PATH")
        last_error = ""
        for _ in range(3):
            with socket.socket() as sock:  # a free port (taken meanwhile: the next attempt)
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            workdir = tempfile.mkdtemp(prefix="perf-redis-")
            logfile = os.path.join(workdir, "redis.log")
            argv = [binary, "--port", str(port), "--save", "", "--dir", workdir, "--logfile", logfile]
            argv += "--bind 127.0.0.1 --appendonly no --daemonize no --protected-mode yes".split()
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
            server = cls(proc, port, workdir, binary)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and proc.poll() is None:
                if _ping(port):
                    return server
                time.sleep(0.02)
            try:
                with open(logfile, errors="replace") as f:
                    last_error = f.read()[-500:]
            except OSError:
                last_error = f"exit status {proc.poll()}"
            server.stop()
        raise RuntimeError(f"redis-server did not answer PING: {last_error.strip()}")

    def version(self) -> str:
        try:
            out = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=5).stdout
            return next((tok[2:] for tok in out.split() if tok.startswith("v=")), out.strip())
        except Exception:
            return "?"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc.poll() is None
