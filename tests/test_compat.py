"""The UltraDict drop-in: UltraDict 0.0.6's documented API on the new engine.

Each test runs something UltraDict's README (or its examples folder)
documents, against ``from ultradict_ng import UltraDict``.
"""

from __future__ import annotations

import collections
import collections.abc
import json
import multiprocessing
import os
import pickle
import pickletools
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import ultradict_ng
from tests import compat_workers as workers
from tests.conftest import unique_name
from ultradict_ng import SharedDict, UltraDict
from ultradict_ng._shm import layout as L

spawn = multiprocessing.get_context("spawn")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
E = UltraDict.Exceptions


def segments(name):
    return sorted(e for e in os.listdir("/dev/shm") if e == name or e.startswith(name + "@"))


def run(target, *args, timeout=60):
    p = spawn.Process(target=target, args=args)
    p.start()
    p.join(timeout)
    assert p.exitcode == 0
    return p


@pytest.fixture
def holder(name):
    """A dict whose lock a live spawned process holds: (handle, holder process)."""
    ultra = UltraDict({"counter": 0}, name=name)
    ready = spawn.Event()
    p = spawn.Process(target=workers.hold_lock, args=(name, ready))
    p.start()
    assert ready.wait(30)
    yield ultra, p
    p.kill()
    p.join()
    ultra.close()


# -- README examples ----------------------------------------------------------------------


def test_readme_simple(name):
    ultra = UltraDict({1: 1}, some_key="some_value", name=name)
    assert repr(ultra) == "{1: 1, 'some_key': 'some_value'}"
    assert ultra.name == name
    other = UltraDict(name=ultra.name)  # "in another Python REPL"
    assert other == {1: 1, "some_key": "some_value"}
    other[2] = 2
    assert ultra[2] == 2
    run(workers.set_item, name, 3, "from another process")
    assert ultra[3] == "from another process"
    assert other.close() == {1: 1, "some_key": "some_value", 2: 2, 3: "from another process"}
    ultra.close()


def test_readme_nested(name):
    ultra = UltraDict(recurse=True, name=name)
    ultra["nested"] = {"counter": 0}
    assert type(ultra["nested"]) is UltraDict
    assert type(ultra["nested"]).__name__ == "UltraDict"
    run(workers.increment_nested, ultra.name)  # other['nested']['counter'] += 1
    assert ultra["nested"]["counter"] == 1
    other = UltraDict(name=ultra.name)  # recurse comes from the dict
    other["nested"]["counter"] += 1
    assert ultra["nested"]["counter"] == 2
    ultra["nested"]["deeper"] = {"x": {}}
    assert type(other["nested"]["deeper"]["x"]) is UltraDict
    assert ultra.copy() == {"nested": {"counter": 2, "deeper": {"x": {}}}}
    other.close()
    ultra.close()


def test_parallel_counters_in_spawned_processes(name):
    # examples/parallel.py: buffer_size=10_000, shared_lock=True, full_dump_size=10_000
    ultra = UltraDict(buffer_size=10_000, shared_lock=True, full_dump_size=10_000, name=name)
    ultra["counter"] = 0
    procs = [spawn.Process(target=workers.count, args=(ultra.name, 250)) for _ in range(2)]
    procs.append(spawn.Process(target=workers.count_handle, args=(ultra, 250)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert ultra["counter"] == 750
    assert ultra.status()["full_dump_counter_remote"] >= 1  # the stream filled up: dumps happened
    ultra.close()


@pytest.mark.parametrize("mode", ["plain", "steal", "manual"])
def test_lock_recovered_from_dead_holder_while_counting(name, mode):
    # examples/recover_from_stale_lock*.py: one worker is SIGKILLed holding the lock.
    ultra = UltraDict(buffer_size=10_000, shared_lock=True, name=name)
    ultra["counter"] = 0
    procs = [spawn.Process(target=workers.count_with_crash, args=(ultra, 30, 10, mode)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    codes = sorted(p.exitcode for p in procs)
    assert codes == [-signal.SIGKILL, 0, 0], codes
    assert ultra["counter"] == 30
    ultra.close()


# -- the lock -----------------------------------------------------------------------------


def test_lock_forms_from_the_readme(name):
    ultra = UltraDict({"counter": 0}, shared_lock=True, name=name)
    with ultra.lock:
        ultra["counter"] += 1
    with ultra.lock(timeout=None, block=True, steal=False, sleep_time=0.000001):
        ultra["counter"] += 1
    with ultra.lock(sleep_time=0):
        ultra["counter"] += 1
    with ultra.lock(timeout=1.5):
        ultra["counter"] += 1
    with ultra.lock(timeout=1.5, steal_after_timeout=True):
        ultra["counter"] += 1
    result = ultra.lock.acquire(block=False)
    assert result is True and ultra.lock.get_remote_pid() == os.getpid()
    assert ultra.lock.release() is True
    assert ultra.lock.release() is False  # UltraDict: releasing an unheld lock returns False
    assert ultra.lock.get_remote_pid() == 0
    with ultra:
        with ultra.lock:  # reentrant
            ultra["counter"] += 1
        assert ultra.lock.status()["pid_remote"] == os.getpid()
    assert ultra["counter"] == 6
    # Held by another thread of this process: blocking_pid is our own pid.
    taken, done = threading.Event(), threading.Event()

    def hold():
        with ultra.lock:
            taken.set()
            done.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    assert taken.wait(10)
    with pytest.raises(E.CannotAcquireLock) as info:
        ultra.lock.acquire(block=False)
    assert info.value.blocking_pid == os.getpid()
    done.set()
    t.join()
    assert ultra.lock is ultra.lock
    assert isinstance(ultra.lock, UltraDict.SharedLock)
    ultra.close()


def test_lock_held_by_live_process(holder):
    ultra, p = holder
    with pytest.raises(E.CannotAcquireLock) as info:
        ultra.lock.acquire(block=False)
    assert info.value.blocking_pid == p.pid
    assert type(info.value) is E.CannotAcquireLock

    t0 = time.monotonic()
    with pytest.raises(E.CannotAcquireLockTimeout) as timeout:
        with ultra.lock(timeout=0.3):
            pass
    assert time.monotonic() - t0 >= 0.3
    assert timeout.value.blocking_pid == p.pid
    # A live holder's lock is never taken after a timeout, steal_after_timeout or not.
    with pytest.raises(E.CannotAcquireLockTimeout):
        with ultra.lock(timeout=0.2, steal_after_timeout=True):
            pass
    with pytest.raises(E.CannotAcquireLock):  # nor by steal_from_dead
        ultra.lock.steal_from_dead(from_pid=p.pid)
    assert ultra.lock.steal(from_pid=p.pid + 1) is False  # not the holder: nothing happens
    assert ultra.lock.get_remote_pid() == p.pid

    try:
        ultra.lock.acquire(block=False)
    except ultradict_ng.LockTimeout as exc:  # caught as ours
        assert exc.pid == p.pid
        assert isinstance(exc, TimeoutError)
    else:
        pytest.fail("acquire(block=False) succeeded while another process held the lock")
    try:
        with ultra.lock(timeout=0.05):
            pass
    except E.CannotAcquireLock as exc:  # UltraDict's timeout subclasses CannotAcquireLock
        assert isinstance(exc, E.CannotAcquireLockTimeout)
        assert isinstance(exc, ultradict_ng.LockTimeout) and exc.pid == p.pid
        assert exc.time_passed is not None and exc.time_passed >= 0.05
        again = pickle.loads(pickle.dumps(exc))  # e.g. out of a Pool worker
        assert type(again) is E.CannotAcquireLockTimeout and again.blocking_pid == p.pid
    else:
        pytest.fail("lock(timeout=0.05) succeeded while another process held the lock")

    # steal=True takes it from a live holder (UltraDict's documented, unsafe option).
    assert ultra.lock.acquire(steal=True) is True
    assert ultra.lock.get_remote_pid() == os.getpid()
    ultra["counter"] = 1
    ultra.lock.release()
    assert ultra.lock.get_remote_pid() == 0


def test_lock_recovered_from_a_dead_holder(name):
    # One process takes the locks of four dicts and is SIGKILLed; each dict
    # then gets its lock back another way.
    names = [name] + [unique_name() for _ in range(3)]
    dicts = [UltraDict({"counter": 0}, name=n) for n in names]
    ready = spawn.Event()
    p = spawn.Process(target=workers.hold_lock, args=(names, ready))
    p.start()
    assert ready.wait(30)
    p.kill()
    p.join()
    with_timeout, plain, non_blocking, from_dead = dicts
    for d in dicts:
        assert d.lock.get_remote_pid() == p.pid  # stale: its holder is dead

    # A timeout shorter than the engine's first liveness check: without
    # steal_after_timeout the dead holder is not noticed in time ...
    short = L.LOCK_FIRST_CHECK / 5
    with pytest.raises(E.CannotAcquireLockTimeout) as info:
        with with_timeout.lock(timeout=short):
            pass
    assert info.value.blocking_pid == p.pid
    # ... with it, the dead holder's lock is taken when the timeout runs out.
    with with_timeout.lock(timeout=short, steal_after_timeout=True):
        with_timeout["counter"] += 1
        assert with_timeout.lock.get_remote_pid() == os.getpid()

    t0 = time.monotonic()
    with plain.lock:  # no option needed: the dead holder is detected while waiting
        plain["counter"] += 1
    assert time.monotonic() - t0 < 2

    assert non_blocking.lock.acquire(block=False) is True  # a dead holder does not block
    non_blocking["counter"] += 1
    non_blocking.lock.release()

    assert from_dead.lock.steal_from_dead(from_pid=p.pid + 1) is False  # not the holder
    assert from_dead.lock.steal_from_dead(from_pid=p.pid, release=True) is True
    from_dead["counter"] += 1

    for d in dicts:
        assert d["counter"] == 1
        assert d.lock.get_remote_pid() == 0
        d.close()


# -- constructor, serializers, full_dump_size -----------------------------------------------


def test_constructor_defaults_and_initial_data(name):
    ultra = UltraDict([("a", 1)], b=2, name=name)
    assert ultra.copy() == {"a": 1, "b": 2}
    assert ultra.buffer_size == 10_000
    assert ultra.serializer is pickle
    assert ultra.shared_lock is True and ultra.recurse is False
    assert ultra.full_dump_size is None and ultra.recurse_register is None
    assert ultra.auto_unlink is True and ultra.closed is False
    ultra[frozenset({1})] = collections.OrderedDict(x=1)  # pickle: any picklable value
    assert type(ultra[frozenset({1})]) is collections.OrderedDict
    # Attaching: stored configuration; initial data only counts for the creator.
    other = UltraDict({"a": "ignored"}, name=name, shared_lock=True, recurse_register="x")
    assert other["a"] == 1 and other.buffer_size == 10_000 and other.serializer is pickle
    assert other.auto_unlink is False
    with pytest.raises(E.ParameterMismatch):
        UltraDict(name=name, buffer_size=20_000)
    with pytest.raises(ultradict_ng.ParameterMismatch):
        UltraDict(name=name, recurse=True)
    with pytest.raises(TypeError):
        UltraDict({}, {})
    assert UltraDict.fromkeys("xy", 0, name=unique_name()).close() == {"x": 0, "y": 0}
    other.close()
    ultra.close()


def test_attaches_to_a_msgpack_shareddict(name):
    d = SharedDict({"n": 1}, name=name, buffer_size=4096)
    ultra = UltraDict(name=name)  # no serializer given: the stored one (msgpack) is used
    assert ultra["n"] == 1 and ultra.buffer_size == 4096
    assert ultra.serializer.name == "msgpack"
    ultra["n"] += 1
    assert d["n"] == 2
    with pytest.raises(E.ParameterMismatch):  # an explicit serializer must match
        UltraDict(name=name, serializer=pickle)
    ultra.close()
    d.close()


def test_json_serializer_from_two_handles(name):
    a = UltraDict({"init": [1, 2]}, name=name, serializer=json)
    b = UltraDict(name=name, serializer=json)
    b["from_b"] = {"k": "v"}
    a["from_a"] = 3.5
    assert a["from_b"] == {"k": "v"}
    assert b.copy() == {"init": [1, 2], "from_b": {"k": "v"}, "from_a": 3.5}
    assert a.serializer is json and b.serializer is json
    with pytest.raises(E.ParameterMismatch):  # a custom serializer must be passed by attachers
        UltraDict(name=name)
    with pytest.raises(TypeError):
        a["bad"] = {1, 2}  # json cannot store a set; nothing changes
    assert "bad" not in b
    q = spawn.Queue()
    run(workers.report, [a], q)  # the json module travels by its importable name
    assert q.get(timeout=10) == ("UltraDict", {"init": [1, 2], "from_b": {"k": "v"}, "from_a": 3.5}, True)
    assert "seen_by" in b
    b.close()
    a.close()


def test_full_dump_size_too_small(name):
    ultra = UltraDict({"a": 1}, name=name, buffer_size=256, full_dump_size=400)
    assert ultra.full_dump_size == 400
    ultra["b"] = "x" * 200  # too big for the stream: a full dump, still under the cap
    assert ultra.status()["full_dump_counter_remote"] == 1
    with pytest.raises(E.FullDumpMemoryFull) as info:
        ultra["big"] = "y" * 1000  # the dump it needs exceeds full_dump_size
    assert isinstance(info.value, ultradict_ng.OutOfSpace)
    assert ultra.copy() == {"a": 1, "b": "x" * 200}  # unchanged
    other = UltraDict(name=name)
    assert other.full_dump_size == 400
    assert other.copy() == {"a": 1, "b": "x" * 200}
    with pytest.raises(E.FullDumpMemoryFull):
        other.update({"c": "z" * 500})
    assert "c" not in ultra
    del ultra["b"]
    ultra.dump()  # small again
    other.close()
    ultra.close()
    # Initial data that cannot fit: creating fails and leaves nothing behind.
    with pytest.raises(E.FullDumpMemoryFull):
        UltraDict({"big": "q" * 5000}, name=name, buffer_size=256, full_dump_size=1000)
    assert segments(name) == []


# -- exceptions ---------------------------------------------------------------------------


MATCHING = {
    "AlreadyExists": (ultradict_ng.AlreadyExists, FileExistsError),
    "CannotAttachSharedMemory": (ultradict_ng.NotFound, FileNotFoundError),
    "CannotAcquireLock": (ultradict_ng.LockTimeout, TimeoutError),
    "CannotAcquireLockTimeout": (ultradict_ng.LockTimeout, TimeoutError),
    "ParameterMismatch": (ultradict_ng.ParameterMismatch, ValueError),
    "AlreadyClosed": (ultradict_ng.Closed, ValueError),
    "FullDumpMemoryFull": (ultradict_ng.OutOfSpace, OSError),
    "MissingDependency": (ultradict_ng.SharedDictError, ImportError),
}


@pytest.mark.parametrize("exc_name", sorted(MATCHING))
def test_exception_namespace(exc_name):
    cls = getattr(UltraDict.Exceptions, exc_name)
    assert cls.__name__ == exc_name
    for base in MATCHING[exc_name]:
        assert issubclass(cls, base)
    assert issubclass(cls, ultradict_ng.SharedDictError)


def test_exceptions_raised_where_ultradict_raises_them(name):
    ultra = UltraDict(name=name, create=True)
    with pytest.raises(E.AlreadyExists):
        UltraDict(name=name, create=True)
    with pytest.raises(ultradict_ng.AlreadyExists):
        UltraDict(name=name, create=True)
    missing = unique_name()
    with pytest.raises(E.CannotAttachSharedMemory):
        UltraDict(name=missing, create=False)
    with pytest.raises(FileNotFoundError):
        UltraDict(name=missing, create=False)
    ultra["k"] = 1
    view_owner = UltraDict(name=name)
    view_owner.close()
    for action in (
        lambda: view_owner["k"],
        lambda: view_owner.__setitem__("k", 2),
        lambda: len(view_owner),
        lambda: list(view_owner.items()),
        lambda: view_owner.lock,
        view_owner.apply_update,
        view_owner.status,
    ):
        with pytest.raises(E.AlreadyClosed):
            action()
        with pytest.raises(ultradict_ng.Closed):
            action()
    assert ultra["k"] == 1
    ultra.close()


# -- lifetime -----------------------------------------------------------------------------


def test_close_returns_the_data(name):
    ultra = UltraDict({"a": [1, 2]}, name=name, recurse=True)
    ultra["nested"] = {"x": {"y": 1}}
    other = UltraDict(name=name)
    data = other.close()
    assert type(data) is dict and type(data["nested"]["x"]) is dict
    assert data == {"a": [1, 2], "nested": {"x": {"y": 1}}}
    assert other.close() is None  # already closed: nothing to do
    assert other.unlink() == 0
    assert ultra["nested"]["x"] == {"y": 1}  # closing an attacher changes nothing for others
    assert segments(name)
    assert ultra.close(unlink=True) == data
    assert segments(name) == []


def test_auto_unlink_and_unlink(name):
    ultra = UltraDict({"a": 1}, name=name)  # creator: auto_unlink
    keep = UltraDict(name=name, auto_unlink=True)  # as in UltraDict: only the creator's counts
    keep.close()
    assert segments(name)
    ultra.close()
    assert segments(name) == []
    ultra = UltraDict({"a": 1}, name=name, auto_unlink=False)
    ultra.close()
    assert segments(name)
    other = UltraDict(name=name)
    assert other.unlink() >= 2  # UltraDict: close(unlink=True)
    assert other.closed and segments(name) == []


def test_unlink_by_name(name):
    ultra = UltraDict(name=name, buffer_size=128, auto_unlink=False, recurse=True)
    ultra["nested"] = {"v": "x" * 300}  # dumps: several segments
    ultra.close()
    assert len(segments(name)) >= 3
    assert UltraDict.unlink_by_name(name) is True
    assert segments(name) == []  # every segment, not just the control one
    with pytest.raises(E.CannotAttachSharedMemory):
        UltraDict.unlink_by_name(name)
    assert UltraDict.unlink_by_name(name, ignore_errors=True) is False
    # The README's cleanup recipe runs as written.
    assert UltraDict.unlink_by_name(f"{name}_memory", ignore_errors=True) is False


def test_pickled_handles_reattach_in_spawned_process(name):
    ultra = UltraDict({"counter": 0}, name=name, recurse=True)
    ultra["nested"] = {"n": 1}
    q = spawn.Queue()
    run(workers.report, [ultra, ultra["nested"]], q)  # a nested view travels by name and path
    assert q.get(timeout=10) == ("UltraDict", {"counter": 0, "nested": {"n": 1}}, False)
    assert q.get(timeout=10) == ("UltraDict", {"n": 1}, False)
    assert ultra["seen_by"] not in (0, os.getpid())
    assert ultra["nested"]["seen_by"] == ultra["seen_by"]
    ultra.close()


# -- status, data, dump/load ------------------------------------------------------------------

ULTRADICT_STATUS_KEYS = {
    "name",
    "control",
    "buffer",
    "buffer_size",
    "lock",
    "shared_lock",
    "update_stream_position",
    "update_stream_position_remote",
    "full_dump_counter",
    "full_dump_memory",
    "full_dump_size",
    "serializer",
    "lock_pid_remote",
    "lock_remote",
    "full_dump_counter_remote",
    "full_dump_static_size_remote",
    "shared_lock_remote",
    "recurse",
    "recurse_remote",
    "recurse_register",
    "full_dump_memory_name_remote",
    "closed",
    "auto_unlink",
}


def test_status_and_print_status(name, capsys):
    ultra = UltraDict({"init": "some initial data"}, name=name, buffer_size=100_000)
    ultra[0] = " " * 100_000  # README "Advanced usage": too big for the stream
    st = ultra.status()
    assert ULTRADICT_STATUS_KEYS <= set(st)
    assert st["name"] == name and st["buffer_size"] == 100_000
    assert st["full_dump_counter"] == st["full_dump_counter_remote"] == 1
    assert st["update_stream_position"] == st["update_stream_position_remote"] == 0
    assert st["full_dump_memory_name_remote"] == L.dump_name(name, 1)
    assert st["full_dump_memory_name_remote"] in os.listdir("/dev/shm")
    assert st["lock_pid_remote"] == 0 and st["serializer"] is pickle and st["closed"] is False
    ultra["small"] = 1
    st = ultra.status()
    assert 0 < st["update_stream_position"] == st["update_stream_position_remote"]
    with ultra.lock:
        assert ultra.status()["lock_pid_remote"] == os.getpid()
    ultra.print_status()
    out = capsys.readouterr().out
    assert "'full_dump_counter': 1" in out and f"'name': '{name}'" in out
    ultra.print_status(stderr=True)
    assert "'buffer_size': 100000" in capsys.readouterr().err
    ultra.close()


def test_data_apply_update_dump_load(name):
    ultra = UltraDict({"a": 1}, name=name)
    other = UltraDict(name=name)
    assert ultra.data == {"a": 1} and type(ultra.data) is dict
    other["b"] = 2
    assert "b" not in ultra.data  # the local cache, not updated by itself
    ultra.apply_update()
    assert ultra.data == {"a": 1, "b": 2}
    before = ultra.status()["full_dump_counter_remote"]
    other.dump()
    assert other.status()["full_dump_counter_remote"] == before + 1
    ultra.load()
    assert ultra.status()["full_dump_counter"] == before + 1
    other["c"] = 3
    ultra.load(force=True)  # reload from the dump, then the stream
    assert ultra.data == {"a": 1, "b": 2, "c": 3}
    assert ultra.has_key("c") and not ultra.has_key("zz")
    ultra.update(None)
    ultra.update({"d": 4}, e=5)
    assert other.copy() == {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}
    other.close()
    ultra.close()


def test_full_dump_counter(name):
    ultra = UltraDict({"a": 1}, name=name)
    other = UltraDict(name=name)
    assert ultra.full_dump_counter == other.full_dump_counter == 0  # no dump yet
    ultra.dump()
    assert ultra.full_dump_counter == ultra.status()["full_dump_counter"] == 1
    assert other.full_dump_counter == 0  # what other's cache reflects: not synced yet
    assert other["a"] == 1
    assert other.full_dump_counter == other.status()["full_dump_counter"] == 1
    ultra.dump()
    store = other._store  # the cache invalidated, as reload() and a failed write leave it
    with store.mutex:
        store.gen = store.seen = -1
    assert other.full_dump_counter == 2  # the published generation, which the next read loads
    st = other.status()
    assert st["full_dump_counter"] == st["full_dump_counter_remote"] == 2
    assert st["full_dump_memory"] == L.dump_name(name, 2)
    assert other.copy() == {"a": 1} and store.gen == other.full_dump_counter == 2
    other.close()
    ultra.close()
    assert ultra.full_dump_counter == 2  # readable after close, like UltraDict's attribute


def test_log_is_ultradicts_log_module_over_our_logger(name, caplog):
    """UltraDict's code (its own test module first) calls ``UltraDict.log.set_level(
    UltraDict.log.Levels.error)``: a module API, not a Logger's.  Here it sets our
    logger's level, and only ours."""
    import logging

    ours, root = logging.getLogger("ultradict_ng"), logging.getLogger()
    log = UltraDict.log
    ultra = UltraDict(name=name)
    assert ultra.log is log and ultradict_ng.compat.log is log
    level, root_level = ours.level, root.level
    try:
        log.set_level(log.Levels.error)
        assert ours.level == logging.ERROR and root.level == root_level
        log.set_level("Warning")
        assert ours.level == logging.WARNING
        log.set_level(logging.DEBUG)
        assert ours.level == logging.DEBUG
        with pytest.raises(ValueError, match="unknown log level 'loud'"):
            log.set_level("loud")
        with pytest.raises(TypeError):
            log.set_level(True)
        assert [m.name for m in log.Levels] == ["debug", "info", "warning", "error", "critical"]
        # The rest of the Logger API reaches the same logger (code written for 0.1).
        log.setLevel(logging.ERROR)
        assert ours.level == log.level == logging.ERROR
        # logging's module-level functions act on the whole program: not offered (so
        # UltraDict's tests take their set_level branch).
        assert not hasattr(log, "disable") and not hasattr(log, "basicConfig")
        with caplog.at_level(logging.WARNING, logger="ultradict_ng"):
            log.warning("from %s", "UltraDict code")
        [record] = caplog.records
        assert record.getMessage() == "from UltraDict code" and record.name == "ultradict_ng"
        assert record.pathname == __file__  # the caller, not the forwarding function
    finally:
        ours.setLevel(level)
    ultra.close()


# -- not a dict subclass ------------------------------------------------------------------------


class _SharedAttributes:
    """MIGRATING.md's replacement for UltraDict's examples/oop.py: attributes kept in
    an UltraDict held in an ordinary attribute (kept in step with the document)."""

    link_name = ""

    def __init__(self):
        object.__setattr__(self, "_shared", UltraDict(name=self.link_name))

    def __getattr__(self, name):
        if name == "_shared":
            raise AttributeError(name)
        try:
            return self._shared[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self._shared[name] = value

    def __delattr__(self, name):
        try:
            del self._shared[name]
        except KeyError:
            raise AttributeError(name) from None


def test_not_a_dict_subclass_and_what_to_write_instead(name):
    ultra = UltraDict(name=name)
    assert not isinstance(ultra, dict) and isinstance(ultra, collections.abc.MutableMapping)

    class Holder:
        pass

    with pytest.raises(TypeError, match="__dict__ must be set to a dictionary, not a 'UltraDict'"):
        object.__setattr__(Holder(), "__dict__", ultra)
    with pytest.raises(TypeError, match="instance lay-out conflict"):
        type("Both", (SharedDict, dict), {})  # why: SharedDict's base has its own layout

    linked = type("Linked", (_SharedAttributes,), {"link_name": name})
    first, second = linked(), linked()
    first.something = "some value"
    assert second.something == "some value" and ultra["something"] == "some value"
    del second.something
    with pytest.raises(AttributeError):
        _ = first.something
    first._shared.close()
    second._shared.close()
    ultra.close()


# -- what a pickled handle names -------------------------------------------------------------


def _globals_named(data):
    """The ``module name`` pairs a protocol-2 pickle imports."""
    return {arg for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}


@pytest.mark.parametrize("serializer", ["msgpack", "pickle", "json"])
def test_a_pickled_handle_names_no_codec_module(name, serializer):
    """What a handle pickles to travel: its class, ``_reattach``, its name and path, and
    for a custom serializer the object (a module by its name) -- never one of our codec
    objects, whose module paths move with the package's layout."""
    if serializer == "msgpack":
        SharedDict(name=name, create=True, recurse=True, auto_unlink=False).close()  # UltraDict attaches
        ultra = UltraDict(name=name, recurse=True)
    else:
        ultra = UltraDict(name=name, recurse=True, serializer=json if serializer == "json" else pickle)
    ultra["nested"] = {"x": 1}
    for handle in (ultra, ultra["nested"]):
        data = pickle.dumps(handle, protocol=2)
        assert _globals_named(data) == {
            "ultradict_ng.compat.ultradict _reattach",
            "ultradict_ng.compat.ultradict UltraDict",
        }
        again = pickle.loads(data)
        assert again.copy() == handle.copy()
        again.close()
    ultra.unlink()
    ultra.close()


# -- a script written for UltraDict, with the import swapped -----------------------------------

README_SCRIPT = """
import marshal, multiprocessing, sys
from UltraDict import UltraDict


def run(name, target):
    d = UltraDict(name=name, shared_lock=True, auto_unlink=False)
    for i in range(target):
        with d.lock:
            d['counter'] += 1


def increment_nested(name):
    other = UltraDict(name=name)
    other['nested']['counter'] += 1


if __name__ == '__main__':
    names = []
    # Simple
    ultra = UltraDict({ 1:1 }, some_key='some_value')
    names.append(ultra.name)
    print(ultra)
    other = UltraDict(name=ultra.name)
    print(other)
    other[2] = 2
    print(ultra[2])

    # Nested
    nested = UltraDict(recurse=True)
    names.append(nested.name)
    nested['nested'] = { 'counter': 0 }
    print(type(nested['nested']).__name__)
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=increment_nested, args=[nested.name])
    p.start(); p.join()
    print(nested['nested']['counter'])

    # Parallel counters
    counter = UltraDict(buffer_size=10_000, shared_lock=True, full_dump_size=10_000)
    names.append(counter.name)
    counter['counter'] = 0
    procs = [ctx.Process(target=run, args=[counter.name, 200]) for _ in range(2)]
    for p in procs: p.start()
    for p in procs: p.join()
    print("Counter:", counter['counter'], '==', 400)

    # Locking
    with counter.lock:
        counter['counter'] += 1
    with counter.lock(timeout=1.5):
        counter['counter'] += 1
    try:
        result = counter.lock.acquire(block=False)
        counter.lock.release()
    except UltraDict.Exceptions.CannotAcquireLock as e:
        print(f'Process with PID {e.blocking_pid} is holding the lock')
    print(result, counter['counter'])

    # Advanced usage
    adv = UltraDict({ 'init': 'some initial data' }, name=sys.argv[1], buffer_size=100_000)
    adv[0] = ' ' * 100_000
    status = adv.status()
    print(status['full_dump_counter'], status['buffer_size'], status['name'] == sys.argv[1])
    del status  # UltraDict: close() fails while status() memoryviews are alive
    adv2 = UltraDict(name=sys.argv[1])
    adv2.dump()
    adv.load()
    adv.load(force=True)
    adv.apply_update()
    print(sorted(adv.data, key=str), len(adv[0]))
    ms = UltraDict(serializer=marshal)
    names.append(ms.name)
    ms['list'] = [1, 2]
    print(UltraDict(name=ms.name, serializer=marshal)['list'])
    print(other.close())
    print(adv.close())
    adv.unlink()
    UltraDict.unlink_by_name(sys.argv[1], ignore_errors=True)
    UltraDict.unlink_by_name(f'{sys.argv[1]}_memory', ignore_errors=True)
    print(' '.join(names))
"""

README_OUTPUT = """\
{1: 1, 'some_key': 'some_value'}
{1: 1, 'some_key': 'some_value'}
2
UltraDict
1
Counter: 400 == 400
True 402
1 100000 True
[0, 'init'] 100000
[1, 2]
{1: 1, 'some_key': 'some_value', 2: 2}
{'init': 'some initial data', 0: '%s'}
""" % (" " * 100_000)


def test_script_written_for_ultradict_runs_with_the_import_swapped(name, tmp_path):
    assert "from UltraDict import UltraDict\n" in README_SCRIPT
    script = README_SCRIPT.replace("from UltraDict import UltraDict", "from ultradict_ng import UltraDict")
    path = tmp_path / "readme_script.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, str(path), name],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    *lines, names = out.stdout.splitlines()
    assert "\n".join(lines) + "\n" == README_OUTPUT
    # Every dict the script made was removed when it exited (auto_unlink) or unlinked.
    for n in [name, *names.split()]:
        assert segments(n) == [], n


def test_large_values_stay_private_copies_unless_blobs_are_asked_for(name):
    np = pytest.importorskip("numpy")
    ultra = UltraDict(name=name)
    try:
        ultra["a"] = np.arange(100_000)
        got = ultra["a"]
        got[0] = 7  # a private, writable copy, as UltraDict hands out
        assert ultra["a"][0] == 0 and ultra.status()["full_dump_counter"] >= 1
    finally:
        ultra.close(unlink=True)
    blobs = UltraDict(name=name, blob_threshold=1024)
    try:
        blobs["a"] = np.arange(100_000)
        other = UltraDict(name=name)
        assert not other["a"].flags.writeable and int(other["a"][-1]) == 99_999
        other.close()
    finally:
        blobs.close(unlink=True)
