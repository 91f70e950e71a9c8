"""The backend seam: what :class:`~ultradict_ng.SharedDict` needs from the
machinery that shares its data.

The facade (``shareddict.py``) knows nothing of segments, streams or dumps:
it talks to an :class:`Engine` -- one process's attachment to one shared
dict tree -- through the small interface below, and to
:func:`ultradict_ng._engine.backends.open_engine` and ``unlink_by_name`` (which pick
the engine) to make and remove one.  The shared-memory engine is
:class:`ultradict_ng._shm.store.Store`, the Redis one
:class:`ultradict_ng._redis.engine.RedisEngine`: the facade, its nested views,
pickling, the UltraDict layer and the asyncio face work on either unchanged.
This module is only the interface: it imports no engine.

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
  :mod:`ultradict_ng._codec.records`) and ``end_write()``; ``commit`` either publishes
  the whole record and applies it to ``data`` or raises and changes nothing
  that any process can see.  ``mutex`` guards ``data`` against this process's
  other threads.
  A commit whose decision rested on a cache another process has since
  overtaken may raise :class:`Conflict` after refreshing ``data`` (an engine
  that checks optimistically, as the Redis one does; the shared-memory
  engine holds the lock and never raises it): the facade runs the operation
  again.  ``write(record)`` publishes a record whose effect does not depend
  on the state (a set, update or clear at the root) without the checks.
* **Waiting without blocking an event loop** (the asyncio face,
  ``aio.py``): ``change_mark()`` is the state ``data`` reflects, and
  ``wait_past(mark, timeout)`` blocks the calling thread -- a helper thread,
  never the event loop's -- until the published state moves past ``mark``
  or the dict is removed, touching neither ``data`` nor ``mutex``; the face
  then catches up with ``wait_for_change(0)``.  A feed's ``wait`` and the
  lock's ``wait_until_free`` are the same kind of call, and the face takes
  the lock itself with ``lock.try_acquire()`` in the loop's thread (the
  lock belongs to a thread).  A caller cancels by passing short timeouts and
  not calling again.
* **Errors** are :mod:`ultradict_ng.errors` classes only.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    NamedTuple,
    Optional,
    Protocol,
    Union,
    runtime_checkable,
)

from ..errors import Closed

if TYPE_CHECKING:
    from .._codec.codec import Codec
    from .._platform.lock import SharedLock
    from ..changes import ChangeSource

__all__ = [
    "Engine",
    "Transactional",
    "Options",
    "Conflict",
    "BlobGone",
    "ClosedWords",
    "check_open",
    "User",
    "Initial",
]

Path = tuple[Any, ...]
#: What a created dict starts with: [key, value] lists, or a ``dict`` given whole
#: (which an engine may load without them: ``Engine.load``).
Initial = Union[list[list[Any]], dict[Any, Any], None]


class User(NamedTuple):
    """One process using a dict (``SharedDict.users()``): its pid, its start
    time (clock ticks since boot, 0 where there is no /proc or the engine
    cannot tell) and whether it is alive now."""

    pid: int
    start_time: int
    alive: bool


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
    #: Shared memory only, this handle's own: the most values of a big dict
    #: it keeps decoded (None: every one it read).
    max_decoded: Optional[int] = None
    #: A dict kept in files: its directory (``_disk``), and the sync policy
    #: ("always", "interval", "never") and interval (seconds) it is created with.
    path: Any = None
    sync: Optional[str] = None
    sync_interval: Optional[float] = None
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
        raise self.error()

    def error(self) -> Closed:
        return Closed(f"this handle of shared dict {self._name!r} is closed")


def check_open(words: object) -> None:
    """Raise ``Closed`` if ``words`` is a closed handle's (:class:`ClosedWords`).

    An operation calls it first, so that a closed handle fails before the lock is
    taken or anything is read; the hit path needs no call, since its first load
    of a ``ClosedWords`` raises by itself."""
    if isinstance(words, ClosedWords):
        raise words.error()


class Conflict(Exception):
    """Internal: the engine refreshed its cache because another process wrote
    first; the facade runs the operation again (never reaches users)."""


class BlobGone(Exception):
    """Internal: a state newer than the one the cache reflects dropped a large
    value this cache still names (``materialize``/``view`` found it gone); the
    facade reads again (never reaches users)."""


class Engine(Protocol):
    """One process's attachment to one shared dict tree (see the module docstring)."""

    name: str
    recurse: bool
    codec: Codec
    mutex: threading.RLock
    #: True for the handle that created the dict.
    created: bool
    words: Any
    seen: int
    data: dict[Any, Any]

    @property
    def lock(self) -> SharedLock:
        """The tree's lock: the front end ``_lock.SharedLock`` over this engine's
        shared part (a subclass that implements only that part)."""

    @property
    def closed(self) -> bool: ...

    @property
    def buffer_size(self) -> int:
        """Bytes of the update buffer now (meaning is the engine's)."""

    def sync(self) -> None:
        """Bring ``data`` up to the published state."""

    def reload(self) -> None:
        """Drop ``data`` and load the whole published state again."""

    def node(self, path: Path) -> dict[Any, Any]:
        """The cached dict at ``path`` (synced by the caller); PathGone if none."""

    def materialize(self, stored: Any) -> Any:
        """The user's value of a cache placeholder (``_codec.placeholders``:
        ``BlobRef``, ``InlineArray``, ``PickledBlobs``); :class:`BlobGone` if a
        newer state dropped it (the caller reads again)."""

    def view(self, stored: Any) -> memoryview:
        """A read-only memoryview of a placeholder's bytes, without a copy."""

    def begin_write(self) -> None: ...

    def commit(self, record: list[Any]) -> None: ...

    def write(self, record: list[Any]) -> None:
        """``begin_write``, ``commit(record)``, ``end_write`` for a record that
        needs no check against the cache."""

    def end_write(self) -> None: ...

    def load(self, mapping: dict[Any, Any]) -> bool:
        """``update(mapping)`` at the root done faster than by a record (a bulk
        load), True; or False, nothing changed: the caller writes the record."""

    def set_root(self, key: Any, value: Any) -> None:
        """``begin_write``, ``commit(record.set_((), key, value))``, ``end_write``."""

    def force_dump(self) -> None:
        """Make the whole state one snapshot now (a full dump; a no-op where
        the engine keeps none)."""

    def wait_for_change(self, timeout: Optional[float]) -> bool:
        """Block until the tree changes after the state ``data`` reflects, then
        bring ``data`` up to date (True); False after ``timeout`` seconds."""

    def change_mark(self) -> int:
        """The value of the change counter ``data`` reflects, for :meth:`wait_past`
        (what it counts is the engine's)."""

    def wait_past(self, mark: int, timeout: float) -> bool:
        """Block the calling thread until the published state moves past
        ``mark`` or the dict is removed (True; at once if it already has), or
        ``timeout`` seconds pass (False).  Changes nothing: neither ``data``
        nor ``mutex``, so a helper thread may wait here while others use the
        handle (module docstring)."""

    def feed(self) -> ChangeSource:
        """A change feed (``changes.ChangeSource``: ``poll``/``wait``/``ended``) that
        starts at the state ``data`` reflects."""

    def stats(self) -> dict[str, Any]:
        """Facts about the dict for people and tools: sizes, counters, holders."""

    def users(self) -> list[User]:
        """The processes attached to the dict (alive and dead)."""

    def close(self) -> None:
        """Detach this process (auto-unlink if this handle was armed to)."""

    def unlink(self) -> int:
        """Remove the dict for everybody; how many storage objects were removed."""

    def reopen_arguments(self) -> dict[str, Any]:
        """Keyword arguments, beside ``name`` and ``create``, with which another
        process opens this same dict (its backend, and the read mode where the
        engine has one): what a pickled handle carries, so the facade need not
        know which engine it runs on."""


@runtime_checkable
class Transactional(Protocol):
    """An engine that has transactions (``SharedDict.transaction()``): shared
    memory and Redis.  The facade checks for it, so an engine without them
    refuses a transaction with a clear error instead of running the block
    unprotected."""

    def begin_transaction(self) -> None:
        """Take the lock (this thread; reentrant) and start buffering: until the
        matching :meth:`end_transaction`, ``commit``/``write``/``set_root`` of
        this thread apply to ``data`` and publish nothing.  A transaction
        begun while one is open joins it (a level deeper)."""

    def end_transaction(self, publish: bool) -> None:
        """Leave one level of the transaction, then release the lock.  At the
        outermost level, ``publish=True`` publishes every buffered write at
        once -- one publish, all or nothing -- or raises having published
        nothing (``data`` is then reloaded); ``publish=False`` discards them
        and reloads ``data``.  A level left with ``publish=False`` dooms the
        whole transaction: the outermost level then raises
        :class:`~ultradict_ng.errors.TransactionAborted` instead of publishing."""
