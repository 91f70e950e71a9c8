"""``cached``: ``functools.lru_cache`` whose cache every process shares, with
stampede protection.

When several processes (or threads) miss one key at once, exactly one
computes it: under the cache's lock the first writes a *claim* entry for the
key (cache_layout: "Entries"), the others find the claim and wait for the
change that replaces it with the value.  A computation that raises removes
its claim (the exception is not cached; a waiter then claims and computes);
a claim whose owner process is dead (SIGKILL) is taken over by a waiter.
The claim's owner is an owner word (pid and start time), so a reused pid
does not pass for the dead owner.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import os
import pickle
import secrets
import threading
import time
from typing import Any, Callable, NamedTuple, Optional

from .._platform import faults
from .._platform.owner import owner_alive, owner_word
from ..errors import TooLarge
from .entries import slot_of
from .sharedcache import DEFAULT_TTL, SharedCache

__all__ = ["cached", "CacheInfo"]

#: Seconds between a waiter's checks that the claim's owner is alive.
OWNER_CHECK = 0.1
#: A waiter's longest sleep between looks at the key.
WAIT_SLICE = 0.05
_PICKLED = "\x00pickled"  # marks an argument the codec cannot key (its pickle stands in)
_SCALARS = (type(None), bool, int, float, str, bytes)
_MISSING: Any = object()


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    maxsize: Optional[int]
    currsize: int


def _name_for(func: Callable[..., Any]) -> str:
    """The cache name of ``func`` when none is given: the same in every process
    that imports it (module and qualified name), short enough for macOS."""
    where = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func.__name__)}"
    return "udngc_" + hashlib.blake2b(where.encode(), digest_size=7).hexdigest()


def _keyable(arg: Any) -> Any:
    """``arg`` as a key the codec stores: scalars and tuples of them as they
    are, anything else by its pickle (so methods key on their instance's state)."""
    tp = type(arg)
    if tp in _SCALARS:
        return arg
    if tp is tuple:
        return tuple(_keyable(a) for a in arg)
    if tp is frozenset:
        try:
            return frozenset(_keyable(a) for a in arg)
        except TypeError:
            pass
    try:
        return (_PICKLED, pickle.dumps(arg, pickle.HIGHEST_PROTOCOL))
    except Exception as exc:
        raise TypeError(
            f"cached: the argument {arg!r} is neither a key the codec stores nor "
            f"picklable ({exc}); pass cached(key=...) to key calls yourself"
        ) from exc


def _make_key(args: tuple[Any, ...], kwargs: dict[str, Any], typed: bool) -> Any:
    key: tuple[Any, ...] = tuple(_keyable(a) for a in args)
    if kwargs:
        key += (_PICKLED,) + tuple(x for k, v in kwargs.items() for x in (k, _keyable(v)))
    if typed:
        key += tuple(f"{type(v).__module__}.{type(v).__qualname__}" for v in (*args, *kwargs.values()))
    return key


class _Claims:
    """The claim protocol on one cache (every step under the cache's lock)."""

    def __init__(self, cache: SharedCache) -> None:
        self.cache = cache

    def claim(self, key: Any) -> tuple[str, Any]:
        """("value", v) if ``key`` holds a live value; ("mine", token) if this call
        now owns the computation; ("wait", claim entry) if a live process does."""
        c = self.cache
        now = time.time()
        with c.lock:
            e = c._dget(key)
            if slot_of(e, c._side.nslots) < 0:
                e = None  # absent, or not an entry (another program's): overwritten
            if e is not None and len(e) == 3 and (not e[0] or e[0] > now):
                return "value", c._value(e)
            if e is not None and len(e) == 4 and owner_alive(e[2]):
                return "wait", e
            token = secrets.randbits(63)
            c._put(key, None, 0.0, now, claim=(owner_word(), token))
        if faults.armed is not None:
            faults.hit("cache-claimed")
        return "mine", token

    def fulfil(self, key: Any, token: int, value: Any, ttl: Any) -> None:
        """Store the computed value (over our claim, or over whatever replaced it);
        a value too large for the cache's maxbytes is returned uncached (as a
        waiter that takes over then computes it again)."""
        try:
            self.cache.set(key, value, ttl)
        except TooLarge:
            self.abandon(key, token)

    def abandon(self, key: Any, token: int) -> None:
        """Remove our claim (the computation raised): a waiter takes over."""
        c = self.cache
        with c.lock:
            e = c._dget(key)
            if type(e) is tuple and len(e) == 4 and e[3] == token:
                c._delete(key, e)

    def still_waiting(self, key: Any, claim: Any) -> bool:
        """Whether ``key`` still holds ``claim`` (of a live owner, checked by the caller)."""
        e = self.cache._dget(key)
        return type(e) is tuple and len(e) == 4 and e[3] == claim[3]


def cached(
    name: Optional[str] = None,
    maxsize: Optional[int] = 128,
    ttl: Optional[float] = None,
    typed: bool = False,
    *,
    serializer: str = "msgpack",
    key: Optional[Callable[..., Any]] = None,
) -> Callable[[Callable[..., Any]], Any]:
    """Decorator: memoize a function in a cache every process shares.

    Shaped like ``functools.lru_cache``: ``cache_info()`` (hits and misses
    of this process; maxsize; entries of all), ``cache_clear()`` (for every
    process), ``cache_parameters()``, ``__wrapped__``; plus ``cache()``,
    which returns this process's :class:`SharedCache` of it.  ``name`` (default: derived from the function's
    module and qualified name, so every process importing it shares one
    cache) names the cache, which lives while a process uses it
    (``auto_unlink="last"``).  ``ttl``: seconds a result stays.  Arguments are
    keyed by value: scalars and tuples as they are, anything else (``self``
    of a method included) by its pickle.  Results go through the safe codec
    (``serializer="pickle"`` for any picklable result, among trusted
    processes); ``key``: a function of the call's arguments returning the
    key instead (e.g. ``lambda self, x: (self.id, x)``).  Works on ``async
    def`` functions: waiting never blocks the event loop.
    """
    if callable(name):  # @cached without parentheses
        return cached()(name)

    def decorate(func: Callable[..., Any]) -> Any:
        cache_name = name or _name_for(func)
        make_key = key
        opened: dict[str, Any] = {}
        guard = threading.Lock()
        stats = [0, 0]  # hits, misses (this process)

        def cache() -> SharedCache:
            c = opened.get("cache")
            if c is None or opened.get("pid") != os.getpid():
                with guard:
                    c = opened.get("cache")
                    if c is None or opened.get("pid") != os.getpid():
                        c = SharedCache(
                            cache_name, maxsize=maxsize, ttl=ttl, serializer=serializer, auto_unlink="last"
                        )
                        opened["cache"], opened["pid"] = c, os.getpid()
                        opened["claims"] = _Claims(c)
            return c

        def lookup(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
            key = make_key(*args, **kwargs) if make_key is not None else _make_key(args, kwargs, typed)
            value = cache().get(key, _MISSING)
            if value is _MISSING:
                stats[1] += 1
            else:
                stats[0] += 1
            return key, value

        def waited(key: Any, claim: Any, last_check: float) -> tuple[bool, float]:
            """(still waiting, when the owner was last checked)."""
            claims: _Claims = opened["claims"]
            if not claims.still_waiting(key, claim):
                return False, last_check
            now = time.monotonic()
            if now - last_check >= OWNER_CHECK:
                if not owner_alive(claim[2]):
                    return False, now
                last_check = now
            return True, last_check

        if inspect.iscoroutinefunction(func):

            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                key, value = lookup(args, kwargs)
                if value is not _MISSING:
                    return value
                claims: _Claims = opened["claims"]
                while True:
                    state, got = claims.claim(key)
                    if state == "value":
                        return got
                    if state == "mine":
                        try:
                            result = await func(*args, **kwargs)
                        except BaseException:
                            claims.abandon(key, got)
                            raise
                        claims.fulfil(key, got, result, DEFAULT_TTL)
                        return result
                    delay, checked = 0.001, time.monotonic()
                    while True:
                        waiting, checked = waited(key, got, checked)
                        if not waiting:
                            break
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, WAIT_SLICE)

            wrapper: Any = async_wrapper
        else:

            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                key, value = lookup(args, kwargs)
                if value is not _MISSING:
                    return value
                claims: _Claims = opened["claims"]
                while True:
                    state, got = claims.claim(key)
                    if state == "value":
                        return got
                    if state == "mine":
                        try:
                            result = func(*args, **kwargs)
                        except BaseException:
                            claims.abandon(key, got)
                            raise
                        claims.fulfil(key, got, result, DEFAULT_TTL)
                        return result
                    checked = time.monotonic()
                    d = claims.cache._d
                    while True:
                        waiting, checked = waited(key, got, checked)
                        if not waiting:
                            break
                        d.wait_for_change(timeout=WAIT_SLICE)

            wrapper = sync_wrapper

        def cache_info() -> CacheInfo:
            return CacheInfo(stats[0], stats[1], maxsize, len(cache()))

        def cache_clear() -> None:
            cache().clear()
            stats[0] = stats[1] = 0

        functools.update_wrapper(wrapper, func)
        wrapper.cache_info = cache_info
        wrapper.cache_clear = cache_clear
        wrapper.cache_parameters = lambda: {
            "maxsize": maxsize,
            "typed": typed,
            "ttl": ttl,
            "name": cache_name,
        }
        wrapper.cache = cache
        return wrapper

    return decorate
