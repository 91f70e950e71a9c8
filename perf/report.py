"""What a run shows and keeps: tables on stdout, targets, ``latest.json``, a pyperf suite, the plot.

Every workload's table, target rows and plot panel come from its entry in
:mod:`perf.registry`; nothing here knows one workload from another.  The run's
metadata (CPU, Python build, load, timer) is pyperf's, and every measurement is
also written as a pyperf benchmark (``latest.pyperf.json``), so two runs compare
with ``python -m pyperf compare_to old.pyperf.json new.pyperf.json``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import textwrap
from datetime import datetime
from typing import Any, Optional

from .registry import Record, Workload
from .util import fmt_value


def _blocks(w: Workload, recs: list[Record]) -> dict[str, dict[str, list[Record]]]:
    """block -> row -> records, in the order they were recorded."""
    out: dict[str, dict[str, list[Record]]] = {}
    for r in recs:
        if r.get("note_only"):
            continue
        block, row = w.keys(r) if w.keys else ("", r["case"])
        out.setdefault(block, {}).setdefault(row, []).append(r)
    return out


def section(w: Workload, recs: list[Record], notes: list[str]) -> str:
    """One workload's tables: per row, each contender's median, spread and ratio to ``w.ref``."""
    recs = [r for r in recs if r["workload"] == w.name]
    if not recs:
        return ""
    mixed = len({r["better"] for r in recs}) > 1
    lines = [
        "",
        f"== {w.number}. {w.title} ==",
        f"   {'' if mixed else recs[0]['better'] + ' is better; '}median, min - max over the repetitions; "
        f"{w.ref} ahead = how many times better {w.ref}'s median is than this row's",
    ]
    for block, rows in _blocks(w, recs).items():
        if block:
            lines.append(f"  == {block} ==")
        for row, cells in rows.items():
            lines.append(f"  -- {row} --" + (f" ({cells[0]['better']} is better)" if mixed else ""))
            ref = next((r for r in cells if r["contender"] == w.ref and r["median"]), None)
            for r in cells:
                label = str(r.get("label") or r["contender"])[:40]
                if r.get("skipped"):
                    lines.append(f"  {label:<40}{'skipped':>12}  {r['skipped']}")
                    continue
                if r["median"] is None:
                    err = str(r.get("error_short") or r.get("error") or "no value").replace("\n", " ")
                    lines.append(f"  {label:<40}{'FAILED':>12}  {err[:220]}")
                    continue
                unit = r["unit"]
                spread = f"{fmt_value(r['min'], unit)} - {fmt_value(r['max'], unit)}"
                higher = r["better"] == "higher"
                ahead = ref["median"] / r["median"] if ref and higher else 0.0
                ahead = r["median"] / ref["median"] if ref and not higher else ahead
                ratio = f"{ahead:.3g}x" if ahead else ""
                extra = "  ".join(f"{k}: {v}" if k != "note" else str(v) for k, v in r["show"].items())
                med = fmt_value(r["median"], unit)
                lines.append(f"  {label:<40}{med:>12}  {spread:<25}{ratio:>8}  {extra}".rstrip())
    lines += [f"   note: {n}" for n in notes]
    return "\n".join(lines)


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


# -- metadata and files -----------------------------------------------------------------------


def machine_info(versions: dict[str, str], load_at_start: Any = None) -> dict[str, Any]:
    """pyperf's metadata of this machine and Python, plus what ultradict_ng was measured."""
    meta: dict[str, Any] = {"cpu_count": os.cpu_count(), "loadavg_at_start": load_at_start}
    try:
        import pyperf

        run = pyperf.Run([1.0], metadata={"name": "metadata"}, collect_metadata=True)
        meta["pyperf"] = {k: v for k, v in run.get_metadata().items() if k not in ("name", "unit")}
        meta["cpu_model"] = meta["pyperf"].get("cpu_model_name", "")
        meta["python"] = meta["pyperf"].get("python_version", "")
    except ImportError:
        import platform
        import sys

        meta.update(python=sys.version, platform=platform.platform(), cpu_model="")
    meta["ultradict_ng_source"] = source_digest()
    meta["packages"] = {**versions, **{f"({d})": _dist_version(d) for d in ("msgpack", "atomics", "pyperf")}}
    return meta


def source_digest() -> dict[str, Any]:
    """Which ultradict_ng source was measured (others edit it while benchmarks run)."""
    try:
        import ultradict_ng
        from ultradict_ng import speedups

        root = os.path.dirname(ultradict_ng.__file__)
        h = hashlib.sha256()
        newest = 0.0
        for folder, dirs, files in sorted(os.walk(root)):
            dirs.sort()
            for name in sorted(f for f in files if f.endswith((".py", ".c", ".h"))):
                path = os.path.join(folder, name)
                with open(path, "rb") as f:
                    h.update(os.path.relpath(path, root).encode() + b"\0" + f.read())
                newest = max(newest, os.path.getmtime(path))
        return {
            "path": root,
            "sha256_of_py_and_c_files": h.hexdigest()[:16],
            "hot_path_implementation": speedups.IMPLEMENTATION,
            "newest_file_mtime": datetime.fromtimestamp(newest).astimezone().isoformat(timespec="seconds"),
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


#: How a record's unit becomes a pyperf unit (a rate becomes seconds per operation).
_PYPERF_UNITS = {"s": "second", "s/op": "second", "ops/s": "second", "MiB": "byte", "count": "integer"}


def write_pyperf(path: str, records: list[Record]) -> Optional[str]:
    """Every measured record as a pyperf benchmark; returns None or why there is no file."""
    try:
        import pyperf
    except ImportError:
        return "pyperf is not installed"
    benches = []
    for r in records:
        unit = _PYPERF_UNITS.get(r["unit"])
        vals = [float(v) for v in r["values"] if v and v > 0 and not math.isinf(v)]
        if unit is None or not vals or r.get("note_only"):
            continue
        if r["unit"] == "ops/s":
            vals = [1.0 / v for v in vals]
        elif r["unit"] == "MiB":
            vals = [v * 1024 * 1024 for v in vals]
        name = f"{r['workload']}: {r['case']}: {r['contender']}"
        if any(b.get_name() == name for b in benches):
            continue
        run = pyperf.Run(vals, metadata={"name": name, "unit": unit}, collect_metadata=False)
        benches.append(pyperf.Benchmark([run]))
    if not benches:
        return "nothing measured"
    tmp = path + ".tmp"
    pyperf.BenchmarkSuite(benches).dump(tmp, replace=True)
    os.replace(tmp, path)
    return None


# -- plot -------------------------------------------------------------------------------------


def bars(ax: Any, recs: list[Record]) -> None:
    """Median per row and contender, min - max as whiskers; log scale over a wide range."""
    import matplotlib.pyplot as plt

    rows: list[str] = []
    conts: list[str] = []
    for r in recs:
        if r["median"]:
            rows += [r["case"]] if r["case"] not in rows else []
            conts += [r["contender"]] if r["contender"] not in conts else []
    cmap = plt.cm.tab10 if len(conts) <= 10 else plt.cm.tab20
    width = 0.8 / max(1, len(conts))
    vals = []
    for i, c in enumerate(conts):
        xs, ys, lo, hi = [], [], [], []
        for j, case in enumerate(rows):
            r = next((x for x in recs if x["case"] == case and x["contender"] == c and x["median"]), None)
            if r:
                xs.append(j + (i - (len(conts) - 1) / 2) * width)
                ys.append(r["median"])
                lo.append(r["median"] - r["min"])
                hi.append(r["max"] - r["median"])
                vals.append(r["median"])
        label = next(str(x.get("label") or c) for x in recs if x["contender"] == c)
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, color=cmap(i), label=label)
    ax.set_xticks(range(len(rows)))
    tilt = 20 if len(rows) > 2 else 0
    labels = [textwrap.fill(r, 28) for r in rows]
    ax.set_xticklabels(labels, rotation=tilt, fontsize=7, ha="right" if tilt else "center")
    if vals and max(vals) / max(min(vals), 1e-30) > 20:
        ax.set_yscale("log")
    unit = recs[0]["unit"] if recs else ""
    ax.set_ylabel(f"{unit} ({'higher' if recs and recs[0]['better'] == 'higher' else 'lower'} is better)")


def plot(path: str, records: list[Record], workloads: list[Workload]) -> Optional[str]:
    """One panel per workload that has a measured record; returns None or why there is no plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"matplotlib unavailable ({exc.__class__.__name__}): no plot"
    present = [
        (w, [r for r in records if r["workload"] == w.name and not r.get("note_only")])
        for w in workloads
        if w.plot and any(r["workload"] == w.name and r["median"] for r in records)
    ]
    if not present:
        return "nothing to plot"
    cols = min(4, len(present))
    nrows = math.ceil(len(present) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.2 * cols, 4.8 * nrows), squeeze=False)
    for ax in axes.flat[len(present) :]:
        ax.axis("off")
    for ax, (w, recs) in zip(axes.flat, present):
        title = w.panel(ax, recs) if w.panel else None
        if w.panel is None:
            bars(ax, recs)
        ax.set_title(textwrap.fill(f"{w.number}. {title or w.title}", 70), fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    tmp = path + ".tmp"
    fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return None
