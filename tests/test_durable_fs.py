"""A dict kept in files on real filesystems mounted by the test (root only):
a full one (a tmpfs of a few hundred KiB) and a power cut (an ext4 image on a
loop device, copied while the writer is stopped: the copy holds only what
reached the device, as after a power loss)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ultradict_ng import SharedDict
from ultradict_ng._disk.opening import control_of
from ultradict_ng.errors import InUseElsewhere, OutOfSpace, Unlinked

pytestmark = [
    pytest.mark.shm_only,
    pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"), reason="mounts need root"),
]


@contextlib.contextmanager
def mounted(where: str, *args: str) -> Iterator[str]:
    os.makedirs(where)
    out = subprocess.run(["mount", *args, where], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount here: {out.stderr.strip()}")
    try:
        yield where
    finally:
        for _ in range(50):
            if subprocess.run(["umount", where], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["umount", "-l", where], capture_output=True)
        os.rmdir(where)


def test_a_full_disk_fails_the_write_and_publishes_nothing(tmp_path):
    with mounted(str(tmp_path / "small"), "-t", "tmpfs", "-o", "size=400k", "tmpfs") as mnt:
        path = os.path.join(mnt, "dict")
        d = SharedDict(path=path, sync="always", buffer_size=16 << 10, blob_threshold=8 << 10)
        written = {}
        with pytest.raises(OutOfSpace, match=f"no room on the disk for {path}/"):
            for i in range(1000):
                value = bytes([i % 256]) * (20 << 10) if i % 3 == 0 else "v" * 500
                d[f"k{i}"] = value
                written[f"k{i}"] = value
        assert dict(d.items()) == written  # the write that did not fit changed nothing
        d.close()  # (the last close: the control segment goes, "clean" stays)
        e = SharedDict(path=path, create=False)
        assert {k: bytes(v) if isinstance(v, memoryview) else v for k, v in e.items()} == written
        for k in list(written)[:5]:  # room made: writes go on
            del e[k]
        e["after"] = 1
        e.unlink()
        e.close()


def test_a_power_cut_keeps_every_acknowledged_write(tmp_path):
    """An ext4 image, a writer with sync="always" stopped at a random instant,
    the image copied (what reached the device), the copy mounted and opened."""
    image = str(tmp_path / "disk.img")
    subprocess.run(["truncate", "-s", "64M", image], check=True)
    mkfs = subprocess.run(["mkfs.ext4", "-q", "-F", image], capture_output=True, text=True)
    if mkfs.returncode != 0:
        pytest.skip(f"no mkfs.ext4: {mkfs.stderr.strip()}")
    copy = str(tmp_path / "copy.img")
    with mounted(str(tmp_path / "disk"), "-o", "loop", image) as mnt:
        path = os.path.join(mnt, "dict")
        d = SharedDict({"k0": -1}, path=path, sync="always", buffer_size=4096, blob_threshold=256)
        d.close()
        writer = subprocess.Popen(
            [sys.executable, "-m", "tests.durable_workers", "write", path, "0", "1000000"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(1.5)
            os.kill(writer.pid, signal.SIGSTOP)
            shutil.copyfile(image, copy)  # the device as a power cut leaves it: no sync runs between
        finally:
            os.kill(writer.pid, signal.SIGKILL)
            out, _ = writer.communicate(timeout=60)
        acked = [int(line.split()[2]) for line in out.splitlines() if line.startswith("ack ")]
        assert len(acked) > 10, "the writer wrote too little in time"
        os.unlink(os.path.join("/dev/shm", control_of(path)))  # (the writer's; the copy gets its own)
    with mounted(str(tmp_path / "after"), "-o", "loop", copy) as mnt:
        path = os.path.join(mnt, "dict")
        out = subprocess.run(
            [sys.executable, "-m", "tests.durable_workers", "open", path], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        last = {f"k{i % 5}": i for i in acked}
        for key, value in last.items():  # every acknowledged write, or the one after it
            assert got[key] in (value, value + 5), (key, got[key], value)
        d = SharedDict(path=path, create=False)
        d.unlink()
        d.close()


def test_a_cache_on_a_full_disk_is_refused_and_leaves_nothing(tmp_path):
    """Its side file cannot be made: OutOfSpace, no cache (nor a half-made
    side file) left; with room made, the same directory makes a cache."""
    from ultradict_ng.cache import SharedCache

    with mounted(str(tmp_path / "small"), "-t", "tmpfs", "-o", "size=1m", "tmpfs") as mnt:
        path = os.path.join(mnt, "cache")
        SharedDict(path=path, buffer_size=16 << 10).close()  # the dict fits ...
        ballast = os.path.join(mnt, "ballast")
        with open(ballast, "wb", buffering=0) as f:  # ... then the disk fills up
            with contextlib.suppress(OSError):
                while True:
                    f.write(bytes(64 << 10))
        with pytest.raises(OutOfSpace):
            SharedCache(path=path, maxsize=100_000)  # (a side file of 2.6 MiB)
        assert sorted(os.listdir(path)) == ["clean", "dict.meta", "stream"]
        os.unlink(ballast)
        c = SharedCache(path=path, maxsize=1000)
        c["k"] = 1
        c.unlink()
        c.close()


def _fill_up(mnt: str, chunk: int) -> str:
    """A file that takes the mount's free space, written ``chunk`` bytes at a time: its path."""
    ballast = os.path.join(mnt, "ballast")
    with open(ballast, "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(bytes(chunk))
    return ballast


@pytest.mark.parametrize("table", ["decoded", "read in place"])
def test_a_recovery_on_a_full_disk_clears_the_stale_tail_instead(tmp_path, caplog, monkeypatch, table):
    """A recovery writes a checkpoint (step e); where the disk has no room
    for one it clears the stream's bytes past its end instead (pages the file
    has: no room needed), so a dict that was not closed cleanly still opens
    on a full disk, whole -- also when it had planned the checkpoint from the
    records' bytes, which it then replays; once there is room, writes and
    checkpoints go on."""
    if table == "read in place":
        monkeypatch.setenv("ULTRADICT_NG_PARTIAL_FROM", "64")
    with mounted(str(tmp_path / "small"), "-t", "tmpfs", "-o", "size=1m", "tmpfs") as mnt:
        path = os.path.join(mnt, "dict")
        d = SharedDict(path=path, buffer_size=64 << 10)
        d.update({f"k{i}": "v" * 200 for i in range(400)})  # (past the stream: a checkpoint of ~100 KiB)
        for i in range(100):
            d[f"n{i}"] = i  # (records after it)
        model = dict(d)
        d.close()
        os.remove(os.path.join(path, "clean"))  # (as a crash leaves it)
        ballast = _fill_up(mnt, 16 << 10)
        with caplog.at_level("WARNING", logger="ultradict_ng"):
            e = SharedDict(path=path)
        assert dict(e) == model and "stale tail was cleared instead" in caplog.text
        e.close()
        os.unlink(ballast)
        e = SharedDict(path=path)  # (clean: the last close recorded it)
        assert dict(e) == model
        e["after"] = 1
        e._store.force_dump()
        e.unlink()
        e.close()


def test_a_recovery_on_a_full_tmpfs_reads_no_hole_through_a_mapping(tmp_path):
    """A growing stream is a sparse file, and on tmpfs a hole touched through
    a mapping takes a page -- on a full one, the process dies of SIGBUS.  A
    recovery there (no room for its checkpoint) reads past the records with
    ``pread`` and clears only pages that hold data: it opens, whole, and so
    does ``doctor``.  The records end within the look past them of the
    stream's reserved part, so that both read holes beyond it."""
    with mounted(str(tmp_path / "small"), "-t", "tmpfs", "-o", "size=4m", "tmpfs") as mnt:
        path = os.path.join(mnt, "dict")
        d = SharedDict(path=path, sync="never")
        stats = d.stats()
        i = 0
        while stats["stream_end"] < stats["stream_limit"] - (16 << 10):
            for _ in range(50):
                d[f"k{i % 100}"] = f"{i:05d}" + "v" * 100
                i += 1
            stats = d.stats()
        assert stats["generation"] == 0 and stats["stream_end"] < stats["stream_limit"]
        model = dict(d)
        d.close()
        os.remove(os.path.join(path, "clean"))  # (as a crash leaves it)
        ballast = _fill_up(mnt, 4 << 10)
        code = "\n".join(
            [
                "from ultradict_ng import SharedDict",
                "from ultradict_ng.cli.paths import file_checks",
                f"print(file_checks({path!r}))",
                f"d = SharedDict(path={path!r})",
                "print(repr(dict(d)))",
                "d.close()",
            ]
        )
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
        assert p.stdout.splitlines()[-1] == repr(model)
        assert "stale tail was cleared instead" in p.stderr
        os.unlink(ballast)
        e = SharedDict(path=path)
        assert dict(e) == model
        e.unlink()
        e.close()


@pytest.mark.parametrize("made", ["cp --sparse=always", "cut short"])
def test_a_stream_with_holes_on_a_full_disk_fails_writes_not_the_process(tmp_path, made):
    """A backup copied with ``cp`` has a sparse stream, and a stream cut short
    is extended sparse by the recovery: holes where LIMIT said the room was
    reserved.  A write through the mapping into a hole a full disk has no
    page for kills the process (SIGBUS); the recovery reserves LIMIT again
    -- or, with no room, only what the records take -- so that a write past
    it fails with ``OutOfSpace`` instead, publishing nothing."""
    with mounted(str(tmp_path / "small"), "-t", "tmpfs", "-o", "size=4m", "tmpfs") as mnt:
        path, copy = os.path.join(mnt, "dict"), os.path.join(mnt, "copy")
        d = SharedDict({f"k{i}": i for i in range(20)}, path=path, sync="never")
        d.close()
        if made == "cp --sparse=always":
            subprocess.run(["cp", "-r", "--sparse=always", path, copy], check=True)
            shutil.rmtree(path)
        else:
            os.rename(path, copy)
            os.truncate(os.path.join(copy, "stream"), 64 << 10)
        ballast = _fill_up(mnt, 4 << 10)
        code = "\n".join(
            [
                "from ultradict_ng import SharedDict",
                "from ultradict_ng.errors import OutOfSpace",
                f"d = SharedDict(path={copy!r})",
                "try:",
                "    for i in range(100000):",
                "        d[f'n{i}'] = 'v' * 100",
                "except OutOfSpace as exc:",
                "    print('OutOfSpace', i, exc)",
                "d.close()",
            ]
        )
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
        assert p.stdout.startswith("OutOfSpace"), p.stdout
        written = int(p.stdout.split()[1])
        os.unlink(ballast)
        e = SharedDict(path=copy)
        assert dict(e) == {**{f"k{i}": i for i in range(20)}, **{f"n{i}": "v" * 100 for i in range(written)}}
        e.unlink()
        e.close()


def test_without_posix_modules_import_works_and_every_open_refuses(tmp_path):
    """As on Windows (no ``fcntl``, no ``_posixshmem``): the package imports,
    and an open -- by name or by path -- raises ``OSError``, making nothing."""
    where = tmp_path / "d"
    script = f"""
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name in ("fcntl", "_posixshmem"):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Absent())
from ultradict_ng import SharedDict
for kw in ({{"name": "udng-nowin"}}, {{"path": {str(where)!r}}}):
    try:
        SharedDict(**kw)
    except OSError as exc:
        print(type(exc).__name__, exc.errno)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.stdout.split("\n")[:2] == ["OSError 38", "OSError 38"], out.stdout + out.stderr
    assert not where.exists()


def _open_elsewhere(path: str) -> str:
    """Open the dict in a new process: what happened, in a word."""
    code = (
        "from ultradict_ng import SharedDict, InUseElsewhere, NotADict\n"
        f"try:\n    d = SharedDict(path={path!r}, create=False)\n"
        "except (InUseElsewhere, NotADict) as exc:\n    print(type(exc).__name__, exc)\n"
        "else:\n    print('opened', sorted(d.items()))\n    d.close()\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout


def test_an_open_dict_whose_shared_memory_is_gone_is_not_rebuilt_beside_it(durable_dir):
    """A handle open while the dict's control segment is removed (a cleaner
    of ``/dev/shm``; or another IPC namespace, which has its own): a new
    opener would rebuild the dict from the files beside it, and each would
    overwrite the other's writes.  It is refused while the handle is open,
    and opens once it is closed."""
    from ultradict_ng._disk.opening import control_of

    d = SharedDict({"a": 1}, path=durable_dir)
    os.unlink(os.path.join("/dev/shm", control_of(durable_dir)))
    said = _open_elsewhere(durable_dir)
    assert said.startswith("InUseElsewhere") and "another container or IPC namespace" in said, said
    d["b"] = 2
    d.close()
    assert _open_elsewhere(durable_dir) == "opened [('a', 1), ('b', 2)]\n"
    SharedDict(path=durable_dir).unlink()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_processes_of_two_shared_memories_do_not_both_open_one_dict(durable_dir):
    """Two containers on one volume, each with its own ``/dev/shm`` (here a
    mount namespace with a tmpfs of its own): the second opener is refused
    while the first has the dict open, and nothing the first wrote is lost."""
    SharedDict({"n": 0}, path=durable_dir).close()
    script = (
        "import sys, time\nfrom ultradict_ng import SharedDict\n"
        f"d = SharedDict(path={durable_dir!r})\nd['first'] = 1\nprint('open', flush=True)\n"
        "sys.stdin.readline()\nd['last'] = 2\nd.close()\n"
    )
    first = subprocess.Popen(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f'mount -t tmpfs tmpfs /dev/shm && exec "{sys.executable}" -c "$0"',
            script,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None and first.stdout.readline() == "open\n"
        said = _open_elsewhere(durable_dir)
        assert said.startswith("InUseElsewhere"), said
    finally:
        first.communicate("\n", timeout=60)
    assert first.returncode == 0
    assert _open_elsewhere(durable_dir) == "opened [('first', 1), ('last', 2), ('n', 0)]\n"
    SharedDict(path=durable_dir).unlink()


def test_a_copy_made_by_hard_links_is_refused_until_it_has_its_own_files(durable_dir):
    """``cp -al`` (or ``rsync --link-dest``) shares the stream, written in
    place, between the dict and its copy: a write to one would show in the
    other.  Refused, naming the file and the fix; after the fix the copy is a
    dict of its own."""
    SharedDict({"a": 1}, path=durable_dir).close()
    copy = durable_dir + "-links"
    subprocess.run(["cp", "-al", durable_dir, copy], check=True)
    said = _open_elsewhere(copy)
    assert said.startswith("NotADict") and "stream has 2 hard links" in said, said
    subprocess.run("cp stream stream.own && mv stream.own stream", shell=True, cwd=copy, check=True)
    c = SharedDict(path=copy)
    c["b"] = 2
    c.unlink()
    c.close()
    assert _open_elsewhere(durable_dir) == "opened [('a', 1)]\n"
    SharedDict(path=durable_dir).unlink()


@pytest.mark.parametrize("made_by", ["the open", "another"])
def test_a_new_dicts_directory_entry_is_synced_in_every_parent(tmp_path, monkeypatch, made_by):
    """A power loss may lose a directory's entry in its parent until the
    parent is synced: the dict's own directory and every directory above it
    are synced before the creation returns -- whoever made them (an opener
    racing this one, the user just before: this open cannot tell)."""
    from ultradict_ng._disk import files

    path = tmp_path / "a" / "b" / "dict"
    if made_by == "another":
        os.makedirs(path)  # (no sync: the entries of a, b and dict in the page cache only)
    synced: list[str] = []
    real = files.sync_dir
    monkeypatch.setattr(files, "sync_dir", lambda path: (synced.append(path), real(path))[1])
    d = SharedDict(path=str(path), sync="always")
    for level in (tmp_path, tmp_path / "a", tmp_path / "a" / "b", path):
        assert str(level) in synced, (level, synced)
    assert "/" in synced
    d["k"] = 1
    d.unlink()
    d.close()


def test_a_new_dict_through_a_symbolic_link_syncs_where_it_leads(tmp_path, monkeypatch):
    """``app/link/new/dict`` with ``link`` to ``disk/data`` (just made): the
    entries above the dict where it really is are synced too -- ``data`` in
    ``disk`` -- not only those above the path as given."""
    from ultradict_ng._disk import files

    os.makedirs(tmp_path / "disk" / "data")
    os.makedirs(tmp_path / "app")
    (tmp_path / "app" / "link").symlink_to(tmp_path / "disk" / "data")
    synced: list[str] = []
    real = files.sync_dir
    monkeypatch.setattr(files, "sync_dir", lambda path: (synced.append(path), real(path))[1])
    d = SharedDict(path=str(tmp_path / "app" / "link" / "new" / "dict"))
    for level in (tmp_path / "disk", tmp_path / "disk" / "data", tmp_path / "disk" / "data" / "new"):
        assert str(level) in synced, (level, synced)
    d.unlink()
    d.close()


def test_the_open_check_leaves_no_lock_to_a_child_forked_meanwhile(tmp_path, monkeypatch):
    """The check for open handles takes ``LOCK_EX`` on a descriptor of its
    own: a child forked by another thread while it holds it shares the lock
    and would keep it after the close.  It unlocks before closing, so the
    next handle's shared lock is not kept waiting for that child."""
    import fcntl

    from ultradict_ng._disk import files

    stream = tmp_path / "stream"
    stream.write_bytes(b"\0" * 4096)
    real, children = fcntl.flock, []

    def flock(fd: int, op: int) -> None:
        real(fd, op)
        if op == fcntl.LOCK_EX | fcntl.LOCK_NB and not children:
            pid = os.fork()  # (another thread's fork, at the worst moment)
            if pid == 0:
                time.sleep(3)
                os._exit(0)
            children.append(pid)

    monkeypatch.setattr(files.fcntl, "flock", flock)
    try:
        assert not files.marked_open(str(stream))
        monkeypatch.setattr(files.fcntl, "flock", real)
        fd = os.open(stream, os.O_RDONLY)
        try:
            real(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # (what a new handle takes: free)
        finally:
            os.close(fd)
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _hold_mark(path: str, ready: Any, stop: Any) -> None:
    """A handle of another container: its mark on the stream, nothing of this shared memory."""
    import fcntl

    fd = os.open(os.path.join(path, "stream"), os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    ready.set()
    stop.wait(60)


def _write_then_die(path: str, keys: list[str]) -> None:
    d = SharedDict(path=path)
    for k in keys:
        d[k] = 1
    os.kill(os.getpid(), signal.SIGKILL)


def test_shared_memory_its_users_left_is_not_used_while_another_has_the_dict_open(durable_dir):
    """A process here killed leaves the dict's shared memory, its users all
    dead; a handle outside this shared memory (another container) then has
    the dict open: an opener here is refused -- attached to the segment
    left, it would write beside that handle, each over the other's records."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    SharedDict({"a": 1}, path=durable_dir).close()
    p = ctx.Process(target=_write_then_die, args=(durable_dir, []))  # (opens, writes nothing)
    p.start()
    p.join(30)
    assert os.path.exists(os.path.join("/dev/shm", control_of(durable_dir)))
    ready, stop = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_mark, args=(durable_dir, ready, stop))
    holder.start()
    try:
        assert ready.wait(30)
        with pytest.raises(InUseElsewhere):
            SharedDict(path=durable_dir)
    finally:
        stop.set()
        holder.join(30)
    d = SharedDict(path=durable_dir)
    assert dict(d) == {"a": 1}
    d.unlink()
    d.close()


def test_shared_memory_older_than_the_files_checkpoint_is_rebuilt(durable_dir):
    """Containers taking turns, each with its own ``/dev/shm``: A's processes
    are killed (its shared memory stays, generation 0); B rebuilds the dict
    from the files (a checkpoint), reads and is killed; A's next open must
    not attach to its old shared memory -- its writes would land in a
    generation no recovery reads -- but rebuild from the newer checkpoint."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    SharedDict(path=durable_dir).close()
    shm = os.path.join("/dev/shm", control_of(durable_dir))
    for who, keys in (("a", ["a1", "a2"]), ("b", [])):  # (B only reads: A's records stay whole)
        p = ctx.Process(target=_write_then_die, args=(durable_dir, keys))
        p.start()
        p.join(30)
        if who == "a":
            os.rename(shm, shm + "-a")  # (A's /dev/shm, out of B's sight)
    os.unlink(shm)  # (B's container gone, its /dev/shm with it)
    os.rename(shm + "-a", shm)  # (A restarts with its own /dev/shm, writes and is killed)
    p = ctx.Process(target=_write_then_die, args=(durable_dir, ["a3"]))
    p.start()
    p.join(30)
    os.unlink(shm)  # (and C, a new container, opens)
    e = SharedDict(path=durable_dir)
    assert sorted(e) == ["a1", "a2", "a3"]
    e.unlink()
    e.close()


def test_a_removal_killed_midway_stops_the_handles_still_open(durable_dir):
    """A removal killed once ``dict.meta`` says "creating": the handles still
    open on the dict write nothing more (``Unlinked``), also once a new dict
    is made at its path -- their files would land in it."""
    import multiprocessing

    from ultradict_ng._disk import lifetime

    d = SharedDict({"a": 1}, path=durable_dir, blob_threshold=1024)
    real = lifetime._mark_removed

    def killed(directory: str) -> None:
        real(directory)
        os.kill(os.getpid(), signal.SIGKILL)

    def remove() -> None:
        lifetime._mark_removed = killed
        SharedDict(path=durable_dir).unlink()

    p = multiprocessing.get_context("fork").Process(target=remove)
    p.start()
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    with pytest.raises(Unlinked):
        d["b"] = 2
    new = SharedDict(path=durable_dir)
    with pytest.raises(Unlinked):
        d["big"] = b"x" * 5000
    assert dict(new) == {} and not [f for f in os.listdir(durable_dir) if f.startswith("blob.")]
    d.close()
    new.unlink()
    new.close()


def test_a_creation_over_leftovers_stops_the_handles_of_the_dict_before(durable_dir):
    """A ``dict.meta`` that says "creating" beside a dict's files (what a
    creation killed midway leaves) while a handle of the dict that was there
    is open: the creation retires that dict's shared memory, and the handle
    writes nothing more -- its files would land in the new dict."""
    d = SharedDict({"a": 1}, path=durable_dir)
    meta = os.path.join(durable_dir, "dict.meta")
    with open(meta) as f:
        described = json.load(f)
    with open(meta, "w") as f:
        json.dump({**described, "creating": True}, f)
    new = SharedDict(path=durable_dir)
    assert dict(new) == {}
    with pytest.raises(Unlinked):
        d["b"] = 2
    d.close()
    new.unlink()
    new.close()


def test_shared_memory_left_under_the_name_by_another_user_is_named(durable_dir, monkeypatch):
    """Shared memory left under the dict's name (a directory of the same inode
    before, another user's) that this user cannot open: a ``PermissionError``
    naming the directory, the segment and what to do -- at a creation and at
    an open -- not the system's bare words about ``/udng+...``."""
    from ultradict_ng._platform import segments

    SharedDict({"a": 1}, path=durable_dir).close()
    real = segments.Segment.attach.__func__  # type: ignore[attr-defined]

    def attach(cls: Any, name: str) -> Any:
        if "@" not in name:  # (the control segment: another user's, mode 0600)
            raise PermissionError(13, "Permission denied", "/" + name)
        return real(cls, name)

    monkeypatch.setattr(segments.Segment, "attach", classmethod(attach))
    for path in (durable_dir, durable_dir + "-new"):  # (an open, a creation)
        with pytest.raises(PermissionError, match="belongs to .*ultradict-ng clean") as raised:
            SharedDict(path=path)
        assert path in str(raised.value) and "/dev/shm/udng+" in str(raised.value)
    monkeypatch.undo()
    SharedDict(path=durable_dir).unlink()
    shutil.rmtree(durable_dir + "-new", ignore_errors=True)


def test_a_close_and_an_open_in_two_threads_keep_the_shared_memory(durable_dir):
    """A thread closes the process's last handle while another opens the
    dict: the opener attaches to the shared memory the closer's handle left
    (its slot already free), and the closer's last close, under the
    directory lock next, must see the new handle of its own process -- not
    remove the shared memory under it (a later open refused, its writes
    lost)."""
    import threading

    from ultradict_ng._disk import dirlock

    d1 = SharedDict({"a": 1}, path=durable_dir, sync="always")
    name = d1._store.name
    busy = dirlock.directory_lock(durable_dir)  # (another opener at work: the threads queue)
    busy.acquire()
    opened: dict[str, SharedDict] = {}
    t2 = threading.Thread(target=lambda: opened.setdefault("d2", SharedDict(path=durable_dir)))
    t2.start()
    time.sleep(0.3)
    t1 = threading.Thread(target=d1.close)
    t1.start()
    time.sleep(0.3)
    busy.__exit__()
    t1.join(10)
    t2.join(10)
    d2 = opened["d2"]
    assert os.path.exists(os.path.join("/dev/shm", name))
    d2["b"] = 2
    d3 = SharedDict(path=durable_dir)
    assert dict(d3) == {"a": 1, "b": 2}
    d3.close()
    d2.close()
    e = SharedDict(path=durable_dir)
    assert dict(e) == {"a": 1, "b": 2}
    e.unlink()
    e.close()


def test_a_handle_keeps_its_mark_until_its_last_close_is_done(durable_dir, monkeypatch):
    """The last close writes ``clean`` and removes the shared memory under the
    directory lock: until then the handle's mark stays, so that an opener
    with another ``/dev/shm`` is refused instead of rebuilding the dict from
    files the close then writes over (a checkpoint of its named "missing")."""
    from ultradict_ng._disk import files, lifetime

    d = SharedDict({"a": 1}, path=durable_dir)
    stream = os.path.join(durable_dir, "stream")
    real, seen = lifetime._close_registered, []

    def spy(*args: Any) -> None:
        seen.append(files.marked_open(stream))
        real(*args)
        seen.append(files.marked_open(stream))

    monkeypatch.setattr(lifetime, "_close_registered", spy)
    d.close()
    assert seen == [True, True] and not files.marked_open(stream)
    monkeypatch.undo()
    SharedDict(path=durable_dir).unlink()


def _killed_inside_a_sync(path: str, big: str, w: int) -> None:
    d = SharedDict(path=path)
    d["x"] = 1

    def syncing() -> None:  # (a thread inside a system call when the process is killed)
        fd = os.open(big, os.O_WRONLY | os.O_CREAT)
        while True:
            for _ in range(32):
                os.write(fd, b"\1" * (1 << 20))
            os.write(w, b"s")
            os.fsync(fd)
            os.lseek(fd, 0, 0)

    import threading

    threading.Thread(target=syncing, daemon=True).start()
    time.sleep(60)


def test_a_process_killed_while_a_thread_syncs_does_not_refuse_the_next_open(durable_dir, tmp_path):
    """A process killed with a thread inside ``fsync`` shows as dead (its main
    thread a zombie) while that thread still holds its descriptors -- its
    mark on the stream with them -- for a few milliseconds: the next opener
    waits for the mark to go instead of refusing (``InUseElsewhere``)."""
    import multiprocessing

    SharedDict(path=durable_dir, sync="interval").close()
    ctx = multiprocessing.get_context("fork")
    for _attempt in range(8):
        r, w = os.pipe()
        p = ctx.Process(target=_killed_inside_a_sync, args=(durable_dir, str(tmp_path / "big"), w))
        p.start()
        os.close(w)
        assert os.read(r, 1) == b"s"  # (its thread syncs: kill it while it does, again)
        os.kill(p.pid, signal.SIGKILL)
        d = SharedDict(path=durable_dir)  # (refused before: InUseElsewhere)
        d.close()
        p.join(30)
        os.close(r)
    SharedDict(path=durable_dir).unlink()


def test_a_handle_collected_inside_an_open_of_its_dict_closes_after_it(tmp_path):
    """A garbage collection inside this thread's open of a dict -- which holds
    the directory lock -- closes a collected handle of the same dict: its
    close, which takes that lock too, runs once the open lets it go, instead
    of waiting for ever on a lock ``flock`` does not know is its own."""
    path = str(tmp_path / "d")
    script = f"""
import gc
from ultradict_ng import SharedDict
from ultradict_ng._disk import opening
kept = SharedDict({{"k": 1}}, path={path!r})
class Cycle:
    def __init__(self):
        self.me, self.d = self, SharedDict(path={path!r})
gc.disable()
Cycle()
arm = opening._arm
def collecting(*args):
    gc.collect()  # (an automatic collection at an allocation there)
    return arm(*args)
opening._arm = collecting
third = SharedDict(path={path!r})
opening._arm = arm
third["j"] = 2
third.close()
kept.close()
print(sorted(SharedDict(path={path!r}).items()))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout == "[('j', 2), ('k', 1)]\n", out.stdout + out.stderr
    SharedDict(path=path).unlink()


@pytest.mark.skipif(shutil.which("chattr") is None, reason="needs chattr")
@pytest.mark.parametrize("flag", ["+i", "+a"])
def test_a_directory_that_refuses_new_files_fails_the_write_and_publishes_nothing(durable_dir, flag):
    """A large value's file and a checkpoint's cannot be made or named (an
    immutable or append-only directory here; a filesystem gone read-only
    does the same): the write fails with the system's error, naming the file
    it was for -- not hidden by the removal of its ``.tmp`` name, which the
    directory refuses too -- and publishes nothing; once the directory takes
    files again, writes go on."""
    d = SharedDict(path=durable_dir, sync="always", buffer_size=16 << 10, blob_threshold=1 << 10)
    d["before"] = 1
    try:
        if subprocess.run(["chattr", flag, durable_dir], capture_output=True).returncode != 0:
            pytest.skip(f"this filesystem takes no {flag} flag")
        try:
            with pytest.raises(PermissionError, match=f"{durable_dir}/blob.1 could not be made; nothing of"):
                d["big"] = b"x" * 4096
            with pytest.raises(PermissionError, match=f"{durable_dir}/dump.1 could not be made; nothing of"):
                for i in range(2000):  # (a checkpoint once the stream is full)
                    d[f"k{i}"] = "v" * 100
            written = dict(d)
        finally:
            subprocess.run(["chattr", "-" + flag[1], durable_dir], check=True)
        assert "big" not in written and written["before"] == 1
        d["big"] = b"x" * 4096
        d.close()
        d = SharedDict(path=durable_dir, create=False)
        assert {k: v for k, v in d.items() if k != "big"} == written and bytes(d["big"]) == b"x" * 4096
    finally:
        d.unlink()
        d.close()


def test_a_dict_on_a_read_only_mount_is_refused_at_open(tmp_path):
    """Every open maps the dict's files read-write and may write (a
    recovery, a clean close): on a filesystem mounted read-only it is
    refused at once, saying so, and nothing is made there."""
    with mounted(str(tmp_path / "ro"), "-t", "tmpfs", "-o", "size=4m", "tmpfs") as mnt:
        path = os.path.join(mnt, "dict")
        d = SharedDict({"a": 1}, path=path)
        d.close()
        subprocess.run(["mount", "-o", "remount,ro", mnt], check=True)
        try:
            for where in (path, os.path.join(mnt, "new")):
                with pytest.raises(OSError) as got:
                    SharedDict(path=where)
                assert got.value.errno == errno.EROFS and "read-only" in str(got.value).lower()
            assert sorted(os.listdir(mnt)) == ["dict"]
        finally:
            subprocess.run(["mount", "-o", "remount,rw", mnt], check=True)
        d = SharedDict(path=path, create=False)
        assert dict(d) == {"a": 1}
        d.unlink()
        d.close()


def test_a_closed_handle_of_a_removed_dict_leaves_the_files_of_the_new_one(tmp_path):
    """A dict removed and made again in its directory (a mount point stays,
    with its inode: the same names) while a handle of the first stays open
    here: that handle's close must not take the new dict's names from its
    files -- its large values and checkpoints then went to shared memory,
    lost to a reboot."""
    with mounted(str(tmp_path / "m"), "-t", "tmpfs", "-o", "size=8m", "tmpfs") as mnt:
        d = SharedDict(path=mnt, sync="always", blob_threshold=1 << 10)
        d.unlink()
        e = SharedDict(path=mnt, sync="always", blob_threshold=1 << 10)
        try:
            assert e.name == d.name
            d.close()
            e["big"] = b"x" * 4096
            assert os.path.exists(os.path.join(mnt, "blob.1"))
            e.close()
            assert not [n for n in os.listdir("/dev/shm") if n.startswith(d.name)]
            e = SharedDict(path=mnt, create=False)
            assert bytes(e["big"]) == b"x" * 4096
        finally:
            e.unlink()
            e.close()
            for n in os.listdir("/dev/shm"):  # (what the names taken from the files made there)
                if n.startswith(d.name):
                    os.unlink(os.path.join("/dev/shm", n))
