"""CPython's own mapping-protocol tests, run against SharedDict.

``test.mapping_tests`` is the suite CPython runs against ``dict``,
``UserDict`` and ``os.environ``: ``BasicTestMappingProtocol`` (what any
mapping must do), ``TestMappingProtocol`` (dict's methods, ``fromkeys`` on
subclasses, ``copy``, ``popitem`` on a few thousand keys) and
``TestHashMappingProtocol`` (keys whose ``__eq__``/``__hash__`` raise, repr,
mutation during iteration).  It is imported from the interpreter's ``test``
package when this module is collected.  An interpreter installed without
that package runs none of them: ``test_cpython_mapping_tests_are_available``
then skips with the reason -- and fails under ``CI=true``, so that a CI
image that lost the package does not turn the suite into a green skip.

Every test passes except the by-design differences in :data:`BY_DESIGN`,
each with its reason, expected to fail (``xfail(strict=True)``: one that
starts passing fails the run, and its entry is removed).

The dicts are made by :class:`Shared` (``type2test``): uniquely named,
auto-unlinked, closed by each test's cleanup, so nothing stays in /dev/shm
(conftest's leak check covers these names) or on the Redis server.  The
suite runs once per backend of ``ULTRADICT_NG_TEST_BACKENDS``, as the api
suite does.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest

from ultradict_ng import SharedDict, UnsupportedType

from .conftest import BACKENDS, unique_name

try:
    from test import mapping_tests
except ImportError as exc:  # an interpreter installed without its test package
    mapping_tests = None
    MISSING = (
        f"CPython's test.mapping_tests is not importable ({exc}): install the interpreter's test package"
    )
else:
    MISSING = ""


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def test_cpython_mapping_tests_are_available() -> None:
    if mapping_tests is None:
        if _ci():
            pytest.fail(MISSING + " -- CI=true, so this is a failure, not a skip", pytrace=False)
        pytest.skip(MISSING)


#: Handles the current test made; its cleanup closes them (the creator's
#: close unlinks: auto_unlink=True).
_MADE: list[SharedDict] = []


class Shared(SharedDict):
    """``type2test``: ``Shared()`` / ``Shared(data)`` / ``Shared(x=1)`` make a
    new, uniquely named dict that the test's cleanup closes and unlinks.
    The test suite subclasses it (``class dictlike(self.type2test)``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("name", unique_name())
        super().__init__(*args, auto_unlink=True, **kwargs)
        _MADE.append(self)


def _close_made() -> None:
    while _MADE:
        d = _MADE.pop()
        if not d.closed:
            d.close()


_COPIES = (
    "values read back are copies, not the stored objects (documented on SharedDict): "
    "d.setdefault(k, []).append(3) changes the returned list, not the dict"
)
_KEYS = (
    "keys must be storable by the dict's serializer, and these are classes local to a "
    "test (BadEq, BadHash, BadCmp): neither msgpack types nor picklable -- storing one "
    "raises UnsupportedType, so the checks of keys whose __eq__/__hash__ raise never run"
)

#: test name -> (the suite class that adds the failing check: it and its
#: subclasses fail; the exception the check fails with; why SharedDict
#: differs from dict there, by design).  A failure with another exception
#: is a real failure (xfail's ``raises``).
BY_DESIGN: dict[str, tuple[str, type, str]] = {
    "test_copy": (
        "TestMappingProtocol",
        AssertionError,
        "copy() returns a plain dict, a snapshot -- not another shared dict, which "
        "would need a name and shared memory of its own (documented on copy())",
    ),
    "test_setdefault": (
        "TestMappingProtocol",
        IndexError,
        _COPIES + "; in TestHashMappingProtocol also: " + _KEYS,
    ),
    "test_getitem": ("TestHashMappingProtocol", UnsupportedType, _KEYS),
    "test_pop": ("TestHashMappingProtocol", UnsupportedType, _KEYS),
    "test_eq": ("TestHashMappingProtocol", UnsupportedType, _KEYS),
    "test_repr": (
        "TestHashMappingProtocol",
        AssertionError,
        "repr names the dict, SharedDict({...}, name='...'), not a plain {...}; and "
        "d[1] = d stores a copy of d's contents, so there is no cycle to print as {...}",
    ),
    "test_repr_deep": (
        "TestHashMappingProtocol",
        UnsupportedType,
        "a value nested more than 500 containers deep is refused with UnsupportedType "
        "(the codec's limit, _codec/ext.py MAX_NESTING), before repr could recurse",
    ),
}


def _expect_failures(cls: type, suite: type) -> type:
    """Mark ``cls``'s by-design tests xfail(strict): each must fail, for its reason."""
    assert mapping_tests is not None
    for name, (since, raises, reason) in BY_DESIGN.items():
        test = getattr(cls, name, None)
        if test is None or not issubclass(suite, getattr(mapping_tests, since)):
            continue  # not in this Python's version of the suite, or not failing in this class

        def expected(self: Any, _test: Callable[[Any], None] = test) -> None:
            _test(self)

        expected.__name__ = name
        setattr(cls, name, pytest.mark.xfail(strict=True, raises=raises, reason=reason)(expected))
    return cls


class _OnSharedDict:
    """Mixed into each suite: ``type2test``, cleanup, and the backend."""

    type2test = Shared
    backend = "shm"

    @pytest.fixture(autouse=True)
    def _on_backend(self, request: Any, monkeypatch: Any) -> Any:
        if self.backend == "redis":
            monkeypatch.setenv("ULTRADICT_NG_BACKEND", request.getfixturevalue("redis_url"))
        else:
            monkeypatch.delenv("ULTRADICT_NG_BACKEND", raising=False)
        yield
        _close_made()  # before conftest's leak checks (fixtures finish in reverse order)


def _suites() -> dict[str, type]:
    """One TestCase per (mapping_tests class, backend)."""
    if mapping_tests is None:
        return {}
    out: dict[str, type] = {}
    for base in (
        mapping_tests.BasicTestMappingProtocol,
        mapping_tests.TestMappingProtocol,
        mapping_tests.TestHashMappingProtocol,
    ):
        for backend in [b for b in ("shm", "redis") if b in BACKENDS]:
            name = f"TestSharedDict_{base.__name__}_{backend}"
            cls = type(name, (_OnSharedDict, base), {"backend": backend, "__module__": __name__})
            out[name] = _expect_failures(cls, base)
    return out


globals().update(_suites())
