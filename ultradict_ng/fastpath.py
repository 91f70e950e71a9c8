"""Base classes of ``Store`` and ``SharedDict`` that carry the read hit path.

With the compiled helper (``atomicwords.NATIVE``), ``StoreBase`` and
``ViewBase`` come from ``ultradict_ng._native``: ``ViewBase.__getitem__`` is
a C slot that answers a root-level read from the local cache when STATE still
equals ``seen`` and the value is immutable, and otherwise calls the Python
method ``_getitem_slow`` (``SharedDict``'s one implementation of the full
rules).  Without it, the pure-Python twins below carry the same attributes
and ``SharedDict`` uses ``_getitem_slow`` as ``__getitem__`` directly.

Why C here: a read hit is one 8-byte load, one compare and one dict lookup,
but a Python-level ``__getitem__`` costs a frame and a dozen bytecodes around
them -- most of the time of a read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Tuple

from . import atomicwords
from .codec import IMMUTABLE_TYPES

__all__ = ["StoreBase", "ViewBase", "NATIVE_READS"]


class _PyStoreBase:
    """What the read hit path needs from a store: ``seen`` and ``data``."""

    __slots__ = ("seen", "data")

    seen: int
    data: Dict[Any, Any]

    def _bind_state(self, words: Any, index: int) -> None:
        """Only the compiled base loads STATE itself; here the store's
        memoryview does (see ``SharedDict._getitem_slow``)."""


class _PyViewBase:
    """The two fields of a ``SharedDict`` handle: its store and its path."""

    __slots__ = ("_store", "_path")

    _store: Any
    _path: Tuple[Any, ...]


_native = atomicwords.NATIVE
#: True when reads hit the compiled ``ViewBase.__getitem__``.
NATIVE_READS: bool = _native is not None
if TYPE_CHECKING:  # the compiled bases have exactly these attributes
    StoreBase = _PyStoreBase
    ViewBase = _PyViewBase
elif _native is not None:
    _native.set_immutable_types(IMMUTABLE_TYPES)
    StoreBase = _native.StoreBase
    ViewBase = _native.ViewBase
else:
    StoreBase = _PyStoreBase
    ViewBase = _PyViewBase
