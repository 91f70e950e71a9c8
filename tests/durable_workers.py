"""Processes for the tests of dicts kept in files (tests/test_durable*.py).

``python -m tests.durable_workers write PATH START COUNT [transaction]``:
writes ``d["k<i % 5>"] = i`` for i in START..START+COUNT-1 (and a 300-byte
``big`` value every 4th write, so that dumps and blobs happen), printing
``ack KEY VALUE`` after each write returns; with ``transaction`` each i is
one block.  The parent kills it (SIGKILL, or an armed fault point) and knows
exactly which writes were acknowledged.

``python -m tests.durable_workers abort PATH``: a transaction aborted (the
stream's first bytes printed before its rollback), one write after it, then
the process kills itself (no close).

``python -m tests.durable_workers set PATH KEY VALUE``: ``d[KEY] = VALUE``, then a close.

``python -m tests.durable_workers create PATH``: ``SharedDict({"config": "v1",
"counter": 0}, path=PATH)``, then a close.

``python -m tests.durable_workers compact PATH``: a checkpoint now (what
``ultradict-ng compact`` does), then a close.

``python -m tests.durable_workers die PATH COUNT``: writes ``d["k<i>"] = i``
for i below COUNT, then the process kills itself (no close).

``python -m tests.durable_workers open PATH``: opens the dict (recovering it
if needed) and prints its contents as JSON.

``python -m tests.durable_workers contents DIR...``: for each directory,
opens the dict, prints one line ``DIR <canonical repr of its contents>`` (or
``DIR ERROR <exception>``), then removes it with ``unlink()``.

``python -m tests.durable_workers cache-contents DIR...``: the same for a
SharedCache kept in each directory, whose side segment must pass
:func:`audit_side` once opened (else ``DIR ERROR side: ...``).
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


def cache_state(cache: Any) -> list[tuple[str, Any]]:
    """A cache's live entries, as sorted ``(repr(key), value)`` pairs."""
    return sorted((repr(k), plain(cache._d[k][2])) for k in cache._d if len(cache._d[k]) == 3)


def audit_side(cache: Any) -> str:
    """What is wrong with a SharedCache's side segment against its entries, or
    '' (cache_layout: one slot per entry, below ``next``, none of them on the
    free stack nor twice on it; ``bytes`` the sum of the entries' sizes, each
    size its entry's; the expiring flag set if an entry expires)."""
    from ultradict_ng.cache import layout as C

    side = cache._side
    w = side.words
    if w[C.W_BATCH]:
        return "the batch word is still set"
    entries = {k: cache._d[k] for k in cache._d}
    if any(e[0] or len(e) == 4 for e in entries.values()) and not w[C.W_FLAGS]:
        return "entries expire but the expiring flag is clear"
    if not side.nslots:
        return ""
    slots = [e[1] for e in entries.values()]
    if len(set(slots)) != len(slots):
        return f"entries share slots: {sorted(slots)}"
    if any(s >= w[C.W_NEXT] for s in slots):
        return f"slots {sorted(slots)} reach past next={w[C.W_NEXT]}"
    free = [side.free[i] for i in range(w[C.W_FREE])]
    if len(set(free)) != len(free) or set(free) & set(slots):
        return f"free stack {free} repeats a slot or holds one in use ({sorted(slots)})"
    if cache._size_codec is not None:
        for k, e in entries.items():
            if side.sizes[e[1]] != cache._size(k, e[2] if len(e) == 3 else None):
                return f"the size of {k!r} is {side.sizes[e[1]]}"
        if w[C.W_BYTES] != sum(side.sizes[s] for s in slots):
            return f"bytes {w[C.W_BYTES]} != {sum(side.sizes[s] for s in slots)}"
    return ""


def _contents(directory: str, cache: bool) -> str:
    """What the dict (or cache) kept in ``directory`` opens as, or ``ERROR ...``;
    then it is removed."""
    from ultradict_ng.cache import SharedCache

    try:
        d: Any = (SharedCache if cache else SharedDict)(path=directory, create=False)
    except Exception as exc:
        return f"ERROR {exc!r}"
    try:
        if not cache:
            return repr(plain(d))
        problem = audit_side(d)
        return f"ERROR side: {problem}" if problem else repr(cache_state(d))
    except Exception as exc:
        return f"ERROR {exc!r}"
    finally:
        d.unlink()
        d.close()


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
                with open(os.path.join(sys.argv[2], "stream"), "rb") as f:  # (its records, before rollback)
                    print("raw", f.read(4096).hex(), flush=True)
                raise RuntimeError("abort")
        except RuntimeError:
            pass
        d["k"] = 3  # (overwrites the first aborted record exactly: the second starts where it ends)
        print("done", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    elif command == "set":
        d = SharedDict(path=sys.argv[2], create=False)
        d[sys.argv[3]] = sys.argv[4]
        d.close()
    elif command == "create":
        SharedDict({"config": "v1", "counter": 0}, path=sys.argv[2]).close()
    elif command == "compact":
        d = SharedDict(path=sys.argv[2], create=False)
        d._store.force_dump()
        d.close()
    elif command == "die":
        d = SharedDict(path=sys.argv[2], create=False)
        for i in range(int(sys.argv[3])):
            d[f"k{i}"] = i
        print("done", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    elif command == "open":
        d = SharedDict(path=sys.argv[2], create=False)
        contents = d.copy()  # (nested dicts as plain ones)
        raw = (bytes, bytearray, memoryview)
        shown = {k: bytes(v).hex() if isinstance(v, raw) else v for k, v in contents.items()}
        print(json.dumps(shown), flush=True)
        d.close()
    elif command in ("contents", "cache-contents"):
        for directory in sys.argv[2:]:
            print(directory, _contents(directory, command == "cache-contents"), flush=True)
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
