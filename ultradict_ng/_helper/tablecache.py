"""Pure-Python twin of tablecache.c: ``TableCacheBase``, the base of a big
dict's cache (``_shm/tablecache.py``), whose set takes the subclass's rules.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["TableCacheBase"]


class TableCacheBase:
    """The state of a big dict's cache (``_shm/tablecache.TableCache``); its
    compiled twin sets and deletes str and int keys itself, leaving a new key unplaced
    (``pending``, marked True in ``fresh``) until :meth:`resolve` -- unless
    a count came within its last 16 such sets (``_since``).  Here every
    set and delete is the subclass's ``_setitem`` / ``_delitem``, which places
    each key at once: the same rule, one call more, and ``pending`` stays
    empty unless a caller fills it."""

    __slots__ = ("hot", "dead", "fresh", "changed", "_probe", "_limit", "pending", "_since")

    hot: dict[Any, Any]
    dead: set[Any]
    fresh: dict[Any, Optional[bool]]
    changed: set[Any]
    _probe: Optional[tuple[Any, int, int, int]]
    _limit: Optional[int]
    pending: list[Any]
    _since: int

    def __setitem__(self, key: Any, value: Any) -> None:
        self._setitem(key, value)  # type: ignore[attr-defined]

    def __delitem__(self, key: Any) -> None:
        self._delitem(key)  # type: ignore[attr-defined]

    def resolve(self) -> None:
        """Place every key of ``pending`` still marked True in ``fresh``: a
        counted one (the subclass's ``_counted``) leaves ``fresh`` for
        ``changed``, the rest stay fresh (marked None, in their place)."""
        self._since = 0
        batch, self.pending = self.pending, []
        fresh = self.fresh
        for i, key in enumerate(batch):
            if fresh.get(key) is not True:
                continue
            try:
                counted = self._counted(key)  # type: ignore[attr-defined]
            except BaseException:
                self.pending = batch[i:] + self.pending
                raise
            if fresh.get(key) is not True:  # (placed while it ran)
                continue
            if counted:
                self.changed.add(key)
                del fresh[key]
            else:
                fresh[key] = None
