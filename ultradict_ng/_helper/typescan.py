"""Pure-Python twins of typescan.c: the codec's scans of containers,
``types_within`` (may a dict take the fast packers?) and ``contains_type``
(does decoded data hold a foreign Timestamp?).
"""

from __future__ import annotations

import itertools
from typing import Any

__all__ = ["types_within", "contains_type"]


def types_within(container: Any, types: frozenset[type], levels: int = 0) -> bool:
    """Whether every member of a dict (keys and values), list, tuple, set or
    frozenset is of one of the exact ``types`` -- or, within ``levels`` more
    levels, is an exact dict, list, tuple, set or frozenset whose members are."""
    if not 0 <= levels <= 16:
        raise ValueError("types_within: levels must be 0..16")
    tp = type(container)
    if tp is dict:
        if types.issuperset(map(type, container)) and types.issuperset(map(type, container.values())):
            return True
        members: Any = itertools.chain(container, container.values())
    elif tp in _SEQUENCES:
        if types.issuperset(map(type, container)):
            return True
        members = container
    else:
        raise TypeError("types_within: container must be a dict, list, tuple, set or frozenset")
    if not levels:
        return False
    for m in members:
        if type(m) not in types and not (type(m) in _CONTAINERS and types_within(m, types, levels - 1)):
            return False
    return True


_SEQUENCES = frozenset({list, tuple, set, frozenset})
_CONTAINERS = frozenset({list, tuple, set, frozenset, dict})


def contains_type(obj: Any, tp: type, max_depth: int) -> bool:
    """Whether an object of exactly ``tp`` is anywhere inside ``obj`` (lists,
    tuples, sets, frozensets, dict keys and values), or containers nest deeper
    than ``max_depth`` (treated as found).  A container at a time:
    ``set(map(type, members))`` runs in C, so a million scalars cost two passes
    at C speed; only nested containers are visited further."""
    if type(obj) is tp:
        return True
    containers = _CONTAINERS
    stack = [(obj, max_depth)] if type(obj) in containers else []
    while stack:
        item, depth = stack.pop()
        if depth < 0:
            return True
        groups = (item.keys(), item.values()) if type(item) is dict else (item,)
        for members in groups:
            found = set(map(type, members))
            if tp in found:
                return True
            if not found.isdisjoint(containers):
                stack.extend((m, depth - 1) for m in members if type(m) in containers)
    return False
