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
from . import registry, report
from .run import Run
from .util import log, shm_entries

DEFAULT_OUT = os.path.join("perf", "results")
#: The parts of workload 10 (``--wake-parts``; :mod:`perf.wake` runs them).
WAKE_PARTS = ("latency", "idle", "lock")


def _parse_list(text: str, valid: list[str], aliases: dict[str, str], what: str) -> list[str]:
    out: list[str] = []
    for raw in text.split(","):
        item = raw.strip().lower()
        if not item:
            continue
        item = aliases.get(item, item)
        if item not in valid:
            raise argparse.ArgumentTypeError(f"unknown {what} {raw!r}; choose from {', '.join(valid)}")
        out += [item] if item not in out else []
    if not out:
        raise argparse.ArgumentTypeError(f"no {what} given")
    return out


def _contenders() -> tuple[list[str], dict[str, str]]:
    keys = list(A.ORDER)
    aliases = dict(A.ALIASES)
    for w in registry.load():
        keys += [c for c in w.own if c not in keys]
        aliases.update(w.contender_aliases)
    return keys, aliases


def build_parser() -> argparse.ArgumentParser:
    workloads = registry.load()
    keys, _ = _contenders()
    p = argparse.ArgumentParser(
        prog="python -m perf",
        description="Benchmark ultradict_ng side by side with its peers, the same loop for each: "
        + "; ".join(f"{w.number} {w.name}: {w.title}" for w in workloads),
    )
    p.add_argument("--quick", action="store_true", help="short run: 0.1 s per measurement, smaller sizes")
    p.add_argument("--repeat", type=int, default=None, metavar="N", help="repetitions (default 5; 3 quick)")
    p.add_argument(
        "--only",
        default=None,
        metavar="WORKLOAD[,..]",
        help="workloads by name or number: " + ", ".join(f"{w.number}={w.name}" for w in workloads),
    )
    p.add_argument("--contenders", default=None, metavar="NAME[,..]", help="default all: " + ", ".join(keys))
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"results directory ({DEFAULT_OUT}/)")
    p.add_argument("--box", type=float, default=None, metavar="S", help="seconds per measurement (0.4; 0.1)")
    p.add_argument(
        "--wake-parts", default=None, metavar="PART[,..]", help="workload 10's parts: latency, idle, lock"
    )
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument(
        "--name-prefix",
        default="perf_",
        metavar="PREFIX",
        help="prefix of every dict name, then 12 hex digits (the test suite passes its own, "
        "so that its leak check sees them)",
    )
    return p


class _Terminated(BaseException):
    pass


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def _load_adapters(run: Run, wanted: list[str], versions: dict[str, str]) -> None:
    for key in wanted:
        adapter = A.ADAPTERS[key](run)
        try:
            adapter.load()
            versions[adapter.label] = adapter.version()
            run.adapters[key] = adapter
            if adapter.global_side_effects and adapter.module not in run.preload_modules:
                run.preload_modules.append(adapter.module)
        except A.Unavailable as exc:
            run.skipped[key] = str(exc)
        except Exception as exc:
            run.skipped[key] = f"failed to start: {exc!r}"
        label = A.ADAPTERS[key].label
        print(f"  {label:<29} {versions.get(label) or 'SKIPPED: ' + run.skipped.get(key, '')}")


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    workloads = registry.load()
    keys, contender_aliases = _contenders()
    try:
        names = [w.name for w in workloads]
        only = _parse_list(args.only, names, registry.aliases(), "workload") if args.only else names
        chosen = keys
        if args.contenders:
            chosen = _parse_list(args.contenders, keys, contender_aliases, "contender")
        wake_parts = _parse_list(args.wake_parts, list(WAKE_PARTS), {}, "part") if args.wake_parts else None
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    repeat = args.repeat if args.repeat is not None else (3 if args.quick else 5)
    if repeat < 1:
        parser.error("--repeat must be >= 1")
    box = args.box if args.box is not None else (0.1 if args.quick else 0.4)
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,39}", args.name_prefix):
        parser.error("--name-prefix: a letter, then at most 39 letters, digits, '_', '.', '-'")
    selected = [w for w in workloads if w.name in only]
    wanted = [c for c in A.ORDER if c in chosen] if any(w.adapters for w in selected) else []

    started = time.perf_counter()
    started_at = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    shm_before = set(shm_entries())
    load_at_start = os.getloadavg()
    run = Run(quick=args.quick, repeat=repeat, box=box, out=args.out, name_prefix=args.name_prefix)
    run.wake_parts = wake_parts
    run.only = [w.name for w in selected]
    old_term = signal.signal(signal.SIGTERM, _on_sigterm)
    status = 0
    interrupted = None
    versions: dict[str, str] = {}
    target_rows: list[dict[str, Any]] = []
    mode = "quick" if args.quick else "full"
    print(f"perf: ultradict_ng side by side ({mode} mode, {repeat} repetitions of ~{box:g} s); {started_at}")
    print(
        f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load average "
        f"{', '.join(f'{x:.2f}' for x in load_at_start)} (a shared machine: expect noise)"
    )
    try:
        src = report.source_digest()
        if "path" in src:
            print(
                f"ultradict_ng from {src['path']} (sha256 {src['sha256_of_py_and_c_files']}, newest "
                f"{src['newest_file_mtime']}; hot path: {src['hot_path_implementation']})"
            )
        if wanted:
            print("contenders:")
            _load_adapters(run, wanted, versions)
        for w in selected:
            if w.versions and not w.adapters and any(c in chosen for c in w.labels):
                got = w.versions()
                print(f"contenders of workload {w.number} ({w.name}):")
                for key in (c for c in w.own if c in chosen and c in w.labels):
                    print(f"  {w.labels[key]:<29} {got.get(key, '')}")
                    versions[f"{w.labels[key]} (workload {w.number})"] = got.get(key, "")
        sys.stdout.flush()
        adapters = [run.adapters[k] for k in wanted if k in run.adapters]
        for w in selected:
            if w.name in run.done:
                continue
            t0 = time.perf_counter()
            log(f"[{w.number}] {w.name}: {w.title}")
            if w.adapters:
                these: list[Any] = [a for a in adapters if a.runs(w.name)]
            else:
                these = [c for c in w.own if c in chosen]
            if not these or (not w.adapters and registry.NG in w.own and registry.NG not in chosen):
                log(f"    (none of the selected contenders takes part in {w.name})")
                continue
            group = [w.name, *(w.run(run, these) or ())]
            for g in (registry.WORKLOADS[n] for n in group):
                run.done.add(g.name)
                text = report.section(g, run.records, run.section_notes.get(g.name, []))
                if text:
                    print(text, flush=True)
            log(f"    ({', '.join(group)} took {time.perf_counter() - t0:.1f} s)")
        target_rows = registry.targets(run.records, args.quick)
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
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C during cleanup would leak
        try:
            problems = run.cleanup()
            gc.collect()
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
    wall = time.perf_counter() - started
    leak_lines, unattributed = _leaks(run, set(shm_entries()) - shm_before, wanted, problems)
    payload = {
        "harness": "perf (ultradict_ng)",
        "started_at": started_at,
        "wall_time_s": round(wall, 2),
        "mode": mode,
        "options": {
            "repeat": repeat,
            "box_s": box,
            "only": run.only,
            "contenders": chosen,
            "wake_parts": wake_parts or list(WAKE_PARTS),
            "argv": sys.argv[1:] if argv is None else list(argv),
        },
        "status": interrupted or "complete",
        "skipped_contenders": {A.ADAPTERS[k].label: v for k, v in run.skipped.items()},
        "notes": run.notes,
        "section_notes": run.section_notes,
        "alerts": run.alerts,
        "targets": target_rows,
        "leaks": leak_lines,
        "unattributed_new_shm": unattributed,
        "method": {
            "timed_loops": "gc disabled inside timed loops (as timeit); op counts calibrated to "
            "~box seconds with timeit.Timer.autorange; repetitions of contenders interleaved",
            "spread": "min-max of the repetitions (q1/q3 also stored)",
        },
        "records": run.records,
    }
    return _write(args, payload, versions, load_at_start, workloads, status, wall)


def _leaks(run: Run, new: set[str], wanted: list[str], problems: list[str]) -> tuple[list[str], list[str]]:
    """What this run left in /dev/shm, and new entries it cannot attribute; prints both."""
    ours = sorted(e for e in new if run.name_prefix in e)
    leak_lines = [f"segments of this run left in /dev/shm: {ours}"] if ours else []
    used_ultradict = any(k in ("ultradict", "ultradict_shared") for k in wanted if k not in run.skipped)
    orphans = A.ultra_orphans(sorted(new), run.psm_suspects) if used_ultradict else []
    if orphans:
        for e in orphans:
            A.unlink_segment(e)
        run.alert(
            f"UltraDict left {len(orphans)} full-dump segment(s) that no close() or unlink_by_name() "
            f"of its dicts removes: {orphans}; the harness unlinked them"
        )
        leak_lines.append(f"UltraDict orphaned 'psm_*' full-dump segment(s) (removed): {orphans}")
    exists = [e for e in sorted(new) if os.path.exists(os.path.join("/dev/shm", e)) and e not in orphans]
    unattributed = [
        f"new '{kind}' entries appeared during the run, not this run's (another program's?), left alone: {es}"
        for kind, es in (
            ("psm_*", [e for e in exists if e.startswith("psm_")]),
            ("sem.mp-*", [e for e in exists if e.startswith("sem.mp-")]),
        )
        if es
    ]
    leak_lines += ["cleanup: " + p for p in problems]
    print("\n== cleanup ==")
    for line in unattributed:
        print("  note: " + line)
    for line in leak_lines:
        print("  WARNING: " + line)
    if not leak_lines:
        print(f"  /dev/shm: nothing left by this run (names {run.name_prefix}*); its processes ended")
    for title, lines, mark in (("alerts (read these)", run.alerts, "!!!"), ("notes", run.notes, "-")):
        if lines:
            print(f"\n== {title} ==")
            for line in lines:
                print(f"  {mark} {line}")
    return leak_lines, unattributed


def _write(
    args: Any,
    payload: dict[str, Any],
    versions: dict[str, str],
    load_at_start: Any,
    workloads: list[registry.Workload],
    status: int,
    wall: float,
) -> int:
    try:
        os.makedirs(args.out, exist_ok=True)
        payload["machine"] = report.machine_info(versions, load_at_start)
        payload["machine"]["loadavg_at_end"] = os.getloadavg()
        json_path = os.path.join(args.out, "latest.json")
        report.write_json(json_path, payload)
        print(f"\nwrote {json_path}")
        pyperf_path = os.path.join(args.out, "latest.pyperf.json")
        why = report.write_pyperf(pyperf_path, payload["records"])
        print(f"wrote {pyperf_path}" if why is None else f"no pyperf suite: {why}")
        if not args.no_plot:
            png_path = os.path.join(args.out, "latest.png")
            why = report.plot(png_path, payload["records"], workloads)
            print(f"wrote {png_path}" if why is None else f"no plot: {why}")
    except Exception as exc:
        print(f"!!! could not write results: {exc!r}")
        status = status or 1
    print(f"wall time: {wall:.1f} s")
    return status
