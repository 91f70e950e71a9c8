"""A 256 MiB numpy array shared by four spawned processes without a copy.

The parent stores the array once (``d["frame"] = arr``: one write into a
shared-memory segment of its own).  Each spawned reader gets it with
``d["frame"]``: a read-only array whose memory *is* that segment, so reading
it takes well under a millisecond and adds almost nothing to the reader's
memory, whatever the size.  Each reader sums its quarter and reports how long
the access took and how much its RSS grew before it touched the data.  The
parent then overwrites the key while a reader still holds the old array,
which does not change.  The script checks every claim and exits non-zero if
one does not hold.

Needs numpy (``pip install 'ultradict_ng[numpy]'``).  Run from the repository
root::

    python examples/shared_arrays.py
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

import numpy as np

from ultradict_ng import SharedDict

N = (256 << 20) // 8  # float64 elements: 256 MiB
READERS = 4


def rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) * 1024


def reader(name: str, part: int, results: multiprocessing.Queue[tuple]) -> None:
    """Runs in a spawned child: attaches by name, reads its quarter in place."""
    d = SharedDict(name=name, create=False)
    before = rss()
    t = time.perf_counter()
    frame = d["frame"]
    took = time.perf_counter() - t
    grew = rss() - before
    chunk = frame[part * N // READERS : (part + 1) * N // READERS]
    results.put((part, took, grew, float(chunk.sum()), frame.flags.writeable))
    d.close()


def main() -> int:
    name = f"example-arrays-{os.getpid()}"
    d = SharedDict(name=name, create=True)
    try:
        arr = np.arange(N, dtype=np.float64)
        t = time.perf_counter()
        d["frame"] = arr
        print(f"stored a {arr.nbytes >> 20} MiB array in {1000 * (time.perf_counter() - t):.0f} ms")
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=reader, args=(name, i, results)) for i in range(READERS)]
        for p in procs:
            p.start()
        got = sorted(results.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(60)
        ok = all(p.exitcode == 0 for p in procs)
        total = 0.0
        for part, took, grew, partial, writeable in got:
            print(
                f"reader {part}: d['frame'] in {took * 1e3:.2f} ms, RSS +{grew / 2**20:.2f} MiB "
                f"before touching the data, read-only: {not writeable}"
            )
            ok = ok and took < 0.05 and grew < 16 << 20 and not writeable
            total += partial
        expected = float(arr.sum())
        print(f"sum of the quarters {total:.0f}, sum of the array {expected:.0f}")
        ok = ok and total == expected
        held = d["frame"]
        d["frame"] = np.zeros(8)  # overwritten: the old segment is unlinked...
        ok = ok and held[-1] == N - 1  # ...but the array held here keeps it, unchanged
        print(f"after overwriting the key, the held array still ends in {held[-1]:.0f}")
    finally:
        d.close()
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
