"""The seam (``ultradict_ng.speedups``): the compiled helper and its pure-Python twins.

Every entry point exists in ``_native`` and in ``twins`` with the same
name, and each implementation -- the compiled one where it is built, the twin
with both ``atomics`` flavours -- is checked here against an explicit
reference (struct + zlib + msgpack-python): the same stream bytes, the same
lock state transitions, the same answers.  Processes on different
implementations then share a dict (tested at the end).
"""

from __future__ import annotations

import ast
import collections
import importlib
import math
import os
import struct
import subprocess
import sys
import textwrap
import threading
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ultradict_ng import SharedDict, speedups
from ultradict_ng._codec import codec
from ultradict_ng._codec import records as record
from ultradict_ng._helper import copytree, tablewalk, words
from ultradict_ng._helper import twins as fallback
from ultradict_ng._helper.entries import CONSTANTS, ENTRY_POINTS
from ultradict_ng._shm import layout as L
from ultradict_ng._shm import table_layout as TL
from ultradict_ng.errors import Closed

from .helpers import count_decodes

native = speedups._compiled
needs_native = pytest.mark.skipif(native is None, reason="ultradict_ng._helper._native is not compiled")

MSGPACK = codec.codec_for(None)


class _Impl:
    """One implementation's entry points, under the names speedups exports."""

    def __init__(self, module, words):
        self.module = module
        self.Words = words
        for name in ENTRY_POINTS:
            if name != "Words":
                setattr(self, name, getattr(module, name))


def _impls():
    out = [
        pytest.param(_Impl(fallback, fallback.BoundWords), id="bound"),
        pytest.param(_Impl(fallback, fallback.PublicWords), id="public"),
    ]
    if native is not None:
        out.append(pytest.param(_Impl(native, native.Words), id="native"))
    return out


impls = pytest.mark.parametrize("impl", _impls())

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from(
        [
            0,
            127,
            128,
            -32,
            -33,
            -128,
            -129,
            255,
            256,
            2**15,
            -(2**15) - 1,
            2**16,
            2**31,
            -(2**31) - 1,
            2**32,
            2**63 - 1,
            2**63,
            -(2**63),
        ]
    ),
    st.floats(allow_nan=True),
    st.text(max_size=300),
    st.binary(max_size=300),
    st.sampled_from(["x" * 31, "x" * 32, "é" * 128, "y" * 65535, b"z" * 255, b"z" * 65536]),
)
not_simple = st.one_of(
    st.integers(min_value=2**64, max_value=2**70),
    st.integers(max_value=-(2**63) - 1, min_value=-(2**70)),
    st.sampled_from(
        [
            "\ud800",
            1j,
            [1],
            {"a": 1},
            bytearray(b"x"),
            frozenset(),
            ((1,),),
            (2**64,),
            tuple(range(16)),
            ("\ud800",),
        ]
    ),
)


def test_helper_is_built_in_ci():
    """CI installs with gcc present: the compiled path must be the one under test there."""
    forced = os.environ.get(speedups.ENV_VAR) or os.environ.get("ULTRADICT_NG_ATOMICS")
    if os.environ.get("CI") and not forced:
        assert native is not None, "ultradict_ng._helper._native did not compile"
        assert speedups.IMPLEMENTATION == "native"


# -- one interface, described once ---------------------------------------------------


def _public(obj):
    return {n for n in dir(obj) if not n.startswith("__")}


HELPER = os.path.dirname(fallback.__file__)

#: Per entry point, the tests that hold both implementations to one result
#: (``module::test``): each compares them, or runs on every implementation
#: of the seam (the ``impl`` and ``name`` parameters, or CI's bound and public
#: phases for the bases of the read path).
PARITY = {
    "Words": [
        "test_native::test_words_operations_and_errors",
        "test_native::test_write_record_matches_the_spec",
    ],
    "ProcessState": ["test_native::test_process_state_transitions"],
    "StoreBase": ["test_native::test_hit_path_never_answers_from_a_stale_or_closed_cache"],
    "ViewBase": [
        "test_native::test_native_and_fallback_processes_share_one_dict",
        "test_native::test_a_root_set_of_a_scalar_or_tuple_calls_set_root_without_the_slow_frame",
    ],
    "CacheGet": ["test_cache_get::test_compiled_get_answers_every_entry_as_its_twin"],
    "TableCacheBase": [
        "test_tablecache::test_the_compiled_set_takes_str_and_int_keys_and_places_new_ones_later",
        "test_tablecache::test_resolve_places_a_batch_as_one_by_one_would_and_keeps_the_rest_on_error",
        "test_tablecache::test_sets_right_after_a_count_place_their_keys_at_once",
    ],
    "parse_records": ["test_native::test_parse_records_checks_every_record"],
    "msgpack_length": ["test_native::test_msgpack_length_is_the_encoded_length"],
    "apply_sets": ["test_native::test_apply_sets_applies_the_leading_simple_sets"],
    "apply_simple": ["test_native::test_apply_simple_is_the_decode_and_apply_all"],
    "crc32": ["test_native::test_crc32_is_zlibs"],
    "scan_stream": ["test_native::test_scan_stream_twins_agree_on_damaged_streams"],
    "stream_merge_plan": ["test_streammerge::test_the_merge_is_the_dict_the_records_make_on_every_impl"],
    "stream_merge_write": ["test_streammerge::test_the_merge_is_the_dict_the_records_make_on_every_impl"],
    "types_within": ["test_native::test_types_within_is_the_reference_scan"],
    "contains_type": ["test_native::test_contains_type_is_the_reference_walk"],
    "copy_plain": ["test_copytree::test_the_twins_agree"],
    "first_to_export": [
        "test_unpack_simple::test_first_to_export_finds_the_first_value_that_is_not_handed_out_as_it_is"
    ],
    "set_immutable_types": ["test_copytree::test_a_copy_equals_the_value_and_shares_nothing_mutable"],
    "pack_map": ["test_native::test_pack_map_is_the_codecs_general_encoding"],
    "pack_pairs": ["test_native::test_pack_map_is_the_codecs_general_encoding"],
    "unpack_simple": [
        "test_unpack_simple::test_a_scalar_or_tuple_of_scalars_decodes_as_the_codec_and_nothing_else"
    ],
    "tuple_hook": ["test_unpack_simple::test_tuple_hook_is_the_python_hook"],
    "key_hash_common": ["test_native::test_key_hash_common_is_key_hash_or_none"],
    "table_get": ["test_native::test_table_probe_answers_as_the_dict"],
    "table_candidates": ["test_native::test_table_probe_answers_as_the_dict"],
    "table_entry": ["test_native::test_table_entry_checks_as_the_probe"],
    "table_changes": ["test_native::test_table_changes_are_the_probes_and_the_codecs_bytes_on_every_impl"],
    "table_fill": ["test_native::test_table_writers_write_the_same_bytes_on_every_impl"],
    "table_index": ["test_native::test_table_writers_write_the_same_bytes_on_every_impl"],
    "table_merge": ["test_native::test_table_merge_writes_the_same_bytes_on_every_impl"],
    "table_chunk": ["test_native::test_table_writers_write_the_same_bytes_on_every_impl"],
    "table_rows": ["test_unpack_simple::test_table_rows_decodes_rows_until_the_first_entry_that_is_not_one"],
}


@needs_native
def test_the_helper_the_stub_and_the_twins_define_the_listed_names():
    """_native, _native.pyi and the twins define exactly the entry points and
    constants of _helper/entries.py; each lives in the C file the list names
    and in the twin module of the same name."""
    listed = set(ENTRY_POINTS) | set(CONSTANTS)
    assert {n for n in vars(native) if not n.startswith("_")} == listed | {"LAYOUT_CONSTANTS"}
    assert set(fallback.__all__) == listed | {"BoundWords", "PublicWords"}
    stub = ast.parse(open(os.path.join(HELPER, "_native.pyi")).read())
    stubbed = {
        node.name if not isinstance(node, ast.AnnAssign) else node.target.id  # type: ignore[union-attr]
        for node in stub.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AnnAssign))
    }
    assert stubbed == listed | {"LAYOUT_CONSTANTS"}
    for name, module in {**ENTRY_POINTS, **CONSTANTS}.items():
        twin = importlib.import_module(f"ultradict_ng._helper.{module}")
        assert name in twin.__all__, (name, module)
        assert getattr(fallback, name) is getattr(twin, name)
    for name, module in ENTRY_POINTS.items():
        source = open(os.path.join(HELPER, f"{module}.c")).read()
        defined = f'"ultradict_ng._helper._native.{name}"' if name[0].isupper() else f"udng_native_{name}("
        assert defined in source, (name, f"{module}.c")
    for cls in ("Words", "ProcessState", "StoreBase", "ViewBase", "TableCacheBase"):
        assert _public(getattr(native, cls)) <= _public(getattr(fallback, cls)) | {"_bind_state"}, cls
        assert _public(getattr(fallback, cls)) - {"_check", "_view", "_nwords"} >= _public(
            getattr(native, cls)
        ), cls


def test_every_entry_point_has_a_parity_test():
    """Each entry point names the tests that hold its two implementations to
    one result, and those tests exist."""
    assert set(PARITY) == set(ENTRY_POINTS)
    here = os.path.dirname(__file__)
    for name, tests in PARITY.items():
        for test in tests:
            module, function = test.split("::")
            tree = ast.parse(open(os.path.join(here, f"{module}.py")).read())
            assert function in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, (name, test)


@needs_native
def test_the_helpers_layout_constants_are_the_layout_modules():
    """The numbers udng.h compiles in are the layout modules' and the twins'."""
    got = native.LAYOUT_CONSTANTS
    assert got["RECORD_HEADER"] == L.RECORD_HEADER == struct.calcsize(L.RECORD_FORMAT)
    assert got["TABLE_HEADER"] == TL.TABLE_HEADER
    assert got["TABLE_ENTRY_HEADER"] == TL.TABLE_ENTRY_HEADER == struct.calcsize(TL.TABLE_ENTRY_FORMAT)
    assert (1 << got["TABLE_OFFSET_BITS"]) - 1 == TL.TABLE_OFFSET_MASK
    assert got["COPY_DEPTH"] == copytree.COPY_DEPTH
    assert got["PLAIN_DEPTH"] == words.PLAIN_DEPTH


def test_mirrored_constants_agree():
    assert set(fallback.SCALAR_TYPES) == record.SCALAR_TYPES
    assert fallback.RECORD_HEADER == L.RECORD_HEADER == struct.calcsize(L.RECORD_FORMAT)
    if native is not None:
        assert set(native.SCALAR_TYPES) == record.SCALAR_TYPES
        assert native.RECORD_HEADER == L.RECORD_HEADER
        assert native.FUTEX == fallback.FUTEX == int(sys.platform.startswith("linux"))
    # The compiled release finds LOCK_WAITERS, LOCK_SEQ and LOCK_WAKING by position.
    assert (L.W_LOCK_WAITERS, L.W_LOCK_SEQ, L.W_LOCK_WAKING) == (L.W_LOCK + 1, L.W_LOCK + 2, L.W_LOCK + 3)


def test_speedups_exports_one_implementation():
    source = fallback if speedups.IMPLEMENTATION != "native" else native
    for name in (*ENTRY_POINTS, *CONSTANTS):
        if name != "Words":
            assert getattr(speedups, name) is getattr(source, name), name
    assert set(speedups.__all__) == {"IMPLEMENTATION", "ENV_VAR", *ENTRY_POINTS, *CONSTANTS}
    expected_words = {
        "native": getattr(native, "Words", None),
        "bound": fallback.BoundWords,
        "public": fallback.PublicWords,
    }[speedups.IMPLEMENTATION]
    assert speedups.Words is expected_words


# -- stream bytes ----------------------------------------------------------------


@impls
@given(st.binary(max_size=2000), st.integers(min_value=0, max_value=2**32 - 1))
def test_crc32_is_zlibs(impl, data, start):
    assert impl.crc32(data, start) == zlib.crc32(data, start)
    assert impl.crc32(data) == zlib.crc32(data)


@impls
@settings(max_examples=300)
@given(
    st.one_of(scalars, not_simple, st.text(min_size=100, max_size=400), st.binary(min_size=100, max_size=400))
)
def test_key_hash_common_is_key_hash_or_none(impl, key):
    """The table's key hash: the compiled word hash and numeric hash give
    _codec/keyhash.py's values bit for bit (every tail length of the last word
    included); other types and lone surrogates are left to key_hash (None)."""
    from ultradict_ng._codec.keyhash import key_hash

    got = impl.key_hash_common(key)
    if type(key) in (str, bytes, int, bool, float, type(None)) and key != "\ud800":
        assert got == key_hash(key)
    else:
        assert got is None


@impls
@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(
        st.one_of(st.text(max_size=40), st.binary(max_size=40), st.integers()), st.integers(), max_size=40
    ),
    st.lists(st.one_of(st.text(max_size=40), st.binary(max_size=40), st.integers()), max_size=10),
)
def test_table_probe_answers_as_the_dict(impl, model, absent):
    """table_get (str and bytes keys) and table_candidates (the rest) over a table
    built from ``model``; the damage messages are the same strings on every impl."""
    from ultradict_ng._shm.table import hash_key

    buf, slots, start, end = table_of(model)
    for key in list(model) + absent:
        if type(key) in (str, bytes):
            got = impl.table_get(buf, slots, start, end, key)
            assert (MSGPACK.loads(got) if got is not None else None) == model.get(key)
        else:
            pairs = impl.table_candidates(buf, slots, start, end, hash_key(key))
            values = [MSGPACK.loads(v) for k, v in pairs if MSGPACK.loads(k) == key]
            assert values == ([model[key]] if key in model else [])
            # (with offsets: the same pairs, each behind the offset of its entry)
            triples = impl.table_candidates(buf, slots, start, end, hash_key(key), True)
            assert [(k, v) for _, k, v in triples] == pairs
            for off, k, v in triples:
                kl = int.from_bytes(buf[off + 8 : off + 12], "little")
                assert (
                    bytes(buf[off + 24 : off + 24 + kl]) == k
                    and buf[off + 24 + kl : off + 24 + kl + len(v)] == v
                )
    if model:  # damage one entry's value: its probe reports it, the same words on every impl
        from ultradict_ng._shm.table import Table

        k0 = next(iter(model))
        t = Table(memoryview(buf), 0)
        off = t.find(k0, hash_key(k0), MSGPACK.loads)
        _, _, value, _ = t.entry(off)
        last = off + 24 + len(t.entry(off)[1]) + len(value) - 1
        del value
        t.close()
        buf[last] ^= 0xFF
        with pytest.raises(ValueError, match="^table entry fails its checksum$"):
            if type(k0) in (str, bytes):
                impl.table_get(buf, slots, start, end, k0)
            else:
                impl.table_candidates(buf, slots, start, end, hash_key(k0))
        with pytest.raises(ValueError, match="^table entry fails its checksum$"):
            impl.table_entry(buf, slots, start, end, off)


@impls
def test_table_entry_checks_as_the_probe(impl):
    """table_entry gives each entry's (hash, key length, value length) as its
    header holds them, and refuses each kind of damage with the probe's words."""
    model = {f"k{i}": [i, "x" * i] for i in range(20)}
    buf, slots, start, end = table_of(model)
    off, n = start, 0
    while off < end:
        h, kl, vl = impl.table_entry(buf, slots, start, end, off)
        assert (h, kl, vl) == struct.unpack_from("<QII", buf, off)
        assert MSGPACK.loads(bytes(buf[off + 24 : off + 24 + kl])) in model
        off, n = (off + 24 + kl + vl + 7) & ~7, n + 1
    assert n == len(model)
    kl = struct.unpack_from("<I", buf, start + 8)[0]
    for where, bad in [
        (start + 4, "offset outside the entries"),  # not aligned
        (end, "offset outside the entries"),
        (start - 8, "offset outside the entries"),
    ]:
        with pytest.raises(ValueError, match=f"^table entry {bad}$"):
            impl.table_entry(buf, slots, start, end, where)
    for field, value, bad in [(20, 1, "has a nonzero reserved word"), (8, end, "runs past the entries")]:
        broken = bytearray(buf)
        struct.pack_into("<I", broken, start + field, value)
        with pytest.raises(ValueError, match=f"^table entry {bad}$"):
            impl.table_entry(broken, slots, start, end, start)
    broken = bytearray(buf)
    broken[start + 24 + kl] ^= 1  # a byte of the first value
    with pytest.raises(ValueError, match="^table entry fails its checksum$"):
        impl.table_entry(broken, slots, start, end, start)
    with pytest.raises(ValueError, match="^table bounds do not fit the buffer$"):
        impl.table_entry(buf, slots, start, len(buf) + 8, start)


def table_of(model):
    """A table of ``model`` in a bytearray: (buffer, slots, entries start, entries end)."""
    from ultradict_ng._shm.table import encode_entries, table_size, write_table

    entries = encode_entries(model.items(), MSGPACK.dumps)
    size = table_size(len(entries), sum((24 + len(k) + len(v) + 7) & ~7 for _, k, v in entries))
    buf = bytearray(size)
    write_table(memoryview(buf), entries, 1, 0)
    slots = int.from_bytes(buf[24:32], "little")
    return buf, slots, 64 + 8 * slots, int.from_bytes(buf[40:48], "little")


#: Ints at every msgpack length boundary, both signs, and past 64 bits.
BOUNDARY_INTS = sorted(
    {
        s * b + d
        for b in (
            0,
            0x1F,
            0x20,
            0x7F,
            0x80,
            0xFF,
            0x100,
            0xFFFF,
            0x10000,
            0xFFFFFFFF,
            1 << 32,
            (1 << 63) - 1,
            1 << 63,
            (1 << 64) - 1,
        )
        for s in (1, -1)
        for d in (-1, 0, 1)
    }
)


@impls
@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.one_of(
            st.text(max_size=10),
            st.sampled_from(BOUNDARY_INTS),
            st.integers(),
            st.sampled_from([1.0, True, False, 0.0, 2.0**63, -(2.0**63), 7.5]),
        ),
        st.integers(),
        max_size=40,
    ),
    st.lists(st.one_of(st.sampled_from(BOUNDARY_INTS), st.integers(), st.text(max_size=10)), max_size=10),
)
def test_table_offsets_of_str_and_int_keys_are_the_probes(impl, model, absent):
    """table_get(..., offset=True): a str key's entry offset, an int key's by its
    own encoding (every length of msgpack's int forms), or -1 when an entry of
    its hash holds an equal key of another type (1.0, True) or the int has no
    64-bit form; then, and for every other answer, Table.find agrees."""
    from ultradict_ng._shm.table import Table, hash_key

    buf, slots, start, end = table_of(model)
    t = Table(memoryview(buf), 0)
    try:
        for key in [k for k in list(model) + absent if type(k) in (str, int)]:
            got = impl.table_get(buf, slots, start, end, key, True)
            want = t.find(key, hash_key(key), MSGPACK.loads)
            stored = next((k for k in model if k == key), None)
            if got == -1:
                assert type(key) is int and (type(stored) is not int or not -(1 << 63) <= key < 1 << 64)
            else:
                assert got == want, (key, got, want)
                assert (got != 0) == (stored is not None)
    finally:
        t.close()


@needs_native
@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.one_of(
            st.text(max_size=20),
            st.binary(max_size=20),
            st.integers(),
            st.tuples(st.integers(), st.text(max_size=3)),
        ),
        st.one_of(scalars, st.lists(st.integers(), max_size=4)),
        max_size=60,
    )
)
def test_table_writers_write_the_same_bytes_on_every_impl(model):
    """table_fill and table_index: the compiled helper and the twins write
    identical tables (entries, padding, crcs, index) from one packed dict."""
    from ultradict_ng._shm.table import hash_key, slots_for

    packed = MSGPACK.dumps(model)
    hashes = [hash_key(k) for k in model]
    slots = slots_for(len(model))
    start = 64 + 8 * slots
    tables = []
    for impl in (native, fallback):
        end = impl.table_fill(None, start, packed, hashes)
        buf = bytearray(end)
        assert impl.table_fill(buf, start, packed, hashes) == end
        impl.table_index(buf, slots, start, end, len(model))
        tables.append(bytes(buf))
    assert tables[0] == tables[1]
    for most in (1, 5, 1000):  # the walk in chunks: the same packed maps, offsets and pairs
        walks = []
        for impl in (native, fallback):
            off, parts = start, []
            while off < len(tables[0]):
                packed, off = impl.table_chunk(tables[0], start, len(tables[0]), off, most)
                parts.append(packed)
            walks.append(parts)
        assert walks[0] == walks[1]
        pairs = [kv for p in walks[0] for kv in MSGPACK.loads(p).items()]
        assert repr(pairs) == repr(list(model.items()))  # (repr: a NaN value equals no copy of it)


@needs_native
@settings(max_examples=80, deadline=None)
@given(
    st.dictionaries(
        st.one_of(st.text(max_size=12), st.integers()),
        st.one_of(scalars, st.text(max_size=90)),
        min_size=1,
        max_size=40,
    ),
    st.data(),
)
def test_table_merge_writes_the_same_bytes_on_every_impl(model, data):
    """table_merge: an old table's entries with some dropped and some given
    new values (of other lengths) -- the compiled helper and the twins write
    identical entries, which decode to the changed dict in its order; a
    damaged changed entry is reported in the same words; a change out of
    order, a value that is not bytes or a buffer too small raise ValueError."""
    buf, _, start, end = table_of(model)
    offsets = []
    off = start
    while off < end:  # (each entry's offset, in order)
        offsets.append(off)
        kl, vl = struct.unpack_from("<II", buf, off + 8)
        off = (off + 24 + kl + vl + 7) & ~7
    keys = list(model)
    picked = data.draw(st.lists(st.sampled_from(range(len(keys))), unique=True, max_size=len(keys)))
    changes, want = [], dict(model)
    for i in sorted(picked):
        if data.draw(st.booleans()):
            changes.append((offsets[i], None))
            del want[keys[i]]
        else:
            new = data.draw(st.one_of(scalars, st.text(max_size=90)))
            changes.append((offsets[i], MSGPACK.dumps(new)))
            want[keys[i]] = new
    out = []
    for impl in (native, fallback):
        size = impl.table_merge(None, 8, buf, start, end, changes)
        dst = bytearray(size)
        assert impl.table_merge(dst, 8, buf, start, end, changes) == size
        out.append(bytes(dst))
        with pytest.raises(ValueError):
            impl.table_merge(bytearray(size - 8), 8, buf, start, end, changes)
        if len(changes) > 1:
            with pytest.raises(ValueError):
                impl.table_merge(None, 8, buf, start, end, changes[::-1])
        with pytest.raises(ValueError):
            impl.table_merge(None, 8, buf, start, end, [(start, "not bytes")])
    assert out[0] == out[1]
    got = {}
    off = 8
    while off < len(out[0]):
        kl, vl = struct.unpack_from("<II", out[0], off + 8)
        got[MSGPACK.loads(out[0][off + 24 : off + 24 + kl])] = MSGPACK.loads(
            out[0][off + 24 + kl : off + 24 + kl + vl]
        )
        assert tablewalk.entry_checked(out[0], 8, len(out[0]), off) == (
            struct.unpack_from("<Q", out[0], off)[0],
            kl,
            vl,
        )
        off = (off + 24 + kl + vl + 7) & ~7
    assert repr(list(got.items())) == repr(list(want.items()))
    if changes:  # entries that end unaligned (a forged end): the last one's padding runs past it
        last = changes[-1][0]
        if last == offsets[-1]:
            for impl in (native, fallback):
                with pytest.raises(ValueError, match="^table entry runs past the entries$"):
                    impl.table_merge(None, 8, buf, start, end - 1, changes)
    if changes:  # a changed entry damaged: reported, the same words on every impl
        at = changes[0][0]
        buf[at + 24] ^= 0xFF
        for impl in (native, fallback):
            with pytest.raises(ValueError, match="^table entry fails its checksum$"):
                impl.table_merge(None, 8, buf, start, end, changes)


@needs_native
@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.one_of(
            st.text(max_size=10),
            st.sampled_from(BOUNDARY_INTS),
            st.integers(),
            st.sampled_from([1.0, True, 0.0, 2.0**63, 7.5, (1, 2), b"k"]),
        ),
        st.integers(),
        max_size=40,
    ),
    st.data(),
)
def test_table_changes_are_the_probes_and_the_codecs_bytes_on_every_impl(model, data):
    """table_changes: the entries of the dead and changed keys it decides, at
    the offsets Table.find gives, with the codec's bytes of the new values; it
    decides exactly the str and int keys table_get's offset probe finds (for a
    changed one, with a value pack_value encodes) and lists every other key,
    the compiled helper and the twins alike.  Keys absent from the table, or
    from ``hot``, are left to the caller."""
    from ultradict_ng._helper.packing import pack_value
    from ultradict_ng._shm.table import Table, hash_key

    buf, slots, start, end = table_of(model)
    keys = list(model) + data.draw(
        st.lists(st.one_of(st.text(max_size=5), st.integers(), st.sampled_from(BOUNDARY_INTS)), max_size=5)
    )
    unique = list({k: None for k in keys})  # (keys equal to another, e.g. 1 and 1.0, once)
    dead, changed, hot = set(), set(), {}
    for k in unique:
        role = data.draw(st.sampled_from(["dead", "changed", "changed-not-hot", "untouched"]))
        if role == "dead":
            dead.add(k)
        elif role.startswith("changed"):
            changed.add(k)
            if role == "changed":
                hot[k] = data.draw(st.one_of(scalars, not_simple, st.tuples(scalars, scalars)))
    t = Table(memoryview(buf), 0)
    try:
        answers = []
        for impl in (native, fallback):
            changes, rest_dead, rest_changed = impl.table_changes(buf, slots, start, end, dead, changed, hot)
            by_offset = {off: v for off, v in changes}
            assert len(by_offset) == len(changes)
            for keys_, rest, is_changed in ((dead, rest_dead, False), (changed, rest_changed, True)):
                assert len(rest) == len(set(rest))
                for k in keys_:
                    off = impl.table_get(buf, slots, start, end, k, True) if type(k) in (str, int) else 0
                    value = pack_value(hot[k]) if is_changed and k in hot else None
                    decided = isinstance(off, int) and off > 0 and (not is_changed or value is not None)
                    assert (k in rest) != decided, (k, off, value)
                    if decided:
                        assert off == t.find(k, hash_key(k), MSGPACK.loads)
                        assert by_offset.pop(off) == value
                        if is_changed:
                            assert value == MSGPACK.dumps(hot[k])
            assert not by_offset  # (no change for a key it was not given)
            answers.append((sorted(changes), sorted(map(repr, rest_dead)), sorted(map(repr, rest_changed))))
            with pytest.raises(TypeError):
                impl.table_changes(buf, slots, start, end, list(dead), changed, hot)
        assert answers[0] == answers[1]
    finally:
        t.close()


def _reference_record(pos, tag, payload, size=300_000, unit=L.UNIT_WHOLE):
    """The stream bytes layout.py's "Stream record" describes, built from the spec."""
    buf = bytearray(size)
    length = len(payload)
    crc = zlib.crc32(payload, zlib.crc32(struct.pack("<II", length, tag)))
    buf[pos : pos + 16] = struct.pack(L.RECORD_FORMAT, length, tag, crc, unit)
    buf[pos + 16 : pos + 16 + length] = payload
    return pos + 16 + length, buf


@impls
@given(st.binary(max_size=3000), st.integers(0, 64), st.integers(0, 2**32 - 1))
def test_write_record_matches_the_spec(impl, payload, pos, tag):
    buf = bytearray(8192)
    words = impl.Words(buf)
    end = words.write_record(pos, tag, payload)
    words.release()
    expected_end, expected = _reference_record(pos, tag, payload, 8192)
    assert end == expected_end and buf == expected


@impls
def test_a_transaction_record_carries_its_unit_word(impl):
    """The unit word is stored as given (a transaction's records: their offset, shifted)."""
    for unit in (0, 2, 2**32 - 2, L.UNIT_WHOLE):
        buf = bytearray(4096)
        words = impl.Words(buf)
        end = words.write_record(100, 7, b"abc", unit)
        simple_end = words.write_simple(end, 7, 4096, L.OP_SET, "k", 1, 0, unit)
        words.release()
        assert buf[:end] == _reference_record(100, 7, b"abc", 4096, unit)[1][:end]
        assert simple_end is not None
        assert (
            buf[end:simple_end]
            == _reference_record(0, 7, MSGPACK.dumps([L.OP_SET, [], "k", 1]), 4096, unit)[1][
                : simple_end - end
            ]
        )


@impls
@settings(max_examples=150)
@given(key=scalars, value=scalars, pos=st.integers(0, 40), tag=st.integers(0, 2**32 - 1))
def test_write_simple_is_the_general_encoding(impl, key, value, pos, tag):
    """write_simple stores the bytes of a record of codec.dumps(record)."""
    for args, rec in (
        ((L.OP_SET, key, value), [L.OP_SET, [], key, value]),
        ((L.OP_DEL, key), [L.OP_DEL, [], key]),
    ):
        buf = bytearray(300_000)
        words = impl.Words(buf)
        end = words.write_simple(pos, tag, 300_000, *args)
        words.release()
        expected_end, expected = _reference_record(pos, tag, MSGPACK.dumps(rec))
        assert end == expected_end
        assert buf == expected
        # ...which decodes to an equal record of the same types (what the writer applies).
        decoded = MSGPACK.loads(bytes(buf[pos + 16 : end]))
        assert [type(x) for x in decoded] == [type(x) for x in rec]
        for got, want in zip(decoded, rec):
            assert got == want or (isinstance(want, float) and math.isnan(want) and math.isnan(got))


@impls
@settings(max_examples=150)
@given(
    value=st.tuples()
    | st.lists(scalars, max_size=15).map(tuple)
    | st.tuples(st.floats(), st.integers(0, 2**20), st.binary(max_size=70_000)),
    pos=st.integers(0, 40),
    tag=st.integers(0, 2**32 - 1),
)
def test_write_simple_writes_a_tuple_of_scalars_as_the_codec_does(impl, value, pos, tag):
    """A value that is a tuple of scalars (a cache entry's shape) takes the
    scalar path too: the codec's ext 1 bytes, decoding to an equal tuple."""
    rec = [L.OP_SET, [], "k", value]
    buf = bytearray(300_000)
    words = impl.Words(buf)
    end = words.write_simple(pos, tag, 300_000, L.OP_SET, "k", value)
    words.release()
    payload = MSGPACK.dumps(rec)
    if pos + 16 + len(payload) > 300_000:  # (up to 15 strs of 65535 bytes): left to the caller
        assert end is None and buf == bytearray(300_000)
        return
    expected_end, expected = _reference_record(pos, tag, payload)
    assert end == expected_end and buf == expected
    got = MSGPACK.loads(bytes(buf[pos + 16 : end]))[3]
    assert type(got) is tuple and repr(got) == repr(value)


_plain_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.integers(2**64, 2**65),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.binary(min_size=95, max_size=105),
)
plain_trees = st.recursive(
    _plain_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(st.text(max_size=5), st.integers(-5, 5), st.none()), inner, max_size=5),
        st.lists(inner, max_size=2).map(tuple),
        st.sets(st.integers(), max_size=2),
    ),
    max_leaves=30,
)


@impls
@settings(max_examples=300)
@given(value=plain_trees | st.lists(plain_trees, max_size=4).map(tuple), pos=st.integers(0, 40))
def test_write_simple_plain_writes_json_like_values_as_the_codec_does(impl, value, pos):
    """With ``plain``, a JSON-like value (dicts and lists of scalars, or a
    tuple of them at the top: a cache's entry) is written as the codec's bytes
    and decodes to what a copy of it is; anything else (a tuple or set below
    the top, an int beyond 64 bits, a bytes for a blob, a tree deeper than
    words.PLAIN_DEPTH) is declined, by every implementation alike."""
    from ultradict_ng._helper.words import plain_ok

    rec = [L.OP_SET, [], "k", value]
    buf = bytearray(300_000)
    words = impl.Words(buf)
    end = words.write_simple(pos, 7, 300_000, L.OP_SET, "k", value, 100, 1, True)
    words.release()
    in_64_bits = all(not (type(x) is int and not -(2**63) <= x < 2**64) for x in _leaves(value))
    if not (plain_ok(value, 100) and in_64_bits):
        if type(value) is not bytes:  # (a large bytes at the top is the caller's to refuse)
            assert end is None and buf == bytearray(300_000)
        return
    expected_end, expected = _reference_record(pos, 7, MSGPACK.dumps(rec))
    assert end == expected_end and buf == expected
    got = MSGPACK.loads(bytes(buf[pos + 16 : end]))[3]
    assert repr(got) == repr(speedups.copy_plain(value))


def _leaves(v):
    if type(v) in (list, tuple):
        for x in v:
            yield from _leaves(x)
    elif type(v) is dict:
        for k, x in v.items():
            yield k
            yield from _leaves(x)
    else:
        yield v


@impls
def test_write_simple_plain_declines_deep_trees_and_blob_sized_bytes(impl):
    from ultradict_ng._helper.words import PLAIN_DEPTH

    def nested(n):
        v = [1]
        for _ in range(n - 1):
            v = [v]
        return v

    buf = bytearray(8192)
    words = impl.Words(buf)
    put = lambda v: words.write_simple(0, 1, 8192, L.OP_SET, "k", v, 100, 1, True)  # noqa: E731
    assert put(nested(PLAIN_DEPTH)) is not None and put(nested(PLAIN_DEPTH + 1)) is None
    assert put({"a": b"x" * 99}) is not None and put({"a": b"x" * 100}) is None
    assert put({"a": (1,)}) is None and put([{1, 2}]) is None and put({(1, 2): 1}) is None
    assert put((1.0, 3, {"a": [1]})) is not None  # a cache's entry
    assert words.write_simple(0, 1, 8192, L.OP_SET, "k", {"a": 1}, 100, 1) is None  # (plain is off)
    words.release()


@impls
def test_write_simple_leaves_a_tuple_holding_a_blob_sized_bytes_to_the_codec(impl):
    buf = bytearray(8192)
    words = impl.Words(buf)
    assert words.write_simple(0, 1, 8192, L.OP_SET, "k", (1.0, b"x" * 100), 100) is None
    assert words.write_simple(0, 1, 8192, L.OP_SET, "k", (1.0, b"x" * 99), 100) is not None
    assert words.write_simple(0, 1, 8192, L.OP_SET, (1,), 1) is None  # never a tuple key
    words.release()


@impls
@given(bad=not_simple, pos=st.integers(0, 40))
def test_write_simple_declines_what_it_cannot_encode_exactly(impl, bad, pos):
    buf = bytearray(4096)
    words = impl.Words(buf)
    assert words.write_simple(pos, 1, 4096, L.OP_SET, "k", bad) is None
    assert words.write_simple(pos, 1, 4096, L.OP_SET, bad, 1) is None
    words.release()
    assert buf == bytearray(4096)  # nothing written


@impls
def test_write_simple_and_write_record_never_write_past_the_buffer(impl):
    buf = bytearray(64)
    words = impl.Words(buf)
    assert words.write_simple(40, 1, 64, L.OP_SET, "k", "x" * 10) is None  # 16 + 16 bytes > 24
    assert words.write_simple(-1, 1, 64, L.OP_SET, "k", 1) is None
    assert words.write_simple(65, 1, 64, L.OP_SET, "k", 1) is None
    assert words.write_simple(0, 1, 20, L.OP_SET, "k", 1) is None  # past the limit
    with pytest.raises(ValueError):
        words.write_record(60, 1, b"abc")
    with pytest.raises(ValueError):
        words.write_record(-8, 1, b"abc")
    words.release()
    assert buf == bytearray(64)
    words = impl.Words(buf)
    assert words.write_simple(0, 1, 2**40, L.OP_SET, "k", 1) == 16 + 6  # limit clamped to the buffer
    words.release()


@given(key=scalars, value=scalars)
def test_encode_record_fast_path_is_the_general_path(key, value):
    """Codec.encode_record's scalar shortcut returns what dumps + loads return."""
    for rec in ([L.OP_SET, [], key, value], [L.OP_DEL, [key], value], [L.OP_CLEAR, [key]]):
        payload, decoded = MSGPACK.encode_record(rec)
        assert payload == MSGPACK.dumps(rec)
        general = MSGPACK.loads(payload)
        assert [type(x) for x in decoded] == [type(x) for x in general]


def test_encode_record_falls_back_for_everything_else():
    for value in (2**64, "\ud800", (1, 2), [1], {"a": (1,)}, 1j):
        record = [L.OP_SET, [], "k", value]
        try:
            expected = MSGPACK.dumps(record)
        except Exception as exc:
            with pytest.raises(type(exc)):
                MSGPACK.encode_record(record)
            continue
        payload, decoded = MSGPACK.encode_record(record)
        assert payload == expected and decoded == MSGPACK.loads(expected)


# -- atomic words ------------------------------------------------------------------


@impls
def test_words_operations_and_errors(impl):
    buf = bytearray(64)
    words = impl.Words(buf)
    words.store(1, 7)
    assert words.cas(1, 7, 2**64 - 1) == (True, 7)
    assert words.cas(1, 7, 3) == (False, 2**64 - 1)
    assert words.load(1) == 2**64 - 1 and words.load(0) == 0
    assert buf[8:16] == b"\xff" * 8
    for bad in (-1, 8):
        with pytest.raises(IndexError):
            words.load(bad)
    with pytest.raises(OverflowError):
        words.store(0, 2**64)
    with pytest.raises(OverflowError):
        words.store(0, -1)
    words.release()
    with pytest.raises(Closed):
        words.load(0)
    with pytest.raises(Closed):
        words.write_simple(0, 0, 64, 0, "k", 1)
    with pytest.raises(ValueError):
        impl.Words(memoryview(bytearray(64))[1:33])  # not 8-byte aligned
    with pytest.raises(BufferError):
        impl.Words(b"\x00" * 64)  # read-only


@impls
def test_words_keep_the_mapping_exported_until_released(impl):
    import mmap

    m = mmap.mmap(-1, 4096)
    words = impl.Words(m)
    with pytest.raises(BufferError):
        m.close()  # the export protects us from use after unmap
    words.release()
    m.close()


def test_public_words_exit_every_view_they_make_when_threads_race(monkeypatch):
    """Two threads first touching one word may each make its view: the one
    not kept must be exited -- dropped while entered, it is an exception
    ``atomics`` reports from ``__del__`` -- and the kept one at release."""
    import atomics

    made, exited, meet = [], [], threading.Barrier(2)
    real = atomics.atomicview

    class Tracked:
        def __init__(self, **kwargs):
            self.ctx = real(**kwargs)
            made.append(self)

        def __enter__(self):
            return self.ctx.__enter__()

        def __exit__(self, *exc):
            exited.append(self)
            return self.ctx.__exit__(*exc)

    def slow_view(**kwargs):
        try:  # both threads inside the first use, unless one waits for the other
            meet.wait(0.5)
        except threading.BrokenBarrierError:
            pass
        return Tracked(**kwargs)

    monkeypatch.setattr(words.atomics, "atomicview", slow_view)
    w = fallback.PublicWords(bytearray(64))
    threads = [threading.Thread(target=w.load, args=(3,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    w.release()
    assert made and sorted(map(id, exited)) == sorted(map(id, made))


# -- lock state ----------------------------------------------------------------


@impls
def test_process_state_transitions(impl):
    """Every ProcessState goes through the same states."""
    buf = bytearray(24)
    words = impl.Words(buf)
    state = impl.ProcessState()
    me = threading.get_ident()
    assert (state.owner, state.count, state.mutex.locked()) == (None, 0, False)
    assert state.exit(words, 1, 5) is None  # not held: nothing changes
    assert state.enter(words, 1, 5) is True
    assert (state.owner, state.count, state.mutex.locked()) == (me, 1, True)
    assert int.from_bytes(buf[8:16], sys.byteorder) == 5
    assert state.enter(words, 1, 5) is True  # reentrant
    assert state.count == 2
    assert state.exit(words, 1, 5) is True
    assert int.from_bytes(buf[8:16], sys.byteorder) == 5
    assert state.exit(words, 1, 5) is True
    assert (state.owner, state.count, state.mutex.locked()) == (None, 0, False)
    assert buf[8:16] == bytes(8)
    # Another process holds the word: enter takes the mutex and reports False.
    buf[8:16] = (9).to_bytes(8, sys.byteorder)
    assert state.enter(words, 1, 5) is False
    assert state.owner is None and state.mutex.locked()
    state.mutex.release()
    # Taken over while we held it: the last exit reports False, releases the mutex.
    buf[8:16] = bytes(8)
    assert state.enter(words, 1, 5) is True
    buf[8:16] = (9).to_bytes(8, sys.byteorder)
    assert state.exit(words, 1, 5) is False
    assert not state.mutex.locked() and state.owner is None
    # The attributes the Python slow paths and the fork handler write.
    state.owner, state.count = me, 3
    assert (state.owner, state.count) == (me, 3)
    state.owner = None
    new_mutex = threading.Lock()
    state.mutex = new_mutex
    assert state.mutex is new_mutex
    words.release()


@impls
def test_add_and_publish(impl):
    buf = bytearray(32)
    words = impl.Words(buf)
    assert words.add(1, 5) == 5 and words.add(1, 2**64 - 1) == 4  # wraps at 2**64
    words.store(2, 7)
    assert words.publish(0, 9, 2) == 7 and words.load(0) == 9
    with pytest.raises(IndexError):
        words.publish(0, 1, 4)
    words.release()
    with pytest.raises(Closed):
        words.add(1, 1)


@impls
@pytest.mark.skipif(not fallback.FUTEX, reason="no futex on this platform")
def test_wait_and_wake(impl):
    """wait sleeps only while the low 32 bits equal ``expected``; wake wakes it."""
    import time

    buf = bytearray(32)
    words = impl.Words(buf)
    words.store(1, (3 << 32) | 7)
    t0 = time.monotonic()
    assert words.wait(1, 8, 5.0) is True  # differs: returns at once
    assert words.wait(1, (9 << 32) | 8, 5.0) is True  # only the low half counts
    assert time.monotonic() - t0 < 1
    assert words.wait(1, 7, 0.05) is False  # equal: sleeps until the timeout
    assert time.monotonic() - t0 >= 0.05
    assert words.wake(1, 1) == 0  # nobody asleep
    results = []
    sleeper = threading.Thread(target=lambda: results.append(words.wait(1, 7, 10.0)))
    sleeper.start()
    deadline = time.monotonic() + 5
    woken = 0
    while not woken and time.monotonic() < deadline:
        time.sleep(0.01)
        woken = words.wake(1, 1)
    sleeper.join(5)
    assert woken == 1 and results == [True]
    words.release()
    with pytest.raises(Closed):
        words.wait(1, 7, 0.01)


@impls
def test_release_wakes_only_when_a_waiter_is_registered(impl):
    """exit() after the last level: nothing more if LOCK_WAITERS (index + 1) is 0;
    else, unless a wake is in flight (LOCK_WAKING, +3), LOCK_SEQ (+2) moves, LOCK_WAKING
    is set and 2 reports a wake that woke nobody."""
    buf = bytearray(48)
    words = impl.Words(buf)
    state = impl.ProcessState()
    word = lambda i: int.from_bytes(buf[8 * i : 8 * i + 8], sys.byteorder)  # noqa: E731
    assert state.enter(words, 1, 5) is True
    assert state.exit(words, 1, 5) is True
    assert (word(2), word(3), word(4)) == (0, 0, 0)  # no waiter: no SEQ, no wake
    buf[16:24] = (1).to_bytes(8, sys.byteorder)  # a registered waiter (not asleep)
    assert state.enter(words, 1, 5) is True
    assert state.exit(words, 1, 5) == 2  # woke nobody (the waiter will claim it)
    assert (word(3), word(4)) == (1, 1)
    assert state.enter(words, 1, 5) is True
    assert state.exit(words, 1, 5) is True  # a wake is in flight: no second one, SEQ stays
    assert (word(3), word(4)) == (1, 1)
    buf[32:40] = (77).to_bytes(8, sys.byteorder)  # claimed by a designated waiter (owner word 77)
    assert state.enter(words, 1, 5) is True
    assert state.exit(words, 1, 5) is True
    assert (word(3), word(4)) == (1, 77)
    # At the end of the buffer there is no room for the waiter words: plain release.
    buf[16:24] = bytes(8)
    buf[24:48] = bytes(24)
    assert state.enter(words, 5, 5) is True
    assert state.exit(words, 5, 5) is True and buf[24:48] == bytes(24)
    words.release()


@impls
def test_process_state_excludes_threads(impl):
    buf = bytearray(24)
    words = impl.Words(buf)
    state = impl.ProcessState()
    counter = [0]

    def worker():
        for _ in range(2000):
            while not state.enter(words, 1, 5):  # another "process" never holds it here
                state.mutex.release()
            value = counter[0]
            counter[0] = value + 1
            assert state.exit(words, 1, 5) is True

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter[0] == 8000 and buf[8:16] == bytes(8)
    words.release()


# -- selection and interoperation ----------------------------------------------------


def _implementation_in_child(value, var=speedups.ENV_VAR):
    env = {k: v for k, v in os.environ.items() if k not in (speedups.ENV_VAR, "ULTRADICT_NG_ATOMICS")}
    env[var] = value
    return subprocess.run(
        [sys.executable, "-c", "import ultradict_ng.speedups as s; print(s.IMPLEMENTATION)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("value", ["bound", "public", "BOUND"])
@pytest.mark.parametrize("var", [speedups.ENV_VAR, "ULTRADICT_NG_ATOMICS"])
def test_environment_variable_forces_a_fallback(value, var):
    """The switch, under its name and its former name."""
    out = _implementation_in_child(value, var)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == value.lower()


def test_environment_variable_rejects_unknown_values():
    out = _implementation_in_child("fast")
    assert out.returncode != 0 and f"{speedups.ENV_VAR}='fast'" in out.stderr


@needs_native
def test_environment_variable_native():
    out = _implementation_in_child("native")
    assert out.returncode == 0 and out.stdout.strip() == "native"


@pytest.mark.slow
@pytest.mark.parametrize("other", ["bound", "public"])
def test_native_and_fallback_processes_share_one_dict(name, other):
    """Processes on different paths write the same bytes and honour the same lock."""
    d = SharedDict(name=name)
    d["n"] = 0
    script = textwrap.dedent(f"""
        from ultradict_ng import SharedDict
        d = SharedDict(name={name!r}, create=False)
        for i in range(1500):
            with d.lock:
                d["n"] += 1
            d["last-" + str(i % 7)] = i
        d.close()
    """)
    child = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, speedups.ENV_VAR: other})
    try:
        for _ in range(1500):
            with d.lock:
                d["n"] += 1
    finally:
        assert child.wait(timeout=120) == 0
    assert d["n"] == 3000
    assert {k: v for k, v in d.items() if k != "n"} == {f"last-{j}": 1499 - (1499 - j) % 7 for j in range(7)}
    d.unlink()


# -- the read hit path -----------------------------------------------------------


def test_reads_use_the_compiled_hit_path_when_built():
    if speedups.IMPLEMENTATION == "native":
        # The C slot, not a Python function: SharedDict defines no __getitem__ of its own.
        assert "__getitem__" not in SharedDict.__dict__
        assert type(SharedDict.__getitem__).__name__ == "wrapper_descriptor"
    else:  # the twin base installs the full rules as __getitem__ itself
        assert SharedDict.__getitem__ is SharedDict._getitem_slow


def test_hit_path_never_answers_from_a_stale_or_closed_cache(name):
    d = SharedDict(name=name, recurse=True)
    other = SharedDict(name=name)
    d["k"] = 1
    assert other["k"] == 1
    for i in range(200):  # another handle writes: every read sees it at once
        d["k"] = i
        assert other["k"] == i
    d["m"] = [1, 2]
    got = other["m"]
    got.append(3)  # mutable values are copies (slow path)
    assert other["m"] == [1, 2]
    d["n"] = {"x": 1}
    assert other["n"]["x"] == 1  # nested view (slow path)
    with pytest.raises(KeyError):
        other["missing"]
    with pytest.raises(TypeError):
        other[[1]]
    store = other._store
    store.gen = store.seen = -1  # a reload is due (as the store marks it): never answered from the cache
    store.data = {"k": "stale"}
    assert other["k"] == 199
    other.close()
    with pytest.raises(Closed):
        other["k"]
    d.unlink()
    d.close()


def test_a_tuple_of_immutable_items_is_handed_out_as_it_is(name, monkeypatch):
    """A tuple whose items are immutable is as immutable as they are: every
    read gets the cached tuple itself, answered by the compiled hit path where
    it is built (no call into the Python slow path); a tuple holding a list is
    copied there too (copytree.c), the list inside the caller's own."""
    d = SharedDict(name=name)
    d["row"] = (1, "name", 0.5, None, b"x", True)
    d["mixed"] = (1, [2, 3])
    d["nested"] = (1, (2, 3))
    calls = []
    slow = SharedDict._getitem_slow

    def counting(self, key):
        calls.append(key)
        return slow(self, key)

    monkeypatch.setattr(SharedDict, "_getitem_slow", counting)
    if speedups.IMPLEMENTATION != "native":
        monkeypatch.setattr(SharedDict, "__getitem__", counting)
    try:
        first = d["row"]
        assert first == (1, "name", 0.5, None, b"x", True) and d["row"] is first
        if speedups.IMPLEMENTATION == "native":
            assert calls == []  # answered in C
        got = d["mixed"]
        assert got == (1, [2, 3])
        got[1].append(4)
        assert d["mixed"] == (1, [2, 3])  # the list inside was a copy
        nested = d["nested"]
        assert nested == (1, (2, 3)) and d["nested"] is nested  # (a copy of it is itself)
        # The compiled path copies plain values itself (copytree.c); the twin asks the slow path.
        twin_calls = ["row", "row", "mixed", "mixed", "nested", "nested"]
        assert calls == ([] if speedups.IMPLEMENTATION == "native" else twin_calls)
    finally:
        d.unlink()
        d.close()


@pytest.mark.skipif(speedups.IMPLEMENTATION != "native", reason="the compiled write slot")
def test_a_root_set_of_a_scalar_or_tuple_calls_set_root_without_the_slow_frame(name, monkeypatch):
    """``d[k] = v`` at the root with a value that cannot be a SharedDict (an
    immutable scalar, a tuple) is what ``_setitem_slow`` does then -- hash the
    key, ``set_root`` -- made by the C slot without its frame; every other set
    (a mutable value, a SharedDict, a nested view, a subclass with its own
    ``_setitem_slow``) takes ``_setitem_slow``; an unhashable key is dict's
    TypeError before anything is written or locked."""
    d = SharedDict(name=name, recurse=True)
    calls: list = []
    slow = SharedDict._setitem_slow

    def counting(self, key, value):
        calls.append(key)
        return slow(self, key, value)

    try:
        d["n"] = {}
        monkeypatch.setattr(SharedDict, "_setitem_slow", counting)
        d["a"], d["b"], d["c"] = 1, "x", (1, "y", 0.5)
        assert calls == ["a", "b", "c"]  # (patched: not the registered function, so called)
        monkeypatch.setattr(SharedDict, "_setitem_slow", slow)
        frames: list = []
        sys.setprofile(
            lambda frame, event, arg: frames.append(frame.f_code.co_name) if event == "call" else None
        )
        try:
            d["a"], d["b"], d["c"] = 2, "z", (2, "y")
        finally:
            sys.setprofile(None)
        assert "set_root" in frames and "_setitem_slow" not in frames
        assert d.copy() == {"n": {}, "a": 2, "b": "z", "c": (2, "y")}
        state = d._store.words[L.W_STATE]
        with pytest.raises(TypeError):
            d[[1]] = 1
        assert d._store.words[L.W_STATE] == state and not d.lock.locked()

        class Own(SharedDict):
            def _setitem_slow(self, key, value):
                calls.append(("own", key))
                super()._setitem_slow(key, value)

        own = Own(name=name)
        try:
            own["d"] = 4
            assert calls[-1] == ("own", "d") and d["d"] == 4
        finally:
            own.close()
        monkeypatch.setattr(SharedDict, "_setitem_slow", counting)
        del calls[:]
        d["m"] = [1]
        d["s"] = d["n"]  # a SharedDict value: copied by the slow path
        d["n"]["x"] = 1  # a nested view
        assert calls == ["m", "s", "x"]
    finally:
        d.unlink()
        d.close()


# -- replay: record framing, batch decoding and applying ----------------------------


@impls
@settings(max_examples=100)
@given(
    st.lists(
        st.one_of(
            scalars,
            st.lists(scalars, max_size=5),
            st.dictionaries(st.text(max_size=5), scalars, max_size=5),
            st.tuples(scalars, scalars),
        ),
        max_size=6,
    )
)
def test_msgpack_length_is_the_encoded_length(impl, values):
    """The framing check measures exactly one object, never more or less."""
    payload = MSGPACK.dumps([L.OP_UPDATE, [], [[i, v] for i, v in enumerate(values)]])
    assert impl.msgpack_length(payload) == len(payload)
    assert impl.msgpack_length(payload + b"\xc0") == len(payload)  # a second object is not counted
    for cut in {0, 1, len(payload) // 2, len(payload) - 1}:
        if cut < len(payload):
            assert impl.msgpack_length(payload[:cut]) == -1  # truncated
    assert impl.msgpack_length(b"\xc1") == -1  # never used by msgpack


@impls
def test_parse_records_checks_every_record(impl):
    buf = bytearray(512)
    words = impl.Words(buf)
    one = MSGPACK.dumps([L.OP_SET, [], "k", 1])
    end = words.write_record(0, 3, one)
    end2 = words.write_record(end, 3, one + b"\xc0")  # two objects in one record
    words.release()
    chunk = bytes(buf[:end2])
    assert impl.parse_records(chunk, 3, 0) == [one, one + b"\xc0"]  # framing not asked for
    with pytest.raises(ValueError, match=f"offset {end} is not exactly one msgpack object"):
        impl.parse_records(chunk, 3, 0, True)
    assert impl.parse_records(chunk[:end], 3, 100, True) == [one]
    with pytest.raises(ValueError, match="another generation"):
        impl.parse_records(chunk[:end], 4, 0)
    assert impl.parse_records(chunk[:end], 3 + 2**32, 0) == [one]  # the tag's low 32 bits
    with pytest.raises(ValueError, match="^truncated record header at stream offset 100$"):
        impl.parse_records(chunk[:10], 3, 100)
    with pytest.raises(ValueError, match="overruns"):
        impl.parse_records(chunk[: end - 1], 3, 0)
    damaged = bytearray(chunk[:end])
    damaged[20] ^= 1
    with pytest.raises(ValueError, match="checksum"):
        impl.parse_records(bytes(damaged), 3, 0)


def _stream_of_units(units, tag=3, size=1024):
    """A stream buffer of ``units`` (each a list of payloads: one is a whole
    write, more a transaction, its unit words as the writer makes them) and
    the offsets where each unit ends."""
    buf = bytearray(size)
    words = fallback.BoundWords(buf)
    pos, ends = 0, []
    try:
        for payloads in units:
            first = pos
            for i, payload in enumerate(payloads):
                unit = (pos - first) << L.UNIT_BACK_SHIFT | (L.UNIT_LAST if i == len(payloads) - 1 else 0)
                pos = words.write_record(pos, tag, payload, unit)
            ends.append(pos)
    finally:
        words.release()
    return buf, ends


def _scans(buf, tag):
    """scan_stream of every implementation on ``buf``: one answer, or the test fails."""
    got = {name: mod.scan_stream(buf, tag) for name, mod in (("twin", fallback), ("native", native)) if mod}
    assert len(set(got.values())) == 1, got
    return got["twin"]


def test_scan_stream_finds_the_whole_units_and_why_it_stopped():
    """Recovery's scan (_disk/layout.py, step 4c), compiled and twin alike, on
    a stream whole, torn, zeroed, damaged, of another generation, with a unit
    word that does not fit, and with a transaction that never ended."""
    one = MSGPACK.dumps([L.OP_SET, [], "k", 1])
    buf, ends = _stream_of_units([[one], [one, one + b"x", one], [one]])
    assert _scans(buf, 3) == (ends[2], 3, "zeros")
    assert _scans(bytes(buf[: ends[2]]), 3) == (ends[2], 3, "")  # the buffer's end, exactly
    assert _scans(bytes(buf[: ends[2] + 5]), 3) == (ends[2], 3, "the file's end")  # a torn header
    assert _scans(bytes(buf[: ends[2] - 1]), 3) == (ends[1], 2, "a record running past the file")
    assert _scans(bytes(buf[: ends[1] - 1]), 3) == (ends[0], 1, "a record running past the file")
    assert _scans(buf, 4) == (0, 0, "a record of another generation")
    assert _scans(buf, 3 + 2**32) == (0, 0, "a record of another generation")  # (a masked tag only)
    assert _scans(bytearray(64), 3) == (0, 0, "zeros")
    assert _scans(b"", 3) == (0, 0, "")
    for cut in range(ends[0] + 1, ends[1]):  # inside the transaction: back to its start
        assert _scans(buf[:cut] + bytes(len(buf) - cut), 3)[:2] == (ends[0], 1)
    damaged = bytearray(buf)
    damaged[ends[0] + 20] ^= 1  # the transaction's first payload
    assert _scans(damaged, 3) == (ends[0], 1, "a record failing its checksum")
    older, _ = _stream_of_units([[one]] * 6, tag=2)  # a checkpoint's new stream over an older one
    newer = bytearray(older)
    newer[: ends[2]] = buf[: ends[2]]
    assert _scans(newer, 3)[0] == ends[2]
    assert _scans(newer, 3)[2] in ("a record of another generation", "a record failing its checksum")
    # Unit words: a transaction's record must give its offset from the first one.
    # (The crc does not cover the unit word: only the unit rule stops these.)
    bad, bends = _stream_of_units([[one], [one]])
    struct.pack_into("<I", bad, bends[0] + 12, 4 << L.UNIT_BACK_SHIFT | L.UNIT_LAST)
    assert _scans(bad, 3) == (bends[0], 1, "a record not of the unit before it")
    open_tx, oends = _stream_of_units([[one], [one, one]])
    last = oends[1] - len(one) - L.RECORD_HEADER  # the transaction's last record, made not last
    struct.pack_into("<I", open_tx, last + 12, (last - oends[0]) << L.UNIT_BACK_SHIFT)
    assert _scans(open_tx, 3) == (oends[0], 1, "a transaction's records without its last")  # (then zeros)
    assert _scans(bytes(open_tx[: oends[1]]), 3) == (oends[0], 1, "a transaction's records without its last")


@settings(max_examples=300)
@given(
    st.lists(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=3), max_size=8),
    st.lists(st.tuples(st.integers(min_value=0, max_value=1535), st.integers(min_value=0, max_value=255))),
    st.integers(min_value=0, max_value=1536),
    st.sampled_from([3, 4]),
)
def test_scan_stream_twins_agree_on_damaged_streams(units, flips, cut, tag):
    """Any stream, with any bytes changed and cut anywhere: compiled and twin
    give the same end, units and reason (_scans fails otherwise)."""
    buf, _ = _stream_of_units(units, size=1536)
    for at, value in flips:
        buf[at] = value
    _scans(bytes(buf[:cut]), tag)
    _scans(buf, tag)


@given(st.lists(st.lists(scalars, min_size=1, max_size=3), min_size=0, max_size=40))
def test_loads_many_is_loads_of_each(records):
    payloads = [MSGPACK.dumps([L.OP_SET, [], i, r]) for i, r in enumerate(records)]
    expected = [MSGPACK.loads(p) for p in payloads]
    for framed in (False, True):
        got = MSGPACK.loads_many(payloads, framed)
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            assert repr(a) == repr(b)  # NaN-safe equality of the decoded records


def test_loads_many_names_the_bad_record():
    import msgpack as mp

    good = MSGPACK.dumps([L.OP_SET, [], "k", 1])
    bad = mp.packb([L.OP_SET, [], "t", mp.Timestamp(1, 0)])
    payloads = [good] * 10 + [bad] + [good] * 3
    from ultradict_ng.errors import CorruptSegment

    for framed in (False, True):
        with pytest.raises(CorruptSegment, match="record 10"):
            MSGPACK.loads_many(payloads, framed)


@impls
def test_apply_sets_applies_the_leading_simple_sets(impl):
    data = {}
    records = [
        [L.OP_SET, [], "a", 1],
        [L.OP_SET, [], 2, [1]],
        [L.OP_SET, ["n"], "x", 1],
        [L.OP_SET, [], (1,), 2],
        [L.OP_DEL, [], "a"],
        [L.OP_SET, [], "b", 2],
    ]
    keys = record.SCALAR_TYPES
    assert impl.apply_sets(data, records, 0, L.OP_SET, keys) == 2
    assert data == {"a": 1, 2: [1]}
    assert impl.apply_sets(data, records, 3, L.OP_SET, keys) == 3  # tuple key: not simple
    assert impl.apply_sets(data, records, 5, L.OP_SET, keys) == 6
    assert data == {"a": 1, 2: [1], "b": 2}
    assert impl.apply_sets(data, [[2**70, [], "x", 1]], 0, L.OP_SET, keys) == 0  # no OverflowError
    assert impl.apply_sets(data, [(L.OP_SET, [], "t", 1), [L.OP_SET, (), "t", 1]], 0, L.OP_SET, keys) == 0


def _applied_simply(payloads, *ops):
    """apply_simple of every implementation on ``payloads`` (``ops``: op_set
    and optionally op_del; default OP_SET only): one answer (index and dict,
    key order and value types included), or the test fails."""
    got = []
    for mod in (fallback, native):
        if mod is not None:
            data = {"old": 0}
            done = mod.apply_simple(data, list(payloads), 0, *(ops or (L.OP_SET,)))
            got.append((done, repr(list(data.items()))))
    assert len(set(got)) == 1, got
    return got[0][0]


def _decoded_then_applied(payloads):
    """What the reader's general path makes of ``payloads``: decoded, then apply_all."""
    data = {"old": 0}
    record.apply_all(data, MSGPACK.loads_many(list(payloads), True))
    return repr(list(data.items()))


def test_apply_simple_applies_the_leading_root_sets_of_rows():
    """A replay's records straight from their payloads: root-level sets of a
    scalar key to a scalar or a tuple of scalars; it stops at anything else
    (the caller decodes the rest) and never applies what it cannot decode
    exactly as the codec does."""
    row = MSGPACK.dumps([L.OP_SET, [], "a", (1, "x", 0.5)])
    stops = [
        MSGPACK.dumps([L.OP_SET, [], "b", [1]]),  # a list: not a row
        MSGPACK.dumps([L.OP_SET, ["n"], "x", 1]),  # a nested path
        MSGPACK.dumps([L.OP_SET, [], (1,), 2]),  # a tuple key
        MSGPACK.dumps([L.OP_DEL, [], "a"]),
        MSGPACK.dumps([L.OP_SET, [], "c", ((1,),)]),  # a tuple of a tuple
        MSGPACK.dumps([L.OP_SET, [], "d", 1]) + b"\xc0",  # trailing bytes
        MSGPACK.dumps([L.OP_SET, [], "d", 1])[:-1],  # cut short
        b"\x94\x01\x90\xa2\xff\xfe\x01",  # a key that is not UTF-8
        b"\x94\x01\x90\xd6\xff\x00\x00\x00\x01\x01",  # a Timestamp key
        b"\x94\x01\x90\xa1d\xd6\xff\x00\x00\x00\x01",  # a Timestamp value
        b"\x94\x01\x91\xa1n\xa1d\x01",  # a path
        b"\x93\x01\x90\xa1d",  # three items
    ]
    for stop in stops:
        assert _applied_simply([row, row, stop, row]) == 2, stop
    assert _applied_simply([row, stops[0]]) == 1
    assert _applied_simply([]) == 0
    for mod in (fallback, native):
        if mod is not None:
            data = {}
            assert mod.apply_simple(data, [row, row], 1, L.OP_SET) == 2 and data == {"a": (1, "x", 0.5)}
            assert mod.apply_simple(data, [row], 0, 200) == 0  # (no op of this form)
            assert mod.apply_simple(data, [bytearray(row)], 0, L.OP_SET) == 0
            with pytest.raises(TypeError):
                mod.apply_simple([], [row], 0, L.OP_SET)


def test_apply_simple_takes_root_deletes_of_held_keys_when_given_their_op():
    """Given ``op_del``, a root-level delete of a scalar key the dict holds is
    applied straight too; one of a key it does not hold, or not exactly of
    that form, stops there (the general path reports it), as does every
    delete without ``op_del``."""
    row = MSGPACK.dumps([L.OP_SET, [], "a", (1, "x", 0.5)])
    drop = MSGPACK.dumps([L.OP_DEL, [], "a"])
    stops = [
        MSGPACK.dumps([L.OP_DEL, [], "missing"]),  # not held
        MSGPACK.dumps([L.OP_DEL, ["n"], "a"]),  # a nested path
        MSGPACK.dumps([L.OP_DEL, [], (1,)]),  # a tuple key
        drop + b"\xc0",  # trailing bytes
        drop[:-1],  # cut short
        MSGPACK.dumps([L.OP_DEL, [], "a", 1]),  # four items
        MSGPACK.dumps([L.OP_CLEAR, []]),
    ]
    for mod in (fallback, native):
        if mod is None:
            continue
        data = {"old": 0}
        assert mod.apply_simple(data, [row, drop, row], 0, L.OP_SET, L.OP_DEL) == 3
        assert data == {"old": 0, "a": (1, "x", 0.5)} and list(data) == ["old", "a"]
        assert mod.apply_simple(data, [row, drop, row], 0, L.OP_SET) == 1  # (no op_del: no delete)
        assert mod.apply_simple(data, [drop, drop], 0, L.OP_SET, L.OP_SET) == 0  # (op_del == op_set: none)
        for stop in stops:
            data = {"old": 0, "a": 1, (1,): 2}
            assert mod.apply_simple(data, [row, stop, drop], 0, L.OP_SET, L.OP_DEL) == 1, stop
            assert data == {"old": 0, "a": (1, "x", 0.5), (1,): 2}, stop


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(
            st.one_of(scalars, not_simple), st.one_of(scalars, not_simple), st.none() | st.integers(0, 11)
        ),
        max_size=12,
    )
)
def test_apply_simple_is_the_decode_and_apply_all(writes):
    """What apply_simple applies, and then the general path applies from where
    it stopped, is what the general path alone makes -- on every
    implementation.  (A write with an index deletes the key of an earlier
    set instead.)"""
    payloads, earlier = [], []
    for key, value, drop in writes:
        rec = (
            record.delete([], earlier[drop % len(earlier)])
            if drop is not None and earlier
            else record.set_([], key, value)
        )
        try:
            payloads.append(MSGPACK.encode_record(rec)[0])
        except Exception:
            continue  # (what the codec cannot encode never reaches a stream)
        if rec[0] == L.OP_SET:
            earlier.append(key)
    try:
        whole = _decoded_then_applied(payloads)
    except Exception:
        return  # (unhashable keys, a key deleted twice: the reader reports them; apply_simple stops before)
    done = _applied_simply(payloads, L.OP_SET, L.OP_DEL)
    data = {"old": 0}
    native_or_twin = native if native is not None else fallback
    native_or_twin.apply_simple(data, payloads, 0, L.OP_SET, L.OP_DEL)
    record.apply_all(data, MSGPACK.loads_many(payloads[done:], True))
    assert repr(list(data.items())) == whole


def test_a_reader_decodes_only_the_records_apply_simple_does_not_take(monkeypatch):
    """A reader catching up applies every record apply_simple takes from its
    payload, also after one it cannot take (a dict value): only those are
    decoded, one at a time while sets of scalars follow them, and in runs of
    1, 2, 4 ... while none do (a stream of dict values: few decode calls)."""
    name = f"udng_t_simply_{os.getpid()}"
    w = SharedDict(name=name, buffer_size=1 << 20)
    try:
        w["cfg"] = {"a": 1}
        model: dict[Any, Any] = {"cfg": {"a": 1}}
        for i in range(50):
            w[f"k{i}"] = model[f"k{i}"] = i
        w["cfg2"] = model["cfg2"] = {"b": [2]}
        del w["k3"], model["k3"]
        for i in range(10):
            w[f"d{i}"] = model[f"d{i}"] = {"v": i}
        w["last"] = model["last"] = 1.5
        decoded = count_decodes(monkeypatch, w)
        r = SharedDict(name=name)
        try:
            assert r.copy() == model and list(r) == list(model)
            assert decoded == [1, 1, 1, 2, 4, 4]  # (cfg; cfg2; d0 after the delete; d1-2, d3-6; d7-9 + last)
        finally:
            r.close()
    finally:
        w.unlink()
        w.close()


# -- the codec's type scans ----------------------------------------------------------

leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=3))
trees = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=3), inner, max_size=4),
        st.frozensets(st.integers(), max_size=3),
    ),
    max_leaves=30,
)


def _reference_contains(obj, tp, depth):
    if type(obj) is tp:
        return True
    if type(obj) not in (list, tuple, dict, set, frozenset):
        return False
    if depth < 0:
        return True
    members = [*obj.keys(), *obj.values()] if type(obj) is dict else list(obj)
    return any(_reference_contains(m, tp, depth - 1) for m in members)


@impls
@settings(max_examples=150)
@given(tree=trees, depth=st.integers(0, 6))
def test_contains_type_is_the_reference_walk(impl, tree, depth):
    for tp in (float, bool, type(None), frozenset):
        assert impl.contains_type(tree, tp, depth) == _reference_contains(tree, tp, depth)


def _reference_within(container, allowed, levels):
    members = [*container.keys(), *container.values()] if type(container) is dict else list(container)
    return all(
        type(m) in allowed
        or (
            levels > 0
            and type(m) in (list, tuple, dict, set, frozenset)
            and _reference_within(m, allowed, levels - 1)
        )
        for m in members
    )


@impls
@settings(max_examples=200)
@given(
    container=st.one_of(
        st.lists(trees, max_size=5),
        st.dictionaries(st.text(max_size=3), trees, max_size=5),
        st.tuples(trees, trees),
        st.frozensets(st.integers(), max_size=4),
    ),
    levels=st.integers(0, 4),
)
def test_types_within_levels_is_the_reference_scan(impl, container, levels):
    """With ``levels``, containers among the members are scanned that many levels down."""
    allowed = frozenset({int, str, type(None), bool})
    assert impl.types_within(container, allowed, levels) == _reference_within(container, allowed, levels)
    assert impl.types_within([[1, (2, {3})]], allowed, 2) is False  # (a set one level too deep)
    assert impl.types_within([[1, (2, frozenset({3}))]], allowed, 3) is True
    with pytest.raises(ValueError):
        impl.types_within([], allowed, -1)


@impls
@given(
    container=st.one_of(
        st.lists(trees, max_size=5),
        st.dictionaries(st.text(max_size=3), trees, max_size=5),
        st.tuples(trees, trees),
        st.frozensets(st.integers(), max_size=4),
    )
)
def test_types_within_is_the_reference_scan(impl, container):
    allowed = frozenset({int, str, type(None)})
    members = [*container.keys(), *container.values()] if type(container) is dict else list(container)
    assert impl.types_within(container, allowed) == all(type(m) in allowed for m in members)
    with pytest.raises(TypeError):
        impl.types_within(5, allowed)


# -- pack_map, pack_pairs: a big dict of scalar rows in one call ------------------------


def _general(obj):
    """The codec's general path (its Packer chain after the walk), whatever
    MsgpackCodec.dumps itself takes."""
    from ultradict_ng._codec.encode import new_chain, prepare

    return new_chain()[0].pack(prepare(obj, 0, 0))


row_values = (
    scalars
    | st.lists(scalars, max_size=15).map(tuple)
    | st.tuples(st.floats(), st.integers(0, 2**20), st.binary(max_size=70_000))
)


def _holds_bytes_from(obj, threshold):
    items = obj.items() if type(obj) is dict else obj
    for k, v in items:
        for x in (k, *(v if type(v) is tuple else (v,))):
            if type(x) is bytes and len(x) >= threshold:
                return True
    return False


@impls
@settings(max_examples=150)
@given(rows=st.dictionaries(scalars, row_values, max_size=40), threshold=st.sampled_from([0, 1, 100, 300]))
def test_pack_map_is_the_codecs_general_encoding(impl, rows, threshold):
    """pack_map gives the general path's bytes of a dict of scalar keys and
    scalar or scalar-tuple values; None exactly when a bytes of the
    threshold's size is in it (it would go to a blob)."""
    out = impl.pack_map(rows, threshold)
    if threshold and _holds_bytes_from(rows, threshold):
        assert out is None
    else:
        assert out == _general(rows)
    pairs = [[k, v] for k, v in rows.items()]
    out = impl.pack_pairs(pairs, threshold)
    if threshold and _holds_bytes_from(pairs, threshold):
        assert out is None
    else:
        assert out == _general(pairs)


@impls
@pytest.mark.parametrize("n", [0, 15, 16, 65535, 65536])
def test_pack_map_headers_of_every_size(impl, n):
    rows = {i: (i, f"r{i}", i / 2) if i % 3 else "s" * (i % 40) for i in range(n)}
    assert impl.pack_map(rows, 0) == _general(rows)
    pairs = [[k, v] for k, v in rows.items()]
    assert impl.pack_pairs(pairs, 0) == _general(pairs)


class _Str(str):
    pass


class _Int(int):
    pass


class _List(list):
    pass


@impls
@given(bad=not_simple)
def test_pack_map_declines_what_is_not_a_scalar_row(impl, bad):
    """None for any key or value the general path must encode (or refuse)."""
    for rows in ({"k": bad, "a": 1}, {1: (1, 2), 2: (3, bad)}):
        assert impl.pack_map(rows, 0) is None
        assert impl.pack_pairs([[k, v] for k, v in rows.items()], 0) is None
    if type(bad) is not list and type(bad) is not dict and type(bad) is not bytearray:
        assert impl.pack_map({bad: 1}, 0) is None
        assert impl.pack_pairs([[bad, 1]], 0) is None


@impls
def test_pack_map_declines_other_shapes(impl):
    for rows in (
        {"a": {"b": 1}},
        {"a": [1]},
        {"a": (1, (2,))},
        {(1, 2): 1},
        {frozenset(): 1},
        {"a": 2**64},
        {"a": -(2**63) - 1},
        {"a": tuple(range(16))},
        {_Str("a"): 1},
        {"a": _Str("b")},
        {_Int(1): 1},
        {"a": (_Int(1),)},
        {"a": 1.5j},
        {"a": "\ud800"},
    ):
        assert impl.pack_map(rows, 0) is None, rows
        assert impl.pack_pairs([["x", 1], *([k, v] for k, v in rows.items())], 0) is None, rows
    assert impl.pack_map({"a": (1, 2)}, 0) is not None
    assert impl.pack_map(collections.OrderedDict(a=1), 0) is None
    assert impl.pack_map([["a", 1]], 0) is None and impl.pack_pairs({"a": 1}, 0) is None
    assert impl.pack_pairs([("a", 1)], 0) is None  # a tuple pair is the codec's ext 1
    assert impl.pack_pairs([_List(["a", 1])], 0) is None and impl.pack_pairs(_List([["a", 1]]), 0) is None
    assert impl.pack_pairs([["a", 1, 2]], 0) is None and impl.pack_pairs([["a"]], 0) is None
    blob = b"x" * 100
    for rows in ({"a": blob}, {blob: 1}, {"a": (1, blob)}):
        assert impl.pack_map(rows, 100) is None
        assert impl.pack_map(rows, 101) == _general(rows) == impl.pack_map(rows, 0)


@needs_native
def test_the_helpers_state_lives_in_its_module_object():
    """Multi-phase initialisation: what Python gives the helper (the immutable
    types) is kept in the module object's state, not in a static -- a second
    instance of the module starts without it, the first keeps its own."""
    import importlib.util

    spec = importlib.util.find_spec("ultradict_ng._helper._native")
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    from ultradict_ng._codec.copies import IMMUTABLE_TYPES

    native.set_immutable_types(IMMUTABLE_TYPES)  # (what the codec gives it when it is in use)
    value = [frozenset({1}), {"a": 1}]
    mine = native.copy_plain(value)
    assert mine == value and mine is not value and mine[0] is value[0]
    assert other.copy_plain(value) is None  # (no types given: a frozenset is not known immutable)
    other.set_immutable_types(frozenset({frozenset}))
    theirs = other.copy_plain(value)
    assert theirs == value and theirs[0] is value[0]
    assert native.copy_plain(value)[0] is value[0]


def test_a_store_without_the_immutable_types_still_reads_right(name):
    """The read path takes the immutable types from the store: one without
    them hands out scalars as they are and everything else through the Python
    rules -- the same values, never the cache's own mutable objects."""
    d = SharedDict(name=name)
    try:
        d["f"], d["l"], d["t"] = frozenset({1}), [1, [2]], (1, "x")
        d._store._immutable_types = None
        assert d["f"] == frozenset({1}) and d["t"] == (1, "x")
        got = d["l"]
        assert got == [1, [2]] and got is not d["l"]
        got[1].append(3)
        assert d["l"] == [1, [2]]
    finally:
        d.unlink()


@needs_native
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the ELF symbol table")
def test_the_helper_exports_only_its_init_function():
    """Built with hidden visibility: the files' calls to one another are
    direct (inlinable), not through the PLT; only PyInit__native is exported."""
    import shutil

    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm")
    out = subprocess.run(
        [nm, "-D", "--defined-only", native.__file__], capture_output=True, text=True, check=True
    )
    exported = {line.split()[-1] for line in out.stdout.splitlines() if line.split()[1:2] == ["T"]}
    assert exported == {"PyInit__native"}
