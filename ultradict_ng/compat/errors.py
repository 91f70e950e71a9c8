"""UltraDict's exception classes, and how the compat layer raises them.

Split out of :mod:`ultradict_ng.compat` because it is a concept of its own:

* the exception classes under UltraDict 0.0.6's names (``Exceptions``), each
  subclassing the ultradict_ng error -- and so the builtin -- it corresponds
  to: ``except UltraDict.Exceptions.AlreadyClosed`` and ``except
  ultradict_ng.Closed`` (or ``ValueError``) both catch a closed handle;
* :func:`translate`: our error -> UltraDict's;
* :func:`mapped` (one callable) and :func:`map_errors` (a class decorator):
  make our errors leave as UltraDict's.  ``map_errors`` wraps every
  method-like attribute the class has or inherits, so a method added to
  :class:`~ultradict_ng.SharedDict` later is mapped without editing the
  compat layer.
"""

from __future__ import annotations

import functools
import time
import types
from typing import Any, Callable, Optional, TypeVar, cast

from .. import errors
from ..errors import SharedDictError

__all__ = [
    "Exceptions",
    "AlreadyExists",
    "CannotAttachSharedMemory",
    "CannotAcquireLock",
    "CannotAcquireLockTimeout",
    "ParameterMismatch",
    "AlreadyClosed",
    "FullDumpMemoryFull",
    "MissingDependency",
    "translate",
    "mapped",
    "map_errors",
    "NOT_MAPPED",
]

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)


# -- the classes --------------------------------------------------------------------------


class AlreadyExists(errors.AlreadyExists):
    """``create=True`` but a dict of that name exists (also :class:`ultradict_ng.AlreadyExists`)."""


class CannotAttachSharedMemory(errors.NotFound):
    """No dict of that name exists (``create=False``, ``unlink_by_name``); a
    :class:`ultradict_ng.NotFound`."""


class CannotAcquireLock(errors.LockTimeout):
    """The lock is held by another process or thread (``acquire(block=False)``).

    ``blocking_pid`` is the pid that held it (0 if it was released meanwhile);
    ``timestamp`` is ``time.monotonic()`` when the attempt failed.  A
    :class:`ultradict_ng.LockTimeout` (a ``TimeoutError``) with ``pid`` set too.
    """

    def __init__(
        self,
        *args: Any,
        blocking_pid: int = 0,
        timestamp: Optional[float] = None,
        name: str = "",
        **kwargs: Any,
    ) -> None:
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


def _rebuild_error(cls: type[Exception], message: str, state: dict[str, Any]) -> Exception:
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


#: Every UltraDict class: raised as they are, never translated again.
_COMPAT_ERRORS = tuple(v for v in vars(Exceptions).values() if isinstance(v, type))


# -- translation --------------------------------------------------------------------------


def translate(exc: SharedDictError) -> Optional[Exception]:
    """The UltraDict exception for one of ours, or None to let it through unchanged.

    None for UltraDict's own classes (so mapping twice changes nothing) and
    for errors UltraDict has no name for (``Unlinked``, ``PathGone`` ...).
    """
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


#: Set on every wrapper :func:`mapped` makes (and so how to tell one).
MAPPED_MARK = "__ultradict_mapped__"


def is_mapped(fn: Any) -> bool:
    """True if ``fn`` is a wrapper made by :func:`mapped`."""
    return getattr(fn, MAPPED_MARK, False) is True


def mapped(fn: F) -> F:
    """Wrap ``fn`` so that our errors leave it as their UltraDict counterparts.

    ``fn`` may be a function or a C method/slot descriptor (called with the
    instance first).  Idempotent: a wrapper is returned as it is.
    """
    if is_mapped(fn):
        return fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SharedDictError as exc:
            compat = translate(exc)
            if compat is None:
                raise
            raise compat from exc

    setattr(wrapper, MAPPED_MARK, True)
    return cast(F, wrapper)


# -- the class decorator ------------------------------------------------------------------

#: Attributes :func:`map_errors` leaves alone: the object protocol itself --
#: construction before ``__init__``, class-level hooks, attribute access,
#: pickling (a handle pickles by name even when closed; unpickling runs the
#: mapped ``__init__``), hashing and introspection.  None of them reaches the
#: store.  Attributes that only ``object`` defines (``__str__``, ``__lt__`` ...)
#: are skipped too: they are the same protocol, and delegate to mapped methods.
NOT_MAPPED = frozenset(
    {
        "__new__",
        "__init_subclass__",
        "__class_getitem__",
        "__subclasshook__",
        "__getattribute__",
        "__setattr__",
        "__delattr__",
        "__reduce__",
        "__reduce_ex__",
        "__getstate__",
        "__setstate__",
        "__sizeof__",
        "__dir__",
        "__format__",
        "__hash__",
        "__class__",
        "__del__",
    }
)

_FIELD_TYPES = (types.MemberDescriptorType, types.GetSetDescriptorType)  # __slots__, __weakref__


def _bound_classmethod(desc: Any) -> Callable[..., Any]:
    """A function ``(cls, *args)`` calling a C classmethod descriptor bound to ``cls``."""

    def call(cls: type, *args: Any, **kwargs: Any) -> Any:
        return desc.__get__(None, cls)(*args, **kwargs)

    return functools.wraps(desc)(call)


def _mapped_attribute(owner: type, name: str, attr: Any) -> Any:
    """``attr`` (found as ``owner.__dict__[name]``) with its callables mapped;
    ``attr`` itself if there is nothing to map or it is mapped already."""
    if isinstance(attr, type) or isinstance(attr, _FIELD_TYPES):
        return attr  # nested classes (``Exceptions``), slot fields
    if isinstance(attr, (types.FunctionType, types.WrapperDescriptorType, types.MethodDescriptorType)):
        return mapped(attr)  # Python methods; C methods and slots (``ViewBase.__getitem__``)
    if isinstance(attr, staticmethod):
        return attr if is_mapped(attr.__func__) else staticmethod(mapped(attr.__func__))
    if isinstance(attr, classmethod):
        return attr if is_mapped(attr.__func__) else classmethod(mapped(attr.__func__))
    if isinstance(attr, types.ClassMethodDescriptorType):
        return classmethod(mapped(_bound_classmethod(attr)))
    if isinstance(attr, types.BuiltinFunctionType):  # a C static function: not bound
        return staticmethod(mapped(attr))
    if isinstance(attr, property):
        prop = attr
        if prop.fget is not None and not is_mapped(prop.fget):
            prop = prop.getter(mapped(prop.fget))
        if prop.fset is not None and not is_mapped(prop.fset):
            prop = prop.setter(mapped(prop.fset))
        if prop.fdel is not None and not is_mapped(prop.fdel):
            prop = prop.deleter(mapped(prop.fdel))
        return prop
    if callable(attr) or hasattr(type(attr), "__get__"):
        # A kind of method this decorator does not know (cached_property, a
        # callable object ...): fail at import rather than leak unmapped errors.
        raise TypeError(
            f"map_errors: cannot map {owner.__qualname__}.{name} ({type(attr).__name__}); "
            f"teach _mapped_attribute about it or add {name!r} to NOT_MAPPED"
        )
    return attr  # plain data: docstrings, __slots__, None, a logger ...


def map_errors(cls: C) -> C:
    """Class decorator: every method of ``cls`` raises UltraDict's exceptions.

    Walks ``cls.__mro__`` (``object`` excepted) and, for each attribute name
    not in :data:`NOT_MAPPED`, wraps what ``cls.name`` resolves to with
    :func:`mapped` and sets it on ``cls``: functions, C method and slot
    descriptors (a C base's ``__getitem__``), static and class methods, and
    property getters, setters and deleters.  Private helpers are included:
    views such as ``keys()`` call ``_snapshot_keys`` long after the method
    that made them returned.  Idempotent, like :func:`mapped`.
    """
    done = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        for name, attr in list(vars(klass).items()):
            if name in done:
                continue  # overridden by a class earlier in the MRO
            done.add(name)
            if name in NOT_MAPPED:
                continue
            new = _mapped_attribute(klass, name, attr)
            if new is not attr:
                setattr(cls, name, new)
    return cls
