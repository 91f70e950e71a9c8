"""Pure-Python twin of tablecache.c: ``TableCacheBase``, the base of a big
dict's cache (``_shm/tablecache.py``), whose set takes the subclass's rules.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["TableCacheBase"]


class TableCacheBase:
    """The state of a big dict's cache (``_shm/tablecache.TableCache``); its
    compiled twin sets str and int keys itself, here every set and delete is
    the subclass's ``_setitem`` / ``_delitem``: the same rule, one call more."""

    __slots__ = ("hot", "dead", "fresh", "changed", "_probe", "_limit")

    hot: dict[Any, Any]
    dead: set[Any]
    fresh: dict[Any, None]
    changed: set[Any]
    _probe: Optional[tuple[Any, int, int, int]]
    _limit: Optional[int]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._setitem(key, value)  # type: ignore[attr-defined]

    def __delitem__(self, key: Any) -> None:
        self._delitem(key)  # type: ignore[attr-defined]
