"""Workload 17 (``documents``): JSON-like values read back, against decoding them.

What web applications and workers keep -- a session, a user record, an API
response: small dicts and lists, not only scalars -- must come back as the
caller's own copy.  This times, in a spawned process that did not write
them, one read of such a value:

* ``d[k]`` of a ``SharedDict`` the harness wrote (the reader's first read
  decodes and caches it; every read hands out a copy);
* ``SharedCache.get`` of the same value;
* and, for the floor a copy must beat, ``msgpack.unpackb`` and
  ``pickle.loads`` of its bytes and ``json.loads`` of its JSON text;
  ``cachetools.LRUCache.get`` (one process, hands out its own object: no
  copy) and ``diskcache.Cache.get`` for scale.

Two documents: the small one of a session or user record (76 bytes of
msgpack) and one of ~1 KB (an order with 16 lines).  Repetitions interleave
the contenders, order rotated; ``--quick``: 3 repetitions of 0.1 s, full:
7 of ``box``.  Targets: ``d[k]`` >= 1x ``msgpack.unpackb`` for both.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
import time
from typing import Any, Callable, Optional

from .run import Run
from .util import calibrate, fmt_rate, no_gc

WL = "documents"
NUMBER = 17
TITLE = "JSON-like values: a read in another process vs decoding the value's bytes"
ENTRY: tuple[str, int, str] = (WL, NUMBER, TITLE)
ALIASES = {"docs": WL, "document": WL, "json": WL}

SMALL = {"user": 42, "name": "x" * 50, "tags": ["a", "b", "c"]}
ORDER_DOC = {
    "id": 7,
    "customer": {"name": "Ada", "email": "ada@example.com", "vip": True},
    "lines": [{"sku": f"s{i:04d}", "qty": i, "price": 1.5 * i, "tags": ["x", "y"]} for i in range(16)],
    "meta": {"source": "web", "note": None},
}
DOCS = {"small": SMALL, "1kb": ORDER_DOC}
CASES = {"small": "small document (a user record)", "1kb": "~1 KB document (an order)"}
CONTENDERS = ["ours", "cache", "unpackb", "pickle", "json", "lru", "diskcache"]
LABELS = {
    "ours": "ultradict_ng d[k]",
    "cache": "ultradict_ng SharedCache.get",
    "unpackb": "msgpack.unpackb(bytes)",
    "pickle": "pickle.loads(bytes)",
    "json": "json.loads(text)",
    "lru": "cachetools.LRUCache.get (no copy)",
    "diskcache": "diskcache.Cache.get",
}
#: (contender, peer, need): our median rate / the peer's >= need, for each document.
TARGETS = [("ours", "unpackb", 1.0)]


def _readers(spec: dict[str, Any], doc: str) -> dict[str, Callable[[], Any]]:
    """One read of the document per contender (what is missing is skipped)."""
    import msgpack

    from ultradict_ng import SharedDict
    from ultradict_ng.cache import SharedCache

    value = DOCS[doc]
    d = SharedDict(name=spec["name"])
    c = SharedCache(name=spec["cache"])
    packed, pickled, text = msgpack.packb(value), pickle.dumps(value, 5), json.dumps(value)
    out: dict[str, Callable[[], Any]] = {
        "ours": lambda: d[doc],
        "cache": lambda: c.get(doc),
        "unpackb": lambda: msgpack.unpackb(packed),
        "pickle": lambda: pickle.loads(pickled),
        "json": lambda: json.loads(text),
    }
    try:
        import cachetools

        lru: Any = cachetools.LRUCache(1000)
        lru[doc] = value
        out["lru"] = lambda: lru.get(doc)
    except ImportError:
        pass
    try:
        import diskcache

        dc = diskcache.Cache(os.path.join(spec["dir"], doc))
        dc.set(doc, value)
        out["diskcache"] = lambda: dc.get(doc)
    except ImportError:
        pass
    for name, read in out.items():
        if read() != value:
            raise AssertionError(f"{name} read back {read()!r}")
    return out


def _loop(read: Callable[[], Any]) -> Callable[[int], float]:
    def loop(n: int) -> float:
        with no_gc():
            t0 = time.perf_counter()
            for _ in range(n):
                read()
            return time.perf_counter() - t0

    return loop


def child(spec: dict[str, Any], q: Any) -> None:
    """Rates per document and contender: ``{doc: {contender: [ops/s, ...]}}``."""
    try:
        rates: dict[str, dict[str, list[float]]] = {}
        for doc in DOCS:
            readers = _readers(spec, doc)
            loops = {c: _loop(r) for c, r in readers.items()}
            ops = {c: calibrate(f, spec["box"]) for c, f in loops.items()}
            names = list(loops)
            got: dict[str, list[float]] = {c: [] for c in names}
            for rep in range(spec["reps"]):
                for j in range(len(names)):
                    c = names[(rep + j) % len(names)]
                    got[c].append(ops[c] / loops[c](ops[c]))
            rates[doc] = got
        q.put({"rates": rates})
    except BaseException as exc:
        q.put({"error": f"{type(exc).__name__}: {exc}"})


def w_documents(run: Run, contenders: list[str]) -> None:
    from ultradict_ng import SharedDict
    from ultradict_ng.cache import SharedCache

    from .cache import _run_child, _unlink_ours

    name, cname = run.new_name(), run.new_name()
    for n in (name, cname):
        run.own(n, lambda n=n: _unlink_ours(n), "ultradict_ng")
    tmp = tempfile.mkdtemp(prefix=f"{run.name_prefix}-documents-")
    run.own(tmp, lambda: shutil.rmtree(tmp, ignore_errors=True), f"workload {NUMBER} directory")
    try:
        d = SharedDict(name=name, create=True, auto_unlink=False)
        c = SharedCache(name=cname, maxsize=1000, auto_unlink=False)
        try:
            for doc, value in DOCS.items():
                d[doc] = value
                c.set(doc, value)
        finally:
            d.close()
            c.close()
        spec = {
            "name": name,
            "cache": cname,
            "dir": tmp,
            "box": run.box,
            "reps": run.repeat if run.quick else max(run.repeat, 7),
        }
        got = _run_child(run, child, spec, 600)
    finally:
        for n in (name, cname):
            _unlink_ours(n)
            run.disown(n)
        shutil.rmtree(tmp, ignore_errors=True)
        run.disown(tmp)
    for doc in DOCS:
        for cont in CONTENDERS:
            params = {"doc": doc, "contender": cont}
            values = (got.get("rates") or {}).get(doc, {}).get(cont)
            rec = run.record(
                WL,
                CASES[doc],
                cont,
                unit="ops/s",
                better="higher",
                values=values or [],
                params=params,
                error=got.get("error"),
                skipped=None if values or "error" in got else "not installed",
            )
            rec["label"] = LABELS[cont]
    if "error" in got:
        run.alert(f"workload {NUMBER}: {got['error']}")
    run.note(
        "one spawned reader that did not write the values; contenders interleaved, order rotated; "
        "gc off inside timed loops",
        WL,
    )


def _find(recs: list[dict[str, Any]], doc: str, cont: str) -> Optional[dict[str, Any]]:
    for r in recs:
        if r["workload"] == WL and r["params"].get("doc") == doc and r["params"].get("contender") == cont:
            return r
    return None


def section(recs: list[dict[str, Any]], number: int, title: str, notes: list[str]) -> str:
    lines = [
        "",
        f"== {number}. {title} ==",
        "   unit: reads/s (higher is better); x unpackb: this row / unpackb",
    ]
    for doc in DOCS:
        lines.append(f"  {CASES[doc]}")
        ref = _find(recs, doc, "unpackb")
        for cont in CONTENDERS:
            r = _find(recs, doc, cont)
            if r is None:
                continue
            if r["median"] is None:
                lines.append(f"    {LABELS[cont]:<36}{str(r.get('skipped') or r.get('error') or '-')[:120]}")
                continue
            q = r["median"] / ref["median"] if ref and ref["median"] else None
            lines.append(
                f"    {LABELS[cont]:<36}{fmt_rate(r['median']):>8}  "
                f"{fmt_rate(r['min'])} .. {fmt_rate(r['max']):<8}{r['n']:>3}"
                f"{'-' if q is None else f'{q:.2f}x':>9}"
            )
    lines.extend(f"   note: {n}" for n in notes)
    return "\n".join(lines)


def targets(recs: list[dict[str, Any]], quick: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for doc in DOCS:
        for cont, peer, need in TARGETS:
            a, b = _find(recs, doc, cont), _find(recs, doc, peer)
            if a is None and b is None:
                continue
            row: dict[str, Any] = {
                "target": f"documents: {LABELS[cont]} >= {need:g}x {LABELS[peer]} ({CASES[doc]})",
                "need": f">= {need:g}x",
            }
            if not a or not b or not a["median"] or not b["median"]:
                row.update(measured=None, status="n/a", detail="not measured")
            else:
                q = a["median"] / b["median"]
                row.update(
                    measured=q,
                    status="PASS" if q >= need else "MISS",
                    detail=f"{fmt_rate(a['median'])}/s vs {fmt_rate(b['median'])}/s "
                    f"(medians of {a['n']} / {b['n']})",
                )
                if quick:
                    row["caveat"] = "--quick repetitions"
            out.append(row)
    return out


def plot_panel(ax: Any, recs: list[dict[str, Any]]) -> str:
    """Median reads/s per contender, one group per document (whiskers min..max), log scale."""
    width = 0.8 / len(CONTENDERS)
    for i, cont in enumerate(CONTENDERS):
        xs, ys, lo, hi = [], [], [], []
        for j, doc in enumerate(DOCS):
            r = _find(recs, doc, cont)
            if r and r["median"]:
                xs.append(j + (i - (len(CONTENDERS) - 1) / 2) * width)
                ys.append(r["median"])
                lo.append(r["median"] - r["min"])
                hi.append(r["max"] - r["median"])
        if xs:
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=LABELS[cont])
    ax.set_xticks(range(len(DOCS)))
    ax.set_xticklabels([CASES[d] for d in DOCS], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("reads/s (median)")
    ax.legend(fontsize=6)
    return "JSON-like values: reads vs decoding"
