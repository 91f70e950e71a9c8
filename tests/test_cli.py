"""The command line (``python -m ultradict_ng`` / ``ultradict-ng``), driven as a user does.

Every command runs in a fresh interpreter; the dicts it looks at are made by
other processes (tests/cli_workers.py) or by the test itself.  The dict names
are unique to the test, and the assertions pick them out of machine-wide
listings (other dicts may exist on the machine at the same time).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any, Optional

import pytest

from ultradict_ng import SharedDict
from ultradict_ng._platform.segments import Segment
from ultradict_ng._shm import layout as L
from ultradict_ng._shm.survey import report
from ultradict_ng.futures import layout as PL

from .conftest import unique_name
from .helpers import make_half_created

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = os.path.join(ROOT, "tests", "cli_workers.py")
CLI = [sys.executable, "-m", "ultradict_ng"]
SHM = "/dev/shm"
COMMANDS = ["ls", "show", "stats", "watch", "rm", "clean", "doctor"]


def cli(*args: str, timeout: float = 30, cwd: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT)


def cli_json(*args: str, status: int = 0) -> Any:
    out = cli(*args, "--json")
    assert out.returncode == status, out.stdout + out.stderr
    return json.loads(out.stdout)


def ls_entry(name: str) -> dict[str, Any]:
    found = [d for d in cli_json("ls")["dicts"] if d["name"] == name]
    assert len(found) == 1, found
    return found[0]


def ls_row(name: str) -> str:
    out = cli("ls")
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.split()[:1] == [name]]
    assert len(rows) == 1, out.stdout
    return rows[0]


def clean_entry(results: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [e for e in results if e["name"] == name]
    assert len(found) == 1, results
    return found[0]


def segments(name: str) -> list[str]:
    return sorted(e for e in os.listdir(SHM) if e == name or e.startswith(name + "@"))


def _readline(proc: subprocess.Popen[str], timeout: float = 20) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "no line from the child in time"
    return proc.stdout.readline()


class Worker:
    """A tests/cli_workers.py child that says ``ready <pid>``, then waits to be killed."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, WORKERS, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        line = _readline(self.proc)
        assert line.startswith("ready"), line + self.proc.stderr.read()  # type: ignore[union-attr]
        self.pid = self.proc.pid

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()


@pytest.fixture
def removed() -> Iterator[list[str]]:
    """Names to remove (``rm``) after the test, whatever happened."""
    names: list[str] = []
    yield names
    for n in names:
        if segments(n):
            cli("rm", n)


@contextlib.contextmanager
def watcher(*args: str, cwd: Any = ROOT) -> Iterator[subprocess.Popen[str]]:
    """``ultradict-ng watch ARGS`` running; killed (by its pid) if still running after."""
    proc = subprocess.Popen(
        [*CLI, "watch", *args], cwd=cwd, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _make_unused(name: str, **items: Any) -> None:
    """A dict ``name`` that exists with no process attached."""
    d = SharedDict(name=name, auto_unlink=False)
    d.update(items)
    d.close()


# -- help and the console script ------------------------------------------------------


def test_help_of_main_command_lists_commands_and_examples():
    out = cli("--help")
    assert out.returncode == 0, out.stderr
    for command in COMMANDS:
        assert command in out.stdout
    assert "examples:" in out.stdout and "ultradict-ng show jobs done 42" in out.stdout
    assert "never unpickled" in out.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_help_of_each_subcommand(command):
    out = cli(command, "--help")
    assert out.returncode == 0, out.stderr
    assert f"usage: ultradict-ng {command}" in out.stdout and "--json" in out.stdout
    # every subcommand is among the main command's examples
    assert f"ultradict-ng {command}" in cli("--help").stdout


def test_usage_errors_exit_2():
    assert cli().returncode == 2
    assert cli("frobnicate").returncode == 2
    assert cli("show").returncode == 2  # NAME missing


def test_console_script(name, removed):
    script = shutil.which("ultradict-ng") or shutil.which(
        "ultradict-ng", path=os.path.dirname(sys.executable)
    )
    if script is None:
        pytest.skip("the ultradict-ng script is not installed (pip install -e .)")
    removed.append(name)
    _make_unused(name, a=1)
    out = subprocess.run([script, "ls", "--json"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert name in [d["name"] for d in json.loads(out.stdout)["dicts"]]
    out = subprocess.run([script, "show", name], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout == "'a': 1\n", out.stdout + out.stderr
    out = subprocess.run([script, "rm", name], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and f"removed {name!r}: 2 segment(s)" in out.stdout
    assert segments(name) == []


# -- ls ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ls_live_holder_then_killed(name, removed):
    """Keys, creator, users and lock of a dict held by a live process, then by a SIGKILLed one."""
    removed.append(name)
    with Worker("hold", name, "lock") as holder:
        entry = ls_entry(name)
        assert entry["status"] == "ok" and entry["keys"] == 4 and entry["serializer"] == "msgpack"
        assert entry["creator"] == {"pid": holder.pid, "alive": True}
        assert [(u["pid"], u["alive"]) for u in entry["users"]] == [(holder.pid, True)]
        assert entry["lock"] == {"pid": holder.pid, "alive": True}
        assert entry["recurse"] is True and entry["generation"] == 0
        row = ls_row(name)
        assert f" {holder.pid} " in row and "1 alive" in row and f"held by {holder.pid}" in row
        assert row.split()[1] == "4" and row.rstrip().endswith("ok")
        # a second, live user
        with Worker("attach", name) as other:
            entry = ls_entry(name)
            assert sorted(u["pid"] for u in entry["users"] if u["alive"]) == sorted([holder.pid, other.pid])
            assert "2 alive" in ls_row(name)
    # both SIGKILLed: nothing left their slots or the lock
    entry = ls_entry(name)
    assert entry["creator"] == {"pid": holder.pid, "alive": False}
    assert entry["lock"] == {"pid": holder.pid, "alive": False}
    assert len(entry["users"]) == 2 and not any(u["alive"] for u in entry["users"])
    row = ls_row(name)
    assert f"{holder.pid} (dead)" in row and "0 alive, 2 dead" in row
    assert f"held by {holder.pid} (dead)" in row
    # ls changed nothing: the dead holder's lock and slots are still there
    assert ls_entry(name)["lock"] == {"pid": holder.pid, "alive": False}


def test_ls_and_stats_show_a_shared_cache_and_its_side_segment(name, removed):
    """A SharedCache's side segment N@c is the dict's (counted in its bytes, not
    a foreign file), ls and stats say the dict is a cache and how its values
    are stored; a side segment left without its dict is an orphan clean removes."""
    from ultradict_ng.cache import SharedCache

    removed.append(name)
    with SharedCache(name, maxsize=10, serializer="pickle") as c:
        c["a"] = 1
        entry = ls_entry(name)
        assert entry["cache"] == "pickle" and f"{name}@c" in entry["segments"]
        assert "cache, pickle" in ls_row(name)
        assert f"{name}@c" not in cli_json("ls", "--all")["foreign"].get("names", [])
        assert "a SharedCache, values stored with pickle" in cli("stats", name).stdout
        c.unlink()
    assert segments(name) == []
    Segment.create(f"{name}@c", 4096).close()  # the side segment alone: an orphan
    found = cli_json("ls")
    assert {"base": name, "segments": [f"{name}@c"], "bytes": 4096} in found["orphans"]
    assert cli("clean", name).returncode == 0 and segments(name) == []


def test_ls_orphans_and_foreign_files(name, removed):
    """Orphaned segments of ours are reported; other programs' files are counted (and
    flagged when segments named like ours sit beside them) and never removed by clean."""
    removed.append(name)
    foreign = f"{name}_foreign"  # not a name the suite's leak check knows: removed below
    lookalike = f"{name}_lookalike"
    made = [f"{SHM}/{foreign}", f"{SHM}/{lookalike}", f"{SHM}/{lookalike}@s"]
    try:
        for path in made:  # the look-alike's first word (where our MAGIC is) is 0
            with open(path, "wb") as f:
                f.write((b"" if path.endswith(foreign) else bytes(8)) + os.urandom(L.CONTROL_SIZE - 8))
        Segment.create(L.stream_name(name), 4096).close()  # <name>@s alone: an orphan

        found = cli_json("ls", "--all")
        assert {"base": name, "segments": [f"{name}@s"], "bytes": 4096} in found["orphans"]
        assert foreign in found["foreign"]["names"] and found["foreign"]["count"] >= 1
        assert lookalike not in found["foreign"]["names"]
        (flagged,) = [d for d in found["dicts"] if d["name"] == lookalike]
        assert flagged["status"] == "damaged" and "not an ultradict_ng control segment" in flagged["problem"]
        assert name not in [d["name"] for d in found["dicts"]]
        assert "names" not in cli_json("ls")["foreign"]

        text = cli("ls").stdout
        assert f"orphaned segments of {name!r} (no control segment): 1 segment(s), 4.0 KiB" in text
        assert "other file(s) in /dev/shm" in text and "(--all lists them)" in text
        assert f"  {lookalike}: damaged: " in text
        assert foreign in cli("ls", "--all").stdout

        dry = cli_json("clean", "--dry-run", name, lookalike, foreign)
        assert clean_entry(dry, name) == {
            "name": name,
            "kind": "orphans",
            "segments": 1,
            "bytes": 4096,
            "reason": "segments of a dict that no longer exists",
            "action": "would remove",
        }
        assert segments(name) == [f"{name}@s"]
        done = cli_json("clean", name, lookalike, foreign)
        assert clean_entry(done, name)["action"] == "removed" and segments(name) == []
        assert clean_entry(done, lookalike)["action"] == "kept"
        assert foreign not in [e["name"] for e in done]
        assert all(os.path.exists(p) for p in made), "clean removed another program's file"

        out = cli("rm", foreign, lookalike)  # not ours: refused, left alone
        assert out.returncode == 1 and foreign in out.stderr and lookalike in out.stderr
        assert all(os.path.exists(p) for p in made), "rm removed another program's file"
    finally:
        for path in made:
            if os.path.exists(path):
                os.unlink(path)


# -- show ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_show(name, removed):
    pytest.importorskip("numpy")
    removed.append(name)
    with Worker("hold", name, "numpy"):
        out = cli("show", name)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == [
            "'a': 1",
            "42: 'forty-two'",
            "'nested':",
            "  'x':",
            "    'y': 2",
            "'raw': bytes, 100 B",
            "'arr': ndarray <f4 (300, 400) 468.8 KiB, in a blob",
        ]
        assert cli("show", name, "a", "42").stdout == "'a': 1\n42: 'forty-two'\n"
        assert cli("show", name, "nested").stdout == "'nested':\n  'x':\n    'y': 2\n"

        data = cli_json("show", name, "raw", "arr", "nested")
        assert data == {
            "raw": {"type": "bytes", "size": 100},
            "arr": {
                "type": "ndarray",
                "size": 480000,
                "storage": "blob",
                "dtype": "<f4",
                "shape": [300, 400],
            },
            "nested": {"x": {"y": 2}},
        }
        # a non-str key: the JSON form says so
        assert cli_json("show", name, "42") == {"type": "dict", "items": [[42, "forty-two"]]}
        everything = cli_json("show", name)
        assert [42, "forty-two"] in everything["items"] and len(everything["items"]) == 5

        out = cli("show", name, "a", "nope")  # a missing key: the rest is shown, exit 1
        assert out.returncode == 1 and out.stdout == "'a': 1\n"
        assert out.stderr == f"no key 'nope' in {name!r}\n"
        assert cli("show", name, "43").returncode == 1

    missing = unique_name()
    out = cli("show", missing)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == f"ultradict-ng show: no shared dict named {missing!r} exists\n"
    out = cli("show", "bad@name")
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr


def test_show_empty_dict(name, removed):
    removed.append(name)
    _make_unused(name)
    assert cli("show", name).stdout == "(empty)\n"
    assert cli_json("show", name) == {}


@pytest.mark.slow
def test_show_and_watch_never_unpickle(name, removed, tmp_path):
    """A pickle dict holding objects whose unpickling creates a file: show and watch name
    their class and never run them (the writer does, in its own directory: the traps work)."""
    removed.append(name)
    writer_dir, cli_dir = tmp_path / "writer", tmp_path / "cli"
    writer_dir.mkdir()
    cli_dir.mkdir()
    marker = "UNPICKLED"

    def write(key: str) -> None:
        subprocess.run(
            [sys.executable, WORKERS, "evil", name, marker, key], cwd=writer_dir, check=True, timeout=30
        )

    write("evil")
    assert (writer_dir / marker).exists(), "the trap does not fire when really unpickled"
    (writer_dir / marker).unlink()

    out = cli("show", name, cwd=str(cli_dir))
    assert out.returncode == 0, out.stderr
    assert "'evil': <io.open object, not unpickled>" in out.stdout
    assert "'evil-system': <posix.system object, not unpickled>" in out.stdout
    assert "'plain': [1, 'two']" in out.stdout
    data = json.loads(cli("show", name, "--json", cwd=str(cli_dir)).stdout)
    assert data["evil"] == {"type": "io.open", "loaded": False}
    assert data["evil-system"] == {"type": "posix.system", "loaded": False}
    assert cli("stats", name, cwd=str(cli_dir)).returncode == 0
    assert cli("ls", cwd=str(cli_dir)).returncode == 0
    assert ls_entry(name)["keys"] == 3 and ls_entry(name)["serializer"] == "pickle"

    with watcher(name, "--count", "2", cwd=cli_dir) as watch:
        assert _readline(watch).startswith(f"watching {name!r}")
        write("again")
        out_text, err = watch.communicate(timeout=20)
    assert watch.returncode == 0, err
    assert "set     ['again'] = <io.open object, not unpickled>" in out_text
    assert "set     ['again-system'] = <posix.system object, not unpickled>" in out_text
    assert not os.listdir(cli_dir), "the command line ran code from a pickle"


# -- stats ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_stats(name, removed):
    removed.append(name)
    d = SharedDict(name=name, auto_unlink=False, buffer_size=4096)
    try:
        d["small"] = 1
        d["big"] = b"x" * 100_000  # a blob
        with d.lock:
            info = cli_json("stats", name)
            text = cli("stats", name).stdout
        me = os.getpid()
        assert info["layout_version"] == L.LAYOUT_VERSION and info["status"] == "ok"
        assert info["keys"] == 2 and info["generation"] == 0 and info["dumps"] == 0
        assert (
            info["blobs"] == 1 and info["blob_bytes"] >= 100_000 and info["referenced_blob_bytes"] == 100_000
        )
        assert 0 < info["stream_end"] <= info["stream_limit"] == info["stream_size"] == 4096
        assert info["stream_grows"] is False and info["serializer"] == "msgpack"
        assert info["lock"] == {"pid": me, "alive": True} and info["creator"] == {"pid": me, "alive": True}
        assert [u["pid"] for u in info["users"]] == [me]
        assert info["segments"] == [name, f"{name}@b1", f"{name}@s"]
        fields = dict(line.split(":", 1) for line in text.splitlines())
        fields = {k: v.strip() for k, v in fields.items()}
        assert fields["layout"] == f"version {L.LAYOUT_VERSION}"
        assert fields["generation"] == "0 (full dumps written so far)"
        assert fields["dumps"] == "0 segment(s), 0 B"
        assert fields["large values"].startswith("1 blob segment(s), ")
        assert fields["lock"] == f"held by {me}" and fields["users"] == f"1 alive: {me}"
        assert fields["stream"].startswith(f"{info['stream_end']} B of 4.0 KiB used (")
        assert fields["stream"].endswith(", fixed; 4.0 KiB in memory")
        assert fields["keys"] == "2" and fields["status"] == "ok"

        for i in range(3):  # force dumps: a stream of 4 KiB and writes larger than it
            d[f"v{i}"] = "y" * 5000
        info = cli_json("stats", name)
        assert info["generation"] >= 1 and info["dumps"] >= 1
        assert "(full dumps written so far)" in cli("stats", name).stdout
    finally:
        d.close()
    out = cli("stats", unique_name())
    assert out.returncode == 1 and "no shared dict named" in out.stderr and len(out.stderr.splitlines()) == 1


# -- watch ---------------------------------------------------------------------------------


def _wait_for_watcher(name: str, timeout: float = 20) -> None:
    """Until a process sleeps waiting for a change of ``name`` (watch is ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rep = report(name, load_keys=False)
        if rep is not None and rep.change_waiters:
            return
        time.sleep(0.02)
    raise AssertionError("watch never started waiting")


def test_watch_json_count(name):
    d = SharedDict(name=name, recurse=True)
    d["before"] = 0  # the current state is not reported
    try:
        with watcher(name, "--json", "--count", "3") as watch:
            _wait_for_watcher(name)
            d["x"] = 1
            d["n"] = {"deep": [1, "two"]}
            del d["x"]
            out, err = watch.communicate(timeout=20)
    finally:
        d.close()
    assert watch.returncode == 0, err
    changes = [json.loads(line) for line in out.splitlines()]
    assert [(c["op"], c["path"], c["key"], c["value"]) for c in changes] == [
        ("set", [], "x", 1),
        ("set", [], "n", {"deep": [1, "two"]}),
        ("delete", [], "x", None),
    ]
    assert all(c["resync"] is False and isinstance(c["time"], float) for c in changes)


def test_watch_text(name):
    d = SharedDict(name=name)
    try:
        with watcher(name, "--count", "3") as watch:
            assert _readline(watch) == f"watching {name!r} (generation 0, 0 keys); Ctrl-C stops\n"
            _wait_for_watcher(name)
            d["k"] = b"\0" * 10
            d.pop("k")
            d.clear()
            out, err = watch.communicate(timeout=20)
    finally:
        d.close()
    assert watch.returncode == 0, err
    lines = [line.split("  ", 1)[1] for line in out.splitlines()]  # without the time stamps
    assert lines == ["set     ['k'] = bytes, 10 B", "delete  ['k']", "clear   (root)"]


def test_watch_timeout_without_changes(name):
    d = SharedDict(name=name)
    try:
        t0 = time.monotonic()
        out = cli("watch", name, "--json", "--timeout", "0.5")
        elapsed = time.monotonic() - t0
    finally:
        d.close()
    assert out.returncode == 0 and out.stdout == "", out.stderr
    assert 0.5 <= elapsed < 10


def test_watch_ends_when_the_dict_is_removed(name, removed):
    removed.append(name)
    _make_unused(name, a=1)
    with watcher(name) as watch:
        assert _readline(watch).startswith(f"watching {name!r} (generation 0, 1 keys)")
        _wait_for_watcher(name)
        assert cli("rm", name).returncode == 0
        out, err = watch.communicate(timeout=20)
    assert watch.returncode == 0, err
    assert out == f"{name!r} was removed\n"


def test_watch_missing_dict():
    missing = unique_name()
    out = cli("watch", missing, "--timeout", "0.1")
    assert (
        out.returncode == 1 and out.stderr == f"ultradict-ng watch: no shared dict named {missing!r} exists\n"
    )


# -- rm ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_rm(removed):
    a, b, c = unique_name(), unique_name(), unique_name()
    removed.extend([a, b, c])
    _make_unused(a, x=1)
    _make_unused(b, big=b"z" * 100_000)  # control, stream and a blob
    _make_unused(c)
    missing = unique_name()
    results = cli_json("rm", a, b, missing, status=1)
    assert [(r["name"], r["removed"]) for r in results] == [(a, 2), (b, 3), (missing, 0)]
    assert results[0]["live_users"] == [] and results[0]["bytes"] > 0
    assert results[2]["error"] == f"no shared dict named {missing!r}"
    assert segments(a) == segments(b) == []

    out = cli("rm", c, missing)
    assert out.returncode == 1
    assert out.stdout.startswith(f"removed {c!r}: 2 segment(s) (")
    assert out.stderr == f"{missing}: no shared dict named {missing!r}\n"
    assert segments(c) == []
    out = cli("rm", "bad/name")
    assert out.returncode == 1 and "bad/name" in out.stderr and "Traceback" not in out.stderr


def test_rm_says_who_still_uses_it(name, removed):
    removed.append(name)
    d = SharedDict(name=name, auto_unlink=False)
    try:
        out = cli("rm", name)
        assert out.returncode == 0, out.stderr
        assert f"it was still used by pid {os.getpid()}" in out.stdout
        assert segments(name) == []
    finally:
        d.close()


def test_rm_removes_a_dict_of_another_layout_version(name, removed):
    """The leftovers of an upgrade: ls flags them, clean keeps them (it cannot read their
    register), rm removes every segment by name; another program's file stays refused."""
    removed.append(name)
    _make_unused(name, big=b"z" * 100_000)  # control, stream and a blob
    ctrl = Segment.attach(name)
    words = memoryview(ctrl.buf).cast("Q")
    words[L.W_LAYOUT] = 4 | (1024 << 32)  # as layout version 4 wrote it
    words.release()
    ctrl.close()
    entry = ls_entry(name)
    assert entry["status"] == "incompatible" and entry["layout_version"] == 4
    assert clean_entry(cli_json("clean", name), name)["action"] == "kept"
    assert len(segments(name)) == 3
    results = cli_json("rm", name)
    assert results == [
        {"name": name, "layout_version": 4, "removed": 3, "bytes": results[0]["bytes"], "live_users": []}
    ]
    assert segments(name) == []


# -- clean ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_clean_removes_a_dict_whose_only_user_was_killed(name, removed):
    removed.append(name)
    with Worker("hold", name):
        pass  # SIGKILLed
    assert cli("clean", "--dry-run", name).stdout.count(name) == 1
    dry = clean_entry(cli_json("clean", "--dry-run", name), name)
    assert dry["action"] == "would remove" and dry["dead_users"] == 1
    assert dry["reason"] == "no live process uses it"
    text = [line for line in cli("clean", "--dry-run", name).stdout.splitlines() if line.startswith(name)]
    assert len(text) == 1 and "would remove" in text[0] and "1 dead user slot(s)" in text[0]
    assert len(segments(name)) == 2 and ls_entry(name)["users"][0]["alive"] is False  # unchanged
    assert name not in [e["name"] for e in cli_json("clean", name + "?*", "other-*")]  # not matched
    assert len(segments(name)) == 2
    done = clean_entry(cli_json("clean", name[:-2] + "*"), name)
    assert done["action"] == "removed" and done["removed"] == 2, done
    assert segments(name) == []


@pytest.mark.slow
def test_clean_keeps_dicts_in_use(name, removed):
    """A registered live user, then a process that only maps the control segment, keep
    the dict; once neither is left, clean removes it."""
    removed.append(name)
    d = SharedDict(name=name, auto_unlink=False)
    d["k"] = 1
    with Worker("attach", name):
        pass  # SIGKILLed: a dead user beside a live one
    kept = clean_entry(cli_json("clean", name), name)
    assert kept["action"] == "kept" and kept["users"] == [os.getpid()] and kept["reason"] == "in use"
    assert kept["dead_users_freed"] == 1  # the register of a kept dict is repaired
    assert [u["pid"] for u in ls_entry(name)["users"]] == [os.getpid()]
    d.close()
    with Worker("map-only", name) as mapper:
        assert ls_entry(name)["users"] == []  # not registered...
        for args in (["--dry-run"], []):
            kept = clean_entry(cli_json("clean", *args, name), name)
            assert kept["action"] == "kept" and kept["users"] == [mapper.pid]  # ...yet seen
        text = [line for line in cli("clean", name).stdout.splitlines() if line.startswith(name)]
        assert len(text) == 1 and f"in use: pid {mapper.pid}" in text[0]
        assert len(segments(name)) == 2
    done = clean_entry(cli_json("clean", name), name)
    assert done["action"] == "removed" and segments(name) == []


def test_clean_removes_a_half_created_dict(name, removed):
    """A control segment whose MAGIC was never stored, by a creator that died."""
    removed.append(name)
    make_half_created(name, 0x7FFFFF, stream=True)  # a pid that does not exist
    entry = ls_entry(name)
    assert entry["status"] == "abandoned" and "died while creating" in entry["problem"]
    assert entry["creator"]["alive"] is False
    assert f"  {name}: abandoned: its creator died while creating it" in cli("ls").stdout
    dry = clean_entry(cli_json("clean", "--dry-run", name), name)
    assert dry["action"] == "would remove" and len(segments(name)) == 2
    done = clean_entry(cli_json("clean", name), name)
    assert done["action"] == "removed" and done["removed"] == 2 and segments(name) == []


def test_clean_keeps_a_dict_being_created(name, removed):
    """MAGIC still 0 but its creator (this process) alive: never pulled from under it."""
    removed.append(name)
    from ultradict_ng._platform.owner import owner_word

    make_half_created(name, owner_word())
    try:
        assert ls_entry(name)["status"] == "creating"
        kept = clean_entry(cli_json("clean", name), name)
        assert kept["action"] == "kept" and segments(name) == [name]
    finally:
        os.unlink(f"{SHM}/{name}")


@pytest.mark.slow
def test_clean_races_a_process_that_opens_and_closes(name, removed, tmp_path):
    """clean again and again while a child opens the dict, writes, checks and closes it:
    the child never loses the dict while it holds a handle (layout: "Users")."""
    removed.append(name)
    stop = tmp_path / "stop"
    child = subprocess.Popen(
        [sys.executable, WORKERS, "churn", name, str(stop)],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert _readline(child).startswith("ready")
        actions = []
        for _ in range(25):
            out = cli("clean", "--json", name)
            assert out.returncode == 0, out.stderr
            actions += [e["action"] for e in json.loads(out.stdout) if e["name"] == name]
            assert child.poll() is None, child.communicate()
        stop.touch()
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    summary = json.loads(out.splitlines()[-1])
    assert child.returncode == 0 and summary["errors"] == [], (summary, err)
    assert summary["rounds"] > 50
    # the race was real: clean both kept the dict (in use) and removed it (between handles)
    # clean kept the dict while the child used it; between handles it may have removed
    # it (then the child made it again: "created" > 1) -- usually, not always
    assert "kept" in actions, actions
    assert (
        actions.count("removed") == summary["created"] - 1 or actions.count("removed") == summary["created"]
    )


# -- doctor --------------------------------------------------------------------------------


def test_doctor():
    out = cli("doctor")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "/dev/shm size" in out.stdout and "/dev/shm free" in out.stdout
    assert "compiled helper" in out.stdout
    checks = {c["check"]: c for c in cli_json("doctor")}
    assert {"/dev/shm size", "/dev/shm free", "compiled helper", "waiting", "python", "os", "layout"} <= set(
        checks
    )
    assert all(c["level"] in ("ok", "warn") for c in checks.values())
    from ultradict_ng import speedups

    assert checks["compiled helper"]["level"] == ("ok" if speedups.IMPLEMENTATION == "native" else "warn")
    assert checks["layout"]["message"].startswith(f"version {L.LAYOUT_VERSION}")


FULL_SHM_SCRIPT = r"""
import json, os, subprocess, sys
from ultradict_ng import SharedDict
from ultradict_ng.errors import OutOfSpace

def cli(*args):
    r = subprocess.run(
        [sys.executable, "-m", "ultradict_ng", *args], capture_output=True, text=True, timeout=60
    )
    return {"rc": r.returncode, "out": r.stdout, "err": r.stderr}

out = {"empty": cli("doctor", "--json"), "empty_text": cli("doctor")}
d = SharedDict(name="unused", auto_unlink=False)  # a dict nobody uses any more
d["k"] = 1
d.close()
fd = os.open("/dev/shm/filler", os.O_CREAT | os.O_WRONLY, 0o600)
try:
    while True:
        os.write(fd, b"\xff" * 65536)  # (all zeros would look like a control segment being made)
except OSError:
    pass
os.close(fd)
out["full"] = cli("doctor", "--json")
out["full_text"] = cli("doctor")
try:
    SharedDict(name="new", auto_unlink=False)
    out["create"] = "created"
except OutOfSpace as exc:
    out["create"] = "OutOfSpace: " + str(exc)
except BaseException as exc:
    out["create"] = repr(exc)
out["after_create"] = sorted(os.listdir("/dev/shm"))
out["ls"] = cli("ls", "--json")
out["ls_text"] = cli("ls")
out["clean"] = cli("clean", "--json")
out["final"] = sorted(os.listdir("/dev/shm"))
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/unshare"),
    reason="needs root and unshare to mount a private, tiny /dev/shm",
)
def test_full_dev_shm(tmp_path):
    """A private 2 MiB /dev/shm: doctor warns (container-sized), then fails when it is
    full; creating a dict raises OutOfSpace and leaves nothing; ls and clean still work."""
    script = tmp_path / "full.py"
    script.write_text(FULL_SHM_SCRIPT)
    proc = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f"mount -t tmpfs -o size=2m tmpfs /dev/shm && exec {sys.executable} {script}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)

    assert out["empty"]["rc"] == 0, out["empty"]
    empty = {c["check"]: c for c in json.loads(out["empty"]["out"])}
    assert (
        empty["/dev/shm size"]["level"] == "warn" and "container-sized" in empty["/dev/shm size"]["message"]
    )
    assert empty["/dev/shm size"]["message"].startswith("2.0 MiB")
    assert "WARN  /dev/shm size" in out["empty_text"]["out"]

    assert out["full"]["rc"] == 1, out["full"]
    full = {c["check"]: c for c in json.loads(out["full"]["out"])}
    assert full["/dev/shm free"]["level"] in ("fail", "warn")
    assert full["/dev/shm free"]["level"] == "fail" and "OutOfSpace" in full["/dev/shm free"]["message"]
    assert out["full_text"]["rc"] == 1 and "FAIL  /dev/shm free" in out["full_text"]["out"]

    assert out["create"].startswith("OutOfSpace"), out["create"]
    assert out["after_create"] == ["filler", "unused", "unused@s"]  # nothing half-made left

    assert out["ls"]["rc"] == 0, out["ls"]
    listing = json.loads(out["ls"]["out"])
    assert [(d["name"], d["status"], d["keys"]) for d in listing["dicts"]] == [("unused", "ok", 1)]
    assert listing["foreign"]["count"] == 1 and listing["orphans"] == []
    assert out["ls_text"]["rc"] == 0 and "unused" in out["ls_text"]["out"]

    assert out["clean"]["rc"] == 0, out["clean"]
    assert [(e["name"], e["action"]) for e in json.loads(out["clean"]["out"])] == [("unused", "removed")]
    assert out["final"] == ["filler"]


_POOL_SCRIPT = """
import sys, time
import numpy as np
from ultradict_ng.futures import ProcessPoolExecutor
ex = ProcessPoolExecutor(1)
ex.submit(time.sleep, 60)
ex.submit(np.add, np.ones(100_000), 1)  # its call parcel waits in the call queue
from ultradict_ng.futures import parcels
import os
while not any(p.owner_pid == os.getpid() for p in parcels()):
    time.sleep(0.01)
print("ready", flush=True)
time.sleep(60)
"""


def test_ls_and_clean_parcels_of_a_killed_pool(tmp_path):
    """A pool whose process is SIGKILLed leaves a parcel: ls shows it abandoned under
    the dead pid, clean --dry-run lists it, clean removes it; a live pool's parcel stays."""
    import struct

    from ultradict_ng._platform.owner import owner_word

    pytest.importorskip("numpy")  # (the install without a compiler has no numpy)
    proc = subprocess.Popen([sys.executable, "-c", _POOL_SCRIPT], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    live = os.path.join(SHM, f"{PL.POOL_PREFIX}{os.getpid():x}cli.1-0")
    try:
        assert _readline(proc, timeout=60).strip() == "ready"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        with open(live, "xb") as f:  # a parcel of a live pool: this process
            f.write(
                struct.pack(PL.PARCEL_FORMAT, PL.PARCEL_MAGIC, owner_word(), owner_word(), 0).ljust(64, b"\0")
            )
        dead = [p for p in cli_json("ls")["parcels"] if p["owner_pid"] == proc.pid]
        assert dead and all(p["status"] == "abandoned" for p in dead), dead
        mine = [p for p in cli_json("ls")["parcels"] if p["name"] == os.path.basename(live)]
        assert [p["status"] for p in mine] == ["live"]
        assert f"pool of pid {proc.pid}: {len(dead)} process-pool parcel(s)" in cli("ls").stdout
        token = dead[0]["name"].split(".")[0]
        dry = clean_entry(cli_json("clean", "--dry-run", token + "*"), f"pool of pid {proc.pid}")
        assert dry["action"] == "would remove" and dry["segments"] == len(dead)
        assert all(os.path.exists(os.path.join(SHM, p["name"])) for p in dead)
        out = cli("clean", token + "*", os.path.basename(live))
        assert out.returncode == 0 and f"pool of pid {proc.pid} ({len(dead)} parcels)" in out.stdout, (
            out.stdout
        )
        assert not any(os.path.exists(os.path.join(SHM, p["name"])) for p in dead)
        assert os.path.exists(live)  # the live pool's parcel is never touched
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(live)


def test_clean_prints_entries_removed_meanwhile_or_failed(capsys):
    """``clean`` reports a dict another process removed while it looked, and
    one it could not remove, beside the others (its table read ``segments``
    of every entry, and died after the removals were made)."""
    from ultradict_ng.cli.cleaning import _print_clean

    _print_clean(
        [
            {"name": "a", "kind": "dict", "action": "gone", "reason": "removed meanwhile by another process"},
            {"name": "b", "kind": "dict", "action": "error", "reason": "denied"},
            {"name": "pool of pid 7", "kind": "parcels", "segments": 2, "bytes": 4096, "action": "removed"},
            {"name": "c", "kind": "orphans", "bytes": 0, "action": "removed"},
        ],
        False,
    )
    out = capsys.readouterr().out
    assert "removed meanwhile" in out and "denied" in out and "(2 parcels)" in out and "c@* (orphans)" in out


def test_mains_running_at_once_share_the_raised_recursion_limit(monkeypatch):
    """The commands run with a raised recursion limit, which is the
    interpreter's: two ``main`` calls overlapping in threads each run with
    it, and the program's own is back after the last (the first to end put
    it back under the other, and the last left it raised)."""
    import threading

    from ultradict_ng import cli
    from ultradict_ng.cli import inspecting

    own = sys.getrecursionlimit()
    first_in, second_in, first_done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, list[int]] = {"first": [], "second": []}

    def ls(args: Any) -> int:
        who = threading.current_thread().name
        if who == "first":
            first_in.set()
            assert second_in.wait(10)
            seen[who].append(sys.getrecursionlimit())
        else:
            second_in.set()
            seen[who].append(sys.getrecursionlimit())
            assert first_done.wait(10)
            seen[who].append(sys.getrecursionlimit())
        return 0

    monkeypatch.setattr(inspecting, "cmd_ls", ls)

    def run(who: str) -> None:
        cli.main(["ls"])
        if who == "first":
            first_done.set()

    first = threading.Thread(target=run, args=("first",), name="first")
    second = threading.Thread(target=run, args=("second",), name="second")
    first.start()
    assert first_in.wait(10)  # (the first is in its command before the second starts)
    second.start()
    for t in (first, second):
        t.join(20)
    assert seen["first"] == [cli._FRAMES] and seen["second"] == [cli._FRAMES, cli._FRAMES]
    assert sys.getrecursionlimit() == own
