"""Workload 16 (``durable``): a dict kept in files against the durable stores people
reach for instead -- a bare ``pwrite`` + ``fdatasync`` loop, SQLite in WAL mode,
LMDB and diskcache -- on the machine's disk.

Cases (all in spawned children, files in a fresh directory under
``$ULTRADICT_NG_PERF_DIR`` or the system's temporary directory):

* small writes, one process: ``d[f"k{i % 1000}"] = i`` for ``box`` seconds, per
  sync policy, against each peer's own small write (one committed transaction
  each for SQLite and LMDB) and against the dict in shared memory;
* ``sync="always"`` with 4 writer processes (group commit): their total rate;
* a transaction of 1,000 writes under ``"always"`` against the same writes one by one;
* hot reads of a dict kept in files against one in shared memory;
* reopening N keys after a "reboot" (shared memory gone, files in the page
  cache) plus one read, against LMDB's open plus one get;
* recovery after a crash with a full stream against a clean reopen of the
  same dict (each followed by a read of every key);
* the disk space N keys ``"user:%08d" -> (int, str, float)`` take, against LMDB;
* a persistent cache: ``SharedCache(path=...)`` (its default policy,
  ``"interval"``) against ``diskcache.Cache``, set and hot get of a short
  string and of a small dict, 1,000 keys.

Repetitions alternate the contenders (order rotated); the table shows
median, min..max and the ratio against the row's reference.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import shutil
import sqlite3
import tempfile
import time
from typing import Any, Callable, Optional

from .run import Run
from .util import fmt_rate, fmt_seconds

WL = "durable"
NUMBER = 16
TITLE = (
    "dicts kept in files: durable writes, group commit, reads, reopen and recovery vs SQLite, LMDB, diskcache"
)
ENTRY: tuple[str, int, str] = (WL, NUMBER, TITLE)
ALIASES = {"files": WL, "disk": WL}

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
CASE_REOPEN = "open after a reboot + first read (s)"
CASE_RECOVER = "open + read every key (s)"
CASE_DISK = "disk space of the keys (bytes)"
CASE_CACHE = "persistent cache, 1,000 keys (ops/s)"
#: The cache case's values: a short string, and a small dict (a copy per get).
CACHE_VALUES = {"str": "x" * 20, "dict": {"id": 1, "name": "Ada", "tags": ["a", "b"], "score": 0.5}}


def _base() -> str:
    return tempfile.mkdtemp(prefix="perf_durable_", dir=os.environ.get("ULTRADICT_NG_PERF_DIR") or None)


def _reboot(path: str) -> None:
    from ultradict_ng._disk.opening import control_of

    try:
        os.unlink(os.path.join("/dev/shm", control_of(path)))
    except FileNotFoundError:
        pass


# -- writers: each returns a function that writes n times and gives the seconds ----------


def _reported(body: Callable[..., dict[str, Any]]) -> Callable[..., None]:
    """A spawned child's target: ``body(base, *args)`` run in a fresh directory
    ``base`` (under ``_base()``), its result -- or the error -- put on the queue
    passed last, the directory removed whatever happened."""

    @functools.wraps(body)
    def child(*args: Any) -> None:
        *given, q = args
        base = _base()
        try:
            q.put(body(base, *given))
        except BaseException as exc:
            q.put({"error": f"{type(exc).__name__}: {exc}"})
        finally:
            shutil.rmtree(base, ignore_errors=True)

    return child


def _writer(kind: str, where: str) -> tuple[Callable[[int], float], Callable[[], None]]:
    if kind == "fsync":
        fd = os.open(os.path.join(where, "log"), os.O_CREAT | os.O_WRONLY, 0o600)
        rec = b"x" * 64

        def loop(n: int) -> float:
            t0 = time.perf_counter()
            for i in range(n):
                os.pwrite(fd, rec, (i % 1000) * 64)
                os.fdatasync(fd)
            return time.perf_counter() - t0

        return loop, lambda: os.close(fd)
    if kind.startswith("sqlite"):
        db = sqlite3.connect(os.path.join(where, "db.sqlite"), isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={'FULL' if kind == 'sqlite_full' else 'NORMAL'}")
        db.execute("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v INTEGER)")

        def loop(n: int) -> float:
            t0 = time.perf_counter()
            for i in range(n):
                db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (f"k{i % 1000}", i))
            return time.perf_counter() - t0

        return loop, db.close
    if kind.startswith("lmdb"):
        import lmdb

        env = lmdb.open(os.path.join(where, "lmdb"), map_size=1 << 30, sync=kind == "lmdb_sync")

        def loop(n: int) -> float:
            t0 = time.perf_counter()
            for i in range(n):
                with env.begin(write=True) as txn:
                    txn.put(f"k{i % 1000}".encode(), str(i).encode())
            return time.perf_counter() - t0

        return loop, env.close
    if kind == "diskcache":
        import diskcache

        cache = diskcache.Cache(os.path.join(where, "diskcache"))

        def loop(n: int) -> float:
            t0 = time.perf_counter()
            for i in range(n):
                cache.set(f"k{i % 1000}", i)
            return time.perf_counter() - t0

        return loop, cache.close
    from ultradict_ng import SharedDict

    if kind == "memory":
        d = SharedDict(name=f"perf_durable_{os.getpid()}_{os.urandom(4).hex()}")
        finish = d.unlink
    else:
        d = SharedDict(path=os.path.join(where, "dict"), sync=kind)
        finish = d.unlink

    def loop(n: int) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            d[f"k{i % 1000}"] = i
        return time.perf_counter() - t0

    def close() -> None:
        finish()
        d.close()

    return loop, close


def _timed(loop: Callable[[int], float], box: float) -> float:
    """Writes per second over about ``box`` seconds."""
    n, spent = 0, 0.0
    chunk = 1
    while spent < box:
        spent += loop(chunk)
        n += chunk
        chunk = min(chunk * 2, 4096)
    return n / spent


@_reported
def child_writes(base: str, kinds: list[str], box: float, reps: int) -> dict[str, Any]:
    out: dict[str, list[float]] = {k: [] for k in kinds}
    made = {}
    for k in kinds:
        where = os.path.join(base, k)
        os.makedirs(where)
        made[k] = _writer(k, where)
        made[k][0](50)  # warm-up
    for rep in range(reps):
        for j in range(len(kinds)):
            k = kinds[(rep + j) % len(kinds)]
            out[k].append(_timed(made[k][0], box))
    for _, close in made.values():
        close()
    return {"rates": out}


def _cache_ops(kind: str, where: str) -> tuple[Callable[[str, Any, int], float], Callable[[], None]]:
    """``loop(op, value, n)``: n sets or gets; and a close that removes the cache."""
    if kind == "diskcache":
        import diskcache

        cache: Any = diskcache.Cache(os.path.join(where, "diskcache"))
        finish = cache.close
    else:
        from ultradict_ng.cache import SharedCache

        cache = SharedCache(path=os.path.join(where, "cache"))

        def finish() -> None:
            cache.unlink()
            cache.close()

    def loop(op: str, value: Any, n: int) -> float:
        keys = [f"k{i % 1000}" for i in range(n)]
        t0 = time.perf_counter()
        if op == "set":
            for k in keys:
                cache.set(k, value)
        else:
            get = cache.get
            for k in keys:
                get(k)
        return time.perf_counter() - t0

    return loop, finish


@_reported
def child_cache(base: str, box: float, reps: int) -> dict[str, Any]:
    out: dict[str, list[float]] = {}
    made = {}
    for kind in ("ultradict_ng", "diskcache"):
        os.makedirs(os.path.join(base, kind))
        made[kind] = _cache_ops(kind, os.path.join(base, kind))
    for rep in range(reps):
        for value_name, value in CACHE_VALUES.items():
            for op in ("set", "get"):
                kinds = list(made) if rep % 2 == 0 else list(made)[::-1]
                for kind in kinds:
                    loop = made[kind][0]
                    if op == "get":
                        loop("set", value, 1000)  # (every key holds this value)
                    out.setdefault(f"{kind} {op} {value_name}", []).append(
                        _timed(lambda n: loop(op, value, n), box)  # noqa: B023 - called at once
                    )
    for _, close in made.values():
        close()
    return {"cache": out}


def _group_writer(path: str, box: float, start: Any, q: Any) -> None:
    from ultradict_ng import SharedDict

    d = SharedDict(path=path, create=False)
    key = f"k{os.getpid()}"
    start.wait()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < box:
        d[key] = n
        n += 1
    q.put((n, time.perf_counter() - t0))
    d.close()


@_reported
def child_rest(base: str, box: float, reps: int, keys: int) -> dict[str, Any]:
    """Every case but the single-process writes, in one spawned child."""
    from ultradict_ng import SharedDict

    res: dict[str, Any] = {}
    # -- 4 writers under "always" (and 1, the same way) --------------------------------
    path = os.path.join(base, "group")
    d = SharedDict(path=path, sync="always")
    ctx = multiprocessing.get_context("spawn")
    group: dict[str, list[float]] = {"1": [], "4": []}
    for rep in range(reps):
        for procs in ("1", "4") if rep % 2 == 0 else ("4", "1"):
            start, rq = ctx.Event(), ctx.Queue()
            ps = [ctx.Process(target=_group_writer, args=(path, box, start, rq)) for _ in range(int(procs))]
            for p in ps:
                p.start()
            time.sleep(0.3)
            start.set()
            got = [rq.get(timeout=120) for _ in ps]
            for p in ps:
                p.join(30)
            group[procs].append(sum(n for n, _ in got) / max(t for _, t in got))
    res["group"] = group
    # -- a transaction of 1,000 writes vs one by one -----------------------------------
    tx: dict[str, list[float]] = {"transaction": [], "one by one": []}
    for rep in range(reps):
        t0 = time.perf_counter()
        with d.transaction():
            for i in range(1000):
                d[f"t{i}"] = rep
        tx["transaction"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for i in range(1000):
            d[f"t{i}"] = rep + 1
        tx["one by one"].append(time.perf_counter() - t0)
    res["tx"] = tx
    d.unlink()
    d.close()
    # -- hot reads -------------------------------------------------------------------
    mem = SharedDict({f"k{i}": i for i in range(1000)}, name=f"perf_durable_{os.getpid()}")
    disk = SharedDict({f"k{i}": i for i in range(1000)}, path=os.path.join(base, "reads"))
    reads: dict[str, list[float]] = {"memory": [], "files": []}

    def read_loop(dd: Any) -> float:
        n, t0 = 0, time.perf_counter()
        while True:
            for _ in range(10000):
                dd["k7"]
            n += 10000
            t = time.perf_counter() - t0
            if t >= box:
                return n / t

    for rep in range(reps):
        for which in ("memory", "files") if rep % 2 == 0 else ("files", "memory"):
            reads[which].append(read_loop(mem if which == "memory" else disk))
    res["reads"] = reads
    mem.unlink()
    mem.close()
    disk.unlink()
    disk.close()
    # -- reopen after a reboot, recovery, disk space ---------------------------------
    res.update(_big(base, keys, reps))
    return res


def _big(base: str, keys: int, reps: int) -> dict[str, Any]:
    import lmdb
    import msgpack

    from ultradict_ng import SharedDict

    rows = {f"user:{i:08d}": (i, f"name{i}", i / 7) for i in range(keys)}
    path = os.path.join(base, "big")
    d = SharedDict(rows, path=path, sync="never")
    d.close()
    lpath = os.path.join(base, "big.lmdb")
    env = lmdb.open(lpath, map_size=1 << 33, sync=False)
    with env.begin(write=True) as txn:
        for k, v in rows.items():
            txn.put(k.encode(), msgpack.packb(v))
    env.sync(True)
    env.close()
    probe = f"user:{keys // 2:08d}"
    reopen: dict[str, list[float]] = {"ultradict_ng": [], "lmdb": []}
    for _ in range(reps):
        _reboot(path)
        t0 = time.perf_counter()
        d = SharedDict(path=path, create=False)
        d[probe]
        reopen["ultradict_ng"].append(time.perf_counter() - t0)
        d.close()
        t0 = time.perf_counter()
        env = lmdb.open(lpath, map_size=1 << 33, readonly=True, lock=False)
        with env.begin() as txn:
            msgpack.unpackb(txn.get(probe.encode()))
        reopen["lmdb"].append(time.perf_counter() - t0)
        env.close()
    disk = {
        "ultradict_ng": sum(os.stat(os.path.join(path, f)).st_blocks * 512 for f in os.listdir(path)),
        "lmdb": sum(os.stat(os.path.join(lpath, f)).st_blocks * 512 for f in os.listdir(lpath)),
    }
    # Recovery: the stream full of overwrites, the writer gone without closing.
    recover: dict[str, list[float]] = {"recovery after a crash": [], "clean reopen": []}
    ctx = multiprocessing.get_context("spawn")
    for _ in range(reps):
        p = ctx.Process(target=_fill_then_die, args=(path, keys))
        p.start()
        p.join(600)
        _reboot(path)
        t0 = time.perf_counter()
        d = SharedDict(path=path, create=False)
        len(d.copy())
        recover["recovery after a crash"].append(time.perf_counter() - t0)
        d.close()
        _reboot(path)
        t0 = time.perf_counter()
        d = SharedDict(path=path, create=False)
        len(d.copy())
        recover["clean reopen"].append(time.perf_counter() - t0)
        d.close()
    d = SharedDict(path=path, create=False)
    d.unlink()
    d.close()
    return {"reopen": reopen, "disk": disk, "recover": recover}


def _fill_then_die(path: str, keys: int) -> None:
    """Overwrite keys until the stream is 90% full (of STREAM_GROWTH times the
    dump, at most its cap), then die without closing (SIGKILL)."""
    import signal

    from ultradict_ng import SharedDict
    from ultradict_ng._shm import layout as L

    d = SharedDict(path=path, create=False)
    dump = os.path.join(path, "dump." + L.base36(d.stats()["generation"]))
    full = min(L.STREAM_GROWTH * os.stat(dump).st_size, L.GROWING_STREAM_CAP)  # (what the stream may hold)
    i = 0
    while d.stats()["stream_end"] < full * 0.9:
        for _ in range(1000):
            d[f"user:{i % keys:08d}"] = (i, "x", 0.5)
            i += 1
    os.kill(os.getpid(), signal.SIGKILL)


def _spawn(target: Callable[..., None], *args: Any) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q), daemon=False)
    p.start()
    try:
        got: dict[str, Any] = q.get(timeout=1800)
    finally:
        p.join(60)
        if p.is_alive():
            p.kill()
            p.join(5)
        q.close()
    return got


def w_durable(run: Run, contenders: list[str]) -> None:
    quick = run.quick
    box = 0.25 if quick else 1.0
    reps = run.repeat if quick else max(run.repeat, 5)
    keys = 100_000 if quick else 1_000_000
    kinds = [k for k in WRITERS if k != "diskcache" or _has("diskcache")]
    kinds = [k for k in kinds if not k.startswith("lmdb") or _has("lmdb")]
    got = _spawn(child_writes, kinds, box, reps)
    if "error" in got:
        run.alert(f"workload {NUMBER}: {got['error']}")
    else:
        for k in kinds:
            run.record(
                WL, CASE_WRITES, k, unit="/s", better="higher", values=got["rates"][k], params={"kind": k}
            )["label"] = WRITERS[k]
    if _has("diskcache"):
        got = _spawn(child_cache, box, reps)
        if "error" in got:
            run.alert(f"workload {NUMBER}: {got['error']}")
        else:
            for contender, values in got["cache"].items():
                run.record(WL, CASE_CACHE, contender, unit="/s", better="higher", values=values)
    if not _has("lmdb") or not _has("msgpack"):
        run.note("py-lmdb is missing: the reopen and disk rows are not measured", WL)
        return
    rest = _spawn(child_rest, box, reps, keys)
    if "error" in rest:
        run.alert(f"workload {NUMBER}: {rest['error']}")
        return
    for procs, values in rest["group"].items():
        rec = run.record(WL, CASE_GROUP, f"{procs} writer(s)", unit="/s", better="higher", values=values)
        rec["params"] = {"procs": int(procs)}
    for mode, values in rest["tx"].items():
        run.record(WL, CASE_TX, mode, unit="s", better="lower", values=values)
    for which, values in rest["reads"].items():
        run.record(WL, CASE_READS, which, unit="/s", better="higher", values=values)
    for who, values in rest["reopen"].items():
        run.record(WL, f"{CASE_REOPEN}, {keys:,} keys", who, unit="s", better="lower", values=values)
    for who, values in rest["recover"].items():
        run.record(WL, f"{CASE_RECOVER}, {keys:,} keys", who, unit="s", better="lower", values=values)
    for who, size in rest["disk"].items():
        run.record(WL, f"{CASE_DISK}, {keys:,} keys", who, unit="B", better="lower", values=[float(size)])
    run.note(
        f"files on {os.environ.get('ULTRADICT_NG_PERF_DIR') or tempfile.gettempdir()}; "
        f"writes d[f'k{{i % 1000}}'] = i for {box:g} s per repetition; "
        f"{keys:,} keys 'user:%08d' -> (int, str, float) for the reopen, recovery and disk rows",
        WL,
    )


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


# -- report -------------------------------------------------------------------------------


def _rows(recs: list[dict[str, Any]], case_prefix: str) -> list[dict[str, Any]]:
    return [r for r in recs if r["workload"] == WL and r["case"].startswith(case_prefix)]


def _median(recs: list[dict[str, Any]], case_prefix: str, contender: str) -> Optional[float]:
    for r in _rows(recs, case_prefix):
        if r["contender"] == contender and r["median"]:
            return float(r["median"])
    return None


def section(recs: list[dict[str, Any]], number: int, title: str, notes: list[str]) -> str:
    lines = ["", f"== {number}. {title} =="]
    for case, ref in (
        (CASE_WRITES, "fsync"),
        (CASE_GROUP, "1 writer(s)"),
        (CASE_TX, "one by one"),
        (CASE_READS, "memory"),
        (CASE_REOPEN, "lmdb"),
        (CASE_RECOVER, "clean reopen"),
        (CASE_DISK, "lmdb"),
        (CASE_CACHE, "diskcache, the same operation and value"),
    ):
        rows = _rows(recs, case)
        if not rows:
            continue
        lines.append(f"  {rows[0]['case']}   (x: against {ref})")
        base = _median(recs, case, ref)
        for r in rows:
            if case == CASE_CACHE:  # (each row against diskcache's same operation)
                base = _median(recs, case, "diskcache " + r["contender"].split(" ", 1)[1])
            if r["median"] is None:
                lines.append(f"    {r['label']:<34} FAILED")
                continue
            shown = (
                fmt_rate(r["median"])
                if r["unit"] == "/s"
                else f"{r['median'] / 2**20:,.1f} MiB"
                if r["unit"] == "B"
                else fmt_seconds(r["median"])
            )
            q = r["median"] / base if base else None
            spread = (
                ""
                if r["unit"] == "B"
                else f"  ({r['n']} runs, min..max {_fmt(r, r['min'])} .. {_fmt(r, r['max'])})"
            )
            lines.append(f"    {r['label']:<34}{shown:>12}{'' if q is None else f'{q:>9.2f}x'}{spread}")
    for n in notes:
        lines.append(f"   note: {n}")
    return "\n".join(lines)


def _fmt(r: dict[str, Any], x: float) -> str:
    return fmt_rate(x) if r["unit"] == "/s" else fmt_seconds(x)


def targets(recs: list[dict[str, Any]], quick: bool) -> list[dict[str, Any]]:
    def ratio(case: str, a: str, b: str) -> Optional[float]:
        x, y = _median(recs, case, a), _median(recs, case, b)
        return None if x is None or y is None or not y else x / y

    wanted = [
        (
            'sync="always", one writer >= 0.8x a bare pwrite+fdatasync',
            ratio(CASE_WRITES, "always", "fsync"),
            0.8,
            True,
        ),
        (
            'sync="always", one writer >= 1.5x SQLite WAL FULL',
            ratio(CASE_WRITES, "always", "sqlite_full"),
            1.5,
            True,
        ),
        (
            'sync="always", 4 writers >= 2x one writer',
            ratio(CASE_GROUP, "4 writer(s)", "1 writer(s)"),
            2.0,
            True,
        ),
        (
            "a transaction of 1,000 writes >= 100x them one by one",
            ratio(CASE_TX, "one by one", "transaction"),
            100.0,
            True,
        ),
        (
            'sync="interval" >= 0.8x the dict in shared memory',
            ratio(CASE_WRITES, "interval", "memory"),
            0.8,
            True,
        ),
        ('sync="never" >= 0.8x the dict in shared memory', ratio(CASE_WRITES, "never", "memory"), 0.8, True),
        (
            'sync="interval" >= 10x SQLite WAL NORMAL',
            ratio(CASE_WRITES, "interval", "sqlite_normal"),
            10.0,
            True,
        ),
        ("hot reads >= 0.95x the dict in shared memory", ratio(CASE_READS, "files", "memory"), 0.95, True),
        (
            "reopen after a reboot + first read <= 2x LMDB's",
            ratio(CASE_REOPEN, "ultradict_ng", "lmdb"),
            2.0,
            False,
        ),
        (
            "recovery with a full stream <= 2x a clean reopen",
            ratio(CASE_RECOVER, "recovery after a crash", "clean reopen"),
            2.0,
            False,
        ),
        ("disk space <= 2x LMDB's", ratio(CASE_DISK, "ultradict_ng", "lmdb"), 2.0, False),
    ]
    for value in CACHE_VALUES:
        for op in ("set", "get"):
            wanted.append(
                (
                    f"SharedCache(path=...) {op} of a {value} >= 10x diskcache's",
                    ratio(CASE_CACHE, f"ultradict_ng {op} {value}", f"diskcache {op} {value}"),
                    10.0,
                    True,
                )
            )
    out = []
    for text, q, need, higher in wanted:
        row: dict[str, Any] = {"target": f"durable: {text}", "need": f"{'>=' if higher else '<='} {need:g}x"}
        if q is None:
            row.update(measured=None, status="n/a", detail="not measured")
        else:
            ok = q >= need if higher else q <= need
            row.update(measured=q, status="PASS" if ok else "MISS", detail=f"{q:.2f}x")
            if quick:
                row["caveat"] = "--quick repetitions and sizes"
        out.append(row)
    return out


def plot_panel(ax: Any, recs: list[dict[str, Any]]) -> str:
    """Small writes per second, one process, by contender (whiskers min..max), log scale."""
    rows = [r for r in _rows(recs, CASE_WRITES) if r["median"]]
    ys = [r["median"] for r in rows]
    lo = [r["median"] - r["min"] for r in rows]
    hi = [r["max"] - r["median"] for r in rows]
    colors = [
        "tab:blue" if r["contender"] in ("always", "interval", "never", "memory") else "tab:gray"
        for r in rows
    ]
    ax.barh(range(len(rows)), ys, xerr=[lo, hi], color=colors, capsize=2)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r["label"] for r in rows], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("writes/s (median)")
    ax.invert_yaxis()
    return "durable small writes, one process"
