"""Big dicts read in place: a reader's ``TableCache`` (``_shm/tablecache.py``) against a plain dict.

A reader of a table dump of at least ``PARTIAL_FROM`` entries maps it and
decodes only what it touches; the stream's records after the dump change a
small private overlay.  Whatever the mix of table entries, overwrites,
deletes, keys deleted and set again, clears and nested changes, the reader
must be the ``dict`` a plain replica would be: the same keys in the same order
(of the same types), the same values, the same answers for equal keys of other
types (``1``/``1.0``/``True``, ``(1, 2)``/``(1.0, 2)``, an instant in two
zones) -- in this process and in an unrelated interpreter.
"""

from __future__ import annotations

import gc
import os
import pickle
import random
import struct
import subprocess
import sys
import threading
from decimal import Decimal
from typing import Any, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from ultradict_ng import SharedDict, speedups
from ultradict_ng._codec import records as R
from ultradict_ng._codec.codec import codec_for
from ultradict_ng._shm import dumps, tablecache
from ultradict_ng._shm import layout as L
from ultradict_ng._shm.table import Table, hash_key, map_size, write_map
from ultradict_ng._shm.tablecache import TableCache
from ultradict_ng.speedups import apply_simple

from .conftest import soak_scaled, unique_name
from .helpers import count_decodes
from .test_keyhash import KEYS, variants

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ABSENT = "<absent>"

#: Few keys, many of them equal across types: overwrites, deletes and re-sets collide.
POOL = [
    0,
    1,
    1.0,
    True,
    Decimal(1),
    2,
    2.0,
    "a",
    "b",
    b"a",
    (1, 2),
    (1.0, 2),
    frozenset({1, 2}),
    frozenset({2.0, 1}),
    None,
    7,
    "user:00000001",
]
POOL_KEYS = st.one_of(st.sampled_from(POOL), st.integers(-3, 20))
#: Hashable keys of types the serializer refuses: absent from every dict of ours.
UNSUPPORTED = [object(), range(3), (1, object())]
LEAVES = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=4), st.binary(max_size=3))
VALUES = st.one_of(
    LEAVES,
    st.lists(LEAVES, max_size=3).map(tuple),
    st.dictionaries(st.sampled_from(["x", "y", "z"]), LEAVES, max_size=3),
)


def exact(a: Any, b: Any) -> bool:
    """``a == b`` with the same types all the way down (a dict keeps the key object
    it was first given: 1 stays an int when 1.0 overwrites its value)."""
    if type(a) is not type(b) or a != b:
        return False
    if type(a) is tuple:
        return all(exact(x, y) for x, y in zip(a, b))
    return True


def holds_nan(key: Any) -> bool:
    """Whether ``key`` holds a NaN anywhere (a copy of it is then not equal to it)."""
    return pickle.loads(pickle.dumps(key)) != key


def same_keys(got: list[Any], want: list[Any]) -> bool:
    return len(got) == len(want) and all(exact(a, b) for a, b in zip(got, want))


def check_reads(got: Any, model: dict[Any, Any], key: Any) -> None:
    """``got`` answers ``in``, ``get`` and ``[]`` as ``model`` does for ``key``, its
    equal keys of other types, and keys of types no dict of ours holds (absent)."""
    for k in [key] + variants(key):
        assert (k in got) == (k in model), k
        assert got.get(k, ABSENT) == model.get(k, ABSENT), k
    for k in UNSUPPORTED:
        assert k not in got and got.get(k, ABSENT) == ABSENT
        with pytest.raises(KeyError):
            got[k]


def table_cache(data: dict[Any, Any], limit: Optional[int] = None) -> TableCache:
    """A TableCache over a table of ``data`` built in private memory."""
    codec = codec_for("msgpack")
    packed = codec.dumps(data)
    hashes = [hash_key(k) for k in data]
    buf = bytearray(map_size(packed, hashes))
    view = memoryview(buf)
    write_map(view, packed, hashes, 1, 7)
    return TableCache(Table(view, 7), codec.loads, (buf, view), threading.RLock(), limit=limit)


def within_bound(cache: Any) -> None:
    """A bounded TableCache keeps at most its limit of clean rows, and every
    fresh and changed key's value (those the table does not hold)."""
    if type(cache) is TableCache:
        if cache.limit is not None:
            assert cache.clean_rows() <= cache.limit, (cache.clean_rows(), cache.limit)
        assert all(k in cache.hot for k in (*cache.fresh, *cache.changed))


def a_dict_key(data: Any, model: dict[Any, Any]) -> Any:
    """A key of ``model`` whose value is a dict, drawn; ABSENT when none is."""
    dicts = [k for k, v in model.items() if type(v) is dict]
    return data.draw(st.sampled_from(dicts)) if dicts else ABSENT


class TableCacheMachine(RuleBasedStateMachine):
    """A TableCache made from a table, then changed by records as a reader's is."""

    limit: Optional[int] = None  # (max_decoded)

    @initialize(data=st.dictionaries(POOL_KEYS, VALUES, min_size=3, max_size=12))
    def start(self, data: dict[Any, Any]) -> None:
        self.model = dict(data)
        self.cache = table_cache(data, self.limit)

    @rule(key=POOL_KEYS, value=VALUES)
    def set(self, key: Any, value: Any) -> None:
        R.apply(self.cache, R.set_((), key, value))
        self.model[key] = value

    @rule(key=POOL_KEYS)
    def delete(self, key: Any) -> None:
        if key in self.model:
            R.apply(self.cache, R.delete((), key))
            del self.model[key]
            for k in [key] + variants(key):  # (its entry may still be in the table: dead)
                assert self.cache.get(k, ABSENT) == ABSENT and k not in self.cache, k
        else:
            with pytest.raises(R.Inconsistent):
                R.apply(self.cache, R.delete((), key))

    @rule(pairs=st.lists(st.tuples(POOL_KEYS, VALUES), max_size=4))
    def update(self, pairs: list[Any]) -> None:
        R.apply(self.cache, R.update((), [list(p) for p in pairs]))
        self.model.update(pairs)

    @rule()
    def clear(self) -> None:
        R.apply(self.cache, R.clear(()))
        self.model.clear()

    @rule(data=st.data(), inner=st.sampled_from(["x", "y", "w"]), value=LEAVES)
    def nested_set(self, data: Any, inner: str, value: Any) -> None:
        key = a_dict_key(data, self.model)
        if key is not ABSENT:
            R.apply(self.cache, R.set_((key,), inner, value))
            self.model[key][inner] = value

    @rule(
        pairs=st.lists(st.tuples(POOL_KEYS, VALUES), max_size=8),
        lazy=st.booleans(),
        drops=st.lists(st.integers(0, 7), max_size=3),
    )
    def sets(self, pairs: list[Any], lazy: bool, drops: list[int]) -> None:
        """Several set records in a row, then deletes of some of their keys,
        each key read back before any count: keys the compiled set left
        unplaced pile up in ``pending`` (``lazy``: as after a long run of
        sets; else each is placed at once, as after a count), and a delete
        places its own key only, the table's becoming dead."""
        if lazy and type(self.cache) is TableCache:
            self.cache._since = 1 << 20
        for key, value in pairs:
            R.apply(self.cache, R.set_((), key, value))
            self.model[key] = value
        for i in drops:
            if i < len(pairs) and pairs[i][0] in self.model:
                R.apply(self.cache, R.delete((), pairs[i][0]))
                del self.model[pairs[i][0]]
        for key, _ in pairs:
            check_reads(self.cache, self.model, key)

    @rule(key=POOL_KEYS)
    def read(self, key: Any) -> None:
        check_reads(self.cache, self.model, key)

    @invariant()
    def same_dict(self) -> None:
        within_bound(self.cache)
        if type(self.cache) is TableCache:  # (pending: the keys marked True, in the order of
            # their last listing; a key deleted since may stay listed, unmarked)
            listed = [k for k in self.cache.pending if self.cache.fresh.get(k) is True]
            last = list(dict.fromkeys(reversed(listed)))[::-1]
            assert [k for k, mark in self.cache.fresh.items() if mark] == last
        assert len(self.cache) == len(self.model)
        if type(self.cache) is TableCache:
            assert self.cache.pending == [] and True not in self.cache.fresh.values()
        assert same_keys(list(self.cache), list(self.model))
        full = self.cache.full()
        assert full == self.model and same_keys(list(full), list(self.model))
        assert list(self.cache.items()) == list(self.model.items())


TestTableCache = TableCacheMachine.TestCase
TestTableCache.settings = settings(
    max_examples=soak_scaled(150),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


class BoundedTableCacheMachine(TableCacheMachine):
    """The same, keeping at most one clean row decoded: every read past it
    drops the older ones, never a value only ``hot`` holds."""

    limit = 1


TestBoundedTableCache = BoundedTableCacheMachine.TestCase
TestBoundedTableCache.settings = settings(
    max_examples=soak_scaled(60),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


class ReaderMachine(RuleBasedStateMachine):
    """A SharedDict writer dumping often (a 1 KiB stream) and a reader that reads
    every dump in place (ULTRADICT_NG_PARTIAL_FROM=0), checked against a dict."""

    recurse = False  # (the writer's nested dicts shared, or copies)
    merge_fraction = dumps.MERGE_FRACTION
    max_decoded: Optional[int] = None  # (both handles')

    def __init__(self) -> None:
        super().__init__()
        self._env = os.environ.get("ULTRADICT_NG_PARTIAL_FROM")
        os.environ["ULTRADICT_NG_PARTIAL_FROM"] = "0"
        self._fraction = dumps.MERGE_FRACTION
        dumps.MERGE_FRACTION = self.merge_fraction
        self.name = unique_name()
        self.w = SharedDict(
            name=self.name, buffer_size=1024, recurse=self.recurse, max_decoded=self.max_decoded
        )
        self.r = SharedDict(name=self.name, max_decoded=self.max_decoded)
        self.model: dict[Any, Any] = {}

    def teardown(self) -> None:
        self.r.close()
        self.w.close()
        dumps.MERGE_FRACTION = self._fraction
        if self._env is None:
            os.environ.pop("ULTRADICT_NG_PARTIAL_FROM", None)
        else:
            os.environ["ULTRADICT_NG_PARTIAL_FROM"] = self._env

    @rule(key=POOL_KEYS, value=VALUES)
    def set(self, key: Any, value: Any) -> None:
        self.w[key] = value
        self.model[key] = value

    @rule(key=POOL_KEYS)
    def pop(self, key: Any) -> None:
        assert self.w.pop(key, ABSENT) == self.model.pop(key, ABSENT)

    @rule(data=st.dictionaries(POOL_KEYS, VALUES, max_size=30))
    def update(self, data: dict[Any, Any]) -> None:
        self.w.update(data)  # (30 values may not fit the stream: a dump)
        self.model.update(data)

    @rule()
    def clear(self) -> None:
        self.w.clear()
        self.model.clear()

    @rule()
    def dump(self) -> None:
        self.w._store.force_dump()

    @rule(key=POOL_KEYS, value=LEAVES)
    def reader_writes(self, key: Any, value: Any) -> None:
        """(A reader that writes becomes a writer: its cache stays read in place.)"""
        self.r[key] = value
        self.model[key] = value

    @rule(key=POOL_KEYS)
    def read(self, key: Any) -> None:
        check_reads(self.r, self.model, key)

    @invariant()
    def same_dict(self) -> None:
        within_bound(self.r._store.data)
        within_bound(self.w._store.data)
        assert len(self.r) == len(self.model)
        assert same_keys(list(self.r), list(self.model))
        assert list(self.r.items()) == list(self.model.items())
        assert self.r.copy() == self.model


TestReader = ReaderMachine.TestCase
TestReader.settings = settings(
    max_examples=soak_scaled(40),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


class WriterMachine(ReaderMachine):
    """A writer whose cache is read in place (ULTRADICT_NG_PARTIAL_FROM=0),
    nested dicts shared (``recurse=True``), dumping often (a 1 KiB stream):
    each dump merges what changed into the last table.  The writer itself and
    the reader are checked against a dict after every step."""

    recurse = True
    merge_fraction = 1.0  # (every dump that can merge does; below, the default too)

    @rule()
    def popitem(self) -> None:
        if not self.model:
            with pytest.raises(KeyError):
                self.w.popitem()
            return
        got = self.w.popitem()
        want = self.model.popitem()
        assert exact(got[0], want[0]) and got[1] == want[1]

    @rule(data=st.data(), inner=st.sampled_from(["x", "y", "w"]), value=LEAVES)
    def nested_set(self, data: Any, inner: str, value: Any) -> None:
        key = a_dict_key(data, self.model)
        if key is not ABSENT:
            self.w[key][inner] = value  # (a record on the nested path: the root value changes in place)
            self.model[key][inner] = value

    @rule(key=POOL_KEYS)
    def writer_reads(self, key: Any) -> None:
        check_reads(self.w, self.model, key)

    @invariant()
    def the_writer_is_the_dict(self) -> None:
        assert len(self.w) == len(self.model)
        assert same_keys(list(self.w), list(self.model))
        assert self.w.copy() == self.model


TestWriter = WriterMachine.TestCase
TestWriter.settings = settings(
    max_examples=soak_scaled(40),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


class RepackingWriterMachine(WriterMachine):
    """The same with the default MERGE_FRACTION: many of these small dicts'
    dumps change too many keys to merge, and repack the cache whole."""

    merge_fraction = dumps.MERGE_FRACTION


TestRepackingWriter = RepackingWriterMachine.TestCase
TestRepackingWriter.settings = settings(
    max_examples=soak_scaled(20),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


class BoundedWriterMachine(WriterMachine):
    """The writer machine with both handles keeping at most two clean rows
    decoded (``max_decoded=2``): reads, records and merged dumps evict
    constantly, and the overwritten, fresh and nested values stay."""

    max_decoded = 2


TestBoundedWriter = BoundedWriterMachine.TestCase
TestBoundedWriter.settings = settings(
    max_examples=soak_scaled(30),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def test_a_writers_dump_merges_only_what_changed(name, monkeypatch):
    """A writer whose cache is read in place decodes only the keys it touches,
    and its dump encodes only what changed since the table: the overwritten
    values and the new keys and values.  Everything else is copied as bytes;
    readers see the dict's order (a key deleted and set again moves to the end)."""
    monkeypatch.setenv("ULTRADICT_NG_PARTIAL_FROM", "100")
    model = {f"k{i}": (i, f"v{i}", i / 2) for i in range(1000)}
    w = SharedDict(model, name=name, buffer_size=4096, recurse=True)
    encoded: list[Any] = []
    real = dumps._merge

    def counting(cache: Any, dump: Any, loads: Any) -> Any:
        def spy(obj: Any) -> bytes:
            encoded.append(obj)
            return dump(obj)

        return real(cache, spy, loads)

    monkeypatch.setattr(dumps, "_merge", counting)
    real_changes = dumps.table_changes

    def changes_spy(*args: Any) -> Any:  # (the values it encodes itself count too)
        got = real_changes(*args)
        encoded.extend(args[6][k] for k in set(args[5]) - set(got[2]))
        return got

    monkeypatch.setattr(dumps, "table_changes", changes_spy)
    try:
        assert type(w._store.data) is TableCache
        del w["k1"]
        w["k2"] = "two"
        w["new"] = {"nested": 1}
        del w["k3"]
        w["k3"] = 3
        assert set(w._store.data.hot) == {"k2", "new", "k3"}  # (deletes probe, decode nothing)
        w._store.force_dump()
        assert sorted(map(repr, encoded)) == sorted(map(repr, ["two", "new", {"nested": 1}, "k3", 3]))
        for k in ("k1", "k3"):
            del model[k]
        model.update({"k2": "two", "new": {"nested": 1}, "k3": 3})
        r = SharedDict(name=name)
        try:
            assert list(r.items()) == list(model.items()) == list(w.items())
            assert r._store.data.table.count == 1000
        finally:
            r.close()
        encoded.clear()
        w["new"]["more"] = 2  # (a nested change: its root value is encoded again at the next dump)
        w._store.force_dump()
        assert encoded == [{"nested": 1, "more": 2}]
    finally:
        w.close()


def test_a_reader_and_a_writer_read_a_big_dump_in_place(name, monkeypatch):
    """At the threshold a reader's cache is a TableCache, below it a dict; a
    writer's too: its dump of a dict at the threshold becomes its cache, and
    a write decodes only the keys it touches.  Both read the same throughout."""
    monkeypatch.setenv("ULTRADICT_NG_PARTIAL_FROM", "100")
    w = SharedDict({f"k{i}": i for i in range(100)}, name=name, buffer_size=4096)
    w._store.force_dump()
    r = SharedDict(name=name)
    try:
        assert r["k5"] == 5 and type(r._store.data) is TableCache
        assert len(r._store.data.hot) == 1  # decoded: the one key read
        assert type(w._store.data) is TableCache and not w._store.data.hot
        del w["k0"]
        assert not w._store.data.hot  # (a delete probes; it decodes nothing)
        w._store.force_dump()  # 99 entries: under the threshold
        assert r["k5"] == 5 and type(r._store.data) is dict and type(w._store.data) is dict
        w["k0"] = 0
        w._store.force_dump()
        assert r["k0"] == 0 and type(r._store.data) is TableCache
        before = r.copy()
        r["new"] = 1
        r["k7"] = 70
        assert type(r._store.data) is TableCache and set(r._store.data.hot) == {"new", "k0", "k7"}
        assert r.copy() == {**before, "new": 1, "k7": 70} == w.copy()
        assert list(r) == list(w) == list(before) + ["new"]
    finally:
        r.close()
        w.close()


_CHILD = r"""
import os, pickle, struct, sys
os.environ["ULTRADICT_NG_PARTIAL_FROM"] = "0"
from ultradict_ng import SharedDict
inp, out = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = inp.read(4)
    if len(head) < 4:
        break
    name, probes = pickle.loads(inp.read(struct.unpack("<I", head)[0]))
    d = SharedDict(name=name, create=False)
    kind = type(d._store.data).__name__
    answer = (kind, [(p in d, d.get(p, "<absent>")) for p in probes], list(d), len(d))
    d.close()
    blob = pickle.dumps(answer)
    out.write(struct.pack("<I", len(blob)) + blob)
    out.flush()
"""


def test_key_identity_is_dicts_in_another_interpreter() -> None:
    """An unrelated interpreter (another PYTHONHASHSEED) reads a dump in place and
    answers like the writer's dict for every key and every equal key of another
    type: the table's hash and comparison keep dict's key identity."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert child.stdin is not None and child.stdout is not None

    def ask(name: str, probes: list[Any]) -> Any:
        blob = pickle.dumps((name, probes))
        child.stdin.write(struct.pack("<I", len(blob)) + blob)  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
        size = struct.unpack("<I", child.stdout.read(4))[0]  # type: ignore[union-attr]
        return pickle.loads(child.stdout.read(size))  # type: ignore[union-attr]

    @settings(max_examples=soak_scaled(60), deadline=None, suppress_health_check=list(HealthCheck))
    @given(keys=st.lists(KEYS, min_size=1, max_size=10), extra=st.lists(KEYS, max_size=4))
    def check(keys: list[Any], extra: list[Any]) -> None:
        keys = [k for k in keys if not holds_nan(k)]  # (found only by identity: not across processes)
        model = {k: i for i, k in enumerate(keys)}
        name = unique_name()
        d = SharedDict(name=name, buffer_size=64)
        try:
            d.update(model)
            d._store.force_dump()
            probes = [p for k in list(model) + extra if not holds_nan(k) for p in [k] + variants(k)]
            kind, answers, listed, length = ask(name, probes)
        finally:
            d.close()
        assert kind == "TableCache"
        assert answers == [(p in model, model.get(p, ABSENT)) for p in probes]
        assert same_keys(listed, list(model)) and length == len(model)

    try:
        check()
    finally:
        child.stdin.close()
        child.kill()
        child.wait()


_MEMORY = r"""
import random, sys
def anon():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
from ultradict_ng import SharedDict
before = anon()
d = SharedDict(name=sys.argv[1], create=False)
rng = random.Random(1)
for _ in range(2000):
    assert d["user:%08d" % rng.randrange(int(sys.argv[2]))][1].startswith("name")
print(type(d._store.data).__name__, anon() - before)
d.close()
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux's smaps_rollup")
def test_a_readers_private_memory_grows_with_what_it_reads_not_with_the_dict(name):
    """200k rows: a fresh reader that reads 2,000 of them adds under 16 MiB of
    its own memory (the decoded rows and the overlay), where decoding the whole
    dump (the threshold raised) adds over 40 MiB."""
    n = 200_000
    d = SharedDict({f"user:{i:08d}": (i, f"name{i}", i / 2) for i in range(n)}, name=name)
    try:
        d._store.force_dump()
        grown = {}
        for env in ("", str(10**9)):
            out = subprocess.run(
                [sys.executable, "-c", _MEMORY, name, str(n)],
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, "ULTRADICT_NG_PARTIAL_FROM": env},
            )
            assert out.returncode == 0, out.stderr
            kind, added = out.stdout.split()
            grown[kind] = int(added)
        assert grown["TableCache"] < 16 * 2**20, grown
        assert grown["dict"] > 40 * 2**20, grown
    finally:
        d.close()


def test_many_readers_share_one_copy(name):
    """A mapped table is shared: random reads in place by 3 readers at once give
    every reader the writer's values (the rows), each holding only what it read."""
    rows = {i: (i, f"r{i}") for i in range(60_000)}
    d = SharedDict(rows, name=name)
    d._store.force_dump()
    readers = [SharedDict(name=name) for _ in range(3)]
    try:
        rng = random.Random(5)
        for _ in range(3000):
            r = rng.choice(readers)
            k = rng.randrange(60_000)
            assert r[k] == rows[k]
        for r in readers:
            assert type(r._store.data) is TableCache and len(r) == 60_000
            assert len(r._store.data.hot) < 3000
    finally:
        for r in readers:
            r.close()
        d.close()


def keys_passed_to(monkeypatch: Any, cls: type, method: str) -> list[Any]:
    """The keys ``cls.method(self, key)`` is called with from now on (the method still runs)."""
    keys: list[Any] = []
    original = getattr(cls, method)

    def counting(self: Any, key: Any) -> Any:
        keys.append(key)
        return original(self, key)

    monkeypatch.setattr(cls, method, counting)
    return keys


NATIVE = __import__("ultradict_ng.speedups", fromlist=["x"]).IMPLEMENTATION == "native"


@pytest.mark.skipif(not NATIVE, reason="the compiled read path")
def test_the_compiled_read_path_answers_a_big_dicts_keys(name, monkeypatch):
    """``d[k]`` is answered by the C slot without a Python frame while the
    handle is in sync: a key the TableCache decoded already from its ``hot``
    dict (hot reads at dict speed), and the first read of a str key whose row
    is a scalar or a tuple of scalars straight from the table (decoded, kept
    in ``hot``), or its absence.  Any other key or row goes to the TableCache's
    own miss path (``__getitem__``: no ``_getitem_slow`` frames); a read that
    must sync, or export a mutable value, takes ``_getitem_slow``."""
    monkeypatch.setenv("ULTRADICT_NG_PARTIAL_FROM", "0")
    w = SharedDict(
        {**{f"k{i}": (i, "v") for i in range(50)}, 7: "seven", "list": [1, 2]}, name=name, buffer_size=4096
    )
    w._store.force_dump()
    r = SharedDict(name=name)
    slow = keys_passed_to(monkeypatch, SharedDict, "_getitem_slow")
    probed = keys_passed_to(monkeypatch, TableCache, "__getitem__")
    try:
        assert r["k3"] == (3, "v") and type(r._store.data) is TableCache
        assert slow == [] and probed == []  # (the handle synced as it opened)
        assert r._store.data.hot == {"k3": (3, "v")}
        for _ in range(5):
            assert r["k3"] == (3, "v")
        with pytest.raises(KeyError) as absent:
            r["absent"]
        assert absent.value.args == ("absent",)
        assert r["k4"] == (4, "v") and slow == [] and probed == []  # all compiled
        assert r[7] == "seven" and probed == [7]  # another key type: the TableCache's path
        w["new"] = [5]  # a new key's mutable value: exported (copied) by the slow path, each read
        for _ in range(3):
            got = r["new"]
            assert got == [5] and got is not r._store.data.hot["new"] and slow[-1] == "new"
        del w["new"]
        for _ in range(3):  # a row the serializer decodes: the TableCache's path, then exported
            got = r["list"]
            assert got == [1, 2] and got is not r._store.data.hot["list"] and slow[-1] == "list"
        assert "list" in probed
        w["k6"] = [6]  # a table key's value changed to a mutable one: the same
        for _ in range(3):
            got = r["k6"]
            assert got == [6] and got is not r._store.data.hot["k6"] and slow[-1] == "k6"
    finally:
        r.close()
        w.close()


@pytest.mark.skipif(not NATIVE, reason="the compiled set")
def test_the_compiled_set_takes_str_and_int_keys_and_places_new_ones_later(monkeypatch):
    """``cache[key] = value`` of a str or int key is TableCacheBase's, in C:
    an overwrite of a key in ``hot`` in place (a counted one ``changed``), and
    any other key -- a table key, a new key, a deleted one set again, an int
    whose hash an entry of other bytes shares (``1.0`` in the table) --
    stored in ``hot``, marked True in ``fresh`` and listed in ``pending``:
    not placed yet.  Anything that reads the count or the order places them
    first; a delete places its own key only; every other key goes to
    ``_setitem``."""
    cache = table_cache({"a": 1, 7: 2, 1.0: 3, (1, 2): 4, **{f"k{i}": i for i in range(20)}})
    cache._since = 16  # (as after a run of sets with no count: keys wait)
    slow: list[Any] = []
    original = TableCache._setitem
    monkeypatch.setattr(TableCache, "_setitem", lambda self, k, v: (slow.append(k), original(self, k, v)))
    assert cache["k5"] == 5  # (a clean row in hot: its overwrite is placed at once)
    cache["k5"] = 55
    assert cache.changed == {"k5"} and cache.pending == []
    cache["a"] = 10
    cache[7] = 20
    cache["new"] = 30
    cache[8] = 40
    cache["new"] = 31  # (in hot, not placed: stays as it is)
    cache[1] = 6  # (1 == 1.0: decided by ==, in Python, when placed)
    assert slow == [] and cache.pending == ["a", 7, "new", 8, 1]
    assert list(cache.fresh.items()) == [("a", True), (7, True), ("new", True), (8, True), (1, True)]
    assert cache["a"] == 10 and cache[1] == 6 and cache.changed == {"k5"}  # (reads need no placing)
    since = cache._since
    del cache["k3"]  # (a delete places no other key, and is no count)
    assert cache.pending == ["a", 7, "new", 8, 1] and cache.dead == {"k3"} and cache._since == since
    assert cache.changed == {"k5"}
    cache["gone"] = 0
    del cache["gone"]  # (waiting, not the table's: it leaves, listed still, unmarked)
    del cache[7]  # (waiting, the table's: placed alone, dead)
    cache[7] = 20  # (dead: fresh, listed again)
    assert cache.pending == ["a", 7, "new", 8, 1, "gone", 7] and "gone" not in cache.fresh
    assert cache.dead == {"k3", 7} and cache.changed == {"k5"} and cache.fresh[7] is True
    cache.resolve()
    assert cache.pending == [] and cache.changed == {"k5", "a", 1}
    assert list(cache.fresh.items()) == [("new", None), (8, None), (7, None)]
    cache._since = 16  # (the count: without this the next sets would place at once)
    cache["k3"] = 50  # (dead: fresh when placed, after "new", 8 and 7)
    cache["k4"] = 51
    assert cache.pending == ["k3", "k4"]
    cache[(1, 2)] = 5
    assert slow == [(1, 2)]
    model = {
        "a": 10,
        1.0: 6,
        (1, 2): 5,
        **{f"k{i}": i for i in range(20) if i != 3},
        "k5": 55,
        "k4": 51,
        "new": 31,
        8: 40,
        7: 20,
        "k3": 50,
    }
    assert len(cache) == len(model) and cache.pending == []
    assert list(cache.fresh) == ["new", 8, 7, "k3"] and cache.changed == {"k5", "a", 1, "k4", (1, 2)}
    assert cache.full() == model and same_keys(list(cache), list(model))


@pytest.mark.skipif(not NATIVE, reason="the compiled placing")
def test_resolve_places_a_batch_as_one_by_one_would_and_keeps_the_rest_on_error(monkeypatch):
    """``resolve`` places thousands of pending keys (its probes run several
    keys ahead) exactly as placing each at its set would: the counted ones
    ``changed``, the rest fresh in the order they were set, keys placed or
    gone since skipped.  When placing raises, the keys not placed yet go back
    to ``pending`` ahead of those set meanwhile, and a later call places
    them; the table's buffer is held by no probe afterwards."""
    data = {f"k{i}": i for i in range(5000)}
    data[1.0] = "float"
    cache = table_cache(data)
    rng = random.Random(5)
    order = rng.sample(range(10000), 6000)
    cache._since = 16
    for i in order:
        cache[f"k{i}"] = -i
    cache[1] = "one"  # (an int equal to a table key of another type: Python's rule)
    assert len(cache.pending) == 6001
    model = dict(data)
    for i in order:
        model[f"k{i}"] = -i
    model[1.0] = "one"
    calls: list[Any] = []
    original = TableCache._counted

    def failing(self: TableCache, key: Any) -> bool:
        calls.append(key)
        if len(calls) == 1:
            cache._since = 16
            cache["late"] = 1  # (set while placing runs Python code: waits, after the batch)
            raise MemoryError("placing")
        return original(self, key)

    monkeypatch.setattr(TableCache, "_counted", failing)
    with pytest.raises(MemoryError):
        cache.resolve()
    assert cache.pending[0] == 1 and cache.pending[-1] == "late" and len(cache.pending) == 2
    model["late"] = 1
    assert len(cache) == len(model) and cache.pending == [] and calls == [1, 1]
    assert cache.changed == {f"k{i}" for i in order if i < 5000} | {1}
    assert list(cache.fresh) == [f"k{i}" for i in order if i >= 5000] + ["late"]
    assert cache.full() == model and same_keys(list(cache), list(model))
    cache.table.close()  # (BufferError if a probe left the buffer exported)
    cache._keep[1].release()


@pytest.mark.skipif(not NATIVE, reason="the compiled set")
def test_sets_right_after_a_count_place_their_keys_at_once():
    """A process that counts between its writes (a bounded cache asks ``len``
    at each set) would place its keys one at a time, each with a batch's
    overhead: the 16 sets of new keys after a count (``resolve``) probe and
    place at once, and only then do keys wait; a count starts the run again."""
    cache = table_cache({f"k{i}": i for i in range(40)})
    for i in range(8):
        cache[f"k{i}"] = -i  # (a table key: changed at once)
        cache[f"n{i}"] = i  # (a new key: fresh at once)
        assert cache.pending == [] and cache._since == 2 * i + 2
    assert cache.changed == {f"k{i}" for i in range(8)} and list(cache.fresh) == [f"n{i}" for i in range(8)]
    assert True not in cache.fresh.values()
    cache["n8"] = 8  # (the 17th: it waits)
    assert cache.pending == ["n8"] and cache.fresh["n8"] is True
    assert len(cache) == 49 and cache.pending == [] and cache._since == 0
    cache["k39"] = 1
    cache["n9"] = 9
    assert cache.pending == [] and "k39" in cache.changed and cache.fresh["n9"] is None
    model = {f"k{i}": (-i if i < 8 else 1 if i == 39 else i) for i in range(40)}
    model.update({f"n{i}": i for i in range(10)})
    assert cache.full() == model and same_keys(list(cache), list(model))


def test_the_compiled_delete_takes_str_and_int_keys(monkeypatch):
    """A delete of a str or int key is the compiled rule's (``_delitem``'s,
    without its frames): a key waiting to be placed is placed alone (the
    others wait on), a fresh key leaves with its value, a counted one (read,
    overwritten or not) becomes dead; a key the cache does not hold is a
    KeyError.  Other keys
    take ``_delitem``; the twin takes it for every key."""
    base: dict[Any, Any] = {f"k{i}": i for i in range(20)}
    base.update({5: "five", 2.5: "float"})
    cache = table_cache(base)
    called: list[Any] = []
    real = TableCache._delitem

    def spy(self: Any, key: Any) -> None:
        called.append(key)
        real(self, key)

    monkeypatch.setattr(TableCache, "_delitem", spy)
    del cache["k1"]  # (counted, never read)
    assert cache["k2"] == 2
    del cache["k2"]  # (counted and read: in hot)
    cache["k3"] = -3
    del cache["k3"]  # (changed)
    del cache[5]
    assert len(cache) == 22 - 4
    for i in range(17):  # (the 17th set after a count waits to be placed)
        cache[f"n{i}"] = i
    cache["k4"] = -4  # (a table key, waiting: placing makes it changed, the delete dead)
    native = speedups.IMPLEMENTATION == "native"
    assert cache.pending == (["n16", "k4"] if native else [])
    del cache["k4"]  # (placed alone: the other key waits on, and k4 stays listed, unmarked)
    assert cache.pending == (["n16", "k4"] if native else [])
    assert "k4" in cache.dead and "k4" not in cache.fresh
    assert cache.fresh["n16"] is (True if native else None)
    del cache["n16"]  # (fresh)
    for gone in ("k1", "absent", 7):
        with pytest.raises(KeyError):
            del cache[gone]
    del cache[2.5]
    if native:
        assert called == [2.5]
    else:
        assert called == ["k1", "k2", "k3", 5, "k4", "n16", "k1", "absent", 7, 2.5]
    assert cache.dead == {"k1", "k2", "k3", 5, "k4", 2.5} and not cache.changed
    model = {k: v for k, v in base.items() if k not in cache.dead}
    model.update({f"n{i}": i for i in range(16)})
    assert "k4" not in cache.hot and "k2" not in cache.hot and "n16" not in cache.hot
    assert len(cache) == len(model) and same_keys(list(cache), list(model)) and cache.full() == model


@settings(max_examples=soak_scaled(150), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.dictionaries(POOL_KEYS, LEAVES, max_size=12),
    st.lists(st.tuples(POOL_KEYS, st.one_of(VALUES, st.just(ABSENT))), max_size=24),
    st.booleans(),
)
def test_a_replay_into_a_big_dicts_cache_is_the_decode_and_apply_all(base, writes, counted):
    """The records a reader replays straight from their payloads into a
    TableCache (``apply_simple``: root sets of scalars and rows and root
    deletes, through the cache's own set and delete) and then, from the
    first other one, decoded and applied one by one, leave the cache as
    decoding and applying them all would: the same keys of the same types
    in the same order, the same values.  (ABSENT: a delete, of a key the
    dict holds then, as a writer writes one.)"""
    codec = codec_for("msgpack")
    model, records = dict(base), []
    for k, v in writes:
        if v is not ABSENT:
            model[k] = v
            records.append(R.set_([], k, v))
        elif k in model:
            del model[k]
            records.append(R.delete([], k))
    payloads = [codec.encode_record(rec)[0] for rec in records]
    fast, slow = table_cache(base), table_cache(base)
    if counted:  # (right after a count the compiled set places keys at once; else later)
        len(fast), len(slow)
    done = apply_simple(fast, payloads, 0, L.OP_SET, L.OP_DEL)
    R.apply_all(fast, codec.loads_many(payloads[done:], True))
    R.apply_all(slow, codec.loads_many(payloads, True))
    simple = (int, str, float, bool, bytes, type(None))
    if all(
        type(r[2]) in simple and (len(r) == 3 or type(r[3]) in simple or type(r[3]) is tuple) for r in records
    ):
        assert done == len(payloads)  # (every record of scalars and rows taken straight)
    assert same_keys(list(fast), list(slow)) and len(fast) == len(slow)
    assert [(k, v) for k, v in fast.items()] == [(k, v) for k, v in slow.items()]
    for k, v in fast.items():
        assert exact(v, slow[k]) or type(v) is dict, (k, v, slow[k])


def test_a_reader_replays_a_big_dicts_simple_records_without_decoding_them(name, monkeypatch):
    """A process attaching to a big dict replays the stream into the table it
    reads in place: the root sets of scalars and rows, and the root deletes,
    from their payloads (no record list decoded: a million of them took
    1.9 s, 0.7 s so); any other record is decoded and applied between them."""
    monkeypatch.setenv("ULTRADICT_NG_PARTIAL_FROM", "100")
    model: dict[Any, Any] = {f"k{i}": (i, f"v{i}", i / 2) for i in range(1000)}
    w = SharedDict(model, name=name, buffer_size=1 << 16)
    try:
        w._store.force_dump()  # (a table: the stream after it holds what follows)
        generation = w.stats()["generation"]
        for i in range(0, 1200, 3):  # (overwrites of the table's keys, and new keys)
            w[f"k{i}"] = model[f"k{i}"] = (i, "x", 0.5)
        for i in range(10):
            w[i] = model[i] = f"int {i}"
        del w["k4"], model["k4"]  # (a delete: straight from its payload too)
        del w[3], model[3]
        w["nested"] = model["nested"] = {"a": [1, 2]}
        w["k7"] = model["k7"] = None
        decoded = count_decodes(monkeypatch, w)
        r = SharedDict(name=name)
        try:
            assert type(r._store.data) is TableCache and w.stats()["generation"] == generation
            assert decoded == [1]  # (the nested set alone: the set after it from its payload)
            assert same_keys(list(r), list(model)) and list(r.items()) == list(model.items())
            assert len(r) == len(model) == 1000 - 1 + 66 + 10 - 1 + 1
        finally:
            r.close()
    finally:
        w.close()


@pytest.mark.parametrize("limit", [0, 1, 64])
def test_a_bounded_reader_keeps_at_most_max_decoded_rows(name, monkeypatch, limit):
    """``max_decoded=N``: a reader of a big dict keeps at most N rows decoded
    -- through the compiled first read (str keys) and the TableCache's own
    path (int keys) alike -- and gives every value right while a writer
    overwrites, adds and deletes keys: the values records set are kept, never
    dropped for a row the table holds.  0 keeps no row at all."""
    monkeypatch.setenv("ULTRADICT_NG_PARTIAL_FROM", "0")
    model: dict[Any, Any] = {**{f"k{i}": (i, "v") for i in range(600)}, **{i: i * 2 for i in range(200)}}
    w = SharedDict(model, name=name)
    w._store.force_dump()
    r = SharedDict(name=name, max_decoded=limit)
    rng = random.Random(limit)
    try:
        keys = list(model)
        for step in range(3000):
            k = rng.choice(keys)
            if step % 50 == 0:  # (a record: the reader's value for k is now only in hot)
                if k in model and step % 100 == 0:
                    del w[k]
                    del model[k]
                else:
                    w[k] = model[k] = ("set", step)
            if k in model and step % 2:
                assert r[k] == model[k], k  # (the compiled slot)
            else:
                assert r.get(k, ABSENT) == model.get(k, ABSENT), k
            cache = r._store.data
            assert type(cache) is TableCache
            within_bound(cache)
            if limit == 0:
                assert cache.clean_rows() == 0
        assert len(r) == len(model) and r.copy() == model
        if limit:
            assert cache.clean_rows() > 0  # (the bound keeps rows, it does not stop keeping them)
    finally:
        r.close()
        w.close()


def test_max_decoded_must_be_a_count_and_is_for_shared_memory(name):
    """A bad ``max_decoded`` raises TypeError (not an int) or ValueError
    (negative) and creates nothing; the Redis backend (which maps no table)
    refuses it before connecting."""
    for bad, error in ((-1, ValueError), (2.5, TypeError), ("10", TypeError), (True, TypeError)):
        with pytest.raises(error, match="max_decoded"):
            SharedDict(name=name, max_decoded=bad)
    assert not any(name in f for f in os.listdir("/dev/shm"))
    with pytest.raises(ValueError, match="max_decoded"):
        SharedDict(name=name, backend="redis://127.0.0.1:1/0", max_decoded=5)


class _Finalizer:
    """Cyclic garbage whose finalizer runs ``then`` when the collector frees it."""

    def __init__(self, then: Any) -> None:
        self.then, self.me = then, self

    def __del__(self) -> None:
        self.then()


@pytest.mark.skipif(not NATIVE, reason="the compiled read path")
@pytest.mark.parametrize("record", ["delete", "clear", "set"])
def test_a_record_applied_while_a_compiled_first_read_decodes_wins(name, monkeypatch, record):
    """The compiled first read takes no mutex: no other thread runs between its
    checks and its store -- except while decoding allocates, when a collection
    may run finalizers (which may apply records, or let another thread do so).
    Forced here: the collector runs at the row's first allocation (a tuple of
    25: too long for the tuples' free list) and a finalizer applies a record to
    the reader's cache.  The read must not then store the value it decoded: a
    deleted or cleared key would read as present ever after, a set one as its
    old value."""
    monkeypatch.setenv("ULTRADICT_NG_PARTIAL_FROM", "0")
    row = tuple(range(25))
    w = SharedDict({f"k{i}": row for i in range(50)}, name=name, buffer_size=4096)
    w._store.force_dump()
    r = SharedDict(name=name)
    try:
        assert r["k1"] == row
        cache = r._store.data
        assert type(cache) is TableCache
        apply = {
            "delete": lambda: R.apply(cache, R.delete((), "k3")),
            "clear": lambda: R.apply(cache, R.clear(())),
            "set": lambda: R.apply(cache, R.set_((), "k3", "new")),
        }[record]
        threshold = gc.get_threshold()
        gc.disable()
        try:
            _Finalizer(apply)  # (garbage now; freed by the next collection)
            gc.set_threshold(1)
            gc.enable()
            try:
                got = r["k3"]  # (no call before it: a frame would collect first on 3.9/3.10)
            except KeyError:
                got = ABSENT
        finally:
            gc.set_threshold(*threshold)
            gc.enable()
        want = {"delete": ABSENT, "clear": ABSENT, "set": "new"}[record]
        assert got in (want, row)  # (the read itself is concurrent with the record)
        assert cache.get("k3", ABSENT) == want and cache.hot.get("k3", ABSENT) == want
    finally:
        r.close()
        w.close()


def test_a_bulk_load_is_published_as_a_table(name, monkeypatch):
    """A root update of PARTIAL_FROM pairs or more, at least as many as the dict
    holds, is published as a dump -- a table readers map -- even where its record
    would fit the stream; a smaller update, or one of a few keys of a bigger
    dict, is a record."""
    monkeypatch.setattr(tablecache, "PARTIAL_FROM", 1000)  # (the writer's rule: not the environment's)
    monkeypatch.setenv("ULTRADICT_NG_PARTIAL_FROM", "1000")  # (the reader's)
    w = SharedDict(name=name)  # a 1 MiB stream: all of these records would fit
    r = SharedDict(name=name)
    try:
        w.update({f"k{i}": i for i in range(999)})
        assert w._store.gen == 0 and r["k5"] == 5 and type(r._store.data) is dict
        w.update({f"j{i}": i for i in range(1000)})  # 1,000 pairs: more than the 999 held
        assert w._store.gen == 1 and r["j5"] == 5 and type(r._store.data) is TableCache
        w.update({f"m{i}": i for i in range(1500)})  # fewer than the 1,999 held: a record
        assert w._store.gen == 1 and r["m5"] == 5 and len(r) == 3499
        w.update([(f"n{i}", i) for i in range(4000)])
        assert w._store.gen == 2 and r.copy() == w.copy()
    finally:
        r.close()
        w.close()


def test_a_delete_applied_during_a_readers_probe_is_not_undone(monkeypatch):
    """Thread A misses ``hot`` and probes the table; thread B applies a record
    deleting that key meanwhile (a sync of the same handle, under the reader's
    mutex).  A must not then store the value it read: the key would read as
    present ever after.  The interleaving is forced: the probe starts B and
    gives it 0.3 s to apply the delete (with the probe under the mutex, B waits
    for A instead, and the delete lands after A's store)."""
    cache = table_cache({"k": "old", "other": 1})
    applied = threading.Event()
    original = tablecache.table_get  # (the probe of a str key; Table.lookup's of the others)
    prober = threading.current_thread()

    def probe_while_another_thread_deletes(buf: Any, slots: int, start: int, end: int, key: Any) -> Any:
        if key == "k" and threading.current_thread() is prober and not applied.is_set():

            def delete() -> None:
                with cache._mutex:
                    R.apply(cache, R.delete((), "k"))
                applied.set()

            threading.Thread(target=delete).start()
            applied.wait(0.3)
        return original(buf, slots, start, end, key)

    monkeypatch.setattr(tablecache, "table_get", probe_while_another_thread_deletes)
    cache.get("k")  # (either "old" or None: the delete is concurrent)
    assert applied.wait(5)
    assert cache.get("k", ABSENT) == ABSENT and "k" not in cache and list(cache) == ["other"]


def test_a_dict_given_whole_is_loaded_without_a_record(name, monkeypatch):
    """update(dict) and SharedDict(dict, ...) of PARTIAL_FROM rows or more
    (scalar keys, scalar or scalar-tuple values) are a bulk load straight from
    the dict (Store.load: no [key, value] lists, no record): the same dict,
    in the same order, for the loader and its readers; over keys the dict
    holds, as update() does.  Anything else takes the record path, which
    publishes the same."""
    from ultradict_ng._codec import codec as codec_module

    monkeypatch.setattr(tablecache, "PARTIAL_FROM", 1000)
    encoded: list[Any] = []
    real = codec_module.MsgpackCodec.encode_record
    monkeypatch.setattr(
        codec_module.MsgpackCodec,
        "encode_record",
        lambda self, rec: encoded.append(rec[0]) or real(self, rec),
    )
    rows = {f"k{i}": (i, f"v{i}", i / 2) for i in range(1500)}
    w = SharedDict(rows, name=name, blob_threshold=100)
    r = SharedDict(name=name)
    try:
        assert encoded == [] and w._store.gen == 1
        assert list(r.items()) == list(rows.items()) == list(w.items())
        again = {**{f"k{i}": -i for i in range(0, 1500, 2)}, **{f"n{i}": None for i in range(600)}}
        w.update(again)  # 1,350 rows < 1,500 held: a record
        model = {**rows, **again}
        assert encoded == [L.OP_UPDATE] and list(r.items()) == list(model.items())
        bigger = {**{f"k{i}": i for i in range(1000, 1500)}, **{f"z{i}": b"x" for i in range(1700)}}
        encoded.clear()
        w.update(bigger)  # over the 2,100 held: loaded, in place
        model.update(bigger)
        assert encoded == [] and w._store.gen == 2 and list(r.items()) == list(model.items())
        for declined in (
            {f"b{i}": b"y" * 200 for i in range(3000)},  # blobs
            {f"d{i}": {"n": i} for i in range(4000)},
        ):  # nested values
            w.update(declined)
            model.update(declined)
            assert encoded[-1] == L.OP_UPDATE and r.copy() == model == w.copy()
        assert list(r) == list(model)
        with w.transaction():  # (an open transaction: its records)
            w.update({f"t{i}": i for i in range(9000)})
        model.update({f"t{i}": i for i in range(9000)})
        assert r.copy() == model
    finally:
        r.close()
        w.close()
