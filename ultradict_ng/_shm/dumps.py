"""What a dump's segment holds, planned before the segment is made (writer step 4b).

Why apart from the writer: a dump takes one of three forms (layout: "Dump"),
and for a big dict the one that matters is the *merge*: the writer's cache
of a big dict is a :class:`~._shm.tablecache.TableCache` (the last dump's
table, mapped, plus what changed since), and its next dump is that table
with the changes merged in -- unchanged entries copied as bytes, only the
changed and new ones encoded (``table_layout``: "Merge").  That keeps a
writer's work and memory O(the keys it touched), never a decode and an
encode of the whole dict.  The other two forms pack a ``dict``
cache whole: a table when its keys have table hashes, else the payload form.

:func:`plan` decides and sizes; :meth:`Planned.write` fills the segment the
writer made of that size.  Neither publishes anything.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Callable, Optional, Union

from .._codec.codec import MsgpackCodec
from .._codec.records import SCALAR_TYPES
from ..errors import CorruptSegment
from ..speedups import table_changes
from . import layout as L
from .table import Merge, StreamMerge, Table, hash_key, map_size, root_hashes, write_map
from .tablecache import TableCache

__all__ = ["Planned", "plan", "successor", "MERGE_FRACTION"]

#: A dump merges while the keys changed since the table (deleted, overwritten,
#: new) are at most this fraction of its entries; past it the cache is
#: decoded whole and packed, which is then cheaper.  A merge costs a probe
#: and an encode per changed key (one compiled call for a lookup table's
#: str and int keys and scalar rows, ``table_changes``) plus a copy of the
#: rest and a new index; a repack the compiled row walk, one pack and the
#: compiled split of every entry.  Measured (2 cores, ``"%d"`` values), merge
#: against repack: 100k keys with 12.5% / 25% / 50% / 100% of them changed,
#: 18 / 35 / 69 / 104 ms against 54 / 86 / 93 / 90 ms; 1M keys with 12.5% /
#: 25% / 50%, 0.34 / 0.59 / 0.97 s against 0.84 / 1.23 / 1.37 s.
#: (Tests set 1.0: every dump that can merge does.)
MERGE_FRACTION = 1 / 2

_dump_header = struct.Struct(L.DUMP_FORMAT)
_MSGPACK_ID = MsgpackCodec.id


class Planned:
    """A dump about to be written: its ``size`` in bytes and ``count`` of
    root entries (None: the payload form, which is never read in place)."""

    __slots__ = ("size", "count", "_merge", "_payload", "_hashes")

    def __init__(
        self,
        size: int,
        count: Optional[int],
        merge: Optional[Union[Merge, StreamMerge]],
        payload: Optional[bytes],
        hashes: Optional[list[int]],
    ) -> None:
        self.size, self.count = size, count
        self._merge, self._payload, self._hashes = merge, payload, hashes

    def write(self, buf: memoryview, gen: int, token: int) -> None:
        """Fill ``buf`` (``size`` bytes), its header last."""
        if self._merge is not None:
            self._merge.write(buf, gen, token)
            return
        payload = self._payload
        assert payload is not None
        if self._hashes is None:
            buf[L.DUMP_HEADER : self.size] = payload
            buf[0 : L.DUMP_HEADER] = _dump_header.pack(
                L.DUMP_MAGIC, gen, len(payload), zlib.crc32(payload), 0
            )
        else:
            write_map(buf, payload, self._hashes, gen, token)


def plan(data: Any, codec: Any, packed: Optional[bytes] = None) -> Planned:
    """The dump of the writer's cache ``data``: a merge when it is a
    :class:`TableCache` whose table still counts and few of its keys changed
    (:data:`MERGE_FRACTION`), else ``data`` packed whole (``packed``: the
    caller's packing of it, when it has one).  A ``TableCache`` that no
    longer has a table (a ``clear`` emptied it) holds only what was set
    since, which is packed as a ``dict``."""
    if type(data) is TableCache:
        data._settle()  # (the merge reads dead, changed and fresh)
        table = data.table
        if (
            table is not None
            and codec.id == _MSGPACK_ID
            and len(data.dead) + len(data.changed) + len(data.fresh) <= MERGE_FRACTION * table.count
        ):
            merge = _merge(data, codec.dumps, codec.loads)
            return Planned(merge.size, merge.count, merge, None, None)
        data = data.full()
    payload = codec.dumps(data) if packed is None else packed
    hashes = root_hashes(data) if codec.id == _MSGPACK_ID else None  # (None: payload form)
    if hashes is None:
        return Planned(L.DUMP_HEADER + len(payload), None, None, payload, None)
    return Planned(map_size(payload, hashes), len(hashes), None, payload, hashes)


def _merge(cache: TableCache, dumps: Callable[[Any], bytes], loads: Callable[[Any], Any]) -> Merge:
    """The cache's table with its changes merged in (``table_layout``: "Merge"):
    the entries of ``dead`` keys removed, those of ``changed`` keys given their
    value in ``hot`` anew, ``fresh`` keys appended in order.  Only those keys
    are hashed, probed and encoded: O(changes since the table).  The str and
    int keys with scalar-row values -- a lookup table's -- are probed and
    encoded in one compiled call (``table_changes``); the rest here, one by
    one (at 1M keys, 65k changes: 0.1 s of Python)."""
    table, hot = cache.table, cache.hot
    assert table is not None

    def offset(key: Any) -> int:
        off = table.locate(key, loads)
        if not off:  # (dead and changed keys are the table's by the cache's invariant)
            raise CorruptSegment(f"{table.where}: key {key!r} of the cache has no entry to merge")
        return off

    changes, dead, changed = table_changes(
        table.buf, table.slots, table.start, table.end, cache.dead, cache.changed, hot
    )
    changes += [(offset(k), None) for k in dead]
    changes += [(offset(k), dumps(hot[k])) for k in changed]
    appended: list[tuple[int, bytes, bytes]] = [(hash_key(k), dumps(k), dumps(hot[k])) for k in cache.fresh]
    return Merge(table, changes, appended)


def _not_rows(hot: dict[Any, Any], keys: Any) -> list[Any]:
    """The ``keys`` whose value in ``hot`` is not a row -- a scalar or a tuple
    of scalars: immutable, handed out as it is.  One comprehension, no call
    per key: a checkpoint after a recovery may ask it of every key of the
    dict (a function call per key took 2 s of it at a million keys)."""
    scalars = SCALAR_TYPES
    return [
        k
        for k in keys
        if (t := type(v := hot[k])) not in scalars
        and (t is not tuple or not scalars.issuperset(map(type, v)))
    ]


def successor(
    old: Any, table: Table, keep: Any, mutex: Any, loads: Callable[[Any], Any], limit: Optional[int] = None
) -> TableCache:
    """The writer's cache after a table dump of ``PARTIAL_FROM`` entries or
    more: the new ``table`` read in place, as every reader reads it.  After a
    merge (``old`` a :class:`TableCache` of the table it was merged from)
    the values ``old`` decoded stay decoded: every one is the new table's
    value of its key.  Those that are not rows stay ``changed`` (a nested
    record may change them in place, and a read must export them), so the
    next merge encodes them again.  A ``dict`` cache is dropped: the values
    this process touches are decoded again, on demand, as a reader's.  The
    rows carried over are bounded as a reader's (``limit``: ``max_decoded``)."""
    new = TableCache(table, loads, keep, mutex, limit=limit)
    if type(old) is TableCache:
        old._settle()
        hot = old.hot
        new.hot.update(hot)
        new.changed.update(_not_rows(hot, (*old.changed, *old.fresh)))
        if limit is not None and new.clean_rows() > limit:
            new.evict()
    return new
