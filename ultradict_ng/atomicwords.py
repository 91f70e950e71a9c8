"""The hot primitives: atomic 64-bit operations on control words, and the
writing of a stream record.

The ``atomics`` package is our portable primitive (it wraps the patomic C
library), but its public API runs ~60 Python calls per operation (~8-15 µs,
see shared/MEASURED.md), which would cap writes near 30k/s.  So there are
three implementations with the same behaviour, chosen once at import (the
msgpack pattern: a compiled speedup, pure-Python fallbacks, an environment
variable that forces a fallback so that every path is tested):

* ``native`` (default): :class:`NativeWords`, the optional compiled helper
  ``ultradict_ng._native`` built by the package's own build (~50 ns per
  operation, and a record is written in one call).
* ``bound``: :class:`BoundWords` takes patomic's 64-bit function pointers from
  ``atomics`` once and calls them through ctypes with the word's address
  (~1 µs).  Used when the helper was not compiled (no C compiler at install).
* ``public``: :class:`PublicWords` uses only the public ``atomics.atomicview``
  API.  Used when the internals ``bound`` relies on are missing (a future
  ``atomics``).

``ULTRADICT_NG_ATOMICS=bound`` or ``=public`` forces that implementation
(``=native`` insists on the helper and fails at import without it).  Each
candidate passes a self-test on a private buffer before it is trusted.

Every atomic operation is sequentially consistent: a store publishes
everything the process wrote before it, a load or CAS sees everything
published before it.  :meth:`RecordWriter.write` uses plain stores; the
caller publishes the record afterwards with a store of STATE.
"""

from __future__ import annotations

import ctypes
import os
import struct
import zlib
from typing import Any, Dict, List, Optional, Tuple

import atomics  # type: ignore[import-untyped, unused-ignore]

from .errors import Closed

__all__ = [
    "AtomicWords", "NativeWords", "BoundWords", "PublicWords", "RecordWriter",
    "make_words", "make_record_writer", "parse_records", "IMPLEMENTATION", "NATIVE",
]

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

    @property
    def raw(self) -> Any:
        """The object ``lock``'s per-process state operates on (see lock._ProcessState)."""
        return self


try:
    from . import _native  # type: ignore[attr-defined, unused-ignore]
except ImportError:  # not compiled: no C compiler at install time
    _native = None


class NativeWords(AtomicWords):
    """The compiled helper's ``Words``: one C call per operation."""

    def __init__(self, buf: Any, indexes: List[int]) -> None:
        if _native is None:
            raise RuntimeError("ultradict_ng._native is not compiled")
        words = _native.Words(buf)
        # Bound methods: the hot path calls them directly.
        self.load = words.load  # type: ignore[method-assign]
        self.store = words.store  # type: ignore[method-assign]
        self.cas = words.cas  # type: ignore[method-assign]
        self._words = words

    def release(self) -> None:
        self._words.release()

    @property
    def raw(self) -> Any:
        return self._words  # _native.ProcessState takes the C object itself


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


class RecordWriter:
    """Writes one stream record (layout: "Stream record") at a byte offset.

    ``write(pos, tag, payload)`` stores the 16-byte header and the payload at
    ``pos`` with plain stores and returns the offset just past the record;
    the caller publishes it afterwards by storing STATE.
    """

    _header = struct.Struct("<IIII")
    _prefix = struct.Struct("<II")

    def __init__(self, buf: Any) -> None:
        self._mv: Optional[memoryview] = memoryview(buf)
        self._native: Any = _native.Words(buf) if _IMPL is NativeWords else None
        #: ``write_simple(pos, tag, limit, op, key[, value])`` of the compiled helper
        #: (a root-level scalar record encoded in place), or None without it.
        self.simple: Any = None
        if self._native is not None:
            self.write = self._native.write_record  # type: ignore[method-assign]
            self.simple = self._native.write_simple

    def write(self, pos: int, tag: int, payload: bytes) -> int:
        mv = self._mv
        if mv is None:
            raise Closed("this handle's shared memory was closed")
        length = len(payload)
        end = pos + 16 + length
        if pos < 0 or end > len(mv):
            raise ValueError("record does not fit the stream at that offset")
        crc = zlib.crc32(payload, zlib.crc32(self._prefix.pack(length, tag)))
        mv[pos + 16:end] = payload
        mv[pos:pos + 16] = self._header.pack(length, tag, crc, 0)
        return end

    def release(self) -> None:
        if self._native is not None:
            self._native.release()
        if self._mv is not None:
            self._mv.release()
            self._mv = None


def _parse_records_py(chunk: bytes, tag: int, base: int) -> Any:
    """The payloads of the records in ``chunk`` (stream bytes starting at
    offset ``base``), or a str saying what is wrong: reader step 4's checks
    (header complete, payload within the chunk, generation tag, crc)."""
    out: List[bytes] = []
    pos, n = 0, len(chunk)
    header = RecordWriter._header
    with memoryview(chunk) as mv:
        while pos < n:
            if n - pos < 16:
                return f"truncated record header at stream offset {base + pos}"
            length, rtag, crc, _ = header.unpack_from(chunk, pos)
            start = pos + 16
            if length > n - start:
                return f"record at stream offset {base + pos} overruns the published end"
            if rtag != tag:
                return f"record at stream offset {base + pos} belongs to another generation"
            body = mv[start:start + length]
            if zlib.crc32(body, zlib.crc32(mv[pos:pos + 8])) != crc:
                return f"record at stream offset {base + pos} fails its checksum"
            out.append(bytes(body))
            pos = start + length
    return out


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


def _native_self_test() -> bool:
    if _native is None or not _self_test(NativeWords):
        return False
    # write_record must produce exactly the bytes of the Python writer.
    a, b = bytearray(64), bytearray(64)
    words = _native.Words(a)
    try:
        end = words.write_record(8, 0xDEADBEEF, b"payload")
    finally:
        words.release()
    mv = memoryview(b)
    crc = zlib.crc32(b"payload", zlib.crc32(RecordWriter._prefix.pack(7, 0xDEADBEEF)))
    mv[24:31] = b"payload"
    mv[8:24] = RecordWriter._header.pack(7, 0xDEADBEEF, crc, 0)
    mv.release()
    return end == 31 and a == b


_CHOICES = {"native": NativeWords, "bound": BoundWords, "public": PublicWords}


def _choose() -> type:
    forced = os.environ.get("ULTRADICT_NG_ATOMICS", "").lower()
    if forced:
        if forced not in _CHOICES:
            raise ImportError(
                f"ULTRADICT_NG_ATOMICS={forced!r}: expected one of {', '.join(_CHOICES)}"
            )
        if forced == "native" and not _native_self_test():
            raise ImportError("ULTRADICT_NG_ATOMICS=native, but ultradict_ng._native is "
                              "not compiled or fails its self-test")
        return _CHOICES[forced]
    if _native_self_test():
        return NativeWords
    return BoundWords if _self_test(BoundWords) else PublicWords


_IMPL = _choose()
#: "native", "bound" or "public": which implementation this process uses.
IMPLEMENTATION: str = next(k for k, v in _CHOICES.items() if v is _IMPL)
#: The compiled helper module when this process uses it, else None.
NATIVE: Any = _native if _IMPL is NativeWords else None


def make_words(buf: Any, indexes: List[int]) -> AtomicWords:
    """Atomic access to the 8-byte words ``indexes`` of ``buf`` (8-byte aligned)."""
    words: AtomicWords = _IMPL(buf, indexes)
    return words


#: ``parse_records(chunk, tag, base)``: payloads or an error message (see
#: :func:`_parse_records_py`; the compiled helper's when it is in use).
parse_records: Any = _native.parse_records if _IMPL is NativeWords else _parse_records_py


def make_record_writer(buf: Any) -> RecordWriter:
    """A :class:`RecordWriter` on the stream mapping ``buf``."""
    return RecordWriter(buf)
