"""The writer: publishing one mutation under the lock, as a record or a dump.

Follows layout: "Writer", step by step.  Every mutation of the facade is
``begin_write`` (lock, cache mutex, catch up, checks), then ``commit(record)``
(encode, write, publish, apply), then ``end_write``.  ``set_root`` is the
same three for the commonest write, with the root-level scalar record
encoded straight into the stream by ``Words.write_simple`` (the same bytes
the codec would make).  The named ``faults`` points are where crash tests kill
a writer.
"""

from __future__ import annotations

import logging
import struct
import zlib
from typing import Any, Callable, List, Optional

from . import faults
from . import layout as L
from . import record as R
from . import segment
from .errors import OutOfSpace, Unlinked
from .reader import INVALID, Reader
from .segment import Segment

__all__ = ["Writer"]

log = logging.getLogger("ultradict_ng")

# Hot-path constants as module globals (one dict lookup instead of two).
_W_STATE, _W_STATUS, _UNLINKED = L.W_STATE, L.W_STATUS, L.STATUS_UNLINKED
_GEN_SHIFT, _GEN_MASK, _RECORD_HEADER, _OP_SET = L.GEN_SHIFT, L.GEN_MASK, L.RECORD_HEADER, L.OP_SET
_W_STREAM_LIMIT = L.W_STREAM_LIMIT
_dump_header = struct.Struct(L.DUMP_FORMAT)


class Writer(Reader):
    """Base of :class:`~ultradict_ng.store.Store`: the writer algorithm (a
    writer is a reader that holds the lock: step 1 is the reader's catch-up)."""

    __slots__ = ("grows", "dump_limit", "write_simple")

    grows: bool
    dump_limit: int
    #: ``write_simple`` of the stream when its bytes are msgpack's, else None.
    write_simple: Optional[Callable[..., Optional[int]]]

    def begin_write(self) -> None:
        """Take the lock and the cache mutex, and catch up (writer steps 1-2)."""
        words = self.words
        words[_W_STATE]  # raises Closed on a closed handle, before touching the lock
        lock = self.lock
        lock.acquire()
        try:
            if faults.armed is not None:
                faults.hit("lock-held")
            self.mutex.acquire()
        except BaseException:
            lock.release()
            raise
        try:
            if words[_W_STATE] != self.seen:
                self._refresh_locked()
            if words[_W_STATUS] & _UNLINKED:
                raise Unlinked(f"shared dict {self.name!r} was unlinked; it can no longer be written")
        except BaseException:
            self.mutex.release()
            lock.release()
            raise

    def end_write(self) -> None:
        self.mutex.release()
        self.lock.release()

    def limit(self) -> int:
        """Bytes of the stream writers may use now (LIMIT, never past the stream);
        only meaningful under the lock, where it cannot change."""
        limit: int = self._map.words[_W_STREAM_LIMIT]
        return limit if limit < self.stream_size else self.stream_size

    def set_root(self, key: Any, value: Any) -> None:
        """``data[key] = value`` at the root: begin_write, commit, end_write in one.

        With the msgpack codec a scalar key and value are encoded straight
        into the stream by ``write_simple``; anything else, a record
        that does not fit, or an armed fault point goes through :meth:`commit`.
        """
        self.begin_write()
        try:
            simple = self.write_simple
            if simple is not None and faults.armed is None:
                new_end = simple(self.pos, self.gen & _GEN_MASK, self.limit(), _OP_SET, key, value)
                if new_end is not None:
                    state = (self.gen << _GEN_SHIFT) | new_end
                    self._map.atomic.store(_W_STATE, state)  # publish after the payload
                    try:
                        self.data[key] = value  # a scalar decodes to an equal object
                    except BaseException:  # published but not applied here: reload
                        self.gen = self.seen = INVALID
                        raise
                    self.pos, self.seen = new_end, state
                    return
            self.commit(R.set_((), key, value))
        finally:
            self.end_write()

    def commit(self, rec: List[Any]) -> None:
        """Encode, publish and apply one record (writer steps 2-5); caller is in begin_write."""
        # UnsupportedType here changes nothing.  ``decoded`` is what every
        # reader will decode (the record itself when that is provably equal).
        payload, decoded = self.codec.encode_record(rec)
        end = self.pos
        if end + _RECORD_HEADER + len(payload) <= self.limit():
            mapping = self._map
            stream = mapping.stream_words
            assert stream is not None
            new_end = stream.write_record(end, self.gen & _GEN_MASK, payload)
            if faults.armed is not None:
                faults.hit("record-written")
            state = (self.gen << _GEN_SHIFT) | new_end
            mapping.atomic.store(_W_STATE, state)  # publish after the payload
            if faults.armed is not None:
                faults.hit("record-published")
            try:
                R.apply(self.data, decoded)
            except BaseException:  # published but not applied here: reload
                self.gen = self.seen = INVALID
                raise
            self.pos, self.seen = new_end, state
            return
        try:
            R.apply(self.data, decoded)
            self._write_dump()
        except BaseException:
            self.gen = self.seen = INVALID  # the cache may differ from shared memory: reload
            raise

    def force_dump(self) -> None:
        """Write a full dump now (restarting the stream), under the lock."""
        self.begin_write()
        try:
            self._write_dump()
        finally:
            self.end_write()

    def _write_dump(self) -> None:
        """Writer step 4: snapshot the cache into generation gen+1 and publish it."""
        payload = self.codec.dumps(self.data)
        if self.dump_limit and L.DUMP_HEADER + len(payload) > self.dump_limit:
            raise OutOfSpace(
                f"shared dict {self.name!r}: a full dump would take {L.DUMP_HEADER + len(payload)} "
                f"bytes, over the dict's dump size limit of {self.dump_limit}"
            )
        gen = self.gen + 1 if self.gen < L.GEN_MASK else 1
        atomic = self._map.atomic
        atomic.store(L.W_REG_HIGH, gen)  # 4a
        if faults.armed is not None:
            faults.hit("dump-registered")
        dname = L.dump_name(self.name, gen)
        size = L.DUMP_HEADER + len(payload)
        try:
            seg = Segment.create(dname, size)  # 4b
        except FileExistsError:
            segment.unlink(dname)  # unpublished leftover of a writer that died
            seg = Segment.create(dname, size)
        try:
            assert seg.buf is not None
            if faults.armed is not None:
                faults.hit("dump-created")
            seg.buf[L.DUMP_HEADER:size] = payload
            seg.buf[0:L.DUMP_HEADER] = _dump_header.pack(
                L.DUMP_MAGIC, gen, len(payload), zlib.crc32(payload), 0
            )
        except BaseException:
            seg.close()
            segment.unlink(dname)
            raise
        seg.close()
        if faults.armed is not None:
            faults.hit("dump-written")
        if self.grows:
            self._grow_stream(size)
        state = gen << L.GEN_SHIFT
        atomic.store(L.W_STATE, state)  # 4c: publishes the dump, restarts the stream
        if faults.armed is not None:
            faults.hit("dump-published")
        self.gen, self.pos, self.seen = gen, 0, state
        low = atomic.load(L.W_REG_LOW)  # 4d
        for old in range(max(low, gen - L.MAX_RECLAIM), gen):
            segment.unlink(L.dump_name(self.name, old))
        atomic.store(L.W_REG_LOW, gen)
        if atomic.load(L.W_STATUS) & L.STATUS_UNLINKED:
            segment.unlink(dname)  # unlinked while we were dumping: do not leak ours

    def _grow_stream(self, dump_size: int) -> None:
        """Raise LIMIT for a dump of ``dump_size`` bytes (layout: "Stream size")."""
        granule = L.STREAM_GRANULE
        wanted = -(-L.STREAM_GROWTH * dump_size // granule) * granule
        wanted = min(wanted, self.stream_size)
        if wanted <= self.limit():
            return
        try:
            segment.reserve(L.stream_name(self.name), wanted)
        except (OutOfSpace, FileNotFoundError) as exc:
            log.info("shared dict %r: stream stays at %d bytes (%s)", self.name, self.limit(), exc)
            return
        self._map.atomic.store(_W_STREAM_LIMIT, wanted)
