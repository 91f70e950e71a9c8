"""Workload 12 (``redis``): the code that runs in the spawned child processes.

Every child is started by :mod:`perf.redis_backend` with
:func:`child_main` and a *role*; it talks to the harness through one pipe
(``("ready", info)``, then one or more ``("result", payload)``; or
``("unavailable", why)`` / ``("error", short, traceback)``) and, for the
roles that must start together, waits on a shared ``multiprocessing.Event``.

Roles:

* ``rw``: one contender's hot-key reads and rotating-key writes, measured on
  command (``("measure", {...})``) until ``("exit",)``.  A fresh process per
  contender and round: pottery monkeypatches ``json.dumps`` for the whole
  process on import, and a cached-mode handle runs a listener thread; neither
  reaches another contender.
* ``locker``: ``n`` times ``with lock: m[k] += 1`` after the start event;
  reports its own clock around the loop.
* ``holder``: attaches, takes ``d.lock``, says so, then sleeps until the harness
  SIGKILLs it.
* ``waiter``: attaches, then on ``("go",)`` enters ``with d.lock:`` and reports
  when it got in.
* ``writer`` / ``poller``: the staleness measurement; the writer writes
  ``d["t"] = i`` with pauses and records when each write returned, the poller
  reads ``d["t"]`` in a loop and records when each value first showed.

Every clock is :func:`time.monotonic` (``CLOCK_MONOTONIC``: one clock for every
process of the machine).  Every child ignores SIGINT (the harness ends it by
its pid) and turns SIGTERM into ``SystemExit`` so that its handles close.
"""

from __future__ import annotations

import os
import random
import signal
import time
import traceback
from itertools import cycle, islice, repeat
from typing import Any, Callable, Optional

from .util import no_gc

clock = time.monotonic
pc = time.perf_counter

#: Keys of the write loop (rotating; the same count for every contender).
WRITE_KEYS = 1024
HOT = "hot"
COUNTER = "c"
STAMP = "t"


class Unavailable(Exception):
    """The contender cannot be imported here."""


def _on_term(signum: int, frame: Any) -> None:
    raise SystemExit(143)


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "?"


def child_main(role: str, params: dict[str, Any], conn: Any, start: Any) -> None:
    """Entry point of every child of workload 12."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_term)
    try:
        ROLES[role](params, conn, start)
    except Unavailable as exc:
        try:
            conn.send(("unavailable", str(exc)))
        except Exception:
            pass
    except BaseException as exc:
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=12)))
        except Exception:
            pass
        if not isinstance(exc, Exception):
            raise
    finally:
        try:
            conn.close()
        except Exception:
            pass


# -- opening a contender -----------------------------------------------------------------------


def _redis_client(params: dict[str, Any]) -> Any:
    try:
        import redis
    except ImportError as exc:
        raise Unavailable(f"redis-py is not installed ({exc})") from None
    return redis.Redis(host="127.0.0.1", port=params["port"])


def _shared_dict(params: dict[str, Any], **kw: Any) -> Any:
    from ultradict_ng import SharedDict

    return SharedDict(name=params["name"], backend=params["url"], **kw)


def _pottery() -> Any:
    try:
        import pottery
    except ImportError as exc:
        raise Unavailable(f"pottery is not installed ({exc}; pip install pottery)") from None
    return pottery


def _redis_dict() -> Any:
    try:
        import redis_dict
    except ImportError as exc:
        raise Unavailable(f"redis-dict is not installed ({exc}; pip install redis-dict)") from None
    return redis_dict


class Ops:
    """One contender in a ``rw`` child: its loops, a check of what it reads, and its closing."""

    def __init__(self) -> None:
        self.loops: dict[str, Callable[[int], float]] = {}
        self.check_read: Callable[[], Any] = lambda: None
        self.check_write: Callable[[int], Any] = lambda n: None
        self.close: Callable[[], None] = lambda: None
        self.version = "?"


def _sub_read(m: Any, k: Any) -> Callable[[int], float]:
    """``m[k]`` n times (gc off, as timeit)."""

    def loop(n: int) -> float:
        it = repeat(None, n)
        with no_gc():
            t0 = pc()
            for _ in it:
                m[k]
            t1 = pc()
        return t1 - t0

    return loop


def _call_read(get: Callable[[Any], Any], k: Any) -> Callable[[int], float]:
    """``get(k)`` n times: raw redis-py ``r.get(k)``."""

    def loop(n: int) -> float:
        it = repeat(None, n)
        with no_gc():
            t0 = pc()
            for _ in it:
                get(k)
            t1 = pc()
        return t1 - t0

    return loop


class _Rotation:
    """The write loops' keys, continuing where the previous call stopped; the last (key, value)."""

    def __init__(self, keys: list[Any]) -> None:
        self.keys = keys
        self.pos = 0
        self.last: Optional[tuple[Any, int]] = None

    def take(self, n: int) -> Any:
        it = islice(cycle(self.keys[self.pos :] + self.keys[: self.pos]), n)
        self.pos = (self.pos + n) % len(self.keys)
        return it


def _sub_write(m: Any, rot: _Rotation) -> Callable[[int], float]:
    """``m[k] = i`` for n rotating keys."""

    def loop(n: int) -> float:
        pairs = zip(rot.take(n), range(n))
        with no_gc():
            t0 = pc()
            for k, i in pairs:
                m[k] = i
            t1 = pc()
        rot.last = (rot.keys[(rot.pos - 1) % len(rot.keys)], n - 1)
        return t1 - t0

    return loop


def _call_write(put: Callable[[Any, Any], Any], rot: _Rotation) -> Callable[[int], float]:
    """``put(k, i)`` for n rotating keys: raw redis-py ``r.set(k, i)``."""

    def loop(n: int) -> float:
        pairs = zip(rot.take(n), range(n))
        with no_gc():
            t0 = pc()
            for k, i in pairs:
                put(k, i)
            t1 = pc()
        rot.last = (rot.keys[(rot.pos - 1) % len(rot.keys)], n - 1)
        return t1 - t0

    return loop


def _open_rw(contender: str, params: dict[str, Any]) -> Ops:
    ops = Ops()
    name = params["name"]
    if contender == "redis":
        r = _redis_client(params)
        hot = f"{name}:{HOT}"
        r.set(hot, 0)
        rot = _Rotation([f"{name}:w{j}" for j in range(WRITE_KEYS)])
        ops.loops = {"read": _call_read(r.get, hot), "write": _call_write(r.set, rot)}
        ops.check_read = lambda: r.get(hot) == b"0"
        ops.check_write = lambda n: rot.last is None or r.get(rot.last[0]) == str(rot.last[1]).encode()
        ops.close = r.close
        ops.version = "redis-py " + _version("redis")
        return ops
    if contender in ("ultradict_ng", "ultradict_ng:cached"):
        reads = "cached" if contender.endswith(":cached") else "fresh"
        d = _shared_dict(params, create=True, reads=reads)
        d[HOT] = 0
        rot = _Rotation([f"w{j}" for j in range(WRITE_KEYS)])
        ops.loops = {"read": _sub_read(d, HOT), "write": _sub_write(d, rot)}
        ops.check_read = lambda: d[HOT] == 0
        ops.check_write = lambda n: rot.last is None or d[rot.last[0]] == rot.last[1]
        ops.close = d.close
        ops.version = f"ultradict_ng {_version('ultradict_ng')} (reads={reads!r})"
        return ops
    if contender == "pottery":
        pottery = _pottery()
        r = _redis_client(params)
        pd = pottery.RedisDict(redis=r, key=name)
        pd[HOT] = 0
        rot = _Rotation([f"w{j}" for j in range(WRITE_KEYS)])
        ops.loops = {"read": _sub_read(pd, HOT), "write": _sub_write(pd, rot)}
        ops.check_read = lambda: pd[HOT] == 0
        ops.check_write = lambda n: rot.last is None or pd[rot.last[0]] == rot.last[1]
        ops.close = r.close
        ops.version = "pottery " + _version("pottery")
        return ops
    if contender == "redis_dict":
        rdm = _redis_dict()
        rd = rdm.RedisDict(namespace=name, host="127.0.0.1", port=params["port"])
        rd[HOT] = 0
        rot = _Rotation([f"w{j}" for j in range(WRITE_KEYS)])
        ops.loops = {"read": _sub_read(rd, HOT), "write": _sub_write(rd, rot)}
        ops.check_read = lambda: rd[HOT] == 0
        ops.check_write = lambda n: rot.last is None or rd[rot.last[0]] == rot.last[1]
        ops.close = rd.redis.close
        ops.version = "redis-dict " + _version("redis-dict")
        return ops
    raise ValueError(f"unknown contender {contender!r}")


# -- the roles ---------------------------------------------------------------------------------


def _rw(params: dict[str, Any], conn: Any, start: Any) -> None:
    from .util import calibrate

    ops = _open_rw(params["contender"], params)
    try:
        conn.send(("ready", {"pid": os.getpid(), "version": ops.version}))
        counts: dict[str, int] = {}  # op counts, calibrated at the first measurement
        while True:
            msg = conn.recv()
            if msg[0] == "exit":
                return
            spec = msg[1]
            out: dict[str, Any] = {}
            for kind in spec["kinds"]:
                loop = ops.loops[kind]
                if kind not in counts:
                    counts[kind] = calibrate(loop, spec["box"])
                n = counts[kind]
                raw = [{"ops": n, "seconds": loop(n)} for _ in range(spec["reps"])]
                ok = ops.check_read() if kind == "read" else ops.check_write(n)
                out[kind] = {"raw": raw, "ok": bool(ok)}
            conn.send(("result", out))
    finally:
        ops.close()


def _locker(params: dict[str, Any], conn: Any, start: Any) -> None:
    contender, n = params["contender"], params["n"]
    closers: list[Callable[[], Any]] = []
    if contender == "ultradict_ng":
        d = _shared_dict(params)  # attach by name (the harness created it)
        m, lock = d, d.lock
        closers.append(d.close)
    elif contender == "pottery":
        pottery = _pottery()
        r = _redis_client(params)
        lock = pottery.Redlock(key=params["name"] + ":lock", masters={r})
        m = pottery.RedisDict(redis=r, key=params["name"] + ":dict")
        if params["init"]:
            m[COUNTER] = 0
        closers.append(r.close)
    else:
        raise ValueError(f"unknown contender {contender!r}")
    try:
        k = COUNTER
        conn.send(("ready", {"pid": os.getpid()}))
        if not start.wait(params["start_timeout"]):
            raise TimeoutError("no start signal")
        with no_gc():
            t0 = clock()
            for _ in repeat(None, n):
                with lock:
                    m[k] += 1
            t1 = clock()
        conn.send(("result", {"t0": t0, "t1": t1, "n": n}))
    finally:
        for c in closers:
            c()


def _holder(params: dict[str, Any], conn: Any, start: Any) -> None:
    d = _shared_dict(params, lease=params["lease"])
    d.lock.acquire()
    conn.send(("ready", {"pid": os.getpid(), "held_at": clock()}))
    while True:  # until SIGKILL (the keeper thread renews the lease meanwhile)
        time.sleep(3600)


def _waiter(params: dict[str, Any], conn: Any, start: Any) -> None:
    d = _shared_dict(params, lease=params["lease"])
    try:
        conn.send(("ready", {"pid": os.getpid()}))
        if conn.recv()[0] != "go":
            return
        t_try = clock()
        conn.send(("trying", {"t": t_try}))
        with d.lock:
            t_in = clock()
            d["taken_by"] = os.getpid()
        conn.send(("result", {"t_try": t_try, "t_in": t_in}))
    finally:
        d.close()


def _writer(params: dict[str, Any], conn: Any, start: Any) -> None:
    """One session per ``("go", spec)``: attach to ``spec['name']``, write, report, close."""
    from ultradict_ng import SharedDict

    sleep = time.sleep
    conn.send(("ready", {"pid": os.getpid()}))
    while True:
        msg = conn.recv()
        if msg[0] != "go":
            return
        spec = msg[1]
        d = SharedDict(name=spec["name"], backend=params["url"])
        try:
            rnd = random.Random(spec["seed"])
            lo, hi = spec["gap"]
            done: list[float] = []
            d[STAMP]  # (warm: the handle is loaded)
            for i in range(1, spec["writes"] + 1):
                d[STAMP] = i
                done.append(clock())
                sleep(rnd.uniform(lo, hi))
        finally:
            d.close()
        conn.send(("result", {"done": done}))


def _poller(params: dict[str, Any], conn: Any, start: Any) -> None:
    d = _shared_dict(params, reads=params["reads"])
    try:
        last_value = params["writes"]
        conn.send(("ready", {"pid": os.getpid()}))
        if conn.recv()[0] != "go":
            return
        seen: list[tuple[int, float]] = []  # (value, first time seen)
        pause = params.get("pause", 0.0)
        sleep = time.sleep
        deadline = clock() + params["limit"]
        prev = d[STAMP]
        reads = 0
        with no_gc():
            while True:
                v = d[STAMP]
                reads += 1
                if v != prev:
                    seen.append((v, clock()))
                    prev = v
                    if v >= last_value:
                        break
                elif pause:
                    sleep(pause)
                if (pause or reads & 0xFFF == 0) and clock() > deadline:
                    break
        conn.send(("result", {"seen": seen, "reads": reads}))
    finally:
        d.close()


ROLES: dict[str, Callable[[dict[str, Any], Any, Any], None]] = {
    "rw": _rw,
    "locker": _locker,
    "holder": _holder,
    "waiter": _waiter,
    "writer": _writer,
    "poller": _poller,
}
