"""Workload 11 (``pool``): ``ultradict_ng.futures.ProcessPoolExecutor`` against the standard pool and peers.

Two cases, each for four contenders:

* **(a) submit round trip**: ``ex.submit(add_one, x).result()`` with
  ``x = np.ones(int(2e7))`` (160 MB; ``--quick``: 2e6), ``max_workers=1``; from
  the ``submit`` call to the result's first and last element read (the input
  array exists before the clock starts).  The worker is warmed up by a tiny
  task first.  A few extra round trips with ``add_one_stamped`` (the same
  add, which also returns the worker's clock around it) split the time into
  *to worker* (submit -> the function starts in the worker: pickling or
  copying the argument, the pipe, unpickling or attaching), *compute* and
  *back* (the function returns -> the result usable here); they are not part
  of the median.
* **(b) map**: ``list(ex.map(add_one, arrays))`` over 64 float64 arrays of
  10 MiB each (``--quick``: 16 of 1 MiB), ``max_workers=2``; wall time from
  the ``map`` call to every result's first and last element read, and the
  throughput in MiB/s of input.

Contenders (``--contenders`` takes these names too):

* ``stdlib``: :class:`concurrent.futures.ProcessPoolExecutor`;
* ``npshmex``: ``npshmex.ProcessPoolExecutor`` (arrays through SharedArray
  segments; its module replaces ``concurrent.futures._base.Future`` with a
  subclass that un-shms results, for the whole process);
* ``handwritten``: the standard pool with :class:`multiprocessing.shared_memory.SharedMemory`
  managed by the caller, as a careful user writes it (see :mod:`perf.pool_tasks`);
* ``ultradict_ng``: ``ultradict_ng.futures.ProcessPoolExecutor``.

Every measurement runs in a fresh spawned *driver* process per contender and
round (:func:`perf.pool_tasks.driver_main`), so that npshmex's patch reaches
no other contender and each pool starts clean; the rounds interleave the
contenders (order rotated each round).  All executors use the platform's
default start method, passed explicitly as ``mp_context``.

Cleanup: each driver is ended by its pid (SIGTERM, which it turns into an
orderly shutdown; then SIGKILL); its workers' pids (reported by the driver,
checked against their start time) are ended if they outlive it; and the
segments a driver can leave are removed by name: the hand-written ones by
their prefix (which contains the run's name prefix), ultradict_ng's by its
pools' parcel prefixes, npshmex's (``npshmex_*``) that appeared while the
driver ran.  Anything found after a driver that finished normally is an
alert: the contender leaked it.  The same cleanup is registered with the run
(``run.own_resource``), so Ctrl-C or SIGTERM anywhere still runs it.

And **(c) small tasks** (no array: ``submit`` of ints, ``map`` with
``chunksize=100``, ``map`` returning small dicts), the standard pool against
ultradict_ng only, in the same drivers: see :mod:`perf.pool_small`.

Targets (the report only; nothing here fails on a ratio): (a) >= 4x faster
than the standard pool and faster than npshmex; (b) >= 3x the standard
pool's throughput; (c) each row >= 1.0x the standard pool.
"""

from __future__ import annotations

import importlib.util
import math
import multiprocessing as mp
import os
import signal
import statistics
import time
from typing import Any, Optional

from . import pool_small as S
from . import pool_tasks as T
from .run import Run
from .util import fmt_seconds, log, shm_entries

WL = "pool"
NUMBER = 11
TITLE = "process pool: submit(add_one, big array) round trip; map over many 10 MiB arrays; small tasks"
#: The workload as :data:`perf.workloads.WORKLOADS` lists the others.
ENTRY: tuple[str, int, str] = (WL, NUMBER, TITLE)
ALIASES = {"futures": "pool", "executor": "pool", "processpool": "pool", "processpoolexecutor": "pool"}

ORDER = list(T.CONTENDERS)  # stdlib, npshmex, handwritten, ultradict_ng
LABELS = {
    "stdlib": "concurrent.futures (stdlib)",
    "npshmex": "npshmex",
    "handwritten": "stdlib + SharedMemory by hand",
    "ultradict_ng": "ultradict_ng.futures",
}
#: ``--contenders`` names of this workload's contenders that are no adapters.
CONTENDER_ALIASES = {
    "std": "stdlib",
    "concurrent.futures": "stdlib",
    "concurrent-futures": "stdlib",
    "hand": "handwritten",
    "hand-written": "handwritten",
    "by-hand": "handwritten",
}
OWN_CONTENDERS = [c for c in ORDER if c != "ultradict_ng"]

SUBMIT, MAP = "submit", "map"
#: Targets: (a) vs the standard pool, (a) vs npshmex, (b) throughput vs the standard pool.
SUBMIT_VS_STDLIB = 4.0
SUBMIT_VS_NPSHMEX = 1.0
MAP_VS_STDLIB = 3.0
MiB = 1 << 20


# -- sizes and repetitions ----------------------------------------------------------------------


def plan(run: Run) -> dict[str, Any]:
    """Sizes, repetitions and rounds for this run."""
    if run.quick:
        return {
            "submit_elements": int(2e6),
            "map_arrays": 16,
            "map_bytes": MiB,
            "submit_reps": min(run.repeat, 3),
            "map_reps": min(run.repeat, 2),
            "stamped_reps": 1,
            "rounds": 1,
        }
    reps_a, reps_b = run.repeat, min(run.repeat, 3)
    return {
        "submit_elements": int(2e7),
        "map_arrays": 64,
        "map_bytes": 10 * MiB,
        "submit_reps": reps_a,
        "map_reps": reps_b,
        "stamped_reps": 2,
        "rounds": max(reps_a, reps_b),
    }


def _elements(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        m = n // 1_000_000
        return f"int({m // 10}e7)" if m % 10 == 0 and m >= 10 else f"int({m}e6)"
    return str(n)


def submit_case(p: dict[str, Any]) -> str:
    return f"submit(add_one, np.ones({_elements(p['submit_elements'])})) round trip, max_workers=1"


def map_case(p: dict[str, Any]) -> str:
    return f"list(map(add_one, {p['map_arrays']} arrays of {p['map_bytes'] // MiB} MiB)), max_workers=2"


# -- availability -------------------------------------------------------------------------------


def _missing(contender: str) -> Optional[str]:
    """Why a contender cannot run here (checked without importing npshmex, which patches)."""
    try:
        if contender == "npshmex":
            for mod in ("npshmex", "SharedArray"):
                if importlib.util.find_spec(mod) is None:
                    return f"{mod} is not installed (pip install npshmex)"
        elif contender == "ultradict_ng":
            if importlib.util.find_spec("ultradict_ng.futures") is None:
                return "ultradict_ng.futures does not exist in the installed ultradict_ng"
    except (ImportError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def versions() -> dict[str, str]:
    """The contenders' versions, for the contenders list (npshmex not imported)."""
    import platform
    from importlib.metadata import version

    out = {
        "stdlib": "stdlib " + platform.python_version(),
        "handwritten": "stdlib " + platform.python_version(),
    }
    for key, dist in (("npshmex", "npshmex"), ("ultradict_ng", "ultradict_ng")):
        try:
            out[key] = version(dist)
        except Exception:
            out[key] = "-"
    return out


# -- one driver -------------------------------------------------------------------------------


class DriverError(Exception):
    """The driver raised (``text`` is its traceback), died or did not answer."""


class Unavailable(Exception):
    """The contender cannot be imported in the driver."""


def _alive_as(pid: int, start: Optional[str]) -> bool:
    """``pid`` runs and is the process that had start time ``start``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # not ours
    now = T._proc_start(pid)
    return now == start and (start is not None or not os.path.exists("/proc/self/stat"))


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


class _DriverRun:
    """A spawned driver, what it reported, and the removal of whatever it leaves."""

    def __init__(self, run: Run, contender: str, params: dict[str, Any], limit: float) -> None:
        self.run = run
        self.contender = contender
        self.params = params
        self.limit = limit
        self.proc: Any = None
        self.conn: Any = None
        self.workers: list[tuple[int, Optional[str]]] = []
        self.parcel_prefixes: list[str] = []
        self.shm_before = set(shm_entries())
        self.key = f"pool driver {contender} {id(self):x}"
        self.cleaned = False
        self.info: dict[str, Any] = {}

    def start(self) -> None:
        parent_end, child_end = self.run.ctx.Pipe()
        self.conn = parent_end
        self.run.own_resource(self.key, self.cleanup)
        self.proc = self.run.ctx.Process(
            target=T.driver_main,
            name=f"perf-pool-{self.contender}",
            args=(self.contender, self.params, child_end),
            daemon=False,
        )  # (a daemon could not start its pool)
        try:
            self.proc.start()
        finally:
            child_end.close()

    def result(self) -> dict[str, Any]:
        """Wait for the driver's result (remembering the pools it reports on the way)."""
        deadline = time.monotonic() + self.limit
        p, conn = self.proc, self.conn
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DriverError(
                    f"no result from the {self.contender} driver (pid {p.pid}) within {self.limit:.0f} s"
                )
            if conn.poll(min(1.0, left)):
                try:
                    msg = conn.recv()
                except EOFError:
                    raise DriverError(
                        f"the {self.contender} driver (pid {p.pid}) ended, exit code {p.exitcode}"
                    ) from None
                kind = msg[0]
                if kind == "pool":
                    self.workers.extend(tuple(w) for w in msg[1]["pids"])
                    if msg[1].get("parcel_prefix"):
                        self.parcel_prefixes.append(msg[1]["parcel_prefix"])
                elif kind == "ready":
                    self.info = msg[1]
                elif kind == "result":
                    res: dict[str, Any] = msg[1]
                    return res
                elif kind == "unavailable":
                    raise Unavailable(msg[1])
                elif kind == "error":
                    raise DriverError(f"in the {self.contender} driver: {msg[2].strip()}")
                else:
                    raise DriverError(f"the {self.contender} driver sent {kind!r}")
            elif not p.is_alive() and not conn.poll(0):
                raise DriverError(f"the {self.contender} driver (pid {p.pid}) died, exit code {p.exitcode}")

    def cleanup(self, ok: bool = False) -> list[str]:
        """End the driver and its workers, remove its segments; what had to be done."""
        if self.cleaned:
            return []
        self.cleaned = True
        done: list[str] = []
        p = self.proc
        if p is not None and p.pid is not None:
            p.join(30 if ok else 0.2)
            if p.is_alive():
                p.terminate()  # SIGTERM: the driver shuts its executor down
                p.join(15)
            if p.is_alive():
                p.kill()
                p.join(5)
                done.append(f"driver pid {p.pid} killed")
        if self.conn is not None:
            self.conn.close()
        # The workers: an orderly shutdown has joined them; ultradict_ng's notice their
        # pool's process is gone within a second; anything else is ended here.
        deadline = time.monotonic() + 2.0
        left = [w for w in self.workers if _alive_as(*w) and not _zombie(w[0])]
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [w for w in left if _alive_as(*w) and not _zombie(w[0])]
        for pid, start in left:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if not _alive_as(pid, start) or _zombie(pid):
                    break
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                t = time.monotonic() + 1.5  # (a standard worker inside a task ignores SIGTERM)
                while time.monotonic() < t and _alive_as(pid, start) and not _zombie(pid):
                    time.sleep(0.05)
            done.append(f"worker pid {pid} outlived its pool's process: ended")
        # The segments it can leave.
        gone = []
        for name in shm_entries():
            if (
                name.startswith(self.params["hand_prefix"])
                or any(name.startswith(px) for px in self.parcel_prefixes)
                or (name.startswith("npshmex_") and name not in self.shm_before)
            ):
                if T.shm_unlink_name(name):
                    gone.append(name)
        if gone:
            shown = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
            done.append(f"{len(gone)} segment(s) left in /dev/shm, removed: {shown}")
        self.run.resources.pop(self.key, None)
        return done


def _one(
    run: Run, contender: str, params: dict[str, Any], limit: float
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Run one driver; (its result, its ready info, what the cleanup found after a normal end)."""
    d = _DriverRun(run, contender, params, limit)
    try:
        d.start()
        res = d.result()
    except BaseException as exc:
        left = d.cleanup(False)
        if left and isinstance(exc, Exception):
            raise DriverError(f"{exc}\n(then the harness: {'; '.join(left)})") from exc
        raise
    return res, d.info, d.cleanup(True)


# -- the workload ----------------------------------------------------------------------------


def w_pool(run: Run, contenders: list[str]) -> None:
    p = plan(run)
    small = S.plan(run)
    cases = [(SUBMIT, submit_case(p)), (MAP, map_case(p))]
    small_cases = S.cases(small)
    todo: list[str] = []
    numpy_missing = importlib.util.find_spec("numpy") is None
    for c in [c for c in ORDER if c in contenders]:
        why = "numpy is not installed" if numpy_missing else _missing(c)
        if why:
            _skip(run, c, cases + (small_cases if c in S.CONTENDERS else []), "unavailable: " + why)
            run.note(f"{LABELS[c]} skipped: {why}", WL)
        else:
            todo.append(c)
    if not todo:
        return
    start_method = mp.get_all_start_methods()[0]  # the platform's default
    base = {k: p[k] for k in ("submit_elements", "map_arrays", "map_bytes")}
    base.update((k, small[k]) for k in S.KINDS)
    base["start_method"] = start_method
    raws: dict[str, dict[str, list[dict[str, Any]]]] = {c: {SUBMIT: [], MAP: [], S.SMALL: []} for c in todo}
    small_rounds: dict[str, list[int]] = {c: [] for c in todo}
    info: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}  # given up on (unavailable, or failed MAX_FAILURES times)
    errors: dict[str, list[str]] = {c: [] for c in todo}
    stamped_left = p["stamped_reps"]
    per_round_stamped = 1 if p["rounds"] > 1 else p["stamped_reps"]
    seq = 0
    t_all = time.perf_counter()
    for rnd in range(p["rounds"]):
        reps_a = p["submit_reps"] if p["rounds"] == 1 else int(rnd < p["submit_reps"])
        reps_b = p["map_reps"] if p["rounds"] == 1 else int(rnd < p["map_reps"])
        stamped = min(stamped_left, per_round_stamped)
        stamped_left -= stamped
        order = todo[rnd % len(todo) :] + todo[: rnd % len(todo)]
        for c in order:
            if c in failed:
                continue
            seq += 1
            params = dict(
                base,
                submit_reps=reps_a,
                map_reps=reps_b,
                stamped_reps=stamped,
                small_reps=small["small_reps"] if c in S.CONTENDERS else 0,
                hand_prefix=f"{run.name_prefix}pool{seq}_",
            )
            if not (
                params["submit_reps"] or params["stamped_reps"] or params["map_reps"] or params["small_reps"]
            ):
                continue
            log(f"  pool: {LABELS[c]}, round {rnd + 1}/{p['rounds']}")
            limit = (
                120.0
                + 60.0 * (params["submit_reps"] + params["stamped_reps"])
                + 120.0 * params["map_reps"]
                + 60.0 * params["small_reps"]
            )
            try:
                res, inf, left = _one(run, c, params, limit)
            except Unavailable as exc:
                failed[c] = "skipped"
                _skip(run, c, cases + (small_cases if c in S.CONTENDERS else []), f"unavailable: {exc}")
                run.note(f"{LABELS[c]} skipped: {exc}", WL)
                continue
            except Exception as exc:
                text = str(exc) if isinstance(exc, DriverError) else f"{type(exc).__name__}: {exc}"
                errors[c].append(text)
                short = _short(text)
                more = (
                    " (a later round runs it again)"
                    if len(errors[c]) < MAX_FAILURES
                    else f" ({MAX_FAILURES} failures: not run again)"
                )
                run.alert(
                    f"{LABELS[c]} failed in workload {WL}, round {rnd + 1}: {short}{more}" + _hint(text)
                )
                if len(errors[c]) >= MAX_FAILURES:
                    failed[c] = text
                continue
            info[c] = inf
            if left:
                run.alert(
                    f"{LABELS[c]} (workload {WL}, round {rnd + 1}): after the driver had "
                    f"shut its executor down: {'; '.join(left)}"
                )
            for case in (SUBMIT, MAP):
                if case in res:
                    raws[c][case].append(res[case])
            if S.SMALL in res:
                raws[c][S.SMALL].append(res[S.SMALL])
                small_rounds[c].append(rnd + 1)
    for c in todo:
        if failed.get(c) == "skipped":
            continue
        for kind, case in cases:
            if any(r["times"] for r in raws[c][kind]):
                _record(run, c, kind, case, raws[c][kind], p, info.get(c, {}), errors[c])
            elif errors[c]:
                _fail(run, c, [(kind, case)], errors[c][-1])
        if c in S.CONTENDERS:
            if raws[c][S.SMALL]:
                S.record(run, c, LABELS[c], raws[c][S.SMALL], small, small_rounds[c], errors[c])
            elif errors[c]:
                _fail(run, c, small_cases, errors[c][-1])
    ran = [c for c in todo if failed.get(c) != "skipped"]
    _notes(run, p, ran, info, start_method, time.perf_counter() - t_all)
    if any(c in S.CONTENDERS for c in ran):
        run.note(
            f"(c) small tasks: {small['small_reps']} repetition(s) of each row per driver, "
            "after the array cases, on the driver's pool of 2 workers; only the standard "
            "pool and ultradict_ng.futures (with no array the other two are the standard "
            "pool); by round: the ratio of each round's medians",
            WL,
        )


#: A contender that fails this many rounds is not run again.
MAX_FAILURES = 2


def _short(text: str) -> str:
    mark = "(then the harness:"
    lines = [ln for ln in text.strip().splitlines() if not ln.startswith(mark)]
    short = lines[-1][:300] if lines else text
    cleaned = [ln for ln in text.strip().splitlines() if ln.startswith(mark)]
    return short + (" " + cleaned[0] if cleaned else "")


def _hint(text: str) -> str:
    """What a known failure means."""
    if "is gone (removed from outside?)" in text:
        return (
            "; another process removed a live parcel: a concurrent pytest run does this "
            "(tests/conftest.py's no_leftovers unlinks every @udp* entry that appears while "
            "a test runs, a benchmark's too), as would a buggy 'ultradict-ng clean'"
        )
    return ""


def _skip(run: Run, c: str, cases: list[tuple[str, str]], why: str) -> None:
    for kind, case in cases:
        rec = run.record(
            WL, case, c, unit="s", better="lower", values=[], skipped=why, params={"case_kind": kind}
        )
        rec["label"] = LABELS[c]


def _fail(run: Run, c: str, cases: list[tuple[str, str]], text: str) -> None:
    short = _short(text)
    for kind, case in cases:
        rec = run.record(
            WL, case, c, unit="s", better="lower", values=[], error=text, params={"case_kind": kind}
        )
        rec["label"] = LABELS[c]
        rec["error_short"] = short


def _med(xs: list[float]) -> Optional[float]:
    return statistics.median(xs) if xs else None


def _record(
    run: Run,
    c: str,
    kind: str,
    case: str,
    raw: list[dict[str, Any]],
    p: dict[str, Any],
    inf: dict[str, Any],
    errors: list[str],
) -> None:
    times = [t for r in raw for t in r["times"]]
    wrong = [w for r in raw for w in r["wrong"]]
    if wrong:
        run.alert(f"{LABELS[c]}: pool {kind}: a wrong result: {wrong[0]}")
    params: dict[str, Any] = {
        "case_kind": kind,
        "repetitions": len(times),
        "drivers": len(raw),
        "start_method": inf.get("start_method"),
        "version": inf.get("version"),
        "future_class_in_driver": inf.get("future_class"),
        "result_types": sorted({t for r in raw for t in r["result_types"]}),
        "release_s_median": _med([x for r in raw for x in r["release_s"]]),
        "failed_rounds": len(errors),
        "errors": errors,
    }
    show: dict[str, Any] = {}
    if errors:
        show["failed rounds"] = str(len(errors))
    if kind == SUBMIT:
        params["elements"] = p["submit_elements"]
        params["input_bytes"] = p["submit_elements"] * 8
        stages = [s for r in raw for s in r.get("stages", [])]
        params["stages"] = stages
        if stages:
            params["stages_median"] = {k: _med([s[k] for s in stages if k in s]) for k in stages[0]}
    else:
        mib = p["map_arrays"] * p["map_bytes"] / MiB
        params.update(
            arrays=p["map_arrays"],
            array_bytes=p["map_bytes"],
            input_mib=mib,
            throughput_mib_s=[mib / t for t in times],
        )
        med = _med(times)
        params["throughput_mib_s_median"] = mib / med if med else None
    if wrong:
        show["value"] = "WRONG"
    rec = run.record(
        WL, case, c, unit="s", better="lower", values=times, raw=raw, show=show, params=params, ok=not wrong
    )
    rec["label"] = LABELS[c]


def _notes(
    run: Run,
    p: dict[str, Any],
    todo: list[str],
    info: dict[str, dict[str, Any]],
    start_method: str,
    took: float,
) -> None:
    def note(text: str) -> None:
        run.note(text, WL)

    rounds = p["rounds"]
    note(
        f"each measurement in a fresh spawned driver process per contender ({rounds} round"
        f"{'s' if rounds > 1 else ''}, contenders interleaved, order rotated); executors made "
        f"with mp_context={start_method!r} (this platform's default start method), warmed up "
        f"by one tiny task per worker; {p['submit_reps']} round trip(s) and {p['map_reps']} "
        f"map(s) per contender; median (min..max); the workload took {took:.0f} s"
    )
    note(
        "(a) the clock runs from the submit call to the result's first and last element read "
        "(the input array is made before); 'to worker / compute / back': "
        f"{p['stamped_reps']} extra round trip(s) of add_one_stamped (the same add, returning "
        "the worker's clock around it in a dict, as npshmex ships only arrays and dicts of "
        "arrays through shared memory), not in the median: to worker = submit -> the add "
        "starts in the worker, back = the add ends -> the result usable here (the "
        "hand-written one includes the parent's segment create + copy in 'to worker')"
    )
    note(
        "(b) wall time from the map call to every result's first and last element read; "
        "MiB/s = input MiB / wall; speed-up = stdlib's median / the contender's (for (b) "
        "that is the throughput ratio)"
    )
    if "npshmex" in todo:
        fc = info.get("npshmex", {}).get("future_class")
        note(
            "npshmex monkeypatches concurrent.futures._base.Future globally when imported "
            f"(in its driver the class was {fc or '?'}): it runs only in drivers of its own; "
            "its submit puts array arguments in SharedArray segments and its Future un-shms "
            "results on arrival; its map sends tuples of arguments (chunks), which it does "
            "not recognise as arrays: in (b) the arrays travel pickled through the pipe, "
            "as in the standard pool"
        )
    if "handwritten" in todo:
        note(
            "stdlib + SharedMemory by hand: the caller creates a segment per input and copies "
            "the array in, passes (name, shape, dtype); the worker attaches, creates an output "
            "segment and computes into it (np.add(x, 1, out=...): no extra copy), returns its "
            "name; the caller attaches it (zero-copy); closing and unlinking both happens "
            "after the clock stops (release time in latest.json); no resource-tracker "
            "registration is left (track=False on 3.13+, else unregister after each "
            "create/attach and shm_unlink); in (b) map consumes a generator that copies each "
            "input just before its submit"
        )
    if "ultradict_ng" in todo:
        note(
            "ultradict_ng.futures.ProcessPoolExecutor with its default shm_threshold; its "
            "result arrays are views of a segment whose name is already removed (freed when "
            "the array is)"
        )


# -- the report -------------------------------------------------------------------------------


def _rows(recs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    rows = [r for r in recs if r["workload"] == WL and r["params"].get("case_kind") == kind]
    return sorted(rows, key=lambda r: ORDER.index(r["contender"]) if r["contender"] in ORDER else len(ORDER))


def _find(recs: list[dict[str, Any]], kind: str, c: str) -> Optional[dict[str, Any]]:
    for r in _rows(recs, kind):
        if r["contender"] == c:
            return r
    return None


def _speedup(recs: list[dict[str, Any]], kind: str, base: str, c: str) -> Optional[float]:
    """``base``'s median / ``c``'s: how many times faster ``c`` is (None if either is missing)."""
    b, x = _find(recs, kind, base), _find(recs, kind, c)
    if not b or not x or not b["median"] or not x["median"]:
        return None
    return float(b["median"]) / float(x["median"])


def _spread(r: dict[str, Any]) -> str:
    if r["n"] < 2:
        return "(1 rep)"
    return f"{fmt_seconds(r['min'])} .. {fmt_seconds(r['max'])}"


def _bad(r: dict[str, Any], w: int) -> Optional[str]:
    if r.get("skipped"):
        return f"  {r['label']:<{w}}skipped: {r['skipped']}"
    if r.get("error") and r["median"] is None:
        return f"  {r['label']:<{w}}FAILED: {(r.get('error_short') or r['error'])[:200]}"
    return None


def section(recs: list[dict[str, Any]], number: int, title: str, notes: list[str]) -> str:
    lines = ["", f"== {number}. {title} =="]
    w = 31
    for kind in (SUBMIT, MAP):
        rows = _rows(recs, kind)
        if not rows:
            continue
        better = "lower is better" if kind == SUBMIT else "lower wall / higher MiB/s is better"
        lines.append(
            f"  -- ({'a' if kind == SUBMIT else 'b'}) {rows[0]['case']} ({better}; "
            "x stdlib / x npshmex: times faster than it) --"
        )
        head = f"  {'contender':<{w}}{'median':>10}  {'spread (min..max)':<22}{'n':>3}"
        head += f"{'x stdlib':>10}"
        head += f"{'x npshmex':>11}" if kind == SUBMIT else f"{'MiB/s':>9}"
        lines.append(head + "  notes")
        for r in rows:
            bad = _bad(r, w)
            if bad:
                lines.append(bad)
                continue
            vs_std = _speedup(recs, kind, "stdlib", r["contender"])
            line = (
                f"  {r['label']:<{w}}{fmt_seconds(r['median']):>10}  {_spread(r):<22}"
                f"{r['n']:>3}{'-' if vs_std is None else f'{vs_std:.2f}x':>10}"
            )
            if kind == SUBMIT:
                vs_np = _speedup(recs, kind, "npshmex", r["contender"])
                line += f"{'-' if vs_np is None else f'{vs_np:.2f}x':>11}"
            else:
                thr = r["params"].get("throughput_mib_s_median")
                line += f"{'-' if thr is None else f'{thr:.0f}':>9}"
            extra = []
            if r["show"].get("value"):
                extra.append("VALUE " + r["show"]["value"])
            if r["show"].get("failed rounds"):
                extra.append(f"{r['show']['failed rounds']} round(s) failed: see the alerts")
            lines.append((line + "  " + ", ".join(extra)).rstrip())
        if kind == SUBMIT:
            staged = [r for r in rows if r["params"].get("stages_median")]
            if staged:
                lines.append(
                    f"  where the time goes (add_one_stamped, median of "
                    f"{len(staged[0]['params']['stages'])}):"
                )
                lines.append(
                    f"  {'':<{w}}{'to worker':>10}{'compute':>10}{'back':>10}"
                    f"{'total':>10}  (hand-written: put = create + copy, take = attach)"
                )
                for r in staged:
                    s = r["params"]["stages_median"]
                    more = ""
                    if "put" in s:
                        more = f"  put {fmt_seconds(s['put'])}, take {fmt_seconds(s['take'])}"
                    lines.append(
                        f"  {r['label']:<{w}}{fmt_seconds(s.get('to_worker')):>10}"
                        f"{fmt_seconds(s.get('compute')):>10}"
                        f"{fmt_seconds(s.get('back')):>10}"
                        f"{fmt_seconds(s.get('total')):>10}{more}"
                    )
    lines.extend(S.section(recs, LABELS, w))
    for n in notes:
        lines.append(f"   note: {n}")
    return "\n".join(lines)


def targets(records: list[dict[str, Any]], quick: bool) -> list[dict[str, Any]]:
    """The pool's targets on the medians of this run (the report marks them; nothing fails)."""
    out: list[dict[str, Any]] = []
    recs = [r for r in records if r["workload"] == WL]

    def why(kind: str, c: str) -> str:
        r = _find(recs, kind, c)
        if r is None:
            return f"{LABELS[c]}: not measured in this run"
        return f"{LABELS[c]}: " + str(r.get("skipped") or r.get("error_short") or "no value")

    def row(name: str, kind: str, base: str, need: float, strict: bool) -> None:
        ratio = _speedup(recs, kind, base, "ultradict_ng")
        r: dict[str, Any] = {"target": name, "need": f"> {need:g}x" if strict else f">= {need:g}x"}
        if ratio is None:
            missing = "ultradict_ng" if not (_find(recs, kind, "ultradict_ng") or {}).get("median") else base
            r.update(measured=None, status="n/a", detail=why(kind, missing))
        else:
            ok = ratio > need if strict else ratio >= need
            ng, b = _find(recs, kind, "ultradict_ng"), _find(recs, kind, base)
            assert ng is not None and b is not None
            detail = (
                f"ultradict_ng.futures {fmt_seconds(ng['median'])} vs {LABELS[base]} "
                f"{fmt_seconds(b['median'])} (median of {ng['n']} / {b['n']})"
            )
            if kind == MAP:
                detail += (
                    f"; {ng['params'].get('throughput_mib_s_median') or 0:.0f} vs "
                    f"{b['params'].get('throughput_mib_s_median') or 0:.0f} MiB/s"
                )
            r.update(measured=ratio, status="PASS" if ok else "MISS", detail=detail)
            case = ng["case"]
            if quick:
                r["caveat"] = f"--quick sizes ({case}), not the targets'"
        out.append(r)

    row("pool: submit round trip >= 4x faster than stdlib pool", SUBMIT, "stdlib", SUBMIT_VS_STDLIB, False)
    row("pool: submit round trip faster than npshmex", SUBMIT, "npshmex", SUBMIT_VS_NPSHMEX, True)
    row("pool: map 64x10 MiB >= 3x stdlib pool's throughput", MAP, "stdlib", MAP_VS_STDLIB, False)
    out.extend(S.targets(recs, quick))
    return out


def _minor_label(v: float, _pos: Any) -> str:
    """Label the 2s and 5s between the decades of a log axis."""
    if v <= 0:
        return ""
    lead = round(v / 10 ** math.floor(math.log10(v)), 6)
    return f"{v:g}" if lead in (2.0, 5.0) else ""


def plot_panel(ax: Any, recs: list[dict[str, Any]]) -> str:
    """Median seconds (whiskers min..max) per case and contender; the speed-up over stdlib on top."""
    # ultradict_ng in its colour of the other panels; the peers in colours no other panel uses
    colors = {"stdlib": "dimgray", "npshmex": "goldenrod", "handwritten": "teal", "ultradict_ng": "tab:blue"}
    width = 0.8 / len(ORDER)
    kinds = [k for k in (SUBMIT, MAP) if any(r["median"] for r in _rows(recs, k))]
    for i, c in enumerate(ORDER):
        xs, ys, lo, hi = [], [], [], []
        for j, kind in enumerate(kinds):
            r = _find(recs, kind, c)
            if r and r["median"]:
                x = j + (i - (len(ORDER) - 1) / 2) * width
                xs.append(x)
                ys.append(r["median"])
                lo.append(r["median"] - r["min"])
                hi.append(r["max"] - r["median"])
                s = _speedup(recs, kind, "stdlib", c)
                if s is not None and c != "stdlib":
                    ax.annotate(f"{s:.1f}x", (x, r["max"]), ha="center", va="bottom", fontsize=7)
        if xs:
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, color=colors[c], label=LABELS[c])
    labels = []
    for kind in kinds:
        prm = next(r["params"] for r in _rows(recs, kind) if r["median"])
        if kind == SUBMIT:
            labels.append(f"(a) submit round trip, 1 worker\n{prm.get('input_bytes', 0) / 1e6:.0f} MB array")
        else:
            labels.append(
                f"(b) map, 2 workers\n{prm.get('arrays')} x {(prm.get('array_bytes') or 0) // MiB} MiB"
            )
    ax.set_xticks(range(len(kinds)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(_minor_label))
    ax.set_ylabel("s (median; label: x faster than stdlib)")
    return "process pool with large arrays (lower is better)"
