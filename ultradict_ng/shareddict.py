"""``SharedDict``: the user-facing dict, a thin layer over an engine
(:mod:`ultradict_ng.engine`; the shared-memory one is :class:`~ultradict_ng.store.Store`).

A ``SharedDict`` is a (store, path) pair: the root has path ``()``; with
``recurse=True`` a dict stored under a key comes back as a ``SharedDict`` whose
path is the keys leading to it, sharing the root's store, lock and segments.
Every method syncs the local cache first (a single counter comparison when
nothing changed) and every mutation is one record published under the lock,
so each method is atomic across processes.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, TypeVar, Union, overload

from . import layout as L
from ._codec import records as R
from ._shm.blobs import BlobGone, BlobRef, InlineArray, PickledBlobs
from .changes import Change, iterate
from ._codec.codec import IMMUTABLE_TYPES, copy_value
from ._engine import Conflict, Engine, Options, open_engine, unlink_by_name as _unlink_by_name
from ._shm.lock import SharedLock
from .speedups import ViewBase, set_immutable_types
from ._shm.users import User

__all__ = ["SharedDict"]

_W_STATE = L.W_STATE
_IMMUTABLE = IMMUTABLE_TYPES
_STORED = frozenset({BlobRef, InlineArray, PickledBlobs})  # placeholders of large values, arrays
set_immutable_types(IMMUTABLE_TYPES)  # what the compiled hit path hands out without a copy
_MISSING: Any = object()

T = TypeVar("T")
SD = TypeVar("SD", bound="SharedDict")


class SharedDict(ViewBase, MutableMapping[Any, Any]):
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
      README's "Redis backend" for what each read mode guarantees.
      Redis only: ``reads="fresh"`` (default; every read validates its cache
      in one round trip) or ``"cached"`` (no round trip, at most
      ``staleness`` seconds behind, default 0.5); ``lease``: seconds the lock
      survives a holder that stopped renewing it (default 3).
    * The configuration is stored with the dict: attachers pass only ``name``;
      a conflicting explicit value raises :class:`ParameterMismatch`.

    Lifetime rules (like ``multiprocessing.shared_memory``, plus auto-unlink):

    * :meth:`close` detaches this handle in this process only.
    * :meth:`unlink` (or :func:`unlink_by_name`) removes the dict's segments for
      everybody.  Handles that are still open keep reading the last state;
      their writes raise :class:`Unlinked`.
    * ``auto_unlink`` (default: True for the handle that created the dict,
      False for attachers): unlink when this handle is closed, garbage-collected,
      or its process exits normally.  Only in the creating process -- never in
      a forked child.  Pass ``auto_unlink=False`` to let the dict outlive its
      creator, and remove it later with :func:`unlink_by_name`.  Pass
      ``auto_unlink="last"`` (creator or attacher) to remove it when this
      handle closes *and no other process is attached* (:meth:`users`): the
      last one out removes it, whichever process that is.

    Values read back are copies (mutating a returned list does not change the
    dict); with ``recurse`` nested dicts are live views instead.  Iteration
    and ``keys()/values()/items()`` walk a snapshot taken when they start, so
    they never raise because another process wrote meanwhile.
    """

    # ``_store`` and ``_path`` live in the base class (speedups.ViewBase),
    # where the compiled read hit path finds them.
    __slots__ = ()

    _store: Engine
    _path: Tuple[Any, ...]

    @overload
    def __init__(self, name: Optional[str] = None, create: Optional[bool] = None, *,
                 recurse: Optional[bool] = None, buffer_size: Optional[int] = None,
                 serializer: Any = None, auto_unlink: Union[bool, str, None] = None,
                 blob_threshold: Optional[int] = None, backend: Any = None,
                 reads: Optional[str] = None, lease: Optional[float] = None,
                 staleness: Optional[float] = None, **data: Any) -> None: ...

    @overload
    def __init__(self, __data: Union[Mapping[Any, Any], Iterable[Tuple[Any, Any]]],
                 name: Optional[str] = None, create: Optional[bool] = None, *,
                 recurse: Optional[bool] = None, buffer_size: Optional[int] = None,
                 serializer: Any = None, auto_unlink: Union[bool, str, None] = None,
                 blob_threshold: Optional[int] = None, backend: Any = None,
                 reads: Optional[str] = None, lease: Optional[float] = None,
                 staleness: Optional[float] = None, **more: Any) -> None: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The parameters come out of kwargs; what remains is data.
        name: Optional[str] = kwargs.pop("name", None)
        create: Optional[bool] = kwargs.pop("create", None)
        options = Options(recurse=kwargs.pop("recurse", None),
                          buffer_size=kwargs.pop("buffer_size", None),
                          serializer=kwargs.pop("serializer", None),
                          auto_unlink=kwargs.pop("auto_unlink", None),
                          blob_threshold=kwargs.pop("blob_threshold", None),
                          backend=kwargs.pop("backend", None),
                          reads=kwargs.pop("reads", None),
                          lease=kwargs.pop("lease", None),
                          staleness=kwargs.pop("staleness", None))
        data: Any = None
        positional = list(args)
        if positional and not isinstance(positional[0], (str, type(None))):
            data = positional.pop(0)
        if len(positional) > 2:
            raise TypeError("SharedDict() takes at most: data, name, create as positional arguments")
        if positional:
            if name is not None:
                raise TypeError("SharedDict() got the name both positionally and by keyword")
            name = positional.pop(0)
        if positional:
            if create is not None:
                raise TypeError("SharedDict() got create both positionally and by keyword")
            create = positional.pop(0)
        # As dict(mapping, **kwargs): keyword items after (and over) the mapping's.
        initial = (_pairs(data) if data is not None else []) + _pairs(kwargs)
        self._store = open_engine(name, create, options, initial)
        self._path = ()

    @classmethod
    def fromkeys(cls: "type[SD]", iterable: Iterable[Any], value: Any = None, **options: Any) -> SD:
        """``SharedDict.fromkeys(keys, value, name=...)``: like ``dict.fromkeys``,
        ``cls(**options)`` then every key set to ``value`` (one atomic update),
        so it works on subclasses whatever their constructor takes as data."""
        d = cls(**options)
        d.update(dict.fromkeys(iterable, value))
        return d

    # -- identity ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The dict's name (the root's, for a nested view)."""
        return self._store.name

    @property
    def path(self) -> Tuple[Any, ...]:
        """Keys from the root to this nested dict; ``()`` for the root."""
        return self._path

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

    def stats(self) -> Dict[str, Any]:
        """Facts about the dict now, for people and tools (a snapshot): its
        engine, serializer, generation (full dumps so far), stream use, the
        pid holding the lock, the creator's pid (keys depend on the engine)."""
        return self._store.stats()

    def users(self) -> List[User]:
        """The processes attached to the dict now: ``User(pid, start_time,
        alive)`` for each, dead ones included until their slot is reused
        (a process killed with SIGKILL never detaches).  One entry per
        process, however many handles it has open."""
        return self._store.users()

    @property
    def lock(self) -> SharedLock:
        """The lock of the whole tree: ``with d.lock:``, ``with d.lock(timeout=2):``."""
        self._store.words[_W_STATE]  # Closed on a closed handle
        return self._store.lock

    # -- reading -----------------------------------------------------------------------

    def _node(self) -> Dict[Any, Any]:
        s = self._store
        if s.words[_W_STATE] != s.seen:
            s.sync()
        return s.node(self._path) if self._path else s.data

    @classmethod
    def _on_engine(cls: "type[SD]", engine: Engine, path: Tuple[Any, ...] = ()) -> SD:
        """A handle on an already open engine: how nested views are made, and
        how an engine other than the shared-memory one is put behind the facade."""
        view = ViewBase.__new__(cls)
        view._store = engine
        view._path = path
        return view

    def _view(self: SD, path: Tuple[Any, ...]) -> SD:
        """A handle of the same class on the nested dict at ``path`` (sharing the store)."""
        return self._on_engine(self._store, path)

    def _export(self, key: Any, value: Any) -> Any:
        """What a reader gets for a cached value: a nested view, the value of a
        large value or array (zero-copy for arrays), or a private copy.

        Raises ``BlobGone`` when a newer state dropped a blob this cache still
        references: the callers read again (they sync first)."""
        tp = type(value)
        if tp is dict and self._store.recurse:
            return self._view(self._path + (key,))
        if tp in _STORED:
            return self._store.materialize(value)
        return copy_value(value, self._store.materialize)

    def _getitem_slow(self, key: Any) -> Any:
        """``self[key]``: all the rules.  With the compiled helper, ``__getitem__``
        is ViewBase's C hit path, which calls this for everything else; the
        twin ViewBase makes this ``__getitem__`` itself."""
        s = self._store
        # The hit path first, in as few bytecodes as possible: one 8-byte load
        # of STATE compared with what the cache reflects, one dict lookup.
        while True:
            if s.words[_W_STATE] == s.seen and not self._path:
                value = s.data[key]
            else:
                value = self._node()[key]
            if type(value) in _IMMUTABLE:
                return value
            try:
                return self._export(key, value)
            except BlobGone:
                continue  # a newer state replaced it: read that one

    def get(self, key: Any, default: Any = None) -> Any:
        while True:
            value = self._node().get(key, _MISSING)
            if value is _MISSING:
                return default
            if type(value) in _IMMUTABLE:
                return value
            try:
                return self._export(key, value)
            except BlobGone:
                continue

    def view(self, key: Any) -> memoryview:
        """A read-only ``memoryview`` of the value at ``key`` without copying it:
        for a value stored in a blob (or an array, or ``bytes``).

        The view maps the shared memory itself and never changes: it stays
        valid, and keeps that memory allocated, until it is released or
        collected -- whatever happens to the key or the dict meanwhile."""
        while True:
            value = self._node()[key]
            tp = type(value)
            try:
                if tp is BlobRef or tp is InlineArray:
                    return self._store.view(value)
            except BlobGone:
                continue
            if tp is bytes:
                return memoryview(value)
            raise TypeError(f"shared dict value at {key!r} is a {tp.__name__}, not a buffer or array")

    def __contains__(self, key: object) -> bool:
        return key in self._node()

    def __len__(self) -> int:
        return len(self._node())

    def _snapshot_keys(self) -> List[Any]:
        node = self._node()
        with self._store.mutex:
            return list(node)

    def _snapshot_items(self) -> List[Tuple[Any, Any]]:
        while True:
            node = self._node()
            with self._store.mutex:
                items = list(node.items())
            try:
                return [(k, v if type(v) in _IMMUTABLE else self._export(k, v)) for k, v in items]
            except BlobGone:
                continue  # the snapshot is older than a blob it needs: take a newer one

    def __iter__(self) -> Iterator[Any]:
        return iter(self._snapshot_keys())

    def __reversed__(self) -> Iterator[Any]:
        return iter(self._snapshot_keys()[::-1])

    def keys(self) -> "SharedKeysView":
        return SharedKeysView(self)

    def values(self) -> "SharedValuesView":
        return SharedValuesView(self)

    def items(self) -> "SharedItemsView":
        return SharedItemsView(self)

    def copy(self) -> Dict[Any, Any]:
        """A plain, deep ``dict`` of the current contents (nested views become dicts)."""
        while True:
            node = self._node()
            try:
                with self._store.mutex:
                    out: Dict[Any, Any] = copy_value(node, self._store.materialize)
                return out
            except BlobGone:
                continue

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
        if self.closed:
            return f"<{type(self).__name__} name={self.name!r} (closed)>"
        path = f", path={list(self._path)!r}" if self._path else ""
        return f"{type(self).__name__}({self.copy()!r}, name={self.name!r}{path})"

    def __or__(self, other: Any) -> Dict[Any, Any]:
        if not isinstance(other, Mapping):
            return NotImplemented
        out = self.copy()
        out.update(other.copy() if isinstance(other, SharedDict) else other)
        return out

    def __ror__(self, other: Any) -> Dict[Any, Any]:
        if not isinstance(other, Mapping):
            return NotImplemented
        out = dict(other)
        out.update(self.copy())
        return out

    def __ior__(self: SD, other: Any) -> SD:
        self.update(other)
        return self

    # -- writing -----------------------------------------------------------------------

    def __setitem__(self, key: Any, value: Any) -> None:
        hash(key)  # unhashable keys fail here, like dict, before anything is locked
        if type(value) not in _IMMUTABLE and isinstance(value, SharedDict):
            value = value.copy()
        s = self._store
        if not self._path:
            s.set_root(key, value)
            return
        while True:
            s.begin_write()
            try:
                s.node(self._path)
                s.commit(R.set_(self._path, key, value))
                return
            except Conflict:
                continue  # another process wrote first: check again (engine.Conflict)
            finally:
                s.end_write()

    def __delitem__(self, key: Any) -> None:
        s = self._store
        while True:
            s.begin_write()
            try:
                if key not in (s.node(self._path) if self._path else s.data):
                    raise KeyError(key)
                s.commit(R.delete(self._path, key))
                return
            except Conflict:
                continue
            finally:
                s.end_write()

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        s = self._store
        while True:
            s.begin_write()
            try:
                node = s.node(self._path) if self._path else s.data
                if key not in node:
                    if default is _MISSING:
                        raise KeyError(key)
                    return default
                value = node[key]
                if type(value) not in _IMMUTABLE:  # blobs are read before the delete drops them
                    value = copy_value(value, s.materialize)
                s.commit(R.delete(self._path, key))
                return value
            except Conflict:
                continue
            finally:
                s.end_write()

    def popitem(self) -> Tuple[Any, Any]:
        """Remove and return the most recently inserted item (LIFO, like dict)."""
        s = self._store
        while True:
            s.begin_write()
            try:
                node = s.node(self._path) if self._path else s.data
                if not node:
                    raise KeyError("popitem(): shared dict is empty")
                key = next(reversed(node))
                value = node[key]
                if type(value) not in _IMMUTABLE:  # blobs are read before the delete drops them
                    value = copy_value(value, s.materialize)
                s.commit(R.delete(self._path, key))
                return key, value
            except Conflict:
                continue
            finally:
                s.end_write()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        hash(key)
        if isinstance(default, SharedDict):
            default = default.copy()
        s = self._store
        while True:
            s.begin_write()
            try:
                node = s.node(self._path) if self._path else s.data
                if key not in node:
                    s.commit(R.set_(self._path, key, default))
                return self._export(key, node[key])
            except Conflict:
                continue
            finally:
                s.end_write()

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        """Like ``dict.update``, as one atomic record: all items are stored or none."""
        pairs = _pairs(other) + _pairs(kwargs)
        if not pairs:
            self._node()  # still: Closed / PathGone like any other call
            return
        self._write(R.update(self._path, pairs))

    def clear(self) -> None:
        self._write(R.clear(self._path))

    def _write(self, rec: List[Any]) -> None:
        """Publish ``rec``: at the root it needs no check (``Engine.write``);
        in a nested dict, that the dict still exists."""
        s = self._store
        if not self._path:
            s.write(rec)
            return
        while True:
            s.begin_write()
            try:
                s.node(self._path)
                s.commit(rec)
                return
            except Conflict:
                continue
            finally:
                s.end_write()

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

    # -- lock, lifetime, pickling ------------------------------------------------------------

    def __enter__(self: SD) -> SD:
        self.lock.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._store.lock.release()

    def close(self) -> None:
        """Detach this process's handle (the root's, for a nested view).

        Other processes are unaffected.  If this handle created the dict with
        ``auto_unlink`` (the default for creators), the dict is unlinked too.
        Further use of this handle raises :class:`Closed`.
        """
        self._store.close()

    def unlink(self) -> int:
        """Remove every segment of the dict tree, for every process; returns how many.

        Open handles elsewhere keep reading the last state; writes raise :class:`Unlinked`.
        """
        return self._store.unlink()

    @staticmethod
    def unlink_by_name(name: str, backend: Any = None) -> int:
        """Remove every segment (Redis: every key) of the dict ``name``, even
        if all its users were killed.  ``backend`` as for ``SharedDict``.

        Returns the number of segments (keys) removed, 0 if there was none.
        """
        return _unlink_by_name(name, backend)

    def __reduce__(self) -> Tuple[Any, ...]:
        # A handle travels by name: the receiving process attaches on its own
        # (to the same backend, in the same read mode).
        backend = getattr(self._store, "backend", None)
        if backend is None:
            return (_reattach, (type(self), self.name, self._path))
        where = {"backend": backend, "reads": self._store.reads}  # type: ignore[attr-defined]
        return (_reattach, (type(self), self.name, self._path, where))


def _reattach(cls: type, name: str, path: Tuple[Any, ...],
              where: Optional[Dict[str, Any]] = None) -> SharedDict:
    root: SharedDict = cls(name=name, create=False, **(where or {"backend": "shm"}))
    return root._view(path) if path else root


def _pairs(data: Any) -> List[List[Any]]:
    """``dict(data)``'s items as [key, value] lists, keys checked for hashability."""
    if isinstance(data, SharedDict):
        data = data.copy()
    if isinstance(data, Mapping) or hasattr(data, "keys"):
        items = [[k, data[k]] for k in data.keys()]
    else:
        items = []
        for i, item in enumerate(data):
            try:
                k, v = item
            except (TypeError, ValueError):
                raise ValueError(
                    f"update sequence element #{i} is not a (key, value) pair"
                ) from None
            items.append([k, v])
    for item in items:
        hash(item[0])
        if isinstance(item[1], SharedDict):
            item[1] = item[1].copy()
    return items


from ._views import SharedItemsView, SharedKeysView, SharedValuesView  # noqa: E402  (they name SharedDict)
