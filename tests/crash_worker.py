"""Writer process for crash tests: ``python -m tests.crash_worker NAME START COUNT``.
(``--follow NAME``: a waiter instead; see :func:`follow`.  ``--remove NAME``: a
remover, see :func:`remove`.)

Writes ``d["k<i % 5>"] = i`` (under the lock with a 4th argument ``locked``;
in a ``with d.transaction()`` block with ``transaction``) for i in START..START+COUNT-1 (plus a value larger
than the stream every 4th write, so dumps happen), printing ``ack KEY VALUE``
after each write returns: the parent knows exactly which writes were
acknowledged before the process died (at an armed fault point or by SIGKILL).
"""

from __future__ import annotations

import contextlib
import json
import sys

from ultradict_ng import SharedDict


def main() -> None:
    name, start, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    locked = sys.argv[4:] == ["locked"]  # each write under ``with d.lock``
    transactional = sys.argv[4:] == ["transaction"]  # each write (and "big") in one block
    d = SharedDict(name=name, create=False)
    for i in range(start, start + count):
        key = f"k{i % 5}"
        if locked:
            d.lock.acquire()
        with d.transaction() if transactional else contextlib.nullcontext():
            if i % 4 == 3:
                d["big"] = bytes([i % 256]) * 300
            d[key] = i
        if locked:
            d.lock.release()
        print(f"ack {key} {i}", flush=True)
    d.close()


def follow(name: str) -> None:
    """Print ``ready``, then follow the dict with ``wait_for_change`` (only wake-ups
    end its sleeps in time: ``WAIT_SLICE`` is 60 s) until ``stop`` appears; print
    ``timeout`` if a wait ran out, and finally the ``k*`` keys as JSON."""
    from ultradict_ng._shm import layout as L

    L.WAIT_SLICE = 60.0
    d = SharedDict(name=name, create=False)
    d.get("stop")
    print("ready", flush=True)
    while not d.get("stop"):
        if not d.wait_for_change(timeout=30):
            print("timeout", flush=True)
            break
    print("final", json.dumps({k: v for k, v in d.items() if k.startswith("k")}), flush=True)
    d.close()


def remove(name: str) -> None:
    """Run the remove protocol ("close if unused", as ``clean`` does) on one dict;
    print ``removed N``, ``kept REASON`` or ``gone``."""
    from tests.users_workers import remove_once

    verdict = remove_once(name)
    if verdict is None:
        print("gone", flush=True)
    elif verdict.removed:
        print(f"removed {verdict.removed}", flush=True)
    else:
        print(f"kept {verdict.reason}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--follow":
        follow(sys.argv[2])
    elif sys.argv[1] == "--remove":
        remove(sys.argv[2])
    else:
        main()
