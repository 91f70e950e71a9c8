"""The command line on dicts kept in files: a PATH where a NAME goes.

A dict name never contains ``/``, so an argument that does is the directory
of a dict kept in files (write ``./jobs`` for one in the current directory).
``show``, ``stats``, ``watch``, ``dump``, ``load`` and ``rm`` open it as a
program would (recovering it if it needs it) and close it again; ``ls`` and
``doctor`` only read its files and change nothing; ``compact`` writes a
checkpoint now, so that the stream starts empty.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import struct
import zlib
from collections.abc import Iterator
from typing import Any, Optional

from .._disk import layout as D
from .._disk.files import FileBytes, absolute, dicts_file, open_rw
from .._disk.opening import read_meta
from .._disk.recovery import missing_checkpoint, newest_checkpoint, read_clean, short_of_clean
from .._disk.scanning import NORMAL_ENDS, looked_past, scan
from .._platform import segments
from .._shm import layout as L
from .._shm import table_layout as TL
from .._shm.peek import Peek
from .._shm.survey import report
from .._shm.table import Table
from ..cache import layout as C
from ..cache.side import header_problem
from ..errors import CorruptSegment, IncompatibleLayout, NotADict, NotFound, SharedDictError
from ..shareddict import SharedDict

__all__ = ["is_path", "open_dict", "peeking", "summary", "file_checks", "cmd_compact", "describes_a_dict"]

Check = tuple[str, str, str]


def is_path(target: str) -> bool:
    return os.sep in target


def open_dict(path: str, **options: Any) -> SharedDict:
    """The dict kept in ``path`` (NotFound if there is none; ``create=True`` to make one)."""
    options.setdefault("create", False)
    return SharedDict(path=path, **options)


@contextlib.contextmanager
def peeking(path: str) -> Iterator[Peek]:
    """A :class:`Peek` of the dict kept in ``path``, opened (and recovered) for the block."""
    d = open_dict(path)
    try:
        with Peek.open(d.name) as peek:
            yield peek
    finally:
        d.close()


def _meta(path: str) -> dict[str, Any]:
    meta_path = os.path.join(path, D.META_FILE)
    try:
        with _open_read(meta_path) as f:
            meta = json.loads(f.read())
    except FileNotFoundError:
        raise NotFound(f"no dict is kept in {path!r}") from None
    except NotADirectoryError:
        raise NotADict(f"{path!r} is not a directory: a dict kept in files is one") from None
    except ValueError as exc:
        raise CorruptSegment(f"{meta_path}: not a dict's description ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != D.META_FORMAT:
        raise CorruptSegment(f"{meta_path} does not describe an ultradict_ng dict")
    if meta.get("creating"):
        raise NotFound(f"no dict is kept in {path!r}: its creation did not finish (the next one replaces it)")
    return meta


def _open_read(name: str) -> Any:
    """The dict's file ``name`` opened to read, as an open of the dict opens it:
    non-blocking (a FIFO there must not hang a command that only reads), and
    ``CorruptSegment`` naming it if it is no regular file."""
    return open(open_rw(name, writable=False), "rb")


def describes_a_dict(path: str) -> None:
    """``NotFound`` or ``CorruptSegment`` unless ``path`` holds a dict's ``dict.meta`` (any version)."""
    _meta(path)


def holds_dict(path: str) -> bool:
    """Whether ``path`` is a directory with a dict's ``dict.meta`` (for ``ls``:
    a dict kept in files inside ``/dev/shm`` is not another program's file)."""
    try:
        describes_a_dict(path)
    except (OSError, SharedDictError):
        return False
    return True


def _users(path: str) -> Optional[list[int]]:
    """The live processes using the dict kept in ``path``, from its control
    segment; None if there is none (closed, or gone with a reboot)."""
    st = os.stat(path)
    control = D.control_name(st.st_dev, st.st_ino)
    rep = report(control, load_keys=False) if segments.exists(control) else None
    return None if rep is None else rep.live_users


def _files(path: str) -> dict[str, int]:
    """Each file of the dict and the disk space it takes (allocated blocks,
    not its length).  A file renamed or removed between the listing and its
    ``stat`` -- a writer's blob or checkpoint finished meanwhile -- is left
    out: the dict is in use, and its files change under the reader."""
    out = {}
    for f in sorted(os.listdir(path)):
        if D.is_own(f):
            with contextlib.suppress(FileNotFoundError):
                out[f] = os.stat(os.path.join(path, f)).st_blocks * 512
    return out


def summary(path: str) -> dict[str, Any]:
    """What ``ls PATH`` shows, from the files and (if present) the control segment; changes nothing."""
    path = absolute(path)
    meta = _meta(path)
    files = _files(path)
    st = os.stat(path)
    control = D.control_name(st.st_dev, st.st_ino)
    users = _users(path)
    dumps = sorted(f for f in files if D.own_id(f, D.DUMP_PREFIX) is not None)
    return {
        "path": path,
        "sync": meta.get("sync"),
        "sync_interval": meta.get("sync_interval") if meta.get("sync") == "interval" else None,
        "layout": meta.get("layout"),
        "disk_bytes": sum(files.values()),
        "dumps": len(dumps),
        "blobs": sum(1 for f in files if D.own_id(f, D.BLOB_PREFIX) is not None),
        "open": bool(users),  # (by a live process: a segment only dead ones used is not open)
        "users": users or [],
        "control_segment": control if users is not None else None,
        "closed_cleanly": _closed_cleanly(path, meta, dumps),
    }


def _closed_cleanly(path: str, meta: dict[str, Any], dumps: list[str]) -> bool:
    """Whether ``clean`` is a whole record of this dict at the checkpoint an
    open takes (``newest_checkpoint``: the one a clean close names, whatever
    newer name lies beside it) -- what an open trusts (the stream's end it
    checks too needs a scan: ``doctor PATH`` makes it) -- not merely a file."""
    try:
        clean = read_clean(path)
        if clean is None or clean[2] != meta.get("token"):
            return False
        return newest_checkpoint(path, dumps, clean[0]) == clean[0]
    except CorruptSegment:  # (no regular file; a checkpoint's name on another file)
        return False


#: Times ``doctor`` checks again when a writer made a checkpoint meanwhile.
_AGAIN = 5


def file_checks(path: str) -> list[Check]:
    """``doctor PATH``: the directory and the dict's files checked, read-only (no recovery).

    Checked again when a checkpoint appeared while it checked: it lists the
    directory, then reads the stream, which a writer's checkpoint restarts
    meanwhile -- records of a later generation than the checkpoint listed
    looked like a lost checkpoint (FAIL on a healthy dict)."""
    path = absolute(path)
    for _ in range(_AGAIN):
        before = _newest_dump(path)
        try:
            out = _checks_once(path)
        except OSError as exc:  # (unreadable by this user, gone meanwhile: this path fails, not the rest)
            return [("files", "fail", f"{exc.filename or path}: {exc.strerror or exc}")]
        if _newest_dump(path) == before:
            return out
    # Each time: what failed may be the race's, not the files' -- said as a warning.
    changing = " (a writer made a checkpoint while this checked: run it again, or once it is idle)"
    return [
        (what, "warn", text + changing) if kind == "fail" else (what, kind, text) for what, kind, text in out
    ]


def _newest_dump(path: str) -> int:
    try:
        return max((D.own_id(f, D.DUMP_PREFIX) or 0 for f in os.listdir(path)), default=0)
    except OSError:
        return -1


def _checks_once(path: str) -> list[Check]:
    out: list[Check] = []
    try:
        meta = _meta(path)
    except (NotFound, CorruptSegment) as exc:
        return [("dict.meta", "fail", str(exc))]
    version, layout = meta.get("version"), meta.get("layout")
    try:
        read_meta(path)  # (its fields, as every open checks them)
    except IncompatibleLayout:
        pass  # (another version's files: the "version" check says so)
    except CorruptSegment as exc:
        return [("dict.meta", "fail", f"{exc} (every open refuses it)")]
    out.append(("dict.meta", "ok", f"version {version!r}, layout {layout!r}, sync {meta.get('sync')}"))
    if not D.readable_version(version, layout):
        out.append(
            (
                "version",
                "fail",
                f"its files are of version {version!r} (layout {layout!r}); this ultradict_ng reads version "
                f"{D.DISK_VERSION} (layout {L.LAYOUT_VERSION}): no open takes them",
            )
        )
        return out
    free = shutil.disk_usage(path).free
    room = "ok" if free > (64 << 20) else "warn"
    out.append(("disk", room, f"{free / (1 << 20):,.0f} MiB free where the files are"))
    names = os.listdir(path)
    token: int = meta["token"] if type(meta.get("token")) is int else 0
    try:
        clean = read_clean(path)
    except CorruptSegment as exc:
        return out + [("clean", "fail", f"{exc} (every open refuses it)")]
    try:
        generation = newest_checkpoint(path, names, clean[0] if clean and clean[2] == token else None)
        problem = _dump_problem(path, generation, token) if generation else ""
    except CorruptSegment as exc:
        generation, problem = 0, str(exc)
    for f in names:
        if not D.is_own(f) or (
            D.own_id(f, D.DUMP_PREFIX) not in (None, generation) and not dicts_file(path, f)
        ):
            out.append(("files", "warn", f"{f}: not one of the dict's files (left as it is)"))
        elif (
            (D.own_id(f, D.DUMP_PREFIX) or 0) > generation
            and clean is not None
            and clean[::2] == (generation, token)
        ):
            out.append(
                (
                    "files",
                    "warn",
                    f"{f}: a checkpoint never published (its writer was killed); the next open removes it",
                )
            )
    out.append(
        (
            "checkpoint",
            "fail" if problem else "ok",
            problem or f"generation {generation}" + ("" if generation else " (empty: no dump yet)"),
        )
    )
    stream = os.path.join(path, D.STREAM_FILE)
    with contextlib.suppress(OSError):
        if os.path.getsize(stream) == 0:  # (mmap refuses an empty file: said as what it means)
            out.append(("stream", "fail", f"{stream} is empty (cut to nothing): the writes it held are lost"))
            return out
    try:
        with _open_read(stream) as sf, mmap.mmap(sf.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            found = looked_past(FileBytes(sf.fileno()), scan(mm, generation), generation)  # (as recovery)
            missing = missing_checkpoint(mm, found, generation, clean, token)
    except (OSError, ValueError) as exc:  # (CorruptSegment names the file)
        out.append(("stream", "fail", str(exc) if isinstance(exc, CorruptSegment) else f"{stream}: {exc}"))
        return out
    if missing:
        name = D.DUMP_PREFIX + L.base36(missing)
        out.append(
            ("checkpoint", "fail", f"{name} is missing: the dict's newest checkpoint, which its files name")
        )
    whole = found.stopped in NORMAL_ENDS
    tail = "" if whole else f"; its tail from byte {found.end} is not whole ({found.stopped})"
    out.append(
        ("stream", "ok" if whole else "warn", f"{found.units:,} whole writes after the checkpoint{tail}")
    )
    recorded = short_of_clean(clean, generation, token, found.end)
    if recorded:
        out.append(
            (
                "stream",
                "fail",
                f"its clean close recorded whole writes to byte {recorded}, but they end at {found.end}: "
                "the writes between are lost to damage (the next open keeps the rest, with a warning)",
            )
        )
    users = _users(path)
    if users:
        out.append(("state", "ok", f"open (used by pid {', '.join(map(str, users))})"))
    elif clean is not None and clean == (generation, found.end, token):
        out.append(("state", "ok", "closed cleanly: opens without recovery"))
    elif users is None:
        out.append(("state", "ok", "not closed cleanly: the next open recovers it"))
    else:
        state = "its shared memory left by processes that died: the next open checks it against the files"
        out.append(("state", "ok", state))
    locked = [
        f
        for f in (D.STREAM_FILE, D.DUMP_PREFIX + L.base36(generation), D.CACHE_FILE)
        if os.path.exists(os.path.join(path, f)) and not os.access(os.path.join(path, f), os.R_OK | os.W_OK)
    ]
    if locked:  # (every open maps them read-write)
        named = ", ".join(locked)
        out.append(("files", "fail", f"not readable and writable by this user: {named} (every open fails)"))
    blobs = _blob_problems(path, names, token)
    if blobs:
        more = f" (and {len(blobs) - 3} more)" if len(blobs) > 3 else ""
        out.append(("blobs", "fail", "; ".join(blobs[:3]) + more + ": reading those values fails"))
    cache = _cache_problem(path, token)
    if cache is not None:
        out.append(("cache", "fail" if cache else "ok", cache or "its settings and slots are whole"))
    leftovers = [f for f in os.listdir(path) if D.aside_of(f) is not None]
    if leftovers and not users:  # (in use: a writer's value or checkpoint being written)
        named = ", ".join(leftovers[:3])
        out.append(
            (
                "files",
                "warn",
                f"{len(leftovers)} unfinished file(s) ({named}): the next recovery removes them",
            )
        )
    return out


def _blob_problems(path: str, names: list[str], token: int) -> list[str]:
    """What is wrong with the headers of the value files ``blob.<id>``: what
    every read of one checks (magic, the dict's token, its id, its length
    within the file).  The payload has no checksum: a read maps it as it is."""
    out = []
    header = struct.Struct(L.BLOB_FORMAT)
    ids = sorted(i for i in (D.own_id(f, D.BLOB_PREFIX) for f in names) if i is not None)
    for blob_id in ids:
        f = D.BLOB_PREFIX + L.base36(blob_id)
        try:
            with _open_read(os.path.join(path, f)) as bf:
                size = os.fstat(bf.fileno()).st_size
                raw = bf.read(header.size)
        except FileNotFoundError:
            continue  # (dropped by a writer meanwhile)
        except CorruptSegment as exc:
            out.append(str(exc))
            continue
        except OSError as exc:
            out.append(f"{f}: {exc.strerror or exc}")
            continue
        if len(raw) < header.size:
            out.append(f"{f} is cut short ({size} bytes)")
            continue
        magic, owner, bid, length = header.unpack(raw)[:4]
        if magic != L.BLOB_MAGIC or bid != blob_id:
            out.append(f"{f} is not a value file of this dict (damaged)")
        elif owner != token:
            out.append(f"{f} is an earlier dict's, not this one's")
        elif size < L.BLOB_HEADER + length:
            out.append(f"{f} is cut short ({size} bytes of {L.BLOB_HEADER + length})")
    return out


def _cache_problem(path: str, token: int) -> Optional[str]:
    """What is wrong with the side file ``cache`` of a SharedCache kept in
    ``path`` ("": nothing; None: no such file, not a cache): its header --
    what every open of the cache checks, and refuses while it holds entries."""
    name = os.path.join(path, D.CACHE_FILE)
    try:
        with _open_read(name) as f:
            size = os.fstat(f.fileno()).st_size
            header = f.read(C.HEADER_WORDS * 8)
    except FileNotFoundError:
        return None
    except CorruptSegment as exc:
        return str(exc)
    except OSError as exc:
        return f"{name}: {exc.strerror or exc}"
    if len(header) < C.HEADER_WORDS * 8 or size % 8:
        return f"{name} is cut short ({size} bytes): the cache's settings and slots are lost"
    magic, owner = struct.unpack_from("QQQ", header)[::2]  # (native, as the words are)
    if magic != C.SIDE_MAGIC:
        what = "zeroed" if not any(header) else "not a cache's side"
        return f"{name} is {what}: the cache's settings and slots are lost (every open refuses it)"
    if owner != token:
        return f"{name} is an earlier cache's, not this one's (every open refuses it while it holds entries)"
    problem = header_problem(header, size)
    return f"{name} is damaged: {problem}" if problem else ""


def _dump_problem(path: str, generation: int, token: int) -> str:
    """What is wrong with the checkpoint ``dump.<generation>`` of ``path`` ("": nothing):
    its header, and every entry's bounds and crc and its index (a table) or its payload's crc."""
    name = os.path.join(path, D.DUMP_PREFIX + L.base36(generation))
    try:
        with _open_read(name) as f:  # (read whole, not mapped: a failed check's views hold no mapping)
            mm = f.read()
            if mm[:8] == TL.TABLE_MAGIC:
                with memoryview(mm) as whole:
                    table = Table(whole, token, name)
                    try:
                        if table.generation != generation:
                            return f"{name}: of generation {table.generation}, not {generation}"
                        table.check()
                        table.check_index()
                    finally:
                        table.close()
                return ""
            magic, gen, length, crc, _ = struct.unpack_from(L.DUMP_FORMAT, mm, 0)
            if magic != L.DUMP_MAGIC or gen != generation or length > len(mm) - L.DUMP_HEADER:
                return f"{name}: an invalid header"
            return (
                ""
                if zlib.crc32(mm[L.DUMP_HEADER : L.DUMP_HEADER + length]) == crc
                else f"{name}: fails its checksum"
            )
    except CorruptSegment as exc:
        return str(exc)
    except (OSError, ValueError, struct.error) as exc:
        return f"{name}: {exc}"


def cmd_compact(path: str) -> dict[str, Any]:
    """A checkpoint now: the dict dumped whole, the stream restarted (what a program's
    writes do when the stream fills); the disk space before and after."""
    d = open_dict(path)
    try:
        before = sum(_files(absolute(path)).values())
    except FileNotFoundError:  # (removed by another process since the open)
        d.close()
        raise NotFound(f"no dict in {path!r}: it was removed as this opened it") from None
    try:
        d._store.force_dump()
        generation = d.stats()["generation"]
    except ValueError as exc:  # (a damaged checkpoint's entries, found as it is rewritten)
        if isinstance(exc, CorruptSegment):
            raise
        dump = os.path.join(absolute(path), D.DUMP_PREFIX + L.base36(d.stats()["generation"]))
        raise CorruptSegment(f"{dump}: {exc}; no checkpoint was written (`doctor` tells more)") from exc
    finally:
        d.close()
    after = sum(_files(absolute(path)).values())
    where = absolute(path)
    return {"path": where, "generation": generation, "bytes_before": before, "bytes_after": after}
