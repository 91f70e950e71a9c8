"""Worker functions of tests/test_django_cache.py, written as a Django project uses its
cache: settings configured, then ``django.core.cache.cache``.  They live in an
importable module so that ``spawn`` children can run them."""

from __future__ import annotations

import os
import time
from typing import Any

BACKEND = "ultradict_ng.integrations.django.SharedCache"


def django_cache(location: str, options: dict[str, Any] | None = None) -> Any:
    """This process's ``django.core.cache.cache``, configured on ``location``."""
    from django.conf import settings

    settings.configure(
        CACHES={"default": {"BACKEND": BACKEND, "LOCATION": location, "OPTIONS": options or {}}}
    )
    from django.core.cache import cache

    return cache


def read_and_write(location: str, results: Any) -> None:
    """Report what the parent stored, then store a value of our own."""
    cache = django_cache(location)
    results.put((cache.get("from-parent"), cache.get("missing", "default")))
    cache.set("from-child", {"pid": os.getpid(), "list": [1, 2, 3]})


def add_race(location: str, start: Any, results: Any, rounds: int) -> None:
    """Each round, at the barrier, ``add`` that round's key; report which we won."""
    cache = django_cache(location)
    cache.get("warm-up")  # the attach happens before the barrier, not in the race
    wins = []
    for r in range(rounds):
        start.wait()
        wins.append(cache.add(f"race-{r}", os.getpid()))
    results.put((os.getpid(), wins))


def count(location: str, start: Any, n: int) -> None:
    """At the barrier, ``incr`` the counter ``n`` times and ``decr`` it ``n // 2`` times."""
    cache = django_cache(location)
    cache.get("warm-up")
    start.wait()
    for i in range(n):
        cache.incr("counter")
        if i % 2:
            cache.decr("counter", 1)


def set_expiring(location: str, timeout: float, results: Any) -> None:
    """Store a key that expires in ``timeout`` seconds; report when (wall clock)."""
    cache = django_cache(location)
    cache.set("short-lived", "here", timeout)
    results.put(time.time())


def create_and_exit(location: str, options: dict[str, Any]) -> None:
    """Create the cache (this process is its creator), store a value, exit normally."""
    cache = django_cache(location, options)
    cache.set("survivor", "still here", None)
