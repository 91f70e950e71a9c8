"""The pool's call queue: a small plain call skips the feeder thread.

The standard pool's call queue hands every call to a feeder thread, which
pickles it and writes it into the pipe the workers read.  For a small task
that hop is most of what the pool's process spends on it: the result thread
(which puts the call) wakes the feeder, which must then win the GIL, pickle
and write, while the workers wait -- the queue holds only ``max_workers + 1``
calls, so every result is followed by that hop before a worker has work again.

:class:`CallQueue` writes a *plain* call (its function and arguments hold
nothing that needs shared memory: ``submit`` found so, see
``executor._plain_call``) into the pipe itself, in the thread that puts it,
pickled as the feeder pickles it (``ForkingPickler``: the same bytes), when
three things hold; otherwise the call goes to the feeder as in the standard
pool:

* nothing handed to the feeder is still unwritten, so calls reach the pipe in
  the order they were put (a worker's stop sentinel must never overtake a call,
  nor a call the sentinel before it), and the feeder's write lock is free: it
  is never waited for (the feeder holds it while its write waits for room);
* the pipe has room for the message without blocking: its unread bytes
  (``FIONREAD``) plus the message fit in :data:`ROOM`, less than any pipe
  holds -- the thread that puts is the pool's result thread, and blocked in a
  write it would read no result, so workers blocked on a full result pipe
  could never drain the call pipe;
* the call pickles: a call that fails to pickle goes to the feeder, which
  fails its future as in the standard pool.

A call with an argument that needs shared memory (``_Call``) always goes to
the feeder: its pickling may run user code or write a large parcel, which
must not hold up the result thread.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import io
import queue
import struct
import termios
import threading
from concurrent.futures import process as _process
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Optional

from .parcel import dispatch_table

__all__ = ["CallQueue", "install", "ROOM"]

#: A message is written directly only when the pipe's unread bytes plus the
#: message (and its 4-byte length) fit in this, so that the write never blocks:
#: one page, the least a Linux pipe holds even when its owner has used up its
#: pipe memory (a pipe starts at 64 KiB on Linux, 16 KiB on macOS).
ROOM = 4096

_unread = struct.Struct("i")


class CallQueue(_process._SafeQueue):
    """The standard call queue, with small plain calls written by the putter."""

    # (the standard queue's own fields, which the stubs do not list)
    _reader: Any
    _writer: Any
    _wlock: Any
    _sem: Any
    _closed: bool
    _ignore_epipe: bool
    _send_bytes: Callable[[Any], None]

    @staticmethod
    def needs_feeder(fn: Any) -> bool:
        """True for a call of ``fn`` the feeder must pickle (:func:`install`
        sets the pool's own test on each queue)."""
        return True

    def _reset(self, after_fork: bool = False) -> None:
        super()._reset(after_fork)  # type: ignore[misc]
        # Counts what was handed to the feeder and not yet written (or failed):
        # the feeder's writes go through the counting wrapper.
        self._fed = 0
        self._fed_lock = threading.Lock()
        self._send_bytes = self._counted_send
        self._pickler: Optional[Any] = None
        self._stream = io.BytesIO()
        self._pickling = threading.Lock()

    def _counted_send(self, data: Any) -> None:
        self._writer.send_bytes(data)
        # (a failed write is counted by the error hook, or never: a pipe the
        # workers closed ends the feeder, and the direct path with it)
        self._done_feeding()

    def _done_feeding(self) -> None:
        with self._fed_lock:
            self._fed -= 1

    def _on_queue_feeder_error(self, e: Exception, obj: Any) -> None:
        # (the feeder failed to pickle ``obj`` or write it: it will not be written)
        self._done_feeding()
        super()._on_queue_feeder_error(e, obj)

    def put(self, obj: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        data = None if self._closed else self._plain_message(obj)
        if data is not None:
            if not self._sem.acquire(block, timeout):
                raise queue.Full
            if self._write_directly(data, obj):
                return
            self._sem.release()  # (the feeder's put takes it again)
        with self._fed_lock:
            self._fed += 1
        try:
            super().put(obj, block, timeout)
        except BaseException:
            self._done_feeding()
            raise

    def _plain_message(self, obj: Any) -> Optional[bytes]:
        """The pipe message of ``obj`` if it is a small plain call, else None."""
        if type(obj) is not _process._CallItem or self.needs_feeder(obj.fn):
            return None
        try:
            data = self._dumps(obj)
        except Exception:
            return None  # (the feeder pickles it again and fails its future)
        return data if len(data) + 4 <= ROOM else None

    def _dumps(self, obj: Any) -> bytes:
        """``ForkingPickler.dumps(obj)``, the feeder's pickle, byte for byte.
        For ``map``'s chunks with one pickler kept for this queue: making one
        copies the reducer tables (~1.5 µs), more than the checks that keep it
        right cost; for a call of a few values those checks cost as much as
        they save.  The kept pickler is made anew when the reducers registered
        changed (as ``parcel.dispatch_table`` sees it), and is never used by
        two threads at once (only the pool's result thread puts calls)."""
        if type(obj.fn) is not functools.partial:
            return bytes(ForkingPickler.dumps(obj))
        if not self._pickling.acquire(False):  # (busy: another thread's put)
            return bytes(ForkingPickler.dumps(obj))
        try:
            table = dispatch_table()
            pickler = self._pickler
            if pickler is None or pickler.dispatch_table is not table:
                pickler = self._pickler = ForkingPickler(self._stream)
                pickler.dispatch_table = table
            stream = self._stream
            stream.seek(0)
            stream.truncate()
            pickler.clear_memo()
            pickler.dump(obj)
            return stream.getvalue()
        finally:
            self._pickling.release()

    def _write_directly(self, data: bytes, obj: Any) -> bool:
        """Write ``data`` if the feeder has nothing unwritten and the pipe has
        room; False to leave the call to the feeder."""
        wlock = self._wlock
        if wlock is None:  # pragma: no cover - Windows
            return False
        # The feeder writes under the same lock, and holds it while a write waits
        # for room in the pipe: waiting for it here, the result thread would read
        # no result meanwhile, so workers blocked on a full result pipe could never
        # drain the call pipe.  Held means the feeder has a call unwritten anyway.
        if not wlock.acquire(False):
            return False
        try:
            if self._fed:
                return False
            try:
                unread = _unread.unpack(
                    fcntl.ioctl(self._reader.fileno(), termios.FIONREAD, b"\0" * _unread.size)
                )[0]
            except (OSError, ValueError):  # (a reader closed: the pool broke)
                return False
            if unread + len(data) + 4 > ROOM:
                return False
            try:
                self._writer.send_bytes(data)
                return True
            except OSError as exc:
                failed = exc
        finally:
            wlock.release()
        # As the feeder does: a pipe every worker has closed loses the call (the
        # pool is broken and fails it); any other error fails the call's future.
        if not (self._ignore_epipe and failed.errno == errno.EPIPE):
            self._sem.release()
            super()._on_queue_feeder_error(failed, obj)
        return True


def install(executor: Any, needs_feeder: Callable[[Any], bool]) -> bool:
    """Make ``executor``'s call queue (a standard pool's, before any call was
    put) a :class:`CallQueue`; ``needs_feeder(fn)`` says which calls must go
    through the feeder: True.  A pool of another standard library is left as
    it is: False (the caller says so)."""
    calls: Any = getattr(executor, "_call_queue", None)
    standard = (
        type(calls) is _process._SafeQueue
        and getattr(calls, "_thread", 0) is None
        and hasattr(calls, "_send_bytes")
    )
    if not standard:
        return False
    calls.__class__ = CallQueue
    calls.needs_feeder = needs_feeder
    calls._reset()
    return True
