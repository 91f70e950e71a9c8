"""Stateful property test: two handles of one dict against a plain dict model.

Random sequences of every mutating method (at the root and in nested dicts),
alternating between two handles, with a stream so small that dumps happen
constantly.  After every step both handles must equal the model.
"""

from __future__ import annotations

import os
from typing import Any

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.conftest import unique_name
from ultradict_ng import SharedDict
from ultradict_ng._disk import layout as D
from ultradict_ng._disk.opening import control_of

keys = st.one_of(st.integers(-3, 8), st.sampled_from(["a", "b", "c", ""]), st.tuples(st.integers(0, 2)))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.floats(allow_nan=False),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner)),
    max_leaves=6,
)
big_values = st.one_of(
    st.binary(min_size=300, max_size=3000), st.binary(min_size=300, max_size=3000).map(bytearray)
)


class TwoHandles(RuleBasedStateMachine):
    """Handles ``a``/``b`` on one dict with recurse=True; ``model`` is a plain nested dict."""

    @initialize(buffer_size=st.sampled_from([64, 512, 4096]), threshold=st.sampled_from([0, 256, 2048]))
    def open(self, buffer_size: int, threshold: int) -> None:
        """``threshold``: 0 keeps big values inline (in dumps); else those at least
        that large go to blobs."""
        self.name = unique_name("sm")
        self.threshold = threshold
        self.a = SharedDict(
            name=self.name, create=True, recurse=True, buffer_size=buffer_size, blob_threshold=threshold
        )
        self.b = SharedDict(name=self.name, create=False)
        self.model: dict[Any, Any] = {}

    def handle(self, which: bool) -> SharedDict:
        return self.a if which else self.b

    def nested_paths(self) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = [()]

        def walk(node: dict[Any, Any], path: tuple[Any, ...]) -> None:
            for k, v in node.items():
                if type(v) is dict:
                    out.append(path + (k,))
                    walk(v, path + (k,))

        walk(self.model, ())
        return out

    def target(self, which: bool, data: st.DataObject) -> tuple[Any, dict[Any, Any]]:
        path = data.draw(st.sampled_from(self.nested_paths()))
        shared: Any = self.handle(which)
        node = self.model
        for k in path:
            shared = shared[k]
            node = node[k]
        return shared, node

    @rule(which=st.booleans(), data=st.data(), key=keys, value=values)
    def set_item(self, which: bool, data: st.DataObject, key: Any, value: Any) -> None:
        shared, node = self.target(which, data)
        shared[key] = value
        node[key] = value

    @rule(which=st.booleans(), data=st.data(), key=keys, value=big_values)
    def set_big(self, which: bool, data: st.DataObject, key: Any, value: bytes) -> None:
        shared, node = self.target(which, data)
        shared[key] = value
        node[key] = value

    @rule(
        which=st.booleans(),
        data=st.data(),
        key=keys,
        value=st.one_of(
            st.lists(big_values, max_size=3),
            st.tuples(big_values, values),
            st.dictionaries(keys, big_values, max_size=3),
        ),
    )
    def set_big_inside(self, which: bool, data: st.DataObject, key: Any, value: Any) -> None:
        """Big values inside lists, tuples and (nested, with recurse) dicts."""
        shared, node = self.target(which, data)
        shared[key] = value
        node[key] = dict(value) if type(value) is dict else value

    @rule(which=st.booleans(), data=st.data(), items=st.dictionaries(keys, big_values, max_size=3))
    def update_big(self, which: bool, data: st.DataObject, items: dict[Any, Any]) -> None:
        shared, node = self.target(which, data)
        shared.update(items)
        node.update(items)

    @rule(which=st.booleans(), data=st.data(), key=keys, inner=st.dictionaries(keys, values, max_size=3))
    def set_nested(self, which: bool, data: st.DataObject, key: Any, inner: dict[Any, Any]) -> None:
        shared, node = self.target(which, data)
        shared[key] = inner
        node[key] = dict(inner)

    @rule(which=st.booleans(), data=st.data(), key=keys)
    def delete(self, which: bool, data: st.DataObject, key: Any) -> None:
        shared, node = self.target(which, data)
        if key in node:
            del shared[key]
            del node[key]
        else:
            try:
                del shared[key]
            except KeyError:
                pass
            else:
                raise AssertionError("deleting a missing key did not raise")

    @rule(which=st.booleans(), data=st.data(), key=keys, default=values)
    def pop(self, which: bool, data: st.DataObject, key: Any, default: Any) -> None:
        shared, node = self.target(which, data)
        got = shared.pop(key, default)
        want = node.pop(key, default)
        assert got == want

    @rule(which=st.booleans(), data=st.data())
    def popitem(self, which: bool, data: st.DataObject) -> None:
        shared, node = self.target(which, data)
        if node:
            assert shared.popitem() == node.popitem()

    @rule(which=st.booleans(), data=st.data(), key=keys, default=values)
    def setdefault(self, which: bool, data: st.DataObject, key: Any, default: Any) -> None:
        shared, node = self.target(which, data)
        got = shared.setdefault(key, default)
        want = node.setdefault(key, default)
        assert got == want

    @rule(which=st.booleans(), data=st.data(), items=st.dictionaries(keys, values, max_size=4))
    def update(self, which: bool, data: st.DataObject, items: dict[Any, Any]) -> None:
        shared, node = self.target(which, data)
        shared.update(items)
        node.update(items)

    @rule(which=st.booleans(), data=st.data())
    def clear(self, which: bool, data: st.DataObject) -> None:
        shared, node = self.target(which, data)
        if data.draw(st.integers(0, 4)) == 0:  # clearing is rare, or the dict stays tiny
            shared.clear()
            node.clear()

    @rule(which=st.booleans(), data=st.data(), key=keys)
    def locked_increment(self, which: bool, data: st.DataObject, key: Any) -> None:
        shared, node = self.target(which, data)
        with self.handle(which).lock:
            current = shared.get(key)
            new = current + 1 if type(current) is int else 0
            shared[key] = new
        node[key] = new

    @precondition(lambda self: hasattr(self, "a"))
    @invariant()
    def both_equal_model(self) -> None:
        assert self.a.copy() == self.model
        assert self.b.copy() == self.model
        assert list(self.b.keys()) == list(self.model.keys())

    def big_values(self) -> int:
        """How many of the model's values are in blobs (at least ``threshold`` bytes)."""

        def big(value: Any) -> int:
            if type(value) in (bytes, bytearray):
                return int(0 < self.threshold <= len(value))
            if type(value) in (list, tuple):
                return sum(map(big, value))
            if type(value) is dict:
                return sum(map(big, value.values()))
            return 0

        return big(self.model)

    @precondition(lambda self: hasattr(self, "a") and self.a.stats()["engine"] == "shared memory")
    @invariant()
    def one_blob_per_big_value(self) -> None:
        """Blobs are reclaimed at once: exactly the model's big values have one.
        (Shared memory only: the Redis engine keeps every value inline; a dict
        kept in files reclaims them at its dumps, below.)"""
        if getattr(self, "path", None):
            return
        present = [e for e in os.listdir("/dev/shm") if e.startswith(self.name + "@b")]
        assert len(present) == self.big_values(), (present, self.model)

    def teardown(self) -> None:
        if hasattr(self, "a"):
            self.b.close()
            self.a.close()


class TwoHandlesInFiles(TwoHandles):
    """The machine on a dict kept in files (``path=``), in each sync policy, with
    reboots: both handles closed and reopened with the control segment gone,
    after a clean close (the files as it left them) or as a crash leaves them
    (no ``clean``: recovery replays the stream and writes a checkpoint).  The
    dict must come back as the model after either."""

    base = ""  # (the test's directory, set by the test)

    @initialize(
        buffer_size=st.sampled_from([64, 512, 4096]),
        threshold=st.sampled_from([0, 256, 2048]),
        sync=st.sampled_from(["never", "interval", "always"]),
    )
    def open(self, buffer_size: int, threshold: int, sync: str) -> None:
        self.name = unique_name("sm")
        self.path = os.path.join(self.base, self.name)
        self.threshold = threshold
        self.a = SharedDict(
            path=self.path,
            create=True,
            recurse=True,
            buffer_size=buffer_size,
            blob_threshold=threshold,
            sync=sync,
        )
        self.b = SharedDict(path=self.path, create=False)
        self.model = {}

    @rule(crashed=st.booleans())
    def reboot(self, crashed: bool) -> None:
        self.b.close()
        self.a.close()
        assert not os.path.exists(os.path.join("/dev/shm", control_of(self.path)))
        clean = os.path.join(self.path, D.CLEAN_FILE)
        assert os.path.exists(clean)  # (what the last close writes)
        if crashed:
            os.remove(clean)
        self.a = SharedDict(path=self.path, create=False)
        self.b = SharedDict(path=self.path, create=False)
        if crashed:  # (the checkpoint swept the blobs nothing holds)
            assert len(self.blob_files()) == self.big_values()

    @rule()
    def reattach(self) -> None:
        """One handle closed and opened again while the other keeps the dict open."""
        self.b.close()
        self.b = SharedDict(path=self.path, create=False)

    def blob_files(self) -> list[str]:
        return [
            f for f in os.listdir(self.path) if f.startswith(D.BLOB_PREFIX) and not f.endswith(D.TMP_SUFFIX)
        ]

    @precondition(lambda self: hasattr(self, "a"))
    @invariant()
    def a_blob_file_per_big_value(self) -> None:
        """Every big value has its blob file (those overwritten since the last
        dump may still be there: a dump removes them)."""
        assert len(self.blob_files()) >= self.big_values()

    def teardown(self) -> None:
        if hasattr(self, "a"):
            self.b.close()
            self.a.unlink()
            self.a.close()
            assert not os.path.exists(self.path)


def test_two_handles_on_a_dict_kept_in_files(tmp_path: Any) -> None:
    """The machine on a dict kept in files, with reboots after a clean close and after a crash."""
    TwoHandlesInFiles.base = str(tmp_path)
    run_state_machine_as_test(
        TwoHandlesInFiles, settings=settings(max_examples=60, stateful_step_count=50, deadline=None)
    )


def test_two_handles(each_backend: str) -> None:
    """The machine on every engine (conftest: each_backend)."""
    run_state_machine_as_test(
        TwoHandles,
        settings=settings(
            max_examples=60 if each_backend == "shm" else 30, stateful_step_count=40, deadline=None
        ),
    )
