"""Workload 9 (``big``): one large value from a writer process to a fresh reader process.

A numpy array, ``bytes``, and bytes read as a zero-copy memoryview (``view``) of 1 MiB to 1 GiB
(``--quick``: 1 and 10 MiB, once), for the adapters with ``runs('big')``: write, 1st read in a fresh
reader (attach included, until the first and last element are read), 2nd read, the reader's RSS added
(a copy adds the whole value, a zero-copy read a few pages).  A kind an API refuses is *unavailable*.
1 GiB runs only where the value was copied at most about twice at 100 MiB (:data:`COPIES_LIMIT`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import signal
import sys
import time
import traceback
from typing import Any, Optional

from . import adapters as A
from .registry import Workload, register
from .report import bars
from .run import Run, WorkerError, compact_error
from .util import log, no_gc, summarize, watchdog

pc = time.perf_counter
MiB = 1 << 20
GiB = 1 << 30
KEY = "v"
#: More than two copies (half a copy of slack for allocator noise): no 1 GiB.
COPIES_LIMIT = 2.5
KIND_TITLES = {"numpy": "numpy array (float64)", "bytes": "bytes", "view": "bytes as a zero-copy memoryview"}
#: metric -> the reader's field (seconds, but MiB for RSS added)
METRICS = {"write": "write_s", "1st read": "first_s", "2nd read": "second_s", "RSS added": "rss_added_mib"}
#: Exceptions that mean "this API does not take / give this kind of value".
UNAVAILABLE_ERRORS = (TypeError, AttributeError, NotImplementedError, A.Unavailable)


def size_label(n: int) -> str:
    return f"{n // GiB} GiB" if n >= GiB else f"{n // MiB} MiB"


def mem_status() -> dict[str, int]:
    """This process's VmRSS, VmHWM (peak) and the RSS parts, in bytes (empty off Linux)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[k] = int(v.split()[0]) * 1024
    return out


def _baseline() -> tuple[bool, dict[str, int]]:
    """Collect, reset VmHWM to the current RSS (Linux >= 4.0: ``5 > /proc/self/clear_refs``): whether
    it was reset, and :func:`mem_status`."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False, mem_status()
    return True, mem_status()


def _mib(after: dict[str, int], before: dict[str, int], field: str) -> Optional[float]:
    return (after[field] - before[field]) / MiB if field in after and field in before else None


def make_value(kind: str, size: int) -> tuple[Any, dict[str, Any]]:
    """The value of ``kind`` and ``size`` bytes, and what the reader checks."""
    if kind == "numpy":
        import numpy as np

        n = size // 8
        return np.arange(n, dtype=np.float64), {"nbytes": n * 8, "first": 0.0, "last": float(n - 1)}
    b = bytes(range(256)) * (size // 256)
    return b, {"nbytes": len(b), "first": b[0], "last": b[-1]}


def _touch(v: Any) -> tuple[Any, Any]:
    """Read the first and the last element (nothing else)."""
    if hasattr(v, "flat"):
        return v.flat[0], v.flat[-1]
    v = v.cast("B") if isinstance(v, memoryview) and (v.ndim != 1 or v.format != "B") else v
    return v[0], v[-1]


def _check(v: Any, spec: dict[str, Any], first: Any, last: Any) -> Optional[str]:
    """None when the value is what was written, else what is wrong."""
    kind, nbytes = spec["kind"], v.nbytes if hasattr(v, "nbytes") else len(v)
    want = {"bytes": bytes, "view": memoryview}.get(kind) or sys.modules["numpy"].ndarray
    if isinstance(v, want) and (nbytes, first, last) == (spec["nbytes"], spec["first"], spec["last"]):
        return None
    return (
        f"got {type(v).__module__}.{type(v).__name__} of {nbytes} bytes, first {first!r}, last {last!r}; "
        f"expected {kind} of {spec['nbytes']} bytes, first {spec['first']!r}, last {spec['last']!r}"
    )


def big_reader(key: str, ctl: Any, channel: Any, preload: list[str]) -> None:
    """A spawned reader: baseline, first access, second access, report; then exit."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        A.preload(preload)
        A.untrack_shared_memory()  # attaches only; shares the harness's resource tracker
        cls = A.ADAPTERS[key]
        if cls.module == "ipc_py_objects":
            A._import_ippo()
        elif cls.module:
            A.preload([cls.module])
        with contextlib.suppress(ImportError):
            import numpy  # noqa: F401  (imported before the baseline, like the peer)
        ctl.send(("ready", {"pid": os.getpid()}))
        go, spec = ctl.recv()
        if go != "go":
            return
        peak_reset, before = _baseline()
        t0 = pc()
        h = cls.big_open(spec, channel)
        t1 = pc()
        v = cls.big_get(h, spec, True)
        f1, l1 = _touch(v)
        t2 = pc()
        after1 = mem_status()
        wrong1 = _check(v, spec, f1, l1)
        if cls.streaming:
            ctl.send(("again", None))  # the writer sends the value once more
        t3 = pc()
        v2 = cls.big_get(h, spec, False)
        f2, l2 = _touch(v2)
        t4 = pc()
        after2 = mem_status()
        wrong2 = _check(v2, spec, f2, l2)
        readonly = v.readonly if isinstance(v, memoryview) else None
        if hasattr(v, "flags"):  # (no local for v.flags: it holds the array)
            readonly = not v.flags.writeable
        value_type = f"{type(v).__module__}.{type(v).__name__}"
        del v, v2
        cls.big_close(h)
        shared = sum(_mib(after1, before, f) or 0 for f in ("RssShmem", "RssFile"))
        peak = peak_reset and "VmHWM" in after1 and "VmRSS" in before
        private = max(0.0, (after1["VmHWM"] - before["VmRSS"]) / MiB - shared) if peak else None
        res = {"pid": os.getpid(), "attach_s": t1 - t0, "first_s": t2 - t0, "second_s": t4 - t3}
        res.update(rss_before=before, rss_after_first=after1, rss_after_second=after2)
        for field, part in (("", "VmRSS"), ("_anon", "RssAnon"), ("_shmem", "RssShmem")):
            res[f"rss{field}_added_mib"] = _mib(after1, before, part)
        res["rss_added_second_mib"] = _mib(after2, after1, "VmRSS")
        res["reader_peak_added_mib"] = _mib(after1, before, "VmHWM") if peak_reset else None
        res.update(reader_private_peak_mib=private, value_type=value_type, readonly=readonly)
        res["wrong"] = wrong1 or wrong2
        ctl.send(("result", res))
    except BaseException as exc:
        err = {"text": f"{type(exc).__name__}: {exc}"[:600], "traceback": traceback.format_exc(limit=8)}
        with contextlib.suppress(Exception):
            ctl.send(("error", dict(err, unavailable=isinstance(exc, UNAVAILABLE_ERRORS))))


class CellUnavailable(Exception):
    """The contender's API does not take or give this kind of value."""


class ReaderError(Exception):
    """The reader process raised (text) or died."""


def _expect(ctl: Any, p: Any, kind: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not ctl.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
        if not p.is_alive() and not ctl.poll(0):
            raise ReaderError(f"the reader process died (exit code {p.exitcode}) before sending {kind!r}")
        if time.monotonic() > deadline:
            raise ReaderError(f"no {kind!r} from the reader process within {timeout:.0f} s")
    try:
        got, payload = ctl.recv()
    except EOFError:
        raise ReaderError(f"the reader ended (exit code {p.exitcode}) before {kind!r}") from None
    if got == kind:
        return payload
    if got == "error" and payload.get("unavailable"):
        raise CellUnavailable(payload["text"])
    if got == "error":
        raise ReaderError(f"in the reader process: {payload['traceback'].strip()}")
    raise ReaderError(f"the reader sent {got!r}, expected {kind!r}")


def _write(a: A.Adapter, state: Any, value: Any, limit: float, what: str) -> float:
    try:
        with watchdog(limit, what), no_gc():
            t0 = pc()
            a.big_write(state, KEY, value)
            return pc() - t0
    except UNAVAILABLE_ERRORS as exc:
        raise CellUnavailable(f"{type(exc).__name__}: {exc}") from None


def _cell(run: Run, a: A.Adapter, kind: str, size: int, value: Any, expect: dict[str, Any]) -> dict[str, Any]:
    """One measurement: setup, write, a fresh reader's two accesses, teardown."""
    label = f"{a.label} big {kind} {size_label(size)}"
    limit = 120.0 + 300.0 * size / GiB
    state = p = ctl = None
    ok = False
    try:
        peak_reset, m0 = _baseline()
        with watchdog(limit, label + " setup"):
            state = a.big_prepare(size, kind)
        m1: dict[str, int] = {}
        if not a.streaming:
            write_s = _write(a, state, value, limit, label + " write")
            m1 = mem_status()
        spec = dict(a.big_spec(state), kind=kind, key=KEY, **expect)
        ctl, child_end = run.ctx.Pipe()
        args = (a.key, child_end, a.big_channel(state), run.preload_modules if a.uses_mp_shm else [])
        proc = run.ctx.Process(target=big_reader, name="perf-big-reader", args=args, daemon=True)
        try:
            proc.start()
        finally:
            child_end.close()
        p = proc
        run.children.append(p)
        _expect(ctl, p, "ready", 120)
        ctl.send(("go", spec))
        if a.streaming:  # the reader is receiving while the writer writes
            write_s = _write(a, state, value, limit, label + " write")
            _expect(ctl, p, "again", limit)
            m1 = mem_status()  # after delivery: a Queue's feeder thread pickles after put()
            with watchdog(limit, label + " second send"):
                a.big_write(state, KEY, value)
        res = _expect(ctl, p, "result", limit)
        ok = True
    finally:
        if p is not None:
            if not ok and p.is_alive():
                p.terminate()
            run.reap(p, 30 if ok else 5)
            run.children.remove(p)
        if ctl is not None:
            ctl.close()
        if state is not None:
            try:
                with watchdog(120, label + " cleanup"):
                    a.big_destroy(state, ok)
            except Exception as exc:
                what = f"big {kind} {size_label(size)}"
                run.alert(f"{a.label}: cleanup after {what} failed: {exc!r} (retried at the end)")
    peak = peak_reset and "VmHWM" in m1 and "VmRSS" in m0
    writer = max(0, m1["VmHWM"] - m0["VmRSS"]) / MiB if peak else None
    res.update(write_s=write_s, writer_peak_added_mib=writer, bytes=size)
    res["writer_rss_added_mib"] = _mib(m1, m0, "VmRSS")
    reader = res.get("reader_private_peak_mib")
    res["copies"] = None if writer is None or reader is None else (writer + reader) / (size / MiB)
    return res


def _record(run: Run, a: A.Adapter, kind: str, size: int, raw: Any = (), **kw: Any) -> Optional[float]:
    """The four records of a cell: measured (``raw``; returns the copies), or ``skipped`` / ``error``."""
    params: dict[str, Any] = {"kind": kind, "value_bytes": size}
    show: dict[str, str] = {}
    copies = summarize([r["copies"] for r in raw if r["copies"] is not None])["median"]
    if raw:
        wrong = [r["wrong"] for r in raw if r.get("wrong")]
        if wrong:
            run.alert(f"{a.label}: big {kind} {size_label(size)}: the reader got a wrong value: {wrong[0]}")
            show["value"] = "WRONG"
        if copies is not None:
            show = {"copies": f"{copies:.1f}", **show}
        kw["ok"] = not wrong
        attach = summarize([r["attach_s"] for r in raw])["median"]
        types = sorted({r["value_type"] for r in raw})
        params.update(repetitions=len(raw), copies_median=copies, value_types=types, attach_s_median=attach)
    kw.update(better="lower", show=show)
    for metric, f in METRICS.items():
        kw.update(
            unit="MiB" if metric == "RSS added" else "s", values=[r[f] for r in raw if r.get(f) is not None]
        )
        kw.update(raw=list(raw) if metric == "1st read" else [], params={**params, "metric": metric})
        rec = run.record("big", f"{kind}, {size_label(size)}: {metric}", a.key, **kw)
        if kw.get("error"):
            rec["error_short"] = compact_error(kw["error"])
    return copies


def w_big(run: Run, adapters: list[A.Adapter]) -> None:
    numpy_missing = None if importlib.util.find_spec("numpy") else "numpy is not installed"
    unavailable: dict[tuple[str, str], str] = {}
    copies_at: dict[tuple[str, str], Optional[float]] = {}  # at 100 MiB: whether 1 GiB runs
    for size in [MiB, 10 * MiB] if run.quick else [MiB, 10 * MiB, 100 * MiB, GiB]:
        for kind in KIND_TITLES:
            raws: dict[str, list[dict[str, Any]]] = {a.key: [] for a in adapters}
            failed: set[str] = set()
            todo: list[A.Adapter] = []
            for a in adapters:
                why = unavailable.get((a.key, kind)) or a.big_unsupported(kind)
                why = why or (numpy_missing if kind == "numpy" else None)
                if why:
                    unavailable[(a.key, kind)] = why
                    _record(run, a, kind, size, skipped="unavailable: " + why)
                elif size >= GiB and (a.key, kind) not in copies_at:
                    _record(run, a, kind, size, skipped="not run at 1 GiB: not measured at 100 MiB")
                elif size >= GiB and (copies_at[(a.key, kind)] or 0) > COPIES_LIMIT:
                    c = copies_at[(a.key, kind)]
                    why = f"~{c:.1f} copies of the value at 100 MiB (more than 2; see the note)"
                    _record(run, a, kind, size, skipped="not run at 1 GiB: " + why)
                else:
                    todo.append(a)
            if not todo:
                continue
            value, expect = make_value(kind, size)
            try:
                for rep in range(1 if run.quick else min(run.repeat, 2 if size >= GiB else 3)):
                    for a in todo:
                        if a.key in failed or (a.key, kind) in unavailable:
                            continue
                        log(f"  big {kind} {size_label(size)}: {a.label} (rep {rep + 1})")
                        try:
                            raws[a.key].append(_cell(run, a, kind, size, value, expect))
                        except CellUnavailable as exc:
                            unavailable[(a.key, kind)] = str(exc)
                            _record(run, a, kind, size, skipped=f"unavailable: {exc}")
                        except Exception as exc:
                            failed.add(a.key)
                            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                            text = str(exc) if isinstance(exc, (ReaderError, WorkerError)) else text
                            where = f"({kind}, {size_label(size)})"
                            run.alert(f"{a.label} failed in workload big {where}: {compact_error(text)}")
                            _record(run, a, kind, size, error=text)
            finally:
                del value
                gc.collect()
            for a in todo:
                if a.key not in failed and (a.key, kind) not in unavailable and raws[a.key]:
                    copies = _record(run, a, kind, size, raws[a.key])
                    if size == 100 * MiB:
                        copies_at[(a.key, kind)] = copies
    _notes(run, {a.key for a in adapters}, numpy_missing)


_NOTES = {  # the contenders a note is about ("": the first note, "*": every run): the note
    "": "1st read = from the reader's first access (attaching included) to the value usable (array: first "
    "and last element read; bytes: the bytes object; view: a memoryview, first and last byte read); 2nd "
    "read = the same access again in that process; RSS added = the reader's VmRSS after the 1st read minus "
    "before attaching (shared pages it touched count too)",
    "*": "copies = (writer's peak RSS added by setup + write, shared-memory pages it wrote included, + "
    "reader's private peak RSS added by the 1st read) / value size, at that size; 1 GiB runs only where it "
    f"was <= {COPIES_LIMIT:g} at 100 MiB",
    "ultradict_ng": "ultradict_ng: d[k] = value; the reader d[k] (kinds numpy, bytes) and d.view(k) (kind "
    "view), nothing else: whatever its public API refuses is reported as unavailable with the exception",
    "ultradict_shared ultradict": "UltraDict(shared_lock=True): default pickle serializer and buffer_size "
    "(10 kB); full_dump_size = value + 1/16 + 1 MiB, so each write is a full dump (a pickle of the whole "
    "dict) into that static segment and attaching loads it; UltraDict() differs only in its lock and is not "
    "repeated here",
    "pickle5": "pickle5 out-of-band: pickle.dumps(protocol=5, buffer_callback) with the stream and the "
    "buffers in one new segment; the reader unpickles with buffers= views of it (bytes are pickled as "
    "PickleBuffer and come back as a memoryview: kind bytes copies it with bytes())",
    "shm": "SharedMemory (raw): write = SharedMemory(create=True, size) + one copy; the reader attaches by "
    "name (unregistered from the resource tracker) and views the buffer (np.ndarray(buffer=shm.buf); "
    "bytes(...) for kind bytes)",
    "pipe queue": "Pipe / Queue: the reader is already receiving when the writer starts; Pipe.send blocks "
    "until the reader has taken the data (a pipe holds 64 KiB), so its write includes the transfer; "
    "Queue.put returns at once (a feeder thread pickles and sends), so its write is only the enqueue; 1st "
    "read = from the reader's recv/get call to the value; 2nd read = a second send/put of the value; bytes "
    "go through send_bytes/recv_bytes on the Pipe; no view kind",
    "sharedarray": "SharedArray: write = sa.create('shm://name', shape, dtype) + one copy; each read = "
    "sa.attach (bytes stored as a uint8 array; tobytes() for kind bytes)",
    "ippo": "InterProcessPyObjects: its block (value + 1/8 + 1 MiB) is created and zeroed in the untimed "
    "setup (counted in copies); write = put_message_2 inside wait_my_turn; 1st read = init_consumer + "
    "take_message; 2nd read = get_obj at the message's offset; view = get_obj_buffer",
}


def _notes(run: Run, keys: set[str], numpy_missing: Optional[str]) -> None:
    reps = (
        "1 repetition" if run.quick else f"{min(run.repeat, 3)} repetitions ({min(run.repeat, 2)} at 1 GiB)"
    )
    run.note(f"{reps} per cell, each with a fresh spawned reader; {_NOTES['']}", "big")
    for which, text in _NOTES.items():
        if keys & set(which.split()) or which == "*":
            run.note(text, "big")
    if numpy_missing:
        run.note(f"numpy kind not measured: {numpy_missing}", "big")
    left_out = [A.ADAPTERS[k].label for k in A.ORDER if k in run.adapters and not run.adapters[k].runs("big")]
    if left_out:
        why = "(dicts of small values: see workload 8 for their large-value cost)"
        run.note(f"not in this workload: {', '.join(left_out)} {why}", "big")


def _panel(ax: Any, recs: list[dict[str, Any]]) -> str:
    bars(ax, [r for r in recs if r["params"]["metric"] == "1st read" and r["params"]["kind"] != "view"])
    return "large values: 1st read in a fresh process (numpy, bytes)"


register(
    Workload(
        name="big",
        number=9,
        title="large values to another process: write, 1st/2nd read, reader RSS",
        run=w_big,
        aliases=("large", "large-values", "numpy"),
        adapters=True,
        own=(),
        keys=lambda r: (
            f"{KIND_TITLES[r['params']['kind']]}, {size_label(r['params']['value_bytes'])}",
            r["params"]["metric"],
        ),
        panel=_panel,
    )
)
