"""A cache's side segment ``N@c``: its settings, counters, recency and sizes.

The protocol is in :mod:`ultradict_ng.cache.layout`.  This module creates,
attaches, checks and replaces the segment; :class:`Side` gives the words
and arrays as memoryviews.  Why a segment of its own and not keys of the
dict: readers write recency on every hit, without the lock, and a store of
8 bytes into shared memory is the only write cheap enough for a read path
(writing the dict would take the lock and publish).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from .._platform import directories, segments
from .._platform.segments import Segment
from ..errors import CorruptSegment, NotFound, ParameterMismatch
from . import layout as C

__all__ = ["Side", "open_side", "Settings", "header_problem"]

Settings = dict[str, Any]


class Side:
    """The mapped side segment: ``words`` (u64 header), ``floats`` (the same
    header as f64, for the ttl word), ``recency``, ``sizes`` and ``free``."""

    __slots__ = ("segment", "words", "floats", "recency", "sizes", "free", "nslots")

    def __init__(self, segment: Segment) -> None:
        assert segment.buf is not None
        self.segment = segment
        mv = memoryview(segment.buf)
        self.words = mv.cast("Q")
        self.floats = mv.cast("d")
        n = self.nslots = self.words[C.W_NSLOTS]
        h = C.HEADER_WORDS * 8
        self.recency = mv[h : h + 8 * n].cast("d")
        self.sizes = mv[h + 8 * n : h + 16 * n].cast("Q")
        self.free = mv[h + 16 * n : h + 24 * n].cast("Q")
        mv.release()

    def settings(self) -> Settings:
        w = self.words
        cull = w[C.W_CULL]
        return {
            "maxsize": w[C.W_MAXSIZE] or None,
            "maxbytes": w[C.W_MAXBYTES] or None,
            "ttl": self.floats[C.W_TTL] or None,
            "serializer": {v: k for k, v in C.SERIALIZERS.items()}.get(w[C.W_SERIALIZER], "?"),
            "cull_frequency": None if cull == 0 else cull - 1,
        }

    def close(self) -> None:
        for view in (self.words, self.floats, self.recency, self.sizes, self.free):
            view.release()
        self.segment.close()


def _write_new(name: str, token: int, settings: Settings) -> Side:
    """Create ``name`` exclusively (FileExistsError if it exists), settings
    first, MAGIC last; in files, written aside, synced and renamed
    (``_disk/layout.py``, "Cache side file").  Called under the dict's lock."""
    maxsize = settings["maxsize"] or 0
    maxbytes = settings["maxbytes"] or 0
    nslots = C.nslots_for(maxsize, maxbytes)
    segments.discard_aside(name)  # (a creator killed before its rename: under the lock, nobody else's)
    seg = Segment.create(name, C.side_size(nslots))
    try:
        assert seg.buf is not None
        with memoryview(seg.buf) as mv, mv.cast("Q") as words, mv.cast("d") as floats:
            words[C.W_VERSION] = C.SIDE_VERSION
            words[C.W_TOKEN] = token
            words[C.W_NSLOTS] = nslots
            words[C.W_MAXSIZE] = maxsize
            words[C.W_MAXBYTES] = maxbytes
            floats[C.W_TTL] = float(settings["ttl"] or 0.0)
            words[C.W_SERIALIZER] = C.SERIALIZERS[settings["serializer"]]
            cull = settings["cull_frequency"]
            words[C.W_CULL] = 0 if cull is None else cull + 1
            words[C.W_MAGIC] = C.SIDE_MAGIC
        segments.finish(seg)
    except BaseException:
        seg.close()
        segments.unlink(name)
        raise
    return Side(seg)


def _check_header(seg: Segment) -> str:
    """What is wrong with the settings words of a side segment, or ''."""
    assert seg.buf is not None
    return header_problem(bytes(seg.buf[: C.HEADER_WORDS * 8]), seg.size)


def header_problem(header: bytes, size: int) -> str:
    """What is wrong with the settings words ``header`` (the first
    ``HEADER_WORDS`` words) of a side segment of ``size`` bytes, or '' --
    also for ``doctor``, which reads a cache's file without opening it."""
    words, floats = memoryview(header).cast("Q"), memoryview(header).cast("d")
    try:
        nslots, ttl = words[C.W_NSLOTS], floats[C.W_TTL]
        if words[C.W_VERSION] != C.SIDE_VERSION:
            return f"version {words[C.W_VERSION]}"
        if nslots != C.nslots_for(words[C.W_MAXSIZE], words[C.W_MAXBYTES]) or size < C.side_size(nslots):
            return f"{nslots} slots for maxsize {words[C.W_MAXSIZE]}, maxbytes {words[C.W_MAXBYTES]}"
        if words[C.W_SERIALIZER] not in C.SERIALIZERS.values():
            return f"serializer {words[C.W_SERIALIZER]}"
        if not (ttl == 0.0 or ttl > 0.0):
            return f"ttl {ttl}"
        return ""
    finally:
        words.release()
        floats.release()


def _named(name: str) -> str:
    """How messages name the side segment ``name``: its file if the cache is kept in files."""
    path = directories.file_of(name)
    return f"the cache's file {path}" if path is not None else f"segment {name!r}"


def _attach(name: str, token: int) -> Optional[Side]:
    """The side segment if it is whole and belongs to the dict of ``token``;
    None if it is stale or its creator never finished; FileNotFoundError if absent."""
    deadline = time.monotonic() + C.INIT_TIMEOUT
    while True:
        seg = Segment.attach(name)
        if seg.buf is not None and (seg.size < C.HEADER_WORDS * 8 or seg.size % 8):
            seg.close()  # (its creator sizes it in one step: never seen part-sized)
            raise CorruptSegment(f"{_named(name)} is not a cache side segment ({seg.size} bytes)")
        if seg.buf is not None:
            words = memoryview(seg.buf).cast("Q")
            magic, owner = words[C.W_MAGIC], words[C.W_TOKEN]
            words.release()
            if magic == C.SIDE_MAGIC:
                if owner != token:
                    seg.close()
                    return None  # an earlier dict's, left by a crash
                problem = _check_header(seg)
                if problem:
                    seg.close()
                    raise CorruptSegment(
                        f"{_named(name)} is not a cache side segment of this version, or is damaged: "
                        f"{problem}"
                    )
                return Side(seg)
            if magic != 0:
                seg.close()
                raise CorruptSegment(f"{_named(name)} is not a cache side segment")
        seg.close()
        if time.monotonic() > deadline:
            return None  # its creator died before MAGIC
        time.sleep(0.001)


def open_side(
    dict_name: str,
    token: int,
    lock: Any,
    wanted: Settings,
    explicit: Settings,
    dict_len: Callable[[], int],
    removed: Callable[[], bool] = lambda: False,
) -> Side:
    """Attach the side segment of the dict ``dict_name`` (creation ``token``),
    creating it with ``wanted`` if there is none (or only a stale one, replaced
    under the dict's ``lock``).  Settings the caller passed (``explicit``) must
    match the stored ones, else :class:`ParameterMismatch`; a dict that holds
    keys but no side segment is not a cache."""
    name = C.cache_name(dict_name)
    for _ in range(50):
        try:
            side = _attach(name, token)
        except FileNotFoundError:
            side = None
        if side is None:
            # Decided under the lock, which every creator of a side segment
            # holds: looked up again there, the segment is whole or absent
            # (another opener may have made it, and written keys, meanwhile).
            with lock:
                try:
                    side = _attach(name, token)
                    absent = False
                except FileNotFoundError:
                    absent = True
                if side is None:
                    if removed():  # (the dict removed as this opened it: no side made for it)
                        said = f"shared dict {directories.shown(dict_name)!r} was removed as this opened it"
                        raise NotFound(said)
                    if absent and dict_len() > 0:
                        shown = directories.shown(dict_name)
                        raise ParameterMismatch(f"shared dict {shown!r} holds keys but is not a SharedCache")
                    if dict_len() > 0:  # its entries name slots of a segment that is gone
                        why = (
                            "damaged (zeroed), or an earlier cache's"
                            if directories.file_of(name)
                            else ("unfinished or an earlier dict's")
                        )
                        raise CorruptSegment(
                            f"{_named(name)} is {why}, but the cache {directories.shown(dict_name)!r} holds "
                            "entries: its settings and slots are lost"
                        )
                    if not absent:
                        segments.unlink(name)  # stale (an earlier dict's) or never finished
                    try:
                        side = _write_new(name, token, wanted)
                    except FileExistsError:
                        continue
        stored = side.settings()
        for key, value in explicit.items():
            if stored[key] != value:
                side.close()
                where = directories.directory_of(dict_name)  # (a cache kept in files: its directory)
                raise ParameterMismatch(
                    f"cache {where or dict_name!r} was created with {key}={stored[key]!r}, not {value!r}"
                )
        return side
    raise CorruptSegment(f"could not open the side segment of cache {dict_name!r}")
