"""``python -m perf.overwrite``: a large array overwritten in a loop while readers read.

The scenario of the large-values target "overwrite a 10 MiB array 1,000 times
while readers read: /dev/shm use of the dict stays <= 3x the value, 0 torn
reads".  The writer stores ``np.full(n, i)`` under one key, ``--times`` times;
``--readers`` spawned processes read the key in a loop and count arrays whose
elements are not all equal (torn).  /dev/shm use is sampled with ``statvfs``
after every write, against a baseline taken before the loop (so run it on an
otherwise quiet machine: anything else writing to /dev/shm meanwhile counts).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from typing import Any, Optional


def _used() -> int:
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _reader(name: str, stop: Any, out: Any) -> None:
    from ultradict_ng import SharedDict

    d = SharedDict(name=name, create=False)
    reads = torn = 0
    while not stop.is_set():
        arr = d["a"]
        if int(arr.min()) != int(arr.max()):
            torn += 1
        reads += 1
        del arr
    out.put((reads, torn))
    d.close()


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.overwrite", description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=10, help="size of the array (default 10)")
    p.add_argument("--times", type=int, default=1000, help="overwrites (default 1000)")
    p.add_argument("--readers", type=int, default=2, help="spawned reader processes (default 2)")
    args = p.parse_args(argv)
    import numpy as np

    from ultradict_ng import SharedDict

    size = args.mib << 20
    ctx = multiprocessing.get_context("spawn")
    d = SharedDict(name=f"perf_overwrite_{os.getpid()}")
    try:
        d["a"] = np.zeros(size // 8, np.int64)
        stop, out = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_reader, args=(d.name, stop, out)) for _ in range(args.readers)]
        for proc in procs:
            proc.start()
        time.sleep(1.0)  # the readers are reading
        base = _used() - size  # /dev/shm use apart from the current value
        peak = 0
        t0 = time.perf_counter()
        for i in range(args.times):
            d["a"] = np.full(size // 8, i, np.int64)
            peak = max(peak, _used() - base)
        elapsed = time.perf_counter() - t0
        stop.set()
        results = [out.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(60)
    finally:
        d.close()
    reads = [r for r, _ in results]
    torn = sum(t for _, t in results)
    print(
        f"{args.times} overwrites of a {args.mib} MiB array in {elapsed:.1f} s "
        f"({elapsed / args.times * 1e3:.1f} ms each), {args.readers} readers: reads {reads}, "
        f"torn {torn}; peak /dev/shm use {peak / size:.2f}x the value"
    )
    return 1 if torn else 0


if __name__ == "__main__":
    raise SystemExit(main())
