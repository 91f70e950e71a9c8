"""The state of one harness run: options, adapters, results, and everything to clean up."""

from __future__ import annotations

import gc
import multiprocessing as mp
import queue
import secrets
import time
import traceback
from collections.abc import Iterable
from typing import Any, Callable, Optional

from . import procs
from .util import log, summarize

__all__ = ["Run", "Pool", "WorkerError"]


def compact_error(text: str) -> str:
    """A traceback's last exception line, plus the innermost frame when there is one."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else text
    frames = [line for line in lines if line.startswith("File ")]
    last = lines[-1]
    head = ""
    if " worker(s) failed; the first:" in lines[0]:
        head = lines[0].split("WorkerError: ", 1)[-1].split(";", 1)[0] + ": "
    if frames:
        where = frames[-1].replace("File ", "", 1)
        return f"{head}{last} (at {where})"
    return " ".join(lines)[:300]


def _reported(q: Any, body: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """In a spawned process (:meth:`Run.spawn`): put what ``body(*args)`` returns, or why it raised."""
    try:
        q.put(body(*args))
    except BaseException as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        q.put({"error": f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno} in {where.name})"})


class WorkerError(Exception):
    """A pool worker reported an exception or did not answer in time.

    ``fatal``: a worker died or did not answer (the pool must be replaced);
    otherwise every worker answered and the pool can be used further.
    """

    def __init__(self, msg: str, fatal: bool = True) -> None:
        super().__init__(msg)
        self.fatal = fatal


class Pool:
    """Spawned worker processes (see :func:`perf.procs.worker_main`), reused across contenders.

    Workers attach to a dict once per contender and detach before it is destroyed.
    Multiprocessing locks can only reach a spawned process at its creation:
    every adapter's ``inheritables()`` are passed then.
    """

    def __init__(self, run: Run, size: int) -> None:
        ctx = run.ctx
        self.res_q = ctx.Queue()
        self.cmd_qs = [ctx.Queue() for _ in range(size)]
        inherit: dict[str, Any] = {}
        for a in run.adapters.values():
            inherit.update(a.inheritables())
        self.procs = [
            ctx.Process(
                target=procs.worker_main,
                name=f"perf-worker-{i}",
                args=(i, q, self.res_q, inherit, run.preload_modules),
                daemon=True,
            )
            for i, q in enumerate(self.cmd_qs)
        ]
        for p in self.procs:
            p.start()
        self.size = size

    def send(self, wid: int, cmd: tuple[Any, ...]) -> None:
        self.cmd_qs[wid].put(cmd)

    def gather(
        self, count: int, timeout: float, kinds: Iterable[str] = ("ok",)
    ) -> list[tuple[int, str, Any]]:
        """``count`` answers of the given kinds; WorkerError on an error, a death or a timeout."""
        kinds = set(kinds)
        out: list[tuple[int, str, Any]] = []
        errors: list[str] = []
        deadline = time.monotonic() + timeout
        while len(out) + len(errors) < count:  # every worker answers once, result or error
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(
                    f"no answer from the worker processes within {timeout:.0f} s"
                    + (f"; earlier: {errors[0]}" if errors else "")
                )
            try:
                wid, kind, payload = self.res_q.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead:
                    raise WorkerError(
                        f"worker process(es) died: {', '.join(dead)} "
                        f"(exit codes {[p.exitcode for p in self.procs]})"
                    ) from None
                continue
            if kind == "error":
                errors.append(f"worker {wid}: {payload}")
            elif kind not in kinds:
                errors.append(f"worker {wid}: unexpected answer {kind!r}")
            else:
                out.append((wid, kind, payload))
        if errors:
            raise WorkerError(
                f"{len(errors)} of {count} worker(s) failed; the first: {errors[0]}", fatal=False
            )
        return out

    def attach(self, wids: Iterable[int], spec: dict[str, Any], timeout: float = 120.0) -> None:
        wids = list(wids)
        for w in wids:
            self.send(w, ("attach", spec))
        self.gather(len(wids), timeout)

    def detach(self, wids: Iterable[int], name: str, timeout: float = 60.0) -> None:
        wids = list(wids)
        for w in wids:
            self.send(w, ("close", name))
        self.gather(len(wids), timeout)

    def stop(self, grace: float = 5.0) -> None:
        for w, p in enumerate(self.procs):
            if p.is_alive():
                try:
                    self.send(w, ("exit",))
                except Exception:
                    pass
        deadline = time.monotonic() + grace
        for p in self.procs:
            p.join(max(0.1, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        for q in [*self.cmd_qs, self.res_q]:
            try:
                q.close()
                q.join_thread()
            except Exception:
                pass


class Run:
    """Options, the adapters in use, the collected records, and the cleanup registry."""

    def __init__(
        self,
        *,
        quick: bool,
        repeat: int,
        box: float,
        out: str,
        name_prefix: str = "perf_",
        wake_parts: Optional[list[str]] = None,
    ) -> None:
        self.quick = quick
        #: The parts of workload 10 to run (perf.wake.PARTS; None: all).
        self.wake_parts = wake_parts
        self.repeat = repeat
        #: The workloads selected, in run order; those already measured.
        self.only: list[str] = []
        self.done: set[str] = set()
        self.box = box
        self.out = out
        self.ctx = mp.get_context("spawn")
        self.token = secrets.token_hex(2)
        self.prefix = name_prefix
        self._seq = 0
        self.owned: dict[str, tuple[Callable[[], Any], str]] = {}
        self.resources: dict[str, Callable[[], Any]] = {}
        self.adapters: dict[str, Any] = {}
        self.skipped: dict[str, str] = {}
        self.records: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.section_notes: dict[str, list[str]] = {}
        self.alerts: list[str] = []
        self.preload_modules: list[str] = []
        self.pool: Optional[Pool] = None
        self.children: list[Any] = []
        self.single_lock_rate: dict[str, float] = {}
        #: psm_* segments that appeared while worker processes used UltraDict /
        #: shared-memory-dict (checked for orphans at the end)
        self.psm_suspects: set = set()

    # -- names and cleanup registry ------------------------------------------------------
    @property
    def name_prefix(self) -> str:
        return self.prefix + self.token

    def new_name(self) -> str:
        """prefix + 12 hex digits: this run's 4-digit token, then a counter."""
        self._seq += 1
        return f"{self.name_prefix}{self._seq:08x}"

    def own(self, name: str, cleanup: Callable[[], Any], label: str) -> None:
        self.owned[name] = (cleanup, label)

    def disown(self, name: str) -> None:
        self.owned.pop(name, None)

    def own_resource(self, key: str, stop: Callable[[], Any]) -> None:
        self.resources[key] = stop

    # -- notes and records ----------------------------------------------------------------
    def note(self, text: str, section: Optional[str] = None) -> None:
        target = self.notes if section is None else self.section_notes.setdefault(section, [])
        if text not in target:
            target.append(text)
            if section is None:
                log("note: " + text)

    def alert(self, text: str) -> None:
        """Something the reader must not miss (a count mismatch, a crash)."""
        self.alerts.append(text)
        log("!!! " + text)

    def record(
        self,
        wl: str,
        case: str,
        contender: str,
        *,
        unit: str,
        better: str,
        values: list[float],
        raw: Optional[list[Any]] = None,
        show: Optional[dict[str, str]] = None,
        params: Optional[dict[str, Any]] = None,
        error: Optional[str] = None,
        skipped: Optional[str] = None,
        ok: Optional[bool] = None,
        note_only: bool = False,
    ) -> dict[str, Any]:
        label = self.adapters[contender].label if contender in self.adapters else contender
        rec: dict[str, Any] = {
            "workload": wl,
            "case": case,
            "contender": contender,
            "label": label,
            "unit": unit,
            "better": better,
            "values": list(values),
            "raw": raw or [],
            **summarize(values),
            "show": show or {},
            "params": params or {},
            "error": error,
            "skipped": skipped,
            "ok": ok,
            "note_only": note_only,
        }
        self.records.append(rec)
        return rec

    def fail(self, wl: str, case: str, contender: str, exc: BaseException, *, unit: str, better: str) -> None:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        label = self.adapters[contender].label if contender in self.adapters else contender
        self.alert(f"{label} failed in workload {wl} ({case}): {compact_error(text)}")
        rec = self.record(wl, case, contender, unit=unit, better=better, values=[], error=text)
        rec["error_short"] = compact_error(text)

    # -- processes ------------------------------------------------------------------------
    def get_pool(self, size: int = 4) -> Pool:
        if self.pool is None:
            self.pool = Pool(self, size)
        return self.pool

    def drop_pool(self) -> None:
        """After a worker error or timeout: end the workers (a fresh pool comes next time)."""
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool.kill()

    def call(self, body: Callable[..., Any], *args: Any, timeout: float = 1800.0) -> dict[str, Any]:
        """``body(*args)`` in a fresh spawned process: the dict it returned, or ``{"error": why}``."""
        return self.spawn(body, [args], timeout)[0]

    def spawn(self, body: Callable[..., Any], arg_sets: list[tuple[Any, ...]], timeout: float) -> list[Any]:
        """``body(*args)`` for each ``args``, each in a fresh spawned process, all at once.

        What each returned, in the order they answered; ``{"error": why}`` for one
        that raised, died without answering (SIGKILL, a crash) or ran past ``timeout``.
        """
        q = self.ctx.Queue()
        # Not daemonic: a child may start processes of its own (durable's group writers).
        name = f"perf-{body.__name__}"
        ps = [self.ctx.Process(target=_reported, args=(q, body, a), name=name) for a in arg_sets]
        self.children += ps  # before start: an interruption after the fork still finds them
        out: list[Any] = []
        try:
            for p in ps:
                p.start()
            deadline = time.monotonic() + timeout
            while len(out) < len(ps):
                try:
                    out.append(q.get(timeout=1.0))
                    continue
                except queue.Empty:
                    pass
                dead = [p.exitcode for p in ps if p.exitcode not in (None, 0)]
                if dead or not any(p.is_alive() for p in ps) or time.monotonic() > deadline:
                    why = f"died (exit code {dead[0]})" if dead else f"gave no answer within {timeout:.0f} s"
                    out += [{"error": f"a child process {why}"}] * (len(ps) - len(out))
            return out
        finally:
            for p in ps:
                self.reap(p, 60)
                self.children.remove(p)
            q.close()

    def reap(self, proc: Any, timeout: float = 10.0) -> None:
        proc.join(timeout)
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)

    # -- teardown -------------------------------------------------------------------------
    def cleanup(self) -> list[str]:
        """End every process, stop every server, unlink every segment; returns problems."""
        problems: list[str] = []
        if self.pool is not None:
            pool, self.pool = self.pool, None
            try:
                pool.stop()
            except Exception as exc:
                problems.append(f"stopping the worker pool: {exc!r}")
        for proc in self.children:
            try:
                self.reap(proc, 1.0)
            except Exception as exc:
                problems.append(f"ending {proc}: {exc!r}")
        self.children.clear()
        for name, (fn, label) in list(self.owned.items()):
            try:
                fn()
            except Exception as exc:
                problems.append(f"unlinking {label} dict {name}: {exc!r}")
            self.owned.pop(name, None)
        for a in list(self.adapters.values()):
            try:
                a.shutdown()
            except Exception as exc:
                problems.append(f"shutting down {a.label}: {exc!r}")
        for key, stop in list(self.resources.items()):
            try:
                stop()
            except Exception as exc:
                problems.append(f"stopping {key}: {exc!r}")
            self.resources.pop(key, None)
        # Drop multiprocessing objects now so that their finalizers release their
        # named semaphores (otherwise the resource tracker warns about them at exit).
        self.adapters.clear()
        gc.collect()
        return problems
