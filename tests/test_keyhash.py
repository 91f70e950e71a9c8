"""``_codec.keyhash.key_hash``: the hash a big dict's table is indexed by.

It must agree with ``dict``'s key identity (equal keys hash equal, whatever
their types, time zones or set orders) and with itself in every process,
whatever the hash seed.  Hypothesis builds keys and equal variants of them;
a plain ``dict`` decides what is equal; unrelated interpreters with other
``PYTHONHASHSEED``s must compute the same hashes; pinned values keep the
format from changing unnoticed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ultradict_ng import UnsupportedType
from ultradict_ng._codec.codec import MsgpackCodec
from ultradict_ng._codec.keyhash import key_hash

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ZONES = st.builds(
    lambda minutes, named: (
        dt.timezone(dt.timedelta(minutes=minutes), "Z" if named else None)
        if named
        else dt.timezone(dt.timedelta(minutes=minutes))
    ),
    st.integers(-23 * 60, 23 * 60),
    st.booleans(),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True),
    st.complex_numbers(allow_nan=True),
    st.decimals(allow_nan=False),
    st.text(max_size=12),
    st.binary(max_size=12),
    st.datetimes(),
    st.datetimes(timezones=ZONES),
    st.dates(),
    st.times(),
    st.times(timezones=ZONES),
    st.timedeltas(),
    ZONES,
)
KEYS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4).map(tuple), st.frozensets(inner, max_size=4)),
    max_leaves=12,
)


def variants(key: Any) -> list[Any]:
    """Keys equal to ``key`` (by ``==``) that are not the same object: other
    numeric types, the instant in other zones, rebuilt containers."""
    out: list[Any] = []
    t = type(key)
    if t in (int, bool):
        out += [int(key), float(key) if abs(key) < 2**53 else int(key), Decimal(int(key)), complex(key, 0)]
    elif t is float and key == key:
        out += [Decimal(key), complex(key, 0)] + ([int(key)] if key.is_integer() else [])
    elif t is dt.datetime and key.tzinfo is not None:
        for minutes in (0, 90, -300):
            try:
                out.append(key.astimezone(dt.timezone(dt.timedelta(minutes=minutes))))
            except OverflowError:  # (near year 1 or 9999)
                pass
    elif t is dt.timezone:
        out += [dt.timezone(key.utcoffset(None)), dt.timezone(key.utcoffset(None), "other")]
    elif t is tuple:
        out.append(tuple(variants(k)[-1] if variants(k) else k for k in key))
    elif t is frozenset:
        out.append(frozenset(reversed([variants(k)[-1] if variants(k) else k for k in key])))
    return [v for v in out if v == key]


@settings(max_examples=400, deadline=None)
@given(keys=st.lists(KEYS, min_size=1, max_size=8))
def test_equal_keys_hash_equal_as_a_dict_sees_them(keys: list[Any]) -> None:
    every = [v for k in keys for v in [k] + variants(k)]
    model: dict[Any, Any] = {}
    for k in every:
        model.setdefault(k, set()).add(key_hash(k))
    for k, hashes in model.items():
        if k == k:  # (a key holding a NaN equals only itself: identity, not value)
            assert len(hashes) == 1, (k, hashes)
    for a in every:  # and across dict slots: a == b implies equal hashes
        for b in every:
            if a == b:
                assert key_hash(a) == key_hash(b), (a, b)


def test_the_equalities_dict_has_and_hash_does_not_show() -> None:
    utc = dt.timezone.utc
    plus2 = dt.timezone(dt.timedelta(hours=2), "CEST")
    groups = [
        [1, 1.0, True, Decimal(1), Decimal("1.00"), complex(1, 0)],
        [0, 0.0, -0.0, False, Decimal("-0"), 0j],
        [(1, 2), (1.0, 2), (True, Decimal(2))],
        [frozenset({1, "a", (2, 3)}), frozenset({(2.0, 3), "a", True})],
        [dt.datetime(2026, 11, 24, 10, tzinfo=utc), dt.datetime(2026, 11, 24, 12, tzinfo=plus2)],
        [dt.time(10, tzinfo=utc), dt.time(12, tzinfo=plus2)],
        [dt.timezone(dt.timedelta(hours=2)), plus2],
        [dt.datetime(2026, 1, 1, 1, 30), dt.datetime(2026, 1, 1, 1, 30, fold=1)],
        [dt.timedelta(days=1), dt.timedelta(hours=24), dt.timedelta(seconds=86400)],
    ]
    for group in groups:
        assert len({key_hash(k) for k in group}) == 1, group
        assert len(dict.fromkeys(group)) == 1  # (dict agrees they are one key)
    # Never equal, and (here) hashed apart: naive vs aware, str vs bytes, date vs datetime.
    apart = [
        dt.datetime(2026, 1, 1),
        dt.datetime(2026, 1, 1, tzinfo=utc),
        dt.date(2026, 1, 1),
        "a",
        b"a",
        (),
        frozenset(),
        None,
        0,
        dt.time(0),
        dt.timedelta(0),
    ]
    assert len({key_hash(k) for k in apart}) == len(apart)


def test_distinct_keys_spread() -> None:
    keys: list[Any] = (
        list(range(20_000))
        + [f"user:{i:08d}" for i in range(20_000)]
        + [(i, i + 1) for i in range(5_000)]
        + [str(i).encode() for i in range(5_000)]
    )
    hashes = [key_hash(k) for k in keys]
    assert len(set(hashes)) == len(keys)  # no collision in 50,000 keys (64 bits)
    for bits in (0, 20, 40, 56):  # every part of the hash is used: a 256-slot table fills evenly
        buckets = [0] * 256
        for h in hashes[:20_000]:
            buckets[(h >> bits) & 255] += 1
        assert max(buckets) < 2 * 20_000 / 256


def test_every_process_and_seed_computes_the_same_hashes() -> None:
    """Unrelated interpreters with other hash seeds: the keys travel encoded
    (the codec's bytes), the hashes come back as JSON."""
    codec = MsgpackCodec()
    keys = [
        "",
        "é",
        "user:00000042",
        b"\x00\xff",
        (1, "a", b"b"),
        frozenset({"x", "y", "z", 3}),
        dt.datetime(2026, 11, 24, 10, 30, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
        dt.date(2000, 2, 29),
        2**100,
        -1.5,
        Decimal("3.14"),
        None,
        (frozenset({"p", "q"}), "r"),
    ]
    payload = codec.dumps(keys).hex()
    script = (
        "import sys, json\n"
        "from ultradict_ng._codec.codec import MsgpackCodec\n"
        "from ultradict_ng._codec.keyhash import key_hash\n"
        "keys = MsgpackCodec().loads(bytes.fromhex(sys.argv[1]))\n"
        "print(json.dumps([key_hash(k) for k in keys]))\n"
    )
    here = [key_hash(k) for k in keys]
    for seed in ("0", "1", "4242", "random"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", script, payload],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert json.loads(out) == here, seed


def test_pinned_values_keep_the_format() -> None:
    """The hash is a format (an index built with it is read by later code):
    these values must never change once a table is built with them.  (The
    str and bytes values changed once, before any table existed: BLAKE2b
    gave way to a word hash ten times cheaper compiled.)"""
    got = {repr(k): key_hash(k) for k in PINNED_KEYS}
    assert got == PINNED, {k: v for k, v in got.items() if PINNED.get(k) != v}


PINNED_KEYS = [
    0,
    1,
    -1,
    2**64,
    1.5,
    None,
    "",
    "a",
    b"a",
    (1, 2),
    frozenset({1, 2}),
    dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
    dt.date(2026, 1, 1),
    dt.timedelta(1),
    float("nan"),
    "user:00012345",
    "é€",
    b"0123456789abcdefg",
]
PINNED: dict[str, int] = {
    "0": 0xE220A8397B1DCDAF,
    "1": 0xE4D971771B652C20,
    "-1": 0x336503C6B835BEC0,
    "18446744073709551616": 0x9E5651B0EF953636,
    "1.5": 0x3B7A8EAD0DAD174F,
    "None": 0xBC1242F19D31D401,
    "''": 0xBEEB8DA1658EEC67,
    "'a'": 0xD45DE3A6347E677D,
    "b'a'": 0x3565BFCAC20F07C,
    "(1, 2)": 0x5D3B8F59B9E71CC6,
    "frozenset({1, 2})": 0xA4B3BBFCCCF0AE91,
    "datetime.datetime(2026, 1, 1, 0, 0, tzinfo=datetime.timezone.utc)": 0x6FBB3090F4172D97,
    "datetime.date(2026, 1, 1)": 0x9284916E9E284A5A,
    "datetime.timedelta(days=1)": 0x482CFDD2A56DA1F5,
    "nan": 0x6DB6CA64564DAEAA,
    "b'0123456789abcdefg'": 0xD0B64390E4BBC556,
    "'é€'": 0x3F7F32229186D503,
    "'user:00012345'": 0x1C56AE5A85EF4EE7,
}


def test_unsupported_and_unhashable_keys_raise() -> None:
    class K:
        pass

    with pytest.raises(UnsupportedType):
        key_hash(K())
    with pytest.raises(UnsupportedType):
        key_hash("\ud800")  # a lone surrogate: the serializer cannot store it either
    for bad in ([1], {1: 2}, {1}, bytearray(b"x"), (1, [2])):
        with pytest.raises(TypeError):
            key_hash(bad)
    with pytest.raises(UnsupportedType):
        key_hash(dt.datetime(2026, 1, 1, tzinfo=_OtherZone()))


class _OtherZone(dt.tzinfo):
    def utcoffset(self, when: Any) -> dt.timedelta:
        return dt.timedelta(0)
