"""Workload 12 (``redis``): ultradict_ng's Redis backend against redis-py, pottery and redis-dict.

Everything runs on loopback against ONE private ``redis-server`` (the one the
``redis`` adapter started for workloads 1-5 and 10 when it runs, else one
started here and stopped at the end of the workload; see
:mod:`perf.redis_server`).  Five parts:

1. **hot-key reads**: raw redis-py ``r.get(k)`` (a ``redis.Redis`` client with
   its defaults), ``SharedDict(..., backend=url)`` ``d[k]`` with
   ``reads="fresh"`` (the default: one validating round trip per read) and
   with ``reads="cached"`` (no round trip), pottery's ``RedisDict`` ``d[k]``
   and redis-dict's ``RedisDict`` ``d[k]``;
2. **writes** ``d[k] = i`` over 1024 rotating keys: raw ``r.set(k, i)``, ours
   (a fresh-mode handle), pottery, redis-dict;
3. **locked increments**: 4 processes each doing ``n`` times ``with d.lock:
   d[k] += 1`` (ours: the children attach by name, ``SharedDict(name=...,
   backend=url)``) against pottery's ``Redlock(key=..., masters={r})`` around
   its ``RedisDict`` (each child builds its own client); the final count must
   be exactly ``4n``; aggregate ops/s from the first child's start to the last
   one's end;
4. **dead lock holder takeover**: a child takes ``d.lock`` and is SIGKILLed
   while holding it (at a random moment of its lease-renewal cycle); the time
   from the kill until a process that was already waiting in ``with d.lock:``
   gets in (the default lease, 3 s, and 1 s; ``--quick``: 0.5 s only);
5. **staleness of cached reads**: one process writes a counter ``d["t"] = i``
   (pauses of 0.5-1.5 ms), another reads ``d["t"]`` in a loop; the delay from
   the write call's return in the writer to the value's first sight in the
   reader (a value the reader skipped counts as seen when a later one was),
   per write: p50, p99, max.  A fresh-mode reader is measured alike as the
   reference (full mode).

Each contender of parts 1-2 runs in a fresh spawned process per round (all of a
round's processes are started together, then measured one after the other,
order rotated per round; pottery monkeypatches ``json.dumps`` on import and a
cached handle runs a listener thread, so none shares a process with
another).  Every child process is spawned (the harness's start method).
Full mode: ``--repeat`` rounds of one repetition (parts 1-2), 3 rounds (part
3), 3 takeovers per lease; ``--quick``: one round of ``--repeat``
repetitions, fewer increments, one takeover with a 0.5 s lease, 200 writes.

Targets (reported, never asserted: machines are noisy): fresh reads >= 1x raw
GET; cached reads >= 100x raw GET; writes >= 0.8x raw SET and >= 2x pottery;
4-process locked increments >= 2x pottery with exact counts; takeover within
lease + 1 s.

Cleanup: every child is ended (SIGTERM, then SIGKILL) and reaped; every key
this workload made carries the run's name prefix and is removed at the end
(``SCAN`` + ``UNLINK``), also after an exception (registered with the run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import time
from typing import Any, Optional

from . import redis_children as C
from .run import Run
from .util import fmt_rate, fmt_seconds, log, percentile

WL = "redis"
NUMBER = 12
TITLE = (
    "Redis backend vs redis-py, pottery, redis-dict: reads, writes, 4-process locked "
    "increments, dead-holder takeover, cached-read staleness"
)
ENTRY: tuple[str, int, str] = (WL, NUMBER, TITLE)
ALIASES = {"redis-backend": WL, "redis_backend": WL, "backend": WL}

#: ``--contenders`` names that take part (``redis``: raw redis-py; ``ultradict_ng``: both read modes).
ORDER = ["redis", "ultradict_ng", "pottery", "redis_dict"]
OWN_CONTENDERS = ["pottery", "redis_dict"]
CONTENDER_ALIASES = {"redis-dict": "redis_dict", "redisdict": "redis_dict"}

#: Table rows (record ``contender``), in order.
ROWS = ["redis", "ultradict_ng", "ultradict_ng:cached", "pottery", "redis_dict"]
READ, WRITE, LOCK, TAKEOVER, STALE = "read", "write", "lock", "takeover", "staleness"
LABELS: dict[str, dict[str, str]] = {
    READ: {
        "redis": "redis-py r.get (raw GET)",
        "ultradict_ng": "SharedDict reads='fresh'",
        "ultradict_ng:cached": "SharedDict reads='cached'",
        "pottery": "pottery RedisDict",
        "redis_dict": "redis-dict RedisDict",
    },
    WRITE: {
        "redis": "redis-py r.set (raw SET)",
        "ultradict_ng": "SharedDict (fresh handle)",
        "pottery": "pottery RedisDict",
        "redis_dict": "redis-dict RedisDict",
    },
    LOCK: {"ultradict_ng": "SharedDict, with d.lock", "pottery": "pottery Redlock + RedisDict"},
    TAKEOVER: {"ultradict_ng": "SharedDict d.lock"},
    STALE: {"ultradict_ng:cached": "SharedDict reads='cached'", "ultradict_ng": "SharedDict reads='fresh'"},
}
#: Targets (the report only).
FRESH_VS_GET = 1.0
CACHED_VS_GET = 100.0
WRITE_VS_SET = 0.8
WRITE_VS_POTTERY = 2.0
LOCK_VS_POTTERY = 2.0
TAKEOVER_SLACK = 1.0  # s over the lease
DEFAULT_LEASE = 3.0  # ultradict_ng's default (redis_backend/layout.py)
PROCS = 4


def plan(run: Run) -> dict[str, Any]:
    if run.quick:
        return {
            "rw_rounds": 1,
            "rw_passes": run.repeat,
            "lock_rounds": 1,
            "n": {"ultradict_ng": 100, "pottery": 5},
            "leases": [0.5],
            "takeover_reps": 1,
            "stale": [("ultradict_ng:cached", 0.0, 150), ("ultradict_ng:cached", 1e-4, 150)],
            "gap": (0.0005, 0.0015),
            "rw_box": run.box / 2,
        }
    return {
        "rw_rounds": run.repeat,
        "rw_passes": 2,
        "lock_rounds": min(run.repeat, 3),
        "n": {"ultradict_ng": 500, "pottery": 100},
        "leases": [DEFAULT_LEASE, 1.0],
        "takeover_reps": min(run.repeat, 3),
        "stale": [
            ("ultradict_ng:cached", 0.0, 2000),
            ("ultradict_ng:cached", 1e-4, 1000),
            ("ultradict_ng", 0.0, 500),
        ],
        "gap": (0.0005, 0.0015),
        "rw_box": run.box,
    }


def read_case() -> str:
    return "hot-key read d[k] (raw: r.get(k))"


def write_case() -> str:
    return f"write d[k] = i over {C.WRITE_KEYS} rotating keys (raw: r.set(k, i))"


def lock_case(p: dict[str, Any]) -> str:
    return f"{PROCS} processes x n: with lock: d[k] += 1 (aggregate)"


def takeover_case(lease: float) -> str:
    return f"dead holder (SIGKILL) -> waiter in, lease {lease:g} s"


STALE_MODE = {"ultradict_ng:cached": "reads='cached'", "ultradict_ng": "reads='fresh'"}


def stale_label(row: str, pause: float) -> str:
    how = "busy reader" if not pause else f"reader sleeps {pause * 1e3:g} ms"
    return f"SharedDict {STALE_MODE[row]}, {how}"


def stale_case(row: str, pause: float) -> str:
    return f"staleness: write returned -> visible to a {STALE_MODE[row]} reader, " + (
        "busy loop" if not pause else f"time.sleep({pause:g}) between reads"
    )


# -- availability, versions -----------------------------------------------------------------


def _installed(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def _missing(row: str) -> Optional[str]:
    """Why a row cannot run here (checked without importing pottery, which patches json.dumps)."""
    if row == "pottery" and not _installed("pottery"):
        return "pottery is not installed (pip install pottery)"
    if row == "redis_dict" and not _installed("redis_dict"):
        return "redis-dict is not installed (pip install redis-dict)"
    return None


def _dist(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "not installed"


def versions() -> dict[str, str]:
    """The contenders' versions, for the contenders list (nothing imported)."""
    return {
        "redis": "redis-py " + _dist("redis"),
        "ultradict_ng": "ultradict_ng " + _dist("ultradict_ng"),
        "pottery": "pottery " + _dist("pottery"),
        "redis_dict": "redis-dict " + _dist("redis-dict"),
    }


LIST_LABELS = {
    "redis": "redis-py (raw GET/SET)",
    "ultradict_ng": "SharedDict(backend='redis://')",
    "pottery": "pottery",
    "redis_dict": "redis-dict",
}


# -- the server --------------------------------------------------------------------------------


class _Server:
    def __init__(self, server: Any, own: bool) -> None:
        self.server = server
        self.own = own
        self.port: int = server.port
        self.url = f"redis://127.0.0.1:{server.port}/0"
        self.version = server.version()


def _server(run: Run) -> tuple[Optional[_Server], str]:
    """The run's redis-server (the adapter's, else a new one); or None and why."""
    from .redis_server import RedisServer, redis_binary

    a = run.adapters.get("redis")
    srv = getattr(a, "server", None)
    if srv is not None and srv.running:
        return _Server(srv, False), ""
    if not _installed("redis"):
        return None, "redis-py is not installed (pip install redis)"
    binary = redis_binary()
    if not binary:
        return None, "no redis-server binary on PATH (the harness never installs it)"
    server = RedisServer.start(binary)
    run.own_resource("redis-server (workload 12)", server.stop)
    return _Server(server, True), ""


def _client(srv: _Server) -> Any:
    import redis

    return redis.Redis(host="127.0.0.1", port=srv.port)


def _remove_keys(srv: _Server, pattern: str) -> int:
    """UNLINK every key matching ``pattern``; how many."""
    r = _client(srv)
    try:
        n, batch = 0, []
        for k in r.scan_iter(match=pattern, count=10_000):
            batch.append(k)
            if len(batch) >= 1000:
                n += r.unlink(*batch)
                batch = []
        if batch:
            n += r.unlink(*batch)
        return n
    finally:
        r.close()


# -- child processes ---------------------------------------------------------------------------


class ChildError(Exception):
    """A child raised (``text``: its traceback), died or did not answer."""

    def __init__(self, short: str, text: str = "") -> None:
        super().__init__(short)
        self.short = short
        self.text = text or short


class ChildUnavailable(Exception):
    """The child could not import its contender."""


class _Child:
    """One spawned child of :func:`perf.redis_children.child_main`, with its pipe."""

    def __init__(self, run: Run, role: str, params: dict[str, Any], start: Any = None) -> None:
        self.run = run
        self.role = role
        parent_end, child_end = run.ctx.Pipe()
        self.conn = parent_end
        self.proc = run.ctx.Process(
            target=C.child_main, name=f"perf-redis-{role}", args=(role, params, child_end, start), daemon=True
        )
        run.children.append(self.proc)
        try:
            self.proc.start()
        finally:
            child_end.close()
        self.info: dict[str, Any] = {}

    @property
    def pid(self) -> int:
        pid = self.proc.pid
        assert pid is not None
        return int(pid)

    def send(self, msg: tuple[Any, ...]) -> None:
        self.conn.send(msg)

    def recv(self, timeout: float, want: str) -> dict[str, Any]:
        """The payload of the next message, which must be ``want``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChildError(
                    f"no {want!r} from the {self.role} process (pid {self.proc.pid}) within {timeout:.0f} s"
                )
            if self.conn.poll(min(1.0, left)):
                try:
                    msg = self.conn.recv()
                except EOFError:
                    self.proc.join(1)
                    raise ChildError(
                        f"the {self.role} process (pid {self.proc.pid}) ended, exit code {self.proc.exitcode}"
                    ) from None
                if msg[0] == want:
                    payload: dict[str, Any] = msg[1]
                    if want == "ready":
                        self.info = payload
                    return payload
                if msg[0] == "unavailable":
                    raise ChildUnavailable(msg[1])
                if msg[0] == "error":
                    raise ChildError(f"in the {self.role} process: {msg[1]}", msg[2])
                raise ChildError(f"the {self.role} process sent {msg[0]!r}, expected {want!r}")
            elif not self.proc.is_alive() and not self.conn.poll(0):
                raise ChildError(
                    f"the {self.role} process (pid {self.proc.pid}) died, exit code {self.proc.exitcode}"
                )

    def stop(self, grace: float = 5.0) -> None:
        p = self.proc
        try:
            if p.is_alive():
                try:
                    self.conn.send(("exit",))
                except Exception:
                    pass
                p.join(grace)
            self.run.reap(p, 0.1)
        finally:
            try:
                self.conn.close()
            except Exception:
                pass
            if p in self.run.children:
                self.run.children.remove(p)


def _stop_all(children: list[_Child]) -> None:
    for ch in children:
        try:
            if ch.proc.is_alive():
                ch.conn.send(("exit",))
        except Exception:
            pass
    for ch in children:
        ch.stop(5.0)


def _common(srv: _Server, name: str) -> dict[str, Any]:
    return {"name": name, "url": srv.url, "port": srv.port}


# -- the workload ------------------------------------------------------------------------------


def w_redis(run: Run, contenders: list[str]) -> None:
    p = plan(run)
    rows = [r for r in ROWS if r.split(":")[0] in contenders]
    srv, why = _server(run)
    if srv is None:
        for kind, row, case, label, lease in _all_cells(p, rows):
            _skip(run, kind, row, case, why, label, lease)
        run.note(f"workload {NUMBER} skipped: {why}", WL)
        return
    pattern = f"*{run.name_prefix}*"
    key = f"redis keys of workload {NUMBER}"
    run.own_resource(key, lambda: _remove_keys(srv, pattern) if srv.server.running else 0)
    t_all = time.perf_counter()
    try:
        run.note(
            f"one private redis-server {srv.version} on 127.0.0.1:{srv.port} (--save '' "
            f"--appendonly no){'' if srv.own else ', the one workloads 1-5 and 10 use'}; "
            "every child process spawned; clocks: CLOCK_MONOTONIC",
            WL,
        )
        for part in (_part_rw, _part_lock, _part_takeover, _part_stale):
            try:
                part(run, p, srv, rows)
            except Exception as exc:  # a harness-side failure of one part: the others still run
                run.alert(f"workload {NUMBER} ({WL}), {part.__name__[6:]}: {type(exc).__name__}: {exc}")
    finally:
        try:
            _remove_keys(srv, pattern)
            run.resources.pop(key, None)
        except Exception as exc:
            run.alert(f"workload {NUMBER}: removing its keys failed: {exc!r} (retried at the end)")
        if srv.own:
            srv.server.stop()
            run.resources.pop("redis-server (workload 12)", None)
    run.note(f"the workload took {time.perf_counter() - t_all:.0f} s", WL)


def _all_cells(p: dict[str, Any], rows: list[str]) -> list[tuple[str, str, str, str, Optional[float]]]:
    out: list[tuple[str, str, str, str, Optional[float]]] = [(READ, r, read_case(), "", None) for r in rows]
    out += [(WRITE, r, write_case(), "", None) for r in rows if r in LABELS[WRITE]]
    out += [(LOCK, r, lock_case(p), "", None) for r in rows if r in LABELS[LOCK]]
    if "ultradict_ng" in rows:
        out += [(TAKEOVER, "ultradict_ng", takeover_case(lease), "", lease) for lease in p["leases"]]
        out += [(STALE, r, stale_case(r, pause), stale_label(r, pause), None) for r, pause, _ in p["stale"]]
    return out


def _skip(
    run: Run, kind: str, row: str, case: str, why: str, label: str = "", lease: Optional[float] = None
) -> None:
    unit = "ops/s" if kind in (READ, WRITE, LOCK) else "s"
    params: dict[str, Any] = {"case_kind": kind}
    if lease is not None:
        params["lease"] = lease
    rec = run.record(
        WL,
        case,
        row,
        unit=unit,
        better="higher" if unit == "ops/s" else "lower",
        values=[],
        skipped=why,
        params=params,
    )
    rec["label"] = label or LABELS[kind][row]


def _fail(run: Run, kind: str, row: str, case: str, err: str, text: str = "", label: str = "") -> None:
    unit = "ops/s" if kind in (READ, WRITE, LOCK) else "s"
    rec = run.record(
        WL,
        case,
        row,
        unit=unit,
        better="higher" if unit == "ops/s" else "lower",
        values=[],
        error=text or err,
        params={"case_kind": kind},
    )
    rec["label"] = label or LABELS[kind][row]
    rec["error_short"] = err


def _limit(run: Run) -> float:
    return 120.0 + 50 * run.box


# -- parts 1-2: reads and writes ------------------------------------------------------------------


def _part_rw(run: Run, p: dict[str, Any], srv: _Server, rows: list[str]) -> None:
    todo: list[str] = []
    for row in rows:
        why = _missing(row)
        if why:
            _skip(run, READ, row, read_case(), why)
            if row in LABELS[WRITE]:
                _skip(run, WRITE, row, write_case(), why)
        else:
            todo.append(row)
    if not todo:
        return
    raws: dict[str, dict[str, list[dict[str, Any]]]] = {r: {READ: [], WRITE: []} for r in todo}
    oks: dict[str, dict[str, bool]] = {r: {READ: True, WRITE: True} for r in todo}
    vers: dict[str, str] = {}
    gone: dict[str, tuple[str, str]] = {}  # row -> (skipped|failed, why)
    limit = _limit(run)
    seq = 0  # pass number over the whole part (pairs the contenders' values of one pass)
    for rnd in range(p["rw_rounds"]):
        live = [r for r in todo if r not in gone]
        if not live:
            break
        log(
            f"  redis: reads/writes, round {rnd + 1}/{p['rw_rounds']} ({len(live)} processes, "
            f"{p['rw_passes']} pass(es))"
        )
        kids: dict[str, _Child] = {}
        try:
            for row in live:
                kids[row] = _Child(run, "rw", {"contender": row, **_common(srv, run.new_name())})
            for row in live:
                try:
                    vers[row] = kids[row].recv(limit, "ready").get("version", "?")
                except ChildUnavailable as exc:
                    gone[row] = ("skipped", str(exc))
                except ChildError as exc:
                    gone[row] = ("failed", exc.text)
                    run.alert(f"{LABELS[READ][row]} failed in workload {NUMBER}: {exc.short}")
            for _pass in range(p["rw_passes"]):
                live = [r for r in live if r not in gone]
                if not live:
                    break
                k = seq % len(live)
                order = live[k:] + live[:k]  # rotated every pass
                for row in order:
                    kinds = [READ] + ([WRITE] if row in LABELS[WRITE] else [])
                    try:
                        kids[row].send(("measure", {"kinds": kinds, "box": p["rw_box"], "reps": 1}))
                        res = kids[row].recv(limit, "result")
                    except ChildError as exc:
                        gone[row] = ("failed", exc.text)
                        run.alert(f"{LABELS[READ][row]} failed in workload {NUMBER}: {exc.short}")
                        continue
                    for kind in kinds:
                        raws[row][kind].extend(dict(r, round=rnd, pass_no=seq) for r in res[kind]["raw"])
                        oks[row][kind] = oks[row][kind] and res[kind]["ok"]
                seq += 1
        finally:
            _stop_all(list(kids.values()))
    for row in todo:
        for kind, case in ((READ, read_case()), (WRITE, write_case())):
            if kind == WRITE and row not in LABELS[WRITE]:
                continue
            state = gone.get(row)
            if not raws[row][kind]:
                if state and state[0] == "skipped":
                    _skip(run, kind, row, case, state[1])
                else:
                    err = state[1] if state else "no measurement"
                    _fail(run, kind, row, case, err.strip().splitlines()[-1][:300], err)
                continue
            raw = raws[row][kind]
            values = [r["ops"] / r["seconds"] for r in raw if r["seconds"] > 0]
            ok = oks[row][kind]
            show = {} if ok else {"value": "WRONG"}
            if not ok:
                run.alert(f"{LABELS[kind][row]}: workload {NUMBER} {kind}: read back a wrong value")
            rec = run.record(
                WL,
                case,
                row,
                unit="ops/s",
                better="higher",
                values=values,
                raw=raw,
                show=show,
                ok=ok,
                params={"case_kind": kind, "version": vers.get(row), "fresh_process_per_round": True},
            )
            rec["label"] = LABELS[kind][row]
            if state:
                rec["show"]["failed later"] = state[1].strip().splitlines()[-1][:200]
                rec["params"]["error_later"] = state[1]
    run.note(
        f"reads and writes: each contender in a fresh spawned process per round "
        f"({p['rw_rounds']} round(s) of {p['rw_passes']} pass(es) over the contenders, order "
        f"rotated each pass: one repetition of ~{p['rw_box']:g} s per contender and pass; op "
        f"count calibrated once in the process, gc off in the loop); hot key: one "
        f"small int; writes: d[k] = i over {C.WRITE_KEYS} keys in turn; every contender "
        "creates its own dict/keys; raw redis-py: redis.Redis(host, port) with its defaults "
        "(values come back as bytes, undecoded)",
        WL,
    )


# -- part 3: locked increments in 4 processes -------------------------------------------------------


def _part_lock(run: Run, p: dict[str, Any], srv: _Server, rows: list[str]) -> None:
    case = lock_case(p)
    todo = []
    for row in [r for r in rows if r in LABELS[LOCK]]:
        why = _missing(row)
        if why:
            _skip(run, LOCK, row, case, why)
        else:
            todo.append(row)
    if not todo:
        return
    from ultradict_ng import SharedDict

    results: dict[str, list[dict[str, Any]]] = {r: [] for r in todo}
    gone: dict[str, tuple[str, str]] = {}
    limit = _limit(run)
    for rnd in range(p["lock_rounds"]):
        live = [r for r in todo if r not in gone]
        if not live:
            break
        order = live[rnd % len(live) :] + live[: rnd % len(live)]
        log(f"  redis: locked increments, round {rnd + 1}/{p['lock_rounds']}")
        kids: dict[str, list[_Child]] = {}
        starts: dict[str, Any] = {}
        names: dict[str, str] = {}
        creators: dict[str, Any] = {}
        try:
            for row in order:  # every child of the round starts at once (spawning is slow)
                names[row] = name = run.new_name()
                if row == "ultradict_ng":
                    d = SharedDict(name=name, backend=srv.url, create=True)
                    d[C.COUNTER] = 0
                    creators[row] = d
                starts[row] = run.ctx.Event()
                base = {"contender": row, "n": p["n"][row], "start_timeout": limit, **_common(srv, name)}
                kids[row] = [
                    _Child(run, "locker", {**base, "init": i == 0}, starts[row]) for i in range(PROCS)
                ]
            for row in order:
                try:
                    for ch in kids[row]:
                        ch.recv(limit, "ready")
                except ChildUnavailable as exc:
                    gone[row] = ("skipped", str(exc))
                except ChildError as exc:
                    gone[row] = ("failed", exc.text)
                    run.alert(f"{LABELS[LOCK][row]} failed in workload {NUMBER} (lock): {exc.short}")
            for row in order:
                if row in gone:
                    continue
                n = p["n"][row]
                starts[row].set()
                try:
                    got = [ch.recv(limit + 10 * n, "result") for ch in kids[row]]
                except ChildError as exc:
                    gone[row] = ("failed", exc.text)
                    run.alert(f"{LABELS[LOCK][row]} failed in workload {NUMBER} (lock): {exc.short}")
                    continue
                wall = max(g["t1"] for g in got) - min(g["t0"] for g in got)
                final = _final_count(srv, row, names[row], creators.get(row))
                results[row].append(
                    {
                        "n_per_process": n,
                        "processes": PROCS,
                        "seconds": wall,
                        "ops": PROCS * n,
                        "final": final,
                        "expected": PROCS * n,
                        "per_process_seconds": [g["t1"] - g["t0"] for g in got],
                    }
                )
        finally:
            for ch_list in kids.values():
                _stop_all(ch_list)
            for d in creators.values():
                try:
                    d.close()
                except Exception:
                    pass
    for row in todo:
        res = results[row]
        state = gone.get(row)
        if not res:
            if state and state[0] == "skipped":
                _skip(run, LOCK, row, case, state[1])
            else:
                err = state[1] if state else "no measurement"
                _fail(run, LOCK, row, case, err.strip().splitlines()[-1][:300], err)
            continue
        exact = all(r["final"] == r["expected"] for r in res)
        if not exact:
            bad = next(r for r in res if r["final"] != r["expected"])
            run.alert(
                f"{LABELS[LOCK][row]}: workload {NUMBER}: final count {bad['final']}, expected "
                f"{bad['expected']} (lost updates under the lock)"
            )
        values = [r["ops"] / r["seconds"] for r in res if r["seconds"] > 0]
        show = {"count": "exact" if exact else "MISMATCH", "n": f"{PROCS} x {res[0]['n_per_process']}"}
        unfair = [
            max(r["per_process_seconds"]) / min(r["per_process_seconds"])
            for r in res
            if min(r["per_process_seconds"]) > 0
        ]
        if unfair:
            show["slowest/fastest process"] = f"{max(unfair):.2g}x"
        rec = run.record(
            WL,
            case,
            row,
            unit="ops/s",
            better="higher",
            values=values,
            raw=res,
            show=show,
            ok=exact,
            params={"case_kind": LOCK, "processes": PROCS, "n_per_process": res[0]["n_per_process"]},
        )
        rec["label"] = LABELS[LOCK][row]
    run.note(
        f"locked increments: {PROCS} spawned processes per contender and round "
        f"({p['lock_rounds']} round(s)), started together by an Event once all had attached; "
        "ops/s = 4n / (last end - first start); ours: the children attach by name "
        "(SharedDict(name=..., backend=url)), lock = d.lock (lease 3 s); pottery: each child "
        "builds its own redis.Redis, Redlock(key=..., masters={r}) with its defaults (retry "
        "sleeps up to 0.2 s) and RedisDict(redis=r, key=...); n differs per contender (pottery "
        "is slow): " + ", ".join(f"{LABELS[LOCK][r]} n={p['n'][r]}" for r in todo),
        WL,
    )


def _final_count(srv: _Server, row: str, name: str, creator: Any) -> Any:
    if row == "ultradict_ng":
        return creator[C.COUNTER]
    r = _client(srv)
    try:  # pottery's RedisDict: a hash of JSON-encoded keys and values
        raw = r.hget(name + ":dict", json.dumps(C.COUNTER, sort_keys=True))
        return None if raw is None else json.loads(raw)
    finally:
        r.close()


# -- part 4: dead holder takeover ----------------------------------------------------------------


def _part_takeover(run: Run, p: dict[str, Any], srv: _Server, rows: list[str]) -> None:
    if "ultradict_ng" not in rows:
        return
    from ultradict_ng import SharedDict

    limit = _limit(run)
    rnd = random.Random()
    for lease in p["leases"]:
        case = takeover_case(lease)
        raw: list[dict[str, Any]] = []
        error: Optional[ChildError] = None
        for rep in range(p["takeover_reps"]):
            log(f"  redis: dead-holder takeover, lease {lease:g} s, {rep + 1}/{p['takeover_reps']}")
            name = run.new_name()
            params = {**_common(srv, name), "lease": lease}
            d = SharedDict(name=name, backend=srv.url, create=True, lease=lease)
            kids: list[_Child] = []
            try:
                holder = _Child(run, "holder", params)
                waiter = _Child(run, "waiter", params)
                kids = [holder, waiter]
                holder.recv(limit, "ready")
                waiter.recv(limit, "ready")
                waiter.send(("go",))
                waiter.recv(limit, "trying")
                # Kill at a random moment of the keeper's renewal cycle (every lease / 3).
                time.sleep(0.2 + rnd.uniform(0, lease / 3))
                ttl = d.stats().get("lock_ttl")
                t_kill = time.monotonic()
                os.kill(holder.pid, signal.SIGKILL)
                res = waiter.recv(lease + 30.0, "result")
                took = res["t_in"] - t_kill
                taken_by = d.get("taken_by")
                raw.append(
                    {"seconds": took, "ttl_at_kill": ttl, "lease": lease, "waiter_ok": taken_by == waiter.pid}
                )
            except ChildError as exc:
                error = exc
                run.alert(
                    f"{LABELS[TAKEOVER]['ultradict_ng']} takeover (lease {lease:g} s) failed: {exc.short}"
                )
                break
            finally:
                _stop_all(kids)
                d.close()
        if not raw:
            err = error.text if error else "no measurement"
            _fail(run, TAKEOVER, "ultradict_ng", case, err.strip().splitlines()[-1][:300], err)
            continue
        values = [r["seconds"] for r in raw]
        ttls = [r["ttl_at_kill"] for r in raw if r["ttl_at_kill"] is not None]
        ok = all(r["waiter_ok"] for r in raw)
        show: dict[str, str] = {}
        if ttls:
            show["lease left at kill"] = f"{fmt_seconds(min(ttls))}..{fmt_seconds(max(ttls))}"
            after = [r["seconds"] - r["ttl_at_kill"] for r in raw if r["ttl_at_kill"] is not None]
            show["in after expiry"] = f"{fmt_seconds(min(after))}..{fmt_seconds(max(after))}"
        if not ok:
            show["value"] = "WRONG"
            run.alert(f"workload {NUMBER}: takeover: the waiter's write inside the lock was not seen")
        rec = run.record(
            WL,
            case,
            "ultradict_ng",
            unit="s",
            better="lower",
            values=values,
            raw=raw,
            show=show,
            ok=ok,
            params={"case_kind": TAKEOVER, "lease": lease, "target_s": lease + TAKEOVER_SLACK},
        )
        rec["label"] = LABELS[TAKEOVER]["ultradict_ng"]
    run.note(
        "takeover: a spawned child attaches by name with lease=L, takes d.lock and says so; "
        "a second one is already blocked in 'with d.lock:'; the harness SIGKILLs the holder "
        "0.2 s + uniform(0, L/3) later (a random phase of the keeper's renewal every L/3; "
        "'lease left at kill' = the lock's PTTL just before) and measures kill -> the waiter "
        "inside (its own clock); every handle passes the same lease=",
        WL,
    )


# -- part 5: staleness of cached reads ------------------------------------------------------------


def _delays(done: list[float], seen: list[tuple[int, float]]) -> tuple[list[float], int, int]:
    """Per write i (1-based): first time a value >= i was seen - when write i returned.

    Returns (delays, writes never seen, writes whose own value was never seen
    because a later one was first)."""
    delays: list[float] = []
    j = 0
    skipped = 0
    values = {v for v, _ in seen}
    for i, t_done in enumerate(done, start=1):
        while j < len(seen) and seen[j][0] < i:
            j += 1
        if j >= len(seen):
            return delays, len(done) - i + 1, skipped
        if i not in values:
            skipped += 1
        delays.append(seen[j][1] - t_done)
    return delays, 0, skipped


def _part_stale(run: Run, p: dict[str, Any], srv: _Server, rows: list[str]) -> None:
    if "ultradict_ng" not in rows:
        return
    from ultradict_ng import SharedDict

    limit = _limit(run)
    lo, hi = p["gap"]
    sessions = p["stale"]
    log(
        f"  redis: staleness, {len(sessions)} reader(s): "
        + ", ".join(f"{stale_label(row, pause)} ({writes} writes)" for row, pause, writes in sessions)
    )
    dicts: list[Any] = []
    kids: list[_Child] = []
    try:
        names = []
        for _ in sessions:
            names.append(run.new_name())
            d = SharedDict(name=names[-1], backend=srv.url, create=True)
            d[C.STAMP] = 0
            dicts.append(d)
        # One writer for every session, one reader per session: all started at once.
        writer = _Child(run, "writer", _common(srv, ""))
        pollers = [
            _Child(
                run,
                "poller",
                {
                    **_common(srv, name),
                    "writes": writes,
                    "pause": pause,
                    "reads": "cached" if row.endswith(":cached") else "fresh",
                    "limit": writes * hi * 3 + 30.0,
                },
            )
            for name, (row, pause, writes) in zip(names, sessions)
        ]
        kids = [writer, *pollers]
        try:
            writer.recv(limit, "ready")
        except ChildError as exc:
            for row, pause, _w in sessions:
                _fail(run, STALE, row, stale_case(row, pause), exc.short, exc.text, stale_label(row, pause))
            run.alert(f"workload {NUMBER}: the staleness writer failed: {exc.short}")
            return
        for name, poller, (row, pause, writes) in zip(names, pollers, sessions):
            case = stale_case(row, pause)
            try:
                poller.recv(limit, "ready")
                poller.send(("go",))
                time.sleep(0.05)  # the reader is in its loop
                writer.send(
                    (
                        "go",
                        {"name": name, "writes": writes, "gap": (lo, hi), "seed": random.randrange(1 << 30)},
                    )
                )
                done = writer.recv(limit + writes * hi * 3, "result")["done"]
                got = poller.recv(limit + writes * hi * 3, "result")
            except ChildError as exc:
                run.alert(f"{stale_label(row, pause)}: staleness failed: {exc.short}")
                _fail(run, STALE, row, case, exc.short, exc.text, stale_label(row, pause))
                if not writer.proc.is_alive():
                    break
                continue
            finally:
                poller.stop(5.0)
            seen = [(int(v), float(t)) for v, t in got["seen"]]
            delays, lost, skipped = _delays(done, seen)
            params: dict[str, Any] = {
                "case_kind": STALE,
                "reads": row,
                "pause_s": pause,
                "writes": writes,
                "gap_s": [lo, hi],
                "reads_in_reader": got["reads"],
                "never_seen": lost,
                "skipped_values": skipped,
                "before_write_returned": sum(1 for x in delays if x < 0),
            }
            if delays:
                params.update(
                    p50=percentile(delays, 50),
                    p90=percentile(delays, 90),
                    p99=percentile(delays, 99),
                    max=max(delays),
                    min=min(delays),
                )
            show: dict[str, str] = {}
            if lost:
                show["value"] = f"{lost} write(s) never seen"
                run.alert(
                    f"workload {NUMBER}: the {stale_label(row, pause)} never saw {lost} of "
                    f"{writes} writes within its time limit"
                )
            rec = run.record(
                WL, case, row, unit="s", better="lower", values=delays, show=show, ok=not lost, params=params
            )
            rec["label"] = stale_label(row, pause)
    finally:
        _stop_all(kids)
        for d in dicts:
            d.close()
    run.note(
        f"staleness: one spawned writer (a fresh handle) writes d['t'] = 1, 2, ... with pauses "
        f"of {lo * 1e3:g}-{hi * 1e3:g} ms and notes when each write call returned; a reader in "
        "another spawned process reads d['t'] in a loop (gc off; 'busy': back to back; "
        "'sleeps': time.sleep(pause) between reads) and notes when each value first showed; "
        "delay(i) = first sight of a value >= i - write i returned (negative: seen before the "
        "writer's call returned); cached mode's documented bound is staleness=0.5 s. A busy "
        "reader thread holds the GIL, so the handle's listener thread waits for "
        f"sys.getswitchinterval() (5 ms by default) each time it needs it",
        WL,
    )


# -- the report ------------------------------------------------------------------------------------


def _rows(recs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    rows = [r for r in recs if r["workload"] == WL and r["params"].get("case_kind") == kind]
    if kind == STALE:
        return rows  # in the order measured
    return sorted(
        rows,
        key=lambda r: (
            ROWS.index(r["contender"]) if r["contender"] in ROWS else len(ROWS),
            r["params"].get("lease") or 0,
        ),
    )


def _find(recs: list[dict[str, Any]], kind: str, row: str) -> Optional[dict[str, Any]]:
    for r in _rows(recs, kind):
        if r["contender"] == row:
            return r
    return None


def _ratio(recs: list[dict[str, Any]], kind: str, row: str, base: str) -> Optional[float]:
    """``row``'s median ops/s / ``base``'s (None if either is missing)."""
    a, b = _find(recs, kind, row), _find(recs, kind, base)
    if not a or not b or not a["median"] or not b["median"]:
        return None
    return float(a["median"]) / float(b["median"])


def _bad(r: dict[str, Any], w: int) -> Optional[str]:
    if r.get("skipped"):
        return f"  {r['label']:<{w}}skipped: {r['skipped']}"
    if r.get("error") and r["median"] is None:
        return f"  {r['label']:<{w}}FAILED: {(r.get('error_short') or r['error'])[:200]}"
    return None


def _x(v: Optional[float]) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}x" if v < 1000 else f"{v:.0f}x"


def section(recs: list[dict[str, Any]], number: int, title: str, notes: list[str]) -> str:
    lines = ["", f"== {number}. {title} =="]
    w = 30
    for kind, base in ((READ, "redis"), (WRITE, "redis"), (LOCK, None)):
        rows = _rows(recs, kind)
        if not rows:
            continue
        bl = {READ: "x raw GET", WRITE: "x raw SET"}.get(kind, "")
        lines.append(f"  -- {rows[0]['case']} (ops/s, higher is better) --")
        lines.append(
            f"  {'contender':<{w}}{'median':>10}  {'spread (min..max)':<20}{'n':>3}"
            f"{bl:>11}{'x pottery':>11}  notes"
        )
        for r in rows:
            bad = _bad(r, w)
            if bad:
                lines.append(bad)
                continue
            vs_base = _ratio(recs, kind, r["contender"], base) if base else None
            vs_pot = _ratio(recs, kind, r["contender"], "pottery")
            spread = f"{fmt_rate(r['min'])} .. {fmt_rate(r['max'])}" if r["n"] > 1 else "(1 rep)"
            extra = ", ".join(f"{k}: {v}" if k != "value" else f"VALUE {v}" for k, v in r["show"].items())
            lines.append(
                (
                    f"  {r['label']:<{w}}{fmt_rate(r['median']):>10}  {spread:<20}{r['n']:>3}"
                    f"{(_x(vs_base) if base else ''):>11}"
                    f"{(_x(vs_pot) if r['contender'] != 'pottery' else ''):>11}  {extra}"
                ).rstrip()
            )
    rows = _rows(recs, TAKEOVER)
    if rows:
        lines.append(
            "  -- dead lock holder (SIGKILL) -> a waiting process inside 'with d.lock:' "
            "(seconds, lower is better) --"
        )
        lines.append(
            f"  {'contender':<{w}}{'lease':>7}{'median':>10}  {'spread (min..max)':<20}"
            f"{'n':>3}{'target':>9}  notes"
        )
        for r in rows:
            bad = _bad(r, w)
            if bad:
                lines.append(bad)
                continue
            lease = r["params"]["lease"]
            spread = f"{fmt_seconds(r['min'])} .. {fmt_seconds(r['max'])}" if r["n"] > 1 else "(1 rep)"
            ok = r["max"] <= lease + TAKEOVER_SLACK
            extra = ", ".join(f"{k}: {v}" for k, v in r["show"].items())
            lines.append(
                (
                    f"  {r['label']:<{w}}{lease:>6g}s{fmt_seconds(r['median']):>10}  "
                    f"{spread:<20}{r['n']:>3}{'<= ' + format(lease + TAKEOVER_SLACK, 'g') + ' s':>9}"
                    f"  {'all within' if ok else 'MISSED'}{', ' + extra if extra else ''}"
                ).rstrip()
            )
    rows = _rows(recs, STALE)
    if rows:
        lines.append(
            "  -- staleness: a write returned in one process -> the value visible to a "
            "reader in another (seconds per write) --"
        )
        ws = max(w, *(len(r["label"]) + 2 for r in rows))
        lines.append(
            f"  {'reader':<{ws}}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}{'min':>10}{'writes':>8}  notes"
        )
        for r in rows:
            bad = _bad(r, ws)
            if bad:
                lines.append(bad)
                continue
            prm = r["params"]
            notes_ = [f"{prm['skipped_values']} value(s) overtaken before seen"]
            if prm.get("before_write_returned"):
                notes_.append(f"{prm['before_write_returned']} seen before the write returned")
            if prm.get("never_seen"):
                notes_.append(f"{prm['never_seen']} NEVER SEEN")
            lines.append(
                f"  {r['label']:<{ws}}{fmt_seconds(prm.get('p50')):>10}"
                f"{fmt_seconds(prm.get('p90')):>10}{fmt_seconds(prm.get('p99')):>10}"
                f"{fmt_seconds(prm.get('max')):>10}{fmt_seconds(prm.get('min')):>10}"
                f"{prm['writes']:>8}  {', '.join(notes_)}"
            )
    for n in notes:
        lines.append(f"   note: {n}")
    return "\n".join(lines)


def _paired(a: dict[str, Any], b: dict[str, Any]) -> list[float]:
    """Sorted ratios a/b of the ops/s measured in the same pass (adjacent in time)."""

    def by_pass(rec: dict[str, Any]) -> dict[int, float]:
        return {
            r["pass_no"]: r["ops"] / r["seconds"]
            for r in rec.get("raw") or []
            if isinstance(r, dict) and "pass_no" in r and r.get("seconds")
        }

    pa, pb = by_pass(a), by_pass(b)
    return sorted(pa[k] / pb[k] for k in pa if k in pb and pb[k])


def targets(records: list[dict[str, Any]], quick: bool) -> list[dict[str, Any]]:
    """The Redis backend's targets on this run's medians (reported; nothing fails)."""
    recs = [r for r in records if r["workload"] == WL]
    out: list[dict[str, Any]] = []
    if not recs:
        return out

    def why(kind: str, row: str) -> str:
        r = _find(recs, kind, row)
        if r is None:
            return f"{LABELS[kind].get(row, row)}: not measured in this run"
        return f"{r['label']}: " + str(r.get("skipped") or r.get("error_short") or "no value")

    def ratio_row(name: str, kind: str, row: str, base: str, need: float, exact: bool = False) -> None:
        ratio = _ratio(recs, kind, row, base)
        t: dict[str, Any] = {"target": name, "need": f">= {need:g}x"}
        if ratio is None:
            missing = row if not (_find(recs, kind, row) or {}).get("median") else base
            t.update(measured=None, status="n/a", detail=why(kind, missing))
        else:
            a, b = _find(recs, kind, row), _find(recs, kind, base)
            assert a is not None and b is not None
            ok = ratio >= need
            detail = (
                f"{a['label']} {fmt_rate(a['median'])}/s vs {b['label']} "
                f"{fmt_rate(b['median'])}/s (median of {a['n']} / {b['n']})"
            )
            paired = _paired(a, b)
            if paired:
                detail += (
                    f"; paired per pass: median {_x(paired[len(paired) // 2])} "
                    f"({_x(paired[0])}..{_x(paired[-1])}, {len(paired)} passes)"
                )
            if exact:
                ok = ok and bool(a.get("ok"))
                detail += "; counts " + ("exact" if a.get("ok") else "NOT EXACT")
            t.update(measured=ratio, status="PASS" if ok else "MISS", detail=detail)
            if quick:
                t["caveat"] = "--quick: short loops"
        out.append(t)

    ratio_row("redis: fresh reads >= 1x raw redis-py GET", READ, "ultradict_ng", "redis", FRESH_VS_GET)
    ratio_row(
        "redis: cached reads >= 100x raw redis-py GET", READ, "ultradict_ng:cached", "redis", CACHED_VS_GET
    )
    ratio_row("redis: writes >= 0.8x raw redis-py SET", WRITE, "ultradict_ng", "redis", WRITE_VS_SET)
    ratio_row("redis: writes >= 2x pottery RedisDict", WRITE, "ultradict_ng", "pottery", WRITE_VS_POTTERY)
    ratio_row(
        "redis: 4-process locked increments >= 2x pottery, exact",
        LOCK,
        "ultradict_ng",
        "pottery",
        LOCK_VS_POTTERY,
        exact=True,
    )
    for r in _rows(recs, TAKEOVER) or [None]:  # type: ignore[list-item]
        if r is None:
            out.append(
                {
                    "target": "redis: dead holder taken over within lease + 1 s",
                    "need": "<= lease + 1 s",
                    "measured": None,
                    "status": "n/a",
                    "detail": "not measured in this run",
                }
            )
            continue
        lease = r["params"].get("lease", DEFAULT_LEASE)
        t: dict[str, Any] = {
            "target": f"redis: dead holder taken over within lease + 1 s (lease {lease:g} s)",
            "need": f"<= {lease + TAKEOVER_SLACK:g} s",
        }
        if r["median"] is None:
            t.update(measured=None, status="n/a", detail=why(TAKEOVER, "ultradict_ng"))
        else:
            ok = r["max"] <= lease + TAKEOVER_SLACK
            t.update(
                measured=r["max"],
                measured_text=fmt_seconds(r["max"]),
                status="PASS" if ok else "MISS",
                detail=f"kill -> waiter inside: median {fmt_seconds(r['median'])}, max "
                f"{fmt_seconds(r['max'])} over {r['n']} takeover(s)",
            )
            if lease != DEFAULT_LEASE:
                t["caveat"] = f"lease {lease:g} s (the default is {DEFAULT_LEASE:g} s)"
        out.append(t)
    return out


def plot_panel(ax: Any, recs: list[dict[str, Any]]) -> str:
    """Median ops/s (whiskers min..max) of reads, writes and locked increments, log scale."""
    colors = {
        "redis": "tab:red",
        "ultradict_ng": "tab:blue",
        "ultradict_ng:cached": "lightskyblue",
        "pottery": "tab:brown",
        "redis_dict": "tab:olive",
    }
    kinds = [k for k in (READ, WRITE, LOCK) if any(r["median"] for r in _rows(recs, k))]
    width = 0.8 / len(ROWS)
    for i, row in enumerate(ROWS):
        xs: list[float] = []
        ys: list[float] = []
        lo: list[float] = []
        hi: list[float] = []
        for j, kind in enumerate(kinds):
            r = _find(recs, kind, row)
            if r and r["median"]:
                xs.append(j + (i - (len(ROWS) - 1) / 2) * width)
                ys.append(r["median"])
                lo.append(r["median"] - r["min"])
                hi.append(r["max"] - r["median"])
        if xs:
            label = {
                "redis": "redis-py (raw)",
                "ultradict_ng": "SharedDict fresh",
                "ultradict_ng:cached": "SharedDict cached",
                "pottery": "pottery",
                "redis_dict": "redis-dict",
            }[row]
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, color=colors[row], label=label)
    names = {READ: "hot-key read", WRITE: "write (1024 keys)", LOCK: f"locked +1, {PROCS} procs"}
    ax.set_xticks(range(len(kinds)))
    ax.set_xticklabels([names[k] for k in kinds], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ops/s (median)")
    take = [r for r in _rows(recs, TAKEOVER) if r["median"]]
    stale = [r for r in _rows(recs, STALE) if r["median"] and r["contender"].endswith(":cached")]
    bits = []
    if take:
        bits.append(
            "takeover "
            + ", ".join(f"{fmt_seconds(r['median'])} (lease {r['params']['lease']:g} s)" for r in take)
        )
    if stale:
        bits.append(
            "cached staleness p99: "
            + ", ".join(
                f"{'busy reader' if not r['params'].get('pause_s') else 'pausing reader'} "
                f"{fmt_seconds(r['params'].get('p99'))}"
                for r in stale
            )
        )
    if bits:
        ax.text(0.99, 0.97, "\n".join(bits), transform=ax.transAxes, fontsize=7, va="top", ha="right")
    return "Redis backend vs redis-py, pottery, redis-dict (higher is better)"
