"""UltraDict compatibility: ``from ultradict_ng import UltraDict``.

A drop-in for the documented API of UltraDict 0.0.6 (PyPI ``UltraDict``) on top
of :class:`~ultradict_ng.SharedDict`.  It is a thin layer: the class *is* a
``SharedDict`` (same engine, segments, lock and crash safety) that

* takes UltraDict's constructor (defaults: pickle, ``buffer_size=10_000``;
  initial data from ``*args``/``**kwargs`` like ``dict``);
* adds UltraDict's attributes and methods (``data``, ``apply_update()``,
  ``dump()``, ``load()``, ``status()``, ``print_status()``,
  ``close(unlink=False)`` returning the data, ``unlink_by_name(name,
  ignore_errors=False)`` returning a bool);
* wraps the lock in :class:`UltraLock`, which speaks UltraDict's lock API
  (``block=``, ``timeout=``, ``steal=``, ``steal_after_timeout=``,
  ``sleep_time=``, :class:`CannotAcquireLock` with ``blocking_pid``);
* raises UltraDict's exception classes (``UltraDict.Exceptions.<Name>``),
  each a subclass of the matching ultradict_ng error, so code catching either
  family works.

This module holds the class and how it opens a dict; the exception classes
and the decorator that maps our errors to them are in
:mod:`ultradict_ng.compat.errors`, the lock in :mod:`ultradict_ng.compat.lock`.
Everything public is re-exported by the package (``from ultradict_ng.compat import
UltraDict, UltraLock, Exceptions, CannotAcquireLock ...``).

``docs/migrating.md`` lists what behaves better, what differs on purpose, and what
is not carried over.
"""

from __future__ import annotations

import importlib
import pickle
import pprint
import sys
import types
import weakref
from typing import Any, Optional

from .. import errors
from .._codec.codec import ObjectCodec, PickleCodec
from .._engine import Options
from .._engine.backends import open_engine
from .._engine.backends import unlink_by_name as _unlink_by_name
from .._shm import layout as L
from .._shm.store import Store
from ..shareddict import SharedDict
from . import log as log_module
from .errors import (
    AlreadyClosed,
    AlreadyExists,
    CannotAcquireLock,
    CannotAcquireLockTimeout,
    CannotAttachSharedMemory,
    Exceptions,
    FullDumpMemoryFull,
    MissingDependency,
    ParameterMismatch,
    map_errors,
)
from .lock import DEFAULT_SLEEP_TIME as DEFAULT_SLEEP_TIME
from .lock import UltraLock

__all__ = [
    "UltraDict",
    "UltraLock",
    "Exceptions",
    "AlreadyExists",
    "CannotAttachSharedMemory",
    "CannotAcquireLock",
    "CannotAcquireLockTimeout",
    "ParameterMismatch",
    "AlreadyClosed",
    "FullDumpMemoryFull",
    "MissingDependency",
]

#: UltraDict's defaults for a dict this handle creates.
DEFAULT_BUFFER_SIZE = 10_000
#: ``Store.gen`` of a cache that was invalidated and is reloaded by the next read.
_RELOAD_PENDING = -1


# -- per-store state ----------------------------------------------------------------------
#
# Nested views share the root's Store (SharedDict makes them with
# ``ViewBase.__new__`` and sets only ``_store`` and ``_path``), so what a compat
# handle needs beyond that lives here, keyed weakly by the store.


class _Info:
    __slots__ = ("lock", "auto_unlink")

    def __init__(self, store: Store, auto_unlink: bool) -> None:
        self.lock = UltraLock(store)
        self.auto_unlink = auto_unlink


_infos: weakref.WeakKeyDictionary[Store, _Info] = weakref.WeakKeyDictionary()


def _info(store: Store) -> _Info:
    info = _infos.get(store)
    if info is None:
        info = _infos.setdefault(store, _Info(store, store.created))
    return info


class _Default:
    """Marks a parameter the caller did not pass (creating and attaching treat it differently)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


_DEFAULT_SERIALIZER: Any = _Default(pickle)
_DEFAULT_BUFFER: Any = _Default(DEFAULT_BUFFER_SIZE)


def _open_store(
    name: Optional[str],
    create: Optional[bool],
    buffer_size: Any,
    serializer: Any,
    auto_unlink: Optional[bool],
    recurse: Optional[bool],
    full_dump_size: Optional[int],
    initial: Optional[list[list[Any]]],
    blob_threshold: Optional[int] = None,
) -> Store:
    """Create or attach like UltraDict.

    Parameters the caller did not pass take UltraDict's defaults when creating
    and the stored values when attaching; explicit ones are checked against
    the stored ones (ParameterMismatch).  As in UltraDict, ``auto_unlink`` only
    applies to the handle that creates the dict.
    """
    defaults: dict[str, Any] = {
        "auto_unlink": True if auto_unlink is None else auto_unlink,
        # UltraDict hands out private, writable copies of every value: so do
        # its dicts here, unless blobs are asked for explicitly.
        "blob_threshold": 0,
    }
    if isinstance(serializer, _Default):
        defaults["serializer"], serializer = serializer.value, None
    if isinstance(buffer_size, _Default):
        defaults["buffer_size"], buffer_size = buffer_size.value, None
    if full_dump_size is not None and (
        not isinstance(full_dump_size, int) or isinstance(full_dump_size, bool) or full_dump_size < 0
    ):
        raise TypeError("full_dump_size must be None or a non-negative int (bytes)")
    options = Options(
        recurse=recurse,
        buffer_size=buffer_size,
        serializer=serializer,
        dump_limit=full_dump_size or None,  # UltraDict: 0 means "no static size"
        blob_threshold=blob_threshold,
        create_defaults=defaults,
        backend="shm",
    )  # UltraDict's API is shared memory's, whatever the environment says
    store = open_engine(name, create, options, initial)
    assert isinstance(store, Store)
    return store


def _initial(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Optional[list[list[Any]]]:
    """``dict(*args, **kwargs)`` as [key, value] pairs (None if empty)."""
    if len(args) > 1:
        raise TypeError(f"UltraDict expected at most 1 positional argument, got {len(args)}")
    first: Any = args[0] if args else ()
    if isinstance(first, SharedDict):
        first = first.copy()
    data = dict(first, **kwargs)
    if not data:
        return None
    return [[k, v.copy() if isinstance(v, SharedDict) else v] for k, v in data.items()]


def _serializer_spec(store: Store) -> Any:
    """What a receiving process needs to attach: None, or how to get the serializer object."""
    codec = store.codec
    if not isinstance(codec, ObjectCodec):
        return None  # msgpack and pickle are named in the dict's header
    obj = codec.serializer
    if isinstance(obj, types.ModuleType):
        return ("module", obj.__name__)  # a module cannot be pickled; its name can
    return ("object", obj)


def _reattach(cls: type, name: str, path: tuple[Any, ...], spec: Any) -> UltraDict:
    if spec is None:
        serializer: Any = _DEFAULT_SERIALIZER
    elif spec[0] == "module":
        serializer = importlib.import_module(spec[1])
    else:
        serializer = spec[1]
    root: UltraDict = cls(name=name, create=False, serializer=serializer)
    return root._view(path) if path else root


# -- the dict -----------------------------------------------------------------------------


@map_errors  # every method, inherited ones included, raises UltraDict's exceptions
class UltraDict(SharedDict):
    """UltraDict's API on a :class:`~ultradict_ng.SharedDict`.

    ``UltraDict(*args, name=None, create=None, buffer_size=10_000,
    serializer=pickle, shared_lock=None, full_dump_size=None, auto_unlink=None,
    recurse=None, recurse_register=None, **kwargs)``

    * Initial data from ``*args``/``**kwargs`` as for ``dict``; applied only by
      the process that creates the dict.
    * ``buffer_size`` and ``serializer`` default to UltraDict's (10 000 bytes,
      pickle) when this handle *creates* the dict; when it attaches, the values
      stored with the dict are used.  Passed explicitly, they must match the
      stored ones (:class:`ParameterMismatch`).  ``serializer`` is ``pickle``
      or any object with ``dumps``/``loads`` returning bytes or str (``json``);
      every process passes the same object (as with UltraDict).
    * ``full_dump_size``: a *cap* in bytes on a full dump (the whole dict
      serialized, plus a 32-byte header), checked whenever one is written; a
      write that would need a bigger one raises :class:`FullDumpMemoryFull`
      and changes nothing.  Nothing is preallocated.
    * ``shared_lock`` and ``recurse_register`` are accepted and ignored: the
      lock is always cross-process, and nested dicts need no register.
    * ``auto_unlink`` (default True for the creating handle) unlinks the dict
      when the creating handle is closed, collected, or its process exits.
    * ``blob_threshold`` (an ultradict_ng extension; default 0, never): large
      buffers and arrays go to blobs and read back zero-copy and read-only, as
      with ``SharedDict``; by default every value is a private copy, as in UltraDict.

    Every method, including those inherited from ``SharedDict``, raises
    UltraDict's exception classes instead of ours (:func:`map_errors`).
    """

    __slots__ = ()

    #: UltraDict's API (status, dump, full_dump_counter ...) speaks of the
    #: shared-memory engine's segments and counters: it always runs on Store.
    _store: Store

    Exceptions = Exceptions
    SharedLock = UltraLock
    #: UltraDict's log module API (``UltraDict.log.set_level(UltraDict.log.Levels.error)``)
    #: over the ``ultradict_ng`` logger: :mod:`ultradict_ng.compat.log`.
    log = log_module

    def __init__(
        self,
        *args: Any,
        name: Optional[str] = None,
        create: Optional[bool] = None,
        buffer_size: int = _DEFAULT_BUFFER,
        serializer: Any = _DEFAULT_SERIALIZER,
        shared_lock: Optional[bool] = None,
        full_dump_size: Optional[int] = None,
        auto_unlink: Optional[bool] = None,
        recurse: Optional[bool] = None,
        recurse_register: Any = None,
        blob_threshold: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        initial = _initial(args, kwargs)
        store = _open_store(
            name,
            create,
            buffer_size,
            serializer,
            auto_unlink,
            recurse,
            full_dump_size,
            initial,
            blob_threshold,
        )
        self._store = store
        self._path = ()
        _infos.setdefault(store, _Info(store, store.created and auto_unlink is not False))

    # -- dict methods that differ from SharedDict's -------------------------------------

    def update(self, other: Any = None, /, *args: Any, **kwargs: Any) -> None:
        """Like ``dict.update`` (``None`` allowed, as in UltraDict); atomic."""
        SharedDict.update(self, () if other is None else other, **kwargs)

    def has_key(self, key: Any) -> bool:
        return key in self

    def __repr__(self) -> str:
        """The contents as a dict's repr, as UltraDict prints."""
        if self.closed:
            return f"<{type(self).__name__} name={self.name!r} (closed)>"
        try:
            return repr(self.copy())
        except errors.PathGone:
            return f"<{type(self).__name__} name={self.name!r} path={list(self._path)!r} (gone)>"

    # -- UltraDict's attributes ---------------------------------------------------------

    @property
    def lock(self) -> UltraLock:  # type: ignore[override]
        """The whole tree's lock, with UltraDict's API (:class:`UltraLock`)."""
        store = self._store
        if store.closed:
            raise AlreadyClosed(f"UltraDict {store.name!r} already closed")
        return _info(store).lock

    @property
    def data(self) -> dict[Any, Any]:
        """The local cache, as it was last synced (no sync here): for reads only.

        Call :meth:`apply_update` to bring it up to date; ask again afterwards
        (loading a full dump replaces the dict object).
        """
        store = self._store
        return store.node(self._path) if self._path else store.data

    @property
    def serializer(self) -> Any:
        """The serializer object: ``pickle``, the object passed (``json``), or the msgpack codec."""
        codec = self._store.codec
        if isinstance(codec, ObjectCodec):
            return codec.serializer
        if isinstance(codec, PickleCodec):
            return pickle
        return codec

    @property
    def full_dump_size(self) -> Optional[int]:
        return self._store.dump_limit or None

    @property
    def full_dump_counter(self) -> int:
        """The full dump generation this handle's cache reflects (0 before the first dump).

        When the cache was invalidated and waits to be reloaded, the published
        generation, which the next read loads.
        """
        s = self._store
        if s.gen == _RELOAD_PENDING:
            return int(s.words[L.W_STATE] >> L.GEN_SHIFT)
        return s.gen

    @property
    def shared_lock(self) -> bool:
        return True

    @property
    def auto_unlink(self) -> bool:
        return _info(self._store).auto_unlink

    @property
    def recurse_register(self) -> None:
        return None

    # -- UltraDict's methods -------------------------------------------------------------

    def apply_update(self) -> None:
        """Bring the local cache (:attr:`data`) up to date; every read does this itself."""
        self._store.sync()

    def load(self, force: bool = False) -> None:
        """Load what is new; ``force=True`` reloads from the current full dump, then the stream."""
        if force:
            self._store.reload()
        else:
            self._store.sync()

    def dump(self) -> None:
        """Write a full dump now (restarting the update stream); :class:`FullDumpMemoryFull` over the cap."""
        self._store.force_dump()

    def status(self) -> dict[str, Any]:
        """UltraDict's status fields, mapped onto ours (see docs/migrating.md for their meaning)."""
        s = self._store
        state = s.words[L.W_STATE]
        gen_remote, end_remote = state >> L.GEN_SHIFT, state & L.END_MASK
        gen = gen_remote if s.gen == _RELOAD_PENDING else s.gen  # full_dump_counter
        owner = s.lock.owner_pid or 0
        return {
            "name": s.name,
            "control": s.name,
            "buffer": L.stream_name(s.name),
            "buffer_size": s.stream_size,
            "update_stream_position": s.pos,
            "update_stream_position_remote": end_remote,
            "full_dump_counter": gen,
            "full_dump_counter_remote": gen_remote,
            "full_dump_memory": L.dump_name(s.name, gen) if gen > 0 else None,
            "full_dump_memory_name_remote": L.dump_name(s.name, gen_remote) if gen_remote else "",
            "full_dump_size": s.dump_limit or None,
            "full_dump_static_size_remote": s.dump_limit,
            "lock": _info(s).lock,
            "lock_pid_remote": owner,
            "lock_remote": 1 if owner else 0,
            "shared_lock": True,
            "shared_lock_remote": True,
            "recurse": s.recurse,
            "recurse_remote": s.recurse,
            "recurse_register": None,
            "serializer": self.serializer,
            "closed": False,
            "auto_unlink": _info(s).auto_unlink,
        }

    def print_status(self, status: Optional[dict[str, Any]] = None, stderr: bool = False) -> None:
        """Pretty-print :meth:`status` to stdout (or stderr)."""
        pprint.pprint(status or self.status(), stream=sys.stderr if stderr else sys.stdout)

    def close(self, unlink: bool = False) -> Optional[dict[str, Any]]:  # type: ignore[override]
        """Detach this process's handle; returns the contents as a plain dict.

        ``unlink=True`` removes the dict for everybody first.  Closing an
        already closed handle does nothing and returns None (as UltraDict).
        A nested view closes the whole tree's handle in this process.
        """
        store = self._store
        if store.closed:
            return None
        try:
            data: dict[Any, Any] = self.copy()
        except errors.PathGone:
            data = {}
        try:
            if unlink:
                store.unlink()
        finally:
            store.close()
        return data

    def unlink(self) -> int:
        """Remove the dict for everybody and close this handle (``close(unlink=True)``).

        Returns the number of segments removed; 0 on a closed handle, which
        (as in UltraDict) does nothing: use ``close(unlink=True)`` or
        :meth:`unlink_by_name`.
        """
        store = self._store
        if store.closed:
            return 0
        try:
            return store.unlink()
        finally:
            store.close()

    @staticmethod
    def unlink_by_name(name: str, ignore_errors: bool = False) -> bool:
        """Remove every segment of the dict ``name``; True if there was one.

        Otherwise raises :class:`CannotAttachSharedMemory`, or returns False
        with ``ignore_errors=True``.  Works after every user was killed.
        """
        try:
            removed = _unlink_by_name(name)
        except errors.InvalidName:
            if ignore_errors:
                return False
            raise
        if removed:
            return True
        if not ignore_errors:
            raise CannotAttachSharedMemory(f"Could not get memory {name!r}: no such shared dict")
        return False

    def __reduce__(self) -> tuple[Any, ...]:
        # Travels by name (and path); a custom serializer travels as its module's
        # importable name, or pickled if it is not a module.
        return (_reattach, (type(self), self.name, self._path, _serializer_spec(self._store)))
