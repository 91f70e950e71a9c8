"""The cachelib backend (``ultradict_ng.integrations.cachelib.SharedCache``):
cachelib's own test mixins as shipped, real processes, Flask-Caching.

**cachelib's mixins.**  The sdist of the installed cachelib is downloaded from
PyPI when the tests run (once per session; its code is never committed here)
and only its ``tests/`` is unpacked.  Next to its mixin modules goes
``tests/cachelib_suite/suite_module.py`` (as ``test_ultradict_ng_cache.py``):
it mixes every mixin cachelib ships (CommonTests, HasTests, ClearTests,
SerializerTests, DeleteManyWithPrefixTests in 0.17) into one class and runs
it unmodified, with a ``cache_factory`` fixture as cachelib's own test modules
have, for four variants of the backend (plain, key prefix, a serializer of
its own, kept in files).  pytest runs there in a subprocess (cachelib's conftest imports
pytest-xprocess for its server fixtures: a one-line stand-in is written when
it is not installed); the junit report says what passed, and every test of
every mixin must pass, counted.  Without network the download fails: a skip,
except with ``CI=true``, where it is a failure (as tests/test_ultradict_suite.py).

**Processes.**  Spawned workers (tests/cachelib_suite/workers.py) share a
cache with the test: values of every kind both ways, ``inc`` exact from
several processes at once (every returned value distinct), ``add`` won by
exactly one racer per key, an expiry set by one process seen by the other on
time, the cache outliving the worker that created it (a named cache outlives
every process by default; ``auto_unlink="last"`` removes it with its last user).

**Flask-Caching** (skipped when it is not installed): a real app configured
with ``CACHE_TYPE="ultradict_ng.integrations.cachelib.SharedCache"``, its
cached view and memoized function computed once for two processes; the
``factory`` Flask-Caching calls for a backend whose path has no "cachelib".
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from typing import Any

import pytest

pytest.importorskip("cachelib")

import cachelib

import ultradict_ng
from tests.cachelib_suite import workers
from tests.conftest import SESSION, unique_name
from tests.helpers import expire_when_incr_declines
from tests.sdists import fetch_sdist
from ultradict_ng.errors import ParameterMismatch
from ultradict_ng.integrations.cachelib import SharedCache

spawn = multiprocessing.get_context("spawn")
SHM = "/dev/shm"
HERE = os.path.dirname(os.path.abspath(__file__))
#: The installed cachelib, whose sdist's tests run.
VERSION = cachelib.__version__
#: The mixins and tests a cachelib version ships (each runs in 3 variants: 63
#: tests for 0.17.0, 33 for 0.9.0, the oldest pyproject allows).  Another version
#: runs whatever mixins it ships, all of which must pass.
EXPECTED = {
    "0.17.0": (["ClearTests", "CommonTests", "DeleteManyWithPrefixTests", "HasTests", "SerializerTests"], 21),
    "0.9.0": (["ClearTests", "CommonTests", "HasTests"], 11),
}
VARIANTS = ["plain", "key_prefix", "own_serializer", "kept_in_files"]
#: cachelib >= 0.17 checks a timeout's type, and its serializer returns None for a
#: value pickle refuses (0.9 raises UnboundLocalError from its own code there).
MODERN = tuple(int(p) for p in VERSION.split(".")[:2]) >= (0, 17)


def _segments(name: str) -> list[str]:
    """The /dev/shm entries of the cache ``name`` (its dict and side segments)."""
    return sorted(e for e in os.listdir(SHM) if e == name or e.startswith(name + "@"))


def run_workers(calls: list[tuple[str, tuple[Any, ...]]], timeout: float = 120) -> list[Any]:
    """Run each ``(worker, args)`` of tests/cachelib_suite/workers.py in a spawned
    process at once; their results (in the order they finished)."""
    out = spawn.Queue()
    procs = [spawn.Process(target=workers.report, args=(out, worker, *args)) for worker, args in calls]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=timeout) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    errors = [detail for status, detail in results if status != "ok"]
    assert not errors, "\n".join(errors)
    for p in procs:
        assert p.exitcode == 0
    return [detail for _, detail in results]


@pytest.fixture
def caches():
    """``caches(...)`` makes a backend that is closed after the test, pass or fail."""
    made: list[SharedCache] = []

    def make(*args: Any, **kwargs: Any) -> SharedCache:
        made.append(SharedCache(*args, **kwargs))
        return made[-1]

    yield make
    for cache in reversed(made):
        name = cache.name
        cache.close()
        SharedCache.unlink_by_name(name)  # (a named cache outlives its handles: auto_unlink=False)


@pytest.fixture
def name():
    """A cache name unique to this test; the cache is removed afterwards (a named
    cache outlives the processes that use it)."""
    made = unique_name()
    yield made
    SharedCache.unlink_by_name(made)


# -- cachelib's own test mixins ------------------------------------------------------------


@pytest.fixture(scope="session")
def cachelib_tests(tmp_path_factory: pytest.TempPathFactory) -> str:
    """cachelib's unpacked ``tests/`` directory, ready to run against the backend."""
    root = tmp_path_factory.mktemp("cachelib_suite")
    # Its tests/*.py only (one level): the mixins, their conftest, its own modules.
    tests = fetch_sdist(
        "cachelib",
        VERSION,
        root,
        lambda rel: (
            rel[len("tests/") :]
            if (rel.startswith("tests/") and rel.count("/") == 1 and rel.endswith(".py"))
            else None
        ),
        "tests",
    )
    assert (tests / "common.py").is_file() and (tests / "conftest.py").is_file()
    # Only the mixins run: cachelib's own test modules (its backends) are not ours to run.
    for module in tests.glob("test_*.py"):
        module.unlink()
    shutil.copy(os.path.join(HERE, "cachelib_suite", "suite_module.py"), tests / "test_ultradict_ng_cache.py")
    # cachelib's conftest imports pytest-xprocess (for its server fixtures, unused here).
    if subprocess.run([sys.executable, "-c", "import xprocess"], capture_output=True, check=False).returncode:
        (tests / "xprocess.py").write_text("class ProcessStarter:  # stand-in\n    pass\n")
    (tests / "pytest.ini").write_text(
        "[pytest]\naddopts = --strict-markers\nmarkers =\n    network: needs a server\n"
    )
    return str(tests)


def _env() -> dict[str, str]:
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(ultradict_ng.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env["UDNG_SESSION"] = SESSION  # cache names the leftover check knows as ours
    return env


@pytest.mark.skipif(not os.path.isdir(SHM), reason="the leftover check lists /dev/shm (Linux)")
def test_cachelib_mixins_as_shipped(cachelib_tests: str, tmp_path: Any) -> None:
    # One pytest per variant, at once: each runs test_expiration's 4 s sleep.
    procs = {}
    for variant in VARIANTS:
        env = _env()
        env["UDNG_VARIANT"] = variant
        env["UDNG_MIXINS_OUT"] = str(tmp_path / f"mixins-{variant}.json")
        env["UDNG_FILES"] = str(tmp_path / "files")
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rfE",
            f"--junitxml={tmp_path / f'junit-{variant}.xml'}",
            "test_ultradict_ng_cache.py",
        ]
        procs[variant] = subprocess.Popen(
            cmd,
            cwd=cachelib_tests,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    outs: dict[str, str] = {}
    for variant, proc in procs.items():
        try:
            outs[variant], _ = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for p in procs.values():  # only the groups we started
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            outs[variant], _ = proc.communicate()
            pytest.fail(f"cachelib's tests ({variant}) ran over 600 s\n{outs[variant][-5000:]}")
    out = "\n".join(f"== {v} (exit {procs[v].returncode})\n{o[-4000:]}" for v, o in outs.items())

    outcomes: dict[str, str] = {}
    for variant in VARIANTS:
        mixins_out = tmp_path / f"mixins-{variant}.json"
        assert mixins_out.is_file(), f"the suite module did not load\n{out}"
        found = json.loads(mixins_out.read_text())
        for case in ET.parse(tmp_path / f"junit-{variant}.xml").getroot().iter("testcase"):
            verdicts = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
            outcomes[case.get("name", "")] = verdicts[0] if verdicts else "passed"
    if VERSION in EXPECTED:
        assert (sorted(found["mixins"]), len(found["tests"])) == EXPECTED[VERSION], found
    assert {"CommonTests", "HasTests", "ClearTests"} <= set(found["mixins"]), found
    expected = {f"{t}[{v}]" for t in found["tests"] for v in VARIANTS}
    passed = sorted(t for t, o in outcomes.items() if o == "passed")
    assert set(outcomes) == expected, (sorted(set(outcomes) ^ expected), out)
    assert len(passed) == len(expected), (
        f"{len(passed)} of {len(expected)} passed: "
        f"{ {t: o for t, o in outcomes.items() if o != 'passed'} }\n{out}"
    )
    assert all(p.returncode == 0 for p in procs.values()), out
    if VERSION in EXPECTED:
        assert len(passed) == EXPECTED[VERSION][1] * len(VARIANTS)


# -- processes -----------------------------------------------------------------------------


def test_two_processes_share_values(caches: Any, name: str) -> None:
    cache = caches(name)
    cache.set("from_parent", {"nested": [1, 2.5, None]}, timeout=0)
    cache.set("parent_int", 7)
    [pid] = run_workers([("write_values", (name,))])
    assert pid != os.getpid()
    assert cache.get("point") == workers.Point(1, 2.5)
    assert cache.get("nested") == {"a": [1, (2, 3)], 4: {"b": None}}
    assert cache.get("count") == 41 and cache.inc("count") == 42
    assert cache.get("flag") is False and cache.has("flag")
    assert cache.get_many("m1", "m2", "nope") == [b"\x00bytes", "text", None]
    assert cache.get("added") == [1, 2] and not cache.add("added", "again")
    [seen] = run_workers([("read_values", (name, ["from_parent", "parent_int", "count", "x"]))])
    assert seen == {
        "from_parent": ({"nested": [1, 2.5, None]}, True),
        "parent_int": (7, True),
        "count": (42, True),
        "x": (None, False),
    }


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_forked_children_use_the_parents_handle(caches: Any, name: str) -> None:
    cache = caches(name)
    cache.set("parent", os.getpid())
    fork = multiprocessing.get_context("fork")
    out = fork.Queue()
    children = [fork.Process(target=workers.use_inherited, args=(cache, out)) for _ in range(3)]
    for c in children:
        c.start()
    seen = sorted(out.get(timeout=60) for _ in children)
    for c in children:
        c.join(30)
        assert c.exitcode == 0
    assert seen == [(1, os.getpid()), (2, os.getpid()), (3, os.getpid())]
    assert cache.get("child") in {c.pid for c in children}
    assert cache.get("n") == 3 and _segments(name)  # the children's exits removed nothing


def test_inc_and_dec_exact_from_several_processes(caches: Any, name: str) -> None:
    cache = caches(name)
    n = 300
    start = spawn.Barrier(6)
    results = run_workers(
        [("incrementer", (name, "up", n, 1, start)) for _ in range(4)]
        + [("incrementer", (name, "down", n, -3, start)) for _ in range(2)]
    )
    ups = [v for r in results if r[0] > 0 for v in r]
    # Both keys were missing: each process's first call raced to create them.  Every
    # increment returned a value nobody else got, and none was lost.
    assert sorted(ups) == list(range(1, 4 * n + 1))
    assert cache.get("up") == 4 * n
    assert cache.get("down") == -3 * 2 * n
    assert sorted(v for r in results if r[0] < 0 for v in r) == list(range(-6 * n, 0, 3))
    for r in results:  # each process saw its own values strictly monotone
        assert r == sorted(r) or r == sorted(r, reverse=True)


def test_add_race_has_exactly_one_winner_per_key(caches: Any, name: str) -> None:
    cache = caches(name)
    keys = [f"k{i}" for i in range(40)]
    start = spawn.Barrier(6)
    results = run_workers([("adder", (name, keys, start)) for _ in range(6)])
    won = [k for r in results for k in r]
    assert sorted(won) == sorted(keys), "every key won exactly once"
    values = cache.get_many(*keys)
    assert len(set(values)) > 0 and all(isinstance(v, int) and v != os.getpid() for v in values)


def test_expiry_set_by_one_process_is_seen_by_another(caches: Any, name: str) -> None:
    # The writer's default_timeout (1 s) is data stored with the entry: the reader,
    # whose own default is 300 s, sees it expire on time.
    cache = caches(name, default_timeout=1)
    set_at = time.time()
    cache.set("short", "s")
    cache.set("forever", "f", timeout=0)
    [seen] = run_workers([("watch_expiry", (name, set_at + 10))])
    first, last = seen[0], seen[-1]
    assert first[1:] == ("s", "f", True), first
    assert last[1:] == (None, "f", False), last
    gone_at = last[0]
    assert set_at + 0.95 <= gone_at <= set_at + 2.0, (gone_at - set_at, seen[-3:])
    assert all(entry[1] == "s" for entry in seen[:-1])
    assert cache.get("short") is None and cache.get("forever") == "f"


@pytest.mark.skipif(not os.path.isdir(SHM), reason="lists /dev/shm (Linux)")
def test_cache_outlives_the_worker_that_made_it(name: str) -> None:
    attached, release = spawn.Event(), spawn.Event()
    out = spawn.Queue()
    worker = spawn.Process(target=workers.report, args=(out, "create_and_fill", name, attached, release))
    worker.start()
    try:
        assert attached.wait(60)
        cache = SharedCache(name, threshold=None)  # attaches: the worker's bound
        assert cache.cache.maxsize == 100
        release.set()
        assert out.get(timeout=60)[0] == "ok"
    finally:
        release.set()
        worker.join(30)
    assert worker.exitcode == 0
    # The creator is gone: the cache is there ...
    assert cache.get("from_worker") == worker.pid
    cache.close()
    # ... and stays when no process has it open (the default, auto_unlink=False),
    # for the next worker: a value set by one process is read by the next.
    assert _segments(name)
    assert SharedCache(name, threshold=None).get("from_worker") == worker.pid


@pytest.mark.skipif(not os.path.isdir(SHM), reason="lists /dev/shm (Linux)")
def test_auto_unlink_last_removes_the_cache_with_its_last_user(name: str) -> None:
    cache = SharedCache(name, auto_unlink="last")
    cache.set("k", 1)
    again = SharedCache(name, create=False, auto_unlink="last")
    cache.close()
    assert again.get("k") == 1 and _segments(name)
    again.close()
    assert _segments(name) == []
    # auto_unlink is each handle's: one opened with "last" and closed last removes
    # the cache however it was created.
    SharedCache(name).close()
    SharedCache(name, create=False, auto_unlink="last").close()
    assert _segments(name) == []
    # A cache without a name (shared with forked children only) keeps "last".
    fresh = SharedCache()
    fresh_name = fresh.name
    fresh.close()
    assert _segments(fresh_name) == []


# -- semantics -----------------------------------------------------------------------------


def test_timeouts(caches: Any, name: str) -> None:
    cache = caches(name, default_timeout=dt.timedelta(minutes=2))
    core = cache.cache
    assert cache.default_timeout == 120
    cache.set("default", 1)
    cache.set("zero", 1, timeout=0)
    cache.set("delta", 1, timeout=dt.timedelta(seconds=30))
    cache.set_many({"m": 1}, timeout=5)
    assert 119 < core.ttl("default") <= 120
    assert core.ttl("zero") is None
    assert 29 < core.ttl("delta") <= 30 and 4 < core.ttl("m") <= 5
    cache.set("gone", 1)
    assert cache.set("gone", 2, timeout=-1) and not cache.has("gone") and cache.get("gone") is None
    assert cache.add("neg", 1, timeout=-1) and not cache.has("neg")
    if MODERN:
        with pytest.raises(TypeError):
            cache.set("bad", 1, timeout="60")  # type: ignore[arg-type]
    assert caches(unique_name(), default_timeout=0).default_timeout == 0


def test_inc_dec_semantics(caches: Any, name: str) -> None:
    cache = caches(name, default_timeout=100)
    core = cache.cache
    assert cache.inc("new", 5) == 5 and 99 < core.ttl("new") <= 100  # starts at 0, default timeout
    cache.set("kept", 10, timeout=0)
    assert cache.dec("kept", 3) == 7 and core.ttl("kept") is None  # keeps its expiry
    assert cache.dec("fresh") == -1
    cache.set("float", 1.5, timeout=50)
    assert cache.inc("float", 2) == 3.5 and cache.get("float") == 3.5 and core.ttl("float") <= 50
    cache.set("bool", True)
    assert cache.inc("bool") == 2 and core.get("bool") == 2  # now an int: stored as one
    cache.set("text", "spam")
    with pytest.raises(TypeError):
        cache.inc("text")
    assert cache.get("text") == "spam"
    cache.set("none", None)  # (cachelib: ``(value or 0) + delta``)
    assert cache.inc("none") == 1 and cache.get("none") == 1
    assert cache.inc("big", 2**70) == 2**70 and cache.inc("big") == 2**70 + 1


def test_inc_of_a_value_expiring_meanwhile_starts_at_zero(caches: Any, name: str, monkeypatch: Any) -> None:
    """Expiry is time, not the lock: a float's entry that expires after the
    int step declined it is a missing key (it starts at 0), not a raw
    ``KeyError`` from a second lookup."""
    cache = caches(name, default_timeout=100)
    cache.set("f", 1.5, timeout=50)
    expire_when_incr_declines(monkeypatch, 60)
    assert cache.inc("f", 2) == 2


def test_values_keys_and_serializers(caches: Any, name: str) -> None:
    cache = caches(name)
    core = cache.cache
    cache.set("int", 3)
    cache.set("str", "x")
    assert core.get("int") == 3 and isinstance(core.get("str"), bytes)  # ints stay numbers
    cache.set("doc", {"a": [1, (2, b"x")]})  # plain data, with the default serializer: itself
    assert core.get("doc") == {"a": [1, (2, b"x")]} and cache.get("doc") == {"a": [1, (2, b"x")]}
    cache.set("odd", {"c": 1j})
    assert isinstance(core.get("odd"), bytes) and cache.get("odd") == {"c": 1j}  # not plain: pickled
    for key in (1, b"k", None, ("t",)):
        with pytest.raises(TypeError):
            cache.set(key, 1)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            cache.get(key)  # type: ignore[arg-type]
    # A value pickle refuses: cachelib's serializer logs a PickleError and returns
    # None (set is then False, as in cachelib); any other error reaches the caller.
    refused = workers.Unpicklable()
    if MODERN:
        assert cache.set("no", refused) is False and not cache.has("no")
        assert cache.add("no", refused) is False
        assert cache.set_many({"a": 1, "no": refused, "b": 2}) == ["a", "b"]
    else:
        cache.set_many({"a": 1, "b": 2})
    with pytest.raises(TypeError):
        cache.set("lock", threading.Lock())  # "cannot pickle '_thread.lock'": raised, as by cachelib
    cache.serializer = workers.JSONSerializer()
    cache.set("json", {"a": [1, 2]})
    assert core.get("json") == b'{"a": [1, 2]}' and cache.get("json") == {"a": [1, 2]}
    assert cache.get_dict("a", "json", "none") == {"a": 1, "json": {"a": [1, 2]}, "none": None}
    assert cache.delete("a") and not cache.delete("a")
    assert cache.delete_many("b", "missing") == ["b", "missing"]
    assert repr(cache).startswith("<SharedCache ")


def test_threshold(caches: Any, name: str) -> None:
    cache = caches(name, threshold=20)
    for i in range(100):
        cache.set(f"k{i}", i)
    assert len(cache.cache) <= 20 and cache.get("k99") == 99
    with pytest.raises(ParameterMismatch):
        SharedCache(name, threshold=30)
    with pytest.raises(ParameterMismatch):
        SharedCache(name)  # the default, 500, is a bound too
    with pytest.raises(ParameterMismatch, match="threshold=20, not 0"):
        SharedCache(name, threshold=0)  # (no bound: not the stored one either)
    assert caches(name, threshold=None).cache.maxsize == 20
    unbounded = caches(unique_name(), threshold=0)
    unbounded.set_many({f"k{i}": i for i in range(600)})
    assert len(unbounded.cache) == 600
    assert caches(unique_name(), threshold=None).cache.maxsize == 500
    with pytest.raises(ValueError):
        SharedCache(unique_name(), threshold=-1)


def test_key_prefix_and_clear(caches: Any, name: str) -> None:
    a = caches(name, key_prefix="a:")
    tenant = ["b1"]
    b = caches(name, key_prefix=lambda: tenant[0] + ":")
    plain = caches(name)
    a.set("k", "A")
    b.set("k", "B1")
    tenant[0] = "b2"
    b.set("k", "B2")
    plain.set("k", "plain")
    assert plain.get_many("a:k", "b1:k", "b2:k", "k") == ["A", "B1", "B2", "plain"]
    assert b.get("k") == "B2" and a.get("k") == "A"
    assert a.clear() and not a.has("k")
    assert sorted(plain.cache) == ["b1:k", "b2:k", "k"]
    assert b.clear() and sorted(plain.cache) == ["b1:k", "k"]
    assert plain.clear() and len(plain.cache) == 0


# -- Flask-Caching -------------------------------------------------------------------------


def test_flask_caching_app_shared_by_two_processes(name: str) -> None:
    pytest.importorskip("flask_caching")
    config = {
        "CACHE_TYPE": "ultradict_ng.integrations.cachelib.SharedCache",
        "CACHE_DEFAULT_TIMEOUT": 60,
        "CACHE_OPTIONS": {"name": name, "threshold": 100, "key_prefix": "app:"},
    }
    app, cache = workers.flask_app(config)
    backend = app.extensions["cache"][cache]
    try:
        assert type(backend) is SharedCache
        assert backend.cache.maxsize == 100 and backend.default_timeout == 60
        with app.app_context():
            assert app.test_client().get("/pid").get_data(as_text=True) == str(os.getpid())
            assert app.slow_square(12) == (144, os.getpid())
            assert cache.cache.inc("requests") == 1  # Cache proxies no inc: the backend's
        [child] = run_workers([("flask_requests", (config,))])
        # The other process got the view and the memoized value this one computed.
        assert child["pid"] != os.getpid()
        assert child == {
            "pid": child["pid"],
            "view": str(os.getpid()),
            "square": (144, os.getpid()),
            "counter": 2,
        }
        assert all(k.startswith("app:") for k in backend.cache)
        with app.app_context():
            cache.delete_memoized(app.slow_square)
            assert app.slow_square(12) == (144, os.getpid())
            assert cache.unlink("app_key") in ([], ["app_key"])  # deletes keys, not the cache
            assert cache.get("requests") == 2
    finally:
        backend.close()


def test_flask_caching_factory(name: str) -> None:
    """Flask-Caching calls ``factory(app, config, args, kwargs)`` for the path
    ``ultradict_ng.integrations.flask.SharedCache`` (no "cachelib" in it):
    CACHE_THRESHOLD, CACHE_KEY_PREFIX and CACHE_SERIALIZER then apply; without
    a name it refuses (each worker would get a cache of its own)."""
    pytest.importorskip("flask_caching")
    from flask import Flask
    from flask_caching import Cache

    from ultradict_ng.integrations.flask import SharedCache as FlaskSharedCache

    app = Flask(__name__)
    app.config.update(
        CACHE_TYPE="ultradict_ng.integrations.flask.SharedCache",
        CACHE_THRESHOLD=50,
        CACHE_DEFAULT_TIMEOUT=30,
        CACHE_SERIALIZER=workers.JSONSerializer,
    )
    with pytest.raises(ValueError, match="needs a name"):
        Cache(app)
    app.config.update(CACHE_KEY_PREFIX="p_", CACHE_ARGS=[name])
    cache = Cache(app)
    backend = app.extensions["cache"][cache]
    try:
        assert type(backend) is FlaskSharedCache and isinstance(backend, SharedCache)
        assert backend.name == name
        assert backend.cache.maxsize == 50 and backend.default_timeout == 30
        assert isinstance(backend.serializer, workers.JSONSerializer)
        with app.app_context():
            cache.set("x", {"a": 1})
            assert cache.get("x") == {"a": 1}
        assert backend.cache.get("p_x") == b'{"a": 1}'
    finally:
        backend.close()
