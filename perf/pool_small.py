"""Workload 11 (``pool``), the small-task rows: tasks that carry no array.

A drop-in pool must not make the work that gains nothing from it slower (issue
25), so workload 11 also times, on two workers, the standard pool and
``ultradict_ng.futures`` (the other contenders are the standard pool here):

* ``submit(inc, i)`` for 3,000 ints, every result read (``--quick``: 500);
* ``sum(ex.map(inc, range(60000), chunksize=100))`` (``--quick``: 10,000);
* ``list(ex.map(small_dict, range(3000)))``, a result of four fields
  (``--quick``: 500).

They run in the same spawned drivers as the array cases (one per contender and
round, rounds interleaved, order rotated), ``small_reps`` times each per driver
(:meth:`perf.pool_tasks.Driver.case_small`).  Reported per row: median and
min..max of the wall times, and the ratio to the standard pool in this run --
its median over ours (higher is faster), with the spread of the same ratio
taken round by round (each round's medians), which shows how much of a
difference the machine's noise could make.  Target: >= 1.0x the standard pool.
"""

from __future__ import annotations

import statistics
from typing import Any, Optional

from .run import Run
from .util import fmt_seconds

SMALL = "small"
#: The rows: (case kind, what it does).
KINDS = ("small_submit", "small_map", "small_dicts")
#: The contenders that run them (the hand-written one is the standard pool here,
#: npshmex adds nothing to tasks without arrays).
CONTENDERS = ("stdlib", "ultradict_ng")
TARGET = 1.0


def plan(run: Run) -> dict[str, Any]:
    """Sizes and repetitions per driver."""
    if run.quick:
        return {"small_submit": 500, "small_map": 10_000, "small_dicts": 500, "small_reps": 2}
    return {"small_submit": 3000, "small_map": 60_000, "small_dicts": 3000, "small_reps": 3}


def case_text(kind: str, p: dict[str, Any]) -> str:
    n = p[kind]
    if kind == "small_submit":
        return f"submit(inc, i) for {n:,} ints, 2 workers"
    if kind == "small_map":
        return f"map(inc, range({n:,}), chunksize=100), 2 workers"
    return f"map(small_dict, range({n:,})) (results: dicts of 4 fields), 2 workers"


def cases(p: dict[str, Any]) -> list[tuple[str, str]]:
    return [(kind, case_text(kind, p)) for kind in KINDS]


def record(
    run: Run,
    c: str,
    label: str,
    raw: list[dict[str, Any]],
    p: dict[str, Any],
    rounds: list[int],
    errors: list[str],
) -> None:
    """One record per row for contender ``c`` (``raw``: its drivers' results, the
    driver of round ``rounds[i]`` first)."""
    for kind, case in cases(p):
        per_round = [r["times"][kind] for r in raw]
        times = [t for ts in per_round for t in ts]
        wrong = [w for r in raw for w in r["wrong"] if w.startswith(kind)]
        if wrong:
            run.alert(f"{label}: pool {kind}: {wrong[0]}")
        params = {
            "case_kind": kind,
            "tasks": p[kind],
            "repetitions": len(times),
            "drivers": len(raw),
            "failed_rounds": len(errors),
            "errors": errors,
            "round_medians": {str(rnd): statistics.median(ts) for rnd, ts in zip(rounds, per_round) if ts},
        }
        rec = run.record(
            "pool",
            case,
            c,
            unit="s",
            better="lower",
            values=times,
            raw=raw,
            show={"value": "WRONG"} if wrong else {},
            params=params,
            ok=not wrong,
        )
        rec["label"] = label


def _find(recs: list[dict[str, Any]], kind: str, c: str) -> Optional[dict[str, Any]]:
    for r in recs:
        if r["params"].get("case_kind") == kind and r["contender"] == c:
            return r
    return None


def ratio(recs: list[dict[str, Any]], kind: str) -> Optional[float]:
    """The standard pool's median over ours: how many times as fast ours is."""
    std, ng = _find(recs, kind, "stdlib"), _find(recs, kind, "ultradict_ng")
    if not std or not ng or not std["median"] or not ng["median"]:
        return None
    return float(std["median"]) / float(ng["median"])


def round_ratios(recs: list[dict[str, Any]], kind: str) -> list[float]:
    """The same ratio round by round (each round's medians)."""
    std, ng = _find(recs, kind, "stdlib"), _find(recs, kind, "ultradict_ng")
    if not std or not ng:
        return []
    a, b = std["params"].get("round_medians", {}), ng["params"].get("round_medians", {})
    return [a[k] / b[k] for k in a if k in b and b[k]]


def section(recs: list[dict[str, Any]], labels: dict[str, str], w: int) -> list[str]:
    """The table's block (c)."""
    rows = [r for r in recs if r["params"].get("case_kind") in KINDS]
    if not rows:
        return []
    lines = [
        "  -- (c) small tasks, no array (lower is better; x stdlib: the standard pool's "
        "median / this one's, and min..max of that ratio round by round) --",
        f"  {'contender':<{w}}{'median':>10}  {'spread (min..max)':<22}{'n':>3}"
        f"{'x stdlib':>10}  {'by round':<13}",
    ]
    for kind in KINDS:
        krows = sorted(
            (r for r in rows if r["params"]["case_kind"] == kind),
            key=lambda r: (
                CONTENDERS.index(r["contender"]) if r["contender"] in CONTENDERS else len(CONTENDERS)
            ),
        )
        if not krows:
            continue
        lines.append(f"  {krows[0]['case']}")
        for r in krows:
            label = labels.get(r["contender"], r["contender"])
            if r.get("skipped") or (r.get("error") and r["median"] is None):
                why = r.get("skipped") or r.get("error_short") or r.get("error")
                lines.append(f"  {label:<{w}}{'skipped' if r.get('skipped') else 'FAILED'}: {str(why)[:200]}")
                continue
            spread = "(1 rep)" if r["n"] < 2 else f"{fmt_seconds(r['min'])} .. {fmt_seconds(r['max'])}"
            x = "-"
            by_round = ""
            if r["contender"] == "stdlib":
                x = "1.00x"
            else:
                q = ratio(recs, kind)
                x = "-" if q is None else f"{q:.2f}x"
                rr = round_ratios(recs, kind)
                if len(rr) > 1:
                    by_round = f"{min(rr):.2f}..{max(rr):.2f}"
            extra = "  VALUE WRONG" if r["show"].get("value") else ""
            lines.append(
                f"  {label:<{w}}{fmt_seconds(r['median']):>10}  {spread:<22}{r['n']:>3}"
                f"{x:>10}  {by_round:<13}{extra}".rstrip()
            )
    return lines


def targets(recs: list[dict[str, Any]], quick: bool) -> list[dict[str, Any]]:
    """Each row >= 1.0x the standard pool (the report marks it; nothing fails)."""
    out: list[dict[str, Any]] = []
    for kind in KINDS:
        ng, std = _find(recs, kind, "ultradict_ng"), _find(recs, kind, "stdlib")
        if ng is None and std is None:
            continue
        case = (ng or std or {}).get("case", kind)
        row: dict[str, Any] = {
            "target": f"pool, small tasks: {case} >= {TARGET:g}x the standard pool",
            "need": f">= {TARGET:g}x",
        }
        q = ratio(recs, kind)
        if q is None or ng is None or std is None:
            row.update(measured=None, status="n/a", detail="not measured for both pools")
        else:
            rr = round_ratios(recs, kind)
            detail = (
                f"ultradict_ng.futures {fmt_seconds(ng['median'])} vs the standard pool "
                f"{fmt_seconds(std['median'])} (median of {ng['n']} / {std['n']})"
            )
            if len(rr) > 1:
                detail += f"; by round {min(rr):.2f}x..{max(rr):.2f}x"
            row.update(measured=q, status="PASS" if q >= TARGET else "MISS", detail=detail)
            if quick:
                row["caveat"] = "--quick sizes"
        out.append(row)
    return out
