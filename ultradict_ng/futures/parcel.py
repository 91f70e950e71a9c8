"""Parcels: a pickle whose large buffers travel in one shared-memory segment.

The standard process pool pickles a call and its result into a pipe; a
160 MB array then costs a pickle copy and a pipe transfer that runs at
~0.07 GiB/s here (docs/performance.md).  Here the object is pickled with
protocol 5, where every large numpy array (and any other large buffer pickle
hands to ``buffer_callback``) is set aside instead of being copied into the
stream.  Those buffers, and the stream itself when it is large (``bytes`` and
``bytearray`` values -- the C pickler writes them in-band before any hook can
see them -- and big lists), are written into one new segment with ``pwrite``
(no mapping, so no page faults in the maker), and only a reference (a
:class:`Parcel`: the segment's name and where each piece is) goes through the
pipe.  With nothing large, :func:`pack` makes no segment, and its one pickle
is what goes through the pipe.  The taker maps the segment
and rebuilds the object with numpy arrays *over the mapping*: zero-copy, and
writable, as the standard pool's private copies are (nobody else maps a
parcel once it has been taken).

Layout, naming, and who removes a parcel: ``layout.py``, "Pool parcels".
Security: the segment holds raw buffer bytes only; what is unpickled is the
stream, which the taker received from its own pool (in the pipe or in a
segment the pipe named) -- the standard pool's trust, not a shared dict's.
"""

from __future__ import annotations

import copyreg
import errno
import io
import itertools
import os
import pickle
import struct
import sys
import threading
from multiprocessing.reduction import ForkingPickler
from typing import Any, NamedTuple, Optional

from .._platform import faults, segments
from .._platform.owner import owner_word
from .._shm import layout as L
from ..errors import CorruptSegment
from . import layout as PL

__all__ = ["Parcel", "pack", "unpack", "parcel_name", "pool_prefix", "VIEW", "ARRAY", "DATA"]

_header = struct.Struct(PL.PARCEL_FORMAT)

#: The spans of a parcel: a buffer pickle asked for (``NEXT_BUFFER``: a
#: numpy subclass's, a user object's ``PickleBuffer``), a numpy array reduced
#: by :meth:`_Pickler.reducer_override`, or the pickle stream itself.
VIEW, ARRAY, DATA = 0, 1, 2

Span = tuple[int, int, int]  # (offset, length, kind)


class Parcel(NamedTuple):
    """What goes through the pipe: the segment's name ("" if the object had
    nothing large), the pickle stream if it is small (else ``b""`` and a DATA
    span says where it is), and the spans of the out-of-band buffers in the
    order the stream asks for them."""

    name: str
    data: bytes
    spans: tuple[Span, ...]


class _Loading(threading.local):
    #: The ARRAY buffers of the parcel this thread is unpickling.
    arrays: Optional[list[memoryview]] = None


_loading = _Loading()


def _array(index: int, dtype: Any, shape: tuple[int, ...], order: str) -> Any:
    """Reconstructor of an array :meth:`_Pickler.reducer_override` sent: a
    writable array over the ``index``-th ARRAY buffer of the parcel being taken."""
    arrays = _loading.arrays
    if arrays is None or not 0 <= index < len(arrays):
        raise CorruptSegment("a pool parcel's pickle names an array buffer it does not carry")
    np = sys.modules.get("numpy") or __import__("numpy")
    return np.frombuffer(arrays[index], dtype=dtype).reshape(shape, order=order)


_counter = itertools.count()


def parcel_name(pool: str) -> str:
    """A new parcel name of pool ``pool`` made by this process (layout: "Pool parcels")."""
    return f"{PL.POOL_PREFIX}{pool}.{L.base36(os.getpid())}-{L.base36(next(_counter))}"


def pool_prefix(pool: str) -> str:
    """The prefix every parcel name of pool ``pool`` starts with."""
    return f"{PL.POOL_PREFIX}{pool}."


_tables: tuple[int, int, dict[Any, Any]] = (-1, -1, {})


def dispatch_table() -> dict[Any, Any]:
    """copyreg's reducers plus those registered for the standard pool
    (``ForkingPickler.register``, e.g. torch's), as ``ForkingPickler`` merges
    them -- but merged again only when either changed: ``ForkingPickler``
    copies both on every construction, a third of a small task's pickling."""
    global _tables
    extra: dict[Any, Any] = getattr(ForkingPickler, "_extra_reducers", {})
    n_copyreg, n_extra, table = _tables
    if n_copyreg != len(copyreg.dispatch_table) or n_extra != len(extra):
        table = {**copyreg.dispatch_table, **extra}
        _tables = (len(copyreg.dispatch_table), len(extra), table)
    return table


class _Pickler(pickle.Pickler):
    """The standard pool's pickling, with large buffers sent out of band.

    One per thread, reused by every :func:`pack` of that thread (the call
    queue's feeder thread, a worker's main thread): making a pickler, its
    stream and its table costs about as much as pickling a small result, and
    a pool pickles one or two per task.  Large numpy arrays are found through
    the dispatch table (exactly ``ndarray``, looked up by the C pickler: no
    Python call for any other object), not ``reducer_override`` (called for
    every object that is not a builtin)."""

    def __init__(self, threshold: int, np: Any) -> None:
        self.stream = io.BytesIO()
        self.taken = _Buffers(threshold)
        super().__init__(self.stream, 5, buffer_callback=self.taken.take)
        self.threshold = threshold
        self.np = np
        self.tables = dispatch_table()
        self.dispatch_table = self.tables if np is None else {**self.tables, np.ndarray: self.reduce_array}
        self.busy = False

    def reduce_array(self, obj: Any) -> Any:
        """A large numpy array travels as raw bytes and is rebuilt by
        :func:`_array`: writable (numpy's own protocol-5 reduction keeps a
        read-only array read-only, the standard pool's protocol 4 does not), in
        its order and shape, also for datetime64/timedelta64 (which export no
        buffer) and strided arrays (made contiguous once; numpy would pickle
        them element by element, in-band).  Subclasses keep numpy's reduction,
        and so their own ``__reduce__``."""
        np = self.np
        if obj.nbytes < self.threshold or obj.dtype.hasobject:
            # In-band.  numpy's protocol-5 reduction would rebuild a read-only
            # array read-only; its protocol-4 one gives what the standard pool gives.
            return obj.__reduce_ex__(5 if obj.flags.writeable else 4)
        if obj.flags.f_contiguous and not obj.flags.c_contiguous:
            arr, order = obj, "F"
        else:
            arr, order = (obj if obj.flags.c_contiguous else np.ascontiguousarray(obj)), "C"
        raw = memoryview(arr.reshape(-1, order="A").view(np.uint8))
        return _array, (self.taken.add(raw, ARRAY), obj.dtype, obj.shape, order)

    def reset(self) -> None:
        """Ready for the next :func:`pack`: no buffer, no stream, no memo."""
        self.taken.release()
        self.stream.seek(0)
        self.stream.truncate()  # (also gives a large stream's memory back)
        self.clear_memo()
        self.busy = False


class _Buffers:
    """The out-of-band buffers of one pickling, in order, kept alive until written."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.views: list[memoryview] = []
        self.kinds: list[int] = []
        self.arrays = 0

    def take(self, pb: pickle.PickleBuffer) -> bool:
        """``buffer_callback``: a large buffer goes out of band, a small one in-band."""
        view = pb.raw()
        if view.nbytes < self.threshold:
            view.release()
            return True
        self.add(view, VIEW)
        return False

    def add(self, view: memoryview, kind: int) -> int:
        """Keep ``view`` for the parcel; its index among the buffers of its kind."""
        self.views.append(view)
        self.kinds.append(kind)
        if kind != ARRAY:
            return -1
        self.arrays += 1
        return self.arrays - 1

    def release(self) -> None:
        for view in self.views:
            view.release()
        self.views.clear()
        self.kinds.clear()
        self.arrays = 0


class _Picklers(threading.local):
    #: This thread's pickler (None until its first pack).
    pickler: Optional[_Pickler] = None


_picklers = _Picklers()


def _pickler(threshold: int) -> _Pickler:
    """This thread's pickler for ``threshold``, made anew when the threshold,
    numpy's presence or the reducers registered changed -- or when it is busy:
    an object whose pickling packs another (nothing of ours does) gets a
    pickler of its own."""
    np = sys.modules.get("numpy")
    p = _picklers.pickler
    if (
        p is not None
        and not p.busy
        and p.threshold == threshold
        and p.np is np
        and p.tables is dispatch_table()
    ):
        return p
    fresh = _Pickler(threshold, np)
    if p is None or not p.busy:
        _picklers.pickler = fresh
    return fresh


def pack(obj: Any, pool: str, owner: int, threshold: int) -> Parcel:
    """Pickle ``obj`` into a parcel of pool ``pool`` owned by the process of
    owner word ``owner``.  On any error (unpicklable object, full shared
    memory) nothing is left behind and the error propagates."""
    p = _pickler(threshold)
    p.busy = True
    try:
        p.dump(obj)
        data = p.stream.getbuffer()
        try:
            buffers = p.taken
            if not buffers.views and data.nbytes < threshold:
                return Parcel("", bytes(data), ())
            pieces = list(zip(buffers.views, buffers.kinds))
            inline = data.nbytes < threshold
            if not inline:
                pieces.append((data, DATA))
            name = parcel_name(pool)
            spans = _write(name, owner, pieces)
            return Parcel(name, bytes(data) if inline else b"", spans)
        finally:
            data.release()
    finally:
        p.reset()


def _write(name: str, owner: int, pieces: list[tuple[memoryview, int]]) -> tuple[Span, ...]:
    """Create parcel ``name`` holding ``pieces`` (layout: "Pool parcels", maker):
    reserved whole first (a full ``/dev/shm`` is ``OutOfSpace`` before any
    byte), then the header, then each piece at its offset."""
    spans: list[Span] = []
    end = PL.PARCEL_HEADER
    for view, kind in pieces:
        spans.append((end, view.nbytes, kind))
        end = -(-(end + view.nbytes) // PL.PARCEL_ALIGN) * PL.PARCEL_ALIGN
    _require_posix()
    header = _header.pack(PL.PARCEL_MAGIC, owner, owner_word(), end - PL.PARCEL_HEADER)
    segments.create_written(
        name,
        end,
        [(0, header), *((span[0], view) for span, (view, _) in zip(spans, pieces))],
        f"no room in shared memory for a {end}-byte pool parcel",
        reserve=True,
        created=None if faults.armed is None else _created,
    )
    if faults.armed is not None:
        faults.hit("parcel-written")  # (dies with the parcel complete and its name unsent)
    return tuple(spans)


def _created() -> None:
    faults.hit("parcel-created")


def _require_posix() -> None:
    if not segments.SUPPORTED:  # pragma: no cover - Windows
        raise OSError(errno.ENOSYS, "the shared-memory pool needs POSIX shared memory (Linux, macOS)")


def unpack(parcel: Parcel, owner: int) -> Any:
    """Rebuild the object of ``parcel`` (layout: "Pool parcels", taker); its
    segment's name is unlinked as soon as the segment is open.

    Raises :class:`CorruptSegment` if the segment is missing or is not the
    parcel the reference describes (wrong magic, owner or size).
    """
    name, data, spans = parcel
    if not name:
        return pickle.loads(data)
    if (
        not name.startswith(PL.POOL_PREFIX)
        or "/" in name
        or any(
            kind not in (VIEW, ARRAY, DATA) or off < PL.PARCEL_HEADER or length < 0
            for off, length, kind in spans
        )
    ):
        raise CorruptSegment(f"not a pool parcel reference: {name!r} {spans!r}")
    _require_posix()
    try:
        opened = segments.Opened(name, writable=True)
    except FileNotFoundError:
        raise CorruptSegment(f"pool parcel {name!r} is gone (removed from outside?)") from None
    except OSError as exc:  # a name too long for this system, ...
        raise CorruptSegment(f"pool parcel {name!r} cannot be opened: {exc.strerror}") from None
    with opened:
        segments.unlink(name, missing_ok=False)  # the descriptor and the mapping keep it
        size = opened.size()
        need = max((off + length for off, length, _ in spans), default=PL.PARCEL_HEADER)
        head = opened.pread(_header.size, 0)
        magic, powner, _, length = _header.unpack(head) if len(head) == _header.size else (b"", 0, 0, 0)
        if magic != PL.PARCEL_MAGIC or powner != owner or size < need or length + PL.PARCEL_HEADER > size:
            raise CorruptSegment(f"pool parcel {name!r} does not hold what its reference says")
        mm = opened.map(size)
    whole = memoryview(mm)  # the arrays built over its slices keep the mapping alive
    stream: Any = data
    buffers: list[memoryview] = []
    arrays: list[memoryview] = []
    for off, length, kind in spans:
        piece = whole[off : off + length]
        if kind == DATA:
            stream = piece
        else:
            (arrays if kind == ARRAY else buffers).append(piece)
    _loading.arrays = arrays
    try:
        return pickle.loads(stream, buffers=buffers)
    finally:
        _loading.arrays = None
