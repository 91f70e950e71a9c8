"""What every :class:`~ultradict_ng.SharedDict` method stands on: the
(engine, path) pair, the synced node it reads, what a read hands out for a
cached value (a nested view, a large value, a copy; snapshots for iteration),
and the two retry loops.

A handle's reads and writes race with other processes in exactly two ways,
and each race is handled here, once, for every method:

* a read meets a large value whose blob a newer state freed (``BlobGone``):
  :meth:`Handle._read` syncs and reads again;
* a checked write loses to another client that committed first
  (``Conflict``, from an engine that checks optimistically, as the Redis one
  does): :meth:`Handle._locked` decides again on the refreshed cache.

``shareddict.py`` writes each method as what it does on one consistent
node, and hands it to one of these loops.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from .._codec.codec import IMMUTABLE_TYPES, copy_value
from .._codec.placeholders import BlobRef, InlineArray, PickledBlobs
from .._engine import BlobGone, Conflict, Engine
from .._shm import layout as L
from ..speedups import ViewBase, first_to_export, set_immutable_types

__all__ = ["Handle", "MISSING"]

_W_STATE = L.W_STATE
_IMMUTABLE = IMMUTABLE_TYPES
_STORED = frozenset({BlobRef, InlineArray, PickledBlobs})  # placeholders of large values, arrays
set_immutable_types(IMMUTABLE_TYPES)  # what the compiled hit path hands out without a copy
#: "No value given" / "no such key", where None is a value.
MISSING: Any = object()

T = TypeVar("T")
H = TypeVar("H", bound="Handle")


class Handle(ViewBase):
    """A (store, path) pair: the root has path ``()``, a nested view the keys
    leading to it.  ``_store`` and ``_path`` live in the base class
    (``speedups.ViewBase``), where the compiled read hit path finds them."""

    __slots__ = ()

    _store: Engine
    _path: tuple[Any, ...]

    @classmethod
    def _on_engine(cls: type[H], engine: Engine, path: tuple[Any, ...] = ()) -> H:
        """A handle on an already open engine: how nested views are made, and
        how an engine other than the shared-memory one is put behind the facade."""
        view = ViewBase.__new__(cls)
        view._store = engine
        view._path = path
        return view

    def _view(self: H, path: tuple[Any, ...]) -> H:
        """A handle of the same class on the nested dict at ``path`` (sharing the store)."""
        return self._on_engine(self._store, path)

    def _node(self) -> dict[Any, Any]:
        """This handle's dict in the cache, synced first (one counter
        comparison when nothing changed); PathGone if it no longer exists."""
        s = self._store
        if s.words[_W_STATE] != s.seen:
            s.sync()
        return s.node(self._path) if self._path else s.data

    # -- what a read hands out ---------------------------------------------------------

    def _export(self, key: Any, value: Any) -> Any:
        """What a reader gets for a cached value: a nested view, the value of a
        large value or array (zero-copy for arrays), or a private copy.

        Raises ``BlobGone`` when a newer state dropped a blob this cache still
        references: callers read again in ``_read``'s loop."""
        tp = type(value)
        if tp is dict and self._store.recurse:
            return self._view(self._path + (key,))
        if tp in _STORED:
            return self._store.materialize(value)
        return copy_value(value, self._store.materialize)

    def _item(self, node: dict[Any, Any], key: Any, default: Any = MISSING) -> Any:
        """The user's value of ``node[key]``, for ``_read``: ``default`` if
        absent (KeyError if no default)."""
        value = node.get(key, MISSING)
        if value is MISSING:
            if default is MISSING:
                raise KeyError(key)
            return default
        return self._export(key, value)

    def _snapshot_keys(self) -> list[Any]:
        node = self._node()
        with self._store.mutex:
            return list(node)

    def _snapshot_items(self) -> list[tuple[Any, Any]]:
        def read(node: Any) -> list[tuple[Any, Any]]:  # (a dict, or a big dict's TableCache)
            with self._store.mutex:
                items, known = (list(node.items()), 0) if type(node) is dict else node.pairs()
            # Values handed out as they are, as by d[k] (a tuple of immutable items is one: a
            # table row; a TableCache's `known` leading rows are), checked in one compiled call.
            first = known + first_to_export(items[known:]) if known else first_to_export(items)
            if first < len(items):
                immutable = _IMMUTABLE
                items[first:] = [
                    (
                        k,
                        v
                        if type(v) in immutable or (type(v) is tuple and immutable.issuperset(map(type, v)))
                        else self._export(k, v),
                    )
                    for k, v in items[first:]
                ]
            return items

        return self._read(read)

    def _read(self, read: Callable[..., T], *args: Any) -> T:
        """``read(node, *args)`` on the synced node: the loop of every read that may
        export a large value.

        The race: between our sync and ``materialize``, another process
        replaced or deleted the value and freed its blob.  The engine raises
        ``BlobGone`` only once the published state has moved past the cache,
        so the next ``_node()`` syncs to that state and ``read`` runs on it.
        ``d[k]`` and ``get`` -- the hot reads -- try the value they already
        looked up first and enter this loop only after losing that race;
        values of immutable types hold no blob and never enter it."""
        while True:
            node = self._node()
            try:
                return read(node, *args)
            except BlobGone:
                continue

    def _locked(self, decide: Callable[[Engine, dict[Any, Any]], T]) -> T:
        """``decide(store, node)`` under the write lock, on a current cache: the
        loop of every mutation that checks the state.  ``decide`` commits at
        most one record, so the method is one atomic step.

        The race: an engine that checks optimistically (Redis) lets another
        client commit between our sync and our commit; ours then raises
        ``Conflict`` instead of publishing a decision taken on the old state,
        with the cache refreshed, and ``decide`` runs again on the new state
        (``node`` is looked up again: the refresh may have replaced it)."""
        s = self._store
        while True:
            s.begin_write()
            try:
                return decide(s, s.node(self._path) if self._path else s.data)
            except Conflict:
                continue
            finally:
                s.end_write()

    def _write(self, rec: list[Any]) -> None:
        """Publish ``rec``, a record whose effect does not depend on the state:
        at the root with no check at all (``Engine.write``, no loop); in a
        nested dict after checking that it still exists (``node`` raises
        PathGone)."""
        if not self._path:
            self._store.write(rec)
        else:
            self._locked(lambda s, node: s.commit(rec))
