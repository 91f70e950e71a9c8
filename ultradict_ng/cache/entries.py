"""How a SharedCache changes its entries, under the dict's lock: slots, the
bytes count, eviction (sampled LRU, Django's cull), active expiry.

Kept apart from :mod:`.sharedcache` (the API) because this is the part the
protocol constrains (cache_layout: slots, write order against crashes): the
slot of a new key is taken *before* its entry is written and pushed back
*after* it is deleted, ``bytes`` grows before a write and shrinks after one,
so that a writer killed between the two steps leaks, never double-books.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Optional

from .._codec.codec import codec_for
from .._platform import directories, faults
from .._platform.owner import owner_alive
from ..errors import TooLarge
from ..shareddict import SharedDict
from ..speedups import types_within
from . import layout as C
from .side import Side

__all__ = ["Entries", "add_word", "plain_data", "slot_of"]

_U64 = (1 << 64) - 1
_W_FREE, _W_NEXT, _W_EVICTIONS, _W_EXPIRATIONS = C.W_FREE, C.W_NEXT, C.W_EVICTIONS, C.W_EXPIRATIONS
_W_BATCH = C.W_BATCH


# With the pickle serializer, values the codec gives back exactly are stored as
# themselves (cache/layout.py, "Entries"): reading one back is a copy of the
# decoded value, ~3x faster than unpickling it.  Exact types only (a str
# subclass such as Django's SafeString, an IntEnum, an OrderedDict are
# pickled), and never bytes at the top: a stored bytes is a pickle.
_PLAIN_LEAVES: frozenset[type] = frozenset({str, int, float, bool, type(None), bytes})
_PLAIN_TOP: frozenset[type] = frozenset({str, int, float, bool, type(None)})
_PLAIN_TREES: frozenset[type] = frozenset({dict, list, set, frozenset})  # (tuples inside only)
_CHECKED = codec_for("msgpack")
_INF = float("inf")  # (the codec of the cache's dict, as its size check's)


def plain_data(value: Any) -> bool:
    """Whether the codec gives ``value`` back exactly (equal, of the same
    types) and it is no bytes: what a pickling cache stores as itself."""
    tp = type(value)
    return tp in _PLAIN_TOP or (tp in _PLAIN_TREES and types_within(value, _PLAIN_LEAVES, 16))


def refuse_early(key: Any, stored: Any) -> None:
    """Encode a key and value no size check has encoded (a cache without
    ``maxbytes``) before making room for them evicts anything: one the codec
    refuses -- an unsupported type, a str holding a lone surrogate, which no
    type check sees -- must raise first.  Only when the cache is full: else
    nothing is evicted, and the write's own encoding refuses it."""
    for part in (key, stored):
        if type(part) is not bytes:
            _CHECKED.dumps(part)


def slot_of(e: Any, nslots: int) -> int:
    """The slot of the entry ``e``, or -1 if ``e`` is not an entry (cache_layout:
    a tuple of a number of seconds, a slot below nslots, then a value, or an
    owner and a token (ints)) -- what only another program can have written
    there; a writer that meets one deletes it (and frees nothing: it names no
    slot of ours)."""
    if (
        type(e) is tuple
        and 3 <= len(e) <= 4
        and type(e[1]) is int
        and isinstance(e[0], (int, float))
        and 0 <= e[1] < (nslots or 1)
        and (len(e) == 3 or (type(e[2]) is int and type(e[3]) is int))
    ):
        return e[1]
    return -1


def add_word(w: Any, index: int, delta: int) -> None:
    """``w[index] += delta``, kept within a u64: a damaged word must not fail a
    write (a counter wraps, bytes sticks at the end it went past)."""
    try:
        w[index] += delta
    except ValueError:
        w[index] = 0 if index != C.W_BYTES or delta < 0 else _U64


class Entries:
    """The entry-changing half of SharedCache (every method: under the lock)."""

    _d: SharedDict
    _side: Side
    _dget: Callable[..., Any]
    _recency: Any
    _maxsize: Optional[int]
    _maxbytes: Optional[int]
    _cull: Optional[int]
    _pool: Optional[list[Any]]
    _pool_age: int
    _size_codec: Any
    _lock: Any
    #: The store's ``before_side_change`` (shm/writer.py), bound once.
    _side_change: Callable[[], None]
    name: Any
    #: Inside this handle's set_many/delete_many (cache_layout, "Crashes").
    _in_batch = False

    def _size(self, key: Any, stored: Any) -> int:
        codec = self._size_codec
        if codec is None:
            return 0
        return len(codec.dumps(key)) + len(stored if type(stored) is bytes else codec.dumps(stored)) + 32

    def _put(
        self, key: Any, stored: Any, expires: float, now: float, claim: Optional[tuple[int, int]] = None
    ) -> None:
        """``key`` -> the entry (expires, slot, stored), or with ``claim`` the
        claim (expires, slot, owner, token): its old slot, or a new one after
        making room."""
        side = self._side
        w = side.words
        self._after_dead_batch()
        size = self._size(key, stored) if self._size_codec is not None else 0
        if self._maxbytes is not None and size > self._maxbytes:
            raise TooLarge(
                f"an entry of {size:,} bytes (key {key!r:.60}) cannot fit the cache's "
                f"maxbytes={self._maxbytes:,}"
            )
        if (expires or claim) and not w[C.W_FLAGS]:
            w[C.W_FLAGS] = C.FLAG_EXPIRING
        # The entry as the handle caches it, not a copy (only its slot is read):
        # the dict's get would copy a mutable value for nothing.
        old = self._d._node().get(key)
        if old is not None and slot_of(old, side.nslots) < 0:
            old = None  # not an entry: overwritten as a new key's
        # A size grows (in its cell and in bytes) before the write and shrinks
        # after it: a writer killed in between leaves both too high, never too
        # low -- a rebuild sums the cells.
        if old is not None:
            slot = old[1]
            if side.nslots:
                grown = size - side.sizes[slot]
                if grown > 0:
                    add_word(w, C.W_BYTES, grown)
                    side.sizes[slot] = size
                    self._fit_bytes(now, key, grown, (slot, size))
            self._d[key] = (expires, slot, stored) if claim is None else (expires, slot) + claim
            if side.nslots and grown < 0:
                add_word(w, C.W_BYTES, grown)
                side.sizes[slot] = size
        else:
            if self._size_codec is None and self._maxsize is not None and len(self._d) >= self._maxsize:
                refuse_early(key, stored)
            if w[C.W_FLAGS]:
                self._reap(now, key)
            self._make_room(now, key, size)
            slot = self._take_slot() if side.nslots else 0
            if faults.armed is not None:
                faults.hit("cache-slot-taken")
            if side.nslots:
                side.sizes[slot] = size
                if size:
                    add_word(w, C.W_BYTES, size)
            try:
                self._d[key] = (expires, slot, stored) if claim is None else (expires, slot) + claim
            except BaseException:
                if side.nslots and self._d._node().get(key, (0, -1))[1:2] != (slot,):
                    self._free(slot, size)  # not written (a value the codec refuses ...): not leaked
                raise
            self._pool_age += 1
        if side.nslots:
            side.recency[slot] = now

    def _delete(self, key: Any, e: Any) -> None:
        """Remove ``key`` (whose entry is ``e``, None if absent), then free its slot."""
        if e is None:
            return
        if self._after_dead_batch():
            e = self._d._node().get(key)  # (the rebuild may have removed it)
            if e is None:
                return
        del self._d[key]
        if faults.armed is not None:
            faults.hit("cache-entry-removed")
        slot = e[1] if type(e) is tuple and len(e) > 2 else -1
        if self._side.nslots and type(slot) is int and 0 <= slot < self._side.nslots:  # (else: not an entry)
            self._free(slot, self._side.sizes[slot])

    def _free(self, slot: int, size: int) -> None:
        """Give back ``slot`` and its ``size`` bytes (its entry is gone)."""
        side = self._side
        w = side.words
        w[C.W_BYTES] -= min(w[C.W_BYTES], size)
        side.sizes[slot] = 0
        free = w[_W_FREE]
        if free < side.nslots:
            side.free[free] = slot
            w[_W_FREE] = free + 1

    def _take_slot(self) -> int:
        side = self._side
        w = side.words
        free, nxt, nslots = w[_W_FREE], w[_W_NEXT], side.nslots
        if nxt > nslots or free + len(self._d._store.data) > nxt:  # (synced: under the lock)
            # More slots free and in use than were ever handed out: damaged words
            # (or entries sharing a slot) -- handing one out could double-book it.
            self._rebuild()
            free, nxt = w[_W_FREE], w[_W_NEXT]
        if free:
            w[_W_FREE] = free - 1
            slot = int(side.free[free - 1])
            if slot >= min(nxt, nslots):  # (a damaged cell: never handed out; recounted instead)
                self._rebuild()
                return self._take_slot()
            return slot
        if nxt < nslots:
            w[_W_NEXT] = nxt + 1
            return int(nxt)
        self._rebuild()  # slots leaked by crashes: recount from the entries
        if not w[_W_FREE] and w[_W_NEXT] >= nslots:
            raise RuntimeError(f"cache {directories.shown(self.name)!r}: no free slot after a rebuild")
        return self._take_slot()

    @contextmanager
    def _batch(self) -> Iterator[None]:
        """set_many's and delete_many's one transaction (cache_layout, "Crashes"):
        the side segment's ``batch`` word is set while it is open; if it ends
        without publishing, the side segment is rebuilt from the entries."""
        w = self._side.words
        with self._lock:
            self._after_dead_batch()
            w[_W_BATCH] = 1
            self._in_batch = True
            try:
                with self._d.transaction():
                    yield
            except BaseException:
                self._rebuild()  # (the transaction published nothing: the entries are the old ones)
                raise
            finally:
                self._in_batch = False
                w[_W_BATCH] = 0

    def _emptied(self) -> None:
        """Every entry removed (``clear``, an emptying cull): the dict cleared,
        then the side's slots and bytes -- marked a batch in between (unless
        in one already), so that a writer killed after the clear's publish
        leaves the side rebuilt by the next writer, not ``bytes`` counting
        every entry gone."""
        w = self._side.words
        own = not self._in_batch
        if own:
            w[_W_BATCH] = 1
        self._d.clear()
        w[_W_FREE] = 0  # (before NEXT: a death between the two leaks, never double-books)
        w[_W_NEXT] = 0
        w[C.W_BYTES] = 0
        if own:
            w[_W_BATCH] = 0
        self._pool = None

    def _after_dead_batch(self) -> bool:
        """If a writer died inside a batch (its flag is set, and it is not this
        handle's own), rebuild: slots of entries still there may be free.
        True if it did.  Every write checks this first, under the lock (and,
        kept in files, removes a pending ``clean`` before the side changes)."""
        w = self._side.words
        self._side_change()  # (a cache kept in files: _disk/layout.py, "Cache side file")
        if not w[_W_BATCH] or self._in_batch:
            return False
        self._rebuild()
        w[_W_BATCH] = 0
        return True

    def _rebuild(self) -> None:
        """The free stack, sizes and bytes from the entries (after crashes leaked
        slots); entries that are not entries, or share a slot, are removed.

        The stack is emptied first and ``next`` set past the last slot in use
        before the stack is rewritten: a writer killed midway leaves slots
        leaked, never one on the stack twice nor one both on the stack and
        past ``next``.  Costs O(entries + the highest slot in use), not
        O(nslots) (a cache bounded by bytes alone has 2**20 slots)."""
        side = self._side
        if not side.nslots:  # (nothing to recount: only what is not an entry is removed)
            drop, expiring = [], False
            for key, e in self._d.items():
                if slot_of(e, 0) < 0:
                    drop.append(key)
                else:
                    expiring = expiring or bool(e[0]) or len(e) == 4
            for key in drop:
                del self._d[key]
            if expiring:
                side.words[C.W_FLAGS] = C.FLAG_EXPIRING
            return
        owners: dict[int, list[Any]] = {}
        sizes: dict[int, int] = {}
        drop = []
        expiring = False
        for key, e in self._d.items():
            slot = slot_of(e, side.nslots)
            if slot < 0:
                drop.append(key)
            else:
                owners.setdefault(slot, []).append(key)
                expiring = expiring or bool(e[0]) or len(e) == 4
                if self._size_codec is not None:
                    sizes[slot] = self._size(key, e[2] if len(e) == 3 else None)
        for keys in owners.values():
            if len(keys) > 1:  # (damaged words handed a slot out twice)
                drop += keys
        for key in drop:
            del self._d[key]
        used = {slot for slot, keys in owners.items() if len(keys) == 1}
        w = side.words
        if expiring:  # (a side file a power loss left older than its entries may lack the flag)
            w[C.W_FLAGS] = C.FLAG_EXPIRING
        for slot in used:  # recounted: exact whatever crashes or damage left in the cells
            side.sizes[slot] = sizes.get(slot, 0)
            if not 0.0 <= side.recency[slot] < _INF:  # (NaN, infinite, negative: damage)
                side.recency[slot] = 0.0  # (the least recent)
        top = max(used) + 1 if used else 0
        w[C.W_FREE] = 0
        w[C.W_NEXT] = top
        free = [s for s in range(top) if s not in used]
        for i, s in enumerate(free):
            side.free[i] = s
        w[C.W_FREE] = len(free)
        w[C.W_BYTES] = sum(side.sizes[s] for s in used)

    def _make_room(self, now: float, key: Any, size: int) -> None:
        """Evict until one more entry of ``size`` bytes fits the bounds."""
        maxsize = self._maxsize
        if maxsize is not None:
            n = len(self._d)
            if n >= maxsize:
                if self._cull is not None:
                    self._cull_now(now, n)
                else:
                    for _ in range(n - maxsize + 1):
                        if not self._evict_one(now, key):
                            break
        if self._maxbytes is not None:  # (its size not in bytes yet: a writer killed here leaves none)
            self._fit_bytes(now, key, extra=size)
        if (  # (slots run out: a cache bounded by bytes alone has 2**20 of them)
            self._side.nslots
            and self._side.words[C.W_FREE] == 0
            and self._side.words[C.W_NEXT] >= self._side.nslots
            and len(self._d) >= self._side.nslots
        ):
            self._evict_one(now, key)

    def _fit_bytes(
        self,
        now: float,
        key: Any,
        pending: int = 0,
        cell: Optional[tuple[int, int]] = None,
        extra: int = 0,
    ) -> None:
        """Evict until ``bytes`` (counting ``pending`` bytes it holds that the
        entries do not yet, and ``extra`` bytes of a new entry it does not
        hold) is within maxbytes.  Over it with nothing left to evict, the
        count is too high (crashes leave it so; or damage): recounted once --
        from the entries, which still hold ``key``'s old value where it grows:
        its new size (``cell``: slot, size) is put back after the recount, and
        its growth counted from the old size found, not the cell's (which a
        writer killed growing it left too high)."""
        maxbytes = self._maxbytes
        w = self._side.words
        recounted = False
        while maxbytes is not None and w[C.W_BYTES] + extra > maxbytes:
            if not self._evict_one(now, key):
                if recounted:
                    break
                self._rebuild()
                if cell is not None:  # (its growth again, from the size the recount found)
                    pending = cell[1] - self._side.sizes[cell[0]]
                    self._side.sizes[cell[0]] = cell[1]
                add_word(w, C.W_BYTES, pending)
                recounted = True

    def _evict_one(self, now: float, exclude: Any) -> bool:
        victim = self._victim(now, exclude)
        if victim is None:
            return False
        key, e = victim
        expired = bool(e[0] and e[0] <= now)
        self._delete(key, e)
        w = self._side.words
        index = _W_EXPIRATIONS if expired else _W_EVICTIONS
        try:
            w[index] += 1
        except ValueError:  # (a damaged counter: it wraps)
            w[index] = 0
        return True

    def _sample_pool(self, fresh: bool = False) -> list[Any]:
        pool = self._pool
        if fresh or pool is None or self._pool_age > max(32, len(pool) // 2):
            pool = self._pool = list(self._d)
            self._pool_age = 0
        return pool

    def _victim(self, now: float, exclude: Any) -> Optional[tuple[Any, Any]]:
        """The least recently used of ``SAMPLES`` sampled entries (an expired one
        at once), never ``exclude`` nor a live process's claim (its computation
        would run twice); None if the cache holds nothing else."""
        rec = self._recency
        dget = self._d._node().get  # (the entries as cached, not copies: read-only here)
        for fresh in (False, True):
            pool = self._sample_pool(fresh)
            if not pool:  # (a stale pool may be empty: taken when the cache was)
                continue
            best: Optional[tuple[Any, Any]] = None
            best_t = float("inf")
            n = len(pool)
            for _ in range(C.SAMPLES):
                k = pool[int(random.random() * n)]
                e = dget(k)
                if e is None or (k == exclude and type(k) is type(exclude)):
                    continue
                try:
                    if e[0] and e[0] <= now:
                        return k, e
                    if len(e) == 4 and owner_alive(e[2]):
                        continue
                    t = rec[e[1]] if rec is not None and e[1] < len(rec) else 0.0
                except (TypeError, IndexError, KeyError):
                    self._delete(k, e)  # not an entry (another program's): removed, no victim
                    continue
                if best is None or t < best_t:  # (a NaN or infinite time -- damage -- is a victim too)
                    best, best_t = (k, e), t
            if best is not None:
                return best
        return None

    def _reap(self, now: float, exclude: Any) -> None:
        """Remove expired entries among a few sampled (active expiry: memory
        of entries nobody reads again is reclaimed by the writes)."""
        pool = self._sample_pool()
        if not pool:
            return
        n = len(pool)
        for _ in range(C.EXPIRE_SAMPLES):
            k = pool[int(random.random() * n)]
            e = self._dget(k)
            if e is None or (k == exclude and type(k) is type(exclude)):
                continue
            try:
                expired = e[0] and e[0] <= now
            except (TypeError, IndexError, KeyError):
                expired = None  # not an entry: removed
            if expired or expired is None:
                self._delete(k, e)
                if expired:
                    add_word(self._side.words, C.W_EXPIRATIONS, 1)

    def _cull_now(self, now: float, n: int) -> None:
        """Django's cull: ``len // cull_frequency`` entries in LRU order (expired
        first), or everything for 0."""
        if self._cull == 0:  # (as clear(): marked a batch meanwhile)
            w = self._side.words
            nslots = self._side.nslots
            expired = live = 0
            for e in self._d.values() if w[C.W_FLAGS] else ():  # (else no entry has an expiry)
                if slot_of(e, nslots) >= 0 and len(e) == 3:  # (claims and foreign keys: neither)
                    if e[0] and e[0] <= now:
                        expired += 1
                    else:
                        live += 1
            if not w[C.W_FLAGS]:
                live = n
            self._emptied()
            add_word(w, C.W_EVICTIONS, live)  # (counted as the culls of n > 0 count theirs)
            add_word(w, C.W_EXPIRATIONS, expired)
            return
        rec = self._recency
        assert rec is not None and self._cull
        nslots = self._side.nslots
        ranked = heapq.nsmallest(
            max(1, n // self._cull),
            (
                (-2.0 if slot_of(e, nslots) < 0 else -1.0 if e[0] and e[0] <= now else rec[e[1]], i, k, e)
                for i, (k, e) in enumerate(self._d.items())
            ),
        )
        w = self._side.words
        for t, _, k, e in ranked:
            self._delete(k, e)
            if t > -2.0:
                add_word(w, C.W_EXPIRATIONS if t < 0 else C.W_EVICTIONS, 1)
