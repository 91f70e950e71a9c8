"""A dict kept in files (``SharedDict(path=...)``): opening, reopening, the
sync policies, removal, and bad input (``_disk/layout.py``)."""

from __future__ import annotations

import contextlib
import errno
import json
import multiprocessing
import os
import pathlib
import re
import shutil
import stat
import struct
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from ultradict_ng import SharedDict
from ultradict_ng._disk import layout as D
from ultradict_ng._disk.opening import control_of
from ultradict_ng._shm import layout as L
from ultradict_ng.errors import (
    AlreadyExists,
    CorruptSegment,
    IncompatibleLayout,
    InvalidName,
    NotADict,
    NotFound,
    OutOfSpace,
    ParameterMismatch,
)

pytestmark = pytest.mark.shm_only

SHM = "/dev/shm"


def reboot(path: str) -> None:
    """What a reboot does to a dict no process has open: its shared memory is gone."""
    try:
        os.unlink(os.path.join(SHM, control_of(path)))
    except FileNotFoundError:
        pass


def recovers_after_a_failed_sync(path: str, d: SharedDict) -> None:
    """Close ``d`` after a failed sync (no clean close), reboot, reopen: the
    recovery rebuilds the dict from its files, and it takes writes again."""
    d.close()
    reboot(path)
    e = SharedDict(path=path)
    e["after"] = 1
    e.unlink()
    e.close()


def ok_in_a_child(code: str, path: str) -> None:
    """``code`` prints "ok" in a new interpreter, within 60 s: a hang there
    fails the test instead of stopping the suite (the dict's shared memory,
    which the killed child leaves, removed)."""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        reboot(path)
        raise
    assert out.stdout.strip() == "ok", out.stderr


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.durable_workers", *args], capture_output=True, text=True, timeout=120
    )


def test_the_dict_outlives_its_processes_and_a_reboot(durable_dir):
    d = SharedDict(path=durable_dir, recurse=True)
    d["a"] = 1
    d["nested"] = {"x": [1, 2]}
    d["blob"] = b"z" * 100_000  # a blob: a file of its own
    with d.transaction():
        d["b"] = 2
        d["nested"]["y"] = "deep"
    d.close()
    assert sorted(os.listdir(durable_dir)) == ["blob.1", "clean", "dict.meta", "stream"]
    reboot(durable_dir)  # (already gone: the last close removed it)
    out = run("open", durable_dir)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got == {"a": 1, "nested": {"x": [1, 2], "y": "deep"}, "blob": "7a" * 100_000, "b": 2}
    d = SharedDict(path=durable_dir, create=False)
    assert d["nested"]["y"] == "deep" and bytes(d["blob"]) == b"z" * 100_000
    assert d.stats()["generation"] == 0  # a clean close: reopened without a checkpoint
    assert os.path.exists(os.path.join(durable_dir, D.CLEAN_FILE))  # (still true: nothing written)
    d["after"] = 1
    assert not os.path.exists(os.path.join(durable_dir, D.CLEAN_FILE))  # (the first write removed it)
    d.unlink()
    d.close()
    assert not os.path.exists(durable_dir)


def test_a_stale_clean_file_is_not_trusted(durable_dir):
    """A ``clean`` file that does not name the files' state (restored from a
    backup, or left by a tool) must not spare the recovery its checkpoint."""
    d = SharedDict(path=durable_dir, sync="never")
    d["a"] = 1
    d.close()
    clean = os.path.join(durable_dir, D.CLEAN_FILE)
    with open(clean, "rb") as f:
        old = f.read()
    out = run("write", durable_dir, "0", "7")  # (closes cleanly: a clean file of its own)
    assert out.returncode == 0, out.stderr
    with open(clean, "wb") as f:
        f.write(old)  # the first close's: generation 0, the end of one write
    reboot(durable_dir)
    d = SharedDict(path=durable_dir, create=False)
    assert d.stats()["generation"] >= 1  # recovered with a checkpoint, not trusted as clean
    assert dict(d) == {"a": 1, "k0": 5, "k1": 6, "k2": 2, "k3": 3, "k4": 4, "big": bytes([3]) * 300}
    assert not os.path.exists(clean)
    d.unlink()
    d.close()


def test_processes_sharing_the_directory_share_one_dict(durable_dir):
    d = SharedDict(path=durable_dir)
    assert d.directory == os.path.abspath(durable_dir) and d.path == ()
    m = SharedDict()  # (in shared memory: no directory)
    assert m.directory is None
    m.close()
    e = SharedDict(path=durable_dir, create=False)
    d["k"] = 1
    assert e["k"] == 1
    e["k"] = 2
    assert d["k"] == 2
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:  # a handle travels by its path
        assert pool.apply(_read_k, (d,)) == 2
    d.close()
    e.close()
    d = SharedDict(path=durable_dir, create=False)
    d.unlink()
    d.close()


def _read_k(d):
    return d["k"]


def test_a_copy_is_a_dict_of_its_own_and_a_moved_directory_opens(durable_dir, tmp_path):
    d = SharedDict(path=durable_dir)
    d.update({i: str(i) for i in range(5000)})  # a table dump, read in place
    d["last"] = True
    d.close()
    copy = str(tmp_path / "copy")
    shutil.copytree(durable_dir, copy)
    moved = str(tmp_path / "moved")
    os.rename(durable_dir, moved)
    a = SharedDict(path=moved, create=False)
    b = SharedDict(path=copy, create=False)
    assert a.name != b.name
    b["last"] = False
    assert a["last"] is True and b["last"] is False and a[4999] == b[4999] == "4999"
    a.unlink()
    b.unlink()
    a.close()
    b.close()


def test_a_path_given_as_bytes_or_a_path_object_names_the_same_dict(durable_dir):
    """``path=`` takes what ``os.open`` takes: str, bytes, a path object."""
    d = SharedDict(path=os.fsencode(durable_dir))
    d["k"] = 1
    e = SharedDict(path=pathlib.Path(durable_dir), create=False)
    assert e["k"] == 1 and e.name == d.name
    assert {f for f in os.listdir(durable_dir)} >= {"dict.meta", "stream"}
    e.close()
    d.unlink()
    d.close()
    with pytest.raises(TypeError):
        SharedDict(path=5)


def test_a_path_through_a_file_is_not_a_dict(tmp_path):
    (tmp_path / "file").write_text("x")
    for create in (None, False, True):
        with pytest.raises(NotADict, match="a file is on its path"):
            SharedDict(path=str(tmp_path / "file" / "sub"), create=create)


def test_the_sync_policies(durable_dir, tmp_path):
    d = SharedDict(path=durable_dir, sync="always")
    d["a"] = 1
    s = d.stats()
    assert (s["synced_generation"], s["synced_end"]) == (s["generation"], s["stream_end"])
    assert s["sync"] == "always" and s["sync_interval"] is None  # (no interval: none shown)
    d.close()
    with pytest.raises(ParameterMismatch):
        SharedDict(path=durable_dir, sync="never")
    with pytest.raises(ValueError, match="sync_interval= is for sync='interval', not sync='always'"):
        SharedDict(path=durable_dir, sync="always", sync_interval=5)  # (an interval it would not use)
    with pytest.raises(ParameterMismatch, match="created with sync='always', which takes no sync_interval="):
        SharedDict(path=durable_dir, sync_interval=5)  # (alone too: an interval says "interval")
    d = SharedDict(path=durable_dir)
    d.unlink()
    d.close()
    e = SharedDict(path=str(tmp_path / "interval"), sync="interval", sync_interval=0.05)
    assert e.stats()["sync_interval"] == 0.05
    with pytest.raises(ParameterMismatch, match="created with sync_interval=0.05, not 5"):
        SharedDict(path=str(tmp_path / "interval"), sync_interval=5)
    e["a"] = 1
    deadline = time.monotonic() + 5
    while e.stats()["synced_end"] != e.stats()["stream_end"]:
        assert time.monotonic() < deadline, "the interval's thread never synced"
        time.sleep(0.01)
    e.unlink()
    e.close()


def _synced_within(d: SharedDict, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while d.stats()["synced_end"] != d.stats()["stream_end"]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_each_interval_dict_is_synced_on_its_own_schedule(tmp_path):
    """One process's thread syncs every ``interval`` dict of it: a dict of a
    short interval written after one of a long interval is synced within
    its own interval, not the other's."""
    slow = SharedDict(path=str(tmp_path / "slow"), sync="interval", sync_interval=60.0)
    fast = SharedDict(path=str(tmp_path / "fast"), sync="interval", sync_interval=0.1)
    slow["a"] = 1
    time.sleep(0.05)  # (the thread now waits for the slow one)
    fast["b"] = 2
    assert _synced_within(fast, 10), "the short interval waited for the long one"
    assert not _synced_within(slow, 0)
    for d in (slow, fast):
        d.unlink()
        d.close()


def test_the_sync_thread_ends_once_no_interval_dict_is_open(durable_dir):
    """A process keeps its sync thread only while it has an ``interval``
    dict open (plus ``_FLUSHER_IDLE``): after the last one closes it ends,
    and the next write starts another, synced within its interval again.
    (In a process of its own: one that ran other tests may hold such a dict.)"""
    code = textwrap.dedent(
        f"""
        import threading, time
        from ultradict_ng import SharedDict
        from ultradict_ng._disk import syncing

        def syncers():
            return sum(t.name == "ultradict_ng sync" and t.is_alive() for t in threading.enumerate())

        def synced(d):
            deadline = time.monotonic() + 10
            while d.stats()["synced_end"] != d.stats()["stream_end"] and time.monotonic() < deadline:
                time.sleep(0.01)
            return d.stats()["synced_end"] == d.stats()["stream_end"]

        syncing._FLUSHER_IDLE = 0.05
        for _ in range(2):
            d = SharedDict(path={durable_dir!r}, sync="interval", sync_interval=0.1)
            d["k"] = 1
            assert syncers() == 1 and synced(d)
            d.close()
            deadline = time.monotonic() + 10
            while syncers() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert syncers() == 0, "the sync thread stayed"
        d = SharedDict(path={durable_dir!r})
        d.unlink()
        d.close()
        print("ok")
        """
    )
    ok_in_a_child(code, durable_dir)


def _write_and_return(path: str) -> None:
    d = SharedDict(path=path, create=False)
    d["from the worker"] = 1  # (then the worker returns: multiprocessing ends it with os._exit)


def test_an_interval_write_of_a_multiprocessing_worker_is_synced_as_it_ends(durable_dir):
    """A worker started by ``multiprocessing`` (fork) ends with ``os._exit``:
    no ``atexit``, and its sync thread dies with it.  Its write is on the
    disk once it has ended all the same (multiprocessing's own finalizers)."""
    d = SharedDict(path=durable_dir, sync="interval", sync_interval=3600.0)
    p = multiprocessing.get_context("fork").Process(target=_write_and_return, args=(durable_dir,))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert d["from the worker"] == 1
    assert _synced_within(d, 0), "the worker's write was left unsynced"
    d.unlink()
    d.close()


@pytest.mark.parametrize("ends", ["os._exit", "SIGTERM"])
def test_an_interval_write_of_a_forked_child_is_synced_by_its_parent(durable_dir, ends):
    """A child forked by hand ends with ``os._exit`` (or is terminated, as a
    pool's workers are) before its own sync thread's first sync; the parent,
    which has the dict open but wrote nothing (no sync thread of its own
    yet), syncs the child's write within the interval."""
    import signal

    d = SharedDict(path=durable_dir, sync="interval", sync_interval=0.2)
    pid = os.fork()
    if pid == 0:  # (the child: no pytest code runs here)
        try:
            d["from the child"] = 1
        finally:
            if ends == "SIGTERM":
                os.kill(os.getpid(), signal.SIGTERM)
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) or os.WTERMSIG(status) == signal.SIGTERM
    assert d["from the child"] == 1
    assert _synced_within(d, 5), "the child's write was left unsynced"
    d.unlink()
    d.close()


def test_a_child_forked_while_a_thread_starts_the_sync_thread_does_not_hang(durable_dir):
    """A thread of the parent holds the guard of the sync thread's start at
    the fork (its first ``interval`` write): the child's own first write
    starts the child's sync thread all the same."""
    import signal
    import threading

    from ultradict_ng._disk import syncing

    d = SharedDict(path=durable_dir, sync="interval")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with syncing._flusher_guard:
            held.set()
            release.wait(0.5)  # (the fork's own hook in the parent takes the guard after it)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:
        try:
            signal.alarm(10)
            d["from the child"] = 1
        finally:
            os._exit(0)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        t.join()
    assert os.WIFEXITED(status), "the child hung in its first write"
    assert d["from the child"] == 1
    d.unlink()
    d.close()


def test_bad_input_is_refused_and_changes_nothing(durable_dir, tmp_path):
    with pytest.raises(NotFound):
        SharedDict(path=durable_dir, create=False)
    assert not os.path.exists(durable_dir)
    with pytest.raises(ValueError, match="sync"):
        SharedDict(path=durable_dir, sync="sometimes")
    with pytest.raises(ValueError, match="sync_interval"):
        SharedDict(path=durable_dir, sync_interval=0)
    with pytest.raises(ValueError, match="auto_unlink"):
        SharedDict(path=durable_dir, auto_unlink=True)
    with pytest.raises(ValueError, match="path="):
        SharedDict(name="x", sync="always")
    kept = SharedDict(path=str(tmp_path / "kept"))
    with pytest.raises(InvalidName, match="the shared memory of a dict kept in files: open that dict by its"):
        SharedDict(name=kept.name)  # (the name ls shows for it)
    kept.unlink()
    kept.close()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(NotADict, match="notes.txt"):
        SharedDict(path=str(other))
    assert os.listdir(other) == ["notes.txt"]
    with pytest.raises(NotADict):
        SharedDict(path=str(other / "notes.txt"))
    d = SharedDict(path=durable_dir)
    d["a"] = 1
    with pytest.raises(AlreadyExists):
        SharedDict(path=durable_dir, create=True)
    d.close()
    meta_path = os.path.join(durable_dir, D.META_FILE)
    meta = json.load(open(meta_path))
    json.dump({**meta, "version": D.DISK_VERSION + 1}, open(meta_path, "w"))
    with pytest.raises(IncompatibleLayout, match="version"):
        SharedDict(path=durable_dir)
    open(meta_path, "w").write("{garbage")
    with pytest.raises(CorruptSegment, match="dict.meta"):
        SharedDict(path=durable_dir)
    json.dump(meta, open(meta_path, "w"))
    if os.geteuid() != 0:  # (root writes anywhere)
        os.chmod(durable_dir, stat.S_IRUSR | stat.S_IXUSR)
        try:
            with pytest.raises(PermissionError):
                SharedDict(path=durable_dir)
        finally:
            os.chmod(durable_dir, stat.S_IRWXU)
    d = SharedDict(path=durable_dir)
    assert d["a"] == 1
    d.unlink()
    d.close()


def test_a_damaged_dump_is_refused_naming_the_file(durable_dir):
    d = SharedDict(path=durable_dir, buffer_size=4096)
    d.update({f"k{i}": "v" * 50 for i in range(200)})  # past the stream: a dump
    gen = d.stats()["generation"]
    d.close()
    reboot(durable_dir)
    dump = os.path.join(durable_dir, D.DUMP_PREFIX + L.base36(gen))
    with open(dump, "r+b") as f:
        f.write(b"\xff" * 64)  # the header
    with pytest.raises(CorruptSegment, match=D.DUMP_PREFIX):
        SharedDict(path=durable_dir)
    assert not os.path.exists(os.path.join(SHM, control_of(durable_dir)))
    shutil.rmtree(durable_dir)


def test_a_torn_tail_is_cut_with_a_warning(durable_dir, caplog):
    d = SharedDict(path=durable_dir, buffer_size=1 << 16)
    for i in range(10):
        d[f"k{i}"] = i
    end = d.stats()["stream_end"]
    d.close()
    reboot(durable_dir)
    os.remove(os.path.join(durable_dir, D.CLEAN_FILE))  # (as a crash leaves it)
    with open(os.path.join(durable_dir, D.STREAM_FILE), "r+b") as f:
        f.seek(end - 3)
        f.write(b"\x00\x01\x02")  # the last record's payload torn
    with caplog.at_level("WARNING", logger="ultradict_ng"):
        d = SharedDict(path=durable_dir)
    assert dict(d) == {f"k{i}": i for i in range(9)}
    assert "checksum" in caplog.text
    assert d.stats()["generation"] == 1  # a checkpoint: the torn bytes can never count again
    d["k9"] = 9
    d.unlink()
    d.close()


def test_waiting_the_change_feed_and_asyncio_work_on_it(durable_dir):
    import asyncio
    import threading

    from ultradict_ng.aio import AsyncSharedDict

    d = SharedDict(path=durable_dir, sync="never")
    feed = d.changes(timeout=10)
    other = SharedDict(path=durable_dir, create=False)
    other["k"] = 1
    change = next(feed)
    assert (change.key, change.value) == ("k", 1)
    d.get("k")  # (caught up)
    timer = threading.Timer(0.05, lambda: other.__setitem__("k", 2))
    timer.start()
    assert d.wait_for_change(timeout=10)
    timer.join()
    assert d["k"] == 2

    async def main() -> None:
        a = AsyncSharedDict(path=durable_dir, create=False)
        try:
            await a.set("via", "asyncio")
            assert a.get("via") == "asyncio"
        finally:
            a.close()

    asyncio.run(main())
    assert d["via"] == "asyncio"
    feed.close()
    other.close()
    d.unlink()
    d.close()


def test_writers_in_four_processes_with_sync_always_lose_nothing(durable_dir):
    """Group commit: every acknowledged write of every process is on the disk."""
    d = SharedDict(path=durable_dir, sync="always", buffer_size=1 << 14)
    d.close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.durable_workers", "write", durable_dir, str(1000 * w), "150"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in range(4)
    ]
    acked = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        acked += [int(line.split()[2]) for line in out.splitlines()]
    assert len(acked) == 600
    reboot(durable_dir)  # (everything was closed cleanly; still, the files alone must hold it)
    os.remove(os.path.join(durable_dir, D.CLEAN_FILE))
    d = SharedDict(path=durable_dir, create=False)
    for k in ("k0", "k1", "k2", "k3", "k4"):
        assert d[k] in acked and int(d[k]) % 5 == int(k[1])
    d.unlink()
    d.close()


MOUNTS = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
31 22 0:26 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw
90 31 0:52 / {nfs_mount} rw,relatime shared:70 - nfs4 server:/export rw,vers=4.2
91 31 0:60 / {gluster} rw,relatime shared:75 - fuse.glusterfs server:/gv0 rw,user_id=0,group_id=0
92 31 0:61 / {ssh} rw,nosuid,nodev,relatime shared:80 - fuse.sshfs me@host:/home rw,user_id=0,group_id=0
93 31 0:62 / {local} rw,relatime shared:81 - fuse.portal portal rw,user_id=0,group_id=0
94 90 0:63 / {inner} rw,relatime shared:82 - tmpfs tmpfs rw
"""


def test_a_network_filesystem_is_refused_before_anything_is_made(monkeypatch, tmp_path):
    # The mount table is the test's: directories on /dev/shm (an anonymous
    # device, as every network filesystem's) mounted as NFS (a path with a
    # space, which the table escapes), GlusterFS and sshfs -- the last two
    # FUSE mounts, known by their subtype.
    from ultradict_ng._disk import opening

    top = os.path.join(SHM, f"udng-netfs-{os.getpid()}-{time.monotonic_ns()}")
    names = {k: os.path.join(top, k.replace("_", " ")) for k in ("nfs_mount", "gluster", "ssh", "local")}
    names["inner"] = os.path.join(names["nfs_mount"], "inner")
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTS.format(**{k: v.replace(" ", "\\040") for k, v in names.items()}))
    monkeypatch.setattr(opening, "_MOUNTINFO", str(table))
    monkeypatch.setattr(opening, "_LOCAL_DEVICES", set())
    for where in names.values():
        os.makedirs(where)
    try:
        for kind, fstype in (("nfs_mount", "nfs4"), ("gluster", "fuse.glusterfs"), ("ssh", "fuse.sshfs")):
            for path in (names[kind], os.path.join(names[kind], "new", "dict")):
                with pytest.raises(NotADict, match=f"network filesystem \\({fstype}\\)"):
                    SharedDict(path=path)
            assert os.listdir(names[kind]) == ([] if kind != "nfs_mount" else ["inner"])  # (nothing made)
        for kind in ("local", "inner"):  # (a local FUSE mount; a tmpfs mounted inside the NFS one)
            d = SharedDict(path=os.path.join(names[kind], "dict"))
            d["a"] = 1
            d.unlink()
            d.close()
    finally:
        shutil.rmtree(top)


def test_a_dict_made_on_tmpfs_warns_that_a_reboot_takes_it(caplog):
    """/dev/shm (tmpfs, as /run and /tmp on many systems) keeps files in
    memory: a dict made there is said not to outlive a reboot -- once, at
    its creation, not at every open."""
    path = os.path.join(SHM, f"udng-tmpfs-{os.getpid()}-{time.monotonic_ns()}", "dict")
    try:
        with caplog.at_level("WARNING", logger="ultradict_ng"):
            d = SharedDict(path=path)
            d["k"] = 1
            d.close()
            assert "is on tmpfs, in memory: the dict outlives its processes, not a reboot" in caplog.text
            caplog.clear()
            d = SharedDict(path=path)
            assert d["k"] == 1 and caplog.text == ""
        d.unlink()
        d.close()
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def test_a_block_devices_filesystem_is_local_without_the_mount_table(monkeypatch, tmp_path):
    from ultradict_ng._disk import opening

    if os.major(os.stat(tmp_path).st_dev) == 0:
        pytest.skip("the temporary directory is not on a block device here")
    table = tmp_path / "mountinfo"
    table.write_text("22 1 0:40 / / rw,relatime shared:1 - nfs4 server:/ rw\n")  # (would refuse)
    monkeypatch.setattr(opening, "_MOUNTINFO", str(table))
    monkeypatch.setattr(opening, "_LOCAL_DEVICES", set())
    d = SharedDict(path=str(tmp_path / "dict"))
    d.unlink()
    d.close()
    assert opening.mounted_kind(table.read_text(), str(tmp_path)) == "nfs4"


def test_a_mount_table_naming_a_mount_point_in_any_bytes_is_read(monkeypatch, tmp_path):
    """A mount point's name may be any bytes (not UTF-8): the table is read
    as paths are, and a directory on an anonymous device opens."""
    from ultradict_ng._disk import opening

    table = tmp_path / "mountinfo"
    table.write_bytes(b"22 1 0:40 / /mnt/\xff\xfe rw - tmpfs tmpfs rw\n23 1 0:41 / / rw - ext4 /dev/sda rw\n")
    monkeypatch.setattr(opening, "_MOUNTINFO", str(table))
    monkeypatch.setattr(opening, "_LOCAL_DEVICES", set())
    anonymous = os.makedev(0, 41)
    assert opening._network_filesystem(str(tmp_path), anonymous) is None
    assert opening._memory_filesystem(os.fsdecode(b"/mnt/\xff\xfe/d"), anonymous) == "tmpfs"


def test_a_dot_dot_after_a_symbolic_link_goes_up_from_where_it_leads(tmp_path, capsys):
    """``here/link/../d`` with ``link`` to ``real/sub`` is ``real/d`` to the
    system: the dict there, the one every other path to it opens, and what
    the command line reads."""
    from ultradict_ng.cli import main

    os.makedirs(tmp_path / "real" / "sub")
    os.makedirs(tmp_path / "here")
    (tmp_path / "here" / "link").symlink_to(tmp_path / "real" / "sub")
    d = SharedDict(path=str(tmp_path / "here" / "link" / ".." / "d"))
    d["k"] = 1
    assert d.directory == str(tmp_path / "real" / "d") and not os.path.exists(tmp_path / "here" / "d")
    e = SharedDict(path=str(tmp_path / "real" / "d"))
    assert dict(e) == {"k": 1}
    e.close()
    assert main(["show", "--json", str(tmp_path / "here" / "link" / ".." / "d")]) == 0
    assert json.loads(capsys.readouterr().out) == {"k": 1}
    d.unlink()
    d.close()


@pytest.mark.parametrize("up", ["", ".."])
@pytest.mark.parametrize("parent", ["a link to nothing", "links in a loop"])
def test_a_path_through_a_broken_symbolic_link_is_no_dict(tmp_path, parent, up):
    """``link/d``, and ``link/../d`` (which the system walks through the link
    too): refused as the system refuses it, nothing made elsewhere."""
    link = tmp_path / "link"
    if parent == "a link to nothing":
        link.symlink_to(tmp_path / "nowhere" / "sub")
    else:
        link.symlink_to(tmp_path / "other")
        (tmp_path / "other").symlink_to(link)
    with pytest.raises(NotADict, match="cannot be"):
        SharedDict(path=os.path.join(str(link), up, "d"))
    assert sorted(os.listdir(tmp_path)) == (["link"] if parent == "a link to nothing" else ["link", "other"])


@pytest.mark.parametrize("refused", ["a value", "a key", "the serializer"])
def test_a_refused_creation_leaves_no_directory_it_made(tmp_path, refused):
    """Bad input changes nothing: the directories a refused creation made
    (the dict's and its missing parents) are gone again; one that was there
    before stays."""
    from ultradict_ng.errors import UnsupportedType

    args: dict[str, Any] = {
        "a value": {"initial": {"a": object()}},
        "a key": {"initial": {object(): 1}},
        "the serializer": {"serializer": "yaml"},
    }[refused]
    initial = args.pop("initial", None)
    for path in (tmp_path / "new" / "sub" / "d", tmp_path):
        with pytest.raises(UnsupportedType if refused != "the serializer" else ValueError):
            SharedDict(initial, path=str(path), **args)
    assert os.listdir(tmp_path) == []


def test_a_refused_creation_leaves_a_parent_another_opener_holds(tmp_path, monkeypatch):
    """The parents a refused creation made are removed only under their own
    directory lock: one another opener holds (creating a dict in it, made
    meanwhile) stays."""
    import fcntl

    from ultradict_ng._disk import files

    parent, make, held = tmp_path / "x", files.make_directories, []

    def and_another_opener(directory: str) -> None:
        make(directory)
        held.append(os.open(parent, os.O_RDONLY | os.O_DIRECTORY))
        fcntl.flock(held[-1], fcntl.LOCK_EX)  # (its directory lock, as an opener of x takes it)

    monkeypatch.setattr(files, "make_directories", and_another_opener)
    try:
        with pytest.raises(ValueError, match="serializer"):
            SharedDict(path=str(parent / "e"), serializer="yaml")
        assert parent.is_dir() and os.listdir(parent) == []
    finally:
        os.close(held[0])


@pytest.mark.parametrize("fails", ["a name too long", "an interrupt"])
def test_a_path_whose_making_fails_leaves_no_directory_made(tmp_path, monkeypatch, fails):
    """A missing path whose making fails part way (a name too long below the
    parents made, an interrupt): those made are removed, and a name too
    long, in the path or in the whole, is ``NotADict``."""
    from ultradict_ng._disk import files

    if fails == "an interrupt":

        def interrupted(directory: str) -> None:
            os.makedirs(os.path.dirname(directory))
            raise KeyboardInterrupt

        monkeypatch.setattr(files, "make_directories", interrupted)
        with pytest.raises(KeyboardInterrupt):
            SharedDict(path=str(tmp_path / "new" / "sub" / "d"))
    else:
        for path in (tmp_path / "new" / "sub" / ("d" * 300), tmp_path.joinpath(*["d" * 200] * 25)):
            with pytest.raises(NotADict, match="too long"):
                SharedDict(path=str(path))
    assert os.listdir(tmp_path) == []


def test_a_dot_dot_after_a_file_is_no_dict(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADict):
        SharedDict(path=str(tmp_path / "file" / ".." / "d"))
    assert os.listdir(tmp_path) == ["file"]


def test_a_parent_removed_as_the_open_makes_the_path_is_made_again(tmp_path, monkeypatch):
    """Another creation of the same new path, refused, removes the directories
    it made while this one makes them (ENOENT): made again, not refused."""
    from ultradict_ng._disk import files

    make, removed = files.make_directories, []

    def raced(directory: str) -> None:
        if not removed:
            removed.append(directory)
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), directory)
        make(directory)

    monkeypatch.setattr(files, "make_directories", raced)
    d = SharedDict(path=str(tmp_path / "new" / "d"))
    assert removed
    d.unlink()
    d.close()


def test_an_absolute_path_opens_from_a_removed_working_directory(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    d = SharedDict(path=str(tmp_path / "d"))
    d.unlink()
    d.close()


LOOKALIKES = ["dump.sql", "dump.old", "dump.01", "dump.A", "streamer.log", "cache.json", "lock", "lock.txt"]
LOOKALIKES += ["clean.sh", "blob.png", "blob.bak", "dict.meta.bak", "notes.tmp", "streamer.tmp"]


def test_files_that_only_begin_like_a_dicts_are_the_users(tmp_path):
    """A dict's files are its names matched whole, and a finished dump's or
    blob's first bytes: a directory holding look-alikes is refused at
    creation; in a dict's directory they survive a recovery, a checkpoint's
    sweep and an unlink.  After a clean close (which names the checkpoint)
    one named as a newer checkpoint is passed over; after a crash it stops
    the recovery, naming it, rather than be skipped or removed."""
    other = tmp_path / "lookalikes"
    other.mkdir()
    for f in LOOKALIKES:
        (other / f).write_text(f)
    with pytest.raises(NotADict, match="not a dict's"):
        SharedDict(path=str(other))
    assert sorted(os.listdir(other)) == sorted(LOOKALIKES)
    path = str(tmp_path / "dict")
    d = SharedDict(path=path)
    d["a"] = b"x" * 100_000  # (a blob)
    d.close()
    for f in LOOKALIKES:
        open(os.path.join(path, f), "w").write(f)
    reboot(path)
    from ultradict_ng.cli.paths import file_checks

    checks = file_checks(path)
    assert ("checkpoint", "ok", "generation 0 (empty: no dump yet)") in checks, checks
    assert ("files", "warn", "dump.sql: not one of the dict's files (left as it is)") in checks, checks
    d = SharedDict(path=path)  # (a clean close's reopen)
    assert d["a"] == b"x" * 100_000
    d.close()
    reboot(path)
    os.remove(os.path.join(path, D.CLEAN_FILE))  # (as a crash leaves it)
    with pytest.raises(CorruptSegment, match="dump.sql is named as the dict's newest checkpoint"):
        SharedDict(path=path)
    assert all(open(os.path.join(path, f)).read() == f for f in LOOKALIKES)
    kept = [f for f in LOOKALIKES if f not in ("dump.sql", "dump.old", "dump.A")]
    for f in ("dump.sql", "dump.old"):
        os.remove(os.path.join(path, f))
    d = SharedDict(path=path)  # a recovery: leftovers removed, the newest dump found
    assert d["a"] == b"x" * 100_000
    d["a"] = 2
    d._store.force_dump()  # a checkpoint (its blob swept, the look-alikes not)
    assert not os.path.exists(os.path.join(path, "blob.1"))
    d.close()
    reboot(path)
    open(os.path.join(path, "dump.sql"), "w").write("dump.sql")
    d = SharedDict(path=path)  # (the clean close names dump.1)
    assert d["a"] == 2
    d.unlink()
    d.close()
    assert sorted(os.listdir(path)) == sorted(kept + ["dump.A", "dump.sql"])
    for f in os.listdir(path):
        assert open(os.path.join(path, f)).read() == f


def test_an_opener_that_waited_on_an_unlink_makes_a_new_dict(durable_dir, monkeypatch):
    """The directory lock is the directory's ``flock``: an opener waiting while
    ``unlink()`` removes the dict finds the directory gone once it holds the
    lock, starts over and makes a new dict -- never one over files another
    opener is making, never in a removed directory."""
    import threading

    from ultradict_ng._disk import lifetime, opening

    d = SharedDict(path=durable_dir, sync="always")
    d["old"] = 1
    holding, real = threading.Event(), lifetime.unlink_tree

    def slow_unlink_tree(*args):
        holding.set()
        time.sleep(0.3)  # (the opener below is waiting for the lock meanwhile)
        return real(*args)

    monkeypatch.setattr(lifetime, "unlink_tree", slow_unlink_tree)
    real_create = opening._create

    def slow_create(*args):
        time.sleep(0.2)  # (an unlink's removal of the directory must not come meanwhile)
        return real_create(*args)

    monkeypatch.setattr(opening, "_create", slow_create)
    got: dict[str, object] = {}

    def opener() -> None:
        holding.wait(10)
        e = SharedDict(path=durable_dir, sync="always")
        e["new"] = 2  # (acknowledged: on the disk)
        got["keys"] = sorted(e)
        e.close()

    t = threading.Thread(target=opener)
    t.start()
    d.unlink()
    d.close()
    t.join(30)
    assert got["keys"] == ["new"]
    reboot(durable_dir)
    e = SharedDict(path=durable_dir, create=False)
    assert dict(e) == {"new": 2}
    e.unlink()
    e.close()
    assert not os.path.exists(durable_dir)


@pytest.mark.parametrize("damage", ["generation word", "zeroed page", "the last one's generation word"])
def test_damage_that_looks_like_the_streams_end_is_logged(durable_dir, caplog, damage):
    """A flipped bit in a record's generation word, or a page of zeros, in
    the middle of the stream makes the scan stop as at the stream's end: the
    prefix is kept, and the records after it are reported, never dropped
    silently -- also the last record's, with none after it (its crc, of the
    tag it was written with, tells).  An ordinary end after a checkpoint
    (older records past it) logs nothing."""
    d = SharedDict(path=durable_dir, buffer_size=1 << 16)
    for i in range(600):
        d[f"o{i}"] = "x" * 40  # (~40 KiB of records, then a checkpoint: they lie past the new records)
    d._store.force_dump()
    gen, ends = d.stats()["generation"], []
    for i in range(300):
        d[f"k{i}"] = "v" * 20
        ends.append(d.stats()["stream_end"])
    d.close()
    reboot(durable_dir)
    assert gen >= 1
    stream = os.path.join(durable_dir, D.STREAM_FILE)
    with open(stream, "r+b") as f:
        if damage != "zeroed page":
            at = ends[-2] if damage.startswith("the last") else ends[100]  # (the last record's header, 101's)
            f.seek(at + 5)
            f.write(b"\x40")
        else:
            at = ends[150]  # (zeros from a record's start to past the next page: no record is torn)
            f.seek(at)
            f.write(bytes((at + 4095) // 4096 * 4096 + 4096 - at))
    os.remove(os.path.join(durable_dir, D.CLEAN_FILE))  # (as a crash leaves it)
    from ultradict_ng.cli.paths import file_checks

    last = damage == "the last one's generation word"
    said = "generation word is damaged" if last else "then records from byte"
    stream_check = [c for c in file_checks(durable_dir) if c[0] == "stream"]
    assert stream_check[0][1] == "warn" and said in stream_check[0][2]  # (doctor too)
    with caplog.at_level("WARNING", logger="ultradict_ng"):
        d = SharedDict(path=durable_dir)
    kept = sum(1 for i in range(300) if f"k{i}" in d)
    assert 100 <= kept < 300 and all(f"k{i}" in d for i in range(kept))  # (a prefix)
    assert said in caplog.text, caplog.text
    d.close()
    caplog.clear()
    reboot(durable_dir)
    os.remove(os.path.join(durable_dir, D.CLEAN_FILE))
    with caplog.at_level("WARNING", logger="ultradict_ng"):
        d = SharedDict(path=durable_dir)  # (a recovery of a whole stream, older records past its end)
    assert len(d) == 600 + kept and "ultradict_ng" not in caplog.text, caplog.text
    d.unlink()
    d.close()


def test_records_a_clean_close_recorded_then_lost_to_damage_are_reported(durable_dir, caplog):
    """``clean`` records the stream's end after a sync: whole records ending
    before it in its generation were lost to damage (here a zeroed page with
    nothing after it, which the scan alone takes for the end).  The open keeps
    the rest and says so; ``doctor`` fails it."""
    d = SharedDict(path=durable_dir)
    d["kept"] = 0
    d._store.force_dump()
    for i in range(20):
        d[f"k{i}"] = i
    d.close()
    reboot(durable_dir)
    with open(os.path.join(durable_dir, D.STREAM_FILE), "r+b") as f:
        f.write(bytes(4096))
    from ultradict_ng.cli.paths import file_checks

    failed = [c[2] for c in file_checks(durable_dir) if c[:2] == ("stream", "fail")]
    assert failed and "lost to damage" in failed[0], file_checks(durable_dir)
    with caplog.at_level("WARNING", logger="ultradict_ng"):
        d = SharedDict(path=durable_dir)
    assert dict(d) == {"kept": 0}
    assert "the writes between are lost to damage" in caplog.text, caplog.text
    d.unlink()
    d.close()


def test_stale_bytes_past_the_end_a_clean_close_names_are_not_reported(durable_dir, caplog):
    """Past the end ``clean`` names lie bytes of older records, which the
    stream was restarted over; one may look like the start of a record of
    this generation, cut off.  A clean reopen stops there as at its end, and
    warns of nothing (it said that writes were cut off, in 42 of 700 reopens
    after a recovery's checkpoint)."""
    d = SharedDict(path=durable_dir)
    d["k"] = 1
    end, generation = d.stats()["stream_end"], d.stats()["generation"]
    d.close()
    reboot(durable_dir)
    with open(os.path.join(durable_dir, D.STREAM_FILE), "r+b") as f:
        f.seek(end)
        f.write(struct.pack("<IIII", 1 << 30, generation & L.GEN_MASK, 0, 0))  # (running past the file)
    with caplog.at_level("WARNING", logger="ultradict_ng"):
        d = SharedDict(path=durable_dir)
    assert dict(d) == {"k": 1} and caplog.text == ""
    d["k"] = 2  # (the record goes over them)
    d.unlink()
    d.close()


def _killed_after(path: str, code: str) -> int:
    """A process opens the dict, runs ``code`` (``d`` is the dict) and is
    killed: its shared memory stays.  Its stream's end then."""
    script = f"from ultradict_ng import SharedDict\nd = SharedDict(path={path!r})\n{code}\n"
    script += "print(d.stats()['stream_end'], flush=True)\nimport time\ntime.sleep(60)\n"
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None
        end = int(p.stdout.readline())
    finally:
        p.kill()
        p.wait()
    assert os.path.exists(os.path.join(SHM, control_of(path)))
    return end


def _put_back(backup: str, directory: str) -> None:
    """The files of ``backup`` copied over those of ``directory`` (the directory itself stays)."""
    for f in os.listdir(directory):
        os.remove(os.path.join(directory, f))
    for f in os.listdir(backup):
        shutil.copy(os.path.join(backup, f), os.path.join(directory, f))


def test_shared_memory_left_by_dead_processes_is_used_only_if_the_files_agree(durable_dir, tmp_path, caplog):
    """After a process is killed its control segment stays, and the next
    opener attaches to it (the page cache holds what it published) -- unless
    the files no longer say what it says: a backup put back in the
    directory, records the kernel could not write.  Then it is rebuilt from
    the files, with a warning."""
    d = SharedDict(path=durable_dir)
    d["v"] = "backup"
    d.close()
    backup = str(tmp_path / "backup")
    shutil.copytree(durable_dir, backup)
    _killed_after(durable_dir, 'd["v"] = "later"')
    with caplog.at_level("WARNING", logger="ultradict_ng"):
        d = SharedDict(path=durable_dir)  # (the segment agrees with the files: attached, no warning)
    assert d["v"] == "later" and "ultradict_ng" not in caplog.text
    d.close()
    _killed_after(durable_dir, 'd["v"] = "newest"\nd._store.force_dump()')  # (a newer checkpoint)
    _put_back(backup, durable_dir)
    with caplog.at_level("WARNING", logger="ultradict_ng"):
        d = SharedDict(path=durable_dir)
    assert dict(d) == {"v": "backup"} and "checkpoint dump.1 is not in the directory" in caplog.text
    d["w"] = 1
    d.close()
    caplog.clear()
    end = _killed_after(durable_dir, 'd["x"] = "lost"')
    stream = os.path.join(durable_dir, D.STREAM_FILE)
    with open(stream, "r+b") as f:  # (what writeback that failed leaves: the last record not on the disk)
        f.seek(end - 4)
        f.write(bytes(4))
    with caplog.at_level("WARNING", logger="ultradict_ng"):
        d = SharedDict(path=durable_dir)
    assert dict(d) == {"v": "backup", "w": 1} and "the stream file's whole ones at" in caplog.text
    d.unlink()
    d.close()


def test_files_put_back_over_a_dead_processes_segment_win_when_clean_differs(durable_dir, tmp_path, caplog):
    """A copy that went on from the same state has records that line up
    with the segment's: its ``clean`` file, recording another state, is what
    tells the segment is not of these files."""
    d = SharedDict(path=durable_dir, sync="always")
    d["n"] = 0
    d.close()
    copy = str(tmp_path / "copy")
    shutil.copytree(durable_dir, copy)
    _killed_after(durable_dir, 'd["n"] = 1')  # (its segment stays: STATE past n = 0)
    e = SharedDict(path=copy)
    for n in (7, 8, 9):
        e["n"] = n
    e.close()
    _put_back(copy, durable_dir)
    with caplog.at_level("WARNING", logger="ultradict_ng"):
        d = SharedDict(path=durable_dir)
    assert dict(d) == {"n": 9} and "its clean file records another state" in caplog.text, caplog.text
    d.unlink()
    d.close()
    e = SharedDict(path=copy)
    e.unlink()
    e.close()


META_EDITS = [
    ("sync", None),
    ("token", None),
    ("token", "12"),
    ("sync_interval", "1s"),
    ("sync_interval", -1),
    ("sync_interval", 0.0),
    ("sync_interval", 3600.5),
    ("token", 0),
    ("sync", "sometimes"),
    ("grows", "no"),
    ("recurse", 1),
    ("dump_limit", -5),
    ("stream_size", -1),
    ("stream_size", 2**40),
    ("stream_limit", 2**31),
    ("blob_threshold", 1.5),
    ("serializer", [1]),
]


@pytest.mark.parametrize("field, value", META_EDITS)
def test_a_dict_meta_edited_by_hand_is_refused_naming_the_field(durable_dir, field, value):
    d = SharedDict(path=durable_dir)
    d["a"] = 1
    d.close()
    meta_path = os.path.join(durable_dir, D.META_FILE)
    meta = json.load(open(meta_path))
    if value is None:
        del meta[field]
    else:
        meta[field] = value
    json.dump(meta, open(meta_path, "w"))
    before = {f: open(os.path.join(durable_dir, f), "rb").read() for f in os.listdir(durable_dir)}
    for attempt in range(2):
        if attempt:
            reboot(durable_dir)
            os.remove(os.path.join(durable_dir, D.CLEAN_FILE))  # (a recovery's path too)
            before.pop(D.CLEAN_FILE)
        with pytest.raises(CorruptSegment, match=f"dict.meta: {field} is"):
            SharedDict(path=durable_dir)
        assert not os.path.exists(os.path.join(SHM, control_of(durable_dir)))
        assert {f: open(os.path.join(durable_dir, f), "rb").read() for f in os.listdir(durable_dir)} == before
    shutil.rmtree(durable_dir)


@pytest.mark.parametrize("version, layout", [("1", None), (True, None), (None, 9.0), (2, None)])
def test_a_dict_meta_of_another_version_is_refused_as_such(durable_dir, version, layout):
    """Only the very ints this version writes pass: ``"1"``, ``true`` and
    ``9.0`` are another version's (the message shows them as they are)."""
    d = SharedDict(path=durable_dir)
    d.close()
    meta_path = os.path.join(durable_dir, D.META_FILE)
    meta = json.load(open(meta_path))
    meta["version"] = meta["version"] if version is None else version
    meta["layout"] = meta["layout"] if layout is None else layout
    json.dump(meta, open(meta_path, "w"))
    with pytest.raises(
        IncompatibleLayout, match=re.escape(f"version {meta['version']!r} (layout {meta['layout']!r})")
    ):
        SharedDict(path=durable_dir)
    shutil.rmtree(durable_dir)


@pytest.mark.parametrize("field", ["version", "layout"])
def test_a_dict_meta_without_its_version_is_damage_not_another_version(durable_dir, field):
    d = SharedDict(path=durable_dir)
    d.close()
    meta_path = os.path.join(durable_dir, D.META_FILE)
    meta = json.load(open(meta_path))
    del meta[field]
    json.dump(meta, open(meta_path, "w"))
    with pytest.raises(CorruptSegment, match=f"has no {field}: a damaged description"):
        SharedDict(path=durable_dir)
    shutil.rmtree(durable_dir)


def test_an_empty_path_or_a_dangling_link_is_refused(tmp_path):
    with pytest.raises(ValueError, match="path= is empty"):
        SharedDict(path="")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(NotADict, match="symbolic link to nothing"):
        SharedDict(path=str(link))
    assert not (tmp_path / "nowhere").exists()


def test_after_a_failed_sync_no_write_is_acknowledged_until_a_reopen(durable_dir, monkeypatch, caplog):
    """Linux reports a failed writeback once, to the next fsync, and forgets
    the pages: a later fsync succeeds without writing them.  So after one
    sync of a dict fails, every later sync of it fails (any handle's), the
    last close records no clean close, and the dict is good again once
    reopened from its files (a recovery, then a checkpoint)."""
    import errno as E
    import pickle

    from ultradict_ng._disk import files
    from ultradict_ng.errors import SyncFailed

    d = SharedDict(path=durable_dir, sync="always")
    other = SharedDict(path=durable_dir)
    d["before"] = 1
    real, fails = files.sync_data, [1]

    def flaky(*args):
        if fails[0]:
            fails[0] -= 1
            raise OSError(E.EIO, "Input/output error")
        return real(*args)

    monkeypatch.setattr(files, "sync_data", flaky)
    with pytest.raises(SyncFailed) as first:
        d["a"] = "maybe lost"
    assert first.value.errno == E.EIO and isinstance(first.value, OSError)
    assert str(pickle.loads(pickle.dumps(first.value))) == str(first.value)
    for handle, key in ((d, "b"), (other, "c")):  # (the disk would take them now: not acknowledged either)
        with pytest.raises(SyncFailed, match="an earlier sync"):
            handle[key] = 2
    other.close()
    with caplog.at_level("WARNING", logger="ultradict_ng"):
        d.close()
    assert "a sync failed; the next open recovers it" in caplog.text
    assert not os.path.exists(os.path.join(durable_dir, D.CLEAN_FILE))
    reboot(durable_dir)
    d = SharedDict(path=durable_dir)  # (a recovery: the page cache still held the records)
    assert dict(d) == {"before": 1, "a": "maybe lost", "b": 2, "c": 2}
    d["after"] = 3  # (acknowledged again)
    d.unlink()
    d.close()


@pytest.mark.parametrize("code", ["EIO", "ENOSPC"])
@pytest.mark.parametrize("step", ["sync_range", "sync_dir"])
def test_a_checkpoint_whose_sync_fails_is_discarded_by_its_write(durable_dir, monkeypatch, code, step):
    """The new checkpoint's own sync fails (its file's, or the directory's
    after its rename): the write that made it raises the documented error
    (not a bare ``OSError``), nothing of it is published, the failure bit
    stays clear (nothing published is in doubt), and writes go on."""
    import errno as E

    from ultradict_ng._disk import files
    from ultradict_ng.errors import OutOfSpace, SyncFailed

    d = SharedDict(path=durable_dir, sync="always", buffer_size=512)
    d["a"] = 0
    gen = d.stats()["generation"]
    real, once = getattr(files, step), [step == "sync_dir"]

    def failing(*args: object) -> None:
        if any("dump." in str(a) for a in args) or once[0]:  # (the directory's once: not its removal's)
            once[0] = False
            raise OSError(getattr(E, code), os.strerror(getattr(E, code)))
        real(*args)

    monkeypatch.setattr(files, step, failing)
    acked = None
    with pytest.raises(OutOfSpace if code == "ENOSPC" else SyncFailed) as raised:
        for i in range(100):  # (the stream fills: a checkpoint)
            d["filler"] = f"{'x' * 100}{i}"
            acked = d["filler"]
    assert "an earlier sync" not in str(raised.value)
    monkeypatch.undo()
    assert d["filler"] == acked and d.stats()["generation"] == gen
    assert not d._store._map.words[L.W_STATUS] & L.STATUS_SYNC_FAILED
    for i in range(100):
        d["filler"] = f"after {i}"
    d.close()
    reboot(durable_dir)
    e = SharedDict(path=durable_dir)
    assert dict(e) == {"a": 0, "filler": "after 99"}
    e.unlink()
    e.close()


def test_a_checkpoint_is_refused_once_a_sync_failed(durable_dir, monkeypatch):
    """With the failure bit set, a write that needs a checkpoint raises
    ``SyncFailed`` before writing one: a checkpoint is a sync too."""
    import errno as E

    from ultradict_ng._disk import files
    from ultradict_ng.errors import SyncFailed

    d = SharedDict(path=durable_dir, sync="always", buffer_size=512)
    d["a"] = 0
    gen, dumps = d.stats()["generation"], sorted(f for f in os.listdir(durable_dir) if f.startswith("dump."))

    def failing(*args: object) -> None:
        raise OSError(E.EIO, "Input/output error")

    monkeypatch.setattr(files, "sync_data", failing)
    with pytest.raises(SyncFailed):
        d["b"] = 1
    monkeypatch.undo()
    for i in range(100):  # (enough to fill the stream: each raises, none checkpoints)
        with pytest.raises(SyncFailed, match="an earlier sync"):
            d["filler"] = f"{'x' * 100}{i}"
    assert d.stats()["generation"] == gen
    assert sorted(f for f in os.listdir(durable_dir) if f.startswith("dump.")) == dumps
    recovers_after_a_failed_sync(durable_dir, d)


@pytest.mark.parametrize("sync", ["interval", "never"])
def test_a_sync_failed_in_the_background_fails_the_next_write(durable_dir, monkeypatch, sync):
    """Under ``interval`` the sync runs in the flusher thread, under ``never``
    at a close: a write cannot raise for it, so the next write of the dict,
    in any handle, raises ``SyncFailed`` (as Redis refuses writes once a
    background ``fsync`` failed) -- acknowledged by no one as durable."""
    import errno as E
    import time

    from ultradict_ng._disk import files
    from ultradict_ng.errors import SyncFailed

    options = {"sync_interval": 0.05} if sync == "interval" else {}
    d = SharedDict(path=durable_dir, sync=sync, **options)
    other = SharedDict(path=durable_dir)
    d["before"] = 1

    def failing(*args):
        raise OSError(E.EIO, "Input/output error")

    monkeypatch.setattr(files, "sync_data", failing)
    d["a"] = 1  # (returns: its sync comes later)
    if sync == "never":
        other.close()  # (its close syncs, and fails: logged)
    deadline = time.monotonic() + 10
    while not d._store._map.words[L.W_STATUS] & L.STATUS_SYNC_FAILED and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(SyncFailed, match="an earlier sync"):
        d["b"] = 2
    if sync == "interval":
        with pytest.raises(SyncFailed, match="an earlier sync"):
            other["c"] = 3
        other.close()
    monkeypatch.undo()
    recovers_after_a_failed_sync(durable_dir, d)


def test_a_damaged_entry_of_a_checkpoint_stops_a_recovery(durable_dir):
    """A recovery merges the checkpoint's entries into its own as bytes: it
    checks every one first, so a damaged entry is refused, naming the file,
    instead of being carried into the new checkpoint (and the old removed)."""
    d = SharedDict(path=durable_dir)
    d.update({f"k{i}": f"value-{i}" for i in range(6000)})
    d._store.force_dump()
    d["s"] = 1  # (a record after it: the next open is not clean)
    gen = d.stats()["generation"]
    d.close()
    reboot(durable_dir)
    os.remove(os.path.join(durable_dir, D.CLEAN_FILE))
    dump = os.path.join(durable_dir, D.DUMP_PREFIX + L.base36(gen))
    raw = bytearray(open(dump, "rb").read())
    raw[-10] ^= 0x40  # (the last entry's value)
    open(dump, "wb").write(raw)
    before = {f: open(os.path.join(durable_dir, f), "rb").read() for f in os.listdir(durable_dir)}
    for _ in range(2):
        with pytest.raises(
            CorruptSegment, match=f"{D.DUMP_PREFIX}{L.base36(gen)}'?: .*checksum.*nothing was changed"
        ) as refused:
            SharedDict(path=durable_dir)
        assert "udng+" not in str(refused.value)  # (the file named, not the segment's name)
        assert {f: open(os.path.join(durable_dir, f), "rb").read() for f in os.listdir(durable_dir)} == before
        assert not os.path.exists(os.path.join(SHM, control_of(durable_dir)))
    shutil.rmtree(durable_dir)


@pytest.mark.parametrize(
    "failure", [OutOfSpace("no room (a test)"), PermissionError(13, "no right (a test)")]
)
def test_a_sweeping_checkpoint_that_fails_leaves_the_write_in(durable_dir, monkeypatch, caplog, failure):
    """The checkpoint a handle writes once its dropped blobs outweigh the last
    one is its own, not the write's: with no room for it (or no right to make
    files in the directory), the write (already published) returns, and the
    replaced values wait for a later checkpoint."""
    from ultradict_ng._shm.store import Store

    def full(self, planned=None):
        raise failure

    d = SharedDict(path=durable_dir, sync="never")
    monkeypatch.setattr(Store, "force_dump", full)
    for i in range(8):
        with d.transaction() if i % 2 else contextlib.nullcontext():
            d["photo"] = bytes([i]) * (300 << 10)
    monkeypatch.undo()
    assert f"replaced values stay until a checkpoint can be written ({failure})" in caplog.text
    assert durable_dir in caplog.text
    assert len([f for f in os.listdir(durable_dir) if f.startswith(D.BLOB_PREFIX)]) > 4
    d.close()
    reboot(durable_dir)
    d = SharedDict(path=durable_dir)
    assert bytes(d["photo"]) == bytes([7]) * (300 << 10)
    d.unlink()
    d.close()


@pytest.mark.parametrize("inside", ["a write", "a transaction"])
def test_blobs_overwritten_do_not_pile_up_on_the_disk(durable_dir, inside):
    """Blobs a write drops stay until a checkpoint's sweep (a power loss may
    still need them until then), so a handle whose dropped blobs outweigh the
    last checkpoint (at least 1 MiB) writes one: one key overwritten with
    300 KiB values 40 times keeps a few blob files, not 40 -- also when
    each write is a transaction's (its end counts what it dropped)."""
    d = SharedDict(path=durable_dir, sync="never")
    other = SharedDict(path=durable_dir)
    for i in range(40):
        with d.transaction() if inside == "a transaction" else contextlib.nullcontext():
            d["photo"] = bytes([i]) * (300 << 10)
        assert bytes(other["photo"]) == bytes([i]) * (300 << 10)
        blobs = [f for f in os.listdir(durable_dir) if f.startswith(D.BLOB_PREFIX)]
        assert len(blobs) <= 6, blobs
    assert d.stats()["generation"] >= 5
    other.close()
    d.close()
    reboot(durable_dir)
    d = SharedDict(path=durable_dir)
    assert bytes(d["photo"]) == bytes([39]) * (300 << 10)
    d.unlink()
    d.close()


def test_blobs_replaced_by_many_handles_and_processes_count_together(durable_dir):
    """What each write drops counts toward the next checkpoint whoever made
    it: handles opened for one write each (each close the last: the count
    goes through ``clean``), or processes writing one value each -- 24
    values of 300 KiB keep a few blob files, not 24."""
    code = (
        f"from ultradict_ng import SharedDict\nd = SharedDict(path={durable_dir!r})\n"
        "d['photo'] = bytes([{i}]) * (300 << 10)\nd.close()\nprint('ok')\n"
    )
    for i in range(24):
        if i % 4 == 3:
            ok_in_a_child(code.replace("{i}", str(i)), durable_dir)
        else:
            d = SharedDict(path=durable_dir, sync="never")
            d["photo"] = bytes([i]) * (300 << 10)
            d.close()
        blobs = [f for f in os.listdir(durable_dir) if f.startswith(D.BLOB_PREFIX)]
        assert len(blobs) <= 6, blobs
    d = SharedDict(path=durable_dir)
    assert bytes(d["photo"]) == bytes([23]) * (300 << 10) and d.stats()["generation"] >= 3
    d.unlink()
    d.close()


def test_a_blob_or_checkpoint_numbered_tmp_in_base_36_is_a_finished_file(durable_dir):
    """Id 38401 is base 36 ``tmp``: ``blob.tmp`` and ``dump.tmp`` are a
    finished blob and checkpoint, not files being written (``blob.tmp.tmp``
    is): kept by a recovery, swept once dropped, removed with the dict."""
    assert D.aside_of("dump.tmp") is None and D.aside_of("dump.tmp.tmp") == "dump.tmp"
    assert D.suffix_of("dump.tmp") == L.DUMP_SUFFIX + "tmp" and D.is_own("blob.tmp")
    d = SharedDict(path=durable_dir, sync="always")
    with d.lock:  # (as 38,400 large values before it would have left it)
        d._store._map.atomic.store(L.W_BLOB_NEXT, int("tmp", 36))
    d["v"] = bytes([7]) * 100_000
    assert "blob.tmp" in os.listdir(durable_dir)
    d.close()
    reboot(durable_dir)
    d = SharedDict(path=durable_dir)
    assert bytes(d["v"]) == bytes([7]) * 100_000 and "blob.tmp" in os.listdir(durable_dir)
    del d["v"]
    d._store.force_dump()
    assert "blob.tmp" not in os.listdir(durable_dir)  # (the sweep saw it)
    d["w"] = bytes([8]) * 100_000
    d.unlink()
    d.close()
    assert not os.path.exists(durable_dir)


def test_a_checkpoint_of_another_handle_resets_what_one_counts_as_dropped(durable_dir):
    """A handle compares what it dropped with the last checkpoint's size: the
    one written last, by whichever handle -- not the big one it saw first.
    The dict shrunk by another handle's ``clear`` and checkpoint, one key
    overwritten with 300 KiB values keeps a few blob files, not one each."""
    d = SharedDict(path=durable_dir, sync="never")
    other = SharedDict(path=durable_dir)
    d.update({f"k{i}": "x" * 1000 for i in range(8000)})  # (~8 MB inline)
    d["photo"] = bytes(300 << 10)
    d._store.force_dump()
    d["photo"] = bytes([1]) * (300 << 10)  # (counted against the 8 MB checkpoint)
    other.clear()
    other._store.force_dump()
    for i in range(20):
        d["photo"] = bytes([i]) * (300 << 10)
        blobs = [f for f in os.listdir(durable_dir) if f.startswith(D.BLOB_PREFIX)]
        assert len(blobs) <= 6, blobs
    other.close()
    d.unlink()
    d.close()


def test_a_handle_sent_after_its_dict_was_removed_or_moved_finds_it_gone(durable_dir, tmp_path):
    """A handle travels as its directory and its control segment's name: the
    receiver finds ``NotFound`` (a ``FileNotFoundError``) once the dict was
    removed, or moved away and another made at its path, as a handle of a dict
    in shared memory unlinked meanwhile does; a name not a handle's is refused."""
    import pickle

    d = SharedDict(path=durable_dir)
    d["k"] = 1
    sent = pickle.dumps(d)
    assert pickle.loads(sent)["k"] == 1
    d.unlink()
    d.close()
    with pytest.raises(NotFound, match="removed, or moved away"):
        pickle.loads(sent)
    d = SharedDict(path=durable_dir)
    sent = pickle.dumps(d)
    d.close()
    os.rename(durable_dir, str(tmp_path / "moved"))
    SharedDict(path=durable_dir).close()  # (another dict at the path)
    with pytest.raises(NotFound, match="removed, or moved away"):
        pickle.loads(sent)
    with pytest.raises(ValueError, match="its path=, not a name"):
        SharedDict(name="mine", path=durable_dir)
    for where in (durable_dir, str(tmp_path / "moved")):
        e = SharedDict(path=where)
        e.unlink()
        e.close()


def test_a_handle_sent_before_a_new_dict_was_made_in_its_directory_finds_it_gone(durable_dir):
    """The directory kept (a file not the dict's kept it from removal: the
    same inode, the same control segment's name) and a new dict made in it:
    a handle of the removed one does not open the new one."""
    import pickle

    d = SharedDict({"old": 1}, path=durable_dir)
    sent = pickle.dumps(d)
    with open(os.path.join(durable_dir, "notes.txt"), "w") as f:
        f.write("not the dict's")
    d.unlink()
    d.close()
    os.remove(os.path.join(durable_dir, "notes.txt"))  # (the directory stays: empty, the same inode)
    e = SharedDict({"new": 2}, path=durable_dir)
    assert control_of(durable_dir) == d.name
    with pytest.raises(NotFound, match="removed, or moved away"):
        pickle.loads(sent)
    assert dict(e) == {"new": 2} and pickle.loads(pickle.dumps(e))["new"] == 2
    e.unlink()
    e.close()


def test_a_process_s_last_close_gives_the_dict_s_names_back_to_shared_memory(durable_dir):
    """Open, a dict's derived names (its stream, dumps, blobs) stand for its
    files in this process.  After this process's last close they must not:
    a removal by name there (``clean``'s, of shared memory its users left)
    removed the stream file of the closed dict."""
    from ultradict_ng._platform import directories
    from ultradict_ng._shm import cleanup

    d = SharedDict({"a": 1}, path=durable_dir, sync="always")
    name = control_of(durable_dir)
    e = SharedDict(path=durable_dir)
    d.close()
    assert (
        directories.file_of(name + L.STREAM_SUFFIX) == os.path.realpath(durable_dir) + "/stream"
    )  # (e open)
    e.close()
    assert directories.file_of(name + L.STREAM_SUFFIX) is None
    assert directories.shown(name) == os.path.realpath(durable_dir)  # (messages still name it so)
    cleanup.unlink_by_name(name, control=True)
    assert os.path.exists(os.path.join(durable_dir, D.STREAM_FILE))
    with pytest.raises(ParameterMismatch):  # (a refused open gives them back too)
        SharedDict(path=durable_dir, sync="never")
    assert directories.file_of(name + L.STREAM_SUFFIX) is None
    d = SharedDict(path=durable_dir, create=False)
    assert dict(d) == {"a": 1}
    d.unlink()
    d.close()


def test_a_handle_dropped_without_close_is_closed_by_its_collection(durable_dir):
    """A handle let go (a request handler that never calls ``close()``) is
    closed when it is collected, as one of a dict in shared memory is: its
    descriptors and mappings freed, its slot among the users too, its writes
    synced -- nothing held until the process exits."""
    import gc
    import weakref

    SharedDict(path=durable_dir).close()

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    first = SharedDict(path=durable_dir, create=False)  # (kept: the drops are not last closes)
    before = fds()
    for i in range(20):
        h = SharedDict(path=durable_dir, create=False)
        h["hits"] = i
        store = weakref.ref(h._store)
        del h
        gc.collect()
        assert store() is None
    assert fds() == before
    s = first.stats()
    assert s["users"] == 1 and (s["synced_generation"], s["synced_end"]) == (s["generation"], s["stream_end"])
    first.unlink()
    first.close()


def _released(directory: str, fds: list[str]) -> None:
    """The directory lock given back: no descriptor kept, none marked held,
    and another descriptor takes it at once (BlockingIOError while kept)."""
    import fcntl

    from ultradict_ng._disk import dirlock

    assert sorted(os.listdir("/proc/self/fd")) == fds and dirlock._mine() == []
    probe = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(probe)


def test_an_interrupt_while_taking_the_directory_lock_leaves_it_free(durable_dir, monkeypatch):
    """A KeyboardInterrupt after the ``flock`` but before the lock is handed
    to its holder: nobody would ever release it, and every open of the dict,
    in any process, would wait for this process to end."""
    from ultradict_ng._disk import dirlock

    class Interrupting(set):  # type: ignore[type-arg]
        def add(self, fd: int) -> None:
            raise KeyboardInterrupt("Ctrl-C in acquire")

    os.makedirs(durable_dir, exist_ok=True)
    fds = sorted(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(dirlock, "_held", Interrupting())
    with pytest.raises(KeyboardInterrupt):
        dirlock.directory_lock(durable_dir).acquire()
    monkeypatch.undo()
    _released(durable_dir, fds)


def test_an_interrupt_while_releasing_the_directory_lock_still_releases_it(durable_dir, monkeypatch):
    from ultradict_ng._disk import dirlock

    class Interrupting(set):  # type: ignore[type-arg]
        def discard(self, fd: int) -> None:
            super().discard(fd)
            raise KeyboardInterrupt("Ctrl-C in the release")

    os.makedirs(durable_dir, exist_ok=True)
    fds = sorted(os.listdir("/proc/self/fd"))
    lock = dirlock.directory_lock(durable_dir)
    lock.acquire()
    monkeypatch.setattr(dirlock, "_held", Interrupting(dirlock._held))
    with pytest.raises(KeyboardInterrupt):
        lock.__exit__(None, None, None)
    monkeypatch.undo()
    _released(durable_dir, fds)


def test_an_interrupt_after_creating_a_file_leaves_no_descriptor(tmp_path, monkeypatch):
    from ultradict_ng._disk import files

    path, fds = str(tmp_path / "made"), sorted(os.listdir("/proc/self/fd"))

    def note(event: str, where: str, done: bool, *rest: object) -> None:
        if done:
            raise KeyboardInterrupt("Ctrl-C in create")

    monkeypatch.setattr(files, "_note", note)
    with pytest.raises(KeyboardInterrupt):
        files.create(path)
    assert sorted(os.listdir("/proc/self/fd")) == fds and not os.path.exists(path)


def test_the_directory_lock_is_released_while_a_copy_of_its_descriptor_lives(durable_dir):
    """A ``flock`` lives as long as any descriptor of its open file does (a
    forked child's copy): the release unlocks, it does not only close."""
    import threading

    from ultradict_ng._disk import dirlock

    SharedDict(path=durable_dir).close()
    lock = dirlock.directory_lock(durable_dir)
    lock.acquire()
    copy = os.dup(lock.fd)  # (what a child forked now would hold)
    try:
        lock.__exit__(None, None, None)
        opened = threading.Event()
        t = threading.Thread(target=lambda: (SharedDict(path=durable_dir).close(), opened.set()), daemon=True)
        t.start()
        assert opened.wait(10), "an open waited for the released directory lock"
    finally:
        os.close(copy)
    t.join()
    SharedDict(path=durable_dir).unlink()


def test_a_child_forked_while_the_directory_lock_is_held_does_not_keep_it(durable_dir):
    """The holder forks (another thread's fork), then dies holding the lock:
    its child closed its copy of the descriptor at the fork, so the next
    opener does not wait for that child to end."""
    SharedDict(path=durable_dir).close()
    code = (
        "import os, signal, sys, time\n"
        "from ultradict_ng._disk import dirlock\n"
        "lock = dirlock.directory_lock(sys.argv[1]); lock.acquire()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.closerange(1, 3); time.sleep(60); os._exit(0)\n"
        "print(pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    p = subprocess.run([sys.executable, "-c", code, durable_dir], capture_output=True, text=True, timeout=60)
    child = int(p.stdout)
    try:
        t0 = time.monotonic()
        d = SharedDict(path=durable_dir, create=False)
        assert time.monotonic() - t0 < 10
        d.unlink()
        d.close()
    finally:
        os.kill(child, 9)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, 0)


@pytest.mark.parametrize("at_the_old_path", ["nothing", "another dict"])
def test_a_dict_moved_while_open_writes_no_file_at_its_old_path(tmp_path, caplog, at_the_old_path):
    """Moved while open (the guide allows it only while closed; a deploy that
    re-points a symlink does it), a dict's path names another directory or
    none.  A write that needs a new file there (a large value, a checkpoint)
    fails before it is published, the other dict's files untouched; writes
    to the stream (mapped: it moved with the directory) go on; the last
    close records no clean close there, and the dict reopens where it is now
    with every acknowledged write."""
    old, new = str(tmp_path / "d"), str(tmp_path / "moved")
    SharedDict({"x": 1}, path=old, sync="always").close()
    a = SharedDict(path=old)  # (a clean reopen: its first write removes its ``clean``)
    os.rename(old, new)
    other = None
    if at_the_old_path == "another dict":
        SharedDict({"mine": 1}, path=old).close()
        other = SharedDict(path=old)  # (closed cleanly: its ``clean`` is there)
    before = sorted(os.listdir(old)) if other is not None else None
    assert before is None or D.CLEAN_FILE in before
    with pytest.raises(NotFound, match="no longer the dict's directory"):
        a["big"] = b"A" * (200 << 10)
    with pytest.raises(NotFound, match="no longer the dict's directory"):
        a._store.force_dump()
    a["y"] = 2  # (a record: the stream file is mapped)
    assert "big" not in a and a["y"] == 2
    if other is not None:
        assert sorted(os.listdir(old)) == before and dict(other) == {"mine": 1}
    with caplog.at_level("WARNING", logger="ultradict_ng"):
        a.close()
    assert "no longer at that path (moved while open)" in caplog.text
    assert not os.path.exists(os.path.join(new, D.CLEAN_FILE))
    assert os.path.exists(os.path.join(SHM, control_of(new)))  # (kept, as a crash leaves it: taken over)
    if other is not None:
        assert sorted(os.listdir(old)) == before
        other.unlink()
        other.close()
    d = SharedDict(path=new, create=False)
    assert dict(d) == {"x": 1, "y": 2}
    d.unlink()
    d.close()


def test_messages_name_the_directory_not_the_segment(durable_dir):
    """A dict kept in files is known by the directory given as ``path=``:
    errors and ``repr`` name it, never its control segment, and a mismatch
    says to pass only ``path=`` -- whether or not another handle is open."""
    from ultradict_ng.errors import Closed, Unlinked

    d = SharedDict(path=durable_dir, recurse=True)
    for _ in range(2):  # (attached to a handle's segment, then recovered from the files)
        with pytest.raises(ParameterMismatch) as got:
            SharedDict(path=durable_dir, recurse=False)
        said = f"the dict kept in {durable_dir!r} was created with recurse=True; pass only path="
        assert said in str(got.value)
        d.close()
    e = SharedDict(path=durable_dir)
    assert repr(e) == f"SharedDict({{}}, path={durable_dir!r})"
    e.close()
    assert repr(e) == f"<SharedDict path={durable_dir!r} (closed)>"
    with pytest.raises(Closed, match=repr(durable_dir)):
        e["x"]
    e, f = SharedDict(path=durable_dir), SharedDict(path=durable_dir)
    f.unlink()
    with pytest.raises(Unlinked, match=repr(durable_dir)):
        e["x"] = 1
    assert "udng+" not in repr(e.lock)
    e.close()
    f.close()


def test_a_damaged_value_file_is_named(durable_dir):
    """A large value's file whose header is damaged is refused by its path."""
    d = SharedDict(path=durable_dir)
    d["big"] = b"x" * 100_000
    d.close()
    blob = os.path.join(durable_dir, "blob.1")
    with open(blob, "r+b") as f:
        f.seek(9)
        flipped = f.read(1)[0] ^ 0xFF  # (the token's second byte: random, 0xff one time in 256)
        f.seek(9)
        f.write(bytes([flipped]))
    d = SharedDict(path=durable_dir)
    with pytest.raises(CorruptSegment, match=f"blob {blob!r} does not hold what its reference says"):
        d["big"]
    os.remove(blob)
    with pytest.raises(CorruptSegment, match=f"value {re.escape(blob)} is referenced but does not exist"):
        d["big"]
    d.unlink()
    d.close()


def test_a_directory_that_does_not_fit_on_the_disk_is_out_of_space(tmp_path, monkeypatch):
    """A new dict's directory made on a full disk: ``OutOfSpace``, as for its files."""
    import errno

    from ultradict_ng.errors import OutOfSpace

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "makedirs", full)
    path = str(tmp_path / "new")
    with pytest.raises(OutOfSpace, match=f"no room on the disk to make {re.escape(path)}"):
        SharedDict(path=path)


@pytest.mark.parametrize("where", ["mark_open", "arm"])
@pytest.mark.parametrize("existing", [True, False])
def test_an_open_interrupted_before_its_handle_is_armed_leaves_nothing(
    durable_dir, monkeypatch, where, existing
):
    """A KeyboardInterrupt (or EMFILE) while a handle gets its sync policy
    and its closing: the handle is closed -- its registration, mapping,
    descriptor and mark -- so that the last real close is the last one."""
    from ultradict_ng._disk import files, lifetime

    d = SharedDict({"a": 1}, path=durable_dir) if existing else None
    fds = sorted(os.listdir("/proc/self/fd"))
    module, name = (files, "mark_open") if where == "mark_open" else (lifetime, "arm")

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt(f"Ctrl-C in {name}")

    monkeypatch.setattr(module, name, interrupted)
    with pytest.raises(KeyboardInterrupt):
        SharedDict(path=durable_dir)
    monkeypatch.undo()
    assert sorted(os.listdir("/proc/self/fd")) == fds
    if d is None:
        assert not os.path.exists(os.path.join(durable_dir, "dict.meta"))
        d = SharedDict({"a": 1}, path=durable_dir)
    d.close()  # (the last: the control segment goes, "clean" is written)
    assert not os.path.exists(os.path.join(SHM, control_of(durable_dir)))
    assert os.path.exists(os.path.join(durable_dir, D.CLEAN_FILE))
    e = SharedDict(path=durable_dir)
    assert dict(e) == {"a": 1}
    e.unlink()
    e.close()


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink"])
@pytest.mark.parametrize("file", ["dict.meta", "clean", "dump", "stream", "blob", "cache"])
def test_no_regular_file_in_place_of_a_dicts_file_is_refused_not_hung(durable_dir, tmp_path, file, kind):
    """What is no regular file where a dict's file must be: an error of the
    CorruptSegment family naming it -- not a bare ``OSError``, never an open
    that blocks (a FIFO opened for reading waits for a writer, under the
    directory lock), never a write through a link into the file it names --
    and nothing changed, the link's target included."""
    d = SharedDict(path=durable_dir, blob_threshold=1000)
    d["v"] = b"x" * 2000  # (a value file)
    d._store.force_dump()
    d["after"] = 1
    d.close()
    reboot(durable_dir)
    names = {"dump": "dump.", "blob": "blob."}
    target = next((f for f in sorted(os.listdir(durable_dir)) if f.startswith(names.get(file, file))), file)
    where = os.path.join(durable_dir, target)
    if os.path.exists(where):  # (a plain dict has no "cache": one is made where it would be)
        os.rename(where, where + ".saved")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"another program's" * 64)
    if kind == "directory":
        os.mkdir(where)
    elif kind == "fifo":
        os.mkfifo(where)
    else:
        os.symlink(elsewhere, where)
    before = sorted(os.listdir(durable_dir))
    try:
        code = (
            "from ultradict_ng import SharedDict; from ultradict_ng.errors import SharedDictError\n"
            "try:\n"
            f"    d = SharedDict(path={durable_dir!r}, create=False)\n"
            "    print(sorted(d), bytes(d['v'])[:1], d['after']); d.close()\n"
            "except SharedDictError as exc:\n"
            "    print(type(exc).__name__, exc)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert re.match(f"CorruptSegment .*{re.escape(target)} is ", out.stdout), out.stdout
        assert sorted(os.listdir(durable_dir)) == before
        assert elsewhere.read_bytes() == b"another program's" * 64
    finally:
        os.rmdir(where) if kind == "directory" else os.unlink(where)
        if os.path.exists(where + ".saved"):
            os.rename(where + ".saved", where)
        reboot(durable_dir)
    e = SharedDict(path=durable_dir)
    e.unlink()
    e.close()


def test_a_close_that_finds_no_regular_file_records_no_clean_close(durable_dir, caplog):
    """A FIFO made as ``cache`` while the dict is open: its last close logs
    and returns (the next open recovers), as for a failed sync -- no raw
    error out of ``close()`` after the shared memory is gone already."""
    d = SharedDict({"a": 1}, path=durable_dir)
    os.mkfifo(os.path.join(durable_dir, D.CACHE_FILE))
    with caplog.at_level("WARNING", logger="ultradict_ng"):
        d.close()
    assert "no clean close recorded" in caplog.text and "is a FIFO" in caplog.text
    assert not os.path.exists(os.path.join(durable_dir, D.CLEAN_FILE))
    os.unlink(os.path.join(durable_dir, D.CACHE_FILE))
    e = SharedDict(path=durable_dir)
    assert dict(e) == {"a": 1}
    e.unlink()
    e.close()


def test_a_last_close_interrupted_after_claiming_closing_wedges_nothing(durable_dir, monkeypatch):
    """A KeyboardInterrupt while the last close checks for users (CLOSING
    claimed): the claim is given back, so that neither this process nor
    another waits for a remover that is alive but will never finish."""
    from ultradict_ng._shm import users

    d = SharedDict(path=durable_dir, sync="always")
    d["a"] = 1
    real = users._users_now

    def interrupted(*args: object) -> object:
        monkeypatch.setattr(users, "_users_now", real)
        raise KeyboardInterrupt("Ctrl-C in a close")

    monkeypatch.setattr(users, "_users_now", interrupted)
    with pytest.raises(KeyboardInterrupt):
        d.close()
    e = SharedDict(path=durable_dir, create=False)  # (LockTimeout after 5 s while CLOSING stays claimed)
    e["b"] = 2
    code = f"import ultradict_ng as u; d = u.SharedDict(path={durable_dir!r}); print(dict(d)); d.close()"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "{'a': 1, 'b': 2}", out.stderr
    e.unlink()
    e.close()


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_a_non_file_under_the_control_segments_name_is_refused_clearly(durable_dir, kind):
    """Anyone may make a directory or a symbolic link in /dev/shm: under the
    dict's control segment's name it is ``CorruptSegment`` naming it, not a
    bare ``OSError``, at a reopen and at a creation, and nothing is changed."""
    d = SharedDict({"k": 1}, path=durable_dir)
    d.close()
    reboot(durable_dir)
    fresh = durable_dir + "-new"
    os.mkdir(fresh)
    try:
        for path in (durable_dir, fresh):
            ctl = os.path.join(SHM, control_of(path))
            before = sorted(os.listdir(path))
            os.mkdir(ctl) if kind == "directory" else os.symlink(os.path.join(path, "nothing"), ctl)
            try:
                with pytest.raises(CorruptSegment, match=f"{re.escape(ctl)} is not a segment.*remove it"):
                    SharedDict(path=path)
                assert sorted(os.listdir(path)) == before
            finally:
                os.rmdir(ctl) if kind == "directory" else os.unlink(ctl)
        e = SharedDict(path=durable_dir)
        assert dict(e) == {"k": 1}
        e.unlink()
        e.close()
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


def test_running_out_of_descriptors_is_not_called_a_damaged_segment(durable_dir, monkeypatch):
    """EMFILE while attaching is the system's error, not ``CorruptSegment``
    saying to remove a sound dict's shared memory or checkpoint."""
    import errno

    from ultradict_ng._platform import segments

    d = SharedDict({"k": 1}, path=durable_dir)

    def exhausted(*args: object) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(segments, "_open_fd", exhausted)
    with pytest.raises(OSError) as raised:
        SharedDict(path=durable_dir)
    assert raised.value.errno == errno.EMFILE and not isinstance(raised.value, CorruptSegment)
    monkeypatch.undo()
    d.unlink()
    d.close()


@pytest.mark.parametrize("initial", [None, {"k": 1}])
def test_a_description_that_does_not_fit_on_the_disk_is_out_of_space(tmp_path, monkeypatch, initial):
    """No room left for a new dict's ``dict.meta``: ``OutOfSpace``, as for its
    other files, and nothing of the dict left behind."""
    import errno

    from ultradict_ng._disk import files
    from ultradict_ng.errors import OutOfSpace

    whole = files.write_whole

    def full(path: str, data: bytes) -> None:
        if path.endswith("/dict.meta"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        whole(path, data)

    monkeypatch.setattr(files, "write_whole", full)
    path = str(tmp_path / "new")
    with pytest.raises(OutOfSpace, match=f"no room on the disk for {re.escape(path)}/dict.meta"):
        SharedDict(initial, path=path)
    assert not os.path.exists(path)  # (made by this open, refused: removed again)


@pytest.mark.parametrize("call", ["create", "rename"])
def test_a_file_the_disk_has_no_room_to_name_is_out_of_space(durable_dir, monkeypatch, caplog, call):
    """Creating a value's or a checkpoint's file, or renaming it into place,
    fails with ENOSPC (no inode left, a quota, a directory block): the write
    gets ``OutOfSpace`` and changes nothing; a recovery that cannot name its
    checkpoint clears the stream's stale tail instead, and the dict opens."""
    import errno

    from ultradict_ng._disk import files
    from ultradict_ng.errors import OutOfSpace

    real = getattr(files, call)

    def full(path: str, *rest: str) -> object:
        if os.path.basename(rest[0] if rest else path).startswith((D.DUMP_PREFIX, D.BLOB_PREFIX)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, *rest)

    d = SharedDict(path=durable_dir, sync="always", buffer_size=512, blob_threshold=256)
    d["a"] = 1
    monkeypatch.setattr(files, call, full)
    with pytest.raises(OutOfSpace, match="no room on the disk for"):
        d["b"] = b"x" * 1000  # (a value's file)
    with pytest.raises(OutOfSpace, match="no room on the disk for"):
        for i in range(50):
            d["f"] = "y" * 100 + str(i)  # (the stream fills: a checkpoint)
    monkeypatch.undo()
    assert "b" not in d and not [f for f in os.listdir(durable_dir) if f.endswith(D.TMP_SUFFIX)]
    kept = dict(d)
    d.close()
    with open(os.path.join(durable_dir, D.CLEAN_FILE), "r+b") as f:
        f.write(b"X")  # (damaged: a recovery, which writes a checkpoint)
    reboot(durable_dir)
    monkeypatch.setattr(files, call, full)
    d = SharedDict(path=durable_dir)
    monkeypatch.undo()
    assert dict(d) == kept and d.stats()["generation"] == 0
    assert "stale tail was cleared instead" in caplog.text
    d.unlink()
    d.close()


@pytest.mark.parametrize("code", ["EIO", "EMFILE"])
@pytest.mark.parametrize("call", ["sync_file", "sync_dir"])
def test_a_value_file_whose_sync_fails_is_sync_failed_and_gone(durable_dir, monkeypatch, call, code):
    """An I/O error syncing a large value's file, or the directory once it
    is named: the write raises ``SyncFailed`` and leaves no file of it (the
    named one too), the dict as it was.  No descriptor left to sync with is
    the process's limit, not the disk's: its own ``OSError``, as cleanly."""
    import errno

    from ultradict_ng._disk import files
    from ultradict_ng.errors import SyncFailed

    d = SharedDict({"a": 1}, path=durable_dir, sync="always")
    before = sorted(os.listdir(durable_dir))
    real = getattr(files, call)
    number = getattr(errno, code)

    def failing(*args: object) -> object:
        if call == "sync_dir" or os.path.basename(str(args[-1])).startswith(D.BLOB_PREFIX):
            raise OSError(number, os.strerror(number))
        return real(*args)

    monkeypatch.setattr(files, call, failing)
    with pytest.raises(OSError) as got:
        d["big"] = b"x" * 100_000
    if code == "EIO":
        assert isinstance(got.value, SyncFailed) and "nothing of it published" in str(got.value)
    else:
        assert not isinstance(got.value, SyncFailed) and got.value.errno == errno.EMFILE
    monkeypatch.undo()
    assert sorted(os.listdir(durable_dir)) == before and dict(d) == {"a": 1}
    d["big"] = b"y" * 100_000  # (the disk sound again: the dict goes on)
    d.unlink()
    d.close()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="root only opens another's dict")
def test_root_opening_another_users_dict_leaves_every_file_theirs(durable_dir):
    """Root reading or writing a dict whose directory another user owns (an
    admin's ``ultradict-ng show PATH``) leaves every file it makes -- the
    control segment, ``clean``, a checkpoint, a value's file -- owned by
    that user: mode 0600 files of root's would lock them out of their dict."""
    nobody = 65534
    d = SharedDict(path=durable_dir)
    d["k"] = 1
    d.close()
    for f in [durable_dir, *(os.path.join(durable_dir, f) for f in os.listdir(durable_dir))]:
        os.chown(f, nobody, nobody)
    d = SharedDict(path=durable_dir)  # (root: rebuilds the control segment)
    assert os.stat(os.path.join(SHM, control_of(durable_dir))).st_uid == nobody
    d["big"] = b"x" * 100_000  # (a value's file)
    d._store.force_dump()  # (a checkpoint)
    d.close()  # (clean)
    owners = {f: os.stat(os.path.join(durable_dir, f)).st_uid for f in os.listdir(durable_dir)}
    assert set(owners.values()) == {nobody}, owners
    d = SharedDict(path=durable_dir)
    d.unlink()
    d.close()


def test_an_awaited_write_under_always_syncs_without_blocking_the_loop(durable_dir, monkeypatch):
    """``await d.set(...)`` under ``sync="always"`` returns once the write is
    on the disk, but the ``fdatasync`` (here made to take 0.3 s) runs in a
    helper thread: a ticker coroutine keeps its 10 ms beat meanwhile."""
    import asyncio
    import time

    from ultradict_ng._disk import files
    from ultradict_ng.aio import AsyncSharedDict

    d = AsyncSharedDict(path=durable_dir, sync="always")
    real = files.sync_data
    synced: list[float] = []

    def slow(*args):
        time.sleep(0.3)
        real(*args)
        synced.append(time.monotonic())

    monkeypatch.setattr(files, "sync_data", slow)

    async def main() -> tuple[float, float]:
        beats: list[float] = []
        done = False

        async def ticker() -> None:
            while not done:
                beats.append(time.monotonic())
                await asyncio.sleep(0.01)

        task = asyncio.ensure_future(ticker())
        await asyncio.sleep(0.03)
        await d.set("k", 1)
        returned = time.monotonic()
        await d.update({"j": 2})
        await asyncio.sleep(0.03)  # (beats after the writes: a loop stood still shows as a gap)
        done = True
        await task
        return max(b - a for a, b in zip(beats, beats[1:])), returned

    gap, returned = asyncio.run(main())
    assert len(synced) == 2 and synced[0] <= returned  # (returned once synced)
    assert gap < 0.2, f"the loop stood still {gap:.2f} s"
    assert dict(d.dict) == {"k": 1, "j": 2}
    d.unlink()
    d.close()


def test_an_awaited_write_whose_handle_closes_before_its_sync_returns(durable_dir):
    """The sync of an awaited write waits in the loop's executor; the handle
    closed before it runs (a shutdown closing the dict while another task's
    write is in flight): the write returns -- the close synced what it
    published -- rather than fail on the released mapping."""
    import asyncio
    import time
    from concurrent.futures import ThreadPoolExecutor

    from ultradict_ng.aio import AsyncSharedDict

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        busy = loop.run_in_executor(None, time.sleep, 0.3)  # (its one thread busy: the sync waits)
        d = AsyncSharedDict(path=durable_dir, sync="always")
        task = asyncio.ensure_future(d.set("k", 1))
        await asyncio.sleep(0.05)
        d.close()
        await asyncio.wait_for(task, 10)
        await busy

    asyncio.run(main())
    e = SharedDict(path=durable_dir)
    assert dict(e) == {"k": 1}
    e.unlink()
    e.close()


def test_a_failed_checkpoint_that_cannot_be_removed_durably_fails_later_writes(durable_dir, monkeypatch):
    """A checkpoint that failed after its rename is removed, the directory
    synced; if that sync fails the file may stay on the disk, and a recovery
    would take it over every later record: no later write is acknowledged
    (``SyncFailed``), as after a failed sync of the stream."""
    import errno as E

    from ultradict_ng._disk import files
    from ultradict_ng._shm.writer import Writer
    from ultradict_ng.errors import SyncFailed

    d = SharedDict(path=durable_dir, sync="always", buffer_size=512)
    d["a"] = 0
    real_sync_dir = files.sync_dir

    def interrupted(self: object, *args: object) -> None:
        def failing(path: str) -> None:
            raise OSError(E.EIO, "Input/output error")

        monkeypatch.setattr(files, "sync_dir", failing)  # (the removal's sync, next)
        raise KeyboardInterrupt("while the checkpoint is mapped")

    monkeypatch.setattr(Writer, "_read_in_place", interrupted)
    with pytest.raises(OSError):
        for i in range(100):  # (the stream fills: a checkpoint)
            d["filler"] = "x" * 100 + str(i)
    monkeypatch.setattr(files, "sync_dir", real_sync_dir)
    monkeypatch.undo()
    with pytest.raises(SyncFailed):
        d["acked"] = "not on the disk"
    recovers_after_a_failed_sync(durable_dir, d)


@pytest.mark.parametrize("write", ["a write", "a transaction"])
def test_always_syncs_a_write_whose_thread_another_transaction_follows(durable_dir, monkeypatch, write):
    """Two threads on one handle under "always": B's write (or block) ends,
    and A opens a transaction the moment the lock is free. B decided whether
    to sync after the release, saw A's open block, and returned unsynced --
    an acknowledged write a power loss could take."""
    import threading

    d = SharedDict(path=durable_dir, sync="always")
    d["x"] = 0
    words = d._store._map.words
    a_in, a_may_end = threading.Event(), threading.Event()
    cls = type(d._store.lock)
    real = cls.release
    ender = "end_write" if write == "a write" else "end_transaction"

    def release(self: object) -> None:
        real(self)
        caller = sys._getframe(1).f_code.co_name
        if caller == ender and threading.current_thread().name == "B" and not a_in.is_set():
            threading.Thread(target=in_a_block, name="A").start()
            assert a_in.wait(10)  # (A's block open before B goes on)

    def in_a_block() -> None:
        with d.transaction():
            a_in.set()
            a_may_end.wait(10)

    monkeypatch.setattr(cls, "release", release)
    seen: dict[str, int] = {}

    def b() -> None:
        if write == "a write":
            d["x"] = 1
        else:
            with d.transaction():
                d["x"] = 1
        seen["state"], seen["synced"] = words[L.W_STATE], words[L.W_SYNCED]

    t = threading.Thread(target=b, name="B")
    try:
        t.start()
        t.join(10)
        a_may_end.set()
        assert a_in.is_set() and seen["synced"] >= seen["state"], {k: hex(v) for k, v in seen.items()}
    finally:
        a_may_end.set()
        monkeypatch.undo()
        time.sleep(0.1)  # (A's block ends)
        d.unlink()
        d.close()


def test_a_sync_leader_naming_this_process_with_no_thread_leading_is_stale(durable_dir):
    """SYNC_LEADER left naming this process (a release lost) is taken over as
    a dead process's is: no thread of it leads, and a sync waited for ever
    (a word naming itself was never checked)."""
    import threading

    from ultradict_ng._shm.lock import owner_word

    d = SharedDict(path=durable_dir, sync="always")
    atomic = d._store._map.atomic
    atomic.store(L.W_SYNC_LEADER, owner_word())
    t = threading.Thread(target=d.__setitem__, args=("x", 1), daemon=True)
    t.start()
    t.join(5)
    stuck = t.is_alive()
    if stuck:
        atomic.store(L.W_SYNC_LEADER, 0)  # (let it end)
        t.join(5)
    assert not stuck and d._store._map.words[L.W_SYNCED] >= d._store._map.words[L.W_STATE]
    d.unlink()
    d.close()


def test_a_handle_collected_inside_another_handles_sync_lead_syncs_itself(durable_dir):
    """Under "always" a handle in a reference cycle is collected -- its close
    run -- inside the sync another handle of the dict leads in this thread:
    the close's sync waited for the leader, which was itself, suspended.
    In a child bounded in time; the collection forced at the sync."""
    code = textwrap.dedent(
        f"""
        import gc, threading
        from ultradict_ng import SharedDict
        from ultradict_ng._disk import files

        h1 = SharedDict(path={durable_dir!r}, sync="always")
        h2 = SharedDict(path={durable_dir!r}, create=False)
        h2["y"] = 2
        cycle = [h2]
        cycle.append(cycle)  # (freed by the cyclic collector only)
        del h2, cycle
        real, armed = files.sync_data, [True]

        def sync_data(*args):
            if armed[0]:
                armed[0] = False
                gc.collect()  # (as a collection at any allocation there)
            return real(*args)

        files.sync_data = sync_data
        gc.disable()
        h1["x"] = 1
        files.sync_data = real
        gc.enable()
        assert dict(h1) == {{"y": 2, "x": 1}}
        h1.unlink()
        h1.close()
        print("ok")
        """
    )
    ok_in_a_child(code, durable_dir)


def test_a_handle_closed_while_the_flusher_leads_its_sync_leaves_no_leader(durable_dir):
    """Under "interval" the flusher thread leads a sync of a handle another
    thread closes: the close released the mapping between the leader's sync
    and its release of SYNC_LEADER, which then failed (swallowed), and every
    later sync of the dict in this process waited for ever for a leader that
    was this process. In a child bounded in time."""
    code = textwrap.dedent(
        f"""
        import threading, time
        from ultradict_ng import SharedDict
        from ultradict_ng._disk.syncing import Durability

        root = SharedDict(path={durable_dir!r}, sync="interval", sync_interval=0.05)
        h = SharedDict(path={durable_dir!r}, create=False)
        real, paused = Durability._lead, threading.Event()

        def lead(self):
            real(self)
            if threading.current_thread().name == "ultradict_ng sync" and not paused.is_set():
                paused.set()
                time.sleep(0.5)  # (synced, SYNC_LEADER not released yet)

        Durability._lead = lead
        h["x"] = 1
        assert paused.wait(5)
        h.close()
        Durability._lead = real
        root["y"] = 2
        root.close()  # (its sync waited for ever)
        r = SharedDict(path={durable_dir!r}, create=False)
        assert dict(r) == {{"x": 1, "y": 2}}
        r.unlink()
        r.close()
        print("ok")
        """
    )
    ok_in_a_child(code, durable_dir)


def test_a_write_waiting_on_a_failed_group_commit_is_not_acknowledged(durable_dir, monkeypatch):
    """Two threads under ``"always"``: A leads the group commit and its sync
    fails; B, published meanwhile and waiting, would lead a sync of its own,
    which Linux lets succeed (it reports a failed write-back once): B raises
    ``SyncFailed`` too -- its record lies past pages the disk never got."""
    import errno as E
    import threading

    from ultradict_ng._disk import files
    from ultradict_ng.errors import SyncFailed

    d = SharedDict(path=durable_dir, sync="always")
    d["x"] = 0
    real, gate, calls = files.sync_data, threading.Event(), [0]

    def slow_then_failing(*args: object) -> None:
        calls[0] += 1
        if calls[0] == 1:
            gate.wait(10)
            raise OSError(E.EIO, "Input/output error")
        real(*args)

    monkeypatch.setattr(files, "sync_data", slow_then_failing)
    got: dict[str, str] = {}

    def write(key: str) -> None:
        try:
            d[key] = 1
            got[key] = "acknowledged"
        except SyncFailed:
            got[key] = "SyncFailed"

    threads = [threading.Thread(target=write, args=(k,)) for k in "ab"]
    threads[0].start()
    time.sleep(0.2)
    threads[1].start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join(10)
    assert got == {"a": "SyncFailed", "b": "SyncFailed"}
    monkeypatch.undo()
    d.close()
    reboot(durable_dir)
    SharedDict(path=durable_dir).unlink()


def test_an_awaited_write_whose_close_failed_to_sync_raises(durable_dir, monkeypatch):
    """The handle closes before an awaited write's sync runs, and the close's
    own sync fails (logged there): the write raises ``SyncFailed`` -- no sync
    covered it -- instead of returning as if on the disk."""
    import asyncio
    import errno as E
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from ultradict_ng._disk import files
    from ultradict_ng.aio import AsyncSharedDict
    from ultradict_ng.errors import SyncFailed

    real, failing = files.sync_data, [False]

    def flaky(*args: object) -> None:
        if failing[0]:
            raise OSError(E.EIO, "Input/output error")
        real(*args)

    monkeypatch.setattr(files, "sync_data", flaky)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        busy = threading.Event()
        waiting = loop.run_in_executor(None, busy.wait)  # (its one thread busy: the sync waits)
        d = AsyncSharedDict(path=durable_dir, sync="always")
        task = asyncio.ensure_future(d.set("k", 1))
        await asyncio.sleep(0.1)
        failing[0] = True
        d.close()
        busy.set()
        with pytest.raises(SyncFailed):
            await task
        await waiting

    asyncio.run(main())
    monkeypatch.undo()
    reboot(durable_dir)
    SharedDict(path=durable_dir).unlink()
