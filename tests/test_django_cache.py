"""The Django cache backend ``ultradict_ng.integrations.django.SharedCache``.

**Django's own suite.**  Django tests every cache backend with one mixin,
``BaseCacheTests`` in its ``tests/cache/tests.py``, declared per backend as
``class LocMemCacheTests(BaseCacheTests, TestCase)`` under
``override_settings(CACHES=caches_setting_for_tests(BACKEND=...))``.  Django's test
code is not in its wheel, so the sdist of the installed Django version is downloaded
from PyPI when the tests run (once per session; never committed here) and only its
``tests/cache/`` is unpacked.  tests/django_suite/run_cache_suite.py then declares
``SharedCacheTests`` the same way and runs it in a subprocess under minimal test
settings (tests/django_suite/settings.py: sqlite in memory, the ``cache`` test app),
reporting each test as a JSON line.  Every test of ``BaseCacheTests`` must pass
(54 with Django 5.2); none is skipped.  As in Django's runs for its file-based
backend, every alias (``cull`` with MAX_ENTRIES 30, ``zero_cull`` with
CULL_FREQUENCY 0 among them) shares one store and applies its own limits; once
more with the store kept in files (``OPTIONS["PATH"]``).

Without network (or pip) the download fails: a skip, except with ``CI=true``, where
it is a failure -- CI reaches PyPI, and a green skip there would hide a broken
backend.

**Ours.**  Real processes (spawned, configured as a Django project configures its
cache) share one cache: a value set in one is read in another, an ``add`` race has
exactly one winner, ``incr`` from several processes, threads and forked workers is
exact, an expiry set in one process is seen by another, and the cache outlives the
process that made it (AUTO_UNLINK's default).  Settings: a LOCATION is required and
must be a valid name, bad OPTIONS are refused before anything is made, a cache whose
stored limits differ is used with them and a warning.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import django  # the "test" extra installs it
import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.conftest import unique_name
from tests.django_suite import workers
from tests.helpers import expire_when_incr_declines
from tests.sdists import fetch_sdist, run_suite
from ultradict_ng.cache import SharedCache as Cache
from ultradict_ng.integrations import django as backend_module
from ultradict_ng.integrations.django import SharedCache

SHM = "/dev/shm"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = os.path.join(REPO, "tests", "django_suite", "run_cache_suite.py")
#: What of Django's sdist is unpacked: the cache tests' package.
WANTED = "tests/cache/"
#: BaseCacheTests' tests in the Django version the suite was written against; another
#: version may add or drop some (every one found must pass, whatever the count).
DJANGO_52_TESTS = 54
spawn = multiprocessing.get_context("spawn")


def _shm_with(prefixes: tuple[str, ...]) -> list[str]:
    if not os.path.isdir(SHM):
        return []
    return sorted(e for e in os.listdir(SHM) if e.split("@", 1)[0] in prefixes)


# -- Django's suite ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def django_cache_tests(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The directory holding Django's ``cache`` test package, for the installed Django."""
    root = tmp_path_factory.mktemp("django_suite")
    suite = fetch_sdist(
        "django",
        django.__version__,
        root,
        lambda rel: rel[len("tests/") :] if rel.startswith(WANTED) else None,
    )
    assert (suite / "cache" / "tests.py").is_file(), sorted(suite.rglob("*"))
    return str(suite)


def _check_suite(done: Any) -> None:
    """Every test of BaseCacheTests ran and passed; none was skipped."""
    report = f"stdout:\n{done.stdout[-8000:]}\nstderr:\n{done.stderr[-8000:]}"
    outcomes = {}
    for line in done.stdout.splitlines():
        if line.startswith("OUTCOME "):
            entry = json.loads(line[len("OUTCOME ") :])
            outcomes[entry["test"]] = entry
    finished = [ln for ln in done.stdout.splitlines() if ln.startswith("DONE ")]
    assert finished, f"Django's cache suite did not finish (exit {done.returncode})\n{report}"
    summary = json.loads(finished[-1][len("DONE ") :])
    expected = summary["expected"]
    failing = {t: e["status"] + "\n" + e["detail"] for t, e in outcomes.items() if e["status"] != "ok"}
    assert not failing, "\n\n".join(f"{t}: {d}" for t, d in failing.items()) + "\n" + report
    assert sorted(outcomes) == expected, (sorted(set(expected) ^ set(outcomes)), report)
    if summary["django"].startswith("5.2."):
        assert len(expected) == DJANGO_52_TESTS
    assert len(expected) >= 50, expected
    assert done.returncode == 0, report


def _suite_env(django_cache_tests: str, key: str, value: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (django_cache_tests, REPO, env.get("PYTHONPATH", "")) if p)
    env[key] = value
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


@pytest.mark.skipif(not os.path.isdir(SHM), reason="the leftover check lists /dev/shm (Linux)")
def test_django_base_cache_tests(django_cache_tests: str) -> None:
    # One LOCATION for every alias, as Django runs the suite (run_cache_suite.py).
    name = unique_name()
    env = _suite_env(django_cache_tests, "ULTRADICT_NG_DJANGO_LOCATION", name)
    try:
        done = run_suite([sys.executable, RUNNER], django_cache_tests, env, timeout=300)
        # The backend's default (AUTO_UNLINK False): the cache outlives the processes
        # that used it -- until removed, as here.
        left_by_run = _shm_with((name,))
    finally:
        Cache.unlink_by_name(name)
    assert _shm_with((name,)) == [], "unlink_by_name left segments behind"
    _check_suite(done)
    assert {e.split("@", 1)[0] for e in left_by_run} == {name}, left_by_run


def test_django_base_cache_tests_kept_in_files(django_cache_tests: str, tmp_path: Any) -> None:
    """The same suite with the cache every alias shares kept in a directory (OPTIONS["PATH"])."""
    where = str(tmp_path / "cache")
    env = _suite_env(django_cache_tests, "ULTRADICT_NG_DJANGO_PATH", where)
    try:
        done = run_suite([sys.executable, RUNNER], django_cache_tests, env, timeout=300)
        kept = os.path.isfile(os.path.join(where, "cache"))
    finally:
        if os.path.isdir(where):
            c = Cache(path=where, create=False)
            c.unlink()
            c.close()
    _check_suite(done)
    assert kept, "the cache kept in files was not made where OPTIONS['PATH'] said"


# -- ours: processes and threads sharing the backend ----------------------------------------


def _forget_handles(location: str) -> None:
    """Close and drop this process's handles of ``location`` (the backend keeps one
    per process for good)."""
    with backend_module._handles_lock:
        for key in [k for k in backend_module._handles if k[0] == location]:
            backend_module._handles.pop(key).close()


@pytest.fixture
def location() -> Iterator[str]:
    """A unique LOCATION, its cache removed after the test (pass or fail)."""
    name = unique_name()
    yield name
    _forget_handles(name)
    Cache.unlink_by_name(name)


def backend(location: str, **params: Any) -> Any:
    """A backend object as Django's cache handler makes one from an alias's settings."""
    return SharedCache(location, params)


def _join(procs: list[Any], timeout: float = 60) -> None:
    for p in procs:
        p.join(timeout)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
        p.join()
    assert not alive, "workers did not finish"
    assert [p.exitcode for p in procs] == [0] * len(procs)


def test_a_value_set_in_one_process_is_read_in_another(location: str) -> None:
    cache = backend(location)
    cache.set("from-parent", ("tuple", {"nested": [1.5, None]}))
    results = spawn.Queue()
    p = spawn.Process(target=workers.read_and_write, args=(location, results))
    p.start()
    got = results.get(timeout=60)
    _join([p])
    assert got == (("tuple", {"nested": [1.5, None]}), "default")
    assert cache.get("from-child") == {"pid": p.pid, "list": [1, 2, 3]}


@pytest.mark.slow
def test_add_race_has_exactly_one_winner(location: str) -> None:
    n, rounds = 8, 20
    backend(location)  # created here: the racers only attach
    start = spawn.Barrier(n)
    results = spawn.Queue()
    procs = [
        spawn.Process(target=workers.add_race, args=(location, start, results, rounds)) for _ in range(n)
    ]
    for p in procs:
        p.start()
    reports = [results.get(timeout=120) for _ in procs]
    _join(procs)
    cache = backend(location)
    for r in range(rounds):
        winners = [pid for pid, wins in reports if wins[r]]
        assert len(winners) == 1, (r, reports)
        assert cache.get(f"race-{r}") == winners[0]


@pytest.mark.slow
def test_incr_from_several_processes_is_exact(location: str) -> None:
    n, per = 4, 400
    cache = backend(location)
    cache.set("counter", 0, 300)
    start = spawn.Barrier(n)
    procs = [spawn.Process(target=workers.count, args=(location, start, per)) for _ in range(n)]
    for p in procs:
        p.start()
    _join(procs, timeout=120)
    assert cache.get("counter") == n * (per - per // 2)
    # incr and decr kept the expiry set with the value (as memcached does).
    assert 200 < cache._cache.ttl(cache.make_key("counter")) <= 300


def test_incr_of_a_float_or_a_bool_adds_as_djangos_own_caches(location: str) -> None:
    """LocMemCache and FileBasedCache return ``value + delta`` for any stored
    value (2.5 for 1.5, 2 for True) and keep its expiry; a string raises
    ``TypeError`` there too; a missing key ``ValueError``."""
    cache = backend(location)
    cache.set("f", 1.5, 300)
    cache.set("b", True)
    cache.set("s", "x")
    assert cache.incr("f") == 2.5 and cache.get("f") == 2.5
    assert 200 < cache._cache.ttl(cache.make_key("f")) <= 300
    assert cache.decr("b") == 0 and cache.get("b") == 0
    with pytest.raises(TypeError):
        cache.incr("s")
    assert cache.get("s") == "x"
    with pytest.raises(ValueError, match="not found"):
        cache.incr("missing")


def test_incr_of_a_value_that_expires_meanwhile_is_not_found(location: str, monkeypatch: Any) -> None:
    """Expiry is time, not the lock: a float's entry that expires after the
    int step declined it is a missing key (``ValueError``), not a raw
    ``KeyError`` from a second lookup."""
    cache = backend(location)
    cache.set("f", 1.5, 300)
    expire_when_incr_declines(monkeypatch, 400)
    with pytest.raises(ValueError, match="not found"):
        cache.incr("f")


def test_incr_from_several_threads_is_exact(location: str) -> None:
    """Django makes one backend object per thread: they share this process's handle."""
    backend(location).set("counter", 0)
    n, per = 4, 500

    def work() -> None:
        cache = backend(location)  # per thread, as django.core.cache.caches does
        for _ in range(per):
            cache.incr("counter")

    with ThreadPoolExecutor(n) as pool:
        for done in [pool.submit(work) for _ in range(n)]:
            done.result()  # re-raises a thread's error
    assert backend(location).get("counter") == n * per


def test_forked_workers_use_the_handle_they_inherit(location: str) -> None:
    """gunicorn --preload: workers are forked from a master that may have used the cache."""
    cache = backend(location)
    cache.set("counter", 0, None)

    def worker() -> None:
        mine = backend(location)
        assert mine._cache is cache._cache  # inherited, not reopened
        for _ in range(200):
            mine.incr("counter")

    fork = multiprocessing.get_context("fork")
    procs = [fork.Process(target=worker) for _ in range(3)]
    for p in procs:
        p.start()
    _join(procs)
    assert cache.get("counter") == 600


@pytest.mark.slow
def test_expiry_set_in_one_process_is_seen_by_another(location: str) -> None:
    cache = backend(location)
    timeout = 2.0
    results = spawn.Queue()
    p = spawn.Process(target=workers.set_expiring, args=(location, timeout, results))
    p.start()
    set_at = results.get(timeout=60)
    _join([p])
    assert cache.has_key("short-lived") and cache.get("short-lived") == "here"
    time.sleep(max(0.0, set_at + timeout + 0.05 - time.time()))
    assert not cache.has_key("short-lived")
    assert cache.get("short-lived", "gone") == "gone"
    assert cache.add("short-lived", "again") is True


def test_the_cache_outlives_the_process_that_made_it(location: str) -> None:
    p = spawn.Process(target=workers.create_and_exit, args=(location, {}))
    p.start()
    _join([p])
    assert _shm_with((location,)), "removed when its creator exited"
    assert backend(location).get("survivor") == "still here"


def test_auto_unlink_last_removes_it_with_the_last_process(location: str) -> None:
    p = spawn.Process(target=workers.create_and_exit, args=(location, {"AUTO_UNLINK": "last"}))
    p.start()
    _join([p])
    assert _shm_with((location,)) == []


# -- ours: settings ---------------------------------------------------------------------------


def test_settings_become_the_shared_caches(location: str) -> None:
    cache = backend(location, OPTIONS={"MAX_ENTRIES": 40, "CULL_FREQUENCY": 4, "MAXBYTES": 1 << 20})
    assert (cache._cache.maxsize, cache._cache.maxbytes, cache._cache.serializer) == (40, 1 << 20, "pickle")
    for i in range(40):
        cache.set(i, i)
    cache.set("one-more", 1)  # a full cache culls 40 // 4 entries, the least recently used
    assert len(cache._cache) == 31
    assert cache.get("one-more") == 1 and not cache.has_key(0) and cache.has_key(39)


def test_a_value_larger_than_maxbytes_is_not_stored(location: str) -> None:
    """As memcached's too-large items: set stores nothing and drops the old value,
    add returns False, set_many returns the keys it could not store."""
    cache = backend(location, OPTIONS={"MAXBYTES": 4_000})
    cache.set("k", "small")
    cache.set("k", "x" * 10_000)
    assert cache.get("k") is None
    assert cache.add("big", "x" * 10_000) is False and not cache.has_key("big")
    assert cache.set_many({"a": 1, "b": "x" * 10_000, "c": 3}) == ["b"]
    assert cache.get_many(["a", "b", "c"]) == {"a": 1, "c": 3}


def test_default_timeout_and_django_timeout_rules(location: str) -> None:
    forever = backend(location, TIMEOUT=None)
    forever.set("a", 1)
    assert forever._cache.ttl(forever.make_key("a")) is None
    short = backend(location, TIMEOUT=60)
    short.set("b", 2)
    assert 55 < short._cache.ttl(short.make_key("b")) <= 60
    short.set("c", 3, None)
    assert short._cache.ttl(short.make_key("c")) is None
    short.set("a", 4, -5)  # negative: expired at once; the old value is gone too
    assert short.get("a") is None and not short.has_key("a")
    assert short.add("d", 5, 0) is True and short.get("d") is None


def test_close_keeps_the_handle_and_objects_share_it(location: str) -> None:
    first, second = backend(location), backend(location)
    assert first._cache is second._cache  # one handle per process and LOCATION
    first.set("k", "v")
    first.close()  # Django calls it at the end of every request
    assert second.get("k") == "v" and first.get("k") == "v"


def test_location_is_required() -> None:
    with pytest.raises(ImproperlyConfigured, match="LOCATION"):
        SharedCache("", {})


@pytest.mark.parametrize(
    "options, message",
    [
        ({"MAX_ENTRY": 10}, "unknown OPTIONS MAX_ENTRY"),
        ({"MAX_ENTRIES": 0}, "MAX_ENTRIES must be at least 1"),
        ({"CULL_FREQUENCY": -1}, "CULL_FREQUENCY must be 0 or more"),
        ({"MAXBYTES": "1M"}, "MAXBYTES must be a positive int"),
        ({"AUTO_UNLINK": "first"}, "AUTO_UNLINK must be"),
    ],
)
def test_bad_options_are_refused(location: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        backend(location, OPTIONS=options)
    assert _shm_with((location,)) == []  # refused before anything was made


def test_a_location_that_is_no_name_is_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match="LOCATION 'my cache'"):
        backend("my cache")


def test_stored_limits_win_with_a_warning(location: str, caplog: Any) -> None:
    backend(location, OPTIONS={"MAX_ENTRIES": 10})
    with caplog.at_level(logging.WARNING, logger="ultradict_ng"):
        other = backend(location, OPTIONS={"MAX_ENTRIES": 20})
    assert other._cache.maxsize == 10
    assert f"Django cache {location!r}: stored with maxsize=10" in caplog.text
    assert "MAX_ENTRIES=20" in caplog.text and f"ultradict-ng rm {location}" in caplog.text
    assert "name a new LOCATION" in caplog.text


def test_aliases_sharing_a_location_each_apply_their_own_limits(location: str, caplog: Any) -> None:
    """As Django's file-based backend: one store, each alias culling by its own
    MAX_ENTRIES and CULL_FREQUENCY (what Django's test_cull and test_zero_cull
    check with one LOCATION for all aliases); no warning, since the store
    holds what each alias asks for."""
    big = backend(location, OPTIONS={"MAX_ENTRIES": 300})
    with caplog.at_level(logging.WARNING, logger="ultradict_ng"):
        cull = backend(location, OPTIONS={"MAX_ENTRIES": 30, "CULL_FREQUENCY": 3})
        zero = backend(location, OPTIONS={"MAX_ENTRIES": 30, "CULL_FREQUENCY": 0})
    assert caplog.text == ""
    for i in range(1, 50):
        cull.set(f"cull{i}", "value", 1000)
    assert sum(cull.has_key(f"cull{i}") for i in range(1, 50)) == 29
    big.clear()
    for i in range(1, 50):
        zero.set(f"cull{i}", "value", 1000)
    assert sum(zero.has_key(f"cull{i}") for i in range(1, 50)) == 19
    for i in range(100):  # the alias of 300 entries evicts nothing
        big.set(f"big{i}", i)
    assert all(big.has_key(f"big{i}") for i in range(100))


def test_a_cache_of_another_serializer_is_refused(location: str) -> None:
    other = Cache(location, maxsize=300, cull_frequency=3, serializer="msgpack")
    try:
        with pytest.raises(ImproperlyConfigured, match="msgpack"):
            backend(location)
    finally:
        other.close()


def test_a_cache_kept_in_files_keeps_its_sync_policy_with_a_warning(tmp_path: Any, caplog: Any) -> None:
    """A deploy that changed SYNC (or SYNC_INTERVAL) while the cache lives on
    in its directory: the store serves with its own policy and a warning
    says so, as for a changed MAX_ENTRIES -- rather than every cache call
    raising ParameterMismatch."""
    path = str(tmp_path / "cache")
    first = backend("", OPTIONS={"PATH": path, "SYNC": "interval", "MAX_ENTRIES": 10})
    first.set("k", 1)
    _forget_handles(path)
    with caplog.at_level(logging.WARNING, logger="ultradict_ng"):
        later = backend("", OPTIONS={"PATH": path, "SYNC": "always"})
    assert later.get("k") == 1
    later.set("k", 2)
    assert later._cache._d.stats()["sync"] == "interval"
    (policy, limits) = [r.getMessage() for r in caplog.records]
    assert "sync='interval'" in policy and f"rm {path}" in policy
    assert "sync" not in limits and "stored with maxsize=10" in limits and "MAX_ENTRIES=300" in limits
    assert "give a new PATH" in limits and "LOCATION" not in limits
    _forget_handles(path)
    c = Cache(path=path, create=False)
    c.unlink()
    c.close()
