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

__all__ = ["RedisServer", "redis_binary"]


def redis_binary() -> Optional[str]:
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
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
        self.proc = proc
        self.port = port
        self.workdir = workdir
        self.binary = binary

    @classmethod
    def start(cls, binary: Optional[str] = None, wait: float = 10.0) -> RedisServer:
        binary = binary or redis_binary()
        if not binary:
            raise FileNotFoundError("redis-server not found on PATH")
        last_error = ""
        for _ in range(3):  # the free port can be taken between probe and bind
            port = _free_port()
            workdir = tempfile.mkdtemp(prefix="perf-redis-")
            logfile = os.path.join(workdir, "redis.log")
            argv: list[str] = [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                workdir,
                "--logfile",
                logfile,
                "--protected-mode",
                "yes",
            ]
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
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
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
            for tok in out.split():
                if tok.startswith("v="):
                    return tok[2:]
            return out.strip()
        except Exception:
            return "?"

    def stop(self) -> None:
        proc = self.proc
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def running(self) -> bool:
        return self.proc.poll() is None
