"""Workload 10 (``wakeup``): the code that runs in the spawned processes.

Three process bodies, one per part of the workload (see :mod:`perf.wake`):

* :func:`waiter_main` -- part 1, wake-up latency: blocks in one contender's
  wait, stamps the clock as soon as the wait returns, acknowledges through a
  second pipe, and blocks again; ends on the value :data:`STOP`.
* :func:`idle_main` -- part 2, the CPU an idle waiter burns: one wait (or a
  polling loop) for a fixed window with no writes, measured with
  ``getrusage(RUSAGE_SELF)`` around it.
* :func:`locker_main` -- part 3: ``with d.lock: d[k] += 1`` for a fixed wall
  time from a start instant common to all workers.

Why a module of its own: ``ULTRADICT_NG_WAIT`` must be set (or removed) in the
child *before* ``ultradict_ng`` is imported, so this module imports only the
standard library at the top and imports ``ultradict_ng`` (and redis-py) inside
the functions, after :func:`set_wait_env`.  Arguments are names and
multiprocessing primitives only, never a ``SharedDict``: unpickling one would
import ``ultradict_ng`` before the body runs.

Every child ignores SIGINT (the harness ends it by its pid), and gives up by
itself when its parent is gone or a wait exceeds its limit, so nothing
outlives the harness.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
import traceback
from typing import Any, Callable, Optional

from .util import no_gc

#: The environment variable that forces ultradict_ng's polling fallback.
ENV = "ULTRADICT_NG_WAIT"
#: The key every part writes; the value of a round is its number.
KEY = "k"
#: The value that tells a part-1 waiter to report and exit.
STOP = -1


def _pick_clock() -> tuple[str, Callable[[], int]]:
    """A nanosecond clock that all processes of the machine share.

    Latencies subtract a stamp taken in one process from one taken in another,
    which is only meaningful on a system-wide clock.  On Linux ``perf_counter``
    is ``clock_gettime(CLOCK_MONOTONIC)``; where it is not (it is
    ``mach_absolute_time`` on macOS, also system-wide, but say so), fall back
    to ``monotonic_ns``.
    """
    impl = time.get_clock_info("perf_counter").implementation
    if "CLOCK_MONOTONIC" in impl:
        return f"perf_counter_ns ({impl})", time.perf_counter_ns
    return (
        f"monotonic_ns ({time.get_clock_info('monotonic').implementation}; perf_counter is {impl})"
    ), time.monotonic_ns


CLOCK_NAME, now_ns = _pick_clock()


def set_wait_env(mode: str) -> dict[str, Any]:
    """Set ``ULTRADICT_NG_WAIT`` for ``mode`` ("futex": removed, "poll": set).

    Returns what the measurement depends on: the value now set, and whether
    ``ultradict_ng`` had been imported before (which would make the setting
    come too late: reported, not hidden).
    """
    before = "ultradict_ng" in sys.modules
    if mode == "poll":
        os.environ[ENV] = "poll"
    else:
        os.environ.pop(ENV, None)
    return {"env": os.environ.get(ENV), "imported_before_env": before}


def _setup(mode: str) -> tuple[int, dict[str, Any]]:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    info = set_wait_env(mode)
    info["pid"] = os.getpid()
    info["clock"] = CLOCK_NAME
    return os.getppid(), info


def _attach(name: str) -> Any:
    from ultradict_ng import SharedDict

    return SharedDict(name=name, create=False)


def wait_mode() -> Optional[str]:
    """The waiting mode ultradict_ng chose in this process ("futex" / "poll"), if it says."""
    if "ultradict_ng" not in sys.modules:
        return None
    try:
        from ultradict_ng._shm import waiting  # type: ignore[attr-defined,unused-ignore]

        return str(waiting.MODE)
    except Exception:
        return None


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class WaitMissing(Exception):
    """The installed ultradict_ng has no ``SharedDict.wait_for_change``."""


# -- part 1: one waiter per contender -----------------------------------------------------
#
# ``arm()`` runs before the acknowledgement that lets the writer write (the
# Condition waiter takes its lock there, so that the notify cannot come before
# it waits); ``next(timeout)`` blocks until the next value and returns
# (t1, value or None on a timeout, spurious wake-ups seen).


class _Waiter:
    def __init__(self, spec: dict[str, Any], chan: Any) -> None:
        self.spec = spec
        self.chan = chan
        self.last: Any = 0

    def arm(self) -> None:
        pass

    def next(self, timeout: float) -> tuple[int, Any, int]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _NgWaiter(_Waiter):
    """``d.wait_for_change(timeout)``, then ``d[k]`` (which also moves the handle's state on)."""

    def __init__(self, spec: dict[str, Any], chan: Any) -> None:
        super().__init__(spec, chan)
        self.d = _attach(spec["name"])
        if not hasattr(self.d, "wait_for_change"):
            import ultradict_ng

            raise WaitMissing(
                f"SharedDict.wait_for_change does not exist in the ultradict_ng "
                f"installed at {os.path.dirname(ultradict_ng.__file__)}"
            )
        self.last = self.d[KEY]

    def next(self, timeout: float) -> tuple[int, Any, int]:
        d, wait = self.d, self.d.wait_for_change
        spurious = 0
        while True:
            changed = wait(timeout)
            t1 = now_ns()
            if not changed:
                return t1, None, spurious
            v = d[KEY]
            if v != self.last:
                self.last = v
                return t1, v, spurious
            spurious += 1

    def close(self) -> None:
        self.d.close()


class _SpinWaiter(_Waiter):
    """Plain polling: read ``d[k]`` until it changes, ``time.sleep(0)`` between reads."""

    def __init__(self, spec: dict[str, Any], chan: Any) -> None:
        super().__init__(spec, chan)
        self.d = _attach(spec["name"])
        self.last = self.d[KEY]

    def next(self, timeout: float) -> tuple[int, Any, int]:
        d, last, sleep = self.d, self.last, time.sleep
        deadline = now_ns() + int(timeout * 1e9)
        i = 0
        while True:
            v = d[KEY]
            if v != last:
                t1 = now_ns()
                self.last = v
                return t1, v, 0
            sleep(0)
            i += 1
            if i & 0x3FF == 0 and now_ns() > deadline:
                return now_ns(), None, 0

    def close(self) -> None:
        self.d.close()


class _EventWaiter(_Waiter):
    """``ev.wait(timeout)``; the round's number is in a shared ``RawValue``; ``ev.clear()`` after."""

    def next(self, timeout: float) -> tuple[int, Any, int]:
        ev, val = self.chan
        if not ev.wait(timeout):
            return now_ns(), None, 0
        t1 = now_ns()
        v = val.value
        ev.clear()  # before the acknowledgement: the writer sets again only after it
        return t1, v, 0


class _ConditionWaiter(_Waiter):
    """``with cond: while value unchanged: cond.wait(timeout)`` (the writer: ``notify_all``)."""

    def arm(self) -> None:
        cond, _ = self.chan
        cond.acquire()

    def next(self, timeout: float) -> tuple[int, Any, int]:
        cond, val = self.chan
        spurious = 0
        try:
            while val.value == self.last:
                if not cond.wait(timeout):
                    return now_ns(), None, spurious
                if val.value == self.last:
                    spurious += 1
            t1 = now_ns()
            v = self.last = val.value
            return t1, v, spurious
        finally:
            cond.release()


class _PipeWaiter(_Waiter):
    """``conn.recv()``, blocking, as it is commonly used (``poll(timeout)`` first costs more).

    No timeout is needed to end: the writer's end is never in this process, so
    when the harness goes away ``recv`` raises EOFError.
    """

    def next(self, timeout: float) -> tuple[int, Any, int]:
        v = self.chan.recv()
        return now_ns(), v, 0


class _RawPipeWaiter(_Waiter):
    """``os.read`` of 8 bytes on the pipe's descriptor: the kernel's wake-up plus the least
    Python there can be, a floor for every other row (the writer: ``os.write``)."""

    def next(self, timeout: float) -> tuple[int, Any, int]:
        data = os.read(self.chan.fileno(), 8)
        t1 = now_ns()
        if len(data) < 8:
            raise EOFError("the writer's end is closed")
        return t1, int.from_bytes(data, "little", signed=True), 0


class _RedisWaiter(_Waiter):
    """A redis-py pub/sub subscriber: ``get_message(timeout)`` until a message arrives."""

    def __init__(self, spec: dict[str, Any], chan: Any) -> None:
        super().__init__(spec, chan)
        import redis

        self.client = redis.Redis(host="127.0.0.1", port=spec["port"])
        self.ps = self.client.pubsub()  # type: ignore[no-untyped-call]
        self.ps.subscribe(spec["channel"])
        deadline = time.monotonic() + 30
        while True:  # the writer may publish only once the subscription is confirmed
            msg = self.ps.get_message(timeout=1.0)
            if msg is not None and msg["type"] == "subscribe":
                break
            if time.monotonic() > deadline:
                raise RuntimeError("redis: no subscribe confirmation within 30 s")

    def next(self, timeout: float) -> tuple[int, Any, int]:
        get = self.ps.get_message
        deadline = time.monotonic() + timeout
        while True:
            msg = get(timeout=max(0.0, deadline - time.monotonic()))
            if msg is not None and msg["type"] == "message":
                return now_ns(), int(msg["data"]), 0
            if time.monotonic() >= deadline:
                return now_ns(), None, 0

    def close(self) -> None:
        self.ps.close()
        self.client.close()


WAITERS: dict[str, type] = {
    "ng": _NgWaiter,
    "spin": _SpinWaiter,
    "event": _EventWaiter,
    "condition": _ConditionWaiter,
    "pipe": _PipeWaiter,
    "rawpipe": _RawPipeWaiter,
    "redis": _RedisWaiter,
}


def waiter_main(kind: str, mode: str, spec: dict[str, Any], chan: Any, ack: Any, timeout: float) -> None:
    """Part 1: wait, stamp, acknowledge (with the stamp), wait again; until STOP.

    Messages on ``ack``: ("ready", info), ("woke", value, t1, spurious),
    ("timeout", None, t1, spurious), ("bye", info) and ("error", text, missing).
    """
    w: Optional[_Waiter] = None
    try:
        ppid, info = _setup(mode)
        w = WAITERS[kind](spec, chan)
        info["wait_mode"] = wait_mode()
        w.arm()
        ack.send(("ready", info))
        with no_gc():  # no collection between the wake-up and the stamp
            while True:
                t1, v, spurious = w.next(timeout)
                if v == STOP:
                    break
                w.arm()
                ack.send(("woke" if v is not None else "timeout", v, t1, spurious))
                if v is None and os.getppid() != ppid:
                    return  # the harness is gone
        ack.send(("bye", {"cpu_s": _cpu_s()}))
    except BaseException as exc:
        try:
            ack.send(("error", traceback.format_exc(limit=6), isinstance(exc, WaitMissing)))
        except Exception:
            pass
    finally:
        if w is not None:
            try:
                w.close()
            except Exception:
                pass


# -- part 2: idle waiters -----------------------------------------------------------------


def idle_main(mode: str, name: str, conn: Any) -> None:
    """Part 2: wait with no writes until ``end_ns``; report the CPU time of the wait alone.

    ``mode``: "futex" / "poll" (``d.wait_for_change(remaining)``, called again if it
    returns early) or "sleep" (``d[k]`` then ``time.sleep(0.001)`` in a loop).
    """
    d = None
    try:
        _, info = _setup("poll" if mode == "poll" else "futex")
        d = _attach(name)
        d.get(KEY)  # a first read: the handle starts from the current state
        if mode != "sleep" and not hasattr(d, "wait_for_change"):
            raise WaitMissing("SharedDict.wait_for_change does not exist in this ultradict_ng")
        info["wait_mode"] = wait_mode()
        conn.send(("ready", info))
        msg = conn.recv()
        if msg[0] != "go":
            return
        end_ns = msg[1]
        with no_gc():
            cpu0, t0 = _cpu_s(), now_ns()
            returns = early_true = 0
            if mode == "sleep":
                sleep = time.sleep
                while now_ns() < end_ns:
                    d.get(KEY)
                    sleep(0.001)
                    returns += 1
            else:
                wait = d.wait_for_change
                while True:
                    left = (end_ns - now_ns()) / 1e9
                    if left <= 0:
                        break
                    if wait(left):
                        early_true += 1
                    returns += 1
            t1, cpu1 = now_ns(), _cpu_s()
        conn.send(
            (
                "done",
                {
                    "cpu_s": cpu1 - cpu0,
                    "wall_s": (t1 - t0) / 1e9,
                    "calls": returns,
                    "returned_true": early_true,
                    **info,
                },
            )
        )
        conn.recv()  # "exit": the parent has read everything
    except EOFError:
        pass
    except BaseException as exc:
        try:
            conn.send(("error", traceback.format_exc(limit=6), isinstance(exc, WaitMissing)))
        except Exception:
            pass
    finally:
        if d is not None:
            try:
                d.close()
            except Exception:
                pass


# -- part 3: locked increments ------------------------------------------------------------


def _sleep_until(t_ns: int) -> None:
    while True:
        left = t_ns - now_ns()
        if left <= 0:
            return
        if left > 2_000_000:
            time.sleep((left - 1_000_000) / 1e9)


def locker_main(mode: str, name: str, conn: Any) -> None:
    """Part 3: on ("run", start_ns, end_ns), increment under the lock until end_ns; report."""
    d = None
    try:
        ppid, info = _setup(mode)
        d = _attach(name)
        info["wait_mode"] = wait_mode()
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
            m, lock, clock = d, d.lock, now_ns
            n = 0
            with no_gc():
                _sleep_until(start_ns)
                cpu0 = _cpu_s()
                t0 = clock()
                while True:
                    with lock:
                        m[KEY] += 1
                    n += 1
                    if clock() >= end_ns:
                        break
                t1 = clock()
                cpu = _cpu_s() - cpu0
            conn.send(("done", {"count": n, "t0": t0, "t1": t1, "cpu_s": cpu}))
    except EOFError:
        pass
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc(limit=6), False))
        except Exception:
            pass
    finally:
        if d is not None:
            try:
                d.close()
            except Exception:
                pass
