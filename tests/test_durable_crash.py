"""A dict kept in files whose writer, or whose recovery, is killed -- then the
machine "reboots" (its shared memory removed) -- reopens with every
acknowledged write (``_disk/layout.py``, "Opening and recovery")."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from tests.conftest import soak_scaled
from ultradict_ng import SharedDict
from ultradict_ng._disk import layout as D
from ultradict_ng._disk.opening import control_of
from ultradict_ng._shm import layout as L
from ultradict_ng._shm import writer as writer_module
from ultradict_ng.errors import CorruptSegment, NotFound

pytestmark = pytest.mark.shm_only

SHM = "/dev/shm"
STREAM = 256  # small: dumps (checkpoints) every few writes


def reboot(path: str) -> None:
    try:
        os.unlink(os.path.join(SHM, control_of(path)))
    except FileNotFoundError:
        pass


def worker(args: list[str], fault: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("ULTRADICT_NG_FAULT", None)
    if fault:
        env["ULTRADICT_NG_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-m", "tests.durable_workers", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def acked(out: str) -> list[int]:
    return [int(line.split()[2]) for line in out.splitlines() if line.startswith("ack ")]


def expected(n: int) -> dict[str, object]:
    """The dict after the first ``n`` writes of the worker (from k0 = -1)."""
    model: dict[str, object] = {"k0": -1}
    for i in range(n):
        if i % 4 == 3:
            model["big"] = bytes([i % 256]) * 300
        model[f"k{i % 5}"] = i
    return model


def check(path: str, done: int, atomic: bool, rebooted: bool = True) -> None:
    """Reopened after a reboot: the first ``done`` writes, or ``done + 1`` (the one in flight;
    outside a transaction, its "big" write may have landed and its key's not yet)."""
    if rebooted:
        reboot(path)
    d = SharedDict(path=path, create=False)
    got = {k: bytes(v) if k == "big" else v for k, v in d.items()}
    half = {**expected(done), "big": bytes([done % 256]) * 300} if done % 4 == 3 and not atomic else None
    assert got in (expected(done), expected(done + 1), half), f"after {done} acknowledged writes: {got}"
    # ... and it goes on: a write, a clean close, a reopen.
    d["after"] = True
    d.close()
    d = SharedDict(path=path, create=False)
    assert d["after"] is True
    d.unlink()
    d.close()


POINTS = [
    "record-written",
    "record-published",
    "dump-registered",
    "dump-created",
    "dump-written",
    "dump-published",
    "blob-registered",
    "blob-written",
]


@pytest.mark.parametrize("sync", ["always", "interval", "never"])
@pytest.mark.parametrize("point", ["lock-held", *POINTS, "transaction-written", "transaction-published"])
def test_a_writer_killed_at_a_fault_point_then_a_reboot(durable_dir, point, sync, caplog):
    d = SharedDict({"k0": -1}, path=durable_dir, sync=sync, buffer_size=STREAM, blob_threshold=256)
    d.close()
    after = 2 if point.startswith(("dump", "blob")) else 5
    transaction = point.startswith("transaction")
    p = worker(
        ["write", durable_dir, "0", "40"] + (["transaction"] if transaction else []), f"{point}:kill:{after}"
    )
    assert p.returncode == -signal.SIGKILL, p.stderr
    done = acked(p.stdout)
    assert done == list(range(len(done))) and done, "the writer died before its first write"
    with caplog.at_level("WARNING", logger="ultradict_ng"):
        check(durable_dir, len(done), transaction)
    if (
        point == "transaction-written"
    ):  # (its records are there, its last unmarked: said so, not taken for damage)
        assert "ignored (a transaction's records without its last)" in caplog.text, caplog.text


@pytest.mark.parametrize("then", ["a reboot", "no reboot"])
@pytest.mark.parametrize("sync", ["always", "interval", "never"])
@pytest.mark.parametrize("point", ["closing-claimed", "closing-checked"])
def test_a_last_close_killed_loses_nothing(durable_dir, point, sync, then):
    """The last holder killed as it closes -- CLOSING held by a dead process,
    or its users found gone and the dict not yet closed: its control segment
    stays.  The next opener (the segment in place, or after a reboot) gets
    every write, and does not wait for the dead closer."""
    import time

    SharedDict({"k0": -1}, path=durable_dir, sync=sync, buffer_size=STREAM, blob_threshold=256).close()
    p = worker(["write", durable_dir, "0", "12"], f"{point}:kill:1")
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert acked(p.stdout) == list(range(12))  # (every write returned: it died closing)
    assert os.path.exists(os.path.join(SHM, control_of(durable_dir)))
    t0 = time.monotonic()
    check(durable_dir, 12, True, rebooted=then == "a reboot")
    assert time.monotonic() - t0 < 10


def test_an_aborted_transaction_leaves_zeros_and_never_comes_back(durable_dir, caplog):
    """Its rollback zeroes its records past the published end: the recovery
    after a crash finds the stream's normal end, and warns of nothing.  Put
    back (a process killed in its rollback, or a power loss that kept them),
    they are still never replayed: a later write's record is followed by the
    rest of them, whose unit word does not follow it."""
    p = worker(["abort", durable_dir])
    assert p.returncode == -signal.SIGKILL and "done" in p.stdout, p.stderr
    stream = os.path.join(durable_dir, D.STREAM_FILE)
    before = bytes.fromhex(p.stdout.split("raw ")[1].split()[0])
    assert before.count(b"other") == 1  # (the aborted records were written, past the end)
    with open(stream, "rb") as f:
        after = f.read(len(before))
    assert b"other" not in after
    copy = durable_dir + "-leftovers"  # (a dict of its own)
    shutil.copytree(durable_dir, copy)
    end = len(after.rstrip(b"\0"))  # (the records of k = 0 and k = 3)
    with open(os.path.join(copy, D.STREAM_FILE), "r+b") as f:  # the leftovers put back past k = 3
        f.seek(end)
        f.write(before[end:])
    for where in (durable_dir, copy):
        caplog.clear()
        reboot(where)
        e = SharedDict(path=where)
        assert dict(e) == {"k": 3}
        e.unlink()
        e.close()
        assert ("a record not of the unit before it" in caplog.text) == (where == copy), caplog.text


class _RaiseAfterPublish:
    """In place of ``faults`` in the writer: the step after a transaction's
    publish raises, as a failure there would (its wake-up, its blobs' removal)."""

    armed = True

    @staticmethod
    def hit(point: str) -> None:
        if point == "transaction-published":
            raise RuntimeError(point)


def test_a_transaction_failing_after_its_publish_keeps_its_records(durable_dir, monkeypatch):
    """A rollback zeroes only records nobody can have seen: a transaction that
    fails after its publish leaves them, so they are still read, and survive
    a reboot (zeroed, the recovery would stop at them: both writes lost)."""
    d = SharedDict({"k": 0}, path=durable_dir)
    monkeypatch.setattr(writer_module, "faults", _RaiseAfterPublish)
    with pytest.raises(RuntimeError, match="transaction-published"), d.transaction():
        d["a"] = 1
        d["b"] = "two"
    monkeypatch.undo()
    assert dict(d) == {"k": 0, "a": 1, "b": "two"}
    d["c"] = 3  # (a later record after them)
    d.close()
    reboot(durable_dir)
    e = SharedDict(path=durable_dir)
    assert dict(e) == {"k": 0, "a": 1, "b": "two", "c": 3}
    e.unlink()
    e.close()


@pytest.mark.parametrize("sync", ["always", "interval", "never"])
@pytest.mark.parametrize("point", ["recovery-scanned", "recovery-loaded", "recovery-checkpointed"])
def test_a_recovery_killed_is_redone(durable_dir, point, sync):
    d = SharedDict({"k0": -1}, path=durable_dir, sync=sync, buffer_size=STREAM, blob_threshold=256)
    d.close()
    p = worker(["write", durable_dir, "0", "30"], "record-written:kill:23")
    assert p.returncode == -signal.SIGKILL
    done = len(acked(p.stdout))
    reboot(durable_dir)
    r = worker(["open", durable_dir], f"{point}:kill:1")
    assert r.returncode == -signal.SIGKILL, r.stderr
    check(durable_dir, done, False)


def test_a_group_commit_leader_killed_is_replaced(durable_dir):
    """A writer dies leading a sync (SYNC_LEADER holds its word): another writer's
    sync="always" write still returns, once the dead leader is noticed."""
    import time

    d = SharedDict({"k0": -1}, path=durable_dir, sync="always", buffer_size=1 << 16)
    p = worker(["write", durable_dir, "0", "40"], "sync-leading:kill:3")
    assert p.returncode == -signal.SIGKILL, p.stderr
    done = acked(p.stdout)
    assert len(done) == 2  # (its third write published, then it died leading the sync)
    t0 = time.monotonic()
    d["after"] = 1  # waits for SYNCED: the dead leader is replaced
    assert time.monotonic() - t0 < 5
    s = d.stats()
    assert (s["synced_generation"], s["synced_end"]) == (s["generation"], s["stream_end"])
    d.close()
    reboot(durable_dir)
    e = SharedDict(path=durable_dir, create=False)
    assert dict(e) == {**expected(3), "after": 1}  # (the dead writer's third write was published)
    e.unlink()
    e.close()


def test_an_interval_sync_leader_killed_is_replaced(durable_dir):
    """Under "interval" the flusher leads the syncs: killed leading one (here
    the writer's close's), its SYNC_LEADER word is a dead process's.  The
    survivor's flusher replaces it, and the dead writer's writes are synced
    within the interval and a liveness check."""
    import time

    d = SharedDict({"k0": -1}, path=durable_dir, sync="interval", sync_interval=0.2, buffer_size=1 << 16)
    p = worker(["write", durable_dir, "0", "12"], "sync-leading:kill:1")
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert len(acked(p.stdout)) == 12
    d["after"] = 1  # (returns at once: "interval" waits for no sync)
    deadline = time.monotonic() + 5
    while True:
        s = d.stats()
        if (s["synced_generation"], s["synced_end"]) == (s["generation"], s["stream_end"]):
            break
        assert time.monotonic() < deadline, f"not synced: {s}"
        time.sleep(0.05)
    d.close()
    reboot(durable_dir)
    e = SharedDict(path=durable_dir, create=False)
    assert dict(e) == {**expected(12), "after": 1}
    e.unlink()
    e.close()


@pytest.mark.parametrize("point", ["dump-written", "dump-published"])
def test_the_checkpoint_a_killed_writer_had_not_yet_removed_goes_at_the_recovery(durable_dir, point):
    """A writer killed after its new checkpoint was in place, before it
    removed the one before (step 4d): after a reboot the recovery removes
    that one -- nothing else would, and each such crash would keep one more
    dump on the disk for good."""
    SharedDict({"k0": -1}, path=durable_dir, buffer_size=STREAM, blob_threshold=256).close()
    p = worker(["write", durable_dir, "0", "40"], f"{point}:kill:2")
    assert p.returncode == -signal.SIGKILL, p.stderr
    done = len(acked(p.stdout))
    dumps = sorted(f for f in os.listdir(durable_dir) if f.startswith(D.DUMP_PREFIX))
    assert len(dumps) == 2
    reboot(durable_dir)
    newest = os.path.join(durable_dir, dumps[-1])
    with open(newest, "r+b") as f:  # (its header damaged: the open refuses it, and removes nothing)
        f.seek(16)
        word = f.read(1)
        f.seek(16)
        f.write(bytes([word[0] ^ 1]))
    with pytest.raises(CorruptSegment, match="nothing was changed"):
        SharedDict(path=durable_dir, create=False)
    assert sorted(f for f in os.listdir(durable_dir) if f.startswith(D.DUMP_PREFIX)) == dumps
    with open(newest, "r+b") as f:
        f.seek(16)
        f.write(word)
    d = SharedDict(path=durable_dir, create=False)
    got = {k: bytes(v) if k == "big" else v for k, v in d.items()}
    assert got in (expected(done), expected(done + 1))
    d._store.force_dump()
    dumps = [f for f in os.listdir(durable_dir) if f.startswith(D.DUMP_PREFIX)]
    assert dumps == [D.DUMP_PREFIX + L.base36(d.stats()["generation"])], dumps
    d.unlink()
    d.close()


def test_a_random_kill_then_a_reboot(durable_dir):
    """SIGKILL at whatever instruction the writer is at (a transaction writer
    and a plain one); once each in CI, more rounds in soak mode."""
    import random
    import time

    for transaction in [False, True] * soak_scaled(1):
        d = SharedDict({"k0": -1}, path=durable_dir, buffer_size=STREAM, blob_threshold=256, sync="never")
        d.close()
        args = [sys.executable, "-m", "tests.durable_workers", "write", durable_dir, "0", "100000"]
        p = subprocess.Popen(
            args + (["transaction"] if transaction else []), stdout=subprocess.PIPE, text=True
        )
        time.sleep(0.6 + random.random() * 0.4)
        os.kill(p.pid, signal.SIGKILL)
        out, _ = p.communicate(timeout=60)
        done = acked(out)
        assert done, "the writer wrote nothing in time"
        check(durable_dir, len(done), transaction)


def test_a_write_killed_before_it_was_published_stays_out_after_a_clean_close(durable_dir):
    """A writer killed between writing its record and publishing it: the
    processes that go on never see the write, and the last of them closes
    cleanly -- unmaking the record, whole past the end it writes down, so
    that the next open (after a reboot) does not replay it."""
    keeper = SharedDict(path=durable_dir, sync="always")
    keeper["state"] = "old"
    p = worker(["set", durable_dir, "state", "ghost"], "record-written:kill:1")
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert keeper["state"] == "old"
    keeper.close()
    assert b"ghost" in open(os.path.join(durable_dir, D.STREAM_FILE), "rb").read(4096)
    reboot(durable_dir)
    d = SharedDict(path=durable_dir, create=False)
    assert dict(d) == {"state": "old"} and d.stats()["generation"] == 0  # (clean: no recovery)
    d["state"] = "new"  # (and it goes on: the next write takes the dropped one's place)
    d.close()
    reboot(durable_dir)
    d = SharedDict(path=durable_dir, create=False)
    assert dict(d) == {"state": "new"}
    d.unlink()
    d.close()


@pytest.mark.parametrize("how", ["closed", "closed after its checkpoint", "killed", "an older dump put back"])
def test_a_missing_checkpoint_is_refused_and_changes_nothing(durable_dir, how):
    """The dict's newest checkpoint removed (a cleaner of old files): the open
    names it and changes nothing -- rather than opening the dict as the dump
    before it, or as empty, and taking the missing one's generation again."""
    import shutil

    from ultradict_ng.errors import CorruptSegment

    d = SharedDict({"k": 0, "big": b"x" * 5000}, path=durable_dir, blob_threshold=1024)
    d._store.force_dump()  # dump.1
    older = os.path.join(os.path.dirname(durable_dir), "dump.1.saved")
    shutil.copy(os.path.join(durable_dir, "dump.1"), older)
    if how == "an older dump put back":
        d._store.force_dump()  # dump.2 (dump.1 removed)
    newest = max(f for f in os.listdir(durable_dir) if f.startswith("dump."))
    if how.startswith("closed"):
        for i in range(10 if how == "closed" else 0):
            d[f"k{i}"] = i  # records of the newest generation (none: only ``clean`` names it)
        d.close()
    else:
        d.close()
        p = worker(["die", durable_dir, "10"])  # (the records, then no close: as a crash leaves them)
        assert p.returncode == -signal.SIGKILL and "done" in p.stdout, p.stderr
    os.remove(os.path.join(durable_dir, newest))
    if how == "an older dump put back":
        shutil.copy(older, os.path.join(durable_dir, "dump.1"))
    os.remove(older)
    reboot(durable_dir)
    before = {f: open(os.path.join(durable_dir, f), "rb").read() for f in os.listdir(durable_dir)}
    for _ in range(2):
        with pytest.raises(CorruptSegment, match=f"{newest} is missing"):
            SharedDict(path=durable_dir, create=False)
        assert {f: open(os.path.join(durable_dir, f), "rb").read() for f in os.listdir(durable_dir)} == before
        assert not os.path.exists(os.path.join(SHM, control_of(durable_dir)))
    shutil.rmtree(durable_dir)


@pytest.mark.parametrize("point", ["recovery-scanned", "recovery-loaded", "recovery-checkpointed"])
def test_a_recovery_killed_is_redone_by_the_next_opener_without_a_reboot(durable_dir, point, monkeypatch):
    """The next opener finds the control segment the killed recovery made
    (no reboot removes it): it rebuilds it rather than attach to it, and every
    acknowledged write is there -- also on the path that merges the records
    as bytes, whose STATE (``g << 32``) holds none of them until its
    checkpoint is written."""
    monkeypatch.setenv("ULTRADICT_NG_PARTIAL_FROM", "64")  # (a table read in place: the bytes merge)
    d = SharedDict({f"p{i}": i for i in range(300)}, path=durable_dir, sync="always")
    d._store.force_dump()
    d.close()
    p = worker(["die", durable_dir, "10"])  # (acknowledged writes in the stream, no close)
    assert p.returncode == -signal.SIGKILL and "done" in p.stdout, p.stderr
    reboot(durable_dir)
    r = worker(["open", durable_dir], f"{point}:kill:1")
    assert r.returncode == -signal.SIGKILL, r.stderr
    made = os.path.exists(os.path.join(SHM, control_of(durable_dir)))  # (left by the killed recovery)
    assert made == (point != "recovery-scanned")  # (killed before it made one)
    e = SharedDict(path=durable_dir, create=False)
    assert dict(e) == {**{f"p{i}": i for i in range(300)}, **{f"k{i}": i for i in range(10)}}
    e["after"] = 1
    e.close()
    e = SharedDict(path=durable_dir, create=False)
    assert e["k9"] == 9 and e["after"] == 1
    e.unlink()
    e.close()


@pytest.mark.parametrize("then", ["a clean close", "a reboot", "a crash"])
def test_a_checkpoint_never_published_does_not_hide_the_writes_after_it(durable_dir, then, caplog):
    """A process killed after its checkpoint ``dump.<g+1>`` is renamed into
    place, before STATE publishes it: the others write on in generation g,
    and the next open after a clean close, a reboot or a crash keeps their
    acknowledged writes -- the first of them, taking the dead holder's lock
    over, removes the dump (a recovery would take the newest for the dict)."""
    SharedDict({"before": 1}, path=durable_dir, sync="always").close()
    keeper = SharedDict(path=durable_dir, create=False) if then == "a clean close" else None
    p = worker(["compact", durable_dir], "dump-written:kill:1")
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert "dump.1" in os.listdir(durable_dir)
    if keeper is not None:
        for i in range(5):
            keeper[f"k{i}"] = i
        assert "recovered from dead process" in caplog.text
        keeper.close()
    else:  # (a writer that takes the lock over, writes, and is killed in its turn)
        p = worker(["die", durable_dir, "5"])
        assert p.returncode == -signal.SIGKILL and "done" in p.stdout, p.stderr
        if then == "a reboot":
            reboot(durable_dir)
    assert "dump.1" not in os.listdir(durable_dir)
    e = SharedDict(path=durable_dir, create=False)
    assert dict(e) == {"before": 1, **{f"k{i}": i for i in range(5)}}
    e["after"] = 1
    e.close()
    reboot(durable_dir)
    e = SharedDict(path=durable_dir, create=False)
    assert e["k4"] == 4 and e["after"] == 1
    e.unlink()
    e.close()


def test_a_checkpoint_never_published_that_a_clean_close_kept_is_removed_at_the_reopen(durable_dir):
    """As above, but the processes left only read, then close: none takes the
    lock over, and the last close writes ``clean`` beside ``dump.<g+1>``.  The
    reopen removes it (logged): else, once the first write removes ``clean``,
    the recovery after the next crash took it for the dict's checkpoint and
    dropped every write since as records of an older generation."""
    SharedDict({"before": 1}, path=durable_dir, sync="always").close()
    reader = SharedDict(path=durable_dir, create=False)
    p = worker(["compact", durable_dir], "dump-written:kill:1")
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert dict(reader) == {"before": 1}
    reader.close()
    assert sorted(os.listdir(durable_dir)) == ["clean", "dict.meta", "dump.1", "stream"]
    from ultradict_ng.cli.paths import file_checks

    assert (
        "files",
        "warn",
        "dump.1: a checkpoint never published (its writer was killed); the next open removes it",
    ) in (file_checks(durable_dir))
    p = worker(["die", durable_dir, "5"])  # (a clean reopen; five writes acknowledged, then killed)
    assert p.returncode == -signal.SIGKILL and "done" in p.stdout, p.stderr
    assert "removing dump.1, a checkpoint never published" in p.stderr
    assert "dump.1" not in os.listdir(durable_dir)
    reboot(durable_dir)
    e = SharedDict(path=durable_dir, create=False)
    assert dict(e) == {"before": 1, **{f"k{i}": i for i in range(5)}}
    e.unlink()
    e.close()


def test_a_creator_killed_before_its_initial_data_is_in_leaves_no_dict(durable_dir):
    """``SharedDict(initial, path=...)``: the dict exists (``dict.meta``) only
    once its initial data is in.  A creator killed writing it leaves files
    the next creator replaces, initial data and all -- not a dict without it."""
    p = worker(["create", durable_dir], "lock-held:kill:1")  # (the initial data's write takes the lock)
    assert p.returncode == -signal.SIGKILL, p.stderr
    with open(os.path.join(durable_dir, D.META_FILE)) as f:
        assert json.load(f)["creating"] is True  # (what tells its leftovers from a dict that lost its meta)
    from ultradict_ng.cli.paths import summary

    with pytest.raises(NotFound, match="its creation did not finish"):
        summary(durable_dir)  # (ls)
    with pytest.raises(NotFound):
        SharedDict(path=durable_dir, create=False)
    assert worker(["create", durable_dir]).returncode == 0
    d = SharedDict(path=durable_dir, create=False)
    assert dict(d) == {"config": "v1", "counter": 0}
    d.unlink()
    d.close()


@pytest.mark.parametrize("holding", ["a checkpoint", "records only", "a clean close"])
def test_a_dict_whose_meta_is_lost_is_refused_not_removed(durable_dir, holding, capsys):
    """Without ``dict.meta``, files that hold data are a dict whose description
    was lost, not a creation's leftovers: every open refuses them
    (``CorruptSegment`` naming it), removes nothing, and ``rm PATH`` removes them."""
    from ultradict_ng.cli import main

    d = SharedDict(path=durable_dir, sync="always")
    d["k"] = 1
    if holding == "a checkpoint":
        d._store.force_dump()
    d.close()
    if holding != "a clean close":  # (a writer killed: no clean close)
        assert worker(["die", durable_dir, "3"]).returncode == -signal.SIGKILL
        reboot(durable_dir)
    os.unlink(os.path.join(durable_dir, D.META_FILE))
    before = sorted(os.listdir(durable_dir))
    for create in (None, False, True):
        with pytest.raises(CorruptSegment, match="dict.meta is missing, but the directory holds"):
            SharedDict(path=durable_dir, create=create)
        assert sorted(os.listdir(durable_dir)) == before
    reboot(durable_dir)
    assert main(["rm", durable_dir]) == 0
    assert "removed" in capsys.readouterr().out
    assert not os.path.exists(durable_dir)


def test_initial_data_refused_leaves_nothing_and_does_not_hang(durable_dir):
    """A value the serializer refuses among the initial data: the error, and
    no dict (the creator, which holds the directory lock, undoes it)."""
    from ultradict_ng.errors import UnsupportedType

    os.makedirs(durable_dir)  # (there before: it stays, empty)
    with pytest.raises(UnsupportedType):
        SharedDict({"ok": 1, "bad": lambda: 1}, path=durable_dir)
    assert os.listdir(durable_dir) == []
    assert not os.path.exists(os.path.join(SHM, control_of(durable_dir)))
    with pytest.raises(UnsupportedType):
        SharedDict({"ok": 1, "bad": lambda: 1}, path=os.path.join(durable_dir, "new"))
    assert os.listdir(durable_dir) == []  # (made by the open: removed again)
    d = SharedDict({"ok": 1}, path=durable_dir)
    assert dict(d) == {"ok": 1}
    d.unlink()
    d.close()


def test_a_failed_removal_of_the_unpublished_dump_does_not_keep_the_lock(durable_dir, monkeypatch, caplog):
    """Removing the dead writer's unpublished checkpoint happens with its lock
    just taken over: an error there (the disk's) is logged, and the lock is
    used and released as ever -- but the checkpoint may stay on the disk, where
    a recovery would take it over every later record, so the write that took
    the lock over and every later one raise ``SyncFailed`` (acknowledged by
    no one as durable), as after a failed sync of the stream."""
    from ultradict_ng._shm import lock as shm_lock
    from ultradict_ng.errors import SyncFailed

    def broken(name: str) -> None:
        raise OSError(5, "Input/output error")

    d = SharedDict({"before": 1}, path=durable_dir)
    p = worker(["compact", durable_dir], "dump-written:kill:1")
    assert p.returncode == -signal.SIGKILL, p.stderr
    monkeypatch.setattr(shm_lock.segments, "discard_unpublished", broken)
    with pytest.raises(SyncFailed):
        d["after"] = 1  # (takes the dead writer's lock over; published, not acknowledged)
    assert "its unpublished dump 1 stays" in caplog.text
    with d.lock(timeout=1):
        assert d["after"] == 1
    with pytest.raises(SyncFailed):
        d["later"] = 2
    monkeypatch.undo()
    d.unlink()
    d.close()
