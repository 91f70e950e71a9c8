"""The command line on dicts kept in files: a PATH where a NAME goes
(``ultradict_ng/cli/paths.py``), each command in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from ultradict_ng import SharedDict
from ultradict_ng._disk import layout as D

pytestmark = pytest.mark.shm_only

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ultradict_ng", *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def cli_json(*args: str) -> object:
    out = cli(*args, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("damage", ["zeroed", "flipped", "another dict's", "an older checkpoint's"])
def test_ls_calls_a_dict_closed_cleanly_only_when_its_clean_record_says_so(durable_dir, tmp_path, damage):
    """``ls``/``stats`` read ``closed_cleanly`` from the ``clean`` record as an
    open trusts it -- whole, this dict's, at its newest checkpoint -- not from
    a file of that name (the open then recovers, as ``doctor`` says)."""
    from ultradict_ng._disk import layout as D

    d = SharedDict({"a": 1}, path=durable_dir)
    older = None
    if damage == "an older checkpoint's":
        d._store.force_dump()
        d.close()
        with open(os.path.join(durable_dir, D.CLEAN_FILE), "rb") as f:
            older = f.read()
        d = SharedDict(path=durable_dir)
        d["b"] = 2
        d._store.force_dump()
    d.close()
    assert cli_json("ls", durable_dir)[0]["closed_cleanly"]
    clean = os.path.join(durable_dir, D.CLEAN_FILE)
    with open(clean, "rb") as f:
        raw = bytearray(f.read())
    if damage == "zeroed":
        raw = bytearray(len(raw))
    elif damage == "flipped":
        raw[9] ^= 1
    elif damage == "another dict's":
        other = SharedDict({"a": 1}, path=str(tmp_path / "other"))
        other.close()
        with open(str(tmp_path / "other" / D.CLEAN_FILE), "rb") as f:
            raw = bytearray(f.read())
        SharedDict(path=str(tmp_path / "other")).unlink()
    else:
        raw = bytearray(older)
    with open(clean, "wb") as f:
        f.write(raw)
    (listed,) = cli_json("ls", durable_dir)
    assert not listed["closed_cleanly"]
    assert "not closed cleanly" in cli("doctor", durable_dir).stdout
    assert not cli_json("stats", durable_dir)["closed_cleanly"]  # (it opens the dict: a recovery)


def test_a_stray_newer_checkpoint_name_does_not_unmake_a_clean_close(durable_dir):
    """The open takes the checkpoint ``clean`` names, whatever newer name lies
    beside it (an unpublished ``dump.N`` a killed writer left): ``ls`` agrees."""
    from ultradict_ng._disk import layout as D

    d = SharedDict({"a": 1}, path=durable_dir)
    d._store.force_dump()
    d.close()
    gen = cli_json("ls", durable_dir)[0]
    assert gen["closed_cleanly"]
    with open(os.path.join(durable_dir, D.DUMP_PREFIX + "z"), "wb") as f:
        f.write(b"\0" * 64)  # (unpublished: zeros)
    assert cli_json("ls", durable_dir)[0]["closed_cleanly"]
    assert "closed cleanly: opens without recovery" in cli("doctor", durable_dir).stdout


@pytest.mark.parametrize("file", ["dict.meta", "dump", "blob", "cache", "clean"])
def test_the_reading_commands_refuse_a_fifo_in_place_of_a_file_without_hanging(durable_dir, file):
    """``ls``, ``stats`` and ``doctor`` read a dict's files as an open does: a
    FIFO there (its open for reading waits for a writer) is named, not waited
    for, and no command prints a traceback."""
    from ultradict_ng._disk import layout as D

    d = SharedDict(path=durable_dir, blob_threshold=1000)
    d["v"] = b"x" * 2000
    d._store.force_dump()
    d.close()
    prefix = {"dump": D.DUMP_PREFIX, "blob": D.BLOB_PREFIX}.get(file, file)
    target = next((f for f in sorted(os.listdir(durable_dir)) if f.startswith(prefix)), file)
    where = os.path.join(durable_dir, target)
    if os.path.exists(where):
        os.rename(where, where + ".saved")
    os.mkfifo(where)
    try:
        for command in ("ls", "doctor", "stats"):
            out = cli(command, durable_dir)  # (a TimeoutExpired while one waits)
            assert "Traceback" not in out.stderr, out.stderr
            assert f"{target} is a FIFO" in out.stdout + out.stderr or command != "doctor", (command, out)
    finally:
        os.unlink(where)
        if os.path.exists(where + ".saved"):
            os.rename(where + ".saved", where)
    SharedDict(path=durable_dir).unlink()


def test_every_command_takes_a_path(durable_dir, tmp_path):
    d = SharedDict(path=durable_dir, sync="always", buffer_size=4096)
    d.update({f"k{i}": i for i in range(100)})
    d["text"] = "hello"
    d.close()

    (listed,) = cli_json("ls", durable_dir)
    assert listed["sync"] == "always" and not listed["open"] and listed["closed_cleanly"]
    shown = cli_json("show", durable_dir, "text", "k7")
    assert shown == {"text": "hello", "k7": 7}
    between = cli("show", durable_dir, "--json", "text", "k7")  # (an option among the values)
    assert between.returncode == 0 and json.loads(between.stdout) == shown, between.stderr
    before = cli("--json", "show", durable_dir)  # (no command's option)
    assert before.returncode == 2 and "unrecognized arguments: --json" in before.stderr
    stats = cli_json("stats", durable_dir)
    assert stats["keys"] == 101 and stats["path"] == durable_dir and stats["sync"] == "always"
    assert stats["sync_interval"] is None  # (a policy without one)
    assert stats["engine"] == "files" and "name" not in stats  # (the directory is its name)
    assert not stats["open"] and stats["users"] == [] and stats["closed_cleanly"]  # (not its own open)
    doctor = cli("doctor", durable_dir)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "closed cleanly" in doctor.stdout

    backup = str(tmp_path / "backup.jsonl")
    assert cli("dump", durable_dir, backup, "-q").returncode == 0
    other = str(tmp_path / "restored")
    out = cli("load", other, backup, "-q")
    assert out.returncode == 0, out.stderr
    assert cli_json("show", other) == cli_json("show", durable_dir)
    synced = str(tmp_path / "synced")
    assert cli("load", synced, backup, "-q", "--sync", "always").returncode == 0
    assert cli_json("ls", synced)[0]["sync"] == "always"  # type: ignore[index]
    out = cli("load", synced, backup, "-q", "--sync", "never")  # (an existing dict's must agree)
    assert out.returncode == 1 and "created with sync='always', not 'never'" in out.stderr, out.stderr
    out = cli("load", "a-name", backup, "--sync", "always")
    assert out.returncode == 1 and "--sync is for a dict kept in files" in out.stderr, out.stderr
    assert cli("rm", synced).returncode == 0

    generation = stats["generation"]
    compacted = cli_json("compact", durable_dir)
    assert compacted["generation"] == generation + 1
    assert cli_json("show", durable_dir, "k99") == {"k99": 99}

    removed = cli_json("rm", other)
    assert removed[0]["removed"] > 0 and not os.path.exists(other)
    assert cli("rm", other).returncode == 1  # gone: an error, naming it
    assert cli("rm", durable_dir).returncode == 0
    assert not os.path.exists(durable_dir)


def test_doctor_reads_what_recovery_would_keep_and_changes_nothing(durable_dir):
    d = SharedDict(path=durable_dir, buffer_size=1 << 16)
    for i in range(5):
        d[f"k{i}"] = i
    end = d.stats()["stream_end"]
    d.close()
    os.remove(os.path.join(durable_dir, D.CLEAN_FILE))  # (as a crash leaves it)
    with open(os.path.join(durable_dir, D.STREAM_FILE), "r+b") as f:
        f.seek(end - 2)
        flipped = bytes(b ^ 0xFF for b in f.read(2))  # (the last record's tail: damaged whatever it held)
        f.seek(end - 2)
        f.write(flipped)
    before = {f: open(os.path.join(durable_dir, f), "rb").read() for f in os.listdir(durable_dir)}
    checks = {c["check"].split(": ")[-1]: c for c in cli_json("doctor", durable_dir)}
    assert checks["stream"]["level"] == "warn" and "4 whole writes" in checks["stream"]["message"]
    assert "recovers" in checks["state"]["message"]
    after = {f: open(os.path.join(durable_dir, f), "rb").read() for f in os.listdir(durable_dir)}
    assert after == before
    assert cli_json("show", durable_dir) == {f"k{i}": i for i in range(4)}  # (show recovers it)
    d = SharedDict(path=durable_dir, create=False)
    d.unlink()
    d.close()


def test_a_path_that_holds_no_dict_is_an_error(tmp_path):
    missing = str(tmp_path / "nothing")
    for args in (["show", missing], ["stats", missing], ["ls", missing], ["compact", missing]):
        out = cli(*args)
        assert out.returncode == 1 and "no dict" in out.stderr, (args, out.stderr)
    assert not os.path.exists(missing)


def _left_by_a_killed_process(path: str) -> str:
    """A process opens the dict kept in ``path``, writes and is killed: the name of the segment it leaves."""
    from ultradict_ng._disk.opening import control_of

    code = f"from ultradict_ng import SharedDict\nd = SharedDict(path={path!r})\nd['a'] = 1\n"
    code += "print('ok', flush=True)\nimport time\ntime.sleep(60)\n"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ok"
    finally:
        p.kill()
        p.wait()
    name = control_of(path)
    assert os.path.exists(os.path.join("/dev/shm", name))
    return name


@pytest.mark.parametrize("directory", ["kept", "removed"])
def test_ls_and_clean_know_a_dict_in_files_shared_memory(tmp_path, directory):
    """The control segment a killed process left in /dev/shm for a dict kept
    in files is listed as such, and ``clean`` removes it once unused -- also
    when its directory was removed since (else it would stay until a reboot).
    Nothing is lost: the next open rebuilds it from the files."""
    import shutil

    path = str(tmp_path / "dict")
    name = _left_by_a_killed_process(path)
    held = os.open(path, os.O_RDONLY)  # (its inode not reused meanwhile: a new directory's dict of our name)
    try:
        if directory == "removed":
            shutil.rmtree(path)
        (entry,) = [d for d in cli_json("ls")["dicts"] if d["name"] == name]  # type: ignore[index]
        assert entry["status"] == "files" and not any(u["alive"] for u in entry["users"])
        which = path if directory == "kept" else name  # (a PATH stands for its shared memory)
        (done,) = [d for d in cli_json("clean", which) if d["name"] == name]  # type: ignore[union-attr]
        assert done["action"] == "removed", done
        assert not os.path.exists(os.path.join("/dev/shm", name))
    finally:
        os.close(held)
    if directory == "kept":
        d = SharedDict(path=path)
        assert dict(d) == {"a": 1}
        d.unlink()
        d.close()


def test_ls_tells_a_dict_kept_in_files_in_dev_shm_from_other_programs_files():
    """A dict kept in a directory of /dev/shm (tmpfs) is listed as a dict, not
    counted among other programs' files -- a directory without one still is."""
    from .conftest import unique_name

    path, other = f"/dev/shm/{unique_name()}", f"/dev/shm/{unique_name()}"
    SharedDict({"a": 1}, path=path).close()  # (logs that tmpfs does not outlive a reboot)
    os.mkdir(other)
    try:
        listed = cli_json("ls", "--all")
        assert path in listed["kept_in_files"]  # type: ignore[index]
        names = listed["foreign"]["names"]  # type: ignore[index]
        assert os.path.basename(other) in names and os.path.basename(path) not in names
        out = cli("ls")
        assert f"{path}: a dict kept in files" in out.stdout, out.stdout
    finally:
        os.rmdir(other)
        assert cli("rm", path).returncode == 0


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="runs doctor as another user")
def test_doctor_fails_a_file_its_user_cannot_write(tmp_path):
    """Every open maps the stream and the checkpoint read-write: one its
    user may only read (mode 0400) makes every open fail, so ``doctor`` run
    by that user fails it instead of reporting the dict whole; a directory
    it cannot read is a fail of that path, the others still checked."""
    import shutil
    import tempfile

    from ultradict_ng.cli.paths import file_checks

    nobody = 65534

    def checks_as_nobody(path: str) -> list[Any]:
        """``doctor``'s checks in a forked child that became ``nobody``."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # (no pytest code runs here)
            try:
                os.setgroups([])
                os.setgid(nobody)
                os.setuid(nobody)
                os.write(w, json.dumps(file_checks(path)).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            got = f.read()
        os.waitpid(pid, 0)
        return [tuple(c) for c in json.loads(got)]

    base = tempfile.mkdtemp(prefix="udng-doctor-")  # (reachable by another user: tmp_path is not)
    try:
        os.chmod(base, 0o755)
        path = os.path.join(base, "dict")
        SharedDict({"a": 1}, path=path).close()
        for f in [path, *(os.path.join(path, f) for f in os.listdir(path))]:
            os.chown(f, nobody, nobody)
        assert all(c[1] != "fail" for c in checks_as_nobody(path))
        os.chmod(os.path.join(path, "stream"), 0o400)
        failed = [c for c in checks_as_nobody(path) if c[1] == "fail"]
        said = "not readable and writable by this user: stream (every open fails)"
        assert failed == [("files", "fail", said)]
        os.chown(path, 0, 0)
        os.chmod(path, 0o700)  # (a directory this user cannot read: a fail of its own, not an error)
        (failed,) = checks_as_nobody(path)
        assert failed[1] == "fail" and "Permission denied" in failed[2]
    finally:
        shutil.rmtree(base)


def test_doctor_checks_the_description_as_an_open_does_and_sees_a_live_user(durable_dir):
    """``doctor`` fails a ``dict.meta`` every open refuses (a stream limit past
    the stream, a sync policy of no name, no version: damage, not another
    version's files), and a dict a live process has open (a reader: its
    ``clean`` stays until the first write) is "open", not "closed cleanly"."""
    from ultradict_ng.cli.paths import file_checks

    SharedDict({"a": 1}, path=durable_dir).close()
    d = SharedDict(path=durable_dir)  # (reads only: ``clean`` stays)
    states = [c for c in file_checks(durable_dir) if c[0] == "state"]
    assert states == [("state", "ok", f"open (used by pid {os.getpid()})")]
    d.close()
    meta_path = os.path.join(durable_dir, D.META_FILE)
    good = open(meta_path).read()
    for field, value in (("stream_limit", 2**40), ("sync", "bogus"), ("version", None)):
        meta = json.loads(good)
        meta[field] = value
        if value is None:
            del meta[field]
        with open(meta_path, "w") as f:
            json.dump(meta, f)
        checks = file_checks(durable_dir)
        assert checks[0][:2] == ("dict.meta", "fail") and "every open refuses it" in checks[0][2], checks
    with open(meta_path, "w") as f:
        f.write(good)
    SharedDict(path=durable_dir).unlink()


def test_compact_of_a_damaged_big_checkpoint_fails_in_one_line(durable_dir):
    """Rewriting a table checkpoint with a damaged entry: one line naming the
    checkpoint and exit 1, as ``show`` and ``dump`` give -- no traceback,
    and no new checkpoint."""
    SharedDict({f"key{i}": i for i in range(20_000)}, path=durable_dir).close()
    dump = os.path.join(durable_dir, "dump.1")
    with open(dump, "r+b") as f:
        at = os.path.getsize(dump) // 2
        f.seek(at)
        was = f.read(8)
        f.seek(at)
        f.write(bytes(x ^ 0x5A for x in was))
    before = sorted(os.listdir(durable_dir))
    out = cli("compact", durable_dir)
    assert out.returncode == 1 and "Traceback" not in out.stderr and dump in out.stderr, out.stderr
    assert sorted(os.listdir(durable_dir)) == before
    assert cli("rm", durable_dir).returncode == 0


def test_doctor_fails_an_empty_stream_saying_so(durable_dir):
    """A stream cut to nothing: FAIL saying so (``mmap`` refuses an empty file)."""
    from ultradict_ng.cli.paths import file_checks

    d = SharedDict({"a": 1}, path=durable_dir)
    d["b"] = 2
    d.close()
    stream = os.path.join(durable_dir, "stream")
    os.truncate(stream, 0)
    assert [c for c in file_checks(durable_dir) if c[1] != "ok"] == [
        ("stream", "fail", f"{stream} is empty (cut to nothing): the writes it held are lost")
    ]
    assert cli("rm", durable_dir).returncode == 0


def test_doctor_checks_the_value_files(durable_dir):
    """A value kept as ``blob.<id>`` cut short or of another dict: FAIL naming
    the file, as reading the value would fail; whole ones pass."""
    from ultradict_ng.cli.paths import file_checks

    d = SharedDict(path=durable_dir, blob_threshold=1024)
    d["big"] = b"x" * 100_000
    d["other"] = b"y" * 5_000
    assert len([f for f in os.listdir(durable_dir) if f.startswith("blob.")]) == 2
    d.close()
    assert [c for c in file_checks(durable_dir) if c[1] != "ok"] == []
    blob = os.path.join(durable_dir, "blob.1")
    os.truncate(blob, 50_000)
    _flip(os.path.join(durable_dir, "blob.2"), 9)  # (its token)
    failed = [c for c in file_checks(durable_dir) if c[1] != "ok"]
    assert failed == [
        (
            "blobs",
            "fail",
            "blob.1 is cut short (50000 bytes of 100064); blob.2 is an earlier dict's, not this one's: "
            "reading those values fails",
        )
    ], failed
    with pytest.raises(Exception, match="blob"):
        SharedDict(path=durable_dir)["big"]
    assert cli("rm", durable_dir).returncode == 0


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 1]))


def test_doctor_checks_the_checkpoint_and_rm_removes_a_dict_no_one_can_open(tmp_path):
    """A checkpoint with a flipped bit, or one removed: ``doctor`` fails it
    (every open refuses that dict) and changes nothing; ``rm`` removes such a
    dict, and one of another version, by its files -- a directory whose
    ``dict.meta`` is not a dict's it refuses."""
    made = {}
    for how in ("damaged", "missing", "other version", "not a dict's"):
        path = str(tmp_path / how.replace(" ", "-").replace("'", ""))
        d = SharedDict(path=path)
        d.update({f"k{i}": "v" * 50 for i in range(500)})
        d._store.force_dump()
        if how == "missing":
            d["after"] = 1  # (a record of the checkpoint's generation)
        d.close()
        dump = os.path.join(path, "dump.1")
        if how == "damaged":
            _flip(dump, 20000)
        elif how == "missing":
            os.remove(dump)
        meta = json.load(open(os.path.join(path, D.META_FILE)))
        if how == "other version":
            meta["version"] += 1
        elif how == "not a dict's":
            meta["format"] = "something else"
        json.dump(meta, open(os.path.join(path, D.META_FILE), "w"))
        made[how] = path
    for how in ("damaged", "missing"):
        path = made[how]
        before = {f: open(os.path.join(path, f), "rb").read() for f in os.listdir(path)}
        out = cli("doctor", path)
        assert out.returncode == 1 and "FAIL" in out.stdout, out.stdout
        assert ("fails its checksum" if how == "damaged" else "dump.1 is missing") in out.stdout
        assert {f: open(os.path.join(path, f), "rb").read() for f in os.listdir(path)} == before
        assert cli("show", path).returncode == 1
    for how in ("damaged", "missing", "other version"):
        out = cli("rm", made[how])
        assert out.returncode == 0 and "file(s) and segment(s)" in out.stdout, out.stderr
        assert not os.path.exists(made[how])
    refused = cli("rm", made["not a dict's"])
    assert refused.returncode == 1 and os.path.exists(os.path.join(made["not a dict's"], "dump.1"))


def test_ls_leaves_out_a_file_renamed_or_removed_as_it_lists(durable_dir, monkeypatch):
    from ultradict_ng.cli import paths

    d = SharedDict(path=durable_dir)
    d["k"] = 1
    d.close()
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p: listdir(p) + ["blob.zz.tmp"])  # (gone before its stat)
    assert "blob.zz.tmp" not in paths._files(durable_dir) and paths.summary(durable_dir)["disk_bytes"] > 0
    monkeypatch.undo()
    d = SharedDict(path=durable_dir, create=False)
    d.unlink()
    d.close()


def test_a_dict_whose_users_all_died_is_not_shown_open(tmp_path):
    """Its control segment is there, but no live process uses it: ``ls PATH``
    does not call it open and ``doctor PATH`` says who left it; with a live
    user, both name the process."""
    path = str(tmp_path / "dict")
    _left_by_a_killed_process(path)
    (listed,) = cli_json("ls", path)  # type: ignore[misc]
    assert not listed["open"] and listed["users"] == [] and listed["control_segment"]
    checks = {c["check"].split(": ")[-1]: c for c in cli_json("doctor", path)}  # type: ignore[union-attr]
    assert "left by processes that died" in checks["state"]["message"]
    d = SharedDict(path=path, create=False)
    (listed,) = cli_json("ls", path)  # type: ignore[misc]
    assert listed["open"] and listed["users"] == [os.getpid()]
    d.unlink()
    d.close()


def test_doctor_finds_a_damaged_index_and_compact_rebuilds_it(durable_dir):
    """A checkpoint's hash index is not checksummed (an open never pays a
    pass over the table): a zeroed page of it makes present keys read as
    absent.  ``doctor`` rebuilds it from the entries and compares; ``compact``
    writes the checkpoint anew, its index from the entries."""
    d = SharedDict(path=durable_dir)
    d.update({f"key{i}": i for i in range(5000)})  # (past PARTIAL_FROM: read in place)
    d._store.force_dump()
    d.close()
    dump = os.path.join(durable_dir, "dump.2")
    with open(dump, "r+b") as f:
        f.seek(4096)
        f.write(bytes(4096))  # (inside the index: 64 + 8 * slots bytes)
    out = cli("doctor", durable_dir)
    assert out.returncode == 1 and "its hash index does not match its entries" in out.stdout, out.stdout
    d = SharedDict(path=durable_dir)
    assert sum(1 for k in d.keys() if k not in d) > 0  # (what the damage does)
    d.close()
    assert cli("compact", durable_dir).returncode == 0
    assert cli("doctor", durable_dir).returncode == 0
    d = SharedDict(path=durable_dir)
    assert all(d[f"key{i}"] == i for i in range(5000))
    d.unlink()
    d.close()


def test_doctor_fails_a_dict_of_another_version(durable_dir):
    d = SharedDict(path=durable_dir)
    d.close()
    meta_path = os.path.join(durable_dir, D.META_FILE)
    meta = json.load(open(meta_path))
    meta["version"] = 99
    json.dump(meta, open(meta_path, "w"))
    out = cli("doctor", durable_dir)
    assert out.returncode == 1 and "its files are of version 99" in out.stdout, out.stdout
    assert "closed cleanly" not in out.stdout
    assert cli("rm", durable_dir).returncode == 0


def test_rm_of_a_path_names_the_processes_still_using_it(durable_dir):
    d = SharedDict(path=durable_dir)
    d["k"] = 1
    out = cli("rm", durable_dir)
    assert out.returncode == 0 and f"still used by pid {os.getpid()}" in out.stdout, out.stdout
    d.close()


def test_a_failed_load_into_a_directory_the_user_made_leaves_it(tmp_path):
    """A load that fails changes nothing: an empty directory given as the
    dict's stays, with its mode (only a dict made for the load is removed)."""
    target = tmp_path / "target"
    target.mkdir()
    os.chmod(target, 0o750)
    dump = tmp_path / "d.jsonl"
    dump.write_text('["a", 1]\n["b", \n')
    out = cli("load", str(target), str(dump))
    assert out.returncode == 1 and "nothing was changed" in out.stderr, out.stderr
    assert target.is_dir() and os.listdir(target) == [] and (os.stat(target).st_mode & 0o777) == 0o750


def test_path_odds_and_ends_in_the_commands(tmp_path):
    """A plain file given as PATH is named as not a directory; doctor of a dict
    in use says nothing of the file a writer is writing aside (``.tmp``), and
    a load into a dict that cannot be opened says "nothing was changed" once."""
    plain = tmp_path / "plain"
    plain.write_text("x")
    out = cli("ls", str(plain))
    assert out.returncode == 1 and "is not a directory" in out.stderr, out.stderr
    assert "Errno" not in out.stderr
    path = str(tmp_path / "d")
    d = SharedDict(path=path)
    d["k"] = 1
    d._store.force_dump()
    d["j"] = 2  # (a record of the checkpoint's generation)
    open(os.path.join(path, "blob.x3.tmp"), "wb").close()  # (as a writer's value being written)
    assert "unfinished file" not in cli("doctor", path).stdout
    d.close()
    assert "unfinished file" in cli("doctor", path).stdout
    os.remove(os.path.join(path, "dump.1"))  # ("... is missing ...; nothing was changed")
    dump = tmp_path / "d.jsonl"
    dump.write_text('["a", 1]\n')
    out = cli("load", path, str(dump))
    assert out.returncode == 1 and out.stderr.count("nothing was changed") == 1, out.stderr


def test_files_named_as_a_dicts_without_its_bytes_are_another_programs(tmp_path):
    """Without a ``dict.meta``, ``stream``, ``clean`` and ``cache`` are a
    dict's only if their first bytes say so: another program's are refused
    at the open (``NotADict``, naming them, not "a dict that lost its
    description"), and ``rm`` removes nothing and fails -- as it does on a
    directory of other files only.  A cache whose ``dict.meta`` was lost is
    still recognised, and removed whole."""
    from ultradict_ng.cache import SharedCache
    from ultradict_ng.errors import NotADict

    app = tmp_path / "app"
    app.mkdir()
    theirs = {"stream": b"an event stream of my app\n" * 4, "clean": b"yes\n", "cache": b"\1" * 64}
    for f, data in theirs.items():
        (app / f).write_bytes(data)
    with pytest.raises(NotADict, match="not a dict's \\(cache, clean, stream\\)"):
        SharedDict(path=str(app))
    out = cli("rm", str(app))
    assert out.returncode == 1 and "nothing removed" in out.stderr, out.stdout + out.stderr
    assert {f: (app / f).read_bytes() for f in os.listdir(app)} == theirs
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("mine")
    out = cli("rm", str(notes))
    assert out.returncode == 1 and os.listdir(notes) == ["notes.txt"], out.stdout

    for leftover in (b"", bytes(32)):  # (a creation killed before it sized its stream: its leftovers)
        left = tmp_path / f"left{len(leftover)}"
        left.mkdir()
        (left / "stream").write_bytes(leftover)
        d = SharedDict(path=str(left))
        d["k"] = 1
        d.unlink()
        d.close()

    lost = str(tmp_path / "cache")
    c = SharedCache(path=lost, maxsize=10)
    c.set("k", "v")
    c.close()
    os.remove(os.path.join(lost, D.META_FILE))
    out = cli("rm", lost)
    assert out.returncode == 0 and not os.path.exists(lost), out.stdout + out.stderr


def test_ls_of_several_paths_lists_each_and_fails_on_the_one_that_is_no_dict(tmp_path):
    made = [str(tmp_path / "a"), str(tmp_path / "c")]
    for path in made:
        SharedDict(path=path).close()
    missing = str(tmp_path / "b")
    out = cli("ls", made[0], missing, made[1])
    assert out.returncode == 1 and f"no dict is kept in {missing!r}" in out.stderr, out.stderr
    assert [line.split()[0] for line in out.stdout.splitlines()] == made
    out = cli("ls", made[0], missing, made[1], "--json")
    listed = json.loads(out.stdout)
    assert out.returncode == 1 and [e["path"] for e in listed] == [made[0], missing, made[1]]
    assert "error" in listed[1] and "error" not in listed[0] and listed[2]["closed_cleanly"]
    for path in made:
        assert cli("rm", path).returncode == 0


def test_a_name_that_is_a_directory_here_is_answered_with_its_path(tmp_path):
    SharedDict(path=str(tmp_path / "counters")).close()
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-m", "ultradict_ng", "show", "counters"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 1 and "give ./counters for the dict kept in it" in out.stderr, out.stderr
    assert cli("rm", str(tmp_path / "counters")).returncode == 0


def _killed_in_its_recovery(path: str) -> str:
    """The shared memory an opener killed in its recovery leaves (no MAGIC,
    its creator dead: "abandoned"); its name."""
    from ultradict_ng._disk.opening import control_of

    env = {**os.environ, "ULTRADICT_NG_FAULT": "recovery-loaded:kill:1"}
    code = f"from ultradict_ng import SharedDict\nSharedDict(path={path!r})\n"
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, timeout=60)
    assert p.returncode == -9, p.stderr
    return control_of(path)


def test_clean_removes_what_a_killed_recovery_left_and_not_a_dict_made_since(durable_dir):
    """``clean NAME`` removes the shared memory an opener killed in its
    recovery left (its name has a '+', which names refused); and a dict made
    under that name after the survey that found it abandoned is kept."""
    from ultradict_ng._shm.survey import report
    from ultradict_ng.cli.cleaning import _clean_dict

    d = SharedDict({"k": 1}, path=durable_dir)
    d.close()
    name = _killed_in_its_recovery(durable_dir)
    (done,) = cli_json("clean", name)  # type: ignore[misc]
    assert (done["status"], done["action"]) == ("abandoned", "removed"), done
    assert not os.path.exists(os.path.join("/dev/shm", name))

    _killed_in_its_recovery(durable_dir)
    surveyed = report(name, load_keys=False)
    assert surveyed is not None and surveyed.status == "abandoned"
    d = SharedDict(path=durable_dir)  # (recovered since: a live dict under the name)
    assert _clean_dict(surveyed, None, False)["action"] == "kept"
    d["k"] = 2  # (not removed: no Unlinked)
    d.unlink()
    d.close()


def _left_by_a_killed_writer(path: str) -> str:
    """The shared memory a writer SIGKILLed after writing ``b`` leaves (every
    user dead, its segment whole); its name."""
    from ultradict_ng._disk.opening import control_of

    code = (
        f"import os, signal\nfrom ultradict_ng import SharedDict\nd = SharedDict(path={path!r})\n"
        "d['b'] = 2\nos.kill(os.getpid(), signal.SIGKILL)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, timeout=60)
    assert p.returncode == -9, p.stderr
    name = control_of(path)
    assert os.path.exists(os.path.join("/dev/shm", name))
    return name


def test_an_open_attaching_as_clean_removes_the_shared_memory_opens_the_dict(durable_dir, monkeypatch):
    """``clean`` removes the shared memory of a dict whose users all died
    without the directory lock (it knows no directory): an opener that chose
    to attach to it looks again, and rebuilds the dict from its files."""
    from ultradict_ng._disk import attaching

    SharedDict({"a": 1}, path=durable_dir, sync="always").close()
    name = _left_by_a_killed_writer(durable_dir)
    cleaned: list[object] = []
    plain = attaching._plain

    def clean_first(options: Any) -> Any:  # (between step 3's checks and the attach)
        if not cleaned:
            cleaned.append(cli_json("clean", name))
        return plain(options)

    monkeypatch.setattr(attaching, "_plain", clean_first)
    d = SharedDict(path=durable_dir)
    assert cleaned == [[{**cleaned[0][0], "action": "removed"}]]  # type: ignore[index]
    assert dict(d) == {"a": 1, "b": 2}
    d.unlink()
    d.close()


def test_a_removal_spares_the_control_segment_an_opener_rebuilt_under_its_name(durable_dir):
    """A dict kept in files keeps its token when its control segment is
    rebuilt: a ``clean`` that flagged the old one removed, then finds the
    opener's new one under the name, leaves it (and the open dict) alone."""
    from ultradict_ng._shm.cleanup import mark_unlinked, unlink_tree
    from ultradict_ng._shm.control import Header, attach_control
    from ultradict_ng._shm.mapping import Mapping

    SharedDict({"a": 1}, path=durable_dir, sync="always").close()
    name = _left_by_a_killed_writer(durable_dir)
    old = Mapping(attach_control(name), None)
    try:
        token = Header.read(name, old.words).token
        mark_unlinked(old.atomic)  # (clean's first step)
        d = SharedDict(path=durable_dir)  # (the flag seen: removed and rebuilt under the same name)
        assert unlink_tree(name, old, token) == 0  # (clean's next steps)
    finally:
        old.release()
    assert os.path.exists(os.path.join("/dev/shm", name))
    d["c"] = 3
    e = SharedDict(path=durable_dir)
    assert dict(e) == {"a": 1, "b": 2, "c": 3}
    e.close()
    d.unlink()
    d.close()


def test_a_file_gone_while_the_dict_is_open_is_named_and_the_open_ends(durable_dir):
    """The stream removed while a handle has the dict open: another open
    finds the shared memory there, unflagged, naming a missing file --
    ``CorruptSegment`` naming it, not a wait for a removal that is not one."""
    from ultradict_ng.errors import CorruptSegment

    d = SharedDict({"a": 1}, path=durable_dir)
    stream = os.path.join(durable_dir, D.STREAM_FILE)
    os.rename(stream, stream + ".moved")
    code = (
        "from ultradict_ng import SharedDict\nfrom ultradict_ng.errors import CorruptSegment\n"
        f"try:\n    SharedDict(path={durable_dir!r})\nexcept CorruptSegment as exc:\n    print(exc)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert f"{stream}: missing" in p.stdout, (p.stdout, p.stderr)
    os.rename(stream + ".moved", stream)
    d.unlink()
    d.close()
    assert issubclass(CorruptSegment, Exception)


@pytest.mark.slow
def test_a_rebuild_waits_for_a_clean_holding_the_old_segment(durable_dir, monkeypatch):
    """An opener that finds the shared memory flagged by a ``clean`` still at
    work rebuilds it only once the clean is done with the name: else the
    clean's removal by name took the rebuilt segment, and the open dict was
    left nameless (the next opener refused, ``InUseElsewhere``)."""
    import select

    from ultradict_ng._platform import directories
    from ultradict_ng._shm import cleanup

    SharedDict({"a": 1}, path=durable_dir, sync="always").close()
    name = _left_by_a_killed_writer(durable_dir)
    code = (
        f"import sys\nfrom ultradict_ng import SharedDict\nd = SharedDict(path={durable_dir!r})\n"
        "print('ready', flush=True)\nsys.stdin.readline()\nd['c'] = 3\nd.close()\n"
    )
    opener: list[subprocess.Popen[str]] = []
    owner = cleanup.control_owner

    def then_an_opener(*args: Any, **kwargs: Any) -> str:
        said = owner(*args, **kwargs)  # (the clean has flagged it, holding its lock)
        p = subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        opener.append(p)
        select.select([p.stdout], [], [], 3)  # (a rebuild now would be removed by the clean's next step)
        return said

    monkeypatch.setattr(cleanup, "control_owner", then_an_opener)
    assert directories.file_of(name + "@s") is None  # (closed here: names, not files, as in clean's process)
    cleanup.unlink_by_name(name, control=True)  # (what `ultradict-ng clean` does with it)
    monkeypatch.undo()
    (p,) = opener
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        assert os.path.exists(os.path.join("/dev/shm", name))  # (the rebuilt segment)
    finally:
        p.communicate("\n", timeout=60)
    d = SharedDict(path=durable_dir)
    assert dict(d) == {"a": 1, "b": 2, "c": 3}
    d.unlink()
    d.close()


def _checkpointing(path: str, stop: Any) -> None:
    d = SharedDict(path=path, create=False)
    i = 0
    while not stop.is_set():
        d[f"k{i % 500}"] = os.urandom(20_000)  # (a checkpoint every dozen writes)
        i += 1
    d.close()


def test_doctor_fails_nothing_of_a_healthy_dict_whose_writer_makes_checkpoints(durable_dir):
    """doctor lists the checkpoint, then reads the stream, which a writer's
    next checkpoint restarts meanwhile: its records then looked like those
    of a lost checkpoint (FAIL in 4 of 10 runs).  It checks again, and says
    a race it keeps losing as a warning."""
    import multiprocessing

    from ultradict_ng.cli.paths import file_checks

    SharedDict(path=durable_dir, sync="always", buffer_size=1 << 18).close()
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    p = ctx.Process(target=_checkpointing, args=(durable_dir, stop))
    p.start()
    try:
        time.sleep(0.5)
        failed = [c for _ in range(15) for c in file_checks(durable_dir) if c[1] == "fail"]
    finally:
        stop.set()
        p.join(60)
    assert not failed, failed
    assert all(kind == "ok" for _, kind, _ in file_checks(durable_dir))  # (idle)
    d = SharedDict(path=durable_dir)
    d.unlink()
    d.close()


def test_reading_commands_leave_a_closed_dicts_files_untouched(durable_dir):
    """``show`` and ``stats`` open a dict closed cleanly, read and close it:
    no file of it changes -- ``clean`` not rewritten when it already says
    the same (a backup that goes by files' times copied it again).  The
    log's bytes stay; its times may not (its blocks reserved again as the
    shared memory is rebuilt: a sparse copy must not SIGBUS on a full disk)."""
    d = SharedDict({"a": 1, "b": [1, 2]}, path=durable_dir)
    d.close()

    def files() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in sorted(os.listdir(durable_dir)):
            st = os.stat(os.path.join(durable_dir, f))
            with open(os.path.join(durable_dir, f), "rb") as opened:
                data = opened.read()
            out[f] = (data,) if f == D.STREAM_FILE else (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, data)
        return out

    before = files()
    time.sleep(0.01)  # (a change now would show in the times)
    for command in (("show", durable_dir), ("stats", durable_dir)):
        out = cli(*command)
        assert out.returncode == 0, out.stderr
    assert files() == before


def test_doctor_fails_a_serializer_id_no_open_takes(durable_dir):
    """A ``dict.meta`` whose serializer id names none (1 msgpack, 2 pickle,
    3 custom): every open refuses it, naming the file, and so does doctor."""
    from ultradict_ng.errors import CorruptSegment

    SharedDict({"a": 1}, path=durable_dir).close()
    meta_path = os.path.join(durable_dir, D.META_FILE)
    with open(meta_path) as f:
        meta = json.load(f)
    for bad in (0, 99):
        meta["serializer"] = bad
        with open(meta_path, "w") as f:
            json.dump(meta, f)
        with pytest.raises(CorruptSegment, match=f"{meta_path}.*serializer"):
            SharedDict(path=durable_dir)
        out = cli("doctor", durable_dir)
        assert out.returncode == 1 and "serializer" in out.stdout + out.stderr
    meta["serializer"] = 1
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    d = SharedDict(path=durable_dir)
    d.unlink()
    d.close()


def test_dump_of_a_dict_at_a_path_of_other_bytes_than_utf8(tmp_path):
    """A path in bytes that are not UTF-8 (a Latin-1 name): ``dump`` writes
    its file as for any other path (the header names it escaped)."""
    where = os.fsdecode(os.path.join(os.fsencode(str(tmp_path)), b"caf\xe9"))
    SharedDict({"a": 1}, path=where).close()
    out = subprocess.run(
        [sys.executable, "-m", "ultradict_ng", "dump", where, str(tmp_path / "backup")],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    d = SharedDict(path=where)
    d.unlink()
    d.close()
