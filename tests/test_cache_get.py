"""SharedCache.get's compiled hit path (``CacheGet``) against its twin and the rules.

A handle's ``get`` is a CacheGet: the compiled one answers a hit on a view in
sync itself (clock, expiry, recency store, copy) and calls the Python rules
(``SharedCache._lookup``) for everything else; the twin always calls them.
Every entry shape a dict can hold -- live, expired, a claim, damaged ones --
must give the same value (or error), the same counts and the same recency
store on both, and the compiled one must not fall back for plain hits (that
is what makes it fast).
"""

from __future__ import annotations

import os
import pickle
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ultradict_ng import SharedDict, speedups
from ultradict_ng._helper import twins
from ultradict_ng.cache import SharedCache
from ultradict_ng.cache import sharedcache as sc
from ultradict_ng.errors import Closed

from .conftest import unique_name

# (The compiled CacheGet reads a compiled SharedDict's fields: with the twins
# forced, handles are twin-based and only the twin can serve them.)
native = speedups._compiled if speedups.IMPLEMENTATION == "native" else None
needs_native = pytest.mark.skipif(native is None, reason="the compiled helper is not in use")

NSLOTS = 8
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
)
value = st.one_of(
    scalar,
    st.lists(scalar, max_size=4).map(tuple),
    st.dictionaries(st.text(max_size=4), scalar, max_size=4),
    st.lists(scalar, max_size=4),
    st.dictionaries(st.text(max_size=4), st.lists(scalar, max_size=2), max_size=2),  # deeper: the slow path
    st.lists(st.lists(scalar, max_size=2), max_size=2),
)
# expires: never, far future, past, an int (the slow path), NaN
expires = st.sampled_from([0.0, 1e12, 1.0, 0, 5, float("nan")])
slot = st.one_of(st.integers(0, NSLOTS - 1), st.sampled_from([-1, NSLOTS, 10**30, True, "s", None]))
entry = st.one_of(
    st.tuples(st.sampled_from([0.0, 1e12]), st.integers(0, NSLOTS - 1), value),  # hits, mostly
    st.tuples(expires, slot, value),
    st.tuples(expires, slot, st.integers(), st.integers()),  # a claim
    st.tuples(expires, slot),
    st.tuples(),
    st.just(7),
    st.just([0.0, 0, 1]),  # damaged
)


@pytest.fixture(scope="module")
def shared():
    """One cache (maxsize: recency is stored) and a plain second handle to write raw entries."""
    name = unique_name()
    c = SharedCache(name, maxsize=NSLOTS)
    raw = SharedDict(name, create=False)
    yield c, raw
    raw.close()
    c.close()
    SharedCache.unlink_by_name(name)


def outcome(get, key, default):
    """(result or exception type, hits, misses)."""
    h, m = get.hits, get.misses
    try:
        got = ("value", get(key, default))
    except Exception as e:  # what the rules raise, e.g. IndexError for a slot past the end
        got = ("error", type(e))
    return got, get.hits - h, get.misses - m


def recency(c):
    return list(c._side.recency)


@needs_native
@settings(max_examples=400, deadline=None)
@given(e=entry)
def test_compiled_get_answers_every_entry_as_its_twin(shared, e):
    c, raw = shared
    raw["k"] = e
    c._d.get("k")  # sync the cache's view: the compiled path answers from it
    slow_calls = []

    def slow(key):
        slow_calls.append(key)
        return c._lookup(key)

    results = {}
    for impl in (native, twins):
        for i in range(len(c._side.recency)):
            c._side.recency[i] = 0.0
        get = impl.CacheGet(c._d, c._side.recency, c._loads, slow, sc._MISSING)
        t0 = time.time()
        got, hits, misses = outcome(get, "k", "DEFAULT")
        t1 = time.time()
        get.release()
        stored = [i for i, t in enumerate(recency(c)) if t]
        results[impl.__name__] = (got, hits, misses, stored)
        assert all(t0 - 1e-3 <= recency(c)[i] <= t1 + 1e-3 for i in stored)
        if hits and isinstance(e[2], (dict, list)):
            assert got[1] == e[2] and got[1] is not c._d._store.data["k"][2]  # a private copy
    assert results[native.__name__] == results[twins.__name__], e
    # The rules, independently: a live 3-tuple whose slot is one of ours is a
    # hit; anything else -- absent, expired, a claim, not an entry -- a miss.
    got, hits, misses, _ = results[native.__name__]
    nslots = len(c._side.recency)
    live = (
        type(e) is tuple
        and len(e) == 3
        and type(e[0]) in (int, float)
        and e[0] == e[0]
        and (not e[0] or e[0] > time.time())
        and type(e[1]) is int
        and 0 <= e[1] < nslots
    )
    assert (got, hits, misses) == ((("value", e[2]), 1, 0) if live else (("value", "DEFAULT"), 0, 1))


@needs_native
def test_compiled_get_answers_plain_hits_and_misses_without_the_python_rules(shared):
    c, raw = shared
    c.clear()
    c["s"] = "text"
    c["d"] = {"id": 1, "name": "x"}
    c["t"] = (1, "a", 1.5)
    c.set("old", 1, ttl=0.001)
    time.sleep(0.01)
    c._d.get("s")
    calls = []
    get = native.CacheGet(c._d, c._side.recency, None, lambda k: calls.append(k) or c._lookup(k), sc._MISSING)
    try:
        assert [get("s"), get("d"), get("t"), get("old", 0), get("absent", 0)] == [
            "text",
            {"id": 1, "name": "x"},
            (1, "a", 1.5),
            0,
            0,
        ]
        assert calls == [] and (get.hits, get.misses) == (3, 2)
        got = get("d")
        got["id"] = 2  # a private copy: the cache is unchanged
        assert get("d") == {"id": 1, "name": "x"} and calls == []
        raw["other"] = 1  # another handle wrote: the view is out of sync, the rules answer (and sync it)
        assert get("s") == "text" and calls == ["s"]
        assert get("s") == "text" and calls == ["s"]
    finally:
        get.release()


def test_a_hit_stores_its_time_as_the_entrys_recency(shared):
    c, raw = shared
    c.clear()
    c["a"] = {"v": 1}
    c._d.get("a")
    i = c._d.get("a")[1]
    c._side.recency[i] = 0.0
    t0 = time.time()
    assert c.get("a") == {"v": 1}
    assert t0 - 1e-3 <= c._side.recency[i] <= time.time() + 1e-3


def test_pickle_serializer_values_come_back_through_loads(name):
    class Point:
        def __init__(self, x):
            self.x = x

        def __eq__(self, other):
            return type(other) is Point and other.x == self.x

    with SharedCache(name, maxsize=4, serializer="pickle") as c:
        c["p"] = [1, 2]
        c["b"] = b"raw"
        c._d.get("p")
        assert c.get("p") == [1, 2] and c.get("p") is not c.get("p") and c["b"] == b"raw"
        c._d["x"] = (0.0, 0, pickle.dumps(3))  # an entry written by hand: loads decides
        assert c["x"] == 3
        assert c.stats()["hits"] == 5
        c.unlink()


def test_counts_survive_as_stats_and_a_closed_handle_raises_closed(name):
    c = SharedCache(name, maxsize=4)
    c["a"] = 1
    assert c.get("a") == 1 and c.get("b") is None and c["a"] == 1
    assert (c.stats()["hits"], c.stats()["misses"]) == (2, 1)
    c.close()
    with pytest.raises(Closed):
        c.get("a")
    SharedCache.unlink_by_name(name)


def test_get_rejects_bad_calls(name):
    with SharedCache(name) as c:
        with pytest.raises(TypeError):
            c.get()
        with pytest.raises(TypeError):
            c.get("a", 1, 2)
        with pytest.raises(TypeError):
            c.get(["unhashable"])
        c.unlink()
    if native is not None:
        with pytest.raises(TypeError):
            native.CacheGet(object(), None, None, len, None)  # not a SharedDict
        with pytest.raises(TypeError):
            native.CacheGet(c._d, None, 5, len, None)  # loads not callable
        with pytest.raises(BufferError):
            native.CacheGet(c._d, memoryview(b"readonly"), None, len, None)  # recency not writable
        with pytest.raises(ValueError):
            native.CacheGet(c._d, bytearray(12), None, len, None)  # not whole 8-byte words


def test_readers_in_threads_while_another_thread_closes_the_handle(name):
    """Every read is a value or Closed; the recency buffer is given back
    before the side segment closes (no BufferError, no store into unmapped memory)."""
    c = SharedCache(name, maxsize=64)
    for i in range(64):
        c[i] = {"i": i}
    seen = {"closed": 0, "values": 0}
    errors = []

    def read():
        for _ in range(20000):
            try:
                v = c.get(7)
            except Closed:
                seen["closed"] += 1
                return
            except Exception as e:  # anything else is the failure
                errors.append(e)
                return
            if v != {"i": 7}:
                errors.append(v)
                return
            seen["values"] += 1

    threads = [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.005)
    c.close()
    for t in threads:
        t.join()
    assert not errors and seen["values"] > 0
    SharedCache.unlink_by_name(name)


_CYCLE_THROUGH_A_GET = """
import gc, sys
from ultradict_ng import SharedDict
from ultradict_ng.speedups import _compiled as native
d = SharedDict(name=sys.argv[1])
ignored = []
sys.unraisablehook = lambda u: ignored.append(f"{u.err_msg}: {u.exc_value!r}")
gc.collect()
recency = memoryview(bytearray(64)).cast("Q")  # tracked first
holder = type("Holder", (), {"slow": lambda self, *a: None})()
holder.recency = recency
holder.get = native.CacheGet(d, recency, None, holder.slow, object())  # the cycle
del recency, holder
gc.collect()
d.close()
print(ignored, flush=True)
"""


@needs_native
def test_the_collector_never_clears_the_recency_view_under_its_get(name):
    """A handle's get (CacheGet) holds the recency memoryview's buffer, and a
    handle dropped unclosed (cached()'s at exit) is a cycle through it.  If
    the collector clears that memoryview first it drops the memory under the
    export (BufferError in tp_clear, then SIGSEGV): the memoryview must count
    as referenced from outside the cycle.  The cycle is built so that the
    memoryview is the first of its objects the collector meets; a child
    interpreter runs it, since the failure is a crash."""
    import subprocess
    import sys

    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CYCLE_THROUGH_A_GET, name], capture_output=True, text=True, timeout=60
        )
    finally:
        if os.path.exists(f"/dev/shm/{name}"):  # the child crashed before closing it
            SharedDict.unlink_by_name(name)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout
