"""What changed in a dict: :class:`Change`, and turning what a feed replays into changes.

``SharedDict.changes()`` yields :class:`Change` items from a change feed, the
engine's private reader of the dict (shared memory: ``_shm/feed.py``; Redis:
``_redis/feed.py``).  What a feed reports is built here, the same for both:
a change per record it replays, or -- when the records it missed are gone --
the difference between its cache and the newer full state, each item marked
``resync=True``; a value overwritten again before the feed saw it is
:data:`SUPERSEDED`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Callable, NamedTuple, Optional, Protocol

from ._shm import layout as L

__all__ = [
    "Change",
    "SUPERSEDED",
    "ChangeSource",
    "iterate",
    "changes_of_records",
    "changes_of_dump",
    "skeleton",
]


class _Superseded:
    """The value of a change to a large value that a later write has already
    replaced and removed from shared memory (its bytes are gone)."""

    _instance: Optional[_Superseded] = None

    def __new__(cls) -> _Superseded:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "SUPERSEDED"

    def __reduce__(self) -> str:
        return "SUPERSEDED"


SUPERSEDED: Any = _Superseded()


class Change(NamedTuple):
    """One mutation, as the change feed reports it.

    ``op`` is ``"set"``, ``"delete"`` or ``"clear"``; ``path`` the keys from
    the root to the nested dict it happened in (``()`` for the root); ``key``
    the key (None for a clear); ``value`` the new value for a set (None
    otherwise): a private copy (nested dicts as plain dicts), arrays
    zero-copy, or :data:`SUPERSEDED` for a large value a later write already
    removed.  ``resync`` is True for the items of a catch-up: the feed fell
    behind a full dump, and these are the difference between what it had and
    that dump, instead of the mutations it missed.
    """

    op: str
    path: tuple[Any, ...]
    key: Any
    value: Any = None
    resync: bool = False


class ChangeSource(Protocol):
    """What an engine's change feed offers (``Engine.feed()``)."""

    def poll(self) -> list[Change]:
        """The changes replayed since the last poll (empty: none yet)."""

    @property
    def ended(self) -> bool:
        """True once the dict was removed: no change will come."""

    def wait(self, deadline: Optional[float]) -> bool:
        """Sleep until something may be new (True) or ``deadline`` passed (False)."""


def skeleton(node: dict[Any, Any]) -> dict[Any, Any]:
    """A copy of a cache tree's dicts, sharing its leaves.  Enough for a
    private cache: replaying records replaces leaves and mutates only dicts."""
    out: dict[Any, Any] = {}
    stack: list[tuple[dict[Any, Any], dict[Any, Any]]] = [(node, out)]
    while stack:
        src, dst = stack.pop()
        for k, v in src.items():
            if type(v) is dict:
                child: dict[Any, Any] = {}
                dst[k] = child
                stack.append((v, child))
            else:
                dst[k] = v
    return out


def _same(a: Any, b: Any, dumps: Callable[[Any], bytes]) -> bool:
    """Whether a resync may skip ``b`` replacing ``a``: the same bytes under the
    dict's serializer.  Not ``==``: ``[1]`` and ``[True]``, ``0.0`` and ``-0.0``
    are equal but not the same value, and a NaN or an array is not equal to itself."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return dumps(a) == dumps(b)
    except Exception:  # (cannot tell: report it)
        return False


def changes_of_records(out: list[Change], export: Callable[[Any], Any], records: list[Any]) -> None:
    """Append the changes ``records`` make (before they are applied: a later
    record of the batch may change a nested dict in place)."""
    for rec in records:
        op, path = rec[0], tuple(rec[1])
        if op == L.OP_SET:
            out.append(Change("set", path, rec[2], export(rec[3])))
        elif op == L.OP_DEL:
            out.append(Change("delete", path, rec[2]))
        elif op == L.OP_CLEAR:
            out.append(Change("clear", path, None))
        elif op == L.OP_UPDATE:
            out.extend(Change("set", path, k, export(v)) for k, v in rec[2])


def changes_of_dump(
    out: list[Change],
    export: Callable[[Any], Any],
    dumps: Callable[[Any], bytes],
    old: dict[Any, Any],
    new: dict[Any, Any],
) -> None:
    """Append the difference from tree ``old`` to tree ``new``, as resync changes:
    a dict's deletions, then its keys in ``new``'s order, a nested dict's
    changes where its key is (depth first).  So the key written last comes
    last -- a reader that stops at a marker key its writer sets after the
    rest (``done``) has applied the rest; level by level, it came before
    every nested change of the batch."""

    def deletions(path: tuple[Any, ...], old_node: dict[Any, Any], new_node: dict[Any, Any]) -> None:
        for k in old_node:
            if k not in new_node:
                out.append(Change("delete", path, k, None, True))

    deletions((), old, new)
    stack: list[tuple[tuple[Any, ...], dict[Any, Any], Iterator[tuple[Any, Any]]]] = [
        ((), old, iter(new.items()))
    ]
    while stack:
        path, old_node, items = stack[-1]
        for k, v in items:
            if k in old_node:
                ov = old_node[k]
                if type(ov) is dict and type(v) is dict:  # (its changes here, then this dict's next keys)
                    deletions(path + (k,), ov, v)
                    stack.append((path + (k,), ov, iter(v.items())))
                    break
                if _same(ov, v, dumps):
                    continue
            out.append(Change("set", path, k, export(v), True))
        else:
            stack.pop()


def iterate(feed: ChangeSource, timeout: Optional[float]) -> Iterator[Change]:
    """``SharedDict.changes``: the feed's changes as they come; ends when none
    arrives for ``timeout`` seconds (None: never) or the dict is unlinked."""
    while True:
        batch = feed.poll()
        if batch:
            yield from batch
            continue
        if feed.ended:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        if not feed.wait(deadline):
            return
