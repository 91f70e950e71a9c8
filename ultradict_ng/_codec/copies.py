"""The caller's own copies of values read from a process's cache.

Every process decodes a value once, into its cache; a read of a mutable value
hands out a copy that shares no mutable object with the cache (the caller may
change it).  A plain tree -- lists, dicts, tuples, sets and bytearrays down to
immutable values -- is copied by one compiled call (``speedups.copy_plain``,
``_helper/copytree.c``); anything else (a blob's placeholder, becoming the
large value it stands for; a type only pickle stores; a tree deeper than the
compiled copy goes) by the Python rules here, which give the same result.
"""

from __future__ import annotations

import copy
import operator
from typing import Any, Callable, Optional

from ..speedups import copy_plain
from .ext import LEAF_TYPES
from .placeholders import BlobRef, InlineArray, PickledBlobs

__all__ = ["IMMUTABLE_TYPES", "copy_value"]

#: Types whose values are immutable all the way down: the cache hands them out as they are.
IMMUTABLE_TYPES: frozenset[type] = LEAF_TYPES | {frozenset}
_IMMUTABLE_TYPES = IMMUTABLE_TYPES


def _copy(value: Any, stored: Optional[Callable[[Any], Any]]) -> Any:
    tp = type(value)
    if tp in _IMMUTABLE_TYPES:
        return value
    if tp in _STORED_TYPES:
        return value if stored is None else stored(value)
    if tp is list:
        if _IMMUTABLE_TYPES.issuperset(map(type, value)):
            return value.copy()
        return [_copy(item, stored) for item in value]
    if tp is dict:
        if _IMMUTABLE_TYPES.issuperset(map(type, value.values())):
            return value.copy()
        return {key: _copy(item, stored) for key, item in value.items()}
    if tp is tuple:
        if _IMMUTABLE_TYPES.issuperset(map(type, value)):
            return value
        items = [_copy(item, stored) for item in value]
        if all(map(operator.is_, items, value)):
            return value
        return tuple(items)
    if tp is set:
        return value.copy()
    if tp is bytearray:
        return bytearray(value)
    return copy.deepcopy(value)


def copy_value(value: Any, stored: Optional[Callable[[Any], Any]] = None) -> Any:
    """Return a copy of *value* that shares no mutable object with it.

    Immutable values (and tuples holding only immutable values) are returned
    as they are.  Lists, dicts, sets and bytearrays are copied, recursively;
    dict keys and set members are hashable and so are not copied.  Cache
    placeholders of large values and arrays (``placeholders.BlobRef``,
    ``placeholders.InlineArray``, ``placeholders.PickledBlobs``) become
    ``stored(placeholder)`` (they stay as they are without ``stored``).  Any
    other type (possible only with the pickle serializer) is ``copy.deepcopy``-ed.
    """
    if type(value) in _IMMUTABLE_TYPES:
        return value
    out = copy_plain(value)  # (a plain tree, copied in one compiled call)
    if out is not None:
        return out
    try:
        return _copy(value, stored)
    except RecursionError:  # nested deeper than the stack allows here, or a cycle (pickle)
        return _copy_without_recursion(value, stored)


def _copy_without_recursion(root: Any, stored: Optional[Callable[[Any], Any]]) -> Any:
    """What ``_copy`` returns, with an explicit stack instead of recursion.

    Why: a value the codec accepts (up to MAX_NESTING levels) must read back
    from any call depth, and ``_copy`` takes a frame per level.  Lists and
    dicts are memoized by identity, so a cyclic value (only the pickle
    serializer can make one) is copied as a cycle; other non-codec types are
    ``copy.deepcopy``-ed as in ``_copy``.
    """
    memo: dict[int, Any] = {}

    def finished(v: Any) -> tuple[bool, Any]:
        tp = type(v)
        if tp in _IMMUTABLE_TYPES:
            return True, v
        if tp is list or tp is dict or tp is tuple:
            seen = memo.get(id(v), _NOT_SEEN)
            return (seen is not _NOT_SEEN), seen
        if tp in _STORED_TYPES:
            return True, (v if stored is None else stored(v))
        if tp is set:
            return True, v.copy()
        if tp is bytearray:
            return True, bytearray(v)
        return True, copy.deepcopy(v)

    def frame(v: Any) -> list[Any]:
        """[original, children, copies of the children so far, the new container]"""
        new: Any = None
        if type(v) is list:
            new = memo[id(v)] = []
            return [v, v, [], new]
        if type(v) is dict:
            new = memo[id(v)] = {}
            return [v, list(v.values()), [], new]
        return [v, list(v), [], new]  # a tuple: built when its items are

    stack = [frame(root)]
    while True:
        top = stack[-1]
        orig, children, copies, new = top
        if len(copies) < len(children):
            done, result = finished(children[len(copies)])
            if done:
                copies.append(result)
            else:
                stack.append(frame(children[len(copies)]))
            continue
        if type(orig) is list:
            new.extend(copies)
        elif type(orig) is dict:
            new.update(zip(orig, copies))
        else:
            new = orig if all(map(operator.is_, copies, orig)) else tuple(copies)
        stack.pop()
        if not stack:
            return new
        stack[-1][2].append(new)


_NOT_SEEN: Any = object()
_STORED_TYPES = frozenset({BlobRef, InlineArray, PickledBlobs})
