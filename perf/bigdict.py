"""Workload 14 (``bigdict``): one big read-mostly dict shared by reader processes.

The dict: ``"user:%08d" % i -> (i, "name%d" % i, i * 0.5)`` at 10k, 100k and 1M
keys (10M with ``PERF_BIGDICT_10M=1``; ``--quick``: 10k), loaded once by the
harness, then read by fresh spawned processes.  Contenders:

* ``ultradict_ng``: ``SharedDict``: its dump is a table, which a reader maps
  and reads in place (from ``PARTIAL_FROM`` = 4,096 keys: ``_shm/tablecache.py``),
  keeping every value it decoded (hot reads at dict speed);
* ``uncached``: the same read with ``max_decoded=0``: no value kept decoded,
  every read decoded from the table (memory and random reads against hot reads);
* ``table``: that table read through its own API (``_shm/table.py``), with
  the serializer's ``loads`` per value: what ``SharedDict`` adds above it;
* ``lmdb``: py-lmdb, values msgpack-packed, one write transaction to load,
  a read-only environment without locks to read (``get`` + ``unpackb``);
* ``UltraDict``: UltraDict 0.0.6 (its local dict filled, then one ``dump()``);
* ``Manager``: ``multiprocessing.Manager().dict()``, at 10k keys only (each
  read is a round trip; larger loads take minutes).

Measured per contender and size: **load** (harness process, from a built
``dict``), and in a fresh reader per repetition: **open + first read**,
**random reads** (100,000 uniformly random keys; 10,000 for Manager),
**hot reads** (the same keys again), **private memory** (``Anonymous`` of
``/proc/self/smaps_rollup`` added by opening and the random reads: what the
process holds that no other does), **items()** (every pair, decoded); then,
in a fresh writer per repetition, **writes** (20,000 random keys set to the
value they hold, 2,000 for Manager and UltraDict; after opening and a first write: the rate) and its
**private memory** (py-lmdb: a write transaction per set).  Once
per size (not with ``--quick``): **8 readers** at once, each opening and
reading 100,000 random keys, their private memory summed, beside the dict's
shared bytes.  Readers check a sample of values; a wrong value is an alert.
"""

from __future__ import annotations

import gc
import os
import random
import shutil
import tempfile
import time
from typing import Any, Callable, Optional

from .run import Run
from .util import log

WL = "bigdict"
NUMBER = 14
TITLE = "a big dict read by fresh processes: load, open, random and hot reads, memory, items(), writes"
ENTRY: tuple[str, int, str] = (WL, NUMBER, TITLE)
ALIASES = {"big-dict": WL, "bigdicts": WL}
CONTENDERS = ("ultradict_ng", "uncached", "table", "lmdb", "UltraDict", "Manager")
LABELS = {
    "ultradict_ng": "ultradict_ng SharedDict",
    "uncached": "ultradict_ng max_decoded=0",
    "table": "ultradict_ng table (its own API)",
    "lmdb": "py-lmdb + msgpack",
    "UltraDict": "UltraDict 0.0.6",
    "Manager": "Manager().dict()",
}
#: Largest size each contender is loaded at (UltraDict's replicas cost ~270 MiB per reader at 1M keys).
MAX_SIZE = {
    "ultradict_ng": 10_000_000,
    "uncached": 10_000_000,
    "table": 10_000_000,
    "lmdb": 10_000_000,
    "UltraDict": 1_000_000,
    "Manager": 10_000,
}
READS = 100_000
WRITES = 20_000
METRICS = ("load", "open", "random", "hot", "private", "items", "writes", "wprivate")
UNITS = {
    "load": ("s", "lower"),
    "open": ("s", "lower"),
    "random": ("ops/s", "higher"),
    "hot": ("ops/s", "higher"),
    "private": ("MiB", "lower"),
    "items": ("s", "lower"),
    "readers8": ("MiB", "lower"),
    "writes": ("ops/s", "higher"),
    "wprivate": ("MiB", "lower"),
}


def sizes(run: Run) -> list[int]:
    if run.quick:
        return [10_000]
    out = [10_000, 100_000, 1_000_000]
    if os.environ.get("PERF_BIGDICT_10M") == "1":
        out.append(10_000_000)
    return out


def key(i: int) -> str:
    return f"user:{i:08d}"


def value(i: int) -> tuple[int, str, float]:
    return (i, f"name{i}", i * 0.5)


def _anon_mib() -> float:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) / 1024
    return 0.0


# -- loading (harness process) ------------------------------------------------------------------


def _load(
    contender: str, name: str, data: dict[str, Any], run: Run
) -> tuple[dict[str, Any], int, Callable[[], None]]:
    """Load ``data``; return (what a reader needs, shared bytes, destroy)."""
    if contender in ("ultradict_ng", "uncached"):
        from ultradict_ng import SharedDict, unlink_by_name

        run.own(name, lambda: unlink_by_name(name), LABELS[contender])
        d = SharedDict(name=name, auto_unlink=False)  # the readers attach after it is closed
        d.update(data)
        shared = sum(
            os.stat(os.path.join("/dev/shm", e)).st_blocks * 512
            for e in os.listdir("/dev/shm")
            if e == name or e.startswith(name + "@")
        )  # (pages held: the stream is sparse)
        d.close()
        return {"name": name}, shared, lambda: unlink_by_name(name)
    if contender == "table":
        from ultradict_ng._codec.codec import MsgpackCodec
        from ultradict_ng._platform import segments as _segments
        from ultradict_ng._shm.table import hash_key, map_size, write_map

        seg = name + "@t1"
        run.own(seg, lambda: _segments.unlink(seg), LABELS[contender])
        packed = MsgpackCodec().dumps(data)
        hashes = [hash_key(k) for k in data]
        buf = bytearray(map_size(packed, hashes))
        size = write_map(memoryview(buf), packed, hashes, 1, 1)
        _segments.create_written(seg, size, [(0, buf)], "no room for the table")
        return {"name": seg}, size, lambda: _segments.unlink(seg)
    if contender == "lmdb":
        import lmdb
        import msgpack

        path = tempfile.mkdtemp(prefix=name, dir="/dev/shm")
        run.own(path, lambda: shutil.rmtree(path, ignore_errors=True), LABELS[contender])
        env = lmdb.open(path, map_size=1 << 36, subdir=True)
        with env.begin(write=True) as txn:
            put, packb = txn.put, msgpack.packb
            for k, v in data.items():
                put(k.encode(), packb(v))
        env.close()
        shared = os.stat(os.path.join(path, "data.mdb")).st_blocks * 512
        return {"path": path}, shared, lambda: shutil.rmtree(path, ignore_errors=True)
    if contender == "UltraDict":
        from UltraDict import UltraDict

        from .adapters import _ultra_dump_name, _ultra_unlink_all

        run.own(name, lambda: _ultra_unlink_all(name, [_ultra_dump_name(name)]), LABELS[contender])
        d = UltraDict(name=name, create=True, shared_lock=True, full_dump_size=len(data) * 96 + (1 << 20))
        with d.lock:
            d.data.update(data)
            d.dump()
        shared = sum(
            os.stat(os.path.join("/dev/shm", e)).st_blocks * 512
            for e in os.listdir("/dev/shm")
            if e.startswith(name)
        )
        dump = _ultra_dump_name(name)

        def destroy() -> None:  # (the creator's handle stays open while readers attach)
            d.close(unlink=True)
            _ultra_unlink_all(name, [dump])

        return {"name": name}, shared, destroy
    if contender == "Manager":
        import multiprocessing

        mgr = multiprocessing.get_context("spawn").Manager()
        run.own(name, mgr.shutdown, LABELS[contender])
        proxy = mgr.dict()
        proxy.update(data)
        return {"proxy": proxy}, 0, mgr.shutdown
    raise ValueError(contender)


# -- reading (a fresh spawned process) ----------------------------------------------------------


def _open(
    contender: str, info: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], int], Callable[[], None]]:
    """(get, walk every item and count them, close) for a reader of ``contender``."""
    if contender in ("ultradict_ng", "uncached"):
        from ultradict_ng import SharedDict

        d = SharedDict(name=info["name"], create=False, max_decoded=0 if contender == "uncached" else None)
        return d.__getitem__, lambda: sum(1 for _ in d.items()), d.close
    if contender == "table":
        import mmap

        from ultradict_ng._codec.codec import MsgpackCodec
        from ultradict_ng._platform import segments as _segments
        from ultradict_ng._shm.table import Table

        loads = MsgpackCodec().loads
        with _segments.Opened(info["name"]) as seg:
            mm = seg.map(seg.size(), mmap.ACCESS_READ)
        t = Table(memoryview(mm), 1)
        look = t.lookup

        def get(k: str) -> Any:
            got = look(k, loads)
            if got is None:
                raise KeyError(k)
            return loads(got)

        def walk() -> int:
            return sum(1 for _ in t.decoded(loads))

        return get, walk, t.close
    if contender == "lmdb":
        import lmdb
        import msgpack

        env = lmdb.open(info["path"], readonly=True, lock=False, subdir=True)
        txn = env.begin(buffers=True)
        tget, unpackb = txn.get, msgpack.unpackb

        def lget(k: str) -> Any:
            return unpackb(tget(k.encode()))

        def lwalk() -> int:
            n = 0
            for kb, vb in txn.cursor():
                bytes(kb).decode(), unpackb(vb)
                n += 1
            return n

        return lget, lwalk, lambda: (txn.abort(), env.close())
    if contender == "UltraDict":
        from UltraDict import UltraDict

        u = UltraDict(name=info["name"], create=False)
        return u.__getitem__, lambda: sum(1 for _ in u.items()), u.close
    if contender == "Manager":
        p = info["proxy"]
        return p.__getitem__, lambda: len(p.items()), lambda: None
    raise ValueError(contender)


def reader(contender: str, info: dict[str, Any], n: int, reads: int, seed: int, walk: bool, q: Any) -> None:
    """One fresh reader: everything imported first, then timed open, reads, memory, items()."""
    try:
        import msgpack  # noqa: F401  (imports are not part of the measurement)

        import ultradict_ng

        if contender == "table":
            import ultradict_ng._codec.codec
            import ultradict_ng._platform.segments
            import ultradict_ng._shm.table  # noqa: F401
        if contender == "lmdb":
            import lmdb  # noqa: F401
        if contender == "UltraDict":
            import UltraDict  # noqa: F401
        rng = random.Random(seed)
        keys = [key(rng.randrange(n)) for _ in range(reads)]
        base = _anon_mib()
        t0 = time.perf_counter()
        get, items, close = _open(contender, info)
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
        dict_hot = reads / (time.perf_counter() - t4)
        del local
        wrong = [k for k in keys[:200] if tuple(get(k)) != value(int(k[5:]))]
        if tuple(first) != value(int(keys[0][5:])):
            wrong.append(keys[0])
        out: dict[str, Any] = {
            "open": t1 - t0,
            "random": reads / (t2 - t1),
            "hot": reads / (t3 - t2),
            "private": private,
            "wrong": wrong[:3],
            "dict_hot": dict_hot,
        }
        if walk:
            t5 = time.perf_counter()
            count = items()
            out["items"] = time.perf_counter() - t5
            if count != n:
                out["wrong"].append(f"items() gave {count} pairs, not {n}")
        close()
        q.put(out)
    except BaseException as exc:
        q.put({"error": f"{type(exc).__name__}: {exc}"})


def _open_writable(
    contender: str, info: dict[str, Any]
) -> tuple[Callable[[str, Any], None], Callable[[], None]]:
    """(set one key, close) for a writer of ``contender``; each set is visible
    to every other process once it returns (py-lmdb: one write transaction)."""
    if contender in ("ultradict_ng", "uncached"):
        from ultradict_ng import SharedDict

        d = SharedDict(name=info["name"], create=False, max_decoded=0 if contender == "uncached" else None)
        return d.__setitem__, d.close
    if contender == "lmdb":
        import lmdb
        import msgpack

        env = lmdb.open(info["path"], map_size=1 << 36, subdir=True)
        packb = msgpack.packb

        def put(k: str, v: Any) -> None:
            with env.begin(write=True) as txn:
                txn.put(k.encode(), packb(v))

        return put, env.close
    if contender == "UltraDict":
        from UltraDict import UltraDict

        u = UltraDict(name=info["name"], create=False)
        return u.__setitem__, u.close
    if contender == "Manager":
        return info["proxy"].__setitem__, lambda: None
    raise ValueError(contender)


def writer(contender: str, info: dict[str, Any], n: int, writes: int, seed: int, q: Any) -> None:
    """One fresh writer: open and one write, then ``writes`` random keys set
    to the value they hold (the dict stays the same for whoever reads it
    next): their rate, and the private memory opening and writing added."""
    try:
        import msgpack  # noqa: F401  (imports are not part of the measurement)

        import ultradict_ng  # noqa: F401

        if contender == "lmdb":
            import lmdb  # noqa: F401
        if contender == "UltraDict":
            import UltraDict  # noqa: F401
        rng = random.Random(seed)
        keys = [key(rng.randrange(n)) for _ in range(writes)]
        pairs = [(k, value(int(k[5:]))) for k in keys]
        base = _anon_mib()
        put, close = _open_writable(contender, info)
        put(*pairs[0])  # (opening catches up with the earlier writers' records: not timed)
        t0 = time.perf_counter()
        for k, v in pairs:
            put(k, v)
        elapsed = time.perf_counter() - t0
        private = _anon_mib() - base
        close()
        q.put({"writes": writes / elapsed, "wprivate": private})
    except BaseException as exc:
        q.put({"error": f"{type(exc).__name__}: {exc}"})


def _spawn_writer(run: Run, contender: str, info: dict[str, Any], n: int) -> dict[str, Any]:
    writes = 2_000 if contender in ("Manager", "UltraDict") else WRITES  # (UltraDict: ~200/s at 1M keys)
    q = run.ctx.Queue()
    p = run.ctx.Process(
        target=writer, args=(contender, info, n, writes, random.randrange(1 << 30), q), daemon=True
    )
    p.start()
    try:
        return q.get(timeout=900)  # type: ignore[no-any-return]
    finally:
        p.join(60)
        if p.is_alive():
            p.kill()
            p.join(5)
        q.close()


def _spawn_readers(
    run: Run, contender: str, info: dict[str, Any], n: int, count: int, walk: bool
) -> list[dict[str, Any]]:
    reads = 10_000 if contender == "Manager" else READS
    q = run.ctx.Queue()
    procs = [
        run.ctx.Process(
            target=reader, args=(contender, info, n, reads, random.randrange(1 << 30), walk, q), daemon=True
        )
        for _ in range(count)
    ]
    for p in procs:
        p.start()
    try:
        return [q.get(timeout=900) for _ in procs]
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join(5)
        q.close()


# -- the workload ------------------------------------------------------------------------------


def _available(contender: str) -> Optional[str]:
    module = {"lmdb": "lmdb", "UltraDict": "UltraDict"}.get(contender)
    if module is None:
        return None
    try:
        __import__(module)
    except Exception as exc:
        return f"{module} is not installed ({type(exc).__name__}); pip install -e '.[perf]'"
    return None


def _record(
    run: Run,
    size: int,
    contender: str,
    metric: str,
    values: list[float],
    extra: Optional[dict[str, Any]] = None,
    **kw: Any,
) -> None:
    unit, better = UNITS[metric]
    params = {"size": size, "metric": metric, "contender": contender, **(extra or {})}
    rec = run.record(
        WL, f"{size:,} keys", contender, unit=unit, better=better, values=values, params=params, **kw
    )
    rec["label"] = LABELS[contender]


def w_bigdict(run: Run, contenders: list[str]) -> None:
    reps = run.repeat if run.quick else max(run.repeat, 3)
    for size in sizes(run):
        log(f"  big dict: {size:,} keys")
        data = {key(i): value(i) for i in range(size)}
        for c in contenders:
            why = _available(c) or (
                None
                if size <= MAX_SIZE[c]
                else f"not loaded above {MAX_SIZE[c]:,} keys (see the workload's notes)"
            )
            if why:
                for m in METRICS + (("readers8",) if not run.quick else ()):
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
                results = [_spawn_readers(run, c, info, size, 1, True)[0] for _ in range(reps)]
                errors = [r["error"] for r in results if "error" in r]
                if errors:
                    raise RuntimeError(errors[0])
                for r in results:
                    for w in r["wrong"]:
                        run.alert(f"workload {NUMBER} ({c}, {size:,} keys): wrong read {w}")
                for m in ("open", "random", "hot", "private", "items"):
                    _record(
                        run,
                        size,
                        c,
                        m,
                        [r[m] for r in results],
                        ok=not any(r["wrong"] for r in results),
                        extra={"dict_hot": [r["dict_hot"] for r in results]} if m == "hot" else None,
                    )
                if not run.quick:
                    eight = _spawn_readers(run, c, info, size, 8, False)
                    errors = [r["error"] for r in eight if "error" in r]
                    if errors:
                        raise RuntimeError(errors[0])
                    _record(
                        run,
                        size,
                        c,
                        "readers8",
                        [sum(r["private"] for r in eight)],
                        extra={"shared_mib": shared / 2**20},
                    )
                    run.note(
                        f"{LABELS[c]} at {size:,} keys: {shared / 2**20:.1f} MiB of shared memory "
                        "(or page cache)",
                        WL,
                    )
                if c == "table":  # (never written: a table does not change)
                    for m in ("writes", "wprivate"):
                        _record(run, size, c, m, [], skipped="read only")
                else:  # last: the writes' records are replayed by every process that opens it after
                    wrote = [_spawn_writer(run, c, info, size) for _ in range(reps)]
                    errors = [r["error"] for r in wrote if "error" in r]
                    if errors:
                        raise RuntimeError(errors[0])
                    for m in ("writes", "wprivate"):
                        _record(run, size, c, m, [r[m] for r in wrote])
            except Exception as exc:
                run.alert(f"workload {NUMBER} ({c}, {size:,} keys): {type(exc).__name__}: {exc}")
                for m in METRICS:
                    _record(run, size, c, m, [], error=f"{type(exc).__name__}: {exc}")
            finally:
                if destroy is not None:
                    try:
                        destroy()
                    except Exception:
                        pass
                for owned in [n for n in run.owned if n.startswith(name)]:
                    run.disown(owned)
                for owned in [n for n in run.owned if n.startswith("/dev/shm/" + name)]:
                    run.disown(owned)
        del data
    run.note(
        "values (i, 'name<i>', i * 0.5) under 'user:%08d' keys; one fresh spawned reader per "
        f"repetition; {READS:,} random reads (Manager: 10,000); private memory: Anonymous of "
        "/proc/self/smaps_rollup added by opening and the random reads",
        WL,
    )
