"""Workload 13 (``transactions``): 2,000 writes in one ``transaction()`` against the same
writes under ``with d.lock:`` and without either, on shared memory and on Redis (the
target: the transaction >= 5x faster than the lock).

One block of 2,000 ``d[f"k{i}"] = i`` is one repetition; the modes alternate (order
rotated per repetition) on one dict per backend, in one spawned child per backend (no
state of the harness or of the other backend in the process).  Redis: the run's private
``redis-server``, else skipped with the reason.  After each block the child checks that
the dict holds the 2,000 values; a wrong count is an alert.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from typing import Any, Optional

from .registry import Target, Workload, pick, register
from .run import Run

WL, NUMBER = "transactions", 13
ALIASES = ("transaction", "tx")
TITLE = "2,000 writes: in one transaction() vs under with d.lock: vs neither (shm and Redis)"
WRITES = 2000
MODES = ("transaction", "lock", "plain")
LABELS = dict(zip(MODES, ("with d.transaction():", "with d.lock:", "no lock (each write alone)")))


def _block(d: Any, mode: str, base: int) -> float:
    t0 = time.perf_counter()
    with d.transaction() if mode == "transaction" else d.lock if mode == "lock" else nullcontext():
        for i in range(WRITES):
            d[f"k{i}"] = base + i
    return time.perf_counter() - t0


def child(name: str, backend: Optional[str], reps: int) -> dict[str, Any]:
    """Time ``reps`` blocks of each mode: ``{mode: [seconds]}`` and the wrong counts."""
    from ultradict_ng import SharedDict

    d = SharedDict(name=name, **({"backend": backend} if backend else {}))
    times: dict[str, list[float]] = {m: [] for m in MODES}
    wrong: list[str] = []
    try:
        for w in range(2):  # warm-up: the keys exist, the stream has its size
            _block(d, MODES[w % len(MODES)], -WRITES)
        for rep in range(reps):
            for j in range(len(MODES)):
                mode = MODES[(rep + j) % len(MODES)]
                base = (rep * len(MODES) + j) * WRITES
                times[mode].append(_block(d, mode, base))
                if d.get("k0") != base or d.get(f"k{WRITES - 1}") != base + WRITES - 1 or len(d) != WRITES:
                    wrong.append(f"{mode}: after a block the dict holds {len(d)} keys, k0={d.get('k0')!r}")
    finally:
        d.unlink()
        d.close()
    return {"times": times, "wrong": wrong}


def w_transactions(run: Run, contenders: list[str]) -> None:
    from .redis_backend import server

    reps = run.repeat if run.quick else max(run.repeat, 7)
    for backend in ("shm", "redis"):
        case = f"{WRITES:,} writes, {'shared memory' if backend == 'shm' else 'Redis (loopback)'}"
        srv, why = server(run) if backend == "redis" else (None, "")
        name = f"{run.name_prefix}{os.urandom(6).hex()}"
        try:
            url = srv.url if srv else None
            got = {"skipped": why} if why else run.call(child, name, url, reps, timeout=300)
        except Exception as exc:
            got = {"error": f"{type(exc).__name__}: {exc}"}
        for w in [got["error"]] if "error" in got else got.get("wrong", []):
            run.alert(f"workload {NUMBER} ({backend}): {w}")
        t, extra = got.get("times"), {k: got.get(k) for k in ("error", "skipped")}
        for mode in MODES:
            params = {"backend": backend, "mode": mode, **({"writes": WRITES} if t else {})}
            kw = dict(extra, params=params, ok=not got["wrong"] if t else None, values=t[mode] if t else [])
            run.record(WL, case, mode, unit="s", better="lower", **kw)["label"] = LABELS[mode]
    run.note(
        f"one block = {WRITES:,} writes d[f'k{{i}}'] = i; modes alternate, order rotated; "
        "one spawned child per backend; Redis: the run's private server on loopback",
        WL,
    )


def _target(b: str) -> Target:
    text = f"transactions: {WRITES:,} writes in one transaction >= 5x faster than under the lock ({b})"
    return Target(text, 5.0, num=pick(WL, "lock", backend=b), den=pick(WL, "transaction", backend=b))


TARGETS = (_target("shm"), _target("redis"))
register(Workload(WL, NUMBER, TITLE, w_transactions, ALIASES, targets=TARGETS, ref="transaction"))
