"""Workloads 1-8, each written once against :class:`perf.adapters.Handle`.

Every timed loop has the same shape for every contender (``m[k]``, ``m[k] = i``,
``with lock: m[k] += 1``, with ``m`` and ``lock`` bound to locals first); the
cyclic GC is off inside timed loops, as in :mod:`timeit`.  Op counts are chosen
so one repetition loops for about ``run.box`` seconds; repetitions of different
contenders are interleaved so that machine noise is spread over all of them.
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
from .procs import attach_probe
from .registry import Target, Workload, pick, register
from .run import Run, WorkerError
from .util import calibrate, fmt_count, fmt_rate, fmt_seconds, log, no_gc, percentile, shm_entries, watchdog
from .util import summarize as _summarize

pc = time.perf_counter
pc_ns = time.perf_counter_ns
Loop = Callable[[int], float]

KEY = 0
#: Each workload's unit and which way is better.
UNITS = {
    "read": ("ops/s", "higher"),
    "write": ("ops/s", "higher"),
    "lock": ("ops/s", "higher"),
    "contend": ("ops/s", "higher"),
    "latency": ("s", "lower"),
    "attach": ("s", "lower"),
    "growth": ("s/op", "lower"),
    "values": ("GB/s", "higher"),
}


def _rec(run: Run, wl: str, case: str, key: str, values: list[float], **kw: Any) -> dict[str, Any]:
    unit = kw.pop("unit", UNITS[wl][0])
    return run.record(wl, case, key, unit=unit, better=UNITS[wl][1], values=values, **kw)


def _fail(run: Run, wl: str, case: str, key: str, exc: BaseException, unit: Optional[str] = None) -> None:
    run.fail(wl, case, key, exc, unit=unit or UNITS[wl][0], better=UNITS[wl][1])


def _median(values: list[float]) -> Optional[float]:
    return _summarize(values)["median"]


def _safe_destroy(run: Run, a: Adapter, h: Optional[Handle]) -> None:
    if h is None:
        return
    try:
        with watchdog(120, f"destroying {a.label}"):
            a.destroy(h)
    except Exception as exc:
        run.alert(f"{a.label}: cleanup of {h.name} failed: {exc!r} (retried at the end)")


def _close_second(a: Adapter, h: Optional[Handle], h2: Optional[Handle]) -> None:
    if h2 is not None and h2 is not h:
        try:
            a.close_second(h2)
        except Exception:
            pass


def _cell_limit(run: Run) -> float:
    """Watchdog limit of one measurement (generous: catches hangs, not slowness)."""
    return 120.0 + 50 * run.box


def _interleave(run: Run, wl: str, cells: list[dict[str, Any]], what: str, limit: float) -> None:
    """``run.repeat`` rounds of every cell's ``loop(n)``, cells interleaved; a failing cell drops out.

    A cell is a dict with ``a`` (adapter), ``loop``, ``n``, ``cases`` (recorded as
    failed on an exception) and ``raw``; ``extra()`` adds to each raw entry.
    """
    for rep in range(run.repeat):
        for c in (c for c in cells if not c.get("failed")):
            if wl in ("growth", "values"):
                log(f"  {wl} {what}: {c['a'].label} (rep {rep + 1}, {c['n']} ops)")
            try:
                with watchdog(limit, f"{c['a'].label} {wl} {what}"):
                    dt = c["loop"](c["n"])
                c["raw"].append({"ops": c["n"], "seconds": dt, **(c["extra"]() if "extra" in c else {})})
            except Exception as exc:
                c["failed"] = True
                for case in c["cases"]:
                    _fail(run, wl, case, c["a"].key, exc)


# -- loops --------------------------------------------------------------------------------


def read_loop(h: Handle, k: Any = KEY) -> Loop:
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


def write_loop(h: Handle, k: Any = KEY) -> Loop:
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


def lock_loop(h: Handle, k: Any = KEY) -> Loop:
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

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.total = 0

    def __call__(self, n: int) -> float:
        dt = self.loop(n)
        self.total += n
        return dt


# -- 1-3: one process ------------------------------------------------------------------------


def _inproc(
    run: Run, wl: str, adapters: list[Adapter], case: str, make_loop: Callable[[Handle], Loop], check: bool
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
                cells.append({"a": a, "h": h, "loop": loop, "n": n, "raw": [], "cases": [case]})
            except Exception as exc:
                _fail(run, wl, case, a.key, exc)
                _safe_destroy(run, a, h)
        _interleave(run, wl, cells, case, _cell_limit(run))
        for c in (c for c in cells if not c.get("failed")):
            a, total = c["a"], c["loop"].total
            show: dict[str, str] = {}
            ok = None
            if check:
                try:
                    with watchdog(60, f"{a.label} final count"):
                        final = c["h"].m[KEY]
                    ok = final == total
                    show["count"] = "exact" if ok else f"MISMATCH {final} != {total}"
                    if not ok:
                        run.alert(
                            f"{a.label}: workload {wl}: final count {final}, expected {total} (lost updates)"
                        )
                except Exception as exc:
                    show["count"] = f"unreadable: {exc!r}"
                    ok = False
            values = [r["ops"] / r["seconds"] for r in c["raw"] if r["seconds"] > 0]
            _rec(run, wl, case, a.key, values, raw=c["raw"], show=show, ok=ok, params={"ops_per_rep": c["n"]})
            if wl == "lock" and values:
                run.single_lock_rate[a.key] = _median(values) or 0.0
    finally:
        for c in cells:
            _safe_destroy(run, c["a"], c["h"])


def w_read(run: Run, adapters: list[Adapter]) -> None:
    _inproc(run, "read", adapters, "hot key", read_loop, False)


def w_write(run: Run, adapters: list[Adapter]) -> None:
    _inproc(run, "write", adapters, "single key", write_loop, False)


def w_lock(run: Run, adapters: list[Adapter]) -> None:
    _inproc(run, "lock", adapters, "1 process", lock_loop, True)
    redis = next((a for a in adapters if a.key == "redis"), None)
    if redis is None:
        return
    try:
        key = run.new_name() + ":incr"
        loop = redis.incr_loop(key)
        n = calibrate(loop, run.box)
        raw = [{"ops": n, "seconds": loop(n)} for _ in range(run.repeat)]
        redis.client.delete(key)
        vals = [r["ops"] / r["seconds"] for r in raw]
        _rec(run, "lock", "1 process", "redis:INCR", vals, raw=raw, note_only=True)
        run.note(
            "redis INCR (one atomic server-side command; not the same shape as lock + GET + SET): "
            f"{fmt_rate(_median(vals))} ops/s median",
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


def _sized_rounds(
    run: Run, P: int, base: float, least: int, round_: Callable[[int, float], dict[str, Any]]
) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    """A calibration round sizes the op count for ``run.box``; then ``run.repeat`` rounds."""
    n_cal = max(least, int(base * run.box * 0.15 / P))
    cal = round_(n_cal, 120 + 200 * P * n_cal / max(base, 1.0))
    agg = cal["ops"] / cal["seconds"] if cal["seconds"] > 0 else base
    n = max(least, int(agg * run.box / P))
    return n, cal, [round_(n, 120 + 50 * P * n / max(agg, 1.0)) for _ in range(run.repeat)]


def _contend_threads(run: Run, a: Adapter, P: int, case: str) -> None:
    """The plain dict cannot cross processes: its ceiling uses P threads and a threading.Lock."""
    h = a.create()
    try:
        m, lock = h.m, h.lock

        def round_(n: int, timeout: float) -> dict[str, Any]:
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
            return {"ops": P * n, "seconds": span, "final": m[KEY], "exact": m[KEY] == P * n}

        n, _, raw = _sized_rounds(run, P, _base_lock_rate(run, a, h), 10, round_)
        exact = all(r["exact"] for r in raw)
        show = {"count": "exact" if exact else "MISMATCH", "how": f"{P} threads"}
        values = [r["ops"] / r["seconds"] for r in raw]
        params = {"ops_per_worker": n, "threads": P}
        _rec(run, "contend", case, a.key, values, raw=raw, ok=exact, show=show, params=params)
    finally:
        a.destroy(h)


def _psm() -> set[str]:
    return {e for e in shm_entries() if e.startswith("psm_")}


def _contend_procs(run: Run, a: Adapter, P: int, case: str) -> None:
    h = None
    attached = False
    psm_before = _psm() if a.uses_mp_shm else None
    try:
        with watchdog(_cell_limit(run), f"{a.label} contend setup"):
            h = a.create()
            with h.lock:
                h.m[KEY] = 0
            base = _base_lock_rate(run, a, h)
        pool = run.get_pool()
        wids = list(range(P))
        pool.attach(wids, a.child_spec(h))
        attached = True

        def round_(n: int, timeout: float) -> dict[str, Any]:
            with watchdog(_cell_limit(run), f"{a.label} reset counter"):
                with h.lock:
                    h.m[KEY] = 0
            start = pc_ns() + 40_000_000  # every worker starts at the same instant
            for w in wids:
                pool.send(w, ("incr", h.name, KEY, n, start))
            answers = pool.gather(P, timeout, kinds=("incr",))
            with watchdog(_cell_limit(run), f"{a.label} final count"):
                final = h.m[KEY]
            return {
                "ops": P * n,
                "seconds": (max(p[1] for _, _, p in answers) - min(p[0] for _, _, p in answers)) / 1e9,
                "final": final,
                "exact": final == P * n,
                "per_worker_s": [round((p[1] - p[0]) / 1e9, 6) for _, _, p in answers],
            }

        n, cal, raw = _sized_rounds(run, P, base, 5, round_)
        bad = [r for r in [cal, *raw] if not r["exact"]]
        show = {"count": "exact"}
        if bad:
            lost = [r["ops"] - r["final"] for r in bad]
            show["count"] = f"MISMATCH in {len(bad)}/{len(raw) + 1} rounds (lost {min(lost)}..{max(lost)})"
            run.alert(
                f"{a.label}: {case}: final count wrong in {len(bad)} of {len(raw) + 1} rounds, "
                f"e.g. {bad[0]['final']} instead of {bad[0]['ops']} (lost updates)"
            )
        values = [r["ops"] / r["seconds"] for r in raw if r["seconds"] > 0]
        params = {"ops_per_worker": n, "processes": P, "calibration_round": 0}
        _rec(run, "contend", case, a.key, values, raw=[cal, *raw], ok=not bad, show=show, params=params)
    except Exception as exc:
        if isinstance(exc, WorkerError) and exc.fatal:
            run.drop_pool()
            attached = False
        _fail(run, "contend", case, a.key, exc)
    finally:
        if attached and run.pool is not None and h is not None:
            try:
                run.pool.detach(list(range(P)), h.name)
            except Exception:
                run.drop_pool()
        _safe_destroy(run, a, h)
        if psm_before is not None:
            run.psm_suspects |= _psm() - psm_before


def w_contend(run: Run, adapters: list[Adapter]) -> None:
    for P in (2, 4):
        case = f"{P} processes"
        for a in adapters:
            log(f"  contend: {a.label}, {P} workers")
            try:
                (_contend_procs if a.cross_process else _contend_threads)(run, a, P, case)
            except Exception as exc:
                _fail(run, "contend", case, a.key, exc)
    run.note(
        "aggregate = total increments / (last worker's end - first worker's start); every round starts "
        "with the counter at 0 and checks the exact final count; the first round sizes the op count "
        "and is not in the rates (its count is checked)",
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
    for a in adapters:
        if not a.cross_process:
            _rec(run, "latency", "write -> seen", a.key, [], skipped="cannot be shared between processes")
            continue
        log(f"  latency: {a.label}")
        psm_before = _psm() if a.uses_mp_shm else None
        try:
            _latency_one(run, a, "write -> seen", samples, -1)
        finally:
            if psm_before is not None:
                run.psm_suspects |= _psm() - psm_before
    run.note(
        f"{samples} writes per repetition, 0.5-1.5 ms apart; latency = reader's perf_counter_ns when it "
        "first sees the value - the writer's perf_counter_ns taken just before the write call "
        "(CLOCK_MONOTONIC, common to all processes); median of each repetition, p99 over all of them; "
        "'seen' < total means a value was overwritten before the reader saw it",
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
        raw = []
        pooled: list[float] = []
        for batch in stamps:
            lat = [(seen_at[ts] - ts) / 1e9 for ts in batch if ts in seen_at]
            pooled.extend(lat)
            raw.append(
                {
                    "samples": len(batch),
                    "seen": len(lat),
                    "median_s": _median(lat),
                    "p99_s": percentile(lat, 99),
                    "max_s": max(lat) if lat else None,
                }
            )
        show = {
            "p99": fmt_seconds(percentile(pooled, 99)),
            "seen": f"{sum(r['seen'] for r in raw)}/{samples * run.repeat}",
        }
        if read_errors:
            show["read errors"] = str(len(read_errors))
            run.alert(
                f"{a.label}: the polling reader got {len(read_errors)} exception(s) while the parent "
                f"wrote, e.g. {read_errors[0]}"
            )
        params = {
            "samples_per_rep": samples,
            "missed": sum(r["samples"] - r["seen"] for r in raw),
            "p99_pooled_s": percentile(pooled, 99),
            "read_errors": read_errors[:20],
        }
        values = [r["median_s"] for r in raw if r["median_s"] is not None]
        _rec(run, "latency", case, a.key, values, raw=raw, show=show, params=params)
    except Exception as exc:
        # A reader that failed or may still be polling is not reusable.
        if attached or (isinstance(exc, WorkerError) and exc.fatal):
            run.drop_pool()
            attached = False
        _fail(run, "latency", case, a.key, exc)
    finally:
        if attached and run.pool is not None and h is not None:
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


def _keys_loop_read(h: Handle, keys: list[Any]) -> Loop:
    m = h.m

    def loop(n: int) -> float:
        full, rest = divmod(n, len(keys))
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


def _keys_loop_write(h: Handle, pairs: list[tuple[Any, Any]]) -> Loop:
    m = h.m

    def loop(n: int) -> float:
        full, rest = divmod(n, len(pairs))
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
    inherit: dict[str, Any] = {}
    for ad in run.adapters.values():
        inherit.update(ad.inheritables())
    preload = run.preload_modules if a.uses_mp_shm else []
    got = run.call(attach_probe, a.child_spec(h), KEY, expected, inherit, preload, timeout=180)
    if "error" in got:
        raise WorkerError(f"attach probe: {got['error']}")
    return got


def w_sized(run: Run, adapters: list[Adapter], do_attach: bool, do_growth: bool) -> None:
    at = attach_sizes(run) if do_attach else []
    gr = growth_sizes(run) if do_growth else []
    for size in sorted(set(at + gr)):
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
                            f"shared-memory-dict: size={handles[a.key].extra['size']:,} bytes for {label} "
                            "(1.5x its pickled dict + 64 KiB; it needs a fixed size)",
                            "growth" if do_growth else "attach",
                        )
                except Exception as exc:
                    for wl, sizes in (("attach", at), ("growth", gr)):
                        if size in sizes:
                            _fail(run, wl, label, a.key, exc, unit="s" if wl == "attach" else "s/op")
            seeded = [a for a in adapters if a.key in handles]
            if size in at:
                _attach(run, seeded, handles, label)
            if size in gr:
                _growth(run, seeded, handles, size, label)
                if size == max(gr):
                    _dump_load(run, seeded, handles, label)
        finally:
            for a in adapters:
                _safe_destroy(run, a, handles.pop(a.key, None))
            del initial
            gc.collect()


def _attach(run: Run, adapters: list[Adapter], handles: dict[str, Handle], label: str) -> None:
    raws: dict[str, list[dict[str, Any]]] = {a.key: [] for a in adapters}
    failed = set()
    for a in adapters:
        if not a.cross_process:
            _rec(run, "attach", label, a.key, [], skipped="cannot be opened from another process")
            failed.add(a.key)
    for rep in range(run.repeat):
        for a in (a for a in adapters if a.key not in failed):
            log(f"  attach {label}: {a.label} (rep {rep + 1})")
            try:
                raws[a.key].append(_probe(run, a, handles[a.key], str(KEY)))
            except Exception as exc:
                failed.add(a.key)
                _fail(run, "attach", label, a.key, exc)
    for a in (a for a in adapters if a.key not in failed):
        raw = raws[a.key]
        ok = all(r["value_ok"] for r in raw)
        show = {
            "attach": fmt_seconds(_median([r["attach"] for r in raw])),
            "1st read": fmt_seconds(_median([r["first_read"] for r in raw])),
        }
        if a.server_based:
            show["note"] = "server: nothing loaded"
        if not ok:
            show["value"] = "WRONG VALUE"
            run.alert(f"{a.label}: attach {label}: the first read returned a wrong value")
        _rec(run, "attach", label, a.key, [r["total"] for r in raw], raw=raw, ok=ok, show=show)


def _growth(run: Run, adapters: list[Adapter], handles: dict[str, Handle], size: int, label: str) -> None:
    rnd = random.Random(size)
    keys = [rnd.randrange(size) for _ in range(65_536)]
    pairs = [(k, str(rnd.randrange(10 * size))) for k in keys]
    for kind in ("read", "write"):
        case = f"{kind} {label}"
        cells = []
        for a in adapters:
            h = handles[a.key]
            try:
                with watchdog(_cell_limit(run) * 3, f"{a.label} growth {kind} calibration"):
                    loop = _keys_loop_read(h, keys) if kind == "read" else _keys_loop_write(h, pairs)
                    least = 1 if kind == "read" else a.min_writes(h, run.quick)
                    n = max(least, calibrate(loop, run.box))
                cells.append({"a": a, "loop": loop, "n": n, "raw": [], "min": least, "cases": [case]})
            except Exception as exc:
                _fail(run, "growth", case, a.key, exc)
        _interleave(run, "growth", cells, case, _cell_limit(run) * 3)
        for c in (c for c in cells if not c.get("failed")):
            show = {"ops/rep": fmt_count(c["n"]) if c["n"] >= 1000 else str(c["n"])}
            if c["min"] > 1:
                show["ops/rep"] += f" (>= {c['min']} for dumps)"
            values = [r["seconds"] / r["ops"] for r in c["raw"]]
            params = {"size": size, "kind": kind, "ops_per_rep": c["n"], "min_ops_for_dumps": c["min"]}
            _rec(run, "growth", case, c["a"].key, values, raw=c["raw"], show=show, params=params)


def _timed(run: Run, what: str, steps: list[Callable[[], Any]]) -> list[list[float]]:
    """``run.repeat`` rounds of the steps in turn: each step's seconds per round."""
    out: list[list[float]] = [[] for _ in steps]
    for _ in range(run.repeat):
        with watchdog(600, what):
            for i, step in enumerate(steps):
                t0 = pc()
                step()
                out[i].append(pc() - t0)
    return out


def _dump_load(run: Run, adapters: list[Adapter], handles: dict[str, Handle], label: str) -> None:
    for a in adapters:
        h = handles[a.key]
        try:
            if a.key == "ultradict_ng":

                def fresh(a: Adapter = a, h: Handle = h) -> None:
                    h2 = a.open_second(h)
                    h2.m[KEY]
                    a.close_second(h2)

                (secs,) = _timed(run, "ultradict_ng fresh handle", [fresh])
                what = {"what": "SharedDict(name) + first read, in-process"}
                _rec(run, "growth", f"load {label}: fresh handle", a.key, secs, unit="s", show=what)
            elif a.key in ("ultradict_shared", "ultradict"):
                steps = [h.m.dump, lambda h=h: h.m.load(force=True)]
                for step, secs in zip(
                    ("dump()", "load(force=True)"), _timed(run, f"{a.label} dump/load", steps)
                ):
                    _rec(run, "growth", f"load {label}: {step}", a.key, secs, unit="s")
        except Exception as exc:
            _fail(run, "growth", f"load {label}", a.key, exc, unit="s")
    run.note(
        f"load/dump at {label}: ultradict_ng = a fresh handle attaching and reading once (its dump "
        "happens inside the write that overflows the stream and is amortized in the write cost above); "
        "UltraDict = its dump() and load(force=True); shared-memory-dict loads/dumps the whole dict on "
        "every op (see its read/write cost); Manager, redis and dict have no such notion",
        "growth",
    )


# -- 8: large values ----------------------------------------------------------------------------


def value_sizes(run: Run) -> list[int]:
    return [1_000, 1_000_000] if run.quick else [1_000, 1_000_000, 100_000_000]


def _values_loop(w: Handle, r: Handle, value: Any) -> tuple[Loop, list[float]]:
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


def _values_cell(run: Run, a: Adapter, size: int, label: str, value: bytes) -> dict[str, Any]:
    """Writer and second handle for one value size; on failure, the adapter's fallback settings."""
    for attempt in range(2):
        h = h2 = None
        try:
            with watchdog(_cell_limit(run) * 4, f"{a.label} values {label} setup"):
                h = a.create(fit_bytes=size)
                h2 = a.open_second(h)
                loop, acc = _values_loop(h, h2, value)
                n = calibrate(loop, run.box)
            if a.key == "smd":
                run.note(
                    f"shared-memory-dict: size={h.extra['size']:,} bytes for {label} values "
                    "(it needs a fixed size)",
                    "values",
                )
            extra = lambda acc=acc: {"bytes": size, "write_s": acc[0], "read_s": acc[1]}  # noqa: E731
            cases = [f"{label} write", f"{label} read"]
            return {"a": a, "h": h, "h2": h2, "loop": loop, "n": n, "raw": [], "extra": extra, "cases": cases}
        except Exception as exc:
            _close_second(a, h, h2)
            _safe_destroy(run, a, h)
            why = a.fallback(size) if attempt == 0 else None  # e.g. UltraDict: full_dump_size
            if why is None:
                raise
            run.note(f"{why} (the default settings raised {exc!r})", "values")
    raise AssertionError("unreachable")


def w_values(run: Run, adapters: list[Adapter]) -> None:
    for size in value_sizes(run):
        label = {1_000: "1 KB", 1_000_000: "1 MB", 100_000_000: "100 MB"}.get(size, f"{size} B")
        value = os.urandom(size)
        groups = [[a] for a in adapters] if size >= 50_000_000 else [adapters]  # big values: one at a time
        for group in groups:
            cells = []
            try:
                for a in group:
                    try:
                        cells.append(_values_cell(run, a, size, label, value))
                    except Exception as exc:
                        for kind in ("write", "read"):
                            _fail(run, "values", f"{label} {kind}", a.key, exc)
                _interleave(run, "values", cells, label, _cell_limit(run) * 4)
                for c in (c for c in cells if not c.get("failed")):
                    a = c["a"]
                    try:
                        ok = c["h2"].m[KEY] == value
                    except Exception as exc:
                        ok = False
                        run.alert(f"{a.label}: values {label}: final read failed: {exc!r}")
                    if not ok:
                        run.alert(f"{a.label}: values {label}: the second handle read a wrong value")
                    for kind in ("write", "read"):
                        vals = [
                            r["ops"] * size / r[f"{kind}_s"] / 1e9 for r in c["raw"] if r[f"{kind}_s"] > 0
                        ]
                        params = {"value_bytes": size, "ops_per_rep": c["n"]}
                        show = {} if ok else {"value": "WRONG"}
                        _rec(
                            run,
                            "values",
                            f"{label} {kind}",
                            a.key,
                            vals,
                            raw=c["raw"],
                            ok=ok,
                            params=params,
                            show=show,
                        )
            finally:
                for c in cells:
                    _close_second(c["a"], c["h"], c["h2"])
                    _safe_destroy(run, c["a"], c["h"])
                gc.collect()
        del value
    for a in adapters:
        if a.key in ("ultradict", "ultradict_shared") and not getattr(a, "full_dump_size", None):
            run.note(
                f"{a.label}: ran with its defaults at every value size (buffer_size=10_000, no "
                "full_dump_size: values larger than the buffer go to a dynamic full-dump segment, "
                "created per write)",
                "values",
            )
    run.note(
        "each op: writer handle m[k] = value (timed as write), then a second handle in the same process "
        "reads it (timed as read: for caching contenders this includes fetching the new value); values "
        "are random bytes; dict's 'second handle' is the same dict (ceiling)",
        "values",
    )


# -- the registry ----------------------------------------------------------------------------


def _sized_group(do_attach: bool) -> Callable[[Run, list[Adapter]], list[str]]:
    """Attach and growth share their seeded dicts when both run: the first runs both."""

    def run_it(run: Run, adapters: list[Adapter]) -> list[str]:
        both = "attach" in run.only and "growth" in run.only
        w_sized(run, adapters, do_attach or both, not do_attach or both)
        return ["growth" if do_attach else "attach"] if both else []

    return run_it


UDS = "ultradict_shared"


def _vs_ultradict(text: str, wl: str, case: str, need: float, exact: bool = False) -> Target:
    return Target(text, need, num=pick(wl, case=case), den=pick(wl, UDS, case=case), exact=exact)


def _growth_ratio(recs: list[dict[str, Any]]) -> Optional[tuple[float, str]]:
    sizes = sorted({r["params"].get("size") or 0 for r in recs if r["workload"] == "growth"} - {0})
    small = pick("growth", case="write 1k keys").find(recs)
    big = pick("growth", case=f"write {fmt_count(sizes[-1])} keys").find(recs) if sizes else None
    if not small or not big or not small["median"] or not big["median"] or big is small:
        return None
    return big["median"] / small["median"], (
        f"ultradict_ng {fmt_seconds(big['median'])}/op at {fmt_count(sizes[-1])} keys vs "
        f"{fmt_seconds(small['median'])}/op at 1k"
    )


_TARGETS: dict[str, tuple[Target, ...]] = {
    "read": (_vs_ultradict("hot-key reads >= 4x UltraDict(shared_lock=True)", "read", "hot key", 4),),
    "write": (_vs_ultradict("writes >= 10x UltraDict(shared_lock=True)", "write", "single key", 10),),
    "lock": (_vs_ultradict("locked increment >= 10x UltraDict(shared_lock=True)", "lock", "1 process", 10),),
    "contend": tuple(
        _vs_ultradict(f"{n} processes contending >= 10x, exact counts", "contend", f"{n} processes", 10, True)
        for n in (2, 4)
    ),
    "attach": (
        Target(
            "1M-key attach faster than UltraDict(shared_lock=True)'s",
            1.0,
            num=(pick("attach", UDS, case="1M keys"), pick("attach", UDS, case="100k keys")),
            den=pick("attach"),
            strict=True,
        ),
    ),
    "growth": (
        Target("write cost at 1M keys / at 1k keys <= 1.5x", 1.5, at_most=True, measure=_growth_ratio),
    ),
}
TITLES = {
    "read": "hot-key read (no concurrent writes)",
    "write": "single-key write",
    "lock": "read-modify-write under the lock: with lock: m[k] += 1",
    "contend": "locked increment, spawned processes contending (aggregate)",
    "latency": "visibility latency: parent writes, a spawned reader polls",
    "attach": "attach by name in a fresh spawned process, to the first read",
    "growth": "cost per op vs dict size (writes include amortized full dumps)",
    "values": "large values: write, then read through a second handle",
}
RUNNERS = [w_read, w_write, w_lock, w_contend, w_latency, _sized_group(True), _sized_group(False), w_values]
ALIASES = ["reads", "writes", "incr increment", "contention processes", "visibility", "load", "size cost"]
ALIASES.append("value")
for (_no, _name), _run, _aliases in zip(enumerate(TITLES, 1), RUNNERS, ALIASES):
    _targets = _TARGETS.get(_name, ())
    register(Workload(_name, _no, TITLES[_name], _run, tuple(_aliases.split()), True, (), targets=_targets))
