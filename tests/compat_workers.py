"""Worker functions for tests/test_compat.py, written as UltraDict users write them.

They live in an importable module so that ``spawn`` children can run them.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

from ultradict_ng import UltraDict


def set_item(name: str, key: Any, value: Any) -> None:
    """README "Simple", second REPL: attach by name and write."""
    other = UltraDict(name=name)
    other[key] = value
    other.close()


def increment_nested(name: str) -> None:
    """README "Nested", second REPL: ``other['nested']['counter'] += 1``."""
    other = UltraDict(name=name)
    with other.lock:
        other["nested"]["counter"] += 1
    other.close()


def count(name: str, target: int) -> None:
    """examples/parallel.py's worker: attach by name, increment under the lock."""
    d = UltraDict(name=name, shared_lock=True, auto_unlink=False)
    for _ in range(target):
        with d.lock:
            d["counter"] += 1
    d.close()


def count_handle(d: Any, target: int) -> None:
    """The same, with the handle passed pickled (it re-attaches by name)."""
    for _ in range(target):
        with d.lock:
            d["counter"] += 1


def hold_lock(names: Any, ready: Any) -> None:
    """Take the lock of each dict named (one name or a list), say so, and wait to be killed."""
    handles = [UltraDict(name=n) for n in ([names] if isinstance(names, str) else names)]
    for d in handles:
        d.lock.acquire()
    ready.set()
    while True:
        time.sleep(1)


def count_with_crash(d: Any, target: int, crash_at: int, mode: str) -> None:
    """examples/recover_from_stale_lock*.py: count to ``target`` with a crash at ``crash_at``.

    Whoever increments the counter to ``crash_at`` SIGKILLs itself while it
    still holds the lock.  The others must get the lock back:

    * ``plain``: ``with d.lock:`` (recovered automatically);
    * ``steal``: ``with d.lock(timeout=..., steal_after_timeout=True):``;
    * ``manual``: ``with d.lock(block=False):``, and on CannotAcquireLock
      ``steal_from_dead(blocking_pid)`` after a while, as UltraDict's
      recover_from_stale_lock_manual.py does.
    """
    first_failure = 0.0
    while True:
        try:
            if mode == "plain":
                hold = d.lock
            elif mode == "steal":
                hold = d.lock(timeout=1.5, steal_after_timeout=True)
            else:
                hold = d.lock(block=False)
            with hold:
                if d["counter"] >= target:
                    return
                d["counter"] += 1
                first_failure = 0.0
                if d["counter"] == crash_at:
                    os.kill(os.getpid(), signal.SIGKILL)
        except UltraDict.Exceptions.CannotAcquireLock as e:
            assert mode == "manual", f"{mode}: {e!r}"
            if not first_failure:
                first_failure = e.timestamp
            if time.monotonic() - first_failure >= 0.3:
                try:
                    d.lock.steal_from_dead(from_pid=e.blocking_pid, release=True)
                except UltraDict.Exceptions.CannotAcquireLock:
                    pass  # a live process holds it now: just try again
                first_failure = 0.0
            else:
                time.sleep(0.001)


def report(handles: Any, results: Any) -> None:
    """Receive pickled handles (roots or nested views): report what arrived, write through each."""
    for handle in handles:
        results.put((type(handle).__name__, handle.copy(), handle.serializer is json))
        with handle.lock:
            handle["seen_by"] = os.getpid()
