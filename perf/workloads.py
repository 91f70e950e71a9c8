"""The workloads, each written once against :class:`perf.adapters.Handle`.

(Workload 9, large values between processes, lives in :mod:`perf.big`;
workload 10, wake-ups, idle waiters and the lock under contention, in
:mod:`perf.wake`.)

Every timed loop has the same shape for every contender (``m[k]``,
``m[k] = i``, ``with lock: m[k] += 1``, with ``m`` and ``lock`` bound to
locals first); the cyclic GC is off inside timed loops, as in :mod:`timeit`.
Op counts are chosen so one repetition loops for about ``run.box`` seconds;
repetitions of different contenders are interleaved so that machine noise is
spread over all of them.
"""

from __future__ import annotations

import gc
import os
import random
import threading
import time
from itertools import repeat as _repeat
from typing import Any, Callable, Optional

from .adapters import Adapter, Handle
from .big import w_big
from .procs import attach_probe
from .run import Run, WorkerError
from .util import calibrate, fmt_count, fmt_seconds, log, no_gc, percentile, shm_entries, summarize, watchdog
from .wake import w_wake

pc = time.perf_counter
pc_ns = time.perf_counter_ns

KEY = 0

# (name, number, title, unit, better)
WORKLOADS: list[tuple[str, int, str]] = [
    ("read", 1, "hot-key read (no concurrent writes)"),
    ("write", 2, "single-key write"),
    ("lock", 3, "read-modify-write under the lock: with lock: m[k] += 1"),
    ("contend", 4, "locked increment, spawned processes contending (aggregate)"),
    ("latency", 5, "visibility latency: parent writes, a spawned reader polls"),
    ("attach", 6, "attach by name in a fresh spawned process, to the first read"),
    ("growth", 7, "cost per op vs dict size (writes include amortized full dumps)"),
    ("values", 8, "large values: write, then read through a second handle"),
    ("big", 9, "large values to another process: write, 1st/2nd read, reader RSS"),
    ("wakeup", 10, "wake-up: a write -> a waiter in another process; idle waiters' CPU; d.lock"),
]
NUMBERS = {name: no for name, no, _ in WORKLOADS}
TITLES = {name: title for name, _, title in WORKLOADS}
ALIASES = {
    "reads": "read",
    "writes": "write",
    "incr": "lock",
    "increment": "lock",
    "contention": "contend",
    "processes": "contend",
    "visibility": "latency",
    "load": "attach",
    "size": "growth",
    "cost": "growth",
    "value": "values",
    "large": "big",
    "large-values": "big",
    "numpy": "big",
    "wake": "wakeup",
    "wake-up": "wakeup",
    "wait": "wakeup",
    "wait_for_change": "wakeup",
    "futex": "wakeup",
}


def _safe_destroy(run: Run, a: Adapter, h: Optional[Handle]) -> None:
    if h is None:
        return
    try:
        with watchdog(120, f"destroying {a.label}"):
            a.destroy(h)
    except Exception as exc:
        run.alert(f"{a.label}: cleanup of {h.name} failed: {exc!r} (retried at the end)")


def _cell_limit(run: Run) -> float:
    """Watchdog limit of one measurement (generous: catches hangs, not slowness)."""
    return 120.0 + 50 * run.box


# -- loops --------------------------------------------------------------------------------


def read_loop(h: Handle, k: Any = KEY) -> Callable[[int], float]:
    m = h.m

    def loop(n: int) -> float:
        it = _repeat(None, n)
        with no_gc():
            t0 = pc()
            for _ in it:
                m[k]
            t1 = pc()
        return t1 - t0

    return loop


def write_loop(h: Handle, k: Any = KEY) -> Callable[[int], float]:
    m = h.m

    def loop(n: int) -> float:
        it = range(n)
        with no_gc():
            t0 = pc()
            for i in it:
                m[k] = i
            t1 = pc()
        return t1 - t0

    return loop


def lock_loop(h: Handle, k: Any = KEY) -> Callable[[int], float]:
    m, lock = h.m, h.lock

    def loop(n: int) -> float:
        it = _repeat(None, n)
        with no_gc():
            t0 = pc()
            for _ in it:
                with lock:
                    m[k] += 1
            t1 = pc()
        return t1 - t0

    return loop


class Counted:
    """Wraps a loop and counts the operations it ran (to check the final count)."""

    def __init__(self, loop: Callable[[int], float]) -> None:
        self.loop = loop
        self.total = 0

    def __call__(self, n: int) -> float:
        dt = self.loop(n)
        self.total += n
        return dt


# -- 1-3: one process ------------------------------------------------------------------------


def _inproc(
    run: Run,
    wl: str,
    adapters: list[Adapter],
    case: str,
    make_loop: Callable[[Handle], Callable[[int], float]],
    *,
    check_count: bool,
) -> None:
    cells: list[dict[str, Any]] = []
    try:
        for a in adapters:
            h = None
            try:
                with watchdog(_cell_limit(run), f"{a.label} {wl} setup"):
                    h = a.create()
                    with h.lock:
                        h.m[KEY] = 0
                    loop = Counted(make_loop(h))
                    n = calibrate(loop, run.box)
                cells.append({"a": a, "h": h, "loop": loop, "n": n, "raw": [], "failed": False})
            except Exception as exc:
                run.fail(wl, case, a.key, exc, unit="ops/s", better="higher")
                _safe_destroy(run, a, h)
        for _rep in range(run.repeat):
            for c in cells:
                if c["failed"]:
                    continue
                try:
                    with watchdog(_cell_limit(run), f"{c['a'].label} {wl}"):
                        dt = c["loop"](c["n"])
                    c["raw"].append({"ops": c["n"], "seconds": dt})
                except Exception as exc:
                    c["failed"] = True
                    run.fail(wl, case, c["a"].key, exc, unit="ops/s", better="higher")
        for c in cells:
            if c["failed"]:
                continue
            a, h = c["a"], c["h"]
            show: dict[str, str] = {}
            ok = None
            if check_count:
                try:
                    with watchdog(60, f"{a.label} final count"):
                        final = h.m[KEY]
                    ok = final == c["loop"].total
                    show["count"] = "exact" if ok else f"MISMATCH {final} != {c['loop'].total}"
                    if not ok:
                        run.alert(
                            f"{a.label}: workload {wl}: final count {final}, expected "
                            f"{c['loop'].total} (lost updates in ONE process)"
                        )
                except Exception as exc:
                    show["count"] = f"unreadable: {exc!r}"
                    ok = False
            values = [r["ops"] / r["seconds"] for r in c["raw"] if r["seconds"] > 0]
            run.record(
                wl,
                case,
                a.key,
                unit="ops/s",
                better="higher",
                values=values,
                raw=c["raw"],
                show=show,
                ok=ok,
                params={"ops_per_rep": c["n"]},
            )
            if wl == "lock" and values:
                run.single_lock_rate[a.key] = summarize(values)["median"] or 0.0
    finally:
        for c in cells:
            _safe_destroy(run, c["a"], c["h"])


def w_read(run: Run, adapters: list[Adapter]) -> None:
    _inproc(run, "read", adapters, "hot key", read_loop, check_count=False)


def w_write(run: Run, adapters: list[Adapter]) -> None:
    _inproc(run, "write", adapters, "single key", write_loop, check_count=False)


def w_lock(run: Run, adapters: list[Adapter]) -> None:
    _inproc(run, "lock", adapters, "1 process", lock_loop, check_count=True)
    redis = next((a for a in adapters if a.key == "redis"), None)
    if redis is not None:
        try:
            key = run.new_name() + ":incr"
            loop = redis.incr_loop(key)
            n = calibrate(loop, run.box)
            raw = [{"ops": n, "seconds": loop(n)} for _ in range(run.repeat)]
            redis.client.delete(key)
            vals = [r["ops"] / r["seconds"] for r in raw]
            run.record(
                "lock",
                "1 process",
                "redis:INCR",
                unit="ops/s",
                better="higher",
                values=vals,
                raw=raw,
                note_only=True,
            )
            med = summarize(vals)["median"]
            from .util import fmt_rate

            run.note(
                f"redis INCR (one atomic server-side command; not the same shape as "
                f"lock + GET + SET): {fmt_rate(med)} ops/s median",
                "lock",
            )
        except Exception as exc:
            run.note(f"redis INCR measurement failed: {exc!r}", "lock")


# -- 4: contention ------------------------------------------------------------------------------


def _base_lock_rate(run: Run, a: Adapter, h: Handle) -> float:
    rate = run.single_lock_rate.get(a.key)
    if rate:
        return rate
    h.m[KEY] = 0  # (a fresh handle: workload 3, which sets it, may not have run)
    loop = lock_loop(h)
    n = calibrate(loop, min(run.box, 0.1))
    dt = loop(n)
    return n / dt if dt > 0 else 1000.0


def _contend_threads(run: Run, a: Adapter, P: int, case: str) -> None:
    """The plain dict cannot cross processes: its ceiling uses P threads and a threading.Lock."""
    h = a.create()
    try:
        m, lock = h.m, h.lock

        def round_(n: int) -> tuple[float, bool, int]:
            m[KEY] = 0
            barrier = threading.Barrier(P + 1)
            times: list[tuple[int, int]] = []

            def body() -> None:
                barrier.wait()
                t0 = pc_ns()
                for _ in _repeat(None, n):
                    with lock:
                        m[KEY] += 1
                times.append((t0, pc_ns()))

            threads = [threading.Thread(target=body) for _ in range(P)]
            for t in threads:
                t.start()
            barrier.wait()
            for t in threads:
                t.join()
            span = (max(t1 for _, t1 in times) - min(t0 for t0, _ in times)) / 1e9
            return span, m[KEY] == P * n, m[KEY]

        base = _base_lock_rate(run, a, h)
        n_cal = max(10, int(base * run.box * 0.15 / P))
        span, _, _ = round_(n_cal)
        agg = P * n_cal / span if span > 0 else base
        n = max(10, int(agg * run.box / P))
        raw = []
        exact_all = True
        for _ in range(run.repeat):
            span, exact, final = round_(n)
            exact_all &= exact
            raw.append({"ops": P * n, "seconds": span, "final": final, "exact": exact})
        run.record(
            "contend",
            case,
            a.key,
            unit="ops/s",
            better="higher",
            values=[r["ops"] / r["seconds"] for r in raw],
            raw=raw,
            ok=exact_all,
            show={"count": "exact" if exact_all else "MISMATCH", "how": f"{P} threads"},
            params={"ops_per_worker": n, "threads": P},
        )
    finally:
        a.destroy(h)


def _psm() -> set:
    return {e for e in shm_entries() if e.startswith("psm_")}


def _contend_procs(run: Run, a: Adapter, P: int, case: str) -> None:
    psm_before = _psm() if a.uses_mp_shm else None
    try:
        _contend_procs_inner(run, a, P, case)
    finally:
        if psm_before is not None:
            run.psm_suspects |= _psm() - psm_before


def _contend_procs_inner(run: Run, a: Adapter, P: int, case: str) -> None:
    h = None
    pool = None
    attached = False
    try:
        with watchdog(_cell_limit(run), f"{a.label} contend setup"):
            h = a.create()
            with h.lock:
                h.m[KEY] = 0
            base = _base_lock_rate(run, a, h)
        pool = run.get_pool()
        spec = a.child_spec(h)
        wids = list(range(P))
        pool.attach(wids, spec)
        attached = True

        def round_(n: int, timeout: float) -> dict[str, Any]:
            with watchdog(_cell_limit(run), f"{a.label} reset counter"):
                with h.lock:
                    h.m[KEY] = 0
            start = pc_ns() + 40_000_000  # every worker starts at the same instant
            for w in wids:
                pool.send(w, ("incr", h.name, KEY, n, start))
            answers = pool.gather(P, timeout, kinds=("incr",))
            t0 = min(p[0] for _, _, p in answers)
            t1 = max(p[1] for _, _, p in answers)
            with watchdog(_cell_limit(run), f"{a.label} final count"):
                final = h.m[KEY]
            span = (t1 - t0) / 1e9
            return {
                "ops": P * n,
                "seconds": span,
                "final": final,
                "exact": final == P * n,
                "per_worker_s": [round((p[1] - p[0]) / 1e9, 6) for _, _, p in answers],
            }

        n_cal = max(5, int(base * run.box * 0.15 / P))
        cal = round_(n_cal, timeout=120 + 200 * P * n_cal / max(base, 1.0))
        agg = cal["ops"] / cal["seconds"] if cal["seconds"] > 0 else base
        n = max(5, int(agg * run.box / P))
        raw = []
        for _ in range(run.repeat):
            raw.append(round_(n, timeout=120 + 50 * P * n / max(agg, 1.0)))
        exact_all = cal["exact"] and all(r["exact"] for r in raw)
        show = {"count": "exact" if exact_all else "MISMATCH"}
        if not exact_all:
            bad = [r for r in [cal, *raw] if not r["exact"]]
            lost = [r["ops"] - r["final"] for r in bad]
            show["count"] = f"MISMATCH in {len(bad)}/{len(raw) + 1} rounds (lost {min(lost)}..{max(lost)})"
            run.alert(
                f"{a.label}: {case}: final count wrong in {len(bad)} of {len(raw) + 1} rounds, "
                f"e.g. {bad[0]['final']} instead of {bad[0]['ops']} (lost updates)"
            )
        run.record(
            "contend",
            case,
            a.key,
            unit="ops/s",
            better="higher",
            values=[r["ops"] / r["seconds"] for r in raw if r["seconds"] > 0],
            raw=[cal, *raw],
            ok=exact_all,
            show=show,
            params={"ops_per_worker": n, "processes": P, "calibration_round": 0},
        )
    except WorkerError as exc:
        if exc.fatal:
            run.drop_pool()
            attached = False
        run.fail("contend", case, a.key, exc, unit="ops/s", better="higher")
    except Exception as exc:
        run.fail("contend", case, a.key, exc, unit="ops/s", better="higher")
    finally:
        if attached and run.pool is not None:
            try:
                run.pool.detach(list(range(P)), h.name)
            except Exception:
                run.drop_pool()
        _safe_destroy(run, a, h)


def w_contend(run: Run, adapters: list[Adapter]) -> None:
    for P in (2, 4):
        case = f"{P} processes"
        for a in adapters:
            log(f"  contend: {a.label}, {P} workers")
            if a.cross_process:
                _contend_procs(run, a, P, case)
            else:
                try:
                    _contend_threads(run, a, P, case)
                except Exception as exc:
                    run.fail("contend", case, a.key, exc, unit="ops/s", better="higher")
    run.note(
        "aggregate = total increments / (last worker's end - first worker's start); every "
        "round starts with the counter at 0 and checks the exact final count; the first "
        "round sizes the op count and is not in the rates (its count is checked)",
        "contend",
    )
    if any(not a.cross_process for a in adapters):
        run.note(
            "dict: cannot be shared between processes; its row uses threads in one process "
            "(threading.Lock) as the ceiling",
            "contend",
        )


# -- 5: visibility latency -------------------------------------------------------------------


def w_latency(run: Run, adapters: list[Adapter]) -> None:
    samples = 60 if run.quick else 200
    stop = -1
    for a in adapters:
        case = "write -> seen"
        if not a.cross_process:
            run.record(
                "latency",
                case,
                a.key,
                unit="s",
                better="lower",
                values=[],
                skipped="cannot be shared between processes",
            )
            continue
        log(f"  latency: {a.label}")
        psm_before = _psm() if a.uses_mp_shm else None
        try:
            _latency_one(run, a, case, samples, stop)
        finally:
            if psm_before is not None:
                run.psm_suspects |= _psm() - psm_before
    run.note(
        f"{samples} writes per repetition, 0.5-1.5 ms apart; latency = reader's "
        "perf_counter_ns when it first sees the value - the writer's perf_counter_ns taken "
        "just before the write call (CLOCK_MONOTONIC, common to all processes); median of "
        "each repetition, p99 over all of them; 'seen' < total means a value was "
        "overwritten before the reader saw it",
        "latency",
    )


def _latency_one(run: Run, a: Adapter, case: str, samples: int, stop: int) -> None:
    h = None
    attached = False
    try:
        with watchdog(_cell_limit(run), f"{a.label} latency setup"):
            h = a.create()
            h.m[KEY] = 0
        pool = run.get_pool()
        pool.attach([0], a.child_spec(h))
        attached = True
        pool.send(0, ("poll", h.name, KEY, stop, 600.0))
        pool.gather(1, 120, kinds=("ready",))
        m = h.m
        rnd = random.Random(1)
        stamps: list[list[int]] = []
        with watchdog(_cell_limit(run) + samples * run.repeat * 0.05, f"{a.label} latency"):
            for _ in range(run.repeat):
                batch = []
                for _ in range(samples):
                    time.sleep(rnd.uniform(0.0005, 0.0015))
                    ts = pc_ns()
                    m[KEY] = ts
                    batch.append(ts)
                stamps.append(batch)
            m[KEY] = stop
        _, _, (seen, read_errors) = pool.gather(1, 120, kinds=("seen",))[0]
        seen_at = dict(seen)
        per_rep = []
        raw = []
        pooled: list[float] = []
        for batch in stamps:
            lat = [(seen_at[ts] - ts) / 1e9 for ts in batch if ts in seen_at]
            pooled.extend(lat)
            per_rep.append(summarize(lat)["median"])
            raw.append(
                {
                    "samples": len(batch),
                    "seen": len(lat),
                    "median_s": summarize(lat)["median"],
                    "p99_s": percentile(lat, 99),
                    "max_s": max(lat) if lat else None,
                }
            )
        missed = sum(r["samples"] - r["seen"] for r in raw)
        show = {
            "p99": fmt_seconds(percentile(pooled, 99)),
            "seen": f"{sum(r['seen'] for r in raw)}/{samples * run.repeat}",
        }
        if read_errors:
            show["read errors"] = str(len(read_errors))
            run.alert(
                f"{a.label}: the polling reader got {len(read_errors)} exception(s) while "
                f"the parent wrote, e.g. {read_errors[0]}"
            )
        run.record(
            "latency",
            case,
            a.key,
            unit="s",
            better="lower",
            values=[v for v in per_rep if v is not None],
            raw=raw,
            show=show,
            params={
                "samples_per_rep": samples,
                "missed": missed,
                "p99_pooled_s": percentile(pooled, 99),
                "read_errors": read_errors[:20],
            },
        )
    except WorkerError as exc:
        if exc.fatal or attached:  # a reader that failed mid-poll is not reusable
            run.drop_pool()
            attached = False
        run.fail("latency", case, a.key, exc, unit="s", better="lower")
    except Exception as exc:
        run.fail("latency", case, a.key, exc, unit="s", better="lower")
        if attached:  # the reader may still be polling: it cannot be reused
            run.drop_pool()
            attached = False
    finally:
        if attached and run.pool is not None:
            try:
                run.pool.detach([0], h.name)
            except Exception:
                run.drop_pool()
        _safe_destroy(run, a, h)


# -- 6 + 7: sized dicts ------------------------------------------------------------------------


def attach_sizes(run: Run) -> list[int]:
    return [1_000, 100_000] if run.quick else [1_000, 100_000, 1_000_000]


def growth_sizes(run: Run) -> list[int]:
    return [1_000, 100_000] if run.quick else [1_000, 10_000, 100_000, 1_000_000]


def _keys_loop_read(h: Handle, keys: list[Any]) -> Callable[[int], float]:
    m = h.m
    L = len(keys)

    def loop(n: int) -> float:
        full, rest = divmod(n, L)
        tail = keys[:rest]
        with no_gc():
            t0 = pc()
            for _ in range(full):
                for k in keys:
                    m[k]
            for k in tail:
                m[k]
            t1 = pc()
        return t1 - t0

    return loop


def _keys_loop_write(h: Handle, pairs: list[tuple[Any, Any]]) -> Callable[[int], float]:
    m = h.m
    L = len(pairs)

    def loop(n: int) -> float:
        full, rest = divmod(n, L)
        tail = pairs[:rest]
        with no_gc():
            t0 = pc()
            for _ in range(full):
                for k, v in pairs:
                    m[k] = v
            for k, v in tail:
                m[k] = v
            t1 = pc()
        return t1 - t0

    return loop


def _probe(run: Run, a: Adapter, h: Handle, expected: Any) -> dict[str, Any]:
    """One fresh spawned process: attach + first read."""
    q = run.ctx.Queue()
    inherit: dict[str, Any] = {}
    for ad in run.adapters.values():
        inherit.update(ad.inheritables())
    p = run.ctx.Process(
        target=attach_probe,
        name="perf-attach-probe",
        args=(a.child_spec(h), KEY, expected, inherit, run.preload_modules if a.uses_mp_shm else [], q),
        daemon=True,
    )
    run.children.append(p)
    try:
        p.start()
        try:
            kind, payload = q.get(timeout=180)
        except Exception:
            raise WorkerError("the attach probe did not answer within 180 s") from None
        if kind != "probe":
            raise WorkerError(f"attach probe: {payload}")
        return payload
    finally:
        run.reap(p, 30)
        run.children.remove(p)
        q.close()
        q.join_thread()


def w_sized(run: Run, adapters: list[Adapter], do_attach: bool, do_growth: bool) -> None:
    sizes = sorted(set((attach_sizes(run) if do_attach else []) + (growth_sizes(run) if do_growth else [])))
    largest_growth = max(growth_sizes(run))
    for size in sizes:
        label = fmt_count(size) + " keys"
        log(f"  sized dicts: seeding {label}")
        initial = {i: str(i) for i in range(size)}
        handles: dict[str, Handle] = {}
        try:
            for a in adapters:
                try:
                    t0 = pc()
                    with watchdog(900, f"{a.label} seeding {label}"):
                        handles[a.key] = a.create(initial=initial)
                    log(f"    {a.label}: seeded in {pc() - t0:.2f} s")
                    if a.key == "smd":
                        run.note(
                            f"shared-memory-dict: size={handles[a.key].extra['size']:,} bytes "
                            f"for {label} (1.5x its pickled dict + 64 KiB; it needs a fixed "
                            "size)",
                            "growth" if do_growth else "attach",
                        )
                except Exception as exc:
                    for wl, unit in (("attach", "s"), ("growth", "s/op")):
                        if (wl == "attach" and do_attach and size in attach_sizes(run)) or (
                            wl == "growth" and do_growth and size in growth_sizes(run)
                        ):
                            run.fail(wl, label, a.key, exc, unit=unit, better="lower")
            if do_attach and size in attach_sizes(run):
                _attach(run, [a for a in adapters if a.key in handles], handles, size, label)
            if do_growth and size in growth_sizes(run):
                _growth(
                    run,
                    [a for a in adapters if a.key in handles],
                    handles,
                    size,
                    label,
                    size == largest_growth,
                )
        finally:
            for a in adapters:
                _safe_destroy(run, a, handles.pop(a.key, None))
            del initial
            gc.collect()


def _attach(run: Run, adapters: list[Adapter], handles: dict[str, Handle], size: int, label: str) -> None:
    raws: dict[str, list[dict[str, Any]]] = {a.key: [] for a in adapters}
    failed: dict[str, str] = {}
    for a in adapters:
        if not a.cross_process:
            run.record(
                "attach",
                label,
                a.key,
                unit="s",
                better="lower",
                values=[],
                skipped="cannot be opened from another process",
            )
            failed[a.key] = "skip"
    for rep in range(run.repeat):
        for a in adapters:
            if a.key in failed:
                continue
            log(f"  attach {label}: {a.label} (rep {rep + 1})")
            try:
                raws[a.key].append(_probe(run, a, handles[a.key], str(KEY)))
            except Exception as exc:
                failed[a.key] = "fail"
                run.fail("attach", label, a.key, exc, unit="s", better="lower")
    for a in adapters:
        if a.key in failed:
            continue
        raw = raws[a.key]
        ok = all(r["value_ok"] for r in raw)
        show = {
            "attach": fmt_seconds(summarize([r["attach"] for r in raw])["median"]),
            "1st read": fmt_seconds(summarize([r["first_read"] for r in raw])["median"]),
        }
        if a.server_based:
            show["note"] = "server: nothing loaded"
        if not ok:
            show["value"] = "WRONG VALUE"
            run.alert(f"{a.label}: attach {label}: the first read returned a wrong value")
        run.record(
            "attach",
            label,
            a.key,
            unit="s",
            better="lower",
            values=[r["total"] for r in raw],
            raw=raw,
            ok=ok,
            show=show,
        )


def _growth(
    run: Run, adapters: list[Adapter], handles: dict[str, Handle], size: int, label: str, largest: bool
) -> None:
    rnd = random.Random(size)
    L = 65_536
    keys = [rnd.randrange(size) for _ in range(L)]
    pairs = [(k, str(rnd.randrange(10 * size))) for k in keys]
    for kind in ("read", "write"):
        cells = []
        for a in adapters:
            h = handles[a.key]
            try:
                with watchdog(_cell_limit(run) * 3, f"{a.label} growth {kind} calibration"):
                    if kind == "read":
                        loop = _keys_loop_read(h, keys)
                        n = calibrate(loop, run.box)
                        min_n = 1
                    else:
                        loop = _keys_loop_write(h, pairs)
                        min_n = a.min_writes(h, run.quick)
                        n = max(min_n, calibrate(loop, run.box))
                cells.append({"a": a, "loop": loop, "n": n, "raw": [], "min": min_n, "failed": False})
            except Exception as exc:
                run.fail("growth", f"{kind} {label}", a.key, exc, unit="s/op", better="lower")
        for rep in range(run.repeat):
            for c in cells:
                if c["failed"]:
                    continue
                log(f"  growth {kind} {label}: {c['a'].label} (rep {rep + 1}, {c['n']} ops)")
                try:
                    with watchdog(_cell_limit(run) * 3, f"{c['a'].label} growth {kind}"):
                        dt = c["loop"](c["n"])
                    c["raw"].append({"ops": c["n"], "seconds": dt})
                except Exception as exc:
                    c["failed"] = True
                    run.fail("growth", f"{kind} {label}", c["a"].key, exc, unit="s/op", better="lower")
        for c in cells:
            if c["failed"]:
                continue
            show = {"ops/rep": fmt_count(c["n"]) if c["n"] >= 1000 else str(c["n"])}
            if c["min"] > 1:
                show["ops/rep"] += f" (>= {c['min']} for dumps)"
            run.record(
                "growth",
                f"{kind} {label}",
                c["a"].key,
                unit="s/op",
                better="lower",
                values=[r["seconds"] / r["ops"] for r in c["raw"]],
                raw=c["raw"],
                show=show,
                params={"size": size, "kind": kind, "ops_per_rep": c["n"], "min_ops_for_dumps": c["min"]},
            )
    if largest:
        _dump_load(run, adapters, handles, size, label)


def _dump_load(run: Run, adapters: list[Adapter], handles: dict[str, Handle], size: int, label: str) -> None:
    for a in adapters:
        h = handles[a.key]
        try:
            if a.key == "ultradict_ng":
                raw = []
                for _ in range(run.repeat):
                    with watchdog(600, "ultradict_ng fresh handle"):
                        t0 = pc()
                        h2 = a.open_second(h)
                        h2.m[KEY]
                        t1 = pc()
                        a.close_second(h2)
                    raw.append({"seconds": t1 - t0})
                run.record(
                    "growth",
                    f"load {label}: fresh handle",
                    a.key,
                    unit="s",
                    better="lower",
                    values=[r["seconds"] for r in raw],
                    raw=raw,
                    show={"what": "SharedDict(name) + first read, in-process"},
                )
            elif a.key in ("ultradict_shared", "ultradict"):
                dumps, loads = [], []
                for _ in range(run.repeat):
                    with watchdog(600, f"{a.label} dump/load"):
                        t0 = pc()
                        h.m.dump()
                        t1 = pc()
                        h.m.load(force=True)
                        t2 = pc()
                    dumps.append({"seconds": t1 - t0})
                    loads.append({"seconds": t2 - t1})
                run.record(
                    "growth",
                    f"load {label}: dump()",
                    a.key,
                    unit="s",
                    better="lower",
                    values=[r["seconds"] for r in dumps],
                    raw=dumps,
                )
                run.record(
                    "growth",
                    f"load {label}: load(force=True)",
                    a.key,
                    unit="s",
                    better="lower",
                    values=[r["seconds"] for r in loads],
                    raw=loads,
                )
        except Exception as exc:
            run.fail("growth", f"load {label}", a.key, exc, unit="s", better="lower")
    run.note(
        f"load/dump at {label}: ultradict_ng = a fresh handle attaching and reading once "
        "(its dump happens inside the write that overflows the stream and is amortized in "
        "the write cost above); UltraDict = its dump() and load(force=True); "
        "shared-memory-dict loads/dumps the whole dict on every op (see its read/write "
        "cost); Manager, redis and dict have no such notion",
        "growth",
    )


def w_attach(run: Run, adapters: list[Adapter]) -> None:
    w_sized(run, adapters, True, False)


def w_growth(run: Run, adapters: list[Adapter]) -> None:
    w_sized(run, adapters, False, True)


# -- 8: large values ----------------------------------------------------------------------------


def value_sizes(run: Run) -> list[int]:
    return [1_000, 1_000_000] if run.quick else [1_000, 1_000_000, 100_000_000]


def _size_label(n: int) -> str:
    return {1_000: "1 KB", 1_000_000: "1 MB", 100_000_000: "100 MB"}.get(n, f"{n} B")


def _values_loop(w: Handle, r: Handle, value: Any) -> tuple[Callable[[int], float], list[float]]:
    wm, rm = w.m, r.m
    acc = [0.0, 0.0]

    def loop(n: int) -> float:
        tw = tr = 0.0
        with no_gc():
            for _ in range(n):
                t0 = pc()
                wm[KEY] = value
                t1 = pc()
                rm[KEY]
                t2 = pc()
                tw += t1 - t0
                tr += t2 - t1
        acc[0], acc[1] = tw, tr
        return tw + tr

    return loop, acc


def w_values(run: Run, adapters: list[Adapter]) -> None:
    for size in value_sizes(run):
        label = _size_label(size)
        value = os.urandom(size)
        big = size >= 50_000_000
        groups = [[a] for a in adapters] if big else [adapters]  # big values: one at a time
        for group in groups:
            cells = []
            try:
                for a in group:
                    h = h2 = None
                    try:
                        try:
                            with watchdog(_cell_limit(run) * 4, f"{a.label} values {label} setup"):
                                h = a.create(fit_bytes=size)
                                h2 = a.open_second(h)
                                loop, acc = _values_loop(h, h2, value)
                                n = calibrate(loop, run.box)
                        except Exception as exc:
                            why = a.fallback(size)  # e.g. UltraDict: full_dump_size
                            if why is None:
                                raise
                            run.note(f"{why} (the default settings raised {exc!r})", "values")
                            if h2 is not None and h2 is not h:
                                a.close_second(h2)
                            _safe_destroy(run, a, h)
                            h = h2 = None
                            with watchdog(_cell_limit(run) * 4, f"{a.label} values {label} setup"):
                                h = a.create(fit_bytes=size)
                                h2 = a.open_second(h)
                                loop, acc = _values_loop(h, h2, value)
                                n = calibrate(loop, run.box)
                        if a.key == "smd":
                            run.note(
                                f"shared-memory-dict: size={h.extra['size']:,} bytes for "
                                f"{label} values (it needs a fixed size)",
                                "values",
                            )
                        cells.append(
                            {
                                "a": a,
                                "h": h,
                                "h2": h2,
                                "loop": loop,
                                "acc": acc,
                                "n": n,
                                "raw": [],
                                "failed": False,
                            }
                        )
                    except Exception as exc:
                        for kind in ("write", "read"):
                            run.fail("values", f"{label} {kind}", a.key, exc, unit="GB/s", better="higher")
                        if h2 is not None and h2 is not h:
                            try:
                                a.close_second(h2)
                            except Exception:
                                pass
                        _safe_destroy(run, a, h)
                for rep in range(run.repeat):
                    for c in cells:
                        if c["failed"]:
                            continue
                        log(f"  values {label}: {c['a'].label} (rep {rep + 1}, {c['n']} ops)")
                        try:
                            with watchdog(_cell_limit(run) * 4, f"{c['a'].label} values {label}"):
                                c["loop"](c["n"])
                            c["raw"].append(
                                {"ops": c["n"], "bytes": size, "write_s": c["acc"][0], "read_s": c["acc"][1]}
                            )
                        except Exception as exc:
                            c["failed"] = True
                            for kind in ("write", "read"):
                                run.fail(
                                    "values", f"{label} {kind}", c["a"].key, exc, unit="GB/s", better="higher"
                                )
                for c in cells:
                    if c["failed"]:
                        continue
                    a = c["a"]
                    try:
                        got = c["h2"].m[KEY]
                        ok = got == value
                    except Exception as exc:
                        ok = False
                        run.alert(f"{a.label}: values {label}: final read failed: {exc!r}")
                    if not ok:
                        run.alert(f"{a.label}: values {label}: the second handle read a wrong value")
                    for kind in ("write", "read"):
                        vals = [
                            r["ops"] * size / r[f"{kind}_s"] / 1e9 for r in c["raw"] if r[f"{kind}_s"] > 0
                        ]
                        run.record(
                            "values",
                            f"{label} {kind}",
                            a.key,
                            unit="GB/s",
                            better="higher",
                            values=vals,
                            raw=c["raw"],
                            ok=ok,
                            params={"value_bytes": size, "ops_per_rep": c["n"]},
                            show={} if ok else {"value": "WRONG"},
                        )
            finally:
                for c in cells:
                    a = c["a"]
                    if c["h2"] is not c["h"]:
                        try:
                            a.close_second(c["h2"])
                        except Exception:
                            pass
                    _safe_destroy(run, a, c["h"])
                gc.collect()
        del value
    for a in adapters:
        if a.key in ("ultradict", "ultradict_shared") and not getattr(a, "full_dump_size", None):
            run.note(
                f"{a.label}: ran with its defaults at every value size (buffer_size=10_000, "
                "no full_dump_size: values larger than the buffer go to a dynamic full-dump "
                "segment, created per write)",
                "values",
            )
    run.note(
        "each op: writer handle m[k] = value (timed as write), then a second handle in the "
        "same process reads it (timed as read: for caching contenders this includes "
        "fetching the new value); values are random bytes; dict's 'second handle' is the "
        "same dict (ceiling)",
        "values",
    )


RUNNERS: dict[str, Callable[[Run, list[Adapter]], None]] = {
    "read": w_read,
    "write": w_write,
    "lock": w_lock,
    "contend": w_contend,
    "latency": w_latency,
    "attach": w_attach,
    "growth": w_growth,
    "values": w_values,
    "big": w_big,
    "wakeup": w_wake,
}
