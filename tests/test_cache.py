"""SharedCache in one process: the API, expiry, bounds, eviction quality, the
side segment, bad input; a hypothesis state machine against a dict model
(two handles: every read goes through the handle that did not write)."""

from __future__ import annotations

import collections
import os
import pickle
import random
import time

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ultradict_ng import SharedDict
from ultradict_ng._platform.segments import Segment
from ultradict_ng.cache import DEFAULT_TTL, SharedCache, cached
from ultradict_ng.cache import layout as C
from ultradict_ng.errors import CorruptSegment, ParameterMismatch, TooLarge, UnsupportedType

from .conftest import unique_name


@pytest.fixture
def cache(name):
    c = SharedCache(name, maxsize=100)
    yield c
    c.close()
    SharedCache.unlink_by_name(name)


def test_mapping_api(cache):
    cache["a"] = 1
    cache.set("b", {"x": [1, 2]})
    assert cache["a"] == 1 and cache.get("b") == {"x": [1, 2]} and cache.get("zz", 5) == 5
    assert "a" in cache and "zz" not in cache and len(cache) == 2 and sorted(cache) == ["a", "b"]
    got = cache["b"]
    got["x"].append(3)  # a copy: the cache is unchanged
    assert cache["b"] == {"x": [1, 2]}
    with pytest.raises(KeyError):
        cache["zz"]
    del cache["a"]
    with pytest.raises(KeyError):
        del cache["a"]
    assert cache.delete("b") and not cache.delete("b") and len(cache) == 0
    assert cache.add("k", 1) and not cache.add("k", 2) and cache["k"] == 1
    assert cache.incr("k") == 2 and cache.decr("k", 5) == -3 and cache.incr("new", default=10) == 11
    with pytest.raises(KeyError):
        cache.incr("missing")
    cache["s"] = "text"
    with pytest.raises(TypeError):
        cache.incr("s")
    assert cache.setdefault("k", 9) == -3 and cache.setdefault("sd", 9) == 9
    assert cache.pop("sd") == 9 and cache.pop("sd", None) is None
    cache.set_many({"m1": 1, "m2": (1, 2)})
    assert cache.get_many(["m1", "m2", "m3"]) == {"m1": 1, "m2": (1, 2)}
    assert cache.delete_many(["m1", "m2", "m3"]) == 2
    cache.clear()
    assert len(cache) == 0 and list(cache) == []
    assert cache.stats()["hits"] > 0 and cache.stats()["misses"] > 0


def test_expiry_is_data_every_handle_sees(cache):
    other = SharedCache(cache.name)
    try:
        cache.set("short", 1, ttl=0.2)
        cache.set("long", 2, ttl=None)
        assert other["short"] == 1 and 0 < other.ttl("short") <= 0.2 and other.ttl("long") is None
        time.sleep(0.25)
        assert "short" not in other and other.get("short") is None and list(other) == ["long"]
        with pytest.raises(KeyError):
            other.ttl("short")
        assert len(other) == 1 and other.touch("long", 0.2) and not other.touch("short")
        assert not other.add("long", 3)  # live
        assert cache.expire() == 1  # "short" reclaimed: gone from the dict itself
        assert "short" not in SharedDict(cache.name, create=False).keys()
        cache.set("gone", 1, ttl=0)  # <= 0: already expired, stores nothing
        cache.set("gone2", 1, ttl=-1)
        assert "gone" not in cache and "gone2" not in cache
        time.sleep(0.25)
        assert other.add("long", 4) and other["long"] == 4  # expired: add wins
    finally:
        other.close()


def test_default_ttl_and_reaping(name):
    c = SharedCache(name, ttl=0.1)
    try:
        for i in range(50):
            c[i] = i
        c.set("forever", 1, ttl=None)
        time.sleep(0.15)
        assert len(c) == 1 and c.get(3) is None
        for i in range(100, 400):  # writes reclaim expired entries as they go
            c.set(i, i, ttl=None)
        raw = SharedDict(name, create=False)
        assert len(raw) < 350, len(raw)
        raw.close()
        assert c.stats()["expirations"] > 0
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


def test_maxsize_evicts_least_recently_used(name):
    random.seed(5)  # (the sampling's: deterministic)
    c = SharedCache(name, maxsize=50)
    try:
        for i in range(50):
            c[i] = i
        for _ in range(3):
            for i in range(25):  # the hot half
                assert c[i] == i
        for i in range(50, 60):
            c[i] = i
        assert len(c) == 50
        hot = sum(1 for i in range(25) if i in c)
        assert hot >= 24, hot  # sampled LRU keeps the hot half (random eviction: ~20)
        assert c.stats()["evictions"] == 10
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


def test_maxbytes_bound(name):
    c = SharedCache(name, maxbytes=20_000)
    try:
        for i in range(200):
            c[i] = "x" * 500
            assert c.stats()["bytes"] <= 20_000
        assert 20 <= len(c) < 40
        c.expire()  # recounts: the running total was right
        assert c.stats()["bytes"] <= 20_000
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


def test_a_cache_bounded_by_bytes_alone_evicts_when_its_slots_run_out(name, monkeypatch):
    """A cache bounded only by ``maxbytes`` has ``BYTES_ONLY_SLOTS`` (2**20)
    slots: small entries use them up while far under the bytes.  The next
    new key evicts the least recently used entry, as a cache full by its
    bounds does -- here with 64 slots, in place of a million entries."""
    monkeypatch.setattr(C, "BYTES_ONLY_SLOTS", 64)
    c = SharedCache(name, maxbytes=1 << 30)
    try:
        for i in range(200):
            c[i] = i
        assert len(c) <= 64 and c[199] == 199 and 0 not in c
        assert c.stats()["bytes"] == sum(c._size(k, c._d[k][2]) for k in c._d)
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


def test_an_entry_grown_when_the_count_is_recounted_keeps_its_new_size(name):
    """A count too high (a writer killed while deleting leaves it so) makes a
    grown entry find nothing to evict: the count is recounted from the
    entries, which still hold its old value -- its new size goes back in,
    and ``maxbytes`` holds at the next write."""
    from tests.durable_workers import audit_side

    for stale_cell in (0, 300):  # (a writer killed growing "a" leaves its cell too high as well)
        c = SharedCache(name, maxbytes=1000)
        try:
            c["a"] = "x" * 10
            c._side.words[C.W_BYTES] += 500  # (as a killed deleter leaves it: too high)
            c._side.sizes[c._d["a"][1]] += stale_cell
            c._side.words[C.W_BYTES] += stale_cell
            c["a"] = "x" * 900
            assert audit_side(c) == "", audit_side(c)
            c["c"] = "x" * 800
            assert audit_side(c) == "" and c.stats()["bytes"] <= 1000 and "a" not in c
        finally:
            c.close()
            SharedCache.unlink_by_name(name)


def test_an_entry_larger_than_maxbytes_is_refused_and_changes_nothing(name):
    c = SharedCache(name, maxbytes=2_000)
    try:
        c["a"] = "small"
        for write in (
            lambda: c.set("a", "x" * 5_000),
            lambda: c.add("b", "x" * 5_000),
            lambda: c.set_many({"c": 1, "d": "x" * 5_000}),
        ):
            with pytest.raises(TooLarge, match="maxbytes=2,000"):
                write()
            assert dict(c.items()) == {"a": "small"} and c.stats()["bytes"] <= 2_000

        @cached(name=name, maxsize=None)  # the cache's stored maxbytes applies
        def make(n):
            calls.append(n)
            return "y" * n

        calls = []
        assert make(10) == make(10) == "y" * 10 and calls == [10]
        assert make(5_000) == make(5_000) == "y" * 5_000 and calls == [10, 5_000, 5_000]  # not cached
        assert all(len(e) == 3 for e in c._d.values())  # and no claim left behind
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


@pytest.mark.parametrize("ttl", [None, 60])
def test_maxsize_holds_from_the_first_eviction(name, ttl):
    """With a ttl every write samples for expired entries first: a sample pool
    taken while the cache was empty must not stop eviction (it did: the bound
    was exceeded from the 5th of 4 entries on)."""
    with SharedCache(name, maxsize=4, ttl=ttl) as c:
        for i in range(40):
            c[i] = i
            assert len(c) <= 4
        c.unlink()


def test_popitem_returns_private_values_also_from_blobs(name):
    with SharedCache(name, maxsize=10) as c:
        c["d"] = {"a": [1]}
        c["big"] = b"x" * 100_000  # over the blob threshold: the entry holds a reference
        popped = dict(c.popitem() for _ in range(2))
        assert popped == {"d": {"a": [1]}, "big": b"x" * 100_000} and len(c) == 0
        with pytest.raises(KeyError):
            c.popitem()
        c.unlink()


def test_eviction_spares_a_live_claim_and_takes_a_dead_one(name):
    """A claim of cached() whose owner lives is never the victim (its
    computation would start again in another process); a dead owner's is."""
    from ultradict_ng._shm import layout as L
    from ultradict_ng.cache.memoize import _Claims

    with SharedCache(name, maxsize=4) as c:
        kind, token = _Claims(c).claim("computing")
        assert kind == "mine"
        dead = (2**22 - 3) | (12345 << L.PID_BITS)  # no such process
        with c.lock:
            c._put("abandoned", None, 0.0, time.time() - 100, claim=(dead, 1))
        for i in range(40):
            c[i] = i
        assert len(c._d["computing"]) == 4 and "abandoned" not in c._d
        c.unlink()


@pytest.mark.parametrize("frequency, final", [(3, 29), (0, 19)])
def test_cull_frequency_is_djangos(name, frequency, final):
    c = SharedCache(name, maxsize=30, cull_frequency=frequency, serializer="pickle")
    try:
        for i in range(1, 50):
            c.set(f"cull{i}", "value", 1000)
        assert sum(1 for i in range(1, 50) if f"cull{i}" in c) == final
        assert c.stats()["evictions"] == 49 - final  # (every entry culled, also by an emptying cull)
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


def test_an_emptying_cull_counts_what_it_removes(name):
    """``cull_frequency=0`` empties a full cache: its live entries count as
    evictions and the expired ones as expirations, as a cull of ``n > 0``
    counts each it removes."""
    c = SharedCache(name, maxsize=5, cull_frequency=0)
    try:
        c.set("soon", 0, ttl=0.05)
        for i in range(4):
            c[i] = i
        time.sleep(0.1)
        c["new"] = 1
        s = c.stats()
        assert list(c) == ["new"] and (s["evictions"], s["expirations"]) == (4, 1)
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


def test_a_refused_cache_creation_leaves_nothing_and_an_opener_meanwhile_starts_over(name, monkeypatch):
    """A creation whose side segment is refused (no room for its slots)
    removes the dict it made, also one kept past its creator's close
    (``auto_unlink=False``); an opener that attached to that dict meanwhile
    finds it removed when it would make the side, and starts over."""
    from ultradict_ng.cache import opening, side
    from ultradict_ng.errors import OutOfSpace

    write_new = side._write_new

    def no_room(*args):
        raise OutOfSpace("no room for the cache's slots")

    monkeypatch.setattr(side, "_write_new", no_room)
    with pytest.raises(OutOfSpace):
        SharedCache(name, create=True, auto_unlink=False, maxsize=10)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(name)]
    monkeypatch.setattr(side, "_write_new", write_new)
    real_open_side, removed = opening.open_side, []

    def removed_first(*args, **kwargs):
        if not removed:  # (as a refused creator elsewhere removes the dict this just attached to)
            removed.append(True)
            SharedDict.unlink_by_name(name)
        return real_open_side(*args, **kwargs)

    monkeypatch.setattr(opening, "open_side", removed_first)
    c = SharedCache(name, auto_unlink=False, maxsize=10)
    try:
        c["k"] = 1
        assert removed and c["k"] == 1 and c.maxsize == 10
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


@pytest.mark.parametrize("auto_unlink", [None, True, "last"])
def test_a_refused_creator_s_close_keeps_the_cache_another_made(name, monkeypatch, auto_unlink):
    """A creator refused after another opener made the cache in its new
    dict (its settings differ: ``ParameterMismatch``) closes its handle
    without the creator's ``auto_unlink``: the other's cache and entries
    stay."""
    from ultradict_ng.cache import opening

    real_open_side, others, asked = opening.open_side, [], []

    def another_makes_it_first(*args, **kwargs):
        if not asked:  # (the creator's call: the other opener's own goes through)
            asked.append(True)
            others.append(SharedCache(name, maxsize=20, auto_unlink=False))
            others[0]["k"] = 1
        return real_open_side(*args, **kwargs)

    monkeypatch.setattr(opening, "open_side", another_makes_it_first)
    try:
        with pytest.raises(ParameterMismatch):
            SharedCache(name, create=True, auto_unlink=auto_unlink, maxsize=10)
        monkeypatch.undo()
        c = SharedCache(name, create=False)
        assert c["k"] == 1 and c.maxsize == 20
        c.close()
    finally:
        for other in others:
            other.close()
        SharedCache.unlink_by_name(name)


def _zipf_trace(keys: int, requests: int, a: float, seed: int):
    rnd = random.Random(seed)
    weights = [1.0 / (i**a) for i in range(1, keys + 1)]
    return rnd.choices(range(keys), weights=weights, k=requests)


def test_hit_ratio_on_a_zipf_trace_is_near_exact_lru(name):
    trace = _zipf_trace(20_000, 60_000, 0.9, 7)
    size = 1000
    lru: collections.OrderedDict[int, None] = collections.OrderedDict()
    exact = 0
    for k in trace:
        if k in lru:
            exact += 1
            lru.move_to_end(k)
        else:
            lru[k] = None
            if len(lru) > size:
                lru.popitem(last=False)
    c = SharedCache(name, maxsize=size)
    try:
        ours = 0
        for k in trace:
            if c.get(k) is not None:
                ours += 1
            else:
                c[k] = 1
        assert ours >= 0.95 * exact, (ours, exact)
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


def test_pickle_serializer_and_handles_pickle(name):
    c = SharedCache(name, serializer="pickle", maxsize=10)
    try:
        c["obj"] = collections.Counter("abca")
        assert c["obj"] == collections.Counter("abca")
        again = pickle.loads(pickle.dumps(c))
        assert again["obj"]["a"] == 2 and again.serializer == "pickle"
        again.close()
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


class _Marked(str):
    """A str subclass (as Django's SafeString): its type must survive."""


def test_pickle_serializer_keeps_plain_data_as_itself_and_pickles_the_rest(name):
    c = SharedCache(name, serializer="pickle", maxsize=20)
    other = SharedCache(name)
    deep: list = [1]
    for _ in range(20):
        deep = [deep]
    plain = {
        "doc": {"user": 42, "tags": ["a", "b"], "at": (1, 2.5), "s": {1, 2}, "raw": b"x", "n": None},
        "list": [1, "a", [2.0, True]],
        "str": "text",
        "int": 2**70,
        "fs": frozenset({1, 2}),
    }
    pickled = {
        "tuple": (1, [2]),
        "bytes": b"raw",  # (bytes at the top are pickled: a stored bytes is a pickle)
        "marked": _Marked("<b>"),
        "ordered": collections.OrderedDict(a=1),
        "counter": {"c": collections.Counter("aab")},
        "deep": deep,
        "flag": {"f": _Marked("x")},
    }
    try:
        for k, v in {**plain, **pickled}.items():
            c[k] = v
        for k, v in plain.items():
            assert c._dget(k)[2] == v  # stored as itself
        for k in pickled:
            assert type(c._dget(k)[2]) is bytes
        for h in (c, other):
            for k, v in {**plain, **pickled}.items():
                got = h[k]
                assert got == v and type(got) is type(v), k
            got = h["doc"]
            got["tags"].append("c")
            assert h.get("doc")["tags"] == ["a", "b"]  # the caller's own copy
        assert c.incr("int") == 2**70 + 1 and other["int"] == 2**70 + 1
    finally:
        other.close()
        c.close()
        SharedCache.unlink_by_name(name)


def test_settings_are_stored_with_the_cache(name):
    c = SharedCache(name, maxsize=10, ttl=5, serializer="pickle", cull_frequency=3)
    try:
        other = SharedCache(name)
        assert (other.maxsize, other.default_ttl, other.serializer, other.cull_frequency) == (
            10,
            5.0,
            "pickle",
            3,
        )
        with SharedCache(unique_name(), maxsize=2) as plain:
            assert plain.cull_frequency is None
            plain.unlink()
        other.close()
        with pytest.raises(ParameterMismatch):
            SharedCache(name, maxsize=11)
        with pytest.raises(ParameterMismatch):
            SharedCache(name, serializer="msgpack")
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


def test_bad_input_changes_nothing(cache, name):
    for kwargs in (
        {"maxsize": 0},
        {"maxsize": 1.5},
        {"maxbytes": -1},
        {"ttl": 0},
        {"ttl": "1"},
        {"serializer": "json"},
        {"cull_frequency": -1},
        {"cull_frequency": 2},
    ):
        with pytest.raises(ValueError):
            SharedCache(unique_name(), **kwargs)
    cache["a"] = 1
    with pytest.raises(UnsupportedType):
        cache["b"] = object()
    with pytest.raises(TypeError):
        cache.set("c", 1, ttl="soon")
    with pytest.raises(ValueError, match="NaN"):
        cache.set("c", 1, ttl=float("nan"))
    with pytest.raises(TypeError):
        cache[[1]] = 1
    assert dict(cache.get_many(["a", "b", "c"])) == {"a": 1} and len(cache) == 1


def test_a_plain_dict_with_keys_is_not_a_cache(name):
    d = SharedDict(name)
    d["x"] = 1
    try:
        with pytest.raises(ParameterMismatch):
            SharedCache(name)
    finally:
        d.unlink()


def test_side_segment_removed_with_the_cache_and_a_stale_one_replaced(name):
    c = SharedCache(name, maxsize=10, auto_unlink=False)
    c["a"] = 1
    side = "/dev/shm/" + C.cache_name(name)
    assert os.path.exists(side)
    c.close()
    assert os.path.exists(side)
    assert SharedCache.unlink_by_name(name) >= 3
    assert not os.path.exists(side)
    # A side segment left by an earlier dict of the same name (a crash between
    # the dict's removal and its own): another token, so it is replaced.
    seg = Segment.create(C.cache_name(name), C.side_size(0))
    words = memoryview(seg.buf).cast("Q")
    words[C.W_VERSION], words[C.W_TOKEN], words[C.W_MAGIC] = C.SIDE_VERSION, 1, C.SIDE_MAGIC
    words.release()
    seg.close()
    c = SharedCache(name, maxsize=20)
    assert c.maxsize == 20 and c.stats()["maxsize"] == 20
    c.close()
    assert not os.path.exists(side)


def test_an_opener_that_finds_no_side_segment_looks_again_under_the_lock(name, monkeypatch):
    """The creators' race, made deterministic: between this opener's first look
    (no side segment) and its taking the lock, another opener makes the side
    segment and writes a key.  The dict holds keys then, and is a cache."""
    from ultradict_ng.cache import side as side_module

    real = side_module._attach
    others = []

    def racing(segment: str, token: int):
        if not others:
            others.append(None)
            other = SharedCache(name, maxsize=10)  # (looks with the real _attach: others is set)
            other["k"] = 1
            others[0] = other
            raise FileNotFoundError(segment)
        return real(segment, token)

    monkeypatch.setattr(side_module, "_attach", racing)
    c = SharedCache(name, maxsize=10)
    try:
        assert c["k"] == 1 and c.maxsize == 10
    finally:
        others[0].close()
        c.close()


def test_corrupted_side_segment_is_refused(name):
    c = SharedCache(name, maxsize=10)
    try:
        c._side.words[C.W_MAGIC] = 12345
        with pytest.raises(CorruptSegment):
            SharedCache(name)
        c._side.words[C.W_MAGIC] = C.SIDE_MAGIC
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


def test_default_ttl_sentinel_pickles():
    assert pickle.loads(pickle.dumps(DEFAULT_TTL)) is DEFAULT_TTL


KEYS = st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b", "c"]), st.tuples(st.integers(0, 2)))
VALUES = st.one_of(st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=3))


class CacheModel(RuleBasedStateMachine):
    """An unbounded cache without expiry behaves as a dict; reads go through another handle."""

    def __init__(self) -> None:
        super().__init__()
        self.name = unique_name()
        self.w = SharedCache(self.name)
        self.r = SharedCache(self.name)
        self.model: dict = {}

    @rule(k=KEYS, v=VALUES)
    def set(self, k, v):
        self.w[k] = v
        self.model[k] = v

    @rule(k=KEYS, v=VALUES)
    def add(self, k, v):
        assert self.w.add(k, v) == (k not in self.model)
        self.model.setdefault(k, v)

    @rule(k=KEYS, delta=st.integers(-5, 5))
    def incr(self, k, delta):
        if not isinstance(self.model.get(k, 0), int):
            return
        assert self.w.incr(k, delta, default=0) == self.model.get(k, 0) + delta
        self.model[k] = self.model.get(k, 0) + delta

    @rule(k=KEYS)
    def delete(self, k):
        assert self.w.delete(k) == (k in self.model)
        self.model.pop(k, None)

    @rule(k=KEYS)
    def pop(self, k):
        assert self.w.pop(k, "none") == self.model.pop(k, "none")

    @rule(items=st.dictionaries(KEYS, VALUES, max_size=4))
    def set_many(self, items):
        self.w.set_many(items)
        self.model.update(items)

    @rule(keys=st.lists(KEYS, max_size=4))
    def delete_many(self, keys):
        assert self.w.delete_many(keys) == len(set(keys) & set(self.model))
        for k in keys:
            self.model.pop(k, None)

    @rule()
    def clear(self):
        self.w.clear()
        self.model.clear()

    @invariant()
    def same(self):
        assert len(self.r) == len(self.model)
        assert sorted(map(repr, self.r)) == sorted(map(repr, self.model))
        for k, v in self.model.items():
            assert self.r[k] == v
        assert self.r.get_many(list(self.model)) == self.model

    def teardown(self) -> None:
        self.r.close()
        self.w.close()
        SharedCache.unlink_by_name(self.name)


TestCacheModel = CacheModel.TestCase
TestCacheModel.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


def test_a_value_the_codec_refuses_leaks_no_slot(name):
    """set() of a value the dict cannot store raises and gives its slot back
    (regression: every such call leaked one, until a rebuild)."""
    from tests.torture_workers import check_side

    c = SharedCache(name, maxsize=10)
    try:
        c["a"] = 1
        for i in range(30):
            with pytest.raises(TypeError):
                c.set(f"k{i}", object())
        with c.lock:
            assert check_side(c) == (0, 0)
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


@pytest.mark.parametrize("cull", [None, 0, 2])
@pytest.mark.parametrize("bad", ["value", "key", "surrogate value", "surrogate key"])
def test_a_refused_set_into_a_full_cache_evicts_nothing(name, cull, bad):
    """Bad input changes nothing: a full cache without maxbytes (nothing sized
    the entry) refused a key or value only after making room for it -- an
    unsupported type, or a str with a lone surrogate (``os.fsdecode`` makes
    them), inside plain data where no type check sees it."""
    from tests.torture_workers import check_side

    c = SharedCache(name, maxsize=4, cull_frequency=cull)
    try:
        c.update({f"k{i}": (i, "x") for i in range(4)})
        with pytest.raises(UnsupportedType):
            if bad == "value":
                c.set("new", (1, object()))
            elif bad == "key":
                c.set(object(), 1)
            elif bad == "surrogate value":
                c.set("new", {"name": ["ok", "\udc80"]})
            else:
                c.set("\udc80", 1)
        assert sorted(c) == [f"k{i}" for i in range(4)]
        with c.lock:
            assert check_side(c) == (0, 0)
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


@pytest.mark.parametrize("cell", [4, 2**40])
def test_a_damaged_free_slot_cell_is_recounted_not_handed_out(name, cell):
    """A free-stack cell naming a slot never handed out (or past the arrays):
    the writer recounts the side from the entries instead of writing a size
    past the array (IndexError) or giving one slot to two entries."""
    from tests.torture_workers import check_side

    c = SharedCache(name, maxsize=4)
    try:
        c.update({f"k{i}": i for i in range(3)})
        del c["k1"]
        with c.lock:
            c._side.free[c._side.words[C.W_FREE] - 1] = cell
        c["new"] = 1
        c["newer"] = 2
        assert sorted(c) == ["k0", "k2", "new", "newer"]
        with c.lock:
            assert check_side(c) == (0, 0)
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


@pytest.mark.parametrize("when", [float("nan"), float("inf")])
def test_damaged_recency_times_still_leave_a_victim(name, when):
    """Eviction takes the least recent of a sample; a NaN or infinite time
    compares false with everything, and no victim was found: the cache grew
    past maxsize."""
    c = SharedCache(name, maxsize=4)
    try:
        c.update({f"k{i}": i for i in range(4)})
        with c.lock:
            for slot in range(c._side.nslots):
                c._side.recency[slot] = when
        for i in range(10):
            c[f"n{i}"] = i
            assert len(c) <= 4
    finally:
        c.close()
        SharedCache.unlink_by_name(name)


def test_limit_handle_bounds_this_handles_writes_only(name):
    """Per-handle limits (a framework's aliases sharing one store): checked, and
    each handle evicts by its own."""
    c = SharedCache(name, maxsize=100)
    other = SharedCache(name)
    try:
        for bad in (0, 101, 1.5, "10"):
            with pytest.raises(ValueError, match="maxsize must be"):
                other.limit_handle(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="cull_frequency"):
            other.limit_handle(10, -1)
        other.limit_handle(10, 2)
        assert (other.maxsize, other.cull_frequency, c.maxsize) == (10, 2, 100)
        for i in range(10):
            other[f"k{i}"] = i
        other["k10"] = 10  # full for this handle: culls 10 // 2
        assert len(c) == 6
        for i in range(50):
            c[f"m{i}"] = i  # the stored bound: nothing evicted
        assert len(c) == 56
    finally:
        other.close()
        c.close()
    unbounded = SharedCache(name + "u")
    try:
        with pytest.raises(ValueError, match="no maxsize"):
            unbounded.limit_handle(10)
    finally:
        unbounded.unlink()
        unbounded.close()


def test_expire_counts_what_it_removes_as_expirations(cache):
    """``stats()["expirations"]`` counts entries removed because they expired,
    by ``expire()`` as by a read that finds one."""
    for i in range(3):
        cache.set(f"short{i}", i, ttl=0.05)
    cache.set("long", 1, ttl=None)
    time.sleep(0.1)
    before = cache.stats()["expirations"]
    assert cache.expire() == 3
    assert cache.stats()["expirations"] == before + 3
