"""Workload 11 (``pool``): the code that runs in the spawned driver and in the pool workers.

One **driver** process per contender and round (:func:`driver_main`, spawned
by :mod:`perf.pool`) makes the contender's executor, warms its workers up with
tiny tasks, measures the cases it is told to and sends the timings back
through a pipe.  A fresh process per contender keeps them apart: importing
``npshmex`` replaces ``concurrent.futures._base.Future`` with its own class
for the whole process, and nothing of that may reach the others.

The **task functions** (:func:`add_one`, :func:`add_one_stamped`,
:func:`hand_add_one`, :func:`tiny`, and :func:`inc` and :func:`small_dict` of
the small-task rows) live here so that a pool worker can
import them whatever the start method.

The hand-written contender (:class:`Hand`) is a plain
:class:`concurrent.futures.ProcessPoolExecutor` where the caller manages
:class:`multiprocessing.shared_memory.SharedMemory` itself: it creates an
input segment, copies the array in and passes the name; the worker attaches,
creates an output segment, computes into it (``np.add(x, 1, out=...)``) and
returns its name; the caller attaches the output and uses it zero-copy, then
closes and unlinks both.  No segment is left to the resource tracker:
``track=False`` on Python >= 3.13; before, every process unregisters a
segment right after creating or attaching it (the tracker keeps a set per
name, not a count, so a registration left by an attach would be dropped by
another process's unregister) and the owner unlinks it with
``shm_unlink`` alone.  Segment names start with a prefix the harness gives,
so that it can remove whatever a crash leaves.

Every driver ignores SIGINT (the harness ends it by its pid), turns SIGTERM
into ``SystemExit`` so that its executor is shut down and its segments are
released on the way out, and reports its workers' pids (and for
ultradict_ng its pool's parcel prefix) so that the harness can end and remove
whatever survives a driver that was killed.
"""

from __future__ import annotations

import gc
import itertools
import os
import signal
import sys
import time
import traceback
from multiprocessing import resource_tracker, shared_memory
from typing import Any, Callable, Optional

from .util import no_gc

try:
    import numpy as np
except ImportError:  # pragma: no cover - the harness checks before it spawns a driver
    np = None  # type: ignore[assignment]

clock = time.perf_counter  # CLOCK_MONOTONIC on Linux: shared by every process of the machine

#: The contenders, in table order.
CONTENDERS = ("stdlib", "npshmex", "handwritten", "ultradict_ng")


# -- task functions (run in the pool workers) ---------------------------------------------------


def add_one(x: Any) -> Any:
    return x + 1


def add_one_stamped(x: Any) -> dict[str, Any]:
    """``x + 1`` and the worker's clock around it (a dict: npshmex moves only arrays and
    dicts of arrays through shared memory)."""
    t0 = clock()
    out = x + 1
    t1 = clock()
    return {"out": out, "t_start": t0, "t_end": t1}


def tiny(x: Any) -> Any:
    """The warm-up: long enough that every worker of the pool gets one."""
    time.sleep(0.05)
    return x


def worker_pid(_: Any = None) -> int:
    return os.getpid()


def inc(x: int) -> int:
    """The small-task rows' task: an int in, an int out."""
    return x + 1


def small_dict(i: int) -> dict[str, Any]:
    """The small-task rows' task with a result of a few fields."""
    return {"i": i, "square": i * i, "name": f"item-{i}", "even": i % 2 == 0}


# -- the hand-written SharedMemory contender ----------------------------------------------------

_TRACK_PARAM = sys.version_info >= (3, 13)
_seq = itertools.count()


def shm_create(name: str, size: int) -> shared_memory.SharedMemory:
    """A new segment that no resource tracker will unlink or warn about."""
    if _TRACK_PARAM:
        return shared_memory.SharedMemory(name, create=True, size=size, track=False)  # type: ignore[call-arg]
    seg = shared_memory.SharedMemory(name, create=True, size=size)
    resource_tracker.unregister(seg._name, "shared_memory")  # type: ignore[attr-defined]
    return seg


def shm_attach(name: str) -> shared_memory.SharedMemory:
    if _TRACK_PARAM:
        return shared_memory.SharedMemory(name, track=False)  # type: ignore[call-arg]
    seg = shared_memory.SharedMemory(name)  # < 3.13 registers an attach too
    resource_tracker.unregister(seg._name, "shared_memory")  # type: ignore[attr-defined]
    return seg


def shm_unlink(seg: shared_memory.SharedMemory) -> None:
    """Remove the name (without a tracker message: the segment is not registered)."""
    if _TRACK_PARAM:
        seg.unlink()  # track=False: no unregister
        return
    import _posixshmem  # type: ignore[import-not-found, unused-ignore]

    _posixshmem.shm_unlink(seg._name)  # type: ignore[attr-defined]  # what SharedMemory.unlink calls


def shm_unlink_name(name: str) -> bool:
    """Remove a segment by name; False if it was not there."""
    try:
        import _posixshmem  # type: ignore[import-not-found, unused-ignore]

        _posixshmem.shm_unlink("/" + name)
        return True
    except FileNotFoundError:
        return False
    except ImportError:  # pragma: no cover
        try:
            os.unlink(os.path.join("/dev/shm", name))
            return True
        except FileNotFoundError:
            return False


def hand_add_one(
    spec: tuple[str, tuple[int, ...], str], prefix: str, stamped: bool = False
) -> tuple[Any, ...]:
    """In a worker: attach the input, compute ``x + 1`` into a new output segment, return its name."""
    name, shape, dtype = spec
    seg_in = shm_attach(name)
    try:
        x = np.ndarray(shape, np.dtype(dtype), buffer=seg_in.buf)
        t0 = clock()
        out_name = f"{prefix}o{os.getpid():x}_{next(_seq)}"
        seg_out = shm_create(out_name, max(1, x.nbytes))
        try:
            y = np.ndarray(shape, x.dtype, buffer=seg_out.buf)
            np.add(x, 1, out=y)
            del y
        except BaseException:
            seg_out.close()
            shm_unlink(seg_out)
            raise
        seg_out.close()
        t1 = clock()
        del x
    finally:
        seg_in.close()
    return (out_name, shape, dtype, t0, t1) if stamped else (out_name, shape, dtype)


class Hand:
    """The caller's side of the hand-written contender: every segment it made or took,
    released in :meth:`release` (and in :meth:`release_all`, also after an error)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.segs: list[shared_memory.SharedMemory] = []

    def put(self, arr: Any) -> tuple[str, tuple[int, ...], str]:
        name = f"{self.prefix}i{next(_seq)}"
        seg = shm_create(name, max(1, arr.nbytes))
        self.segs.append(seg)
        dst = np.ndarray(arr.shape, arr.dtype, buffer=seg.buf)
        dst[...] = arr
        del dst
        return (name, arr.shape, arr.dtype.str)

    def take(self, ret: tuple[Any, ...]) -> Any:
        name, shape, dtype = ret[:3]
        seg = shm_attach(name)
        self.segs.append(seg)
        return np.ndarray(shape, np.dtype(dtype), buffer=seg.buf)

    def release_all(self) -> None:
        """Close and unlink every segment (the arrays over them must be gone)."""
        segs, self.segs = self.segs, []
        for seg in segs:
            try:
                seg.close()
            except BufferError:
                pass  # an array still views it; the unlink is what matters
            try:
                shm_unlink(seg)
            except FileNotFoundError:
                pass


# -- the driver ----------------------------------------------------------------------------------


def _on_term(signum: int, frame: Any) -> None:
    raise SystemExit(143)


def _executor_class(contender: str) -> tuple[Callable[..., Any], str]:
    """The contender's executor class and its version (ImportError if it is missing)."""
    import platform

    if contender in ("stdlib", "handwritten"):
        import concurrent.futures as cf

        return cf.ProcessPoolExecutor, "stdlib " + platform.python_version()
    if contender == "npshmex":
        import npshmex  # replaces concurrent.futures._base.Future in this process

        return npshmex.ProcessPoolExecutor, getattr(npshmex, "__version__", "?")
    if contender == "ultradict_ng":
        from ultradict_ng.futures import ProcessPoolExecutor

        try:
            from importlib.metadata import version

            v = version("ultradict_ng")
        except Exception:
            v = "?"
        return ProcessPoolExecutor, v
    raise ValueError(f"unknown pool contender {contender!r}")


def _proc_start(pid: int) -> Optional[str]:
    """The start time of ``pid`` (field 22 of /proc/<pid>/stat): tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class Driver:
    """One contender's executors and measurements inside the driver process."""

    def __init__(self, contender: str, params: dict[str, Any], conn: Any) -> None:
        self.contender = contender
        self.p = params
        self.conn = conn
        self.cls, self.version = _executor_class(contender)
        self.hand = Hand(params["hand_prefix"]) if contender == "handwritten" else None
        self.ex: Any = None

    # -- executors ---------------------------------------------------------------------------
    def start(self, workers: int) -> None:
        import multiprocessing as mp

        self.ex = self.cls(max_workers=workers, mp_context=mp.get_context(self.p["start_method"]))
        # Tiny tasks, one per worker (each sleeps a little, so all are started and busy).
        futs = [self.ex.submit(tiny, np.ones(4)) for _ in range(workers)]
        for f in futs:
            f.result(timeout=120)
        pids = sorted(getattr(self.ex, "_processes", {}) or {})
        info: dict[str, Any] = {"pids": [(pid, _proc_start(pid)) for pid in pids]}
        pool = getattr(self.ex, "_pool", None)  # ultradict_ng's parcel bookkeeping
        if self.contender == "ultradict_ng" and pool is not None:
            from ultradict_ng.futures.parcel import pool_prefix

            info["parcel_prefix"] = pool_prefix(pool.token)
        self.conn.send(("pool", info))

    def stop(self) -> None:
        ex, self.ex = self.ex, None
        if ex is not None:
            ex.shutdown(wait=True, cancel_futures=True)

    # -- one call ----------------------------------------------------------------------------
    def roundtrip(self, x: Any, stamped: bool) -> tuple[float, Any, dict[str, float]]:
        """``submit(add_one, x).result()``, the result's first and last element read."""
        ex, hand = self.ex, self.hand
        stages: dict[str, float] = {}
        if hand is None:
            fn = add_one_stamped if stamped else add_one
            t0 = clock()
            r = ex.submit(fn, x).result()
            if stamped:
                t_done = clock()
                out = r["out"]  # (npshmex's Future has already un-shm'd the dict's arrays)
                first, last = out[0], out[-1]
                t1 = clock()
                stages = {
                    "to_worker": r["t_start"] - t0,
                    "compute": r["t_end"] - r["t_start"],
                    "back": t_done - r["t_end"],
                }
            else:
                first, last = r[0], r[-1]
                t1 = clock()
                out = r
            return t1 - t0, (first, last, type(out).__module__ + "." + type(out).__name__), stages
        t0 = clock()
        spec = hand.put(x)
        t_put = clock()
        ret = ex.submit(hand_add_one, spec, hand.prefix, stamped).result()
        t_done = clock()
        out = hand.take(ret)
        first, last = out[0], out[-1]
        t1 = clock()
        if stamped:
            stages = {
                "to_worker": ret[3] - t0,
                "compute": ret[4] - ret[3],
                "back": t1 - ret[4],
                "put": t_put - t0,
                "take": t1 - t_done,
            }
        kind = type(out).__module__ + "." + type(out).__name__
        del out
        return t1 - t0, (first, last, kind), stages

    def release(self) -> float:
        t0 = clock()
        if self.hand is not None:
            self.hand.release_all()
        gc.collect()
        return clock() - t0

    # -- the cases ---------------------------------------------------------------------------
    def case_submit(self, reps: int, stamped_reps: int) -> dict[str, Any]:
        n = self.p["submit_elements"]
        self.start(1)
        x = np.ones(n)
        times: list[float] = []
        releases: list[float] = []
        stages: list[dict[str, float]] = []
        wrong: list[str] = []
        kinds: set[str] = set()
        for i in range(reps + stamped_reps):
            stamped = i >= reps
            gc.collect()
            with no_gc():
                dt, (first, last, kind), st = self.roundtrip(x, stamped)
            kinds.add(kind)
            if first != 2.0 or last != 2.0:
                wrong.append(f"result[0]={first!r}, result[-1]={last!r}, expected 2.0 ({kind})")
            releases.append(self.release())
            if stamped:
                stages.append(dict(st, total=dt))
            else:
                times.append(dt)
        del x
        self.stop()
        return {
            "times": times,
            "release_s": releases,
            "stages": stages,
            "wrong": wrong,
            "result_types": sorted(kinds),
            "elements": n,
        }

    def case_map(self, reps: int) -> dict[str, Any]:
        count, nbytes = self.p["map_arrays"], self.p["map_bytes"]
        self.start(2)
        arrays = [np.full(nbytes // 8, float(i)) for i in range(count)]
        times: list[float] = []
        releases: list[float] = []
        wrong: list[str] = []
        kinds: set[str] = set()
        ex, hand = self.ex, self.hand
        for _ in range(reps):
            gc.collect()
            with no_gc():
                t0 = clock()
                if hand is None:
                    outs = list(ex.map(add_one, arrays))
                else:
                    # (map submits as it consumes the generator: the workers start on
                    # the first arrays while this process still copies the next ones)
                    rets = list(
                        ex.map(hand_add_one, (hand.put(a) for a in arrays), itertools.repeat(hand.prefix))
                    )
                    outs = [hand.take(r) for r in rets]
                ends = [(o[0], o[-1]) for o in outs]
                t1 = clock()
            times.append(t1 - t0)
            kinds.update(type(o).__module__ + "." + type(o).__name__ for o in outs)
            for i, (first, last) in enumerate(ends):
                if first != i + 1 or last != i + 1 or outs[i].nbytes != nbytes:
                    wrong.append(
                        f"result {i}: [0]={first!r}, [-1]={last!r}, "
                        f"{outs[i].nbytes} bytes; expected {i + 1}.0, {nbytes} bytes"
                    )
                    break
            del outs, ends
            releases.append(self.release())
        del arrays
        self.stop()
        return {
            "times": times,
            "release_s": releases,
            "wrong": wrong,
            "result_types": sorted(kinds),
            "arrays": count,
            "array_bytes": nbytes,
        }

    def case_small(self, reps: int) -> dict[str, Any]:
        """The small-task rows: three workloads of tasks that carry no array, on
        two workers, ``reps`` times each (interleaved), every result checked."""
        n_submit, n_map, n_dicts = (self.p["small_submit"], self.p["small_map"], self.p["small_dicts"])
        self.start(2)
        ex = self.ex
        times: dict[str, list[float]] = {"small_submit": [], "small_map": [], "small_dicts": []}
        wrong: list[str] = []

        def submit_ints() -> bool:
            futures = [ex.submit(inc, i) for i in range(n_submit)]
            return sum(f.result() for f in futures) == n_submit * (n_submit + 1) // 2

        def map_chunks() -> bool:
            return sum(ex.map(inc, range(n_map), chunksize=100)) == n_map * (n_map + 1) // 2

        def map_dicts() -> bool:
            out = list(ex.map(small_dict, range(n_dicts)))
            return len(out) == n_dicts and out[-1]["square"] == (n_dicts - 1) ** 2

        cases = (("small_submit", submit_ints), ("small_map", map_chunks), ("small_dicts", map_dicts))
        for _ in range(reps):
            for kind, fn in cases:
                gc.collect()
                with no_gc():
                    t0 = clock()
                    ok = fn()
                    t1 = clock()
                times[kind].append(t1 - t0)
                if not ok:
                    wrong.append(f"{kind}: a wrong result")
        self.stop()
        return {"times": times, "wrong": wrong}


def driver_main(contender: str, params: dict[str, Any], conn: Any) -> None:
    """A spawned driver: measure the cases in ``params['cases']`` for one contender, then exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_term)
    d: Optional[Driver] = None
    try:
        try:
            if np is None:
                raise ImportError("numpy is not installed")
            d = Driver(contender, params, conn)
        except ImportError as exc:
            conn.send(("unavailable", f"{type(exc).__name__}: {exc}"))
            return
        conn.send(
            (
                "ready",
                {
                    "pid": os.getpid(),
                    "version": d.version,
                    "start_method": params["start_method"],
                    "future_class": _future_class(),
                },
            )
        )
        out: dict[str, Any] = {}
        if params.get("submit_reps") or params.get("stamped_reps"):
            out["submit"] = d.case_submit(params["submit_reps"], params.get("stamped_reps", 0))
        if params.get("map_reps"):
            out["map"] = d.case_map(params["map_reps"])
        if params.get("small_reps"):
            out["small"] = d.case_small(params["small_reps"])
        conn.send(("result", out))
    except BaseException as exc:
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=12)))
        except Exception:
            pass
        if not isinstance(exc, Exception):
            raise
    finally:
        if d is not None:
            try:
                d.release()
            finally:
                d.stop()
        conn.close()


def _future_class() -> str:
    import concurrent.futures._base as base

    cls = base.Future
    return f"{cls.__module__}.{cls.__qualname__}"
