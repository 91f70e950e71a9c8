"""One process's mappings of a dict's control and stream segments.

Kept apart from :class:`~ultradict_ng.store.Store` so that a finalizer (and
``unlink_by_name``, which maps only the control segment) can hold and release
the mappings without holding the store, which would keep the store alive.
"""

from __future__ import annotations

from typing import Optional

from .._platform.segments import Segment
from ..speedups import Words

__all__ = ["Mapping"]


class Mapping:
    """``ctrl`` and ``stream`` segments; ``words``, plain loads of the control
    words (the reader's hit path); ``atomic``, the control words' atomic
    operations; ``stream_mv`` and ``stream_words``, the stream's bytes and its
    record writer.  :meth:`release` drops every export, then unmaps."""

    __slots__ = ("ctrl", "stream", "words", "atomic", "stream_mv", "stream_words")

    def __init__(self, ctrl: Segment, stream: Optional[Segment]) -> None:
        assert ctrl.buf is not None
        self.ctrl = ctrl
        self.stream = stream
        self.words: memoryview = memoryview(ctrl.buf).cast("Q")
        self.atomic = Words(ctrl.buf)
        sbuf = stream.buf if stream is not None else None
        self.stream_mv: Optional[memoryview] = memoryview(sbuf) if sbuf is not None else None
        self.stream_words: Optional[Words] = Words(sbuf) if sbuf is not None else None

    def release(self) -> None:
        self.atomic.release()
        if self.stream_words is not None:
            self.stream_words.release()
        self.words.release()
        if self.stream_mv is not None:
            self.stream_mv.release()
        self.ctrl.close()
        if self.stream is not None:
            self.stream.close()
