"""A cache shared by processes: :class:`SharedCache` (expiry, size bounds,
eviction every process sees) and :func:`cached` (``functools.lru_cache``
across processes, with stampede protection).  The protocol is in
:mod:`ultradict_ng.cache.layout`.

The names are imported on first use (PEP 562): the layout module is read by
the shared-memory engine's cleanup and survey, which must not pull in the
cache, whose modules import the engine in turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .memoize import cached
    from .sharedcache import DEFAULT_TTL, SharedCache

__all__ = ["SharedCache", "cached", "DEFAULT_TTL"]


def __getattr__(name: str) -> Any:
    if name == "cached":
        from .memoize import cached

        return cached
    if name in ("SharedCache", "DEFAULT_TTL"):
        from . import sharedcache

        return getattr(sharedcache, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
