"""Workload 15's spawned processes: the Django part, the plain API part, the hit
ratios and the stampede workers (see :mod:`perf.cache`).

Every child imports what it measures before any timing, builds its contenders
one by one (a contender that cannot be built is reported skipped with the
reason, the others run), times them with the same loop shape, repetitions
interleaved (order rotated per repetition), and puts one dict on the queue:
``{"rows": {key: {...}}, ...}`` or ``{"error": ...}``.  A child removes what it
created in a ``finally`` (the parent removes it again by name if the child was
killed).
"""

from __future__ import annotations

import itertools
import os
import random
import time
from typing import Any, Callable, Optional

from .util import calibrate, no_gc

#: Keys of the throughput parts (all present: every timed get is a hit).
KEYS = 1000
#: Django's MAX_ENTRIES and the caches' maxsize there: above KEYS, nothing is culled.
MAX_ENTRIES = 10_000


def dict_value(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"user{i}", "score": 1.5, "tags": ["a", "b"]}


def str_value(i: int) -> str:
    return f"user{i}"


def key(i: int) -> str:
    return f"user:{i}"


def _loop(fn: Callable[..., Any], args: list[Any], star: bool) -> Callable[[int], float]:
    """``loop(n)``: ``n`` calls of ``fn`` cycling over ``args``; returns the seconds."""

    def loop(n: int) -> float:
        it = itertools.islice(itertools.cycle(args), n)
        with no_gc():
            if star:
                t0 = time.perf_counter()
                for a in it:
                    fn(*a)
                return time.perf_counter() - t0
            t0 = time.perf_counter()
            for a in it:
                fn(a)
            return time.perf_counter() - t0

    return loop


def _interleaved(
    cells: dict[tuple[str, str], Callable[[int], float]], order: list[tuple[str, str]], reps: int, box: float
) -> dict[tuple[str, str], dict[str, Any]]:
    """Calibrate every cell once, then ``reps`` rounds over all cells, order rotated."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    ops: dict[tuple[str, str], int] = {}
    for cell in order:
        try:
            ops[cell] = calibrate(cells[cell], box, min_ops=1, max_ops=5_000_000)
            out[cell] = {"values": [], "ops": ops[cell]}
        except Exception as exc:
            out[cell] = {"error": f"{type(exc).__name__}: {exc}"}
    live = [c for c in order if "error" not in out[c]]
    for rep in range(reps):
        shift = rep % max(1, len(live))
        for cell in live[shift:] + live[:shift]:
            if "error" in out[cell]:
                continue
            try:
                out[cell]["values"].append(ops[cell] / cells[cell](ops[cell]))
            except Exception as exc:
                out[cell] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


# -- Django ------------------------------------------------------------------------------------


def django_child(spec: dict[str, Any], q: Any) -> None:
    """``spec``: reps, box, ``caches`` {key: Django CACHES entry}.  Times get and set."""
    made: dict[str, Any] = {}
    try:
        import django
        from django.conf import settings

        settings.configure(
            CACHES={"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}, **spec["caches"]},
            INSTALLED_APPS=[],
            USE_TZ=True,
        )
        django.setup()
        from django.core.cache import caches

        rows: dict[str, dict[str, Any]] = {}
        keys = [key(i) for i in range(KEYS)]
        pairs = [(key(i), dict_value(i)) for i in range(KEYS)]
        for c, conf in spec["caches"].items():
            try:
                made[c] = caches[c]
            except Exception as exc:
                rows[c] = {"skipped": f"{conf['BACKEND']}: {type(exc).__name__}: {exc}"}
                continue
            try:
                cache = made[c]
                for k, v in pairs:  # every key present (also the warm-up)
                    cache.set(k, v)
                got = cache.get(keys[7])
                if got != dict_value(7):
                    rows[c] = {"error": f"read back {got!r}, not {dict_value(7)!r}"}
                    continue
                rows[c] = {"backend": conf["BACKEND"]}
            except Exception as exc:
                rows[c] = {"error": f"{type(exc).__name__}: {exc}"}
        live = [c for c in spec["caches"] if c in made and "backend" in rows.get(c, {})]
        cells: dict[tuple[str, str], Callable[[int], float]] = {}
        for c in live:
            cells[(c, "get")] = _loop(made[c].get, keys, False)
            cells[(c, "set")] = _loop(made[c].set, pairs, True)
        order = [(c, op) for op in ("get", "set") for c in live]
        timed = _interleaved(cells, order, spec["reps"], spec["box"])
        for (c, op), res in timed.items():
            rows[c][op] = res
        for c in live:  # still right after the set rounds?
            got = made[c].get(keys[KEYS - 1])
            if got != dict_value(KEYS - 1):
                rows[c]["wrong"] = f"after the rounds, get returned {got!r}"
        q.put({"rows": rows, "versions": _versions(["Django", "diskcache", "redis", "shared-memory-dict"])})
    except BaseException as exc:
        q.put({"error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        for c, cache in made.items():
            try:
                if c == "smd":
                    cache._cache.shm.unlink()  # (its close() only unmaps)
                    cache._cache.cleanup()
                elif c in ("redis", "ours"):
                    cache.clear()  # (Redis: the workload's own server; ours: unlinked by the parent too)
                    cache.close()
                else:
                    cache.close()
            except Exception:
                pass


def _versions(dists: list[str]) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for d in dists:
        try:
            out[d] = version(d)
        except PackageNotFoundError:
            out[d] = "not installed"
    return out


# -- the plain API -----------------------------------------------------------------------------


def _plain_make(c: str, spec: dict[str, Any]) -> tuple[Any, Callable[..., Any], Callable[..., Any]]:
    """(cache, get, set) for a contender of the plain API part."""
    if c == "ours":
        from ultradict_ng.cache import SharedCache

        cache = SharedCache(spec["name"], maxsize=MAX_ENTRIES)
        return cache, cache.get, cache.set
    if c == "diskcache":
        import diskcache

        cache = diskcache.Cache(spec["dir"])
        return cache, cache.get, cache.set
    if c == "cl_ours":
        from ultradict_ng.integrations.cachelib import SharedCache as CachelibShared

        cache = CachelibShared(name=spec["name"], threshold=MAX_ENTRIES, default_timeout=300)
        return cache, cache.get, cache.set
    if c in ("cl_simple", "cl_fs"):
        import cachelib

        cache = (
            cachelib.SimpleCache(threshold=MAX_ENTRIES, default_timeout=300)
            if c == "cl_simple"
            else cachelib.FileSystemCache(spec["dir"], threshold=MAX_ENTRIES, default_timeout=300)
        )
        return cache, cache.get, cache.set
    if c in ("lru", "ttl"):
        import cachetools

        cache = cachetools.LRUCache(MAX_ENTRIES) if c == "lru" else cachetools.TTLCache(MAX_ENTRIES, ttl=600)
        return cache, cache.get, cache.__setitem__
    raise ValueError(c)


def plain_child(spec: dict[str, Any], q: Any) -> None:
    """``spec``: reps, box, contenders, values, name (SharedCache), dir (diskcache, FileSystemCache)."""
    made: dict[str, Any] = {}
    try:
        rows: dict[str, dict[str, Any]] = {}
        keys = [key(i) for i in range(KEYS)]
        values = {k: v for k, v in (("dict", dict_value), ("str", str_value)) if k in spec["values"]}
        fns: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}
        for c in spec["contenders"]:
            try:
                made[c], g, s = _plain_make(c, spec)
                fns[c] = (g, s)
                rows[c] = {}
            except ImportError as exc:
                rows[c] = {"skipped": f"{type(exc).__name__}: {exc}"}
            except Exception as exc:
                rows[c] = {"error": f"{type(exc).__name__}: {exc}"}
        live = list(fns)
        for kind, make in values.items():
            pairs = [(k, make(i)) for i, k in enumerate(keys)]
            cells: dict[tuple[str, str], Callable[[int], float]] = {}
            for c in live:
                g, s = fns[c]
                try:
                    for k, v in pairs:
                        s(k, v)
                    if g(keys[7]) != make(7):
                        rows[c][kind] = {"error": f"read back {g(keys[7])!r}, not {make(7)!r}"}
                        continue
                except Exception as exc:
                    rows[c][kind] = {"error": f"{type(exc).__name__}: {exc}"}
                    continue
                cells[(c, "get")] = _loop(g, keys, False)
                cells[(c, "set")] = _loop(s, pairs, True)
            order = [(c, op) for op in ("get", "set") for c in live if (c, op) in cells]
            for (c, op), res in _interleaved(cells, order, spec["reps"], spec["box"]).items():
                rows[c].setdefault(kind, {})[op] = res
            for c in live:
                if (c, "get") in cells and fns[c][0](keys[-1]) != make(KEYS - 1):
                    rows[c][kind]["wrong"] = f"after the rounds, get returned {fns[c][0](keys[-1])!r}"
        q.put({"rows": rows, "versions": _versions(["diskcache", "cachetools", "cachelib"])})
    except BaseException as exc:
        q.put({"error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        for c, cache in made.items():
            try:
                if c == "ours":
                    cache.unlink()
                    cache.close()
                elif c in ("diskcache", "cl_ours"):
                    cache.close()  # (cl_ours: the last handle out removes it; the parent unlinks it too)
            except Exception:
                pass


# -- hit ratio ---------------------------------------------------------------------------------


def zipf_trace(alpha: float, nkeys: int, requests: int, seed: int) -> list[int]:
    """``requests`` keys of a Zipf(alpha) law over ``nkeys`` keys (ranks shuffled to key ids)."""
    rng = random.Random(seed)
    cum: list[float] = []
    total = 0.0
    for r in range(1, nkeys + 1):
        total += r**-alpha
        cum.append(total)
    ranks = rng.choices(range(nkeys), cum_weights=cum, k=requests)
    ids = list(range(nkeys))
    rng.shuffle(ids)
    return [ids[r] for r in ranks]


def _replay(
    c: str, trace: list[int], size: int, spec: dict[str, Any]
) -> tuple[int, Optional[dict[str, Any]]]:
    """Hits of contender ``c`` over ``trace`` (get; on a miss set); and its stats()."""
    hits = 0
    if c == "exact":
        from collections import OrderedDict

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

        lru = cachetools.LRUCache(size)
        get = lru.get
        for k in trace:
            if get(k) is None:
                lru[k] = k
            else:
                hits += 1
        return hits, None
    from ultradict_ng.cache import SharedCache

    kwargs = {"cull_frequency": 3} if c == "ours_cull3" else {}
    cache = SharedCache(spec["names"][c], maxsize=size, **kwargs)
    try:
        get, put = cache.get, cache.set
        for k in trace:
            if get(k) is None:
                put(k, k)
            else:
                hits += 1
        try:
            stats = dict(cache.stats())
        except Exception:
            stats = None
        return hits, stats
    finally:
        cache.unlink()
        cache.close()


def hit_child(spec: dict[str, Any], q: Any) -> None:
    """``spec``: alphas, nkeys, requests, size, contenders, names {contender: cache name}."""
    try:
        out: dict[str, Any] = {}
        for alpha in spec["alphas"]:
            trace = zipf_trace(alpha, spec["nkeys"], spec["requests"], seed=15)
            row: dict[str, Any] = {"distinct": len(set(trace))}
            for c in spec["contenders"]:
                t0 = time.perf_counter()
                try:
                    hits, stats = _replay(c, trace, spec["size"], spec)
                    row[c] = {
                        "hits": hits,
                        "ratio": hits / len(trace),
                        "seconds": time.perf_counter() - t0,
                        "stats": stats,
                    }
                except ImportError as exc:
                    row[c] = {"skipped": f"{type(exc).__name__}: {exc}"}
                except Exception as exc:
                    row[c] = {"error": f"{type(exc).__name__}: {exc}"}
            out[str(alpha)] = row
        q.put({"alphas": out})
    except BaseException as exc:
        q.put({"error": f"{type(exc).__name__}: {exc}"})
        raise


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
    import functools

    path, seconds = spec["path"], spec["seconds"]
    cached_f: Optional[Callable[[Any], Any]] = None
    why = ""
    try:
        from ultradict_ng.cache import cached

        def work(arg: Any) -> dict[str, Any]:
            return _compute(path, "cached", arg, seconds)

        cached_f = cached(name=spec["name"], maxsize=128)(work)
    except Exception as exc:  # (the rounds still run: lru_cache is measured either way)
        why = f"{type(exc).__name__}: {exc}"

    @functools.lru_cache(maxsize=128)
    def lru_f(arg: Any) -> dict[str, Any]:
        return _compute(path, "lru_cache", arg, seconds)

    results: list[tuple[str, int, float, float, Optional[str]]] = []
    try:
        if cached_f is not None:
            try:  # warm-up on a key of its own: attach the cache before the timed rounds
                cached_f(-1 - wid)
            except Exception as exc:
                why, cached_f = f"{type(exc).__name__}: {exc}", None
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
                    err = f"{type(exc).__name__}: {exc}"
                results.append((mode, rnd, t0, time.monotonic(), err))
        q.put({"wid": wid, "results": results, "cached_error": why})
    except BaseException as exc:
        q.put({"wid": wid, "error": f"{type(exc).__name__}: {exc}", "results": results})
        raise
