"""Twin of ``copytree.c``: what a read hands out as it is, and the caller's own
copies of the rest.

The same rules, the same results: ``copy_plain`` copies lists, dicts,
tuples holding something mutable, sets and bytearrays down to the immutable
values, and answers None for anything else (a placeholder of a blob or an
array, another type the pickle serializer stored, a dict key other than a
scalar or a tuple of scalars under a mutable value, a tree nested deeper than
``COPY_DEPTH``): the Python rules (``codec.copy_value``) decide those.
"""

from __future__ import annotations

from typing import Any

__all__ = ["copy_plain", "first_to_export", "set_immutable_types", "COPY_DEPTH"]

#: Containers a copy goes into before it leaves the rest to the Python rules
#: (udng.h's UDNG_COPY_DEPTH).
COPY_DEPTH = 64

# Handed out without a copy whatever set_immutable_types says (the C checks
# these by pointer first).
_BASE: frozenset[type] = frozenset({int, str, float, bool, bytes, type(None)})

_immutable_types: frozenset[type] = _BASE


def _plain_key(k: Any) -> bool:
    """A dict key whose hash runs no Python code (a scalar, or a tuple of
    them): a copy only stores values under such keys."""
    return type(k) in _BASE or (type(k) is tuple and all(type(x) in _BASE for x in k))


class _NotPlain(Exception):
    """Raised inside a copy: the value is left to the Python rules."""


def set_immutable_types(types: frozenset[type]) -> None:
    """The types whose values the hit path may hand out without a copy."""
    global _immutable_types
    if type(types) is not frozenset:
        raise TypeError("set_immutable_types needs a frozenset of types")
    _immutable_types = types | _BASE


def _is_immutable_tuple(v: Any) -> bool:
    return type(v) is tuple and _immutable_types.issuperset(map(type, v))


def first_to_export(pairs: list[tuple[Any, Any]]) -> int:
    """Index of the first ``(key, value)`` whose value the hit path would not
    hand out as it is (not of an immutable type, nor a tuple of such); len if none."""
    types = _immutable_types
    for i, (_, v) in enumerate(pairs):
        tp = type(v)
        if tp not in types and not (tp is tuple and types.issuperset(map(type, v))):
            return i
    return len(pairs)


def _item(v: Any, depth: int) -> Any:
    return v if type(v) in _immutable_types else _copy(v, depth)


def _copy(v: Any, depth: int) -> Any:
    if depth > COPY_DEPTH:
        raise _NotPlain
    tp = type(v)
    if tp is dict:
        out = v.copy()
        for k, item in v.items():
            if type(item) in _immutable_types or _is_immutable_tuple(item):
                continue
            if not _plain_key(k):
                raise _NotPlain
            c = _copy(item, depth + 1)
            if c is not item:
                out[k] = c
        return out
    if tp is list:
        return [_item(item, depth + 1) for item in v]
    if tp is tuple:
        if _is_immutable_tuple(v):
            return v
        items = [_item(item, depth + 1) for item in v]
        return v if all(a is b for a, b in zip(items, v)) else tuple(items)
    if tp is set:
        return v.copy()
    if tp is bytearray:
        return bytearray(v)
    raise _NotPlain


def copy_plain(value: Any) -> Any:
    """The caller's own copy of a plain value (what ``codec.copy_value`` makes
    of it), or None: the value holds something else."""
    try:
        return _item(value, 1)
    except _NotPlain:
        return None
    except RecursionError:  # (called near the stack's limit: the compiled copy takes no frames)
        return None
