"""The twin of ``_native.scan_stream``: recovery's scan of a stream file.

``_disk/layout.py``, "Opening and recovery", step 4c, as a Python loop: the
compiled one is the same loop in C (a full stream's million records take the
loop seconds).  ``_disk/recovery.py`` calls it through :mod:`ultradict_ng.speedups`
and names the stops that are normal.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

from .._shm import layout as L

__all__ = ["scan_stream"]

_header = struct.Struct(L.RECORD_FORMAT)


def scan_stream(buffer: Any, tag: int) -> tuple[int, int, str]:
    """Recovery's scan of a stream file (``_disk/layout.py``, step 4c): the
    records from offset 0 that carry ``tag``, lie within ``buffer``, pass
    their crc and whose unit word is their offset in their unit (shifted).
    Returns the end of the last whole unit (its last record ``UNIT_LAST``),
    the whole units before it, and why the scan stopped there ("" at the
    buffer's end).  ``_disk/recovery.py`` names the normal stops."""
    mv = memoryview(buffer)
    try:
        size = len(mv)
        pos = start = end = units = 0
        stopped = ""
        while pos + L.RECORD_HEADER <= size:
            length, rtag, crc, unit = _header.unpack_from(mv, pos)
            if not (length or rtag or crc or unit):
                stopped = "zeros"
                break
            if rtag != tag:
                stopped = "a record of another generation"
                break
            if length > size - pos - L.RECORD_HEADER:
                stopped = "a record running past the file"
                break
            body = pos + L.RECORD_HEADER
            if zlib.crc32(mv[body : body + length], zlib.crc32(mv[pos : pos + 8])) != crc:
                stopped = "a record failing its checksum"
                break
            if unit >> L.UNIT_BACK_SHIFT != pos - start:
                stopped = "a record not of the unit before it"
                break
            pos = body + length
            if unit & L.UNIT_LAST:
                end = start = pos
                units += 1
        else:
            if pos < size:
                stopped = "the file's end"
        if start != pos and stopped in ("", "zeros", "a record of another generation"):
            stopped = "a transaction's records without its last"  # (a writer killed inside one: said so)
        return end, units, stopped
    finally:
        mv.release()
