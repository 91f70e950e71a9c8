"""Processes for the transaction tests: ``python -m tests.transaction_workers ROLE NAME ...``.

* ``mover NAME SEED SECONDS``: moves random amounts between the accounts
  ``a0..a9`` in transactions (two writes each: the invariant "the sum is
  constant" holds only between them), printing ``moved N`` at the end;
* ``auditor NAME TOTAL SECONDS``: sums ``d.copy()`` as fast as it can and
  prints ``audits N broken M`` -- a broken snapshot is one whose sum differs;
* ``block NAME FAULT``: opens a transaction, writes ``k0..k9`` (and a blob),
  prints ``inside``, then either waits to be killed (``FAULT`` = ``-``) or
  leaves the block with the fault point armed in the environment.

On Redis (``ULTRADICT_NG_BACKEND``) ``TX_LEASE`` sets the workers' lease:
a killed worker's lock is free that much later.
"""

from __future__ import annotations

import os
import random
import sys
import time

from ultradict_ng import SharedDict

ACCOUNTS = [f"a{i}" for i in range(10)]


def attach(name: str) -> SharedDict:
    lease = os.environ.get("TX_LEASE")
    return SharedDict(name=name, create=False, **({"lease": float(lease)} if lease else {}))


def mover(name: str, seed: int, seconds: float) -> None:
    d = attach(name)
    rnd = random.Random(seed)
    moved = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        src, dst = rnd.sample(ACCOUNTS, 2)
        amount = rnd.randint(1, 50)
        with d.transaction():
            d[src] -= amount
            if rnd.random() < 0.02:
                time.sleep(0.001)  # (a slow block: auditors read meanwhile)
            d[dst] += amount
        moved += 1
    print(f"moved {moved}", flush=True)
    d.close()


def auditor(name: str, total: int, seconds: float) -> None:
    d = attach(name)
    audits = broken = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        snap = d.copy()
        audits += 1
        if sum(snap[a] for a in ACCOUNTS) != total:
            broken += 1
    print(f"audits {audits} broken {broken}", flush=True)
    d.close()


def block(name: str, fault: str) -> None:
    d = attach(name)
    with d.transaction():
        for i in range(10):
            d[f"k{i}"] = i
        d["blob"] = b"x" * 70_000
        print("inside", flush=True)
        if fault == "-":
            time.sleep(60)  # killed here by the parent
    print("left", flush=True)  # (only reached when no fault fired)


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "mover":
        mover(args[0], int(args[1]), float(args[2]))
    elif role == "auditor":
        auditor(args[0], int(args[1]), float(args[2]))
    elif role == "block":
        block(args[0], args[1])
    else:
        raise SystemExit(f"unknown role {role!r}")
