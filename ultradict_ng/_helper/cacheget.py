"""Pure-Python twin of cacheget.c: ``CacheGet``, SharedCache.get's hit path
(``cache/layout.py``, "Reading"), here the Python rules called directly.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CacheGet"]


class CacheGet:
    """A SharedCache handle's ``get(key, default=None)``.  The compiled one
    answers a hit on a view in sync itself (clock, expiry, recency store,
    copy); this twin asks ``slow(key)`` -- the Python rules, which return the
    value or ``missing`` -- every time, and counts the same way (it never
    reads ``view``, so it takes any handle, compiled or not)."""

    __slots__ = ("hits", "misses", "_slow", "_missing")

    def __init__(self, view: Any, recency: Any, loads: Any, slow: Any, missing: Any) -> None:
        if not callable(slow) or (loads is not None and not callable(loads)):
            raise TypeError("CacheGet: slow and loads (unless None) must be callable")
        self.hits = self.misses = 0
        self._slow = slow
        self._missing = missing

    def __call__(self, key: Any, default: Any = None) -> Any:
        value = self._slow(key)
        if value is self._missing:
            self.misses += 1
            return default
        self.hits += 1
        return value

    def release(self) -> None:
        """(The compiled one gives back its recency buffer here.)"""
