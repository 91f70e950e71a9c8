"""Choosing the engine: which backend a dict lives on, and opening or removing
it there.

The facade and the UltraDict layer call :func:`open_engine` and
:func:`unlink_by_name`; the backend comes from their ``backend`` argument or,
when none is given, from the environment (:data:`BACKEND_ENV`).  Kept apart
from the interface (``_engine/__init__.py``) because it imports the engines, which
import the interface: the dependencies run one way only.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from .._facade.arguments import pairs
from .._shm import cleanup
from .._shm.store import Store
from ..errors import NotFound
from . import Engine, Initial, Options

__all__ = ["open_engine", "unlink_by_name", "resolve_backend", "BACKEND_ENV"]

#: The backend a SharedDict opened without ``backend=`` uses: a Redis URL, or
#: unset / "shm" for shared memory.
BACKEND_ENV = "ULTRADICT_NG_BACKEND"


#: ``_disk.opening``, imported on the first dict kept in files (a process that
#: never opens one never loads it); kept here, as an import statement in the
#: function cost ~9 us of every reopen.
_opening: Any = None


def _import_opening() -> Any:
    global _opening
    from .._disk import opening

    _opening = opening
    return opening


def open_engine(
    name: Optional[str], create: Optional[bool], options: Options, initial: Initial = None
) -> Engine:
    """Create or attach to the dict ``name`` (``create`` as in ``SharedDict``);
    ``initial`` ([key, value] lists, or a dict) is stored only by the process that creates it."""
    if options.path is not None:
        opening = _opening or _import_opening()
        token = None
        if name is not None:  # (a handle sent to another process names both: ``_reattach``)
            token = opening.check_name(name, options.path)
        store: Store = opening.open_durable(options.path, create, options, initial)
        if token is not None and store.token != token:  # (another dict made there since)
            store.close()
            raise NotFound(opening.gone(options.path))
        return store
    if options.sync is not None or options.sync_interval is not None:
        raise ValueError("sync= and sync_interval= are for a dict kept in files (path=)")
    backend = resolve_backend(options.backend)
    if backend is None:
        if options.lease is not None or options.staleness is not None:
            raise ValueError("lease= and staleness= are for the Redis backend only")
        if options.reads not in (None, "fresh", "cached"):
            raise ValueError(f"reads must be 'fresh' or 'cached', not {options.reads!r}")
        return Store.open(name, create, options, initial)
    if options.max_decoded is not None:
        raise ValueError("max_decoded= is for shared memory only (the Redis backend decodes no table)")
    # (Imported on first use: a process that never names a Redis server never loads its engine.)
    from .._redis.engine import RedisEngine

    if isinstance(initial, dict):
        initial = pairs(initial)
    return RedisEngine.open(
        name, create, options, initial, backend, options.reads, options.lease, options.staleness
    )


def resolve_backend(backend: Any) -> Any:
    """None for shared memory, else the Redis URL or client to use."""
    if backend is None:
        backend = os.environ.get(BACKEND_ENV) or None
    if backend is None or backend == "shm":
        return None
    if isinstance(backend, str) and not backend.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(
            f"backend must be 'shm', a redis://, rediss:// or unix:// URL, or a redis client; not {backend!r}"
        )
    return backend


def unlink_by_name(name: str, backend: Any = None) -> int:
    """Remove every storage object of the dict ``name``; how many (0 if none)."""
    where = resolve_backend(backend)
    if where is not None:
        from .._redis.engine import unlink_by_name as unlink_redis

        return unlink_redis(name, where)
    return cleanup.unlink_by_name(name)
