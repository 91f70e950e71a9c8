"""The backend seam: what :class:`~ultradict_ng.SharedDict` needs from the
machinery that shares its data.

The facade (``shareddict.py``) knows nothing of segments, streams or dumps:
it talks to an :class:`Engine` -- one process's attachment to one shared
dict tree -- through the small interface below, and to :func:`open_engine`
and :func:`unlink_by_name` to make and remove one.  The shared-memory engine
is :class:`ultradict_ng.store.Store`; a second engine (a Redis backend, say)
implements the same interface and the facade, its nested views, pickling and
the UltraDict layer work on it unchanged.

Contract, beyond the signatures:

* **Cache and change counter.**  ``data`` is a process-local tree of plain
  dicts; ``words[layout.W_STATE]`` is the engine's change counter (an 8-byte
  word that changes with every published mutation) and ``seen`` the value
  ``data`` reflects.  When they are equal the facade answers reads from
  ``data`` without calling the engine; otherwise it calls :meth:`Engine.sync`.
  An engine subclasses ``speedups.StoreBase`` (which holds ``seen`` and
  ``data`` where the compiled read hit path finds them) and binds its counter
  with ``_bind_state``.
* **Mutations** are ``begin_write()`` (lock held, cache current, the dict
  still exists), checks against ``node(path)``, ``commit(record)`` (records:
  :mod:`ultradict_ng.record`) and ``end_write()``; ``commit`` either publishes
  the whole record and applies it to ``data`` or raises and changes nothing
  that any process can see.  ``mutex`` guards ``data`` against this process's
  other threads.
  A commit whose decision rested on a cache another process has since
  overtaken may raise :class:`Conflict` after refreshing ``data`` (an engine
  that checks optimistically, as the Redis one does; the shared-memory
  engine holds the lock and never raises it): the facade runs the operation
  again.  ``write(record)`` publishes a record whose effect does not depend
  on the state (a set, update or clear at the root) without the checks.
* **Errors** are :mod:`ultradict_ng.errors` classes only.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple, Union

if TYPE_CHECKING:
    from .changes import Feed
    from ._codec.codec import Codec
    from ._shm.lock import SharedLock
    from ._shm.users import User

__all__ = ["Engine", "Options", "Conflict", "ClosedWords", "open_engine", "unlink_by_name", "BACKEND_ENV"]

#: The backend a SharedDict opened without ``backend=`` uses: a Redis URL, or
#: unset / "shm" for shared memory.
BACKEND_ENV = "ULTRADICT_NG_BACKEND"

Path = Tuple[Any, ...]


@dataclass(frozen=True)
class Options:
    """How to open a dict.  ``None`` means "not given": a creating handle then
    takes ``create_defaults[field]`` (or the engine's default), an attaching
    handle the value stored with the dict; a given value must match the
    stored one (:class:`~ultradict_ng.errors.ParameterMismatch`)."""

    recurse: Optional[bool] = None
    buffer_size: Optional[int] = None
    serializer: Any = None
    #: None: True for the handle that creates the dict, False for attachers;
    #: "last": unlink when this handle closes if no other process is attached.
    auto_unlink: Union[bool, str, None] = None
    #: Cap in bytes on a full dump (0 or None: none); UltraDict's full_dump_size.
    dump_limit: Optional[int] = None
    #: Buffers and arrays this large or larger go to blobs (0: never).
    blob_threshold: Optional[int] = None
    #: Where the dict lives: None (``ULTRADICT_NG_BACKEND``, else shared
    #: memory), "shm", a redis:// / rediss:// / unix:// URL or a redis client.
    backend: Any = None
    #: Redis only: "fresh" (default) or "cached" reads; the lease of the lock
    #: and the cached mode's staleness bound, in seconds.
    reads: Optional[str] = None
    lease: Optional[float] = None
    staleness: Optional[float] = None
    #: Values a *creating* handle uses for fields given as None.
    create_defaults: Mapping[str, Any] = field(default_factory=dict)

    def for_create(self, name: str) -> Any:
        value = getattr(self, name)
        return self.create_defaults.get(name) if value is None else value


class ClosedWords:
    """Stands in for an engine's ``words`` after close, so the hit path needs
    no extra check: the facade's first load raises ``Closed``."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getitem__(self, index: int) -> int:
        from .errors import Closed

        raise Closed(f"this handle of shared dict {self._name!r} is closed")


class Conflict(Exception):
    """Internal: the engine refreshed its cache because another process wrote
    first; the facade runs the operation again (never reaches users)."""


class Engine(Protocol):
    """One process's attachment to one shared dict tree (see the module docstring)."""

    name: str
    recurse: bool
    codec: "Codec"
    mutex: "threading.RLock"
    #: True for the handle that created the dict.
    created: bool
    words: Any
    seen: int
    data: Dict[Any, Any]

    @property
    def lock(self) -> "SharedLock":
        """The tree's lock (a ``SharedLock``, or a subclass with the same face)."""

    @property
    def closed(self) -> bool: ...

    @property
    def buffer_size(self) -> int:
        """Bytes of the update buffer now (meaning is the engine's)."""

    def sync(self) -> None:
        """Bring ``data`` up to the published state."""

    def reload(self) -> None:
        """Drop ``data`` and load the whole published state again."""

    def node(self, path: Path) -> Dict[Any, Any]:
        """The cached dict at ``path`` (synced by the caller); PathGone if none."""

    def materialize(self, stored: Any) -> Any:
        """The user's value of a cache placeholder (``blobs.BlobRef``,
        ``blobs.InlineArray``); ``blobs.BlobGone`` if a newer state dropped it
        (the caller reads again)."""

    def view(self, stored: Any) -> memoryview:
        """A read-only memoryview of a placeholder's bytes, without a copy."""

    def begin_write(self) -> None: ...

    def commit(self, record: List[Any]) -> None: ...

    def write(self, record: List[Any]) -> None:
        """``begin_write``, ``commit(record)``, ``end_write`` for a record that
        needs no check against the cache."""

    def end_write(self) -> None: ...

    def set_root(self, key: Any, value: Any) -> None:
        """``begin_write``, ``commit(record.set_((), key, value))``, ``end_write``."""

    def force_dump(self) -> None:
        """Make the whole state one snapshot now (a full dump; a no-op where
        the engine keeps none)."""

    def wait_for_change(self, timeout: Optional[float]) -> bool:
        """Block until the tree changes after the state ``data`` reflects, then
        bring ``data`` up to date (True); False after ``timeout`` seconds."""

    def feed(self) -> "Feed":
        """A change feed (``changes.Feed``'s ``poll``/``wait``/``ended``) that
        starts at the state ``data`` reflects."""

    def stats(self) -> Dict[str, Any]:
        """Facts about the dict for people and tools: sizes, counters, holders."""

    def users(self) -> "List[User]":
        """The processes attached to the dict (alive and dead)."""

    def close(self) -> None:
        """Detach this process (auto-unlink if this handle was armed to)."""

    def unlink(self) -> int:
        """Remove the dict for everybody; how many storage objects were removed."""


def open_engine(name: Optional[str], create: Optional[bool], options: Options,
                initial: Optional[Sequence[Sequence[Any]]] = None) -> Engine:
    """Create or attach to the dict ``name`` (``create`` as in ``SharedDict``);
    ``initial`` [key, value] pairs are stored only by the process that creates it."""
    backend = resolve_backend(options.backend)
    if backend is None:
        if options.lease is not None or options.staleness is not None:
            raise ValueError("lease= and staleness= are for the Redis backend only")
        if options.reads not in (None, "fresh", "cached"):
            raise ValueError(f"reads must be 'fresh' or 'cached', not {options.reads!r}")
        from ._shm.store import Store  # the shared-memory engine (imported late: it imports us)

        return Store.open(name, create, options, initial)
    from ._redis.engine import RedisEngine

    return RedisEngine.open(name, create, options, initial, backend, options.reads,
                            options.lease, options.staleness)


def resolve_backend(backend: Any) -> Any:
    """None for shared memory, else the Redis URL or client to use."""
    import os

    if backend is None:
        backend = os.environ.get(BACKEND_ENV) or None
    if backend is None or backend == "shm":
        return None
    if isinstance(backend, str) and not backend.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"backend must be 'shm', a redis://, rediss:// or unix:// URL, or a redis "
                         f"client; not {backend!r}")
    return backend


def unlink_by_name(name: str, backend: Any = None) -> int:
    """Remove every storage object of the dict ``name``; how many (0 if none)."""
    where = resolve_backend(backend)
    if where is not None:
        from ._redis.engine import unlink_by_name as unlink_redis

        return unlink_redis(name, where)
    from ._shm.cleanup import unlink_by_name as unlink_shm

    return unlink_shm(name)
