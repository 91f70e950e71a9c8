"""Workload 15 (``cache``): ``ultradict_ng.cache`` against the caches people use.

Each part runs in spawned processes (:mod:`perf.cache_children`), repetitions
interleaved with the order rotated; 1,000 keys all present, a small dict value:

* Django cache API: our backend against Django's LocMemCache, FileBasedCache,
  RedisCache (a private loopback redis-server), diskcache and shared-memory-dict.
* Plain API, dict and str values (a dict is copied for the caller on every read,
  a str is not): SharedCache against diskcache and cachetools (one process).
* cachelib API (Flask-Caching's backends): for scale, no target.
* Hit ratio on Zipf traces (quick: a = 0.9 only): SharedCache's approximate LRU
  against an exact LRU.
* Stampede: 8 processes released by a barrier call a ``@cached`` 0.2 s function
  on one cold key: computations and wall time, against ``functools.lru_cache``.

Everything created (segments, the redis-server, temporary directories) is
removed at the end of its part; the harness's cleanup registry holds it until then.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pickle
import queue
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

from . import cache_children as CC
from .redis_server import RedisServer, redis_binary
from .registry import NG, Target, Workload, pick, register
from .report import bars
from .run import Run
from .util import fmt_seconds, log

WL, NUMBER = "cache", 15
Params = dict[str, Any]
#: part -> contender -> (label, module it needs)
PARTS: dict[str, dict[str, tuple[str, str]]] = {
    "django": {
        "ours": ("ultradict_ng Django backend", "ultradict_ng.integrations.django"),
        "locmem": ("Django LocMemCache", ""),
        "file": ("Django FileBasedCache", ""),
        "diskcache": ("diskcache.DjangoCache", "diskcache"),
        "redis": ("Django RedisCache (loopback)", "redis"),
        "smd": ("shared-memory-dict SharedMemoryCache", "shared_memory_dict"),
    },
    "plain": {
        "ours": ("ultradict_ng SharedCache", "ultradict_ng.cache"),
        "diskcache": ("diskcache.Cache", "diskcache"),
        "lru": ("cachetools.LRUCache (1 process)", "cachetools"),
        "ttl": ("cachetools.TTLCache (1 process)", "cachetools"),
    },
    "cachelib": {
        "cl_ours": ("ultradict_ng cachelib backend", "ultradict_ng.integrations.cachelib"),
        "cl_simple": ("cachelib.SimpleCache (1 process)", "cachelib"),
        "cl_fs": ("cachelib.FileSystemCache", "cachelib"),
    },
    "hit": {
        "exact": ("exact LRU (OrderedDict)", ""),
        "ours": ("ultradict_ng SharedCache", "ultradict_ng.cache"),
        "ours_cull3": ("SharedCache(cull_frequency=3)", "ultradict_ng.cache"),
        "cachetools": ("cachetools.LRUCache", "cachetools"),
    },
    "stampede": {
        "cached": ("ultradict_ng @cached", ""),
        "lru_cache": ("functools.lru_cache per process", ""),
    },
}
LABELS = {part: {c: v[0] for c, v in cs.items()} for part, cs in PARTS.items()}
#: part -> (what the log and the cases call it, the table block)
TITLES = {
    "django": ("Django cache API", "Django cache API (cache.get / cache.set), dict value"),
    "plain": ("plain API", "plain API (get / set; cachetools: c[k] = v)"),
    "cachelib": ("cachelib API", "cachelib API (Flask-Caching backends: get / set), dict value"),
    "hit": (
        "hit ratio",
        "hit ratio (get, set on a miss; Zipf, 50,000 keys, 200,000 requests, 2,000 entries)",
    ),
    "stampede": ("stampede", "stampede (8 spawned processes, one cold key per round, a 0.2 s function)"),
}
#: the throughput parts: value kinds, distributions whose versions are noted
RATES = {
    "django": (("dict",), ["Django", "diskcache", "redis", "shared-memory-dict"]),
    "plain": (("dict", "str"), ["diskcache", "cachetools", "cachelib"]),
    "cachelib": (("dict",), ["diskcache", "cachetools", "cachelib"]),
}
ALPHAS = (0.9, 0.7, 1.1)
NKEYS, REQUESTS, SIZE = 50_000, 200_000, 2_000
PROCS, SLEEP = 8, 0.2
REDIS = f"redis-server (workload {NUMBER})"  # (its key in the cleanup registry)


def _missing(*modules: str) -> Optional[str]:
    for m in filter(None, modules):
        with contextlib.suppress(ImportError, ValueError):
            if importlib.util.find_spec(m) is not None:
                continue
        return f"{m} is not importable (not installed, or not written yet)"
    return None


def _rec(run: Run, part: str, case: str, c: str, unit: str, values: Any, params: Params, **kw: Any) -> None:
    """A record; our contender of every part is ``ultradict_ng`` (the tables' reference), a peer part:name."""
    key = NG if c in ("ours", "cl_ours", "cached") else f"{part}:{c}"
    better = "lower" if unit in ("count", "s") else "higher"
    params = {"part": part, "contender": c, **params}
    rec = run.record(WL, case, key, unit=unit, better=better, values=list(values), params=params, **kw)
    rec["label"] = LABELS[part][c]


def _cell(
    run: Run, part: str, case: str, c: str, ps: Params, why: Any, err: Any, vals: Any, more: Params, **kw: Any
) -> bool:
    """A skipped, a failed (with an alert) or a measured record (``more``: its params); whether measured."""
    unit = "ratio" if part == "hit" else "ops/s"
    if why or err:
        if not why:
            run.alert(f"workload {NUMBER}: {LABELS[part][c]} failed ({case}): {err}")
        _rec(run, part, case, c, unit, [], ps, **({"skipped": why} if why else {"error": err}))
        return False
    _rec(run, part, case, c, unit, vals, {**ps, **more}, **kw)
    return True


def _unlink_ours(name: str) -> None:
    """Remove a SharedCache / SharedDict by name, whatever is left of it."""
    with contextlib.suppress(Exception):
        from ultradict_ng.cache import SharedCache

        return SharedCache.unlink_by_name(name)
    with contextlib.suppress(Exception):
        from ultradict_ng import unlink_by_name

        unlink_by_name(name)


def _unlink_smd(name: str) -> None:
    if os.path.exists(f"/dev/shm/sm_{name}"):
        os.unlink(f"/dev/shm/sm_{name}")


def _name(run: Run, part: str, c: str, unlink: Callable[[str], None] = _unlink_ours) -> str:
    name = run.new_name()
    run.own(name, lambda: unlink(name), LABELS[part][c])
    return name


def _tmpdir(run: Run, what: str) -> str:
    path = tempfile.mkdtemp(prefix=f"{run.name_prefix}-{what}-")
    run.own(path, lambda: shutil.rmtree(path, ignore_errors=True), f"workload {NUMBER} {what} directory")
    return path


def _release(run: Run, keys: list[str]) -> None:
    for k in keys:
        fn, _ = run.owned.pop(k, (None, ""))
        if fn is not None:
            fn()


def _smd_block(n: int) -> int:
    """shared-memory-dict keeps the whole table as one pickle in a fixed block and copies the
    block on every read: size it to 1.5x the table (pages), as one would."""
    table = {":1:" + CC.key(i): (CC.dict_value(i), time.time() + 300.0) for i in range(n)}
    size = int(len(pickle.dumps(table, pickle.HIGHEST_PROTOCOL)) * 1.5)
    return (size + 4095) // 4096 * 4096


# -- the parts ---------------------------------------------------------------------------------


def _django(run: Run, spec: dict[str, Any], skipped: dict[str, str], keys: list[str]) -> Any:
    """The CACHES entries into ``spec``, what to release into ``keys``; the redis-server (or None)."""
    names = {"ours": _name(run, "django", "ours"), "smd": _name(run, "django", "smd", _unlink_smd)}
    dirs = {"file": _tmpdir(run, "filebased"), "diskcache": _tmpdir(run, "diskcache-django")}
    keys += [*names.values(), *dirs.values(), REDIS]
    server = None
    if "redis" not in skipped and not redis_binary():
        skipped["redis"] = "no redis-server binary on PATH (the harness never installs it)"
    elif "redis" not in skipped:
        server = RedisServer.start()
        run.own(REDIS, server.stop, "the redis-server of workload 15")
    url = f"redis://127.0.0.1:{server.port}/0" if server else ""
    opts, b = {"OPTIONS": {"MAX_ENTRIES": CC.MAX_ENTRIES}}, "django.core.cache.backends."
    block = _smd_block(CC.KEYS)
    smd, ours = {"LOCATION": names["smd"], "OPTIONS": {"MEMORY_BLOCK_SIZE": block}}, names["ours"]
    conf: dict[str, dict[str, Any]] = {
        "ours": {"BACKEND": "ultradict_ng.integrations.django.SharedCache", "LOCATION": ours, **opts},
        "locmem": {"BACKEND": b + "locmem.LocMemCache", "LOCATION": f"{run.name_prefix}-locmem", **opts},
        "file": {"BACKEND": b + "filebased.FileBasedCache", "LOCATION": dirs["file"], **opts},
        "diskcache": {"BACKEND": "diskcache.DjangoCache", "LOCATION": dirs["diskcache"]},
        "redis": {"BACKEND": b + "redis.RedisCache", "LOCATION": url, "KEY_PREFIX": run.name_prefix},
        "smd": {"BACKEND": "shared_memory_dict.caches.django.SharedMemoryCache", **smd},
    }
    spec["caches"] = {c: conf[c] for c in PARTS["django"] if c not in skipped}
    if "smd" in spec["caches"]:
        run.note(
            f"shared-memory-dict: MEMORY_BLOCK_SIZE {block:,} (1.5x its pickled table; it copies the whole "
            "block on every read) and no lock (its default; SHARED_MEMORY_USE_LOCK=1 adds one)",
            WL,
        )
    return server


def _rates(run: Run, reps: int, part: str) -> None:
    """A throughput part: get and set per contender and value kind, in one child."""
    values, dists = RATES[part]
    cons, django = PARTS[part], part == "django"
    skipped = {c: why for c, (_, m) in cons.items() if (why := _missing("django" if django else "", m))}
    spec: dict[str, Any] = {"part": part, "values": values, "reps": reps, "box": run.box, "versions": dists}
    keys: list[str] = []
    server = None
    try:
        if django:
            server = _django(run, spec, skipped, keys)
        else:
            spec["name"] = _name(run, part, next(iter(cons)))
            spec["dir"] = _tmpdir(run, "diskcache" if part == "plain" else "filesystemcache")
            keys = [spec["name"], spec["dir"]]
        spec["contenders"] = [c for c in cons if c not in skipped]
        got = run.call(CC.rates_child, spec, timeout=600) if spec["contenders"] else {}
        rows = got.get("rows", {})
        for v in values:
            for c in cons:
                row = rows.get(c, {})
                cell = row.get(v) or {}
                for op in ("get", "set"):
                    case = f"{TITLES[part][0]}: {op}" if django else f"{TITLES[part][0]}, {v} value: {op}"
                    res = cell.get(op) or {}
                    err = got.get("error") or row.get("error") or res.get("error") or cell.get("error")
                    err = err or (None if res.get("values") else "not measured")
                    why, wrong = skipped.get(c) or row.get("skipped"), cell.get("wrong")
                    params, more = {"op": op, "value": v}, {"ops_per_rep": res.get("ops")}
                    ok = _cell(run, part, case, c, params, why, err, res.get("values"), more, ok=not wrong)
                    if ok and wrong:
                        run.alert(f"workload {NUMBER}: {LABELS[part][c]}: {wrong}")
        if got.get("versions"):
            vs = ", ".join(f"{k} {v}" for k, v in got["versions"].items())
            run.note(f"versions: {vs}" + (f", redis-server {server.version()}" if server else ""), WL)
    finally:
        _release(run, keys)


def _hit(run: Run) -> None:
    alphas = ALPHAS[:1] if run.quick else ALPHAS
    cons = PARTS["hit"]
    skipped = {c: why for c, (_, m) in cons.items() if (why := _missing(m))}
    names = {c: _name(run, "hit", "ours") for c in ("ours", "ours_cull3")}
    sizes = {"nkeys": NKEYS, "requests": REQUESTS, "size": SIZE}
    try:
        contenders = [c for c in cons if c not in skipped]
        spec = {"alphas": list(alphas), **sizes, "contenders": contenders, "names": names}
        got = run.call(CC.hit_child, spec, timeout=900)
        for alpha in alphas:
            row = (got.get("alphas") or {}).get(str(alpha), {})
            case = f"hit ratio, Zipf a={alpha:g}"
            params = {"alpha": alpha, **sizes, "distinct": row.get("distinct")}
            for c in cons:
                res = row.get(c, {})
                err = got.get("error") or res.get("error") or (None if "ratio" in res else "not measured")
                secs = res.get("seconds")
                more = {"hits": res.get("hits"), "seconds": secs, "stats": res.get("stats")}
                more["requests_per_s"] = REQUESTS / secs if secs else None
                why = skipped.get(c) or res.get("skipped")
                _cell(run, "hit", case, c, params, why, err, [res.get("ratio")], more)
    finally:
        _release(run, list(names.values()))


def _stampede(run: Run, rounds: int) -> None:
    part = "stampede"
    name, d = _name(run, part, "cached"), _tmpdir(run, "stampede")
    path = os.path.join(d, "executions")
    spec = {"name": name, "path": path, "seconds": SLEEP, "rounds": rounds}
    barrier, q, ctx = run.ctx.Barrier(PROCS), run.ctx.Queue(), run.ctx
    worker, label = CC.stampede_worker, "perf-cache-stampede-"
    procs = [
        ctx.Process(target=worker, args=(w, spec, barrier, q), daemon=True, name=f"{label}{w}")
        for w in range(PROCS)
    ]
    answers: list[dict[str, Any]] = []
    problem = ""
    try:
        for p in procs:
            p.start()
            run.children.append(p)
        deadline = time.monotonic() + 120 + rounds * 10
        while len(answers) < PROCS:
            try:
                answers.append(q.get(timeout=1.0))
            except queue.Empty:
                dead = [p for p in procs if not p.is_alive() and p.exitcode != 0]
                if dead or time.monotonic() > deadline:
                    died = f"{len(dead)} stampede process(es) died (exit codes {[p.exitcode for p in dead]})"
                    problem = died if dead else "the stampede processes did not finish in time"
                    barrier.abort()
                    break
        problem = problem or next((a["error"] for a in answers if "error" in a), "")
        cached_error = next((a["cached_error"] for a in answers if a.get("cached_error")), "")
        text = Path(path).read_text() if os.path.exists(path) else ""
        lines = [ln.split() for ln in text.splitlines() if ln.strip()]
        params = {"processes": PROCS, "sleep_s": SLEEP, "rounds": rounds}
        for mode in PARTS[part]:
            counts, walls, errors = [], [], []
            for rnd in range(rounds):
                res = [r for a in answers for r in a.get("results", []) if r[0] == mode and r[1] == rnd]
                errors += [r[4] for r in res if r[4]]
                if len(res) == PROCS:
                    walls.append(max(r[3] for r in res) - min(r[2] for r in res))
                    counts.append(float(sum(1 for ln in lines if ln[0] == mode and ln[1] == str(rnd))))
            cases = (("stampede: computations", "count", counts), ("stampede: wall time", "s", walls))
            why = cached_error if mode == "cached" else ""
            if "No module named" in why:
                for case, unit, _ in cases:
                    _rec(run, part, case, mode, unit, [], params, skipped=why)
                continue
            err = problem or why or (errors[0] if errors else "") or ("" if counts else "not measured")
            if err:
                run.alert(f"workload {NUMBER}: stampede ({LABELS[part][mode]}): {err}")
            kw = {"ok": not err if counts else None, "error": err or None}
            for case, unit, vals in cases:
                _rec(run, part, case, mode, unit, vals, params, **kw)
    finally:
        for p in procs:
            if p.pid is not None:
                run.reap(p, 10)
            if p in run.children:
                run.children.remove(p)
        q.close()
        _release(run, [name, d])


def w_cache(run: Run, contenders: list[str]) -> None:
    # (a noisy machine: 7 in full mode, as workload 13)
    reps = run.repeat if run.quick else max(run.repeat, 7)
    for part, (what, _) in TITLES.items():
        t0 = time.perf_counter()
        log(f"  shared cache: {what}")
        try:
            if part == "hit":
                _hit(run)
            elif part == "stampede":
                _stampede(run, reps)
            else:
                _rates(run, reps, part)
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"
            run.alert(f"workload {NUMBER} ({what}): {err}")
            if not any(r["workload"] == WL and r["params"].get("part") == part for r in run.records):
                params = {"op": "get", "value": "dict"}
                for c in PARTS[part]:  # the table shows the part as failed
                    _rec(run, part, f"{what}: failed", c, "ops/s", [], params, error=err)
        log(f"    ({what} took {time.perf_counter() - t0:.1f} s)")
    run.note(
        f"throughput: {CC.KEYS:,} keys, all present, cycled; value {{'id': i, 'name': 'user%d' % i, "
        f"'score': 1.5}} (plain API also 'user%d' % i); Django: default timeout, MAX_ENTRIES "
        f"{CC.MAX_ENTRIES:,}; one spawned child per part; cells calibrated to ~{run.box:g} s, "
        f"{reps} interleaved repetitions; temporary directories on {tempfile.gettempdir()}",
        WL,
    )
    run.note(
        f"hit ratio: get, and set on a miss, over a Zipf trace ({REQUESTS:,} requests over {NKEYS:,} keys, "
        f"seed 15), {SIZE:,} entries; stampede: {PROCS} spawned processes released by a barrier call "
        f"the function on a cold key (sleeps {SLEEP:g} s, one line per execution in a file); wall = first "
        "release to last return",
        WL,
    )


# -- targets and the plot ----------------------------------------------------------------------

#: "part value op": "peer need, ...": our median / the peer's median >= need
RATE_TARGETS = {
    "django dict get": "locmem 1, diskcache 3, redis 20",
    "django dict set": "locmem .5, diskcache 5, redis 20",
    "plain dict get": "diskcache 10, lru .5",
    "plain dict set": "diskcache 5",
    "plain str get": "diskcache 10, lru .5",
    "plain str set": "diskcache 5",
}


def _rate_target(part_value_op: str, peer_need: str) -> Target:
    (part, value, op), (peer, need) = part_value_op.split(), peer_need.split()
    what = "Django backend" if part == "django" else "SharedCache"
    return Target(
        f"cache: {what} {op} >= {float(need):g}x {LABELS[part][peer]} ({value} value)",
        float(need),
        num=pick(WL, part=part, op=op, value=value),
        den=pick(WL, f"{part}:{peer}", op=op, value=value),
    )


def _stampede_target(recs: list[dict[str, Any]]) -> Optional[tuple[float, str]]:
    """The most computations in any round (NaN, a miss, if the record carries an error)."""
    rc = pick(WL, case="stampede: computations").find(recs)
    if rc is None or rc["median"] is None:
        return None
    wall = pick(WL, case="stampede: wall time").find(recs) or {}
    lru = pick(WL, "stampede:lru_cache", case="stampede: computations").find(recs) or {}
    detail = (
        f"computations per round {[int(v) for v in rc['values']]}; wall {fmt_seconds(wall.get('median'))} "
        f"(median); lru_cache: {lru.get('median')} per round"
        + (f"; error: {rc['error']}" if rc["error"] else "")
    )
    return (float("nan") if rc["error"] else rc["max"]), detail


def _panel(ax: Any, recs: list[dict[str, Any]]) -> str:
    """Only the ops/s (the hit ratios and the stampede are no rates: the tables have them)."""
    bars(ax, [{**r, "label": NG} if r["contender"] == NG else r for r in recs if r["unit"] == "ops/s"])
    return "shared cache: get / set (ops/s)"


register(
    Workload(
        name=WL,
        number=NUMBER,
        title="shared cache: Django cache API, plain get/set, hit ratio on Zipf traces, stampede",
        run=w_cache,
        aliases=("shared-cache", "sharedcache", "caches", "django", "stampede"),
        targets=(
            *(_rate_target(k, t) for k, ts in RATE_TARGETS.items() for t in ts.split(",")),
            *(
                Target(
                    f"cache: SharedCache hit ratio >= 0.95x exact LRU (Zipf a={a:g})",
                    0.95,
                    num=pick(WL, part="hit", alpha=a),
                    den=pick(WL, "hit:exact", alpha=a),
                )
                for a in ALPHAS
            ),
            Target(
                "cache: stampede, 8 processes on a cold key -> 1 computation",
                1,
                at_most=True,
                unit="count",
                measure=_stampede_target,
            ),
        ),
        keys=lambda r: (TITLES[r["params"]["part"]][1], r["case"]),
        panel=_panel,
    )
)
