"""Code that runs in spawned processes.

* :func:`worker_main`: a long-lived worker of the pool used by the contention
  (4) and visibility-latency (5) workloads.  It attaches to dicts by spec,
  runs locked increments from a common start time, or polls a key.
* :func:`attach_probe`: one fresh process per measurement of workload 6: it
  imports everything first, then times attach + first read.

Children ignore SIGINT (the parent ends them) and exit when their parent goes
away, so that nothing outlives the harness.
"""

from __future__ import annotations

import os
import queue
import signal
import time
import traceback
from typing import Any

from . import adapters as A
from .util import no_gc

_perf_ns = time.perf_counter_ns


def _child_setup(preload: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    A.preload(preload)
    return os.getppid()


def _orphaned(ppid: int) -> bool:
    return os.getppid() != ppid


def _sleep_until(start_ns: int) -> None:
    while True:
        left = start_ns - _perf_ns()
        if left <= 0:
            return
        if left > 2_000_000:
            time.sleep((left - 1_000_000) / 1e9)


def worker_main(wid: int, cmd_q: Any, res_q: Any, inherit: dict[str, Any], preload: list[str]) -> None:
    ppid = _child_setup(preload)
    handles: dict[str, Any] = {}
    specs: dict[str, dict[str, Any]] = {}
    try:
        while True:
            try:
                cmd = cmd_q.get(timeout=1.0)
            except queue.Empty:
                if _orphaned(ppid):
                    return
                continue
            op = cmd[0]
            if op == "exit":
                return
            try:
                if op == "attach":
                    spec = cmd[1]
                    handles[spec["name"]] = A.attach_spec(spec, inherit)
                    specs[spec["name"]] = spec
                    res_q.put((wid, "ok", None))
                elif op == "close":
                    name = cmd[1]
                    h = handles.pop(name, None)
                    if h is not None:
                        A.close_child(specs.pop(name), h)
                    res_q.put((wid, "ok", None))
                elif op == "incr":
                    _, name, key, n, start_ns = cmd
                    res_q.put((wid, "incr", _incr(handles[name], key, n, start_ns)))
                elif op == "poll":
                    _, name, key, stop_value, limit_s = cmd
                    _poll(wid, handles[name], key, stop_value, limit_s, res_q, ppid)
                else:
                    res_q.put((wid, "error", f"unknown command {op!r}"))
            except BaseException:
                res_q.put((wid, "error", traceback.format_exc(limit=8)))
    finally:
        for name, h in list(handles.items()):
            try:
                A.close_child(specs[name], h)
            except Exception:
                pass


def _incr(h: Any, key: Any, n: int, start_ns: int) -> Any:
    """The loop of workloads 3/4, started at a common instant."""
    m, lock = h.m, h.lock
    it = range(n)
    _sleep_until(start_ns)
    with no_gc():
        t0 = _perf_ns()
        for _ in it:
            with lock:
                m[key] += 1
        t1 = _perf_ns()
    return (t0, t1, n)


def _poll(wid: int, h: Any, key: Any, stop_value: Any, limit_s: float, res_q: Any, ppid: int) -> None:
    """Workload 5: busy-poll ``m[key]``; record (value, perf_counter_ns when first seen)."""
    m = h.m
    last = m[key]
    seen: list[Any] = []
    errors: list[str] = []
    res_q.put((wid, "ready", None))
    deadline = _perf_ns() + int(limit_s * 1e9)
    i = 0
    while True:
        try:
            v = m[key]
        except Exception as exc:  # e.g. a torn read: counted, reported, polling goes on
            if len(errors) < 1000:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
            i += 1
            if i & 0x3FF == 0 and _perf_ns() > deadline:
                res_q.put((wid, "error", f"poll: gave up; read errors: {errors[:3]}"))
                return
            continue
        if v != last:
            t = _perf_ns()
            if v == stop_value:
                break
            seen.append((v, t))
            last = v
        i += 1
        if i & 0x3FF == 0 and (_perf_ns() > deadline or _orphaned(ppid)):
            res_q.put((wid, "error", "poll: gave up (deadline reached without the stop value)"))
            return
    res_q.put((wid, "seen", (seen, errors)))


def attach_probe(
    spec: dict[str, Any], key: Any, expected: Any, inherit: dict[str, Any], preload: list[str], res_q: Any
) -> None:
    """Workload 6 in a fresh process: time from the attach call to the first read."""
    try:
        _child_setup(preload)
        module = A.ADAPTERS[spec["adapter"]].module
        if module:
            A.preload([module])  # imported before the clock starts
        pc = time.perf_counter
        t0 = pc()
        h = A.attach_spec(spec, inherit)
        t1 = pc()
        value = h.m[key]
        t2 = pc()
        ok = value == expected
        try:
            A.close_child(spec, h)
        except Exception:
            pass
        res_q.put(
            (
                "probe",
                {
                    "attach": t1 - t0,
                    "first_read": t2 - t1,
                    "total": t2 - t0,
                    "value_ok": ok,
                    "pid": os.getpid(),
                },
            )
        )
    except BaseException:
        res_q.put(("error", traceback.format_exc(limit=8)))
