"""Processes for the tests of dicts kept in files (tests/test_durable*.py).

``python -m tests.durable_workers write PATH START COUNT [transaction]``:
writes ``d["k<i % 5>"] = i`` for i in START..START+COUNT-1 (and a 300-byte
``big`` value every 4th write, so that dumps and blobs happen), printing
``ack KEY VALUE`` after each write returns; with ``transaction`` each i is
one block.  The parent kills it (SIGKILL, or an armed fault point) and knows
exactly which writes were acknowledged.

``python -m tests.durable_workers abort PATH``: a transaction aborted, one
write after it, then the process kills itself (no close).

``python -m tests.durable_workers open PATH``: opens the dict (recovering it
if needed) and prints its contents as JSON.

``python -m tests.durable_workers contents DIR...``: for each directory,
opens the dict, prints one line ``DIR <canonical repr of its contents>`` (or
``DIR ERROR <exception>``), then removes it with ``unlink()``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from typing import Any

from ultradict_ng import SharedDict


def plain(value: Any) -> Any:
    """A canonical, comparable form: nested dicts as sorted item lists."""
    if isinstance(value, dict) or hasattr(value, "keys"):
        return ("dict", sorted(((repr(k), plain(value[k])) for k in value.keys()), key=lambda kv: kv[0]))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [plain(v) for v in value])
    return value


def write(path: str, start: int, count: int, transactional: bool) -> None:
    d = SharedDict(path=path, create=False)
    for i in range(start, start + count):
        key = f"k{i % 5}"
        with d.transaction() if transactional else contextlib.nullcontext():
            if i % 4 == 3:
                d["big"] = bytes([i % 256]) * 300
            d[key] = i
        print(f"ack {key} {i}", flush=True)
    d.close()


def main() -> None:
    command = sys.argv[1]
    if command == "write":
        write(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:] == ["transaction"])
    elif command == "abort":  # a transaction aborted, a write after it, then killed: no close
        d = SharedDict(path=sys.argv[2], sync="always", buffer_size=1 << 16)
        d["k"] = 0
        try:
            with d.transaction():
                d["k"] = 1
                d["other"] = 2
                raise RuntimeError("abort")
        except RuntimeError:
            pass
        d["k"] = 3  # (overwrites the first aborted record exactly: the second starts where it ends)
        print("done", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    elif command == "open":
        d = SharedDict(path=sys.argv[2], create=False)
        contents = d.copy()  # (nested dicts as plain ones)
        raw = (bytes, bytearray, memoryview)
        shown = {k: bytes(v).hex() if isinstance(v, raw) else v for k, v in contents.items()}
        print(json.dumps(shown), flush=True)
        d.close()
    elif command == "contents":
        for directory in sys.argv[2:]:
            try:
                d = SharedDict(path=directory, create=False)
            except Exception as exc:
                print(directory, "ERROR", repr(exc), flush=True)
                continue
            try:
                print(directory, repr(plain(d)), flush=True)
            except Exception as exc:
                print(directory, "ERROR", repr(exc), flush=True)
            finally:
                d.unlink()
                d.close()
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
