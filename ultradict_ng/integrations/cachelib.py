"""A cachelib cache -- and so a Flask-Caching backend -- shared by every process on the machine.

>>> from ultradict_ng.integrations.cachelib import SharedCache
>>> cache = SharedCache(name="myapp", threshold=1000, default_timeout=300)
>>> cache.set("user:1", {"name": "Ada"})
True
>>> cache.get("user:1")
{'name': 'Ada'}

Every process that opens ``SharedCache(name="myapp")`` sees the same entries: a
gunicorn or uwsgi worker's ``set`` is the next request's hit in any other worker.
It is a thin adapter (``pip install 'ultradict_ng[flask]'``) over
:class:`ultradict_ng.cache.SharedCache`, which holds the policy -- expiry, the
size bound, the atomic ``add`` and ``incr`` -- on one shared dict.

Semantics are cachelib's (its ``SimpleCache``, ``FileSystemCache`` and
``RedisCache`` agree on these):

- **timeouts** in whole seconds or a ``timedelta``: ``None`` is ``default_timeout``,
  ``0`` never expires, a negative one is already expired.  Expiry is checked at
  every read, in every process.
- **threshold** bounds the number of entries: past it, the least recently used go
  (cachelib's ``SimpleCache`` drops the soonest to expire; both keep the cache at
  about ``threshold``).  ``0`` means no bound, as in ``FileSystemCache``.  The
  bound is stored with the cache: every process passes the same one (the default
  500 counts), or ``threshold=None`` to take the stored one.
- **values** go through ``self.serializer`` (pickle, as in every cachelib cache;
  Flask-Caching's ``CACHE_SERIALIZER`` or an assignment replaces it), except
  ``int``\\ s, stored as numbers -- as ``RedisCache`` stores them -- so that
  ``inc``/``dec`` are one atomic step in shared memory, and, with the default
  serializer, plain data the codec gives back exactly (a dict, list, set,
  float, bool or None of str, int, float, bool, None, bytes and tuples, exact
  types): stored as itself, a read is a copy of the decoded value, ~3x faster
  than unpickling it.  (Never a str or bytes: a serializer's output is one.)
- ``add`` is atomic: of several processes adding one key, exactly one wins.
  ``inc``/``dec`` are atomic and exact; a missing key starts at 0 and gets the
  default timeout, an existing one keeps its expiry (as with Redis's ``INCRBY``).
- ``key_prefix`` (a string, or a callable returning one, as in ``RedisCache``) is
  put before every key, and ``clear()`` then removes only the keys that carry it.
  Keys are strings; anything else raises ``TypeError`` (as in ``FileSystemCache``).

Lifetime: a named cache **outlives the processes that use it** (``auto_unlink=False``,
the default with a name), as a ``FileSystemCache`` directory or a Redis server
does: a value one worker sets is there for the next request, whichever worker
serves it, even when the setter has exited before -- gunicorn's
``--max-requests`` recycles workers, a timeout kills one, Flask's reloader
restarts its child at each edit, a deploy stops every worker before starting
the new ones, and a cache removed whenever no worker happens to be alive would
be empty after each of them.  What that costs is bounded: ``threshold`` bounds
what stays in ``/dev/shm`` (RAM) until the cache is removed
(``ultradict-ng rm NAME``, ``SharedCache.unlink_by_name(name)``) or the machine
reboots.  ``auto_unlink="last"`` removes it when the last process using it
closes it or exits (good for tests); ``True`` when this handle closes.  A cache
made without a name (shared with forked children only) is removed with its
last user: nobody could find it afterwards.

Kept in files: ``path="/var/cache/myapp"`` (``CACHE_OPTIONS={"path": ...}``)
instead of a name keeps the cache in that directory, as
:class:`ultradict_ng.cache.SharedCache` does: it survives restarts, reboots
and power loss by its ``sync`` policy (``"interval"`` by default), is shared by
every process that passes the directory, and is removed only on request
(``backend.cache.unlink()``, ``ultradict-ng rm PATH``).

Values are unpickled when read: like a ``FileSystemCache`` directory or a Redis
server, the shared memory must be writable only by the application's user (it
is: segments are created mode 0600).

Flask-Caching (tested with 2.5)::

    app.config.update(
        CACHE_TYPE="ultradict_ng.integrations.flask.SharedCache",
        CACHE_DEFAULT_TIMEOUT=300, CACHE_THRESHOLD=1000, CACHE_KEY_PREFIX="myapp:",
        CACHE_OPTIONS={"name": "myapp"},
    )

That path (:mod:`ultradict_ng.integrations.flask`: this class as a subclass of
Flask-Caching's ``BaseCache``) is built through :meth:`SharedCache.factory`,
which reads ``CACHE_THRESHOLD`` and ``CACHE_KEY_PREFIX`` as Flask-Caching's own
backends do.  This module's path also works, but Flask-Caching calls a
``CACHE_TYPE`` whose path contains "cachelib" as a plain cachelib class --
``SharedCache(*CACHE_ARGS, default_timeout=..., ignore_delete_many_errors=...,
**CACHE_OPTIONS)`` -- so there the threshold and prefix go in ``CACHE_OPTIONS``.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import TYPE_CHECKING, Any, Callable, Union

from cachelib import BaseCache
from cachelib.serializers import BaseSerializer

from ..cache import SharedCache as _Core
from ..cache.entries import plain_data
from ..errors import AlreadyExists, NotFound, ParameterMismatch, TooLarge

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["SharedCache"]

#: What a timeout may be: whole seconds, a ``timedelta``, or None for the default.
Timeout = Union[int, float, dt.timedelta, None]

_MISSING = object()


# What a serializer's dumps returns: stored values of other types are themselves.
_SERIALIZED = (bytes, str)


class SharedCache(BaseCache):
    """cachelib's cache interface over one :class:`ultradict_ng.cache.SharedCache`.

    :param name: the shared cache's name: every process that passes it uses the
        same entries.  ``None`` makes a fresh one (shared with forked children and
        with whoever is told ``cache.name``).
    :param threshold: the most entries kept; past it the least recently used are
        evicted.  ``0``: no bound.  Stored with the cache: a process that attaches
        with a different value gets ``ParameterMismatch`` (a ``ValueError``) -- give
        every process the same one (the default 500 counts), or ``None``: whatever
        the cache has (500 if this call creates it).
    :param default_timeout: seconds (or a ``timedelta``) an entry lives when
        ``set`` gets no timeout; ``0``: forever.  Each process's own setting.
    :param key_prefix: put before every key (a string, or a callable returning one).
    :param ignore_delete_many_errors: as in cachelib (a shared-memory delete never
        fails, so ``delete_many`` never raises).
    :param auto_unlink: ``False`` (the default for a named cache): it outlives
        every process until removed.  ``"last"`` (the default without a name):
        removed when the last process using it closes it or exits.  ``True``:
        removed when *this* handle closes.
    :param create: ``None`` attach or create; ``True`` must create; ``False`` must attach.
    :param path: instead of ``name``, a directory: the cache is kept in files
        there (:class:`ultradict_ng.cache.SharedCache`'s ``path``), survives a
        restart and a reboot, and is never removed automatically (``auto_unlink``
        does not apply).  Every process that passes the directory shares it.
    :param sync: with ``path``, the sync policy: ``"always"``, ``"interval"``
        (the default: on the disk within a second) or ``"never"``.
    """

    #: The default serializer: pickle (cachelib's).  Flask-Caching's
    #: ``CACHE_SERIALIZER``, or an assignment to ``cache.serializer``, replaces it.
    serializer: Any = BaseSerializer()

    def __init__(
        self,
        name: str | None = None,
        threshold: int | None = 500,
        default_timeout: int | dt.timedelta = 300,
        key_prefix: str | Callable[[], str] | None = None,
        ignore_delete_many_errors: bool = True,
        auto_unlink: bool | str | None = None,
        create: bool | None = None,
        path: str | None = None,
        sync: str | None = None,
    ) -> None:
        BaseCache.__init__(self, default_timeout)
        if isinstance(self.default_timeout, dt.timedelta):  # cachelib < 0.17 keeps timedeltas
            self.default_timeout = math.ceil(self.default_timeout.total_seconds())
        self.ignore_delete_many_errors = ignore_delete_many_errors
        self.key_prefix = key_prefix or ""
        if path is None:
            if sync is not None:
                raise ValueError("sync applies to a cache kept in files: pass path= too")
            if auto_unlink is None:  # (named: outlives its processes; unnamed: nobody could find it later)
                auto_unlink = False if name is not None else "last"
            where: dict[str, Any] = {"auto_unlink": auto_unlink}
        else:
            if name is not None:
                raise ValueError("pass a name (shared memory) or a path (files), not both")
            if auto_unlink not in (None, False):
                raise ValueError("a cache kept in files is never removed automatically: drop auto_unlink")
            where = {"path": path, "sync": sync}
        self._cache = _open(name, threshold, create, where)

    @classmethod
    def factory(cls, app: Any, config: dict[str, Any], args: list[Any], kwargs: dict[str, Any]) -> Self:
        """Flask-Caching's backend factory: ``kwargs`` holds ``default_timeout``,
        ``ignore_delete_many_errors`` and ``CACHE_OPTIONS``; ``CACHE_THRESHOLD`` and
        ``CACHE_KEY_PREFIX`` are read from ``config`` (``CACHE_OPTIONS`` wins).
        Flask-Caching calls it for the path ``ultradict_ng.integrations.flask.SharedCache``.

        A name is required (``CACHE_OPTIONS={"name": ...}`` or ``CACHE_ARGS=[name]``):
        an app's workers share the cache they open by one name, and a cache
        made without one would be each worker's own."""
        if not args and kwargs.get("name") is None and kwargs.get("path") is None:
            raise ValueError(
                "the shared cache needs a name, the same in every worker: "
                "CACHE_OPTIONS={'name': 'myapp-cache'} (or CACHE_ARGS=['myapp-cache']), "
                "or a directory to keep it in: CACHE_OPTIONS={'path': '/var/cache/myapp'}"
            )
        if "CACHE_THRESHOLD" in config:
            kwargs.setdefault("threshold", config["CACHE_THRESHOLD"])
        if config.get("CACHE_KEY_PREFIX"):
            kwargs.setdefault("key_prefix", config["CACHE_KEY_PREFIX"])
        return cls(*args, **kwargs)

    # -- the handle --------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The shared cache's name (pass it to another process to share the entries)."""
        return str(self._cache.name)

    @property
    def cache(self) -> _Core:
        """The :class:`ultradict_ng.cache.SharedCache` underneath (unprefixed keys,
        stored values: serialized bytes, or ints)."""
        return self._cache

    def close(self) -> None:
        """Detach this handle (with ``auto_unlink="last"``: the last one out removes the cache;
        by default a named cache stays for the next process)."""
        self._cache.close()

    # No ``unlink`` method: Flask-Caching's ``Cache.unlink(*keys)`` calls the
    # backend's ``unlink`` (Redis's UNLINK: delete those keys) when it has one, and
    # would remove the whole cache.  Without it, it deletes the keys.  To remove the
    # cache for everybody: ``backend.cache.unlink()`` or ``unlink_by_name``.

    @staticmethod
    def unlink_by_name(name: str) -> int:
        """Remove the cache ``name`` for every process now (also after a crash, or one
        made with ``auto_unlink=False``); returns the segments removed."""
        return int(_Core.unlink_by_name(name))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__qualname__} {self.name!r} threshold={self._cache.maxsize}>"

    # -- keys, values, timeouts ----------------------------------------------------------

    def _prefix(self) -> str:
        prefix = self.key_prefix
        return prefix if isinstance(prefix, str) else prefix()

    def _key(self, key: str, prefix: str | None = None) -> str:
        if not isinstance(key, str):
            raise TypeError(f"cache keys are strings, not {type(key).__name__}: {key!r}")
        return (self._prefix() if prefix is None else prefix) + key

    def _dump(self, value: Any) -> Any:
        """What is stored: an ``int`` as itself (``inc`` adds to it in place), anything
        else as the serializer's bytes; ``_MISSING`` if the serializer failed
        (cachelib's serializers log that and return None)."""
        if type(value) is int:  # not bool, not an IntEnum: those round-trip through pickle
            return value
        if type(value) not in _SERIALIZED and type(self.serializer) is BaseSerializer and plain_data(value):
            return value
        data = self.serializer.dumps(value)
        return _MISSING if data is None else data

    def _load(self, stored: Any) -> Any:
        if type(stored) not in _SERIALIZED:  # an int, or plain data stored as itself
            return stored
        return self.serializer.loads(stored)

    def _ttl(self, timeout: Timeout) -> float | None:
        """cachelib's timeout as the core's ttl: seconds, ``None`` for never."""
        seconds: Any = self._normalize_timeout(timeout)  # type: ignore[arg-type]
        if isinstance(seconds, dt.timedelta):  # cachelib < 0.17
            seconds = math.ceil(seconds.total_seconds())
        if seconds == 0:
            return None
        return float(seconds)

    # -- cachelib's interface ------------------------------------------------------------

    def get(self, key: str) -> Any:
        stored = self._cache.get(self._key(key), _MISSING)
        return None if stored is _MISSING else self._load(stored)

    def get_many(self, *keys: str) -> list[Any]:
        prefix = self._prefix()
        wanted = [self._key(k, prefix) for k in keys]
        found = self._cache.get_many(wanted)
        return [self._load(found[k]) if k in found else None for k in wanted]

    def has(self, key: str) -> bool:
        return self._key(key) in self._cache

    def set(self, key: str, value: Any, timeout: Timeout = None) -> bool:
        stored = self._dump(value)
        if stored is _MISSING:
            return False
        try:
            self._cache.set(self._key(key), stored, ttl=self._ttl(timeout))
        except TooLarge:  # not stored; nor is the old value kept (a set replaces it)
            self._cache.delete(self._key(key))
            return False
        return True

    def add(self, key: str, value: Any, timeout: Timeout = None) -> bool:
        stored = self._dump(value)
        if stored is _MISSING:
            return False
        try:
            return bool(self._cache.add(self._key(key), stored, ttl=self._ttl(timeout)))
        except TooLarge:
            return False

    def set_many(self, mapping: dict[str, Any], timeout: Timeout = None) -> list[Any]:
        prefix = self._prefix()
        stored: dict[str, Any] = {}
        done: list[Any] = []
        for key, value in mapping.items():
            data = self._dump(value)
            if data is not _MISSING:
                stored[self._key(key, prefix)] = data
                done.append(key)
        try:
            if stored:
                self._cache.set_many(stored, ttl=self._ttl(timeout))  # one lock for all
        except TooLarge:  # (nothing was stored) one at a time, leaving out the ones too large
            done = [k for k in done if self.set(k, mapping[k], timeout)]
        return done

    def delete(self, key: str) -> bool:
        return bool(self._cache.delete(self._key(key)))

    def delete_many(self, *keys: str) -> list[Any]:
        # One locked step removes them all: at its end none of them is present, so
        # every key counts as deleted (cachelib: "a key that is absent after the
        # attempt counts as deleted"); nothing is left to raise about.
        prefix = self._prefix()
        self._cache.delete_many([self._key(k, prefix) for k in keys])
        return list(keys)

    def clear(self) -> bool:
        prefix = self._prefix()
        if not prefix:
            self._cache.clear()
            return True
        with self._cache.lock:  # only this prefix's keys, as RedisCache does
            self._cache.delete_many(
                [k for k in list(self._cache) if isinstance(k, str) and k.startswith(prefix)]
            )
        return True

    def inc(self, key: str, delta: int = 1) -> Any:
        return self._add_to(self._key(key), delta)

    def dec(self, key: str, delta: int = 1) -> Any:
        return self._add_to(self._key(key), -delta)

    def _add_to(self, key: str, delta: int) -> Any:
        """Atomic and exact from any number of processes (one step under the
        cache's lock).  An int is added to in place and keeps its expiry; a
        missing key starts at 0 with the default timeout; another stored value
        is added to as cachelib's caches do (``(value or 0) + delta``: a float
        works, ``None`` counts as 0, a string raises ``TypeError``) and keeps
        its expiry."""
        core = self._cache
        with core.lock:
            try:
                return core.incr(key, delta)
            except KeyError:
                core.set(key, delta, ttl=self._ttl(None))
                return delta
            except TypeError:  # a serialized value: a float, a bool, a string ...
                pass
            try:  # (its value and expiry read at once: it may expire now, lock or not)
                value, left = core._value_and_ttl(key)
            except KeyError:
                core.set(key, delta, ttl=self._ttl(None))
                return delta
            new = (self._load(value) or 0) + delta
            stored = self._dump(new)
            if stored is _MISSING:
                return None
            core.set(key, stored, ttl=left)
            return new


#: cachelib's default threshold: what ``threshold=None`` creates a cache with.
DEFAULT_THRESHOLD = 500


def _open(name: str | None, threshold: int | None, create: bool | None, where: dict[str, Any]) -> _Core:
    """The core cache: bounded by ``threshold`` (checked against a stored bound), or,
    for ``None``, attached with whatever bound it has, or created with the default.
    ``where``: ``auto_unlink``, or ``path`` and ``sync`` for a cache kept in files."""
    if threshold is not None or (name is None and "path" not in where):
        if threshold is None:
            threshold = DEFAULT_THRESHOLD
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise ValueError(f"threshold must be an int >= 0 or None, not {threshold!r}")
        core = _Core(name, maxsize=threshold or None, create=create, **where)
        if threshold == 0 and core.maxsize is not None:  # (None is "not given" to the core: checked here)
            core.close()
            raise ParameterMismatch(
                f"the cache was created with threshold={core.maxsize}, not 0 (no bound); "
                "pass threshold=None to use the stored one"
            )
        return core
    while True:
        # Attach first: passing a bound would be checked against the stored one.  If
        # it is absent, create it; if another process created it meanwhile, attach again.
        if create is not True:
            try:
                return _Core(name, create=False, **where)
            except NotFound:
                if create is False:
                    raise
        try:
            return _Core(name, maxsize=DEFAULT_THRESHOLD, create=True, **where)
        except AlreadyExists:
            if create is True:
                raise
