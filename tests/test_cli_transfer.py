"""``ultradict-ng dump`` and ``load``: round trips, refusals, all-or-nothing loads,
stdin/stdout, the progress bar.

Most tests drive ``main([...])`` in this process (fast, and hypothesis can run
many examples); the ones about processes -- a dict that outlives the command,
pipes, a terminal -- run ``python -m ultradict_ng`` as a user does.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pty
import select
import stat
import subprocess
import sys
import time as clock
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ultradict_ng import SharedDict
from ultradict_ng._codec.codec import MSGPACK
from ultradict_ng.cli import main
from ultradict_ng.cli.transfer import MARKER, VERSION

from .conftest import unique_name
from .test_codec import exact_equal, hashables, values

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = os.path.join(ROOT, "tests", "cli_workers.py")
CLI = [sys.executable, "-m", "ultradict_ng"]


def cli(
    *args: str, input: Any = None, cwd: Any = ROOT, text: bool = True
) -> subprocess.CompletedProcess[Any]:
    return subprocess.run([*CLI, *args], capture_output=True, text=text, timeout=120, cwd=cwd, input=input)


@pytest.fixture
def made() -> Iterator[list[str]]:
    """Names of dicts a command created (they outlive it): removed after the test."""
    names: list[str] = []
    yield names
    for n in names:
        SharedDict.unlink_by_name(n)


@contextlib.contextmanager
def attached(name: str) -> Iterator[SharedDict]:
    """A handle on an existing dict, closed after (``with d:`` would take its lock)."""
    d = SharedDict(name=name, create=False)
    try:
        yield d
    finally:
        d.close()


def run(capsys: Any, *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def header(path: Any) -> Any:
    with open(path, "rb") as f:
        return MSGPACK.loads(f.read(200)[: _header_length(path)])


def _header_length(path: Any) -> int:
    import msgpack

    with open(path, "rb") as f:
        unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=False)
        unpacker.skip()
        return int(unpacker.tell())


# -- help --------------------------------------------------------------------------------


def test_help_lists_dump_and_load():
    out = cli("--help")
    assert (
        "ultradict-ng dump jobs jobs.dump" in out.stdout and "ultradict-ng load jobs jobs.dump" in out.stdout
    )
    for command in ("dump", "load"):
        sub = cli(command, "--help")
        assert sub.returncode == 0 and f"usage: ultradict-ng {command}" in sub.stdout
        assert "--format" in sub.stdout and "--quiet" in sub.stdout and "--json" in sub.stdout
    assert "--replace" in cli("load", "--help").stdout
    assert cli("dump", "x").returncode == 2 and cli("load", "x", "f", "--format", "xml").returncode == 2


# -- msgpack round trips -------------------------------------------------------------------


def _has_nan(value: Any) -> bool:
    tp = type(value)
    if tp is float:
        return math.isnan(value)
    if tp is complex:
        return math.isnan(value.real) or math.isnan(value.imag)
    if tp is Decimal:
        return value.is_nan()
    if tp in (tuple, frozenset, set, list):
        return any(_has_nan(v) for v in value)
    return False


keys = hashables.filter(lambda k: not _has_nan(k))  # NaN keys are never found again, in any dict


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(model=st.dictionaries(keys, values, max_size=6), recurse=st.booleans())
def test_msgpack_round_trip_of_every_codec_type(tmp_path, capsys, model, recurse):
    path = str(tmp_path / "d.dump")
    src, dst = unique_name(), unique_name()
    d = SharedDict(name=src, recurse=recurse)
    try:
        d.update(model)
        assert run(capsys, "dump", src, path)[0] == 0
        assert header(path)["entries"] == len(model) and header(path)["recurse"] is recurse
        status, out, err = run(capsys, "load", dst, path)
        assert status == 0, err
        took = out.split(" in ")[-1].split()[0]
        assert out == f"loaded {len(model):,} entries into {dst!r} in {took} s (created it)\n"
        back = SharedDict(name=dst, create=False)
        try:
            assert back.recurse is recurse  # from the dump's header
            assert exact_equal(back.copy(), d.copy())
            assert exact_equal(back.copy(), model)
        finally:
            back.unlink()
            back.close()
    finally:
        d.close()


def _everything() -> dict:
    value = {
        "int": 1,
        "big": 2**200,
        "neg-big": -(2**70),
        "float": -0.0,
        "nan": float("nan"),
        "str": "ünïcödé",
        "bytes": b"\x00\xff" * 10,
        "blob": bytes(range(256)) * 1000,  # a blob segment
        "bytearray": bytearray(b"ba"),
        "complex": 1 + 2j,
        "decimal": Decimal("1.10"),
        "set": {1, "a", (2, 3)},
        "frozenset": frozenset({b"x"}),
        "tuple": (1, [2, {"k": (3,)}]),
        "aware": datetime(2024, 3, 31, 1, 59, tzinfo=timezone(timedelta(hours=2), "CEST"), fold=1),
        "utc": datetime(2020, 1, 1, tzinfo=timezone.utc),
        "naive": datetime(1999, 12, 31, 23, 59),
        "date": date(2000, 2, 29),
        "time": time(12, 0, tzinfo=timezone(-timedelta(hours=5))),
        "timedelta": timedelta(days=-1, microseconds=5),
        "tz": timezone(timedelta(minutes=90), "odd"),
        "nested": {"a": {"b": {"c": [1, 2, {3: "three"}]}}, 7: {}},
        (1, "tuple", (2,)): "a tuple key",
        42: "an int key",
        None: "a None key",
        2.5: "a float key",
        frozenset({1, 2}): "a frozenset key",
        b"bk": "a bytes key",
        Decimal("3"): "a Decimal key",
        datetime(2001, 1, 1, tzinfo=timezone.utc): "a datetime key",
    }
    try:
        import numpy as np
    except ImportError:
        return value
    value["array"] = np.arange(12, dtype="<i4").reshape(3, 4)
    value["big-array"] = np.linspace(0, 1, 200_000)  # 1.6 MB: in a blob
    value["structured"] = np.zeros(3, dtype=[("x", "<f8"), ("y", "S3")])
    value["arrays-in-a-list"] = [np.ones(2, dtype="u1"), {"inner": np.eye(2)}]
    return value


def _same(a: Any, b: Any) -> bool:
    """exact_equal, arrays compared by dtype, shape and bytes."""
    np = sys.modules.get("numpy")
    if np is not None and type(a) is np.ndarray:
        return (
            type(b) is np.ndarray and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
        )
    if type(a) in (list, tuple) and type(b) is type(a) and len(a) == len(b):
        return all(_same(x, y) for x, y in zip(a, b))
    if type(a) is dict and type(b) is dict and len(a) == len(b):
        return all(exact_equal(ka, kb) and _same(va, vb) for (ka, va), (kb, vb) in zip(a.items(), b.items()))
    return exact_equal(a, b)


@pytest.mark.parametrize("recurse", [True, False])
def test_msgpack_round_trip_explicit(dicts, name, made, tmp_path, capsys, recurse):
    value = _everything()
    d = dicts(name=name, recurse=recurse)
    d.update(value)
    path = tmp_path / "all.msgpack"
    status, out, _ = run(capsys, "dump", name, str(path))
    assert status == 0 and out.startswith(f"dumped {len(value)} entries of {name!r} to {path} (")
    head = header(path)
    assert head["format"] == MARKER and head["version"] == VERSION and head["name"] == name
    assert head["entries"] == len(value) and head["recurse"] is recurse
    assert [e for e in os.listdir(tmp_path)] == ["all.msgpack"]  # no temporary file left

    other = unique_name()
    made.append(other)
    assert run(capsys, "load", other, str(path))[0] == 0
    back = SharedDict(name=other, create=False)
    try:
        assert back.recurse is recurse
        assert list(back.keys()) == list(value)  # insertion order
        assert _same(back.copy(), d.copy()) and _same(back.copy(), value)
        if recurse:
            assert isinstance(back["nested"]["a"], SharedDict)
    finally:
        back.close()


@pytest.mark.parametrize("fmt", ["msgpack", "jsonl"])
def test_a_value_as_deep_as_the_dict_takes_loads_back(dicts, name, made, tmp_path, capsys, fmt):
    """The deepest value ``d[k] = v`` takes is in the dump and loads back: an
    update's record nests values two levels deeper than a set's, and load
    refused what the dict itself held."""
    from ultradict_ng.errors import UnsupportedType

    d = dicts(name=name, recurse=False)
    depth = 520
    while True:  # (the deepest list a set takes)
        value: Any = 1
        for _ in range(depth):
            value = [value]
        try:
            d["deep"] = value
            break
        except UnsupportedType:
            depth -= 1
    d["after"] = 2
    path = tmp_path / f"deep.{fmt}"
    assert run(capsys, "dump", name, str(path))[0] == 0
    other = unique_name()
    made.append(other)
    status, _, err = run(capsys, "load", other, str(path))
    assert status == 0, err
    back = SharedDict(name=other, create=False)
    try:
        assert back["deep"] == value and back["after"] == 2
    finally:
        back.close()


def test_a_json_line_nested_deeper_than_any_dict_is_a_one_line_error(dicts, name, tmp_path, capsys):
    path = tmp_path / "deep.jsonl"
    path.write_text('["k", ' + "[" * 5000 + "]" * 5000 + "]\n")
    status, _, err = run(capsys, "load", name, str(path))
    assert status == 1 and "line 1: nested too deep" in err and "Traceback" not in err


def test_show_json_of_the_deepest_value_a_dict_takes(dicts, name, capsys):
    """Rendering takes two or three frames a level: ``show --json`` of a
    value the dict holds raised RecursionError (a traceback)."""
    d = dicts(name=name, recurse=False)
    value: Any = 1
    for _ in range(490):
        value = [value]
    d["deep"] = value
    status, out, err = run(capsys, "show", name, "deep", "--json")
    assert status == 0, err
    assert json.loads(out) == {"deep": value}


# -- JSON lines ------------------------------------------------------------------------------


def test_jsonl_round_trip(dicts, name, made, tmp_path, capsys):
    value = {
        "s": "x\ny\u2028",
        1: [1, 2.5, None, True, {"k": ["v", {}]}],
        2.5: -0.0,
        False: "bool key",
        None: {"a": {"b": 10**30}},
        "empty": [],
        "e": "",
    }
    dicts(name=name).update(value)
    path = tmp_path / "d.jsonl"
    assert run(capsys, "dump", name, str(path))[0] == 0
    lines = path.read_text("utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [[k, v] for k, v in value.items()]
    other = unique_name()
    made.append(other)
    status, out, _ = run(capsys, "load", other, str(path), "--json")
    assert status == 0 and json.loads(out)["entries"] == len(value) and json.loads(out)["created"] is True
    back = SharedDict(name=other, create=False)
    try:
        assert exact_equal(back.copy(), value)  # int, float, bool and None keys keep their types
        assert [type(k) for k in back.keys()][1:5] == [int, float, bool, type(None)]
    finally:
        back.close()


@pytest.mark.parametrize(
    "bad, says",
    [
        ((1, 2), "key 'bad': the value is a tuple, which JSON would turn into a list"),
        ({"x": [1, (2,)]}, "key 'bad': the value at ['x'][1] is a tuple"),
        (b"raw", "key 'bad': the value is a bytes"),
        ({1, 2}, "the value is a set"),
        ({"n": {3: "x"}}, "the value at ['n'] is a dict with the int key 3"),
        (float("inf"), "the float inf has no JSON form"),
        (Decimal("1"), "the value is a Decimal"),
    ],
)
def test_jsonl_refuses_what_json_cannot_hold(dicts, name, tmp_path, capsys, bad, says):
    d = dicts(name=name)
    d.update({"fine": 1, "bad": bad, "after": 2})
    path = tmp_path / "out.jsonl"
    status, out, err = run(capsys, "dump", name, str(path))
    assert status == 1 and out == "" and says in err and "use --format msgpack" in err, err
    assert err.startswith("ultradict-ng dump: ") and err.count("\n") == 1
    assert os.listdir(tmp_path) == []  # neither FILE nor the temporary file
    path.write_text("old\n")
    assert run(capsys, "dump", name, str(path))[0] == 1
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["out.jsonl"]  # FILE untouched


def test_jsonl_refuses_a_tuple_key_and_stdout_gets_nothing(dicts, name):
    dicts(name=name).update({"a": 1, (1, 2): "t"})
    out = cli("dump", name, "-", "--format", "jsonl")
    assert out.returncode == 1 and out.stdout == ""
    assert (
        out.stderr
        == "ultradict-ng dump: key (1, 2): a tuple key has no exact JSON form; use --format msgpack\n"
    )


# -- load: all or nothing ---------------------------------------------------------------


def _dump_file(tmp_path: Any, capsys: Any, items: dict, fmt: str = "msgpack") -> Any:
    src = unique_name()
    d = SharedDict(name=src)
    try:
        d.update(items)
        path = tmp_path / f"src.{fmt}"
        assert run(capsys, "dump", src, str(path))[0] == 0
    finally:
        d.close()
    return path


@pytest.mark.parametrize("cut", ["inside an entry", "at an entry boundary"])
def test_load_of_a_truncated_msgpack_file_changes_nothing(dicts, name, tmp_path, capsys, cut):
    path = _dump_file(tmp_path, capsys, {f"k{i}": "v" * 100 for i in range(20_000)})
    data = path.read_bytes()
    entry = len(b"\x92" + MSGPACK.dumps("k19999") + MSGPACK.dumps("v" * 100))
    path.write_bytes(data[: -entry - 30] if cut == "inside an entry" else data[:-entry])
    target = dicts(name=name)
    target.update({"old": 1, "k5": "old"})
    watcher = SharedDict(name=name, create=False)  # another handle
    try:
        status, out, err = run(capsys, "load", name, str(path))
        assert status == 1 and out == "" and err.count("\n") == 1, err
        if cut == "inside an entry":
            assert "entry 19999: the file is truncated" in err
        else:
            assert "truncated: its header says 20,000 entries, it holds 19,999" in err
        assert err.endswith("; nothing was changed\n")
        assert watcher.copy() == {"old": 1, "k5": "old"} and target.copy() == {"old": 1, "k5": "old"}
        # with --replace too: the clear is rolled back with the rest
        assert run(capsys, "load", name, str(path), "--replace")[0] == 1
        assert watcher.copy() == {"old": 1, "k5": "old"}
    finally:
        watcher.close()


def test_load_of_a_jsonl_file_with_a_bad_line_changes_nothing(dicts, name, tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    lines = [json.dumps([f"k{i}", i]) for i in range(12_000)]  # more than a chunk: some were written
    lines[11_000] = '["k", 1'  # line 11001
    path.write_text("\n".join(lines) + "\n")
    dicts(name=name)["old"] = 1
    watcher = SharedDict(name=name, create=False)
    try:
        status, _, err = run(capsys, "load", name, str(path))
        assert status == 1 and err.startswith("ultradict-ng load: line 11001, column 8: Expecting ','"), err
        assert err.endswith("; nothing was changed\n")
        assert watcher.copy() == {"old": 1}
        for bad, says in [
            ('{"a": 1}', "not a [key, value] array"),
            ("[[1], 2]", "the key is a JSON array"),
            ('["a", NaN]', "NaN is not JSON"),
            ('["a", 1e999]', "does not fit a float"),
            ("[1, 2, 3]", "not a [key, value] array"),
        ]:
            path.write_text(f'["a", 1]\n\n{bad}\n')
            status, _, err = run(capsys, "load", name, str(path), "--replace")
            assert status == 1 and err.startswith("ultradict-ng load: line 3: ") and says in err, err
        path.write_bytes(b'["a", 1]\n["\xff", 1]\n')
        assert "line 2: " in run(capsys, "load", name, str(path))[2]
        assert watcher.copy() == {"old": 1}
    finally:
        watcher.close()


def test_replace(dicts, name, tmp_path, capsys):
    path = _dump_file(tmp_path, capsys, {"a": 1, "b": 2})
    d = dicts(name=name)
    d.update({"b": "old", "z": 26})
    status, out, _ = run(capsys, "load", name, str(path))
    assert status == 0 and out.startswith(f"loaded 2 entries into {name!r} in ") and "(" not in out
    assert d.copy() == {"b": 2, "z": 26, "a": 1}  # merged: existing keys overwritten
    status, out, _ = run(capsys, "load", name, str(path), "--replace")
    assert status == 0 and out.endswith(" s (replaced its contents)\n")
    assert d.copy() == {"a": 1, "b": 2} and list(d) == ["a", "b"]


def test_a_failed_load_leaves_no_new_dict(name, tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text('["a", 1]\n["b"]\n')
    status, _, err = run(capsys, "load", name, str(path))
    assert status == 1 and "line 2" in err
    assert not os.path.exists(f"/dev/shm/{name}")
    nested = tmp_path / "p" / "q" / "d"  # (a PATH whose parents the load would make)
    status, _, err = run(capsys, "load", str(nested), str(path))
    assert status == 1 and "line 2" in err
    assert not os.path.exists(tmp_path / "p")
    mine = tmp_path / "mine"  # (a directory the user made, named through a symbolic link)
    mine.mkdir(mode=0o750)
    (tmp_path / "link").symlink_to(mine)
    status, _, err = run(capsys, "load", str(tmp_path / "link"), str(path))
    assert status == 1 and "line 2" in err, err
    assert mine.is_dir() and os.listdir(mine) == [] and (tmp_path / "link").resolve() == mine
    assert stat.S_IMODE(mine.stat().st_mode) == 0o750


@pytest.mark.parametrize(
    "content, says",
    [
        (b"", "is empty: not an ultradict-ng dump"),
        (
            b'["a", 1]\n',
            "does not start with the 'ultradict-ng dump' header; a JSON lines file? use --format jsonl",
        ),
        (
            MSGPACK.dumps({"format": "other", "version": 1}),
            "does not start with the 'ultradict-ng dump' header",
        ),
        (MSGPACK.dumps({"format": MARKER, "version": 2, "entries": 0, "recurse": False}), "format version 2"),
        (MSGPACK.dumps({"format": MARKER, "version": 1, "entries": "3", "recurse": False}), "damaged header"),
        (
            MSGPACK.dumps({"format": MARKER, "version": 1, "entries": 1, "recurse": False}) + b"\x91\x01",
            "entry 1: not a [key, value] pair",
        ),
        (
            MSGPACK.dumps({"format": MARKER, "version": 1, "entries": 1, "recurse": False})
            + b"\x92\x91\x01\x01",
            "entry 1: its key, a list, is not hashable",
        ),
        (
            MSGPACK.dumps({"format": MARKER, "version": 1, "entries": 1, "recurse": False}) + b"\x92\x01\xc1",
            "entry 1: cannot decode",
        ),
        (
            MSGPACK.dumps({"format": MARKER, "version": 1, "entries": 1, "recurse": False})
            + b"\x92\x01\xd6\xff\0\0\0\0",
            "entry 1: a msgpack Timestamp",
        ),
        (
            MSGPACK.dumps({"format": MARKER, "version": 1, "entries": 0, "recurse": False}) + b"\x92\x01\x01",
            "entry 1: more entries than the header's 0",
        ),
    ],
)
def test_load_refuses_files_that_are_not_dumps(dicts, name, tmp_path, capsys, content, says):
    path = tmp_path / "in.dump"
    path.write_bytes(content)
    dicts(name=name)["old"] = 1
    status, out, err = run(capsys, "load", name, str(path))
    assert status == 1 and out == "" and says in err and err.count("\n") == 1, err
    with attached(name) as d:
        assert d.copy() == {"old": 1}


def test_load_refuses_a_blob_reference(dicts, name, tmp_path, capsys):
    """A reference into some dict's blob segments would make the dict read memory it does
    not own: a dump never holds one (blobs are written as their values)."""
    from ultradict_ng._codec.placeholders import BlobRef

    path = tmp_path / "in.dump"
    path.write_bytes(
        MSGPACK.dumps({"format": MARKER, "version": 1, "entries": 1, "recurse": False})
        + b"\x92"
        + MSGPACK.dumps("k")
        + MSGPACK.dumps([BlobRef(1, 1, 10, None)])
    )
    dicts(name=name)
    status, _, err = run(capsys, "load", name, str(path))
    assert status == 1 and "entry 1: a reference to a dict's blob" in err


def test_recurse_must_agree_on_an_existing_dict(dicts, name, made, tmp_path, capsys):
    path = _dump_file(tmp_path, capsys, {"a": {"b": 1}})
    dicts(name=name)  # not recurse
    status, _, err = run(capsys, "load", name, str(path), "--recurse")
    assert status == 1 and f"{name!r} exists and is not a recurse dict: --recurse disagrees" in err
    assert run(capsys, "load", name, str(path), "--no-recurse")[0] == 0
    created = unique_name()
    made.append(created)
    assert run(capsys, "load", created, str(path), "--recurse")[0] == 0  # the header says not; the flag wins
    with attached(created) as d:
        assert d.recurse is True and isinstance(d["a"], SharedDict)


# -- processes: creation, pipes, refusals ------------------------------------------------------


def test_load_creates_a_dict_that_outlives_the_command(name, made, tmp_path):
    made.append(name)
    path = tmp_path / "in.jsonl"
    path.write_text('["a", 1]\n[2, {"x": [1]}]\n')
    out = cli("load", name, str(path), "--recurse")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.startswith(f"loaded 2 entries into {name!r} in ") and out.stdout.endswith(
        "s (created it)\n"
    )
    d = SharedDict(name=name, create=False)  # the command's process has ended
    try:
        assert d.copy() == {"a": 1, 2: {"x": [1]}} and d.recurse is True
        assert [u.pid for u in d.users()] == [os.getpid()]  # the command detached
    finally:
        d.close()


def test_stdin_and_stdout(dicts, name, made):
    d = dicts(name=name, recurse=True)
    d.update({"a": (1, 2), "b": {"c": {1, 2}}, 3: b"bytes"})
    other = unique_name()
    made.append(other)
    dumped = cli("dump", name, "-", text=False)
    assert dumped.returncode == 0, dumped.stderr
    assert dumped.stderr.decode().startswith(
        f"dumped 3 entries of {name!r} to stdout ("
    )  # the summary: stderr
    assert MSGPACK.loads(dumped.stdout[: _length(dumped.stdout)])["entries"] == 3
    loaded = cli("load", other, "-", input=dumped.stdout, text=False)
    assert loaded.returncode == 0 and loaded.stdout.decode().startswith(f"loaded 3 entries into {other!r}")
    with attached(other) as back:
        assert exact_equal(back.copy(), d.copy()) and back.recurse is True
    # JSON lines both ways, through a pipe
    src = unique_name()
    dicts(name=src).update({"x": [1, "two"], 5: None})
    text = cli("dump", src, "-", "--format", "jsonl", "--quiet")
    assert text.returncode == 0 and text.stdout == '["x", [1, "two"]]\n[5, null]\n'
    assert text.stderr == ""  # --quiet: not even the summary
    assert cli("load", other, "-", "--format", "jsonl", "--replace", input=text.stdout).returncode == 0
    with attached(other) as back:
        assert back.copy() == {"x": [1, "two"], 5: None}


def _length(data: bytes) -> int:
    import msgpack

    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    unpacker.skip()
    return int(unpacker.tell())


def test_missing_dict_and_missing_file(name, tmp_path):
    out = cli("dump", name, str(tmp_path / "x.dump"))
    assert out.returncode == 1 and out.stderr == f"ultradict-ng dump: no shared dict named {name!r} exists\n"
    assert os.listdir(tmp_path) == []
    out = cli("load", name, str(tmp_path / "missing.dump"))
    assert (
        out.returncode == 1
        and "No such file or directory" in out.stderr
        and len(out.stderr.splitlines()) == 1
    )
    assert not os.path.exists(f"/dev/shm/{name}")
    d = SharedDict(name=name)
    try:
        missing_dir = tmp_path / "no" / "x.dump"
        out = cli("dump", name, str(missing_dir))
        assert out.returncode == 1 and out.stderr == (
            f"ultradict-ng dump: [Errno 2] No such file or directory: '{missing_dir}'\n"
        )
        out = cli("dump", name, str(tmp_path))
        assert out.returncode == 1 and out.stderr.endswith(f"Is a directory: '{tmp_path}'\n")
    finally:
        d.close()
    out = cli("dump", "bad/name", str(tmp_path / "x.dump"))
    assert out.returncode == 1 and "bad/name" in out.stderr and "Traceback" not in out.stderr


def test_pickle_dicts_are_refused_and_never_unpickled(name, made, tmp_path):
    """A pickle dict whose objects create a file when unpickled (tests/cli_workers.py evil):
    dump and load refuse it before attaching, and nothing runs."""
    made.append(name)
    writer_dir, cli_dir = tmp_path / "writer", tmp_path / "cli"
    writer_dir.mkdir()
    cli_dir.mkdir()
    subprocess.run(
        [sys.executable, WORKERS, "evil", name, "UNPICKLED", "evil"], cwd=writer_dir, check=True, timeout=30
    )
    assert (writer_dir / "UNPICKLED").exists(), "the trap does not fire when really unpickled"
    out = cli("dump", name, "out.dump", cwd=cli_dir)
    assert out.returncode == 1 and out.stderr == (
        f"ultradict-ng dump: shared dict {name!r} uses the pickle serializer: attaching would unpickle "
        "its contents, i.e. run code stored in shared memory, which the command line never does\n"
    )
    (cli_dir / "in.jsonl").write_text('["a", 1]\n')
    out = cli("load", name, "in.jsonl", cwd=cli_dir)
    assert out.returncode == 1 and "uses the pickle serializer" in out.stderr
    assert sorted(os.listdir(cli_dir)) == ["in.jsonl"], "the command line ran code from a pickle"


# -- the progress bar --------------------------------------------------------------------------


def _on_a_terminal(*args: str) -> tuple[int, str, str]:
    """Run the command with stderr on a pseudo-terminal: (status, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=slave, cwd=ROOT)
    os.close(slave)
    seen = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            assert ready, "the command hung"
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not chunk:
                break
            seen += chunk
        assert proc.stdout is not None
        out = proc.stdout.read().decode()
        proc.stdout.close()
        return proc.wait(60), out, seen.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_progress_bar_on_a_terminal_only(dicts, name, made, tmp_path):
    dicts(name=name).update({i: "v" for i in range(50_000)})
    path = str(tmp_path / "big.dump")
    status, out, term = _on_a_terminal("dump", name, path)
    assert status == 0 and out.startswith("dumped 50,000 entries"), term
    assert f"\rdumping {name} [" in term and "/50,000 entries" in term and "/s" in term
    assert term.endswith("\r\x1b[K")  # erased at the end
    other = unique_name()
    made.append(other)
    status, out, term = _on_a_terminal("load", other, path)
    assert status == 0 and out.startswith("loaded 50,000 entries"), term
    assert f"\rloading {other} [" in term and "/50,000 entries" in term and term.endswith("\r\x1b[K")
    assert _on_a_terminal("load", other, path, "--quiet")[2] == ""
    assert _on_a_terminal("dump", name, path, "-q")[2] == ""
    plain = cli("load", other, path)  # stderr a pipe: nothing
    assert plain.returncode == 0 and plain.stderr == ""


# -- a big dict --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["msgpack", "jsonl"])
def test_200k_keys(dicts, name, made, tmp_path, fmt):
    d = dicts(name=name)
    d.update({f"key-{i}": [i, str(i)] for i in range(200_000)})
    path = str(tmp_path / f"big.{fmt}")
    out = cli("dump", name, path, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["entries"] == 200_000
    other = unique_name()
    made.append(other)
    out = cli("load", other, path, "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["entries"] == result["keys"] == 200_000 and result["format"] == fmt
    with attached(other) as back:
        copy = back.copy()
    assert copy == d.copy() and list(copy)[:3] == ["key-0", "key-1", "key-2"]


def test_load_writes_in_chunks(dicts, name, tmp_path, capsys, monkeypatch):
    """The transaction is fed a bounded chunk at a time, never the whole file at once."""
    from ultradict_ng.cli import transfer

    path = _dump_file(tmp_path, capsys, {i: i for i in range(12_345)})
    sizes: list[int] = []
    real = SharedDict.update

    def update(self: Any, other: Any = (), **kwargs: Any) -> None:
        sizes.append(len(other))
        real(self, other, **kwargs)

    monkeypatch.setattr(SharedDict, "update", update)
    d = dicts(name=name)
    assert run(capsys, "load", name, str(path))[0] == 0
    assert sizes == [transfer.CHUNK_ENTRIES, transfer.CHUNK_ENTRIES, 12_345 - 2 * transfer.CHUNK_ENTRIES]
    monkeypatch.setattr(transfer, "CHUNK_BYTES", 1000)  # or fewer entries, by their size
    sizes.clear()
    assert run(capsys, "load", name, str(path), "--replace")[0] == 0
    assert 10 < len(sizes) and max(sizes) < 500 and sum(sizes) == 12_345
    assert len(d) == 12_345


def test_ctrl_c_during_a_load_changes_nothing(dicts, name, tmp_path, capsys):
    """SIGINT while the load waits for the rest of stdin: exit 130, the transaction is dropped."""
    import signal

    path = _dump_file(tmp_path, capsys, {f"k{i}": i for i in range(20_000)})
    data = path.read_bytes()
    d = dicts(name=name)
    d["old"] = 1
    proc = subprocess.Popen(
        [*CLI, "load", name, "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        # (a suite started in the background of a non-interactive shell runs with
        # SIGINT ignored, which the loader would inherit: a terminal's Ctrl-C is not)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(data[: len(data) // 2])
        proc.stdin.flush()
        deadline = clock.monotonic() + 30
        while not (d.lock.owner_pid == proc.pid and _reading_stdin(proc.pid)):  # in the transaction,
            assert clock.monotonic() < deadline and proc.poll() is None  # waiting for more input
            clock.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)  # (stdin still open: the end of the input cannot come before the signal)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert out == b"" and err == b"ultradict-ng load: interrupted; nothing was changed\n"
    assert d.copy() == {"old": 1}


def _reading_stdin(pid: int) -> bool:
    """Whether the process sleeps in read(0, ...) (x86-64 Linux; elsewhere: after a pause)."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            return f.read().startswith("0 0x0 ")
    except OSError:
        clock.sleep(1)
        return True


def test_a_dump_that_does_not_fit_names_its_file_and_leaves_none(tmp_path, capsys, monkeypatch):
    """A full disk (ENOSPC from the sync here) fails the dump naming FILE,
    and neither FILE nor its temporary file is left."""
    import errno

    name, path = unique_name(), str(tmp_path / "backup.jsonl")
    d = SharedDict({"a": 1}, name=name)
    try:

        def full(fd: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "fsync", full)
        status, _, err = run(capsys, "dump", name, path)
        monkeypatch.undo()
        assert status == 1 and path in err and "No space left on device" in err, err
        assert os.listdir(tmp_path) == []
    finally:
        d.unlink()
        d.close()


def test_load_into_a_shared_cache_is_refused_and_changes_nothing(tmp_path, capsys):
    """A SharedCache's entries are its records (expiry, slot, value): values
    loaded raw would be absent to its reads, past its bounds, and would
    replace its entries -- refused, in shared memory and in files alike."""
    from ultradict_ng.cache import SharedCache

    backup = str(tmp_path / "in.jsonl")
    with open(backup, "w") as f:
        f.write('["newkey", 5]\n["k1", "hello"]\n')
    name = unique_name()
    caches = [
        (name, SharedCache(name, maxsize=10)),
        (str(tmp_path / "cache"), SharedCache(path=str(tmp_path / "cache"))),
    ]
    try:
        for where, c in caches:
            c.update({f"k{i}": i for i in range(3)})
            status, _, err = run(capsys, "load", where, backup)
            assert status == 1 and "is a SharedCache" in err and "nothing was changed" in err, err
            assert dict(c.items()) == {f"k{i}": i for i in range(3)} and len(c) == 3
    finally:
        for _, c in caches:
            c.unlink()
            c.close()
