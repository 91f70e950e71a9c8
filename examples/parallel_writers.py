"""Four writer processes and one concurrent reader on the same dict.

Four spawned processes each write their own keys (``w<i>-<j>`` = j, 2,000 per
process) and, after each key, increment a shared ``"counter"`` under
``with d.lock:``.  Meanwhile the parent iterates ``d.items()`` over and over.
Iteration walks a consistent snapshot, so it never raises because of the
concurrent writes, and every snapshot is a state the dict really had: each
writer's keys form a prefix ``w<i>-0 .. w<i>-<m-1>`` (they are written in
order) and the counter never goes backwards.  At the end the dict must be
exactly the 8,000 keys plus ``counter == 8000``; the script exits non-zero if
anything differs.

Run from the repository root::

    python examples/parallel_writers.py
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from typing import Any

try:
    import ultradict_ng  # noqa: F401
except ImportError:  # running from a source checkout that is not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ultradict_ng import SharedDict

WRITERS = 4
KEYS_PER_WRITER = 2000


def writer(d: SharedDict, index: int, count: int, ready: Any, go: Any) -> None:
    """Runs in a spawned child; ``d`` re-attached by name when it was unpickled."""
    ready.release()
    go.wait()  # all writers (and the parent's clock) start together
    for j in range(count):
        d[f"w{index}-{j}"] = j  # one atomic write; no explicit lock needed
        with d.lock:  # read-modify-write of a shared key: needs the lock
            d["counter"] += 1
    d.close()


def check_snapshot(items: list[Any], last_counter: int) -> int:
    """Validate one snapshot; return its counter."""
    per_writer = [0] * WRITERS
    highest = [-1] * WRITERS
    counter = None
    for key, value in items:
        if key == "counter":
            counter = value
            continue
        w, j = key[1:].split("-")
        w, j = int(w), int(j)
        if value != j:
            raise SystemExit(f"FAILED: snapshot has {key!r} = {value!r}")
        per_writer[w] += 1
        highest[w] = max(highest[w], j)
    for w in range(WRITERS):
        if per_writer[w] != highest[w] + 1:  # keys of one writer must be a prefix
            raise SystemExit(f"FAILED: writer {w}'s keys in a snapshot are not a prefix")
    if counter is None or counter < last_counter:
        raise SystemExit(f"FAILED: counter went from {last_counter} to {counter}")
    return int(counter)


def main() -> None:
    spawn = multiprocessing.get_context("spawn")
    name = f"example-writers-{os.getpid()}"
    d = SharedDict({"counter": 0}, name=name, create=True)  # auto-unlinks on close
    ready, go = spawn.Semaphore(0), spawn.Event()
    procs = [spawn.Process(target=writer, args=(d, i, KEYS_PER_WRITER, ready, go)) for i in range(WRITERS)]
    try:
        for p in procs:
            p.start()
        started = 0
        while started < WRITERS:  # wait until every writer is attached and ready
            if ready.acquire(timeout=0.1):
                started += 1
            elif not all(p.is_alive() for p in procs):
                raise SystemExit(f"FAILED: a writer died at start: {[p.exitcode for p in procs]}")
        go.set()
        t0 = time.monotonic()

        iterations = items_read = 0
        counter = 0
        while True:
            running = any(p.is_alive() for p in procs)
            items = list(d.items())  # a snapshot: never raises during writes
            counter = check_snapshot(items, counter)
            iterations += 1
            items_read += len(items)
            if not running:
                break
        elapsed = time.monotonic() - t0
        for p in procs:
            p.join(60)
        codes = [p.exitcode for p in procs]
        if codes != [0] * WRITERS:
            raise SystemExit(f"FAILED: writer exit codes {codes}")

        total = WRITERS * KEYS_PER_WRITER
        expected: dict[str, int] = {"counter": total}
        for i in range(WRITERS):
            expected.update({f"w{i}-{j}": j for j in range(KEYS_PER_WRITER)})
        final = d.copy()

        writes = 2 * total  # each step: one key write + one locked increment
        print(
            f"{WRITERS} spawned writers x {KEYS_PER_WRITER} keys each, "
            f"plus a locked shared counter after every key"
        )
        print(
            f"writes: {writes} in {elapsed:.2f}s = {writes / elapsed:,.0f} writes/s aggregate "
            f"({total / elapsed:,.0f} keys/s + as many locked increments)"
        )
        print(
            f"parent meanwhile: {iterations} full iterations of d.items() "
            f"({items_read:,} items read), none raised, every snapshot consistent"
        )
        print(f"final dict: {len(final)} entries, counter = {final.get('counter')}")
        if final != expected:
            missing = len(expected.keys() - final.keys())
            extra = len(final.keys() - expected.keys())
            raise SystemExit(
                f"FAILED: final dict differs ({missing} missing, {extra} unexpected keys, "
                f"counter {final.get('counter')} != {total})"
            )
        print(f"OK: final content is exactly the {total} keys plus counter == {total}")
    finally:
        for p in procs:
            if p.pid is not None:  # started
                if p.is_alive():
                    p.kill()
                p.join()
        d.close()


if __name__ == "__main__":
    main()
