"""Property tests of ultradict_ng._codec.codec: exact round-trips, rejection of what
cannot round-trip, robustness of the decoders against arbitrary bytes."""

from __future__ import annotations

import collections
import copy
import enum
import math
import os
import pickle
import struct
import subprocess
import sys
import threading
from datetime import date, datetime, time, timedelta, timezone, tzinfo
from decimal import Decimal
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ultradict_ng._codec.codec import (
    MAX_EXT_NESTING,
    MAX_NESTING,
    MSGPACK,
    PICKLE,
    Codec,
    MsgpackCodec,
    PickleCodec,
    codec_by_id,
    codec_for,
    copy_value,
)
from ultradict_ng.errors import CorruptSegment, SharedDictError, UnsupportedType

try:
    from zoneinfo import ZoneInfo

    PARIS: Any = ZoneInfo("Europe/Paris")
except Exception:  # pragma: no cover - no tz database

    class _FixedTz(tzinfo):
        def utcoffset(self, dt: Any) -> timedelta:
            return timedelta(hours=1)

        def dst(self, dt: Any) -> timedelta:
            return timedelta(0)

        def tzname(self, dt: Any) -> str:
            return "FIXED"

    PARIS = _FixedTz()

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------
# Exact comparison
# --------------------------------------------------------------------------


def _float_equal(a: float, b: float) -> bool:
    if math.isnan(a):
        return math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _tz_equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if type(a) is not type(b):
        return False
    if type(a) is timezone:
        # (offset,) or (offset, name): also tells a named UTC from timezone.utc
        return bool(a.__getinitargs__() == b.__getinitargs__())
    return bool(a == b)


def exact_equal(a: Any, b: Any) -> bool:
    """Equality that also requires identical types at every level, NaN equal
    to NaN, -0.0 distinct from 0.0 and tz/fold of datetimes identical."""
    tp = type(a)
    if tp is not type(b):
        return False
    if tp is float:
        return _float_equal(a, b)
    if tp is complex:
        return _float_equal(a.real, b.real) and _float_equal(a.imag, b.imag)
    if tp is Decimal:
        # sign, digits, exponent (or n/N/F for NaN/sNaN/Infinity): exact
        return bool(a.as_tuple() == b.as_tuple())
    if tp is list or tp is tuple:
        if len(a) != len(b):
            return False
        for x, y in zip(a, b):
            if not exact_equal(x, y):
                return False
        return True
    if tp is dict:
        if len(a) != len(b):
            return False
        for x, y in zip(a.items(), b.items()):  # keys in order too
            if not (exact_equal(x[0], y[0]) and exact_equal(x[1], y[1])):
                return False
        return True
    if tp is set or tp is frozenset:
        if len(a) != len(b):
            return False
        remaining = list(b)
        for x in a:
            for i, y in enumerate(remaining):
                if exact_equal(x, y):
                    del remaining[i]
                    break
            else:
                return False
        return True
    if tp is datetime or tp is time:
        return (
            a.replace(tzinfo=None) == b.replace(tzinfo=None)
            and a.fold == b.fold
            and _tz_equal(a.tzinfo, b.tzinfo)
        )
    if tp is timezone:
        return _tz_equal(a, b)
    return bool(a == b)


def roundtrip(value: Any) -> Any:
    data = MSGPACK.dumps(value)
    assert type(data) is bytes
    back = MSGPACK.loads(data)
    assert exact_equal(back, value), (value, back)
    assert exact_equal(MSGPACK.loads(memoryview(data)), value)
    assert exact_equal(MSGPACK.loads(bytearray(data)), value)
    return back


# --------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------

SPECIAL_INTS = [0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**100, -(10**100)]
SPECIAL_DECIMALS = [
    Decimal(s)
    for s in ("NaN", "-NaN", "NaN123", "Infinity", "-Infinity", "-0", "0E-30", "1E+999999", "-1.2345E-999999")
]

ints = st.one_of(
    st.integers(), st.integers(min_value=-(2**200), max_value=2**200), st.sampled_from(SPECIAL_INTS)
)
floats = st.floats(allow_nan=True, allow_infinity=True)
offsets = st.timedeltas(
    min_value=-timedelta(hours=23, minutes=59, seconds=59, microseconds=999999),
    max_value=timedelta(hours=23, minutes=59, seconds=59, microseconds=999999),
)
tzs = st.one_of(
    st.just(timezone.utc),
    st.builds(timezone, offsets),
    st.builds(timezone, offsets, st.text(max_size=8)),
)
datetimes = st.builds(
    lambda dt, tz, fold: dt.replace(tzinfo=tz, fold=fold), st.datetimes(), st.none() | tzs, st.integers(0, 1)
)
times = st.builds(
    lambda t, tz, fold: t.replace(tzinfo=tz, fold=fold), st.times(), st.none() | tzs, st.integers(0, 1)
)
decimals = st.one_of(st.decimals(allow_nan=True, allow_infinity=True), st.sampled_from(SPECIAL_DECIMALS))

hashable_scalars = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    floats,
    st.text(),
    st.binary(),
    st.complex_numbers(allow_nan=True, allow_infinity=True),
    decimals.filter(lambda d: not d.is_snan()),  # a signaling NaN cannot be hashed
    datetimes,
    st.dates(),
    times,
    st.timedeltas(),
    tzs,
)
scalars = st.one_of(hashable_scalars, decimals, st.binary().map(bytearray))

hashables = st.recursive(
    hashable_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3).map(tuple),
        st.frozensets(children, max_size=3),
    ),
    max_leaves=8,
)

values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(hashables, children, max_size=4),
        st.sets(hashables, max_size=4),
        st.frozensets(hashables, max_size=4),
    ),
    max_leaves=12,
)


# --------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------


@FAST
@given(values)
def test_roundtrip_values(value: Any) -> None:
    roundtrip(value)


@settings(FAST, max_examples=60)
@given(st.dictionaries(hashables, values, max_size=4))
def test_roundtrip_dicts_with_hashable_keys(value: Any) -> None:
    back = roundtrip(value)
    assert [type(k) for k in back] == [type(k) for k in value]


@FAST
@given(st.sets(hashables, max_size=5), st.frozensets(hashables, max_size=5))
def test_roundtrip_sets(s: Any, fs: Any) -> None:
    roundtrip(s)
    roundtrip(fs)
    roundtrip({fs: s})


@FAST
@given(hashables)
def test_hashables_work_as_keys_and_members(key: Any) -> None:
    roundtrip({key: 1})
    roundtrip({key})
    roundtrip(frozenset({key}))
    roundtrip((key, [key]))


IST = timezone(timedelta(hours=5, minutes=30), "IST")
EDGE_CASES: list[Any] = [
    None,
    True,
    False,
    0,
    2**64,
    2**64 - 1,
    -(2**63),
    -(2**63) - 1,
    10**100,
    -(10**100),
    2**10000,
    -(2**10000) + 1,
    0.0,
    -0.0,
    float("nan"),
    float("inf"),
    float("-inf"),
    5e-324,
    complex(-0.0, float("nan")),
    "",
    "é漢字🎉",
    b"",
    bytearray(),
    bytearray(b"\x00\xff"),
    Decimal("NaN"),
    Decimal("-sNaN"),
    Decimal("sNaN42"),
    Decimal("-0"),
    Decimal("1E+999999"),
    Decimal("-Infinity"),
    Decimal("3.14159265358979323846264338327950288419716939937510"),
    datetime(2021, 10, 31, 2, 30, fold=1),
    datetime(2021, 10, 31, 2, 30, 0, 123456, tzinfo=IST, fold=1),
    datetime(2000, 1, 1, tzinfo=timezone.utc),
    datetime(2000, 1, 1, tzinfo=timezone(timedelta(0), "UTC")),
    datetime(2000, 1, 1, tzinfo=timezone(timedelta(hours=-3, microseconds=1))),
    datetime.min,
    datetime.max,
    datetime.max.replace(tzinfo=timezone(timedelta(hours=23, minutes=59))),
    date.min,
    date.max,
    time(),
    time(23, 59, 59, 999999, fold=1),
    time(12, tzinfo=IST, fold=1),
    timedelta(),
    timedelta(microseconds=-1),
    timedelta.min,
    timedelta.max,
    timezone.utc,
    IST,
    timezone(timedelta(hours=-23, minutes=-59), ""),
    [],
    (),
    {},
    set(),
    frozenset(),
    [[], (), {}, set(), frozenset()],
    ((),),
    (((1, 2), (3,)), ()),
    {(1, (2, (3, "x"))): "nested tuple key"},
    {((),): 1, (): 2, frozenset(): 3, frozenset({(1, frozenset({2}))}): 4},
    {None: 1, True: 2, 2: 3, 1.5: 4, b"k": 5, "k": 6, -(2**70): 7, Decimal("1.10"): 8, IST: 9},
    {date(2000, 1, 1): [datetime(2000, 1, 1, tzinfo=IST)], timedelta(1): {time(1)}},
    [bytearray(b"a"), (bytearray(b"b"), [bytearray(b"c")]), {"k": bytearray(b"d")}],
    {"z": 1, "a": 2, "m": 3},
    [b"\xd6\xff\x00\x00\x00\x01", 214, -1, b"\xc7\x0c\xff"],  # look like Timestamp ext bytes
]


def _short_id(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# (loops rather than parametrize: the suite's autouse fixture costs ~50 ms per test)
def test_edge_cases() -> None:
    for value in EDGE_CASES:
        back = roundtrip(value)
        if type(value) in (bool, type(None)):
            assert back is value


def test_utc_comes_back_as_the_singleton() -> None:
    assert MSGPACK.loads(MSGPACK.dumps(timezone.utc)) is timezone.utc
    assert MSGPACK.loads(MSGPACK.dumps(datetime(2000, 1, 1, tzinfo=timezone.utc))).tzinfo is timezone.utc
    named = MSGPACK.loads(MSGPACK.dumps(timezone(timedelta(0), "UTC")))
    assert named is not timezone.utc and named.tzname(None) == "UTC"


def test_dict_key_order_and_types_preserved() -> None:
    value = {(1, 2): "a", 3: "b", "3": "c", (1, (2, 3)): "d", frozenset({1}): "e", b"3": "f"}
    back = MSGPACK.loads(MSGPACK.dumps(value))
    assert list(back) == list(value)
    assert [type(k) for k in back] == [tuple, int, str, tuple, frozenset, bytes]
    assert type(list(back)[3][1]) is tuple


def test_nesting_up_to_the_limits_round_trips() -> None:
    deep: Any = "leaf"
    for _ in range(MAX_NESTING):
        deep = [deep]
    back = MSGPACK.loads(MSGPACK.dumps(deep))
    for _ in range(MAX_NESTING):
        assert type(back) is list and len(back) == 1
        back = back[0]
    assert back == "leaf"
    nested: Any = 1
    for _ in range(MAX_EXT_NESTING):
        nested = (nested, datetime(2000, 1, 1, tzinfo=IST), 2**70)
    roundtrip(nested)
    roundtrip({nested: [nested]})


@settings(FAST, max_examples=150)
@given(values)
def test_the_compiled_scan_decides_as_the_walk(value: Any) -> None:
    """``prepare`` takes a container whose members need no conversion as it is,
    decided by one scan (``_plain_below``); the walk decides alike: the same
    bytes, or the same error, with the scan switched off."""
    from ultradict_ng._codec import encode

    def outcome() -> Any:
        try:
            return MSGPACK.dumps([value, {"rows": [[1, value]]}, (value,)])
        except UnsupportedType as exc:
            return type(exc)

    fast = outcome()
    original = encode._plain_below
    encode._plain_below = lambda obj, depth, ext_depth: False  # type: ignore[assignment]
    try:
        assert outcome() == fast
    finally:
        encode._plain_below = original


def test_the_scan_leaves_conversions_and_limits_to_the_walk() -> None:
    """What the scan must not pass: a bytearray (converted to its ext), nesting
    at the limits, a member of another type."""
    from ultradict_ng._codec import encode
    from ultradict_ng._codec.ext import LEAF_TYPES

    assert encode._plain_below([[1, (2, "x")], {"a": None}], 1, 0)
    assert not encode._plain_below([[1, (2, bytearray(b"x"))]], 1, 0)
    assert not encode._plain_below([[1, (2, 3)]], MAX_NESTING - encode.SCAN_LEVELS + 1, 0)
    assert not encode._plain_below([[1, (2, 3)]], 1, MAX_EXT_NESTING - encode.SCAN_LEVELS + 1)
    assert bytearray not in LEAF_TYPES
    back = MSGPACK.loads(MSGPACK.dumps({"k": [(1, bytearray(b"b"))]}))
    assert type(back["k"][0][1]) is bytearray  # converted, not packed as bytes
    too_deep: Any = 1
    for _ in range(MAX_EXT_NESTING + 1):
        too_deep = (too_deep,)
    with pytest.raises(UnsupportedType):
        MSGPACK.dumps({"rows": [too_deep]})


def test_encoding_is_deterministic() -> None:
    small = {"x", "y", "z", "w"}
    grown = set(map(str, range(1000))) | small
    for i in range(1000):
        grown.discard(str(i))
    assert small == grown
    assert MSGPACK.dumps(small) == MSGPACK.dumps(grown)
    assert MSGPACK.dumps(frozenset(small)) == MSGPACK.dumps(frozenset(grown))
    assert MSGPACK.dumps({(1, frozenset(small)): 1}) == MSGPACK.dumps({(1, frozenset(grown)): 1})
    # the fast path for a top-level tuple of scalars gives the general encoding
    for value in [(True, "key", 123), (2**70, 1.5, datetime(2000, 1, 1, tzinfo=IST)), ()]:
        assert MSGPACK.dumps([value]) == b"\x91" + MSGPACK.dumps(value)


def test_set_encoding_does_not_depend_on_the_hash_seed() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        "import sys; from ultradict_ng._codec.codec import MSGPACK; "
        "sys.stdout.write(MSGPACK.dumps({frozenset(map(str, range(40))): {b'a', 'b', ('c', 'd')}}).hex())"
    )
    outputs = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=root)
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1


# --------------------------------------------------------------------------
# Unsupported values
# --------------------------------------------------------------------------


class Color(enum.IntEnum):
    RED = 1


class MyStr(str):
    pass


class MyClass:
    pass


Point = collections.namedtuple("Point", "x y")


def _deep_list(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _deep_tuple(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = (value,)
    return value


def _deep_dict(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = {"k": value}
    return value


UNSUPPORTED = [
    object(),
    MyClass(),
    lambda: 1,
    Color.RED,
    collections.OrderedDict(a=1),
    collections.defaultdict(list),
    MyStr("x"),
    Point(1, 2),
    datetime(2021, 6, 1, tzinfo=PARIS),
    time(1, tzinfo=PARIS),
    {"a": [1, 2, {"b": (3, [4, {"c": MyClass()}])}]},
    {"a": [1, 2, {"b": (3, [4, {"c": datetime(2021, 6, 1, tzinfo=PARIS)}])}]},
    [Color.RED],
    (1, Color.RED),
    {Color.RED: 1},
    {(1, Color.RED): 1},
    frozenset({Color.RED}),
    {1, (2, Color.RED)},
    memoryview(b"abc"),
    [memoryview(b"abc")],
    msgpack.ExtType(1, b"\x90"),
    [msgpack.ExtType(1, b"\x90")],
    msgpack.Timestamp(1, 0),
    {"t": msgpack.Timestamp(1, 0)},
    "\ud800",
    ("ok", ["\udfff"]),
    {"\ud800": 1},
    type,
    int,
    Ellipsis,
    range(3),
    _deep_list(MAX_NESTING + 1),
    _deep_list(100_000),
    _deep_tuple(MAX_EXT_NESTING + 1),
    _deep_tuple(5000),
    [_deep_tuple(MAX_EXT_NESTING + 1)],
]


def test_unsupported_values_raise_unsupported_type() -> None:
    for value in UNSUPPORTED:
        with pytest.raises(UnsupportedType) as info:
            MSGPACK.dumps(value)
        assert isinstance(info.value, TypeError)
        assert isinstance(info.value, SharedDictError)
        assert "pickle" in str(info.value), _short_id(value)


def test_unsupported_message_names_type_and_opt_in() -> None:
    with pytest.raises(UnsupportedType) as info:
        MSGPACK.dumps({"k": [MyClass()]})
    message = str(info.value)
    assert "MyClass" in message
    assert 'serializer="pickle"' in message
    assert "trusts every process" in message
    with pytest.raises(UnsupportedType, match="subclass of int"):
        MSGPACK.dumps(Color.RED)
    with pytest.raises(UnsupportedType, match="ZoneInfo|tzinfo"):
        MSGPACK.dumps([datetime(2021, 6, 1, tzinfo=PARIS)])


def test_codec_still_works_after_errors() -> None:
    for bad in UNSUPPORTED[:20]:
        with pytest.raises(UnsupportedType):
            MSGPACK.dumps(bad)
        roundtrip((1, "x", [2, {"y": (3,)}]))


# --------------------------------------------------------------------------
# Decoding arbitrary bytes
# --------------------------------------------------------------------------


def _loads_or_corrupt(data: Any) -> None:
    try:
        MSGPACK.loads(data)
    except CorruptSegment:
        pass


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_raises_only_corrupt_segment(data: bytes) -> None:
    _loads_or_corrupt(data)
    _loads_or_corrupt(memoryview(data))


ext_codes = st.integers(min_value=-128, max_value=127)


def _ext_bytes(code: int, payload: bytes) -> bytes:
    """An ext object with any code, including negative ones (ExtType refuses those)."""
    if len(payload) < 256:
        return b"\xc7" + struct.pack(">Bb", len(payload), code) + payload
    return b"\xc8" + struct.pack(">Hb", len(payload), code) + payload


@settings(max_examples=200, deadline=None)
@given(
    ext_codes,
    st.one_of(
        st.binary(max_size=40),
        values.map(MSGPACK.dumps),
        st.builds(
            msgpack.packb, st.lists(st.integers(-(2**63), 2**64 - 1) | st.text(max_size=3), max_size=12)
        ),
    ),
)
def test_ext_with_arbitrary_payload(code: int, payload: bytes) -> None:
    data = _ext_bytes(code, payload)
    _loads_or_corrupt(data)
    _loads_or_corrupt(b"\x92\x01" + data)  # inside an array
    _loads_or_corrupt(b"\x81" + data + b"\x01")  # as a map key
    for wrapper in (1, 2, 3):  # inside a tuple/set/frozenset payload
        _loads_or_corrupt(_ext_bytes(wrapper, b"\x91" + data))


@settings(max_examples=150, deadline=None)
@given(values, st.data())
def test_mutated_encodings(value: Any, data: st.DataObject) -> None:
    encoded = bytearray(MSGPACK.dumps(value))
    index = data.draw(st.integers(0, len(encoded) - 1))
    encoded[index] = data.draw(st.integers(0, 255))
    _loads_or_corrupt(bytes(encoded))
    _loads_or_corrupt(bytes(encoded[:index] + encoded[index + 1 :]))


@FAST
@given(values)
def test_truncated_encodings(value: Any) -> None:
    encoded = MSGPACK.dumps(value)
    for end in range(len(encoded)):
        # msgpack is prefix-free: a strict prefix can never be a whole value
        with pytest.raises(CorruptSegment):
            MSGPACK.loads(encoded[:end])
    with pytest.raises(CorruptSegment):
        MSGPACK.loads(encoded + b"\x00")  # trailing data


def test_unknown_ext_code() -> None:
    for code in (0, 15, 50, 99, 127):  # 1-14 are ours (_codec/ext.py)
        with pytest.raises(CorruptSegment, match="unknown"):
            MSGPACK.loads(msgpack.packb(msgpack.ExtType(code, b"\x00")))
        with pytest.raises(CorruptSegment):
            MSGPACK.loads(msgpack.packb([1, {"k": msgpack.ExtType(code, b"")}]))


def test_negative_ext_code() -> None:
    with pytest.raises(CorruptSegment):
        MSGPACK.loads(b"\xd4\xfb\x00")  # fixext 1, type -5


TIMESTAMP_ENCODINGS = [
    msgpack.packb(msgpack.Timestamp(1, 0)),
    msgpack.packb(msgpack.Timestamp(2**34, 5)),
    msgpack.packb(msgpack.Timestamp(-1, 5)),
    msgpack.packb([1, {"k": msgpack.Timestamp(1, 0)}]),
    msgpack.packb({msgpack.Timestamp(1, 0): 1}),
    msgpack.packb(msgpack.ExtType(1, msgpack.packb([msgpack.Timestamp(1, 0)]))),
    msgpack.packb(msgpack.ExtType(2, msgpack.packb([msgpack.Timestamp(1, 0)]))),
    b"\xc7\x04\xff\x00\x00\x00\x01",  # ext 8 form
    b"\xc8\x00\x08\xff" + b"\x00" * 8,  # ext 16 form
    b"\xc9\x00\x00\x00\x0c\xff" + b"\x00" * 12,  # ext 32 form
]


def test_msgpack_timestamp_is_rejected() -> None:
    for data in TIMESTAMP_ENCODINGS:
        with pytest.raises(CorruptSegment):
            MSGPACK.loads(data)


def test_payload_type_confusion() -> None:
    bad = [
        msgpack.ExtType(1, msgpack.packb({"not": "a list"})),
        msgpack.ExtType(2, msgpack.packb([[1]])),  # unhashable set member
        msgpack.ExtType(8, msgpack.packb([2000, 1, 1, 0, 0, 0, 0, 0, "x"])),
        msgpack.ExtType(8, msgpack.packb([2000, 13, 1, 0, 0, 0, 0, 0])),
        msgpack.ExtType(8, msgpack.packb([2000, 1, 1, 0, 0, 0, 0, 2])),
        msgpack.ExtType(8, msgpack.packb([2000, 1, 1, 0, 0, 0, 0, 0, 10**11])),
        msgpack.ExtType(8, msgpack.packb([2000, 1, 1, 0, 0, 0, 0, 0, 0, 5])),
        msgpack.ExtType(9, msgpack.packb([2000, 1, True + 0.5])),
        msgpack.ExtType(9, msgpack.packb([msgpack.ExtType(4, b"\x01"), 1, 1])),
        msgpack.ExtType(11, msgpack.packb([10**12, 0, 0])),
        msgpack.ExtType(12, msgpack.packb([])),
        msgpack.ExtType(6, b"\x00" * 15),
        msgpack.ExtType(7, b"not a number"),
        msgpack.ExtType(7, b"\xff"),
    ]
    for ext in bad:
        with pytest.raises(CorruptSegment):
            MSGPACK.loads(msgpack.packb(ext))


def test_ext_nesting_beyond_limit_is_corrupt() -> None:
    data = msgpack.packb(0)
    for _ in range(MAX_EXT_NESTING):
        data = msgpack.packb(msgpack.ExtType(1, b"\x91" + data))  # a 1-tuple around data
    assert MSGPACK.loads(data) == _deep_tuple(MAX_EXT_NESTING)
    data = msgpack.packb(msgpack.ExtType(1, b"\x91" + data))
    with pytest.raises(CorruptSegment, match="nested too deeply"):
        MSGPACK.loads(data)
    for _ in range(2000):  # far beyond: must not exhaust the C stack
        data = msgpack.packb(msgpack.ExtType(2, b"\x91" + data))
    with pytest.raises(CorruptSegment):
        MSGPACK.loads(data)


def test_loads_wrong_input_type_is_corrupt() -> None:
    not_bytes: list[Any] = ["a str", 12, None, [1], object()]
    for data in not_bytes:
        with pytest.raises(CorruptSegment):
            MSGPACK.loads(data)


# --------------------------------------------------------------------------
# Pickle codec
# --------------------------------------------------------------------------


class Pickleable:
    def __init__(self, x: Any) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return type(other) is Pickleable and other.x == self.x

    __hash__ = None  # type: ignore[assignment]


class Exploding:
    def __reduce__(self) -> Any:
        return (int, ("not an int",))


PICKLABLES = [
    None,
    (1, "a", [2.5]),
    collections.OrderedDict(a=1, b=[2]),
    collections.defaultdict(list, {"k": [1]}),
    Color.RED,
    MyStr("s"),
    Point(1, 2),
    Pickleable({"nested": Pickleable([1, 2])}),
    datetime(2021, 6, 1, tzinfo=PARIS),
    {frozenset({1}): {2: bytearray(b"x")}},
]


def test_pickle_roundtrip() -> None:
    for value in PICKLABLES:
        data = PICKLE.dumps(value)
        assert data[:2] == b"\x80\x05"  # protocol 5
        for form in (data, memoryview(data), bytearray(data)):
            back = PICKLE.loads(form)
            assert type(back) is type(value)
            assert back == value


@FAST
@given(values)
def test_pickle_roundtrip_values(value: Any) -> None:
    assert exact_equal(PICKLE.loads(PICKLE.dumps(value)), value)


def test_pickle_dumps_errors_are_unsupported_type() -> None:
    class Local:
        pass

    for bad in (lambda: 1, Local(), threading.Lock(), _deep_list(200_000)):
        with pytest.raises(UnsupportedType) as info:
            PICKLE.dumps(bad)
        assert isinstance(info.value, TypeError)


def test_pickle_dumps_too_deep_says_so() -> None:
    for deep in (_deep_list(100_000), _deep_dict(100_000), _deep_tuple(100_000), {_deep_tuple(5000): 1}):
        with pytest.raises(UnsupportedType, match="nested too deeply for the pickle serializer") as info:
            PICKLE.dumps(deep)
        assert "RecursionError" not in str(info.value)
        assert isinstance(info.value.__cause__, RecursionError)
    assert PICKLE.loads(PICKLE.dumps([1, (2,)])) == [1, (2,)]  # the codec still works


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=100))
def test_pickle_garbage_raises_only_corrupt_segment(data: bytes) -> None:
    try:
        PICKLE.loads(data)
    except CorruptSegment:
        pass


def test_pickle_loads_errors_are_corrupt_segment() -> None:
    with pytest.raises(CorruptSegment):
        PICKLE.loads(pickle.dumps(Exploding()))
    with pytest.raises(CorruptSegment):
        PICKLE.loads(b"")
    with pytest.raises(CorruptSegment):
        PICKLE.loads(pickle.dumps([1, 2, 3])[:-3])


# --------------------------------------------------------------------------
# copy_value
# --------------------------------------------------------------------------

MUTABLE = (list, dict, set, bytearray)


def mutable_ids(value: Any) -> list[int]:
    found: list[int] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, MUTABLE):
            found.append(id(item))
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif isinstance(item, Pickleable):
            stack.append(item.x)
    return found


def check_copy(value: Any) -> Any:
    copied = copy_value(value)
    assert exact_equal(copied, value) if type(value) is not Pickleable else copied == value
    assert not set(mutable_ids(copied)) & set(mutable_ids(value))
    return copied


@FAST
@given(values)
def test_copy_value_shares_no_mutable_object(value: Any) -> None:
    copied = check_copy(value)
    if not mutable_ids(value):
        assert copied is value  # immutable (also tuples of immutables) are not copied


def test_copy_value_returns_immutables_as_is() -> None:
    immutables: list[Any] = [
        None,
        True,
        7,
        2**100,
        1.5,
        "s",
        b"b",
        1j,
        Decimal("1.5"),
        date.min,
        datetime.max,
        time(),
        timedelta(1),
        IST,
    ]
    immutables += [frozenset({(1, 2)}), (1, ("a", (b"b",))), ()]
    for value in immutables:
        assert copy_value(value) is value


def test_copy_value_copies_mutables() -> None:
    inner = [1, 2]
    value: dict[str, Any] = {
        "a": inner,
        "b": (inner, 3),
        "c": {1, 2},
        "d": bytearray(b"x"),
        "e": ((1,), [{"f": [inner]}]),
    }
    copied = check_copy(value)
    copied["a"].append(3)
    copied["b"][0].append(4)
    copied["d"][0] = 0
    copied["e"][1][0]["f"][0].append(5)
    assert inner == [1, 2]
    assert value["d"] == bytearray(b"x")
    assert copied["b"] is not value["b"]
    assert copied["e"][0] is value["e"][0]


def test_copy_value_pickle_only_types() -> None:
    obj = Pickleable([1, {"k": [2]}])
    value = [obj, (obj,), collections.OrderedDict(a=[1])]
    copied = copy_value(value)
    assert copied == value
    assert copied[0] is not obj and copied[0].x is not obj.x
    assert copied[1][0] is not obj
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    copied_cycle = copy_value(cyclic)
    assert copied_cycle is not cyclic and copied_cycle[1] is copied_cycle


# --------------------------------------------------------------------------
# codec_for / codec_by_id
# --------------------------------------------------------------------------


def test_codec_for() -> None:
    assert codec_for(None) is MSGPACK
    assert codec_for("msgpack") is MSGPACK
    assert codec_for("MsgPack") is MSGPACK
    assert codec_for("pickle") is PICKLE
    assert codec_for("PICKLE") is PICKLE
    assert codec_for(MSGPACK) is MSGPACK
    custom = MsgpackCodec()
    assert codec_for(custom) is custom
    for bad in ("json", "", b"msgpack", 1, object()):
        with pytest.raises(ValueError) as info:
            codec_for(bad)  # type: ignore[arg-type]
        assert "'msgpack'" in str(info.value) and "'pickle'" in str(info.value)


def test_codec_ids_and_names() -> None:
    assert (MSGPACK.id, MSGPACK.name) == (1, "msgpack")
    assert (PICKLE.id, PICKLE.name) == (2, "pickle")
    assert isinstance(MSGPACK, Codec) and isinstance(PICKLE, PickleCodec)
    assert codec_by_id(1) is MSGPACK
    assert codec_by_id(2) is PICKLE
    for bad in (0, 3, 255, -1):
        with pytest.raises(CorruptSegment, match=f"unknown serializer id {bad}"):
            codec_by_id(bad)
    assert pickle.loads(pickle.dumps(MSGPACK)) is MSGPACK
    assert pickle.loads(pickle.dumps(PICKLE)) is PICKLE
    assert copy.deepcopy(MSGPACK) is MSGPACK


# --------------------------------------------------------------------------
# Threads
# --------------------------------------------------------------------------


def test_dumps_from_threads() -> None:
    samples = (
        list(EDGE_CASES)
        + [(True, "key", i) for i in range(20)]
        + [
            {"i": i, "t": (i, datetime(2000, 1, 1, tzinfo=IST), [bytearray(b"x")] * (i % 3))}
            for i in range(20)
        ]
    )
    expected = [MSGPACK.dumps(v) for v in samples]
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            barrier.wait()
            for rnd in range(40):
                for j in range(len(samples)):
                    k = (j + offset * 7 + rnd) % len(samples)
                    data = MSGPACK.dumps(samples[k])
                    assert data == expected[k]
                    assert exact_equal(MSGPACK.loads(data), samples[k])
                    if k % 10 == 0:
                        with pytest.raises(UnsupportedType):
                            MSGPACK.dumps([1, (2, {"k": MyClass()})])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


# -- a dict of scalar rows (a dump, a bulk load's update record) in one compiled call ------------

_row_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=40),
    st.binary(max_size=40),
)
_row_values = st.one_of(
    _row_scalars,
    st.lists(_row_scalars, max_size=15).map(tuple),
    st.sampled_from([2**64, {"x": 1}, [1, (2,)], (1, (2,)), tuple(range(16)), 1j]),
)


def _general(obj: Any) -> bytes:
    """The codec's general path (its Packer chain after the walk)."""
    from ultradict_ng._codec.encode import new_chain, prepare

    return bytes(new_chain()[0].pack(prepare(obj, 0, 0)))


@given(st.dictionaries(_row_scalars, _row_values, max_size=30))
def test_dumps_of_a_dict_of_rows_is_the_general_encoding(rows: dict[Any, Any]) -> None:
    """Scalar keys and scalar or scalar-tuple values are packed by the
    compiled pack_map; anything else by the general path: the same bytes."""
    assert MSGPACK.dumps(rows) == _general(rows)
    assert repr(MSGPACK.loads(MSGPACK.dumps(rows))) == repr(rows)


@given(
    st.lists(st.tuples(_row_scalars, _row_values).map(list), max_size=30), st.lists(_row_scalars, max_size=2)
)
def test_encode_record_of_an_update_is_the_general_path(pairs: list[Any], path: list[Any]) -> None:
    """encode_record's update shortcut gives the general path's bytes, and a
    decoded record equal to the readers' one, of the same types all the way."""
    from ultradict_ng._shm.layout import OP_UPDATE

    record = [OP_UPDATE, path, pairs]
    payload, decoded = MSGPACK.encode_record(record)
    assert payload == _general(record)
    assert repr(decoded) == repr(MSGPACK.loads(payload))
    # Taken exactly when every pair fits (the record itself is what readers decode).
    fits = all(
        _row_scalar(k)
        and (_row_scalar(v) or (type(v) is tuple and len(v) <= 15 and all(map(_row_scalar, v))))
        for k, v in pairs
    )
    assert (decoded is record) == fits


_ROW_TYPES = frozenset({type(None), bool, int, float, str, bytes})


def _row_scalar(x: Any) -> bool:
    return type(x) in _ROW_TYPES and not (type(x) is int and not -(2**63) <= x < 2**64)


def test_dumps_of_rows_takes_the_compiled_packer(monkeypatch: pytest.MonkeyPatch) -> None:
    from ultradict_ng._codec import codec as codec_module

    taken: list[Any] = []

    def spy(obj: Any, threshold: int) -> Any:
        out = real(obj, threshold)
        taken.append(out)
        return out

    real = codec_module.pack_map
    monkeypatch.setattr(codec_module, "pack_map", spy)
    rows = {f"user:{i:08d}": (i, f"name{i}", i / 2) for i in range(1000)}
    assert MSGPACK.dumps(rows) == _general(rows) and taken == [_general(rows)]
    assert MSGPACK.dumps({"a": {"b": 1}}) == _general({"a": {"b": 1}}) and taken[1:] == [None]


_json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([2**64, -(2**63) - 1]),
    st.floats(allow_nan=True),
    st.text(max_size=10),
    st.binary(max_size=10),
)
_json_trees = st.recursive(
    _json_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers(-3, 3)), inner, max_size=4),
        st.lists(inner, max_size=2).map(tuple),
        st.sets(st.integers(), max_size=2),
    ),
    max_leaves=25,
)


@given(
    value=_json_trees | st.lists(_json_trees, max_size=3).map(tuple), path=st.lists(_row_scalars, max_size=2)
)
def test_encode_record_of_a_json_like_set_is_the_general_path(value: Any, path: list[Any]) -> None:
    """encode_record's strict path for dicts and lists (and a tuple of them at
    the top) gives the general path's bytes, and a decoded record equal to the
    readers' one, of the same types all the way, that shares nothing mutable
    with the caller's value."""
    from ultradict_ng._shm.layout import OP_SET

    record = [OP_SET, path, "k", value]
    try:
        expected = _general(record)
    except Exception:
        with pytest.raises(UnsupportedType):
            MSGPACK.encode_record(record)
        return
    payload, decoded = MSGPACK.encode_record(record)
    assert payload == expected
    assert repr(decoded) == repr(MSGPACK.loads(payload))
    if type(value) in (dict, list):
        assert decoded[3] is not value
