"""UltraDict raises UltraDict's exceptions from every method, by construction.

The compat classes are built with ``ultradict_ng.compat.errors.map_errors``, which wraps
every method-like attribute they have or inherit.  These tests check that
structurally (every method reachable on the class is a mapped wrapper),
by behaviour (every public method of a closed handle raises ``AlreadyClosed``
or returns), and for a method that ``SharedDict`` does not have yet.
"""

from __future__ import annotations

import inspect
import types
from typing import Any, Callable

import pytest

import ultradict_ng
from ultradict_ng import SharedDict, UltraDict
from ultradict_ng._shm import layout as L
from ultradict_ng.compat import Exceptions, UltraLock
from ultradict_ng.compat.errors import NOT_MAPPED, is_mapped, map_errors, mapped
from ultradict_ng.compat.lock import _LockHold

E = UltraDict.Exceptions
COMPAT_ERRORS = tuple(v for v in vars(Exceptions).values() if isinstance(v, type))

_C_CALLABLES = (
    types.WrapperDescriptorType,
    types.MethodDescriptorType,
    types.ClassMethodDescriptorType,
    types.BuiltinFunctionType,
)


def owner_of(cls: type, name: str) -> type:
    return next(k for k in cls.__mro__ if name in vars(k))


def callables_of(attr: Any) -> list[Any]:
    """The functions behind a class attribute, [] if it is not method-like."""
    if isinstance(attr, property):
        return [f for f in (attr.fget, attr.fset, attr.fdel) if f is not None]
    if isinstance(attr, (staticmethod, classmethod)):
        return [attr.__func__]
    if isinstance(attr, (types.FunctionType,) + _C_CALLABLES):
        return [attr]
    if callable(attr) and not isinstance(attr, type):
        return [attr]  # any other callable counts as a method too
    return []


def method_names(cls: type) -> list[str]:
    """Method-like attributes reachable on ``cls`` that must be mapped."""
    names = []
    for name in dir(cls):
        owner = owner_of(cls, name)
        if owner is object or name in NOT_MAPPED:
            continue
        if callables_of(vars(owner)[name]):
            names.append(name)
    return names


def unmapped(cls: type) -> list[str]:
    return [
        name
        for name in method_names(cls)
        if not all(is_mapped(f) for f in callables_of(vars(owner_of(cls, name))[name]))
    ]


# -- (a) structure ------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [UltraDict, UltraLock, _LockHold])
def test_every_method_is_a_mapped_wrapper(cls: type) -> None:
    assert unmapped(cls) == []


def test_the_walk_sees_inherited_c_and_private_methods() -> None:
    names = set(method_names(UltraDict))
    # a C slot of the compiled base, SharedDict's methods and the abc mixins' ones,
    # the helpers views call later, a classmethod, a staticmethod, properties
    assert {
        "__getitem__",
        "__setitem__",
        "get",
        "keys",
        "items",
        "values",
        "__iter__",
        "_node",
        "_snapshot_keys",
        "_snapshot_items",
        "fromkeys",
        "unlink_by_name",
        "lock",
        "closed",
        "name",
        "status",
        "__init__",
        "__eq__",
    } <= names
    assert len(names) > 45


def test_exclusions_are_object_protocol_only() -> None:
    assert all(n.startswith("__") and n.endswith("__") for n in NOT_MAPPED)
    assert {"get", "keys", "__getitem__", "__init__", "_node"}.isdisjoint(NOT_MAPPED)


def test_mapping_is_idempotent() -> None:
    before = {k: v for k, v in vars(UltraDict).items()}
    assert map_errors(UltraDict) is UltraDict
    assert {k: v for k, v in vars(UltraDict).items()} == before  # same objects, nothing rewrapped
    fn = mapped(len)
    assert mapped(fn) is fn


def test_compat_errors_pass_through_unchanged() -> None:
    err = E.AlreadyClosed("closed")

    @mapped
    def fails() -> None:
        raise err

    with pytest.raises(E.AlreadyClosed) as info:
        fails()
    assert info.value is err and info.value.__cause__ is None


def test_errors_without_a_counterpart_pass_through() -> None:
    err = ultradict_ng.PathGone("gone")

    @mapped
    def fails() -> None:
        raise err

    with pytest.raises(ultradict_ng.PathGone) as info:
        fails()
    assert info.value is err


# -- (b) behaviour on a closed handle -----------------------------------------------------

#: Arguments for the public methods whose required parameters are not all keys.
PLAUSIBLE: dict[str, Callable[[Any, str], tuple[Any, ...]]] = {
    "fromkeys": lambda ud, name: (["k"], 1),
    "unlink_by_name": lambda ud, name: (name + "gone",),
    "update": lambda ud, name: ({"k": 1},),
    "pop": lambda ud, name: ("k", None),
    "setdefault": lambda ud, name: ("k", 1),
}


def default_args(fn: Any) -> tuple[Any, ...]:
    """A key for every required positional parameter (after self)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return ()
    required = [
        p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return tuple("k" for _ in required)


PUBLIC_METHODS = sorted(
    n
    for n in method_names(UltraDict)
    if not n.startswith("_") and not isinstance(vars(owner_of(UltraDict, n))[n], property)
)
PUBLIC_PROPERTIES = sorted(
    n
    for n in dir(UltraDict)
    if not n.startswith("_") and isinstance(vars(owner_of(UltraDict, n))[n], property)
)


def call_closed(fn: Callable[[], Any]) -> Any:
    """Run ``fn``; it must return or raise one of UltraDict's exceptions."""
    try:
        return fn()
    except COMPAT_ERRORS as exc:
        return exc
    except ultradict_ng.SharedDictError as exc:
        pytest.fail(f"raised {type(exc).__module__}.{type(exc).__name__}, not an UltraDict exception: {exc}")


@pytest.fixture
def closed(name: str) -> UltraDict:
    ud = UltraDict({"k": 1, "n": {"x": 1}}, name=name, recurse=True)
    ud.close()
    return ud


@pytest.mark.parametrize("method", PUBLIC_METHODS)
def test_closed_handle_methods_raise_already_closed_or_return(
    closed: UltraDict, name: str, method: str
) -> None:
    bound = getattr(closed, method)
    args = PLAUSIBLE[method](closed, name) if method in PLAUSIBLE else default_args(bound)
    result = call_closed(lambda: bound(*args))
    if isinstance(result, UltraDict):  # fromkeys made a new dict
        result.close()
    if isinstance(result, BaseException) and method not in ("unlink_by_name",):
        assert isinstance(result, E.AlreadyClosed), (method, result)


@pytest.mark.parametrize("prop", PUBLIC_PROPERTIES)
def test_closed_handle_properties_raise_already_closed_or_return(closed: UltraDict, prop: str) -> None:
    result = call_closed(lambda: getattr(closed, prop))
    if isinstance(result, BaseException):
        assert isinstance(result, E.AlreadyClosed), (prop, result)


OPERATIONS: dict[str, Callable[[Any], Any]] = {
    "getitem": lambda d: d["k"],
    "setitem": lambda d: d.__setitem__("k", 2),
    "delitem": lambda d: d.__delitem__("k"),
    "contains": lambda d: "k" in d,
    "len": len,
    "iter": list,
    "reversed": lambda d: list(reversed(d)),
    "eq": lambda d: d == {},
    "ne": lambda d: d != {},
    "or": lambda d: d | {},
    "ror": lambda d: {} | d,
    "with": lambda d: d.__enter__(),
    "keys": lambda d: list(d.keys()),
    "values": lambda d: list(d.values()),
    "items": lambda d: list(d.items()),
    "reversed keys": lambda d: list(reversed(d.keys())),
    "key in keys": lambda d: "k" in d.keys(),
    "item in items": lambda d: ("k", 1) in d.items(),
    "value in values": lambda d: 1 in d.values(),
    "len keys": lambda d: len(d.keys()),
    "repr keys": lambda d: repr(d.keys()),
}


@pytest.mark.parametrize("nested", [False, True], ids=["root", "nested view"])
@pytest.mark.parametrize("op", list(OPERATIONS))
def test_closed_handle_operations_raise_already_closed(name: str, op: str, nested: bool) -> None:
    ud = UltraDict({"k": 1, "n": {"k": 1}}, name=name, recurse=True)
    target = ud["n"] if nested else ud
    views = (target.keys(), target.values(), target.items())  # made before closing
    ud.close()
    with pytest.raises(E.AlreadyClosed):
        OPERATIONS[op](target)
    for view in views:
        with pytest.raises(E.AlreadyClosed):
            list(view)
    assert repr(target).endswith("(closed)>")


# -- (c) a method SharedDict does not have yet --------------------------------------------


class Tomorrow(SharedDict):
    """SharedDict with a method and a property added after the compat layer was written."""

    __slots__ = ()

    def published_state(self) -> int:
        return int(self._store.words[L.W_STATE])

    @property
    def state_word(self) -> int:
        return int(self._store.words[L.W_STATE])


@map_errors
class CompatTomorrow(Tomorrow):
    __slots__ = ()


def test_a_new_shareddict_method_is_mapped(name: str) -> None:
    assert unmapped(CompatTomorrow) == []
    assert "published_state" in method_names(CompatTomorrow)
    plain = Tomorrow(name=name)
    compat = CompatTomorrow(name=name)
    assert compat.published_state() == plain.published_state()
    compat.close()
    plain.close()
    with pytest.raises(ultradict_ng.Closed) as info:  # the plain class raises ours ...
        plain.published_state()
    assert not isinstance(info.value, E.AlreadyClosed)
    with pytest.raises(E.AlreadyClosed):  # ... the decorated one UltraDict's
        compat.published_state()
    with pytest.raises(E.AlreadyClosed):
        _ = compat.state_word
    with pytest.raises(E.AlreadyClosed):
        compat["k"]  # the C slot of the compiled base (or its Python twin)
    with pytest.raises(E.AlreadyClosed):
        list(compat.items())


def test_the_decorator_refuses_what_it_cannot_map() -> None:
    class Odd:
        class _Callable:
            def __call__(self, *args: Any) -> None:
                pass

        method = _Callable()  # a callable object: it does not bind like a method

    with pytest.raises(TypeError, match="cannot map"):
        map_errors(Odd)
