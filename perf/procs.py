"""Code that runs in spawned processes: :func:`worker_main`, a worker of the pool of workloads
4 and 5 (attach dicts by spec, locked increments from a common start, poll a key), and
:func:`attach_probe`, one fresh process per measurement of workload 6 (attach + first read).
Children ignore SIGINT (the parent ends them) and exit when their parent goes away.
"""

from __future__ import annotations

import os
import queue
import signal
import time
import traceback
from contextlib import suppress
from typing import Any

from . import adapters as A
from .util import no_gc

_perf_ns = time.perf_counter_ns


def _child_setup(preload: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    A.preload(preload)
    return os.getppid()


def worker_main(wid: int, cmd_q: Any, res_q: Any, inherit: dict[str, Any], preload: list[str]) -> None:
    """Commands: (attach, spec), (close, name), (incr, name, key, n, start_ns), (poll, name, key,
    stop_value, limit_s), (exit,)."""
    ppid = _child_setup(preload)
    opened: dict[str, tuple[dict[str, Any], Any]] = {}  # name: (spec, handle)
    try:
        while True:
            try:
                cmd = cmd_q.get(timeout=1.0)
            except queue.Empty:
                if os.getppid() != ppid:
                    return
                continue
            op = cmd[0]
            if op == "exit":
                return
            try:
                if op == "attach":
                    opened[cmd[1]["name"]] = (cmd[1], A.attach_spec(cmd[1], inherit))
                    res_q.put((wid, "ok", None))
                elif op == "close":
                    if cmd[1] in opened:
                        A.close_child(*opened.pop(cmd[1]))
                    res_q.put((wid, "ok", None))
                elif op == "incr":
                    res_q.put((wid, "incr", _incr(opened[cmd[1]][1], *cmd[2:])))
                elif op == "poll":
                    _poll(wid, opened[cmd[1]][1], *cmd[2:], res_q, ppid)
                else:
                    res_q.put((wid, "error", f"unknown command {op!r}"))
            except BaseException:
                res_q.put((wid, "error", traceback.format_exc(limit=8)))
    finally:
        for spec, h in opened.values():
            with suppress(Exception):
                A.close_child(spec, h)


def _incr(h: Any, key: Any, n: int, start_ns: int) -> Any:
    """The loop of workloads 3/4, started at a common instant."""
    m, lock, it = h.m, h.lock, range(n)
    while (left := start_ns - _perf_ns()) > 0:
        if left > 2_000_000:
            time.sleep((left - 1_000_000) / 1e9)
    with no_gc():
        t0 = _perf_ns()
        for _ in it:
            with lock:
                m[key] += 1
        t1 = _perf_ns()
    return (t0, t1, n)


def _poll(wid: int, h: Any, key: Any, stop_value: Any, limit_s: float, res_q: Any, ppid: int) -> None:
    """Workload 5: busy-poll ``m[key]``; record (value, perf_counter_ns when first seen)."""
    m, seen, errors = h.m, [], []
    last = m[key]
    res_q.put((wid, "ready", None))
    deadline = _perf_ns() + int(limit_s * 1e9)
    i = 0
    while True:
        i += 1
        if i & 0x3FF == 0 and (_perf_ns() > deadline or os.getppid() != ppid):
            why = f"; read errors: {errors[:3]}" if errors else ""
            res_q.put((wid, "error", f"poll: gave up (deadline reached without the stop value){why}"))
            return
        try:
            v = m[key]
        except Exception as exc:  # e.g. a torn read: counted, reported, polling goes on
            if len(errors) < 1000:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
            continue
        if v != last:
            t = _perf_ns()
            if v == stop_value:
                break
            seen.append((v, t))
            last = v
    res_q.put((wid, "seen", (seen, errors)))


def attach_probe(
    spec: dict[str, Any], key: Any, expected: Any, inherit: dict[str, Any], preload: list[str]
) -> dict[str, Any]:
    """Workload 6 in a fresh process (:meth:`perf.run.Run.call`): from the attach call to the first read."""
    _child_setup(preload + [m for m in [A.ADAPTERS[spec["adapter"]].module] if m])
    pc = time.perf_counter
    t0 = pc()
    h = A.attach_spec(spec, inherit)
    t1 = pc()
    value = h.m[key]
    t2 = pc()
    with suppress(Exception):
        A.close_child(spec, h)
    return {
        "attach": t1 - t0,
        "first_read": t2 - t1,
        "total": t2 - t0,
        "value_ok": value == expected,
        "pid": os.getpid(),
    }
