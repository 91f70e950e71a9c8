"""Worker functions for multi-process tests (importable by spawned children)."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from ultradict_ng import SharedDict


def increment(name: str, key: str, times: int) -> None:
    """``with d.lock: d[key] += 1`` ``times`` times."""
    d = SharedDict(name=name, create=False)
    for _ in range(times):
        with d.lock:
            d[key] += 1
    d.close()


def increment_nested(d: Any, key: str, times: int) -> None:
    """Increment ``d["counters"][key]`` under the lock; ``d`` arrives pickled (spawn)."""
    for _ in range(times):
        with d.lock:
            d["counters"][key] += 1


def hold_lock_forever(name: str, ready: Any) -> None:
    """Take the lock, say so, then wait to be killed."""
    d = SharedDict(name=name, create=False)
    d.lock.acquire()
    ready.set()
    while True:
        time.sleep(1)


def hold_lock_then_exit(name: str, seconds: float) -> None:
    d = SharedDict(name=name, create=False)
    with d.lock:
        d["holder"] = os.getpid()
        time.sleep(seconds)
    d.close()


def create_or_attach(name: str, results: Any) -> None:
    """One racer of the create race: report whether it saw initial data."""
    d = SharedDict({"init": os.getpid()}, name=name, auto_unlink=False)
    with d.lock:
        d["count"] = d.get("count", 0) + 1
    results.put((os.getpid(), d["init"]))
    d.close()


def writer_then_kill_self(name: str, n: int) -> None:
    """Write n keys, then die without closing anything."""
    d = SharedDict(name=name, create=False)
    for i in range(n):
        d[f"{os.getpid()}-{i}"] = i
    os.kill(os.getpid(), signal.SIGKILL)


def sequence_writer(name: str, wid: int, n: int) -> None:
    """Write increasing sequence numbers under key ``w<wid>``, with churn that forces dumps:
    short-lived keys, pops, and now and then a value larger than the stream."""
    d = SharedDict(name=name, create=False)
    for i in range(n):
        d[f"w{wid}"] = i
        if i % 7 == 0:
            d[f"tmp{wid}"] = [i, str(i)]
        if i % 11 == 0:
            d.pop(f"tmp{wid}", None)
        if i % 97 == 0:
            d[f"big{wid}"] = bytes([i % 256]) * 5000
        if i % 5 == 0:
            with d.lock:
                d["total"] = d.get("total", 0) + 1
    d.close()


if __name__ == "__main__":  # used by subprocess tests: python -m tests.helpers CMD NAME ...
    cmd, dict_name = sys.argv[1], sys.argv[2]
    if cmd == "set":
        d = SharedDict(name=dict_name, create=False)
        d[sys.argv[3]] = sys.argv[4]
        d.close()
    elif cmd == "get":
        d = SharedDict(name=dict_name, create=False)
        print(repr(d.get(sys.argv[3])))
        d.close()
    elif cmd == "create":
        d = SharedDict({"from": "subprocess"}, name=dict_name, create=True, auto_unlink=False)
        d.close()
    elif cmd == "incr":
        increment(dict_name, sys.argv[3], int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown command {cmd}")


def make_half_created(name: str, creator: int, stream: bool = False) -> None:
    """A control segment as a creator leaves it before publishing MAGIC: the
    header's layout word written (it comes first), ``creator`` as the creator
    word; with ``stream``, the stream segment too."""
    from ultradict_ng._platform.segments import Segment
    from ultradict_ng._shm import layout as L

    ctrl = Segment.create(name, L.CONTROL_SIZE)
    words = memoryview(ctrl.buf).cast("Q")  # type: ignore[arg-type]
    words[L.W_LAYOUT] = L.LAYOUT_VERSION | (L.CONTROL_SIZE << 32)
    words[L.W_CREATOR] = creator
    words.release()
    ctrl.close()
    if stream:
        Segment.create(L.stream_name(name), 4096).close()


def count_decodes(monkeypatch: Any, d: SharedDict) -> list[int]:
    """The payload count of every ``loads_many`` call of ``d``'s codec class
    from now on (a reader's records decoded, not taken from their bytes)."""
    decoded: list[int] = []
    real = type(d._store.codec).loads_many

    def spy(self: Any, payloads: list[Any], framed: bool) -> Any:
        decoded.append(len(payloads))
        return real(self, payloads, framed)

    monkeypatch.setattr(type(d._store.codec), "loads_many", spy)
    return decoded


def expire_when_incr_declines(monkeypatch: Any, later: float) -> None:
    """From the moment ``SharedCache.incr`` declines a value that is no int
    (a float: the backends then add to it in Python), the cache's clock
    reads ``later`` seconds on: its entry expires between the two steps,
    as it may under the lock (expiry is time)."""
    from ultradict_ng.cache import sharedcache

    declined = sharedcache.SharedCache.incr

    def then_it_expires(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return declined(self, *args, **kwargs)
        except TypeError:
            monkeypatch.setattr(sharedcache, "_now", lambda: time.time() + later)
            raise

    monkeypatch.setattr(sharedcache.SharedCache, "incr", then_it_expires)
