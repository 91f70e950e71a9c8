"""Run Django's ``BaseCacheTests`` against ``ultradict_ng.integrations.django.SharedCache``.

Started by tests/test_django_cache.py in a subprocess whose path holds the ``cache``
package unpacked from Django's sdist (``tests/cache/``) and this repository.  It
declares the backend's test case as Django declares ``LocMemCacheTests`` and
``FileBasedCacheTests``, makes the test database as Django's runner does, runs the
case and prints one ``OUTCOME {json}`` line per test as it ends (sturdier than
parsing the verbose report, which a stray warning can interleave) and a ``DONE``
line with the expected test names.

Environment: ``ULTRADICT_NG_DJANGO_LOCATION``, the cache name every alias shares;
or ``ULTRADICT_NG_DJANGO_PATH``, the directory every alias keeps it in
(``OPTIONS["PATH"]``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import unittest
from typing import Any

BACKEND = "ultradict_ng.integrations.django.SharedCache"


def caches_setting(caches_setting_for_tests: Any) -> dict[str, dict[str, Any]]:
    """Django's settings for a backend's run, as Django makes them for its
    file-based backend: every alias (``default``, ``prefix``, ``v2``, ``cull``
    with MAX_ENTRIES 30, ``zero_cull`` with CULL_FREQUENCY 0, ...) names one
    store -- the LOCATION, or kept in files, the directory in OPTIONS["PATH"]
    -- and each applies its own limits to it."""
    where = os.environ.get("ULTRADICT_NG_DJANGO_PATH")
    if where:  # kept in files: OPTIONS["PATH"] names the cache, LOCATION is left out
        setting: dict[str, dict[str, Any]] = caches_setting_for_tests(BACKEND=BACKEND)
        for params in setting.values():
            params["OPTIONS"] = {**params.get("OPTIONS", {}), "PATH": where}
        return setting
    return caches_setting_for_tests(BACKEND=BACKEND, LOCATION=os.environ["ULTRADICT_NG_DJANGO_LOCATION"])


def test_case() -> tuple[type, type]:
    """``(SharedCacheTests, BaseCacheTests)``, declared as Django declares its
    backends' cases (importing Django's test module needs ``django.setup()``)."""
    from cache.tests import BaseCacheTests, caches_setting_for_tests
    from django.test import TestCase, override_settings

    @override_settings(CACHES=caches_setting(caches_setting_for_tests))
    class SharedCacheTests(BaseCacheTests, TestCase):  # type: ignore[misc]
        pass

    return SharedCacheTests, BaseCacheTests


class Result(unittest.TextTestResult):
    """Prints each test's outcome as a JSON line; a failing subTest fails its test."""

    def _emit(self, test: Any, status: str, detail: str = "") -> None:
        name = test._testMethodName
        started = getattr(self, "_started", {}).pop(name, None)
        seconds = round(time.monotonic() - started, 3) if started is not None else None
        print(
            "OUTCOME " + json.dumps({"test": name, "status": status, "detail": detail, "seconds": seconds}),
            flush=True,
        )

    def startTest(self, test: Any) -> None:
        self.__dict__.setdefault("_started", {})[test._testMethodName] = time.monotonic()
        self.__dict__.setdefault("_subfailed", {})[test._testMethodName] = None
        super().startTest(test)

    def addSuccess(self, test: Any) -> None:
        super().addSuccess(test)
        failed = self._subfailed.get(test._testMethodName)
        if failed is None:
            self._emit(test, "ok")
        else:
            self._emit(test, *failed)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            status = "FAIL" if issubclass(err[0], test.failureException) else "ERROR"
            self._subfailed[test._testMethodName] = (
                status,
                f"{subtest}: {self._exc_info_to_string(err, test)}",
            )

    def addFailure(self, test: Any, err: Any) -> None:
        super().addFailure(test, err)
        self._emit(test, "FAIL", self._exc_info_to_string(err, test))

    def addError(self, test: Any, err: Any) -> None:
        super().addError(test, err)
        if not hasattr(test, "_testMethodName"):  # a class or module fixture failed
            print(
                "OUTCOME "
                + json.dumps(
                    {"test": str(test), "status": "ERROR", "detail": self._exc_info_to_string(err, test)}
                ),
                flush=True,
            )
            return
        self._emit(test, "ERROR", self._exc_info_to_string(err, test))

    def addSkip(self, test: Any, reason: str) -> None:
        super().addSkip(test, reason)
        self._emit(test, "skip", reason)

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._emit(test, "xfail", self._exc_info_to_string(err, test))

    def addUnexpectedSuccess(self, test: Any) -> None:
        super().addUnexpectedSuccess(test)
        self._emit(test, "xpass")


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django_suite.settings")
    import django
    from django.test.runner import DiscoverRunner

    django.setup()
    case, base = test_case()
    expected: list[str] = sorted(n for n in dir(base) if n.startswith("test_"))
    runner = DiscoverRunner(verbosity=0, interactive=False)
    runner.setup_test_environment()
    old_config = runner.setup_databases(aliases={"default"})
    started = time.monotonic()
    try:
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(case)
        result = unittest.TextTestRunner(stream=sys.stderr, verbosity=1, resultclass=Result).run(suite)
    finally:
        seconds = time.monotonic() - started
        runner.teardown_databases(old_config)
        runner.teardown_test_environment()
    print(
        "DONE "
        + json.dumps({"expected": expected, "seconds": round(seconds, 2), "django": django.__version__}),
        flush=True,
    )
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
