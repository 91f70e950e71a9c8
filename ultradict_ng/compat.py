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

``MIGRATING.md`` lists what behaves better, what differs on purpose, and what
is not carried over.
"""

from __future__ import annotations

import functools
import importlib
import os
import pickle
import pprint
import sys
import time
import types
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, TypeVar, cast

from . import errors
from . import layout as L
from .codec import ObjectCodec, PickleCodec
from .errors import SharedDictError
from .lock import SharedLock
from .shareddict import SharedDict
from .engine import Options, open_engine, unlink_by_name as _unlink_by_name
from .store import Store

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
DEFAULT_SLEEP_TIME = 0.000001

F = TypeVar("F", bound=Callable[..., Any])


# -- exceptions ---------------------------------------------------------------------------
#
# UltraDict's names, each subclassing the ultradict_ng error (and so the builtin)
# it corresponds to: ``except UltraDict.Exceptions.AlreadyClosed`` and
# ``except ultradict_ng.Closed`` (or ``ValueError``) both catch a closed handle.


class AlreadyExists(errors.AlreadyExists):
    """``create=True`` but a dict of that name exists (also :class:`ultradict_ng.AlreadyExists`)."""


class CannotAttachSharedMemory(errors.NotFound):
    """No dict of that name exists (``create=False``, ``unlink_by_name``); a :class:`ultradict_ng.NotFound`."""


class CannotAcquireLock(errors.LockTimeout):
    """The lock is held by another process or thread (``acquire(block=False)``).

    ``blocking_pid`` is the pid that held it (0 if it was released meanwhile);
    ``timestamp`` is ``time.monotonic()`` when the attempt failed.  A
    :class:`ultradict_ng.LockTimeout` (a ``TimeoutError``) with ``pid`` set too.
    """

    def __init__(self, *args: Any, blocking_pid: int = 0, timestamp: Optional[float] = None,
                 name: str = "", **kwargs: Any) -> None:
        message = str(args[0]) if args else "Cannot acquire lock"
        super().__init__(message, name=name, pid=blocking_pid or None)
        self.blocking_pid = blocking_pid
        self.timestamp = time.monotonic() if timestamp is None else timestamp

    def __reduce__(self) -> Any:  # keep the attributes across processes (Pool, queues)
        return (_rebuild_error, (type(self), str(self), dict(self.__dict__)))


class CannotAcquireLockTimeout(CannotAcquireLock):
    """``acquire(timeout=...)`` ran out; ``time_passed`` is how long it waited."""

    def __init__(self, *args: Any, time_passed: Optional[float] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.time_passed = time_passed


class ParameterMismatch(errors.ParameterMismatch):
    """An explicit parameter differs from the one the dict was created with."""


class AlreadyClosed(errors.Closed):
    """The handle was closed (also :class:`ultradict_ng.Closed`, a ``ValueError``)."""


class FullDumpMemoryFull(errors.OutOfSpace):
    """A full dump would exceed ``full_dump_size`` (or shared memory is full); nothing changed."""


class MissingDependency(SharedDictError, ImportError):
    """Kept for ``except`` clauses written for UltraDict; never raised (no optional dependency)."""


def _rebuild_error(cls: Type[Exception], message: str, state: Dict[str, Any]) -> Exception:
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    exc.__dict__.update(state)
    return exc


class Exceptions:
    """``UltraDict.Exceptions``: UltraDict's exception classes by their UltraDict names."""

    AlreadyExists = AlreadyExists
    CannotAttachSharedMemory = CannotAttachSharedMemory
    CannotAcquireLock = CannotAcquireLock
    CannotAcquireLockTimeout = CannotAcquireLockTimeout
    ParameterMismatch = ParameterMismatch
    AlreadyClosed = AlreadyClosed
    FullDumpMemoryFull = FullDumpMemoryFull
    MissingDependency = MissingDependency


_COMPAT_ERRORS = (AlreadyExists, CannotAttachSharedMemory, CannotAcquireLock, ParameterMismatch,
                  AlreadyClosed, FullDumpMemoryFull, MissingDependency)


def _translate(exc: SharedDictError) -> Optional[Exception]:
    """The UltraDict exception for one of ours, or None to let it through unchanged."""
    if isinstance(exc, _COMPAT_ERRORS):
        return None
    if isinstance(exc, errors.LockTimeout):
        return CannotAcquireLockTimeout(str(exc), blocking_pid=exc.pid or 0, name=exc.name)
    if isinstance(exc, errors.OutOfSpace):
        return FullDumpMemoryFull(str(exc))
    if isinstance(exc, errors.Closed):
        return AlreadyClosed(*exc.args)
    if isinstance(exc, errors.ParameterMismatch):
        return ParameterMismatch(*exc.args)
    if isinstance(exc, errors.AlreadyExists):
        return AlreadyExists(*exc.args)
    if isinstance(exc, errors.NotFound) and not isinstance(exc, errors.Unlinked):
        return CannotAttachSharedMemory(*exc.args)
    return None


def _mapped(fn: F) -> F:
    """Wrap ``fn`` so that our errors leave it as their UltraDict counterparts."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SharedDictError as exc:
            compat = _translate(exc)
            if compat is None:
                raise
            raise compat from exc

    return cast(F, wrapper)


# -- the lock -----------------------------------------------------------------------------


class UltraLock:
    """UltraDict's lock API over the dict's :class:`~ultradict_ng.SharedLock`.

    Always cross-process (``shared_lock`` does not matter), reentrant per
    thread, and recovered automatically from a dead holder.

    * ``with ultra.lock:`` / ``acquire()`` / ``release()``.
    * ``with ultra.lock(block=True, timeout=None, sleep_time=1e-6,
      steal_after_timeout=False, steal=False):`` -- every keyword of
      :meth:`acquire`.
    """

    __slots__ = ("_lock", "_name", "_store", "__weakref__")

    def __init__(self, store: Store) -> None:
        self._lock: SharedLock = store.lock
        self._name: str = store.name
        # Weak: the store's finalizer (auto_unlink on GC) must not wait for lock objects.
        self._store: "weakref.ref[Store]" = weakref.ref(store)

    def _shared(self) -> SharedLock:
        store = self._store()
        if store is None or store.closed:
            raise AlreadyClosed(f"UltraDict {self._name!r} already closed")
        return self._lock

    @_mapped
    def acquire(self, block: bool = True, sleep_time: float = DEFAULT_SLEEP_TIME,
                timeout: Optional[float] = None, steal_after_timeout: bool = False,
                steal: bool = False) -> bool:
        """Take the lock; returns True (or raises).

        * ``block=False``: :class:`CannotAcquireLock` (with ``blocking_pid``)
          at once if another process or thread holds it.
        * ``timeout`` (seconds): :class:`CannotAcquireLockTimeout` when it runs
          out.  As in UltraDict, ``None`` and ``0`` mean no timeout, and with a
          timeout ``block`` is ignored.
        * ``steal_after_timeout=True``: when the timeout runs out and the holder
          is *dead*, take its lock at once instead of raising.  A live holder's
          lock is never taken (UltraDict raises too in that case).
        * ``steal=True``: take the lock even from a *live* holder (UltraDict's
          ``steal``).  This breaks mutual exclusion; avoid it.  Dead holders
          are recovered without it.
        * ``sleep_time``: accepted and ignored; waiting backs off by itself.
        """
        lock = self._shared()
        if steal:
            lock.take_over()
            return True
        if timeout:
            start = time.monotonic()
            try:
                return lock.acquire(timeout=timeout)
            except errors.LockTimeout as exc:
                # A non-blocking attempt takes over from a dead holder at once
                # (the waiting loop only checks the holder every so often).
                if steal_after_timeout and lock.acquire(blocking=False):
                    return True
                raise CannotAcquireLockTimeout(
                    str(exc), blocking_pid=exc.pid or 0, timestamp=start, name=exc.name,
                    time_passed=time.monotonic() - start,
                ) from None
        if block:
            return lock.acquire()
        pid = 0
        for _ in range(3):  # the holder may release between our attempt and our look
            if lock.acquire(blocking=False):
                return True
            pid = lock.owner_pid or 0
            if pid:
                break
        raise CannotAcquireLock(
            f"cannot acquire the lock of {self._name!r}: held by pid {pid}",
            blocking_pid=pid, name=self._name,
        )

    def release(self, *args: Any) -> bool:
        """Release one level; False (like UltraDict) if this thread does not hold it."""
        lock = self._shared()
        if not lock.held():
            return False
        lock.release()
        return True

    def __call__(self, block: bool = True, timeout: Optional[float] = None,
                 sleep_time: float = DEFAULT_SLEEP_TIME, steal_after_timeout: bool = False,
                 steal: bool = False) -> "_LockHold":
        """``with ultra.lock(timeout=1.5, ...):`` -- the keywords of :meth:`acquire`."""
        return _LockHold(self, dict(block=block, timeout=timeout, sleep_time=sleep_time,
                                    steal_after_timeout=steal_after_timeout, steal=steal))

    def __enter__(self) -> "UltraLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    # -- the rest of UltraDict's SharedLock -------------------------------------------------

    @property
    def has_lock(self) -> int:
        """1 if the calling thread holds the lock, else 0."""
        return int(self._shared().held())

    @property
    def pid(self) -> int:
        return os.getpid()

    def held(self) -> bool:
        return self._shared().held()

    @property
    def owner_pid(self) -> Optional[int]:
        return self._shared().owner_pid

    def get_remote_pid(self) -> int:
        """Pid of the process holding the lock now, 0 if free (a snapshot)."""
        return self._shared().owner_pid or 0

    def get_remote_lock(self) -> int:
        return 1 if self.get_remote_pid() else 0

    def steal(self, from_pid: int = 0, release: bool = False) -> bool:
        """UltraDict's ``steal``: take the lock from ``from_pid`` even if it is alive.

        False if the lock is free or held by another pid.  Breaks mutual
        exclusion with a live holder: prefer :meth:`steal_from_dead`.
        """
        lock = self._shared()
        if lock.held():
            raise RuntimeError("cannot steal the lock: this thread already holds it; release() it")
        owner = lock.owner_pid or 0
        if not owner or owner != from_pid:
            return False
        lock.take_over()
        if release:
            lock.release()
        return True

    @_mapped
    def steal_from_dead(self, from_pid: int = 0, release: bool = False) -> bool:
        """Take the lock from ``from_pid`` if that process is dead; False if it no longer holds it.

        Raises :class:`CannotAcquireLock` if ``from_pid`` is alive and holds it
        (UltraDict raises a plain ``Exception`` there).
        """
        lock = self._shared()
        owner = lock.owner_pid or 0
        if not owner or owner != from_pid:
            return False
        if not lock.acquire(blocking=False):  # recovers the lock only from a dead holder
            raise CannotAcquireLock(
                f"not stealing the lock of {self._name!r}: pid {owner} is alive",
                blocking_pid=owner, name=self._name,
            )
        if release:
            lock.release()
        return True

    def status(self) -> Dict[str, Any]:
        pid = self.get_remote_pid()
        return {"has_lock": self.has_lock, "lock_remote": 1 if pid else 0,
                "pid": os.getpid(), "pid_remote": pid}

    def print_status(self, status: Optional[Dict[str, Any]] = None) -> None:
        pprint.pprint(status or self.status())

    def __repr__(self) -> str:
        store = self._store()
        if store is None or store.closed:
            return f"<UltraLock of {self._name!r} (closed)>"
        pid = self._lock.owner_pid
        return f"<UltraLock of {self._name!r} {'held by pid %d' % pid if pid else 'free'}>"


class _LockHold:
    """What ``ultra.lock(...)`` returns: a context manager with those keywords."""

    __slots__ = ("_lock", "_params")

    def __init__(self, lock: UltraLock, params: Dict[str, Any]) -> None:
        self._lock = lock
        self._params = params

    def __enter__(self) -> UltraLock:
        self._lock.acquire(**self._params)
        return self._lock

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def acquire(self) -> bool:
        return self._lock.acquire(**self._params)

    def release(self) -> bool:
        return self._lock.release()


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


_infos: "weakref.WeakKeyDictionary[Store, _Info]" = weakref.WeakKeyDictionary()


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


def _open_store(name: Optional[str], create: Optional[bool], buffer_size: Any, serializer: Any,
                auto_unlink: Optional[bool], recurse: Optional[bool],
                full_dump_size: Optional[int], initial: Optional[List[List[Any]]]) -> Store:
    """Create or attach like UltraDict.

    Parameters the caller did not pass take UltraDict's defaults when creating
    and the stored values when attaching; explicit ones are checked against
    the stored ones (ParameterMismatch).  As in UltraDict, ``auto_unlink`` only
    applies to the handle that creates the dict.
    """
    defaults: Dict[str, Any] = {"auto_unlink": True if auto_unlink is None else auto_unlink}
    if isinstance(serializer, _Default):
        defaults["serializer"], serializer = serializer.value, None
    if isinstance(buffer_size, _Default):
        defaults["buffer_size"], buffer_size = buffer_size.value, None
    if full_dump_size is not None and (not isinstance(full_dump_size, int)
                                       or isinstance(full_dump_size, bool) or full_dump_size < 0):
        raise TypeError("full_dump_size must be None or a non-negative int (bytes)")
    options = Options(recurse=recurse, buffer_size=buffer_size, serializer=serializer,
                      dump_limit=full_dump_size or None,  # UltraDict: 0 means "no static size"
                      create_defaults=defaults)
    store = open_engine(name, create, options, initial)
    assert isinstance(store, Store)
    return store


def _initial(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[List[List[Any]]]:
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


def _reattach(cls: type, name: str, path: Tuple[Any, ...], spec: Any) -> "UltraDict":
    if spec is None:
        serializer: Any = _DEFAULT_SERIALIZER
    elif spec[0] == "module":
        serializer = importlib.import_module(spec[1])
    else:
        serializer = spec[1]
    root: UltraDict = cls(name=name, create=False, serializer=serializer)
    return root._view(path) if path else root


# -- the dict -----------------------------------------------------------------------------


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
    """

    __slots__ = ()

    Exceptions = Exceptions
    SharedLock = UltraLock

    @_mapped
    def __init__(self, *args: Any, name: Optional[str] = None, create: Optional[bool] = None,
                 buffer_size: int = _DEFAULT_BUFFER, serializer: Any = _DEFAULT_SERIALIZER,
                 shared_lock: Optional[bool] = None, full_dump_size: Optional[int] = None,
                 auto_unlink: Optional[bool] = None, recurse: Optional[bool] = None,
                 recurse_register: Any = None, **kwargs: Any) -> None:
        initial = _initial(args, kwargs)
        store = _open_store(name, create, buffer_size, serializer, auto_unlink, recurse,
                            full_dump_size, initial)
        self._store = store
        self._path = ()
        _infos.setdefault(store, _Info(store, store.created and auto_unlink is not False))

    # -- reads and writes raise UltraDict's exceptions ----------------------------------

    __getitem__ = _mapped(SharedDict.__getitem__)
    get = _mapped(SharedDict.get)
    __contains__ = _mapped(SharedDict.__contains__)
    __len__ = _mapped(SharedDict.__len__)
    copy = _mapped(SharedDict.copy)
    _snapshot_keys = _mapped(SharedDict._snapshot_keys)  # iteration, keys(), items() ...
    _snapshot_items = _mapped(SharedDict._snapshot_items)
    __setitem__ = _mapped(SharedDict.__setitem__)
    __delitem__ = _mapped(SharedDict.__delitem__)
    pop = _mapped(SharedDict.pop)
    popitem = _mapped(SharedDict.popitem)
    setdefault = _mapped(SharedDict.setdefault)
    clear = _mapped(SharedDict.clear)

    @_mapped
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
    def data(self) -> Dict[Any, Any]:
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
    def shared_lock(self) -> bool:
        return True

    @property
    def auto_unlink(self) -> bool:
        return _info(self._store).auto_unlink

    @property
    def recurse_register(self) -> None:
        return None

    # -- UltraDict's methods -------------------------------------------------------------

    @_mapped
    def apply_update(self) -> None:
        """Bring the local cache (:attr:`data`) up to date; every read does this itself."""
        self._store.sync()

    @_mapped
    def load(self, force: bool = False) -> None:
        """Load what is new; ``force=True`` reloads from the current full dump, then the stream."""
        if force:
            self._store.reload()
        else:
            self._store.sync()

    @_mapped
    def dump(self) -> None:
        """Write a full dump now (restarting the update stream); :class:`FullDumpMemoryFull` over the cap."""
        self._store.force_dump()

    @_mapped
    def status(self) -> Dict[str, Any]:
        """UltraDict's status fields, mapped onto ours (see MIGRATING.md for their meaning)."""
        s = self._store
        state = s.words[L.W_STATE]
        gen_remote, end_remote = state >> L.GEN_SHIFT, state & L.END_MASK
        owner = s.lock.owner_pid or 0
        return {
            "name": s.name,
            "control": s.name,
            "buffer": L.stream_name(s.name),
            "buffer_size": s.stream_size,
            "update_stream_position": s.pos,
            "update_stream_position_remote": end_remote,
            "full_dump_counter": s.gen,
            "full_dump_counter_remote": gen_remote,
            "full_dump_memory": L.dump_name(s.name, s.gen) if s.gen > 0 else None,
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

    def print_status(self, status: Optional[Dict[str, Any]] = None, stderr: bool = False) -> None:
        """Pretty-print :meth:`status` to stdout (or stderr)."""
        pprint.pprint(status or self.status(), stream=sys.stderr if stderr else sys.stdout)

    def close(self, unlink: bool = False) -> Optional[Dict[str, Any]]:  # type: ignore[override]
        """Detach this process's handle; returns the contents as a plain dict.

        ``unlink=True`` removes the dict for everybody first.  Closing an
        already closed handle does nothing and returns None (as UltraDict).
        A nested view closes the whole tree's handle in this process.
        """
        store = self._store
        if store.closed:
            return None
        try:
            data: Dict[Any, Any] = self.copy()
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

    def __reduce__(self) -> Tuple[Any, ...]:
        # Travels by name (and path); a custom serializer travels as its module's
        # importable name, or pickled if it is not a module.
        return (_reattach, (type(self), self.name, self._path, _serializer_spec(self._store)))
