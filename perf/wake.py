"""Workload 10 (``wakeup``): how fast a waiter in another process wakes, what idle
waiters cost, and the lock under contention.

Three parts, side by side in one run (the processes' code is in :mod:`perf.wake_child`):

1. **Wake-up latency.**  A waiter in a spawned process blocks; this process
   stamps ``t0`` just before its write, the waiter stamps ``t1`` as soon as its
   wait returns; latency = ``t1 - t0`` on CLOCK_MONOTONIC, which every process
   of the machine shares.  Ping-pong: the waiter acknowledges through a second
   pipe and blocks again, and the writer pauses 1-2 ms after the
   acknowledgement, so every write finds the waiter asleep in the kernel rather
   than still on its way back (which would flatter anyone who polls).
   Contenders: ``SharedDict.wait_for_change`` (futex), the same with
   ``ULTRADICT_NG_WAIT=poll`` set in the waiter before it imports
   ultradict_ng, plain polling of ``d[k]`` with ``time.sleep(0)``,
   ``multiprocessing.Event``, ``multiprocessing.Condition``, Redis pub/sub on
   loopback (the private redis-server the redis contender started),
   ``multiprocessing.Pipe``, and as a floor a bare ``os.read`` on a pipe (the
   kernel's wake-up with almost no Python around it).  200 round trips (``--quick``) or 2000, after 20
   unrecorded warm-up rounds.
2. **Idle waiters' CPU.**  10 spawned processes wait on a dict nobody writes
   (``d.wait_for_change(timeout=window)``; 2 s with ``--quick``, 10 s
   otherwise); each measures ``getrusage(RUSAGE_SELF)`` around its wait alone,
   because interpreter start-up and import cost far more than the 0.1 CPU-s
   target and would hide it (the whole processes' CPU, from
   ``RUSAGE_CHILDREN``, is shown too).  Futex mode, poll mode, and a loop of
   ``d[k]`` + ``time.sleep(0.001)`` for comparison.
3. **Locked increments.**  1, 2, 4 and 8 spawned processes do ``with d.lock:
   d[k] += 1`` for a fixed wall time (1 s / 3 s) from a common start instant;
   total rate, its ratio to one process's, the exact final count and the
   spread between processes; futex mode and poll mode.

Every process is spawned fresh (the environment variable has to be set before
the import), registered in ``run.children`` and ended by its own pid here or by
``run.cleanup()``; every dict is made through the ultradict_ng adapter, so it
is registered for unlinking too.
"""

from __future__ import annotations

import os
import random
import resource
import statistics
import time
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple, Optional

from . import wake_child as C
from .run import Run
from .util import fmt_seconds, log, no_gc, percentile, watchdog

WL = "wakeup"
#: The parts, as ``--wake-parts`` names them.
PARTS = ("latency", "idle", "lock")
LATENCY = "wake-up latency"
IDLE = "idle waiters"
IDLE_WAITERS = 10
LOCK_PROCS = (1, 2, 4, 8)
WARMUP = 20
PAUSE_S = (0.001, 0.002)  # after each acknowledgement: the waiter is back in the kernel
WAIT_LIMIT_S = 5.0  # one wait in a part-1 waiter; longer means the wake-up was lost


def lock_case(p: int) -> str:
    return f"locked increments, {p} process" + ("es" if p > 1 else "")


def rounds(run: Run) -> int:
    return 200 if run.quick else 2000


def idle_window(run: Run) -> float:
    return 2.0 if run.quick else 10.0


def lock_window(run: Run) -> float:
    return 1.0 if run.quick else 3.0


class Row(NamedTuple):
    key: str  # record contender
    label: str
    adapter: str  # the adapter that must be selected (--contenders)
    kind: str  # waiter kind in perf.wake_child.WAITERS
    mode: str  # "futex": ULTRADICT_NG_WAIT removed in the child; "poll": set to poll


NG, NG_POLL = "ultradict_ng", "ultradict_ng:poll"
LATENCY_ROWS = [
    Row(NG, "ultradict_ng wait_for_change", "ultradict_ng", "ng", "futex"),
    Row(NG_POLL, "ultradict_ng, ULTRADICT_NG_WAIT=poll", "ultradict_ng", "ng", "poll"),
    Row("ultradict_ng:spin", "polling d[k], time.sleep(0)", "ultradict_ng", "spin", "futex"),
    Row("event", "multiprocessing.Event", "event", "event", "futex"),
    Row("condition", "multiprocessing.Condition", "condition", "condition", "futex"),
    Row("redis", "redis pub/sub (loopback)", "redis", "redis", "futex"),
    Row("pipe", "multiprocessing.Pipe", "pipe", "pipe", "futex"),
    Row("pipe:raw", "os.read/os.write on a pipe (floor)", "pipe", "rawpipe", "futex"),
]
IDLE_ROWS = [  # (key, label, mode for idle_main)
    (NG, "ultradict_ng wait_for_change", "futex"),
    (NG_POLL, "ultradict_ng, ULTRADICT_NG_WAIT=poll", "poll"),
    ("ultradict_ng:sleep", "polling d[k], time.sleep(0.001)", "sleep"),
]
LOCK_ROWS = [(NG, "ultradict_ng (futex)", "futex"), (NG_POLL, "ultradict_ng, WAIT=poll", "poll")]


class ChildError(Exception):
    """A child process raised (``missing``: ``wait_for_change`` does not exist), died or was silent."""

    def __init__(self, text: str, missing: bool = False) -> None:
        super().__init__(text)
        self.missing = missing


def _expect(conn: Any, p: Any, kinds: Sequence[str], timeout: float) -> tuple[Any, ...]:
    """The next message of one of ``kinds`` from a child; ChildError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        if conn.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
            try:
                msg = conn.recv()
            except EOFError:
                raise ChildError(f"{p.name} (pid {p.pid}) ended, exit code {p.exitcode}") from None
            if msg[0] in kinds:
                return tuple(msg)
            if msg[0] == "error":
                raise ChildError(f"in {p.name} (pid {p.pid}): {msg[1].strip()}", bool(msg[2]))
            raise ChildError(f"{p.name} sent {msg[0]!r}, expected {'/'.join(kinds)}")
        if not p.is_alive() and not conn.poll(0):
            raise ChildError(f"{p.name} (pid {p.pid}) died, exit code {p.exitcode}")
        if time.monotonic() > deadline:
            raise ChildError(f"no {'/'.join(kinds)} from {p.name} (pid {p.pid}) within {timeout:.0f} s")


def _spawn(run: Run, target: Callable[..., None], name: str, args: tuple[Any, ...]) -> Any:
    p = run.ctx.Process(target=target, name=name, args=args, daemon=True)
    run.children.append(p)  # before start: an interruption after the fork still finds it
    try:
        p.start()
    except BaseException:
        if p.pid is None:  # never started (a child half-made by spawn exits on EOF)
            run.children.remove(p)
        raise
    return p


def _end(run: Run, procs: list[Any], grace: float) -> None:
    """Join within ``grace`` seconds in all, then terminate/kill by pid whatever still runs.

    (``run.reap``: SIGTERM, then SIGKILL, each to that process alone.)
    """
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            if p.pid is not None:
                run.reap(p, max(0.01, deadline - time.monotonic()))
        finally:
            if p in run.children:
                run.children.remove(p)


def _check_mode(run: Run, label: str, wanted: str, infos: Sequence[dict[str, Any]]) -> str:
    """The waiting mode the children report; an alert if it is not the one the row is about.

    (``ultradict_ng._shm.waiting.MODE``, where the installed version has it: a child
    that imported ultradict_ng before the variable was set, or a platform
    without futex, would otherwise be measured under the wrong label.)
    """
    modes = sorted({str(i.get("wait_mode")) for i in infos if i.get("wait_mode")})
    early = sum(1 for i in infos if i.get("imported_before_env"))
    if early:
        run.alert(
            f"{label}: {early} child(ren) had imported ultradict_ng before "
            f"{C.ENV} was set: their mode may not be the row's"
        )
    if modes and modes != [wanted]:
        run.alert(f"{label}: the children report waiting mode {'/'.join(modes)}, not {wanted}")
    return "/".join(modes) or "?"


def _record(run: Run, case: str, key: str, label: str, **kw: Any) -> dict[str, Any]:
    rec = run.record(WL, case, key, **kw)
    rec["label"] = label
    return rec


def _fail(run: Run, case: str, key: str, label: str, exc: BaseException, unit: str, better: str) -> None:
    if isinstance(exc, ChildError) and exc.missing:
        _record(
            run,
            case,
            key,
            label,
            unit=unit,
            better=better,
            values=[],
            skipped="unavailable: SharedDict.wait_for_change does not exist in the installed ultradict_ng",
        )
        return
    text = str(exc) if isinstance(exc, ChildError) else f"{type(exc).__name__}: {exc}"
    short = text.strip().splitlines()[-1][:300]
    run.alert(f"{label} failed in workload {WL} ({case}): {short}")
    rec = _record(run, case, key, label, unit=unit, better=better, values=[], error=text)
    rec["error_short"] = short


# -- part 1: wake-up latency ----------------------------------------------------------------


class _Writer(NamedTuple):
    spec: dict[str, Any]
    chan: Any
    write: Callable[[int], Any]
    destroy: Callable[[], None]


def _writer(run: Run, row: Row) -> _Writer:
    """The writer's side of one contender: what the child gets, the write, the teardown."""
    ctx = run.ctx
    if row.adapter == "ultradict_ng":
        a = run.adapters["ultradict_ng"]
        h = a.create()
        m = h.m
        m[C.KEY] = 0

        def write_ng(i: int) -> None:
            m[C.KEY] = i

        return _Writer({"name": h.name}, None, write_ng, lambda: a.destroy(h))
    if row.kind in ("event", "condition"):
        val = ctx.RawValue("q", 0)
        if row.kind == "event":
            ev = ctx.Event()

            def write_ev(i: int) -> None:
                val.value = i
                ev.set()

            return _Writer({}, (ev, val), write_ev, lambda: None)
        cond = ctx.Condition()

        def write_cond(i: int) -> None:
            with cond:
                val.value = i
                cond.notify_all()

        return _Writer({}, (cond, val), write_cond, lambda: None)
    if row.kind in ("pipe", "rawpipe"):
        r, w = ctx.Pipe(duplex=False)

        def close() -> None:
            r.close()
            w.close()

        if row.kind == "pipe":
            return _Writer({}, r, w.send, close)
        fd = w.fileno()
        return _Writer({}, r, lambda i: os.write(fd, i.to_bytes(8, "little", signed=True)), close)
    if row.kind == "redis":
        a = run.adapters["redis"]
        channel = run.new_name()
        return _Writer(
            {"port": a.server.port, "channel": channel},
            None,
            lambda i: a.client.publish(channel, i),
            lambda: None,
        )
    raise ValueError(row.kind)


def _latency_one(run: Run, row: Row, n: int) -> None:
    w: Optional[_Writer] = None
    p = ack = None
    done = False  # the waiter got STOP and is exiting by itself
    try:
        w = _writer(run, row)
        ack, child_ack = run.ctx.Pipe(duplex=False)
        p = _spawn(
            run,
            C.waiter_main,
            f"perf-wake-{row.kind}",
            (row.kind, row.mode, w.spec, w.chan, child_ack, WAIT_LIMIT_S),
        )
        child_ack.close()
        info = _expect(ack, p, ("ready",), 120)[1]
        if row.kind == "ng":
            info["checked_mode"] = _check_mode(run, row.label, row.mode, [info])
        rnd = random.Random(10)
        write, sleep, clock = w.write, time.sleep, C.now_ns
        lat: list[float] = []
        wcall: list[float] = []  # the writer's own call, t0 -> its return
        lost = spurious = stale = 0
        with no_gc():
            for i in range(1, WARMUP + n + 1):
                sleep(rnd.uniform(*PAUSE_S))
                t0 = clock()
                write(i)
                tw = clock()
                while True:
                    kind, v, t1, sp = _expect(ack, p, ("woke", "timeout"), WAIT_LIMIT_S + 30)
                    spurious += sp
                    if kind == "timeout":
                        lost += i > WARMUP
                        break
                    if v == i:
                        if i > WARMUP:
                            lat.append((t1 - t0) / 1e9)
                            wcall.append((tw - t0) / 1e9)
                        break
                    stale += 1  # a late wake-up for an earlier round
            write(C.STOP)
            bye = _expect(ack, p, ("bye",), 30)[1]
            done = True
        p99 = percentile(lat, 99)
        wmed = statistics.median(wcall) if wcall else None
        show = {"p99": p99, "max": max(lat) if lat else None, "count": f"{len(lat)}/{n}", "write call": wmed}
        extra = [f"{k} {v}" for k, v in (("lost", lost), ("spurious", spurious), ("stale", stale)) if v]
        if info.get("imported_before_env"):
            extra.append("ultradict_ng was imported before the env was set!")
        show["notes"] = ", ".join(extra)
        _record(
            run,
            LATENCY,
            row.key,
            row.label,
            unit="s",
            better="lower",
            values=lat,
            ok=lost == 0,
            show=show,
            params={
                "rounds": n,
                "warmup": WARMUP,
                "p99_s": p99,
                "lost": lost,
                "spurious": spurious,
                "stale": stale,
                "waiter": info,
                "waiter_cpu_s": bye.get("cpu_s"),
                "mode": row.mode,
                "write_call_median_s": wmed,
            },
        )
        if lost:
            run.alert(
                f"{row.label}: {lost} of {n} wake-ups were lost (the waiter's "
                f"{WAIT_LIMIT_S:g} s wait timed out after a write)"
            )
    except Exception as exc:
        _fail(run, LATENCY, row.key, row.label, exc, "s", "lower")
    finally:
        if p is not None:
            _end(run, [p], 10 if done else 0.1)
        if ack is not None:
            ack.close()
        if w is not None:
            try:
                w.destroy()
            except Exception as exc:
                run.alert(f"{row.label}: cleanup failed: {exc!r} (retried at the end)")


# -- part 2: idle waiters ---------------------------------------------------------------------


def _idle_one(run: Run, key: str, label: str, mode: str, window: float) -> None:
    a = run.adapters["ultradict_ng"]
    h = None
    procs: list[Any] = []
    conns: list[Any] = []
    try:
        h = a.create()
        h.m[C.KEY] = 0
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for j in range(IDLE_WAITERS):
            mine, theirs = run.ctx.Pipe()
            procs.append(_spawn(run, C.idle_main, f"perf-wake-idle-{j}", (mode, h.name, theirs)))
            theirs.close()
            conns.append(mine)
        infos = [_expect(c, p, ("ready",), 120)[1] for c, p in zip(conns, procs)]
        wait_mode = _check_mode(run, label, mode, infos) if mode != "sleep" else None
        end_ns = C.now_ns() + 100_000_000 + int(window * 1e9)
        for c in conns:
            c.send(("go", end_ns))
        res = [_expect(c, p, ("done",), window + 60)[1] for c, p in zip(conns, procs)]
        for c in conns:
            c.send(("exit",))
        _end(run, procs, 10)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        whole = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        total = sum(r["cpu_s"] for r in res)
        wall = sum(r["wall_s"] for r in res) / len(res)
        per10 = total * 10.0 / wall if wall > 0 else None
        calls = sum(r["calls"] for r in res)
        show = {
            "wall": wall,
            "per 10 s": per10,
            "whole": whole,
            "calls": calls,
            "returned True": sum(r["returned_true"] for r in res),
        }
        _record(
            run,
            IDLE,
            key,
            label,
            unit="CPU-s",
            better="lower",
            values=[total],
            show=show,
            params={
                "waiters": IDLE_WAITERS,
                "window_s": window,
                "wall_s_mean": wall,
                "cpu_s_per_10s_scaled": per10,
                "whole_processes_cpu_s": whole,
                "per_waiter": res,
                "env": [i.get("env") for i in infos],
                "mode": mode,
                "wait_mode_reported": wait_mode,
            },
        )
    except Exception as exc:
        _fail(run, IDLE, key, label, exc, "CPU-s", "lower")
    finally:
        _end(run, procs, 0.5)  # (after a success they were all joined above)
        for c in conns:
            c.close()
        if h is not None:
            a.destroy(h)


# -- part 3: locked increments ----------------------------------------------------------------


def _locks_one(run: Run, key: str, label: str, mode: str, window: float) -> None:
    a = run.adapters["ultradict_ng"]
    h = None
    procs: list[Any] = []
    conns: list[Any] = []
    case = lock_case(LOCK_PROCS[0])
    try:
        h = a.create()
        h.m[C.KEY] = 0
        for j in range(max(LOCK_PROCS)):
            mine, theirs = run.ctx.Pipe()
            procs.append(_spawn(run, C.locker_main, f"perf-wake-lock-{j}", (mode, h.name, theirs)))
            theirs.close()
            conns.append(mine)
        infos = [_expect(c, p, ("ready",), 120)[1] for c, p in zip(conns, procs)]
        wait_mode = _check_mode(run, label, mode, infos)
        base: Optional[float] = None
        for P in LOCK_PROCS:
            case = lock_case(P)
            log(f"  wakeup: {label}, {P} process(es), {window:g} s")
            with watchdog(120, f"{label} counter reset"):
                with h.lock:
                    h.m[C.KEY] = 0
            start = C.now_ns() + 50_000_000
            for c in conns[:P]:
                c.send(("run", start, start + int(window * 1e9)))
            res = [_expect(c, p, ("done",), window + 120)[1] for c, p in zip(conns[:P], procs[:P])]
            with watchdog(120, f"{label} final count"):
                final = h.m[C.KEY]
            counts = [r["count"] for r in res]
            total = sum(counts)
            span = (max(r["t1"] for r in res) - min(r["t0"] for r in res)) / 1e9
            rate = total / span if span > 0 else 0.0
            if P == 1:
                base = rate
            exact = final == total
            spread = max(counts) / min(counts) if min(counts) > 0 else float("inf")
            if not exact:
                run.alert(
                    f"{label}: {P} processes: final count {final}, the processes counted "
                    f"{total} (lost updates)"
                )
            show = {
                "vs 1": rate / base if base else None,
                "count": "exact" if exact else f"MISMATCH {final} != {total}",
                "max/min": spread,
                "cpu": sum(r["cpu_s"] for r in res),
                "span": span,
            }
            _record(
                run,
                case,
                key,
                label,
                unit="ops/s",
                better="higher",
                values=[rate],
                ok=exact,
                show=show,
                params={
                    "processes": P,
                    "window_s": window,
                    "counts": counts,
                    "final": final,
                    "exact": exact,
                    "ratio_to_1": show["vs 1"],
                    "max_over_min": spread,
                    "raw": res,
                    "mode": mode,
                    "wait_mode_reported": wait_mode,
                },
            )
    except Exception as exc:
        _fail(run, case, key, label, exc, "ops/s", "higher")
    finally:
        for c in conns:
            try:
                c.send(("exit",))
            except Exception:
                pass
        _end(run, procs, 10)
        for c in conns:
            c.close()
        if h is not None:
            a.destroy(h)


# -- the workload ---------------------------------------------------------------------------


def w_wake(run: Run, adapters: list[Any]) -> None:
    keys = {a.key for a in adapters}
    parts = run.wake_parts or PARTS
    n = rounds(run)
    if "latency" in parts:
        for row in LATENCY_ROWS:
            if row.adapter in keys:
                log(f"  wakeup: latency, {row.label} ({n} round trips)")
                _latency_one(run, row, n)
            elif row.adapter in run.skipped:
                _record(
                    run,
                    LATENCY,
                    row.key,
                    row.label,
                    unit="s",
                    better="lower",
                    values=[],
                    skipped=run.skipped[row.adapter],
                )
        if "ultradict_ng" in keys:
            _note_sleep0(run)
    if "ultradict_ng" in keys and "idle" in parts:
        for key, label, mode in IDLE_ROWS:
            log(f"  wakeup: {IDLE_WAITERS} idle waiters, {label}, {idle_window(run):g} s")
            _idle_one(run, key, label, mode, idle_window(run))
    if "ultradict_ng" in keys and "lock" in parts:
        for key, label, mode in LOCK_ROWS:
            _locks_one(run, key, label, mode, lock_window(run))
    from .wake_report import notes

    notes(run, n, parts)


def _note_sleep0(run: Run) -> None:
    """What ``time.sleep(0)`` costs here: it bounds the plain polling row from below.

    (Since Python 3.11 it is a ``clock_nanosleep`` call, which can take the
    kernel's timer slack, about 50-100 µs, rather than return at once.)
    """
    clock = C.now_ns
    t0 = clock()
    for _ in range(200):
        time.sleep(0)
    per = (clock() - t0) / 200 / 1e9
    run.note(
        f"one time.sleep(0) takes {fmt_seconds(per)} in this process (mean of 200): the "
        "plain polling row cannot see a change sooner than that on average",
        WL,
    )
