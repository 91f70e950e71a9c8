"""Tables on stdout, the targets section, ``latest.json`` and ``latest.png``."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from typing import Any, Optional

from .adapters import ADAPTERS, ORDER
from .util import fmt_value

NG = "ultradict_ng"
UDS = "ultradict_shared"


def _label(key: str) -> str:
    cls = ADAPTERS.get(key)
    return cls.label if cls is not None else key


def _cases(records: list[dict[str, Any]], wl: str) -> list[str]:
    seen: list[str] = []
    for r in records:
        if r["workload"] == wl and r["case"] not in seen:
            seen.append(r["case"])
    return seen


def find(records: list[dict[str, Any]], wl: str, case: str, contender: str) -> Optional[dict[str, Any]]:
    for r in records:
        if r["workload"] == wl and r["case"] == case and r["contender"] == contender:
            return r
    return None


def _order_key(r: dict[str, Any]) -> tuple[int, str]:
    c = r["contender"]
    return (ORDER.index(c) if c in ORDER else len(ORDER), c)


def section(records: list[dict[str, Any]], wl: str, number: int, title: str, notes: list[str]) -> str:
    """One workload's table: contender, median, spread (min-max), ultradict_ng / peer."""
    recs = [r for r in records if r["workload"] == wl]
    lines: list[str] = []
    if not recs:
        return ""
    if wl == "big":
        return big_section(recs, number, title, notes)
    if wl == "wakeup":
        from . import wake_report

        return wake_report.section(recs, number, title, notes)
    if wl == "pool":
        from . import pool

        return pool.section(recs, number, title, notes)
    if wl == "redis":
        from . import redis_backend

        return redis_backend.section(recs, number, title, notes)
    if wl == "transactions":
        from . import transactions

        return transactions.section(recs, number, title, notes)
    if wl == "bigdict":
        from . import bigdict_report

        return bigdict_report.section(recs, number, title, notes)
    if wl == "cache":
        from . import cache_report

        return cache_report.section(recs, number, title, notes)
    if wl == "durable":
        from . import durable

        return durable.section(recs, number, title, notes)
    if wl == "documents":
        from . import documents

        return documents.section(recs, number, title, notes)
    unit = next((r["unit"] for r in recs if not r.get("note_only")), recs[0]["unit"])
    better = next((r["better"] for r in recs if not r.get("note_only")), "higher")
    arrow = "higher is better" if better == "higher" else "lower is better"
    ahead = ">1" if better == "higher" else "<1"
    lines.append("")
    lines.append(f"== {number}. {title} ==")
    lines.append(
        f"   unit: {unit} ({arrow}); ng/peer = ultradict_ng median / peer median "
        f"({ahead}: ultradict_ng ahead)"
    )
    for case in _cases(recs, wl):
        rows = sorted([r for r in recs if r["case"] == case and not r.get("note_only")], key=_order_key)
        if not rows:
            continue
        unit = rows[0]["unit"]
        ng = find(records, wl, case, NG)
        ngm = ng["median"] if ng else None
        lines.append(f"  -- {case} --")
        lines.append(f"  {'contender':<29}{'median':>12}  {'spread (min-max)':<27} {'ng/peer':>9}  notes")
        for r in rows:
            if r.get("skipped"):
                lines.append(f"  {r['label']:<29}{'skipped':>12}  {r['skipped']}")
                continue
            if r.get("error") and r["median"] is None:
                err = r.get("error_short") or r["error"].replace("\n", " ")
                lines.append(f"  {r['label']:<29}{'FAILED':>12}  {err[:220]}")
                continue
            med = fmt_value(r["median"], unit)
            spread = f"{fmt_value(r['min'], unit)} - {fmt_value(r['max'], unit)}"
            if r["contender"] == NG or ngm is None or not r["median"]:
                ratio = "" if r["contender"] != NG else "1.00x"
            else:
                ratio = f"{ngm / r['median']:.3g}x"
            extra = "  ".join(f"{k}: {v}" if k not in ("note",) else v for k, v in r["show"].items())
            lines.append(f"  {r['label']:<29}{med:>12}  {spread:<27} {ratio:>9}  {extra}".rstrip())
    for n in notes:
        lines.append(f"   note: {n}")
    return "\n".join(lines)


# -- workload 9: one block per kind and size, one column per metric ----------------------------


def _scale(unit: str, x: float) -> tuple[float, str]:
    """A factor and unit name that show ``x`` with a sensible magnitude."""
    if unit == "s":
        for factor, name in ((1.0, "s"), (1e3, "ms"), (1e6, "µs")):
            if abs(x) * factor >= 1:
                return factor, name
        return 1e9, "ns"
    if unit == "MiB":
        if abs(x) >= 1024:
            return 1 / 1024, "GiB"
        return (1.0, "MiB") if abs(x) >= 1 else (1024.0, "KiB")
    return 1.0, unit


def _num(x: float) -> str:
    """3 significant digits, without an exponent up to 99999."""
    return f"{x:.0f}" if 1000 <= abs(x) < 100_000 else f"{x:.3g}"


def _spread_cell(r: dict[str, Any]) -> str:
    """``median unit (min..max)`` in the median's unit; just the median for one repetition."""
    med = r["median"]
    if med is None:
        return "-"
    f, name = _scale(r["unit"], med)
    text = f"{_num(med * f)} {name}"
    lo, hi = _num(r["min"] * f), _num(r["max"] * f)
    if r["n"] > 1 and lo != hi:
        text += f" ({lo}..{hi})"
    return text


def big_section(recs: list[dict[str, Any]], number: int, title: str, notes: list[str]) -> str:
    from .big import KIND_TITLES, METRICS, case_name, size_label

    lines = [
        "",
        f"== {number}. {title} ==",
        "   lower is better; median (min..max) over the repetitions; copies: see the note",
    ]
    blocks: list[tuple[str, int]] = []
    for r in recs:
        key = (r["params"].get("kind"), r["params"].get("value_bytes"))
        if key not in blocks:
            blocks.append(key)
    width = 25
    for kind, size in blocks:
        lines.append(f"  -- {KIND_TITLES.get(kind, kind)}, {size_label(size)} --")
        lines.append(f"  {'contender':<28}" + "".join(f"{m:<{width}}" for m, _, _ in METRICS) + "copies")
        contenders = sorted(
            {
                r["contender"]
                for r in recs
                if (r["params"].get("kind"), r["params"].get("value_bytes")) == (kind, size)
            },
            key=lambda c: (ORDER.index(c) if c in ORDER else len(ORDER), c),
        )
        for c in contenders:
            row = [find(recs, "big", case_name(kind, size, m), c) for m, _, _ in METRICS]
            first = next(x for x in row if x is not None)
            label = first["label"]
            if first.get("skipped"):
                why = first["skipped"]
                lines.append(f"  {label:<28}{why if len(why) <= 130 else why[:129] + '…'}")
                continue
            if first.get("error") and first["median"] is None:
                err = first.get("error_short") or first["error"].replace("\n", " ")
                lines.append(f"  {label:<28}FAILED: {err[:200]}")
                continue
            cells = "".join(f"{(_spread_cell(x) if x else '-'):<{width - 1}} " for x in row)
            extra = first["show"].get("copies", "-")
            if first["show"].get("value"):
                extra += "  VALUE " + first["show"]["value"]
            lines.append(f"  {label:<28}{cells}{extra}".rstrip())
    for n in notes:
        lines.append(f"   note: {n}")
    return "\n".join(lines)


def _median(records: list[dict[str, Any]], wl: str, case: str, contender: str) -> Optional[float]:
    r = find(records, wl, case, contender)
    return r["median"] if r and r["median"] else None


def targets(records: list[dict[str, Any]], quick: bool) -> list[dict[str, Any]]:
    """The targets, each as measured ratio vs target, PASS / MISS / n/a."""
    out: list[dict[str, Any]] = []

    def ratio_target(name: str, wl: str, case: str, need: float, exact: bool = False) -> None:
        ng, ud = _median(records, wl, case, NG), _median(records, wl, case, UDS)
        row: dict[str, Any] = {"target": name, "need": f">= {need:g}x"}
        if ng is None or ud is None:
            row.update(measured=None, status="n/a", detail="not measured in this run")
        else:
            ratio = ng / ud
            ok = ratio >= need
            detail = (
                f"ultradict_ng {fmt_value(ng, 'ops/s')} "
                f"vs UltraDict(shared_lock=True) {fmt_value(ud, 'ops/s')}"
            )
            if exact:
                rec = find(records, wl, case, NG)
                exact_ok = bool(rec and rec.get("ok"))
                ok = ok and exact_ok
                detail += "; ultradict_ng counts " + ("exact" if exact_ok else "NOT EXACT")
            row.update(measured=ratio, status="PASS" if ok else "MISS", detail=detail)
        out.append(row)

    ratio_target("hot-key reads >= 4x UltraDict(shared_lock=True)", "read", "hot key", 4)
    ratio_target("writes >= 10x UltraDict(shared_lock=True)", "write", "single key", 10)
    ratio_target("locked increment >= 10x UltraDict(shared_lock=True)", "lock", "1 process", 10)
    ratio_target("2 processes contending >= 10x, exact counts", "contend", "2 processes", 10, True)
    ratio_target("4 processes contending >= 10x, exact counts", "contend", "4 processes", 10, True)

    # Write cost growth: largest measured size vs 1k keys.
    sizes = sorted(
        {
            r["params"].get("size")
            for r in records
            if r["workload"] == "growth" and r["contender"] == NG and r["params"].get("size")
        }
    )
    row: dict[str, Any] = {"target": "write cost at 1M keys / at 1k keys <= 1.5x", "need": "<= 1.5x"}
    if 1_000 in sizes and len(sizes) > 1:
        big = sizes[-1]
        c_small = _median(records, "growth", "write 1k keys", NG)
        c_big = _median(records, "growth", f"write {_count(big)} keys", NG)
        if c_small and c_big:
            ratio = c_big / c_small
            row.update(
                measured=ratio,
                status="PASS" if ratio <= 1.5 else "MISS",
                detail=f"ultradict_ng {fmt_value(c_big, 's/op')} at {_count(big)} vs "
                f"{fmt_value(c_small, 's/op')} at 1k",
            )
            if big != 1_000_000:
                row["caveat"] = f"measured at {_count(big)} keys, not 1M (1M is only in full mode)"
        else:
            row.update(measured=None, status="n/a", detail="not measured")
    else:
        row.update(measured=None, status="n/a", detail="not measured in this run")
    out.append(row)

    # 1M-key attach vs UltraDict's.
    row = {"target": "1M-key attach faster than UltraDict(shared_lock=True)'s", "need": "> 1x"}
    asizes = [s for s in (1_000_000, 100_000) if find(records, "attach", f"{_count(s)} keys", NG)]
    if asizes:
        case = f"{_count(asizes[0])} keys"
        ng, ud = _median(records, "attach", case, NG), _median(records, "attach", case, UDS)
        if ng and ud:
            ratio = ud / ng
            row.update(
                measured=ratio,
                status="PASS" if ratio > 1 else "MISS",
                detail=f"ultradict_ng {fmt_value(ng, 's')} vs UltraDict(shared_lock=True) "
                f"{fmt_value(ud, 's')} (ratio = UltraDict time / ultradict_ng time)",
            )
            if asizes[0] != 1_000_000:
                row["caveat"] = f"measured at {_count(asizes[0])} keys, not 1M (1M is only in full mode)"
        else:
            row.update(measured=None, status="n/a", detail="not measured")
    else:
        row.update(measured=None, status="n/a", detail="not measured in this run")
    out.append(row)

    from . import wake_report

    out.extend(wake_report.targets(records, quick))  # workload 10
    from . import pool

    out.extend(pool.targets(records, quick))  # workload 11
    from . import redis_backend

    out.extend(redis_backend.targets(records, quick))  # workload 12
    from . import transactions

    out.extend(transactions.targets(records, quick))  # workload 13
    from . import bigdict_report

    out.extend(bigdict_report.targets(records, quick))  # workload 14
    from . import durable

    out.extend(durable.targets(records, quick))  # workload 16
    from . import documents

    out.extend(documents.targets(records, quick))  # workload 17
    from . import cache_report

    out.extend(cache_report.targets(records, quick))  # workload 15
    return out


def _count(n: int) -> str:
    from .util import fmt_count

    return fmt_count(n)


def targets_text(rows: list[dict[str, Any]]) -> str:
    lines = ["", "== targets (measured in this run) =="]
    for r in rows:
        m = r.get("measured_text") or ("-" if r["measured"] is None else f"{r['measured']:.2f}x")
        status = r["status"] + ("*" if r.get("caveat") else "")
        lines.append(f"  {status:<5} {r['target']:<58} measured {m:>8}  (target {r['need']})")
        lines.append(f"        {r['detail']}")
        if r.get("caveat"):
            lines.append(f"        * {r['caveat']}")
    return "\n".join(lines)


# -- JSON -----------------------------------------------------------------------------------


def machine_info(versions: dict[str, str], load_at_start: Any = None) -> dict[str, Any]:
    load = load_at_start
    cpu_model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "mem_bytes": mem,
        "loadavg_at_start": load,
        "python": sys.version,
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "ultradict_ng_source": source_digest(),
        "packages": {
            **versions,
            **{f"({dist})": _dist_version(dist) for dist in ("msgpack", "atomics", "matplotlib", "psutil")},
        },
    }


def source_digest() -> dict[str, Any]:
    """Which ultradict_ng source was measured (others edit it while benchmarks run)."""
    import hashlib

    try:
        import ultradict_ng

        root = os.path.dirname(ultradict_ng.__file__)
        h = hashlib.sha256()
        newest = 0.0
        for folder, dirs, files in sorted(os.walk(root)):  # subpackages too (redis_backend, ...)
            dirs.sort()
            for name in sorted(files):
                if name.endswith((".py", ".c")):
                    path = os.path.join(folder, name)
                    with open(path, "rb") as f:
                        h.update(os.path.relpath(path, root).encode() + b"\0" + f.read())
                    newest = max(newest, os.path.getmtime(path))
        import datetime

        from ultradict_ng import speedups

        return {
            "path": root,
            "sha256_of_py_and_c_files": h.hexdigest()[:16],
            # native (compiled helper), bound or public: see speedups.py
            "hot_path_implementation": speedups.IMPLEMENTATION,
            "newest_file_mtime": datetime.datetime.fromtimestamp(newest)
            .astimezone()
            .isoformat(timespec="seconds"),
        }
    except Exception as exc:
        return {"error": repr(exc)}


def _dist_version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "not installed"


def write_json(path: str, payload: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1, default=str)
    os.replace(tmp, path)


# -- plot -----------------------------------------------------------------------------------


def plot(path: str, records: list[dict[str, Any]], workloads: list[tuple[str, int, str]]) -> Optional[str]:
    """One panel per workload; returns None or why there is no plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"matplotlib unavailable ({exc.__class__.__name__}): no plot"
    present = [
        (wl, no, title)
        for wl, no, title in workloads  # (14 and 15 have figures of their own)
        if wl not in ("bigdict", "cache") and any(r["workload"] == wl and r["median"] for r in records)
    ]
    if not present:
        return "nothing to plot"
    cols = min(4, len(present))
    rows = math.ceil(len(present) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.8 * rows), squeeze=False)
    contenders = [c for c in ORDER if any(r["contender"] == c for r in records)]
    # tab10 for the first ten (unchanged colours), then tab20's light shades
    colors = {c: plt.cm.tab10(i) if i < 10 else plt.cm.tab20(2 * (i - 10) + 1) for i, c in enumerate(ORDER)}
    for ax in axes.flat[len(present) :]:
        ax.axis("off")
    for ax, (wl, no, title) in zip(axes.flat, present):
        recs = [r for r in records if r["workload"] == wl and not r.get("note_only")]
        unit = recs[0]["unit"] if recs else ""
        if wl == "growth":
            _plot_growth(ax, recs, contenders, colors)
        elif wl == "big":
            _plot_big(ax, recs, contenders, colors)
            title = "large values: 1st read in another process"
        elif wl == "wakeup":
            from . import wake_report

            title = wake_report.plot_panel(ax, recs)
            ax.set_title(f"{no}. {title}", fontsize=9)
            ax.grid(True, axis="y", alpha=0.3)
            continue  # its own y label (µs)
        elif wl == "pool":
            from . import pool

            title = pool.plot_panel(ax, recs)
            ax.set_title(f"{no}. {title}", fontsize=9)
            ax.grid(True, axis="y", alpha=0.3)
            continue  # its own y label and colours (contenders of its own)
        elif wl == "redis":
            from . import redis_backend

            title = redis_backend.plot_panel(ax, recs)
            ax.set_title(f"{no}. {title}", fontsize=9)
            ax.grid(True, axis="y", alpha=0.3)
            continue  # its own y label and colours (contenders of its own)
        elif wl == "transactions":
            from . import transactions

            title = transactions.plot_panel(ax, recs)
            ax.set_title(f"{no}. {title}", fontsize=9)
            ax.grid(True, axis="y", alpha=0.3)
            continue
        elif wl == "durable":
            from . import durable

            title = durable.plot_panel(ax, recs)
            ax.set_title(f"{no}. {title}", fontsize=9)
            ax.grid(True, axis="x", alpha=0.3)
            continue
        elif wl == "documents":
            from . import documents

            title = documents.plot_panel(ax, recs)
            ax.set_title(f"{no}. {title}", fontsize=9)
            ax.grid(True, axis="y", alpha=0.3)
            continue
        else:
            cases = _cases(recs, wl)
            width = 0.8 / max(1, len(contenders))
            vals = []
            for i, c in enumerate(contenders):
                xs, ys, lo, hi = [], [], [], []
                for j, case in enumerate(cases):
                    r = find(recs, wl, case, c)
                    if r and r["median"]:
                        xs.append(j + (i - (len(contenders) - 1) / 2) * width)
                        ys.append(r["median"])
                        lo.append(r["median"] - r["min"])
                        hi.append(r["max"] - r["median"])
                        vals.append(r["median"])
                if xs:
                    ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, color=colors[c], label=_label(c))
            ax.set_xticks(range(len(cases)))
            ax.set_xticklabels(
                cases,
                rotation=20 if len(cases) > 2 else 0,
                fontsize=8,
                ha="right" if len(cases) > 2 else "center",
            )
            if vals and max(vals) / max(min(vals), 1e-30) > 20:
                ax.set_yscale("log")
        ax.set_title(f"{no}. {title}", fontsize=9)
        ax.set_ylabel(_rescale(ax, unit))
        ax.grid(True, axis="y", alpha=0.3)
    handles, labels = [], []
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    # As many legend columns as the figure is wide; room below the panels for its rows.
    ncol = max(1, min(len(labels), 7, 2 * cols))
    legend_rows = math.ceil(len(labels) / ncol) if labels else 0
    if labels:  # (none when only workload 10 ran: its panel names its bars)
        fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=9)
    fig.tight_layout(rect=(0, min(0.4, (0.3 * legend_rows + 0.15) / (4.8 * rows)), 1, 1))
    tmp = path + ".tmp"
    fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return None


def _rescale(ax: Any, unit: str) -> str:
    """Show small times in ms or µs rather than in seconds with exponents."""
    if unit not in ("s", "s/op") or ax.get_yscale() == "log":
        return unit
    top = ax.get_ylim()[1]
    for factor, name in ((1e6, "µs"), (1e3, "ms")):
        if top * factor < 5000 and top < 1:
            from matplotlib.ticker import FuncFormatter

            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p, f=factor: f"{v * f:g}"))
            return name + unit[1:]
    return unit


def _plot_growth(ax: Any, recs: list[dict[str, Any]], contenders: list[str], colors: dict[str, Any]) -> None:
    for c in contenders:
        for kind, style in (("write", "-"), ("read", "--")):
            pts = sorted(
                (r["params"]["size"], r["median"])
                for r in recs
                if r["contender"] == c and r["params"].get("kind") == kind and r["median"]
            )
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    style,
                    marker="o",
                    markersize=3,
                    color=colors[c],
                    label=_label(c) if kind == "write" else None,
                )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("keys in the dict (solid: write, dashed: read)")


def _plot_big(ax: Any, recs: list[dict[str, Any]], contenders: list[str], colors: dict[str, Any]) -> None:
    """1st read in the other process vs value size: solid numpy, dashed bytes."""
    for c in contenders:
        for kind, style in (("numpy", "-"), ("bytes", "--")):
            pts = sorted(
                (r["params"]["value_bytes"], r["median"])
                for r in recs
                if r["contender"] == c
                and r["params"].get("kind") == kind
                and r["params"].get("metric") == "1st read"
                and r["median"]
            )
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    style,
                    marker="o",
                    markersize=3,
                    color=colors[c],
                    label=_label(c),
                )
    from .big import size_label

    sizes = sorted({r["params"]["value_bytes"] for r in recs if r["median"]})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([size_label(x) for x in sizes], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("value size (solid: numpy array, dashed: bytes)")
