"""Workers of the waiting and change-feed tests (importable by spawned children), and
the helpers those tests share (at the end).

Timing knobs: a worker given ``slice_`` sets ``layout.WAIT_SLICE`` (the longest
single futex sleep) to it, and a worker given ``patient=True`` sets the lock's
owner-liveness intervals to 30 s.  Both are per-process timing constants; the
tests raise them so that a lost wake-up shows as a waiter that does not
return, instead of being hidden by the periodic re-check.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Optional

from ultradict_ng import SharedDict, Unlinked
from ultradict_ng._shm import layout as L


def _patient_lock() -> None:
    L.LOCK_FIRST_CHECK = 30.0
    L.LOCK_CHECK_INTERVAL = 30.0


def change_waiter(name: str, ready: Any, out: Any, timeout: float, slice_: float = 1.0) -> None:
    """Attach, say ready, wait for one change; report (pid, result, when, d.get("k"), mode)."""
    from ultradict_ng._shm import waiting

    L.WAIT_SLICE = slice_
    d = SharedDict(name=name, create=False)
    d.get("k")
    ready.put(os.getpid())
    try:
        ok: Any = d.wait_for_change(timeout)
    except Unlinked:
        ok = "unlinked"
    out.put((os.getpid(), ok, time.monotonic(), d.get("k"), waiting.MODE))
    d.close()


def lock_holder(name: str, ready: Any, release: Any) -> None:
    """Take the lock, say so, hold it until ``release`` is set (or 60 s), release it."""
    d = SharedDict(name=name, create=False)
    d.lock.acquire()
    ready.set()
    release.wait(60)
    d.lock.release()
    d.close()


def lock_sleeper(name: str, started: Any, done: Any, patient: bool = False) -> None:
    """Block in ``with d.lock`` (asleep while another holds it); then ``n += 1``."""
    if patient:
        _patient_lock()
    d = SharedDict(name=name, create=False)
    started.put(os.getpid())
    with d.lock:
        d["n"] += 1
        when = time.monotonic()
    done.put((os.getpid(), when))
    d.close()


def lock_waiter_paused(name: str, registered: Any, go: Any, done: Any, patient: bool = False) -> None:
    """As :func:`lock_sleeper`, but the waiter stops right after registering (waiter
    step 1) until ``go`` is set, as if descheduled there: a release in between
    sees its bit and wakes nobody.  Then it goes on: takes the lock, ``n += 1``."""
    from ultradict_ng._shm import waiting

    if patient:
        _patient_lock()

    enter = waiting.ProcessWaits.enter

    def paused(self: Any, words: Any, waiters: int) -> bool:
        ok = enter(self, words, waiters)
        if waiters == L.W_LOCK_WAITERS:
            registered.set()
            go.wait(60)
        return ok

    waiting.ProcessWaits.enter = paused  # type: ignore[method-assign]
    d = SharedDict(name=name, create=False)
    with d.lock:
        d["n"] += 1
        when = time.monotonic()
    done.put((os.getpid(), when))
    d.close()


def locked_increments(name: str, times: int, patient: bool, out: Any) -> None:
    """``with d.lock: d["n"] += 1`` ``times`` times; report this process's waiting mode."""
    from ultradict_ng._shm import waiting

    if patient:
        _patient_lock()
    d = SharedDict(name=name, create=False)
    for _ in range(times):
        with d.lock:
            d["n"] += 1
    out.put(waiting.MODE)
    d.close()


def script_server(conn: Any) -> None:
    """Run write scripts sent by the test: ``(name, [(delay, key, value), ...])``;
    answer with the time of the last write.  ``None`` stops the server."""
    while True:
        if not conn.poll(60):
            return
        msg = conn.recv()
        if msg is None:
            return
        name, script = msg
        d = SharedDict(name=name, create=False)
        last = 0.0
        for delay, key, value in script:
            if delay:
                time.sleep(delay)
            if key == "dump":
                d._store.force_dump()
            elif key == "update":
                d.update(value)
            else:
                d[key] = value
            last = time.monotonic()
        d.close()
        conn.send(last)


def feed_writer(name: str, ops: list[tuple[Any, ...]]) -> None:
    """Apply ``ops`` (see tests.feed_model.apply_op) to the dict from another process."""
    from tests.feed_model import apply_op

    d = SharedDict(name=name, create=False)
    for op in ops:
        apply_op(d, op)
    d.close()


def feed_follower(name: str, ready: Any, out: Any, quiet: float) -> None:
    """Follow the dict through ``changes()`` until ``quiet`` seconds pass without
    one; report the changes and this handle's final copy."""
    d = SharedDict(name=name, create=False)
    start = d.copy()  # the feed starts at the state this handle's cache reflects
    it = d.changes(timeout=quiet)
    ready.put(os.getpid())
    items = list(it)
    out.put((start, items, d.copy()))
    d.close()


# -- helpers of the tests (not workers) ------------------------------------------------------


def words(d: Any) -> Any:
    """The control words of ``d``'s dict (plain loads)."""
    return d._store._map.words


def slots(d: Any) -> list[int]:
    w = words(d)
    return [w[L.W_WAIT_SLOTS + i] for i in range(L.WAIT_SLOTS)]


def slot_of(d: Any, pid: int) -> Optional[int]:
    """The wait slot holding process ``pid``'s owner word, or None."""
    from ultradict_ng._platform.owner import pid_of

    for i, word in enumerate(slots(d)):
        if word and pid_of(word) == pid:
            return i
    return None


def wait_until(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``cond`` until it is truthy (its value) or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.005)


def registered(d: Any, pid: int, waiters_word: int, timeout: float = 20) -> int:
    """Wait until process ``pid`` holds a slot with its bit set in ``waiters_word``; the slot."""

    def check() -> Optional[int]:
        i = slot_of(d, pid)
        return i + 1 if i is not None and words(d)[waiters_word] >> i & 1 else None

    return wait_until(check, timeout, f"pid {pid} registered in word {waiters_word}") - 1


def in_thread(fn: Callable[[], Any], timeout: float) -> Any:
    """``fn()`` in a daemon thread, bounded: its result, or its exception re-raised."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"still blocked after {timeout}s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def stop(*procs: Any) -> None:
    """End the processes a test started (through their own handles, by pid), then reap them."""
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)
