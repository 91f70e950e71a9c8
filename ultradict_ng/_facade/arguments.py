"""How ``SharedDict(...)`` and its ``update`` read their arguments, as
``dict(...)`` and ``dict.update`` do.

``SharedDict`` takes its parameters (name, create, options) and its initial
data through the same ``*args, **kwargs``: :func:`split_arguments` tells them
apart, and :func:`pairs` turns data -- a mapping, (key, value) pairs or
keyword items -- into the [key, value] lists a record carries.  Kept apart
from ``shareddict.py`` so that the facade reads as the dict's methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from .._codec.decode import gc_paused
from .._engine import Initial, Options
from ..speedups import ViewBase, types_within

#: Value types that are no handle (nor hold one within a tuple of them).
_PLAIN = frozenset({type(None), bool, int, float, str, bytes})

__all__ = ["split_arguments", "pairs"]

#: ``Options`` fields a caller may give ``SharedDict(...)`` by keyword.
_OPTION_KEYWORDS = (
    "recurse",
    "buffer_size",
    "serializer",
    "auto_unlink",
    "blob_threshold",
    "backend",
    "reads",
    "lease",
    "staleness",
    "max_decoded",
    "path",
    "sync",
    "sync_interval",
)

_OPTIONS = frozenset(_OPTION_KEYWORDS)


def split_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Optional[str], Optional[bool], Options, Initial]:
    """``(name, create, options, initial data)`` of ``SharedDict(*args, **kwargs)``.

    Positionally: an optional data argument first (anything that is not a
    str or None), then name, then create.  Keyword arguments that are not
    parameters are data, after (and over) the positional data's items, as
    in ``dict(mapping, **kwargs)``.  The initial data is [key, value] lists,
    or a ``dict`` given alone, as it is: the engine may load it whole
    (``Engine.load``) without a list per pair."""
    kwargs = dict(kwargs)
    name: Optional[str] = kwargs.pop("name", None)
    create: Optional[bool] = kwargs.pop("create", None)
    options = Options(**{field: kwargs.pop(field) for field in [k for k in kwargs if k in _OPTIONS]})
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
    if type(data) is dict and not kwargs:
        return name, create, options, data
    initial = (pairs(data) if data is not None else []) + (pairs(kwargs) if kwargs else [])
    return name, create, options, initial


def pairs(data: Any) -> list[list[Any]]:
    """``dict(data)``'s items as [key, value] lists, keys checked for
    hashability (as ``dict`` refuses an unhashable key before storing
    anything).  A ``SharedDict`` -- as data or as a value -- is stored as a
    plain copy of its contents (``ViewBase`` is the base of every handle;
    this module cannot name ``SharedDict``, which imports it)."""
    if isinstance(data, ViewBase):
        data = _copy_of(data)
    if type(data) is dict:  # (a bulk load's common case: one list per pair, made in C)
        with gc_paused():  # (a list per pair: collections over the caller's data, 9x the time at 1M)
            items = list(map(list, data.items()))
    elif isinstance(data, Mapping) or hasattr(data, "keys"):
        with gc_paused():
            items = [[k, data[k]] for k in data.keys()]
    else:
        items = []
        for i, item in enumerate(data):
            try:
                k, v = item
            except (TypeError, ValueError):
                raise ValueError(f"update sequence element #{i} is not a (key, value) pair") from None
            items.append([k, v])
    if type(data) is dict and types_within(data, _PLAIN, 1):
        return items  # (hashable keys, and no handle among values of plain types: one C scan)
    for item in items:
        hash(item[0])
        if isinstance(item[1], ViewBase):
            item[1] = _copy_of(item[1])
    return items


def _copy_of(handle: Any) -> dict[Any, Any]:
    copied: dict[Any, Any] = handle.copy()
    return copied
