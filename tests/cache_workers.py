"""Processes for the cache tests: ``python -m tests.cache_workers ROLE NAME ARGS...``.

Each is an unrelated interpreter attaching by name.  ``START`` arguments are
``time.time()`` instants the racers wait for, so that they really race.

* ``writer NAME WID COUNT TTL``: sets ``w<WID>-<i>`` -> ``[WID, i]`` (ttl TTL, "-": none);
* ``bound NAME MAXSIZE SECONDS``: polls the cache's entry count, prints the largest seen;
* ``adder NAME START``: ``add("prize", pid)``, prints ``won`` or ``lost``;
* ``opener NAME START``: opens (or creates) the cache and writes a key at once;
* ``adders NAME COUNT START``: ``add("k<i>", pid)`` for i < COUNT, prints ``wins N``;
* ``incr NAME COUNT``: ``incr("n", default=0)`` COUNT times;
* ``memo NAME LOG DELAY START``: calls a ``cached`` function whose body appends a
  line to LOG and sleeps DELAY; prints the result;
* ``expiry NAME``: sets ``short`` (ttl 0.5) and ``long`` (no ttl), prints ``set``, sleeps;
* ``delete_many NAME``: ``delete_many(["a", "b"])``;
* ``rebuild_killed NAME``: SIGKILLs itself in the middle of ``expire()``'s rebuild,
  right after the first cell of the free stack is written.
"""

from __future__ import annotations

import os
import sys
import time

from ultradict_ng.cache import SharedCache, cached


def _until(start: float) -> None:
    delay = start - time.time()
    if delay > 0:
        time.sleep(delay)


def writer(name: str, wid: str, count: str, ttl: str) -> None:
    c = SharedCache(**({"path": name} if name.startswith("/") else {"name": name}), create=False)
    for i in range(int(count)):
        if ttl == "-":
            c[f"w{wid}-{i}"] = [int(wid), i]
        else:
            c.set(f"w{wid}-{i}", [int(wid), i], ttl=float(ttl))
    print("done", flush=True)
    c.close()


def bound(name: str, maxsize: str, seconds: str) -> None:
    c = SharedCache(name, create=False)
    largest = 0
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        largest = max(largest, len(c))
    print(f"largest {largest}", flush=True)
    c.close()


def adder(name: str, start: str) -> None:
    c = SharedCache(name, create=False)
    _until(float(start))
    print("won" if c.add("prize", os.getpid()) else "lost", flush=True)
    c.close()


def opener(name: str, start: str) -> None:
    _until(float(start))
    c = SharedCache(name, maxsize=100, auto_unlink=False)
    c[os.getpid()] = 1
    print("opened", flush=True)
    c.close()


def adders(name: str, count: str, start: str) -> None:
    c = SharedCache(name, create=False)
    _until(float(start))
    wins = sum(1 for i in range(int(count)) if c.add(f"k{i}", os.getpid()))
    print(f"wins {wins}", flush=True)
    c.close()


def incr(name: str, count: str) -> None:
    c = SharedCache(name, create=False)
    for _ in range(int(count)):
        c.incr("n", default=0)
    print("done", flush=True)
    c.close()


def memo(name: str, log: str, delay: str, start: str) -> None:
    @cached(name=name)
    def slow(x: int) -> int:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(float(delay))
        return x * 10

    _until(float(start))
    print(f"result {slow(7)}", flush=True)


def expiry(name: str) -> None:
    c = SharedCache(name, create=False)
    c.set("short", "s", ttl=0.5)
    c.set("long", "l", ttl=None)
    print("set", flush=True)
    time.sleep(30)


def delete_many(name: str) -> None:
    c = SharedCache(name, create=False)
    c.delete_many(["a", "b"])
    c.close()


def clear(name: str) -> None:
    c = SharedCache(name, create=False)
    c.clear()
    c.close()


def rebuild_killed(name: str) -> None:
    import signal

    c = SharedCache(name, create=False)

    class KillAfterOneWrite:
        def __init__(self, view: object) -> None:
            self.view = view

        def __getitem__(self, i: int) -> int:
            return self.view[i]  # type: ignore[index]

        def __setitem__(self, i: int, v: int) -> None:
            self.view[i] = v  # type: ignore[index]
            os.kill(os.getpid(), signal.SIGKILL)

    c._side.free = KillAfterOneWrite(c._side.free)  # type: ignore[assignment]
    c.expire()


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
