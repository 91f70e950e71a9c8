"""``SharedDict``: the user-facing dict, a thin layer over an engine
(:mod:`ultradict_ng._engine`; the shared-memory one is ``_shm.store.Store``,
the Redis one ``_redis.engine.RedisEngine``).  The facade never asks which.

A ``SharedDict`` is a (store, path) pair: the root has path ``()``; with
``recurse=True`` a dict stored under a key comes back as a ``SharedDict`` whose
path is the keys leading to it, sharing the root's store, lock and segments.
Every method syncs the local cache first (a counter comparison when nothing
changed) and every mutation is one record published under the lock, so each
method is atomic across processes.  The two races a method can lose (a blob
freed under a read, a checked write overtaken) are retried in ``_facade/handle.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any, Optional, TypeVar, Union, overload

from ._codec import records as R
from ._codec.codec import IMMUTABLE_TYPES, copy_value
from ._codec.placeholders import BlobRef, InlineArray
from ._engine import BlobGone, Engine, Transactional, User, check_open
from ._engine.backends import open_engine
from ._engine.backends import unlink_by_name as _unlink_by_name
from ._facade.arguments import pairs, split_arguments
from ._facade.handle import MISSING, Handle
from ._platform.lock import SharedLock
from ._shm import layout as L
from .changes import Change, iterate

__all__ = ["SharedDict"]

_W_STATE = L.W_STATE
_IMMUTABLE = IMMUTABLE_TYPES

SD = TypeVar("SD", bound="SharedDict")


class SharedDict(Handle, MutableMapping[Any, Any]):
    """A dict shared by every process on the machine that opens it by name.

    ``SharedDict(name=None, create=None, *, recurse=None, buffer_size=None,
    serializer=None, auto_unlink=None, **data)``.  Initial data is given as to
    ``dict``: a mapping or (key, value) pairs first and/or keyword arguments,
    ``SharedDict({"a": 1}, b=2, name="stats")``.  Keyword arguments that are
    not parameters are data; a key named like a parameter (``name``,
    ``create`` ...) goes in the mapping: ``SharedDict({"name": "x"})``.  Initial
    data is stored only by the process that creates the dict (an attacher's
    is ignored, as its other creation parameters are).

    * ``name``: ``None`` makes a unique name (``d.name``).  Letters, digits,
      ``_ . -`` only.
    * ``create``: ``None`` attaches if the dict exists, else creates it (exactly
      one of several racing processes creates; the others attach to the fully
      made dict); ``True`` raises :class:`AlreadyExists` if it exists; ``False``
      raises :class:`NotFound` if it does not.
    * ``recurse``: dicts stored as values come back as live nested
      ``SharedDict`` views (``d["a"]["b"] = 1`` is seen everywhere).
    * ``buffer_size``: bytes of the update stream.  A mutation that does not
      fit triggers a full dump; no value size limit follows.  Default: the
      stream starts at 1 MiB and grows with the dict (to twice the size of
      its last dump, at most 64 MiB of shared memory), so that the cost of
      dumps, amortised over the writes between them, stays flat as the dict
      grows; an explicit size is fixed.
    * ``serializer``: ``"msgpack"`` (default, never executes code) or
      ``"pickle"`` (any picklable value, but every process that can write the
      segments can then run code in every reader: only for mutually trusted
      processes).
    * ``backend``: where the dict lives.  ``None`` (default): the environment
      variable ``ULTRADICT_NG_BACKEND`` if set, else shared memory (``"shm"``).
      ``"redis://host:port/db"`` (``rediss://``, ``unix://``; or a ready
      ``redis.Redis`` / ``RedisCluster`` client): the same dict on a Redis
      server or cluster, for processes on several machines -- see the
      docs/guide/redis.md for what each read mode guarantees.
      Redis only: ``reads="fresh"`` (default; every read validates its cache
      in one round trip) or ``"cached"`` (no round trip, at most
      ``staleness`` seconds behind, default 0.5); ``lease``: seconds the lock
      survives a holder that stopped renewing it (default 3).
    * ``max_decoded``: this handle's own (shared memory): the most values of a
      big dict (read in place) it keeps decoded; None (default) keeps all.
    * ``path``: a directory instead of a name: the dict is kept in files there
      and survives reboots and power loss; ``sync`` (``"always"``,
      ``"interval"`` (default) or ``"never"``) and ``sync_interval`` (seconds,
      default 1.0) say when a write reaches the disk -- docs/guide/durable.md.
      (:attr:`directory` gives it back; :attr:`path` is a nested view's keys.)
    * The configuration is stored with the dict: attachers pass only ``name``;
      a conflicting explicit value raises :class:`ParameterMismatch`.

    Lifetime rules (like ``multiprocessing.shared_memory``, plus auto-unlink):

    * :meth:`close` detaches this handle in this process only.
    * :meth:`unlink` (or :func:`unlink_by_name`) removes the dict's segments for
      everybody.  Open handles keep reading the last state but for large values
      not read yet (docs/guide/lifetime.md); their writes raise :class:`Unlinked`.
    * ``auto_unlink`` (True for the creator of a dict in shared memory, else
      False; a true one is refused with ``path=``): unlink when this handle is closed, garbage-collected,
      or its process exits normally.  Only in the creating process -- never in
      a forked child.  Pass ``auto_unlink=False`` to let the dict outlive its
      creator, and remove it later with :func:`unlink_by_name`.  Pass
      ``auto_unlink="last"`` (creator or attacher) to remove it when this
      handle closes *and no other process is attached* (:meth:`users`).

    Values read back are copies (mutating a returned list does not change the
    dict); with ``recurse`` nested dicts are live views instead.  Iteration
    and ``keys()/values()/items()`` walk a snapshot taken when they start, so
    they never raise because another process wrote meanwhile.
    """

    __slots__ = ()  # (the (store, path) pair, sync and retry loops: _handle.Handle)

    @overload
    def __init__(
        self,
        name: Optional[str] = None,
        create: Optional[bool] = None,
        *,
        recurse: Optional[bool] = None,
        buffer_size: Optional[int] = None,
        serializer: Any = None,
        auto_unlink: Union[bool, str, None] = None,
        blob_threshold: Optional[int] = None,
        backend: Any = None,
        reads: Optional[str] = None,
        lease: Optional[float] = None,
        staleness: Optional[float] = None,
        max_decoded: Optional[int] = None,
        path: Any = None,
        sync: Optional[str] = None,
        sync_interval: Optional[float] = None,
        **data: Any,
    ) -> None: ...

    @overload
    def __init__(
        self,
        __data: Union[Mapping[Any, Any], Iterable[tuple[Any, Any]]],
        name: Optional[str] = None,
        create: Optional[bool] = None,
        *,
        recurse: Optional[bool] = None,
        buffer_size: Optional[int] = None,
        serializer: Any = None,
        auto_unlink: Union[bool, str, None] = None,
        blob_threshold: Optional[int] = None,
        backend: Any = None,
        reads: Optional[str] = None,
        lease: Optional[float] = None,
        staleness: Optional[float] = None,
        max_decoded: Optional[int] = None,
        path: Any = None,
        sync: Optional[str] = None,
        sync_interval: Optional[float] = None,
        **more: Any,
    ) -> None: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # As dict(): parameters by keyword or position, the rest is data (_arguments).
        name, create, options, initial = split_arguments(args, kwargs)
        self._store = open_engine(name, create, options, initial)
        self._path = ()

    @classmethod
    def fromkeys(cls: type[SD], iterable: Iterable[Any], value: Any = None, **options: Any) -> SD:
        """``SharedDict.fromkeys(keys, value, name=...)``: as ``dict.fromkeys``
        on a subclass of dict, ``cls(**options)`` then ``d[key] = value`` for
        each key, through the made object's own ``__setitem__`` (a subclass
        that overrides it, or whose ``__new__`` returns another mapping, sees
        every key).  Where ``__setitem__`` is ours the keys go in as one atomic
        update instead: the same result, and no process sees half of it."""
        d = cls(**options)
        if getattr(type(d), "__setitem__", None) is SharedDict.__setitem__:
            d.update(dict.fromkeys(iterable, value))
        else:
            for key in iterable:
                d[key] = value
        return d

    # -- identity ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The dict's name (the root's, for a nested view)."""
        return self._store.name

    @property
    def path(self) -> tuple[Any, ...]:
        """Keys from the root to this nested dict; ``()`` for the root."""
        return self._path

    @property
    def directory(self) -> Optional[str]:
        """The directory of a dict kept in files (the ``path=`` it was opened
        with, made absolute); None for a dict in shared memory or on Redis."""
        where: Optional[str] = self._store.reopen_arguments().get("path")
        return where

    @property
    def closed(self) -> bool:
        return self._store.closed

    @property
    def recurse(self) -> bool:
        return self._store.recurse

    @property
    def serializer(self) -> str:
        return self._store.codec.name

    @property
    def buffer_size(self) -> int:
        """Bytes of the update stream: fixed when given at creation, else the
        current size of the growing stream (it follows the dict's size)."""
        return self._store.buffer_size

    def stats(self) -> dict[str, Any]:
        """Facts about the dict now, for people and tools (a snapshot): its
        engine, serializer, generation (full dumps so far), stream use, the
        pid holding the lock, the creator's pid (keys depend on the engine)."""
        return self._store.stats()

    def users(self) -> list[User]:
        """The processes attached to the dict now: ``User(pid, start_time,
        alive)`` for each, dead ones included until their slot is reused
        (a process killed with SIGKILL never detaches).  One entry per
        process, however many handles it has open."""
        return self._store.users()

    @property
    def lock(self) -> SharedLock:
        """The lock of the whole tree: ``with d.lock:``, ``with d.lock(timeout=2):``."""
        check_open(self._store.words)
        return self._store.lock

    # -- reading -----------------------------------------------------------------------

    def _getitem_slow(self, key: Any) -> Any:
        """``self[key]``: all the rules.  With the compiled helper, ``__getitem__``
        is ViewBase's C hit path, which calls this for everything else; the
        twin ViewBase makes this ``__getitem__`` itself."""
        s = self._store
        # The hit path first, in as few bytecodes as possible: one 8-byte load
        # of STATE compared with what the cache reflects, one dict lookup.
        if s.words[_W_STATE] == s.seen and not self._path:
            value = s.data[key]
        else:
            value = self._node()[key]
        tp = type(value)
        if tp in _IMMUTABLE or (tp is tuple and _IMMUTABLE.issuperset(map(type, value))):
            return value  # (as the compiled hit path: a tuple of immutable items is one)
        try:  # the value at hand first: no loop, no second lookup
            return self._export(key, value)
        except BlobGone:  # a writer freed its blob since our sync: read again, in _read's loop
            return self._read(self._item, key)

    def get(self, key: Any, default: Any = None) -> Any:
        value = self._node().get(key, MISSING)
        if value is MISSING:
            return default
        if type(value) in _IMMUTABLE:
            return value
        try:  # as in _getitem_slow
            return self._export(key, value)
        except BlobGone:
            return self._read(self._item, key, default)

    def view(self, key: Any) -> memoryview:
        """A read-only ``memoryview`` of the value at ``key`` without copying it:
        for a value stored in a blob (or an array, or ``bytes``).

        The view maps the shared memory itself and never changes: it stays
        valid, and keeps that memory allocated, until it is released or
        collected -- whatever happens to the key or the dict meanwhile."""

        def read(node: dict[Any, Any]) -> memoryview:
            value = node[key]
            tp = type(value)
            if tp is BlobRef or tp is InlineArray:
                return self._store.view(value)
            if tp is bytes:
                return memoryview(value)
            raise TypeError(f"shared dict value at {key!r} is a {tp.__name__}, not a buffer or array")

        return self._read(read)

    def __contains__(self, key: object) -> bool:
        return key in self._node()

    def __len__(self) -> int:
        return len(self._node())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._snapshot_keys())

    def __reversed__(self) -> Iterator[Any]:
        return iter(self._snapshot_keys()[::-1])

    def keys(self) -> SharedKeysView:
        return SharedKeysView(self)

    def values(self) -> SharedValuesView:
        return SharedValuesView(self)

    def items(self) -> SharedItemsView:
        return SharedItemsView(self)

    def copy(self) -> dict[Any, Any]:
        """A plain, deep ``dict`` of the current contents (nested views become dicts)."""

        def read(node: Any) -> dict[Any, Any]:
            with self._store.mutex:
                if type(node) is not dict:  # a big dict's cache (_shm/tablecache.py): its full()
                    node = node.full()
                out: dict[Any, Any] = copy_value(node, self._store.materialize)
            return out

        return self._read(read)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SharedDict):
            return self.copy() == other.copy()
        if isinstance(other, Mapping):
            return self.copy() == (other if type(other) is dict else dict(other.items()))
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        named = f"name={self.name!r}" if self.directory is None else f"path={self.directory!r}"
        if self.closed:
            return f"<{type(self).__name__} {named} (closed)>"
        nested = f", nested at {list(self._path)!r}" if self._path else ""
        return f"{type(self).__name__}({self.copy()!r}, {named}{nested})"

    def __or__(self, other: Any) -> dict[Any, Any]:
        if not isinstance(other, Mapping):
            return NotImplemented
        out = self.copy()
        out.update(other.copy() if isinstance(other, SharedDict) else other)
        return out

    def __ror__(self, other: Any) -> dict[Any, Any]:
        if not isinstance(other, Mapping):
            return NotImplemented
        out = dict(other)
        out.update(self.copy())
        return out

    def __ior__(self: SD, other: Any) -> SD:
        self.update(other)
        return self

    # -- writing -----------------------------------------------------------------------

    # ``d[k] = v`` and ``del d[k]`` are ViewBase's slots: compiled, ``__setitem__`` writes a
    # root-level scalar of an open transaction's thread itself (layout "Transactions"), calls
    # ``set_root`` for another root set of a scalar or tuple (what ``_setitem_slow`` does
    # then: the class says so by naming it ``_setitem_inline`` too), ``_setitem_slow``
    # for everything else.

    def _setitem_slow(self, key: Any, value: Any) -> None:
        """``self[key] = value``: all the rules."""
        hash(key)  # unhashable keys fail here, like dict, before anything is locked
        if type(value) not in _IMMUTABLE and isinstance(value, SharedDict):
            value = value.copy()
        if not self._path:
            self._store.set_root(key, value)  # needs no check: no loop, no closure
            return
        self._write(R.set_(self._path, key, value))

    #: The compiled ViewBase makes a root set of a scalar or tuple itself (hash, then
    #: ``set_root``) while this names the same function as ``_setitem_slow``: a
    #: subclass that overrides ``_setitem_slow`` is called instead.
    _setitem_inline = _setitem_slow

    def _delitem_slow(self, key: Any) -> None:
        """``del self[key]``."""

        def decide(s: Engine, node: dict[Any, Any]) -> None:
            if key not in node:
                raise KeyError(key)
            s.commit(R.delete(self._path, key))

        self._locked(decide)

    def pop(self, key: Any, default: Any = MISSING) -> Any:
        def decide(s: Engine, node: dict[Any, Any]) -> Any:
            if key not in node:
                if default is MISSING:
                    raise KeyError(key)
                return default
            return self._take(s, node, key)

        return self._locked(decide)

    def popitem(self) -> tuple[Any, Any]:
        """Remove and return the most recently inserted item (LIFO, like dict)."""

        def decide(s: Engine, node: dict[Any, Any]) -> tuple[Any, Any]:
            if not node:
                raise KeyError("popitem(): shared dict is empty")
            key = next(reversed(node))
            return key, self._take(s, node, key)

        return self._locked(decide)

    def _take(self, s: Engine, node: dict[Any, Any], key: Any) -> Any:
        """Delete ``key`` (under the write lock) and return its value, read
        first: the delete frees the value's blobs."""
        value = node[key]
        if type(value) not in _IMMUTABLE:
            value = copy_value(value, s.materialize)
        s.commit(R.delete(self._path, key))
        return value

    def setdefault(self, key: Any, default: Any = None) -> Any:
        hash(key)
        if isinstance(default, SharedDict):
            default = default.copy()

        def decide(s: Engine, node: dict[Any, Any]) -> Any:
            if key not in node:
                s.commit(R.set_(self._path, key, default))
            return self._export(key, node[key])

        return self._locked(decide)

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        """Like ``dict.update``, as one atomic record: all items are stored or none."""
        if type(other) is dict and not kwargs and not self._path and self._store.load(other):
            return  # (a bulk load: a dump, made without a list per pair)
        items = pairs(other) + pairs(kwargs)
        if not items:
            self._node()  # still: Closed / PathGone like any other call
            return
        self._write(R.update(self._path, items))

    def clear(self) -> None:
        self._write(R.clear(self._path))

    # -- changes -------------------------------------------------------------------------------

    def wait_for_change(self, timeout: Optional[float] = None) -> bool:
        """Block until another handle changes the dict (the whole tree, also
        when called on a nested view) after the state this handle last saw;
        then this handle is up to date and it returns True.  False if
        ``timeout`` seconds pass first.

        Never misses a write: one that landed since this handle's last read
        returns at once.  The caller sleeps in the kernel (no CPU) and wakes
        within microseconds of the write.  Raises :class:`Unlinked` if the
        dict is unlinked meanwhile."""
        return self._store.wait_for_change(timeout)

    def changes(self, timeout: Optional[float] = None) -> Iterator[Change]:
        """Iterate the dict's mutations in publish order, as they happen:
        :class:`~ultradict_ng.changes.Change` items (op, path, key, value,
        resync), starting after the state this handle last saw.

        Deletes and clears are included; an update gives one "set" per key.
        A feed that falls behind a full dump yields the difference instead
        of the changes it missed, marked ``resync=True`` -- never a gap, never
        a duplicate.  Ends after ``timeout`` seconds without a change (None:
        never), or once the dict is unlinked.  Covers the whole tree, also
        on a nested view (``path`` tells where each change happened)."""
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 or None")
        return iterate(self._store.feed(), timeout)

    @contextmanager
    def transaction(self: SD) -> Iterator[SD]:
        """``with d.transaction():`` -- the block's writes, to any key of the
        tree (nested dicts, blobs), are published at once when it exits
        normally: another process, or another handle, sees all of them or
        none.  An exception leaving the block discards them and propagates; a
        process that dies inside it publishes nothing.

        The block holds the dict's lock (``d.lock``, reentrant: a ``with
        d.lock:`` inside changes nothing).  Reads through this handle see the
        block's writes -- from any thread of this process, as threads sharing
        one database connection see its open transaction on shared memory; a
        thread that must not, opens its own handle.  A nested
        ``transaction()`` joins this one; an exception leaving it rolls back
        the whole transaction (the outer block then raises
        :class:`~ultradict_ng.errors.TransactionAborted` if it ends normally).
        The change feed and ``wait_for_change`` see one publish: the block's
        changes, in order, together.  docs/guarantees.md, layout "Transactions"."""
        s = self._store
        check_open(s.words)  # before the lock
        if not isinstance(s, Transactional):
            raise NotImplementedError(
                f"shared dict {self.name!r}: its backend has no transactions; nothing was changed"
            )
        s.begin_transaction()
        try:
            yield self
        except BaseException:
            s.end_transaction(False)
            raise
        s.end_transaction(True)

    # -- lock, lifetime, pickling ------------------------------------------------------------

    def __enter__(self: SD) -> SD:
        self.lock.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._store.lock.release()

    def close(self) -> None:
        """Detach this process's handle (the root's, for a nested view).

        Other processes are unaffected.  If it created the dict with ``auto_unlink``
        (creators' default in shared memory), the dict is unlinked too; ``path=``: files stay.
        Further use of this handle raises :class:`Closed`.
        """
        self._store.close()

    def unlink(self) -> int:
        """Remove the dict for every process (its segments; its files and directory too
        for ``path=``); returns how many.

        Open handles elsewhere keep reading the last state; writes raise :class:`Unlinked`."""
        return self._store.unlink()

    @staticmethod
    def unlink_by_name(name: str, backend: Any = None) -> int:
        """Remove every segment (Redis: every key) of the dict ``name``, even
        if all its users were killed.  ``backend`` as for ``SharedDict``.

        Returns the number of segments (keys) removed, 0 if there was none.
        """
        return _unlink_by_name(name, backend)

    def __reduce__(self) -> tuple[Any, ...]:
        # A handle travels by name: the receiver attaches as the engine says (backend, read mode).
        return (_reattach, (type(self), self.name, self._path, self._store.reopen_arguments()))


def _reattach(cls: type, name: str, path: tuple[Any, ...], where: dict[str, Any]) -> SharedDict:
    root: SharedDict = cls(**{"name": name, "create": False, **where})  # (``where`` may name it better)
    return root._view(path) if path else root


from ._facade.views import SharedItemsView, SharedKeysView, SharedValuesView  # noqa: E402  (they name SharedDict)
