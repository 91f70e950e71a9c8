"""Recovery: the control segment of a dict kept in files rebuilt from its files.

Follows ``_disk/layout.py``, "Opening and recovery", step 4, under the
directory lock: the newest checkpoint, the stream's whole units of its
generation, a new control segment, and a new checkpoint unless the last
close left the files exactly so.  Killed at any point, it leaves the files
as they were (or with a complete newer checkpoint): the next opener recovers
again.
"""

from __future__ import annotations

import logging
import os
import sys
import zlib
from typing import Any, Optional

from .._codec.codec import CUSTOM_ID, MsgpackCodec, codec_by_id, codec_for
from .._engine import Options
from .._platform import faults, segments
from .._shm import layout as L
from .._shm import users
from .._shm.control import Header, read_word
from .._shm.dumps import MERGE_FRACTION, Planned
from .._shm.mapping import Mapping
from .._shm.options import check_options
from .._shm.store import Store
from .._shm.streamsize import reserve_again
from .._shm.table import StreamMerge
from .._shm.tablecache import TableCache, partial_from
from ..cache import layout as C
from ..errors import CorruptSegment, OutOfSpace, ParameterMismatch
from . import files
from . import layout as D
from .scanning import NORMAL_ENDS, Scanned, looked_past_file, scan, whole_record
from .syncing import raise_synced

__all__ = [
    "recover",
    "read_clean",
    "read_clean_record",
    "missing_checkpoint",
    "clean_bytes",
    "stale_control",
    "short_of_clean",
    "newest_checkpoint",
]

log = logging.getLogger("ultradict_ng")


def missing_checkpoint(
    buf: Any, scanned: Scanned, generation: int, closed: Optional[tuple[int, int, int]], token: int
) -> int:
    """The generation of a checkpoint the files say was written but the
    directory lacks (0: none), where ``generation`` is its newest dump's (0:
    none), ``buf`` the stream and ``scanned`` its scan for ``generation``:
    the ``clean`` file names a later one, or the stream begins with a whole
    record of a later generation (looked for only where the scan found no
    record of ``generation`` there).

    Why refused: a writer's records of generation g follow its checkpoint
    ``dump.<g>``, synced and renamed before any of them is written (step
    4d), so either sign means the file was removed (a cleaner of old files
    takes a checkpoint that is never modified for stale).  Recovering from
    the dump before it -- or from nothing -- would silently drop what the
    missing one held, and the next checkpoint would take its generation
    again, under which the stream's old records would come back."""
    if closed is not None and closed[2] == token and closed[0] > generation:
        return closed[0]
    tag = whole_record(buf, 0) if not scanned.end else -1  # (a new generation's records begin at 0)
    ahead = (tag - generation) & L.GEN_MASK if tag >= 0 else 0
    return generation + ahead if 0 < ahead < 1 << 31 else 0


def clean_bytes(generation: int, end: int, token: int, dead: int) -> bytes:
    body = D.CLEAN_FORMAT.pack(D.CLEAN_MAGIC, generation, end, token, dead, 0)[:-4]
    return body + zlib.crc32(body).to_bytes(4, "little")


def read_clean(directory: str) -> Optional[tuple[int, int, int]]:
    """``(generation, end, token)`` of the ``clean`` file, if whole."""
    record = read_clean_record(directory)
    return None if record is None else record[:3]


def read_clean_record(directory: str) -> Optional[tuple[int, int, int, int]]:
    """``(generation, end, token, dead bytes)`` of the ``clean`` file, if whole."""
    try:
        raw = files.read_whole(f"{directory}/{D.CLEAN_FILE}", D.CLEAN_FORMAT.size + 1)
    except FileNotFoundError:
        return None
    if len(raw) != D.CLEAN_FORMAT.size:
        return None
    magic, generation, end, token, dead, crc = D.CLEAN_FORMAT.unpack(raw)
    if magic != D.CLEAN_MAGIC or zlib.crc32(raw[:-4]) != crc:
        return None
    return generation, end, token, dead


def dicts_own(directory: str, file: str, described: bool) -> bool:
    """``files.dicts_file``; and where no ``dict.meta`` vouches for the
    directory (``described`` False: it is missing), the files a name alone
    marks checked by their first bytes as well: ``clean`` its magic,
    ``cache`` its magic, ``stream`` a whole record -- or those two empty or
    zeros (a creation killed before it sized or wrote them: nothing held).
    Without it, the open's refusal of a directory that lost its
    ``dict.meta`` named another program's ``stream`` as the dict's records,
    and ``rm PATH`` removed it (and ``clean``, and then the directory)."""
    if not files.dicts_file(directory, file):
        return False
    if described or file not in (D.CLEAN_FILE, D.CACHE_FILE, D.STREAM_FILE):
        return True
    path = os.path.join(directory, file)
    head = files.read_head(path, L.RECORD_HEADER)
    if head is None:
        return False
    if file == D.CLEAN_FILE:
        return head.startswith(D.CLEAN_MAGIC)
    if not head.strip(b"\0"):  # (empty or zeros: nothing held)
        return True
    if file == D.CACHE_FILE:
        return head.startswith(C.SIDE_MAGIC.to_bytes(8, sys.byteorder))
    try:
        with open(path, "rb") as f:  # (read as far as the record says, not whole: pread)
            return whole_record(files.FileBytes(f.fileno()), 0) >= 0
    except OSError:
        return False


def short_of_clean(closed: Optional[tuple[int, int, int]], generation: int, token: int, end: int) -> int:
    """The stream's end the ``clean`` file recorded, where the whole records
    found end before it in the same generation (0: they do not).  A clean
    close syncs the stream before it writes ``clean``, and a power loss
    cannot take synced bytes: those records were lost to damage (a zeroed
    page, a flipped byte), which the scan alone takes for the stream's end."""
    if closed is not None and closed[0] == generation and closed[2] == token and end < closed[1]:
        return closed[1]
    return 0


def _ids(names: list[str], prefix: str) -> list[int]:
    """The ids of the files ``names`` named ``prefix<id>`` (``layout.own_id``), sorted."""
    ids = [D.own_id(f, prefix) for f in names if f.startswith(prefix)]  # (the rest at C speed)
    return sorted(i for i in ids if i is not None)


def newest_checkpoint(directory: str, names: list[str], closed: Optional[int] = None) -> int:
    """Step b: the generation of the newest ``dump.<g>`` (0: none).  A file of
    that name without a dump's first bytes is refused, naming it: it is the
    dict's checkpoint damaged, or a file put there that only looks like one
    -- taking the next one would silently lose what it holds.  Where a clean
    close names the checkpoint (``closed``; 0: none yet) and it is there, it
    is the one: no checkpoint follows a clean close before the first write
    removes ``clean``, so a newer name (``dump.sql``) is not the dict's."""
    dumps = _ids(names, D.DUMP_PREFIX)
    if not dumps:
        return 0
    if closed == 0 or closed in dumps:
        return closed
    name = D.DUMP_PREFIX + L.base36(dumps[-1])
    if dumps[-1] != closed and not files.dicts_file(directory, name):  # (``clean`` names the dict's own)
        raise CorruptSegment(
            f"{os.path.join(directory, name)} is named as the dict's newest checkpoint but does not begin "
            "as one: a damaged checkpoint, or a file not the dict's (move it away); nothing was changed"
        )
    return dumps[-1]


def _remove_checkpoints(directory: str, names: list[str], generation: int, newer: bool) -> None:
    """Remove the dict's checkpoints ``newer`` than ``generation`` (step d),
    or older ones (step d', once it loaded), then sync the directory (why
    each: ``_disk/layout.py``, "Opening and recovery")."""
    ids = [g for g in _ids(names, D.DUMP_PREFIX) if g != generation and (g > generation) == newer]
    stale = [f for f in (D.DUMP_PREFIX + L.base36(g) for g in ids) if files.dicts_file(directory, f)]
    for f in stale if newer else ():
        log.warning(
            "ultradict_ng: recovering %s: removing %s, a checkpoint never published (its writer was "
            "killed before publishing it)",
            directory,
            f,
        )
    for f in stale:
        files.remove(os.path.join(directory, f))
    if stale:
        files.sync_dir(directory)


def _rewritten(directory: str, generation: int, end: int) -> bool:
    """Whether the stream's ``end`` bytes of records may rewrite at least
    ``MERGE_FRACTION`` of the checkpoint's entries (a record takes about the
    bytes of the entry it writes), so that the checkpoint of step e will be
    packed whole: then the dump is loaded decoded whole (``load_whole``),
    whose replay and packing cost less than a cache read in place and merged."""
    if not generation or not end:
        return False
    try:
        size = os.stat(os.path.join(directory, D.DUMP_PREFIX + L.base36(generation))).st_size
    except FileNotFoundError:
        return False  # (the load reports it)
    return end >= size * MERGE_FRACTION


def stale_control(directory: str, base: str, buf: Any) -> str:
    """Why the control segment ``buf`` of the dict kept in ``directory``, whose
    registered users all died, must be rebuilt rather than attached to (step
    3), or "" if it may be used.

    After a process is killed the page cache holds everything it published,
    so such a segment is attached to -- but only if the files still say what
    the segment says: its checkpoint is there, none newer than any it was
    making, and its stream's records are whole up to its end.  They do not
    after the files were put back from a backup while the segment stayed,
    after another container (its own ``/dev/shm``) rebuilt the dict from the
    files and went on, or after the kernel lost pages it could not write (an
    I/O error that left the filesystem read-only): attaching would then fail
    on records that are not there, or read a dict the files do not hold.  A
    ``clean`` file that records another state than the segment's is such
    files too (the first write after a clean reopen removes it before it
    publishes): records of a copy that went on from the same state can line
    up with the segment's."""
    state = read_word(buf, L.W_STATE)
    generation, end = state >> L.GEN_SHIFT, state & L.END_MASK
    dump = D.DUMP_PREFIX + L.base36(generation)
    if generation and not files.dicts_file(directory, dump):
        return f"its checkpoint {dump} is not in the directory"
    newer = max(_ids(os.listdir(directory), D.DUMP_PREFIX), default=0)
    if newer > max(generation, read_word(buf, L.W_REG_HIGH)):
        return f"the directory holds a newer checkpoint, {D.DUMP_PREFIX}{L.base36(newer)}"
    closed = read_clean(directory)  # (while it stays, the segment's state is the one it records)
    if closed is not None and closed != (generation, end, read_word(buf, L.W_TOKEN)):
        return f"its {D.CLEAN_FILE} file records another state (generation {closed[0]}, byte {closed[1]})"
    try:
        stream = segments.Segment.attach(L.stream_name(base))
    except FileNotFoundError:
        return "the stream file is missing"
    try:
        if stream.buf is None or stream.size < end:
            return f"the stream file is shorter than its records' end ({end})"
        with memoryview(stream.buf)[:end] as records:
            whole = scan(records, generation).end
    finally:
        stream.close()
    return "" if whole == end else f"its records end at byte {end}, the stream file's whole ones at {whole}"


def _merged(store: Store, stream: Any, end: int) -> Optional[Planned]:
    """Step e from bytes: the checkpoint that merges the records ``stream[0:end]``
    into the table the store holds in place, none of them replayed (``StreamMerge``);
    None where it cannot: a table decoded whole (below ``PARTIAL_FROM`` entries,
    before or after), or a record that is not a root-level set or delete of
    a str or int key (``stream_merge_plan`` says which).  Why: replaying a
    full stream into a million decoded rows and encoding them again took
    most of a recovery (1.3 s of 1.8)."""
    data: Any = store.data  # (a dict, or a big dict's TableCache)
    if type(data) is not TableCache or data.table is None or data.table.count < partial_from():
        return None
    merge = StreamMerge.planned(data.table, stream, end)
    if merge is None or merge.count < partial_from():
        return None
    return Planned(merge.size, merge.count, merge, None, None)


#: Bytes of the stream :func:`_clear_tail` compares or clears at a time.
_CHUNK = 1 << 20


def _clear_tail(stream: segments.Segment, path: str, end: int) -> None:
    """Step e without a checkpoint, where the disk has no room for one: zeros
    over the stream's bytes past ``end`` that are not zero, then synced.  The
    next opener replays the stream (it has no newer checkpoint).  Read with
    ``pread`` and written page by page only where a page holds data: the
    file already has those pages, so no new room is needed -- a hole
    touched through the mapping would take one (``files.FileBytes``)."""
    buf = stream.buf
    assert buf is not None
    fd = files.open_rw(path, writable=False)
    try:
        disk, tail = files.FileBytes(fd), end
        for at in range(end - end % files.PAGE, min(len(buf), len(disk)), _CHUNK):
            chunk = disk[at : at + _CHUNK]
            for page in range(0, len(chunk), files.PAGE):
                low = max(at + page, end)
                high = at + page + files.PAGE
                if chunk[low - at : high - at].strip(b"\0"):
                    buf[low : min(high, len(buf))] = bytes(min(high, len(buf)) - low)
                    tail = min(high, len(buf))
    finally:
        os.close(fd)
    files.sync_range(buf, path, end, tail)


def _stream(directory: str, base: str, header: Header) -> segments.Segment:
    """The stream file mapped; one shorter than the dict's stream size is extended with zeros."""
    path = f"{directory}/{D.STREAM_FILE}"
    try:
        stream = segments.Segment.attach(L.stream_name(base))
    except FileNotFoundError:
        raise CorruptSegment(f"{path} is missing: the dict's records are gone; nothing was changed") from None
    if stream.size >= header.stream_size:
        return stream
    log.warning(
        "ultradict_ng: %s was cut to %d bytes; extending it to %d", path, stream.size, header.stream_size
    )
    stream.close()
    fd = files.open_rw(path)
    try:
        os.ftruncate(fd, header.stream_size)
        files.sync_file(fd, path)
    finally:
        os.close(fd)
    return segments.Segment.attach(L.stream_name(base))


def recover(directory: str, base: str, meta: dict[str, Any], header: Header, options: Options) -> Store:
    """Steps 4a-4f; the caller holds the directory lock and has removed any control segment."""
    names = os.listdir(directory)  # (one listing: the lock keeps every other opener out)
    for f in names:  # a
        if D.aside_of(f) is not None:
            files.remove(os.path.join(directory, f))
    if header.serializer_id == CUSTOM_ID:
        if options.serializer is None:
            raise ParameterMismatch(f"the dict kept in {directory!r} uses a custom serializer: pass it")
        codec = codec_for(options.serializer)
    else:
        codec = codec_by_id(header.serializer_id)
    given = codec_for(options.serializer) if options.serializer is not None else None
    check_options(base, header, codec, given, options)
    record = read_clean_record(directory)  # (for b, e and f)
    closed = None if record is None else record[:3]
    generation = newest_checkpoint(
        directory, names, closed[0] if closed and closed[2] == header.token else None
    )  # b
    stream = _stream(directory, base, header)
    assert stream.buf is not None
    scanned = scan(stream.buf, generation)  # c
    missing = missing_checkpoint(stream.buf, scanned, generation, closed, header.token)
    if missing:
        raise CorruptSegment(
            f"{directory}/{D.DUMP_PREFIX}{L.base36(missing)} is missing: the dict's newest checkpoint, which "
            "its files name (put it back, or remove the dict); nothing was changed"
        )
    clean = closed == (generation, scanned.end, header.token)  # (for e)
    if not clean:
        scanned = looked_past_file(stream.buf, scanned, generation, f"{directory}/{D.STREAM_FILE}")
    recorded = short_of_clean(closed, generation, header.token, scanned.end)
    if recorded:
        log.warning(
            "ultradict_ng: recovering %s: its clean close recorded whole writes to byte %d of its stream, "
            "which holds them only to byte %d (%s): the writes between are lost to damage",
            directory,
            recorded,
            scanned.end,
            scanned.stopped or "its end",
        )
    if scanned.stopped not in NORMAL_ENDS and not clean:  # (clean: what follows its end is stale bytes)
        log.warning(
            "ultradict_ng: recovering %s: %d whole writes of generation %d replayed; the stream's tail "
            "from byte %d is ignored (%s)",
            directory,
            scanned.units,
            generation,
            scanned.end,
            scanned.stopped,
        )
    if faults.armed is not None:
        faults.hit("recovery-scanned")
    blobs = [
        i for i in _ids(names, D.BLOB_PREFIX) if files.dicts_file(directory, D.BLOB_PREFIX + L.base36(i))
    ]
    whole = not clean and _rewritten(directory, generation, scanned.end)
    from_bytes = not clean and generation > 0 and scanned.end > 0 and codec.id == MsgpackCodec.id
    _remove_checkpoints(directory, names, generation, newer=True)  # d
    ctrl = segments.Segment.create(base, L.CONTROL_SIZE)
    mapping = Mapping(ctrl, stream)
    store: Optional[Store] = None
    try:
        words = mapping.words
        header.write(words)
        words[L.W_STREAM_LIMIT] = reserve_again(L.stream_name(base), header.stream_limit, scanned.end)
        state = generation << L.GEN_SHIFT | (0 if from_bytes else scanned.end)  # (e: records merged as bytes)
        words[L.W_STATE] = words[L.W_SYNCED] = state
        words[L.W_REG_LOW] = words[L.W_REG_HIGH] = generation
        words[L.W_BLOB_NEXT] = blobs[-1] + 1 if blobs else 1
        words[L.W_BLOB_LOW] = blobs[0] if blobs else words[L.W_BLOB_NEXT]
        store = Store(mapping, base, codec, header, created=False, max_decoded=options.max_decoded)
        users.register((base, header.token), mapping.atomic)
        store.registered = True
        merged: Optional[Planned] = None

        def replayed() -> None:  # (STATE at the records' end: the store replays them)
            mapping.atomic.store(L.W_STATE, generation << L.GEN_SHIFT | scanned.end)
            mapping.atomic.store(L.W_SYNCED, generation << L.GEN_SHIFT | scanned.end)
            store.sync()

        try:
            if whole and not from_bytes:
                store.load_whole(generation)
            store.sync()
            merged = _merged(store, stream.buf, scanned.end) if from_bytes else None
            if from_bytes and merged is None:  # (records the bytes merge does not take: replayed)
                if whole:
                    store.load_whole(generation)
                replayed()
            table = getattr(store.data, "table", None)
            if not clean and not whole and merged is None and table is not None:
                table.check()  # (its entries go into the checkpoint as bytes: step e)
        except CorruptSegment as exc:
            name = os.path.join(
                directory, D.DUMP_PREFIX + L.base36(generation) if generation else D.STREAM_FILE
            )
            named = str(exc) if name in str(exc) else f"{name}: {exc}"
            raise CorruptSegment(f"{named}; nothing was changed") from exc
        _remove_checkpoints(directory, names, generation, newer=False)  # d' (g loaded: whole)
        if faults.armed is not None:
            faults.hit("recovery-loaded")
        if clean:  # e
            assert record is not None
            mapping.atomic.store(L.W_DEAD, D.dead_word(generation, record[3]))
            mapping.atomic.store(L.W_CLEAN_PENDING, 1)  # f: the first write removes it
        else:
            try:
                store.force_dump(merged)
            except OutOfSpace as exc:  # (no room for a checkpoint: the other way of step e)
                if merged is not None:  # (the records were not replayed: they are now)
                    replayed()
                _clear_tail(stream, os.path.join(directory, D.STREAM_FILE), scanned.end)
                log.warning(
                    "ultradict_ng: recovering %s: %s; its stream's stale tail was cleared instead",
                    directory,
                    exc,
                )
            raise_synced(mapping.atomic, mapping.atomic.load(L.W_STATE))
            if faults.armed is not None:
                faults.hit("recovery-checkpointed")
            if files.remove(os.path.join(directory, D.CLEAN_FILE)):  # f
                files.sync_dir(directory)
            files.write_in_place(  # (a SharedCache's side: rebuilt from the entries)
                os.path.join(directory, D.CACHE_FILE), 8 * C.W_BATCH, (1).to_bytes(8, sys.byteorder)
            )
        # MAGIC last: a segment without it is rebuilt by the next opener (step
        # 3).  Set before the checkpoint, a recovery killed in step e left a
        # segment that looked whole, whose STATE (g << 32 where the records
        # were to be merged as bytes) the next opener attached to without
        # the records: acknowledged writes lost.
        mapping.atomic.store(L.W_MAGIC, L.CONTROL_MAGIC)
        store._arm_finalizer(False)
        return store
    except BaseException:
        if store is not None:
            if store.registered:
                users.detach((base, header.token), mapping.atomic)
            store._finalizer = None
        segments.unlink(base)  # (only the control segment: the files stay as they are)
        mapping.release()
        raise
