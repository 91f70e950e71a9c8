"""Workers of the user-register tests (importable by spawned children), and the
helpers those tests share.

Every worker reports through a queue or an event and ends when told to (or is
SIGKILLed by the test); none runs longer than its bounded waits.
"""

from __future__ import annotations

import mmap
import os
import random
import time
from typing import Any, Optional

from tests.wait_workers import stop, wait_until  # noqa: F401  (re-exported for test_users)
from ultradict_ng import SharedDict, Unlinked
from ultradict_ng._shm import layout as L
from ultradict_ng._shm.control import Header, attach_control
from ultradict_ng._shm.mapping import Mapping
from ultradict_ng._shm.users import Verdict, remove_if_unused


def attach_and_wait(name: str, out: Any, release: Any, auto_unlink: Any = None) -> None:
    """Attach, report (pid, the alive pids this process sees), wait for ``release``
    (at most 60 s), close."""
    d = SharedDict(name=name, create=False, auto_unlink=auto_unlink)
    out.put((os.getpid(), sorted(u.pid for u in d.users() if u.alive)))
    release.wait(60)
    d.close()
    out.put(("closed", os.getpid()))


def attach_and_hang(name: str, out: Any) -> None:
    """Attach, report the pid, then wait to be killed (60 s at most)."""
    d = SharedDict(name=name, create=False)
    d["hung"] = os.getpid()
    out.put(os.getpid())
    time.sleep(60)
    d.close()


def raw_mapper(name: str, out: Any, release: Any) -> None:
    """Map the control segment with a bare ``mmap``, never registering as a user."""
    fd = os.open(f"/dev/shm/{name}", os.O_RDWR)
    try:
        m = mmap.mmap(fd, L.CONTROL_SIZE)
    finally:
        os.close(fd)
    out.put(os.getpid())
    release.wait(60)
    m.close()


def forked_user(out: Any, release: Any) -> None:
    """A forked child that only inherited its parent's handles: report, wait, exit."""
    out.put(os.getpid())
    release.wait(60)


def churn(name: str, seconds: float, out: Any, enough: Any) -> None:
    """The attacher side of the remove race: open (creating if the name is gone),
    write, check we are a live user, check the dict was not unlinked under us,
    close; until ``enough`` is set (at most ``seconds``).  Reports a dict of counts
    and the violations seen."""
    counts: dict[str, Any] = {"attached": 0, "created": 0, "errors": []}
    rng = random.Random(os.getpid())
    end = time.monotonic() + seconds
    me = os.getpid()
    i = 0
    while time.monotonic() < end and not enough.is_set():
        i += 1
        try:
            d = SharedDict(name=name, create=None, auto_unlink=False)
        except Exception as exc:  # reported to the test
            counts["errors"].append(f"open failed: {type(exc).__name__}: {exc}")
            continue
        try:
            counts["created" if d._store.created else "attached"] += 1
            try:
                d["k"] = i
                if d["k"] != i:
                    counts["errors"].append(f"read back {d['k']!r}, wrote {i}")
                if me not in {u.pid for u in d.users() if u.alive}:
                    counts["errors"].append("not in users() while attached")
                d["k2"] = i
            except Unlinked as exc:
                counts["errors"].append(f"Unlinked while attached: {exc}")
            if d.stats()["unlinked"]:
                counts["errors"].append("the dict was unlinked while this process had it open")
        finally:
            d.close()
        if len(counts["errors"]) > 20:
            break
        # Unused now and then, for a random while: the remover gets its chances,
        # and its steps meet our next attach at every point.
        if i % 2:
            time.sleep(rng.uniform(0, 0.03))
    out.put(counts)


def remove_once(name: str) -> Optional[Verdict]:
    """The command line's "clean" of one dict: the remove protocol; None if the
    name was gone (or its creator not finished)."""
    try:
        mapping = Mapping(attach_control(name), None)
    except FileNotFoundError:
        return None
    try:
        token = Header.read(name, mapping.words).token
        return remove_if_unused(name, mapping, token)
    finally:
        mapping.release()


def remover(name: str, seconds: float, out: Any) -> None:
    """The remover side of the race: :func:`remove_once` in a loop; reports counts."""
    counts = {"removed": 0, "kept": 0, "gone": 0}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        v = remove_once(name)
        if v is None:
            counts["gone"] += 1
        elif v.removed:
            counts["removed"] += 1
        else:
            counts["kept"] += 1
    out.put(counts)


# -- helpers of the tests ----------------------------------------------------------


def user_words(d: SharedDict) -> list[int]:
    w = d._store._map.words
    return [w[L.W_USER_SLOTS + i] for i in range(L.USER_SLOTS)]


def alive_pids(d: SharedDict) -> set[int]:
    return {u.pid for u in d.users() if u.alive}


def close_together(names: Any, barrier: Any) -> None:
    """For each dict: attach with auto_unlink="last", then close at the same
    instant as the other workers (a barrier before and after each close)."""
    for name in names:
        d = SharedDict(name=name, create=False, auto_unlink="last")
        barrier.wait(60)
        d.close()
        barrier.wait(60)
