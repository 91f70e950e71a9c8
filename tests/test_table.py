"""``_shm/table.py``: the hash-indexed table a big dict lives in.

A plain ``dict`` is the model: a table built from it must find every key
(and every key equal to one, of another type or zone), miss every other, and
walk the entries in the dict's order; a merge of a table with a sequence of
sets and deletes must equal the dict those operations leave, order included.
Damage anywhere (header, index, entry) raises ``CorruptSegment`` and never
hangs; an unrelated interpreter with another hash seed reads a table built
here from shared memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import unique_name
from tests.test_keyhash import KEYS, variants
from ultradict_ng import CorruptSegment
from ultradict_ng._codec.codec import MsgpackCodec
from ultradict_ng._codec.keyhash import key_hash
from ultradict_ng._platform import segments as _segments
from ultradict_ng._shm import table_layout as L
from ultradict_ng._shm.table import Merge, Table, encode_entries, hash_key, table_size, write_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODEC = MsgpackCodec()
TOKEN = 0x5EED
VALUES = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=20),
    st.binary(max_size=40),
    st.lists(st.integers(), max_size=5),
    st.floats(allow_nan=False),
)


def build(model: dict[Any, Any], generation: int = 1) -> Table:
    entries = encode_entries(model.items(), CODEC.dumps)
    size = table_size(len(entries), sum((24 + len(k) + len(v) + 7) & ~7 for _, k, v in entries))
    buf = memoryview(bytearray(size))
    assert write_table(buf, entries, generation, TOKEN) == size
    return Table(buf, TOKEN)


def has_nan(key: Any) -> bool:
    """A key holding a NaN equals only itself (by identity): no copy finds it."""
    if isinstance(key, (tuple, frozenset)):
        return any(has_nan(k) for k in key)
    return isinstance(key, (float, complex)) and key != key


def get(table: Table, key: Any) -> Any:
    value = table.lookup(key, CODEC.loads)
    if value is None:
        raise KeyError(key)
    return CODEC.loads(value)


def contents(table: Table) -> list[tuple[Any, Any]]:
    return [(CODEC.loads(k), CODEC.loads(v)) for k, v in table.items()]


def same_items(got: list[tuple[Any, Any]], model: dict[Any, Any]) -> None:
    """Equal to the model's items, in order; keys holding a NaN compare by position."""
    assert len(got) == len(model)
    for (gk, gv), (mk, mv) in zip(got, model.items()):
        assert gk == mk or (has_nan(mk) and type(gk) is type(mk) and len(repr(gk)) == len(repr(mk)))
        assert gv == mv or repr(gv) == repr(mv)


@settings(max_examples=150, deadline=None)
@given(model=st.dictionaries(KEYS, VALUES, max_size=60), absent=st.lists(KEYS, max_size=10))
def test_a_table_answers_as_the_dict_it_was_built_from(model: dict[Any, Any], absent: list[Any]) -> None:
    table = build(model)
    assert table.count == len(model)
    same_items(contents(table), model)
    for k, v in model.items():
        if has_nan(k):  # (found only by identity, as in a dict: not after a copy)
            continue
        for variant in [k] + variants(k):
            assert get(table, variant) == v or repr(get(table, variant)) == repr(v)
    for k in absent:
        if k not in model:
            with pytest.raises(KeyError):
                get(table, k)
    table.close()


class Changes:
    """What a caller tells :class:`Merge`, kept as a dict's operations happen
    (the model of the mutable level a big dict keeps over its table)."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.removed: set[int] = set()
        self.replaced: dict[int, bytes] = {}
        self.appended: dict[Any, Any] = {}

    def _off(self, key: Any) -> int:
        off = self.table.find(key, key_hash(key), CODEC.loads)
        return 0 if off in self.removed else off

    def set(self, key: Any, value: Any) -> None:
        off = 0 if key in self.appended else self._off(key)
        if off:
            self.replaced[off] = CODEC.dumps(value)
        else:
            self.appended[key] = value

    def delete(self, key: Any) -> None:
        if key in self.appended:
            del self.appended[key]
            return
        off = self._off(key)
        assert off, key
        self.removed.add(off)
        self.replaced.pop(off, None)

    def merge(self, generation: int) -> Table:
        changes = [(off, None) for off in self.removed] + list(self.replaced.items())
        plan = Merge(self.table, changes, encode_entries(self.appended.items(), CODEC.dumps))
        buf = memoryview(bytearray(plan.size))
        assert plan.write(buf, generation, TOKEN) == plan.size
        return Table(buf, TOKEN)


SMALL_KEYS = st.one_of(st.integers(0, 30), st.sampled_from(["a", "b", "c", 1.0, 2.0, True, (1, 2), (1.0, 2)]))
OPS = st.lists(st.tuples(st.booleans(), SMALL_KEYS, st.integers()), max_size=60)


@settings(max_examples=200, deadline=None)
@given(start=st.dictionaries(SMALL_KEYS, st.integers(), max_size=20), ops=OPS, rounds=st.integers(1, 3))
def test_a_merge_equals_the_dict_the_operations_leave(
    start: dict[Any, Any], ops: list[tuple[bool, Any, int]], rounds: int
) -> None:
    model = dict(start)
    table = build(model)
    for r in range(rounds):
        changes = Changes(table)
        for is_set, key, value in ops[r::rounds]:
            if is_set:
                model[key] = value
                changes.set(key, value)
            elif key in model:
                del model[key]
                changes.delete(key)
        new = changes.merge(generation=2 + r)
        assert new.generation == 2 + r and new.count == len(model)
        same_items(contents(new), model)
        for k, v in model.items():
            assert get(new, k) == v
        table.close()
        table = new
    table.close()


def test_a_merge_copies_unchanged_entries_as_bytes() -> None:
    """Unchanged entries are byte-identical in the new table (copied, not re-encoded):
    values that would encode differently again keep their old bytes."""
    model = {i: f"v{i}" for i in range(1000)}
    table = build(model)
    changes = Changes(table)
    changes.set(500, "new")
    changes.delete(3)
    changes.set(3, "back")  # deleted then set: moves to the end
    changes.set(5000, "appended")
    new = changes.merge(2)
    old_bytes = {
        CODEC.loads(k): bytes(table.entry(off)[2]) for off, (k, _) in zip(table.offsets(), table.items())
    }
    for off in new.offsets():
        _, kb, vb, _ = new.entry(off)
        k = CODEC.loads(kb)
        if k not in (500, 3, 5000):
            assert bytes(vb) == old_bytes[k]
    keys = [CODEC.loads(k) for k, _ in new.items()]
    assert keys[-2:] == [3, 5000] and keys.index(500) == 499
    assert len(keys) == 1001


def damaged(model: dict[Any, Any], at: int, xor: int = 0x40) -> memoryview:
    table = build(model)
    buf = memoryview(bytearray(table.buf))
    table.close()
    buf[at] ^= xor
    return buf


def test_damage_raises_corrupt_segment_where_it_is_read() -> None:
    model = {f"key{i}": i for i in range(50)}
    good = build(model)
    start, end, slots = good.start, good.end, good.slots
    good.close()
    for at in (0, 9, 17, 25, 33, 41, 49, 56):  # magic, generation, count, slots, start, end, token, crc
        with pytest.raises(CorruptSegment):
            Table(damaged(model, at), TOKEN)
    with pytest.raises(CorruptSegment, match="another dict"):
        Table(build(model).buf, TOKEN + 1)
    with pytest.raises(CorruptSegment):
        Table(build(model).buf[: end - 8], TOKEN)  # truncated: the header's end is past the buffer
    # An entry's key, value or lengths damaged: reading that entry raises.
    for at in (start + 2, start + 9, start + 24, end - 9):
        t = Table(damaged(model, at), TOKEN)
        with pytest.raises(CorruptSegment):
            contents(t)
        t.close()
    # An index slot pointing outside the entries, or at a misaligned offset.
    for xor in (0x01, 0x80):
        buf = damaged(model, 0)
        buf[0] ^= 0x40
        idx = buf[L.TABLE_HEADER : start].cast("Q")
        used = [i for i in range(slots) if idx[i]]
        idx[used[0]] ^= xor if xor == 1 else (1 << 39)
        idx.release()
        t = Table(buf, TOKEN)
        with pytest.raises(CorruptSegment):
            for k in model:
                get(t, k)
        t.close()


def test_an_index_without_an_empty_slot_raises_instead_of_probing_forever() -> None:
    model = {i: i for i in range(5)}
    t = build(model)
    buf = memoryview(bytearray(t.buf))
    start, slots = t.start, t.slots
    t.close()
    idx = buf[L.TABLE_HEADER : start].cast("Q")
    for i in range(slots):
        idx[i] = ((1 << 64) - 1) ^ L.TABLE_OFFSET_MASK | start  # tags that match no key
    idx.release()
    t = Table(buf, TOKEN)
    with pytest.raises(CorruptSegment, match="no empty slot"):
        get(t, 12345)
    t.close()


CHILD = r"""
import json, mmap, sys
from ultradict_ng._platform import segments as _segments
from ultradict_ng._codec.codec import MsgpackCodec
from ultradict_ng._codec.keyhash import key_hash
from ultradict_ng._shm.table import Table
name, token, probes = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
codec = MsgpackCodec()
with _segments.Opened(name) as seg:
    mm = seg.map(seg.size(), mmap.ACCESS_READ)
    buf = memoryview(mm)
    t = Table(buf, token)
    out = []
    for p in probes:
        key = codec.loads(bytes.fromhex(p))
        off = t.find(key, key_hash(key), codec.loads)
        out.append(codec.loads(t.entry(off)[2]) if off else None)
    n = sum(1 for _ in t.items())
    t.close(); buf.release(); mm.close()
print(json.dumps([out, n]))
"""


@pytest.mark.parametrize("seed", ["0", "4242", "random"])
def test_an_unrelated_interpreter_reads_the_table_from_shared_memory(seed: str) -> None:
    import datetime as dt
    from decimal import Decimal

    utc, plus2 = dt.timezone.utc, dt.timezone(dt.timedelta(hours=2))
    model: dict[Any, Any] = {f"user:{i:05d}": i for i in range(2000)}
    model.update(
        {
            b"raw": "bytes",
            (1, 2): "tuple",
            frozenset({1, "a"}): "set",
            dt.datetime(2026, 11, 24, 10, tzinfo=utc): "instant",
            7: "int",
        }
    )
    entries = encode_entries(model.items(), CODEC.dumps)
    size = table_size(len(entries), sum((24 + len(k) + len(v) + 7) & ~7 for _, k, v in entries))
    buf = bytearray(size)
    write_table(memoryview(buf), entries, 1, TOKEN)
    name = unique_name("tbl") + "@t1"
    _segments.create_written(name, size, [(0, buf)], "no room for the test table")
    try:
        probes = [
            "user:00000",
            "user:01999",
            (1.0, 2),
            frozenset({"a", True}),
            b"raw",
            7.0,
            Decimal(7),
            dt.datetime(2026, 11, 24, 12, tzinfo=plus2),
            "user:02000",
            8,
        ]
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=ROOT)
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                name,
                str(TOKEN),
                json.dumps([CODEC.dumps(p).hex() for p in probes]),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        found, n = json.loads(out.stdout)
        assert found == [0, 1999, "tuple", "set", "bytes", "int", "int", "instant", None, None]
        assert n == len(model)
    finally:
        _segments.unlink(name)


def test_colliding_hashes_are_told_apart_by_the_key() -> None:
    """Two keys with one hash (forced: the caller gives the hashes), and keys
    whose hashes share the slot and the tag but not the rest: each probe ends
    at its own key, and a key that is absent is not found in their chain."""
    tag = 0xABCDEF << 40
    hashes = {"a": tag | 5, "b": tag | 5, "c": tag | (1 << 39) | 5, "d": (tag ^ (1 << 63)) | 5}
    entries = [(h, CODEC.dumps(k), CODEC.dumps(k.upper())) for k, h in hashes.items()]
    size = table_size(len(entries), sum((24 + len(k) + len(v) + 7) & ~7 for _, k, v in entries))
    buf = memoryview(bytearray(size))
    write_table(buf, entries, 1, TOKEN)
    t = Table(buf, TOKEN)
    for k, h in hashes.items():
        off = t.find(k, h, CODEC.loads)
        assert off and CODEC.loads(t.entry(off)[2]) == k.upper()
    assert t.find("e", tag | 5, CODEC.loads) == 0  # same hash, another key
    assert t.find("a", tag | (1 << 38) | 5, CODEC.loads) == 0  # same slot and tag, another hash
    t.close()


def test_long_and_boundary_keys_are_found_by_their_encoding() -> None:
    """str and bytes keys are compared as their msgpack encoding: every length
    class of the header (fixstr, str8/16/32, bin8/16/32) and non-ASCII text."""
    lengths = [0, 1, 31, 32, 255, 256, 65535, 65536, 70000]
    model: dict[Any, Any] = {}
    for n in lengths:
        model["s" * n] = n
        model[b"b" * n] = -n
        model["é" * n] = ("e", n)
    model[1] = "one"
    table = build(model)
    for k, v in model.items():
        assert get(table, k) == v
    for n in lengths[1:]:  # the same lengths absent: other text, bytes vs str
        with pytest.raises(KeyError):
            get(table, "t" * n)
        with pytest.raises(KeyError):
            get(table, b"s" * n)
    assert get(table, 1.0) == "one" and get(table, True) == "one"
    table.close()


@settings(max_examples=100, deadline=None)
@given(model=st.dictionaries(KEYS, VALUES, max_size=40))
def test_a_table_from_the_packed_dict_is_the_table_from_its_entries(model: dict[Any, Any]) -> None:
    """The bulk path (the whole dict packed in one call, split into entries by
    the helper) writes the very bytes the entry-by-entry path writes."""
    from ultradict_ng._shm.table import map_size, write_map

    packed = CODEC.dumps(model)
    hashes = [hash_key(k) for k in model]
    size = map_size(packed, hashes)
    buf = memoryview(bytearray(size))
    assert write_map(buf, packed, hashes, 1, TOKEN) == size
    assert bytes(buf) == bytes(build(model).buf)


def test_bad_input_to_the_writers_raises_before_writing_past_anything() -> None:
    from ultradict_ng.speedups import table_fill, table_index

    packed = CODEC.dumps({"a": 1, "b": [1, 2]})
    hashes = [hash_key("a"), hash_key("b")]
    end = table_fill(None, 128, packed, hashes)
    for bad_packed, bad_hashes, match in [
        (CODEC.dumps([1, 2]), hashes, "not a msgpack map"),
        (packed, hashes[:1], "pair count"),
        (packed[:-1], hashes, "malformed"),
        (packed + b"\x00", hashes, "after the map"),
    ]:
        buf = bytearray(end + 64)
        with pytest.raises(ValueError, match=match):
            table_fill(buf, 128, bad_packed, bad_hashes)
    small = bytearray(end - 1)
    with pytest.raises(ValueError, match="too small"):
        table_fill(small, 128, packed, hashes)
    assert small[:128] == bytes(128)  # (the header and index region untouched)
    with pytest.raises(ValueError, match="offset"):
        table_fill(bytearray(end), 12, packed, hashes)
    buf = bytearray(end)
    assert table_fill(buf, 128, packed, hashes) == end
    with pytest.raises(ValueError, match="add up"):
        table_index(buf, 8, 128, end, 3)
    with pytest.raises(ValueError, match="bounds"):
        table_index(buf, 8, 128, end + 8, 2)
    with pytest.raises(ValueError, match="bounds"):
        table_index(buf, 8, 120, end, 2)
    table_index(buf, 8, 128, end, 2)
