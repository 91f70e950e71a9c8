"""Corruption fuzz of the shared cache (test_fuzz.py's rules): hypothesis writes
garbage into the header words of a cache's side segment (``N@c``) and truncates it,
and writes values that are not entries into its dict.  Opening and using the cache
must give one of our errors, or a cache that reads what was written (or nothing) and
keeps its bounds -- never another exception, a hang, or a write outside a segment --
and cleanup must leave nothing behind.
"""

from __future__ import annotations

import os
import random
import signal
import struct
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from tests.conftest import soak_scaled, unique_name
from tests.test_fuzz import _alarm, attempt
from tests.torture_workers import check_side
from ultradict_ng import CorruptSegment, SharedDict, SharedDictError, unlink_by_name
from ultradict_ng._platform import listing, segments
from ultradict_ng._platform.segments import Segment
from ultradict_ng.cache import SharedCache
from ultradict_ng.cache import layout as C
from ultradict_ng.cache.entries import slot_of


def _f64(f: float) -> int:
    """The u64 of the bits of ``f`` (how the ttl word holds a float)."""
    return int.from_bytes(struct.pack("<d", f), "little")


CACHE_BOUNDS = st.sampled_from(
    [
        {},
        {"maxsize": 20},
        {"maxbytes": 1500},
        {"maxsize": 20, "cull_frequency": 3},
        {"maxsize": 20, "maxbytes": 1200, "ttl": 30.0},
        {"maxsize": 20, "serializer": "pickle"},
    ]
)
#: A u64 or the bits of an f64 (the ttl word), with the values that mean something.
SIDE_VALUES = st.one_of(
    st.integers(0, (1 << 64) - 1),
    st.sampled_from([0, 1, 2, 3, 16, 20, 36, 1 << 63, (1 << 64) - 1]),
    st.floats().map(lambda f: _f64(f)),
)
#: Any header word, half the time one whose damage opens a cache (never MAGIC, VERSION ...).
SIDE_WORDS = st.one_of(
    st.integers(0, C.HEADER_WORDS - 1),
    st.sampled_from(
        [
            C.W_MAXBYTES,
            C.W_TTL,
            C.W_SERIALIZER,
            C.W_CULL,
            C.W_EVICTIONS,
            C.W_EXPIRATIONS,
            C.W_BYTES,
            C.W_NEXT,
            C.W_FREE,
            C.W_FLAGS,
            C.W_BATCH,
        ]
    ),
)
#: Sizes to truncate the side segment to (mostly none).
TRUNCATE = st.one_of(
    st.none(), st.none(), st.none(), st.integers(0, 1 << 16), st.integers(0, 1 << 13).map(lambda n: 8 * n)
)


def _settings(c: Any) -> Any:
    return c.maxsize, c.maxbytes, c.default_ttl, c.serializer, c.cull_frequency


def _no_slot_twice(h: Any) -> None:
    """No two entries share a slot."""
    with h.lock:
        if h._side.nslots:  # (else every entry has slot 0)
            slots = [e[1] for e in h._d.values()]
            assert len(set(slots)) == len(slots), "a slot given twice"


def _use_cache(h: Any, written: dict[str, Any], settings: Any, one_count: bool) -> None:
    """Settings as made (``settings``, unless None), reads give what was written or
    nothing, a value set is read back (unless expired at once), writes (evicting)
    work and keep the bytes bound, and -- with at most one of FREE and NEXT damaged (``one_count``) -- never
    give a slot twice (both, lined up with stale stack cells, can until the next
    rebuild), expire() works; then, after a write that fits, the bounds hold and the
    side segment is exact."""
    assert settings is None or _settings(h) == settings, (_settings(h), settings)
    for key, value in written.items():
        assert attempt(h.get, key) in (None, value), key
    if not isinstance(attempt(lambda: h.set("probe", [1])), SharedDictError):
        assert h.get("probe") == [1] or (h.default_ttl or 1) < 1, "a value set is not read back"
    for i in range(3 * (h.maxsize or 20)):
        out = attempt(h.set, f"n{i}", [i, "v" * (i % 50)])
    if h.maxbytes is not None and not isinstance(out, SharedDictError):
        assert h.stats()["bytes"] <= h.maxbytes  # (a damaged count is recounted)
    for op in (
        lambda: h.incr("c", 2, default=1),
        lambda: h.add("a", 1, ttl=0.001),
        lambda: h.touch("n1", 60),
        lambda: h.set_many({"m1": 1, "m2": 2}, ttl=5),
        lambda: h.delete_many(["m1", "n2"]),
        lambda: h.pop("n3", None),
        lambda: h.delete("k0"),
        lambda: list(h),
        lambda: len(h),
        h.stats,
    ):
        attempt(op)
    if one_count:
        _no_slot_twice(h)
    attempt(h.expire)
    fits = not isinstance(
        attempt(lambda: h.set("last", 0)), SharedDictError
    )  # (a damaged maxbytes: TooLarge)
    with h.lock:
        assert h.maxsize is None or len(h) <= h.maxsize
        assert h.maxbytes is None or not fits or h.stats()["bytes"] <= h.maxbytes
        assert check_side(h) == (0, 0)  # exact since expire()'s rebuild


@settings(max_examples=soak_scaled(150), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    bounds=CACHE_BOUNDS,
    keys=st.integers(0, 25),
    truncate=TRUNCATE,
    edits=st.lists(st.tuples(SIDE_WORDS, SIDE_VALUES), max_size=3),
)
def test_cache_side_segment_damage_is_an_error_or_a_bounded_cache(
    bounds: dict[str, Any], keys: int, truncate: Any, edits: list[Any]
) -> None:
    """Garbage in the header words of a cache's side segment (``N@c``) and
    truncation (nobody maps it): opening the cache gives one of our errors, or a
    cache with the settings it was made with (unless a settings word was hit) that
    reads what was written (or nothing) and works within its bounds -- never
    another exception, a hang or a write outside the segment.  Not fuzzed:
    the serializer word set to the *other* serializer (nothing tells it from the
    real one: values would be unpickled, or returned pickled)."""
    name = unique_name()
    init_timeout, C.INIT_TIMEOUT = C.INIT_TIMEOUT, 0.05  # a zero MAGIC: "still being made"
    old_handler = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(20)
    try:
        c = SharedCache(name, auto_unlink=False, **bounds)
        written = {f"k{i}": [i, "v" * i] for i in range(keys)}
        c.set_many(written)
        serializer = C.SERIALIZERS[c.serializer]
        made = _settings(c)
        c.close()
        touched = {index for index, _ in edits}
        if touched & {C.W_MAXSIZE, C.W_MAXBYTES, C.W_TTL, C.W_SERIALIZER, C.W_CULL} or (
            not keys and (touched & {C.W_MAGIC, C.W_TOKEN} or truncate is not None)
        ):
            made = None  # other settings, or (empty) replaced by the opener's
        seg = Segment.attach(C.cache_name(name))
        words = memoryview(seg.buf).cast("Q")
        for index, value in edits:
            if not (index == C.W_SERIALIZER and value in C.SERIALIZERS.values() and value != serializer):
                words[index] = value
        words.release()
        seg.close()
        if truncate is not None:
            os.truncate(f"/dev/shm/{C.cache_name(name)}", truncate % seg.size)
        h = attempt(lambda: SharedCache(name))
        if isinstance(h, SharedCache):
            try:
                _use_cache(h, written, made, len(touched & {C.W_FREE, C.W_NEXT}) < 2)
            finally:
                h.close()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)
        C.INIT_TIMEOUT = init_timeout
        attempt(lambda: unlink_by_name(name))
        leftovers = listing.listed(name)
        for entry in leftovers:
            segments.unlink(entry)
    assert not leftovers, f"unlink_by_name left {leftovers}"


_NUMBER = st.one_of(st.floats(), st.integers(-2, 10**12))
#: Values that are not entries (cache_layout: (expires, slot, value) or a claim of 4).
NOT_ENTRIES = st.one_of(
    st.integers(),
    st.text(max_size=3),
    st.none(),
    st.binary(max_size=3),
    st.lists(st.integers(), max_size=4),
    st.tuples(),
    st.tuples(_NUMBER),
    st.tuples(_NUMBER, st.integers(0, 3)),
    st.tuples(
        st.one_of(st.text(max_size=2), st.none(), st.binary(max_size=2)), st.integers(0, 3), st.integers()
    ),
    st.tuples(
        _NUMBER,
        st.one_of(st.integers(-3, -1), st.integers(10**6, 1 << 70), st.floats(), st.text(max_size=2)),
        st.integers(),
    ),
    st.tuples(_NUMBER, st.integers(0, 3), st.integers(), st.integers(), st.integers()),
)
#: Not entries that reads take for misses (len != 3): what a ``cached()`` claim is met by.
CLAIM_LIKE = st.one_of(
    st.tuples(_NUMBER),
    st.tuples(_NUMBER, st.integers()),
    st.tuples(
        _NUMBER,
        st.integers(-1, 40),
        st.one_of(st.integers(), st.text(max_size=2), st.none(), st.floats()),
        st.one_of(st.integers(), st.none()),
    ),
    st.tuples(_NUMBER, st.integers(), st.integers(), st.integers(), st.integers()),
)


@settings(max_examples=soak_scaled(100), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    bounds=CACHE_BOUNDS,
    keys=st.integers(0, 25),
    garbage=st.lists(NOT_ENTRIES, min_size=1, max_size=4),
    over_keys=st.booleans(),
    claim=CLAIM_LIKE,
)
def test_cache_writers_remove_what_is_not_an_entry(
    bounds: dict[str, Any], keys: int, garbage: list[Any], over_keys: bool, claim: Any
) -> None:
    """Values that are not entries, written into a cache's dict by another program
    (a plain SharedDict of the same name): writes, eviction, active expiry, the cull,
    popitem, ``cached()`` and a rebuild remove them (or raise our errors), never
    another exception; the bounds hold and the side segment is exact."""
    from ultradict_ng.cache import cached

    name = unique_name()
    old_handler = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(20)
    c = SharedCache(name, **bounds)
    raw = SharedDict(name=name, create=False)
    memo = cached(name=name, maxsize=c.maxsize, serializer=c.serializer)(lambda x: x + 1)
    try:
        c.set_many({f"k{i}": [i, "v" * i] for i in range(keys)}, ttl=random.choice([None, 0.001, 30]))
        bad = [f"k{i}" if over_keys and i < keys else f"bad{i}" for i in range(len(garbage))]
        for key, value in zip(bad, garbage):
            raw[key] = value
        c.set("fresh", 1, ttl=0.001)  # an expiring entry: writes sample for expired ones
        for i in range(3 * (c.maxsize or 20)):
            attempt(c.set, f"n{i}", [i, "v" * (i % 50)])
        raw[(1,)] = claim  # where memo(1) claims
        assert memo(1) == 2 and memo(1) == 2
        for op in (lambda: c.set(bad[0], 0), lambda: c.set_many({bad[-1]: 1, "m": 2}), c.popitem):
            attempt(op)
        for key, value in zip(bad, garbage):
            raw[f"late{key}"] = value  # (writes removed the first ones: these meet the rebuild)
        with c.lock:
            c._rebuild()  # (what expire() does after removing expired entries)
            assert all(slot_of(e, c._side.nslots) >= 0 for e in raw.values()), "a rebuild left garbage"
            assert c.maxsize is None or len(raw) <= c.maxsize
            assert c.maxbytes is None or c.stats()["bytes"] <= c.maxbytes
            assert check_side(c) == (0, 0)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)
        memo.cache().close()
        raw.close()
        c.unlink()
        c.close()


NOT_ENTRY_EXAMPLES = [
    5,
    "abc",
    None,
    [0.0, 0, "v"],
    (),
    (1.0,),
    (0.0, 1),
    (0.0, 10**6, "v"),
    (0.0, -1, "v"),
    (0.0, "s", "v"),
    ("x", 0, "v"),
    (b"x", 0, "v"),
    (0.0, 1.5, "v"),
    (0.0, 1 << 70, "v"),
    (0.0, 0, "v", 1, 2),
    (0.0, 0, "not an owner", "token"),
]


def _use_the_bad_key(c: SharedCache, op: str) -> Any:
    """One of a cache's methods, named ``op``, on the key ``"bad"`` (or the whole cache)."""
    return {
        "get": lambda: c.get("bad"),
        "contains": lambda: "bad" in c,
        "iter": lambda: list(c),
        "len": lambda: len(c),
        "expire": c.expire,
        "delete": lambda: c.delete("bad"),
        "add": lambda: c.add("bad", 1),
        "incr": lambda: c.incr("bad", default=0),
        "touch": lambda: c.touch("bad", 5),
        "pop": lambda: c.pop("bad", None),
        "ttl": lambda: c.ttl("bad"),
        "popitem": lambda: [c.popitem() for _ in range(2)],
        "delete_many": lambda: c.delete_many(["bad"]),
        "setdefault": lambda: c.setdefault("bad", 1),
    }[op]()


def test_cache_reads_of_what_is_not_an_entry_are_clean() -> None:
    """Each value that is not an entry, under a key of a cache's dict: every read and
    write of that key, and of the whole cache, answers (absent) or raises one of
    our errors (they raised TypeError, IndexError, ValueError before 3dde552)."""
    failures = []
    for garbage in NOT_ENTRY_EXAMPLES:
        name = unique_name()
        c = SharedCache(name, maxsize=10)
        raw = SharedDict(name=name, create=False)
        try:
            c.set("good", 1)
            for op in (
                "get",
                "contains",
                "iter",
                "len",
                "expire",
                "delete",
                "add",
                "incr",
                "touch",
                "pop",
                "ttl",
                "popitem",
                "delete_many",
                "setdefault",
            ):
                raw["bad"] = garbage
                try:
                    _use_the_bad_key(c, op)
                except (SharedDictError, KeyError):
                    pass
                except TypeError as exc:
                    if not str(exc).startswith("incr: the value"):  # (a value that is not an int)
                        failures.append(f"{op} of {garbage!r}: TypeError: {exc}")
                except Exception as exc:  # collected, the test fails
                    failures.append(f"{op} of {garbage!r}: {type(exc).__name__}: {exc}")
        finally:
            raw.close()
            c.unlink()
            c.close()
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "word, value",
    [
        (C.W_MAGIC, 0),
        (C.W_MAGIC, 1),
        (C.W_VERSION, C.SIDE_VERSION + 1),
        (C.W_TOKEN, 12345),
        (C.W_NSLOTS, 35),
        (C.W_MAXSIZE, 21),
        (C.W_MAXSIZE, 0),
        (C.W_SERIALIZER, 0),
        (C.W_SERIALIZER, 7),
        (C.W_TTL, _f64(float("nan"))),
        (C.W_TTL, _f64(-1.0)),
        ("size", 8 * 40 + 4),
        ("size", 64),
    ],
)
def test_cache_side_header_damage_each_word(word: Any, value: int) -> None:
    """Each check of the side segment's header (side.py), alone: a pickle cache of
    maxsize 20 holding entries, one word damaged (or the segment cut to ``value``
    bytes), opens as CorruptSegment."""
    name = unique_name()
    init_timeout, C.INIT_TIMEOUT = C.INIT_TIMEOUT, 0.05
    try:
        c = SharedCache(name, maxsize=20, serializer="pickle", auto_unlink=False)
        c["k"] = [1]
        c.close()
        if word == "size":
            os.truncate(f"/dev/shm/{C.cache_name(name)}", value)
        else:
            seg = Segment.attach(C.cache_name(name))
            words = memoryview(seg.buf).cast("Q")
            words[word] = value
            words.release()
            seg.close()
        with pytest.raises(CorruptSegment):
            SharedCache(name).close()
    finally:
        C.INIT_TIMEOUT = init_timeout
        unlink_by_name(name)


def test_cache_rebuild_and_a_full_write_recount_damaged_sizes_and_bytes() -> None:
    """Size cells zeroed and the bytes word at its end (damage, or crashes
    between the steps): a write that finds nothing left to evict recounts bytes
    once instead of evicting everything for good, and expire()'s rebuild recounts
    every size cell from the entries."""
    name = unique_name()
    c = SharedCache(name, maxbytes=2000)
    try:
        for i in range(10):
            c[f"k{i}"] = "v" * 50
        side = c._side
        for slot in range(side.nslots and 16):
            side.sizes[slot] = 0
        side.words[C.W_BYTES] = (1 << 64) - 1
        c["new"] = 1
        assert c.stats()["bytes"] <= 2000 and c["new"] == 1
        for slot in range(16):
            side.sizes[slot] = 0
        c.expire()
        with c.lock:
            assert check_side(c) == (0, 0)
    finally:
        c.unlink()
        c.close()
