"""A cache shared by processes: :class:`SharedCache` (expiry, size bounds,
eviction every process sees) and :func:`cached` (``functools.lru_cache``
across processes, with stampede protection).  The protocol is in
:mod:`ultradict_ng.cache_layout`."""

from .memoize import cached
from .sharedcache import DEFAULT_TTL, SharedCache

__all__ = ["SharedCache", "cached", "DEFAULT_TTL"]
