"""Workload 15's table, its targets, its plot and its own JSON.

Everything goes to ``<out>/cache/`` (see :func:`write`): ``latest.json`` (the workload's records,
targets, notes, alerts and the machine) and ``latest.png`` (ops/s bars on a
log scale per contender, hit ratios, stampede).  Ratios are of medians of one
run: ours / the peer's (ops/s, hit ratio).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from .cache import ALPHAS, CACHELIB, DJANGO, HIT, LABELS, NUMBER, PLAIN, STAMPEDE, WL
from .util import fmt_rate, fmt_seconds

#: (part, op, value, peer, need): our median / the peer's median >= need.
RATE_TARGETS: list[tuple[str, str, str, str, float]] = [
    ("django", "get", "dict", "locmem", 1.0),
    ("django", "get", "dict", "diskcache", 3.0),
    ("django", "get", "dict", "redis", 20.0),
    ("django", "set", "dict", "locmem", 0.5),
    ("django", "set", "dict", "diskcache", 5.0),
    ("django", "set", "dict", "redis", 20.0),
    ("plain", "get", "dict", "diskcache", 10.0),
    ("plain", "get", "dict", "lru", 0.5),
    ("plain", "set", "dict", "diskcache", 5.0),
    ("plain", "get", "str", "diskcache", 10.0),
    ("plain", "get", "str", "lru", 0.5),
    ("plain", "set", "str", "diskcache", 5.0),
]
HIT_TARGET = 0.95
ROWS = {"django": DJANGO, "plain": PLAIN, "cachelib": CACHELIB}
OURS = {"django": "ours", "plain": "ours", "cachelib": "cl_ours"}


def _recs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["workload"] == WL]


def find(recs: list[dict[str, Any]], part: str, c: str, **match: Any) -> Optional[dict[str, Any]]:
    for r in recs:
        p = r.get("params") or {}
        if (
            r["workload"] == WL
            and p.get("part") == part
            and p.get("contender") == c
            and all(p.get(k) == v for k, v in match.items())
        ):
            return r
    return None


def _med(r: Optional[dict[str, Any]]) -> Optional[float]:
    return None if r is None or r.get("median") is None else float(r["median"])


def _rate_cell(r: Optional[dict[str, Any]], ours: Optional[float], width: int = 34) -> str:
    if r is None:
        return f"{'-':<{width}}"
    if r.get("skipped"):
        return f"{'skipped':<{width}}"
    if r.get("median") is None:
        return f"{'FAILED':<{width}}"
    m = float(r["median"])
    x = f"{ours / m:.2f}x" if ours and r["params"]["contender"] not in OURS.values() else "-"
    spread = f"[{fmt_rate(r['min'])}..{fmt_rate(r['max'])}]"
    return f"{fmt_rate(m) + '/s':>9} {spread:<16}{x:>8}".ljust(width)


def _reasons(recs: list[dict[str, Any]], rows: list[tuple[str, str]]) -> list[str]:
    out: list[str] = []
    for part, c in rows:
        r = next(
            (
                r
                for r in recs
                if r["params"].get("part") == part
                and r["params"].get("contender") == c
                and (r.get("skipped") or r.get("error"))
            ),
            None,
        )
        if r is not None:
            text = r.get("skipped") or r.get("error")
            line = (
                f"      {LABELS[part][c]}: {'skipped' if r.get('skipped') else 'failed'}: {str(text)[:160]}"
            )
            if line not in out:
                out.append(line)
    return out


def section(records: list[dict[str, Any]], number: int, title: str, notes: list[str]) -> str:
    recs = _recs(records)
    if not recs:
        return ""
    lines = [
        "",
        f"== {number}. {title} ==",
        "   medians [min..max] of the repetitions; x = ours / this row's median (>1: ours ahead)",
    ]
    for part, head, values in (
        ("django", "Django cache API (cache.get / cache.set)", ("dict",)),
        ("plain", "plain API (get / set; cachetools: c[k] = v)", ("dict", "str")),
        ("cachelib", "cachelib API (Flask-Caching backends: get / set)", ("dict",)),
    ):
        names = ROWS[part]
        if not any(find(recs, part, c) for c in names):
            continue
        for value in values:
            lines.append(f"  {head}, {value} value")
            lines.append(
                f"    {'':<40}"
                + "".join(
                    f"{op + '/s':>9} {'[min..max]':<16}{'x ours':>8}".ljust(34) for op in ("get", "set")
                )
            )
            for c in names:
                cells = []
                for op in ("get", "set"):
                    r = find(recs, part, c, op=op, value=value)
                    cells.append(_rate_cell(r, _med(find(recs, part, OURS[part], op=op, value=value))))
                lines.append(f"    {LABELS[part][c]:<40}{''.join(cells)}".rstrip())
        lines.extend(_reasons(recs, [(part, c) for c in names]))
    hit_alphas = [a for a in ALPHAS if any(find(recs, "hit", c, alpha=a) for c in HIT)]
    if hit_alphas:
        first = find(recs, "hit", "exact", alpha=hit_alphas[0]) or {"params": {}}
        p = first["params"]
        lines.append(
            f"  hit ratio (Zipf over {p.get('nkeys', 0):,} keys, {p.get('requests', 0):,} requests, "
            f"{p.get('size', 0):,} entries; get, set on a miss); (x exact LRU)"
        )
        lines.append(f"    {'':<40}" + "".join(f"{f'a={a:g}':<22}" for a in sorted(hit_alphas)))
        for c in HIT:
            cells = []
            for a in sorted(hit_alphas):
                r, ref = find(recs, "hit", c, alpha=a), _med(find(recs, "hit", "exact", alpha=a))
                m = _med(r)
                if r is None or m is None:
                    cells.append(f"{'skipped' if r and r.get('skipped') else 'FAILED' if r else '-':<22}")
                else:
                    cells.append(f"{m:.4f} ({m / ref:.3f}x)".ljust(22) if ref else f"{m:.4f}".ljust(22))
            lines.append(f"    {LABELS['hit'][c]:<40}{''.join(cells)}".rstrip())
        lines.extend(_reasons(recs, [("hit", c) for c in HIT]))
    if any(find(recs, "stampede", c) for c in STAMPEDE):
        r0 = find(recs, "stampede", STAMPEDE[1]) or find(recs, "stampede", STAMPEDE[0]) or {"params": {}}
        p = r0["params"]
        lines.append(
            f"  stampede ({p.get('processes')} spawned processes, one cold key per round, the function "
            f"sleeps {p.get('sleep_s')} s; {p.get('rounds')} rounds)"
        )
        lines.append(f"    {'':<40}{'computations per round':<28}{'wall time per round':<30}")
        for c in STAMPEDE:
            rc = _stampede(recs, c, "count")
            rw = _stampede(recs, c, "s")
            if rc is None or rc.get("median") is None:
                lines.append(
                    f"    {LABELS['stampede'][c]:<40}{'skipped' if rc and rc.get('skipped') else 'FAILED'}"
                )
                continue
            cnt = f"{rc['median']:g} [{rc['min']:g}..{rc['max']:g}]"
            wall = (
                "-"
                if _med(rw) is None
                else f"{fmt_seconds(rw['median'])} [{fmt_seconds(rw['min'])}..{fmt_seconds(rw['max'])}]"
            )
            lines.append(f"    {LABELS['stampede'][c]:<40}{cnt:<28}{wall}")
        lines.extend(_reasons(recs, [("stampede", c) for c in STAMPEDE]))
    for n in notes:
        lines.append(f"   note: {n}")
    return "\n".join(lines)


def _stampede(recs: list[dict[str, Any]], c: str, unit: str) -> Optional[dict[str, Any]]:
    return next(
        (
            r
            for r in recs
            if r["params"].get("part") == "stampede"
            and r["params"].get("contender") == c
            and r["unit"] == unit
        ),
        None,
    )


def targets(records: list[dict[str, Any]], quick: bool) -> list[dict[str, Any]]:
    recs = _recs(records)
    if not recs:
        return []
    out: list[dict[str, Any]] = []
    for part, op, value, peer, need in RATE_TARGETS:
        ours = find(recs, part, "ours", op=op, value=value)
        other = find(recs, part, peer, op=op, value=value)
        if ours is None and other is None:
            continue
        what = "Django backend" if part == "django" else "SharedCache"
        row: dict[str, Any] = {
            "target": f"cache: {what} {op} >= {need:g}x {LABELS[part][peer]} ({value} value)",
            "need": f">= {need:g}x",
        }
        a, b = _med(ours), _med(other)
        if a is None or b is None:
            why = (
                "ours: " + str((ours or {}).get("skipped") or (ours or {}).get("error") or "-")
                if a is None
                else "peer: " + str((other or {}).get("skipped") or (other or {}).get("error") or "-")
            )
            row.update(measured=None, status="n/a", detail=f"not measured ({why[:120]})")
        else:
            q = a / b
            row.update(
                measured=q,
                status="PASS" if q >= need else "MISS",
                detail=f"ours {fmt_rate(a)}/s vs {fmt_rate(b)}/s (medians of {ours['n']} / {other['n']})",
            )
            if quick:
                row["caveat"] = "--quick repetitions"
        out.append(row)
    for a in ALPHAS:
        ours, exact = find(recs, "hit", "ours", alpha=a), find(recs, "hit", "exact", alpha=a)
        if ours is None:
            continue
        row = {
            "target": f"cache: SharedCache hit ratio >= {HIT_TARGET:g}x exact LRU (Zipf a={a:g})",
            "need": f">= {HIT_TARGET:g}x",
        }
        m, ref = _med(ours), _med(exact)
        if m is None or not ref:
            row.update(
                measured=None,
                status="n/a",
                detail=f"not measured ({str(ours.get('skipped') or ours.get('error'))[:120]})",
            )
        else:
            row.update(
                measured=m / ref,
                status="PASS" if m / ref >= HIT_TARGET else "MISS",
                detail=f"SharedCache {m:.4f} vs exact LRU {ref:.4f}",
            )
        out.append(row)
    rc = _stampede(recs, "cached", "count")
    if rc is not None:
        row = {"target": "cache: stampede, 8 processes on a cold key -> 1 computation", "need": "== 1"}
        if rc.get("median") is None:
            row.update(
                measured=None,
                status="n/a",
                detail=f"not measured ({str(rc.get('skipped') or rc.get('error'))[:120]})",
            )
        else:
            rw = _stampede(recs, "cached", "s")
            ok = rc["max"] == 1 and not rc.get("error")
            row.update(
                measured=rc["max"],
                measured_text=f"{rc['max']:g}",
                status="PASS" if ok else "MISS",
                detail=f"computations per round {[int(v) for v in rc['values']]}; wall "
                f"{fmt_seconds(_med(rw))} (median); lru_cache: "
                f"{_med(_stampede(recs, 'lru_cache', 'count'))} per round",
            )
        out.append(row)
    return out


# -- files -------------------------------------------------------------------------------------


def write(out: str, payload: dict[str, Any], plot: bool = True) -> list[str]:
    """``latest.json`` (and ``latest.png``) in ``<out>/cache/``; lines to print.

    With ``--out .../cache`` and only this workload in the run (``python -m perf --only
    cache --out perf/results/cache``, as workloads 9, 10 and 14 are kept), into ``out``
    itself: the harness's ``latest.json`` there is replaced by this one, which holds the
    same records, targets and machine, and the harness draws no ``latest.png`` for it.
    """
    import json

    recs = _recs(payload.get("records", []))
    alone = len(recs) == len(payload.get("records", []))
    out_dir = (
        out if alone and os.path.basename(os.path.normpath(out)) == "cache" else os.path.join(out, "cache")
    )
    os.makedirs(out_dir, exist_ok=True)
    mine = {
        **{
            k: v
            for k, v in payload.items()
            if k not in ("records", "targets", "notes", "section_notes", "alerts")
        },
        "workload": NUMBER,
        "name": WL,
        "notes": (payload.get("section_notes") or {}).get(WL, []),
        "alerts": [a for a in payload.get("alerts", []) if f"workload {NUMBER}" in a],
        "targets": [t for t in payload.get("targets", []) if str(t.get("target", "")).startswith("cache:")],
        "records": recs,
    }
    path = os.path.join(out_dir, "latest.json")
    with open(path + ".tmp", "w") as f:
        json.dump(mine, f, indent=1, default=str)
    os.replace(path + ".tmp", path)
    lines = [f"wrote {path} (workload {NUMBER}'s own{', in place of the above' if out_dir == out else ''})"]
    if plot:
        png = os.path.join(out_dir, "latest.png")
        why = plot_file(png, recs)
        lines.append(f"wrote {png}" if why is None else f"no plot of workload {NUMBER}: {why}")
    return lines


def _bars(
    ax: Any,
    groups: list[str],
    series: list[tuple[str, list[Optional[dict[str, Any]]]]],
    log: bool,
    text: Optional[Any] = None,
) -> None:
    """Grouped bars (median, whiskers min..max); ``text(row)``: a label over a bar."""
    import matplotlib.pyplot as plt

    width = 0.8 / max(1, len(series))
    top = 0.0
    for i, (label, rows) in enumerate(series):
        xs, ys, lo, hi = [], [], [], []
        for j, r in enumerate(rows):
            if r is not None and r.get("median"):
                xs.append(j + (i - (len(series) - 1) / 2) * width)
                ys.append(r["median"])
                lo.append(r["median"] - r["min"])
                hi.append(r["max"] - r["median"])
                top = max(top, r["max"])
                if text is not None:
                    ax.text(xs[-1], r["max"], text(r), ha="center", va="bottom", fontsize=6, rotation=90)
        ax.bar(
            xs,
            ys,
            width,
            yerr=[lo, hi] if len(xs) else None,
            capsize=2,
            label=label,
            color=plt.cm.tab10(i % 10),
        )
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    if log:
        ax.set_yscale("log")
        if top:
            ax.set_ylim(top=top * 30)  # room for the legend above the bars
    elif top:
        ax.set_ylim(0, top * 1.45)
    ax.grid(True, axis="y", alpha=0.3)
    if series:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)


def _exact(recs: list[dict[str, Any]], r: dict[str, Any]) -> float:
    return _med(find(recs, "hit", "exact", alpha=r["params"]["alpha"])) or 1.0


def _rate_text(r: dict[str, Any]) -> str:
    return fmt_rate(r["median"])


def plot_file(path: str, recs: list[dict[str, Any]]) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"matplotlib unavailable ({exc.__class__.__name__})"
    fig, axes = plt.subplots(2, 3, figsize=(21, 10), squeeze=False)
    ax = axes[0][0]
    _bars(
        ax,
        ["get", "set"],
        [
            (LABELS["django"][c], [find(recs, "django", c, op=op) for op in ("get", "set")])
            for c in DJANGO
            if find(recs, "django", c)
        ],
        True,
        _rate_text,
    )
    ax.set_title("Django cache API, dict value (ops/s, log)", fontsize=10)
    ax.set_ylabel("ops/s")
    ax = axes[0][1]
    groups = [("get", "dict"), ("set", "dict"), ("get", "str"), ("set", "str")]
    _bars(
        ax,
        [f"{op} ({v})" for op, v in groups],
        [
            (LABELS["plain"][c], [find(recs, "plain", c, op=op, value=v) for op, v in groups])
            for c in PLAIN
            if find(recs, "plain", c)
        ],
        True,
        _rate_text,
    )
    ax.set_title("plain API: get / set, dict and str values (ops/s, log)", fontsize=10)
    ax.set_ylabel("ops/s")
    ax = axes[0][2]
    _bars(
        ax,
        ["get", "set"],
        [
            (LABELS["cachelib"][c], [find(recs, "cachelib", c, op=op) for op in ("get", "set")])
            for c in CACHELIB
            if find(recs, "cachelib", c)
        ],
        True,
        _rate_text,
    )
    ax.set_title("cachelib API (Flask-Caching), dict value (ops/s, log)", fontsize=10)
    ax.set_ylabel("ops/s")
    ax = axes[1][0]
    alphas = sorted(a for a in ALPHAS if find(recs, "hit", "exact", alpha=a))
    _bars(
        ax,
        [f"Zipf a={a:g}" for a in alphas],
        [
            (LABELS["hit"][c], [find(recs, "hit", c, alpha=a) for a in alphas])
            for c in HIT
            if find(recs, "hit", c)
        ],
        False,
        lambda r: f"{r['median']:.3f} ({r['median'] / _exact(recs, r):.3f}x)",
    )
    ax.set_title("hit ratio (get, set on a miss), 2,000 entries", fontsize=10)
    ax.set_ylabel("hits / requests")
    ax = axes[1][1]
    _bars(
        ax,
        ["computations per round"],
        [
            (LABELS["stampede"][c], [_stampede(recs, c, "count")])
            for c in STAMPEDE
            if _stampede(recs, c, "count")
        ],
        False,
        lambda r: f"{r['median']:g} in {fmt_seconds(_med(_stampede(recs, r['params']['contender'], 's')))}",
    )
    ax.set_ylabel("executions of the function (label: wall time)")
    ax.set_title("stampede: 8 processes, one cold key, a 0.2 s function", fontsize=10)
    axes[1][2].axis("off")
    fig.suptitle(f"{NUMBER}. shared cache (medians; whiskers min..max)")
    fig.tight_layout()
    fig.savefig(path + ".tmp", dpi=80, format="png")
    plt.close(fig)
    os.replace(path + ".tmp", path)
    return None
