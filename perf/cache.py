"""Workload 15 (``cache``): ``ultradict_ng.cache`` against the caches people use.

Four parts, each in spawned processes (the harness's start method), peers side
by side in one run, repetitions interleaved with the order rotated:

* **Django cache API** (``cache.get(k)`` / ``cache.set(k, v)``, default timeout,
  1,000 keys all present, value ``{"id": i, "name": "user%d" % i, "score": 1.5, "tags": ["a", "b"]}``):
  our backend ``ultradict_ng.integrations.django.SharedCache`` against Django's
  ``LocMemCache``, ``FileBasedCache`` (a temporary directory), ``diskcache.DjangoCache``,
  Django's ``RedisCache`` (a private ``redis-server`` on loopback that this
  workload starts and stops) and shared-memory-dict's ``SharedMemoryCache``.
  One child process holds them all (Django's settings are configured once per
  process).
* **Plain API** (``get`` / ``set``; cachetools: ``get`` / ``c[k] = v``):
  ``SharedCache`` against ``diskcache.Cache``, ``cachetools.LRUCache`` and
  ``cachetools.TTLCache`` (one process, not shared), with the small dict value
  and with a short ``str`` value (a dict is copied for the caller on every
  read -- cachetools hands out its own object; a str is immutable and handed
  out as it is).
* **cachelib API** (Flask-Caching's backends; dict value, get / set): our
  ``ultradict_ng.integrations.cachelib.SharedCache`` against ``cachelib.SimpleCache``
  (one process) and ``cachelib.FileSystemCache`` (a temporary directory).  No
  target; for scale.
* **Hit ratio** on Zipf traces (a = 0.7, 0.9, 1.1; 50,000 keys, 200,000
  requests, 2,000 entries; get, and set on a miss): ``SharedCache`` (its
  approximate LRU; and with ``cull_frequency=3``) against an exact LRU (an
  ``OrderedDict``) and ``cachetools.LRUCache``.
* **Stampede**: 8 spawned processes, released together by a barrier, call a
  ``@cached`` function on the same cold key; the function sleeps 0.2 s and
  appends a line per execution to a file.  Computations and wall time (first
  release to last return), against ``functools.lru_cache`` in each process.

Full mode: 0.4 s per measurement, 7 repetitions (at least; ``--repeat``), 7
stampede rounds, about 2 minutes.  ``--quick``: 0.1 s per measurement, 3
repetitions, hit ratios at a = 0.9 only, 3 stampede rounds, about 25 s.

Everything created (segments, the redis-server, temporary directories) is
removed at the end of the workload, also on failure; the harness's cleanup
registry holds each until then.  Table, targets, plot and
``<out>/cache/latest.json``: :mod:`perf.cache_report`.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import queue
import shutil
import tempfile
import time
from typing import Any, Callable, Optional

from . import cache_children as CC
from .run import Run
from .util import log

WL = "cache"
NUMBER = 15
TITLE = "shared cache: Django cache API, plain get/set, hit ratio on Zipf traces, stampede"
ENTRY: tuple[str, int, str] = (WL, NUMBER, TITLE)
ALIASES = {"shared-cache": WL, "sharedcache": WL, "caches": WL, "django": WL, "stampede": WL}

DJANGO = ["ours", "locmem", "file", "diskcache", "redis", "smd"]
PLAIN = ["ours", "diskcache", "lru", "ttl"]
CACHELIB = ["cl_ours", "cl_simple", "cl_fs"]
HIT = ["exact", "ours", "ours_cull3", "cachetools"]
STAMPEDE = ["cached", "lru_cache"]
LABELS: dict[str, dict[str, str]] = {
    "django": {
        "ours": "ultradict_ng Django backend",
        "locmem": "Django LocMemCache",
        "file": "Django FileBasedCache",
        "diskcache": "diskcache.DjangoCache",
        "redis": "Django RedisCache (loopback)",
        "smd": "shared-memory-dict SharedMemoryCache",
    },
    "plain": {
        "ours": "ultradict_ng SharedCache",
        "diskcache": "diskcache.Cache",
        "lru": "cachetools.LRUCache (1 process)",
        "ttl": "cachetools.TTLCache (1 process)",
    },
    "cachelib": {
        "cl_ours": "ultradict_ng cachelib backend",
        "cl_simple": "cachelib.SimpleCache (1 process)",
        "cl_fs": "cachelib.FileSystemCache",
    },
    "hit": {
        "exact": "exact LRU (OrderedDict)",
        "ours": "ultradict_ng SharedCache",
        "ours_cull3": "SharedCache(cull_frequency=3)",
        "cachetools": "cachetools.LRUCache",
    },
    "stampede": {"cached": "ultradict_ng @cached", "lru_cache": "functools.lru_cache per process"},
}
ALPHAS = (0.9, 0.7, 1.1)
NKEYS, REQUESTS, SIZE = 50_000, 200_000, 2_000
PROCS, SLEEP = 8, 0.2

_BACKENDS = {
    "ours": "ultradict_ng.integrations.django.SharedCache",
    "locmem": "django.core.cache.backends.locmem.LocMemCache",
    "file": "django.core.cache.backends.filebased.FileBasedCache",
    "diskcache": "diskcache.DjangoCache",
    "redis": "django.core.cache.backends.redis.RedisCache",
    "smd": "shared_memory_dict.caches.django.SharedMemoryCache",
}


# -- helpers -----------------------------------------------------------------------------------


def _missing(module: str) -> Optional[str]:
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"{module} is not importable (not installed, or not written yet)"


def _record(
    run: Run,
    part: str,
    case: str,
    c: str,
    unit: str,
    better: str,
    values: list[float],
    extra: Optional[dict[str, Any]] = None,
    **kw: Any,
) -> dict[str, Any]:
    params = {"part": part, "contender": c, **(extra or {})}
    rec = run.record(WL, case, f"{part}:{c}", unit=unit, better=better, values=values, params=params, **kw)
    rec["label"] = LABELS[part][c]
    return rec


def _run_child(run: Run, target: Callable[..., None], spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    q = run.ctx.Queue()
    p = run.ctx.Process(target=target, args=(spec, q), daemon=True, name=f"perf-cache-{target.__name__}")
    p.start()
    run.children.append(p)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return q.get(timeout=1.0)
            except queue.Empty:
                if not p.is_alive():
                    return {"error": f"the child process died (exit code {p.exitcode})"}
                if time.monotonic() > deadline:
                    return {"error": f"no answer from the child within {timeout:.0f} s"}
    finally:
        run.reap(p, 30)
        run.children.remove(p)
        q.close()


def _unlink_ours(name: str) -> None:
    """Remove a SharedCache / SharedDict by name, whatever is left of it."""
    try:
        from ultradict_ng.cache import SharedCache

        SharedCache.unlink_by_name(name)
    except Exception:
        try:
            from ultradict_ng import unlink_by_name

            unlink_by_name(name)
        except Exception:
            pass


def _tmpdir(run: Run, what: str) -> str:
    path = tempfile.mkdtemp(prefix=f"{run.name_prefix}-{what}-")
    run.own(path, lambda: shutil.rmtree(path, ignore_errors=True), f"workload {NUMBER} {what} directory")
    return path


def _drop_dir(run: Run, path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    run.disown(path)


def _smd_block(n: int) -> int:
    """shared-memory-dict keeps the whole table as one pickle in a fixed block and copies the
    block on every read: size it to 1.5x the table (pages), as one would."""
    table = {":1:" + CC.key(i): (CC.dict_value(i), time.time() + 300.0) for i in range(n)}
    size = int(len(pickle.dumps(table, pickle.HIGHEST_PROTOCOL)) * 1.5)
    return (size + 4095) // 4096 * 4096


# -- the parts ---------------------------------------------------------------------------------


def _django(run: Run, reps: int) -> None:
    part = "django"
    missing = _missing("django")
    if missing:
        for c in DJANGO:
            for op in ("get", "set"):
                _record(
                    run,
                    part,
                    f"Django cache API: {op}",
                    c,
                    "ops/s",
                    "higher",
                    [],
                    {"op": op},
                    skipped=missing,
                )
        return
    names = {"ours": run.new_name(), "smd": run.new_name()}
    for c in ("ours", "smd"):
        n = names[c]
        run.own(
            n,
            (lambda n=n: _unlink_ours(n))
            if c == "ours"
            else (lambda n=n: os.path.exists(f"/dev/shm/sm_{n}") and os.unlink(f"/dev/shm/sm_{n}")),
            LABELS[part][c],
        )
    dirs = {"file": _tmpdir(run, "filebased"), "diskcache": _tmpdir(run, "diskcache-django")}
    server = None
    skipped: dict[str, str] = {}
    try:
        from .redis_server import RedisServer, redis_binary

        if _missing("redis"):
            skipped["redis"] = "redis-py is not installed (pip install redis)"
        elif not redis_binary():
            skipped["redis"] = "no redis-server binary on PATH (the harness never installs it)"
        else:
            server = RedisServer.start()
            run.own_resource(f"redis-server (workload {NUMBER})", server.stop)
        for c, module in (
            ("ours", "ultradict_ng.integrations.django"),
            ("diskcache", "diskcache"),
            ("smd", "shared_memory_dict"),
        ):
            why = _missing(module)
            if why:
                skipped[c] = why
        conf: dict[str, dict[str, Any]] = {
            "ours": {"LOCATION": names["ours"], "OPTIONS": {"MAX_ENTRIES": CC.MAX_ENTRIES}},
            "locmem": {"LOCATION": f"{run.name_prefix}-locmem", "OPTIONS": {"MAX_ENTRIES": CC.MAX_ENTRIES}},
            "file": {"LOCATION": dirs["file"], "OPTIONS": {"MAX_ENTRIES": CC.MAX_ENTRIES}},
            "diskcache": {"LOCATION": dirs["diskcache"]},
            "redis": {"LOCATION": f"redis://127.0.0.1:{server.port}/0", "KEY_PREFIX": run.name_prefix}
            if server
            else {},
            "smd": {"LOCATION": names["smd"], "OPTIONS": {"MEMORY_BLOCK_SIZE": _smd_block(CC.KEYS)}},
        }
        caches = {c: {"BACKEND": _BACKENDS[c], **conf[c]} for c in DJANGO if c not in skipped}
        got = _run_child(run, CC.django_child, {"caches": caches, "reps": reps, "box": run.box}, 600)
        _emit_rates(
            run,
            part,
            DJANGO,
            got,
            skipped,
            lambda row, op: row.get(op),
            lambda op: f"Django cache API: {op}",
            lambda op: {"op": op, "value": "dict"},
            ops=("get", "set"),
        )
        if got.get("versions"):
            run.note(
                "versions: "
                + ", ".join(f"{k} {v}" for k, v in got["versions"].items())
                + (f", redis-server {server.version()}" if server else ""),
                WL,
            )
        if "smd" in caches:
            run.note(
                f"shared-memory-dict: MEMORY_BLOCK_SIZE {caches['smd']['OPTIONS']['MEMORY_BLOCK_SIZE']:,} "
                "(1.5x its pickled table; it copies the whole block on every read) and no lock "
                "(its default; SHARED_MEMORY_USE_LOCK=1 adds one)",
                WL,
            )
    finally:
        if server is not None:
            server.stop()
            run.resources.pop(f"redis-server (workload {NUMBER})", None)
        for n in names.values():
            fn, _ = run.owned.get(n, (None, ""))
            if fn is not None:
                fn()
            run.disown(n)
        for d in dirs.values():
            _drop_dir(run, d)


def _emit_rates(
    run: Run,
    part: str,
    contenders: list[str],
    got: dict[str, Any],
    skipped: dict[str, str],
    cell: Callable[[dict[str, Any], str], Optional[dict[str, Any]]],
    case: Callable[[str], str],
    extra: Callable[[str], dict[str, Any]],
    ops: tuple[str, ...],
) -> None:
    """Records (ops/s) of a throughput part from the child's answer."""
    rows = got.get("rows", {})
    for c in contenders:
        row = rows.get(c, {})
        for op in ops:
            why = skipped.get(c) or row.get("skipped")
            if why:
                _record(run, part, case(op), c, "ops/s", "higher", [], extra(op), skipped=why)
                continue
            err = got.get("error") or row.get("error")
            res = cell(row, op) or {}
            err = err or res.get("error") or (None if res.get("values") else "not measured")
            if err:
                run.alert(f"workload {NUMBER}: {LABELS[part][c]} failed ({case(op)}): {err}")
                _record(run, part, case(op), c, "ops/s", "higher", [], extra(op), error=err)
                continue
            wrong = row.get("wrong") or (row.get(extra(op).get("value", ""), {}) or {}).get("wrong")
            if wrong:
                run.alert(f"workload {NUMBER}: {LABELS[part][c]}: {wrong}")
            _record(
                run,
                part,
                case(op),
                c,
                "ops/s",
                "higher",
                res["values"],
                {**extra(op), "ops_per_rep": res.get("ops")},
                ok=not wrong,
            )


def _plain_cell(row: dict[str, Any], value: str, op: str) -> Optional[dict[str, Any]]:
    sub = row.get(value) or {}
    return sub.get(op) or ({"error": sub["error"]} if "error" in sub else None)


def _plain(run: Run, reps: int, part: str = "plain") -> None:
    """The plain API part, or (``part="cachelib"``) the cachelib API with the dict value."""
    skipped: dict[str, str] = {}
    modules = {
        "ours": "ultradict_ng.cache",
        "diskcache": "diskcache",
        "lru": "cachetools",
        "ttl": "cachetools",
        "cl_ours": "ultradict_ng.integrations.cachelib",
        "cl_simple": "cachelib",
        "cl_fs": "cachelib",
    }
    contenders = PLAIN if part == "plain" else CACHELIB
    values = ("dict", "str") if part == "plain" else ("dict",)
    for c in contenders:
        why = _missing(modules[c])
        if why:
            skipped[c] = why
    name = run.new_name()
    ours = contenders[0]
    run.own(name, lambda: _unlink_ours(name), LABELS[part][ours])
    d = _tmpdir(run, "diskcache" if part == "plain" else "filesystemcache")
    try:
        spec = {
            "contenders": [c for c in contenders if c not in skipped],
            "reps": reps,
            "box": run.box,
            "name": name,
            "dir": d,
            "values": values,
        }
        got = _run_child(run, CC.plain_child, spec, 600)
        api = "plain API" if part == "plain" else "cachelib API"
        for value in values:
            _emit_rates(
                run,
                part,
                contenders,
                got,
                skipped,
                lambda row, op, v=value: _plain_cell(row, v, op),
                lambda op, v=value: f"{api}, {v} value: {op}",
                lambda op, v=value: {"op": op, "value": v},
                ops=("get", "set"),
            )
        if got.get("versions"):
            run.note("versions: " + ", ".join(f"{k} {v}" for k, v in got["versions"].items()), WL)
    finally:
        _unlink_ours(name)
        run.disown(name)
        _drop_dir(run, d)


def _hit(run: Run) -> None:
    part = "hit"
    alphas = ALPHAS[:1] if run.quick else ALPHAS
    skipped: dict[str, str] = {}
    for c, module in (
        ("ours", "ultradict_ng.cache"),
        ("ours_cull3", "ultradict_ng.cache"),
        ("cachetools", "cachetools"),
    ):
        why = _missing(module)
        if why:
            skipped[c] = why
    names = {c: run.new_name() for c in ("ours", "ours_cull3")}
    for n in names.values():
        run.own(n, lambda n=n: _unlink_ours(n), LABELS[part]["ours"])
    try:
        spec = {
            "alphas": list(alphas),
            "nkeys": NKEYS,
            "requests": REQUESTS,
            "size": SIZE,
            "contenders": [c for c in HIT if c not in skipped],
            "names": names,
        }
        got = _run_child(run, CC.hit_child, spec, 900)
        for alpha in alphas:
            row = (got.get("alphas") or {}).get(str(alpha), {})
            case = f"hit ratio, Zipf a={alpha:g}"
            extra = {
                "alpha": alpha,
                "nkeys": NKEYS,
                "requests": REQUESTS,
                "size": SIZE,
                "distinct": row.get("distinct"),
            }
            for c in HIT:
                res = row.get(c, {})
                why = skipped.get(c) or res.get("skipped")
                err = got.get("error") or res.get("error") or (None if "ratio" in res else "not measured")
                if why:
                    _record(run, part, case, c, "ratio", "higher", [], extra, skipped=why)
                elif err:
                    run.alert(f"workload {NUMBER}: {LABELS[part][c]} failed ({case}): {err}")
                    _record(run, part, case, c, "ratio", "higher", [], extra, error=err)
                else:
                    _record(
                        run,
                        part,
                        case,
                        c,
                        "ratio",
                        "higher",
                        [res["ratio"]],
                        {
                            **extra,
                            "hits": res["hits"],
                            "seconds": res["seconds"],
                            "stats": res.get("stats"),
                            "requests_per_s": REQUESTS / res["seconds"] if res["seconds"] else None,
                        },
                    )
    finally:
        for n in names.values():
            _unlink_ours(n)
            run.disown(n)


def _stampede(run: Run, reps: int) -> None:
    part = "stampede"
    rounds = reps
    name = run.new_name()
    run.own(name, lambda: _unlink_ours(name), LABELS[part]["cached"])
    d = _tmpdir(run, "stampede")
    path = os.path.join(d, "executions")
    spec = {"name": name, "path": path, "seconds": SLEEP, "rounds": rounds}
    barrier = run.ctx.Barrier(PROCS)
    q = run.ctx.Queue()
    procs = [
        run.ctx.Process(
            target=CC.stampede_worker,
            args=(w, spec, barrier, q),
            daemon=True,
            name=f"perf-cache-stampede-{w}",
        )
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
                    problem = (
                        f"{len(dead)} stampede process(es) died (exit codes {[p.exitcode for p in dead]})"
                        if dead
                        else "the stampede processes did not finish in time"
                    )
                    barrier.abort()
                    break
        problem = problem or next((a["error"] for a in answers if "error" in a), "")
        cached_error = next((a["cached_error"] for a in answers if a.get("cached_error")), "")
        lines: list[list[str]] = []
        if os.path.exists(path):
            with open(path) as f:
                lines = [ln.split() for ln in f if ln.strip()]
        for mode in STAMPEDE:
            counts, walls, errors = [], [], []
            for rnd in range(rounds):
                res = [r for a in answers for r in a.get("results", []) if r[0] == mode and r[1] == rnd]
                errors += [r[4] for r in res if r[4]]
                if len(res) == PROCS:
                    walls.append(max(r[3] for r in res) - min(r[2] for r in res))
                    counts.append(sum(1 for ln in lines if ln[0] == mode and ln[1] == str(rnd)))
            extra = {"processes": PROCS, "sleep_s": SLEEP, "rounds": rounds}
            case_c, case_w = "stampede: computations", "stampede: wall time"
            why = cached_error if mode == "cached" else ""
            if why and "No module named" in why:
                for case, unit in ((case_c, "count"), (case_w, "s")):
                    _record(run, part, case, mode, unit, "lower", [], extra, skipped=why)
                continue
            err = problem or why or (errors[0] if errors else "") or ("" if counts else "not measured")
            if err:
                run.alert(f"workload {NUMBER}: stampede ({LABELS[part][mode]}): {err}")
            if not counts:
                for case, unit in ((case_c, "count"), (case_w, "s")):
                    _record(run, part, case, mode, unit, "lower", [], extra, error=err or "not measured")
                continue
            _record(
                run,
                part,
                case_c,
                mode,
                "count",
                "lower",
                [float(x) for x in counts],
                extra,
                ok=not err,
                error=err or None,
            )
            _record(run, part, case_w, mode, "s", "lower", walls, extra, ok=not err, error=err or None)
    finally:
        for p in procs:
            if p.pid is not None:
                run.reap(p, 10)
            if p in run.children:
                run.children.remove(p)
        q.close()
        _unlink_ours(name)
        run.disown(name)
        _drop_dir(run, d)


def w_cache(run: Run, contenders: list[str]) -> None:
    reps = (
        run.repeat if run.quick else max(run.repeat, 7)
    )  # (a noisy machine: 7 in full mode, as workload 13)
    for what, fn in (
        ("Django cache API", lambda: _django(run, reps)),
        ("plain API", lambda: _plain(run, reps)),
        ("cachelib API", lambda: _plain(run, reps, "cachelib")),
        ("hit ratio", lambda: _hit(run)),
        ("stampede", lambda: _stampede(run, reps)),
    ):
        t0 = time.perf_counter()
        log(f"  shared cache: {what}")
        try:
            fn()
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"
            run.alert(f"workload {NUMBER} ({what}): {err}")
            part = {
                "Django cache API": "django",
                "plain API": "plain",
                "cachelib API": "cachelib",
                "hit ratio": "hit",
            }.get(what, "stampede")
            if not any(r["workload"] == WL and r["params"].get("part") == part for r in run.records):
                for c in LABELS[part]:  # the table shows the part as failed
                    _record(
                        run,
                        part,
                        f"{what}: failed",
                        c,
                        "ops/s",
                        "higher",
                        [],
                        {"op": "get", "value": "dict"},
                        error=err,
                    )
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
