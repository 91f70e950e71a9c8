"""The dict interface of SharedDict, one process, two handles where it matters."""

from __future__ import annotations

import collections
import collections.abc
import datetime
import os
import pickle
import sys
from decimal import Decimal

import pytest

from ultradict_ng import (
    AlreadyExists,
    Closed,
    InvalidName,
    NotFound,
    ParameterMismatch,
    PathGone,
    SharedDict,
    SharedDictError,
    Unlinked,
    UnsupportedType,
    unlink_by_name,
)
from ultradict_ng._codec import codec
from ultradict_ng._engine import BlobGone, Conflict

#: Runs on every engine (conftest: each_backend); shm_only tests are about shared memory.
pytestmark = pytest.mark.usefixtures("each_backend")


@pytest.fixture
def pair(name):
    a = SharedDict(name=name, create=True)
    b = SharedDict(name=name, create=False)
    yield a, b
    b.close()
    a.close()


def test_basic_roundtrip_between_handles(pair):
    a, b = pair
    a["x"] = 1
    assert b["x"] == 1
    b["y"] = [1, 2]
    assert a["y"] == [1, 2]
    del a["x"]
    assert "x" not in b
    assert len(b) == 1
    assert isinstance(a, collections.abc.MutableMapping)


def test_full_dict_interface_matches_dict(pair):
    a, b = pair
    model = {}
    for d in (a, model):
        d["k1"] = 1
        d.update({"k2": 2}, k3=3)
        d.update([("k4", 4)])
        assert d.setdefault("k5", 5) == 5
        assert d.setdefault("k1", 99) == 1
        assert d.pop("k2") == 2
        assert d.pop("nope", "dflt") == "dflt"
        d |= {"k6": 6}
    assert b == model
    assert b.copy() == model and type(b.copy()) is dict
    assert list(b) == list(model)
    assert list(b.keys()) == list(model.keys())
    assert list(b.values()) == list(model.values())
    assert list(b.items()) == list(model.items())
    assert list(reversed(b)) == list(reversed(model))
    assert (b | {"z": 0}) == (model | {"z": 0})
    assert ({"z": 0} | b) == ({"z": 0} | model)
    assert b.get("k1") == 1 and b.get("missing") is None and b.get("missing", 7) == 7
    assert "k1" in b.keys() and ("k1", 1) in b.items() and 1 in b.values()
    assert b.keys() & {"k1", "zz"} == {"k1"}
    assert a.popitem() == model.popitem()
    assert b == model
    a.clear()
    assert len(b) == 0 and b == {}
    with pytest.raises(KeyError):
        a.popitem()
    with pytest.raises(KeyError):
        a.pop("missing")
    with pytest.raises(KeyError):
        del a["missing"]
    with pytest.raises(KeyError):
        a["missing"]
    assert a != {"x": 1}
    assert a == SharedDict(name=a.name)  # same dict, another handle
    with pytest.raises(TypeError):
        hash(a)


def test_initial_data_and_positional_forms(name):
    d = SharedDict({"a": 1, "b": [2]}, name=name)
    try:
        assert d == {"a": 1, "b": [2]}
        # An attacher's initial data does not overwrite: data is applied by the creator only.
        e = SharedDict({"a": 100}, name=name)
        assert e["a"] == 1
        e.close()
        f = SharedDict(name)  # name positionally
        assert f["a"] == 1
        f.close()
    finally:
        d.close()
    g = SharedDict([("k", "v")], name, True)
    assert g == {"k": "v"}
    g.close()
    h = SharedDict.fromkeys(["p", "q"], 0, name=name)
    assert h == {"p": 0, "q": 0}
    h.close()


def test_keyword_arguments_are_data_like_dict(name):
    """SharedDict(x=1) and SharedDict(mapping, **kw) take data as dict() does."""
    d = SharedDict(x=1, y=[2])
    try:
        assert d == dict(x=1, y=[2]) and list(d) == ["x", "y"]
    finally:
        d.close()
    e = SharedDict({"a": 1, "b": 2}, b=3, c=4, name=name)  # keywords after, and over, the mapping
    try:
        assert e.copy() == dict({"a": 1, "b": 2}, b=3, c=4) and list(e) == ["a", "b", "c"]
        assert e.name == name  # parameters are not data
        f = SharedDict([("p", 1)], name=name, q=2)  # an attacher's data is ignored, as a mapping's
        assert f == e
        f.close()
    finally:
        e.close()
    # A key named like a parameter goes in the mapping.
    g = SharedDict({"name": "n", "create": 1, "recurse": 2})
    try:
        assert g.copy() == {"name": "n", "create": 1, "recurse": 2} and g.name != "n"
    finally:
        g.close()
    with pytest.raises(TypeError):
        SharedDict([([1], 2)], name=name)  # an unhashable key, refused as dict() refuses it
    with pytest.raises(UnsupportedType):
        SharedDict(name=name, x=object())  # refused, and nothing is left behind
    assert not os.path.exists(f"/dev/shm/{name}")


class _Counters(SharedDict):
    """A subclass whose constructor takes no data (the fromkeys case dict.fromkeys covers)."""

    def __init__(self, name=None):
        super().__init__(name=name, recurse=False)


def test_fromkeys_calls_cls_like_dict_fromkeys(name):
    d = _Counters.fromkeys(["a", "b"], 0, name=name)
    try:
        assert type(d) is _Counters and d == {"a": 0, "b": 0}
        other = SharedDict(name=name)
        assert other.copy() == {"a": 0, "b": 0}
        other.close()
    finally:
        d.close()
    e = SharedDict.fromkeys("xy")
    try:
        assert type(e) is SharedDict and e.copy() == dict.fromkeys("xy")
    finally:
        e.close()


def test_fromkeys_sets_each_key_through_the_subclass_setitem(name):
    """As dict.fromkeys on a dict subclass: cls(), then the made object's own
    __setitem__ per key -- or whatever mapping the subclass's __new__ returns."""
    seen = []

    class Logged(SharedDict):
        def __setitem__(self, key, value):
            seen.append(key)
            super().__setitem__(key, value * 2)

    d = Logged.fromkeys(iter("ab"), 1, name=name)
    try:
        assert type(d) is Logged and seen == ["a", "b"] and d == {"a": 2, "b": 2}
    finally:
        d.close()

    class Elsewhere(SharedDict):
        def __new__(cls):
            return collections.UserDict()

    other = Elsewhere.fromkeys("ab")
    assert type(other) is collections.UserDict and other == {"a": None, "b": None}


@pytest.mark.shm_only
def test_stats_reports_the_shared_state(name):
    d = SharedDict({"a": 1}, name=name, buffer_size=4096)
    other = SharedDict(name=name)
    try:
        st = d.stats()
        assert st["name"] == name and st["engine"] == "shared memory"
        assert st["serializer"] == "msgpack" and st["keys"] == 1 and st["stream_size"] == 4096
        assert st["generation"] == 0 and st["stream_end"] > 0 and st["lock_holder_pid"] is None
        d._store.force_dump()
        with d.lock:
            st = other.stats()
            assert st["lock_holder_pid"] == os.getpid() and st["generation"] == 1
            assert st["stream_end"] == 0
    finally:
        other.close()
        d.close()
    with pytest.raises(Closed):
        d.stats()


def test_generated_name_and_repr():
    d = SharedDict({"a": 1})
    try:
        assert d.name.startswith("udng_")
        assert repr(d) == f"SharedDict({{'a': 1}}, name={d.name!r})"
    finally:
        d.close()
    assert "closed" in repr(d)


def test_returned_values_are_copies(pair):
    a, b = pair
    a["l"] = [1, [2]]
    got = b["l"]
    got.append(3)
    got[1].append(4)
    assert b["l"] == [1, [2]]
    a["s"] = {1, 2}
    s = b["s"]
    s.add(3)
    assert b["s"] == {1, 2}
    a["ba"] = bytearray(b"xy")
    ba = b["ba"]
    ba[0] = 0
    assert b["ba"] == bytearray(b"xy")
    # The caller's object is not aliased by the cache either.
    mine = [1]
    a["m"] = mine
    mine.append(2)
    assert a["m"] == [1]


def test_types_roundtrip_exactly(pair):
    a, b = pair
    values = {
        "none": None,
        "t": True,
        "big": 2**100,
        "neg": -(2**70),
        "f": 1.5,
        "s": "ü",
        "b": b"\x00",
        "ba": bytearray(b"x"),
        "tup": (1, (2, 3)),
        "l": [1, "a"],
        "set": {1, 2},
        "fs": frozenset({3}),
        "c": 1 + 2j,
        "dec": Decimal("1.10"),
        "dt": datetime.datetime(2020, 1, 2, 3, 4, 5, 6),
        "dtz": datetime.datetime(2020, 1, 2, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
        "date": datetime.date(2021, 5, 6),
        "time": datetime.time(1, 2, 3),
        "td": datetime.timedelta(days=-1, seconds=5),
        "tz": datetime.timezone.utc,
    }
    a.update(values)
    for k, v in values.items():
        assert b[k] == v and type(b[k]) is type(v), k
    a[(1, "x")] = "tuple key"
    a[frozenset({1})] = "fs key"
    a[None] = "none key"
    a[2**80] = "big int key"
    assert b[(1, "x")] == "tuple key"
    assert type(next(k for k in b if isinstance(k, tuple))) is tuple
    assert b[frozenset({1})] == "fs key" and b[None] == "none key" and b[2**80] == "big int key"


def test_unsupported_types_change_nothing(pair):
    a, b = pair
    a["keep"] = 1
    before = b.copy()

    class Custom:
        pass

    with pytest.raises(UnsupportedType) as info:
        a["x"] = Custom()
    assert isinstance(info.value, TypeError) and "pickle" in str(info.value)
    with pytest.raises(TypeError):
        a.update({"ok": 1, "bad": [object()]})
    with pytest.raises(TypeError):
        a[["unhashable"]] = 1
    with pytest.raises(TypeError):
        a[Custom()] = 1
    assert a.copy() == before and b.copy() == before


def _nested(kind, depth):
    value = 0
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value} if kind == "dict" else (value,)
    return value


@pytest.mark.parametrize("serializer", ["msgpack", "pickle"])
def test_the_deepest_value_stored_reads_back_from_any_call_depth(name, serializer):
    """What a serializer accepts must read back -- even from deep in a call stack,
    where a copy taking a frame per level would raise RecursionError."""
    d = SharedDict(name=name, serializer=serializer)
    other = SharedDict(name=name)
    try:
        depth = codec.MAX_NESTING + 1
        while True:  # the deepest list this serializer stores here
            depth -= 1 if serializer == "msgpack" else 25
            try:
                d["deep"] = _nested("list", depth)
                break
            except UnsupportedType:
                continue
        assert depth > 100

        def read_at(stack_depth, handle):
            return read_at(stack_depth - 1, handle) if stack_depth else handle["deep"]

        for handle in (d, other):
            for stack_depth in (0, sys.getrecursionlimit() - 150):
                got = read_at(stack_depth, handle)
                assert got == _nested("list", depth)
    finally:
        other.close()
        d.close()


@pytest.mark.parametrize("recurse", [False, True], ids=["root", "nested-view"])
@pytest.mark.parametrize("serializer", ["msgpack", "pickle"])
def test_too_deeply_nested_values_raise_unsupported_type_and_change_nothing(name, serializer, recurse):
    """Far deeper than either serializer takes (msgpack: MAX_NESTING, pickle: the
    recursion limit): UnsupportedType, never RecursionError or a crash, and no change."""
    a = SharedDict(name=name, create=True, serializer=serializer, recurse=recurse)
    b = SharedDict(name=name, create=False)
    try:
        a["keep"] = 1
        a["sub"] = {"inner": [2]}
        target = a["sub"] if recurse else a
        before = b.copy()
        # Keys stay shallower: hashing a tuple recurses in C once per level.
        deep_key = _nested("tuple", 20_000)
        attempts = [
            lambda v: target.__setitem__("x", v),
            lambda v: target.update({"ok": 1, "x": v}),
            lambda v: target.update([("ok", 1)], x=v),
            lambda v: target.setdefault("x", v),
            lambda v: target.__setitem__("x", {"ok": [v]}),
        ]
        for kind in ("list", "dict", "tuple"):
            deep = _nested(kind, 100_000)
            for attempt in attempts:
                with pytest.raises(UnsupportedType) as info:
                    attempt(deep)
                assert "nested" in str(info.value) and "RecursionError" not in str(info.value)
            del deep
        for attempt in (
            lambda: target.__setitem__(deep_key, 1),
            lambda: target.update({"ok": 1, deep_key: 1}),
            lambda: target.setdefault(deep_key, 1),
            lambda: target.__setitem__(("ok", deep_key), 1),
        ):
            with pytest.raises(UnsupportedType):
                attempt()
        assert a.copy() == before and b.copy() == before
        assert "x" not in target and "ok" not in target
        target["after"] = 3  # still usable, and seen by the other handle
        assert (b["sub"]["after"] if recurse else b["after"]) == 3
    finally:
        b.close()
        a.close()


def test_pickle_serializer_opt_in(name):
    d = SharedDict(name=name, serializer="pickle")
    try:
        d["x"] = collections.OrderedDict(a=1)
        e = SharedDict(name=name)
        assert e.serializer == "pickle"
        assert type(e["x"]) is collections.OrderedDict
        e.close()
    finally:
        d.close()


def test_create_flags(name):
    with pytest.raises(NotFound) as info:
        SharedDict(name=name, create=False)
    assert isinstance(info.value, FileNotFoundError)
    d = SharedDict(name=name, create=True)
    try:
        with pytest.raises(AlreadyExists) as info2:
            SharedDict(name=name, create=True)
        assert isinstance(info2.value, FileExistsError)
    finally:
        d.close()


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 300, "sp ace", "at@sign", 5, b"bytes"])
def test_invalid_names(bad):
    with pytest.raises((InvalidName, TypeError)) as info:
        SharedDict(name=bad) if not isinstance(bad, (int, bytes)) else SharedDict(name=bad)  # type: ignore[arg-type]
    assert isinstance(info.value, (ValueError, TypeError))
    assert str(info.value)


def test_parameter_mismatch(name):
    d = SharedDict(name=name, recurse=True, buffer_size=8192)
    try:
        for kwargs in ({"recurse": False}, {"buffer_size": 4096}, {"serializer": "pickle"}):
            with pytest.raises(ParameterMismatch) as info:
                SharedDict(name=name, **kwargs)
            assert isinstance(info.value, ValueError)
        e = SharedDict(name=name, recurse=True, buffer_size=8192, serializer="msgpack")
        assert e.recurse and e.buffer_size == 8192
        e.close()
        f = SharedDict(name=name)
        assert f.recurse
        f.close()
    finally:
        d.close()


def test_closed_handle_raises(name):
    d = SharedDict(name=name)
    d["a"] = 1
    d.close()
    d.close()  # idempotent
    for op in (
        lambda: d["a"],
        lambda: d.__setitem__("a", 2),
        lambda: len(d),
        lambda: list(d),
        lambda: d.lock,
        lambda: d.update(a=1),
        lambda: d.unlink(),
    ):
        with pytest.raises(Closed):
            op()
    assert d.closed


def test_auto_unlink_rules(name, each_backend):
    d = SharedDict(name=name)  # creator: auto_unlink defaults to True
    e = SharedDict(name=name)  # attacher: False
    e["a"] = 1
    e.close()
    assert SharedDict(name=name, create=False)["a"] == 1
    d.close()
    with pytest.raises(NotFound):
        SharedDict(name=name, create=False)
    keep = SharedDict(name=name, auto_unlink=False)
    keep["a"] = 2
    keep.close()
    again = SharedDict(name=name, create=False)
    assert again["a"] == 2
    again.close()
    assert unlink_by_name(name) == (2 if each_backend == "shm" else 3)  # control+stream; meta+snap+log
    assert unlink_by_name(name) == 0


def test_garbage_collected_creator_unlinks(name):
    import gc

    SharedDict({"a": 1}, name=name)
    gc.collect()
    with pytest.raises(NotFound):
        SharedDict(name=name, create=False)


@pytest.mark.shm_only
def test_unlink_then_writes_raise_reads_keep_last_state(name):
    d = SharedDict(name=name)
    e = SharedDict(name=name)
    d["a"] = 1
    assert e["a"] == 1
    assert d.unlink() == 2
    assert e["a"] == 1
    with pytest.raises(Unlinked):
        e["b"] = 2
    with pytest.raises(Unlinked):
        d["b"] = 2
    e.close()
    d.close()


def test_unlink_counts_every_segment(name):
    d = SharedDict(name=name, buffer_size=64)
    d["big"] = "x" * 1000  # larger than the stream: goes through a dump
    assert d["big"] == "x" * 1000
    assert SharedDict.unlink_by_name(name) == 3  # control, stream, dump
    d.close()


def test_large_values_bigger_than_stream(pair):
    a, b = pair
    blob = b"\x01" * (3 << 20)  # 3 MiB through a 1 MiB stream
    a["blob"] = blob
    assert b["blob"] == blob
    a["small"] = 1
    assert b["small"] == 1 and b["blob"] == blob


def test_nested_views(name):
    d = SharedDict(name=name, recurse=True)
    e = SharedDict(name=name)
    try:
        d["a"] = {"b": {"c": 1}}
        inner = e["a"]["b"]
        assert isinstance(inner, SharedDict) and inner.path == ("a", "b")
        inner["c"] += 1
        d["a"]["b"]["d"] = [1]
        assert d == {"a": {"b": {"c": 2, "d": [1]}}}
        assert e.copy() == {"a": {"b": {"c": 2, "d": [1]}}}
        with d.lock:
            d["a"]["n"] = d["a"].get("n", 0) + 1
        assert e["a"]["n"] == 1
        view = e["a"]
        del d["a"]
        with pytest.raises(PathGone) as info:
            view["b"]
        assert isinstance(info.value, KeyError) and isinstance(info.value, SharedDictError)
        with pytest.raises(PathGone):
            view["x"] = 1
        d["a"] = {"fresh": True}
        assert view == {"fresh": True}  # a view follows its path
        p = pickle.loads(pickle.dumps(e["a"]))
        assert p.path == ("a",) and p["fresh"] is True
        p.close()
    finally:
        e.close()
        d.close()


def test_without_recurse_nested_dicts_are_copies(pair):
    a, b = pair
    a["n"] = {"x": 1}
    got = b["n"]
    assert type(got) is dict
    got["x"] = 2
    assert a["n"] == {"x": 1}


def test_iteration_while_writing_same_process(pair):
    a, b = pair
    a.update({i: i for i in range(100)})
    seen = []
    for k in b:
        a[1000 + k] = k  # writes during iteration: the snapshot is unaffected
        del a[k]
        seen.append(k)
        b.get(0)  # forces syncs inside the loop
    assert seen == list(range(100))
    for _ in b.items():
        a.clear()
    assert len(b) == 0


def test_many_dumps_keep_data(name):
    d = SharedDict(name=name, buffer_size=256)
    e = SharedDict(name=name)
    try:
        for i in range(500):
            d[i % 37] = i
            if i % 50 == 0:
                assert e.copy() == d.copy()
        assert e.copy() == {k: max(i for i in range(500) if i % 37 == k) for k in range(37)}
    finally:
        e.close()
        d.close()


def test_serializer_object_with_dumps_and_loads(name):
    import json

    d = SharedDict(name=name, serializer=json)
    try:
        d["a"] = [1, "x"]
        with pytest.raises(ParameterMismatch) as info:
            SharedDict(name=name)  # a custom object cannot be found in shared memory
        assert "serializer" in str(info.value)
        e = SharedDict(name=name, serializer=json)
        assert e["a"] == [1, "x"] and e.serializer == "custom:json"
        with pytest.raises(TypeError):
            e["bad"] = object()
        e.close()
    finally:
        d.close()
    p = SharedDict(name=name, serializer=pickle)  # the pickle module means "pickle"
    assert p.serializer == "pickle"
    p.close()
    with pytest.raises(ValueError):
        SharedDict(name=name, serializer=42)


@pytest.mark.shm_only
def test_dump_limit_rejects_oversized_dumps_and_changes_nothing(name):
    from ultradict_ng import OutOfSpace
    from ultradict_ng._engine import Options
    from ultradict_ng._shm.store import Store

    store = Store.open(name, None, Options(buffer_size=64, auto_unlink=True, dump_limit=4096))
    try:
        store.begin_write()
        try:
            store.commit([1, [], "small", "x" * 100])
            with pytest.raises(OutOfSpace):
                store.commit([1, [], "huge", "x" * 10_000])
        finally:
            store.end_write()
        other = SharedDict(name=name)
        assert other.copy() == {"small": "x" * 100}
        with pytest.raises(ParameterMismatch):
            Store.open(name, None, Options(dump_limit=1 << 20))
        other.close()
        assert store.dump_limit == 4096
    finally:
        store.close()


@pytest.mark.shm_only
def test_force_dump_and_reload(name):
    d = SharedDict({"a": 1}, name=name)
    e = SharedDict(name=name)
    gen = d._store.gen
    d._store.force_dump()
    assert d._store.gen == gen + 1 and d._store.pos == 0
    assert e["a"] == 1 and e._store.gen == gen + 1
    e._store.data["a"] = "tampered local cache"
    e._store.reload()
    assert e["a"] == 1
    e.close()
    d.close()


@pytest.mark.shm_only
def test_lock_take_over_from_a_live_holder(name):
    import multiprocessing

    from tests import helpers

    ctx = multiprocessing.get_context("fork")
    d = SharedDict(name=name)
    ready = ctx.Event()
    p = ctx.Process(target=helpers.hold_lock_forever, args=(name, ready))
    p.start()
    try:
        assert ready.wait(10)
        assert not d.lock.acquire(blocking=False)
        d.lock.take_over()  # the holder is alive: only take_over gets the lock
        assert d.lock.held() and d.lock.owner_pid == os.getpid()
        d.lock.release()
    finally:
        p.kill()
        p.join()
    d.close()


# -- the facade's two retry loops, and pickling through the engine interface ---------------


class _LosesRaces:
    """An engine (wrapping a real one) that loses the next race it is armed
    for: its next ``commit`` raises ``Conflict`` (another client committed
    first), its next ``materialize``/``view`` raises ``BlobGone`` (a newer
    state freed the blob).  Counts how often each was raised."""

    def __init__(self, engine):
        self.__dict__.update(engine=engine, lose_commit=False, lose_blob=False, conflicts=0, gone=0)

    def __getattr__(self, attr):
        return getattr(self.engine, attr)

    def __setattr__(self, attr, value):
        if attr in self.__dict__:
            self.__dict__[attr] = value
        else:
            setattr(self.engine, attr, value)

    def commit(self, rec):
        if self.lose_commit:
            self.__dict__.update(lose_commit=False, conflicts=self.conflicts + 1)
            raise Conflict("another client committed first")
        self.engine.commit(rec)

    def _blob(self):
        if self.lose_blob:
            self.__dict__.update(lose_blob=False, gone=self.gone + 1)
            raise BlobGone("a newer state freed it")

    def materialize(self, stored):
        self._blob()
        return self.engine.materialize(stored)

    def view(self, stored):
        self._blob()
        return self.engine.view(stored)


def test_every_checked_write_runs_again_after_a_conflict(name):
    d = SharedDict(name=name, recurse=True)
    try:
        engine = _LosesRaces(d._store)
        h = SharedDict._on_engine(engine)
        h.update({"a": 1, "b": [2], "c": 3, "n": {"x": 1}})
        n = h["n"]
        assert n._store is engine and n.path == ("n",)

        def lose(call):
            engine.lose_commit = True
            result = call()
            assert not engine.lose_commit, "the method never committed"
            return result

        lose(lambda: h.__delitem__("a"))
        assert lose(lambda: h.pop("b")) == [2]
        assert lose(lambda: h.popitem()) == ("n", {"x": 1})
        assert lose(lambda: h.setdefault("d", [4])) == [4]
        h["n"] = {"x": 1}
        n = h["n"]
        lose(lambda: n.__setitem__("y", 2))
        lose(lambda: n.update(z=3))
        assert d.copy() == {"c": 3, "d": [4], "n": {"x": 1, "y": 2, "z": 3}}
        lose(lambda: n.clear())
        assert engine.conflicts == 7
        assert d.copy() == {"c": 3, "d": [4], "n": {}}  # each write landed exactly once
    finally:
        d.close()


def test_every_read_of_a_large_value_runs_again_when_its_blob_is_gone(name):
    np = pytest.importorskip("numpy")
    arr = np.arange(4096, dtype=np.int64)
    d = SharedDict({"arr": arr, "more": [arr]}, name=name)
    try:
        engine = _LosesRaces(d._store)
        h = SharedDict._on_engine(engine)

        def lose(call):
            engine.lose_blob = True
            result = call()
            assert not engine.lose_blob, "the read never needed the blob"
            return result

        assert np.array_equal(lose(lambda: h["arr"]), arr)
        assert np.array_equal(lose(lambda: h.get("arr")), arr)
        assert lose(lambda: h.view("arr")).nbytes == arr.nbytes
        assert np.array_equal(lose(lambda: list(h.values()))[0], arr)
        assert np.array_equal(lose(lambda: dict(h.items()))["more"][0], arr)
        assert np.array_equal(lose(lambda: h.copy())["arr"], arr)
        assert engine.gone == 6
    finally:
        d.close()


def test_a_pickled_handle_reopens_with_what_its_engine_says(name):
    """__reduce__ carries the engine's reopen_arguments(), whichever engine it is."""
    d = SharedDict({"a": 1}, name=name, recurse=True)
    d["n"] = {"x": 1}
    try:
        where = d._store.reopen_arguments()
        assert "backend" in where
        assert d["n"].__reduce__()[1] == (SharedDict, name, ("n",), where)
        copy = pickle.loads(pickle.dumps(d["n"]))
        assert copy.path == ("n",) and copy == {"x": 1} and type(copy._store) is type(d._store)
        copy.close()
    finally:
        d.close()
