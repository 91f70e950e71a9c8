"""Child processes for tests/test_cli.py: ``python tests/cli_workers.py COMMAND ARGS``.

Each long-lived worker prints ``ready <pid>`` once it is in the state the test
needs, then sleeps until the test kills it.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ultradict_ng import SharedDict
from ultradict_ng.errors import SharedDictError


def _ready() -> None:
    print(f"ready {os.getpid()}", flush=True)


def _sleep_forever() -> None:
    while True:
        time.sleep(1)


def hold(name: str, *flags: str) -> None:
    """Create ``name`` with a few keys of every kind and keep it open
    (``lock``: also hold its lock)."""
    d = SharedDict(name=name, auto_unlink=False, recurse=True)
    d["a"] = 1
    d[42] = "forty-two"
    d["nested"] = {"x": {"y": 2}}
    d["raw"] = b"\x01" * 100
    if "numpy" in flags:
        import numpy as np

        d["arr"] = np.zeros((300, 400), dtype="float32")  # 480 000 B: a blob
    if "lock" in flags:
        d.lock.acquire()
    _ready()
    _sleep_forever()


def attach(name: str) -> None:
    """Attach to an existing dict and keep it open."""
    d = SharedDict(name=name, create=False)  # noqa: F841 - held until killed
    _ready()
    _sleep_forever()


def map_only(name: str) -> None:
    """Map the control segment without registering as a user (as a raw mmap would)."""
    with open(f"/dev/shm/{name}", "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)  # noqa: F841 - held until killed
    _ready()
    _sleep_forever()


class OpenTrap:
    """Unpickling it creates ``path`` (it reduces to ``open(path, "w")``)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (self.path, "w"))


class SystemTrap:
    """Unpickling it runs ``touch path`` (it reduces to ``os.system``)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.path}",))


def evil(name: str, marker: str, key: str = "evil") -> None:
    """Write traps into the pickle dict ``name`` (created if missing), then leave
    without unlinking it.  The writer unpickles its own values (its copies), so
    give a relative ``marker``: each process that runs a trap creates it in its
    own working directory."""
    d = SharedDict(name=name, serializer="pickle", auto_unlink=False)
    d[key] = OpenTrap(marker)
    d[key + "-system"] = SystemTrap(marker)
    d["plain"] = [1, "two"]
    d.close()


def churn(name: str, stop: str) -> None:
    """Open ``name`` (creating it if `clean` removed it), write, check, close -- again
    and again until the file ``stop`` exists; print a JSON summary and exit 1 on any error."""
    import random

    rounds = created = 0
    errors = []
    _ready()
    while not os.path.exists(stop):
        rounds += 1
        try:
            d = SharedDict(name=name, auto_unlink=False)
            try:
                if "n" not in d:
                    created += 1
                d["n"] = rounds
                d[f"k{rounds % 5}"] = rounds
                if d["n"] != rounds or d[f"k{rounds % 5}"] != rounds:
                    errors.append(f"round {rounds}: read back {d.get('n')!r}")
                time.sleep(0.002)
                d["n"] = -rounds
                if d["n"] != -rounds:
                    errors.append(f"round {rounds}: second read back {d.get('n')!r}")
            finally:
                d.close()
        except SharedDictError as exc:
            errors.append(f"round {rounds}: {type(exc).__name__}: {exc}")
        time.sleep(random.uniform(0, 0.01))  # unused meanwhile: clean may remove it
    print(json.dumps({"rounds": rounds, "created": created, "errors": errors[:10]}), flush=True)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    globals()[sys.argv[1].replace("-", "_")](*sys.argv[2:])
