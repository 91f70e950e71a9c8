"""``dump`` and ``load``: a dict to a file and back, for backups and for filling a dict.

Two formats.  **msgpack** is the dict's own codec (``_codec``) on a stream: a
header map (``format``, ``version``, ``entries``, ``recurse``, ``name``,
``time``), then one ``[key, value]`` array per entry in insertion order.  Every
type a dict holds round-trips exactly, because the bytes are what the dict
itself stores.  **JSON lines** is one ``[key, value]`` array per line, for
other tools; it takes only what JSON holds exactly and refuses the rest
(naming the key) rather than writing a file that loads back different.

Why the rules below:

* ``dump`` snapshots with ``copy()`` (one atomic read) and writes a temporary
  file in FILE's directory, renamed over FILE only once complete: a failed or
  interrupted dump never leaves a half backup that looks like a whole one.
* ``load`` writes everything in one ``transaction()``: a damaged file changes
  nothing, so a failed restore never leaves a dict half old, half new.  It
  feeds the transaction a chunk at a time, so the decoded file is never held
  whole beside the dict.  The lock is held meanwhile: other writers wait,
  readers do not.
* Neither ever opens a pickle (or custom-serializer) dict: attaching decodes
  the contents, and unpickling runs code stored in shared memory.  A dump
  file's decoder builds plain data only, as the dict's does; a blob
  reference (which points into some dict's shared memory) is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
import time
from argparse import Namespace
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, Callable, Optional

from .._codec.codec import MSGPACK
from .._codec.ext import type_name
from .._disk import layout as D
from .._disk.files import absolute
from .._platform import segments
from .._platform.names import validate_name
from .._shm.peek import Peek
from ..cache import layout as C
from ..errors import AlreadyExists, BadDumpFile, NotFound, ParameterMismatch, UnsupportedType
from ..shareddict import SharedDict
from . import paths, render
from .dumpfile import (
    MARKER,
    VERSION,
    MsgpackReader,
    check_json,
    file_format,
    jsonl_line,
    msgpack_entry,
    read_jsonl,
    read_msgpack,
)
from .progress import Progress

__all__ = ["cmd_dump", "cmd_load", "MARKER", "VERSION"]

CHUNK_ENTRIES = 5000  #: entries per ``update()`` of a load ...
CHUNK_BYTES = 16 << 20  #: ... or fewer, once their encoding passes this


# -- opening dicts and files ----------------------------------------------------------------


def _check_serializer(name: str) -> bool:
    """The dict's ``recurse``, after refusing a dict the command line must not
    attach to; NotFound if it does not exist."""
    with paths.peeking(name) if paths.is_path(name) else Peek.open(validate_name(name)) as peek:
        if peek.serializer != "msgpack":
            why = (
                "attaching would unpickle its contents, i.e. run code stored in shared memory, "
                "which the command line never does"
                if peek.serializer == "pickle"
                else "only a process that passes that serializer can decode it"
            )
            raise ValueError(f"shared dict {name!r} uses the {peek.serializer} serializer: {why}")
        return bool(peek.header.recurse)


def _open_for_load(
    name: str, recurse: Optional[bool], default_recurse: bool, sync: Optional[str] = None
) -> tuple[SharedDict, bool]:
    """``(dict, created)``: attach to ``name``, or create it to outlive this
    command (a PATH with the ``sync`` policy given, which an existing one must have)."""
    if sync is not None and not paths.is_path(name):
        raise ParameterMismatch(f"--sync is for a dict kept in files (a PATH), not the name {name!r}")
    for _ in range(5):  # exists / removed / made again by others meanwhile: try again
        try:
            stored = _check_serializer(name)
        except NotFound:
            try:
                made = recurse if recurse is not None else default_recurse
                if paths.is_path(name):
                    return paths.open_dict(
                        name, create=True, recurse=made, serializer="msgpack", sync=sync
                    ), True
                return SharedDict(
                    name, create=True, recurse=made, serializer="msgpack", auto_unlink=False, backend="shm"
                ), True
            except AlreadyExists:
                continue
        if _is_cache(name):
            raise ValueError(
                f"{name!r} is a SharedCache: its entries are the cache's records (expiry, slot, value), "
                "which keep its bounds (load into a dict, or set through the cache); nothing was changed"
            )
        if recurse is not None and recurse != stored:
            raise ParameterMismatch(
                f"shared dict {name!r} exists and is {'' if stored else 'not '}a "
                f"recurse dict: --{'' if recurse else 'no-'}recurse disagrees (omit it)"
            )
        try:
            return _attach(name, sync), False
        except NotFound:
            continue
    raise NotFound(f"shared dict {name!r} kept appearing and disappearing")


def _missing_parents(path: str) -> list[str]:
    """The directories above ``path`` that do not exist yet, deepest first."""
    out = []
    parent = os.path.dirname(absolute(path))
    while parent and not os.path.exists(parent) and parent != os.path.dirname(parent):
        out.append(parent)
        parent = os.path.dirname(parent)
    return out


def _is_cache(name: str) -> bool:
    """Whether the dict ``name`` (or PATH) is a SharedCache's: it has the side segment (file)."""
    if paths.is_path(name):
        return os.path.exists(os.path.join(name, D.CACHE_FILE))
    return segments.exists(C.cache_name(name))


def _attach(name: str, sync: Optional[str] = None) -> SharedDict:
    if paths.is_path(name):
        return paths.open_dict(name, serializer="msgpack", sync=sync)
    return SharedDict(name, create=False, serializer="msgpack", backend="shm")


@contextmanager
def _output(path: str) -> Iterator[IO[bytes]]:
    """FILE written whole or not at all: a temporary file beside it (same
    filesystem: the rename is atomic), synced, then renamed over it with the
    mode FILE had (new: as the umask says)."""
    if path == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    target = os.path.realpath(path)
    try:
        if os.path.isdir(target):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        fd, tmp = tempfile.mkstemp(
            dir=os.path.dirname(target), prefix=f".{os.path.basename(target)}.", suffix=".tmp"
        )
    except OSError as exc:  # named after FILE, not the temporary file
        raise type(exc)(exc.errno, exc.strerror, path) from None
    try:
        try:
            with os.fdopen(fd, "wb", buffering=1 << 20) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:  # (a full disk: named after FILE too)
            if exc.filename is None and exc.errno is not None and type(exc).__module__ == "builtins":
                raise type(exc)(exc.errno, exc.strerror, path) from None
            raise
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def _guarded(
    command: str,
    run: Callable[[list[Progress]], dict[str, Any]],
    args: Namespace,
    text: Callable[[dict[str, Any]], str],
) -> int:
    """Run a command: its own refusals (ValueError) as one line on stderr, exit 1
    (main reports the package's errors alike); Ctrl-C, exit 130; else the summary
    on stdout -- on stderr when stdout carries the dump itself."""
    progress: list[Progress] = []  # (the command's bar, erased whatever happens)
    t0 = time.monotonic()
    try:
        result = run(progress)
    except (ValueError, KeyboardInterrupt) as exc:
        for bar in progress:
            bar.close()  # (before the message: same terminal line)
        problem = str(exc) if isinstance(exc, ValueError) else "interrupted"
        if command == "load" and not problem.endswith("nothing was changed"):
            problem += "; nothing was changed"
        elif isinstance(exc, KeyboardInterrupt):
            problem += f"; {args.file} not written"
        print(f"ultradict-ng {command}: {problem}", file=sys.stderr)
        return 1 if isinstance(exc, ValueError) else 130
    finally:
        for bar in progress:
            bar.close()
    result = {
        "command": command,
        "name": args.name,
        "file": args.file,
        **result,
        "seconds": round(time.monotonic() - t0, 3),
    }
    out = sys.stderr if command == "dump" and args.file == "-" else sys.stdout
    if out is sys.stderr and args.quiet:
        return 0
    print(render.dumps(result) if args.json else text(result), file=out)
    return 0


# -- the commands ------------------------------------------------------------------------


def cmd_dump(args: Namespace) -> int:
    fmt = file_format(args.file, args.format)

    def run(bars: list[Progress]) -> dict[str, Any]:
        if args.file == "-" and fmt == "msgpack" and sys.stdout.isatty():
            raise ValueError("refusing to write msgpack to a terminal: redirect stdout or give a FILE")
        _check_serializer(args.name)
        d = _attach(args.name)
        try:
            snapshot, recurse = d.copy(), d.recurse  # one atomic read
        finally:
            d.close()
        if fmt == "jsonl" and args.file == "-":  # no temporary file: check before writing a byte
            for key, value in snapshot.items():
                check_json(key, value)
        bars.append(Progress(f"dumping {args.name}", len(snapshot), args.quiet))
        bars[0].tick(0)
        size = 0
        with _output(args.file) as out:
            if fmt == "msgpack":
                size += out.write(
                    MSGPACK.dumps(
                        {
                            "format": MARKER,
                            "version": VERSION,
                            "entries": len(snapshot),
                            "recurse": recurse,
                            "name": os.fsencode(args.name).decode("utf-8", "backslashreplace"),
                            "time": time.time(),
                        }
                    )
                )
            encode = msgpack_entry if fmt == "msgpack" else jsonl_line
            for done, (key, value) in enumerate(snapshot.items(), 1):
                size += out.write(encode(key, value))
                bars[0].tick(done)
        return {"format": fmt, "entries": len(snapshot), "bytes": size, "recurse": recurse}

    return _guarded(
        "dump",
        run,
        args,
        lambda r: (
            f"dumped {r['entries']:,} entries of {args.name!r} "
            f"to {'stdout' if args.file == '-' else args.file} "
            f"({render.size(r['bytes'])}, {fmt}) in {r['seconds']:.2f} s"
        ),
    )


def cmd_load(args: Namespace) -> int:
    fmt = file_format(args.file, args.format)
    stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # (OSError: main reports it)

    def run(bars: list[Progress]) -> dict[str, Any]:
        header: dict[str, Any] = {}
        if fmt == "msgpack":
            reader = MsgpackReader(stream)
            header = reader.header("stdin" if args.file == "-" else args.file)
        bars.append(Progress(f"loading {args.name}", header.get("entries"), args.quiet))
        if fmt == "msgpack":
            entries = read_msgpack(reader, header["entries"], bars[0])
        else:
            st = os.fstat(stream.fileno())
            entries = read_jsonl(stream, bars[0], st.st_size if stat.S_ISREG(st.st_mode) else None)
        before = os.stat(args.name) if paths.is_path(args.name) and os.path.isdir(args.name) else None
        real = os.path.realpath(args.name)  # (what a removal removes: a symbolic link's directory)
        made = _missing_parents(args.name) if paths.is_path(args.name) else []  # (the open makes them)
        d, created = _open_for_load(args.name, args.recurse, header.get("recurse", False), args.sync)
        try:
            bars[0].tick(0)
            with d.transaction():  # all or nothing
                if args.replace:
                    d.clear()
                done = _fill(d, entries)
        except BaseException:
            if created and len(d) == 0 and [u.pid for u in d.users()] == [os.getpid()]:
                d.unlink()  # made for this load, which failed: leave no empty dict behind
                if before is not None and not os.path.exists(real):  # (a directory the user made stays)
                    os.mkdir(real, stat.S_IMODE(before.st_mode))
                    os.chmod(real, stat.S_IMODE(before.st_mode))  # (as it was, whatever the umask)
                    if os.geteuid() == 0:
                        os.chown(real, before.st_uid, before.st_gid)
                for parent in made:  # (deepest first: made for this load, still empty)
                    with contextlib.suppress(OSError):
                        os.rmdir(parent)
            raise
        finally:
            keys = len(d)
            d.close()
        return {"format": fmt, "entries": done, "keys": keys, "created": created, "replaced": args.replace}

    try:
        return _guarded(
            "load",
            run,
            args,
            lambda r: (
                f"loaded {r['entries']:,} entries into {args.name!r} in {r['seconds']:.2f} s"
                + (" (created it)" if r["created"] else " (replaced its contents)" if r["replaced"] else "")
            ),
        )
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _fill(d: SharedDict, entries: Iterator[tuple[str, Any, Any, int]]) -> int:
    """Write ``entries`` into ``d`` (inside its transaction) a chunk at a time,
    so that the decoded file is never held whole beside the dict; how many."""
    chunk: list[tuple[Any, Any]] = []
    first = where = ""
    size = done = 0
    for where, key, value, nbytes in entries:
        try:
            hash(key)
        except TypeError:
            raise BadDumpFile(f"{where}: its key, a {type_name(type(key))}, is not hashable") from None
        first = first or where
        chunk.append((key, value))
        size += nbytes
        done += 1
        if len(chunk) >= CHUNK_ENTRIES or size >= CHUNK_BYTES:
            _write(d, chunk, first, where)
            chunk, size, first = [], 0, ""
    if chunk:
        _write(d, chunk, first, where)
    return done


def _write(d: SharedDict, chunk: list[tuple[Any, Any]], first: str, last: str) -> None:
    try:
        d.update(chunk)
        return
    except UnsupportedType as exc:  # (main reports it)
        refused = exc
    # One by one (inside the transaction still): an update's record nests its
    # values two levels deeper than a set's, so a value as deep as the dict
    # takes -- one its own dump wrote -- fits a set and not an update.
    try:
        for key, value in chunk:
            d[key] = value
    except UnsupportedType:
        raise UnsupportedType(f"{first} to {last.split(' ')[-1]}: {refused}; nothing was changed") from None
