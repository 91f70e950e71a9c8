"""The user register (layout: "Users"): who has a dict open, across handles,
processes, forks, crashes and a full register; ``auto_unlink="last"``; and
removing a dict only when nobody uses it -- above all, never under a process
that is attaching at that very moment (the remove race).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tests import users_workers as W
from tests.conftest import unique_name
from tests.users_workers import alive_pids, remove_once, stop, user_words, wait_until
from ultradict_ng import SharedDict, unlink_by_name
from ultradict_ng._platform.owner import owner_word
from ultradict_ng._shm import layout as L
from ultradict_ng._shm import users
from ultradict_ng._shm.control import Header, attach_control
from ultradict_ng._shm.mapping import Mapping

spawn = multiprocessing.get_context("spawn")
fork = multiprocessing.get_context("fork")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ME = os.getpid()


def exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/{name}")


def start(ctx: Any, target: Any, *args: Any) -> Any:
    p = ctx.Process(target=target, args=args)
    p.start()
    return p


@pytest.fixture
def kept(name: str):
    """A dict nobody has open: made with ``auto_unlink=False`` and closed.  This
    process keeps its control segment mapped (not registered), so that a ``clean``
    run by another test session at the same time sees it in use; our own
    remover ignores this process.  Yields that mapping; unlinks the dict after."""
    d = SharedDict(name=name, auto_unlink=False)
    m = Mapping(attach_control(name), None)
    d.close()
    yield m
    m.release()
    unlink_by_name(name)


# -- one process -----------------------------------------------------------------------


def test_creator_is_registered_before_magic_is_published(name, monkeypatch):
    """The creator's slot is taken before MAGIC is stored: a published dict always
    has its creator in the register."""
    seen: list[Any] = []

    from ultradict_ng._shm import store as store_mod

    real_register = users.register

    def spy(key: Any, atomic: Any) -> None:
        real_register(key, atomic)
        seen.append(("registered", atomic.load(L.W_MAGIC)))

    monkeypatch.setattr(store_mod.users, "register", spy)
    d = SharedDict({"a": 1}, name=name)
    assert seen == [("registered", 0)], "registered after MAGIC was published"
    assert [(u.pid, u.alive) for u in d.users()] == [(ME, True)]
    assert d.users()[0].start_time == owner_word() >> L.PID_BITS
    assert d.stats()["users"] == 1 and d.stats()["unregistered_users"] == 0
    d.close()


def test_handles_of_one_process_share_one_slot(name):
    d = SharedDict(name=name)
    others = [SharedDict(name=name, create=False) for _ in range(3)]
    assert [u.pid for u in d.users()] == [ME]
    assert sum(1 for w in user_words(d) if w) == 1
    for h in others:
        h.close()
        assert [(u.pid, u.alive) for u in d.users()] == [(ME, True)]  # d still open
    r = SharedDict(name=name, create=False)
    d.close()  # the creator auto-unlinks, but r still holds the slot
    assert [u.pid for u in r.users()] == [ME]
    r.close()


def test_closing_the_last_handle_frees_the_slot(name, kept):
    r = SharedDict(name=name, create=False)
    r2 = SharedDict(name=name, create=False)
    assert [(u.pid, u.alive) for u in r.users()] == [(ME, True)]
    r.close()
    assert [u.pid for u in users.read_users(kept.atomic)] == [ME]
    r2.close()
    assert not any(kept.words[L.W_USER_SLOTS + i] for i in range(L.USER_SLOTS))
    assert kept.words[L.W_USER_OVERFLOW] == 0


def test_a_handle_collected_without_close_frees_the_slot(name, kept):
    import gc

    r = SharedDict(name=name, create=False)
    assert [u.pid for u in users.read_users(kept.atomic)] == [ME]
    del r
    gc.collect()
    assert users.read_users(kept.atomic) == []


def test_users_of_a_closed_handle_raise_closed(name):
    from ultradict_ng import Closed

    d = SharedDict(name=name)
    d.close()
    with pytest.raises(Closed):
        d.users()


# -- other processes ------------------------------------------------------------------------


def test_spawned_user_is_seen_and_leaves_on_close(dicts, name):
    d = dicts(name=name)
    out, release = spawn.Queue(), spawn.Event()
    p = start(spawn, W.attach_and_wait, name, out, release)
    try:
        pid, seen = out.get(timeout=60)
        assert seen == sorted({ME, pid})  # the child sees us both
        assert alive_pids(d) == {ME, pid}
        assert d.stats()["users"] == 2
        release.set()
        assert out.get(timeout=30) == ("closed", pid)
        p.join(10)
        assert p.exitcode == 0
    finally:
        release.set()
        stop(p)
    assert [u.pid for u in d.users()] == [ME]


def test_unrelated_interpreter_is_seen_and_normal_exit_frees_its_slot(dicts, name):
    """A ``python -c`` process attaches and exits without closing: its slot is freed
    at exit (the handle's finalizer), not left behind."""
    d = dicts(name=name)
    code = textwrap.dedent("""
        import os, sys
        from ultradict_ng import SharedDict
        d = SharedDict(name=sys.argv[1], create=False)
        print(os.getpid(), sorted(u.pid for u in d.users() if u.alive), flush=True)
        sys.stdin.readline()
        # exits without d.close()
    """)
    p = subprocess.Popen(
        [sys.executable, "-c", code, name],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    try:
        line = p.stdout.readline().split(maxsplit=1)
        pid = int(line[0])
        assert line[1].strip() == repr(sorted({ME, pid}))
        assert alive_pids(d) == {ME, pid}
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()
    assert [u.pid for u in d.users()] == [ME]


def test_sigkilled_user_stays_dead_until_freed(dicts, name):
    d = dicts(name=name)
    out = spawn.Queue()
    p = start(spawn, W.attach_and_hang, name, out)
    try:
        pid = out.get(timeout=60)
        assert alive_pids(d) == {ME, pid}
        os.kill(pid, signal.SIGKILL)
        p.join(10)
    finally:
        stop(p)
    got = {u.pid: u.alive for u in d.users()}
    assert got == {ME: True, pid: False}
    assert d.stats()["users"] == 1
    assert users.free_dead(d._store._map.atomic) == 1
    assert [(u.pid, u.alive) for u in d.users()] == [(ME, True)]
    assert d["hung"] == pid  # the dict is fine
    d["after"] = 1


def _a_forked_child_is_a_live_user(d: SharedDict) -> None:
    """A child forked while ``d`` is open is one of its live users until it exits."""
    out, release = fork.Queue(), fork.Event()
    p = start(fork, W.forked_user, out, release)
    try:
        pid = out.get(timeout=30)
        assert alive_pids(d) == {ME, pid}
        assert d.stats()["users"] == 2
        release.set()
        p.join(10)
        assert p.exitcode == 0
    finally:
        release.set()
        stop(p)


def test_forked_child_that_inherited_a_handle_is_a_user_while_alive(dicts, name):
    d = dicts(name=name)
    d["x"] = 1
    _a_forked_child_is_a_live_user(d)
    # A forked multiprocessing child ends with os._exit (no finalizers): its slot
    # may stay, but it is not alive.
    assert alive_pids(d) == {ME}
    users.free_dead(d._store._map.atomic)
    assert [u.pid for u in d.users()] == [ME]


# -- a full register ------------------------------------------------------------------------


def test_full_register_counts_overflow_and_detach_uncounts(name, kept):
    m = kept
    live = owner_word(os.getppid())  # a live process other than us
    try:
        for i in range(L.USER_SLOTS):
            m.atomic.store(L.W_USER_SLOTS + i, live)
        r = SharedDict(name=name, create=False)
        r2 = SharedDict(name=name, create=False)  # the same process: counted once
        assert r.stats()["unregistered_users"] == 1
        assert ME not in {u.pid for u in r.users()}
        assert len(r.users()) == L.USER_SLOTS
        r["k"] = 1  # usable
        r2.close()
        assert m.words[L.W_USER_OVERFLOW] == 1
        r.close()
        assert m.words[L.W_USER_OVERFLOW] == 0
        # A full register of dead owners: they are freed and we take a slot.
        dead = L.PID_MASK | (12345 << L.PID_BITS)
        for i in range(L.USER_SLOTS):
            m.atomic.store(L.W_USER_SLOTS + i, dead)
        r = SharedDict(name=name, create=False)
        assert [(u.pid, u.alive) for u in r.users()] == [(ME, True)]
        assert m.words[L.W_USER_OVERFLOW] == 0
        r.close()
        assert not any(m.words[L.W_USER_SLOTS + i] for i in range(L.USER_SLOTS))
    finally:
        for i in range(L.USER_SLOTS):
            m.atomic.store(L.W_USER_SLOTS + i, 0)


def test_an_overflowed_user_is_still_seen_by_remove_if_unused(name, kept):
    """A spawned process attaches while the register is full (no slot): the
    remover still sees it, through /proc/<pid>/maps."""
    m = kept
    token = Header.read(name, m.words).token
    live = owner_word(os.getppid())
    out, release = spawn.Queue(), spawn.Event()
    p = None
    try:
        for i in range(L.USER_SLOTS):
            m.atomic.store(L.W_USER_SLOTS + i, live)
        p = start(spawn, W.attach_and_wait, name, out, release)
        pid, _ = out.get(timeout=60)
        assert m.words[L.W_USER_OVERFLOW] == 1
        for i in range(L.USER_SLOTS):  # the "live" fakes go: only the overflowed child is left
            m.atomic.store(L.W_USER_SLOTS + i, 0)
        v = users.remove_if_unused(name, m, token)
        assert (v.removed, v.users) == (0, [pid]), v
        assert m.words[L.W_CLOSING] == 0
        release.set()
        p.join(10)
        assert m.words[L.W_USER_OVERFLOW] == 0
        v = users.remove_if_unused(name, m, token)
        assert v.removed == 2 and v.users == [], v
    finally:
        release.set()
        if p is not None:
            stop(p)
    assert not exists(name)


# -- auto_unlink="last" ---------------------------------------------------------------------


def test_auto_unlink_last_in_two_processes(name):
    """Both ends say "last": the dict survives the first close, goes at the last."""
    d = SharedDict({"a": 1}, name=name, auto_unlink="last")
    out, release = spawn.Queue(), spawn.Event()
    p = start(spawn, W.attach_and_wait, name, out, release, "last")
    try:
        pid, _ = out.get(timeout=60)
        d.close()  # the child still uses it
        assert exists(name)
        release.set()
        assert out.get(timeout=30) == ("closed", pid)
        p.join(10)
        assert p.exitcode == 0
    finally:
        release.set()
        stop(p)
    assert not exists(name) and not exists(L.stream_name(name))


def test_auto_unlink_last_when_the_last_users_close_at_the_same_instant():
    """Two processes, the only users, close at once, many times: each may see
    the other still mapping the dict, and only a wait for the one leaving to
    unmap lets one of them remove it (without it: leaked about 1 round in 3)."""
    names = [unique_name() for _ in range(12)]
    for n in names:
        SharedDict({"a": 1}, name=n, auto_unlink=False).close()
    barrier = spawn.Barrier(2)
    procs = [start(spawn, W.close_together, names, barrier) for _ in range(2)]
    try:
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
        assert [n for n in names if exists(n)] == []
    finally:
        for p in procs:
            stop(p)
        for n in names:
            if exists(n):
                unlink_by_name(n)


def test_auto_unlink_last_creator_with_live_attacher_then_attacher_last(name):
    d = SharedDict({"a": 1}, name=name, auto_unlink="last")
    out, release = spawn.Queue(), spawn.Event()
    p = start(spawn, W.attach_and_wait, name, out, release)  # the attacher: no auto_unlink
    try:
        pid, _ = out.get(timeout=60)
        d.close()
        assert exists(name)
        r = SharedDict(name=name, create=False, auto_unlink="last")
        assert r["a"] == 1 and alive_pids(r) == {ME, pid}
        release.set()
        p.join(10)
        assert alive_pids(r) == {ME}
        r.close()  # now the last: removes it
    finally:
        release.set()
        stop(p)
    assert not exists(name)


def test_auto_unlink_last_keeps_the_dict_for_another_handle_of_the_same_process(name):
    d = SharedDict(name=name, auto_unlink="last")
    r = SharedDict(name=name, create=False)
    d.close()  # not this process's last handle
    assert exists(name)
    r["k"] = 1
    m = Mapping(attach_control(name), None)  # in use while we check (see ``kept``)
    r.close()  # r was not "last": the dict stays
    assert exists(name)
    m.release()
    assert unlink_by_name(name) == 2


@pytest.mark.parametrize("value", ["x", "first", 1.5, [1]])
def test_invalid_auto_unlink_raises_value_error(name, value):
    with pytest.raises(ValueError):
        SharedDict(name=name, auto_unlink=value)
    assert not exists(name)


# -- remove_if_unused -------------------------------------------------------------------------


def test_remove_if_unused_refuses_with_a_live_registered_user(name, kept):
    out, release = spawn.Queue(), spawn.Event()
    p = start(spawn, W.attach_and_wait, name, out, release)
    try:
        pid, _ = out.get(timeout=60)
        v = remove_once(name)
        assert v is not None and v.removed == 0 and v.users == [pid], v
        assert v.reason == "registered users are alive"
        release.set()
        p.join(10)
        v = remove_once(name)
        assert v is not None and v.removed == 2 and v.users == [], v
    finally:
        release.set()
        stop(p)
    assert not exists(name)


def test_remove_if_unused_refuses_with_an_unregistered_mapper(name, kept):
    out, release = spawn.Queue(), spawn.Event()
    p = start(spawn, W.raw_mapper, name, out, release)
    try:
        pid = out.get(timeout=60)
        v = remove_once(name)
        assert v is not None and v.removed == 0 and v.users == [pid], v
        assert v.reason == "mapped by live processes"
        # the early check of a caller's maps gives the same answer
        m = Mapping(attach_control(name), None)
        try:
            token = Header.read(name, m.words).token
            v2 = users.remove_if_unused(name, m, token, users.mappers())
            assert v2.removed == 0 and v2.users == [pid]
            assert m.words[L.W_CLOSING] == 0
        finally:
            m.release()
        release.set()
        p.join(10)
        v = remove_once(name)
        assert v is not None and v.removed == 2, v
    finally:
        release.set()
        stop(p)


def test_mapped_by_is_mappers_for_one_name(name):
    """Step b's witnesses of one segment (``mapped_by``) are what the map of
    every segment (``mappers``) says of it: its derived segments and a name it
    begins with are others, and a mapping of an unlinked segment is nobody's."""
    d = SharedDict(name=name)
    try:
        every = users.mappers()
        assert every is not None
        for segment in (name, L.stream_name(name), name[:-1], name + "x"):
            assert users.mapped_by(segment) == every.get(segment, set()), segment
        assert users.mapped_by(name) == {os.getpid()} and users.mapped_by(name[:-1]) == set()
        d.unlink()
        assert users.mapped_by(name) == set() and name not in (users.mappers() or {})
    finally:
        d.close()


def test_remove_if_unused_removes_when_every_user_is_dead(name, kept):
    out = spawn.Queue()
    procs = [start(spawn, W.attach_and_hang, name, out) for _ in range(2)]
    try:
        pids = {out.get(timeout=60) for _ in procs}
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for p in procs:
            p.join(10)
    finally:
        stop(*procs)
    assert {u.pid: u.alive for u in users.read_users(kept.atomic)} == {pid: False for pid in pids}
    v = remove_once(name)
    assert v is not None and v.removed == 2 and v.users == [], v
    assert not exists(name)


def test_remove_if_unused_stops_for_a_live_remover(name, kept):
    m = kept
    m.atomic.store(L.W_CLOSING, owner_word(os.getppid()))
    v = users.remove_if_unused(name, m, Header.read(name, m.words).token)
    assert v.removed == 0 and v.users == [os.getppid()]
    assert v.reason == "another process is removing it"
    m.atomic.store(L.W_CLOSING, 0)


def test_an_attacher_waits_for_a_live_remover_then_times_out(name, kept, monkeypatch):
    """CLOSING held by a live process that never finishes: the attacher waits
    INIT_TIMEOUT, then gives up with LockTimeout, registering nothing."""
    from ultradict_ng import LockTimeout

    monkeypatch.setattr(L, "INIT_TIMEOUT", 0.3)
    m = kept
    m.atomic.store(L.W_CLOSING, owner_word(os.getppid()))
    t0 = time.monotonic()
    with pytest.raises(LockTimeout):
        SharedDict(name=name, create=False)
    assert 0.25 < time.monotonic() - t0 < 2.0
    assert users.read_users(m.atomic) == [] and m.words[L.W_USER_OVERFLOW] == 0
    m.atomic.store(L.W_CLOSING, L.PID_MASK | (7 << L.PID_BITS))  # a dead remover
    r = SharedDict(name=name, create=False)  # takes the dead word over
    assert m.words[L.W_CLOSING] == 0 and alive_pids(r) == {ME}
    r.close()


# -- the remove race ---------------------------------------------------------------------------


@pytest.mark.slow
def test_remove_race_never_removes_a_dict_under_an_attacher(name):
    """One process opens (creating when the name is gone), writes and closes in a
    loop; this one runs the remove protocol in a loop.  A dict must never be
    removed while the attacher has it open: its writes never raise Unlinked and
    it never finds its open dict unlinked."""
    out, enough = spawn.Queue(), spawn.Event()
    p = start(spawn, W.churn, name, 90.0, out, enough)
    removed = kept = gone = 0
    try:
        wait_until(lambda: exists(name), 60, "the attacher created the dict")
        # At least 3 s, and until the race was really run: the pure-Python
        # paths attach ten times slower than the compiled one.
        start_time = time.monotonic()
        deadline = start_time + 90
        result = None
        while result is None:
            now = time.monotonic()
            if (removed >= 3 and kept >= 3 and now - start_time > 3) or now > deadline:
                enough.set()
            v = remove_once(name)
            if v is None:
                gone += 1
            elif v.removed:
                removed += 1
            else:
                kept += 1
            try:
                result = out.get_nowait()
            except queue.Empty:
                assert p.is_alive() or not out.empty(), f"the attacher died: exit code {p.exitcode}"
        p.join(10)
        assert p.exitcode == 0
    finally:
        enough.set()
        stop(p)
        unlink_by_name(name)
    print(
        f"\nremove race: {result['attached']} attaches, {result['created']} creates; "
        f"{removed} removals, {kept} refusals, {gone} gone"
    )
    assert result["errors"] == []
    assert removed >= 3, "the remover never removed the dict: the race was not exercised"
    assert result["attached"] >= 3 and result["created"] >= 3


# -- the state machine --------------------------------------------------------------------------


#: What the state machine did, over all its runs (so the test can check it did it).
STEPS: Counter[str] = Counter()


class UserRegister(RuleBasedStateMachine):
    """Handles in this process and (forked) child users, opened, closed, killed:
    the alive users are always exactly this process (while it has a handle) and
    the live children."""

    def __init__(self) -> None:
        super().__init__()
        self.name = unique_name()
        self.handles: list[SharedDict] = []
        self.children: dict[int, Any] = {}  # pid -> (process, release event)
        self.dead: list[int] = []

    @initialize()
    def make(self) -> None:
        d = SharedDict(name=self.name, auto_unlink=False)
        self.control = Mapping(attach_control(self.name), None)  # see ``kept``
        d.close()

    @rule()
    def open_handle(self) -> None:
        self.handles.append(SharedDict(name=self.name, create=False))

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 10))
    def close_handle(self, i: int) -> None:
        self.handles.pop(i % len(self.handles)).close()
        STEPS["close_handle"] += 1

    @precondition(lambda self: len(self.children) < 4)
    @rule()
    def start_child(self) -> None:
        out, release = fork.Queue(), fork.Event()
        p = start(fork, W.attach_and_wait, self.name, out, release)
        pid, _ = out.get(timeout=30)
        self.children[pid] = (p, release, out)
        STEPS["start_child" if not self.handles else "start_child_inheriting"] += 1

    @precondition(lambda self: self.children)
    @rule(i=st.integers(0, 10), how=st.sampled_from(["close", "kill"]))
    def end_child(self, i: int, how: str) -> None:
        pid = sorted(self.children)[i % len(self.children)]
        p, release, out = self.children.pop(pid)
        STEPS[how] += 1
        if how == "kill":
            os.kill(pid, signal.SIGKILL)
            self.dead.append(pid)
        else:
            release.set()
            assert out.get(timeout=30) == ("closed", pid)
        p.join(10)
        assert p.exitcode is not None

    @precondition(lambda self: any(not u.alive for u in users.read_users(self.control.atomic)))
    @rule()
    def free_dead(self) -> None:
        STEPS["freed"] += users.free_dead(self.control.atomic)
        assert all(u.alive for u in users.read_users(self.control.atomic))

    @invariant()
    def alive_users_match_the_model(self) -> None:
        if not hasattr(self, "control"):
            return
        expected = set(self.children) | ({ME} if self.handles else set())
        got = [u for u in users.read_users(self.control.atomic) if u.alive]
        assert {u.pid for u in got} == expected
        assert len(got) == len(expected), "a process holds two slots"
        for h in self.handles:
            assert {u.pid for u in h.users() if u.alive} == expected
            assert h.stats()["users"] == len(expected)
        assert self.control.words[L.W_USER_OVERFLOW] == 0

    def teardown(self) -> None:
        for _, release, _ in self.children.values():
            release.set()
        for p, _, _ in self.children.values():
            p.join(10)
            stop(p)
        for h in self.handles:
            h.close()
        if hasattr(self, "control"):
            self.control.release()
        unlink_by_name(self.name)


UserRegister.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.slow
def test_user_register_state_machine() -> None:
    STEPS.clear()
    UserRegister.TestCase().runTest()
    for step in ("start_child", "start_child_inheriting", "close", "kill", "close_handle", "freed"):
        assert STEPS[step] > 0, f"the state machine never did {step!r}: {dict(STEPS)}"


def test_a_handle_released_without_a_detach_does_not_keep_a_forked_child_out(dicts, name):
    """A registration whose words were released without a detach (a close
    interrupted between the two) is skipped in a forked child, which still
    registers in every other dict it maps."""
    stale = dicts(name=name + "s")
    key = (stale._store.name, stale._store.token)
    stale._store._finalizer.detach()
    stale._store._map.release()  # (words released, the registration left)
    d = dicts(name=name)
    d["x"] = 1
    try:
        _a_forked_child_is_a_live_user(d)
    finally:
        users._attached.pop(key, None)  # (this process's own stale entry)
        SharedDict.unlink_by_name(name + "s")
