"""Transactions on Redis (layout: "Transactions"): the block's records are
buffered in the client and published by one ``WRITE`` as one log entry.

Why one entry, not one ``WRITE`` per record inside ``MULTI``: a reader, a
listener or a feed consumes the log entry by entry (``XREAD COUNT``, ``SYNC``
ranges); an entry is the unit they apply, so a block that is one entry can
never be seen half-applied, whatever a reader's batch boundaries.  The entry's
value is a *bundle* -- byte 0xC1 (never the first byte of a record: msgpack
reserves it, a pickle starts with PROTO 0x80) and then the block's records as
one msgpack array of ``bin`` -- or, for a block of one record, that record.

The lease makes the block exclusive: ``begin`` takes the lock (which syncs
the cache), the block's writes are applied to the cache and buffered, and
``end`` sends one ``WRITE`` carrying the fencing token and ``expect`` = the
sequence number the block started from.  If the lease lapsed meanwhile the
server answers ``FENCED`` and nothing of the block is published
(``LeaseLost``); a client that dies never sends it.
"""

from __future__ import annotations

from threading import get_ident
from typing import TYPE_CHECKING, Any

import msgpack

from .._codec import records as R
from .._engine import check_open
from ..errors import CorruptSegment, LeaseLost, OutOfSpace, TransactionAborted
from . import layout as RL
from .state import EngineState

if TYPE_CHECKING:
    from .._codec.codec import Codec

__all__ = ["RedisTransaction", "begin", "end", "buffer", "entry_records"]

BUNDLE = b"\xc1"
#: Redis refuses a bulk string over ``proto-max-bulk-len`` (512 MiB by default).
MAX_BUNDLE = 512 << 20


class RedisTransaction:
    """An open ``transaction()`` of one handle: what its end publishes."""

    __slots__ = ("start", "thread", "depth", "doomed", "broken", "payloads", "size")

    def __init__(self, start: int) -> None:
        #: The sequence number the cache reflected when it began (the WRITE's ``expect``).
        self.start = start
        #: The thread that holds the lease for it; only its writes are buffered.
        self.thread = get_ident()
        self.depth = 0
        #: A nested level ended with an exception: its end publishes nothing.
        self.doomed = False
        #: The cache may lack one of its writes: its end publishes nothing.
        self.broken = False
        #: The block's encoded records, in order, and their size.
        self.payloads: list[bytes] = []
        self.size = 0


def bundle(payloads: list[bytes]) -> bytes:
    """The log entry value of a block (module docstring)."""
    if len(payloads) == 1:
        return payloads[0]
    packed: bytes = msgpack.packb(payloads, use_bin_type=True)
    return BUNDLE + packed


def _unbundle(value: bytes) -> list[bytes]:
    try:
        payloads = msgpack.unpackb(value[1:], raw=False)
    except Exception as exc:
        raise CorruptSegment(f"a transaction's log entry on Redis cannot be read: {exc}") from None
    if type(payloads) is not list or not all(type(p) is bytes for p in payloads):
        raise CorruptSegment("a transaction's log entry on Redis is not a list of records")
    return payloads


def entry_records(codec: Codec, values: list[bytes]) -> list[Any]:
    """The decoded records of log entries, in order (a bundle gives its records)."""
    if not any(v[:1] == BUNDLE for v in values):
        return codec.loads_many(values)
    flat: list[bytes] = []
    for v in values:
        if v[:1] == BUNDLE:
            flat.extend(_unbundle(v))
        else:
            flat.append(v)
    return codec.loads_many(flat)


def begin(engine: EngineState) -> None:
    """Take the lease (reentrant; it brings the cache up to date) and open the
    transaction, or a level deeper in this thread's open one."""
    check_open(engine.words)
    engine.lock.acquire()
    try:
        with engine.mutex:
            tx = engine.tx
            if tx is None:
                if engine.stale or engine.known < 0:
                    engine.sync_remote()
                engine.tx = RedisTransaction(engine.known)
            else:
                tx.depth += 1
    except BaseException:
        engine.lock.release()
        raise


def buffer(engine: EngineState, tx: RedisTransaction, rec: list[Any]) -> None:
    """A write of the transaction's thread: applied to the cache, kept for the end.
    A record that cannot be encoded raises and changes nothing."""
    payload, decoded = engine.codec.encode_record(rec)
    try:
        R.apply(engine.data, decoded)
    except BaseException:
        tx.broken = True
        raise
    tx.payloads.append(payload)
    tx.size += len(payload)


def end(engine: EngineState, publish: bool) -> None:
    """Leave one level; at the outermost publish the block (one ``WRITE``) or
    discard it, then give the lease back."""
    tx = engine.tx
    if tx is None or tx.thread != get_ident():
        raise RuntimeError(f"no transaction of shared dict {engine.name!r} is open in this thread")
    with engine.mutex:
        if tx.depth:
            tx.depth -= 1
            tx.doomed = tx.doomed or not publish
            engine.lock.release()
            return
        engine.tx = None
    failed = True
    try:
        if not publish or tx.doomed or tx.broken:
            _discard(engine)
            if publish:
                raise TransactionAborted(
                    f"a transaction of shared dict {engine.name!r} published nothing: "
                    + (
                        "a nested transaction() ended with an exception"
                        if tx.doomed
                        else "a write inside it failed half-way"
                    )
                )
        elif tx.payloads:
            _publish(engine, tx)
        failed = False
    finally:
        try:
            engine.lock.release()
        except LeaseLost:
            if not failed:
                raise  # published, then the lease lapsed: the caller must know
            # (already raising: the block published nothing)


def _discard(engine: EngineState) -> None:
    """The cache holds writes nobody else will see: reload it at the next read."""
    with engine.mutex:
        engine.known = -1
        engine.stale = True
        engine.seen = -1
        engine.data = {}


def _largest_value(engine: EngineState) -> int:
    """The server's ``proto-max-bulk-len`` (a larger value makes it drop the
    connection); 512 MiB where ``CONFIG`` is not allowed."""
    try:
        reply = engine.link.command("CONFIG", "GET", "proto-max-bulk-len")
        return int(reply[1])
    except Exception:
        return MAX_BUNDLE


def _publish(engine: EngineState, tx: RedisTransaction) -> None:
    value = bundle(tx.payloads)
    if len(value) > 1 << 20:  # (asked only for large blocks: one more round trip)
        largest = _largest_value(engine) - 4096  # (the other arguments of the call)
        if len(value) > largest:
            _discard(engine)
            raise OutOfSpace(
                f"a transaction of shared dict {engine.name!r} is {len(value)} bytes encoded; "
                f"the Redis server takes at most {largest} in one call (proto-max-bulk-len): "
                "nothing was published"
            )
    lock = engine.lock
    with engine.mutex:
        token = lock.token_of_this_thread()
        try:
            reply = engine.link.call("write", [engine.epoch, tx.start, token, value, engine.minlog])
        except BaseException:
            # The reply is lost: the whole block landed or none of it; reload either way.
            _discard(engine)
            raise
        if type(reply) is int:
            seq = reply >> 1
            if engine.known == tx.start and not engine.stale and seq == tx.start + 1:
                engine.known = seq  # the cache already holds the block's writes
            else:
                _discard(engine)
            if reply & 1:
                engine._snapshot_quietly()
            return
        _discard(engine)
        code = reply[0]
        if code == RL.GONE:
            engine.raise_gone()
        if code == RL.FENCED:
            lock.fenced()
            raise LeaseLost(
                f"the lease on the lock of shared dict {engine.name!r} expired inside a transaction; "
                "the server refused its publish: nothing of the block was published"
            )
        if code == RL.CONFLICT:
            raise TransactionAborted(
                f"a transaction of shared dict {engine.name!r} published nothing: another client "
                "published while it held the lease"
            )
        raise CorruptSegment(f"unexpected WRITE answer {reply!r} for {engine.keys.meta}")
