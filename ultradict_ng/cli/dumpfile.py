"""The two file formats of ``dump`` and ``load`` (module ``transfer``).

**msgpack** is the dict's own codec (``_codec``) on a stream: a header map
(``format``, ``version``, ``entries``, ``recurse``, ``name``, ``time``), then
one ``[key, value]`` array per entry in insertion order.  Every type a dict
holds round-trips exactly, because the bytes are what the dict itself stores.
**JSON lines** is one ``[key, value]`` array per line, for other tools; it
takes only what JSON holds exactly and refuses the rest (naming the key)
rather than writing a file that loads back different.

Reading builds plain data only, as the dict's decoder does: a msgpack
Timestamp and a blob reference (which points into some dict's shared
memory) are refused, never followed.  A file that is not a whole, valid dump
raises :class:`~ultradict_ng.errors.BadDumpFile` naming the line or entry.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from typing import IO, Any, Callable, Optional

import msgpack  # type: ignore[import-untyped, unused-ignore]

from .._codec.codec import MSGPACK, describe_error
from .._codec.decode import ROOT_HOOK, contains_timestamp
from .._codec.ext import Unpacker, type_name
from .._codec.placeholders import BlobRef, InlineArray
from ..errors import BadDumpFile, UnsupportedType
from ..speedups import contains_type
from .progress import Progress

__all__ = [
    "MARKER",
    "VERSION",
    "file_format",
    "check_json",
    "jsonl_line",
    "read_jsonl",
    "msgpack_entry",
    "MsgpackReader",
    "read_msgpack",
]

MARKER = "ultradict-ng dump"  #: the header's ``format``
VERSION = 1  #: the header's ``version``; a reader refuses a newer one
READ_SIZE = 1 << 20
_DEPTH = 4096  # deeper than any decoded value: contains_type treats deeper as found
_JSON_KEYS = (str, int, float, bool, type(None))


def file_format(path: str, given: Optional[str]) -> str:
    """``--format`` if given, else by FILE's extension (``-``: msgpack)."""
    if given:
        return given
    return "jsonl" if path.lower().endswith((".jsonl", ".ndjson")) else "msgpack"


# -- JSON lines --------------------------------------------------------------------------


def json_problem(value: Any) -> Optional[tuple[str, str]]:
    """``(where, why)`` if ``value`` would not come back from JSON as it is, else None."""
    tp = type(value)
    if tp is str or tp is int or tp is bool or value is None:
        return None
    if tp is float:
        return None if math.isfinite(value) else ("", f"the float {value!r} has no JSON form")
    if tp is list:
        for i, item in enumerate(value):
            found = json_problem(item)
            if found is not None:
                return f"[{i}]{found[0]}", found[1]
        return None
    if tp is dict:
        for k, item in value.items():
            if type(k) is not str:
                return "", f"a dict with the {type_name(type(k))} key {k!r} (JSON objects have str keys)"
            found = json_problem(item)
            if found is not None:
                return f"[{k!r}]{found[0]}", found[1]
        return None
    if tp is tuple:
        return "", "a tuple, which JSON would turn into a list"
    return "", f"a {type_name(tp)}, which JSON has no form for"


def check_json(key: Any, value: Any) -> None:
    """UnsupportedType naming the key unless the entry survives JSON exactly."""
    if type(key) not in _JSON_KEYS or (type(key) is float and not math.isfinite(key)):
        raise UnsupportedType(
            f"key {key!r}: a {type_name(type(key))} key has no exact JSON form; use --format msgpack"
        )
    found = json_problem(value)
    if found is not None:
        where = f" at {found[0]}" if found[0] else ""
        raise UnsupportedType(f"key {key!r}: the value{where} is {found[1]}; use --format msgpack")


def jsonl_line(key: Any, value: Any) -> bytes:
    check_json(key, value)
    # UTF-8 as it is, but U+2028/U+2029 escaped: str.splitlines() and some
    # editors break lines there (in JSON they can only be inside a string).
    line = json.dumps([key, value], ensure_ascii=False, allow_nan=False)
    if "\u2028" in line or "\u2029" in line:
        line = line.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return (line + "\n").encode("utf-8")


def _strict_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} does not fit a float")
    return value


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def read_jsonl(
    stream: IO[bytes], progress: Progress, size: Optional[int]
) -> Iterator[tuple[str, Any, Any, int]]:
    """``(where, key, value, bytes)`` per entry; BadDumpFile naming the line."""
    done = read = 0
    for lineno, raw in enumerate(stream, 1):
        read += len(raw)
        try:
            text = raw.decode("utf-8")
            if lineno == 1:
                text = text.lstrip("\ufeff")
            if not text.strip():
                continue
            entry = json.loads(text.rstrip("\r\n"), parse_float=_strict_float, parse_constant=_no_constant)
            if type(entry) is not list or len(entry) != 2:
                raise ValueError("not a [key, value] array")
            if type(entry[0]) not in _JSON_KEYS:
                raise ValueError(f"the key is a JSON {'array' if type(entry[0]) is list else 'object'}")
        except json.JSONDecodeError as exc:  # (its own "line 1" would be misleading)
            raise BadDumpFile(f"line {lineno}, column {exc.colno}: {exc.msg}") from None
        except RecursionError:  # (json's decoder recurses a level at a time)
            raise BadDumpFile(f"line {lineno}: nested too deep for a dict (500 levels at most)") from None
        except BadDumpFile:
            raise
        except ValueError as exc:
            raise BadDumpFile(f"line {lineno}: {exc}") from None
        done += 1
        progress.tick(done, read / size if size else None)
        yield f"line {lineno}", entry[0], entry[1], len(raw)


# -- msgpack ---------------------------------------------------------------------------


def msgpack_entry(key: Any, value: Any) -> bytes:
    # A 2-array header, then key and value encoded on their own: the value may
    # nest as deep as the codec allows (a list around it would be one level more).
    return b"\x92" + MSGPACK.dumps(key) + MSGPACK.dumps(value)


class MsgpackReader:
    """The objects of a msgpack stream, decoded as the dict's codec decodes
    (its ext hook; msgpack's Timestamp refused), a bounded read at a time."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.read1: Callable[[int], bytes] = getattr(stream, "read1", stream.read)
        self.unpacker = Unpacker(
            raw=False, strict_map_key=False, ext_hook=ROOT_HOOK, max_buffer_size=sys.maxsize
        )
        self.fed = 0
        self.eof = False

    def next(self, where: str) -> Any:
        """The next object; EOFError at a clean end; BadDumpFile naming ``where``."""
        while True:
            try:
                obj = self.unpacker.unpack()
            except msgpack.OutOfData:
                pending = self.fed - self.unpacker.tell()
                if self.eof:
                    if pending:
                        raise BadDumpFile(
                            f"{where}: the file is truncated ({pending} bytes of "
                            "an incomplete entry at its end)"
                        ) from None
                    raise EOFError from None
                # What has arrived (read1: a pipe need not fill a whole read first),
                # but at least as much again as is pending: each attempt decodes the
                # object from its start, so attempts stay few for a large one.
                target = self.fed + max(pending, 1)
                while self.fed < target and not self.eof:
                    chunk = self.read1(max(READ_SIZE, pending))
                    self.unpacker.feed(chunk)
                    self.fed += len(chunk)
                    self.eof = not chunk
                continue
            except Exception as exc:
                raise BadDumpFile(f"{where}: cannot decode ({describe_error(exc)})") from None
            if contains_timestamp(obj):
                raise BadDumpFile(f"{where}: a msgpack Timestamp, which this format never holds")
            return obj

    def header(self, label: str) -> dict[str, Any]:
        try:
            head = self.next("header")
        except EOFError:
            raise BadDumpFile(f"{label} is empty: not an ultradict-ng dump") from None
        except BadDumpFile as exc:
            raise BadDumpFile(f"{label} is not an ultradict-ng dump ({exc})") from None
        if type(head) is not dict or head.get("format") != MARKER:
            hint = "; a JSON lines file? use --format jsonl" if head == ord("[") else ""
            raise BadDumpFile(
                f"{label} is not an ultradict-ng dump: it does not start with the {MARKER!r} header{hint}"
            )
        version = head.get("version")
        if type(version) is not int or version != VERSION:
            raise BadDumpFile(
                f"{label} is an ultradict-ng dump of format version {version!r}; "
                f"this version reads version {VERSION} only"
            )
        if (
            type(head.get("entries")) is not int
            or head["entries"] < 0
            or type(head.get("recurse")) is not bool
        ):
            raise BadDumpFile(f"{label}: damaged header {head!r}")
        return head


def _arrays(value: Any) -> Any:
    """``value`` with its inline numpy arrays (tensors) as arrays: the decoder
    gives placeholders, which a dict must not store."""
    tp = type(value)
    if tp is InlineArray:
        return value.value()
    if tp is list:
        return [_arrays(v) for v in value]
    if tp is tuple:
        return tuple(_arrays(v) for v in value)
    if tp is dict:
        return {k: _arrays(v) for k, v in value.items()}
    return value


def read_msgpack(
    reader: MsgpackReader, total: int, progress: Progress
) -> Iterator[tuple[str, Any, Any, int]]:
    done = 0
    while True:
        where = f"entry {done + 1}"
        before = reader.unpacker.tell()
        try:
            entry = reader.next(where)
        except EOFError:
            break
        if type(entry) is not list or len(entry) != 2:
            raise BadDumpFile(f"{where}: not a [key, value] pair")
        if contains_type(entry, BlobRef, _DEPTH):
            raise BadDumpFile(f"{where}: a reference to a dict's blob, which a dump never holds")
        if contains_type(entry[1], InlineArray, _DEPTH):
            try:
                entry[1] = _arrays(entry[1])
            except Exception as exc:
                raise BadDumpFile(f"{where}: {describe_error(exc)}") from None
        if contains_type(entry, InlineArray, _DEPTH):
            raise BadDumpFile(f"{where}: an array inside a key or a set")
        done += 1
        if done > total:
            raise BadDumpFile(f"{where}: more entries than the header's {total:,}")
        progress.tick(done)
        yield where, entry[0], entry[1], reader.unpacker.tell() - before
    if done < total:
        raise BadDumpFile(f"the file is truncated: its header says {total:,} entries, it holds {done:,}")
