"""The change feed: ``SharedDict.changes()`` yields ``Change(op, path, key, value,
resync)`` items in publish order; a feed that fell behind a full dump yields the
difference between what it had and the dump instead (``resync=True``).

The property test replays every item onto a replica of the feed's starting state
and checks, at each point the feed catches up, that the items are exactly right:
the records since the last catch-up when no dump happened (no resync, nothing
twice); otherwise a resync that turns the replica into exactly the dump's state
(every item a real difference, each (path, key) once), followed by exactly the
records after that dump.  Values are compared type-exactly (``[1]`` is not
``[True]``, ``0.0`` is not ``-0.0``), as the dict stores them.
"""

from __future__ import annotations

import copy
import math
import multiprocessing
import pickle
import threading
import time
from typing import Any, Optional

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests import wait_workers
from tests.conftest import unique_name
from tests.feed_model import (
    apply_change,
    apply_op,
    changes_of,
    node_at,
    same_changes,
    strict_equal,
    take_until,
)
from tests.wait_workers import in_thread, stop
from ultradict_ng import Change, Closed, SharedDict
from ultradict_ng.changes import SUPERSEDED

spawn = multiprocessing.get_context("spawn")


# -- ops in order, values ------------------------------------------------------------------


@pytest.fixture
def pair(name: str):
    d = SharedDict(name=name, recurse=True)
    r = SharedDict(name=name, create=False)
    yield d, r
    r.close()
    d.close()


OPS = [
    ("set", (), "a", 1),
    ("set", (), "n", {"x": 1, "y": {"z": [1, 2]}}),
    ("set", ("n",), "x", 2),
    ("set", ("n", "y"), "z", "deep"),
    ("update", (), [("b", 2), ("c", (3, 4)), ("a", None)]),
    ("update", ("n",), [("u", b"bytes")]),
    ("setdefault", (), "s", [True]),
    ("setdefault", (), "s", "ignored"),
    ("del", (), "b"),
    ("pop", ("n",), "u"),
    ("popitem", ()),
    ("clear", ("n", "y")),
    ("set", (), 7, {"t": (1, 2)}),
    ("clear", ()),
    ("set", (), "after", 1.5),
]


def test_changes_report_every_op_in_order(pair):
    d, r = pair
    r.get("a")
    it = r.changes(timeout=0.3)
    model: dict[Any, Any] = {}
    expected: list[Change] = []
    for op in OPS:
        expected += changes_of(model, op)
        assert apply_op(d, op) == apply_op(model, op)
    got = list(it)
    assert same_changes(got, expected), got
    replica: dict[Any, Any] = {}
    for ch in got:
        apply_change(replica, ch)
    assert strict_equal(replica, d.copy()) and strict_equal(replica, model)


def test_feed_starts_at_the_state_the_handle_last_saw(pair):
    d, r = pair
    d["a"] = 1
    assert r["a"] == 1  # r saw this state...
    d["b"] = 2  # ...not this one, made before changes() is called
    it = r.changes(timeout=0.2)
    d["c"] = 3
    assert list(it) == [Change("set", (), "b", 2), Change("set", (), "c", 3)]
    assert list(d.changes(timeout=0.1)) == []  # the writer saw everything


def test_a_nested_view_feeds_the_whole_tree(pair):
    d, r = pair
    d["n"] = {"x": 1}
    view = r["n"]
    it = view.changes(timeout=0.2)
    d["other"] = 1
    d["n"]["x"] = 2
    assert list(it) == [Change("set", (), "other", 1), Change("set", ("n",), "x", 2)]


def test_arrays_and_large_values_come_through(dicts, name):
    np = pytest.importorskip("numpy")
    d = dicts(name=name, blob_threshold=1024)
    r = SharedDict(name=name, create=False)
    r.get("x")
    it = r.changes(timeout=0.3)
    values = {
        "small": np.arange(3, dtype=np.int16),
        "arr": np.arange(1000, dtype=np.float64).reshape(10, 100),
        "big": b"x" * 5000,
        "ba": bytearray(b"y" * 2000),
        "mv": memoryview(b"z" * 3000),
        "nested": [np.ones(400, dtype=np.int32), b"w" * 1500],
    }
    for k, v in values.items():
        d[k] = v
    d["gone"] = b"1" * 5000
    d["gone"] = b"2" * 5000  # drops the first blob before the feed reads it
    got = list(it)
    assert [(c.op, c.key) for c in got] == [("set", k) for k in values] + [("set", "gone")] * 2
    by_key = {c.key: c.value for c in got[: len(values)]}
    for k in ("small", "arr"):
        assert type(by_key[k]) is np.ndarray and by_key[k].dtype == values[k].dtype
        assert np.array_equal(by_key[k], values[k])
    assert by_key["big"] == values["big"] and type(by_key["big"]) is bytes
    assert by_key["ba"] == values["ba"] and type(by_key["ba"]) is bytearray
    assert by_key["mv"] == b"z" * 3000 and type(by_key["mv"]) is bytes
    assert np.array_equal(by_key["nested"][0], values["nested"][0]) and by_key["nested"][1] == b"w" * 1500
    assert got[-2].value is SUPERSEDED and got[-1].value == b"2" * 5000
    r.close()
    d.close()


@pytest.mark.parametrize("dropped_by", ["del", "pop", "overwrite", "clear"])
def test_a_large_value_dropped_before_the_feed_reads_it_is_superseded_on_the_writers_feed(
    dicts, name, dropped_by
):
    """The feed of the handle that wrote (up to date with the dict) replays a
    large value a later write dropped: ``SUPERSEDED``, judged by the feed's
    own position, not its handle's (which saw the drop: a damaged dict)."""
    d = dicts(name=name, blob_threshold=256)
    feed = d.changes(timeout=0)
    d["k"] = b"x" * 1000
    if dropped_by == "del":
        del d["k"]
    elif dropped_by == "pop":
        d.pop("k")
    elif dropped_by == "overwrite":
        d["k"] = 1
    else:
        d.clear()
    got = list(feed)
    assert got[0] == Change("set", (), "k", SUPERSEDED) and len(got) == 2, got
    d.close()


# -- resync --------------------------------------------------------------------------------


def resync_after(d: SharedDict, before: dict[Any, Any], after: dict[Any, Any]) -> list[Change]:
    """Set ``before``, start a feed, change to ``after`` with a dump in between: the items."""
    d.clear()
    d.update(before)
    feed = d._store.feed()
    d.clear()
    d.update(after)
    d._store.force_dump()
    return feed.poll()


@pytest.mark.parametrize(
    "old, new",
    [([1], [True]), ([True], [1.0]), (0.0, -0.0), ((1,), (1.0,)), ({"x": [0]}, {"x": [False]})],
    ids=["1-True", "True-1.0", "zero-sign", "tuple-1.0", "nested-0-False"],
)
def test_resync_reports_type_exact_differences(name, old, new):
    """A value that changed into an equal-comparing value of other types while the
    feed was behind a dump is a difference: the replica must end as the dict is."""
    d = SharedDict(name=name, recurse=True, buffer_size=4096)
    try:
        got = resync_after(d, {"k": old, "same": 1}, {"k": new, "same": 1})
        replica = {"k": copy.deepcopy(old), "same": 1}
        for ch in got:
            assert ch.resync
            apply_change(replica, ch)
        assert strict_equal(replica, d.copy()), (replica, d.copy(), got)
    finally:
        d.close()


def test_a_resync_gives_nested_changes_where_their_key_is(name):
    """Depth first, in the dict's key order: the key written last (a marker a
    writer sets after the rest, as ``done``) is the batch's last item, so a
    reader that stops there has applied every nested change before it."""
    d = SharedDict(name=name, recurse=True, buffer_size=4096)
    try:
        got = resync_after(
            d,
            {"w0": {"a": 1, "n": {"x": 1}}, "w1": {"b": 1}, "gone": 1},
            {"w0": {"a": 2, "n": {"x": 2}}, "w1": {"b": 2, "c": 3}, "done": True},
        )
        assert [(ch.op, ch.path, ch.key) for ch in got] == [
            ("delete", (), "gone"),
            ("set", ("w0",), "a"),
            ("set", ("w0", "n"), "x"),
            ("set", ("w1",), "b"),
            ("set", ("w1",), "c"),
            ("set", (), "done"),
        ]
    finally:
        d.close()


_trees = st.recursive(
    st.dictionaries(st.sampled_from("abcde"), st.integers(0, 2), max_size=5),
    lambda inner: st.dictionaries(st.sampled_from("abcde"), st.one_of(st.integers(0, 2), inner), max_size=5),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(old=_trees, new=_trees)
def test_a_replica_of_a_resync_holds_the_dump(old, new):
    """Applying the resync from any tree to any other gives the other, sending
    only what changed: a key deleted and set again with its value while the
    feed was behind is not sent, and keeps its old place in the replica."""
    import pickle

    from ultradict_ng.changes import changes_of_dump

    out: list[Change] = []
    changes_of_dump(out, copy.deepcopy, pickle.dumps, old, new)
    replica = copy.deepcopy(old)
    for ch in out:
        assert ch.op == "delete" or node_at(old, ch.path).get(ch.key, object()) != ch.value, ch
        apply_change(replica, ch)
    assert replica == new, out
    assert len({(ch.path, ch.key) for ch in out}) == len(out), out


@pytest.mark.parametrize("unchanged", ["inline-array", "nan", "blob-array"])
def test_resync_never_reports_an_unchanged_value(name, unchanged):
    np = pytest.importorskip("numpy")
    value = {
        "inline-array": lambda: np.arange(4),
        "nan": lambda: [math.nan],
        "blob-array": lambda: np.arange(2000),
    }[unchanged]()
    d = SharedDict(name=name, buffer_size=4096, blob_threshold=8000)
    try:
        d["v"] = value
        d["k"] = 0
        feed = d._store.feed()
        d["k"] = 1
        d._store.force_dump()
        assert feed.poll() == [Change("set", (), "k", 1, True)]
    finally:
        d.close()


def test_no_resync_when_the_feed_is_not_behind_a_dump(dicts, name):
    d = dicts(name=name, buffer_size=4096)
    d.update({f"k{i}": i for i in range(20)})
    feed = d._store.feed()
    gen = d._store.gen
    for i in range(10):
        d[f"k{i}"] = -i
        assert feed.poll() == [Change("set", (), f"k{i}", -i)]
    assert d._store.gen == gen
    d._store.force_dump()  # nothing changed since the feed's last poll: nothing to report
    assert feed.poll() == []


# -- the property test ---------------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "c", 1])
#: Mostly values that compare equal across types (1 == True == 1.0, 0.0 == -0.0).
SCALARS = st.sampled_from([True, 1, 1.0, False, 0, 0.0, -0.0, None, "x", b"x"])
LEAVES = st.one_of(SCALARS, st.lists(SCALARS, max_size=2), st.lists(SCALARS, max_size=2).map(tuple))
VALUES = st.one_of(LEAVES, LEAVES, st.dictionaries(KEYS, LEAVES, max_size=2))


_TWIN = {
    (bool, True): 1,
    (int, 1): 1.0,
    (float, 1.0): True,
    (bool, False): 0,
    (int, 0): 0.0,
    (float, 0.0): -0.0,
}


def twin(value: Any) -> Any:
    """A value equal to ``value`` (==) but not the same: 1 for True, 1.0 for 1, ... inside too."""
    if type(value) in (list, tuple):
        return type(value)(twin(v) for v in value)
    if type(value) is dict:
        return {k: twin(v) for k, v in value.items()}
    if type(value) is float and repr(value) == "-0.0":
        return False
    return _TWIN.get((type(value), value), value)


def paths(model: dict[Any, Any], path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    for k, v in model.items():
        if type(v) is dict:
            out += paths(v, path + (k,))
    return out


def draw_op(data: Any, model: dict[Any, Any]) -> tuple[Any, ...]:
    path = data.draw(st.sampled_from(paths(model)))
    node = node_at(model, path)
    kinds = ["set", "set", "set", "update", "setdefault", "clear", "dump", "poll", "poll"]
    if node:
        kinds += ["del", "pop", "popitem", "twin", "twin"]
    kind = data.draw(st.sampled_from(kinds))
    if kind == "twin":  # the same key, a value that compares equal but differs in type
        key = data.draw(st.sampled_from(list(node)))
        return ("set", path, key, twin(node[key]))
    if kind in ("set", "setdefault"):
        return (kind, path, data.draw(KEYS), data.draw(VALUES))
    if kind in ("del", "pop"):
        return (kind, path, data.draw(st.sampled_from(list(node))))
    if kind == "update":
        return (kind, path, list(data.draw(st.dictionaries(KEYS, VALUES, min_size=1, max_size=3)).items()))
    return (kind, path) if kind in ("popitem", "clear") else (kind,)


class Checker:
    """Follows one feed; at each catch-up checks the items against what was published."""

    def __init__(self, d: SharedDict) -> None:
        self.d = d
        self.replica = d.copy()  # the feed starts at the writer's state
        self.it = d.changes(timeout=5)
        self.records: list[Change] = []  # published as records since the feed's last catch-up
        self.dumped: Optional[dict[Any, Any]] = None  # state of the newest dump since then
        self.marks = 0

    def published(self, op_changes: list[Change], model: dict[Any, Any], gen_before: int) -> None:
        if self.d._store.gen != gen_before:  # the op went into a dump, not a record
            self.dumped = copy.deepcopy(model)
            self.records = []
        else:
            self.records += op_changes

    def catch_up(self, model: dict[Any, Any]) -> None:
        d = self.d
        self.marks += 1
        while True:  # the mark must be a record: the last item of the feed's next batch
            gen = d._store.gen
            mark = Change("set", (), "_mark", self.marks)
            d["_mark"] = model["_mark"] = self.marks
            self.published([mark], model, gen)
            if self.dumped is None or self.records:
                break
            self.marks += 1
        got = take_until(self.it, self.records[-1])
        if self.dumped is None:
            assert same_changes(got, self.records), ("no dump since the last catch-up", got, self.records)
        else:
            n = len(got) - len(self.records)
            resync, tail = got[:n], got[n:]
            assert all(c.resync for c in resync) and same_changes(tail, self.records), (got, self.records)
            targets = [(c.path, c.key) for c in resync]
            assert len(set(map(repr, targets))) == len(targets), ("a resync item twice", resync)
            for ch in resync:
                node = node_at(self.replica, ch.path)
                if ch.op == "set":
                    assert ch.key not in node or not strict_equal(node[ch.key], ch.value), ("no change", ch)
                else:
                    assert ch.op == "delete" and ch.key in node, ch
                apply_change(self.replica, ch)
            assert strict_equal(self.replica, self.dumped), ("resync does not give the dump", got)
            got = tail
        for ch in got:
            apply_change(self.replica, ch)
        assert strict_equal(self.replica, model), (self.replica, model)
        self.records, self.dumped = [], None


# No shrinking: a failure's draws are long, but the assertion shows the replica and the
# dump side by side, and shrinking these examples takes minutes.
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
@given(data=st.data(), buffer_size=st.sampled_from([64, 256, 4096]), steps=st.integers(5, 40))
def test_feed_replays_exactly_what_was_published(data, buffer_size, steps):
    d = SharedDict(name=unique_name(), recurse=True, buffer_size=buffer_size)
    try:
        model: dict[Any, Any] = {"_mark": 0}
        d.update(model)
        checker = Checker(d)
        for _ in range(steps):
            op = draw_op(data, model)
            if op[0] == "poll":
                checker.catch_up(model)
                continue
            gen = d._store.gen
            seen = d._store.seen
            op_changes = changes_of(model, op)
            assert apply_op(d, op) == apply_op(model, op)
            if d._store.seen != seen:  # published (a setdefault of a present key is not)
                checker.published(op_changes, model, gen)
        checker.catch_up(model)
        assert strict_equal(checker.replica, d.copy())
    finally:
        d.close()


# -- across processes, threads; unlink, close, timeouts ------------------------------------


def writer_ops(n: int) -> list[tuple[Any, ...]]:
    ops: list[tuple[Any, ...]] = [("set", (), "n", {})]
    for i in range(n):
        ops.append(("set", (), f"k{i % 7}", [i, "v" * (i % 5)]))
        if i % 3 == 0:
            ops.append(("update", ("n",), [(f"u{i % 4}", i), ("last", i)]))
        if i % 11 == 0:
            ops.append(("clear", ("n",)))
        if i % 5 == 4:
            ops.append(("del", (), f"k{(i - 1) % 7}"))
    return ops + [("set", (), "_end", True)]


def test_feed_follows_a_writer_in_another_process(dicts, name):
    d = dicts(name=name, recurse=True, buffer_size=1024)  # a dump every few writes
    ops = writer_ops(300)
    it = d.changes(timeout=20)
    p = spawn.Process(target=wait_workers.feed_writer, args=(name, ops))
    p.start()
    try:
        got = take_until(it, Change("set", (), "_end", True))
        p.join(30)
        assert p.exitcode == 0
    finally:
        stop(p)
    replica: dict[Any, Any] = {}
    for ch in got:
        apply_change(replica, ch)
    model: dict[Any, Any] = {}
    for op in ops:
        apply_op(model, op)
    assert strict_equal(replica, d.copy()) and strict_equal(replica, model)
    assert any(c.resync for c in got) and not all(c.resync for c in got)


def test_feed_in_another_process_follows_this_one(dicts, name):
    d = dicts(name=name, recurse=True, buffer_size=1024)
    ready, out = spawn.Queue(), spawn.Queue()
    p = spawn.Process(target=wait_workers.feed_follower, args=(name, ready, out, 1.5))
    p.start()
    try:
        ready.get(timeout=60)
        for op in writer_ops(200):
            apply_op(d, op)
        start, items, final = out.get(timeout=30)
        p.join(10)
        assert p.exitcode == 0
    finally:
        stop(p)
    for ch in items:
        apply_change(start, ch)
    assert strict_equal(start, final) and strict_equal(final, d.copy())


def test_several_feeds_in_threads_each_end_equal_to_the_dict(pair):
    d, r = pair
    replicas: list[Any] = []

    # The writer starts once every follower holds its copy: a follower that
    # copied the dict after "_end" was written would wait for it in vain.
    ready = threading.Barrier(4, timeout=20)

    def follow() -> None:
        h = SharedDict(name=d.name, create=False)
        replica = h.copy()
        ready.wait()
        for ch in take_until(h.changes(timeout=10), Change("set", (), "_end", True)):
            apply_change(replica, ch)
        replicas.append(replica)
        h.close()

    threads = [threading.Thread(target=follow) for _ in range(3)]
    for t in threads:
        t.start()
    ready.wait()
    for op in writer_ops(150):
        apply_op(d, op)
        if op[0] == "clear":
            d._store.force_dump()
    for t in threads:
        t.join(20)
    assert len(replicas) == 3 and all(strict_equal(x, d.copy()) for x in replicas)


def test_a_waiting_feed_is_woken_by_a_write(pair, monkeypatch):
    from ultradict_ng._shm import layout as L

    monkeypatch.setattr(L, "WAIT_SLICE", 60.0)  # only a wake-up ends the sleep in time
    d, r = pair
    r.get("a")
    it = r.changes(timeout=10)
    threading.Timer(0.2, lambda: d.__setitem__("a", 1)).start()
    t0 = time.monotonic()
    assert in_thread(lambda: next(it), 10) == Change("set", (), "a", 1)
    assert time.monotonic() - t0 < 2.0


def test_feed_ends_when_the_dict_is_unlinked(pair):
    d, r = pair
    r.get("a")
    got: list[Change] = []
    t = threading.Thread(target=lambda: got.extend(r.changes(timeout=None)))
    t.start()
    d["a"] = 1
    d["b"] = 2
    time.sleep(0.1)
    d.unlink()
    t.join(5)
    assert not t.is_alive(), "the feed did not end when the dict was unlinked"
    assert got == [Change("set", (), "a", 1), Change("set", (), "b", 2)]


def test_feed_timeouts(pair):
    d, r = pair
    with pytest.raises(ValueError):
        r.changes(timeout=-1)
    t0 = time.monotonic()
    assert list(r.changes(timeout=0.2)) == []
    assert 0.2 <= time.monotonic() - t0 < 1.2
    assert list(r.changes(timeout=0)) == []


def test_feed_of_a_closed_handle_raises_closed(pair):
    d, r = pair
    r.get("a")
    it = r.changes(timeout=1)
    d["a"] = 1
    r.close()
    with pytest.raises(Closed):
        in_thread(lambda: next(it), 5)
    with pytest.raises(Closed):
        r.changes()


def test_change_items_are_plain_named_tuples():
    ch = Change("set", ("a",), "k", [1])
    assert ch == ("set", ("a",), "k", [1], False) and ch.resync is False
    assert pickle.loads(pickle.dumps(ch)) == ch
    assert pickle.loads(pickle.dumps(SUPERSEDED)) is SUPERSEDED and repr(SUPERSEDED) == "SUPERSEDED"
