"""``python -m perf``: options, the run, cleanup and the leak check."""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import os
import re
import signal
import sys
import time
from typing import Any, Optional

from . import adapters as A
from . import bigdict as BD
from . import cache as CA
from . import documents as DO
from . import durable as DU
from . import pool as P
from . import redis_backend as RB
from . import report
from . import transactions as TX
from .run import Run
from .util import log, shm_entries
from .wake import PARTS as WAKE_PARTS
from .workloads import ALIASES as WL_ALIASES
from .workloads import NUMBERS as WL_NUMBERS
from .workloads import RUNNERS, WORKLOADS
from .workloads import TITLES as WL_TITLES

# Workloads 11 (perf.pool) and 12 (perf.redis_backend) have contenders of their own,
# which are no adapters; workload 13 (perf.transactions) compares ultradict_ng with itself.
# Workload 14 (perf.bigdict) has its own contenders too (py-lmdb, ultradict_ng's table).
ALL_WORKLOADS = WORKLOADS + [P.ENTRY, RB.ENTRY, TX.ENTRY, BD.ENTRY, CA.ENTRY, DU.ENTRY, DO.ENTRY]
NUMBERS = {
    **WL_NUMBERS,
    P.WL: P.NUMBER,
    RB.WL: RB.NUMBER,
    TX.WL: TX.NUMBER,
    BD.WL: BD.NUMBER,
    CA.WL: CA.NUMBER,
    DU.WL: DU.NUMBER,
    DO.WL: DO.NUMBER,
}
TITLES = {
    **WL_TITLES,
    P.WL: P.TITLE,
    RB.WL: RB.TITLE,
    TX.WL: TX.TITLE,
    BD.WL: BD.TITLE,
    CA.WL: CA.TITLE,
    DU.WL: DU.TITLE,
    DO.WL: DO.TITLE,
}
ALIASES = {
    **WL_ALIASES,
    **P.ALIASES,
    **RB.ALIASES,
    **TX.ALIASES,
    **BD.ALIASES,
    **CA.ALIASES,
    **DU.ALIASES,
    **DO.ALIASES,
}
CONTENDERS = list(A.ORDER) + P.OWN_CONTENDERS + RB.OWN_CONTENDERS
CONTENDER_ALIASES = {**A.ALIASES, **P.CONTENDER_ALIASES, **RB.CONTENDER_ALIASES}
OWN_RUNNERS = (P.WL, RB.WL, TX.WL, BD.WL, CA.WL, DU.WL, DO.WL)  # workloads that need no adapter

DEFAULT_OUT = os.path.join("perf", "results")


def _parse_list(
    text: str, valid: list[str], aliases: dict[str, str], what: str, numbers: Optional[dict[str, int]] = None
) -> list[str]:
    out: list[str] = []
    by_number = {str(v): k for k, v in (numbers or {}).items()}
    for raw in text.split(","):
        item = raw.strip().lower()
        if not item:
            continue
        item = by_number.get(item, aliases.get(item, item))
        if item not in valid:
            raise argparse.ArgumentTypeError(f"unknown {what} {raw!r}; choose from {', '.join(valid)}")
        if item not in out:
            out.append(item)
    if not out:
        raise argparse.ArgumentTypeError(f"no {what} given")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m perf",
        description="Benchmark ultradict_ng against UltraDict, shared-memory-dict, "
        "multiprocessing.Manager, Redis and a plain dict, with the same loops; "
        "and, for large values between processes (workload 9), against raw "
        "shared memory, pickle 5 out-of-band buffers, SharedArray, "
        "InterProcessPyObjects, multiprocessing.Pipe and Queue; and, for wake-ups "
        "(workload 10), wait_for_change against polling, multiprocessing.Event, "
        "Condition, Pipe and Redis pub/sub; and ultradict_ng.futures.ProcessPoolExecutor "
        "against the standard pool, npshmex and SharedMemory by hand (workload 11); "
        "and a big dict read by fresh processes against py-lmdb (workload 14).",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="short run (about a minute): 0.1 s per measurement, smaller sizes, 3 repetitions "
        "(workload 9: 1 MiB and 10 MiB values, 1 repetition; workload 10: 200 "
        "round trips, 2 s idle window, 1 s per lock round; workload 11: 2e6 "
        "elements and 16 arrays of 1 MiB, 3 and 2 repetitions; workload 12: one "
        "round, fewer locked increments, one takeover with a 0.5 s lease, 200 "
        "staleness writes)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        metavar="N",
        help="repetitions of each measurement (default 5; 3 with --quick)",
    )
    p.add_argument(
        "--only",
        default=None,
        metavar="WORKLOAD[,..]",
        help="workloads by name or number: " + ", ".join(f"{no}={name}" for name, no, _ in ALL_WORKLOADS),
    )
    p.add_argument(
        "--contenders",
        default=None,
        metavar="NAME[,..]",
        help="contenders (default all): " + ", ".join(A.ORDER) + "; workload 11 "
        "only: " + ", ".join(P.OWN_CONTENDERS) + " (and ultradict_ng); workload 12 "
        "only: " + ", ".join(RB.OWN_CONTENDERS) + " (and ultradict_ng, redis)",
    )
    p.add_argument(
        "--out",
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"directory for latest.json and latest.png (default {DEFAULT_OUT}/)",
    )
    p.add_argument(
        "--box",
        type=float,
        default=None,
        metavar="SECONDS",
        help="target loop time of one measurement (default 0.4; 0.1 with --quick)",
    )
    p.add_argument(
        "--wake-parts",
        default=None,
        metavar="PART[,..]",
        help="the parts of workload 10 to run (default all): latency (wake-up "
        "latency), idle (idle waiters' CPU), lock (locked increments in 1-8 "
        "processes)",
    )
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument(
        "--name-prefix",
        default="perf_",
        metavar="PREFIX",
        help="prefix of every dict name, followed by 12 hex digits (default perf_). "
        "The test suite passes udng_ so that its leak check sees them; the default "
        "differs because that check also deletes udng_<12 hex> segments that "
        "appear while any test runs, including a concurrent benchmark's",
    )
    return p


class _Terminated(BaseException):
    pass


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        only = (
            _parse_list(args.only, [w for w, _, _ in ALL_WORKLOADS], ALIASES, "workload", NUMBERS)
            if args.only
            else [w for w, _, _ in ALL_WORKLOADS]
        )
        chosen = (
            _parse_list(args.contenders, CONTENDERS, CONTENDER_ALIASES, "contender")
            if args.contenders
            else list(CONTENDERS)
        )
        wake_parts = (
            _parse_list(args.wake_parts, list(WAKE_PARTS), {}, "part of workload 10")
            if args.wake_parts
            else None
        )
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    repeat = args.repeat if args.repeat is not None else (3 if args.quick else 5)
    if repeat < 1:
        parser.error("--repeat must be >= 1")
    box = args.box if args.box is not None else (0.1 if args.quick else 0.4)
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,39}", args.name_prefix):
        parser.error("--name-prefix: a letter, then at most 39 letters, digits, '_', '.', '-'")
    only = [w for w, _, _ in ALL_WORKLOADS if w in only]  # always in workload order
    wanted = [c for c in A.ORDER if c in chosen]
    pool_wanted = [c for c in P.ORDER if c in chosen] if P.WL in only else []
    redis_wanted = [c for c in RB.ORDER if c in chosen] if RB.WL in only else []
    if not any(w not in OWN_RUNNERS for w in only):
        wanted = []  # workloads 11-13 alone: no adapter (server, Manager, peer import) is needed

    started = time.perf_counter()
    started_at = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    shm_before = set(shm_entries())
    load_at_start = os.getloadavg()
    run = Run(
        quick=args.quick,
        repeat=repeat,
        box=box,
        out=args.out,
        name_prefix=args.name_prefix,
        wake_parts=wake_parts,
    )
    old_term = signal.signal(signal.SIGTERM, _on_sigterm)
    status = 0
    interrupted = None
    versions: dict[str, str] = {}
    target_rows: list[dict[str, Any]] = []
    printed: list[str] = []
    print(
        f"perf: ultradict_ng side-by-side benchmark ({'quick' if args.quick else 'full'} mode, "
        f"{repeat} repetitions, ~{box:g} s per measurement); started {started_at}"
    )
    print(
        f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"load average {', '.join(f'{x:.2f}' for x in load_at_start)} (a shared machine: expect noise)"
    )
    try:
        # -- contenders ------------------------------------------------------------------
        for key in wanted:
            adapter = A.ADAPTERS[key](run)
            run.adapters[key] = adapter
            try:
                adapter.load()
                versions[adapter.label] = adapter.version()
                if adapter.global_side_effects and adapter.module not in run.preload_modules:
                    run.preload_modules.append(adapter.module)
            except A.Unavailable as exc:
                run.skipped[key] = str(exc)
                del run.adapters[key]
            except Exception as exc:
                run.skipped[key] = f"failed to start: {exc!r}"
                del run.adapters[key]
        src = report.source_digest()
        if "path" in src:
            print(
                f"ultradict_ng measured from {src['path']} (py and c files sha256 "
                f"{src['sha256_of_py_and_c_files']}, newest modified {src['newest_file_mtime']}; "
                f"hot path: {src['hot_path_implementation']})"
            )
        if wanted:
            print("contenders:")
        for key in wanted:
            if key in run.adapters:
                print(f"  {A.ADAPTERS[key].label:<29} {versions.get(A.ADAPTERS[key].label, '')}")
            else:
                print(f"  {A.ADAPTERS[key].label:<29} SKIPPED: {run.skipped[key]}")
        if wanted and "ultradict_ng" not in run.adapters:
            print("  (ultradict_ng not selected: no ratios)")
        if pool_wanted:
            pool_versions = P.versions()
            print(f"contenders of workload {P.NUMBER} ({P.WL}):")
            for key in pool_wanted:
                print(f"  {P.LABELS[key]:<29} {pool_versions.get(key, '')}")
                versions[f"{P.LABELS[key]} (workload {P.NUMBER})"] = pool_versions.get(key, "")
        if redis_wanted:
            rb_versions = RB.versions()
            print(f"contenders of workload {RB.NUMBER} ({RB.WL}):")
            for key in redis_wanted:
                print(f"  {RB.LIST_LABELS[key]:<29} {rb_versions.get(key, '')}")
                versions[f"{RB.LIST_LABELS[key]} (workload {RB.NUMBER})"] = rb_versions.get(key, "")
        sys.stdout.flush()
        adapters = [run.adapters[k] for k in wanted if k in run.adapters]

        # -- workloads -------------------------------------------------------------------
        done = set()
        for wl in only:
            if wl in done:
                continue
            t0 = time.perf_counter()
            log(f"[{NUMBERS[wl]}] {wl}: {TITLES[wl]}")
            if wl == P.WL and not pool_wanted:
                log(f"    (none of the selected contenders takes part in {wl})")
                done.add(wl)
                continue
            if wl in (TX.WL, BD.WL, CA.WL, DU.WL, DO.WL) and "ultradict_ng" not in chosen:
                log(f"    (none of the selected contenders takes part in {wl})")
                done.add(wl)
                continue
            if wl == RB.WL and not redis_wanted:
                log(f"    (none of the selected contenders takes part in {wl})")
                done.add(wl)
                continue
            if wl not in OWN_RUNNERS and not any(a.runs(wl) for a in adapters):
                log(f"    (none of the selected contenders takes part in {wl})")
                done.add(wl)
                continue
            if wl in ("attach", "growth") and "attach" in only and "growth" in only:
                from .workloads import w_sized

                w_sized(run, [a for a in adapters if a.runs(wl)], True, True)  # shared seeded dicts
                group = ["attach", "growth"]
            elif wl == P.WL:
                P.w_pool(run, pool_wanted)
                group = [wl]
            elif wl == RB.WL:
                RB.w_redis(run, redis_wanted)
                group = [wl]
            elif wl == TX.WL:
                TX.w_transactions(run, ["ultradict_ng"])
                group = [wl]
            elif wl == BD.WL:
                peers = {"ultradict_shared": "UltraDict", "manager": "Manager"}
                BD.w_bigdict(
                    run,
                    ["ultradict_ng", "uncached", "table", "lmdb"] + [peers[c] for c in peers if c in chosen],
                )
                group = [wl]
            elif wl == CA.WL:
                CA.w_cache(run, ["ultradict_ng"])  # (its contenders are its own: perf.cache)
                group = [wl]
            elif wl == DU.WL:
                DU.w_durable(run, ["ultradict_ng"])  # (its contenders are its own: perf.durable)
                group = [wl]
            elif wl == DO.WL:
                DO.w_documents(run, ["ultradict_ng"])  # (its contenders are its own: perf.documents)
                group = [wl]
            else:
                RUNNERS[wl](run, [a for a in adapters if a.runs(wl)])
                group = [wl]
            for g in group:
                done.add(g)
                text = report.section(run.records, g, NUMBERS[g], TITLES[g], run.section_notes.get(g, []))
                if text:
                    print(text)
                    printed.append(g)
                sys.stdout.flush()
            log(f"    ({', '.join(group)} took {time.perf_counter() - t0:.1f} s)")
        target_rows = report.targets(run.records, args.quick)
        print(report.targets_text(target_rows))
    except (KeyboardInterrupt, _Terminated) as exc:
        interrupted = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else "terminated (SIGTERM)"
        status = 130 if isinstance(exc, KeyboardInterrupt) else 143
        print(f"\n!!! {interrupted}: cleaning up; partial results are saved", flush=True)
    except Exception:
        import traceback

        status = 1
        interrupted = "harness error"
        traceback.print_exc()
        print("\n!!! harness error: cleaning up; partial results are saved", flush=True)
    finally:
        # Ctrl-C during cleanup would leak: ignore it until everything is gone.
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            problems = run.cleanup()
            gc.collect()
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
    wall = time.perf_counter() - started

    # -- leaks ----------------------------------------------------------------------------
    new = sorted(set(shm_entries()) - shm_before)
    ours = [e for e in new if run.name_prefix in e]
    leak_lines = []
    if ours:
        leak_lines.append(f"segments of this run left in /dev/shm: {ours}")
    orphans = (
        A.ultra_orphans(new, run.psm_suspects)
        if any(k in ("ultradict", "ultradict_shared") for k in wanted if k not in run.skipped)
        else []
    )
    if orphans:
        for e in orphans:
            A.unlink_segment(e)
        run.alert(
            f"UltraDict left {len(orphans)} full-dump segment(s) behind that no close() or "
            f"unlink_by_name() of its dicts removes (unnamed, no longer referenced by any "
            f"control block): {orphans}; the harness unlinked them"
        )
        leak_lines.append(
            f"UltraDict orphaned {len(orphans)} 'psm_*' full-dump segment(s) "
            f"(removed by the harness): {orphans}"
        )
    psm = [
        e
        for e in new
        if e.startswith("psm_") and e not in orphans and os.path.exists(os.path.join("/dev/shm", e))
    ]
    unattributed = []
    if psm:
        unattributed.append(
            f"new unnamed 'psm_*' segments appeared during the run, not recognised "
            f"as UltraDict dumps (another program's?), left alone: {psm}"
        )
    sems = [e for e in new if e.startswith("sem.mp-") and os.path.exists(os.path.join("/dev/shm", e))]
    if sems:
        unattributed.append(
            f"new multiprocessing semaphores in /dev/shm (this run releases its "
            f"own at exit; another program's?), left alone: {sems}"
        )
    for p in problems:
        leak_lines.append("cleanup: " + p)
    print("\n== cleanup ==")
    for line in unattributed:
        print("  note: " + line)
    if leak_lines:
        for line in leak_lines:
            print("  WARNING: " + line)
    else:
        print(
            f"  /dev/shm: nothing left by this run (names {run.name_prefix}*; "
            f"{len(shm_before)} entries before, {len(set(shm_entries()))} after, others' are not ours)"
        )
        print(
            "  processes: worker pool, probes, readers, waiters, pool drivers and their "
            "executors' workers, Manager server and redis-server ended"
        )
    if run.alerts:
        print("\n== alerts (read these) ==")
        for a in run.alerts:
            print("  !!! " + a)
    if run.notes:
        print("\n== notes ==")
        for n in run.notes:
            print("  - " + n)

    # -- files ----------------------------------------------------------------------------
    try:
        os.makedirs(args.out, exist_ok=True)
        meta = report.machine_info(versions, load_at_start)
        try:
            meta["loadavg_at_end"] = os.getloadavg()
        except OSError:
            pass
        payload = {
            "harness": "perf (ultradict_ng)",
            "started_at": started_at,
            "wall_time_s": round(wall, 2),
            "mode": "quick" if args.quick else "full",
            "options": {
                "repeat": repeat,
                "box_s": box,
                "only": only,
                "contenders": wanted,
                "pool_contenders": pool_wanted,
                "redis_contenders": redis_wanted,
                "wake_parts": wake_parts or list(WAKE_PARTS),
                "argv": sys.argv[1:] if argv is None else list(argv),
            },
            "status": interrupted or "complete",
            "machine": meta,
            "skipped_contenders": {A.ADAPTERS[k].label: v for k, v in run.skipped.items()},
            "notes": run.notes,
            "section_notes": run.section_notes,
            "alerts": run.alerts,
            "targets": target_rows,
            "leaks": leak_lines,
            "unattributed_new_shm": unattributed,
            "method": {
                "timed_loops": "gc disabled inside timed loops (as timeit); op counts calibrated to "
                "~box seconds; repetitions of contenders interleaved",
                "spread": "min-max of the repetitions (q1/q3 also stored)",
            },
            "records": run.records,
        }
        json_path = os.path.join(args.out, "latest.json")
        report.write_json(json_path, payload)
        print(f"\nwrote {json_path}")
        if not args.no_plot:
            png_path = os.path.join(args.out, "latest.png")
            why = report.plot(png_path, run.records, ALL_WORKLOADS)
            print(f"wrote {png_path}" if why is None else f"no plot: {why}")
            if any(r["workload"] == BD.WL for r in run.records):
                from . import bigdict_report

                bd_path = os.path.join(args.out, "bigdict.png")
                why = bigdict_report.plot(bd_path, run.records)
                print(f"wrote {bd_path}" if why is None else f"no plot of workload 14: {why}")
        if any(r["workload"] == CA.WL for r in run.records):  # workload 15: <out>/cache/
            from . import cache_report

            print("\n".join(cache_report.write(args.out, payload, not args.no_plot)))
    except Exception as exc:
        print(f"!!! could not write results: {exc!r}")
        status = status or 1
    print(f"wall time: {wall:.1f} s")
    return status
