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
from tests.durable_workers import plain
from tests.powerloss import Disk
from ultradict_ng import SharedDict
from ultradict_ng._disk import files

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
    disk = Disk(path, seed)
    models: list[dict[Any, Any]] = [{}]
    files.observer = disk.observe
    d = None
    try:
        d = SharedDict(path=path, sync=sync, buffer_size=512, blob_threshold=256)
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
    images = disk.images
    dirs = []
    for i, image in enumerate(images):
        where = str(base / f"image{i}")
        image.write(where)
        dirs.append(where)
    out = subprocess.run(
        [sys.executable, "-m", "tests.durable_workers", "contents", *dirs],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    canon = [repr(plain(m)) for m in models]
    for where, image in zip(dirs, images):
        got = lines[where]
        if "dict.meta" not in image.files:  # the creation never reached the disk: no dict
            assert got.startswith("ERROR") and "NotFound" in got, (image.label, got)
            continue
        assert not got.startswith("ERROR"), (image.label, got)
        lowest = image.acked if sync == "always" else 0
        allowed = canon[lowest : image.acked + 2]
        assert got in allowed, (
            f"{image.label}: after {image.acked} acknowledged steps of {steps} the disk reopened "
            f"as {got}, not one of {allowed}"
        )
