"""A Django cache backend: one cache in shared memory for every worker process of the machine.

Django's ``LocMemCache`` keeps one cache per process, so N gunicorn workers hold N
caches that disagree (a ``delete`` in one worker leaves the others serving the old
value) and each starts cold; memcached and Redis share one but cost a server and a
round trip per call.  This backend is a thin adapter over
:class:`ultradict_ng.cache.SharedCache`: every process that names the same
``LOCATION`` uses the same cache, reads are served from shared memory without a
lock, and ``add``, ``incr``/``decr`` and the ``*_many`` calls are atomic across
processes::

    CACHES = {
        "default": {
            "BACKEND": "ultradict_ng.integrations.django.SharedCache",
            "LOCATION": "mysite-cache",      # the shared cache's name: required
            "TIMEOUT": 300,                  # Django's: seconds, None = forever
            "OPTIONS": {"MAX_ENTRIES": 10_000, "MAXBYTES": 256 * 2**20},
        }
    }

Settings (``TIMEOUT``, ``KEY_PREFIX``, ``VERSION`` and ``KEY_FUNCTION`` are Django's
and mean what they mean for every backend; keys are made and checked as by
``BaseCache``, with the same ``CacheKeyWarning`` for keys memcached would refuse):

- ``LOCATION`` -- the name of the shared cache (letters, digits, ``_ . -``; at most 200
  characters on Linux, 20 on macOS).  Every alias and process that names it shares it;
  two sites on one machine need two names.
- ``OPTIONS["MAX_ENTRIES"]`` (default 300) and ``OPTIONS["CULL_FREQUENCY"]`` (default 3)
  -- Django's meaning: when an insert through this alias finds ``MAX_ENTRIES`` entries,
  the least recently used ``1/CULL_FREQUENCY`` of them are evicted (``0``: all of them).
  Aliases that share a ``LOCATION`` (or ``PATH``) share one store and each applies its
  own, as with Django's file-based backend; the store holds as many entries as the
  largest ``MAX_ENTRIES`` of the aliases in ``settings.CACHES`` that share it.
- ``OPTIONS["MAXBYTES"]`` (default: no limit) -- a bound on the bytes of the stored
  (pickled) values; entries are evicted to stay under it.
- ``OPTIONS["AUTO_UNLINK"]`` (default ``False``) -- when the shared memory is removed.
  ``False``: never by a worker; it outlives every process and is reused by the next
  ones.  Remove it with ``ultradict-ng rm LOCATION`` (or
  ``ultradict_ng.cache.SharedCache.unlink_by_name(LOCATION)``).  ``"last"``: when the
  last process using it exits normally (good for tests and ``runserver``).  ``True``:
  when this process exits, whoever else still uses it.

- ``OPTIONS["PATH"]`` (instead of ``LOCATION``) -- a directory to keep the cache in
  (:class:`ultradict_ng.cache.SharedCache`'s ``path``): a persistent cache, like
  ``FileBasedCache`` or ``diskcache.DjangoCache``, that survives restarts, deploys,
  reboots and power loss by ``OPTIONS["SYNC"]`` (``"always"``, ``"interval"`` -- the
  default: on the disk within ``OPTIONS["SYNC_INTERVAL"]``, 1 second -- or ``"never"``).
  Every process and alias naming the directory shares it; it is never removed by a
  worker (``AUTO_UNLINK`` does not apply): remove it with ``ultradict-ng rm PATH``.

Why ``False`` and not ``"last"``: a cache is worth what it holds when a worker starts.
Worker processes come and go under a running site -- gunicorn's ``--max-requests``
recycles them, a timeout kills one, ``runserver``'s reloader restarts its child at
each edit, a deploy stops every worker before starting the new ones -- and with
``"last"`` the cache is emptied each time no worker happens to be alive, which with
one worker is every recycle.  What ``False`` costs is bounded: ``MAX_ENTRIES`` and
``MAXBYTES`` bound the memory the cache keeps in ``/dev/shm`` (RAM) while nothing
uses it, until it is removed or the machine reboots.

The store's size (its entries and ``MAXBYTES``) is fixed when the first process creates
it, and a store kept in files keeps its ``SYNC`` and ``SYNC_INTERVAL``.  An alias whose
``MAX_ENTRIES`` exceeds it, or whose ``MAXBYTES``, ``SYNC`` or ``SYNC_INTERVAL`` differs
(a deploy that changed them while the old cache lives on) uses the store as it is and
logs a warning on the ``ultradict_ng`` logger saying which differ: a cache that keeps serving
is worth more than a site that fails at its first cache call.  To apply new limits,
remove the cache (``ultradict-ng rm LOCATION``) while no worker runs, or name a new
``LOCATION``.

Values are pickled (any picklable object, as with Django's other backends; a value
that cannot be pickled raises the ``pickle`` error from ``set``/``add``), except
plain data the codec gives back exactly -- a dict or list of str, int, float,
bool, None (``SharedCache``'s serializer "pickle" decides: cache/layout.py) --
stored as itself, so that reading a session or a user record back is a copy,
not an unpickling.  Timeouts
follow ``BaseCache.get_backend_timeout``: ``None`` never expires, ``0`` or less
expires at once (``set`` then stores nothing and removes the key), the default is the
alias's ``TIMEOUT``; expiry is checked by every process at each read.  ``incr`` and
``decr`` are atomic, keep the entry's expiry, and raise ``ValueError`` for a missing
key.  ``close()`` -- which Django calls at the end of every request -- does nothing,
as for ``LocMemCache``: the process keeps its handle for the next request, and only
one handle per ``LOCATION`` is opened in a process, shared by its threads and
aliases.  Shared memory only (not the Redis backend of ``SharedDict``); Linux and
macOS.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from django.core.cache.backends.base import (  # type: ignore[import-untyped, unused-ignore]
    DEFAULT_TIMEOUT,
    MEMCACHE_MAX_KEY_LENGTH,
    BaseCache,
)
from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped, unused-ignore]

from .._disk.files import absolute
from .._disk.layout import SYNC_MODES
from ..cache import SharedCache as _SharedCache
from ..errors import InvalidName, NotFound, ParameterMismatch, TooLarge

__all__ = ["SharedCache"]

logger = logging.getLogger("ultradict_ng")

#: ``OPTIONS`` keys: Django's (read by ``BaseCache``) and ours.
DJANGO_OPTIONS = ("MAX_ENTRIES", "CULL_FREQUENCY")
OUR_OPTIONS = ("MAXBYTES", "AUTO_UNLINK", "PATH", "SYNC", "SYNC_INTERVAL")

#: One handle per process for each ``LOCATION`` (and settings): Django makes a
#: backend object per thread and alias (and anew after every settings change in
#: tests), and a handle costs an attach and a local copy of the cache's index.
_handles: dict[tuple[Any, ...], _SharedCache] = {}
_handles_lock = threading.Lock()


def _open(location: str, limits: dict[str, Any], where: dict[str, Any]) -> _SharedCache:
    """This process's handle of the shared cache ``location`` (a name, or the
    directory ``where["path"]``) for an alias of these ``limits`` (``capacity``,
    the store's entries; ``max_entries`` and ``cull_frequency``, the alias's;
    ``maxbytes``), opened (and the store created) on first use."""
    key = (location,) + tuple(sorted(where.items())) + tuple(sorted(limits.items()))
    handle = _handles.get(key)
    if handle is not None:
        return handle
    with _handles_lock:
        handle = _handles.get(key)
        if handle is None:
            try:
                handle = _handles[key] = _attach_or_create(location, limits, where)
            except InvalidName as e:
                raise ImproperlyConfigured(f"LOCATION {location!r}: {e}") from e
    return handle


def _attach_or_create(location: str, limits: dict[str, Any], where: dict[str, Any]) -> _SharedCache:
    name = location or None
    location = location or where["path"]  # (what the messages name)
    max_entries = limits["max_entries"]
    for _ in range(10):
        try:
            cache = _SharedCache(
                name, serializer="pickle", maxsize=limits["capacity"], maxbytes=limits["maxbytes"], **where
            )
        except ParameterMismatch as mismatch:
            try:
                # It exists with other settings: attach with the stored ones (its sync policy too).
                cache = _SharedCache(name, create=False, **{k: where[k] for k in where if "sync" not in k})
            except NotFound:
                continue  # removed between the two opens: create it with ours
            if cache.serializer != "pickle":  # not a limit: values would not round-trip
                cache.close()
                raise ImproperlyConfigured(
                    f"LOCATION {location!r} names a shared cache that stores values with "
                    f"{cache.serializer}; Django's values need pickle: name another LOCATION"
                ) from mismatch
            stored = cache._d.stats() if "path" in where else {}
            policy = {k: stored[k] for k in ("sync", "sync_interval") if k in where and where[k] != stored[k]}
            if policy:
                logger.warning(
                    "Django cache %r: kept in files with %s, not as configured (SYNC=%s, SYNC_INTERVAL=%s); "
                    "it keeps its own. To apply the configured ones, remove it while no process uses it "
                    "(ultradict-ng rm %s) or give a new PATH.",
                    location,
                    ", ".join(f"{k}={v!r}" for k, v in policy.items()),
                    where.get("sync"),
                    where.get("sync_interval"),
                    location,
                )
            if (cache.maxsize or 0) < max_entries or cache.maxbytes != limits["maxbytes"]:
                logger.warning(
                    "Django cache %r: stored with maxsize=%s and maxbytes=%s, not as configured "
                    "(MAX_ENTRIES=%s, MAXBYTES=%s). Using it with at most its stored entries and bytes; "
                    "to apply the configured ones, remove it while no process uses it (ultradict-ng rm %s) "
                    "or %s.",
                    location,
                    cache.maxsize,
                    cache.maxbytes,
                    max_entries,
                    limits["maxbytes"],
                    location,
                    "give a new PATH" if "path" in where else "name a new LOCATION",
                )
        if cache.maxsize is None:  # (a store made by something else than this backend, unbounded)
            return cache
        cache.limit_handle(min(max_entries, cache.maxsize), limits["cull_frequency"])
        return cache
    raise ImproperlyConfigured(
        f"cannot open the shared cache {location!r}: it keeps being removed and made with other settings"
    )


def _capacity(backend: str, location: str, path: Any, max_entries: int) -> int:
    """The entries the store must hold: the largest MAX_ENTRIES of the aliases
    in ``settings.CACHES`` that share it (this backend, this LOCATION or
    PATH), this alias's included.  Each alias then evicts by its own
    (``limit_handle``), as Django's file-based backend does in the directory
    its aliases share; the store's slots are sized once, by the first opener."""
    from django.conf import settings  # type: ignore[import-untyped, unused-ignore]

    found = max_entries
    if not settings.configured:
        return found
    for params in (getattr(settings, "CACHES", None) or {}).values():
        options = params.get("OPTIONS") or {}
        if params.get("BACKEND") != backend:
            continue
        if path is not None:
            same = options.get("PATH") is not None and absolute(os.fsdecode(options["PATH"])) == path
        else:
            same = params.get("LOCATION") == location
        if same:
            entries = params.get("max_entries", options.get("MAX_ENTRIES", 300))
            if type(entries) is int and entries > found:
                found = entries
    return found


def _bad_options(options: dict[str, Any], max_entries: int, cull_frequency: int) -> str | None:
    """What is wrong with an alias's OPTIONS (MAX_ENTRIES and CULL_FREQUENCY as
    ``BaseCache`` read them), None if nothing; checked before anything is made."""
    unknown = sorted(set(options) - set(DJANGO_OPTIONS) - set(OUR_OPTIONS))
    if unknown:
        return f"unknown OPTIONS {', '.join(unknown)} (known: {', '.join(DJANGO_OPTIONS + OUR_OPTIONS)})"
    if max_entries < 1:
        return f"MAX_ENTRIES must be at least 1, not {max_entries}"
    if cull_frequency < 0:
        return f"CULL_FREQUENCY must be 0 or more, not {cull_frequency}"
    maxbytes = options.get("MAXBYTES")
    if maxbytes is not None and (type(maxbytes) is not int or maxbytes < 1):
        return f"MAXBYTES must be a positive int or None, not {maxbytes!r}"
    auto_unlink = options.get("AUTO_UNLINK", False)
    if not (auto_unlink is False or auto_unlink is True or auto_unlink == "last"):
        return f"AUTO_UNLINK must be False, True or 'last', not {auto_unlink!r}"
    path = options.get("PATH")
    if path is None:
        if "SYNC" in options or "SYNC_INTERVAL" in options:
            return "SYNC and SYNC_INTERVAL apply to a cache kept in files: set OPTIONS['PATH'] too"
        return None
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        return f"PATH must be a directory's path, not {path!r}"
    if "AUTO_UNLINK" in options:
        return "AUTO_UNLINK does not apply to a cache kept in files (PATH): it is never removed by a worker"
    sync = options.get("SYNC")
    if sync is not None and sync not in SYNC_MODES:
        return f"SYNC must be one of {', '.join(SYNC_MODES)}, not {sync!r}"
    interval = options.get("SYNC_INTERVAL")
    number = isinstance(interval, (int, float)) and not isinstance(interval, bool)
    if interval is not None and not (number and interval > 0):
        return f"SYNC_INTERVAL must be a positive number of seconds, not {interval!r}"
    if interval is not None and sync is not None and sync != "interval":
        return f"SYNC_INTERVAL is for SYNC 'interval', not {sync!r}"
    return None


class SharedCache(BaseCache):  # type: ignore[misc, unused-ignore]
    """Django cache backend over :class:`ultradict_ng.cache.SharedCache` (module
    docstring: settings, lifetime, semantics)."""

    def __init__(self, location: str, params: dict[str, Any]) -> None:
        super().__init__(params)
        options = params.get("OPTIONS") or {}
        path = options.get("PATH")
        if not location and path is None:
            raise ImproperlyConfigured(
                "ultradict_ng.integrations.django.SharedCache needs a LOCATION: the name of "
                "the shared cache, the same in every process that shares it (or OPTIONS['PATH']: "
                "a directory to keep it in)"
            )
        if location and path is not None:
            raise ImproperlyConfigured(
                f"the shared cache {location!r}: give a LOCATION (shared memory) or OPTIONS['PATH'] "
                f"(files), not both"
            )
        problem = _bad_options(options, self._max_entries, self._cull_frequency)
        if problem is not None:
            raise ImproperlyConfigured(f"the shared cache {location or path!r}: {problem}")
        where: dict[str, Any]
        if path is None:
            where = {"auto_unlink": options.get("AUTO_UNLINK", False)}
        else:
            where = {"path": absolute(os.fsdecode(path))}
            for key, option in (("sync", "SYNC"), ("sync_interval", "SYNC_INTERVAL")):
                if options.get(option) is not None:
                    where[key] = options[option]
        backend = f"{type(self).__module__}.{type(self).__qualname__}"
        limits = {
            "capacity": _capacity(backend, location, where.get("path"), self._max_entries),
            "max_entries": self._max_entries,
            "cull_frequency": self._cull_frequency,
            "maxbytes": options.get("MAXBYTES"),
        }
        self._cache = _open(location, limits, where)
        self.location = location or where["path"]

    def validate_key(self, key: Any) -> None:
        """``BaseCache.validate_key`` (its warnings, word for word), after a quick
        test that lets through the keys it never warns about: its own check costs
        more than the rest of a ``get``."""
        if len(key) > MEMCACHE_MAX_KEY_LENGTH or " " in key or not key.isprintable():
            super().validate_key(key)  # isprintable() is False for every control character

    def _ttl(self, timeout: Any) -> float | None:
        """Django's timeout as SharedCache's ttl: relative seconds, None for never,
        <= 0 for expired (``get_backend_timeout`` without the clock)."""
        return self.default_timeout if timeout is DEFAULT_TIMEOUT else timeout  # type: ignore[no-any-return]

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        try:
            return self._cache.add(key, value, self._ttl(timeout))
        except TooLarge:  # larger than MAXBYTES: not stored, as memcached's too-large items
            return False

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        key = self.make_and_validate_key(key, version=version)
        return self._cache.get(key, default)

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> None:
        key = self.make_and_validate_key(key, version=version)
        try:
            self._cache.set(key, value, self._ttl(timeout))
        except TooLarge:  # not stored; nor is the old value kept (a set replaces it)
            self._cache.delete(key)

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        return self._cache.touch(key, self._ttl(timeout))

    def delete(self, key: Any, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        return self._cache.delete(key)

    def has_key(self, key: Any, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        return key in self._cache

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        """As Django's own caches: ``value + delta``, kept with its expiry --
        an int in one compiled step, another value (a float, a bool) read and
        written under the cache's lock; a string raises ``TypeError``."""
        key = self.make_and_validate_key(key, version=version)
        core = self._cache
        with core.lock:
            try:
                return core.incr(key, delta)
            except KeyError:
                raise ValueError(f"Key '{key}' not found") from None
            except TypeError:  # (not an int)
                pass
            try:  # (its value and expiry read at once: it may expire now, lock or not)
                value, left = core._value_and_ttl(key)
            except KeyError:
                raise ValueError(f"Key '{key}' not found") from None
            new = value + delta
            core.set(key, new, ttl=left)
            return new

    def decr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return self.incr(key, -delta, version=version)

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        made = {self.make_and_validate_key(k, version=version): k for k in keys}
        return {made[k]: v for k, v in self._cache.get_many(made).items()}

    def set_many(
        self, data: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> list[Any]:
        made = {self.make_and_validate_key(k, version=version): (k, v) for k, v in data.items()}
        try:
            if made:
                self._cache.set_many({m: v for m, (_, v) in made.items()}, self._ttl(timeout))
            return []
        except TooLarge:  # (nothing was stored) one at a time, returning the keys that failed
            failed = []
            for m, (k, v) in made.items():
                try:
                    self._cache.set(m, v, self._ttl(timeout))
                except TooLarge:
                    self._cache.delete(m)
                    failed.append(k)
            return failed

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        made = [self.make_and_validate_key(k, version=version) for k in keys]
        if made:
            self._cache.delete_many(made)

    def clear(self) -> None:
        self._cache.clear()

    # close(): BaseCache's, which does nothing (module docstring says why).
