"""Workload 14 (``bigdict``): one big read-mostly dict, loaded once, read by fresh processes.

``"user:%08d" % i -> (i, "name%d" % i, i * 0.5)``, 10k to 1M keys (10M with ``PERF_BIGDICT_10M=1``;
``--quick``: 10k) in ``SharedDict`` (whose readers map its dump's table and keep what they decoded),
with ``max_decoded=0`` (``uncached``), as the bare table (what SharedDict adds above it), in py-lmdb;
UltraDict and ``Manager().dict()`` when chosen.  Measured: load; in a fresh reader open + first read,
100,000 random reads, the same again (hot), private memory, items(); in a fresh writer 20,000 writes
of a key's own value and its private memory; in full mode 8 readers at once.  A wrong read is an alert.
SharedDict alone: 100,000 random overwrites by the process that loaded it, first pass, against the
same writes to a 1,000-key dict loaded the same way in the same process (a ratio per repetition).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import mmap
import os
import random
import shutil
import tempfile
import time
from typing import Any, Callable, Optional

from ultradict_ng import SharedDict, unlink_by_name
from ultradict_ng._codec.codec import MsgpackCodec
from ultradict_ng._platform import segments
from ultradict_ng._shm.table import Table, hash_key, map_size, write_map

from .registry import NG, Record, Target, Workload, pick, register
from .report import bars
from .run import Run
from .util import log, no_gc

WL = "bigdict"
#: contender -> (label, the largest size it is loaded at: UltraDict's replicas cost ~270 MiB a reader at 1M)
CONTENDERS = {
    NG: ("ultradict_ng SharedDict", 10_000_000),
    "uncached": ("ultradict_ng max_decoded=0", 10_000_000),
    "table": ("ultradict_ng table (its own API)", 10_000_000),
    "lmdb": ("py-lmdb + msgpack", 10_000_000),
    "UltraDict": ("UltraDict 0.0.6", 1_000_000),
    "Manager": ("Manager().dict()", 10_000),
}
READS = 100_000
WRITES = 20_000
#: metric -> (unit, better, its row in the table)
METRICS = {
    "load": ("s", "lower", "load (from a built dict)"),
    "open": ("s", "lower", "open + first read in a fresh process"),
    "random": ("ops/s", "higher", "random-key reads in a fresh process"),
    "hot": ("ops/s", "higher", "hot-key reads (the same keys again)"),
    "private": ("MiB", "lower", "a reader's private memory after its random reads"),
    "items": ("s", "lower", "items() over every pair"),
    "writes": ("ops/s", "higher", "writes in a fresh process (a key set to its value)"),
    "wprivate": ("MiB", "lower", "a writer's private memory"),
    "overwrite": ("ops/s", "higher", "overwrites by the loading process (first pass)"),
    "readers8": ("MiB", "lower", "8 readers at once: their private memory summed"),
}


def key(i: int) -> str:
    return f"user:{i:08d}"


def value(i: int) -> tuple[int, str, float]:
    return (i, f"name{i}", i * 0.5)


def _anon_mib() -> float:
    with open("/proc/self/smaps_rollup") as f:
        return next((int(line.split()[1]) / 1024 for line in f if line.startswith("Anonymous:")), 0.0)


def _shm_bytes(name: str) -> int:
    """Pages held by the segments whose names start with ``name`` (a dict's: the names are unique)."""
    return sum(os.stat("/dev/shm/" + e).st_blocks * 512 for e in os.listdir("/dev/shm") if e.startswith(name))


def _load(c: str, name: str, data: dict[str, Any], run: Run) -> tuple[dict[str, Any], int, Callable[[], Any]]:
    """Load ``data``; return (what a reader needs, shared bytes, destroy)."""
    label = CONTENDERS[c][0]
    if c in (NG, "uncached"):
        run.own(name, lambda: unlink_by_name(name), label)
        d = SharedDict(name=name, auto_unlink=False)  # the readers attach after it is closed
        d.update(data)
        shared = _shm_bytes(name)  # (pages held: the stream is sparse)
        d.close()
        return {"name": name}, shared, lambda: unlink_by_name(name)
    if c == "table":
        seg = name + "@t1"
        run.own(seg, lambda: segments.unlink(seg), label)
        packed = MsgpackCodec().dumps(data)
        hashes = [hash_key(k) for k in data]
        buf = bytearray(map_size(packed, hashes))
        size = write_map(memoryview(buf), packed, hashes, 1, 1)
        segments.create_written(seg, size, [(0, buf)], "no room for the table")
        return {"name": seg}, size, lambda: segments.unlink(seg)
    if c == "lmdb":
        import lmdb
        import msgpack

        path = tempfile.mkdtemp(prefix=name, dir="/dev/shm")
        run.own(path, lambda: shutil.rmtree(path, ignore_errors=True), label)
        env = lmdb.open(path, map_size=1 << 36, subdir=True)
        with env.begin(write=True) as txn:
            put, packb = txn.put, msgpack.packb
            for k, v in data.items():
                put(k.encode(), packb(v))
        env.close()
        shared = os.stat(os.path.join(path, "data.mdb")).st_blocks * 512
        return {"path": path}, shared, lambda: shutil.rmtree(path, ignore_errors=True)
    if c == "UltraDict":
        from UltraDict import UltraDict

        from .adapters import _ultra_dump_name, _ultra_unlink_all

        dump = _ultra_dump_name(name)
        run.own(name, lambda: _ultra_unlink_all(name, [dump]), label)
        d = UltraDict(name=name, create=True, shared_lock=True, full_dump_size=len(data) * 96 + (1 << 20))
        with d.lock:
            d.data.update(data)
            d.dump()

        def destroy() -> None:  # (the creator's handle stays open while readers attach)
            d.close(unlink=True)
            _ultra_unlink_all(name, [dump])

        return {"name": name}, _shm_bytes(name), destroy
    import multiprocessing

    mgr = multiprocessing.get_context("spawn").Manager()
    run.own(name, mgr.shutdown, label)
    proxy = mgr.dict()
    proxy.update(data)
    return {"proxy": proxy}, 0, mgr.shutdown


def _open(c: str, info: dict[str, Any], write: bool) -> tuple[Callable[..., Any], Any, Callable[[], Any]]:
    """(get, or set when ``write``; count every item, decoded; close) in a fresh process.

    Each set is visible to every other process once it returns (py-lmdb: a write transaction)."""
    if c == "Manager":
        p = info["proxy"]
        return (p.__setitem__ if write else p.__getitem__), lambda: len(p.items()), lambda: None
    if c in (NG, "uncached", "UltraDict"):
        if c == "UltraDict":
            from UltraDict import UltraDict

            d = UltraDict(name=info["name"], create=False)
        else:
            d = SharedDict(name=info["name"], create=False, max_decoded=0 if c == "uncached" else None)
        return (d.__setitem__ if write else d.__getitem__), lambda: sum(1 for _ in d.items()), d.close
    if c == "table":
        loads = MsgpackCodec().loads
        with segments.Opened(info["name"]) as seg:
            mm = seg.map(seg.size(), mmap.ACCESS_READ)
        t = Table(memoryview(mm), 1)
        look = t.lookup

        def get(k: str) -> Any:
            got = look(k, loads)
            if got is None:
                raise KeyError(k)
            return loads(got)

        return get, lambda: sum(1 for _ in t.decoded(loads)), t.close
    import lmdb
    import msgpack

    packb, unpackb = msgpack.packb, msgpack.unpackb
    if write:
        wenv = lmdb.open(info["path"], map_size=1 << 36, subdir=True)

        def put(k: str, v: Any) -> None:
            with wenv.begin(write=True) as txn:
                txn.put(k.encode(), packb(v))

        return put, None, wenv.close
    env = lmdb.open(info["path"], readonly=True, lock=False, subdir=True)
    txn = env.begin(buffers=True)
    tget = txn.get

    def lwalk() -> int:
        n = 0
        for kb, vb in txn.cursor():
            bytes(kb).decode(), unpackb(vb)
            n += 1
        return n

    return lambda k: unpackb(tget(k.encode())), lwalk, lambda: (txn.abort(), env.close())


def child(c: str, info: dict[str, Any], n: int, count: int, seed: int, mode: str) -> dict[str, Any]:
    """A fresh process, everything imported first: ``mode`` "write" sets ``count`` random keys to
    the value they hold (the dict stays the same), "read" / "walk" (+ items()) reads them."""
    importlib.import_module("msgpack")  # (imports are not part of the measurement)
    _import(c)
    rng = random.Random(seed)
    keys = [key(rng.randrange(n)) for _ in range(count)]
    if mode == "write":
        pairs = [(k, value(int(k[5:]))) for k in keys]
        base = _anon_mib()
        put, _, close = _open(c, info, True)
        put(*pairs[0])  # (opening catches up with the earlier writers' records: not timed)
        t0 = time.perf_counter()
        for k, v in pairs:
            put(k, v)
        out = {"writes": count / (time.perf_counter() - t0), "wprivate": _anon_mib() - base}
        close()
        return out
    base = _anon_mib()
    t0 = time.perf_counter()
    get, items, close = _open(c, info, False)
    first = get(keys[0])
    t1 = time.perf_counter()
    for k in keys:
        get(k)
    t2 = time.perf_counter()
    private = _anon_mib() - base
    for k in keys:
        get(k)
    t3 = time.perf_counter()
    local = {k: value(int(k[5:])) for k in keys}  # a plain dict of the same keys, for scale
    lget = local.__getitem__
    t4 = time.perf_counter()
    for k in keys:
        lget(k)
    dict_hot = count / (time.perf_counter() - t4)
    del local
    wrong = [k for k in keys[:200] if tuple(get(k)) != value(int(k[5:]))]
    wrong += [keys[0]] if tuple(first) != value(int(keys[0][5:])) else []
    out = {"open": t1 - t0, "random": count / (t2 - t1), "hot": count / (t3 - t2), "private": private}
    out.update(wrong=wrong[:3], dict_hot=dict_hot)
    if mode == "walk":
        t5 = time.perf_counter()
        got = items()
        out["items"] = time.perf_counter() - t5
        out["wrong"] += [f"items() gave {got} pairs, not {n}"] if got != n else []
    close()
    return out


def overwrites(names: list[str], n: int, seed: int) -> dict[str, Any]:
    """A fresh process loads ``n`` keys with ``update()`` and sets READS random keys to new values,
    and does the same with 1,000 keys, first or second by turns (``seed``): both rates, and both
    with a ``len()`` after the writes (which places the keys a big dict's writes left unplaced)."""
    rng, rates, placed, sizes = random.Random(seed), {}, {}, (n, 1000)
    for name, size in zip(names, sizes if seed % 2 == 0 else sizes[::-1]):
        d = SharedDict(name=name, create=True)
        d.update({key(i): value(i) for i in range(size)})
        pairs = [(key(j), value(j + 1)) for j in (rng.randrange(size) for _ in range(READS))]
        gc.collect()
        with no_gc():
            t0 = time.perf_counter()
            for k, v in pairs:
                d[k] = v
            rates[size] = READS / (time.perf_counter() - t0)
            len(d)
            placed[size] = READS / (time.perf_counter() - t0)
        d.unlink()
    return {"big": rates[n], "small": rates[1000], "placed": placed[n] / placed[1000]}


def _spawn(run: Run, c: str, info: dict[str, Any], n: int, mode: str, procs: int = 1) -> list[dict[str, Any]]:
    """``procs`` fresh processes at once (:func:`child`); their results, or the first error raised."""
    count = 10_000 if c == "Manager" else READS  # (UltraDict writes: ~200/s at 1M keys)
    count = (2_000 if c in ("Manager", "UltraDict") else WRITES) if mode == "write" else count
    args = [(c, info, n, count, random.randrange(1 << 30), mode) for _ in range(procs)]
    out = run.spawn(child, args, 900)
    errors = [r["error"] for r in out if "error" in r]
    if errors:
        raise RuntimeError(errors[0])
    return out


def _record(run: Run, size: int, c: str, m: str, values: list[float], extra: Any = None, **kw: Any) -> None:
    params = {"size": size, "metric": m, "contender": c, **(extra or {})}
    kw.update(unit=METRICS[m][0], better=METRICS[m][1], values=values, params=params)
    run.record(WL, f"{size:,} keys", c, **kw)["label"] = CONTENDERS[c][0]


def _import(c: str) -> Optional[str]:
    try:
        if c in ("lmdb", "UltraDict"):
            importlib.import_module(c)
    except Exception as exc:
        return f"{c} is not installed ({type(exc).__name__}); pip install -e '.[perf]'"
    return None


def w_bigdict(run: Run, chosen: list[str]) -> None:
    peers = {"ultradict_shared": "UltraDict", "manager": "Manager"}
    contenders = [NG, "uncached", "table", "lmdb"] + [peers[c] for c in chosen if c in peers]
    reps = run.repeat if run.quick else max(run.repeat, 3)
    sizes = [10_000] if run.quick else [10_000, 100_000, 1_000_000]
    for size in sizes + ([10_000_000] if not run.quick and os.environ.get("PERF_BIGDICT_10M") == "1" else []):
        log(f"  big dict: {size:,} keys")
        data = {key(i): value(i) for i in range(size)}
        for c in contenders:
            limit = CONTENDERS[c][1]
            why = _import(c) or (f"not loaded above {limit:,} keys" if size > limit else None)
            if why:
                for m in METRICS if not run.quick else list(METRICS)[:-1]:
                    _record(run, size, c, m, [], skipped=why)
                continue
            name = run.new_name()
            destroy: Optional[Callable[[], None]] = None
            try:
                # (The dict just built is millions of young objects: without this the
                # collection they are due lands in whichever load comes first.)
                gc.collect()
                t0 = time.perf_counter()
                info, shared, destroy = _load(c, name, data, run)
                _record(run, size, c, "load", [time.perf_counter() - t0])
                results = [_spawn(run, c, info, size, "walk")[0] for _ in range(reps)]
                for w in [w for r in results for w in r["wrong"]]:
                    run.alert(f"workload 14 ({c}, {size:,} keys): wrong read {w}")
                ok = not any(r["wrong"] for r in results)
                for m in ("open", "random", "hot", "private", "items"):
                    extra = {"dict_hot": [r["dict_hot"] for r in results]} if m == "hot" else None
                    _record(run, size, c, m, [r[m] for r in results], extra, ok=ok)
                if not run.quick:
                    eight, mib = _spawn(run, c, info, size, "read", 8), shared / 2**20
                    _record(run, size, c, "readers8", [sum(r["private"] for r in eight)], {"shared_mib": mib})
                    text = f"{mib:.1f} MiB of shared memory (or page cache)"
                    run.note(f"{CONTENDERS[c][0]} at {size:,} keys: {text}", WL)
                if c == "table":  # (never written: a table does not change)
                    for m in ("writes", "wprivate"):
                        _record(run, size, c, m, [], skipped="read only")
                else:  # last: the writes' records are replayed by every process that opens it after
                    wrote = [_spawn(run, c, info, size, "write")[0] for _ in range(reps)]
                    for m in ("writes", "wprivate"):
                        _record(run, size, c, m, [r[m] for r in wrote])
                if c == NG:
                    names = [run.new_name() for _ in range(2)]
                    for n in names:
                        run.own(n, lambda n=n: unlink_by_name(n), CONTENDERS[c][0])
                    got = [run.call(overwrites, names, size, rep) for rep in range(reps)]
                    if any("error" in r for r in got):
                        raise RuntimeError(next(r["error"] for r in got if "error" in r))
                    small = {"small": [r["small"] for r in got], "placed": [r["placed"] for r in got]}
                    _record(run, size, c, "overwrite", [r["big"] for r in got], small)
            except Exception as exc:
                run.alert(f"workload 14 ({c}, {size:,} keys): {type(exc).__name__}: {exc}")
                for m in list(METRICS)[:-1]:
                    _record(run, size, c, m, [], error=f"{type(exc).__name__}: {exc}")
            finally:
                if destroy is not None:
                    with contextlib.suppress(Exception):
                        destroy()
                for owned in [n for n in run.owned if n.startswith((name, "/dev/shm/" + name))]:
                    run.disown(owned)
        del data
    run.note(
        "values (i, 'name<i>', i * 0.5) under 'user:%08d' keys; one fresh spawned reader per repetition; "
        f"{READS:,} random reads (Manager: 10,000); private memory: Anonymous of /proc/self/smaps_rollup "
        "added by opening and the random reads",
        WL,
    )


# -- targets: against py-lmdb at 1M keys (in quick mode at 10k, marked) ----------------------

AT = ("1,000,000 keys", "100,000 keys", "10,000 keys")
TARGETS = [  # (metric, text, need): the first four are ours / py-lmdb's at the same size
    ("open", "open + first read in a fresh process <= 1.5x py-lmdb's", 1.5),
    ("load", "bulk load <= 1.0x py-lmdb's time", 1.0),
    ("random", "random-key reads in a fresh process >= 1.2x py-lmdb get + unpackb", 1.2),
    ("items", "items() over all keys <= 1.0x py-lmdb cursor + unpackb", 1.0),
    ("hot", "hot-key reads >= 0.5x a plain dict", 0.5),
    ("readers8", "8 readers' private memory together <= the dict's shared memory", 1.0),
    ("private", "a reader's private memory after 100k random reads <= 1.5x py-lmdb's + 16 MiB", 1.0),
    ("overwrite", "overwrites by the loading process >= 0.8x a 1,000-key dict's, first pass", 0.8),
]


def _measure(c: str, metric: str, recs: list[Record]) -> Optional[tuple[float, str]]:
    """Hot reads / a plain dict's, 8 readers' private memory / the dict's shared memory, a reader's
    private memory / (1.5x py-lmdb's + 16 MiB): at the largest size measured."""
    found = (pick(WL, c, case, metric=metric).find(recs) for case in AT)
    r = next((r for r in found if r and r["median"] is not None), None)
    if r is None:
        return None
    got, at = r["median"], f" at {r['case']}"
    if metric == "overwrite":  # (the median of each repetition's ratio: both measured in one process)
        ratios = sorted(b / s for b, s in zip(r["values"], r["params"]["small"]))
        placed = sorted(r["params"].get("placed") or [0.0])
        text = f"{r['label']} {got / 1e3:.0f}k/s; median ratio of {len(ratios)} runs, spread "
        text += f"{ratios[0]:.2f}-{ratios[-1]:.2f}; with a len() after: {placed[len(placed) // 2]:.2f}"
        return ratios[len(ratios) // 2], text + at
    if metric == "hot":
        ref = sorted(r["params"]["dict_hot"])[len(r["params"]["dict_hot"]) // 2]
        return got / ref, f"{r['label']} {got / 1e6:.2f} M/s vs a plain dict {ref / 1e6:.2f} M/s" + at
    if metric == "readers8":
        ref = r["params"]["shared_mib"]
        return (got / ref, f"{got:.0f} MiB private vs {ref:.0f} MiB shared" + at) if ref else None
    peer = pick(WL, "lmdb", r["case"], metric=metric).find(recs)
    if peer is None or peer["median"] is None:
        return None
    ref = 1.5 * peer["median"] + 16
    return (
        got / ref,
        f"{r['label']} {got:.1f} MiB vs py-lmdb {peer['median']:.1f} MiB (bound {ref:.1f} MiB)" + at,
    )


def _targets() -> tuple[Target, ...]:
    out = []
    for c, tag in ((NG, ""), ("uncached", " [max_decoded=0]"), ("table", " [the table through its own API]")):
        for metric, text, need in TARGETS if c == NG else TARGETS[:-1]:
            kw: dict[str, Any] = {"at_most": metric not in ("random", "hot", "overwrite")}
            if metric in ("hot", "readers8", "private", "overwrite"):
                kw["measure"] = lambda recs, c=c, m=metric: _measure(c, m, recs)
            else:
                kw.update(
                    num=tuple(pick(WL, c, at, metric=metric) for at in AT),
                    den=pick(WL, "lmdb", metric=metric),
                )
            out.append(Target(f"big dict (1,000,000 keys): {text}{tag}", need, **kw))
    return tuple(out)


def _panel(ax: Any, recs: list[Record]) -> str:
    bars(ax, [r for r in recs if r["params"].get("metric") == "random"])
    return "a big dict: random-key reads in a fresh process"


register(
    Workload(
        name=WL,
        number=14,
        title="a big dict read by fresh processes: load, open, random and hot reads, memory, items(), writes",
        run=w_bigdict,
        aliases=("big-dict", "bigdicts"),
        own=(NG, "ultradict_shared", "manager"),
        targets=_targets(),
        keys=lambda r: ("", f"big dict ({r['case']}): {METRICS[r['params']['metric']][2]}"),
        panel=_panel,
    )
)
