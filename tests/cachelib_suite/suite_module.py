"""cachelib's own test mixins against ultradict_ng's cachelib backend.

tests/test_cachelib_cache.py copies this file into cachelib's unpacked
``tests/`` directory (from the sdist of the installed cachelib) as
``test_ultradict_ng_cache.py`` and runs pytest there, in a subprocess.  Every
mixin cachelib ships beside its test modules (a module that is not
``test_*``/``conftest`` holding classes named ``*Tests``: CommonTests,
HasTests, ClearTests, SerializerTests, DeleteManyWithPrefixTests in 0.17) is
mixed into one test class, run unmodified once per variant of the backend, the
way cachelib's own test modules run them: a ``cache_factory`` fixture sets
``cls.cache_factory``.  The variants: plain; with a key prefix (as RedisCache's
tests run); with a serializer of the class's own (as SimpleCache's tests run);
kept in files (``path=``, a directory under ``UDNG_FILES``, removed after the test).

Caches are named from ``UDNG_SESSION`` (the parent's session prefix, so its
leftover check sees them) and removed after each test (a named cache outlives
its handles).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cachelib.serializers import BaseSerializer

from ultradict_ng.integrations.cachelib import SharedCache

HERE = os.path.dirname(os.path.abspath(__file__))
SESSION = os.environ.get("UDNG_SESSION", "x")
VARIANTS = ["plain", "key_prefix", "own_serializer", "kept_in_files"]
#: The variants this run runs (the parent starts one run per variant, at once).
RUN = [os.environ["UDNG_VARIANT"]] if os.environ.get("UDNG_VARIANT") else VARIANTS


def _mixins() -> list[type]:
    found: list[type] = []
    for fn in sorted(os.listdir(HERE)):
        if not fn.endswith(".py") or fn.startswith(("test_", "conftest")) or fn == "xprocess.py":
            continue
        module = importlib.import_module(fn[:-3])
        for attr, obj in sorted(vars(module).items()):
            if inspect.isclass(obj) and attr.endswith("Tests") and obj.__module__ == module.__name__:
                found.append(obj)
    return found


MIXINS = _mixins()
#: The mixins' test methods: the parent checks that exactly these ran, per variant.
MIXIN_TESTS = sorted({n for cls in MIXINS for n in dir(cls) if n.startswith("test_")})


class SillySerializer(BaseSerializer):
    """A pointless serializer only for testing (as in cachelib's test_simple_cache)."""

    def dumps(self, value: Any, protocol: int = 0) -> bytes:
        return repr(value).encode()

    def loads(self, bvalue: bytes) -> Any:
        return eval(bvalue.decode())


class OwnSerializerCache(SharedCache):
    serializer = SillySerializer()


@pytest.fixture(autouse=True, params=RUN)
def cache_factory(request: Any) -> Iterator[None]:
    made: list[SharedCache] = []

    def _factory(self: Any, *args: Any, **kwargs: Any) -> SharedCache:
        if request.param == "key_prefix":
            kwargs.setdefault("key_prefix", "test-key-prefix:")
        cls = OwnSerializerCache if request.param == "own_serializer" else SharedCache
        if request.param == "kept_in_files":
            kwargs.setdefault("path", os.path.join(os.environ["UDNG_FILES"], uuid.uuid4().hex[:8]))
        else:
            kwargs.setdefault("name", f"t{SESSION}{uuid.uuid4().hex[:8]}")
        made.append(cls(*args, **kwargs))
        return made[-1]

    request.cls.cache_factory = _factory
    yield
    for cache in made:
        cache.cache.unlink()  # (a named cache, or one kept in files, outlives its handles)
        cache.close()


# What the parent checks the run against: these mixins, these tests, each variant.
if os.environ.get("UDNG_MIXINS_OUT"):
    with open(os.environ["UDNG_MIXINS_OUT"], "w") as f:
        json.dump({"mixins": [cls.__name__ for cls in MIXINS], "tests": MIXIN_TESTS, "variants": VARIANTS}, f)

TestUltradictNgSharedCache = type("TestUltradictNgSharedCache", tuple(MIXINS), {})
