"""Workload 16 (``durable``): a dict kept in files against what people use instead -- a bare
``pwrite`` + ``fdatasync`` loop, SQLite (WAL), LMDB, diskcache -- on this machine's disk: small
writes per sync policy, group commit, a transaction vs its writes one by one, hot reads, reopen
after a "reboot" (shared memory gone), recovery after a crash, disk space, a persistent cache.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import importlib.util
import multiprocessing
import os
import shutil
import signal
import sqlite3
import tempfile
import time
import timeit
from collections.abc import Iterator
from typing import Any, Callable, Optional

import msgpack

from ultradict_ng import SharedDict
from ultradict_ng._disk.opening import control_of
from ultradict_ng._shm import layout as L
from ultradict_ng.cache import SharedCache

from .registry import NG, Target, Workload, pick, register
from .run import Run
from .util import calibrate

WL = "durable"
TITLE = (
    "dicts kept in files: durable writes, group commit, reads, reopen and recovery vs SQLite, LMDB, diskcache"
)
WRITERS = {
    "fsync": "bare pwrite(64 B) + fdatasync",
    "always": 'ultradict_ng sync="always"',
    "sqlite_full": "SQLite WAL, synchronous=FULL",
    "lmdb_sync": "LMDB, sync=True",
    "diskcache": "diskcache Cache.set",
    "interval": 'ultradict_ng sync="interval"',
    "never": 'ultradict_ng sync="never"',
    "sqlite_normal": "SQLite WAL, synchronous=NORMAL",
    "lmdb_nosync": "LMDB, sync=False",
    "memory": "ultradict_ng in shared memory",
}
CASE_WRITES = "small writes, one process (writes/s)"
CASE_GROUP = 'sync="always", 4 writer processes (writes/s, all together)'
CASE_TX = 'a transaction of 1,000 writes under sync="always" (s per 1,000 writes)'
CASE_READS = "hot reads d[k] (reads/s)"
CASE_REOPEN = "a new process's open after a reboot + first read (s)"
CASE_REPEAT = "open after a reboot + first read, again and again in one process (s)"
CASE_RECOVER = "open + read every key (s)"
CASE_DISK = "disk space of the keys (MiB)"
CASE_CACHE = "persistent cache, 1,000 keys: {} of a {} (ops/s)"
CRASH = "recovery after a crash"
LMDB_RW = "lmdb, read-write"  # (the targets' "lmdb": read-only, no lock)
#: The cache case's values: a short string, and a small dict (a copy per get).
CACHE_VALUES = {"str": "x" * 20, "dict": {"id": 1, "name": "Ada", "tags": ["a", "b"], "score": 0.5}}
Results = dict[Any, list[float]]


def rates(loops: dict[Any, Callable[[int], float]], box: float, reps: int) -> Results:
    """``reps`` rates of each ``loops[k](n)`` (n operations, their seconds), ~``box`` s each, rotated."""
    ops = {k: calibrate(loop, box) for k, loop in loops.items()}
    out: Results = {k: [] for k in loops}
    names = list(loops)
    for rep in range(reps):
        for k in names[rep % len(names) :] + names[: rep % len(names)]:
            out[k].append(ops[k] / loops[k](ops[k]))
    return out


@contextlib.contextmanager
def owned(run: Run, dicts: int, prefix: str, where: Optional[str] = None) -> Iterator[list[str]]:
    """``dicts`` new dict names of this run, then a new directory: removed after, or at cleanup."""
    keys = [run.new_name() for _ in range(dicts)] + [tempfile.mkdtemp(prefix=prefix, dir=where)]
    for k in keys[:-1]:
        run.own(k, functools.partial(SharedDict.unlink_by_name, k), "ultradict_ng")
    run.own(keys[-1], functools.partial(shutil.rmtree, keys[-1], ignore_errors=True), f"{prefix} directory")
    try:
        yield keys
    finally:
        for k in keys:
            with contextlib.suppress(Exception):
                run.owned.pop(k)[0]()


def _drop(d: Any) -> None:
    d.unlink()
    d.close()


def _writer(kind: str, where: str, name: str) -> tuple[Callable[[int], float], Callable[[], Any]]:
    """``loop(n)``: n writes ``k{i % 1000} = i``, their seconds; and a close that removes what it made."""
    if kind in ("always", "interval", "never", "memory"):
        d = SharedDict(name=name) if kind == "memory" else SharedDict(path=where, sync=kind)
        put, close = d.__setitem__, functools.partial(_drop, d)
    elif kind == "fsync":
        fd = os.open(where, os.O_CREAT | os.O_WRONLY, 0o600)

        def put(k: str, i: int) -> None:
            os.pwrite(fd, b"x" * 64, (i % 1000) * 64)
            os.fdatasync(fd)

        close = functools.partial(os.close, fd)
    elif kind.startswith("sqlite"):
        db = sqlite3.connect(where, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={'FULL' if kind == 'sqlite_full' else 'NORMAL'}")
        db.execute("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v INTEGER)")
        put, close = (lambda k, i: db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (k, i))), db.close
    elif kind.startswith("lmdb"):
        import lmdb

        env = lmdb.open(where, map_size=1 << 30, sync=kind == "lmdb_sync")

        def put(k: str, i: int) -> None:  # (one committed transaction per write)
            with env.begin(write=True) as txn:
                txn.put(k.encode(), str(i).encode())

        close = env.close
    else:
        import diskcache

        cache = diskcache.Cache(where)
        put, close = cache.set, cache.close

    def loop(n: int) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            put(f"k{i % 1000}", i)
        return time.perf_counter() - t0

    return loop, close


def child_writes(base: str, name: str, box: float, reps: int, kinds: list[str]) -> Results:
    made = {k: _writer(k, f"{base}/{k}", name) for k in kinds}
    for loop, _ in made.values():
        loop(50)  # warm-up
    out = rates({(CASE_WRITES, k): loop for k, (loop, _) in made.items()}, box, reps)
    for _, close in made.values():
        close()
    return out


def child_cache(base: str, name: str, box: float, reps: int, _: Any) -> Results:
    import diskcache

    made = {NG: SharedCache(path=f"{base}/{NG}"), "diskcache": diskcache.Cache(f"{base}/diskcache")}

    def loop(cache: Any, op: str, value: Any, n: int) -> float:
        keys = [f"k{i % 1000}" for i in range(n)]
        if op == "get":
            loop(cache, "set", value, 1000)  # (every key holds this value)
        t0 = time.perf_counter()
        if op == "set":
            for k in keys:
                cache.set(k, value)
        else:
            get = cache.get
            for k in keys:
                get(k)
        return time.perf_counter() - t0

    loops = {
        (CASE_CACHE.format(op, value_name), kind): functools.partial(loop, cache, op, value)
        for value_name, value in CACHE_VALUES.items()
        for op in ("set", "get")
        for kind, cache in made.items()
    }
    out = rates(loops, box, reps)
    _drop(made[NG])
    made["diskcache"].close()
    return out


def _group_writer(path: str, box: float, start: Any, q: Any) -> None:
    d = SharedDict(path=path, create=False)
    key = f"k{os.getpid()}"
    start.wait()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < box:
        d[key] = n
        n += 1
    q.put((n, time.perf_counter() - t0))
    d.close()


def _group(path: str, box: float, procs: int) -> float:
    """Writes per second of ``procs`` processes writing together, each its own key."""
    ctx = multiprocessing.get_context("spawn")
    start, rq = ctx.Event(), ctx.Queue()
    ps = [ctx.Process(target=_group_writer, args=(path, box, start, rq)) for _ in range(procs)]
    for p in ps:
        p.start()
    time.sleep(0.3)
    start.set()
    got = [rq.get(timeout=120) for _ in ps]
    for p in ps:
        p.join(30)
    return sum(n for n, _ in got) / max(t for _, t in got)


def _open(path: str, probe: Optional[str] = None) -> float:
    """Seconds to open the dict kept in ``path`` after a reboot and read ``probe`` (else copy it)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join("/dev/shm", control_of(path)))  # (the reboot)
    t0 = time.perf_counter()
    d = SharedDict(path=path, create=False)
    _ = d[probe] if probe is not None else len(d.copy())
    took = time.perf_counter() - t0
    d.close()
    return took


def _open_lmdb(path: str, probe: str, locked: bool = False) -> float:
    """The same for LMDB: read-only without its lock, or ``locked`` (read-write), as writers open it."""
    import lmdb

    t0 = time.perf_counter()
    with lmdb.open(path, map_size=1 << 33, readonly=not locked, lock=locked) as env, env.begin() as txn:
        msgpack.unpackb(txn.get(probe.encode()))
        return time.perf_counter() - t0  # (before the close, as _open's)


def _fresh(fn: Callable[..., float], *args: Any) -> float:
    """``fn(*args)`` in a new process: after a reboot every process opens for the first time."""
    with concurrent.futures.ProcessPoolExecutor(1, multiprocessing.get_context("spawn")) as ex:
        return float(ex.submit(fn, *args).result(timeout=120))


def child_rest(base: str, name: str, box: float, reps: int, keys: int) -> Results:
    """Group commit, a transaction, hot reads; reopen, recovery and disk space of ``keys`` keys."""
    import lmdb

    out: Results = collections.defaultdict(list)
    path = f"{base}/group"
    d = SharedDict(path=path, sync="always")
    for rep in range(reps):
        for n in ((1, 4), (4, 1))[rep % 2]:
            out[CASE_GROUP, f"{n} writer(s)"].append(_group(path, box, n))
    for rep in range(reps):
        t0 = time.perf_counter()
        with d.transaction():
            for i in range(1000):
                d[f"t{i}"] = rep
        t1 = time.perf_counter()
        for i in range(1000):
            d[f"t{i}"] = rep + 1
        out[CASE_TX, "transaction"].append(t1 - t0)
        out[CASE_TX, "one by one"].append(time.perf_counter() - t1)
    _drop(d)
    rows = {f"k{i}": i for i in range(1000)}
    dicts = {"memory": SharedDict(rows, name=name), "files": SharedDict(rows, path=f"{base}/reads")}
    reads = {(CASE_READS, k): timeit.Timer('d["k7"]', globals={"d": dd}).timeit for k, dd in dicts.items()}
    out.update(rates(reads, box, reps))
    for dd in dicts.values():
        _drop(dd)
    sized = f", {keys:,} keys"
    rows = {f"user:{i:08d}": (i, f"name{i}", i / 7) for i in range(keys)}
    path, lpath = f"{base}/big", f"{base}/big.lmdb"
    SharedDict(rows, path=path, sync="never").close()
    env = lmdb.open(lpath, map_size=1 << 33, sync=False)
    with env.begin(write=True) as txn:
        txn.cursor().putmulti((k.encode(), msgpack.packb(v)) for k, v in rows.items())
    env.sync(True)
    env.close()
    probe = f"user:{keys // 2:08d}"
    for rep in range(reps):
        for who in (NG, "lmdb", LMDB_RW)[:: 1 - 2 * (rep % 2)]:
            args = (path, probe) if who == NG else (lpath, probe, who == LMDB_RW)
            out[CASE_REOPEN + sized, who].append(_fresh(_open if who == NG else _open_lmdb, *args))
    for _ in range(reps):
        out[CASE_REPEAT + sized, NG].append(_open(path, probe))
        out[CASE_REPEAT + sized, "lmdb"].append(_open_lmdb(lpath, probe))
    for who, where in ((NG, path), ("lmdb", lpath)):
        size = sum(os.stat(os.path.join(where, f)).st_blocks * 512 for f in os.listdir(where))
        out[CASE_DISK + sized, who].append(size / 2**20)
    for _ in range(reps):  # recovery: the stream full of overwrites, the writer gone without closing
        p = multiprocessing.get_context("spawn").Process(target=_fill_then_die, args=(path, keys))
        p.start()
        p.join(600)
        for who in (CRASH, "clean reopen"):
            out[CASE_RECOVER + sized, who].append(_open(path))
    _drop(SharedDict(path=path, create=False))
    return out


def _fill_then_die(path: str, keys: int) -> None:
    # Overwrite keys until the stream is 90% full, then die without closing (SIGKILL).
    d = SharedDict(path=path, create=False)
    dump = os.path.join(path, "dump." + L.base36(d.stats()["generation"]))
    full = min(L.STREAM_GROWTH * os.stat(dump).st_size, L.GROWING_STREAM_CAP)  # (what the stream may hold)
    i = 0
    while d.stats()["stream_end"] < full * 0.9:
        for _ in range(1000):
            d[f"user:{i % keys:08d}"] = (i, "x", 0.5)
            i += 1
    os.kill(os.getpid(), signal.SIGKILL)


def w_durable(run: Run, contenders: list[str]) -> None:
    box, keys = (0.25, 100_000) if run.quick else (1.0, 1_000_000)
    reps = run.repeat if run.quick else max(run.repeat, 5)
    where = os.environ.get("ULTRADICT_NG_PERF_DIR") or None
    has = {m: importlib.util.find_spec(m) is not None for m in ("diskcache", "lmdb", "msgpack")}
    parts = [(child_writes, [k for k in WRITERS if has.get(k.split("_")[0], True)])]
    parts += [(child_cache, None)] if has["diskcache"] else []
    if has["lmdb"] and has["msgpack"]:
        parts.append((child_rest, keys))
    else:
        run.note("py-lmdb is missing: the reopen and disk rows are not measured", WL)
    for body, arg in parts:
        with owned(run, 1, "perf_durable_", where) as (name, base):
            got = run.call(body, base, name, box, reps, arg)
        if "error" in got:
            run.alert(f"workload 16: {got.pop('error')}")
        for (case, who), values in got.items():
            unit = "MiB" if "(MiB)" in case else "s" if "(s" in case else "ops/s"  # (as the case says)
            params = {"kind": who} if case == CASE_WRITES else {}
            params.update({"procs": int(who[0])} if case == CASE_GROUP else {})
            better = "higher" if unit == "ops/s" else "lower"
            rec = run.record(WL, case, who, unit=unit, better=better, values=values, params=params)
            rec["label"] = WRITERS[who] if case == CASE_WRITES else who
    run.note(
        f"files on {where or tempfile.gettempdir()}; writes d[f'k{{i % 1000}}'] = i for {box:g} s per "
        f"repetition; {keys:,} keys 'user:%08d' -> (int, str, float) for the reopen, recovery and disk rows; "
        "a reopen in a new spawned process per repetition, its imports done first",
        WL,
    )


def _panel(ax: Any, recs: list[dict[str, Any]]) -> str:
    from .report import bars

    bars(ax, [r for r in recs if r["case"] == CASE_WRITES])  # (the other rows are other units)
    return "durable small writes, one process"


def _target(text: str, need: float, who: str, case: str, against: str) -> Target:
    """``who``'s median in ``case`` over ``against``'s (at 1M keys, or at 100k in quick mode)."""
    sizes = (1_000_000, 100_000) if case in (CASE_REOPEN, CASE_REPEAT, CASE_RECOVER, CASE_DISK) else ()
    num = tuple(pick(WL, who, f"{case}, {n:,} keys") for n in sizes) or pick(WL, who, case)
    return Target(f"durable: {text}", need, num=num, den=pick(WL, against), at_most="<=" in text)


_TARGETS = [  # (text, need, contender, case, against: the contender in the same case)
    ('sync="always", one writer >= 0.8x a bare pwrite+fdatasync', 0.8, "always", CASE_WRITES, "fsync"),
    ('sync="always", one writer >= 1.5x SQLite WAL FULL', 1.5, "always", CASE_WRITES, "sqlite_full"),
    ('sync="always", 4 writers >= 2x one writer', 2, "4 writer(s)", CASE_GROUP, "1 writer(s)"),
    ("a transaction of 1,000 writes >= 100x them one by one", 100, "one by one", CASE_TX, "transaction"),
    ('sync="interval" >= 0.8x the dict in shared memory', 0.8, "interval", CASE_WRITES, "memory"),
    ('sync="never" >= 0.8x the dict in shared memory', 0.8, "never", CASE_WRITES, "memory"),
    ('sync="interval" >= 10x SQLite WAL NORMAL', 10, "interval", CASE_WRITES, "sqlite_normal"),
    ("hot reads >= 0.95x the dict in shared memory", 0.95, "files", CASE_READS, "memory"),
    ("a new process's reopen after a reboot + first read <= 2x LMDB's", 2, NG, CASE_REOPEN, "lmdb"),
    ("recovery with a full stream <= 2x a clean reopen", 2, CRASH, CASE_RECOVER, "clean reopen"),
    ("disk space <= 2x LMDB's", 2, NG, CASE_DISK, "lmdb"),
]
_TARGETS += [
    (f"SharedCache(path=...) {op} of a {v} >= 10x diskcache's", 10, NG, CASE_CACHE.format(op, v), "diskcache")
    for v in CACHE_VALUES
    for op in ("set", "get")
]
TARGETS = tuple(_target(*t) for t in _TARGETS)
register(Workload(WL, 16, TITLE, w_durable, ("files", "disk"), targets=TARGETS, panel=_panel))
