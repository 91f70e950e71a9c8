"""Workers of tests/test_cachelib_cache.py (importable by spawned children).

Each opens the cachelib backend by name, does its part, closes, and returns
what it saw; none waits longer than its bounded waits.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import time
from typing import Any

from cachelib.serializers import BaseSerializer

from ultradict_ng.integrations.cachelib import SharedCache


@dataclasses.dataclass
class Point:
    """A value only pickle carries (a class of this module)."""

    x: int
    y: float


class JSONSerializer(BaseSerializer):
    """JSON, as cachelib's own (which cachelib < 0.10 lacks)."""

    def dumps(self, value: Any, protocol: int = 0) -> bytes:
        return json.dumps(value).encode()

    def loads(self, bvalue: bytes) -> Any:
        return json.loads(bvalue)


class Unpicklable:
    """A value pickle refuses with a PicklingError."""

    def __reduce__(self) -> Any:
        raise pickle.PicklingError("not this one")


def report(out: Any, worker: str, *args: Any) -> None:
    """Run ``worker`` (a function of this module) and put ("ok", result) or
    ("error", traceback) on ``out``."""
    try:
        out.put(("ok", globals()[worker](*args)))
    except BaseException:  # every failure goes back to the test, as text
        import traceback

        out.put(("error", traceback.format_exc()))


def use_inherited(cache: SharedCache, out: Any) -> None:
    """In a forked child: use the parent's handle (as a gunicorn worker forked from a
    master that made the app -- preload_app -- does), report, exit."""
    cache.set("child", os.getpid())
    out.put((cache.inc("n"), cache.get("parent")))


def write_values(name: str) -> int:
    """Attach, store values of several kinds (each with its own timeout), close."""
    with SharedCache(name, threshold=None) as cache:
        cache.set("point", Point(1, 2.5))
        cache.set("nested", {"a": [1, (2, 3)], 4: {"b": None}}, timeout=0)
        cache.set("count", 41)
        cache.set("flag", False)
        cache.set_many({"m1": b"\x00bytes", "m2": "text"}, timeout=60)
        cache.add("added", [1, 2])
        return os.getpid()


def read_values(name: str, keys: list[str]) -> dict[str, Any]:
    """Attach and return ``{key: get(key)}`` and has() of each."""
    with SharedCache(name, threshold=None) as cache:
        return {k: (cache.get(k), cache.has(k)) for k in keys}


def incrementer(name: str, key: str, n: int, delta: int, start: Any) -> list[int]:
    """After ``start`` (a barrier), ``inc`` (dec for a negative delta) ``key`` n times;
    returns every value inc returned."""
    with SharedCache(name, threshold=None) as cache:
        start.wait(60)
        seen = []
        for _ in range(n):
            seen.append(cache.inc(key, delta) if delta > 0 else cache.dec(key, -delta))
        return seen


def adder(name: str, keys: list[str], start: Any) -> list[str]:
    """After ``start``, ``add`` each key with this pid as value; the keys this process won."""
    with SharedCache(name, threshold=None) as cache:
        start.wait(60)
        return [k for k in keys if cache.add(k, os.getpid())]


def watch_expiry(name: str, deadline: float) -> list[tuple[float, str | None, str | None, bool]]:
    """Poll ``short`` and ``forever`` until ``short`` is gone (or ``deadline``, a
    time.time()): [(time, get(short), get(forever), has(short)), ...]."""
    with SharedCache(name, threshold=None) as cache:
        seen = []
        while True:
            now = time.time()
            entry = (now, cache.get("short"), cache.get("forever"), cache.has("short"))
            seen.append(entry)
            if entry[1] is None or now > deadline:
                return seen
            time.sleep(0.02)


def create_and_fill(name: str, attached: Any, release: Any) -> int:
    """Create the cache (the first user), fill it, signal ``attached`` once the
    parent may attach, wait for ``release``, exit (the worker recycled)."""
    cache = SharedCache(name, threshold=100, create=True)
    cache.set("from_worker", os.getpid(), timeout=0)
    attached.set()
    release.wait(60)
    cache.close()
    return os.getpid()


# -- Flask-Caching -------------------------------------------------------------------------


def flask_app(config: dict[str, Any]) -> tuple[Any, Any]:
    """A Flask app with Flask-Caching configured by ``config``: (app, cache).
    Its view ``/pid`` is cached, ``slow_square`` memoized: both return the pid of
    the process that computed them."""
    from flask import Flask
    from flask_caching import Cache

    app = Flask(__name__)
    app.config.update(config)
    cache = Cache(app)

    @app.route("/pid")
    @cache.cached(timeout=60)
    def pid() -> str:
        return str(os.getpid())

    @cache.memoize(timeout=60)
    def slow_square(x: int) -> tuple[int, int]:
        return x * x, os.getpid()

    app.slow_square = slow_square  # type: ignore[attr-defined]
    return app, cache


def flask_requests(config: dict[str, Any]) -> dict[str, Any]:
    """Build the app in this process and report what its cached view and memoized
    function return (computed here, or by another process that shares the cache)."""
    app, cache = flask_app(config)
    with app.app_context():
        client = app.test_client()
        out = {
            "pid": os.getpid(),
            "view": client.get("/pid").get_data(as_text=True),
            "square": app.slow_square(12),
            "counter": cache.cache.inc("requests"),
        }
        backend = app.extensions["cache"][cache]
        backend.close()
    return out
