"""Pure-Python twins of readpath.c: ``StoreBase`` and ``ViewBase``, the bases
carrying the read hit path of a SharedDict.  The twins hold the same state;
their reads and writes take the Python paths (``SharedDict._getitem_slow``,
``_setitem_slow``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from .words import Words

__all__ = ["StoreBase", "ViewBase"]


class StoreBase:
    """What the read hit path needs from a store (``seen`` and ``data``), and
    the stream offset the cache reflects (``pos``)."""

    __slots__ = ("seen", "data", "pos", "recurse", "_immutable_types")

    seen: int
    #: The value types a read hands out without a copy (codec.IMMUTABLE_TYPES);
    #: the compiled read path's, which the twins take from the codec's rules.
    _immutable_types: Optional[frozenset[type]]
    #: Nested dicts are live views (a dict value is read as a view, not copied).
    recurse: bool
    #: The cache: a dict, or for a big dict a reader's ``_shm/tablecache.TableCache``
    #: (the read API of a dict; a writer turns it into a dict before it writes).
    data: dict[Any, Any]
    pos: int

    def _bind_state(self, words: Optional[Words], index: int) -> None:
        """Where the compiled hit path loads STATE; here the store's own
        memoryview does (see ``SharedDict._getitem_slow``)."""

    def _tx_fast(self, *args: Any) -> None:
        """Arms the compiled transaction write path; the twins have none: a
        transaction's writes all take ``SharedDict._setitem_slow``."""

    @property
    def _tx_last(self) -> int:
        """Where the compiled path's last record begins: it wrote none."""
        return -1


class ViewBase:
    """The two fields of a ``SharedDict`` handle: its store and its path.

    The compiled ``ViewBase.__getitem__`` answers a hit itself and calls the
    subclass's ``_getitem_slow`` otherwise; its ``__setitem__`` writes a
    scalar inside an open transaction itself and calls ``_setitem_slow``
    otherwise, and its ``__delitem__`` is ``_delitem_slow``.  Their twins: a
    subclass that defines ``_getitem_slow`` (``_setitem_slow``,
    ``_delitem_slow``) gets it as ``__getitem__`` (``__setitem__``,
    ``__delitem__``) directly, the same rules at the cost of one call.
    """

    __slots__ = ("_store", "_path")

    _store: Any
    _path: tuple[Any, ...]
    # The subclass's (SharedDict's): what the dunders below fall back on.
    _getitem_slow: Callable[[Any], Any]
    _setitem_slow: Callable[[Any, Any], None]
    _delitem_slow: Callable[[Any], None]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for slow, dunder in (
            ("_getitem_slow", "__getitem__"),
            ("_setitem_slow", "__setitem__"),
            ("_delitem_slow", "__delitem__"),
        ):
            method = cls.__dict__.get(slow)
            if method is not None:
                setattr(cls, dunder, method)

    def __getitem__(self, key: Any) -> Any:
        return self._getitem_slow(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._setitem_slow(key, value)

    def __delitem__(self, key: Any) -> None:
        self._delitem_slow(key)
