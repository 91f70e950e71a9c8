"""The reader: bringing a process's cache up to the published state, lock-free.

Follows layout: "Reader", step by step (the comments name the steps).  The
hit path -- STATE unchanged since the cache was filled -- is not here: it is
one load and one compare in the facade (or in the compiled ``ViewBase``).
This is everything after a miss: load a new dump, copy and validate the new
records, apply them, retry on any sign of a concurrent writer, and take the
lock as a last resort.
"""

from __future__ import annotations

import struct
import time
import zlib
from typing import Any, Optional, Union, cast

from .._codec.codec import Codec, MsgpackCodec
from .._codec.records import Inconsistent, apply_all
from .._platform.directories import shown, shown_file
from .._platform.lock import SharedLock
from .._platform.segments import Segment
from ..errors import CorruptSegment, PathGone, Unlinked
from ..speedups import StoreBase, apply_simple, parse_records
from . import layout as L
from . import table_layout as TL
from .mapping import Mapping
from .table import Table
from .tablecache import TableCache
from .tablecache import partial_from as _partial_from

__all__ = ["Reader", "INVALID"]

#: ``seen``/``gen`` value that forces a reload from the dump.
INVALID = -1
_MSGPACK_ID = MsgpackCodec.id
_OP_SET = L.OP_SET
_OP_DEL = L.OP_DEL
#: The most records :meth:`Reader._apply_simply` decodes in one call between
#: two tries of ``apply_simple`` (the run doubles from 1 while it takes none).
_DECODED_RUN = 4096
_dump_header = struct.Struct(L.DUMP_FORMAT)
_TABLE_MAGIC = TL.TABLE_MAGIC


def _pause(attempt: int) -> None:
    """Back-off between reader rounds: yield first, then sleep briefly."""
    time.sleep(0 if attempt < 10 else 0.0001 * min(attempt, 50))


class Reader(StoreBase):
    """Base of :class:`~ultradict_ng.store.Store`: the reader algorithm, and
    the fields it keeps (``seen``, ``data`` and ``pos`` are ``StoreBase``'s)."""

    __slots__ = ("name", "token", "codec", "words", "gen", "stream_size", "mutex", "lock", "_map")

    name: str
    token: int
    codec: Codec
    words: Any
    gen: int
    stream_size: int
    mutex: Any
    lock: SharedLock
    _map: Mapping
    #: True for a change feed (feed.Feed), which is told what each refresh
    #: replays through ``_feed_records`` and ``_feed_dump``.
    _feeding = False
    #: Whether a big table dump may be read in place (a TableCache) instead of
    #: decoded whole: a change feed compares whole states, so it decodes.
    _partial = True
    #: The most decoded rows of a big dict this handle keeps (``SharedDict(
    #: max_decoded=N)``; None: every row it read, see ``TableCache.evict``).
    max_decoded: Optional[int] = None

    def node(self, path: tuple[Any, ...]) -> dict[Any, Any]:
        """The cached dict at ``path`` (caller has synced); PathGone if it is not a dict now."""
        node = self.data
        for key in path:
            try:
                node = node[key]
            except (KeyError, TypeError):
                node = None  # type: ignore[assignment]
            if type(node) is not dict:
                raise PathGone(
                    f"nested dict at path {list(path)!r} of shared dict {shown(self.name)!r} no longer exists"
                )
        return node

    def sync(self) -> None:
        """Bring the local cache up to the published STATE."""
        with self.mutex:
            if self.words[L.W_STATE] == self.seen or self._refresh(L.READER_RETRIES) is None:
                return
        # Step 5, the last resort: under the lock nothing changes.  Order is lock, then mutex.
        with self.lock:
            with self.mutex:
                self._refresh_locked()

    def load_whole(self, gen: int) -> None:
        """Make the cache the dump of ``gen`` decoded whole into a ``dict``,
        however big (never read in place); a ``sync`` then replays the stream
        into it.  Recovery's (``_disk/recovery.py``), when its checkpoint
        follows and the stream may rewrite much of the dict: a ``dict`` takes
        the records in one compiled pass (``_parse``: ``apply_simple``) and
        is packed whole, where a ``TableCache`` takes them through its own
        set, with the bookkeeping of what changed, and is decoded whole for
        the dump anyway -- a million keys rewritten: ~1.5 s against ~3 s
        (2 cores).  A dump failing its checks is left as it is: ``sync``
        finds it."""
        with self.mutex:
            try:
                data = self._load_dump(gen, in_place=False)
            except CorruptSegment:
                return
            self.data = cast(dict[Any, Any], data)
            self.gen, self.pos, self.seen = gen, 0, gen << L.GEN_SHIFT

    def reload(self) -> None:
        """Drop the cache and load the shared state again from the current dump."""
        with self.mutex:
            self.gen = self.seen = INVALID
        self.sync()

    def _refresh_locked(self) -> None:
        problem = self._refresh(1)
        if problem is None:
            return
        if self._map.words[L.W_STATUS] & L.STATUS_UNLINKED:
            raise Unlinked(f"shared dict {shown(self.name)!r} was unlinked")
        raise CorruptSegment(f"shared dict {shown(self.name)!r}: {problem}")

    def _refresh(self, rounds: int) -> Optional[str]:
        """Up to ``rounds`` rounds of the reader algorithm: None when caught up, else
        what went wrong in the last round."""
        words = self.words
        problem = "no progress"
        for attempt in range(rounds):
            st = words[L.W_STATE]  # step 1
            if st == self.seen:
                return None
            gen, end = st >> L.GEN_SHIFT, st & L.END_MASK
            if gen != self.gen:  # step 2: a new generation
                try:
                    data = self._load_dump(gen)
                except CorruptSegment as exc:  # (a dump replaced meanwhile reads so too: retried)
                    problem = str(exc)
                    _pause(attempt)
                    continue
                data = cast(dict[Any, Any], data)  # (or a TableCache: the read API of a dict)
                if self._feeding:
                    self._feed_dump(data)  # (a feed decodes whole: _partial is False)
                self.data = data
                self.gen, self.pos, self.seen = gen, 0, gen << L.GEN_SHIFT
            if end < self.pos or end > self.stream_size:
                problem = f"STATE end {end} outside 0..{self.stream_size} (cached position {self.pos})"
                self.gen = self.seen = INVALID
                _pause(attempt)
                continue
            mv = self._map.stream_mv
            assert mv is not None
            chunk = bytes(mv[self.pos : end])  # step 3
            if words[L.W_STATE] >> L.GEN_SHIFT != gen:
                problem = "stream restarted while it was being read"
                _pause(attempt)
                continue
            try:
                records = self._parse(chunk, gen)  # step 4
            except CorruptSegment as exc:
                problem = str(exc)
                _pause(attempt)
                continue
            except Inconsistent as exc:  # (a record _parse applied itself; the cache is marked)
                problem = str(exc)
                continue
            if self._feeding:
                self._feed_records(records)
            try:
                apply_all(self.data, records)
            except Inconsistent as exc:
                if self._feeding:
                    self._feed_undo()
                problem = str(exc)
                self.gen = self.seen = INVALID
                continue
            except BaseException:  # e.g. KeyboardInterrupt mid-batch: half applied
                self.gen = self.seen = INVALID
                raise
            self.pos, self.seen = end, st
            return None
        return problem

    def _feed_dump(self, new: dict[Any, Any]) -> None:
        """(A change feed's hook: the cache is about to be replaced by ``new``.)"""

    def _feed_records(self, records: list[Any]) -> None:
        """(A change feed's hook: ``records`` are about to be applied.)"""

    def _feed_undo(self) -> None:
        """(A change feed's hook: the records of the last ``_feed_records`` were not applied.)"""

    def _load_dump(self, gen: int, in_place: bool = True) -> Union[dict[Any, Any], TableCache]:
        """The decoded dump of ``gen`` (``in_place`` False: never a ``TableCache``).
        Raises CorruptSegment saying why it could not be loaded: the reader
        retries (a dump removed or replaced under it reads so too), and raises
        it only when the lock shows it for what it is (layout: "Reader").

        A failure inside the decoding is caught and only its message kept
        before the segment is closed: its traceback's frames may hold views
        of the segment (a twin's memoryview slices), which would make the
        close fail.  The error is raised anew once the segment is closed."""
        if gen == 0:
            return {}
        dname = L.dump_name(self.name, gen)
        try:
            seg = Segment.attach(dname)
        except FileNotFoundError:
            raise CorruptSegment(f"dump {shown_file(dname)!r} does not exist") from None
        kept = False
        problem = ""
        try:
            try:
                out = self._decode_dump(seg, dname, gen, in_place)
                kept = isinstance(out, TableCache)
                return out
            except CorruptSegment as exc:
                problem = str(exc)  # (the exception, and any view its frames hold, go here)
        finally:
            if not kept:
                seg.close()
        raise CorruptSegment(problem)

    def _decode_dump(
        self, seg: Segment, dname: str, gen: int, in_place: bool
    ) -> Union[dict[Any, Any], TableCache]:
        """The dump in ``seg`` checked and decoded (or read in place), for
        :meth:`_load_dump`; CorruptSegment says what is wrong."""
        if seg.buf is None or seg.size < L.DUMP_HEADER:
            raise CorruptSegment(f"dump {shown_file(dname)!r} is too small ({seg.size} bytes)")
        if seg.buf[:8] == _TABLE_MAGIC:
            return self._load_table(seg, dname, gen, in_place)
        magic, dgen, length, crc, _ = _dump_header.unpack_from(seg.buf, 0)
        if magic != L.DUMP_MAGIC or dgen != gen or length > seg.size - L.DUMP_HEADER:
            raise CorruptSegment(f"dump {shown_file(dname)!r} has an invalid header")
        problem = ""
        with memoryview(seg.buf) as whole, whole[L.DUMP_HEADER : L.DUMP_HEADER + length] as body:
            if zlib.crc32(body) != crc:
                problem = "fails its checksum"
            else:
                try:
                    data = self.codec.loads(body)
                except CorruptSegment as exc:  # (dropped before the views are released)
                    problem = f"cannot be decoded: {exc}"
        if problem:
            raise CorruptSegment(f"dump {shown_file(dname)!r} {problem}")
        if type(data) is not dict:
            raise CorruptSegment(f"dump {shown_file(dname)!r} does not hold a dict")
        return data

    def _load_table(
        self, seg: Segment, dname: str, gen: int, in_place: bool = True
    ) -> Union[dict[Any, Any], TableCache]:
        """The cache of a table dump (layout: "Dump"); CorruptSegment says why
        it could not be made (raised once the view of the segment is
        released: see :meth:`_load_dump`).

        A table of at least ``PARTIAL_FROM`` entries stays mapped and becomes a
        :class:`TableCache`: nothing is decoded until it is read (layout:
        "Reader", step 2).  A smaller one is decoded whole into a ``dict``: its
        entries are checked and joined into one map by one compiled pass
        (``table_chunk``: the copy the payload form makes too) and decoded by
        one serializer call, so loading it costs what the payload form does.
        (``in_place`` False: decoded whole at any size.)"""
        whole = memoryview(seg.buf)  # type: ignore[arg-type]
        partial = False
        problem = ""
        try:
            try:
                table = Table(whole, self.token, f"dump {shown_file(dname)!r}")
                try:
                    if table.generation != gen:
                        where = shown_file(dname)
                        raise CorruptSegment(
                            f"dump {where!r} has an invalid header (generation {table.generation})"
                        )
                    if table.count >= _partial_from() and self._partial and in_place:
                        partial = True
                        return TableCache(
                            table,
                            self.codec.loads,
                            (seg, whole),
                            self.mutex,
                            self.codec.id == _MSGPACK_ID,
                            self.max_decoded,
                        )
                    return table.decode_all(self.codec.loads, self.codec.id == _MSGPACK_ID)
                finally:
                    if not partial:
                        table.close()
            except CorruptSegment as exc:
                problem = str(exc)  # (the exception, and any view its frames hold, go here)
        finally:
            if not partial:
                whole.release()
        raise CorruptSegment(problem)

    def _parse(self, chunk: bytes, gen: int) -> list[Any]:
        """Decoded records of ``chunk``; CorruptSegment says what is wrong (step 4).

        For msgpack the parser also checks that each payload is exactly one
        msgpack object, which lets the codec decode them all in one call.
        Into a ``dict`` cache or a big dict's ``TableCache`` (not a feed's)
        the records are applied here (:meth:`_apply_simply`) and none is
        returned."""
        framed = self.codec.id == _MSGPACK_ID
        try:
            payloads = parse_records(chunk, gen & L.GEN_MASK, self.pos, framed)
        except ValueError as exc:  # (the parser's reason)
            raise CorruptSegment(str(exc)) from None
        data: Any = self.data  # (a dict, or a big dict's TableCache)
        if framed and (type(data) is dict or type(data) is TableCache) and not self._feeding:
            self._apply_simply(data, payloads)
            return []
        return self._decoded(payloads, framed)

    def _decoded(self, payloads: list[Any], framed: bool) -> list[Any]:
        try:
            return self.codec.loads_many(payloads, framed)
        except CorruptSegment as exc:
            raise CorruptSegment(f"records from stream offset {self.pos} cannot be decoded: {exc}") from None

    def _apply_simply(self, data: Any, payloads: list[Any]) -> None:
        """Apply msgpack ``payloads`` in order: the records that set a scalar
        root key to a scalar or a tuple of them, or delete a scalar root key
        -- a replayed stream's usual records -- straight from their bytes
        (``apply_simple``: no record made; half the time of the decode and
        ``apply_all`` into a ``dict``, a fifth into a ``TableCache``, whose
        records ``apply_all`` takes one by one), every other record decoded
        and applied between them.  Where ``apply_simple`` takes none, the
        next 1, 2, 4 ... (at most ``_DECODED_RUN``) records are decoded in
        one call: a stream of records it never takes (nested dicts, dict
        values) costs about what decoding it whole did.  A failure once a
        record was applied marks the cache for a reload (CorruptSegment, or
        Inconsistent: a record that does not apply)."""
        n, at, run, done = len(payloads), 0, 1, 0
        try:
            while True:
                done = apply_simple(data, payloads, at, _OP_SET, _OP_DEL)
                if done == n:
                    return
                run = min(2 * run, _DECODED_RUN) if done == at and at else 1  # (doubles: none taken)
                apply_all(data, self._decoded(payloads[done : done + run], True))
                at = done + run
                if at >= n:
                    return
        except CorruptSegment:
            if at or done:
                self.gen = self.seen = INVALID
            raise
        except BaseException:
            self.gen = self.seen = INVALID
            raise
