"""Workload 13 (``transactions``): 2,000 writes in one ``transaction()`` against
the same writes under ``with d.lock:`` and without either, on shared memory and
on Redis (the target: the transaction >= 5x faster than the lock).

One block of 2,000 ``d[f"k{i}"] = i`` is one repetition; the three modes are
timed alternately (order rotated per repetition) on one dict per backend, in
one spawned child per backend (the harness's start method), so that neither
the harness's state nor the other backend shares the process.  Redis runs
against the run's private ``redis-server`` (workload 12's, or one started and
stopped here), skipped with the reason when there is none.  Reported per row:
median and min..max of the block's wall time, and the lock's median over the
row's (higher: the row is faster).  The child checks that the dict holds the
2,000 values after each block; a wrong count is an alert.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any, Optional

from .run import Run
from .util import fmt_seconds

WL = "transactions"
NUMBER = 13
TITLE = "2,000 writes: in one transaction() vs under with d.lock: vs neither (shm and Redis)"
ENTRY: tuple[str, int, str] = (WL, NUMBER, TITLE)
ALIASES = {"transaction": WL, "tx": WL}
ORDER = ["ultradict_ng"]
OWN_CONTENDERS: list[str] = []
CONTENDER_ALIASES: dict[str, str] = {}

WRITES = 2000
MODES = ("transaction", "lock", "plain")
LABELS = {
    "transaction": "with d.transaction():",
    "lock": "with d.lock:",
    "plain": "no lock (each write alone)",
}
BACKENDS = ("shm", "redis")
TARGET = 5.0


def _block(d: Any, mode: str, base: int) -> float:
    t0 = time.perf_counter()
    if mode == "transaction":
        with d.transaction():
            for i in range(WRITES):
                d[f"k{i}"] = base + i
    elif mode == "lock":
        with d.lock:
            for i in range(WRITES):
                d[f"k{i}"] = base + i
    else:
        for i in range(WRITES):
            d[f"k{i}"] = base + i
    return time.perf_counter() - t0


def child(name: str, backend: Optional[str], reps: int, q: Any) -> None:
    """Time ``reps`` blocks of each mode; put ``{mode: [seconds]}`` and the wrong counts."""
    from ultradict_ng import SharedDict

    kwargs = {"backend": backend} if backend else {}
    d = SharedDict(name=name, **kwargs)
    times: dict[str, list[float]] = {m: [] for m in MODES}
    wrong: list[str] = []
    try:
        for w in range(2):  # warm-up: the keys exist, the stream has its size
            _block(d, MODES[w % len(MODES)], -WRITES)
        for rep in range(reps):
            for j in range(len(MODES)):
                mode = MODES[(rep + j) % len(MODES)]
                base = (rep * len(MODES) + j) * WRITES
                times[mode].append(_block(d, mode, base))
                if d.get("k0") != base or d.get(f"k{WRITES - 1}") != base + WRITES - 1 or len(d) != WRITES:
                    wrong.append(f"{mode}: after a block the dict holds {len(d)} keys, k0={d.get('k0')!r}")
    except BaseException as exc:
        q.put({"error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        d.unlink()
        d.close()
    q.put({"times": times, "wrong": wrong})


def _run_child(name: str, backend: Optional[str], reps: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(name, backend, reps, q), daemon=True)
    p.start()
    try:
        got: dict[str, Any] = q.get(timeout=300)
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join(5)
        q.close()
    return got


def w_transactions(run: Run, contenders: list[str]) -> None:
    reps = run.repeat if run.quick else max(run.repeat, 7)
    for backend in BACKENDS:
        url: Optional[str] = None
        why = ""
        if backend == "redis":
            from .redis_backend import _server

            srv, why = _server(run)
            if srv is not None:
                url = srv.url
        name = f"{run.name_prefix}{os.urandom(6).hex()}"
        if backend == "redis" and url is None:
            for mode in MODES:
                run.record(
                    WL,
                    _case(backend),
                    mode,
                    unit="s",
                    better="lower",
                    values=[],
                    skipped=why,
                    params={"backend": backend, "mode": mode},
                )
            continue
        try:
            got = _run_child(name, url, reps)
        except Exception as exc:
            got = {"error": f"{type(exc).__name__}: {exc}"}
        if "error" in got:
            run.alert(f"workload {NUMBER} ({backend}): {got['error']}")
            for mode in MODES:
                run.record(
                    WL,
                    _case(backend),
                    mode,
                    unit="s",
                    better="lower",
                    values=[],
                    error=got["error"],
                    params={"backend": backend, "mode": mode},
                )
            continue
        for w in got["wrong"]:
            run.alert(f"workload {NUMBER} ({backend}): {w}")
        for mode in MODES:
            rec = run.record(
                WL,
                _case(backend),
                mode,
                unit="s",
                better="lower",
                values=got["times"][mode],
                params={"backend": backend, "mode": mode, "writes": WRITES},
                ok=not got["wrong"],
            )
            rec["label"] = LABELS[mode]
    run.note(
        f"one block = {WRITES:,} writes d[f'k{{i}}'] = i; modes alternate, order rotated; "
        f"one spawned child per backend; Redis: the run's private server on loopback",
        WL,
    )


def _case(backend: str) -> str:
    return f"{WRITES:,} writes, {'shared memory' if backend == 'shm' else 'Redis (loopback)'}"


def _find(recs: list[dict[str, Any]], backend: str, mode: str) -> Optional[dict[str, Any]]:
    for r in recs:
        if r["workload"] == WL and r["params"].get("backend") == backend and r["params"].get("mode") == mode:
            return r
    return None


def ratio(recs: list[dict[str, Any]], backend: str, mode: str) -> Optional[float]:
    """The lock's median time over ``mode``'s: how many times as fast ``mode`` is."""
    lock, other = _find(recs, backend, "lock"), _find(recs, backend, mode)
    if not lock or not other or not lock["median"] or not other["median"]:
        return None
    return float(lock["median"]) / float(other["median"])


def section(recs: list[dict[str, Any]], number: int, title: str, notes: list[str]) -> str:
    lines = [
        "",
        f"== {number}. {title} ==",
        "   unit: s per block (lower is better); x lock = the lock's median / this row's",
    ]
    for backend in BACKENDS:
        rows = [r for r in (_find(recs, backend, m) for m in MODES) if r is not None]
        if not rows:
            continue
        lines.append(f"  {rows[0]['case']}")
        for r in rows:
            mode = r["params"]["mode"]
            if r.get("skipped") or r["median"] is None:
                lines.append(
                    f"    {LABELS[mode]:<30}{'skipped' if r.get('skipped') else 'FAILED'}: "
                    f"{str(r.get('skipped') or r.get('error'))[:200]}"
                )
                continue
            q = ratio(recs, backend, mode)
            per = r["median"] / WRITES
            lines.append(
                f"    {LABELS[mode]:<30}{fmt_seconds(r['median']):>10}  "
                f"{fmt_seconds(r['min'])} .. {fmt_seconds(r['max']):<12}{r['n']:>3}"
                f"{'-' if q is None else f'{q:.2f}x':>9}   {fmt_seconds(per)}/write"
            )
    for n in notes:
        lines.append(f"   note: {n}")
    return "\n".join(lines)


def targets(recs: list[dict[str, Any]], quick: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for backend in BACKENDS:
        tx, lock = _find(recs, backend, "transaction"), _find(recs, backend, "lock")
        if tx is None and lock is None:
            continue
        row: dict[str, Any] = {
            "target": f"transactions: {WRITES:,} writes in one transaction "
            f">= {TARGET:g}x faster than under the lock ({backend})",
            "need": f">= {TARGET:g}x",
        }
        q = ratio(recs, backend, "transaction")
        if q is None or tx is None or lock is None:
            row.update(measured=None, status="n/a", detail="not measured")
        else:
            row.update(
                measured=q,
                status="PASS" if q >= TARGET else "MISS",
                detail=f"transaction {fmt_seconds(tx['median'])} vs lock {fmt_seconds(lock['median'])} "
                f"(median of {tx['n']} / {lock['n']})",
            )
            if quick:
                row["caveat"] = "--quick repetitions"
        out.append(row)
    return out


def plot_panel(ax: Any, recs: list[dict[str, Any]]) -> str:
    """Median µs per write by mode and backend (whiskers min..max)."""
    colors = {"transaction": "tab:blue", "lock": "tab:orange", "plain": "tab:gray"}
    backends = [b for b in BACKENDS if any((_find(recs, b, m) or {}).get("median") for m in MODES)]
    width = 0.8 / len(MODES)
    for i, mode in enumerate(MODES):
        xs, ys, lo, hi = [], [], [], []
        for j, b in enumerate(backends):
            r = _find(recs, b, mode)
            if r and r["median"]:
                xs.append(j + (i - (len(MODES) - 1) / 2) * width)
                ys.append(r["median"] / WRITES * 1e6)
                lo.append((r["median"] - r["min"]) / WRITES * 1e6)
                hi.append((r["max"] - r["median"]) / WRITES * 1e6)
        if xs:
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, color=colors[mode], label=LABELS[mode])
    ax.set_xticks(range(len(backends)))
    ax.set_xticklabels(["shared memory" if b == "shm" else "Redis" for b in backends], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("µs per write (median)")
    ax.legend(fontsize=7)
    return "2,000 writes: transaction vs lock"
