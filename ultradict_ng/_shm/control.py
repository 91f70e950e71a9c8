"""The control segment's header: its fields packed into and read from words.

Every bit of the header (layout: "Control segment") is packed and unpacked
here and nowhere else -- creation, attach, the layout check, cleanup and the
finding of a control segment whose creator died.  Words are native-endian
u64, as the spec says: they are read through ``memoryview.cast("Q")`` or
``int.from_bytes(..., sys.byteorder)``, never a fixed byte order.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._platform.segments import Segment
from ..errors import CorruptSegment, IncompatibleLayout
from . import layout as L
from .lock import owner_alive

__all__ = ["Header", "read_word", "check_layout", "attach_control", "control_owner", "looks_half_created"]


def read_word(buf: Any, index: int) -> int:
    """Word ``index`` of a mapped control segment (a plain load: for the fields
    written once at creation, and for checks that tolerate a stale value)."""
    return int.from_bytes(buf[8 * index : 8 * index + 8], sys.byteorder)


@dataclass(frozen=True)
class Header:
    """The fields written once, at creation, before MAGIC is published."""

    recurse: bool
    grows: bool
    serializer_id: int
    stream_size: int
    stream_limit: int
    token: int
    creator: int
    dump_limit: int
    blob_threshold: int

    def write(self, words: memoryview) -> None:
        """Store every field but MAGIC (the creator publishes that last)."""
        words[L.W_LAYOUT] = L.LAYOUT_VERSION | (L.CONTROL_SIZE << 32)
        words[L.W_CONFIG] = (
            (L.FLAG_RECURSE if self.recurse else 0)
            | (L.FLAG_GROWS if self.grows else 0)
            | (self.serializer_id << 32)
        )
        words[L.W_STREAM_SIZE] = self.stream_size
        words[L.W_STREAM_LIMIT] = self.stream_limit
        words[L.W_TOKEN] = self.token
        words[L.W_CREATOR] = self.creator
        words[L.W_DUMP_LIMIT] = self.dump_limit
        words[L.W_BLOB_THRESHOLD] = self.blob_threshold
        words[L.W_BLOB_NEXT] = words[L.W_BLOB_LOW] = 1

    @classmethod
    def read(cls, name: str, words: memoryview) -> Header:
        """The header of a published control segment; :class:`IncompatibleLayout`
        for another layout version, :class:`CorruptSegment` for impossible values."""
        check_layout(name, words)
        config = words[L.W_CONFIG]
        header = cls(
            recurse=bool(config & L.FLAG_RECURSE),
            grows=bool(config & L.FLAG_GROWS),
            serializer_id=config >> 32,
            stream_size=words[L.W_STREAM_SIZE],
            stream_limit=words[L.W_STREAM_LIMIT],
            token=words[L.W_TOKEN],
            creator=words[L.W_CREATOR],
            dump_limit=words[L.W_DUMP_LIMIT],
            blob_threshold=words[L.W_BLOB_THRESHOLD],
        )
        if not L.MIN_STREAM_SIZE <= header.stream_size <= L.MAX_STREAM_SIZE:
            raise CorruptSegment(
                f"control segment {name!r} records an invalid stream size {header.stream_size}"
            )
        return header


def looks_half_created(words: Sequence[int]) -> bool:
    """Whether control words with MAGIC 0 can be ours, mid-creation: the header
    not written at all (every word 0) or written by this layout.  Anything
    else is another program's data, which cleanup must never remove."""
    if words[L.W_MAGIC] != 0:
        return False
    layout = words[L.W_LAYOUT]
    if layout == 0:
        return not any(words)
    return bool(layout == L.LAYOUT_VERSION | (L.CONTROL_SIZE << 32))


def check_layout(name: str, words: memoryview) -> None:
    version = words[L.W_LAYOUT] & 0xFFFFFFFF
    size = words[L.W_LAYOUT] >> 32
    if version != L.LAYOUT_VERSION or size != L.CONTROL_SIZE:
        raise IncompatibleLayout(
            f"shared dict {name!r} uses layout version {version} (control size {size}); this "
            f"ultradict_ng reads version {L.LAYOUT_VERSION}"
        )


def attach_control(name: str) -> Segment:
    """Map ``name`` once its creator has published MAGIC (layout: "Creation and attach").

    ``FileNotFoundError`` if there is no such segment; :class:`CorruptSegment`
    for a foreign segment, or one whose creator died (or never finished
    within ``INIT_TIMEOUT``) before publishing it.
    """
    deadline = time.monotonic() + L.INIT_TIMEOUT
    while True:
        ctrl = Segment.attach(name)  # FileNotFoundError propagates
        if ctrl.buf is not None and ctrl.size >= L.CONTROL_SIZE:
            magic = read_word(ctrl.buf, L.W_MAGIC)
            if magic == L.CONTROL_MAGIC:
                return ctrl
            if magic != 0:
                ctrl.close()
                raise CorruptSegment(
                    f"segment {name!r} exists but is not an ultradict_ng control segment "
                    "(foreign magic bytes)"
                )
            creator = read_word(ctrl.buf, L.W_CREATOR)
            if creator and not owner_alive(creator):
                ctrl.close()  # no point waiting for a creator that is dead
                raise CorruptSegment(
                    f"shared dict {name!r} was never initialised: its creator (pid "
                    f"{creator & L.PID_MASK}) died while creating it; remove it with "
                    f"unlink_by_name({name!r})"
                )
        elif ctrl.size != 0:
            ctrl.close()
            raise CorruptSegment(
                f"segment {name!r} exists but is not an ultradict_ng control segment ({ctrl.size} bytes)"
            )
        ctrl.close()
        if time.monotonic() > deadline:
            raise CorruptSegment(
                f"segment {name!r} was never initialised (its creator probably died while "
                f"creating it); remove it with unlink_by_name({name!r})"
            )
        time.sleep(0.001)


def control_owner(name: str, token: int, unlinked: bool = False) -> str:
    """Whose control segment ``name`` is: "ours" (creation token ``token``,
    and STATUS.unlinked set if ``unlinked``), "gone" (no segment under the
    name) or "other".

    ``unlinked``: the caller has set the flag in the segment it maps, and asks
    whether the name still holds that one.  The token alone cannot tell: a
    dict kept in files keeps its token when its control segment is rebuilt
    (an opener holding the directory lock replaces one marked unlinked by a
    ``clean``, which holds no such lock), and the new one has the flag clear.
    """
    try:
        ctrl = Segment.attach(name)
    except FileNotFoundError:
        return "gone"
    try:
        if ctrl.buf is None or ctrl.size < L.CONTROL_SIZE or read_word(ctrl.buf, L.W_TOKEN) != token:
            return "other"
        return "other" if unlinked and not read_word(ctrl.buf, L.W_STATUS) & L.STATUS_UNLINKED else "ours"
    finally:
        ctrl.close()
