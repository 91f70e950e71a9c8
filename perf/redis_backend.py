"""Workload 12 (``redis``): ultradict_ng's Redis backend against redis-py, pottery and redis-dict.

All on loopback against ONE private ``redis-server`` (the ``redis`` adapter's, else
one started for the workload), in spawned processes (:func:`child_main` in a
*role*, answering through a pipe; every clock ``time.monotonic``).  Parts:
hot-key reads ``d[k]`` (raw ``r.get``, ``SharedDict`` with ``reads="fresh"``,
one validating round trip per read, and ``"cached"``, pottery's and redis-dict's
``RedisDict``); writes ``d[k] = i`` over 1024 keys in turn (raw ``r.set``); 4
processes x ``n`` times ``with d.lock: d[k] += 1`` against pottery's
``Redlock`` (exactly ``4n`` at the end); a ``d.lock`` holder SIGKILLed, until
a waiter gets in; staleness: a write's return -> its first sight in a reader.
Reads and writes run each contender in a fresh process per round (pottery
patches ``json.dumps`` on import; a cached handle runs a listener thread).
Every key carries the run's name prefix and is removed at the end.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Iterable, Iterator
from itertools import cycle, islice, repeat
from typing import TYPE_CHECKING, Any, Callable, Optional

from .redis_server import RedisServer, redis_binary
from .registry import NG, Target, Workload, pick, register
from .util import calibrate, fmt_seconds, log, no_gc, percentile

if TYPE_CHECKING:
    from .run import Run

clock, pc = time.monotonic, time.perf_counter

WL, NUMBER = "redis", 12
TITLE = (
    "Redis backend vs redis-py, pottery, redis-dict: reads, writes, 4-process locked "
    "increments, dead-holder takeover, cached-read staleness"
)
#: Record contenders, in order (``ultradict_ng:cached``: the same contender, reads="cached").
ROWS = ("redis", NG, f"{NG}:cached", "pottery", "redis_dict")
LABELS = {
    "redis": "redis-py r.get / r.set (raw)",
    NG: "SharedDict reads='fresh'",
    f"{NG}:cached": "SharedDict reads='cached'",
    "pottery": "pottery RedisDict",
    "redis_dict": "redis-dict RedisDict",
}
OWN = WRITERS = ("redis", NG, "pottery", "redis_dict")
LOCKERS = (NG, "pottery")
READ, WRITE, LOCK, TAKEOVER, STALE = "read", "write", "lock", "takeover", "staleness"
DEFAULT_LEASE = 3.0  # ultradict_ng's default (redis_backend/layout.py)
TAKEOVER_SLACK = 1.0  # the target: the waiter is in within lease + 1 s
PROCS = 4
WRITE_KEYS = 1024  # the write loop's keys, in turn
HOT, COUNTER, STAMP = "hot", "c", "t"
READ_CASE = "hot-key read d[k] (raw: r.get(k))"
WRITE_CASE = f"write d[k] = i over {WRITE_KEYS} rotating keys (raw: r.set(k, i))"
LOCK_CASE = f"{PROCS} processes x n: with lock: d[k] += 1 (aggregate)"
STALE_MODE = {f"{NG}:cached": "reads='cached'", NG: "reads='fresh'"}


def takeover_case(lease: float) -> str:
    return f"dead holder (SIGKILL) -> waiter in, lease {lease:g} s"


def stale_case(row: str, pause: float) -> str:
    how = "busy loop" if not pause else f"time.sleep({pause:g}) between reads"
    return f"staleness: write returned -> visible to a {STALE_MODE[row]} reader, {how}"


def plan(run: Run) -> dict[str, Any]:
    """Full: ``--repeat`` rounds of one repetition (reads/writes); quick: one round of ``--repeat``."""
    cached, q = f"{NG}:cached", run.quick
    return {
        "rw_rounds": 1 if q else run.repeat,
        "rw_passes": run.repeat if q else 2,
        "lock_rounds": 1 if q else min(run.repeat, 3),
        "n": {NG: 100, "pottery": 5} if q else {NG: 500, "pottery": 100},
        "leases": [0.5] if q else [DEFAULT_LEASE, 1.0],
        "takeover_reps": 1 if q else min(run.repeat, 3),
        "stale": [(cached, 0.0, 150), (cached, 1e-4, 150)]
        if q
        else [(cached, 0.0, 2000), (cached, 1e-4, 1000), (NG, 0.0, 500)],
        "rw_box": run.box / 2 if q else run.box,
        "limit": 120.0 + 50 * run.box,  # s: a child's answer at the latest
    }


GAP = (0.0005, 0.0015)  # the staleness writer's pauses between writes


def _missing(row: str) -> Optional[str]:
    """Why a row cannot run here (pottery patches json.dumps on import: not imported here)."""
    for dist, mod in (("pottery", "pottery"), ("redis-dict", "redis_dict")):
        if row == mod and importlib.util.find_spec(mod) is None:
            return f"{dist} is not installed (pip install {dist})"
    return None


def versions() -> dict[str, str]:
    dists = {"redis": "redis-py", NG: NG, "pottery": "pottery", "redis_dict": "redis-dict"}
    return {k: f"{d} {version_of('redis' if k == 'redis' else d)}" for k, d in dists.items()}


# -- the children's side -------------------------------------------------------------------------


class Unavailable(Exception):
    """A child cannot import its contender (sent to the harness, raised there again)."""


def version_of(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "not installed"


def child_main(role: str, params: dict[str, Any], conn: Any, start: Any) -> None:
    """Every child's entry point: ignores SIGINT (the harness ends it by pid), SIGTERM -> SystemExit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        ROLES[role](params, conn, start)
    except BaseException as exc:
        err = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=12))
        with contextlib.suppress(Exception):
            conn.send(("unavailable", str(exc)) if isinstance(exc, Unavailable) else err)
        if not isinstance(exc, Exception):
            raise
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def _import(module: str, dist: str) -> Any:
    try:
        return __import__(module)
    except ImportError as exc:
        raise Unavailable(f"{dist} is not installed ({exc}; pip install {dist})") from None


def _redis_client(params: dict[str, Any]) -> Any:
    return _import("redis", "redis").Redis(host="127.0.0.1", port=params["port"])


def _shared_dict(params: dict[str, Any], **kw: Any) -> Any:
    from ultradict_ng import SharedDict

    return SharedDict(name=params["name"], backend=params["url"], **kw)


def _loop(m: Any, keys: list[str], call: bool, write: bool, last: list[Any]) -> Callable[[int], float]:
    """n times ``m[keys[0]]`` (``call``: ``m(k)``, raw ``r.get``), or ``m[k] = i`` over the keys in
    turn from where the previous call stopped (``m(k, i)``, ``r.set``; ``last``: the last written)."""
    pos, hot = 0, keys[0]

    def loop(n: int) -> float:
        nonlocal pos
        it: Any = repeat(None, n)
        if write:
            it = zip(islice(cycle(keys[pos:] + keys[:pos]), n), range(n))
            pos = (pos + n) % len(keys)
            last[:] = [keys[(pos - 1) % len(keys)], n - 1]
        with no_gc():
            t0 = pc()
            if write and call:
                for k, i in it:
                    m(k, i)
            elif write:
                for k, i in it:
                    m[k] = i
            elif call:
                for _ in it:
                    m(hot)
            else:
                for _ in it:
                    m[hot]
            t1 = pc()
        return t1 - t0

    return loop


def _rw(params: dict[str, Any], conn: Any, start: Any) -> None:
    """One contender's hot-key reads and rotating writes; op counts calibrated at the first measure."""
    row, name = params["contender"], params["name"]
    raw = row == "redis"  # redis-py: keys under the name, values come back as bytes
    reads = "cached" if row.endswith(":cached") else "fresh"
    if raw or row == "pottery":
        r = _redis_client(params)
        m = r if raw else _import("pottery", "pottery").RedisDict(redis=r, key=name)
        close = r.close
    elif row == "redis_dict":
        rd = _import("redis_dict", "redis-dict")
        m = rd.RedisDict(namespace=name, host="127.0.0.1", port=params["port"])
        close = m.redis.close
    else:
        m = _shared_dict(params, create=True, reads=reads)
        close = m.close
    ver = versions()[row.split(":")[0]] + (f" (reads={reads!r})" if row.startswith(NG) else "")
    try:
        prefix = f"{name}:" if raw else ""
        hot, keys, last = prefix + HOT, [f"{prefix}w{j}" for j in range(WRITE_KEYS)], []
        get, put = (m.get, m.set) if raw else (m.__getitem__, m.__setitem__)
        put(hot, 0)
        enc: Callable[[int], Any] = (lambda v: str(v).encode()) if raw else (lambda v: v)
        loops = {
            "read": _loop(get if raw else m, [hot], raw, False, last),
            "write": _loop(put if raw else m, keys, raw, True, last),
        }
        checks = {
            "read": lambda: get(hot) == enc(0),
            "write": lambda: not last or get(last[0]) == enc(last[1]),
        }
        conn.send(("ready", {"version": ver}))
        counts: dict[str, int] = {}
        while True:
            msg = conn.recv()
            if msg[0] == "exit":
                return
            spec, out = msg[1], {}
            for kind in spec["kinds"]:
                loop = loops[kind]
                if kind not in counts:
                    counts[kind] = calibrate(loop, spec["box"])
                n = counts[kind]
                raws = [{"ops": n, "seconds": loop(n)} for _ in range(spec["reps"])]
                out[kind] = {"raw": raws, "ok": bool(checks[kind]())}
            conn.send(("result", out))
    finally:
        close()


def _locker(params: dict[str, Any], conn: Any, start: Any) -> None:
    if params["contender"] == "ultradict_ng":
        m = _shared_dict(params)  # attach by name (the harness created it)
        lock, close = m.lock, m.close
    else:  # pottery
        pottery = _import("pottery", "pottery")
        r = _redis_client(params)
        lock = pottery.Redlock(key=params["name"] + ":lock", masters={r})
        m = pottery.RedisDict(redis=r, key=params["name"] + ":dict")
        close = r.close
        if params["init"]:
            m[COUNTER] = 0
    try:
        k, n = COUNTER, params["n"]
        conn.send(("ready", {"pid": os.getpid()}))
        if not start.wait(params["start_timeout"]):
            raise TimeoutError("no start signal")
        with no_gc():
            t0 = clock()
            for _ in repeat(None, n):
                with lock:
                    m[k] += 1
            t1 = clock()
        conn.send(("result", {"t0": t0, "t1": t1, "n": n}))
    finally:
        close()


def _holder(params: dict[str, Any], conn: Any, start: Any) -> None:
    d = _shared_dict(params, lease=params["lease"])
    d.lock.acquire()
    conn.send(("ready", {"pid": os.getpid(), "held_at": clock()}))
    while True:  # until SIGKILL (the keeper thread renews the lease meanwhile)
        time.sleep(3600)


def _waiter(params: dict[str, Any], conn: Any, start: Any) -> None:
    d = _shared_dict(params, lease=params["lease"])
    try:
        conn.send(("ready", {"pid": os.getpid()}))
        if conn.recv()[0] != "go":
            return
        t_try = clock()
        conn.send(("trying", {"t": t_try}))
        with d.lock:
            t_in = clock()
            d["taken_by"] = os.getpid()
        conn.send(("result", {"t_try": t_try, "t_in": t_in}))
    finally:
        d.close()


def _writer(params: dict[str, Any], conn: Any, start: Any) -> None:
    """One session per ``("go", spec)``: attach to ``spec['name']``, write, report, close."""
    sleep = time.sleep
    conn.send(("ready", {"pid": os.getpid()}))
    while True:
        msg = conn.recv()
        if msg[0] != "go":
            return
        spec = msg[1]
        d = _shared_dict({"name": spec["name"], "url": params["url"]})
        try:
            rnd = random.Random(spec["seed"])
            lo, hi = spec["gap"]
            done: list[float] = []
            d[STAMP]  # (warm: the handle is loaded)
            for i in range(1, spec["writes"] + 1):
                d[STAMP] = i
                done.append(clock())
                sleep(rnd.uniform(lo, hi))
        finally:
            d.close()
        conn.send(("result", {"done": done}))


def _poller(params: dict[str, Any], conn: Any, start: Any) -> None:
    d = _shared_dict(params, reads=params["reads"])
    try:
        last_value = params["writes"]
        conn.send(("ready", {"pid": os.getpid()}))
        if conn.recv()[0] != "go":
            return
        seen: list[tuple[int, float]] = []  # (value, first time seen)
        pause = params.get("pause", 0.0)
        sleep = time.sleep
        deadline = clock() + params["limit"]
        prev = d[STAMP]
        reads = 0
        with no_gc():
            while True:
                v = d[STAMP]
                reads += 1
                if v != prev:
                    seen.append((v, clock()))
                    prev = v
                    if v >= last_value:
                        break
                elif pause:
                    sleep(pause)
                if (pause or reads & 0xFFF == 0) and clock() > deadline:
                    break
        conn.send(("result", {"seen": seen, "reads": reads}))
    finally:
        d.close()


ROLES = {f.__name__[1:]: f for f in (_rw, _locker, _holder, _waiter, _writer, _poller)}


# -- the harness's side: the server and the children ------------------------------------------


def server(run: Run) -> tuple[Optional[RedisServer], str]:
    """The run's redis-server (the ``redis`` adapter's, else a new one); or None and why."""
    srv = getattr(run.adapters.get("redis"), "server", None)
    if srv is not None and srv.running:
        return srv, ""
    if importlib.util.find_spec("redis") is None:
        return None, "redis-py is not installed (pip install redis)"
    if not redis_binary():
        return None, "no redis-server binary on PATH (the harness never installs it)"
    srv = RedisServer.start()
    run.own_resource("redis-server (workload 12)", srv.stop)
    return srv, ""


def _client(srv: RedisServer) -> Any:
    import redis

    return redis.Redis(host="127.0.0.1", port=srv.port)


def _remove_keys(srv: RedisServer, pattern: str) -> None:
    r = _client(srv)
    try:
        keys = list(r.scan_iter(match=pattern, count=10_000))
        for i in range(0, len(keys), 1000):
            r.unlink(*keys[i : i + 1000])
    finally:
        r.close()


class ChildError(Exception):
    """A child raised (``text``: its traceback), died or did not answer."""

    def __init__(self, short: str, text: str = "") -> None:
        super().__init__(short)
        self.short, self.text = short, text or short


class _Child:
    """One spawned child running :func:`child_main` in ``role``, with its pipe."""

    def __init__(self, run: Run, role: str, params: dict[str, Any], start: Any = None) -> None:
        self.role = role
        self.conn, child_end = run.ctx.Pipe()
        args = (role, params, child_end, start)
        self.proc = run.ctx.Process(target=child_main, name=f"perf-redis-{role}", args=args, daemon=True)
        run.children.append(self.proc)
        try:
            self.proc.start()
        finally:
            child_end.close()

    def recv(self, timeout: float, want: str) -> dict[str, Any]:
        """The payload of the next message, which must be ``want`` (a dead child: EOF on the pipe)."""
        who = f"the {self.role} process (pid {self.proc.pid})"
        if not self.conn.poll(timeout):
            raise ChildError(f"no {want!r} from {who} within {timeout:.0f} s")
        try:
            kind, *rest = self.conn.recv()
        except EOFError:
            self.proc.join(1)
            raise ChildError(f"{who} ended, exit code {self.proc.exitcode}") from None
        if kind == want:
            return dict(rest[0])
        if kind == "unavailable":
            raise Unavailable(rest[0])
        if kind == "error":
            raise ChildError(f"in the {self.role} process: {rest[0]}", rest[1])
        raise ChildError(f"{who} sent {kind!r}, expected {want!r}")


def _stop_all(run: Run, children: Iterable[_Child]) -> None:
    """Ask every child to exit at once, then reap each (SIGTERM, then SIGKILL)."""
    for ch in children:
        with contextlib.suppress(Exception):
            ch.conn.send(("exit",))
    for ch in children:
        ch.proc.join(5.0)
        run.reap(ch.proc, 0.1)
        ch.conn.close()
        if ch.proc in run.children:
            run.children.remove(ch.proc)


@contextlib.contextmanager
def _dropping(run: Run, gone: dict[str, tuple[str, str]], row: str, what: str = "") -> Iterator[None]:
    """A child that cannot go on: its row is skipped (contender not importable) or failed (alerted)."""
    try:
        yield
    except Unavailable as exc:
        gone[row] = ("skipped", str(exc))
    except ChildError as exc:
        gone[row] = ("failed", exc.text)
        run.alert(f"{LABELS[row]} failed in workload {NUMBER}{what}: {exc.short}")


def _common(srv: RedisServer, name: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "url": srv.url, "port": srv.port, **kw}


# -- records ------------------------------------------------------------------------------------


def _rec(run: Run, kind: str, row: str, case: str, values: Any = (), label: str = "", **kw: Any) -> Any:
    unit, better = ("ops/s", "higher") if kind in (READ, WRITE, LOCK) else ("s", "lower")
    kw["params"] = {"case_kind": kind, **kw.get("params", {})}
    rec = run.record(WL, case, row, unit=unit, better=better, values=list(values), **kw)
    rec["label"] = label or LABELS[row]
    return rec


def _lost(run: Run, kind: str, row: str, case: str, state: Optional[tuple[str, str]]) -> None:
    """A cell without a value: skipped (its contender is missing here) or failed."""
    if state and state[0] == "skipped":
        _rec(run, kind, row, case, skipped=state[1])
        return
    err = state[1] if state else "no measurement"
    _rec(run, kind, row, case, error=err)["error_short"] = err.strip().splitlines()[-1][:300]


def _skip(run: Run, p: dict[str, Any], rows: list[str], why: Callable[[str], Optional[str]]) -> list[str]:
    """Every cell of the rows that cannot run here (``why(row)``) recorded as skipped; the others."""
    cells = [(READ, r, READ_CASE, {}) for r in rows]
    cells += [(WRITE, r, WRITE_CASE, {}) for r in rows if r in WRITERS]
    cells += [(LOCK, r, LOCK_CASE, {}) for r in rows if r in LOCKERS]
    if NG in rows:
        cells += [(TAKEOVER, NG, takeover_case(lease), {"lease": lease}) for lease in p["leases"]]
        cells += [(STALE, r, stale_case(r, pause), {}) for r, pause, _ in p["stale"]]
    for kind, row, case, params in cells:
        if why(row):
            _rec(run, kind, row, case, skipped=why(row), params=params)
    return [r for r in rows if not why(r)]


# -- the workload -------------------------------------------------------------------------------


def w_redis(run: Run, contenders: list[str]) -> None:
    p = plan(run)
    rows = [r for r in ROWS if r.split(":")[0] in contenders]
    srv, why = server(run)
    if srv is None:
        _skip(run, p, rows, lambda r: why)
        run.note(f"workload {NUMBER} skipped: {why}", WL)
        return
    rows = _skip(run, p, rows, _missing)  # pottery, redis-dict: checked without importing them
    own = srv is not getattr(run.adapters.get("redis"), "server", None)
    pattern, key = f"*{run.name_prefix}*", f"redis keys of workload {NUMBER}"
    run.own_resource(key, lambda: _remove_keys(srv, pattern) if srv.running else 0)
    t_all = time.perf_counter()
    try:
        run.note(
            f"one private redis-server {srv.version()} on 127.0.0.1:{srv.port} (--save '' --appendonly no)"
            f"{'' if own else ', the one workloads 1-5 and 10 use'}; every child process spawned; "
            "clocks: CLOCK_MONOTONIC",
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
        if own:
            srv.stop()
            run.resources.pop("redis-server (workload 12)", None)
    run.note(f"the workload took {time.perf_counter() - t_all:.0f} s", WL)


def _part_rw(run: Run, p: dict[str, Any], srv: RedisServer, rows: list[str]) -> None:
    """Parts 1-2: every round, one fresh process per contender; passes over them, order rotated."""
    if not rows:
        return
    raws: dict = {(r, k): [] for r in rows for k in (READ, WRITE) if k == READ or r in WRITERS}
    oks = dict.fromkeys(raws, True)
    vers: dict[str, str] = {}
    gone: dict[str, tuple[str, str]] = {}  # row -> (skipped|failed, why)
    seq = 0  # pass number over the whole part (pairs the contenders' values of one pass)
    for rnd in range(p["rw_rounds"]):
        live = [r for r in rows if r not in gone]
        if not live:
            break
        log(f"  redis: reads/writes, round {rnd + 1}/{p['rw_rounds']} ({len(live)} processes)")
        kids: dict[str, _Child] = {}
        try:
            for row in live:
                kids[row] = _Child(run, "rw", {"contender": row, **_common(srv, run.new_name())})
            for row in live:
                with _dropping(run, gone, row):
                    vers[row] = kids[row].recv(p["limit"], "ready").get("version", "?")
            for _pass in range(p["rw_passes"]):
                live = [r for r in live if r not in gone]
                if not live:
                    break
                for row in live[seq % len(live) :] + live[: seq % len(live)]:
                    kinds = [k for k in (READ, WRITE) if (row, k) in raws]
                    with _dropping(run, gone, row):
                        kids[row].conn.send(("measure", {"kinds": kinds, "box": p["rw_box"], "reps": 1}))
                        res = kids[row].recv(p["limit"], "result")
                        for kind in kinds:
                            raws[row, kind] += [dict(r, round=rnd, pass_no=seq) for r in res[kind]["raw"]]
                            oks[row, kind] = oks[row, kind] and res[kind]["ok"]
                seq += 1
        finally:
            _stop_all(run, list(kids.values()))
    for (row, kind), raw in raws.items():
        case, state, ok = READ_CASE if kind == READ else WRITE_CASE, gone.get(row), oks[row, kind]
        if not raw:
            _lost(run, kind, row, case, state)
            continue
        if not ok:
            run.alert(f"{LABELS[row]}: workload {NUMBER} {kind}: read back a wrong value")
        show = {} if ok else {"value": "WRONG"}
        params = {"version": vers.get(row), "fresh_process_per_round": True}
        if state:
            show["failed later"] = state[1].strip().splitlines()[-1][:200]
            params["error_later"] = state[1]
        values = [r["ops"] / r["seconds"] for r in raw if r["seconds"] > 0]
        _rec(run, kind, row, case, values, raw=raw, show=show, ok=ok, params=params)
    run.note(
        f"reads and writes: each contender in a fresh spawned process per round ({p['rw_rounds']} round(s) "
        f"of {p['rw_passes']} pass(es), order rotated each pass; ~{p['rw_box']:g} s per repetition, op "
        "count calibrated once per process, gc off); raw redis-py: redis.Redis(host, port), its defaults",
        WL,
    )


def _part_lock(run: Run, p: dict[str, Any], srv: RedisServer, rows: list[str]) -> None:
    """Part 3: per round and contender, 4 lockers started together by an Event once all attached."""
    todo = [r for r in rows if r in LOCKERS]
    if not todo:
        return
    from ultradict_ng import SharedDict

    results: dict[str, list[dict[str, Any]]] = {r: [] for r in todo}
    gone: dict[str, tuple[str, str]] = {}
    limit = p["limit"]
    for rnd in range(p["lock_rounds"]):
        live = [r for r in todo if r not in gone]
        if not live:
            break
        log(f"  redis: locked increments, round {rnd + 1}/{p['lock_rounds']}")
        order = live[rnd % len(live) :] + live[: rnd % len(live)]
        kids: dict[str, list[_Child]] = {}
        starts, names, creators = {}, {}, {}
        try:
            for row in order:  # every child of the round starts at once (spawning is slow)
                name = names[row] = run.new_name()
                ev = starts[row] = run.ctx.Event()
                if row == NG:
                    creators[row] = SharedDict(name=name, backend=srv.url, create=True)
                    creators[row][COUNTER] = 0
                kw = _common(srv, name, contender=row, n=p["n"][row], start_timeout=limit)
                kids[row] = [_Child(run, "locker", {**kw, "init": i == 0}, ev) for i in range(PROCS)]
            for row in order:
                with _dropping(run, gone, row, " (lock)"):
                    for ch in kids[row]:
                        ch.recv(limit, "ready")
            for row in (r for r in order if r not in gone):
                n = p["n"][row]
                starts[row].set()
                with _dropping(run, gone, row, " (lock)"):
                    got = [ch.recv(limit + 10 * n, "result") for ch in kids[row]]
                    final = creators[row][COUNTER] if row == NG else _pottery_count(srv, names[row])
                    t0s, t1s = [g["t0"] for g in got], [g["t1"] for g in got]
                    res = {"n_per_process": n, "processes": PROCS, "ops": PROCS * n, "expected": PROCS * n}
                    res.update(final=final, seconds=max(t1s) - min(t0s))
                    results[row].append(dict(res, per_process_seconds=[b - a for a, b in zip(t0s, t1s)]))
        finally:
            _stop_all(run, [ch for chs in kids.values() for ch in chs])
            for d in creators.values():
                with contextlib.suppress(Exception):
                    d.close()
    for row in todo:
        res = results[row]
        if not res:
            _lost(run, LOCK, row, LOCK_CASE, gone.get(row))
            continue
        bad = [r for r in res if r["final"] != r["expected"]]
        if bad:
            run.alert(
                f"{LABELS[row]}: workload {NUMBER}: final count {bad[0]['final']}, expected "
                f"{bad[0]['expected']} (lost updates under the lock)"
            )
        n = res[0]["n_per_process"]
        show = {"count": "MISMATCH" if bad else "exact", "n": f"{PROCS} x {n}"}
        unfair = [max(s) / min(s) for s in (r["per_process_seconds"] for r in res) if min(s) > 0]
        if unfair:
            show["slowest/fastest process"] = f"{max(unfair):.2g}x"
        values = [r["ops"] / r["seconds"] for r in res if r["seconds"] > 0]
        label = "pottery Redlock + RedisDict" if row == "pottery" else "SharedDict, with d.lock"
        params = {"processes": PROCS, "n_per_process": n}
        _rec(run, LOCK, row, LOCK_CASE, values, label, raw=res, show=show, ok=not bad, params=params)
    run.note(
        f"locked increments: {PROCS} spawned processes per contender and round, started together by an "
        "Event once all attached; ops/s = 4n / (last end - first start); ours attach by name (lease 3 s); "
        "pottery: Redlock(key=..., masters={r}) with its defaults (retry sleeps up to 0.2 s) around "
        "RedisDict(redis=r, key=...), a redis.Redis per child; n: "
        + ", ".join(f"{r} {p['n'][r]}" for r in todo),
        WL,
    )


def _pottery_count(srv: RedisServer, name: str) -> Any:
    r = _client(srv)
    try:  # pottery's RedisDict: a hash of JSON-encoded keys and values
        raw = r.hget(name + ":dict", json.dumps(COUNTER, sort_keys=True))
        return None if raw is None else json.loads(raw)
    finally:
        r.close()


def _part_takeover(run: Run, p: dict[str, Any], srv: RedisServer, rows: list[str]) -> None:
    """Part 4: kill the holder while a waiter is blocked; kill -> the waiter inside (its clock)."""
    if NG not in rows:
        return
    from ultradict_ng import SharedDict

    rnd = random.Random()
    for lease in p["leases"]:
        case, raw, error = takeover_case(lease), [], None
        for rep in range(p["takeover_reps"]):
            log(f"  redis: dead-holder takeover, lease {lease:g} s, {rep + 1}/{p['takeover_reps']}")
            params = {**_common(srv, run.new_name()), "lease": lease}
            d = SharedDict(name=params["name"], backend=srv.url, create=True, lease=lease)
            kids: list[_Child] = []
            try:
                kids = [_Child(run, "holder", params), _Child(run, "waiter", params)]
                holder, waiter = kids
                holder.recv(p["limit"], "ready")
                waiter.recv(p["limit"], "ready")
                waiter.conn.send(("go",))
                waiter.recv(p["limit"], "trying")
                # Kill at a random moment of the keeper's renewal cycle (every lease / 3).
                time.sleep(0.2 + rnd.uniform(0, lease / 3))
                ttl = d.stats().get("lock_ttl")
                t_kill = time.monotonic()
                os.kill(holder.proc.pid or 0, signal.SIGKILL)
                took = waiter.recv(lease + 30.0, "result")["t_in"] - t_kill
                ok = d.get("taken_by") == waiter.proc.pid
                raw.append({"seconds": took, "ttl_at_kill": ttl, "lease": lease, "waiter_ok": ok})
            except ChildError as exc:
                error = exc
                run.alert(f"SharedDict d.lock takeover (lease {lease:g} s) failed: {exc.short}")
                break
            finally:
                _stop_all(run, kids)
                d.close()
        if not raw:
            _lost(run, TAKEOVER, NG, case, ("failed", error.text if error else "no measurement"))
            continue
        ok = all(r["waiter_ok"] for r in raw)
        show: dict[str, str] = {}
        ttls = [(t, r["seconds"] - t) for r in raw if (t := r["ttl_at_kill"]) is not None]
        for what, xs in zip(("lease left at kill", "in after expiry"), zip(*ttls)):
            show[what] = f"{fmt_seconds(min(xs))}..{fmt_seconds(max(xs))}"
        if not ok:
            show["value"] = "WRONG"
            run.alert(f"workload {NUMBER}: takeover: the waiter's write inside the lock was not seen")
        params = {"lease": lease, "target_s": lease + TAKEOVER_SLACK}
        values = [r["seconds"] for r in raw]
        _rec(run, TAKEOVER, NG, case, values, "SharedDict d.lock", raw=raw, show=show, ok=ok, params=params)
    run.note(
        "takeover: a child with lease=L holds d.lock, another is blocked in 'with d.lock:'; the holder is "
        "SIGKILLed 0.2 s + uniform(0, L/3) later (a random phase of the keeper's renewal; 'lease left at "
        "kill': the lock's PTTL just before); kill -> the waiter inside, on its own clock",
        WL,
    )


def _delays(done: list[float], seen: list[tuple[int, float]]) -> tuple[list[float], int, int]:
    """Per write i (1-based): first time a value >= i was seen - when write i returned.

    Returns (delays, writes never seen, writes overtaken: their own value never seen)."""
    delays: list[float] = []
    j = skipped = 0
    values = {v for v, _ in seen}
    for i, t_done in enumerate(done, start=1):
        while j < len(seen) and seen[j][0] < i:
            j += 1
        if j >= len(seen):
            return delays, len(done) - i + 1, skipped
        skipped += i not in values
        delays.append(seen[j][1] - t_done)
    return delays, 0, skipped


def _part_stale(run: Run, p: dict[str, Any], srv: RedisServer, rows: list[str]) -> None:
    """Part 5: one writer for every session, one reader per session, all started at once."""
    if NG not in rows:
        return
    from ultradict_ng import SharedDict

    limit, (lo, hi), sessions = p["limit"], GAP, p["stale"]
    log(f"  redis: staleness, {len(sessions)} reader(s)")
    dicts: list[Any] = []
    kids: list[_Child] = []
    try:
        names = [run.new_name() for _ in sessions]
        for name in names:
            dicts.append(SharedDict(name=name, backend=srv.url, create=True))
            dicts[-1][STAMP] = 0
        kids = [_Child(run, "writer", _common(srv, ""))]
        for name, (row, pause, writes) in zip(names, sessions):
            reads = "cached" if row.endswith(":cached") else "fresh"
            spec = {"writes": writes, "pause": pause, "reads": reads, "limit": writes * hi * 3 + 30.0}
            kids.append(_Child(run, "poller", {**_common(srv, name), **spec}))
        writer, pollers = kids[0], kids[1:]
        try:
            writer.recv(limit, "ready")
        except ChildError as exc:
            for row, pause, _w in sessions:
                _lost(run, STALE, row, stale_case(row, pause), ("failed", exc.text))
            run.alert(f"workload {NUMBER}: the staleness writer failed: {exc.short}")
            return
        for name, poller, (row, pause, writes) in zip(names, pollers, sessions):
            case = stale_case(row, pause)
            try:
                poller.recv(limit, "ready")
                poller.conn.send(("go",))
                time.sleep(0.05)  # the reader is in its loop
                spec = {"name": name, "writes": writes, "gap": (lo, hi), "seed": random.randrange(1 << 30)}
                writer.conn.send(("go", spec))
                done = writer.recv(limit + writes * hi * 3, "result")["done"]
                got = poller.recv(limit + writes * hi * 3, "result")
            except ChildError as exc:
                run.alert(f"{LABELS[row]}, {case}: staleness failed: {exc.short}")
                _lost(run, STALE, row, case, ("failed", exc.text))
                if not writer.proc.is_alive():
                    break
                continue
            finally:
                _stop_all(run, [poller])
            delays, lost, skipped = _delays(done, [(int(v), float(t)) for v, t in got["seen"]])
            early = sum(1 for x in delays if x < 0)
            params: dict[str, Any] = {"reads": row, "pause_s": pause, "writes": writes, "gap_s": [lo, hi]}
            params.update(reads_in_reader=got["reads"], never_seen=lost, skipped_values=skipped)
            params["before_write_returned"] = early
            notes = [f"{skipped} value(s) overtaken before seen"]
            if delays:
                params.update({f"p{q}": percentile(delays, q) for q in (50, 90, 99)})
                params.update(max=max(delays), min=min(delays))
                notes.insert(0, f"p90 {fmt_seconds(params['p90'])}, p99 {fmt_seconds(params['p99'])}")
            notes += [f"{early} seen before the write returned"] if early else []
            if lost:
                notes.append(f"{lost} NEVER SEEN")
                run.alert(f"workload {NUMBER}, {case}: {lost} of {writes} writes never seen in time")
            show = {"writes": str(writes), "note": "; ".join(notes)}
            _rec(run, STALE, row, case, delays, show=show, ok=not lost, params=params)
    finally:
        _stop_all(run, kids)
        for d in dicts:
            d.close()
    run.note(
        f"staleness: a writer writes d['t'] = 1, 2, ... with pauses of {lo * 1e3:g}-{hi * 1e3:g} ms; a "
        "reader in another process reads d['t'] in a loop (gc off; back to back or time.sleep(pause)); "
        "delay(i) = first sight of a value >= i - write i returned (negative: before the call returned); "
        "cached mode's documented bound: staleness=0.5 s; a busy reader holds the GIL, so the handle's "
        "listener thread waits up to sys.getswitchinterval() (5 ms) each time it needs it",
        WL,
    )


# -- targets (reported, never asserted: machines are noisy) and the registry entry ----------------


def _vs(text: str, need: float, case: str, row: str, base: str, exact: bool = False) -> Target:
    return Target(f"redis: {text}", need, num=pick(WL, row, case), den=pick(WL, base, case), exact=exact)


def _takeover(lease: float) -> Target:
    """Every takeover (their max) within lease + 1 s; quick mode measures a 0.5 s lease only."""

    def measure(recs: list[dict[str, Any]]) -> Optional[tuple[float, str]]:
        r = pick(WL, case=takeover_case(lease)).find(recs)
        if not r or not r["median"]:
            return None
        other = "" if lease == DEFAULT_LEASE else f"; the default lease is {DEFAULT_LEASE:g} s"
        detail = f"kill -> waiter inside: median {fmt_seconds(r['median'])}, max {fmt_seconds(r['max'])}"
        return r["max"], f"{detail} over {r['n']} takeover(s){other}"

    text = f"redis: dead holder taken over within lease + 1 s (lease {lease:g} s)"
    return Target(text, lease + TAKEOVER_SLACK, at_most=True, unit="s", measure=measure)


def _panel(ax: Any, recs: list[dict[str, Any]]) -> str:
    """The ops/s parts only (takeover and staleness are seconds: their tables have them)."""
    from .report import bars

    bars(ax, [r for r in recs if r["unit"] == "ops/s"])
    return "Redis backend vs redis-py, pottery, redis-dict: ops/s"


register(
    Workload(
        WL,
        NUMBER,
        TITLE,
        w_redis,
        ("redis-backend", "redis_backend", "backend"),
        own=OWN,
        labels=dict(
            zip(OWN, ("redis-py (raw GET/SET)", "SharedDict(backend='redis://')", "pottery", "redis-dict"))
        ),
        contender_aliases={"redis-dict": "redis_dict", "redisdict": "redis_dict"},
        versions=versions,
        targets=(
            _vs("fresh reads >= 1x raw redis-py GET", 1.0, READ_CASE, NG, "redis"),
            _vs("cached reads >= 100x raw redis-py GET", 100.0, READ_CASE, f"{NG}:cached", "redis"),
            _vs("writes >= 0.8x raw redis-py SET", 0.8, WRITE_CASE, NG, "redis"),
            _vs("writes >= 2x pottery RedisDict", 2.0, WRITE_CASE, NG, "pottery"),
            _vs("4-process locked increments >= 2x pottery, exact", 2.0, LOCK_CASE, NG, "pottery", True),
            *(_takeover(lease) for lease in (DEFAULT_LEASE, 1.0, 0.5)),
        ),
        panel=_panel,
    )
)
