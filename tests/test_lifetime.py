"""Lifetime: handles opened and closed by the thousand leak nothing, and the
creator leaving while others still use the dict does what the README says."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import soak_scaled
from ultradict_ng import NotFound, SharedDict, Unlinked, unlink_by_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Runs on every engine (conftest: each_backend); shm_only tests are about shared memory.
pytestmark = pytest.mark.usefixtures("each_backend")


def ours(name):
    return sorted(e for e in os.listdir("/dev/shm") if e == name or e.startswith(name + "@"))


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_thousand_cycles_leak_nothing(name):
    """create / attach / write through a dump / close / unlink, >= 1,000 times:
    open file descriptors, mappings and /dev/shm entries stay flat."""
    cycles = soak_scaled(1000)
    start_fds = fds()
    with open("/proc/self/maps") as f:
        start_maps = len(f.readlines())
    for i in range(cycles):
        d = SharedDict(name=name, buffer_size=64)
        e = SharedDict(name=name)
        d["k"] = "v" * 80  # through a dump segment
        assert e["k"] == "v" * 80
        if i % 2:
            e.close()
            d.close()  # creator's auto-unlink
        else:
            assert e.unlink() == 3
            d.close()
            e.close()
        assert ours(name) == []
    with open("/proc/self/maps") as f:
        end_maps = len(f.readlines())
    assert fds() - start_fds <= 2
    assert end_maps - start_maps <= 10


@pytest.mark.shm_only
def test_creator_exit_unlinks_others_keep_reading(name):
    """README: the creator's auto_unlink removes the dict when its process exits;
    handles elsewhere keep reading the last state, and their writes raise Unlinked."""
    code = (
        "import sys, time\n"
        "from ultradict_ng import SharedDict\n"
        f"d = SharedDict({{'from': 'creator'}}, name={name!r})\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"  # exits normally when told to
    )
    creator = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert creator.stdout.readline().strip() == "ready"
    d = SharedDict(name=name, create=False)
    d["mine"] = 1
    creator.communicate("exit\n", timeout=60)
    assert creator.returncode == 0
    assert ours(name) == []  # gone from /dev/shm with its creator
    assert d.copy() == {"from": "creator", "mine": 1}  # still readable here
    with pytest.raises(Unlinked):
        d["more"] = 2
    with pytest.raises(NotFound):
        SharedDict(name=name, create=False)
    d.close()


@pytest.mark.shm_only
def test_creator_with_auto_unlink_false_leaves_it_for_others(name):
    code = (
        "from ultradict_ng import SharedDict\n"
        f"SharedDict({{'kept': True}}, name={name!r}, auto_unlink=False)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
    d = SharedDict(name=name, create=False)
    d["after"] = 1
    assert d.copy() == {"kept": True, "after": 1}
    d.close()
    assert unlink_by_name(name) == 2


def test_killed_creator_does_not_unlink(name):
    """SIGKILL runs no exit handler: the dict stays for others, and crash cleanup
    with unlink_by_name is the way to remove it."""
    code = (
        "import os, signal\n"
        "from ultradict_ng import SharedDict\n"
        f"d = SharedDict({{'x': 1}}, name={name!r})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60)
    assert p.returncode == -9
    d = SharedDict(name=name, create=False)
    assert d["x"] == 1
    d.close()
    assert unlink_by_name(name) == 2


@pytest.mark.parametrize("buffer_size", [64, None], ids=["dumping", "growing"])
def test_an_old_handle_never_unlinks_a_dict_re_created_under_its_name(name, buffer_size):
    """unlink(), re-create under the same name, then the old creator's auto-unlink
    runs (close or garbage collection): the new dict's stream and dumps survive."""
    old = SharedDict(name=name, buffer_size=buffer_size)
    for i in range(20):
        old[i] = "x" * 40  # with a 64-byte stream: dumps of generations 1..20
    old.unlink()
    new = SharedDict(name=name, buffer_size=buffer_size)
    for i in range(20):
        new[i] = "y" * 40
    old.close()  # the old creator's auto-unlink: must not touch the new dict
    del old
    reader = SharedDict(name=name, create=False)
    assert reader.copy() == {i: "y" * 40 for i in range(20)}
    new["more"] = 1
    assert reader["more"] == 1
    reader.close()
    new.close()
    assert not [e for e in os.listdir("/dev/shm") if e == name or e.startswith(name + "@")]
