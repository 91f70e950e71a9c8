"""Workload 11 (``pool``): ``ultradict_ng.futures.ProcessPoolExecutor`` against the standard pool and peers.

* submit round trip: ``ex.submit(add_one, np.ones(int(2e7))).result()`` (160 MB;
  ``--quick``: 2e6), one worker, from the call to the result's first and last
  element read; extra round trips of ``add_one_stamped`` split it into to worker /
  compute / back (not in the median);
* map: ``list(ex.map(add_one, arrays))`` over 64 arrays of 10 MiB (``--quick``: 16
  of 1 MiB), two workers, wall time and MiB/s of input;
* small tasks without arrays (``submit`` of ints, ``map`` with ``chunksize=100``,
  ``map`` returning small dicts), the standard pool and ultradict_ng only: a
  drop-in pool must not make the work that gains nothing from it slower.

Contenders: ``stdlib`` (:class:`concurrent.futures.ProcessPoolExecutor`), ``npshmex``,
``handwritten`` (the standard pool with ``SharedMemory`` managed by the caller,
see :mod:`perf.pool_tasks`) and ``ultradict_ng``.  Every measurement runs in a
fresh spawned driver per contender and round (npshmex patches
``concurrent.futures`` for the whole process); rounds interleave the contenders.
Cleanup: each driver is ended by its pid, its workers (pids checked against
their start time) if they outlive it, and the segments it can leave are removed
by name; anything found after a driver that finished normally is an alert.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import signal
import statistics
import time
from typing import Any, Optional

from . import pool_tasks as T
from .registry import NG, Target, Workload, pick, register
from .run import Run
from .util import fmt_seconds, log, shm_entries

WL = "pool"
ORDER = ("stdlib", "npshmex", "handwritten", NG)
LABELS = dict(zip(ORDER, ("concurrent.futures (stdlib)", "npshmex", "stdlib + SharedMemory by hand")))
LABELS[NG] = "ultradict_ng.futures"
ARRAY_KINDS = ("submit", "map")
#: With no array, the hand-written one is the standard pool and npshmex adds nothing.
SMALL_CONTENDERS = ("stdlib", NG)
MAX_FAILURES = 2  # a contender that fails this many rounds is not run again
MiB = 1 << 20
SECONDS = {"unit": "s", "better": "lower"}
#: sizes and repetitions per driver, --quick and full
SIZES = ("submit_elements", "map_arrays", "map_bytes", *T.SMALL_KINDS, "small_reps", "stamped_reps")
QUICK, FULL = (int(2e6), 16, MiB, 500, 10_000, 500, 2, 1), (int(2e7), 64, 10 * MiB, 3000, 60_000, 3000, 3, 2)


def plan(run: Run) -> dict[str, Any]:
    p = dict(zip(SIZES, QUICK if run.quick else FULL))
    if run.quick:
        return dict(p, submit_reps=min(run.repeat, 3), map_reps=min(run.repeat, 2), rounds=1)
    return dict(p, submit_reps=run.repeat, map_reps=min(run.repeat, 3), rounds=run.repeat)


def cases(p: dict[str, Any]) -> dict[str, str]:
    elements = f"int({p['submit_elements']:.0e})".replace("e+0", "e")
    return {
        "submit": f"submit(add_one, np.ones({elements})) round trip, max_workers=1",
        "map": f"list(map(add_one, {p['map_arrays']} arrays of {p['map_bytes'] // MiB} MiB)), max_workers=2",
        "small_submit": f"submit(inc, i) for {p['small_submit']:,} ints, 2 workers",
        "small_map": f"map(inc, range({p['small_map']:,}), chunksize=100), 2 workers",
        "small_dicts": f"map(small_dict, range({p['small_dicts']:,})) (results: dicts of 4 fields), "
        "2 workers",
    }


def kinds(c: str) -> tuple[str, ...]:
    return ARRAY_KINDS + (T.SMALL_KINDS if c in SMALL_CONTENDERS else ())


def _missing(contender: str) -> Optional[str]:
    """Why a contender cannot run here (checked without importing npshmex, which patches)."""
    need = {"npshmex": ("npshmex", "SharedArray"), NG: ("ultradict_ng.futures",)}.get(contender, ())
    try:
        gone = next((m for m in ("numpy", *need) if importlib.util.find_spec(m) is None), None)
    except (ImportError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return gone and f"{gone} is not installed" + (" (pip install npshmex)" if contender == "npshmex" else "")


# -- one driver -------------------------------------------------------------------------------


class DriverError(Exception):
    """The driver raised (``text`` is its traceback), died or did not answer."""


class Unavailable(Exception):
    """The contender cannot be imported in the driver."""


def _lives(pid: int, start: Optional[str]) -> bool:
    """``pid`` runs, is no zombie and is the process that had start time ``start``."""
    try:
        os.kill(pid, 0)
    except OSError:  # gone, or not ours
        return False
    return T.proc_start(pid) == start and (start is not None or not os.path.exists("/proc/self/stat"))


class _Driver:
    """A spawned driver, what it reported, and the removal of whatever it leaves."""

    def __init__(self, run: Run, contender: str, params: dict[str, Any], limit: float) -> None:
        self.run, self.c, self.params, self.limit = run, contender, params, limit
        self.proc: Any = None
        self.conn: Any = None
        self.workers: list[tuple[int, Optional[str]]] = []
        self.parcel_prefixes: list[str] = []
        self.shm_before = set(shm_entries())
        self.key = f"pool driver {contender} {id(self):x}"
        self.cleaned = False
        self.info: dict[str, Any] = {}

    def result(self) -> dict[str, Any]:
        """Start the driver, wait for its result (remembering the pools it reports on the way)."""
        self.conn, child_end = self.run.ctx.Pipe()
        self.run.own_resource(self.key, self.cleanup)
        args = (self.c, self.params, child_end)  # (no daemon: a daemon could not start its pool)
        p = self.proc = self.run.ctx.Process(target=T.driver_main, name=f"perf-pool-{self.c}", args=args)
        try:
            p.start()
        finally:
            child_end.close()
        deadline = time.monotonic() + self.limit
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DriverError(
                    f"no result from the {self.c} driver (pid {p.pid}) within {self.limit:.0f} s"
                )
            if not self.conn.poll(min(1.0, left)):
                if not p.is_alive() and not self.conn.poll(0):
                    raise DriverError(f"the {self.c} driver (pid {p.pid}) died, exit code {p.exitcode}")
                continue
            try:
                kind, *body = self.conn.recv()
            except EOFError:
                raise DriverError(
                    f"the {self.c} driver (pid {p.pid}) ended, exit code {p.exitcode}"
                ) from None
            if kind == "pool":
                self.workers += [tuple(w) for w in body[0]["pids"]]
                self.parcel_prefixes += [body[0]["parcel_prefix"]] if body[0].get("parcel_prefix") else []
            elif kind == "ready":
                self.info = body[0]
            elif kind == "result":
                return body[0]  # type: ignore[no-any-return]
            elif kind == "unavailable":
                raise Unavailable(body[0])
            elif kind == "error":
                raise DriverError(f"in the {self.c} driver: {body[1].strip()}")
            else:
                raise DriverError(f"the {self.c} driver sent {kind!r}")

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
        # An orderly shutdown has joined the workers; ultradict_ng's notice their pool's
        # process is gone within a second; anything else is ended here.
        deadline = time.monotonic() + 2.0
        left = [w for w in self.workers if _lives(*w)]
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [w for w in left if _lives(*w)]
        for pid, start in left:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if not _lives(pid, start):
                    break
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                t = time.monotonic() + 1.5  # (a standard worker inside a task ignores SIGTERM)
                while time.monotonic() < t and _lives(pid, start):
                    time.sleep(0.05)
            done.append(f"worker pid {pid} outlived its pool's process: ended")
        prefixes = (self.params["hand_prefix"], *self.parcel_prefixes)
        gone = [
            name
            for name in shm_entries()
            if (name.startswith(prefixes) or (name.startswith("npshmex_") and name not in self.shm_before))
            and T.shm_unlink_name(name)
        ]
        if gone:
            shown = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
            done.append(f"{len(gone)} segment(s) left in /dev/shm, removed: {shown}")
        self.run.resources.pop(self.key, None)
        return done


def _one(
    run: Run, c: str, params: dict[str, Any], limit: float
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Run one driver; (its result, its ready info, what the cleanup found after a normal end)."""
    d = _Driver(run, c, params, limit)
    try:
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
    case = cases(p)
    todo: list[str] = []
    for c in contenders:
        why = _missing(c)
        if why:
            _empty(run, c, kinds(c), case, {"skipped": "unavailable: " + why})
            run.note(f"{LABELS[c]} skipped: {why}", WL)
        else:
            todo.append(c)
    if not todo:
        return
    start_method = mp.get_all_start_methods()[0]  # the platform's default
    base = {k: p[k] for k in ("submit_elements", "map_arrays", "map_bytes", *T.SMALL_KINDS)}
    base["start_method"] = start_method
    raws: dict[str, dict[str, list[dict[str, Any]]]] = {c: {k: [] for k in kinds(c)} for c in todo}
    info: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}  # given up on: unavailable, or failed MAX_FAILURES times
    errors: dict[str, list[str]] = {c: [] for c in todo}
    rounds = p["rounds"]
    stamped_left = p["stamped_reps"]
    seq = 0
    t_all = time.perf_counter()
    for rnd in range(rounds):
        stamped = min(stamped_left, 1 if rounds > 1 else stamped_left)
        stamped_left -= stamped
        reps = {
            "submit_reps": p["submit_reps"] if rounds == 1 else int(rnd < p["submit_reps"]),
            "map_reps": p["map_reps"] if rounds == 1 else int(rnd < p["map_reps"]),
            "stamped_reps": stamped,
        }
        for c in todo[rnd % len(todo) :] + todo[: rnd % len(todo)]:
            if c in failed:
                continue
            seq += 1
            small = p["small_reps"] if c in SMALL_CONTENDERS else 0
            prm = dict(base, **reps, small_reps=small, hand_prefix=f"{run.name_prefix}pool{seq}_")
            if not (sum(reps.values()) or small):
                continue
            log(f"  pool: {LABELS[c]}, round {rnd + 1}/{rounds}")
            limit = 120.0 + 60.0 * (reps["submit_reps"] + stamped + small) + 120.0 * reps["map_reps"]
            try:
                res, inf, left = _one(run, c, prm, limit)
            except Unavailable as exc:
                failed[c] = "skipped"
                _empty(run, c, kinds(c), case, {"skipped": f"unavailable: {exc}"})
                run.note(f"{LABELS[c]} skipped: {exc}", WL)
                continue
            except Exception as exc:
                text = str(exc) if isinstance(exc, DriverError) else f"{type(exc).__name__}: {exc}"
                errors[c].append(text)
                more = " (a later round runs it again)"
                if len(errors[c]) >= MAX_FAILURES:
                    failed[c] = text
                    more = f" ({MAX_FAILURES} failures: not run again)"
                run.alert(
                    f"{LABELS[c]} failed in workload {WL}, round {rnd + 1}: {_short(text)}{more}{_hint(text)}"
                )
                continue
            info[c] = inf
            if left:
                run.alert(
                    f"{LABELS[c]} (workload {WL}, round {rnd + 1}): after the driver had "
                    f"shut its executor down: {'; '.join(left)}"
                )
            for k in raws[c]:
                if k in res:
                    raws[c][k].append(dict(res[k], round=rnd + 1))
    ran = [c for c in todo if failed.get(c) != "skipped"]
    ctx = {"plan": p, "case": case, "info": info, "errors": errors, "std_rounds": {}}
    for c in ran:  # (in ORDER: stdlib first, the others' rows compare by round)
        for k, raw in raws[c].items():
            if any(r["times"] for r in raw):
                _record(run, c, k, raw, ctx)
            elif errors[c]:
                _empty(run, c, (k,), case, {"error": errors[c][-1]})
    _notes(run, p, ran, info, start_method, time.perf_counter() - t_all)


def _short(text: str) -> str:
    mark = "(then the harness:"
    lines = [ln for ln in text.strip().splitlines() if not ln.startswith(mark)]
    cleaned = [ln for ln in text.strip().splitlines() if ln.startswith(mark)]
    return (lines[-1][:300] if lines else text) + (" " + cleaned[0] if cleaned else "")


def _hint(text: str) -> str:
    """What a known failure means."""
    if "is gone (removed from outside?)" not in text:
        return ""
    return (
        "; another process removed a live parcel: a concurrent pytest run does this "
        "(tests/conftest.py's no_leftovers unlinks every @udp* entry that appears while "
        "a test runs, a benchmark's too), as would a buggy 'ultradict-ng clean'"
    )


def _empty(run: Run, c: str, ks: tuple[str, ...], case: dict[str, str], why: dict[str, str]) -> None:
    """Records without a value: ``why`` is ``{"skipped": ...}`` or ``{"error": ...}``."""
    for k in ks:
        rec = run.record(WL, case[k], c, **SECONDS, values=[], params={"case_kind": k}, **why)
        rec["label"] = LABELS[c]
        if "error" in why:
            rec["error_short"] = _short(why["error"])


def _med(xs: list[float]) -> Optional[float]:
    return statistics.median(xs) if xs else None


def _record(run: Run, c: str, k: str, raw: list[dict[str, Any]], ctx: dict[str, Any]) -> None:
    """One record of ``c``'s case ``k`` from its drivers' results ``raw``."""
    p, errors = ctx["plan"], ctx["errors"][c]
    times = [t for r in raw for t in r["times"]]
    wrong = [w for r in raw for w in r["wrong"]]
    if wrong:
        run.alert(f"{LABELS[c]}: pool {k}: a wrong result: {wrong[0]}")
    by_round = {str(r["round"]): statistics.median(r["times"]) for r in raw if r["times"]}
    params: dict[str, Any] = {"case_kind": k, "repetitions": len(times), "drivers": len(raw)}
    params.update(failed_rounds=len(errors), errors=errors, round_medians=by_round)
    show = {"failed rounds": f"{len(errors)}, see the alerts"} if errors else {}
    if k in ARRAY_KINDS:
        inf = ctx["info"].get(c, {})
        params.update(
            start_method=inf.get("start_method"),
            version=inf.get("version"),
            future_class_in_driver=inf.get("future_class"),
            result_types=sorted({t for r in raw for t in r["result_types"]}),
            release_s_median=_med([x for r in raw for x in r["release_s"]]),
        )
    else:
        params["tasks"] = p[k]
    if k == "submit":
        stages = [s for r in raw for s in r["stages"]]
        params.update(elements=p["submit_elements"], input_bytes=p["submit_elements"] * 8, stages=stages)
        if stages:
            med = params["stages_median"] = {x: _med([s[x] for s in stages if x in s]) for x in stages[0]}
            names = [x for x in ("to_worker", "compute", "back", "put", "take") if x in med]
            show["stages"] = ", ".join(f"{x.replace('_', ' ')} {fmt_seconds(med[x])}" for x in names)
    elif k == "map":
        mib, med = p["map_arrays"] * p["map_bytes"] / MiB, _med(times)
        params.update(arrays=p["map_arrays"], array_bytes=p["map_bytes"], input_mib=mib)
        params.update(throughput_mib_s=[mib / t for t in times], throughput_mib_s_median=med and mib / med)
        show["MiB/s"] = f"{mib / med:.0f}" if med else "-"
    std = ctx["std_rounds"].setdefault(k, by_round if c == "stdlib" else {})
    ratios = [std[r] / v for r, v in by_round.items() if r in std and v]
    if c != "stdlib" and len(ratios) > 1:
        show["x stdlib by round"] = f"{min(ratios):.2f}..{max(ratios):.2f}"
    if wrong:
        show["value"] = "WRONG"
    rec = run.record(
        WL, ctx["case"][k], c, **SECONDS, values=times, raw=raw, show=show, params=params, ok=not wrong
    )
    rec["label"] = LABELS[c]


def _notes(
    run: Run, p: dict[str, Any], ran: list[str], info: dict[str, Any], method: str, took: float
) -> None:
    notes = {
        "": f"each measurement in a fresh spawned driver process per contender ({p['rounds']} round(s), "
        f"contenders interleaved, order rotated); executors made with mp_context={method!r} (the "
        f"platform's default), warmed up by one tiny task per worker; {p['submit_reps']} round trip(s) "
        f"and {p['map_reps']} map(s) per contender; the workload took {took:.0f} s. submit: from the "
        "submit call to the result's first and last element read (the input made before); 'stages': "
        f"{p['stamped_reps']} extra round trip(s) of add_one_stamped (the add, returning the worker's "
        "clock around it in a dict: npshmex ships only arrays and dicts of arrays through shared "
        "memory), not in the median: to worker = submit -> the add starts, back = the add ends -> the "
        "result usable here (for the hand-written one 'to worker' includes 'put': create + copy). "
        "map: from the map call to every result's first and last element read; MiB/s = input / wall",
        "npshmex": "npshmex monkeypatches concurrent.futures._base.Future when imported (in its driver "
        f"the class was {info.get('npshmex', {}).get('future_class') or '?'}): it runs only in drivers "
        "of its own; its submit puts array arguments in SharedArray segments and its Future un-shms "
        "results; its map sends tuples of arguments, which it does not recognise as arrays: there the "
        "arrays travel pickled through the pipe, as in the standard pool",
        "handwritten": "stdlib + SharedMemory by hand: the caller copies each input into a segment of "
        "its own and passes (name, shape, dtype); the worker attaches, computes into an output segment "
        "(np.add(x, 1, out=...)) and returns its name; the caller attaches it (zero-copy); closing and "
        "unlinking both comes after the clock stops (release time in latest.json); no resource-tracker "
        "registration is left; its map consumes a generator that copies each input just before its submit",
        NG: "ultradict_ng.futures.ProcessPoolExecutor with its default shm_threshold; its result arrays "
        "are views of a segment whose name is already removed (freed when the array is)",
        "small": f"small tasks: {p['small_reps']} repetition(s) of each row per driver, after the array "
        "cases, on the driver's pool of 2 workers; only the standard pool and ultradict_ng.futures (with "
        "no array the other two are the standard pool); x stdlib by round: the ratio of each round's medians",
    }
    for c, text in notes.items():
        if c in (*ran, "") or (c == "small" and set(ran) & set(SMALL_CONTENDERS)):
            run.note(text, WL)


def _vs(kind: str, base: str) -> dict[str, Any]:
    """The ratio ``base``'s median / ultradict_ng's: how many times faster ours is."""
    return {"num": pick(WL, base, case_kind=kind), "den": pick(WL, case_kind=kind)}


_FULL = cases(dict(zip(SIZES, FULL)))
register(
    Workload(
        name=WL,
        number=11,
        title="process pool: submit(add_one, big array) round trip; map over many 10 MiB arrays; small tasks",
        run=w_pool,
        aliases=("futures", "executor", "processpool", "processpoolexecutor"),
        own=ORDER,
        labels=LABELS,
        contender_aliases={
            **dict.fromkeys(("std", "concurrent.futures", "concurrent-futures"), "stdlib"),
            **dict.fromkeys(("hand", "hand-written", "by-hand"), "handwritten"),
        },
        versions=lambda: {c: T.version_of(c) for c in ORDER},
        targets=(
            Target("pool: submit round trip >= 4x faster than stdlib pool", 4.0, **_vs("submit", "stdlib")),
            Target(
                "pool: submit round trip faster than npshmex", 1.0, strict=True, **_vs("submit", "npshmex")
            ),
            Target("pool: map 64x10 MiB >= 3x stdlib pool's throughput", 3.0, **_vs("map", "stdlib")),
            *(
                Target(f"pool, small tasks: {_FULL[k]} >= 1x the standard pool", 1.0, **_vs(k, "stdlib"))
                for k in T.SMALL_KINDS
            ),
        ),
    )
)
