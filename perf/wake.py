"""Workload 10 (``wakeup``): how fast a waiter in another process wakes, what idle waiters
cost, and the lock under contention (the children's code: :mod:`perf.wake_child`).

1. Wake-up latency: this process stamps t0 before its write, a spawned waiter t1 when its
   wait returns (one system-wide clock); ping-pong with a 1-2 ms pause after each
   acknowledgement, so that every write finds the waiter asleep (no flattering of pollers).
   ``wait_for_change`` (futex; and with ``ULTRADICT_NG_WAIT=poll``), polling ``d[k]``, Event,
   Condition, Redis pub/sub, Pipe, and a bare ``os.read`` on a pipe as the floor.
2. Idle waiters: the CPU of 10 processes waiting 2 s / 10 s on a dict nobody writes, each
   measured around its wait alone (start-up would hide the 0.1 CPU-s target).
3. Locked increments: 1-8 processes ``with d.lock: d[k] += 1`` from a common instant: rate,
   ratio to one process's, exact final count, spread between processes.

Every child is spawned fresh (the variable must be set before the import) and ended by its pid;
every dict comes from the ultradict_ng adapter, which unlinks it.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import statistics
import time
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any, Callable, Optional

from . import wake_child as C
from .registry import NG, Target, Workload, pick, register
from .report import bars
from .run import Run
from .util import fmt_seconds, log, no_gc, percentile, watchdog

WL = "wakeup"
PARTS = ("latency", "idle", "lock")  # as --wake-parts names them
LATENCY, IDLE = "wake-up latency", "idle waiters"
UNITS = {LATENCY: ("s", "lower"), IDLE: ("CPU-s", "lower")}  # locked increments: ops/s, higher
IDLE_WAITERS = 10
LOCK_PROCS = (1, 2, 4, 8)
WARMUP = 20
PAUSE_S = (0.001, 0.002)  # after each acknowledgement: the waiter is back in the kernel
WAIT_LIMIT_S = 5.0  # one wait of a latency waiter; longer means the wake-up was lost
POLL = "ultradict_ng:poll"
NG_LABEL, POLL_LABEL = "ultradict_ng wait_for_change", "ultradict_ng, ULTRADICT_NG_WAIT=poll"
#: (record contender, label, adapter that must be selected, waiter kind in wake_child.WAITERS,
#: mode: "futex" = ULTRADICT_NG_WAIT removed in the child, "poll" = set)
LATENCY_ROWS = [
    (NG, NG_LABEL, NG, "ng", "futex"),
    (POLL, POLL_LABEL, NG, "ng", "poll"),
    ("ultradict_ng:spin", "polling d[k], time.sleep(0)", NG, "spin", "futex"),
    ("event", "multiprocessing.Event", "event", "event", "futex"),
    ("condition", "multiprocessing.Condition", "condition", "condition", "futex"),
    ("redis", "redis pub/sub (loopback)", "redis", "redis", "futex"),
    ("pipe", "multiprocessing.Pipe", "pipe", "pipe", "futex"),
    ("pipe:raw", "os.read/os.write on a pipe (floor)", "pipe", "rawpipe", "futex"),
]
IDLE_ROWS = [(NG, NG_LABEL, "futex"), (POLL, POLL_LABEL, "poll")]
IDLE_ROWS += [("ultradict_ng:sleep", "polling d[k], time.sleep(0.001)", "sleep")]
LOCK_ROWS = [(NG, "ultradict_ng (futex)", "futex"), (POLL, "ultradict_ng, WAIT=poll", "poll")]


def lock_case(p: int) -> str:
    return f"locked increments, {p} process" + ("es" if p > 1 else "")


class ChildError(Exception):
    """A child process raised (``args[1]``: ``wait_for_change`` is missing), died or was silent."""


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
    """Join within ``grace`` seconds in all, then ``run.reap`` (SIGTERM, SIGKILL by pid) the rest."""
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            if p.pid is not None:
                run.reap(p, max(0.01, deadline - time.monotonic()))
        finally:
            if p in run.children:
                run.children.remove(p)


def _check_mode(run: Run, label: str, wanted: str, infos: Sequence[dict[str, Any]]) -> str:
    """The waiting mode the children report; an alert if it is not the row's (a child that
    imported ultradict_ng before the variable was set, or no futex on this platform)."""
    modes = sorted({str(i.get("wait_mode")) for i in infos if i.get("wait_mode")})
    early = sum(1 for i in infos if i.get("imported_before_env"))
    if early:
        run.alert(f"{label}: {early} child(ren) imported ultradict_ng before {C.ENV} was set: a wrong mode?")
    if modes and modes != [wanted]:
        run.alert(f"{label}: the children report waiting mode {'/'.join(modes)}, not {wanted}")
    return "/".join(modes) or "?"


def _record(run: Run, case: str, key: str, label: str, **kw: Any) -> dict[str, Any]:
    unit, better = UNITS.get(case, ("ops/s", "higher"))
    rec = run.record(WL, case, key, unit=unit, better=better, **kw)
    rec["label"] = label
    return rec


def _fail(run: Run, case: str, key: str, label: str, exc: BaseException) -> None:
    if isinstance(exc, ChildError) and exc.args[1:] == (True,):
        why = "unavailable: SharedDict.wait_for_change does not exist in the installed ultradict_ng"
        _record(run, case, key, label, values=[], skipped=why)
        return
    text = exc.args[0] if isinstance(exc, ChildError) else f"{type(exc).__name__}: {exc}"
    short = text.strip().splitlines()[-1][:300]
    run.alert(f"{label} failed in workload {WL} ({case}): {short}")
    _record(run, case, key, label, values=[], error=text)["error_short"] = short


# -- part 1: wake-up latency ----------------------------------------------------------------


def _writer(
    run: Run, adapter: str, kind: str
) -> tuple[dict[str, Any], Any, Callable[[int], Any], Optional[Callable]]:
    """The writer's side of one contender: (what the child gets, its channel, the write, the teardown)."""
    ctx = run.ctx
    if adapter == NG:
        a = run.adapters[NG]
        h = a.create()
        m = h.m
        m[C.KEY] = 0

        def write_ng(i: int) -> None:
            m[C.KEY] = i

        return {"name": h.name}, None, write_ng, lambda: a.destroy(h)
    if kind == "redis":
        a, ch = run.adapters["redis"], run.new_name()
        return {"port": a.server.port, "channel": ch}, None, lambda i: a.client.publish(ch, i), None
    if kind in ("pipe", "rawpipe"):
        r, w = ctx.Pipe(duplex=False)
        close = lambda: (r.close(), w.close())  # noqa: E731
        if kind == "pipe":
            return {}, r, w.send, close
        fd = w.fileno()
        return {}, r, lambda i: os.write(fd, i.to_bytes(8, "little", signed=True)), close
    val = ctx.RawValue("q", 0)
    if kind == "event":
        ev = ctx.Event()

        def write_ev(i: int) -> None:
            val.value = i
            ev.set()

        return {}, (ev, val), write_ev, None
    cond = ctx.Condition()

    def write_cond(i: int) -> None:
        with cond:
            val.value = i
            cond.notify_all()

    return {}, (cond, val), write_cond, None


def _latency_one(run: Run, key: str, label: str, adapter: str, kind: str, mode: str, n: int) -> None:
    destroy = p = ack = None
    done = False  # the waiter got STOP and is exiting by itself
    try:
        spec, chan, write, destroy = _writer(run, adapter, kind)
        ack, child_ack = run.ctx.Pipe(duplex=False)
        p = _spawn(run, C.waiter_main, f"perf-wake-{kind}", (kind, mode, spec, chan, child_ack, WAIT_LIMIT_S))
        child_ack.close()
        info = _expect(ack, p, ("ready",), 120)[1]
        if kind == "ng":
            info["checked_mode"] = _check_mode(run, label, mode, [info])
        rnd, sleep, clock = random.Random(10), time.sleep, C.now_ns
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
                    what, v, t1, sp = _expect(ack, p, ("woke", "timeout"), WAIT_LIMIT_S + 30)
                    spurious += sp
                    if what == "timeout":
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
        p99, wmed = percentile(lat, 99), statistics.median(wcall) if wcall else None
        show = {"p99": fmt_seconds(p99), "max": fmt_seconds(max(lat, default=None))}
        show.update({"count": f"{len(lat)}/{n}", "write call": fmt_seconds(wmed)})
        counts = dict(lost=lost, spurious=spurious, stale=stale)
        extra = [f"{k} {v}" for k, v in counts.items() if v]
        extra += ["ultradict_ng was imported before the env was set!"] * bool(info.get("imported_before_env"))
        show.update({"note": ", ".join(extra)} if extra else {})
        params = dict(rounds=n, warmup=WARMUP, p99_s=p99, **counts, waiter=info)
        params.update(waiter_cpu_s=bye.get("cpu_s"), mode=mode, write_call_median_s=wmed)
        _record(run, LATENCY, key, label, values=lat, ok=lost == 0, show=show, params=params)
        if lost:
            run.alert(f"{label}: {lost} of {n} wake-ups lost (the {WAIT_LIMIT_S:g} s wait timed out)")
    except Exception as exc:
        _fail(run, LATENCY, key, label, exc)
    finally:
        if p is not None:
            _end(run, [p], 10 if done else 0.1)
        if ack is not None:
            ack.close()
        if destroy is not None:
            try:
                destroy()
            except Exception as exc:
                run.alert(f"{label}: cleanup failed: {exc!r} (retried at the end)")


# -- parts 2 and 3: a group of processes on one dict ------------------------------------------


@contextlib.contextmanager
def _group(run: Run, target: Callable, count: int, mode: str, label: str, grace: float) -> Iterator[Any]:
    """A dict and ``count`` ready children on it, each with a pipe; all ended and removed after."""
    a, g = run.adapters[NG], SimpleNamespace(h=None, procs=[], conns=[], infos=[])
    try:
        g.h = a.create()
        g.h.m[C.KEY] = 0
        g.before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for j in range(count):
            mine, theirs = run.ctx.Pipe()
            name = f"perf-wake-{target.__name__[:4]}-{j}"
            g.procs.append(_spawn(run, target, name, (mode, g.h.name, theirs)))
            theirs.close()
            g.conns.append(mine)
        g.infos = [_expect(c, p, ("ready",), 120)[1] for c, p in zip(g.conns, g.procs)]
        g.mode = _check_mode(run, label, mode, g.infos) if mode != "sleep" else None
        yield g
    finally:
        for c in g.conns:
            with contextlib.suppress(Exception):
                c.send(("exit",))
        _end(run, g.procs, grace)
        for c in g.conns:
            c.close()
        if g.h is not None:
            a.destroy(g.h)


def _idle_one(run: Run, key: str, label: str, mode: str, window: float) -> None:
    try:
        with _group(run, C.idle_main, IDLE_WAITERS, mode, label, 0.5) as g:
            end_ns = C.now_ns() + 100_000_000 + int(window * 1e9)
            for c in g.conns:
                c.send(("go", end_ns))
            res = [_expect(c, p, ("done",), window + 60)[1] for c, p in zip(g.conns, g.procs)]
            for c in g.conns:
                c.send(("exit",))
            _end(run, g.procs, 10)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the whole processes, reaped
        whole = (after.ru_utime - g.before.ru_utime) + (after.ru_stime - g.before.ru_stime)
        total = sum(r["cpu_s"] for r in res)
        wall = sum(r["wall_s"] for r in res) / len(res)
        per10 = total * 10.0 / wall if wall > 0 else None
        calls, true = sum(r["calls"] for r in res), sum(r["returned_true"] for r in res)
        show = {"per 10 s": f"{per10 or 0:.4f}", "whole procs": f"{whole:.2f}", "calls": str(calls)}
        show.update({"wall": f"{wall:.3g} s"}, **({"note": f"{true} returned True"} if true else {}))
        params = dict(waiters=IDLE_WAITERS, window_s=window, wall_s_mean=wall, cpu_s_per_10s_scaled=per10)
        params.update(whole_processes_cpu_s=whole, per_waiter=res, env=[i.get("env") for i in g.infos])
        params.update(mode=mode, wait_mode_reported=g.mode)
        _record(run, IDLE, key, label, values=[total], show=show, params=params)
    except Exception as exc:
        _fail(run, IDLE, key, label, exc)


def _locks_one(run: Run, key: str, label: str, mode: str, window: float) -> None:
    case = lock_case(LOCK_PROCS[0])
    try:
        with _group(run, C.locker_main, max(LOCK_PROCS), mode, label, 10) as g:
            base: Optional[float] = None
            for P in LOCK_PROCS:
                case = lock_case(P)
                log(f"  wakeup: {label}, {P} process(es), {window:g} s")
                with watchdog(120, f"{label} counter reset"), g.h.lock:
                    g.h.m[C.KEY] = 0
                start = C.now_ns() + 50_000_000
                for c in g.conns[:P]:
                    c.send(("run", start, start + int(window * 1e9)))
                res = [_expect(c, p, ("done",), window + 120)[1] for c, p in zip(g.conns[:P], g.procs[:P])]
                with watchdog(120, f"{label} final count"):
                    final = g.h.m[C.KEY]
                counts = [r["count"] for r in res]
                total, exact = sum(counts), final == sum(counts)
                span = (max(r["t1"] for r in res) - min(r["t0"] for r in res)) / 1e9
                rate = total / span if span > 0 else 0.0
                base = rate if P == 1 else base
                vs1 = rate / base if base else None
                spread = max(counts) / min(counts) if min(counts) > 0 else float("inf")
                if not exact:
                    run.alert(f"{label}, {P} processes: final count {final} != their {total} (lost updates)")
                cnt = "exact" if exact else f"MISMATCH {final} != {total}"
                show = {"vs 1": f"{vs1 or 0:.2f}x", "count": cnt, "max/min": f"{spread:.2f}"}
                show["CPU"] = f"{sum(r['cpu_s'] for r in res):.2f} s"
                params = dict(processes=P, window_s=window, counts=counts, final=final, exact=exact)
                params.update(ratio_to_1=vs1, max_over_min=spread, raw=res, mode=mode)
                params["wait_mode_reported"] = g.mode
                _record(run, case, key, label, values=[rate], ok=exact, show=show, params=params)
    except Exception as exc:
        _fail(run, case, key, label, exc)


def w_wake(run: Run, adapters: list[Any]) -> None:
    keys = {a.key for a in adapters}
    parts = run.wake_parts or PARTS
    n = 200 if run.quick else 2000
    for key, label, adapter, kind, mode in LATENCY_ROWS if "latency" in parts else ():
        if adapter in keys:
            log(f"  wakeup: latency, {label} ({n} round trips)")
            _latency_one(run, key, label, adapter, kind, mode, n)
        elif adapter in run.skipped:
            _record(run, LATENCY, key, label, values=[], skipped=run.skipped[adapter])
    if NG in keys and "latency" in parts:
        # time.sleep(0) bounds the plain polling row from below: since Python 3.11 it is a
        # clock_nanosleep call, which can take the kernel's timer slack (50-100 µs).
        t0 = C.now_ns()
        for _ in range(200):
            time.sleep(0)
        per = fmt_seconds((C.now_ns() - t0) / 200 / 1e9)
        run.note(f"one time.sleep(0) takes {per} here (mean of 200): polling d[k] sees no change sooner", WL)
    for key, label, mode in IDLE_ROWS if NG in keys and "idle" in parts else ():
        window = 2.0 if run.quick else 10.0
        log(f"  wakeup: {IDLE_WAITERS} idle waiters, {label}, {window:g} s")
        _idle_one(run, key, label, mode, window)
    for key, label, mode in LOCK_ROWS if NG in keys and "lock" in parts else ():
        _locks_one(run, key, label, mode, 1.0 if run.quick else 3.0)
    notes = {
        "latency": f"wake-up latency: {n} round trips after {WARMUP} unrecorded ones; t0 = the writer's "
        f"clock before its write, t1 = the waiter's after its wait returns ({C.CLOCK_NAME}); the writer "
        "pauses 1-2 ms after each acknowledgement (a separate Pipe); 'write call' = t0 to the writer's "
        "call returning; 'lost' = a wait timed out after a write, 'stale' = a wake-up for an earlier "
        "round. Event: RawValue = i, set(); Condition: value = i, notify_all() under it; redis: PUBLISH, "
        "get_message(timeout); Pipe: send(i), a blocking recv(); the floor: os.write, a blocking os.read",
        "env": f"{C.ENV} is set to poll (or removed) in each child before it imports ultradict_ng; the "
        f"writer, this process, has {C.ENV}={os.environ.get(C.ENV)!r}",
        "idle": "idle waiters: CPU-s = the sum of each process's getrusage(RUSAGE_SELF) around its wait "
        "alone (wait_for_change(timeout=window), again if it returned early); 'whole procs' = "
        "RUSAGE_CHILDREN from spawn to exit" + ("; --quick: 'per 10 s' = 2 s scaled linearly" * run.quick),
        "lock": "locked increments: rate = all increments / (last end - first start); 'vs 1' = / the "
        "1-process rate; count = the final value against the processes' counts; max/min of their counts",
    }
    for part, text in notes.items():
        if part in parts or part == "env":
            run.note(text, WL)


def _param(case: str, key: str, what: Callable[[dict[str, Any]], str]) -> Callable:
    """A target's measure: ``params[key]`` of ultradict_ng's record of ``case``, and its detail."""

    def measure(recs: list[dict[str, Any]]) -> Optional[tuple[float, str]]:
        r = pick(WL, case=case).find(recs)
        v = r["params"].get(key) if r and r["median"] is not None else None
        return None if v is None else (v, what(r))

    return measure


def _panel(ax: Any, recs: list[dict[str, Any]]) -> str:
    """Wake-up latency alone (the other parts have other units): median bars, p99 whiskers."""
    lat = [r for r in recs if r["case"] == LATENCY and r["median"]]
    bars(ax, [dict(r, min=r["median"], max=r["params"]["p99_s"]) for r in lat])
    ax.set_yscale("log")
    return "wake-up latency to another process (whiskers: p99)"


LAT, REDIS = pick(WL, case=LATENCY), pick(WL, "redis", case=LATENCY)
L8, L1 = pick(WL, case=lock_case(8)), pick(WL, case=lock_case(1))
P99 = _param(LATENCY, "p99_s", lambda r: f"{NG_LABEL} p99 over {r['n']} round trips")
CPU = _param(
    IDLE, "cpu_s_per_10s_scaled", lambda r: f"scaled from {r['median']:.3g} CPU-s in {r['show']['wall']}"
)
SPREAD = _param(lock_case(8), "max_over_min", lambda r: "the busiest process's count / the least busy one's")
LOCKS = "locked increments: with d.lock: d[k] += 1 (ops/s, higher is better)"
register(
    Workload(
        name=WL,
        number=10,
        title="wake-up: a write -> a waiter in another process; idle waiters' CPU; d.lock",
        run=w_wake,
        aliases=("wake", "wake-up", "wait", "wait_for_change", "futex"),
        adapters=True,
        keys=lambda r: (LOCKS, r["case"]) if r["case"].startswith("locked") else ("", r["case"]),
        panel=_panel,
        targets=(
            Target("wake-up median <= 50 µs (wait_for_change)", 50e-6, LAT, at_most=True, unit="s"),
            Target("wake-up p99 <= 1 ms", 1e-3, at_most=True, unit="s", measure=P99),
            Target("wake-up median <= 0.5x Redis pub/sub's", 0.5, LAT, REDIS, at_most=True),
            Target(
                "10 idle waiters <= 0.1 CPU-s total per 10 s", 0.1, at_most=True, unit="CPU-s", measure=CPU
            ),
            Target("8 processes locking >= 0.6x one, exact count", 0.6, L8, L1, exact=True),
            Target("8 processes locking: max/min <= 3", 3, at_most=True, unit="count", measure=SPREAD),
        ),
    )
)
