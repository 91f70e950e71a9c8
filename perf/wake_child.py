"""Workload 10 (``wakeup``): the bodies of the spawned processes (see :mod:`perf.wake`).

``ULTRADICT_NG_WAIT`` must be set (or removed) before ``ultradict_ng`` is imported: so this
module imports only the standard library at the top, and the children get names and
multiprocessing primitives, never a ``SharedDict``.  Every child ignores SIGINT (the harness
ends it by its pid) and gives up when its parent is gone or a wait exceeds its limit.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any, Callable, Optional

from .util import no_gc

ENV = "ULTRADICT_NG_WAIT"
KEY = "k"  # the key every part writes; the value of a round is its number
STOP = -1  # tells a latency waiter to report and exit


def _pick_clock() -> tuple[str, Callable[[], int]]:
    """A nanosecond clock shared by all processes (latencies subtract stamps of two processes)."""
    impl = time.get_clock_info("perf_counter").implementation
    if "CLOCK_MONOTONIC" in impl:
        return f"perf_counter_ns ({impl})", time.perf_counter_ns
    mono = time.get_clock_info("monotonic").implementation
    return f"monotonic_ns ({mono}; perf_counter is {impl})", time.monotonic_ns


CLOCK_NAME, now_ns = _pick_clock()


def _attach(name: str, need_wait: bool = False) -> Any:
    import ultradict_ng
    from ultradict_ng import SharedDict

    d = SharedDict(name=name, create=False)
    if need_wait and not hasattr(d, "wait_for_change"):
        d.close()
        raise WaitMissing(f"no SharedDict.wait_for_change in {os.path.dirname(ultradict_ng.__file__)}")
    return d


def wait_mode() -> Optional[str]:
    """The waiting mode ultradict_ng chose in this process ("futex" / "poll"), if it says."""
    with contextlib.suppress(Exception):
        if "ultradict_ng" in sys.modules:
            from ultradict_ng._shm import waiting  # type: ignore[attr-defined,unused-ignore]

            return str(waiting.MODE)
    return None


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class WaitMissing(Exception):
    """The installed ultradict_ng has no ``SharedDict.wait_for_change``."""


def _child(
    conn: Any, mode: str, make: Callable[[], Any], body: Callable[[Any, dict[str, Any], int], None]
) -> None:
    """Set ``ULTRADICT_NG_WAIT`` for ``mode`` ("poll": set, else removed), ``make()`` the object (closed
    at the end), run ``body(it, what the child reports, the parent's pid)``.  An exception goes
    to the parent (lost if it is gone).  ``imported_before_env``: the setting came too late."""
    obj = None
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        info: dict[str, Any] = {"imported_before_env": "ultradict_ng" in sys.modules}
        os.environ.pop(ENV, None)
        os.environ.update({ENV: "poll"} if mode == "poll" else {})
        info.update(env=os.environ.get(ENV), pid=os.getpid(), clock=CLOCK_NAME)
        ppid = os.getppid()
        obj = make()
        info["wait_mode"] = wait_mode()
        body(obj, info, ppid)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            conn.send(("error", traceback.format_exc(limit=6), isinstance(exc, WaitMissing)))
    finally:
        if obj is not None:
            with contextlib.suppress(Exception):
                obj.close()


# -- wake-up latency: one waiter per contender --------------------------------------------
# A waiter is a generator: its first step sets it up and yields None (then the child says
# "ready"); each further one waits and yields (t1, the value or None on a timeout, spurious
# wake-ups).  When it yields it is ready for the next write (the Condition waiter holds its
# lock again, so that the notify cannot come before it waits).


def _dict_waiter(spec: dict[str, Any], chan: Any, timeout: float, spin: bool = False) -> Iterator[Any]:
    """``d.wait_for_change(timeout)``, then ``d[k]`` (which also moves the handle's state on);
    or (``spin``) plain polling: ``d[k]`` until it changes, ``time.sleep(0)`` between reads."""
    d = _attach(spec["name"], need_wait=not spin)
    try:
        last, sleep = d[KEY], time.sleep
        yield None
        while True:
            spurious = i = 0
            deadline = now_ns() + int(timeout * 1e9)
            while not spin:
                changed = d.wait_for_change(timeout)
                t1 = now_ns()
                if (v := d[KEY] if changed else None) != last:
                    break
                spurious += 1
            while spin and (v := d[KEY]) == last:
                sleep(0)
                i += 1
                if i & 0x3FF == 0 and now_ns() > deadline:
                    v = None
                    break
            t1 = now_ns() if spin else t1
            last = last if v is None else v
            yield t1, v, spurious
    finally:
        d.close()


def _event_waiter(spec: dict[str, Any], chan: Any, timeout: float) -> Iterator[Any]:
    """``ev.wait(timeout)``; the round's number is in a shared ``RawValue``."""
    ev, val = chan
    yield None
    while True:
        if not ev.wait(timeout):
            yield now_ns(), None, 0
            continue
        t1, v = now_ns(), val.value
        ev.clear()  # before the acknowledgement: the writer sets again only after it
        yield t1, v, 0


def _condition_waiter(spec: dict[str, Any], chan: Any, timeout: float) -> Iterator[Any]:
    """``with cond: while value unchanged: cond.wait(timeout)`` (the writer: ``notify_all``)."""
    cond, val = chan
    last = 0
    cond.acquire()
    yield None
    while True:
        spurious, timed_out = 0, False
        while val.value == last and not timed_out:
            timed_out = not cond.wait(timeout)
            spurious += not timed_out and val.value == last
        t1 = now_ns()
        v = None if timed_out else val.value
        last = last if v is None else v
        cond.release()
        cond.acquire()
        yield t1, v, spurious


def _pipe_waiter(spec: dict[str, Any], chan: Any, timeout: float, raw: bool = False) -> Iterator[Any]:
    """A blocking ``recv()``, as commonly used (EOFError when the harness is gone); or (``raw``)
    ``os.read`` of 8 bytes: the kernel's wake-up with the least Python, a floor for the others."""
    fd = chan.fileno()
    yield None
    while True:
        if not raw:
            v = chan.recv()
            yield now_ns(), v, 0
            continue
        data = os.read(fd, 8)
        t1 = now_ns()
        if len(data) < 8:
            raise EOFError("the writer's end is closed")
        yield t1, int.from_bytes(data, "little", signed=True), 0


def _redis_waiter(spec: dict[str, Any], chan: Any, timeout: float) -> Iterator[Any]:
    """A redis-py pub/sub subscriber: ``get_message(timeout)`` until a message arrives."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=spec["port"])
    ps = client.pubsub()  # type: ignore[no-untyped-call]
    try:
        ps.subscribe(spec["channel"])
        deadline = time.monotonic() + 30
        while True:  # the writer may publish only once the subscription is confirmed
            msg = ps.get_message(timeout=1.0)
            if msg is not None and msg["type"] == "subscribe":
                break
            if time.monotonic() > deadline:
                raise RuntimeError("redis: no subscribe confirmation within 30 s")
        yield None
        while True:
            deadline = time.monotonic() + timeout
            while True:
                msg = ps.get_message(timeout=max(0.0, deadline - time.monotonic()))
                if msg is not None and msg["type"] == "message":
                    yield now_ns(), int(msg["data"]), 0
                    break
                if time.monotonic() >= deadline:
                    yield now_ns(), None, 0
                    break
    finally:
        ps.close()
        client.close()


WAITERS: dict[str, Callable[..., Iterator[Any]]] = {
    "ng": _dict_waiter,
    "spin": lambda *a: _dict_waiter(*a, spin=True),
    "event": _event_waiter,
    "condition": _condition_waiter,
    "pipe": _pipe_waiter,
    "rawpipe": lambda *a: _pipe_waiter(*a, raw=True),
    "redis": _redis_waiter,
}


def waiter_main(kind: str, mode: str, spec: dict[str, Any], chan: Any, ack: Any, timeout: float) -> None:
    """Wait, stamp, acknowledge with the stamp, wait again; until STOP.  Sends ("ready", info), then
    ("woke" | "timeout", value, t1, spurious) per round, ("bye", {"cpu_s"}), or ("error", text, missing)."""

    def make() -> Iterator[Any]:
        w = WAITERS[kind](spec, chan, timeout)
        next(w)
        return w

    def body(w: Iterator[Any], info: dict[str, Any], ppid: int) -> None:
        ack.send(("ready", info))
        with no_gc():  # no collection between the wake-up and the stamp
            for t1, v, spurious in w:
                if v == STOP:
                    break
                ack.send(("woke" if v is not None else "timeout", v, t1, spurious))
                if v is None and os.getppid() != ppid:
                    return  # the harness is gone
        ack.send(("bye", {"cpu_s": _cpu_s()}))

    _child(ack, mode, make, body)


def idle_main(mode: str, name: str, conn: Any) -> None:
    """Until the "go" message's end_ns: ``d.wait_for_change(remaining)`` (again if it returns early),
    or (mode "sleep") ``d[k]`` then ``time.sleep(0.001)`` in a loop; report the CPU time of that alone."""

    def body(d: Any, info: dict[str, Any], ppid: int) -> None:
        d.get(KEY)  # a first read: the handle starts from the current state
        conn.send(("ready", info))
        msg = conn.recv()
        if msg[0] != "go":
            return
        end_ns = msg[1]
        calls = early_true = 0
        with no_gc():
            cpu0, t0 = _cpu_s(), now_ns()
            if mode == "sleep":
                sleep = time.sleep
                while now_ns() < end_ns:
                    d.get(KEY)
                    sleep(0.001)
                    calls += 1
            else:
                while (left := (end_ns - now_ns()) / 1e9) > 0:
                    early_true += bool(d.wait_for_change(left))
                    calls += 1
            t1, cpu1 = now_ns(), _cpu_s()
        res = {"cpu_s": cpu1 - cpu0, "wall_s": (t1 - t0) / 1e9, "calls": calls, "returned_true": early_true}
        conn.send(("done", {**res, **info}))
        conn.recv()  # "exit": the parent has read everything

    _child(conn, mode, lambda: _attach(name, need_wait=mode != "sleep"), body)


def locker_main(mode: str, name: str, conn: Any) -> None:
    """On ("run", start_ns, end_ns): ``with d.lock: d[k] += 1`` from start_ns until end_ns; report."""

    def body(d: Any, info: dict[str, Any], ppid: int) -> None:
        conn.send(("ready", info))
        while True:
            if not conn.poll(5.0):
                if os.getppid() != ppid:
                    return
                continue
            msg = conn.recv()
            if msg[0] != "run":
                return
            _, start_ns, end_ns = msg
            lock, clock, n = d.lock, now_ns, 0
            with no_gc():
                while (left := start_ns - clock()) > 0:
                    if left > 2_000_000:
                        time.sleep((left - 1_000_000) / 1e9)
                cpu0, t0 = _cpu_s(), clock()
                while True:
                    with lock:
                        d[KEY] += 1
                    n += 1
                    if clock() >= end_ns:
                        break
                t1, cpu = clock(), _cpu_s() - cpu0
            conn.send(("done", {"count": n, "t0": t0, "t1": t1, "cpu_s": cpu}))

    _child(conn, mode, lambda: _attach(name), body)
