"""SharedCache: a cache every process shares, with expiry, size bounds and eviction.

The entries live in one shared dict (one publish a change: a value and its
expiry become visible together), the cache's settings, recency and sizes in
its side segment (:mod:`ultradict_ng.cache.layout` is the protocol).  Reads
take no lock: a hit is the dict's cached read, a clock read, a check of the
expiry and one 8-byte store of recency.  Every change is made under the
dict's lock, so that ``add``, ``incr`` and eviction are atomic across
processes, and the bounds hold whoever writes.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from time import time as _now
from typing import Any, Optional, cast

from .._codec.codec import codec_for
from .._shm.store import Store
from ..shareddict import SharedDict
from ..speedups import CacheGet
from . import layout as C
from .entries import Entries, add_word, plain_data, slot_of
from .opening import check_settings, open_parts

__all__ = ["SharedCache", "DEFAULT_TTL"]


class _DefaultTTL:
    """The cache's own ttl (what ``set`` uses when given no ttl)."""

    def __repr__(self) -> str:
        return "DEFAULT_TTL"

    def __reduce__(self) -> str:
        return "DEFAULT_TTL"


DEFAULT_TTL: Any = _DefaultTTL()

_MISSING: Any = object()


def _alive(e: Any, now: float, nslots: int) -> bool:
    """Whether ``e`` is a value entry (not a claim, nor anything else another
    program may have written there: cache_layout "Entries") live at ``now``."""
    return slot_of(e, nslots) >= 0 and len(e) == 3 and (not e[0] or e[0] > now)


class SharedCache(Entries, MutableMapping[Any, Any]):
    """A cache shared by every process that opens ``name``.

    * ``maxsize``: at most this many entries; a new key evicts the least
      recently used (approximated: the oldest of 8 sampled, see
      cache_layout).  ``maxbytes``: at most this many stored bytes (keys and
      values encoded).  ``ttl``: seconds an entry lives unless ``set`` says
      otherwise (None: forever).
    * ``cull_frequency`` (needs maxsize): Django's CULL_FREQUENCY -- when full,
      remove ``len // n`` entries at once in LRU order (0: remove all).
    * ``serializer``: ``"msgpack"`` (default: the dict's safe codec; values
      come back as copies) or ``"pickle"`` (any picklable value; unpickling
      runs code chosen by whoever wrote it: mutually trusted processes only).
    * ``create``, ``auto_unlink``, ``buffer_size``: as :class:`SharedDict`.
      The settings are stored with the cache: attachers pass only ``name``;
      a conflicting explicit value raises :class:`ParameterMismatch`.
    * ``path`` (instead of ``name``), ``sync``, ``sync_interval``: a cache
      kept in the directory ``path``, as ``SharedDict(path=...)``: its
      entries survive a restart, a reboot and a power loss by the sync
      policy's rules, its settings with them (``_disk/layout.py``, "Cache
      side file"); recency and counters are kept as well as the page cache
      keeps them.

    Expiry is data: an entry past its time is absent for every process at
    once, and the next write that meets it (or :meth:`expire`) removes it.
    """

    def __init__(
        self,
        name: Optional[str] = None,
        *,
        maxsize: Optional[int] = None,
        maxbytes: Optional[int] = None,
        ttl: Optional[float] = None,
        serializer: Optional[str] = None,
        cull_frequency: Optional[int] = None,
        create: Optional[bool] = None,
        auto_unlink: Any = None,
        buffer_size: Optional[int] = None,
        path: Any = None,
        sync: Optional[str] = None,
        sync_interval: Optional[float] = None,
    ) -> None:
        explicit = check_settings(maxsize, maxbytes, ttl, serializer, cull_frequency)
        if explicit.get("cull_frequency") is not None and "maxsize" not in explicit:
            raise ValueError("cull_frequency needs maxsize")
        wanted = {
            "maxsize": None,
            "maxbytes": None,
            "ttl": None,
            "serializer": "msgpack",
            "cull_frequency": None,
        }
        wanted.update(explicit)
        where: dict[str, Any] = {}
        for key, value in (("path", path), ("sync", sync), ("sync_interval", sync_interval)):
            if value is not None:
                where[key] = value
        self._d, self._side = d, side = open_parts(
            name, create, auto_unlink, buffer_size, where, wanted, explicit
        )
        s = side.settings()
        self._maxsize: Optional[int] = s["maxsize"]
        self._maxbytes: Optional[int] = s["maxbytes"]
        self._ttl: Optional[float] = s["ttl"]
        self._serializer: str = s["serializer"]
        self._cull: Optional[int] = s["cull_frequency"]
        self._loads = pickle.loads if self._serializer == "pickle" else None
        self._size_codec = codec_for("msgpack") if self._maxbytes else None
        self._recency = side.recency if side.nslots else None
        self._dget = d.get
        self._lock = d.lock
        self._side_change = cast(Store, d._store).before_side_change
        self._pool: Optional[list[Any]] = None
        self._pool_age = 0
        # ``get`` is this handle's CacheGet (speedups: compiled, or the twin
        # calling _lookup): a hit costs no Python frame.
        self.__dict__["get"] = CacheGet(d, self._recency, self._loads, self._lookup, _MISSING)
        if side.words[C.W_BATCH]:
            # A writer died in a batch, or a recovery marked the side stale
            # (_disk/layout.py, step f): rebuilt before this handle reads len.
            try:
                with d.lock:
                    self._after_dead_batch()
            except BaseException:
                self.close()
                raise

    # -- reading: no lock ---------------------------------------------------------------

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` if it is absent or expired.

        (Replaced per handle by its CacheGet; this is the class's signature.)"""
        return self.__dict__["get"](key, default)

    def _lookup(self, key: Any) -> Any:
        """``get``'s rules in Python (what CacheGet calls when it cannot answer
        itself): the value of a live entry, after storing the time as its
        recency, or _MISSING."""
        e = self._dget(key)
        if e is not None:
            now = _now()
            if _alive(e, now, self._side.nslots):
                rec = self._recency
                if rec is not None:
                    rec[e[1]] = now
                value = e[2]
                return value if self._loads is None or type(value) is not bytes else self._loads(value)
        return _MISSING

    def __getitem__(self, key: Any) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __contains__(self, key: Any) -> bool:
        """Whether ``key`` holds a live value (counts as neither hit nor use)."""
        e = self._dget(key)
        return _alive(e, _now(), self._side.nslots)

    def get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        """``{key: value}`` for the keys of ``keys`` that hold live values."""
        out = {}
        for key in keys:
            value = self.get(key, _MISSING)
            if value is not _MISSING:
                out[key] = value
        return out

    def ttl(self, key: Any) -> Optional[float]:
        """Seconds ``key`` has left, None if it never expires; KeyError if absent."""
        return self._value_and_ttl(key, False)[1]

    def _value_and_ttl(self, key: Any, value: bool = True) -> tuple[Any, Optional[float]]:
        """``key``'s value (if ``value``) and the seconds it has left, read
        once at one instant: an entry expiring between two lookups is there
        or not, never a value without its time (or a time below zero)."""
        now = _now()
        e = self._live(key, now)
        if e is None:
            raise KeyError(key)
        return (self._value(e) if value else None), (None if not e[0] else e[0] - now)

    def __iter__(self) -> Iterator[Any]:
        """The live keys, from a snapshot taken now."""
        now = _now()
        n = self._side.nslots
        return iter([k for k, e in self._d.items() if _alive(e, now, n)])

    def __len__(self) -> int:
        """Live entries: O(1) while no entry ever had an expiry or a claim, else a scan."""
        if not self._side.words[C.W_FLAGS]:
            return len(self._d)
        now = _now()
        n = self._side.nslots
        return sum(1 for e in self._d.values() if _alive(e, now, n))

    # -- writing: under the dict's lock -------------------------------------------------

    def set(self, key: Any, value: Any, ttl: Any = DEFAULT_TTL) -> None:
        """Store ``value`` under ``key``; ``ttl`` seconds (None: never expires;
        <= 0: already expired -- removes ``key``; default: the cache's ttl)."""
        now = _now()
        expires = self._expires(ttl, now)
        stored = self._stored(value)
        with self._lock:
            if expires < 0:
                self._delete(key, self._dget(key))
            else:
                self._put(key, stored, expires, now)

    __setitem__ = set

    def add(self, key: Any, value: Any, ttl: Any = DEFAULT_TTL) -> bool:
        """Store ``value`` only if ``key`` is absent (or expired): True if it was
        stored.  Atomic: of N processes adding one key at once, exactly one wins."""
        now = _now()
        expires = self._expires(ttl, now)
        stored = self._stored(value)
        with self._lock:
            if self._live(key, now) is not None:
                return False
            if expires < 0:
                self._delete(key, self._dget(key))
            else:
                self._put(key, stored, expires, now)
            return True

    def setdefault(self, key: Any, default: Any = None) -> Any:
        """The live value of ``key``; if absent, store ``default`` and return it (atomic)."""
        now = _now()
        with self._lock:
            e = self._live(key, now)
            if e is not None:
                return self._value(e)
            self._put(key, self._stored(default), self._expires(DEFAULT_TTL, now), now)
            return default

    def incr(self, key: Any, delta: int = 1, *, default: Optional[int] = None) -> int:
        """Add ``delta`` to the int under ``key`` and return the sum (atomic);
        the expiry is kept.  An absent key raises KeyError, or with
        ``default`` starts from it (with the cache's ttl)."""
        now = _now()
        with self._lock:
            e = self._live(key, now)
            if e is None:
                if default is None:
                    raise KeyError(key)
                current, expires = default, self._expires(DEFAULT_TTL, now)
            else:
                current, expires = self._value(e), e[0]
            if isinstance(current, bool) or not isinstance(current, int):
                raise TypeError(f"incr: the value of {key!r} is a {type(current).__name__}, not an int")
            new = current + delta
            self._put(key, self._stored(new), expires, now)
            return new

    def decr(self, key: Any, delta: int = 1, *, default: Optional[int] = None) -> int:
        """``incr(key, -delta, default=default)``."""
        return self.incr(key, -delta, default=default)

    def touch(self, key: Any, ttl: Any = DEFAULT_TTL) -> bool:
        """Give a live ``key`` a new expiry; False if it is absent."""
        now = _now()
        expires = self._expires(ttl, now)
        with self._lock:
            e = self._live(key, now)
            if e is None:
                return False
            if expires < 0:
                self._delete(key, e)
            else:
                self._put(key, e[2], expires, now)
            return True

    def set_many(self, mapping: Mapping[Any, Any], ttl: Any = DEFAULT_TTL) -> None:
        """Store every item of ``mapping``: one lock, one publish (all or none)."""
        now = _now()
        expires = self._expires(ttl, now)
        items = [(k, self._stored(v)) for k, v in mapping.items()]
        with self._batch():
            for key, stored in items:
                if expires < 0:
                    self._delete(key, self._dget(key))
                else:
                    self._put(key, stored, expires, now)

    def delete(self, key: Any) -> bool:
        """Remove ``key``; True if it held a live value."""
        now = _now()
        with self._lock:
            e = self._dget(key)
            live = _alive(e, now, self._side.nslots)
            self._delete(key, e)
            return live

    def __delitem__(self, key: Any) -> None:
        if not self.delete(key):
            raise KeyError(key)

    def delete_many(self, keys: Iterable[Any]) -> int:
        """Remove each of ``keys``: one lock, one publish; how many held live values."""
        now = _now()
        count = 0
        with self._batch():
            for key in keys:
                e = self._dget(key)
                count += _alive(e, now, self._side.nslots)
                self._delete(key, e)
        return count

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        """Remove ``key`` and return its live value (atomic); ``default`` or KeyError if absent."""
        now = _now()
        with self._lock:
            e = self._live(key, now)
            if e is None:
                self._delete(key, self._dget(key))
                if default is _MISSING:
                    raise KeyError(key)
                return default
            value = self._value(e)
            self._delete(key, e)
            return value

    def popitem(self) -> tuple[Any, Any]:
        """Remove and return the least recently used live item (approximately:
        the oldest of 8 sampled; without maxsize no recency is kept, and it is
        any item)."""
        now = _now()
        with self._lock:
            while True:
                victim = self._victim(now, _MISSING)
                if victim is None:
                    raise KeyError("popitem(): the cache is empty")
                key, e = victim  # (the cached entry: the value is read as get reads it)
                live = _alive(e, now, self._side.nslots)
                value = self._value(self._dget(key)) if live else None
                self._delete(key, e)
                if live:
                    return key, value

    def clear(self) -> None:
        """Remove every entry."""
        with self._lock:
            self._after_dead_batch()  # (as every write: a pending clean removed first, too)
            self._emptied()

    def expire(self) -> int:
        """Remove every expired entry now; how many.  (Reads never see them
        anyway; this reclaims their memory at once, and recounts ``bytes``.)"""
        now = _now()
        with self._lock:
            self._after_dead_batch()  # (every write's first step: cache_layout "Crashes")
            n = self._side.nslots  # (and anything that is no entry: cache_layout "Entries")
            gone = [(k, e) for k, e in self._d.items() if slot_of(e, n) < 0 or (e[0] and e[0] <= now)]
            for key, e in gone:
                self._delete(key, e)
            add_word(self._side.words, C.W_EXPIRATIONS, sum(slot_of(e, n) >= 0 for _, e in gone))
            self._rebuild()
            return len(gone)

    # -- the rest of the mapping API ----------------------------------------------------

    @property
    def name(self) -> str:
        return self._d.name

    @property
    def maxsize(self) -> Optional[int]:
        return self._maxsize

    @property
    def maxbytes(self) -> Optional[int]:
        return self._maxbytes

    @property
    def currsize(self) -> int:
        return len(self)

    @property
    def default_ttl(self) -> Optional[float]:
        return self._ttl

    @property
    def serializer(self) -> str:
        return self._serializer

    @property
    def cull_frequency(self) -> Optional[int]:
        """Django's CULL_FREQUENCY as stored with the cache (None: evict one at a time)."""
        return self._cull

    @property
    def lock(self) -> Any:
        """The cache's lock (the dict's): hold it to make several calls one atomic step."""
        return self._lock

    def limit_handle(self, maxsize: int, cull_frequency: Optional[int] = None) -> None:
        """Make this handle's writes keep the cache at ``maxsize`` entries, culling
        ``len // cull_frequency`` at once when full (0: everything; None: one at
        a time), whatever the stored bound; other handles keep their own.

        For frameworks whose aliases share one store with limits of their own:
        Django's file-based backend applies each alias's MAX_ENTRIES and
        CULL_FREQUENCY to the directory they share.  ``maxsize`` may not
        exceed the stored maxsize, which sizes the recency slots (an alias
        allowed more than the store holds would run out of them)."""
        stored = self._side.settings()["maxsize"]
        if stored is None:
            raise ValueError(f"cache {self.name!r} has no maxsize: no recency to evict by")
        if type(maxsize) is not int or not 1 <= maxsize <= stored:
            raise ValueError(f"maxsize must be an int from 1 to the stored {stored}, not {maxsize!r}")
        if cull_frequency is not None and (type(cull_frequency) is not int or cull_frequency < 0):
            raise ValueError(f"cull_frequency must be an int >= 0 or None, not {cull_frequency!r}")
        self._maxsize, self._cull = maxsize, cull_frequency

    def stats(self) -> dict[str, Any]:
        """hits and misses (of this handle), evictions and expirations (of all
        processes), size (live entries), bytes (stored, with maxbytes) and the bounds."""
        w = self._side.words
        g = self.__dict__["get"]
        return {
            "hits": g.hits,
            "misses": g.misses,
            "evictions": w[C.W_EVICTIONS],
            "expirations": w[C.W_EXPIRATIONS],
            "size": len(self),
            "maxsize": self._maxsize,
            "bytes": w[C.W_BYTES] if self._maxbytes else None,
            "maxbytes": self._maxbytes,
            "ttl": self._ttl,
        }

    def close(self) -> None:
        """Detach this handle (other processes are unaffected)."""
        if not self._d.closed:
            self._d.close()
            self._recency = None
            self.__dict__["get"].release()
            self._side.close()

    def unlink(self) -> int:
        """Remove the cache for everybody (its dict and side segment); segments removed."""
        return self._d.unlink()

    @staticmethod
    def unlink_by_name(name: str) -> int:
        """Remove the cache ``name`` (works when every user is dead)."""
        return SharedDict.unlink_by_name(name)

    def __enter__(self) -> SharedCache:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def directory(self) -> Optional[str]:
        """The directory of a cache kept in files (``path=``), else None."""
        return self._d.directory

    def __reduce__(self) -> tuple[Any, ...]:
        directory = self._d.directory
        if directory is not None:  # (with its dict's name and token: this cache only, as a SharedDict's)
            return (_attach_path, (directory, self._d._store.reopen_arguments().get("name")))
        return (_attach, (self.name,))

    def __repr__(self) -> str:
        state = "closed" if self._d.closed else f"{len(self)} entries"
        return (
            f"SharedCache({self.name!r}, maxsize={self._maxsize}, maxbytes={self._maxbytes}, "
            f"ttl={self._ttl}, serializer={self._serializer!r}: {state})"
        )

    # -- internals (under the lock unless said) -----------------------------------------

    def _expires(self, ttl: Any, now: float) -> float:
        """The expiry an entry written now with ``ttl`` gets: 0.0 never, < 0 already."""
        if ttl is DEFAULT_TTL:
            ttl = self._ttl
        if ttl is None:
            return 0.0
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
            raise TypeError(f"ttl must be a number of seconds or None, not {ttl!r}")
        if ttl != ttl:  # NaN: an entry no read would see and no expiry would remove
            raise ValueError("ttl must be a number of seconds, not NaN")
        return -1.0 if ttl <= 0 else now + ttl

    def _stored(self, value: Any) -> Any:
        if self._loads is None or plain_data(value):
            return value
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)

    def _value(self, e: Any) -> Any:
        value = e[2]
        return value if self._loads is None or type(value) is not bytes else self._loads(value)

    def _live(self, key: Any, now: float) -> Any:
        """The value entry of ``key`` if live, else None (no lock needed)."""
        e = self._dget(key)
        return e if _alive(e, now, self._side.nslots) else None


def _attach(name: str) -> SharedCache:
    """Unpickling a SharedCache attaches to it by name."""
    return SharedCache(name, create=False)


def _attach_path(directory: str, name: Optional[str] = None) -> SharedCache:
    """Unpickling one kept in files: the cache then in its directory (else ``NotFound``)."""
    return SharedCache(name, path=directory, create=False)
