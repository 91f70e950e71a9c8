"""The copies a read hands out (``speedups.copy_plain``; ``_helper/copytree.c``
and its twin ``_helper/copytree.py``), and the reads that use them.

A read of a mutable value must give the caller a copy that shares no mutable
object with the process's cache, equal to it and of the same types, exactly
what ``codec.copy_value`` gave before the copy was compiled; anything not
plain (a blob's placeholder, a type only pickle stores, a dict key whose hash
could run Python code under a mutable value, a tree deeper than
``COPY_DEPTH``) is declined (None) and left to the Python rules.
"""

from __future__ import annotations

import datetime
import decimal
import os
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ultradict_ng import SharedDict, speedups, unlink_by_name
from ultradict_ng._codec.copies import IMMUTABLE_TYPES, _copy, copy_value
from ultradict_ng._codec.placeholders import BlobRef
from ultradict_ng._helper import copytree
from ultradict_ng.cache import SharedCache

IMPLS = [
    pytest.param(copytree, id="twin"),
    pytest.param(
        speedups._compiled,
        id="native",
        marks=pytest.mark.skipif(speedups._compiled is None, reason="the compiled helper is not built"),
    ),
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.sampled_from([datetime.date(2026, 1, 2), decimal.Decimal("1.5"), frozenset({1, "a"})]),
)
hashables = st.recursive(scalars, lambda inner: st.tuples(inner, inner), max_leaves=4)
base_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=4)
)
plain_keys = st.one_of(base_scalars, st.tuples(base_scalars, base_scalars))
trees = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(plain_keys, inner, max_size=4),
        st.tuples(inner, inner),
        st.sets(hashables, max_size=3),
        st.binary(max_size=4).map(bytearray),
    ),
    max_leaves=24,
)


def _mutable_ids(v: Any, out: set[int]) -> set[int]:
    """ids of every mutable container inside v (v included)."""
    if type(v) in (list, dict, set, bytearray):
        out.add(id(v))
    if type(v) in (list, tuple):
        for x in v:
            _mutable_ids(x, out)
    elif type(v) is dict:
        for x in v.values():
            _mutable_ids(x, out)
    return out


def _same_shape(a: Any, b: Any) -> None:
    """a and b are equal with the same types all the way down, and share
    every immutable leaf (a copy never copies what it may hand out)."""
    assert type(a) is type(b)
    if type(a) in (list, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same_shape(x, y)
    elif type(a) is dict:
        assert list(a) == list(b)  # the same keys in the same order
        for k in a:
            _same_shape(a[k], b[k])
    elif type(a) in IMMUTABLE_TYPES:
        assert a is b
    else:
        assert a == b


@pytest.fixture(autouse=True)
def _types():
    for impl in (copytree, speedups._compiled):
        if impl is not None:
            impl.set_immutable_types(IMMUTABLE_TYPES)


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=300, deadline=None)
@given(trees)
def test_a_copy_equals_the_value_and_shares_nothing_mutable(impl, value):
    out = impl.copy_plain(value)
    assert out is not None or value is None
    _same_shape(out, value)
    assert _mutable_ids(out, set()).isdisjoint(_mutable_ids(value, set()))
    # What the Python rules give, exactly.
    _same_shape(out, _copy(value, None))
    if type(value) in IMMUTABLE_TYPES or (type(value) is tuple and not _mutable_ids(value, set())):
        assert out is value


@settings(max_examples=300, deadline=None)
@given(trees)
def test_the_twins_agree(value):
    if speedups._compiled is None:
        pytest.skip("the compiled helper is not built")
    a, b = copytree.copy_plain(value), speedups._compiled.copy_plain(value)
    _same_shape(a, b)


class _Key:
    """A key whose hash is Python code."""

    def __hash__(self) -> int:
        return 1

    def __eq__(self, other: object) -> bool:
        return self is other


@pytest.mark.parametrize("impl", IMPLS)
def test_what_is_not_plain_is_declined(impl):
    ref = BlobRef(1, "bytes", 10, None)
    assert impl.copy_plain({"a": [1, ref]}) is None
    assert impl.copy_plain([object()]) is None
    assert impl.copy_plain((1, [uuid.uuid4()])) is None
    assert impl.copy_plain({_Key(): [1]}) is None  # a mutable value under a key Python hashes
    assert impl.copy_plain({(1, (2,)): [1]}) is None  # (only scalars, or tuples of them, qualify)
    assert impl.copy_plain({(1, "a"): [1]}) == {(1, "a"): [1]}
    k = _Key()
    assert impl.copy_plain({k: 1}) == {k: 1}  # (an immutable value under it: PyDict_Copy)
    # copy_value still gives the Python rules' answer for all of them.
    assert copy_value({"a": [1, ref]}, lambda r: b"x" * 10) == {"a": [1, b"x" * 10]}


@pytest.mark.parametrize("impl", IMPLS)
def test_a_tree_deeper_than_the_limit_is_declined(impl):
    def nested(n: int) -> Any:
        v: Any = [1]
        for _ in range(n - 1):
            v = [v]
        return v

    ok = nested(copytree.COPY_DEPTH)
    assert impl.copy_plain(ok) == ok
    assert impl.copy_plain(nested(copytree.COPY_DEPTH + 1)) is None
    deep = nested(400)  # copy_value copies it all the same (the Python rules)
    out = copy_value(deep)
    assert out == deep and out is not deep


@pytest.fixture
def name():
    n = f"udng_ct_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    yield n
    try:
        unlink_by_name(n)
    except FileNotFoundError:
        pass


DOC = {"user": 42, "name": "x" * 50, "tags": ["a", "b", "c"], "at": (1, [2]), "s": {1, 2}}


def test_a_read_hands_out_the_callers_own_copy(name):
    d = SharedDict(name=name, create=True)
    other = SharedDict(name=name)
    try:
        d["k"] = DOC
        for h in (d, other):
            first, second = h["k"], h["k"]
            assert first == DOC and first is not second
            assert _mutable_ids(first, set()).isdisjoint(_mutable_ids(second, set()))
            first["tags"].append("d")
            first["at"][1].append(3)
            assert h["k"] == DOC and h.get("k") == DOC and dict(h.items())["k"] == DOC
    finally:
        other.close()
        d.close()


def test_a_nested_dict_still_reads_as_a_view_and_a_blob_through_the_rules(name):
    d = SharedDict(name=name, create=True, recurse=True, blob_threshold=1024)
    try:
        d["sub"] = {"a": [1, 2]}
        assert isinstance(d["sub"], SharedDict)
        d["sub"]["a"] = [3]
        assert d["sub"]["a"] == [3]
        d["list"] = [{"x": 1}, b"y" * 4096]  # the bytes go to a blob: a placeholder in the cache
        got = d["list"]
        assert got == [{"x": 1}, b"y" * 4096] and type(got[0]) is dict
    finally:
        d.close()


def test_a_cache_get_hands_out_the_callers_own_copy(name):
    c = SharedCache(name, maxsize=8)
    other = SharedCache(name)
    try:
        c["doc"] = DOC
        for h in (c, other):
            first, second = h.get("doc"), h["doc"]
            assert first == DOC and first is not second
            assert _mutable_ids(first, set()).isdisjoint(_mutable_ids(second, set()))
            first["tags"].append("d")
            assert h.get("doc") == DOC
        assert c.stats()["hits"] == 3  # (this handle's)
    finally:
        other.close()
        c.close()
        SharedCache.unlink_by_name(name)


def test_a_written_tree_is_never_the_callers_object(name):
    """A JSON-like value written by the compiled record path: the writer's cache
    holds a copy, so changing the value afterwards changes nothing stored."""
    d = SharedDict(name=name, create=True)
    other = SharedDict(name=name)
    try:
        v = {"a": [1], "n": None}
        d["k"] = v
        assert d._store.data["k"] is not v  # (write_simple took it: see test_native)
        v["a"].append(2)
        assert d["k"] == {"a": [1], "n": None} == other["k"]
        d["e"] = (1.5, 3, v)  # a cache's entry shape
        v["a"].append(3)
        assert d["e"] == (1.5, 3, {"a": [1, 2], "n": None}) == other["e"]
        with d.transaction():
            d["x"] = v
            v["a"].append(4)
            assert d["x"]["a"] == [1, 2, 3]
        assert other["x"]["a"] == [1, 2, 3]
    finally:
        other.close()
        d.close()


def test_the_compiled_checks_never_count_a_container_as_immutable() -> None:
    """The compiled immutable check rules out tuples, dicts and lists before
    it looks at the codec's set: none of them may ever be in it."""
    from ultradict_ng._codec.copies import IMMUTABLE_TYPES

    assert not IMMUTABLE_TYPES & {tuple, dict, list, set, bytearray}
