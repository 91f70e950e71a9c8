"""Workload 10 (``wakeup``) in the report: its table, its targets, its notes and its plot panel.

Its three parts have different units and columns (latency percentiles, CPU
seconds, rates with ratios and checks), so it gets a table of its own, as
workload 9 does, rather than the one-column layout of workloads 1-8.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Optional

from .util import fmt_rate, fmt_seconds
from .wake import IDLE, IDLE_WAITERS, LATENCY, LOCK_PROCS, NG, PAUSE_S, WARMUP, WL, lock_case
from .wake_child import CLOCK_NAME, ENV

REDIS = "redis"
#: The targets: wake-up median and p99, median against Redis pub/sub's; idle waiters'
#: CPU per 10 s; 8 processes' rate against one's, exact count, spread.
WAKE_MEDIAN_S = 50e-6
WAKE_P99_S = 1e-3
WAKE_VS_REDIS = 0.5
IDLE_CPU_S = 0.1
LOCK8_RATIO = 0.6
LOCK8_SPREAD = 3.0


def _find(recs: list[dict[str, Any]], case: str, key: str) -> Optional[dict[str, Any]]:
    for r in recs:
        if r["workload"] == "wakeup" and r["case"] == case and r["contender"] == key:
            return r
    return None


def _rows(recs: list[dict[str, Any]], case: str) -> list[dict[str, Any]]:
    return [r for r in recs if r["case"] == case]


def _bad(r: dict[str, Any], width: int) -> Optional[str]:
    """The line for a skipped or failed row, else None."""
    if r.get("skipped"):
        return f"  {r['label']:<{width}}skipped: {r['skipped']}"
    if r.get("error") and r["median"] is None:
        return f"  {r['label']:<{width}}FAILED: {(r.get('error_short') or r['error'])[:200]}"
    return None


def _why(rec: dict[str, Any]) -> str:
    """Why a target row has no measurement."""
    if not rec:
        return "not measured in this run"
    return str(rec.get("skipped") or rec.get("error_short") or rec.get("error") or "no value")


def _f(x: Optional[float], fmt: str = "{:.3g}") -> str:
    return "-" if x is None else fmt.format(x)


def section(recs: list[dict[str, Any]], number: int, title: str, notes: list[str]) -> str:
    lines = ["", f"== {number}. {title} =="]
    w = 40
    lat = _rows(recs, LATENCY)
    if lat:
        ng = _find(recs, LATENCY, NG)
        ngm = ng["median"] if ng else None
        lines.append(
            "  -- wake-up latency: write here -> waiter in another process returns "
            "(lower is better; ng/peer < 1: ultradict_ng ahead) --"
        )
        lines.append(
            f"  {'contender':<{w}}{'median':>10}{'p99':>10}{'max':>10}{'count':>10}"
            f"{'ng/peer':>9}{'write call':>12}  notes"
        )
        for r in lat:
            bad = _bad(r, w)
            if bad:
                lines.append(bad)
                continue
            s = r["show"]
            ratio = "" if r["contender"] == NG or not ngm or not r["median"] else f"{ngm / r['median']:.3g}x"
            lines.append(
                f"  {r['label']:<{w}}{fmt_seconds(r['median']):>10}"
                f"{fmt_seconds(s.get('p99')):>10}{fmt_seconds(s.get('max')):>10}"
                f"{s.get('count', ''):>10}{ratio:>9}{fmt_seconds(s.get('write call')):>12}"
                f"  {s.get('notes', '')}".rstrip()
            )
    idle = _rows(recs, IDLE)
    if idle:
        window = next((r["params"].get("window_s") for r in idle if r["params"]), None)
        scaled = "" if window == 10.0 else f"; 'per 10 s' scaled from {_f(window, '{:g}')} s"
        lines.append(
            f"  -- {IDLE}: {IDLE_WAITERS} processes, no writes, "
            f"{_f(window, '{:g}')} s each (CPU-s, lower is better{scaled}) --"
        )
        lines.append(
            f"  {'contender':<{w}}{'in waits':>10}{'per 10 s':>10}{'whole procs':>13}{'calls':>9}  notes"
        )
        for r in idle:
            bad = _bad(r, w)
            if bad:
                lines.append(bad)
                continue
            s = r["show"]
            note = f"{s['returned True']} returned True" if s.get("returned True") else ""
            lines.append(
                f"  {r['label']:<{w}}{_f(r['median'], '{:.4f}'):>10}"
                f"{_f(s.get('per 10 s'), '{:.4f}'):>10}"
                f"{_f(s.get('whole'), '{:.2f}'):>13}{s.get('calls', ''):>9}  {note}".rstrip()
            )
    lock = [r for r in recs if r["case"].startswith("locked increments")]
    if lock:
        window = next((r["params"].get("window_s") for r in lock if r["params"]), None)
        lines.append(
            f"  -- locked increments: with d.lock: d[k] += 1, {_f(window, '{:g}')} s "
            "per process count (higher is better) --"
        )
        lines.append(
            f"  {'contender':<30}{'procs':>6}{'total ops/s':>13}{'vs 1':>7}{'max/min':>9}{'CPU-s':>8}  count"
        )
        for r in lock:
            bad = _bad(r, 30)
            if bad:
                lines.append(bad)
                continue
            s = r["show"]
            lines.append(
                f"  {r['label']:<30}{r['params'].get('processes', ''):>6}"
                f"{fmt_rate(r['median']):>13}{_f(s.get('vs 1'), '{:.2f}'):>7}"
                f"{_f(s.get('max/min'), '{:.2f}'):>9}{_f(s.get('cpu'), '{:.2f}'):>8}"
                f"  {s.get('count', '')}"
            )
    for n in notes:
        lines.append(f"   note: {n}")
    return "\n".join(lines)


def targets(records: list[dict[str, Any]], quick: bool) -> list[dict[str, Any]]:
    """The wake-up targets, measured on ultradict_ng in its default (futex) mode."""
    out: list[dict[str, Any]] = []

    def row(
        name: str,
        need: str,
        measured: Optional[float],
        text: str,
        ok: Optional[bool],
        detail: str,
        caveat: Optional[str] = None,
    ) -> None:
        r: dict[str, Any] = {
            "target": name,
            "need": need,
            "measured": measured,
            "measured_text": text,
            "detail": detail,
            "status": "n/a" if ok is None else ("PASS" if ok else "MISS"),
        }
        if caveat:
            r["caveat"] = caveat
        out.append(r)

    ng = _find(records, LATENCY, NG) or {}
    med: Optional[float] = ng.get("median")
    p99: Optional[float] = ng["params"].get("p99_s") if med is not None else None
    count = f" over {ng['show'].get('count')} round trips" if med is not None else ""
    why = _why(ng)
    row(
        "wake-up median <= 50 µs (wait_for_change)",
        "<= 50 µs",
        med,
        fmt_seconds(med),
        None if med is None else med <= WAKE_MEDIAN_S,
        f"ultradict_ng wait_for_change median{count}" if med is not None else why,
    )
    row(
        "wake-up p99 <= 1 ms",
        "<= 1 ms",
        p99,
        fmt_seconds(p99),
        None if p99 is None else p99 <= WAKE_P99_S,
        f"ultradict_ng wait_for_change p99{count}" if p99 is not None else why,
    )
    rd = _find(records, LATENCY, REDIS) or {}
    rdm: Optional[float] = rd.get("median")
    ratio = med / rdm if med is not None and rdm else None
    row(
        "wake-up median <= 0.5x Redis pub/sub's",
        "<= 0.5x",
        ratio,
        _f(ratio, "{:.2f}x"),
        None if ratio is None else ratio <= WAKE_VS_REDIS,
        f"ultradict_ng {fmt_seconds(med)} vs redis pub/sub {fmt_seconds(rdm)}"
        if ratio is not None
        else (why if med is None else "redis pub/sub: " + _why(rd)),
    )
    idle = _find(records, IDLE, NG) or {}
    per10: Optional[float] = None
    caveat = None
    if idle.get("median") is not None:
        per10 = idle["params"].get("cpu_s_per_10s_scaled")
        window = idle["params"]["window_s"]
        if window != 10.0:
            caveat = (
                f"measured {idle['median']:.4f} CPU-s over {window:g} s (--quick), scaled linearly to 10 s"
            )
    row(
        f"{IDLE_WAITERS} idle waiters <= 0.1 CPU-s total per 10 s",
        "<= 0.1 CPU-s",
        per10,
        _f(per10, "{:.4f} CPU-s"),
        None if per10 is None else per10 <= IDLE_CPU_S,
        f"sum of the {IDLE_WAITERS} waiters' user+sys during wait_for_change(timeout)"
        if per10 is not None
        else _why(idle),
        caveat,
    )
    l8 = _find(records, lock_case(max(LOCK_PROCS)), NG)
    if l8 is not None and l8["median"] is not None:
        s = l8["show"]
        r8, spread, exact = s.get("vs 1"), s.get("max/min"), bool(l8.get("ok"))
        ok = r8 is not None and r8 >= LOCK8_RATIO and exact and spread <= LOCK8_SPREAD
        row(
            "8 processes locking >= 0.6x one, exact count, max/min <= 3",
            ">= 0.6x",
            r8,
            _f(r8, "{:.2f}x"),
            ok,
            f"{fmt_rate(l8['median'])} ops/s with 8 vs {fmt_rate(l8['median'] / r8 if r8 else None)}"
            f" with 1; count {'exact' if exact else 'NOT EXACT'}; max/min {_f(spread, '{:.2f}')}",
        )
    else:
        row(
            "8 processes locking >= 0.6x one, exact count, max/min <= 3",
            ">= 0.6x",
            None,
            "-",
            None,
            _why(l8 or {}),
        )
    return out


def plot_panel(ax: Any, recs: list[dict[str, Any]]) -> str:
    """Wake-up latency: the median as a bar, whiskers up to the p99; returns the panel title."""
    rows = [r for r in _rows(recs, LATENCY) if r["median"]]
    xs = list(range(len(rows)))
    meds = [r["median"] * 1e6 for r in rows]
    up = [max(0.0, (r["params"].get("p99_s") or r["median"]) * 1e6 - m) for r, m in zip(rows, meds)]
    ax.bar(
        xs,
        meds,
        0.6,
        yerr=[[0.0] * len(rows), up],
        capsize=3,
        color=["tab:blue" if r["contender"].startswith(NG) else "tab:gray" for r in rows],
    )
    ax.set_xticks(xs)
    ax.set_xticklabels([r["label"] for r in rows], rotation=25, fontsize=7, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("µs (bar: median, whisker: p99)")
    return "wake-up latency to another process"


def notes(run: Any, n: int, parts: Sequence[str]) -> None:
    """The workload's notes (how each part measures), for the parts that ran."""

    def note(text: str) -> None:
        run.note(text, WL)

    if "latency" in parts:
        note(
            f"wake-up latency: {n} round trips per contender after {WARMUP} unrecorded ones; "
            f"t0 = the writer's clock just before its write call, t1 = the waiter's clock right "
            f"after its wait returns (clock: {CLOCK_NAME}, shared by all processes); after "
            f"each acknowledgement (a separate Pipe) the writer pauses {PAUSE_S[0] * 1e3:g}-"
            f"{PAUSE_S[1] * 1e3:g} ms so that the waiter is asleep again; p99 by nearest rank; "
            "'write call' = the median time the writer's own call took (t0 to its return: "
            "a wake-up can land before it returns); 'lost' = a wait that timed out after a "
            "write, 'stale' = a wake-up for an earlier round"
        )
        note(
            "writes: ultradict_ng d[k] = i; Event: a shared RawValue = i, then ev.set() (the "
            "waiter clears); Condition: with cond: value = i; cond.notify_all() (it returns once "
            "the waiter has woken); redis: PUBLISH (the waiter: pubsub.get_message(timeout)); "
            "Pipe: send(i) (the waiter: a blocking recv()); the floor: os.write of 8 bytes, "
            "the waiter a blocking os.read on the same kind of pipe (the kernel's wake-up and "
            "almost no Python: no row can beat it by much); the other waiters wait with a "
            "timeout"
        )
    note(
        "ULTRADICT_NG_WAIT is set to poll (or removed, for the other rows) inside each spawned "
        "child before it imports ultradict_ng; the writer is this process"
        + (
            f", which runs with ULTRADICT_NG_WAIT={os.environ[ENV]!r}"
            if os.environ.get(ENV)
            else " (ULTRADICT_NG_WAIT unset)"
        )
    )
    if "idle" in parts:
        note(
            f"idle waiters: {IDLE_WAITERS} spawned processes wait on a dict nobody writes; "
            "CPU-s = the sum of each one's getrusage(RUSAGE_SELF) user+sys around its wait "
            "alone (one wait_for_change(timeout=window) call, called again only if it returned "
            "early); 'whole' = RUSAGE_CHILDREN of the 10 processes from spawn to exit "
            "(interpreter start, imports, attach included)"
            + (
                "; --quick: a 2 s window, and 'per 10 s' is that measurement scaled linearly, "
                "not measured over 10 s"
                if run.quick
                else ""
            )
        )
    if "lock" in parts:
        note(
            "locked increments: with d.lock: d[k] += 1 in each process for a fixed wall time "
            "from a common start instant; rate = all increments / (last end - first start); "
            "'vs 1' = this rate / the 1-process rate of the same mode; count = the dict's final "
            "value against the sum of the processes' counts; max/min = the busiest process's "
            "count / the least busy one's; CPU-s = the processes' CPU time in the loop"
        )
