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
from typing import Any, Callable, List, Optional, Tuple

from .. import cache_layout as C
from .. import _faults as faults
from ..errors import TooLarge
from .._owner import owner_alive
from ..shareddict import SharedDict
from .side import Side

__all__ = ["Entries"]



class Entries:
    """The entry-changing half of SharedCache (every method: under the lock)."""

    _d: SharedDict
    _side: Side
    _dget: Callable[..., Any]
    _recency: Any
    _maxsize: Optional[int]
    _maxbytes: Optional[int]
    _cull: Optional[int]
    _pool: Optional[List[Any]]
    _pool_age: int
    _size_codec: Any
    name: Any

    def _size(self, key: Any, stored: Any) -> int:
        codec = self._size_codec
        if codec is None:
            return 0
        return len(codec.dumps(key)) + len(stored if type(stored) is bytes else codec.dumps(stored)) + 32

    def _put(self, key: Any, stored: Any, expires: float, now: float,
             claim: Optional[Tuple[int, int]] = None) -> None:
        """``key`` -> the entry (expires, slot, stored), or with ``claim`` the
        claim (expires, slot, owner, token): its old slot, or a new one after
        making room."""
        side = self._side
        w = side.words
        size = self._size(key, stored) if self._size_codec is not None else 0
        if self._maxbytes is not None and size > self._maxbytes:
            raise TooLarge(f"an entry of {size:,} bytes (key {key!r:.60}) cannot fit the cache's "
                           f"maxbytes={self._maxbytes:,}")
        if (expires or claim) and not w[C.W_FLAGS]:
            w[C.W_FLAGS] = C.FLAG_EXPIRING
        # The entry as the handle caches it, not a copy (only its slot is read):
        # the dict's get would copy a mutable value for nothing.
        old = self._d._node().get(key)
        # A size grows (in its cell and in bytes) before the write and shrinks
        # after it: a writer killed in between leaves both too high, never too
        # low -- a rebuild sums the cells.
        if old is not None:
            slot = old[1]
            if side.nslots:
                grown = size - side.sizes[slot]
                if grown > 0:
                    w[C.W_BYTES] += grown
                    side.sizes[slot] = size
                    self._fit_bytes(now, key)
            self._d[key] = (expires, slot, stored) if claim is None else (expires, slot) + claim
            if side.nslots and grown < 0:
                w[C.W_BYTES] += grown
                side.sizes[slot] = size
        else:
            if w[C.W_FLAGS]:
                self._reap(now, key)
            self._make_room(now, key, size)
            slot = self._take_slot() if side.nslots else 0
            if faults.armed is not None:
                faults.hit("cache-slot-taken")
            if side.nslots:
                side.sizes[slot] = size
                w[C.W_BYTES] += size
            self._d[key] = (expires, slot, stored) if claim is None else (expires, slot) + claim
            self._pool_age += 1
        if side.nslots:
            side.recency[slot] = now

    def _delete(self, key: Any, e: Any) -> None:
        """Remove ``key`` (whose entry is ``e``, None if absent), then free its slot."""
        if e is None:
            return
        del self._d[key]
        if faults.armed is not None:
            faults.hit("cache-entry-removed")
        side = self._side
        if side.nslots:
            w = side.words
            slot = e[1]
            w[C.W_BYTES] -= min(w[C.W_BYTES], side.sizes[slot])
            side.sizes[slot] = 0
            free = w[C.W_FREE]
            if free < side.nslots:
                side.free[free] = slot
                w[C.W_FREE] = free + 1

    def _take_slot(self) -> int:
        side = self._side
        w = side.words
        free = w[C.W_FREE]
        if free:
            w[C.W_FREE] = free - 1
            return int(side.free[free - 1])
        nxt = w[C.W_NEXT]
        if nxt < side.nslots:
            w[C.W_NEXT] = nxt + 1
            return int(nxt)
        self._rebuild()  # slots leaked by crashes: recount from the entries
        if not w[C.W_FREE] and w[C.W_NEXT] >= side.nslots:
            raise RuntimeError(f"cache {self.name!r}: no free slot after a rebuild")
        return self._take_slot()

    def _rebuild(self) -> None:
        """The free stack and bytes from the entries (after crashes leaked slots).

        The stack is emptied first and ``next`` set past the last slot in use
        before the stack is rewritten: a writer killed midway leaves slots
        leaked, never one on the stack twice nor one both on the stack and
        past ``next``.  Costs O(entries + the highest slot in use), not
        O(nslots) (a cache bounded by bytes alone has 2**20 slots)."""
        side = self._side
        if not side.nslots:
            return
        used = {e[1] for e in self._d.values()}
        w = side.words
        top = min(side.nslots, max(used) + 1) if used else 0
        w[C.W_FREE] = 0
        w[C.W_NEXT] = top
        free = [s for s in range(top) if s not in used]
        for i, s in enumerate(free):
            side.free[i] = s
        w[C.W_FREE] = len(free)
        w[C.W_BYTES] = sum(side.sizes[s] for s in used if s < side.nslots)

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
        if self._maxbytes is not None:
            self._side.words[C.W_BYTES] += size
            try:
                self._fit_bytes(now, key)
            finally:
                self._side.words[C.W_BYTES] -= size
        elif self._side.nslots and self._side.words[C.W_FREE] == 0 \
                and self._side.words[C.W_NEXT] >= self._side.nslots and len(self._d) >= self._side.nslots:
            self._evict_one(now, key)

    def _fit_bytes(self, now: float, key: Any) -> None:
        maxbytes = self._maxbytes
        w = self._side.words
        while maxbytes is not None and w[C.W_BYTES] > maxbytes:
            if not self._evict_one(now, key):
                break

    def _evict_one(self, now: float, exclude: Any) -> bool:
        victim = self._victim(now, exclude)
        if victim is None:
            return False
        key, e = victim
        expired = bool(e[0] and e[0] <= now)
        self._delete(key, e)
        w = self._side.words
        w[C.W_EXPIRATIONS if expired else C.W_EVICTIONS] += 1
        return True

    def _sample_pool(self, fresh: bool = False) -> List[Any]:
        pool = self._pool
        if fresh or pool is None or self._pool_age > max(32, len(pool) // 2):
            pool = self._pool = list(self._d)
            self._pool_age = 0
        return pool

    def _victim(self, now: float, exclude: Any) -> Optional[Tuple[Any, Any]]:
        """The least recently used of ``SAMPLES`` sampled entries (an expired one
        at once), never ``exclude`` nor a live process's claim (its computation
        would run twice); None if the cache holds nothing else."""
        rec = self._recency
        dget = self._d._node().get  # (the entries as cached, not copies: read-only here)
        for fresh in (False, True):
            pool = self._sample_pool(fresh)
            if not pool:  # (a stale pool may be empty: taken when the cache was)
                continue
            best: Optional[Tuple[Any, Any]] = None
            best_t = float("inf")
            n = len(pool)
            for _ in range(C.SAMPLES):
                k = pool[int(random.random() * n)]
                e = dget(k)
                if e is None or (k == exclude and type(k) is type(exclude)):
                    continue
                if e[0] and e[0] <= now:
                    return k, e
                if len(e) == 4 and owner_alive(e[2]):
                    continue
                t = rec[e[1]] if rec is not None and e[1] < len(rec) else 0.0
                if t < best_t:
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
            if e is not None and e[0] and e[0] <= now and not (k == exclude and type(k) is type(exclude)):
                self._delete(k, e)
                self._side.words[C.W_EXPIRATIONS] += 1

    def _cull_now(self, now: float, n: int) -> None:
        """Django's cull: ``len // cull_frequency`` entries in LRU order (expired
        first), or everything for 0."""
        if self._cull == 0:
            self._d.clear()
            w = self._side.words
            w[C.W_FREE] = w[C.W_NEXT] = w[C.W_BYTES] = 0  # FREE first: never a stacked slot past NEXT
            self._pool = None
            return
        rec = self._recency
        assert rec is not None and self._cull
        ranked = heapq.nsmallest(
            max(1, n // self._cull),
            ((-1.0 if e[0] and e[0] <= now else rec[e[1]], i, k, e)
             for i, (k, e) in enumerate(self._d.items())))
        w = self._side.words
        for t, _, k, e in ranked:
            self._delete(k, e)
            w[C.W_EXPIRATIONS if t < 0 else C.W_EVICTIONS] += 1
