"""Workload 9 (``big``): one large value from a writer process to a reader process.

For a numpy array (float64) and for ``bytes``, at 1 MiB, 10 MiB, 100 MiB and
1 GiB (``--quick``: 1 MiB and 10 MiB, one repetition), every contender that
takes part (``Adapter.runs('big')``) is measured in four ways:

* **write**: the writer (this process) puts the value in: ``d[k] = value``,
  ``SharedMemory(create=True)`` + a copy, ``pickle.dumps(..., protocol=5)`` + a
  copy, ``conn.send(value)``, ``q.put(value)`` ... (``Adapter.big_write``).
* **1st read**: in a fresh spawned reader process, from the start of its
  first access (attaching included) to the value usable: an array whose first
  and last element were read, a ``bytes`` object, or for kind ``view`` a
  memoryview whose first and last byte were read.
* **2nd read**: the same access again in that process (the attach is not
  repeated; for Pipe and Queue the writer sends the value a second time).
* **RSS added**: the reader's ``VmRSS`` (``/proc/self/status``) after the first
  read minus before attaching.  Only the first and last element are touched,
  so a zero-copy read adds a few pages and a copy adds the whole value.

Kinds: ``numpy`` (``d[k]`` returns an array), ``bytes`` (``d[k]`` returns bytes)
and ``view`` (a bytes value read as a read-only memoryview without copying:
``d.view(k)`` for the dicts).  A contender whose public API refuses a kind
(``UnsupportedType``, a missing method: ``TypeError``, ``AttributeError``,
``NotImplementedError``) gets its cells marked *unavailable* with the reason, at
every size, and is not tried again.

1 GiB is run only for contenders that copy the value at most about twice:
at 100 MiB the harness estimates the copies as (the writer's peak RSS added by
setup + write, shared-memory pages it wrote included, + the reader's private
peak RSS added by the first read) / value size, and skips 1 GiB above
:data:`COPIES_LIMIT` (which also keeps every 1 GiB cell far below 8 GiB).

A fresh reader process per measurement keeps its RSS clean; it imports
everything (numpy, the peer) before its baseline.  Everything made is
registered with ``run.own`` by the adapter, and each cell destroys what it
made in a ``finally``; the reader ends with the cell.
"""

from __future__ import annotations

import gc
import os
import signal
import time
import traceback
from typing import Any, Optional

from . import adapters as A
from .run import Run, WorkerError, compact_error
from .util import log, no_gc, summarize, watchdog

pc = time.perf_counter

MiB = 1 << 20
GiB = 1 << 30
KEY = "v"
#: More than two copies (half a copy of slack for allocator noise): no 1 GiB.
COPIES_LIMIT = 2.5
KINDS: list[tuple[str, str]] = [
    ("numpy", "numpy array (float64)"),
    ("bytes", "bytes"),
    ("view", "bytes read as a zero-copy memoryview"),
]
KIND_TITLES = dict(KINDS)
METRICS: list[tuple[str, str, str]] = [  # (metric, unit, raw field)
    ("write", "s", "write_s"),
    ("1st read", "s", "first_s"),
    ("2nd read", "s", "second_s"),
    ("RSS added", "MiB", "rss_added_mib"),
]
#: Exceptions that mean "this API does not take / give this kind of value".
UNAVAILABLE_ERRORS = (TypeError, AttributeError, NotImplementedError, A.Unavailable)


def big_sizes(run: Run) -> list[int]:
    return [MiB, 10 * MiB] if run.quick else [MiB, 10 * MiB, 100 * MiB, GiB]


def big_repeat(run: Run, size: int) -> int:
    if run.quick:
        return 1
    return min(run.repeat, 2 if size >= GiB else 3)


def size_label(n: int) -> str:
    if n >= GiB and n % GiB == 0:
        return f"{n // GiB} GiB"
    if n >= MiB and n % MiB == 0:
        return f"{n // MiB} MiB"
    return f"{n} B"


def case_name(kind: str, size: int, metric: str) -> str:
    return f"{kind}, {size_label(size)}: {metric}"


# -- memory accounting ------------------------------------------------------------------------


_STATUS_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")


def mem_status() -> dict[str, int]:
    """This process's VmRSS, VmHWM (peak) and the RSS parts, in bytes (empty off Linux)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in _STATUS_FIELDS:
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: ``5 > /proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _delta(after: dict[str, int], before: dict[str, int], field: str) -> Optional[int]:
    if field in after and field in before:
        return after[field] - before[field]
    return None


def _mib(n: Optional[int]) -> Optional[float]:
    return None if n is None else n / MiB


# -- values -----------------------------------------------------------------------------------


def make_value(kind: str, size: int) -> tuple[Any, dict[str, Any]]:
    """The value of ``kind`` and ``size`` bytes, and what the reader checks."""
    if kind == "numpy":
        import numpy as np

        n = size // 8
        arr = np.arange(n, dtype=np.float64)
        return arr, {"nbytes": n * 8, "first": 0.0, "last": float(n - 1)}
    b = bytes(range(256)) * (size // 256)
    return b, {"nbytes": len(b), "first": b[0], "last": b[-1]}


def _touch(v: Any) -> tuple[Any, Any]:
    """Read the first and the last element (nothing else)."""
    if hasattr(v, "flat"):
        return v.flat[0], v.flat[-1]
    if isinstance(v, memoryview) and (v.ndim != 1 or v.format != "B"):
        v = v.cast("B")
    return v[0], v[-1]


def _check(v: Any, spec: dict[str, Any], first: Any, last: Any) -> Optional[str]:
    """None when the value is what was written, else what is wrong."""
    kind = spec["kind"]
    if kind == "numpy":
        import numpy as np

        good_type = isinstance(v, np.ndarray)
    elif kind == "bytes":
        good_type = isinstance(v, bytes)
    else:
        good_type = isinstance(v, memoryview)
    nbytes = v.nbytes if hasattr(v, "nbytes") else len(v)
    if good_type and nbytes == spec["nbytes"] and first == spec["first"] and last == spec["last"]:
        return None
    return (
        f"got {type(v).__module__}.{type(v).__name__} of {nbytes} bytes, first {first!r}, "
        f"last {last!r}; expected {kind} of {spec['nbytes']} bytes, first {spec['first']!r}, "
        f"last {spec['last']!r}"
    )


# -- the reader process -----------------------------------------------------------------------


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
        try:
            import numpy  # noqa: F401  (imported before the baseline, like the peer)
        except ImportError:
            pass
        ctl.send(("ready", {"pid": os.getpid()}))
        msg = ctl.recv()
        if msg[0] != "go":
            return
        spec = msg[1]
        gc.collect()
        peak_reset = reset_peak()
        before = mem_status()
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
        value_type = f"{type(v).__module__}.{type(v).__name__}"
        readonly = _readonly(v)
        del v, v2
        cls.big_close(h)
        private_peak = None
        hwm = _delta(after1, before, "VmHWM") if peak_reset else None
        if peak_reset and "VmHWM" in after1 and "VmRSS" in before:
            shared = (_delta(after1, before, "RssShmem") or 0) + (_delta(after1, before, "RssFile") or 0)
            private_peak = max(0, after1["VmHWM"] - before["VmRSS"] - shared)
        ctl.send(
            (
                "result",
                {
                    "pid": os.getpid(),
                    "attach_s": t1 - t0,
                    "first_s": t2 - t0,
                    "second_s": t4 - t3,
                    "rss_before": before,
                    "rss_after_first": after1,
                    "rss_after_second": after2,
                    "rss_added_mib": _mib(_delta(after1, before, "VmRSS")),
                    "rss_anon_added_mib": _mib(_delta(after1, before, "RssAnon")),
                    "rss_shmem_added_mib": _mib(_delta(after1, before, "RssShmem")),
                    "rss_added_second_mib": _mib(_delta(after2, after1, "VmRSS")),
                    "reader_peak_added_mib": _mib(hwm),
                    "reader_private_peak_mib": _mib(private_peak),
                    "value_type": value_type,
                    "readonly": readonly,
                    "wrong": wrong1 or wrong2,
                },
            )
        )
    except BaseException as exc:
        try:
            ctl.send(
                (
                    "error",
                    {
                        "type": type(exc).__name__,
                        "text": f"{type(exc).__name__}: {exc}"[:600],
                        "traceback": traceback.format_exc(limit=8),
                        "unavailable": isinstance(exc, UNAVAILABLE_ERRORS),
                    },
                )
            )
        except Exception:
            pass


def _readonly(v: Any) -> Optional[bool]:
    if isinstance(v, memoryview):
        return v.readonly
    flags = getattr(v, "flags", None)
    if flags is not None:
        return not flags.writeable
    return None


# -- the writer side --------------------------------------------------------------------------


class CellUnavailable(Exception):
    """The contender's API does not take or give this kind of value."""


class ReaderError(Exception):
    """The reader process raised (text) or died."""


def _expect(ctl: Any, p: Any, kind: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        if ctl.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
            try:
                got, payload = ctl.recv()
            except EOFError:
                raise ReaderError(
                    f"the reader process ended (exit code {p.exitcode}) before sending {kind!r}"
                ) from None
            if got == kind:
                return payload
            if got == "error":
                if payload.get("unavailable"):
                    raise CellUnavailable(payload["text"])
                raise ReaderError(f"in the reader process: {payload['traceback'].strip()}")
            raise ReaderError(f"the reader sent {got!r}, expected {kind!r}")
        if not p.is_alive() and not ctl.poll(0):
            raise ReaderError(f"the reader process died (exit code {p.exitcode}) before sending {kind!r}")
        if time.monotonic() > deadline:
            raise ReaderError(f"no {kind!r} from the reader process within {timeout:.0f} s")


def _write(a: A.Adapter, state: Any, value: Any, limit: float, what: str) -> float:
    try:
        with watchdog(limit, what):
            with no_gc():
                t0 = pc()
                a.big_write(state, KEY, value)
                t1 = pc()
    except UNAVAILABLE_ERRORS as exc:
        raise CellUnavailable(f"{type(exc).__name__}: {exc}") from None
    return t1 - t0


def _cell(run: Run, a: A.Adapter, kind: str, size: int, value: Any, expect: dict[str, Any]) -> dict[str, Any]:
    """One measurement: setup, write, a fresh reader's two accesses, teardown."""
    label = f"{a.label} big {kind} {size_label(size)}"
    limit = 120.0 + 300.0 * size / GiB
    state = p = ctl = None
    ok = False
    try:
        gc.collect()
        peak_reset = reset_peak()
        m0 = mem_status()
        with watchdog(limit, label + " setup"):
            state = a.big_prepare(size, kind)
        write_s = None
        m1: dict[str, int] = {}
        if not a.streaming:
            write_s = _write(a, state, value, limit, label + " write")
            m1 = mem_status()
        spec = dict(a.big_spec(state), kind=kind, key=KEY, **expect)
        parent_end, child_end = run.ctx.Pipe()
        ctl = parent_end
        proc = run.ctx.Process(
            target=big_reader,
            name="perf-big-reader",
            args=(a.key, child_end, a.big_channel(state), run.preload_modules if a.uses_mp_shm else []),
            daemon=True,
        )
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
                run.alert(
                    f"{a.label}: cleanup after big {kind} {size_label(size)} failed: "
                    f"{exc!r} (retried at the end)"
                )
    writer_peak = None
    if peak_reset and "VmHWM" in m1 and "VmRSS" in m0:
        writer_peak = max(0, m1["VmHWM"] - m0["VmRSS"])
    res["write_s"] = write_s
    res["writer_peak_added_mib"] = _mib(writer_peak)
    res["writer_rss_added_mib"] = _mib(_delta(m1, m0, "VmRSS"))
    if writer_peak is not None and res.get("reader_private_peak_mib") is not None:
        res["copies"] = (writer_peak / MiB + res["reader_private_peak_mib"]) / (size / MiB)
    else:
        res["copies"] = None
    res["bytes"] = size
    return res


# -- the workload -----------------------------------------------------------------------------


def w_big(run: Run, adapters: list[A.Adapter]) -> None:
    try:
        import numpy  # noqa: F401

        numpy_missing = None
    except ImportError as exc:
        numpy_missing = f"numpy is not installed ({exc})"
    sizes = big_sizes(run)
    unavailable: dict[tuple[str, str], str] = {}
    copies_at: dict[tuple[str, str, int], Optional[float]] = {}
    for size in sizes:
        for kind, _title in KINDS:
            raws: dict[str, list[dict[str, Any]]] = {a.key: [] for a in adapters}
            failed: dict[str, str] = {}
            todo: list[A.Adapter] = []
            for a in adapters:
                why = unavailable.get((a.key, kind)) or a.big_unsupported(kind)
                if why is None and kind == "numpy" and numpy_missing:
                    why = numpy_missing
                if why is not None:
                    unavailable[(a.key, kind)] = why
                    _record_skipped(run, a, kind, size, "unavailable: " + why)
                    continue
                if size >= GiB:
                    gate = _gate(copies_at, a, kind, sizes)
                    if gate is not None:
                        _record_skipped(run, a, kind, size, gate)
                        continue
                todo.append(a)
            if not todo:
                continue
            value, expect = make_value(kind, size)
            try:
                for rep in range(big_repeat(run, size)):
                    for a in todo:
                        if a.key in failed or (a.key, kind) in unavailable:
                            continue
                        log(f"  big {kind} {size_label(size)}: {a.label} (rep {rep + 1})")
                        try:
                            raws[a.key].append(_cell(run, a, kind, size, value, expect))
                        except CellUnavailable as exc:
                            unavailable[(a.key, kind)] = str(exc)
                            _record_skipped(run, a, kind, size, f"unavailable: {exc}")
                        except Exception as exc:
                            failed[a.key] = compact_error(
                                "".join(traceback.format_exception_only(type(exc), exc)).strip()
                            )
                            _record_failed(run, a, kind, size, exc)
            finally:
                del value
                gc.collect()
            for a in todo:
                if a.key in failed or (a.key, kind) in unavailable or not raws[a.key]:
                    continue
                copies = summarize([r["copies"] for r in raws[a.key] if r["copies"] is not None])["median"]
                copies_at[(a.key, kind, size)] = copies
                _record(run, a, kind, size, raws[a.key], copies)
    _notes(run, adapters, numpy_missing)


def _gate(
    copies_at: dict[tuple[str, str, int], Optional[float]], a: A.Adapter, kind: str, sizes: list[int]
) -> Optional[str]:
    """Why 1 GiB is skipped for this contender and kind (None: run it)."""
    below = [s for s in sizes if s < GiB]
    if not below:
        return None
    ref = max(below)
    if (a.key, kind, ref) not in copies_at:
        return f"not run at 1 GiB: not measured at {size_label(ref)}"
    c = copies_at[(a.key, kind, ref)]
    if c is None:
        return None  # no estimate on this system: run it
    if c > COPIES_LIMIT:
        return (
            f"not run at 1 GiB: ~{c:.1f} copies of the value at {size_label(ref)} (more than 2; see the note)"
        )
    return None


def _record(
    run: Run, a: A.Adapter, kind: str, size: int, raw: list[dict[str, Any]], copies: Optional[float]
) -> None:
    wrong = [r["wrong"] for r in raw if r.get("wrong")]
    if wrong:
        run.alert(f"{a.label}: big {kind} {size_label(size)}: the reader got a wrong value: {wrong[0]}")
    show: dict[str, str] = {}
    if copies is not None:
        show["copies"] = f"{copies:.1f}"
    if wrong:
        show["value"] = "WRONG"
    types = sorted({r["value_type"] for r in raw})
    for metric, unit, field in METRICS:
        vals = [r[field] for r in raw if r.get(field) is not None]
        run.record(
            "big",
            case_name(kind, size, metric),
            a.key,
            unit=unit,
            better="lower",
            values=vals,
            raw=raw if metric == "1st read" else [],
            ok=not wrong,
            show=show,
            params={
                "kind": kind,
                "value_bytes": size,
                "metric": metric,
                "repetitions": len(raw),
                "copies_median": copies,
                "value_types": types,
                "attach_s_median": summarize([r["attach_s"] for r in raw])["median"],
            },
        )


def _record_skipped(run: Run, a: A.Adapter, kind: str, size: int, why: str) -> None:
    for metric, unit, _ in METRICS:
        run.record(
            "big",
            case_name(kind, size, metric),
            a.key,
            unit=unit,
            better="lower",
            values=[],
            skipped=why,
            params={"kind": kind, "value_bytes": size, "metric": metric},
        )


def _record_failed(run: Run, a: A.Adapter, kind: str, size: int, exc: BaseException) -> None:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if isinstance(exc, (ReaderError, WorkerError)):
        text = str(exc)
    short = compact_error(text)
    run.alert(f"{a.label} failed in workload big ({kind}, {size_label(size)}): {short}")
    for metric, unit, _ in METRICS:
        rec = run.record(
            "big",
            case_name(kind, size, metric),
            a.key,
            unit=unit,
            better="lower",
            values=[],
            error=text,
            params={"kind": kind, "value_bytes": size, "metric": metric},
        )
        rec["error_short"] = short


def _notes(run: Run, adapters: list[A.Adapter], numpy_missing: Optional[str]) -> None:
    n = "big"
    reps = (
        "1 repetition" if run.quick else f"{min(run.repeat, 3)} repetitions ({min(run.repeat, 2)} at 1 GiB)"
    )
    run.note(
        f"{reps} per cell, each with a fresh spawned reader; the table shows "
        "median (min..max); 1st read = from the reader's first access (attaching included) to the "
        "value usable (array: first and last element read; bytes: the bytes object; view: a "
        "memoryview, first and last byte read); 2nd read = the same access again in that "
        "process; RSS added = the reader's VmRSS after the 1st read minus before attaching "
        "(shared pages it touched count too)",
        n,
    )
    run.note(
        "copies = (writer's peak RSS added by setup + write, shared-memory pages it wrote "
        "included, + reader's private peak RSS added by the 1st read) / value size, at that "
        f"size; 1 GiB runs only where it was <= {COPIES_LIMIT:g} at 100 MiB",
        n,
    )
    keys = {a.key for a in adapters}
    if "ultradict_ng" in keys:
        run.note(
            "ultradict_ng: d[k] = value; the reader d[k] (kinds numpy, bytes) and "
            "d.view(k) (kind view), nothing else: whatever its public API refuses is "
            "reported as unavailable with the exception",
            n,
        )
    if keys & {"ultradict_shared", "ultradict"}:
        run.note(
            "UltraDict(shared_lock=True): default pickle serializer and buffer_size "
            "(10 kB); full_dump_size = value + 1/16 + 1 MiB, so each write is a full dump "
            "(a pickle of the whole dict) into that static segment and attaching loads it; "
            "UltraDict() differs only in its lock and is not repeated here",
            n,
        )
    if "pickle5" in keys:
        run.note(
            "pickle5 out-of-band: pickle.dumps(protocol=5, buffer_callback) with the "
            "stream and the buffers in one new segment; the reader unpickles with "
            "buffers= views of it (bytes are pickled as PickleBuffer and come back as a "
            "memoryview: kind bytes copies it with bytes())",
            n,
        )
    if "shm" in keys:
        run.note(
            "SharedMemory (raw): write = SharedMemory(create=True, size) + one copy; the "
            "reader attaches by name (unregistered from the resource tracker) and views the "
            "buffer (np.ndarray(buffer=shm.buf); bytes(...) for kind bytes)",
            n,
        )
    if keys & {"pipe", "queue"}:
        run.note(
            "Pipe / Queue: the reader is already receiving when the writer starts; "
            "Pipe.send blocks until the reader has taken the data (a pipe holds 64 KiB), "
            "so its write includes the transfer; Queue.put returns at once (a feeder "
            "thread pickles and sends), so its write is only the enqueue; 1st read = from "
            "the reader's recv/get call to the value; 2nd read = a second send/put of "
            "the value; bytes go through send_bytes/recv_bytes on the Pipe; no view kind",
            n,
        )
    if "sharedarray" in keys:
        run.note(
            "SharedArray: write = sa.create('shm://name', shape, dtype) + one copy; "
            "each read = sa.attach (bytes stored as a uint8 array; tobytes() for kind "
            "bytes)",
            n,
        )
    if "ippo" in keys:
        run.note(
            "InterProcessPyObjects: its block (value + 1/8 + 1 MiB) is created and "
            "zeroed in the untimed setup (counted in copies); write = put_message_2 inside "
            "wait_my_turn; 1st read = init_consumer + take_message; 2nd read = get_obj at "
            "the message's offset; view = get_obj_buffer",
            n,
        )
    if numpy_missing:
        run.note(f"numpy kind not measured: {numpy_missing}", n)
    left_out = [A.ADAPTERS[k].label for k in A.ORDER if k in run.adapters and not run.adapters[k].runs("big")]
    if left_out:
        run.note(
            f"not in this workload: {', '.join(left_out)} (dicts of small values: see "
            "workload 8 for their large-value cost)",
            n,
        )
