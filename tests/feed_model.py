"""A model of the change feed for the tests: ops on a SharedDict or a plain dict,
the ``Change`` items an op gives, applying items to a replica, and type-exact
comparison (``[1]`` is not ``[True]``, ``0.0`` is not ``-0.0``)."""

from __future__ import annotations

import copy
from typing import Any

from ultradict_ng import Change, SharedDict


def node_at(root: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        root = root[key]
    return root


def apply_change(replica: dict[Any, Any], ch: Change) -> None:
    """What a consumer of the feed does with each item."""
    node = node_at(replica, ch.path)
    if ch.op == "set":
        node[ch.key] = copy.deepcopy(ch.value)
    elif ch.op == "delete":
        del node[ch.key]
    else:
        assert ch.op == "clear" and ch.key is None, ch
        node.clear()


def apply_op(d: Any, op: tuple[Any, ...]) -> Any:
    """One mutation of ``d`` (a SharedDict or a plain dict of the same content).
    ``("set"|"setdefault", path, key, value)``, ``("del"|"pop", path, key)``,
    ``("popitem", path)``, ``("clear", path)``, ``("update", path, [(k, v), ...])``,
    ``("dump",)`` (SharedDict only: a full dump, no change)."""
    kind = op[0]
    if kind == "dump":
        if isinstance(d, SharedDict):
            d._store.force_dump()
        return None
    if not isinstance(d, SharedDict):
        op = copy.deepcopy(op)  # a plain model must not share the op's values
    node = node_at(d, op[1])
    if kind == "set":
        node[op[2]] = op[3]
    elif kind == "setdefault":
        return node.setdefault(op[2], op[3])
    elif kind == "del":
        del node[op[2]]
    elif kind == "pop":
        return node.pop(op[2])
    elif kind == "popitem":
        return node.popitem()
    elif kind == "clear":
        node.clear()
    elif kind == "update":
        node.update(dict(op[2]))
    return None


def changes_of(model: dict[Any, Any], op: tuple[Any, ...]) -> list[Change]:
    """The feed items ``op`` gives when it is published as a record (before it is
    applied to ``model``); values are copies."""
    op = copy.deepcopy(op)
    kind, path = op[0], op[1] if len(op) > 1 else ()
    if kind == "dump":
        return []
    if kind in ("set", "setdefault"):
        if kind == "setdefault" and op[2] in node_at(model, path):
            return []
        return [Change("set", path, op[2], op[3])]
    if kind in ("del", "pop"):
        return [Change("delete", path, op[2])]
    if kind == "popitem":
        return [Change("delete", path, next(reversed(node_at(model, path))))]
    if kind == "clear":
        return [Change("clear", path, None)]
    return [Change("set", path, k, v) for k, v in op[2]]


def strict_equal(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (floats by repr: -0.0 != 0.0)."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        if len(a) != len(b) or a.keys() != b.keys():
            return False
        keys_b = {k: k for k in b}
        return all(type(keys_b[k]) is type(k) and strict_equal(v, b[k]) for k, v in a.items())
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(strict_equal(x, y) for x, y in zip(a, b))
    if type(a) is float:
        return repr(a) == repr(b)
    return bool(a == b)


def same_changes(got: list[Change], expected: list[Change]) -> bool:
    return len(got) == len(expected) and all(
        (g.op, g.path, g.key, g.resync) == (e.op, e.path, e.key, e.resync) and strict_equal(g.value, e.value)
        for g, e in zip(got, expected)
    )


def take_until(it: Any, last: Change) -> list[Change]:
    """Items of the feed up to and including ``last`` (the feed's timeout bounds it)."""
    out = []
    for ch in it:
        out.append(ch)
        if (ch.op, ch.path, ch.key) == (last.op, last.path, last.key) and strict_equal(ch.value, last.value):
            return out
    raise AssertionError(f"the feed ended before {last}; got {out}")
