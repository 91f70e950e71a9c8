"""The views ``keys()``, ``values()`` and ``items()`` of a :class:`~ultradict_ng.SharedDict`.

They iterate a snapshot taken when iteration starts, so they never raise
because another process wrote meanwhile (a plain dict's views would raise
"changed size during iteration"); membership and ``len`` are live.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, ValuesView
from typing import Any, Protocol

__all__ = ["SharedKeysView", "SharedValuesView", "SharedItemsView", "Snapshots"]


class Snapshots(Protocol):
    """What the views need of their dict (a SharedDict): its snapshots and
    ``get``.  A protocol, not the class, so that this module and the facade
    do not import each other (type checking included)."""

    def _snapshot_keys(self) -> list[Any]: ...

    def _snapshot_items(self) -> list[tuple[Any, Any]]: ...

    def get(self, key: Any, default: Any = None) -> Any: ...

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...

    def __iter__(self) -> Iterator[Any]: ...


_MISSING: Any = object()


class SharedKeysView(KeysView):  # type: ignore[type-arg]
    """``d.keys()``: iterates a snapshot; membership and len are live."""

    _mapping: Snapshots

    def __iter__(self) -> Iterator[Any]:
        keys: list[Any] = self._mapping._snapshot_keys()
        return iter(keys)

    def __reversed__(self) -> Iterator[Any]:
        keys: list[Any] = self._mapping._snapshot_keys()
        return iter(keys[::-1])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._mapping._snapshot_keys()!r})"


class SharedValuesView(ValuesView):  # type: ignore[type-arg]
    """``d.values()``: iterates a snapshot of the values."""

    _mapping: Snapshots

    def __iter__(self) -> Iterator[Any]:
        values: list[Any] = [v for _, v in self._mapping._snapshot_items()]
        return iter(values)

    def __contains__(self, value: object) -> bool:
        return any(v is value or v == value for v in self)

    def __reversed__(self) -> Iterator[Any]:
        return iter([v for _, v in self._mapping._snapshot_items()][::-1])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


class SharedItemsView(ItemsView):  # type: ignore[type-arg]
    """``d.items()``: iterates a snapshot of (key, value) pairs."""

    _mapping: Snapshots

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        items: list[tuple[Any, Any]] = self._mapping._snapshot_items()
        return iter(items)

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, tuple) or len(item) != 2:
            return False
        key, value = item
        got = self._mapping.get(key, _MISSING)
        return got is not _MISSING and (got is value or got == value)

    def __reversed__(self) -> Iterator[tuple[Any, Any]]:
        items: list[tuple[Any, Any]] = self._mapping._snapshot_items()
        return iter(items[::-1])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"
