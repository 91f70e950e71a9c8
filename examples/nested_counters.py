"""Nested counters incremented exactly by several spawned processes.

A ``recurse=True`` dict holds ``d["counters"] = {"a": 0, "b": 0}``.  Because of
``recurse``, ``d["counters"]`` comes back as a live nested view, so
``d["counters"]["a"] += 1`` writes through to shared memory.  Four spawned
processes (two on "a", two on "b") each increment their counter N times under
``with d.lock:``; the dict itself is the Process argument (it travels by name
and re-attaches in the child).  No increment may be lost: the script checks
that a == b == 2 * N and exits non-zero otherwise.

Run from the repository root::

    python examples/nested_counters.py
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time

try:
    import ultradict_ng  # noqa: F401
except ImportError:  # running from a source checkout that is not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ultradict_ng import SharedDict

N = 1000  # increments per process
KEYS = ["a", "b", "a", "b"]  # the counter each of the 4 processes increments


def worker(d: SharedDict, key: str, times: int) -> None:
    """Runs in a spawned child: ``d`` was pickled by name and attached here."""
    for _ in range(times):
        with d.lock:  # read-modify-write: without the lock, increments would be lost
            d["counters"][key] += 1
    d.close()  # an attacher's close() only detaches; the dict lives on


def main() -> None:
    spawn = multiprocessing.get_context("spawn")
    name = f"example-counters-{os.getpid()}"
    # The creator auto-unlinks on close (or when this process exits normally).
    d = SharedDict(name=name, create=True, recurse=True)
    procs = []
    try:
        d["counters"] = {"a": 0, "b": 0}
        print(f"created {name!r} with recurse=True: {d.copy()}")
        print(f"d['counters'] is a live view: {d['counters']!r}")

        t0 = time.monotonic()
        procs = [spawn.Process(target=worker, args=(d, key, N)) for key in KEYS]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        elapsed = time.monotonic() - t0
        codes = [p.exitcode for p in procs]
        if codes != [0] * len(procs):
            raise SystemExit(f"FAILED: worker exit codes {codes}")

        counters = d["counters"].copy()
        expected = {k: KEYS.count(k) * N for k in ("a", "b")}
        print(
            f"{len(procs)} spawned processes x {N} locked increments each "
            f"({KEYS.count('a')} on 'a', {KEYS.count('b')} on 'b') in {elapsed:.2f}s"
        )
        print(f"final counters: {counters}  (expected {expected})")
        if counters != expected:
            raise SystemExit(f"FAILED: lost or extra increments: {counters} != {expected}")
        print(f"OK: all {len(procs) * N} increments counted exactly")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        d.close()  # creator with auto_unlink (the default): removes the segments


if __name__ == "__main__":
    main()
