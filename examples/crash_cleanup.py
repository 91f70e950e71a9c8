"""Crash safety: SIGKILLed writers, a lock held by a dead process, and cleanup.

The dict is created with ``auto_unlink=False`` (it must survive its users),
``recurse=True`` and a tiny ``buffer_size`` so that writes overflow the update
stream and produce dump segments.  Then:

1. Two spawned workers write nested data and are SIGKILLed (no close, no
   cleanup of any kind).  Their writes are all there.
2. A third worker takes ``d.lock``, writes, and is SIGKILLed while holding it.
   A fresh process then takes the lock anyway: the dead owner is detected and
   the lock recovered within about a second (the measured wait is printed;
   the library also logs a warning saying so).
3. Every handle is gone, yet the dict's segments (``NAME``, ``NAME@s``,
   ``NAME@d<gen>``) are still in /dev/shm.  ``unlink_by_name(NAME)`` removes
   them all and returns how many it removed; none remain afterwards.

Run from the repository root::

    python examples/crash_cleanup.py
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
import time
from typing import Any

try:
    import ultradict_ng  # noqa: F401
except ImportError:  # running from a source checkout that is not installed
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ultradict_ng import NotFound, SharedDict, unlink_by_name

SHM = "/dev/shm"
KEYS_PER_WRITER = 40


def segments_of(name: str) -> list[str]:
    """The dict's segments in /dev/shm: NAME, NAME@s, NAME@d<gen>."""
    return sorted(e for e in os.listdir(SHM) if e == name or e.startswith(name + "@"))


def write_then_die(d: SharedDict, tag: str) -> None:
    """Write nested data, then SIGKILL ourselves: nothing gets closed."""
    d["workers"][tag] = {"pid": os.getpid(), "items": {}}
    items = d["workers"][tag]["items"]
    for i in range(KEYS_PER_WRITER):
        items[f"k{i}"] = i * i
    os.kill(os.getpid(), signal.SIGKILL)


def hold_lock_until_killed(d: SharedDict, ready: Any) -> None:
    """Take the lock, write under it, say so, and wait to be killed."""
    d.lock.acquire()
    d["last_holder"] = os.getpid()
    ready.set()
    while True:
        time.sleep(1)


def take_lock(name: str, report: Any) -> None:
    """A fresh process: attach by name, take the (dead-owned) lock, report the wait."""
    d = SharedDict(name=name, create=False)
    dead = d.lock.owner_pid
    t0 = time.monotonic()
    with d.lock(timeout=10):
        waited = time.monotonic() - t0
        d["recovered_by"] = os.getpid()
    report.put((dead, waited))
    d.close()


def main() -> None:
    spawn = multiprocessing.get_context("spawn")
    name = f"example-crash-{os.getpid()}"
    procs: list[Any] = []
    d = SharedDict(name=name, create=True, recurse=True, buffer_size=256, auto_unlink=False)
    try:
        d["config"] = {"mode": "demo", "limits": {"depth": 3, "size": 256}}
        d["workers"] = {}
        print(f"created {name!r}: recurse=True, buffer_size={d.buffer_size}, auto_unlink=False")

        # 1. writers that die by SIGKILL
        procs = [spawn.Process(target=write_then_die, args=(d, f"w{i}")) for i in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        codes = [p.exitcode for p in procs]
        print(f"2 writers wrote {KEYS_PER_WRITER} nested keys each, then died: exit codes {codes}")
        if codes != [-signal.SIGKILL] * 2:
            raise SystemExit(f"FAILED: writers were expected to die by SIGKILL, got {codes}")
        counts = {tag: len(w["items"]) for tag, w in sorted(d["workers"].items())}
        print(f"their writes survived them: {counts}")
        if counts != {"w0": KEYS_PER_WRITER, "w1": KEYS_PER_WRITER}:
            raise SystemExit(f"FAILED: writes of killed workers are missing: {counts}")

        # 2. a worker killed while holding the lock
        ready = spawn.Event()
        holder = spawn.Process(target=hold_lock_until_killed, args=(d, ready))
        procs.append(holder)
        holder.start()
        while not ready.wait(0.1):
            if not holder.is_alive():
                raise SystemExit(f"FAILED: the lock holder died first (exit code {holder.exitcode})")
        if d.lock.acquire(blocking=False):
            raise SystemExit("FAILED: took a lock that a live process holds")
        print(f"pid {holder.pid} holds the lock (a non-blocking acquire here returns False); killing it now")
        holder.kill()  # SIGKILL while holding d.lock
        holder.join(30)
        print(
            f"pid {holder.pid} was SIGKILLed (exit code {holder.exitcode}); "
            f"the lock word still names pid {d.lock.owner_pid}"
        )
        if d.lock.owner_pid != holder.pid:
            raise SystemExit("FAILED: expected the dead process to still own the lock word")

        report = spawn.Queue()
        taker = spawn.Process(target=take_lock, args=(name, report))
        procs.append(taker)
        taker.start()
        while True:
            try:
                dead, waited = report.get(timeout=0.2)
                break
            except queue.Empty:
                if not taker.is_alive():
                    raise SystemExit(
                        f"FAILED: the lock taker exited {taker.exitcode} without reporting"
                    ) from None
        taker.join(30)
        print(
            f"a fresh process (pid {taker.pid}) took the lock of dead pid {dead} after waiting {waited:.3f}s"
        )
        if taker.exitcode != 0 or waited > 2.0:
            raise SystemExit(f"FAILED: lock recovery took {waited:.3f}s (exit code {taker.exitcode})")
        if d["recovered_by"] != taker.pid or d["last_holder"] != holder.pid:
            raise SystemExit("FAILED: writes around the recovery are missing")

        # 3. every user gone: the segments stay until unlink_by_name
        d.close()  # auto_unlink=False: closing the creator's handle removes nothing
        left = segments_of(name)
        print(f"all handles closed or killed; segments still in {SHM}: {left}")
        if name not in left or name + "@s" not in left or not any("@d" in s for s in left):
            raise SystemExit(f"FAILED: expected NAME, NAME@s and NAME@d<gen> segments, got {left}")
        removed = unlink_by_name(name)
        after = segments_of(name)
        print(f"unlink_by_name({name!r}) returned {removed}; segments left: {after}")
        if removed != len(left) or after:
            raise SystemExit(f"FAILED: removed {removed} of {len(left)}, left {after}")
        try:
            SharedDict(name=name, create=False)
        except NotFound:
            print("OK: attaching by that name now raises NotFound; nothing leaked")
        else:
            raise SystemExit("FAILED: the dict can still be attached after unlink_by_name")
    finally:
        for p in procs:
            if p.pid is not None:
                if p.is_alive():
                    p.kill()
                p.join()
        d.close()
        unlink_by_name(name)  # no-op (returns 0) when the demo already cleaned up


if __name__ == "__main__":
    main()
