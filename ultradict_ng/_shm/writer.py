"""The writer: publishing one mutation under the lock, as a record or a dump.

Follows layout: "Writer", step by step.  Every mutation of the facade is
``begin_write`` (lock, cache mutex, catch up, checks), then ``commit(record)``
(encode, write, publish, apply), then ``end_write``.  ``set_root`` is the
same three for the commonest write, with the root-level record of a scalar
or, outside ``recurse``, of a JSON-like value encoded straight into the
stream by ``Words.write_simple`` (the same bytes the codec would make).  The
named ``faults`` points are where crash tests kill a writer.
"""

from __future__ import annotations

import logging
from threading import get_ident
from typing import Any, Callable, Optional

from .._codec import records as R
from .._codec.codec import MsgpackCodec, PickleCodec
from .._codec.placeholders import BlobRef
from .._codec.records import SCALAR_TYPES as _SCALARS
from .._disk.syncing import Durability
from .._engine import check_open
from .._platform import faults, segments
from .._platform.directories import shown, shown_file
from ..errors import OutOfSpace, PathGone, TransactionAborted, Unlinked
from ..speedups import copy_plain
from . import layout as L
from . import tablecache
from .blobs import (
    dropped_blobs,
    extract_blobs,
    may_hold_blobs,
    pairs_may_hold_blobs,
    sweep_blobs,
    unlink_blobs,
)
from .dumps import Planned, plan, successor
from .reader import INVALID, Reader
from .streamsize import grow_stream, reserve_more
from .table import Table
from .transaction import Transaction, mark_last, unwrite
from .waiting import ProcessWaits, wake

__all__ = ["Writer"]

log = logging.getLogger("ultradict_ng")

# Hot-path constants as module globals (one dict lookup instead of two).
_W_STATE, _W_STATUS, _UNLINKED = L.W_STATE, L.W_STATUS, L.STATUS_UNLINKED
_GEN_SHIFT, _GEN_MASK, _RECORD_HEADER, _OP_SET = L.GEN_SHIFT, L.GEN_MASK, L.RECORD_HEADER, L.OP_SET
_W_STREAM_LIMIT, _W_BLOB_NEXT, _W_CHANGE_WAITERS = L.W_STREAM_LIMIT, L.W_BLOB_NEXT, L.W_CHANGE_WAITERS
_UNIT_WHOLE, _UNIT_SHIFT, _MAX_BACK = L.UNIT_WHOLE, L.UNIT_BACK_SHIFT, L.MAX_UNIT_BACK
_WAKE_ALL = 0x7FFFFFFF
_MSGPACK_ID = MsgpackCodec.id


class Writer(Reader):
    """Base of :class:`~ultradict_ng.store.Store`: the writer algorithm (a
    writer is a reader that holds the lock: step 1 is the reader's catch-up)."""

    __slots__ = ("grows", "dump_limit", "write_simple", "blob_threshold", "waits", "tx", "durable")

    #: The open transaction (only its thread, which holds the lock, writes), or None.
    tx: Optional[Transaction]

    grows: bool
    dump_limit: int
    #: Buffers and arrays this large or larger go to blobs (0: never).
    blob_threshold: int
    token: int
    #: This process's registration in the dict's wait register (layout: "Waiting and waking").
    waits: ProcessWaits
    #: ``write_simple`` of the stream when its bytes are msgpack's, else None.
    write_simple: Optional[Callable[..., Optional[int]]]
    #: The sync policy of a dict kept in files (``_disk/syncing.py``), else None.
    durable: Optional[Durability]

    def begin_write(self) -> None:
        """Take the lock and the cache mutex, and catch up (writer steps 1-2)."""
        words = self.words
        check_open(words)  # before touching the lock
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
                raise Unlinked(f"shared dict {shown(self.name)!r} was unlinked; it can no longer be written")
            if self.durable is not None and words[L.W_CLEAN_PENDING]:
                self.durable.forget_clean()  # (before the first write after a clean reopen: _disk/layout.py)
        except BaseException:
            self.mutex.release()
            lock.release()
            raise

    def before_side_change(self) -> None:
        """Under the lock, before a change to what is kept beside the dict (a
        SharedCache's side file): ``clean`` goes first, as before a record
        (``_disk/layout.py``, step f) -- else a power loss could keep the change
        beside entries a clean reopen trusts."""
        if self.durable is not None and self.words[L.W_CLEAN_PENDING]:
            self.durable.forget_clean()

    def end_write(self) -> None:
        # (Read under the lock: once free, another thread may open a block or reload the cache.)
        durable, state = self.durable if self.tx is None else None, self.seen
        self.mutex.release()
        self.lock.release()
        if durable is not None:
            durable.after_write(state)  # (outside the lock: group commit)

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
        In the thread of an open transaction the lock is held and the cache
        caught up since its start (nobody else publishes): only the mutex is taken.
        """
        tx = self.tx
        if tx is not None and tx.thread == get_ident():
            check_open(self.words)
            self.mutex.acquire()
            try:
                self._set_root(key, value, tx)
            finally:
                self.mutex.release()
            return
        self.begin_write()
        try:
            self._set_root(key, value, self.tx)
        finally:
            self.end_write()

    def _set_root(self, key: Any, value: Any, tx: Optional[Transaction]) -> None:
        simple = self.write_simple
        if (
            simple is not None
            and faults.armed is None
            and (tx is None or not tx.dump)
            and (type(value) is not bytes or not 0 < self.blob_threshold <= len(value))
            and (self._map.words[_W_BLOB_NEXT] == 1 or type(self.data.get(key)) in _SCALARS)
        ):
            # (A tuple of scalars is written here too; a bytes item for a blob
            # in it makes write_simple decline, as the threshold is passed.)
            # (A large bytes value goes to a blob; an old value that may hold
            # blobs must be found and dropped: both take commit.)  The limit
            # is ``self.limit()``, inlined: this is every root write's path.
            limit, size = self._map.words[_W_STREAM_LIMIT], self.stream_size
            back = 0 if tx is None else self.pos - tx.start
            if back >= _MAX_BACK:  # (past what a unit word can say: the transaction ends with a dump)
                limit = 0
            new_end = simple(
                self.pos,
                self.gen & _GEN_MASK,
                limit if limit < size else size,
                _OP_SET,
                key,
                value,
                self.blob_threshold,
                _UNIT_WHOLE if tx is None else back << _UNIT_SHIFT,
                not self.recurse,  # (a JSON-like value too: a dict under recurse is a node)
            )
            if new_end is not None:
                if type(value) not in _SCALARS:  # (readers decode the tree afresh: ours is a copy)
                    value = copy_plain(value)
                if tx is not None:  # written past the published end: the transaction's end publishes
                    tx.last = self.pos
                    try:
                        self.data[key] = value
                    except BaseException:
                        tx.broken = True
                        raise
                    self.pos = new_end
                    return
                state = (self.gen << _GEN_SHIFT) | new_end
                if self._map.atomic.publish(_W_STATE, state, _W_CHANGE_WAITERS):  # after the payload
                    self._wake_changes()
                try:
                    self.data[key] = value  # a scalar decodes to an equal object, a tree to a copy
                except BaseException:  # published but not applied here: reload
                    self.gen = self.seen = INVALID
                    raise
                self.pos, self.seen = new_end, state
                return
        self.commit(R.set_((), key, value))

    def write(self, rec: list[Any]) -> None:
        """``begin_write``, ``commit(rec)``, ``end_write`` (a record that needs no check)."""
        self.begin_write()
        try:
            self.commit(rec)
        finally:
            self.end_write()

    def commit(self, rec: list[Any]) -> None:
        """Publish and apply one record (writer steps 2-5, with layout "Blobs"
        a-d when its values hold large buffers or arrays); caller is in
        begin_write.  Raises and changes nothing, or publishes it all."""
        created: list[BlobRef] = []
        threshold = self.blob_threshold
        if (
            threshold
            and len(rec) > 2
            and (
                may_hold_blobs(rec[3], threshold)
                if rec[0] == _OP_SET
                else rec[0] == L.OP_UPDATE and pairs_may_hold_blobs(rec[2], threshold)
            )
        ):
            pickled = self.codec.id == PickleCodec.id
            rec = extract_blobs(rec, created, self.name, self.token, self._map, threshold, pickled)
        dropped = self._dropped(rec) if self._map.words[_W_BLOB_NEXT] > 1 else ()
        before = self._map.words[_W_STATE]
        tx = self.tx
        try:
            if tx is None:
                self._commit(rec)
            else:
                self._buffer(tx, rec)
        except BaseException:
            if created and self._map.words[_W_STATE] == before:  # nothing was published
                unlink_blobs(self.name, created)
            raise
        if tx is not None:  # (published, or unlinked, by the transaction's end)
            tx.created.extend(created)
            tx.dropped.extend(dropped)
        elif dropped and self.durable is None:
            unlink_blobs(self.name, dropped)  # d: no published state references them any more
        elif dropped:  # (in files: a dump sweeps them)
            self._drop_in_files(dropped)

    def _drop_in_files(self, dropped: list[BlobRef]) -> None:
        """Blobs a published write dropped, in files: they stay until a dump
        sweeps them, written once they outweigh the last (``Durability.dropped``).
        That dump is the handle's, not the write's: one that fails (no room
        on the disk, no right to make files in the directory) leaves them for
        a later one, and the write -- published already -- stands."""
        assert self.durable is not None
        if self.durable.dropped(dropped):
            try:
                self.force_dump()
            except OSError as exc:
                where = self.durable.path.rpartition("/")[0]
                log.warning(
                    "ultradict_ng: %s: replaced values stay until a checkpoint can be written (%s)",
                    where,
                    exc,
                )

    def _commit(self, rec: list[Any]) -> None:
        """Writer steps 2-5 for one record."""
        # UnsupportedType here changes nothing.  ``decoded`` is what every
        # reader will decode (the record itself when that is provably equal).
        payload, decoded = self.codec.encode_record(rec)
        end = self.pos
        needed = end + _RECORD_HEADER + len(payload)
        if (needed <= self.limit() or reserve_more(self, needed)) and not self._bulk_load(rec):
            mapping = self._map
            stream = mapping.stream_words
            assert stream is not None
            new_end = stream.write_record(end, self.gen & _GEN_MASK, payload)
            if faults.armed is not None:
                faults.hit("record-written")
            state = (self.gen << _GEN_SHIFT) | new_end
            if mapping.atomic.publish(_W_STATE, state, _W_CHANGE_WAITERS):  # after the payload
                self._wake_changes()
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

    def _bulk_load(self, rec: list[Any]) -> bool:
        """A load: a root update of ``PARTIAL_FROM`` (the default) pairs or more, no fewer
        than the dict holds; published as a dump, a table readers map, not a record."""
        return (
            rec[0] == L.OP_UPDATE
            and not rec[1]
            and self.codec.id == _MSGPACK_ID
            and len(rec[2]) >= max(tablecache.PARTIAL_FROM, len(self.data))
        )

    # -- transactions (layout: "Transactions") -------------------------------------------

    def _buffer(self, tx: Transaction, rec: list[Any]) -> None:
        """A write inside a transaction: its record is written past the
        published end of the stream (no reader looks there) and applied to the
        cache, nothing is published.  Once the records no longer fit, they are
        only applied: the transaction's end publishes a dump of the cache."""
        payload, decoded = self.codec.encode_record(rec)  # errors here change nothing
        end = self.pos
        if not tx.dump:
            back, needed = end - tx.start, end + _RECORD_HEADER + len(payload)
            if (needed <= self.limit() or reserve_more(self, needed)) and back < _MAX_BACK:
                stream = self._map.stream_words
                assert stream is not None
                self.pos = stream.write_record(end, self.gen & _GEN_MASK, payload, back << _UNIT_SHIFT)
                tx.last = end
            else:
                tx.dump = True
                self._tx_fast(None)  # nothing more goes into the stream
        try:
            R.apply(self.data, decoded)
        except BaseException:
            tx.broken = True  # the cache may hold part of the record: never publish it
            raise

    def begin_transaction(self) -> None:
        """Take the lock for the transaction (held until its end) and open it,
        or a level deeper in this thread's open one."""
        self.begin_write()  # lock, mutex, catch up, Unlinked
        try:
            self.lock.acquire()  # (reentrant: the transaction's own hold)
            if self.tx is None:
                self.tx = Transaction(self.pos)
                self._arm_fast_writes()
            else:
                self.tx.depth += 1
        finally:
            self.end_write()

    def _arm_fast_writes(self) -> None:
        """Let ``SharedDict.__setitem__`` (compiled) write this thread's
        root-level scalar sets of the open transaction itself, as ``_set_root``
        would: the tag, LIMIT and the stream stay as they are while the lock is
        held and no dump is due.  Disarmed once a record no longer fits (the
        transaction then ends with a dump) and at its end."""
        stream = self._map.stream_words
        if self.write_simple is not None and stream is not None:
            self._tx_fast(
                stream, self.gen & _GEN_MASK, self.limit(), self.blob_threshold, _W_BLOB_NEXT, _OP_SET
            )

    def end_transaction(self, publish: bool) -> None:
        """Leave a level; at the outermost, publish every buffered write at once
        or none (see ``Engine.end_transaction``), then give the lock back."""
        tx = self.tx
        if tx is None:
            raise RuntimeError(f"no transaction of shared dict {shown(self.name)!r} is open")
        try:
            with self.mutex:
                if tx.depth:
                    tx.depth -= 1
                    tx.doomed = tx.doomed or not publish
                    return
                self.tx = None
                self._tx_fast(None)
                if not publish or tx.doomed or tx.broken:
                    self._discard(tx)
                    if publish:
                        raise TransactionAborted(
                            f"a transaction of shared dict {shown(self.name)!r} published nothing: "
                            + (
                                "a nested transaction() block of it ended with an exception"
                                if tx.doomed
                                else "a write inside it failed after changing the cache"
                            )
                        )
                    return
                before = self._map.words[_W_STATE]
                try:
                    self._publish_transaction(tx)
                except BaseException:
                    if self._map.words[_W_STATE] == before:
                        self._discard(tx)
                    else:  # (published, then interrupted: its blobs are referenced; the cache reloads)
                        self.gen = self.seen = INVALID
                    raise
                if tx.dropped and self.durable is not None and not tx.dump:
                    self._drop_in_files(tx.dropped)
                state = self.seen  # (under the lock: another thread's block may begin once it is free)
        finally:
            self.lock.release()
        if self.durable is not None:
            self.durable.after_write(state)  # (outside the lock: group commit)

    def _publish_transaction(self, tx: Transaction) -> None:
        """The one publish of a transaction: its records (one STATE store), or a
        dump of the cache when they did not fit; then the blobs it dropped."""
        if self._map.words[_W_STATUS] & _UNLINKED:
            raise Unlinked(
                f"shared dict {shown(self.name)!r} was unlinked; the transaction published nothing"
            )
        if faults.armed is not None:
            faults.hit("transaction-written")
        if tx.dump:
            self._write_dump()
        elif self.pos != tx.start:
            stream_mv = self._map.stream_mv
            assert stream_mv is not None
            compiled = self._tx_last  # (the compiled path's last record, if it wrote in this block)
            mark_last(stream_mv, max(tx.last, compiled) if compiled >= tx.start else tx.last, self.pos)
            state = (self.gen << _GEN_SHIFT) | self.pos
            if self._map.atomic.publish(_W_STATE, state, _W_CHANGE_WAITERS):  # after every record
                self._wake_changes()
            self.seen = state
        if faults.armed is not None:
            faults.hit("transaction-published")
        if tx.dropped and self.durable is None:
            unlink_blobs(self.name, tx.dropped)  # d, for the whole transaction

    def _discard(self, tx: Transaction) -> None:
        """Nothing of ``tx`` was published: drop its blobs, zero its records in
        files (``unwrite``) and reload the cache (it holds them) on the next access."""
        if tx.created and not self._map.words[_W_STATUS] & _UNLINKED:  # (removed: its files went with it)
            unlink_blobs(self.name, tx.created)
        if self.durable is not None and self._map.words[_W_STATE] == self.gen << _GEN_SHIFT | tx.start:
            unwrite(self._map.stream_mv, tx.start, self.pos)  # (none of them published: checked)
        self.gen = self.seen = INVALID

    def _wake_changes(self) -> None:
        """After a publish that saw CHANGE_WAITERS != 0 (layout: "Waiting and waking")."""
        atomic = self._map.atomic
        if not wake(atomic, L.W_CHANGE_SEQ, _WAKE_ALL):
            self.waits.woke_nobody(atomic)

    def force_dump(self, planned: Optional[Planned] = None) -> None:
        """Write a full dump now (restarting the stream), under the lock; in a
        transaction, its end publishes one (``planned``: a recovery's, ``StreamMerge``)."""
        self.begin_write()
        try:
            if self.tx is not None and planned is None:
                self.tx.dump = True
                self._tx_fast(None)
                return
            self._write_dump(None, planned)
        finally:
            self.end_write()

    def _write_dump(self, packed: Optional[bytes] = None, planned: Optional[Planned] = None) -> None:
        """Writer step 4: snapshot the cache (packed: by the caller) into generation gen+1 and publish it.

        The dump (``dumps.plan``) merges the changes into the last table when
        the cache is one read in place, else packs the cache whole: a table
        when the root keys have table hashes.  A table of ``PARTIAL_FROM``
        entries or more then becomes this writer's cache, read in place."""
        if self.durable is not None:
            self.durable.refuse_if_failed()
        planned = plan(self.data, self.codec, packed) if planned is None else planned
        size = planned.size
        if self.dump_limit and size > self.dump_limit:
            raise OutOfSpace(
                f"shared dict {shown(self.name)!r}: a full dump would take {size} "
                f"bytes, over the dict's dump size limit of {self.dump_limit}"
            )
        gen = self.gen + 1 if self.gen < L.GEN_MASK else 1
        atomic = self._map.atomic
        atomic.store(L.W_REG_HIGH, gen)  # 4a
        if faults.armed is not None:
            faults.hit("dump-registered")
        dname = L.dump_name(self.name, gen)
        try:
            seg = segments.Segment.create(dname, size)  # 4b
        except FileExistsError:
            segments.unlink(dname)  # unpublished leftover of a writer that died
            seg = segments.Segment.create(dname, size)
        try:
            assert seg.buf is not None
            if faults.armed is not None:
                faults.hit("dump-created")
            with memoryview(seg.buf) as mv:
                planned.write(mv, gen, self.token)  # header last
            segments.finish(seg)  # (in files: synced and named: a checkpoint; _disk/layout.py)
            cache = self._read_in_place(seg, dname, planned)
        except BaseException:
            seg.close()
            try:  # (in files, the directory synced: once named, a recovery would take it over
                segments.discard_unpublished(dname)  # the records this generation goes on to acknowledge)
            except OSError:
                if self.durable is not None:
                    self.durable.mark_failed()  # (it may stay on the disk: nothing acknowledged after)
                raise
            raise
        if faults.armed is not None:
            faults.hit("dump-written")
        if self.grows:
            grow_stream(self, size)
        state = gen << L.GEN_SHIFT
        if atomic.publish(L.W_STATE, state, _W_CHANGE_WAITERS):  # 4c: publishes the dump, restarts the stream
            self._wake_changes()
        if faults.armed is not None:
            faults.hit("dump-published")
        self.gen, self.pos, self.seen = gen, 0, state
        if self.durable is not None:
            self.durable.checkpointed(state, size)  # (the dump is on the disk)
        if cache is not None:
            self.data = cache  # (equal to the cache it replaces, which the dump holds)
        low = atomic.load(L.W_REG_LOW)  # 4d
        for old in range(max(low, gen - L.MAX_RECLAIM), gen):
            segments.unlink(L.dump_name(self.name, old))
        atomic.store(L.W_REG_LOW, gen)
        if atomic.load(L.W_STATUS) & L.STATUS_UNLINKED:
            segments.unlink(dname)  # unlinked while we were dumping: do not leak ours
        elif self._map.words[_W_BLOB_NEXT] > self._map.words[L.W_BLOB_LOW]:
            sweep_blobs(self.name, self.data, self._map)

    def _read_in_place(self, seg: segments.Segment, dname: str, planned: Planned) -> Any:
        """The cache a table dump just written makes, read in place (``seg``
        then stays mapped by it); else (``seg`` closed) a ``dict`` -- the
        cache decoded whole, as a reader decodes a dump smaller than
        ``PARTIAL_FROM`` entries -- or None: the cache stays.  Made before the
        dump is published: a failure here publishes nothing."""
        if planned.count is None or planned.count < tablecache.partial_from() or not self._partial:
            seg.close()
            data: Any = self.data
            return data.full() if type(data) is tablecache.TableCache else None
        whole = memoryview(seg.buf)  # type: ignore[arg-type]
        table = None
        try:
            table = Table(whole, self.token, f"dump {shown_file(dname)!r}")
            return successor(self.data, table, (seg, whole), self.mutex, self.codec.loads, self.max_decoded)
        except BaseException:
            if table is not None:
                table.close()
            whole.release()
            raise

    def _dropped(self, rec: list[Any]) -> list[BlobRef]:
        """The blobs this record removes from the tree (the values it replaces)."""
        try:
            node = self.node(tuple(rec[1]))
        except PathGone:
            return []
        return dropped_blobs(node, rec)
