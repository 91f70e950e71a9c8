"""Every exception class of the package: its place in the hierarchy, and pickling.

Exceptions cross processes pickled (``multiprocessing.Pool``, queues,
``concurrent.futures``), so each one must come back as the same class with
the same message and attributes.  The classes are found by introspection --
``errors.__all__``, the UltraDict compat modules, ``UltraDict.Exceptions``
and every subclass of ``SharedDictError`` defined in the package -- so a class
added later is covered without editing this file.
"""

from __future__ import annotations

import inspect
import multiprocessing
import pickle
import types
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

import ultradict_ng
from ultradict_ng import UltraDict, compat, errors
from ultradict_ng.compat import errors as compat_errors
from ultradict_ng.compat import lock as compat_lock

spawn = multiprocessing.get_context("spawn")
_MISSING = object()


def _package_exceptions() -> list[type]:
    found = {getattr(errors, name) for name in errors.__all__}
    for module in (ultradict_ng, compat, compat_errors, compat_lock):
        found |= {v for v in vars(module).values() if isinstance(v, type) and issubclass(v, BaseException)}
    found |= {v for v in vars(UltraDict.Exceptions).values() if isinstance(v, type)}
    stack = [errors.SharedDictError]
    while stack:  # subclasses defined anywhere in the package
        for sub in stack.pop().__subclasses__():
            if sub.__module__.split(".")[0] == "ultradict_ng":
                found.add(sub)
                stack.append(sub)
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))


CLASSES = _package_exceptions()
IDS = [f"{c.__module__.rsplit('.', 1)[-1]}.{c.__qualname__}" for c in CLASSES]

#: Values for the keyword-only constructor parameters of the classes.
SAMPLE_KWARGS: dict[str, Any] = {
    "name": "tdict",
    "pid": 4242,
    "blocking_pid": 4242,
    "timestamp": 12.5,
    "time_passed": 0.25,
}


def sample(cls: type) -> BaseException:
    """An instance with a message and every keyword attribute set to a non-default value."""
    kwargs: dict[str, Any] = {}
    for klass in cls.__mro__:  # keywords may be passed on to a base's __init__ (**kwargs)
        init = vars(klass).get("__init__")
        if not isinstance(init, types.FunctionType):
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind is not p.KEYWORD_ONLY or p.name in kwargs:
                continue
            if p.name in SAMPLE_KWARGS:
                kwargs[p.name] = SAMPLE_KWARGS[p.name]
            elif p.default is p.empty:
                pytest.fail(f"add a sample value for {cls.__qualname__}({p.name}=...) to SAMPLE_KWARGS")
    exc: BaseException = cls(f"{cls.__name__}: shared dict 'tdict' sample message", **kwargs)
    return exc


def state(exc: BaseException) -> tuple[Any, ...]:
    """Everything a receiver can observe: class, str(), args, and every data attribute."""
    attrs = {}
    for attr in dir(exc):
        if attr.startswith("__"):
            continue
        value = getattr(exc, attr, _MISSING)  # OSError.characters_written raises when unset
        if value is _MISSING or callable(value):
            continue
        attrs[attr] = value
    return type(exc), str(exc), exc.args, attrs


def raise_it(exc: BaseException) -> None:
    """Run in a spawned worker: raise the (unpickled) exception it was sent."""
    raise exc


def test_discovery_finds_both_families() -> None:
    names = {c.__qualname__ for c in CLASSES}
    assert set(errors.__all__) <= names
    compat_names = {c for c in CLASSES if c.__module__ == "ultradict_ng.compat.errors"}
    assert {c.__name__ for c in compat_names} == {
        "AlreadyExists",
        "CannotAttachSharedMemory",
        "CannotAcquireLock",
        "CannotAcquireLockTimeout",
        "ParameterMismatch",
        "AlreadyClosed",
        "FullDumpMemoryFull",
        "MissingDependency",
    }
    assert len(CLASSES) == len(errors.__all__) + len(compat_names)


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_subclasses_shared_dict_error_and_a_builtin(cls: type) -> None:
    assert issubclass(cls, errors.SharedDictError)
    builtin = [b for b in cls.__mro__ if b.__module__ == "builtins" and issubclass(b, BaseException)]
    if cls is errors.SharedDictError:
        assert builtin[0] is Exception
    else:  # something more specific a caller would catch: ValueError, TimeoutError ...
        assert [b for b in builtin if b not in (Exception, BaseException)], cls.__mro__


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_pickles_with_its_attributes(cls: type, protocol: int) -> None:
    exc = sample(cls)
    again = pickle.loads(pickle.dumps(exc, protocol=protocol))
    assert type(again) is cls
    assert state(again) == state(exc)
    assert "sample message" in str(again)


def test_sample_attributes_are_the_interesting_ones() -> None:
    """The round trip above compares real values, not defaults."""
    lt = sample(errors.LockTimeout)
    assert (lt.name, lt.pid) == ("tdict", 4242)  # type: ignore[attr-defined]
    oos = sample(errors.OutOfSpace)
    assert oos.errno == 28 and "sample message" in oos.strerror  # type: ignore[attr-defined]
    t = sample(compat.CannotAcquireLockTimeout)
    assert (t.blocking_pid, t.timestamp, t.time_passed, t.pid, t.name) == (  # type: ignore[attr-defined]
        4242,
        12.5,
        0.25,
        4242,
        "tdict",
    )


def test_cross_a_spawned_process_both_ways() -> None:
    """Sent to a spawned worker as an argument, raised there, and re-raised here."""
    samples = [sample(cls) for cls in CLASSES]
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        futures = [pool.submit(raise_it, exc) for exc in samples]
        for exc, future in zip(samples, futures):
            with pytest.raises(type(exc)) as info:
                future.result(timeout=60)
            assert type(info.value) is type(exc)
            assert state(info.value) == state(exc)
