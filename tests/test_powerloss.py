"""Simulated power loss (tests/powerloss.py): at every sync point of a
workload chosen by Hypothesis, the disk states a power loss could leave are
opened in a fresh process; each must be the dict after a prefix of the
acknowledged writes -- under ``sync="always"`` after all of them but the one
in flight -- never an error, a torn value or a mixed state."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import soak_scaled
from tests.durable_workers import cache_state, plain
from tests.powerloss import Disk
from ultradict_ng import SharedDict
from ultradict_ng._disk import files
from ultradict_ng.cache import SharedCache

pytestmark = pytest.mark.shm_only

keys = st.sampled_from(["a", "b", "c", "d", 1, 2])
values = st.one_of(
    st.integers(-5, 5),
    st.text(max_size=5),
    st.integers(0, 255).map(lambda i: "s" * 200 + str(i)),  # long: the stream fills, dumps follow
    st.integers(0, 255).map(lambda i: bytes([i]) * 300),  # a blob (threshold 256)
)
op = st.one_of(
    st.tuples(st.just("set"), keys, values),
    st.tuples(st.just("del"), keys),
    st.tuples(st.just("txn"), st.lists(st.tuples(keys, values), min_size=1, max_size=4), st.booleans()),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("clear")),
)


def apply(d: Any, step: tuple[Any, ...]) -> None:
    kind = step[0]
    if kind == "set":
        d[step[1]] = step[2]
    elif kind == "del":
        d.pop(step[1], None)
    elif kind == "clear":
        d.clear()
    elif kind == "txn" and isinstance(d, dict):  # the model: all or nothing
        if not step[2]:
            d.update(step[1])
    elif kind == "txn":
        try:
            with d.transaction():
                for k, v in step[1]:
                    d[k] = v
                if step[2]:
                    raise KeyError("abort")
        except KeyError:
            pass


def run_workload(
    path: str, steps: list[Any], sync: str, seed: int, start: dict[Any, Any], create: bool, stream: int = 512
) -> tuple[list[Any], list[dict[Any, Any]], dict[Any, Any]]:
    """Run ``steps`` on the dict kept in ``path`` (made, or opened -- recovering it
    -- from the disk state there) with the power-loss recorder on: the disk
    states it recorded, the model after each step (from ``start``; for an
    opened dict, ``start`` is replaced by what it reopened as), and that."""
    disk = Disk(path, seed)
    files.observer = disk.observe
    d = None
    try:
        if create:
            d = SharedDict(path=path, sync=sync, buffer_size=stream, blob_threshold=256)
        else:
            d = SharedDict(path=path, create=False)
            start = {k: d[k] for k in d}  # (what recovery gave: the base of this run's model)
        models: list[dict[Any, Any]] = [start]
        for step in steps:
            if step[0] == "reopen":
                d.close()
                d = SharedDict(path=path, create=False)
            else:
                apply(d, step)
            model = dict(models[-1])
            if step[0] != "reopen":
                apply(model, step)
            models.append(model)
            disk.acked += 1
        disk.capture("at the end")
    finally:
        files.observer = None
        if d is not None:
            d.unlink()
            d.close()
    return disk.images, models, start


def open_images(base: Any, tag: str, images: list[Any], command: str) -> tuple[list[str], dict[str, str]]:
    """Write each disk state to a directory and open them all in one fresh
    process (tests/durable_workers.py ``command``): the directories, and what
    each opened as."""
    dirs = []
    for i, image in enumerate(images):
        dirs.append(str(base / f"{tag}{i}"))
        image.write(dirs[-1])
    out = subprocess.run(
        [sys.executable, "-m", "tests.durable_workers", command, *dirs],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    return dirs, dict(line.split(" ", 1) for line in out.stdout.splitlines())


def check_images(
    base: Any, tag: str, images: list[Any], models: list[Any], sync: str, what: str
) -> list[str]:
    """Open every disk state in one fresh process; each must be the model after a
    prefix of the acknowledged steps (``always``: all of them but one in flight).
    Returns the directories of the states that hold a dict."""
    dirs, lines = open_images(base, tag, images, "contents")
    canon = [repr(plain(m)) for m in models]
    whole = []
    for where, image in zip(dirs, images):
        got = lines[where]
        if "dict.meta" not in image.files:  # the creation never reached the disk: no dict
            assert got.startswith("ERROR") and "NotFound" in got, (image.label, got)
            continue
        assert not got.startswith("ERROR"), (image.label, got)
        lowest = image.acked if sync == "always" else 0
        allowed = canon[lowest : image.acked + 2]
        assert got in allowed, (
            f"{image.label}: after {image.acked} acknowledged steps of {what} the disk reopened "
            f"as {got}, not one of {allowed}"
        )
        whole.append(image)
    return whole


@settings(
    max_examples=soak_scaled(12),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(op, min_size=1, max_size=14), sync=st.sampled_from(["always", "never"]), seed=st.integers()
)
def test_every_power_loss_leaves_a_prefix(tmp_path_factory, steps, sync, seed):
    base = tmp_path_factory.mktemp("powerloss")
    path = str(base / "dict")
    os.makedirs(path)
    images, models, _ = run_workload(path, steps, sync, seed, {}, True)
    check_images(base, "image", images, models, sync, str(steps))


@settings(
    max_examples=soak_scaled(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    # (small writes of one shape, several 512-byte sectors of them unsynced: a sector
    # lost between kept ones is what a recovery must not let come back)
    first=st.lists(st.tuples(st.just("set"), keys, st.integers(0, 9)), min_size=30, max_size=90),
    then=st.lists(st.tuples(st.just("set"), keys, st.integers(0, 9)), min_size=1, max_size=40),
    seed=st.integers(),
    pick=st.randoms(use_true_random=False),
)
def test_a_power_loss_after_a_recovery_leaves_a_prefix_of_both(tmp_path_factory, first, then, seed, pick):
    """Power lost, the dict recovered and written again, power lost again: the
    second crash's disk states are a prefix of what followed the recovery --
    never a write the first crash cut off, come back (what the checkpoint at
    recovery is for)."""
    base = tmp_path_factory.mktemp("powerloss2")
    path = str(base / "dict")
    os.makedirs(path)
    images, models, _ = run_workload(path, first, "never", seed, {}, True, stream=4096)
    survivors = check_images(base, "first", images, models, "never", str(first))
    for n, image in enumerate(pick.sample(survivors, min(2, len(survivors)))):
        where = str(base / f"recovered{n}")
        image.write(where)
        again, models2, _ = run_workload(where, then, "never", seed + n, {}, False)  # (its policy: never)
        check_images(base, f"second{n}-", again, models2, "never", f"{then} after a recovery of {first}")


@pytest.mark.parametrize("seed", range(soak_scaled(2)))
def test_a_power_loss_keeps_every_write_an_interval_sync_covered(tmp_path, monkeypatch, seed):
    """``sync="interval"`` with a short interval, its thread syncing in the
    middle of the workload (checkpoints too): each disk state is a prefix,
    and holds every write acknowledged before the last sync that had
    finished -- what the policy promises after one interval."""
    import time

    from ultradict_ng._disk.syncing import Durability

    class Covered(Disk):
        covered = 0  # (writes acknowledged before the last finished sync began)
        floors: list[int] = []

        def capture(self, label: str) -> None:
            had = len(self.images)
            super().capture(label)
            self.floors += [self.covered] * (len(self.images) - had)

    path = str(tmp_path / "dict")
    disk = Covered(path, seed)
    disk.floors = []
    lead = Durability._lead

    def leading(self: Any) -> None:
        acked = disk.acked
        lead(self)
        disk.covered = max(disk.covered, acked)

    monkeypatch.setattr(Durability, "_lead", leading)
    files.observer = disk.observe
    try:
        d = SharedDict(path=path, sync="interval", sync_interval=0.01, buffer_size=512)
        for i in range(150):
            d["n"] = i
            disk.acked = i + 1
            time.sleep(0.001)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # (idle: the thread's next sync takes the rest)
            now = d.stats()
            if (now["synced_generation"], now["synced_end"]) == (now["generation"], now["stream_end"]):
                disk.covered = 150  # (every write synced, as the words say: the disk must hold them)
                break
            time.sleep(0.01)
        disk.capture("at the end")
    finally:
        files.observer = None
        with disk.mutex:  # (a capture the sync thread has under way ends before the removal)
            pass
    monkeypatch.undo()
    d.unlink()
    d.close()
    assert 0 < disk.floors[len(disk.floors) // 2] and disk.floors[-1] == 150, disk.floors
    dirs, lines = open_images(tmp_path, "image", disk.images, "contents")
    for where, image, floor in zip(dirs, disk.images, disk.floors):
        if "dict.meta" not in image.files:
            assert floor == 0, image.label
            continue
        got = lines[where]
        n = -1 if got == repr(plain({})) else eval(got)[1][0][1]  # (("dict", [("'n'", n)]))
        assert floor <= n + 1 <= image.acked + 1, (image.label, got, floor, image.acked)


def test_a_write_a_power_loss_cut_off_never_comes_back(tmp_path):
    """A lost sector in the middle of unsynced records: recovery keeps what comes
    before it, and the writes after the recovery, landing where the lost records
    were, must not make the records after the lost sector count again."""
    import shutil

    from ultradict_ng._disk import layout as D

    path = str(tmp_path / "dict")
    d = SharedDict(path=path, sync="never", buffer_size=8192)
    for i in range(60):
        d["a"] = i % 10  # (records of one length: 22 bytes)
    assert d.stats()["generation"] == 0 and d.stats()["stream_end"] == 60 * 22
    lost = str(tmp_path / "lost")
    shutil.copytree(path, lost)  # the disk after a power loss (the writer's page cache) ...
    d.unlink()
    d.close()
    with open(os.path.join(lost, D.STREAM_FILE), "r+b") as f:
        f.seek(512)
        f.write(bytes(512))  # ... which never got the second sector
    e = SharedDict(path=lost, create=False)
    assert dict(e) == {"a": 22 % 10}  # (the 24th record, at 506, runs into the lost sector)
    for _ in range(24):
        e["a"] = 5  # 24 x 22 bytes: if they land at 506, they end at 1034, where record 47 begins
    again = str(tmp_path / "again")
    shutil.copytree(lost, again)  # a second power loss, everything written kept
    e.unlink()
    e.close()
    f = SharedDict(path=again, create=False)
    assert dict(f) == {"a": 5}, "records cut off by the first power loss came back"
    f.unlink()
    f.close()


def test_a_checkpoint_that_failed_once_named_stays_gone_after_a_power_loss(tmp_path, monkeypatch):
    """A checkpoint that fails after it was renamed into place (an interrupt
    while the writer maps it to read in place) is removed, and its removal
    synced before the dict goes on: else, after a power loss, the recovery
    takes it as the newest checkpoint and drops every write the dict
    acknowledged since, in the generation before it."""
    from ultradict_ng._shm.writer import Writer

    path = str(tmp_path / "dict")
    os.makedirs(path)
    disk = Disk(path, 1)
    files.observer = disk.observe
    real = Writer._read_in_place
    failed: list[int] = []

    def interrupted(self: Any, *args: Any) -> Any:
        if not failed:
            failed.append(1)
            raise KeyboardInterrupt("while the checkpoint is mapped")
        return real(self, *args)

    try:
        d = SharedDict(path=path, sync="always", buffer_size=512)
        d["a"] = 0
        monkeypatch.setattr(Writer, "_read_in_place", interrupted)
        with pytest.raises(KeyboardInterrupt):
            for i in range(100):  # (the stream fills: a checkpoint)
                d["filler"] = "x" * 100 + str(i)
        monkeypatch.setattr(Writer, "_read_in_place", real)
        assert d.stats()["generation"] == 0
        d["acked"] = "kept"
        disk.capture("acknowledged")
    finally:
        files.observer = None
    d.unlink()
    d.close()
    (image,) = [im for im in disk.images if im.label == "acknowledged (synced)"]
    where = str(tmp_path / "image")
    image.write(where)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from ultradict_ng import SharedDict; d = SharedDict(path={where!r}); "
            "print(d.get('acked')); d.unlink(); d.close()",
        ],
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "kept", out.stdout + out.stderr


def test_a_power_loss_during_a_removal_leaves_the_whole_dict_or_none(tmp_path):
    """``unlink()`` removes a dict's files without syncing the directory at
    each step: every disk state it can leave -- each prefix of its removals
    reaching the disk -- opens as the whole dict or as no dict."""
    path = str(tmp_path / "dict")
    d = SharedDict(path=path, sync="never", buffer_size=2048, blob_threshold=256)
    for i in range(40):
        d[f"k{i % 7}"] = "v" * 50 + str(i)  # (the stream fills: a checkpoint)
    d["blob"] = b"x" * 1000
    d["after"] = 1
    model = plain(dict(d))
    d.close()
    assert {"dump.1", "blob.1", "clean"} <= set(os.listdir(path))
    disk = Disk(path, 7)
    files.observer = disk.observe
    try:
        e = SharedDict(path=path, create=False)
        e.unlink()
        e.close()
    finally:
        files.observer = None
    assert not os.path.exists(path)
    assert any("directory operations" in image.label for image in disk.images)
    dirs, lines = open_images(tmp_path, "image", disk.images, "contents")
    for where, image in zip(dirs, disk.images):
        got = lines[where]
        assert got == repr(model) or got.startswith("ERROR NotFound"), (image.label, sorted(image.files), got)


# -- a SharedCache kept in files ---------------------------------------------------------------

cache_op = st.one_of(
    st.tuples(
        st.just("set"), keys, values.filter(lambda v: not isinstance(v, bytes)), st.sampled_from([None, 1000])
    ),
    st.tuples(st.just("del"), keys),
    st.tuples(st.just("incr"), st.integers(1, 3)),
    st.tuples(st.just("many"), st.dictionaries(keys, st.integers(0, 9), min_size=1, max_size=3)),
    st.tuples(st.just("reopen")),
)


def run_cache_workload(path: str, steps: list[Any], sync: str, seed: int, bounds: dict[str, Any]) -> Any:
    """The cache's steps with the recorder on: the disk states, and the cache's
    entries (as it held them, evictions included) after each step."""
    disk = Disk(path, seed)
    files.observer = disk.observe
    c = None
    try:
        c = SharedCache(path=path, sync=sync, buffer_size=512, **bounds)
        states = [cache_state(c)]
        for step in steps:
            kind = step[0]
            if kind == "set":
                c.set(step[1], step[2], ttl=step[3])
            elif kind == "del":
                c.delete(step[1])
            elif kind == "incr":
                c.incr("n", step[1], default=0)
            elif kind == "many":
                c.set_many(step[1])
            else:
                c.close()
                c = SharedCache(path=path, create=False)
            states.append(cache_state(c))
            disk.acked += 1
        disk.capture("at the end")
    finally:
        files.observer = None
        if c is not None:
            c.unlink()
            c.close()
    return disk.images, states


@settings(
    max_examples=soak_scaled(10),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(cache_op, min_size=1, max_size=12),
    sync=st.sampled_from(["always", "never"]),
    bounds=st.sampled_from([{}, {"maxsize": 3}, {"maxbytes": 700}]),
    seed=st.integers(),
)
def test_every_power_loss_leaves_a_cache_whole(tmp_path_factory, steps, sync, bounds, seed):
    """Every disk state opens as a cache whose side segment is consistent with its
    entries (slots, sizes, bytes: rebuilt after the recovery when the side file
    is older than them) and whose entries are the cache's after a prefix of the
    steps -- exactly, where nothing is evicted; pair by pair, where an eviction
    (a write of its own) may be what the power loss cut off after."""
    base = tmp_path_factory.mktemp("powerloss-cache")
    path = str(base / "cache")
    os.makedirs(path)
    images, states = run_cache_workload(path, steps, sync, seed, bounds)
    dirs, lines = open_images(base, "image", images, "cache-contents")
    for where, image in zip(dirs, images):
        got = lines[where]
        if "dict.meta" not in image.files:
            continue  # (no dict yet on that disk: refused, nothing to compare)
        assert not got.startswith("ERROR"), (image.label, got, steps)
        lowest = image.acked if sync == "always" and not bounds else 0
        allowed = states[lowest : image.acked + 2]
        if not bounds:
            assert got in [repr(s) for s in allowed], (image.label, got, allowed, steps)
        else:
            pairs = {repr(p) for s in allowed for p in s}
            extra = [p for p in eval(got) if repr(p) not in pairs]  # (our own repr of str/int/float pairs)
            assert not extra, (image.label, extra, allowed, steps)


def test_a_clean_close_leaves_the_cache_side_file_on_the_disk(tmp_path):
    """After a clean close, recovery trusts the files as they are (no rebuild):
    so the close must have synced the side file, which writes never sync."""
    from tests.durable_workers import audit_side

    path = str(tmp_path / "cache")
    os.makedirs(path)
    disk = Disk(path, 0)
    files.observer = disk.observe
    try:
        c = SharedCache(path=path, maxsize=10, maxbytes=900, sync="never")
        for i in range(25):
            c.set(f"k{i}", "v" * i)
        c.close()
        disk.capture("after the close")
    finally:
        files.observer = None
    (image,) = [im for im in disk.images if im.label == "after the close (synced)"]
    image.write(str(tmp_path / "image"))
    c = SharedCache(path=str(tmp_path / "image"), create=False)
    try:
        assert audit_side(c) == "" and len(c) == 10
    finally:
        c.unlink()
        c.close()
    c = SharedCache(path=path, create=False)
    c.unlink()
    c.close()
