"""Real processes: spawn, fork, unrelated interpreters (subprocess), SIGKILL."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import helpers
from ultradict_ng import NotFound, SharedDict, unlink_by_name

spawn = multiprocessing.get_context("spawn")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Runs on every engine (conftest: each_backend); shm_only tests are about shared memory.
pytestmark = pytest.mark.usefixtures("each_backend")


def run_helper(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "tests.helpers", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_unrelated_interpreter_attaches_both_ways(name):
    d = SharedDict(name=name)
    try:
        d["from_parent"] = "hello"
        assert run_helper("get", name, "from_parent") == "'hello'"
        run_helper("set", name, "from_child", "world")
        assert d["from_child"] == "world"
    finally:
        d.close()


def test_dict_created_by_unrelated_interpreter(name):
    run_helper("create", name)
    d = SharedDict(name=name, create=False)
    assert d["from"] == "subprocess"
    d.close()
    assert unlink_by_name(name) == 2


def test_nested_counters_across_spawned_processes(name):
    d = SharedDict(name=name, recurse=True)
    d["counters"] = {"a": 0, "b": 0}
    procs = [spawn.Process(target=helpers.increment_nested, args=(d, k, 150)) for k in "abab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert d["counters"] == {"a": 300, "b": 300}
    d.close()


def test_handle_through_a_queue(name):
    d = SharedDict({"counters": {"q": 0}}, name=name, recurse=True)
    q = spawn.Queue()
    q.put(d["counters"])  # a nested view travels by name and path
    view = q.get(timeout=10)
    assert view.path == ("counters",)
    view["q"] += 1
    assert d["counters"]["q"] == 1
    view.close()
    d.close()


def test_unrelated_interpreters_increment_exactly(name):
    d = SharedDict({"n": 0}, name=name)
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.helpers", "incr", name, "n", "150"], cwd=ROOT)
        for _ in range(3)
    ]
    for p in procs:
        assert p.wait(120) == 0
    assert d["n"] == 450
    d.close()


def test_create_race_exactly_one_creator(name, each_backend):
    results = spawn.Queue()
    procs = [spawn.Process(target=helpers.create_or_attach, args=(name, results)) for _ in range(6)]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    inits = {init for _, init in got}
    assert len(inits) == 1  # every racer saw the same creator's initial data
    assert inits.pop() in {p.pid for p in procs}
    d = SharedDict(name=name, create=False)
    assert d["count"] == 6
    d.close()
    assert unlink_by_name(name) == (2 if each_backend == "shm" else 4)  # meta, snap, log, lockev


@pytest.mark.shm_only
def test_crash_cleanup_after_sigkill_of_every_user(name):
    d = SharedDict(name=name, recurse=True, buffer_size=128, auto_unlink=False)
    d["nested"] = {"x": {"y": 1}}
    procs = [spawn.Process(target=helpers.writer_then_kill_self, args=(name, 50)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == -signal.SIGKILL
    assert len(d) == 151
    d.close()  # auto_unlink=False: closing removes nothing, as if we had died too
    # Now kill the last user: a child that holds the lock when it dies.
    ready = spawn.Event()
    holder = spawn.Process(target=helpers.hold_lock_forever, args=(name, ready))
    holder.start()
    assert ready.wait(30)
    holder.kill()
    holder.join()
    segments = [e for e in os.listdir("/dev/shm") if e == name or e.startswith(name + "@")]
    assert len(segments) >= 3
    removed = unlink_by_name(name)
    assert removed == len(segments)
    assert not [e for e in os.listdir("/dev/shm") if e == name or e.startswith(name + "@")]
    with pytest.raises(NotFound):
        SharedDict(name=name, create=False)


def test_reader_process_sees_writes_promptly(name):
    d = SharedDict({"v": -1}, name=name)
    out = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from ultradict_ng import SharedDict\n"
            f"d = SharedDict(name={name!r}, create=False)\n"
            "deadline = time.time() + 30\n"
            "while d['v'] != 99 and time.time() < deadline: pass\n"
            "print(d['v']); d.close()",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)
    for i in range(100):
        d["v"] = i
    assert out.communicate(timeout=60)[0].strip() == "99"
    d.close()
