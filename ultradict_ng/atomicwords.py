"""Atomic 64-bit operations on words of a shared mapping, built on ``atomics``.

The ``atomics`` package is our portable primitive (it wraps the patomic C
library), but its public API runs ~60 Python calls per operation (~8-15 µs,
see shared/MEASURED.md), which would cap writes near 30k/s.  So this module
has two implementations with the same behaviour:

* :class:`BoundWords` (default) takes patomic's 64-bit function pointers from
  ``atomics`` once and calls them directly with the word's address (~1 µs).
* :class:`PublicWords` uses only the public ``atomics.atomicview`` API.  It is
  chosen when the internals we bind to are missing (a future ``atomics``) or
  when ``ULTRADICT_NG_ATOMICS=public`` is set, so both paths can be tested.

Every operation is sequentially consistent: a store publishes everything the
process wrote before it, a load or CAS sees everything published before it.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Dict, List, Tuple

import atomics  # type: ignore[import-untyped, unused-ignore]

from .errors import Closed

__all__ = ["AtomicWords", "BoundWords", "PublicWords", "make_words", "IMPLEMENTATION"]

_SEQ_CST = 5  # C11 memory_order_seq_cst, as patomic numbers it


class AtomicWords:
    """Interface: atomic u64 ops on the words at ``indexes`` of ``buf``."""

    def load(self, index: int) -> int:
        raise NotImplementedError

    def store(self, index: int, value: int) -> None:
        raise NotImplementedError

    def cas(self, index: int, expected: int, desired: int) -> Tuple[bool, int]:
        """Compare-and-swap; returns (swapped, the value seen before the operation)."""
        raise NotImplementedError

    def release(self) -> None:
        """Drop every reference to the buffer so that it can be unmapped."""
        raise NotImplementedError


def _bound_ops() -> Any:
    from atomics._impl.patomic import Patomic  # type: ignore[import-untyped, unused-ignore]  # checked by _self_test

    return Patomic().ops(8)


class BoundWords(AtomicWords):
    """patomic's function pointers called through ctypes with precomputed addresses."""

    def __init__(self, buf: Any, indexes: List[int]) -> None:
        ops = _bound_ops()
        self._load = ops.fp_load
        self._store = ops.fp_store
        self._cmpxchg = ops.xchg_ops.fp_cmpxchg_strong
        if not (self._load and self._store and self._cmpxchg):
            raise RuntimeError("patomic has no lock-free 64-bit load/store/cmpxchg here")
        # One ctypes object per word keeps the buffer exported (it cannot be
        # unmapped under us) and gives its address.
        self._cells: Dict[int, ctypes.c_uint64] = {
            i: ctypes.c_uint64.from_buffer(buf, 8 * i) for i in indexes
        }
        self._addr: Dict[int, int] = {i: ctypes.addressof(c) for i, c in self._cells.items()}

    def load(self, index: int) -> int:
        out = ctypes.c_uint64()
        self._load(self._addr[index], _SEQ_CST, ctypes.addressof(out))
        return out.value

    def store(self, index: int, value: int) -> None:
        val = ctypes.c_uint64(value)
        self._store(self._addr[index], ctypes.addressof(val), _SEQ_CST)

    def cas(self, index: int, expected: int, desired: int) -> Tuple[bool, int]:
        exp = ctypes.c_uint64(expected)
        des = ctypes.c_uint64(desired)
        ok = self._cmpxchg(
            self._addr[index], ctypes.addressof(exp), ctypes.addressof(des), _SEQ_CST, _SEQ_CST
        )
        return bool(ok), exp.value

    def release(self) -> None:
        self._addr = _Released()  # type: ignore[assignment]
        self._cells = {}


class PublicWords(AtomicWords):
    """Only ``atomics``' public API: slow, but immune to changes of its internals."""

    def __init__(self, buf: Any, indexes: List[int]) -> None:
        self._mv = memoryview(buf)
        self._ctx: Dict[int, Any] = {}
        self._views: Dict[int, Any] = {}
        for i in indexes:
            ctx = atomics.atomicview(buffer=self._mv[8 * i : 8 * i + 8], atype=atomics.UINT)
            self._ctx[i] = ctx
            self._views[i] = ctx.__enter__()

    def load(self, index: int) -> int:
        return int(self._views[index].load())

    def store(self, index: int, value: int) -> None:
        self._views[index].store(value)

    def cas(self, index: int, expected: int, desired: int) -> Tuple[bool, int]:
        res = self._views[index].cmpxchg_strong(expected=expected, desired=desired)
        return bool(res.success), int(res.expected)

    def release(self) -> None:
        for ctx in self._ctx.values():
            ctx.__exit__(None, None, None)
        self._ctx = {}
        self._views = _Released()  # type: ignore[assignment]
        self._mv.release()


class _Released:
    """Replaces the address table after release: any further operation fails clearly."""

    def __getitem__(self, index: int) -> Any:
        raise Closed("this handle's shared memory was closed")


def _self_test(cls: type) -> bool:
    """Check an implementation on a private buffer before trusting it with shared state."""
    buf = bytearray(64)
    try:
        words = cls(buf, [0, 1])
        try:
            words.store(1, 7)
            ok1, seen1 = words.cas(1, 7, 2**64 - 1)
            ok2, seen2 = words.cas(1, 7, 3)
            good = (ok1, seen1, ok2, seen2, words.load(1), words.load(0)) == (
                True, 7, False, 2**64 - 1, 2**64 - 1, 0,
            )
        finally:
            words.release()
        return good and buf[8:16] == b"\xff" * 8
    except Exception:
        return False


def _choose() -> type:
    if os.environ.get("ULTRADICT_NG_ATOMICS", "").lower() == "public":
        return PublicWords
    return BoundWords if _self_test(BoundWords) else PublicWords


_IMPL = _choose()
#: "bound" or "public": which implementation this process uses.
IMPLEMENTATION = "bound" if _IMPL is BoundWords else "public"


def make_words(buf: Any, indexes: List[int]) -> AtomicWords:
    """Atomic access to the 8-byte words ``indexes`` of ``buf`` (8-byte aligned)."""
    words: AtomicWords = _IMPL(buf, indexes)
    return words
