"""Opening a cache: its dict, then its side segment (or file) -- and what
a creation refused between the two undoes.

The dict is opened (or made) first, as any ``SharedDict``; the side, which
holds the cache's settings and slots, is attached or made under the dict's
lock (``side.open_side``).  Refused there (no room for the slots, settings
that differ from the stored ones, an interrupt), the handle closes without
its ``auto_unlink`` -- the dict may be another opener's by then -- and a
dict this call made is removed only while nothing else uses it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, cast

from .._platform import segments
from .._shm import users
from .._shm.store import Store
from ..errors import NotFound
from ..shareddict import SharedDict
from . import layout as C
from .side import Side, open_side

__all__ = ["check_settings", "open_parts"]


def check_settings(
    maxsize: Any, maxbytes: Any, ttl: Any, serializer: Any, cull_frequency: Any
) -> dict[str, Any]:
    """The settings given (not None), each refused before anything is made:
    one the side's words cannot hold failed only once the dict existed."""
    out: dict[str, Any] = {}
    for key, value in (("maxsize", maxsize), ("maxbytes", maxbytes)):
        if value is not None:
            if type(value) is not int or not 1 <= value < C.MAX_SETTING:
                raise ValueError(f"{key} must be a positive int (below 2**56) or None, not {value!r}")
            out[key] = value
    if ttl is not None:
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
            raise ValueError(f"ttl must be a positive number of seconds or None, not {ttl!r}")
        out["ttl"] = float(ttl)
    if serializer is not None:
        if serializer not in C.SERIALIZERS:
            raise ValueError(f"serializer must be 'msgpack' or 'pickle', not {serializer!r}")
        out["serializer"] = serializer
    if cull_frequency is not None:
        if type(cull_frequency) is not int or not 0 <= cull_frequency < C.MAX_SETTING:
            raise ValueError(
                f"cull_frequency must be an int >= 0 (below 2**56) or None, not {cull_frequency!r}"
            )
        out["cull_frequency"] = cull_frequency
    return out


def _discard_created(d: SharedDict) -> None:
    """The dict a refused cache creation made (its side file could not be:
    no room for its slots, an interrupt) removed: as if never made.  Only
    while it holds no key and no side and nothing else uses it -- another
    process or handle that opened it, to make the cache in it next, keeps
    it.  In files that is asked under the dict's lock and its directory's,
    which every opener registers under; in shared memory under the dict's
    lock, and an opener that attached meanwhile finds the dict removed when
    it would make the side, and starts over (``open_side``'s ``removed``)."""
    store = cast(Store, d._store)

    def unused() -> bool:
        return (
            len(d) == 0
            and d.stats()["users"] <= 1
            and users.handles((store.name, store.token)) <= 1
            and not segments.exists(C.cache_name(d.name))
        )

    if store.durable is not None:
        store.durable.remove(store, only_if=unused)
        return
    with d.lock:
        if unused():
            d.unlink()


#: Times a cache's opener starts over when the dict is removed as it opens it.
_RACES = 8


def _removed(d: SharedDict) -> Callable[[], bool]:
    """Whether ``d`` was removed, asked under its lock before a side is made for it."""
    return lambda: bool(d.stats()["unlinked"])


def open_parts(
    name: Optional[str],
    create: Optional[bool],
    auto_unlink: Any,
    buffer_size: Optional[int],
    where: dict[str, Any],
    wanted: dict[str, Any],
    explicit: dict[str, Any],
) -> tuple[SharedDict, Side]:
    """The cache's dict and side, as ``SharedCache`` takes them (see the module docstring)."""
    attempts = 0
    while True:
        d = SharedDict(name, create, auto_unlink=auto_unlink, buffer_size=buffer_size, backend="shm", **where)
        try:
            token = d.stats()["token"]
            side = open_side(d.name, token, d.lock, wanted, explicit, d.__len__, _removed(d))
            return d, side
        except NotFound:  # (removed as this opened it: a creation refused elsewhere, or an unlink)
            cast(Store, d._store).keep_at_close()  # (the name may hold another's dict by now)
            d.close()
            attempts += 1
            if create is False or attempts == _RACES:
                raise
        except BaseException:
            store = cast(Store, d._store)
            try:
                if store.created:
                    _discard_created(d)
            finally:
                store.keep_at_close()  # (removed above, or another opener's: never by this close)
                d.close()
            raise
