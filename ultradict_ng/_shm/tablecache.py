"""A process's cache of a big dict, read in place from its table dump.

Why: a reader that decodes a whole dump into a private ``dict`` pays, at a
million keys, a second or more to open the dict and hundreds of MiB of its own
memory -- per process.  A dump is a table (layout: "Dump"), which
answers a lookup with a hash, a probe and one entry's decoding, so a reader
need not decode what it never touches.  :class:`TableCache` is that reader's
cache of the root: the mapped table (the dump's entries, shared by every
process that maps it) and the changes the stream made since, plus the values
this process decoded.  Its private memory grows with the keys a process
touches, not with the size of the dict.

State (layout: "Reader", step 2, a table at or above ``PARTIAL_FROM`` entries):

* ``table`` -- the dump's entries, never changed (None once a ``clear``
  record emptied the dict: its entries no longer count);
* ``dead`` -- keys of table entries deleted since the dump (their entries
  no longer count, also when the key was set again: it moved to the end);
* ``fresh`` -- keys present now that no counted entry holds, in insertion
  order (set after the dump, or deleted and set again), marked None; and,
  marked True, keys set and not placed yet (below);
* ``hot`` -- the current value of every ``fresh`` key and of the counted
  table keys this process read or a record overwrote;
* ``changed`` -- the counted table keys whose value in ``hot`` may not be
  the table's: a record overwrote it, or the serializer decoded it (a value
  other than a scalar or a tuple of them, which a nested record may change
  in place).

* ``pending`` -- the keys marked True in ``fresh``, in the order they were
  set: the compiled set (``TableCacheBase``) of a str or int key not in
  ``hot`` stores its value and leaves the probe of the table for later.  A
  key deleted since may stay listed, unmarked (``resolve`` skips it), and
  listed again once set again.

A key is present iff it is in ``fresh`` or a counted entry (an entry of the
table whose key is not ``dead``) holds it.  Order is ``dict``'s: the counted
entries in the table's order (an overwrite keeps its place), then ``fresh``.
``len`` is the count of counted entries plus ``len(fresh)``: O(1) once the
pending keys are placed.

Why keys wait to be placed: whether the table holds a key is, at a million
keys, two cache misses in a row (its slot in the index, then its entry, each
on a page of its own), about a sixth of a random overwrite by the process
that loaded the dict -- and the write needs neither: its value goes to
``hot`` either way, where reads find it.  Only what depends on the count and
the order does: ``len``, iteration, a dump.  Those place the pending keys
first (:meth:`_settle`), in one compiled call that keeps the probes of
several keys under way at once: a few times cheaper a key than probing each
at its write (tablecache.c).  A pending key that the table holds leaves
``fresh`` for ``changed``; the others stay in ``fresh``, where their set
put them in the order.  A process that counts between its writes (a
bounded cache asks ``len`` at each set) would place its keys one at a time,
each with a batch's overhead: so a set that comes within 16 sets of the
last count (``_since``) probes and places its key at once, and only a run
of sets with no count between waits.  A delete places its own key only
(placing them all would count as a count: in a stream of sets and deletes,
most sets would probe their key at once).

What reads cost: a hit in ``hot`` is a dict lookup; a miss probes the table
and decodes one entry, which stays in ``hot`` -- unless the process bounds
them (``limit``: ``SharedDict(max_decoded=N)``): past ``N`` decoded rows the
older half of them is dropped (:meth:`TableCache.evict`), and 0 keeps none.
Why a bound: a row of a few fields is ~200 bytes as Python objects, so a
reader that touches 100,000 keys of a big dict holds ~20 MiB of them (eight
such readers more than the dict's shared memory), and storing each one
makes a first read at a million keys ~1.4x slower than decoding alone; the
bound trades hot reads (a hit only for the rows still kept) for memory and
first reads.  Iteration decodes the whole table for the walk (its values are
not kept).  Mutations apply the stream's records (``records.apply``,
through the mapping methods below), a writer's own too: its next dump
merges ``dead``, ``changed`` and ``fresh`` into a new table
(``_shm/dumps.py``), which becomes its cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from itertools import filterfalse, islice
from typing import Any, Callable, Optional

from ..errors import CorruptSegment, UnsupportedType
from ..speedups import TableCacheBase, table_get, unpack_simple
from .table import Table

__all__ = ["TableCache", "PARTIAL_FROM", "partial_from"]

#: A table dump of at least this many entries is read in place; a smaller one
#: is decoded whole into a ``dict``, which costs at most a few milliseconds
#: (~1 us an entry) and keeps repeated iteration of small dicts at replica
#: speed.  Above it a dict opens in the same time at any size.
#: ``ULTRADICT_NG_PARTIAL_FROM`` sets it per process (CI runs the suites once
#: more with 0: every table dump read in place).
PARTIAL_FROM = 4096


def partial_from() -> int:
    """The threshold in force: the environment's, else :data:`PARTIAL_FROM`."""
    value = os.environ.get("ULTRADICT_NG_PARTIAL_FROM")
    return PARTIAL_FROM if not value else int(value)


_MISSING: Any = object()


def _declined(data: Any, default: Any) -> Any:
    return default


class TableCache(TableCacheBase):
    """The root of a dict as a mapped table plus what changed since (module
    docstring).  Records are applied under the reader's cache ``mutex``, as to
    a ``dict`` cache; a read that misses ``hot`` probes and fills it under that
    mutex too, so that a record applied by another thread meanwhile (a delete)
    cannot be undone by the value it read before.  A hit takes no lock."""

    __slots__ = ("table", "_loads", "_simple", "_keep", "_mutex")  # (+ TableCacheBase's)

    def __init__(
        self,
        table: Table,
        loads: Callable[[Any], Any],
        keep: Any,
        mutex: Any,
        msgpack_values: bool = True,
        limit: Optional[int] = None,
    ) -> None:
        self.table: Optional[Table] = table
        self.hot: dict[Any, Any] = {}
        self.dead: set[Any] = set()
        self.fresh: dict[Any, Optional[bool]] = {}
        self.changed: set[Any] = set()
        self.pending: list[Any] = []
        self._since = 0
        self._loads = loads
        # The msgpack serializer's values (every table dump's): a scalar or a
        # tuple of scalars decodes in one compiled call, the codec's own first step.
        self._simple: Callable[[Any, Any], Any] = unpack_simple if msgpack_values else _declined
        self._keep = keep  # the segment and view the table lives in: mapped while we are
        self._mutex = mutex  # the reader's (reentrant: records' nested paths read through us)
        # The most clean rows ``hot`` keeps (None: all): the values decoded
        # from the table and not changed since, which the table holds too,
        # so that dropping one loses nothing.
        self._limit = limit
        # What the compiled read path (readpath.c, table_miss) probes and decodes
        # a str key's row from, and the compiled set (TableCacheBase) probes a
        # key with, without this class's frames; None when they may not
        # (another serializer; the table no longer counted).  It reads our
        # state where it lies, in the compiled base (tablecache.c).
        # While ``fresh`` and ``changed`` are empty, every value in ``hot`` is
        # a row the decoder made, which its hits hand out without a look at
        # the row's items (at a million keys, each one a likely cache miss).
        self._probe: Optional[tuple[Any, int, int, int]] = (
            (table.buf, table.slots, table.start, table.end) if msgpack_values else None
        )

    # -- reading ---------------------------------------------------------------------

    def _decode(self, key: Any) -> Any:
        """``key``'s value after a miss in ``hot``: from ``hot`` again (filled
        meanwhile), else its counted entry's, decoded and kept; or ``_MISSING``.
        Under the mutex: the check of ``dead``, the probe and the store in
        ``hot`` are one step against records."""
        with self._mutex:
            value = self.hot.get(key, _MISSING)
            if value is not _MISSING:
                return value
            table = self.table
            if table is None or key in self.dead:
                return _MISSING
            limit = self._limit
            if limit and self.clean_rows() >= limit:
                self.evict()
            if type(key) is str:  # (Table.lookup's first case, without its frame)
                try:
                    vb = table_get(table.buf, table.slots, table.start, table.end, key)
                except ValueError as exc:
                    raise CorruptSegment(f"{table.where}: {exc}") from None
            else:
                vb = self._lookup(table, key)
            if vb is None:
                return _MISSING
            value = self._simple(vb, _MISSING)  # (a row: no codec frame)
            if value is _MISSING:
                value = self._loads(vb)
                self.changed.add(key)  # (a nested record may change it in place)
            elif limit == 0:
                return value  # (no row kept)
            self.hot[key] = value
            return value

    def _settle(self) -> None:
        """Place the pending keys (module docstring), under the mutex as a
        record's change: what follows may read the count and the order.
        With none, ``resolve`` only notes the count: the compiled set places
        the keys of the next few sets at once, as counts come between sets."""
        if self.pending:
            with self._mutex:
                self.resolve()
        else:
            self.resolve()

    def clean_rows(self) -> int:
        """How many values in ``hot`` are clean rows: neither ``fresh`` nor
        ``changed`` (disjoint sets, both kept whole in ``hot``; a pending key
        is in ``fresh``)."""
        return len(self.hot) - len(self.fresh) - len(self.changed)

    def evict(self) -> None:
        """Drop the older clean rows from ``hot``, so that at most half of
        ``_limit`` stay: O(len(hot)) once per ``_limit / 2`` reads that miss,
        against an LRU's bookkeeping on every hit (the hit path stays one
        dict lookup).  Oldest first, in ``hot``'s insertion order: a key read
        again since it was decoded is not moved, so a hot key can be dropped
        and decoded again -- FIFO, which for keys read at random keeps as many
        hits as LRU does.  Under the mutex: records (which make rows changed)
        wait; the compiled read path, which adds only clean rows and takes no
        mutex, may add some meanwhile, so ``hot`` is walked as a copy of its
        keys."""
        with self._mutex:
            limit = self._limit
            if limit is None:
                return
            excess = self.clean_rows() - limit // 2
            if excess <= 0:
                return
            hot, fresh, changed = self.hot, self.fresh, self.changed
            keys: Iterator[Any] = iter(list(hot))  # (one C call: no thread runs meanwhile)
            if fresh or changed:
                keys = filterfalse(changed.union(fresh).__contains__, keys)
            pop = hot.pop
            for k in islice(keys, excess):
                pop(k, None)

    def _counted(self, key: Any) -> bool:
        """Whether a counted table entry holds ``key`` (its value not decoded).
        A str or int key -- every write of a new key asks -- is probed by its
        encoding in compiled code (``Table.locate``: an offset, no value
        copied), other keys by ``Table.lookup``."""
        with self._mutex:
            table = self.table
            if table is None or key in self.dead:
                return False
            t = type(key)
            if t is str or t is int:
                return table.locate(key, self._loads) != 0
            return self._lookup(table, key) is not None

    def _lookup(self, table: Table, key: Any) -> Any:
        """``table.lookup``, a key of a type no dict of ours holds being absent
        (as in a ``dict``: the table's hash refuses it; an unhashable key has
        raised TypeError at ``hot`` already)."""
        try:
            return table.lookup(key, self._loads)
        except UnsupportedType:
            return None

    def __getitem__(self, key: Any) -> Any:
        value = self.hot.get(key, _MISSING)
        if value is _MISSING:
            value = self._decode(key)
            if value is _MISSING:
                raise KeyError(key)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        value = self.hot.get(key, _MISSING)
        if value is _MISSING:
            value = self._decode(key)
            if value is _MISSING:
                return default
        return value

    def __contains__(self, key: Any) -> bool:
        return key in self.hot or self._counted(key)

    def __len__(self) -> int:
        self._settle()
        table = self.table
        return (table.count - len(self.dead) if table is not None else 0) + len(self.fresh)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Every ``(key, value)`` in order (:meth:`pairs`)."""
        return iter(self.pairs()[0])

    def pairs(self) -> tuple[list[tuple[Any, Any]], int]:
        """Every ``(key, value)`` in order, as a list, and how many leading pairs
        are table rows decoded by the compiled walk and not changed since
        (scalars or tuples of them: a snapshot hands them out unchecked).  The
        table's rows are walked with the deleted keys left out and the changed
        values taken from ``hot``, then the fresh keys follow: a list, no dict
        (nothing of it is kept: the walk's callers hold the list)."""
        self._settle()
        table, hot = self.table, self.hot
        out: list[tuple[Any, Any]] = []
        known = 0
        if table is not None:
            # (hot's values once one changed: its clean rows equal their entries, its fresh keys are
            # no entry's, dead is checked first; no dict of the changed keys is made, 0.5 s after a
            # million overwrites replayed, and no value hot holds is decoded again)
            subst = hot if self.changed else None
            out, known = table.decode_pairs(self._loads, self._simple is unpack_simple, self.dead, subst)
        if self.fresh:
            out.extend([(k, hot[k]) for k in self.fresh])
        return out, known

    def __iter__(self) -> Iterator[Any]:
        for k, _ in self.items():
            yield k

    def __reversed__(self) -> Iterator[Any]:
        """Keys newest first (what ``popitem`` takes): the fresh ones, then the
        counted entries' from the table's end.  The entries are walked from
        the start to find their offsets (they differ in size), so reaching
        the table costs a pass over its entry headers and a key decode per
        entry yielded -- never a value decode."""
        self._settle()
        yield from reversed(list(self.fresh))
        table = self.table
        if table is None:
            return
        for off in reversed(list(table.offsets())):
            key = self._loads(table.entry(off)[1])
            if key not in self.dead:
                yield key

    def keys(self) -> list[Any]:
        return list(self)

    def values(self) -> list[Any]:
        return [v for _, v in self.items()]

    def full(self) -> dict[Any, Any]:
        """The whole dict, decoded: what this cache becomes for a writer, and
        what ``copy()`` hands out.  :meth:`pairs`'s walk into a ``dict``
        (no list of a million pairs made first and dropped), every value
        ``hot`` holds taken from it instead of decoded again: after a stream
        of a million overwrites replayed, a copy took 1.5 s, now 0.7 s."""
        self._settle()
        table, hot = self.table, self.hot
        out: dict[Any, Any] = {}
        if table is not None:
            rows = self._simple is unpack_simple
            out = table.decode_all(self._loads, rows, self.dead, hot if hot else None)
        for k in self.fresh:
            out[k] = hot[k]
        return out

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TableCache):
            other = other.full()
        return self.full() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<TableCache of {len(self)} keys, {len(self.hot)} decoded>"

    @property
    def limit(self) -> Optional[int]:
        """The most clean rows kept decoded (None: no bound)."""
        return self._limit

    # -- what records do (records.apply: the root's set, delete, clear, update) ------------
    # ``cache[key] = value`` and ``del cache[key]`` are TableCacheBase's: a str
    # or int key is set or deleted in compiled code (speedups: the same rule,
    # without these frames: a writer's every root write at a million keys, a
    # replayed stream's every set and delete), the rest comes here.

    def _setitem(self, key: Any, value: Any) -> None:
        hot = self.hot
        counted = key in hot or self._counted(key)  # (fresh keys are in hot: order kept either way)
        if counted:
            hot[key] = value
            if key not in self.fresh:
                self.changed.add(key)
            return
        self.fresh[key] = None
        hot[key] = value

    def _delitem(self, key: Any) -> None:
        mark = self.fresh.get(key, _MISSING)
        if mark is True:  # (set, not placed yet: placed now, alone; it stays listed in pending, unmarked)
            if self._counted(key):
                self.dead.add(key)
            del self.fresh[key]
            del self.hot[key]
        elif mark is not _MISSING:
            del self.fresh[key]
            del self.hot[key]
        elif key in self.hot or self._counted(key):
            self.dead.add(key)
            self.hot.pop(key, None)
            self.changed.discard(key)
        else:
            raise KeyError(key)

    def clear(self) -> None:
        self._probe = None
        self.table = None
        self.hot.clear()
        self.dead.clear()
        self.fresh.clear()
        self.changed.clear()
        self.pending = []

    def update(self, pairs: Any) -> None:
        """``[[key, value], ...]`` assigned in order (an update record's pairs)."""
        for k, v in pairs:
            self[k] = v
