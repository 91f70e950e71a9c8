"""The compiled decoder of a big dict's values (``speedups.unpack_simple``,
``speedups.tuple_hook``; ``_helper/unpack.c``) and its twins.

Both may only ever give what the codec's general path gives -- msgpack's
``unpackb`` with the Python ext hooks -- for the same bytes: a scalar or a
tuple of scalars is decoded (the same value, of the same types), anything
else is declined and left to that path, also every byte string msgpack
rejects.  Checked on the codec's own encodings of every kind of value, on
those bytes damaged, and on random bytes.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ultradict_ng import speedups
from ultradict_ng._codec import codec as codec_module
from ultradict_ng._codec import decode
from ultradict_ng._helper import twins, unpack
from ultradict_ng.errors import CorruptSegment

MSGPACK = codec_module.codec_for(None)
DECLINED: Any = object()

impls = pytest.mark.parametrize(
    "impl",
    [
        pytest.param(twins, id="twin"),
        pytest.param(
            speedups._compiled,
            id="native",
            marks=pytest.mark.skipif(speedups._compiled is None, reason="the compiled helper is not built"),
        ),
    ],
)

SCALAR_TYPES = (type(None), bool, int, float, str, bytes)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=70),
    st.binary(max_size=70),
    st.sampled_from(
        [
            0,
            127,
            128,
            255,
            256,
            -32,
            -33,
            -128,
            -129,
            2**16,
            2**31,
            -(2**31) - 1,
            2**32,
            2**63,
            -(2**63),
            "x" * 31,
            "x" * 32,
            "é" * 200,
            b"z" * 256,
            "y" * 65536,
        ]
    ),
)
others = st.one_of(
    st.integers(2**64, 2**70),
    st.lists(scalars, max_size=3),
    st.dictionaries(st.text(max_size=3), scalars, max_size=3),
    st.frozensets(st.integers(), max_size=3),
    st.sets(st.integers(), max_size=3),
    st.sampled_from([1j, bytearray(b"ab"), ((1,),), (2**64,), ([1],), ((),), ("a", frozenset({1}))]),
)
values = st.one_of(scalars, st.lists(scalars, max_size=20).map(tuple), others)


def general(data: bytes) -> Any:
    """What the codec decodes ``data`` to without the compiled fast paths (or the exception)."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=decode._HOOKS[0])
    except Exception as exc:
        return exc


def same(a: Any, b: Any) -> bool:
    """Equal, of the same types all the way down (NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    if type(a) in (tuple, list):  # (lists and dicts too: what the hook decodes nested, [nan] != [nan])
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if type(a) is float and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def simple(value: Any) -> bool:
    in_range = lambda x: type(x) is not int or -(2**63) <= x < 2**64  # noqa: E731
    if type(value) is tuple:
        return all(type(x) in SCALAR_TYPES and in_range(x) for x in value)
    return type(value) in SCALAR_TYPES and in_range(value)


@impls
@settings(max_examples=400, deadline=None)
@given(values)
def test_a_scalar_or_tuple_of_scalars_decodes_as_the_codec_and_nothing_else(impl, value):
    data = MSGPACK.dumps(value)
    out = impl.unpack_simple(data, DECLINED)
    if simple(value):
        assert out is not DECLINED, f"{value!r} was declined"
        assert same(out, general(data)) and same(out, value)
    else:
        assert out is DECLINED, f"{value!r} decoded to {out!r}"


@impls
@settings(max_examples=400, deadline=None)
@given(
    values,
    st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=3),
    st.integers(-3, 3),
)
def test_damaged_bytes_decode_as_msgpack_does_or_are_declined(impl, value, edits, resize):
    """Bytes changed, cut short or extended: whatever is decoded is what the
    general path decodes, and both implementations agree."""
    data = bytearray(MSGPACK.dumps(value))
    for at, byte in edits:
        if data:
            data[at % len(data)] = byte
    data = bytes(data[: len(data) + resize] if resize < 0 else data + b"\x00" * resize)
    out = impl.unpack_simple(data, DECLINED)
    if out is not DECLINED:
        ref = general(data)
        assert same(out, ref), f"{data!r}: {out!r}, the general path {ref!r}"
    other = unpack.unpack_simple(data, DECLINED)
    assert (out is DECLINED and other is DECLINED) or same(out, other)


@impls
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_random_bytes_decode_as_msgpack_does_or_are_declined(impl, data):
    out = impl.unpack_simple(data, DECLINED)
    if out is not DECLINED:
        assert same(out, general(data))


@impls
def test_every_scalar_format_is_decoded(impl):
    """The formats the codec never writes but msgpack reads (float 32, the
    wide forms of small numbers) are decoded too, as msgpack decodes them."""
    for data in (
        b"\xca\x3f\xc0\x00\x00",
        b"\xcd\x00\x01",
        b"\xce\x00\x00\x00\x01",
        b"\xcf" + bytes(7) + b"\x01",
        b"\xd1\xff\xff",
        b"\xd2\xff\xff\xff\xff",
        b"\xd3" + b"\xff" * 8,
        b"\xda\x00\x01a",
        b"\xdb\x00\x00\x00\x01a",
        b"\xc5\x00\x01a",
        b"\xc6\x00\x00\x00\x01a",
        b"\xc8\x00\x02\x01\x91\x01",
        b"\xc9\x00\x00\x00\x02\x01\x91\x01",
        b"\xc7\x03\x01\xdc\x00\x00",
    ):
        out = impl.unpack_simple(data, DECLINED)
        assert out is not DECLINED and same(out, general(data)), data
    for data in (
        b"",
        b"\xc1",
        b"\xa1\xff",
        b"\x91\x01",
        b"\xd4\x02\x01",
        b"\xd6\xff\x00\x00\x00\x00",
        b"\xd5\x01\x91",
        b"\x01\x01",
        b"\xd7\x01\x93\x01\x02\x03\x04\x05",
    ):
        assert impl.unpack_simple(data, DECLINED) is DECLINED, data


@impls
@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.just(1), st.integers(-128, 127)),
    st.one_of(st.binary(max_size=30), st.lists(values, max_size=4).map(MSGPACK.dumps)),
)
def test_tuple_hook_is_the_python_hook(impl, code, payload):
    """The root ext hook gives the Python hook's result (or its exception) for
    every code and payload; ext 1 of scalars without calling it."""
    try:
        expected: Any = decode._HOOKS[0](code, payload)
    except Exception as exc:
        expected = type(exc)
    calls = []

    def fallback(c, d):
        calls.append(c)
        return decode._HOOKS[0](c, d)

    try:
        got: Any = impl.tuple_hook(fallback, code, payload)
    except Exception as exc:
        got = type(exc)
    assert got == expected if isinstance(expected, type) else same(got, expected)
    if (
        code == 1
        and unpack.unpack_simple(b"\xc9" + len(payload).to_bytes(4, "big") + b"\x01" + payload, DECLINED)
        is not DECLINED
    ):
        assert not calls, "a tuple of scalars went through the Python hook"


def test_the_codec_takes_the_compiled_paths(monkeypatch):
    """codec.loads answers a row through unpack_simple, and a dump's rows go
    through tuple_hook at the root (the Python hook only below it)."""
    assert decode.ROOT_HOOK.func is speedups.tuple_hook and decode.ROOT_HOOK.args == (decode._HOOKS[0],)
    seen = []
    real = codec_module.unpack_simple
    monkeypatch.setattr(
        codec_module, "unpack_simple", lambda d, default: seen.append(real(d, default)) or seen[-1]
    )
    assert MSGPACK.loads(MSGPACK.dumps((1, "a", 2.5))) == (1, "a", 2.5)
    assert seen == [(1, "a", 2.5)]
    assert MSGPACK.loads(MSGPACK.dumps({"k": (1, (2,))})) == {"k": (1, (2,))}


# -- table_rows: a table's rows into a dict, the rest left to the serializer --------

table_keys = st.one_of(
    st.text(max_size=8),
    st.integers(-(2**63), 2**64 - 1),
    st.binary(max_size=4),
    st.tuples(st.integers(0, 9), st.text(max_size=2)),
    st.just(frozenset({1})),
)


def make_table(data: Any) -> Any:
    from ultradict_ng._shm.table import Table, hash_key, map_size, write_map

    packed = MSGPACK.dumps(data)
    hashes = [hash_key(k) for k in data]
    buf = bytearray(map_size(packed, hashes))
    write_map(memoryview(buf), packed, hashes, 1, 7)
    return buf, Table(memoryview(buf), 7)


@impls
@settings(max_examples=150, deadline=None)
@given(st.dictionaries(table_keys, values, max_size=25))
def test_table_rows_decodes_rows_until_the_first_entry_that_is_not_one(impl, model):
    buf, table = make_table(model)
    out: dict = {}
    off = impl.table_rows(buf, table.start, table.end, table.start, out)
    items = list(model.items())
    n = next((i for i, (k, v) in enumerate(items) if not (simple(k) and simple(v))), len(items))
    assert len(out) == n and all(same(k, mk) and same(v, mv) for (k, v), (mk, mv) in zip(out.items(), items))
    offsets = list(table.offsets()) + [table.end]
    assert off == offsets[n]
    # Table.decode_all: the rows compiled, the rest by the serializer -- the same dict, in order.
    for rows in (True, False):
        whole = table.decode_all(MSGPACK.loads, rows)
        assert MSGPACK.dumps(whole) == MSGPACK.dumps(model)  # (equal encodings: NaN inside lists too)


@impls
@settings(max_examples=150, deadline=None)
@given(st.dictionaries(table_keys, values, max_size=25), st.data())
def test_table_rows_into_a_list_leaves_out_skip_and_takes_subst(impl, model, data):
    """Into a list: the same rows as pairs, in order, the keys of ``skip``
    left out and the values of ``subst`` taken (looked up by equal keys: 1.0
    finds 1), theirs never decoded; pairs of untracked rows are untracked.  Table.decode_pairs: the
    serializer's rest alike, and how many leading pairs the compiled walk
    decoded unchanged; skipped keys count as entries."""
    import gc

    buf, table = make_table(model)
    keys = list(model)
    skip = set(data.draw(st.lists(st.sampled_from(keys), max_size=5))) if keys else set()
    subst = (
        {k: ("new", i) for i, k in enumerate(data.draw(st.lists(st.sampled_from(keys), max_size=5)))}
        if keys
        else {}
    )
    out: list = []
    off = impl.table_rows(buf, table.start, table.end, table.start, out, skip, subst or None)
    items = list(model.items())
    # (the walk stops at a key that is not a row's, or at such a value it decodes: not skipped, not replaced)
    stops = (not simple(k) or not (simple(v) or k in skip or k in subst) for k, v in items)
    n = next((i for i, stop in enumerate(stops) if stop), len(items))
    want = [(k, subst.get(k, v)) for k, v in items if k not in skip]
    walked = [(k, subst.get(k, v)) for k, v in items[:n] if k not in skip]
    assert len(out) == len(walked) and all(same(a, b) for pa, pb in zip(out, walked) for a, b in zip(pa, pb))
    assert off == (list(table.offsets()) + [table.end])[n]
    if impl is not twins:
        # (a decoded row's pair; a subst value may be untracked by a collection after its pair was made)
        assert not any(
            gc.is_tracked(p)
            for p in out
            if p[0] not in subst and not (gc.is_tracked(p[0]) or gc.is_tracked(p[1]))
        )
    for rows in (True, False):
        pairs, known = table.decode_pairs(MSGPACK.loads, rows, skip, subst or None)
        assert MSGPACK.dumps(pairs) == MSGPACK.dumps(want)
        assert known == (len(walked) if rows and not subst else 0)
    if keys:  # a count the entries do not add up to: CorruptSegment, as decode_all raises
        with pytest.raises(CorruptSegment, match="do not add up"):
            table.decode_pairs(MSGPACK.loads, True, skip | {object()}, None)


@impls
@given(st.integers(0, 1 << 12), st.integers(0, 255))
def test_table_rows_raises_on_a_damaged_entry_as_table_chunk_does(impl, at, byte):
    buf, table = make_table({f"k{i}": (i, "v") for i in range(40)})
    at = table.start + at % (table.end - table.start)
    if buf[at] == byte:
        return
    buf[at] = byte
    try:
        speedups.table_chunk(buf, table.start, table.end, table.start, 1000)
    except ValueError as exc:
        with pytest.raises(ValueError, match=str(exc)):
            impl.table_rows(buf, table.start, table.end, table.start, {})
    else:  # (a byte of padding: no entry covers it)
        assert impl.table_rows(buf, table.start, table.end, table.start, {}) == table.end


@impls
def test_decoded_rows_are_not_tracked_by_the_cycle_collector(impl):
    """A tuple of scalars cannot be in a cycle: the compiled decoder leaves it
    untracked, as the collector would after a first pass over it (a pass over
    a million fresh rows cost ~0.3 s)."""
    import gc

    row = impl.unpack_simple(MSGPACK.dumps((1, "a", 2.5)), DECLINED)
    hooked = impl.tuple_hook(decode._HOOKS[0], 1, MSGPACK.dumps((1, "a"))[2:])
    assert row == (1, "a", 2.5) and hooked == (1, "a")
    if impl is not twins:  # (the twins build the tuple as msgpack and tuple() do)
        assert not gc.is_tracked(row) and not gc.is_tracked(hooked)
    assert gc.is_tracked(MSGPACK.loads(MSGPACK.dumps((1, [2]))))  # (not a tuple of scalars)


# -- first_to_export: a snapshot's values checked in one call ------------------------


@pytest.mark.parametrize(
    "impl",
    [
        pytest.param(twins, id="twin"),
        pytest.param(
            speedups._compiled,
            id="native",
            marks=pytest.mark.skipif(speedups._compiled is None, reason="the compiled helper is not built"),
        ),
    ],
)
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(), values), max_size=12))
def test_first_to_export_finds_the_first_value_that_is_not_handed_out_as_it_is(impl, pairs):
    from ultradict_ng.shareddict import _IMMUTABLE

    impl.set_immutable_types(_IMMUTABLE)
    expected = next(
        (
            i
            for i, (_, v) in enumerate(pairs)
            if not (type(v) in _IMMUTABLE or (type(v) is tuple and _IMMUTABLE.issuperset(map(type, v))))
        ),
        len(pairs),
    )
    assert impl.first_to_export(pairs) == expected
