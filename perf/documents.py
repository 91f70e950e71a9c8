"""Workload 17 (``documents``): JSON-like values (a user record, an ~1 KB order) read
back in a spawned process that did not write them -- ``d[k]`` (a copy per read) and
``SharedCache.get`` -- against the floor a copy must beat: ``msgpack.unpackb`` and
``pickle.loads`` of the value's bytes, ``json.loads`` of its text; and, for scale,
``cachetools.LRUCache.get`` (one process, no copy) and ``diskcache.Cache.get``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import timeit
from typing import Any, Callable

from ultradict_ng import SharedDict
from ultradict_ng.cache import SharedCache

from .durable import owned, rates
from .registry import Target, Workload, pick, register
from .run import Run

WL = "documents"
TITLE = "JSON-like values: a read in another process vs decoding the value's bytes"
DOCS = {
    "small": {"user": 42, "name": "x" * 50, "tags": ["a", "b", "c"]},
    "1kb": {
        "id": 7,
        "customer": {"name": "Ada", "email": "ada@example.com", "vip": True},
        "lines": [{"sku": f"s{i:04d}", "qty": i, "price": 1.5 * i, "tags": ["x", "y"]} for i in range(16)],
        "meta": {"source": "web", "note": None},
    },
}
CASES = {"small": "small document (a user record)", "1kb": "~1 KB document (an order)"}
LABELS = {
    "ours": "ultradict_ng d[k]",
    "cache": "ultradict_ng SharedCache.get",
    "unpackb": "msgpack.unpackb(bytes)",
    "pickle": "pickle.loads(bytes)",
    "json": "json.loads(text)",
    "lru": "cachetools.LRUCache.get (no copy)",
    "diskcache": "diskcache.Cache.get",
}


def _rates(spec: dict[str, Any], doc: str) -> dict[Any, list[float]]:
    """Reads per second of the document by contender (those not installed are left out)."""
    import msgpack

    value = DOCS[doc]
    d, c = SharedDict(name=spec["name"]), SharedCache(name=spec["cache"])
    packed, pickled, text = msgpack.packb(value), pickle.dumps(value, 5), json.dumps(value)
    out: dict[str, Callable[[], Any]] = {
        "ours": lambda: d[doc],
        "cache": lambda: c.get(doc),
        "unpackb": lambda: msgpack.unpackb(packed),
        "pickle": lambda: pickle.loads(pickled),
        "json": lambda: json.loads(text),
    }
    with contextlib.suppress(ImportError):
        import cachetools

        lru: Any = cachetools.LRUCache(1000)
        lru[doc] = value
        out["lru"] = lambda: lru.get(doc)
    with contextlib.suppress(ImportError):
        import diskcache

        dc = diskcache.Cache(os.path.join(spec["dir"], doc))
        dc.set(doc, value)
        out["diskcache"] = lambda: dc.get(doc)
    for name, read in out.items():
        if read() != value:
            raise AssertionError(f"{name} read back {read()!r}")
    return rates(
        {(CASES[doc], k): timeit.Timer(read).timeit for k, read in out.items()}, spec["box"], spec["reps"]
    )


def child(spec: dict[str, Any]) -> dict[Any, list[float]]:
    return {**_rates(spec, "small"), **_rates(spec, "1kb")}


def w_documents(run: Run, contenders: list[str]) -> None:
    with owned(run, 2, f"{run.name_prefix}-documents-") as (name, cname, tmp):
        d = SharedDict(name=name, create=True, auto_unlink=False)
        c = SharedCache(name=cname, maxsize=1000, auto_unlink=False)
        for doc, value in DOCS.items():
            d[doc] = value
            c.set(doc, value)
        d.close()
        c.close()
        reps = run.repeat if run.quick else max(run.repeat, 7)
        spec = {"name": name, "cache": cname, "dir": tmp, "box": run.box, "reps": reps}
        got = run.call(child, spec, timeout=600)
    error = got.pop("error", None)
    for doc, case in CASES.items():
        for cont, label in LABELS.items():
            values = got.get((case, cont)) or []
            skipped = None if values or error else "not installed"
            params = {"doc": doc, "contender": cont}
            kw = {"unit": "ops/s", "better": "higher", "params": params, "error": error, "skipped": skipped}
            run.record(WL, case, cont, values=values, **kw)["label"] = label
    if error:
        run.alert(f"workload 17: {error}")
    run.note(
        "one spawned reader that did not write the values; contenders interleaved, order rotated; "
        "gc off inside timed loops",
        WL,
    )


_TEXT = "documents: ultradict_ng d[k] >= 1x msgpack.unpackb(bytes) ({})"
TARGETS = tuple(Target(_TEXT.format(c), 1, pick(WL, "ours", c), pick(WL, "unpackb")) for c in CASES.values())
register(Workload(WL, 17, TITLE, w_documents, ("docs", "document", "json"), targets=TARGETS, ref="ours"))
