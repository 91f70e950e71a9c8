"""Workload 11 (``pool``): the code that runs in the spawned drivers and in the pool workers.

One driver per contender and round (:func:`driver_main`) makes the contender's
executor, measures, and sends the timings back through a pipe; a fresh process
keeps npshmex's patch of ``concurrent.futures._base.Future`` from the others.
The hand-written contender (:class:`Hand`) manages ``SharedMemory`` itself and
leaves no segment to the resource tracker: ``track=False`` on Python >= 3.13;
before, every process unregisters a segment right after creating or attaching it
(the tracker keeps a set per name, not a count, so a registration left by an
attach would be dropped by another process's unregister).  Its names start with
a prefix the harness gives, so that it can remove whatever a crash leaves.
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
from typing import Any, Optional

from .util import no_gc

try:
    import numpy as np
except ImportError:  # pragma: no cover - the harness checks before it spawns a driver
    np = None  # type: ignore[assignment]

clock = time.perf_counter  # CLOCK_MONOTONIC on Linux: shared by every process of the machine
SMALL_KINDS = ("small_submit", "small_map", "small_dicts")


# -- task functions (run in the pool workers) ---------------------------------------------------


def add_one(x: Any) -> Any:
    return x + 1


def add_one_stamped(x: Any) -> dict[str, Any]:
    """``x + 1`` and the worker's clock around it (a dict: npshmex moves only arrays and
    dicts of arrays through shared memory)."""
    t0 = clock()
    out = x + 1
    return {"out": out, "t_start": t0, "t_end": clock()}


def tiny(x: Any) -> Any:
    """The warm-up: long enough that every worker of the pool gets one."""
    time.sleep(0.05)
    return x


def inc(x: int) -> int:
    return x + 1


def small_dict(i: int) -> dict[str, Any]:
    return {"i": i, "square": i * i, "name": f"item-{i}", "even": i % 2 == 0}


# -- the hand-written SharedMemory contender ----------------------------------------------------

_TRACK_PARAM = sys.version_info >= (3, 13)
_seq = itertools.count()


def shm_open(name: str, size: int = 0) -> shared_memory.SharedMemory:
    """Create (``size`` > 0) or attach a segment that no resource tracker will unlink or warn about."""
    kw = {"track": False} if _TRACK_PARAM else {}
    seg = shared_memory.SharedMemory(name, create=size > 0, size=size, **kw)
    if not _TRACK_PARAM:  # < 3.13 registers an attach too
        resource_tracker.unregister(seg._name, "shared_memory")  # type: ignore[attr-defined]
    return seg


def shm_unlink_name(name: str) -> bool:
    """Remove a segment by name (what ``SharedMemory.unlink`` calls, without a tracker
    message: the segment is not registered); False if it was not there."""
    import _posixshmem  # type: ignore[import-not-found, unused-ignore]

    try:
        _posixshmem.shm_unlink("/" + name.lstrip("/"))
        return True
    except FileNotFoundError:
        return False


def hand_add_one(
    spec: tuple[str, tuple[int, ...], str], prefix: str, stamped: bool = False
) -> tuple[Any, ...]:
    """In a worker: attach the input, compute ``x + 1`` into a new output segment, return its name."""
    name, shape, dtype = spec
    seg_in = shm_open(name)
    try:
        x = np.ndarray(shape, np.dtype(dtype), buffer=seg_in.buf)
        t0 = clock()
        out_name = f"{prefix}o{os.getpid():x}_{next(_seq)}"
        seg_out = shm_open(out_name, max(1, x.nbytes))
        try:
            np.add(x, 1, out=np.ndarray(shape, x.dtype, buffer=seg_out.buf))
        except BaseException:
            seg_out.close()
            shm_unlink_name(out_name)
            raise
        seg_out.close()
        t1 = clock()
        del x
    finally:
        seg_in.close()
    return (out_name, shape, dtype, t0, t1) if stamped else (out_name, shape, dtype)


class Hand:
    """The caller's side: every segment it made or took, released in :meth:`release_all`."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.segs: list[shared_memory.SharedMemory] = []

    def put(self, arr: Any) -> tuple[str, tuple[int, ...], str]:
        name = f"{self.prefix}i{next(_seq)}"
        seg = shm_open(name, max(1, arr.nbytes))
        self.segs.append(seg)
        np.ndarray(arr.shape, arr.dtype, buffer=seg.buf)[...] = arr
        return (name, arr.shape, arr.dtype.str)

    def take(self, ret: tuple[Any, ...]) -> Any:
        name, shape, dtype = ret[:3]
        self.segs.append(shm_open(name))
        return np.ndarray(shape, np.dtype(dtype), buffer=self.segs[-1].buf)

    def release_all(self) -> None:
        """Close and unlink every segment (the arrays over them must be gone)."""
        segs, self.segs = self.segs, []
        for seg in segs:
            try:
                seg.close()
            except BufferError:
                pass  # an array still views it; the unlink is what matters
            shm_unlink_name(seg.name)


# -- the driver ----------------------------------------------------------------------------------


def version_of(contender: str) -> str:
    import platform
    from importlib.metadata import version

    if contender in ("stdlib", "handwritten"):
        return "stdlib " + platform.python_version()
    try:
        return version(contender)
    except Exception:
        return "-"


def _executor_class(contender: str) -> Any:
    """The contender's executor class (ImportError if it is missing)."""
    if contender in ("stdlib", "handwritten"):
        from concurrent.futures import ProcessPoolExecutor
    elif contender == "npshmex":
        from npshmex import ProcessPoolExecutor  # replaces concurrent.futures._base.Future here
    elif contender == "ultradict_ng":
        from ultradict_ng.futures import ProcessPoolExecutor
    else:
        raise ValueError(f"unknown pool contender {contender!r}")
    return ProcessPoolExecutor


def proc_start(pid: int) -> Optional[str]:
    """The start time of ``pid`` (field 22 of /proc/<pid>/stat: tells a reused pid apart);
    None for a zombie or when unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else fields[19]
    except (OSError, IndexError):
        return None


def _type(x: Any) -> str:
    return type(x).__module__ + "." + type(x).__name__


class Driver:
    """One contender's executors and measurements inside the driver process."""

    def __init__(self, contender: str, params: dict[str, Any], conn: Any) -> None:
        self.contender, self.p, self.conn = contender, params, conn
        self.cls = _executor_class(contender)
        self.hand = Hand(params["hand_prefix"]) if contender == "handwritten" else None
        self.ex: Any = None

    def start(self, workers: int) -> None:
        import multiprocessing as mp

        self.ex = self.cls(max_workers=workers, mp_context=mp.get_context(self.p["start_method"]))
        for f in [self.ex.submit(tiny, np.ones(4)) for _ in range(workers)]:
            f.result(timeout=120)
        pids = sorted(getattr(self.ex, "_processes", {}) or {})
        info: dict[str, Any] = {"pids": [(pid, proc_start(pid)) for pid in pids]}
        pool = getattr(self.ex, "_pool", None)  # ultradict_ng's parcel bookkeeping
        if self.contender == "ultradict_ng" and pool is not None:
            from ultradict_ng.futures.parcel import pool_prefix

            info["parcel_prefix"] = pool_prefix(pool.token)
        self.conn.send(("pool", info))

    def stop(self) -> None:
        ex, self.ex = self.ex, None
        if ex is not None:
            ex.shutdown(wait=True, cancel_futures=True)

    def roundtrip(self, x: Any, stamped: bool) -> tuple[float, tuple[Any, Any, str], dict[str, float]]:
        """``submit(add_one, x).result()``, the result's first and last element read."""
        ex, hand = self.ex, self.hand
        t0 = clock()
        if hand is None:
            r = ex.submit(add_one_stamped if stamped else add_one, x).result()
            t_done = clock()
            out, work = (r["out"], (r["t_start"], r["t_end"])) if stamped else (r, ())
        else:
            spec = hand.put(x)
            t_put = clock()
            ret = ex.submit(hand_add_one, spec, hand.prefix, stamped).result()
            t_done = clock()
            out, work = hand.take(ret), ret[3:]
        first, last = out[0], out[-1]  # (npshmex's Future has already un-shm'd the dict's arrays)
        t1 = clock()
        stages: dict[str, float] = {}
        if stamped:
            stages = {"to_worker": work[0] - t0, "compute": work[1] - work[0]}
            stages["back"] = (t_done if hand is None else t1) - work[1]
            if hand is not None:
                stages.update(put=t_put - t0, take=t1 - t_done)
        return t1 - t0, (first, last, _type(out)), stages

    def release(self) -> float:
        t0 = clock()
        if self.hand is not None:
            self.hand.release_all()
        gc.collect()
        return clock() - t0

    def case_submit(self, reps: int, stamped_reps: int) -> dict[str, Any]:
        self.start(1)
        x = np.ones(self.p["submit_elements"])
        res: dict[str, Any] = {"times": [], "release_s": [], "stages": [], "wrong": []}
        kinds: set[str] = set()
        for i in range(reps + stamped_reps):
            gc.collect()
            with no_gc():
                dt, (first, last, kind), st = self.roundtrip(x, i >= reps)
            kinds.add(kind)
            if first != 2.0 or last != 2.0:
                res["wrong"].append(f"result[0]={first!r}, result[-1]={last!r}, expected 2.0 ({kind})")
            res["release_s"].append(self.release())
            if i >= reps:
                res["stages"].append(dict(st, total=dt))
            else:
                res["times"].append(dt)
        del x
        self.stop()
        return dict(res, result_types=sorted(kinds), elements=self.p["submit_elements"])

    def case_map(self, reps: int) -> dict[str, Any]:
        count, nbytes = self.p["map_arrays"], self.p["map_bytes"]
        self.start(2)
        arrays = [np.full(nbytes // 8, float(i)) for i in range(count)]
        res: dict[str, Any] = {"times": [], "release_s": [], "wrong": []}
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
                    rets = list(ex.map(hand_add_one, map(hand.put, arrays), itertools.repeat(hand.prefix)))
                    outs = [hand.take(r) for r in rets]
                ends = [(o[0], o[-1]) for o in outs]
                t1 = clock()
            res["times"].append(t1 - t0)
            kinds.update(map(_type, outs))
            for i, (first, last) in enumerate(ends):
                if first != i + 1 or last != i + 1 or outs[i].nbytes != nbytes:
                    res["wrong"].append(
                        f"result {i}: [0]={first!r}, [-1]={last!r}, "
                        f"{outs[i].nbytes} bytes; expected {i + 1}.0, {nbytes} bytes"
                    )
                    break
            del outs, ends
            res["release_s"].append(self.release())
        del arrays
        self.stop()
        return dict(res, result_types=sorted(kinds), arrays=count, array_bytes=nbytes)

    def case_small(self, reps: int) -> dict[str, Any]:
        """Three rows of tasks that carry no array, on two workers, ``reps`` times each
        (interleaved), every result checked."""
        n_submit, n_map, n_dicts = (self.p[k] for k in SMALL_KINDS)
        self.start(2)
        ex = self.ex

        def small_submit() -> bool:
            futures = [ex.submit(inc, i) for i in range(n_submit)]
            return sum(f.result() for f in futures) == n_submit * (n_submit + 1) // 2

        def small_map() -> bool:
            return sum(ex.map(inc, range(n_map), chunksize=100)) == n_map * (n_map + 1) // 2

        def small_dicts() -> bool:
            out = list(ex.map(small_dict, range(n_dicts)))
            return len(out) == n_dicts and out[-1]["square"] == (n_dicts - 1) ** 2

        res: dict[str, Any] = {k: {"times": [], "wrong": []} for k in SMALL_KINDS}
        for _ in range(reps):
            for fn in (small_submit, small_map, small_dicts):
                gc.collect()
                with no_gc():
                    t0 = clock()
                    ok = fn()
                    t1 = clock()
                res[fn.__name__]["times"].append(t1 - t0)
                if not ok:
                    res[fn.__name__]["wrong"].append("a wrong sum, count or last result")
        self.stop()
        return res


def driver_main(contender: str, params: dict[str, Any], conn: Any) -> None:
    """A spawned driver: measure what ``params`` asks for one contender, then exit.

    It ignores SIGINT (the harness ends it by its pid) and turns SIGTERM into
    ``SystemExit`` so that its executor is shut down and its segments released.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    d: Optional[Driver] = None
    try:
        try:
            if np is None:
                raise ImportError("numpy is not installed")
            d = Driver(contender, params, conn)
        except ImportError as exc:
            conn.send(("unavailable", f"{type(exc).__name__}: {exc}"))
            return
        import concurrent.futures._base as base

        future = f"{base.Future.__module__}.{base.Future.__qualname__}"
        info = {"version": version_of(contender), "start_method": params["start_method"]}
        conn.send(("ready", dict(info, pid=os.getpid(), future_class=future)))
        out: dict[str, Any] = {}
        if params["submit_reps"] or params["stamped_reps"]:
            out["submit"] = d.case_submit(params["submit_reps"], params["stamped_reps"])
        if params["map_reps"]:
            out["map"] = d.case_map(params["map_reps"])
        if params["small_reps"]:
            out.update(d.case_small(params["small_reps"]))
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
