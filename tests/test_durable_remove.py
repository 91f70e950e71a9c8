"""Removing a dict kept in files while its processes write (``_disk/layout.py``,
"Closing and removal"): only under the dict's lock, so that no write goes on
into the removed directory's path -- nor into the next dict made there."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from ultradict_ng import SharedDict
from ultradict_ng._disk import layout as D
from ultradict_ng.errors import InvalidName, LockTimeout, NotFound, Unlinked

pytestmark = pytest.mark.shm_only

BIG = 200_000  # (a value in a file of its own: blob.<id>)


def _slow_transaction(path: str, inside: Any, seconds: float, out: Any) -> None:
    """A transaction that writes a large value, waits ``seconds`` (a slow disk,
    a long computation) holding the dict's lock, then writes another."""
    d = SharedDict(path=path, create=False)
    try:
        with d.transaction():
            d["t0"] = b"o" * BIG
            inside.set()
            time.sleep(seconds)
            d["t1"] = b"p" * BIG
        out.put("committed")
        time.sleep(0.5)  # (a removal waiting for the lock takes it first: this write then comes after it)
        d["after"] = 1
        out.put("wrote after")
    except Exception as exc:
        out.put(type(exc).__name__)
    d.close()


def _start(path: str, seconds: float) -> tuple[Any, Any]:
    ctx = multiprocessing.get_context("spawn")
    inside, out = ctx.Event(), ctx.Queue()
    p = ctx.Process(target=_slow_transaction, args=(path, inside, seconds, out))
    p.start()
    assert inside.wait(60), "the writer never began its transaction"
    return p, out


def test_a_removal_waits_for_the_writer_that_holds_the_lock(durable_dir):
    """The writer holds the lock past the 2 s a dict in shared memory waits:
    the removal waits on, the transaction commits, and its next write is
    ``Unlinked``.  A dict made at the path next is untouched by the old
    writer (going on without the lock, the removal let the transaction write
    its second value's file over the new dict's, then remove both of the
    new dict's files of those ids when it ended)."""
    d = SharedDict({"a": 1}, path=durable_dir, sync="always")
    p, out = _start(durable_dir, 3.0)
    t0 = time.monotonic()
    assert d.unlink() > 0
    assert time.monotonic() - t0 > 2.5  # (it waited for the transaction)
    d.close()
    assert not os.path.exists(durable_dir)
    new = SharedDict(path=durable_dir)
    for i in range(4):
        new[f"v{i}"] = bytes([i]) * BIG
    p.join(60)
    assert [out.get(timeout=10) for _ in range(2)] == ["committed", "Unlinked"]
    assert {k: new[k] == bytes([int(k[1])]) * BIG for k in new} == {f"v{i}": True for i in range(4)}
    assert sorted(os.listdir(durable_dir)) == ["blob.1", "blob.2", "blob.3", "blob.4", "dict.meta", "stream"]
    new.unlink()
    new.close()


def test_a_removal_gives_up_on_a_lock_held_too_long_and_removes_nothing(durable_dir, monkeypatch):
    d = SharedDict({"a": 1}, path=durable_dir, sync="always")
    monkeypatch.setattr(D, "REMOVE_LOCK_TIMEOUT", 0.5)
    p, out = _start(durable_dir, 3.0)
    with pytest.raises(LockTimeout, match=f"held by pid {p.pid}\\): nothing removed") as refused:
        d.unlink()
    assert refused.value.pid == p.pid
    p.join(60)
    assert [out.get(timeout=10) for _ in range(2)] == ["committed", "wrote after"]
    assert dict(d) == {"a": 1, "t0": b"o" * BIG, "t1": b"p" * BIG, "after": 1}
    d.unlink()
    d.close()


def _leader_stopped_in_its_sync(path: str, stopped: Any) -> None:
    from ultradict_ng._disk import files

    sync_data = files.sync_data

    def stop(*args: Any) -> Any:
        stopped.set()
        os.kill(os.getpid(), signal.SIGSTOP)
        return sync_data(*args)

    d = SharedDict(path=path, create=False)
    files.sync_data = stop
    d["x"] = 1  # (sync="always": this process leads the sync, and stops in it)
    d.close()


def test_a_removal_does_not_wait_for_a_sync_leader_that_is_stopped(durable_dir):
    """A handle closing a dict it removed syncs nothing: the leader of the
    dict's sync stopped inside it (SIGSTOP, a debugger, a disk that hangs)
    kept the removal waiting for ever in its close."""
    d = SharedDict({"a": 1}, path=durable_dir, sync="always")
    d.close()
    ctx = multiprocessing.get_context("spawn")
    stopped = ctx.Event()
    p = ctx.Process(target=_leader_stopped_in_its_sync, args=(durable_dir, stopped))
    p.start()
    try:
        assert stopped.wait(60)
        time.sleep(0.2)
        e = SharedDict(path=durable_dir, create=False)
        removal = threading.Thread(target=lambda: (e.unlink(), e.close()), daemon=True)
        removal.start()
        removal.join(10)
        assert not removal.is_alive(), "the removal waits for the stopped leader"
        assert not os.path.exists(durable_dir)
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.join(60)


def _opens_under_its_lock(path: str, holding: Any, done: Any) -> None:
    d = SharedDict(path=path, create=False)
    with d.lock:
        holding.set()
        time.sleep(0.5)
        SharedDict(path=path, create=False).close()  # (takes the directory's lock, under the dict's)
    d.close()
    done.set()


def test_a_removal_and_a_lock_holder_that_opens_the_path_do_not_wait_for_each_other(durable_dir, monkeypatch):
    """The removal takes the dict's lock, then the directory's, as an open
    or a last close under ``with d.lock:`` does: the other way round each
    waited for the other until the removal gave up."""
    monkeypatch.setattr(D, "REMOVE_LOCK_TIMEOUT", 5.0)
    d = SharedDict({"a": 1}, path=durable_dir)
    ctx = multiprocessing.get_context("spawn")
    holding, done = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_opens_under_its_lock, args=(durable_dir, holding, done))
    p.start()
    assert holding.wait(60)
    t0 = time.monotonic()
    assert d.unlink() > 0
    assert time.monotonic() - t0 < 4 and done.wait(10)
    p.join(60)
    d.close()
    assert not os.path.exists(durable_dir)


def test_a_removal_inside_the_removers_own_transaction_spares_the_next_dict(durable_dir):
    """The lock is the remover's own: its transaction's next large value is
    ``Unlinked`` (no file made at the path), and its rollback removes no file
    there -- both went to the dict made at the path since."""
    d = SharedDict({"a": 1}, path=durable_dir)
    with pytest.raises(Unlinked), d.transaction():
        d["t0"] = b"o" * BIG
        assert d.unlink() > 0
        new = SharedDict(path=durable_dir)
        for i in range(3):
            new[f"v{i}"] = bytes([i]) * BIG
        d["t1"] = b"p" * BIG
    d.close()
    assert {k: new[k] == bytes([int(k[1])]) * BIG for k in new} == {f"v{i}": True for i in range(3)}
    new.unlink()
    new.close()


def test_a_second_removal_finds_nothing_and_a_control_name_is_no_name(durable_dir):
    a, b = SharedDict({"a": 1}, path=durable_dir), SharedDict(path=durable_dir)
    with pytest.raises(InvalidName, match="a dict kept in files"):
        SharedDict.unlink_by_name(a.name)  # (in this process its derived names are its files)
    assert dict(b) == {"a": 1}
    assert a.unlink() > 0 and b.unlink() == 0
    a.close()
    b.close()


def _remove_then_die(path: str, after: int) -> None:
    from ultradict_ng._disk import files

    real, count = files.remove, [0]

    def remove(file: str) -> bool:
        if os.path.basename(file) != D.META_FILE + D.TMP_SUFFIX:  # (not the mark's own)
            count[0] += 1
            if count[0] > after:
                os.kill(os.getpid(), signal.SIGKILL)
        return real(file)

    files.remove = remove
    SharedDict(path=path).unlink()


@pytest.mark.parametrize("after", [0, 1, 3])
def test_a_removal_killed_midway_leaves_no_dict(durable_dir, after):
    """A removal killed after some of the files went (a checkpoint, value
    files): the next open finds no dict and makes a new one -- never the dict
    with values or its checkpoint gone (reads raising, or refused at open) --
    and ``rm PATH`` removes what is left."""
    d = SharedDict(path=durable_dir, blob_threshold=1024)
    d.update({f"k{i}": bytes([i]) * 2000 for i in range(4)})
    d.close()
    subprocess.run(
        [sys.executable, "-m", "ultradict_ng", "compact", durable_dir], check=True, capture_output=True
    )
    assert sorted(os.listdir(durable_dir))[:2] == ["blob.1", "blob.2"] and "dump.1" in os.listdir(durable_dir)
    p = multiprocessing.get_context("fork").Process(target=_remove_then_die, args=(durable_dir, after))
    p.start()
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    with pytest.raises(NotFound):
        SharedDict(path=durable_dir, create=False)
    if after == 3:  # (rm PATH finishes the removal)
        done = subprocess.run([sys.executable, "-m", "ultradict_ng", "rm", durable_dir], capture_output=True)
        assert done.returncode == 0 and not os.path.exists(durable_dir), done.stderr
        return
    e = SharedDict(path=durable_dir)
    assert dict(e) == {}
    e.unlink()
    e.close()
