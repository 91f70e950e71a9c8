"""Workload 15's spawned processes: the throughput parts, the hit ratios, the stampede workers.

A child imports what it measures before any timing, builds its contenders one
by one (one that cannot be built is reported skipped or failed, the others
run), and puts one dict on the queue (``{"error": ...}`` if it failed as a
whole).  It removes what it created in a ``finally``; the parent removes it
again by name if the child was killed.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import time
from collections import OrderedDict
from importlib import import_module
from typing import Any, Callable, Optional

from .util import calibrate, no_gc

#: Keys of the throughput parts (all present: every timed get is a hit).
KEYS = 1000
#: Django's MAX_ENTRIES and the caches' maxsize there: above KEYS, nothing is culled.
MAX_ENTRIES = 10_000
Loop = Callable[[int], float]


def dict_value(i: int) -> Any:
    return {"id": i, "name": f"user{i}", "score": 1.5, "tags": ["a", "b"]}


def str_value(i: int) -> Any:
    return f"user{i}"


def key(i: int) -> str:
    return f"user:{i}"


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _loop(fn: Callable[..., Any], args: list[Any], star: bool) -> Loop:
    """``loop(n)``: ``n`` calls of ``fn`` cycling over ``args``; returns the seconds."""

    def loop(n: int) -> float:
        it = itertools.islice(itertools.cycle(args), n)
        with no_gc():
            t0 = time.perf_counter()
            if star:
                for a in it:
                    fn(*a)
            else:
                for a in it:
                    fn(a)
            return time.perf_counter() - t0

    return loop


def _interleaved(cells: dict[tuple[str, str], Loop], reps: int, box: float) -> dict[tuple[str, str], Any]:
    """Calibrate every cell once, then ``reps`` rounds over all cells, the order rotated."""
    out: dict[tuple[str, str], Any] = {}
    for cell, loop in cells.items():
        try:
            out[cell] = {"values": [], "ops": calibrate(loop, box, min_ops=1, max_ops=5_000_000)}
        except Exception as exc:
            out[cell] = {"error": _err(exc)}
    live = [c for c in cells if "error" not in out[c]]
    for rep in range(reps):
        shift = rep % max(1, len(live))
        for cell in live[shift:] + live[:shift]:
            if "error" not in out[cell]:
                try:
                    out[cell]["values"].append(out[cell]["ops"] / cells[cell](out[cell]["ops"]))
                except Exception as exc:
                    out[cell] = {"error": _err(exc)}
    return out


def _versions(dists: list[str]) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for d in dists:
        try:
            out[d] = version(d)
        except PackageNotFoundError:
            out[d] = "not installed"
    return out


# -- throughput: the Django cache API, the plain API, the cachelib API -----------------------------


def _make(c: str, spec: dict[str, Any]) -> tuple[Any, Callable[..., Any], Callable[..., Any]]:
    """(cache, get, set) of a contender of the plain or the cachelib part."""
    if c in ("lru", "ttl"):
        import cachetools

        cache = cachetools.LRUCache(MAX_ENTRIES) if c == "lru" else cachetools.TTLCache(MAX_ENTRIES, ttl=600)
        return cache, cache.get, cache.__setitem__
    cl = {"threshold": MAX_ENTRIES, "default_timeout": 300}
    cache = {
        "ours": lambda: import_module("ultradict_ng.cache").SharedCache(spec["name"], maxsize=MAX_ENTRIES),
        "diskcache": lambda: import_module("diskcache").Cache(spec["dir"]),
        "cl_ours": lambda: import_module("ultradict_ng.integrations.cachelib").SharedCache(
            name=spec["name"], **cl
        ),
        "cl_simple": lambda: import_module("cachelib").SimpleCache(**cl),
        "cl_fs": lambda: import_module("cachelib").FileSystemCache(spec["dir"], **cl),
    }[c]()
    return cache, cache.get, cache.set


def _close(part: str, c: str, cache: Any) -> None:
    try:
        if c == "smd":
            cache._cache.shm.unlink()  # (its close() only unmaps)
            cache._cache.cleanup()
        elif (part, c) == ("plain", "ours"):
            cache.unlink()
            cache.close()
        elif part == "django" and c in ("redis", "ours"):
            cache.clear()  # (Redis: the workload's own server; ours: unlinked by the parent too)
            cache.close()
        elif part == "django" or c in ("diskcache", "cl_ours"):
            cache.close()  # (cl_ours: the last handle out removes it; the parent unlinks it too)
    except Exception:
        pass


def rates_child(spec: dict[str, Any]) -> dict[str, Any]:
    """get and set per contender and value kind: ``{"rows": {c: {value: {op: {values, ops}}}}}``.

    ``spec``: part, contenders, values, reps, box, versions (distributions); for
    Django ``caches`` (CACHES entries by contender), else name and dir.
    """
    made: dict[str, Any] = {}
    part = spec["part"]
    try:
        if part == "django":  # (Django's settings are configured once per process: one child for all)
            import django
            from django.conf import settings

            default = {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}
            settings.configure(CACHES={"default": default, **spec["caches"]}, INSTALLED_APPS=[], USE_TZ=True)
            django.setup()
            from django.core.cache import caches

            def make(c: str) -> tuple[Any, Callable[..., Any], Callable[..., Any]]:
                return caches[c], caches[c].get, caches[c].set
        else:
            make = functools.partial(_make, spec=spec)
        rows: dict[str, dict[str, Any]] = {}
        fns: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}
        for c in spec["contenders"]:
            try:
                made[c], g, s = make(c)
                fns[c], rows[c] = (g, s), {}
            except Exception as exc:
                if part == "django":
                    rows[c] = {"skipped": f"{spec['caches'][c]['BACKEND']}: {_err(exc)}"}
                else:
                    rows[c] = {"skipped" if isinstance(exc, ImportError) else "error": _err(exc)}
        keys = [key(i) for i in range(KEYS)]
        for kind in spec["values"]:
            value = dict_value if kind == "dict" else str_value
            pairs = [(k, value(i)) for i, k in enumerate(keys)]
            cells: dict[tuple[str, str], Loop] = {}
            for c, (g, s) in fns.items():
                try:
                    for k, v in pairs:  # every key present (also the warm-up)
                        s(k, v)
                    got = g(keys[7])
                    if got != value(7):
                        rows[c][kind] = {"error": f"read back {got!r}, not {value(7)!r}"}
                        continue
                except Exception as exc:
                    rows[c][kind] = {"error": _err(exc)}
                    continue
                cells[(c, "get")] = _loop(g, keys, False)
                cells[(c, "set")] = _loop(s, pairs, True)
            order = sorted(cells, key=lambda cell: cell[1] != "get")  # every get, then every set
            for (c, op), res in _interleaved({k: cells[k] for k in order}, spec["reps"], spec["box"]).items():
                rows[c].setdefault(kind, {})[op] = res
            for c in [c for c in fns if (c, "get") in cells]:  # still right after the set rounds?
                got = fns[c][0](keys[-1])
                if got != value(KEYS - 1):
                    rows[c][kind]["wrong"] = f"after the rounds, get returned {got!r}"
        return {"rows": rows, "versions": _versions(spec["versions"])}
    except BaseException as exc:
        return {"error": _err(exc)}
    finally:
        for c, cache in made.items():
            _close(part, c, cache)


# -- hit ratio ---------------------------------------------------------------------------------


def zipf_trace(alpha: float, nkeys: int, requests: int, seed: int) -> list[int]:
    """``requests`` keys of a Zipf(alpha) law over ``nkeys`` keys (ranks shuffled to key ids)."""
    rng = random.Random(seed)
    cum = list(itertools.accumulate(r**-alpha for r in range(1, nkeys + 1)))
    ranks = rng.choices(range(nkeys), cum_weights=cum, k=requests)
    ids = list(range(nkeys))
    rng.shuffle(ids)
    return [ids[r] for r in ranks]


def _replay(c: str, trace: list[int], size: int, names: dict[str, str]) -> tuple[int, Any]:
    """Hits of contender ``c`` over ``trace`` (get; on a miss set), and its stats()."""
    hits = 0
    if c == "exact":
        od: OrderedDict[int, int] = OrderedDict()
        move, pop = od.move_to_end, od.popitem
        for k in trace:
            if k in od:
                hits += 1
                move(k)
            else:
                od[k] = k
                if len(od) > size:
                    pop(last=False)
        return hits, None
    if c == "cachetools":
        import cachetools

        cache = cachetools.LRUCache(size)
        get, put = cache.get, cache.__setitem__
    else:
        from ultradict_ng.cache import SharedCache

        cache = SharedCache(names[c], maxsize=size, **({"cull_frequency": 3} if c == "ours_cull3" else {}))
        get, put = cache.get, cache.set
    try:
        for k in trace:
            if get(k) is None:
                put(k, k)
            else:
                hits += 1
        try:
            return hits, None if c == "cachetools" else dict(cache.stats())
        except Exception:
            return hits, None
    finally:
        if c != "cachetools":
            cache.unlink()
            cache.close()


def hit_child(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec``: alphas, nkeys, requests, size, contenders, names {contender: cache name}."""
    try:
        out: dict[str, Any] = {}
        for alpha in spec["alphas"]:
            trace = zipf_trace(alpha, spec["nkeys"], spec["requests"], seed=15)
            row: dict[str, Any] = {"distinct": len(set(trace))}
            for c in spec["contenders"]:
                t0 = time.perf_counter()
                try:
                    hits, stats = _replay(c, trace, spec["size"], spec["names"])
                    took = time.perf_counter() - t0
                    row[c] = {"hits": hits, "ratio": hits / len(trace), "seconds": took, "stats": stats}
                except Exception as exc:
                    row[c] = {"skipped" if isinstance(exc, ImportError) else "error": _err(exc)}
            out[str(alpha)] = row
        return {"alphas": out}
    except BaseException as exc:
        return {"error": _err(exc)}


# -- stampede ----------------------------------------------------------------------------------


def _compute(path: str, mode: str, arg: Any, seconds: float) -> dict[str, Any]:
    """The expensive function: one line per execution in ``path`` (O_APPEND), then a sleep."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{mode} {arg} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    time.sleep(seconds)
    return {"arg": arg, "by": os.getpid()}


def stampede_worker(wid: int, spec: dict[str, Any], barrier: Any, q: Any) -> None:
    """One of the processes: per round, both modes on a cold key, all released by ``barrier``."""
    path, seconds = spec["path"], spec["seconds"]
    cached_f: Optional[Callable[[Any], Any]] = None
    why = ""
    try:
        from ultradict_ng.cache import cached

        cached_f = cached(name=spec["name"], maxsize=128)(
            functools.partial(_compute, path, "cached", seconds=seconds)
        )
        cached_f(-1 - wid)  # warm-up on a key of its own: attach the cache before the timed rounds
    except Exception as exc:  # (the rounds still run: lru_cache is measured either way)
        why, cached_f = _err(exc), None
    lru_f = functools.lru_cache(maxsize=128)(functools.partial(_compute, path, "lru_cache", seconds=seconds))
    results: list[tuple[str, int, float, float, Optional[str]]] = []
    try:
        barrier.wait(timeout=120)
        for rnd in range(spec["rounds"]):
            for mode, fn in (("cached", cached_f), ("lru_cache", lru_f)):
                barrier.wait(timeout=120)
                if fn is None:
                    continue
                t0 = time.monotonic()
                err = None
                try:
                    got = fn(rnd)
                    if got.get("arg") != rnd:
                        err = f"wrong result {got!r}"
                except Exception as exc:
                    err = _err(exc)
                results.append((mode, rnd, t0, time.monotonic(), err))
        q.put({"wid": wid, "results": results, "cached_error": why})
    except BaseException as exc:
        q.put({"wid": wid, "error": _err(exc), "results": results})
        raise
