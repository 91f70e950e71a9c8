"""Workload 14's table, its targets (against py-lmdb) and its plots.

The section prints one block per dict size (rows: contenders; columns: the
metrics of :mod:`perf.bigdict`).  The targets compare ultradict_ng's
``SharedDict`` with py-lmdb at the largest size measured (the targets are
set at 1M keys; smaller runs are marked), and list the table's own figures beside
them (what SharedDict reads in place, without SharedDict around it).  The plot is
a figure of its own, ``bigdict.png`` next to ``latest.png``: each metric
against dict size, log-log, one line per contender.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from .bigdict import CONTENDERS, LABELS, WL

COLUMNS = [
    ("load", "load s"),
    ("open", "open+1st ms"),
    ("random", "random M/s"),
    ("hot", "hot M/s"),
    ("private", "private MiB"),
    ("items", "items() s"),
    ("readers8", "8 readers MiB"),
    ("writes", "writes k/s"),
    ("wprivate", "writer MiB"),
]


def _find(recs: list[dict[str, Any]], size: int, contender: str, metric: str) -> Optional[dict[str, Any]]:
    for r in recs:
        p = r.get("params") or {}
        if (
            r["workload"] == WL
            and p.get("size") == size
            and p.get("contender") == contender
            and p.get("metric") == metric
        ):
            return r
    return None


def _median(recs: list[dict[str, Any]], size: int, contender: str, metric: str) -> Optional[float]:
    r = _find(recs, size, contender, metric)
    return None if r is None or r.get("median") is None else float(r["median"])


def _cell(recs: list[dict[str, Any]], size: int, contender: str, metric: str) -> str:
    r = _find(recs, size, contender, metric)
    if r is None:
        return "-"
    if r.get("skipped"):
        return "skip"
    if r.get("median") is None:
        return "FAIL"
    m = float(r["median"])
    if metric == "open":
        return f"{m * 1e3:.2f}"
    if metric in ("random", "hot"):
        return f"{m / 1e6:.2f}"
    if metric == "writes":
        return f"{m / 1e3:.1f}"
    if metric in ("load", "items"):
        return f"{m:.3f}"
    return f"{m:.1f}"


def sizes_of(recs: list[dict[str, Any]]) -> list[int]:
    return sorted({int(r["params"]["size"]) for r in recs if r["workload"] == WL and r.get("params")})


def section(recs: list[dict[str, Any]], number: int, title: str, notes: list[str]) -> str:
    lines = [
        "",
        f"== {number}. {title} ==",
        "   medians; ops/s in millions; private = anonymous memory a reader added",
    ]
    for size in sizes_of(recs):
        lines.append(f"  {size:,} keys")
        lines.append("    " + f"{'':<40}" + "".join(f"{h:>15}" for _, h in COLUMNS))
        for c in CONTENDERS:
            if not any(_find(recs, size, c, m) for m, _ in COLUMNS):
                continue
            skipped = _find(recs, size, c, "load")
            if skipped and skipped.get("skipped"):
                lines.append(f"    {LABELS[c]:<40}skipped: {skipped['skipped']}")
                continue
            lines.append(
                f"    {LABELS[c]:<40}" + "".join(f"{_cell(recs, size, c, m):>15}" for m, _ in COLUMNS)
            )
    for n in notes:
        lines.append(f"   note: {n}")
    return "\n".join(lines)


#: (metric, target, need, higher is better): ours / py-lmdb's median against _LIMITS.
_TARGETS: list[tuple[str, str, str, bool]] = [
    ("open", "open + first read in a fresh process <= 1.5x py-lmdb's", "<= 1.5x", False),
    ("load", "bulk load <= 1.0x py-lmdb's time", "<= 1.0x", False),
    ("random", "random-key reads in a fresh process >= 1.2x py-lmdb get + unpackb", ">= 1.2x", True),
    ("items", "items() over all keys <= 1.0x py-lmdb cursor + unpackb", "<= 1.0x", False),
]
_LIMITS = {"open": 1.5, "load": 1.0, "random": 1.2, "items": 1.0}


def targets(recs: list[dict[str, Any]], quick: bool) -> list[dict[str, Any]]:
    sizes = sizes_of(recs)
    if not sizes:
        return []
    size = max(s for s in sizes if _median(recs, s, "lmdb", "open") is not None or s == min(sizes))
    out: list[dict[str, Any]] = []
    for contender in ("ultradict_ng", "uncached", "table"):
        tag = {
            "ultradict_ng": "",
            "uncached": " [max_decoded=0]",
            "table": " [the table through its own API]",
        }[contender]
        for metric, text, need, higher in _TARGETS:
            ours, peer = _median(recs, size, contender, metric), _median(recs, size, "lmdb", metric)
            row: dict[str, Any] = {"target": f"big dict ({size:,} keys): {text}{tag}", "need": need}
            if ours is None or peer is None or not ours or not peer:
                row.update(measured=None, status="n/a", detail="not measured")
            else:
                q = ours / peer
                ok = q >= _LIMITS[metric] if higher else q <= _LIMITS[metric]
                row.update(
                    measured=q,
                    status="PASS" if ok else "MISS",
                    detail=f"{contender} {ours:.4g} vs py-lmdb {peer:.4g}",
                )
            if size != 1_000_000:
                row["caveat"] = f"measured at {size:,} keys, the targets are at 1M"
            out.append(row)
        hot = _find(recs, size, contender, "hot")
        row = {
            "target": f"big dict ({size:,} keys): hot-key reads >= 0.5x a plain dict{tag}",
            "need": ">= 0.5x",
        }
        if hot is None or hot.get("median") is None:
            row.update(measured=None, status="n/a", detail="not measured")
        else:
            ref = sorted(hot["params"]["dict_hot"])[len(hot["params"]["dict_hot"]) // 2]
            q = float(hot["median"]) / ref
            row.update(
                measured=q,
                status="PASS" if q >= 0.5 else "MISS",
                detail=f"{contender} {float(hot['median']) / 1e6:.2f} M/s vs dict {ref / 1e6:.2f} M/s",
            )
        out.append(row)
        eight = _find(recs, size, contender, "readers8")
        if eight is not None and eight.get("median") is not None:
            shared = float(eight["params"]["shared_mib"])
            out.append(
                {
                    "target": f"big dict ({size:,} keys): 8 readers' private memory together <= the dict's "
                    f"shared memory{tag}",
                    "need": "<= 1.0x",
                    "measured": float(eight["median"]) / shared if shared else None,
                    "status": "PASS" if float(eight["median"]) <= shared else "MISS",
                    "detail": f"{float(eight['median']):.0f} MiB private vs {shared:.0f} MiB shared",
                }
            )
        ours, peer = _median(recs, size, contender, "private"), _median(recs, size, "lmdb", "private")
        row = {
            "target": f"big dict ({size:,} keys): a reader's private memory after 100k random reads "
            f"<= 1.5x py-lmdb's + 16 MiB{tag}",
            "need": "<= 1.5x + 16 MiB",
        }
        if ours is None or peer is None:
            row.update(measured=None, status="n/a", detail="not measured")
        else:
            ok = ours <= 1.5 * peer + 16
            row.update(
                measured=ours,
                status="PASS" if ok else "MISS",
                detail=f"{contender} {ours:.1f} MiB vs py-lmdb {peer:.1f} MiB",
            )
        out.append(row)
    return out


def plot(path: str, recs: list[dict[str, Any]]) -> Optional[str]:
    """``bigdict.png``: each metric against dict size; None, or why there is no plot."""
    sizes = sizes_of(recs)
    if len(sizes) < 1:
        return "workload 14 did not run"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"matplotlib unavailable ({exc.__class__.__name__})"
    fig, axes = plt.subplots(2, 5, figsize=(24, 8.5), squeeze=False)
    scale = {
        "open": (1e3, "ms"),
        "random": (1e-6, "M reads/s"),
        "hot": (1e-6, "M reads/s"),
        "load": (1, "s"),
        "items": (1, "s"),
        "private": (1, "MiB"),
        "readers8": (1, "MiB (8 readers)"),
        "writes": (1e-3, "k writes/s"),
        "wprivate": (1, "MiB (a writer)"),
    }
    for ax, (metric, head) in zip(axes.flat, COLUMNS):
        for i, c in enumerate(CONTENDERS):  # (one colour per contender in every panel, drawn or not)
            pts = [(s, _median(recs, s, c, metric)) for s in sizes]
            pts = [(s, v) for s, v in pts if v]
            if pts:
                ax.plot(
                    [s for s, _ in pts],
                    [v * scale[metric][0] for _, v in pts],
                    marker="o",
                    label=LABELS[c],
                    color=f"C{i}",
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("keys")
        ax.set_ylabel(scale[metric][1])
        ax.set_title(head, fontsize=10)
        ax.grid(True, alpha=0.3)
    axes.flat[-1].axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    for ax in axes.flat[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower right", fontsize=9, bbox_to_anchor=(0.98, 0.12))
    fig.suptitle("14. a big dict read by fresh processes, against dict size")
    fig.tight_layout()
    tmp = path + ".tmp"
    fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return None
