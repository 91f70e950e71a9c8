"""Recovery's checkpoint merged from bytes (``stream_merge_plan`` /
``stream_merge_write``, ``_disk/layout.py`` step e): the compiled helper and
its twin against a ``dict`` replaying the same records, and a recovery that
takes it against one that replays."""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from decimal import Decimal
from typing import Any, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ultradict_ng import SharedDict, speedups
from ultradict_ng._codec import codec
from ultradict_ng._helper import streammerge as twin
from ultradict_ng._shm import layout as L
from ultradict_ng._shm.table import Table, encode_entries, table_size, write_table

pytestmark = pytest.mark.shm_only

native = speedups._compiled
MSGPACK = codec.codec_for(None)
IMPLS = [("twin", twin)] + ([("native", native)] if native is not None else [])

str_keys = st.sampled_from(["a", "b", "é", "k" * 40, "z" * 300, "\U0001f600", "", "x1", "x2"])
#: Every msgpack int form at both ends of its range, and a few between.
EDGES = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**61 - 1, 2**61, 2**63, 2**64 - 1]
EDGES += [-1, -2, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**61) + 1, -(2**63)]
int_keys = st.one_of(st.sampled_from(EDGES), st.integers(min_value=-(2**63), max_value=2**64 - 1))
keys = st.one_of(str_keys, int_keys)
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.binary(max_size=40),
    st.tuples(st.integers(), st.text(max_size=5)),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
)
ops = st.lists(st.tuples(st.sampled_from(["set", "set", "del"]), keys, values), max_size=40)


def table_of(model: dict[str, Any]) -> bytearray:
    entries = encode_entries(model.items(), MSGPACK.dumps)
    buf = bytearray(table_size(len(entries), sum((24 + len(k) + len(v) + 7) & ~7 for _, k, v in entries)))
    write_table(memoryview(buf), entries, 1, 7)
    return buf


def stream_of(payloads: list[bytes], tag: int = 1) -> bytes:
    out = bytearray()
    for p in payloads:
        head = struct.pack("<II", len(p), tag)
        out += head + struct.pack("<II", zlib.crc32(p, zlib.crc32(head)), L.UNIT_WHOLE) + p
    return bytes(out) + bytes(64)


def history(start: dict[str, Any], steps: list[tuple[str, str, Any]]) -> tuple[dict[str, Any], list[bytes]]:
    """The dict after ``steps`` and their records (a delete only of a key present, as writers write)."""
    model, records = dict(start), []
    for op, key, value in steps:
        if op == "set":
            model[key] = value
            records.append(MSGPACK.dumps([L.OP_SET, [], key, value]))
        elif key in model:
            del model[key]
            records.append(MSGPACK.dumps([L.OP_DEL, [], key]))
    return model, records


def merged(impl: Any, buf: bytearray, stream: bytes, end: int) -> Optional[tuple[int, bytes]]:
    """``(count, new table)`` by ``impl``, or None where it declines."""
    table = Table(memoryview(buf), 7)
    args = (table.buf, table.slots, table.start, table.end)
    got = impl.stream_merge_plan(stream, end, *args, L.OP_SET, L.OP_DEL)
    if got is None:
        return None
    count, nbytes, plan = got
    from ultradict_ng._shm.table import _finish, slots_for

    slots = slots_for(count)
    out = bytearray(table_size(count, nbytes))
    at = 64 + 8 * slots
    assert impl.stream_merge_write(plan, stream, *args, out, at) == at + nbytes
    _finish(memoryview(out), count, slots, at + nbytes, 2, 7)
    with pytest.raises(ValueError):
        impl.stream_merge_write(plan, stream, *args, bytearray(len(out) - 8), at)
    return count, bytes(out)


#: Keys a dict takes as equal to ints (True == 1 == 1.0 == Decimal(1) ==
#: complex(1)), in a table beside int records.
equal_to_ints = st.sampled_from(
    [
        True,
        False,
        1.0,
        -0.0,
        2.5,
        float(2**63),
        Decimal(1),
        Decimal(5),
        Decimal("2.5"),
        complex(0, 0),
        complex(3, 0),
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.one_of(keys, equal_to_ints), values, max_size=8), ops)
def test_the_merge_is_the_dict_the_records_make_on_every_impl(start, steps):
    """Sets and deletes, overwrites, deletes and sets again (to the end, as
    in a dict), keys the table did not hold, str and int keys: each
    implementation writes the same bytes, a table of the dict replaying the
    records gives, in its order.  Int records beside a table holding a bool,
    a float or an ext-typed key (``Decimal``, ``complex``) are declined (the
    replay takes them)."""
    model, records = history(start, steps)
    stream = stream_of(records)
    end = len(stream) - 64
    buf = table_of(start)
    got = {name: merged(impl, buf, stream, end) for name, impl in IMPLS}
    assert len({v for v in got.values()}) == 1, got
    result = got["twin"]
    ints = any(type(MSGPACK.loads(r)[2]) is int for r in records)
    if ints and any(type(k) in (bool, float, Decimal, complex) for k in start):
        assert result is None
        return
    assert result is not None
    count, raw = result
    assert count == len(model)
    table = Table(memoryview(bytearray(raw)), 7)
    assert list(table.decoded(MSGPACK.loads)) == list(model.items())


def test_what_the_merge_declines_and_damage_it_reports():
    """A record that is not a root-level set or delete of a str key in
    msgpack's shortest form, or a delete of a key nothing holds: None (the
    caller replays); a damaged entry: ValueError in the walk's words."""
    buf = table_of({"a": 1, "b": 2})
    declined = [
        MSGPACK.dumps([L.OP_SET, ["a"], "x", 1]),  # (a nested dict's record)
        MSGPACK.dumps([L.OP_SET, [], 5.0, 1]),  # (a float key)
        MSGPACK.dumps([L.OP_SET, [], True, 1]),  # (a bool key)
        MSGPACK.dumps([L.OP_SET, [], b"a", 1]),  # (a bytes key)
        bytes([0x94, L.OP_SET, 0x90, 0xCC, 5]) + MSGPACK.dumps(1),  # (an int not in its shortest form)
        bytes([0x94, L.OP_SET, 0x90, 0xD0, 5]) + MSGPACK.dumps(1),  # (a positive int as a signed one)
        bytes([0x94, L.OP_SET, 0x90, 0xD1, 0x7F, 0xFF]) + MSGPACK.dumps(1),  # (32767: a uint16's)
        bytes([0x94, L.OP_SET, 0x90, 0xD1, 0xFF, 0xF0]) + MSGPACK.dumps(1),  # (-16: a fixint's)
        bytes([0x94, L.OP_SET, 0x90, 0xCF, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]) + MSGPACK.dumps(1),
        MSGPACK.dumps([L.OP_CLEAR, []]),
        MSGPACK.dumps([L.OP_UPDATE, [], [["a", 1]]]),
        MSGPACK.dumps([L.OP_DEL, [], "c"]),  # (nothing holds it)
        bytes([0x94, L.OP_SET, 0x90, 0xD9, 1]) + b"a" + MSGPACK.dumps(1),  # (not the shortest form)
        bytes([0x94, L.OP_SET, 0x90, 0xA2]) + b"\xed\xa0" + MSGPACK.dumps(1),  # (not UTF-8: a surrogate)
        MSGPACK.dumps([L.OP_SET, [], "a", 1])[:-1] + b"\xc1",  # (a value msgpack never writes)
    ]
    for record in declined:
        for delete_twice in (False, True):
            records = [record]
            if delete_twice:  # (declined after every record is read: the same answer)
                records = [MSGPACK.dumps([L.OP_DEL, [], "a"])] * 2 + [MSGPACK.dumps([L.OP_SET, [], "z", 0])]
            stream = stream_of(records)
            for _, impl in IMPLS:
                assert merged(impl, buf, stream, len(stream) - 64) is None, (record, impl)
    stream = stream_of([MSGPACK.dumps([L.OP_SET, [], "a", 3])])
    damaged = bytearray(buf)
    damaged[Table(memoryview(buf), 7).start + 25] ^= 1  # (the first entry's key)
    for _, impl in IMPLS:
        with pytest.raises(ValueError, match="table entry fails its checksum"):
            merged(impl, damaged, stream, len(stream) - 64)
        with pytest.raises(ValueError, match="do not fit the end"):
            merged(impl, buf, stream[:-70], len(stream) - 70)
    replaced = bytearray(buf)  # (damage in an entry the records give a new value: never copied, not read)
    first = Table(memoryview(buf), 7).start
    replaced[first + 24 + 2] ^= 1  # (the first entry's value: "a"'s)
    got = {name: merged(impl, replaced, stream, len(stream) - 64) for name, impl in IMPLS}
    assert len(set(got.values())) == 1
    result = got["twin"]
    assert result is not None
    assert list(Table(memoryview(bytearray(result[1])), 7).decoded(MSGPACK.loads)) == [("a", 3), ("b", 2)]


@pytest.mark.parametrize(
    "records", ["sets and deletes", "int keys", "a nested record", "int keys, a Decimal key"]
)
def test_a_recovery_merges_the_records_as_bytes_or_replays_them(tmp_path, monkeypatch, records):
    """A big dict's recovery after a crash: its checkpoint merged from the
    records' bytes (nothing replayed) when they are root-level sets and
    deletes of str or int keys, replayed otherwise -- the same dict either way
    (int records beside a table key equal to an int in a dict but not in
    bytes, a ``Decimal``: replayed, one key, the record's value)."""
    from ultradict_ng._disk import recovery
    from ultradict_ng._shm import table as T

    monkeypatch.setenv("ULTRADICT_NG_PARTIAL_FROM", "64")
    used: list[bool] = []
    planned = T.StreamMerge.planned

    def spy(*args: Any) -> Any:
        got = planned(*args)
        used.append(got is not None)
        return got

    monkeypatch.setattr(T.StreamMerge, "planned", staticmethod(spy))
    path = str(tmp_path / "dict")
    d = SharedDict(path=path, recurse=records == "a nested record")
    key: Any = (lambda i: i * 7919 - 2**40) if records == "int keys" else (lambda i: f"k{i}")
    d.update({key(i): (i, "v") for i in range(500)})
    if records == "int keys, a Decimal key":
        key = lambda i: i * 7919  # noqa: E731
        d[Decimal(3 * 7919)] = "equal to the int key the records set"
    d._store.force_dump()
    model = dict(d)
    for i in range(0, 700, 3):
        d[key(i)] = i  # (overwrites, and new keys past 500)
        model[key(i)] = i
        if i % 7 == 0 and key(i + 1) in model:
            del d[key(i + 1)]
            del model[key(i + 1)]
    if records == "a nested record":
        d["n"] = {"x": 1}
        d["n"]["y"] = 2
        model["n"] = {"x": 1, "y": 2}
    copy = str(tmp_path / "copy")
    shutil.copytree(path, copy)  # (the files as a crash leaves them: a dict of its own, not closed)
    d.unlink()
    d.close()
    e = SharedDict(path=copy, create=False)
    assert used == [records in ("sets and deletes", "int keys")]
    assert list(e.keys()) == list(model) and {k: e[k] for k in model} == model
    assert e.stats()["generation"] == 2  # (a checkpoint, either way)
    e.unlink()
    e.close()
    assert recovery is not None and not os.path.exists(copy)
