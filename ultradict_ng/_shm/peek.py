"""Looking inside a dict from outside: a read-only handle for tools.

The command line must read any dict on the machine -- one whose users are
all dead, one with a pickle serializer, one of a custom serializer it cannot
decode -- without changing it, without taking its lock in the common case,
and without running code stored in it.  A :class:`Peek` is a private reader
(the reader algorithm of layout "Reader", as the change feed uses it) over
mappings of the control and stream segments, with a decoder that cannot run
code: msgpack (the default serializer never does), or pickle through
:mod:`ultradict_ng._codec.safe_pickle`.  Large values stay placeholders
(``BlobRef``, ``InlineArray``): their size and type are known without
mapping them.  A Peek does not register as a user and never writes.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from .._codec.codec import CUSTOM_ID, MSGPACK, PICKLE, Codec
from .._codec.placeholders import BlobRef
from .._codec.safe_pickle import SAFE_PICKLE
from .._platform.directories import shown
from .._platform.segments import Segment
from ..errors import CorruptSegment, NotFound
from . import layout as L
from .control import Header, attach_control
from .lock import ShmLock
from .mapping import Mapping
from .reader import INVALID, Reader
from .waiting import waits_for

__all__ = ["Peek", "reading_codec"]

#: How many lock-free rounds a Peek tries before it gives up (it never locks).
PEEK_ROUNDS = 2000


def reading_codec(serializer_id: int) -> Optional[Codec]:
    """The codec that decodes a dict of this serializer id safely, or None
    (a custom serializer: only the processes that pass it can decode)."""
    if serializer_id == MSGPACK.id:
        return MSGPACK
    if serializer_id == PICKLE.id:
        return SAFE_PICKLE
    if serializer_id == CUSTOM_ID:
        return None
    raise CorruptSegment(f"unknown serializer id {serializer_id}")


class Peek(Reader):
    """A read-only reader of the dict ``name`` (see the module docstring).

    ``header`` is the control header; ``codec`` None when the contents cannot
    be decoded here (custom serializer), and then :meth:`load` raises.
    It also serves as the store of a :class:`~ultradict_ng._shm.feed.Feed`
    (``watch``): the attributes the feed copies are here, and its values
    stay placeholders (``materialize`` is the identity)."""

    __slots__ = ("header", "waits", "closed", "serializer_id")

    _partial = False  # (load() hands out the whole tree: a dict)

    def __init__(self, name: str) -> None:
        ctrl = attach_control(name)  # FileNotFoundError, CorruptSegment
        stream: Optional[Segment] = None
        try:
            with memoryview(ctrl.buf).cast("Q") as words:  # type: ignore[arg-type]
                header = Header.read(name, words)  # IncompatibleLayout, CorruptSegment
            codec = reading_codec(header.serializer_id)  # CorruptSegment for an unknown id
            stream = Segment.attach(L.stream_name(name))
            if stream.size < header.stream_size:
                raise CorruptSegment(
                    f"stream segment {L.stream_name(name)!r} holds {stream.size} bytes, its "
                    f"header says {header.stream_size}"
                )
        except BaseException:
            ctrl.close()
            if stream is not None:
                stream.close()
            raise
        self._map = Mapping(ctrl, stream)
        self.words = self._map.words
        self.name = name
        self.header = header
        self.serializer_id = header.serializer_id
        self.codec = codec  # type: ignore[assignment]
        self.token = header.token
        self.stream_size = header.stream_size
        self.lock = ShmLock(self._map.atomic, name, header.token)
        self.waits = waits_for((name, header.token))
        self.mutex = threading.RLock()
        self.closed = False
        self.data = {}
        self.gen = self.seen = INVALID
        self.pos = 0

    @classmethod
    def open(cls, name: str) -> Peek:
        """:class:`NotFound` rather than FileNotFoundError for a missing dict."""
        try:
            return cls(name)
        except FileNotFoundError:
            raise NotFound(f"no shared dict named {name!r} exists") from None

    @property
    def serializer(self) -> str:
        return {MSGPACK.id: "msgpack", PICKLE.id: "pickle", CUSTOM_ID: "custom"}.get(
            self.serializer_id, f"unknown ({self.serializer_id})"
        )

    def load(self) -> dict[Any, Any]:
        """The whole tree as published now (placeholders for large values).

        :class:`CorruptSegment` if it cannot be read consistently within
        ``PEEK_ROUNDS`` lock-free rounds, or cannot be decoded here."""
        if self.codec is None:
            raise CorruptSegment(
                f"shared dict {shown(self.name)!r} uses a custom serializer; only a process that "
                "passes it can decode the contents"
            )
        with self.mutex:
            problem = self._refresh(PEEK_ROUNDS)
        if problem is not None:
            raise CorruptSegment(f"shared dict {shown(self.name)!r}: {problem}")
        return self.data

    @staticmethod
    def materialize(value: Any, seen: Optional[int] = None) -> Any:
        return value

    def blob_bytes(self) -> int:
        """Payload bytes of the large values the loaded tree references."""
        total = 0
        stack: list[Any] = [self.data]
        while stack:
            node = stack.pop()
            items = node.values() if isinstance(node, dict) else node
            for v in items:
                if type(v) is BlobRef:
                    total += v.length
                elif isinstance(v, (dict, list, tuple)):
                    stack.append(v)
        return total

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.data = {}
            self._map.release()

    def __enter__(self) -> Peek:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
