"""Pure-Python twins of the compiled helper's ``Words``: atomic 64-bit words,
record writing and futex waits on a shared buffer.

The atomic operations come from the ``atomics`` package in two flavours,
because its public API costs ~60 Python calls per operation (~8-15 µs
measured on this project's machines): :class:`BoundWords` calls patomic's
64-bit function pointers once bound through ctypes (~1 µs); :class:`PublicWords`
uses only the public API, for an ``atomics`` whose internals changed.  Every
operation is sequentially consistent, as the C ``__atomic`` builtins with
``SEQ_CST``.  Apart from the other twins (:mod:`.twins`) because importing
``atomics`` costs ~35 ms, which a process on the compiled helper never pays.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys
import zlib
from typing import Any, Optional, Union

import atomics  # type: ignore[import-untyped, unused-ignore]
import msgpack  # type: ignore[import-untyped, unused-ignore]

from .._shm import layout as L
from ..errors import Closed

__all__ = ["Words", "BoundWords", "PublicWords", "SCALAR_TYPES", "RECORD_HEADER", "FUTEX"]

_SEQ_CST = 5  # C11 memory_order_seq_cst, as patomic numbers it
_header = struct.Struct(L.RECORD_FORMAT)
_prefix = struct.Struct(L.RECORD_FORMAT[:3])  # length and tag: what the crc covers first
_MISSING: Any = object()
_U64_MAX = (1 << 64) - 1

#: The scalar types ``write_simple`` encodes (mirrors ``_native.SCALAR_TYPES``;
#: :mod:`ultradict_ng._codec.records` defines the set, a test checks both agree).
SCALAR_TYPES: tuple[type, ...] = (type(None), bool, int, float, str, bytes)
RECORD_HEADER = L.RECORD_HEADER
# The packer of write_simple: exact for SCALAR_TYPES, no default callback.
_pack = msgpack.Packer(use_bin_type=True, datetime=False, autoreset=True).pack


# -- futex through ctypes ------------------------------------------------------------------
#
# The twin of the compiled helper's futex calls: libc's syscall(2) through
# ctypes (which releases the GIL for the call).  SYS_futex by architecture;
# elsewhere (another OS, an architecture not listed) FUTEX is 0 and callers
# poll instead (layout: "Waiting and waking").

_SYS_FUTEX = {
    "x86_64": 202,
    "amd64": 202,
    "aarch64": 98,
    "arm64": 98,
    "riscv64": 98,
    "ppc64le": 221,
    "ppc64": 221,
    "s390x": 238,
    "i686": 240,
    "i386": 240,
    "armv7l": 240,
    "armv6l": 240,
}
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_EAGAIN, _EINTR, _ETIMEDOUT = 11, 4, 110
_LOW_HALF = 4 if sys.byteorder == "big" else 0  # byte offset of a word's low 32 bits


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex_syscall() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    number = _SYS_FUTEX.get(platform.machine().lower())
    if number is None:
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [
        ctypes.c_long,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_uint,
    ]
    return lambda addr, op, val, ts: fn(number, addr, op, val, ts, None, 0)


_futex = _futex_syscall()
#: 1 where :meth:`Words.wait` and :meth:`Words.wake` are the kernel's futex, else 0.
FUTEX = 1 if _futex is not None else 0


# -- Words -------------------------------------------------------------------------------


class Words:
    """``Words(buffer)``: atomic 64-bit operations on the words of a writable,
    8-byte aligned buffer, and the writing of stream records into it.

    Holds the buffer exported until :meth:`release` (so the mapping cannot be
    closed under it); afterwards every operation raises :class:`Closed`.  The
    atomic operations are the subclasses' (:class:`BoundWords`,
    :class:`PublicWords`).
    """

    def __init__(self, buffer: Any) -> None:
        mv = memoryview(buffer)
        if mv.readonly or not mv.c_contiguous:
            mv.release()
            raise BufferError("Words needs a writable, C-contiguous buffer")
        if len(mv) and ctypes.addressof(ctypes.c_char.from_buffer(mv)) & 7:
            mv.release()
            raise ValueError("buffer is not 8-byte aligned")
        self._mv: Optional[memoryview] = mv.cast("B")
        mv.release()
        self._nwords = len(self._mv) // 8
        # Address of the buffer for futex calls; the ctypes object holds an
        # export of _mv until release() drops it (first).
        self._anchor: Any = (ctypes.c_char * len(self._mv)).from_buffer(self._mv) if self._nwords else None
        self._address = ctypes.addressof(self._anchor) if self._anchor is not None else 0

    def _check(self, index: int) -> int:
        if self._mv is None:
            raise Closed("this handle's shared memory was closed")
        if not 0 <= index < self._nwords:
            raise IndexError(f"word index {index} outside 0..{self._nwords - 1}")
        return index

    def load(self, index: int) -> int:
        """Sequentially consistent load of word ``index``."""
        raise NotImplementedError

    def store(self, index: int, value: int) -> None:
        """Sequentially consistent store: publishes every earlier write of this process."""
        raise NotImplementedError

    def cas(self, index: int, expected: int, desired: int) -> tuple[bool, int]:
        """Compare-and-swap; (swapped, the value seen before the operation)."""
        raise NotImplementedError

    def add(self, index: int, delta: int) -> int:
        """Fetch-and-add (a CAS loop; wraps at 2**64); the new value."""
        delta = _u64(delta)
        seen = self.load(index)
        while True:
            new = (seen + delta) & _U64_MAX
            ok, seen = self.cas(index, seen, new)
            if ok:
                return new

    def publish(self, index: int, value: int, watch: int) -> int:
        """Store ``value`` in word ``index``, then load word ``watch`` (both seq_cst)."""
        self.store(index, value)
        return self.load(watch)

    def wait(self, index: int, expected: int, timeout: Optional[float]) -> bool:
        """Futex-wait while the low 32 bits of word ``index`` equal ``expected``'s;
        False when ``timeout`` seconds ran out, True otherwise (woken, changed, signal)."""
        self._check(index)
        if _futex is None:
            raise NotImplementedError("no futex on this platform")
        ts = None
        if timeout is not None:
            t = min(max(float(timeout), 0.0), 1e9)
            ts = _Timespec(int(t), min(int((t - int(t)) * 1e9), 999_999_999))
        r = _futex(
            self._address + 8 * index + _LOW_HALF,
            _FUTEX_WAIT,
            expected & 0xFFFFFFFF,
            ctypes.byref(ts) if ts is not None else None,
        )
        if r == 0:
            return True
        err = ctypes.get_errno()
        if err in (_EAGAIN, _EINTR):
            return True  # (a signal's Python handler runs when this returns)
        if err == _ETIMEDOUT:
            return False
        raise OSError(err, os.strerror(err))

    def wake(self, index: int, count: int) -> int:
        """Futex-wake up to ``count`` sleepers on word ``index``; how many woke."""
        self._check(index)
        if _futex is None:
            raise NotImplementedError("no futex on this platform")
        r = _futex(
            self._address + 8 * index + _LOW_HALF, _FUTEX_WAKE, min(max(int(count), 1), 0x7FFFFFFF), None
        )
        return int(r) if r > 0 else 0

    def write_record(
        self, pos: int, tag: int, payload: Union[bytes, bytearray, memoryview], unit: int = 1
    ) -> int:
        """Store the record (layout: "Stream record") at byte ``pos`` with plain
        stores, payload first; returns the offset just past it.  The caller
        publishes it afterwards with a store of STATE."""
        mv = self._mv
        if mv is None:
            raise Closed("this handle's shared memory was closed")
        if tag > 0xFFFFFFFF or not 0 <= unit <= 0xFFFFFFFF:
            raise OverflowError("record tag or unit does not fit 32 bits")
        length = len(payload)
        end = pos + L.RECORD_HEADER + length
        if length > 0xFFFFFFFF or pos < 0 or end > len(mv):
            raise ValueError("record does not fit the stream at that offset")
        crc = zlib.crc32(payload, zlib.crc32(_prefix.pack(length, tag)))
        mv[pos + L.RECORD_HEADER : end] = payload
        mv[pos : pos + L.RECORD_HEADER] = _header.pack(length, tag, crc, unit)
        return end

    def write_simple(
        self,
        pos: int,
        tag: int,
        limit: int,
        op: int,
        key: Any,
        value: Any = _MISSING,
        threshold: int = 0,
        unit: int = 1,
        plain: bool = False,
    ) -> Optional[int]:
        """The record ``[op, [], key]`` or ``[op, [], key, value]`` written at ``pos``
        when key and value are of :data:`SCALAR_TYPES` (the value may also be a
        tuple of at most 15 of them, none a bytes of ``threshold`` bytes or more
        when threshold > 0: the codec's ext 1) and it ends by ``limit`` (and the
        buffer's end); else None and nothing is written.  With ``plain`` the
        value may also be what :func:`plain_ok` accepts (a JSON-like tree)."""
        if self._mv is None:
            raise Closed("this handle's shared memory was closed")
        if tag > 0xFFFFFFFF or not 0 <= op <= 127:
            raise ValueError("write_simple: tag or op out of range")
        scalars = SCALAR_TYPES
        if type(key) not in scalars:
            return None
        if plain and value is not _MISSING and type(value) not in scalars and plain_ok(value, threshold):
            try:
                if type(value) is tuple:
                    value = msgpack.ExtType(1, _pack(list(value)))
                payload = _pack([op, [], key, value])
            except Exception:  # an int beyond 64 bits, a str with lone surrogates
                return None
        elif value is not _MISSING and type(value) not in scalars:
            if (
                type(value) is not tuple
                or len(value) > 15
                or any(
                    type(x) not in scalars or (type(x) is bytes and 0 < threshold <= len(x)) for x in value
                )
            ):
                return None
            try:
                value = msgpack.ExtType(1, _pack(list(value)))
            except Exception:
                return None
            try:
                payload = _pack([op, [], key, value])
            except Exception:  # an int beyond 64 bits, a str with lone surrogates
                return None
        else:
            try:
                payload = _pack([op, [], key] if value is _MISSING else [op, [], key, value])
            except Exception:  # an int beyond 64 bits, a str with lone surrogates
                return None
        limit = min(limit, len(self._mv))
        if pos < 0 or pos > limit or L.RECORD_HEADER + len(payload) > limit - pos:
            return None
        return self.write_record(pos, tag, payload, unit)

    def release(self) -> None:
        """Drop the buffer export; further operations raise :class:`Closed`."""
        self._anchor = None
        self._address = 0
        if self._mv is not None:
            self._mv.release()
            self._mv = None

    def __del__(self) -> None:
        # As the compiled Words' dealloc: a collected object releases its export.
        if getattr(self, "_mv", None) is not None:
            self.release()


#: Containers a plain value may nest (udng.h's UDNG_PLAIN_DEPTH).
PLAIN_DEPTH = 16


def plain_ok(value: Any, threshold: int) -> bool:
    """What ``write_simple(..., plain=True)`` takes besides scalars and tuples of
    them (packing.c's udng_mp_plain_value): an exact dict (scalar keys) or list
    of scalars and such containers, at most :data:`PLAIN_DEPTH` deep, or a
    tuple of such values; no bytes of ``threshold`` bytes or more inside when
    threshold > 0 (those go to blobs).  Their msgpack map and array bytes are
    the codec's."""
    if type(value) is tuple:
        return all(_plain(x, threshold, 1) for x in value)
    return _plain(value, threshold, 0)


def _plain(o: Any, threshold: int, depth: int) -> bool:
    tp = type(o)
    if tp is dict:
        return depth < PLAIN_DEPTH and all(
            type(k) in SCALAR_TYPES and _plain(v, threshold, depth + 1) for k, v in o.items()
        )
    if tp is list:
        return depth < PLAIN_DEPTH and all(_plain(x, threshold, depth + 1) for x in o)
    if tp is bytes:
        return not 0 < threshold <= len(o)
    return tp in SCALAR_TYPES


class BoundWords(Words):
    """patomic's function pointers, bound once, called through ctypes."""

    def __init__(self, buffer: Any) -> None:
        super().__init__(buffer)
        ops = _bound_ops()
        self._load = ops.fp_load
        self._store = ops.fp_store
        self._cmpxchg = ops.xchg_ops.fp_cmpxchg_strong
        if not (self._load and self._store and self._cmpxchg):
            raise RuntimeError("patomic has no lock-free 64-bit load/store/cmpxchg here")
        # One ctypes array over the whole buffer keeps it exported and gives its address.
        self._cells: Any = (ctypes.c_uint64 * max(self._nwords, 1)).from_buffer(buffer)
        self._base = ctypes.addressof(self._cells)

    # The checks are inline (no helper call): each atomic operation is on the
    # write path three times per write.
    def load(self, index: int) -> int:
        if not 0 <= index < self._nwords:
            self._refuse(index)
        out = ctypes.c_uint64()
        self._load(self._base + 8 * index, _SEQ_CST, ctypes.addressof(out))
        return out.value

    def store(self, index: int, value: int) -> None:
        if not 0 <= index < self._nwords:
            self._refuse(index)
        if not 0 <= value <= _U64_MAX:
            raise OverflowError(f"{value} does not fit an unsigned 64-bit word")
        val = ctypes.c_uint64(value)
        self._store(self._base + 8 * index, ctypes.addressof(val), _SEQ_CST)

    def cas(self, index: int, expected: int, desired: int) -> tuple[bool, int]:
        if not 0 <= index < self._nwords:
            self._refuse(index)
        if not (0 <= expected <= _U64_MAX and 0 <= desired <= _U64_MAX):
            raise OverflowError("cas: a value does not fit an unsigned 64-bit word")
        exp = ctypes.c_uint64(expected)
        des = ctypes.c_uint64(desired)
        ok = self._cmpxchg(
            self._base + 8 * index, ctypes.addressof(exp), ctypes.addressof(des), _SEQ_CST, _SEQ_CST
        )
        return bool(ok), exp.value

    def _refuse(self, index: int) -> None:
        self._check(index)  # raises Closed or IndexError

    def release(self) -> None:
        self._cells = None
        self._nwords = 0  # every index fails the inline check; _check says Closed
        super().release()


class PublicWords(Words):
    """Only ``atomics``' public API: slow, but immune to changes of its internals."""

    def __init__(self, buffer: Any) -> None:
        super().__init__(buffer)
        self._ctx: dict[int, Any] = {}
        self._views: dict[int, Any] = {}

    def _view(self, index: int) -> Any:
        view = self._views.get(index)
        if view is None:
            mv = self._mv
            if mv is None:  # released since the caller's check
                raise Closed("this handle's shared memory was closed")
            ctx = atomics.atomicview(buffer=mv[8 * index : 8 * index + 8], atype=atomics.UINT)
            made = ctx.__enter__()
            # A word's view is entered once and kept until release(): of two
            # threads making one, the loser exits its own (dropped entered,
            # ``atomics`` reports it from ``__del__``).  setdefault, not a lock:
            # a lock some thread held at a fork would stay held in the child.
            view = self._views.setdefault(index, made)
            if view is made:
                self._ctx[index] = ctx
            else:
                ctx.__exit__(None, None, None)
        return view

    def load(self, index: int) -> int:
        return int(self._view(self._check(index)).load())

    def store(self, index: int, value: int) -> None:
        self._view(self._check(index)).store(_u64(value))

    def cas(self, index: int, expected: int, desired: int) -> tuple[bool, int]:
        res = self._view(self._check(index)).cmpxchg_strong(expected=_u64(expected), desired=_u64(desired))
        return bool(res.success), int(res.expected)

    def release(self) -> None:
        for ctx in list(self._ctx.values()):
            ctx.__exit__(None, None, None)
        self._ctx, self._views = {}, {}
        super().release()


def _u64(value: int) -> int:
    if not 0 <= value < 1 << 64:
        raise OverflowError(f"{value} does not fit an unsigned 64-bit word")
    return value


def _bound_ops() -> Any:
    from atomics._impl.patomic import Patomic  # type: ignore[import-untyped, unused-ignore]  # self-tested

    return Patomic().ops(8)
