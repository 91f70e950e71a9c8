"""The compiled helper's entry points: the one list of them.

Each name maps to the C file that implements it (``<file>.c``) and the
pure-Python twin module named after that file (``<file>.py``).  From this
list :mod:`.twins` gathers the twins, :mod:`ultradict_ng.speedups` binds one
implementation, and tests/test_native.py checks that the compiled module,
its stub ``_native.pyi`` and the twins define exactly these names and that
a parity test covers each one.  A new entry point is added here, in its C
file's method table entry (``_native.c``), in its twin and in the stub.
"""

from __future__ import annotations

__all__ = ["ENTRY_POINTS", "CONSTANTS"]

#: name -> the file (without ``.c`` / ``.py``) holding it and its twin.
ENTRY_POINTS: dict[str, str] = {
    # the control words: atomics, record writes, futex
    "Words": "words",
    # the lock's per-process state
    "ProcessState": "lockstate",
    # the read hit path
    "StoreBase": "readpath",
    "ViewBase": "readpath",
    # SharedCache.get's hit path
    "CacheGet": "cacheget",
    # a big dict's cache
    "TableCacheBase": "tablecache",
    # the stream's records
    "parse_records": "records",
    "msgpack_length": "records",
    "apply_sets": "records",
    "apply_simple": "records",
    "crc32": "records",
    # recovery's scan of a stream file
    "scan_stream": "streamscan",
    # recovery's checkpoint merged from the records' bytes
    "stream_merge_plan": "streammerge",
    "stream_merge_write": "streammerge",
    # the codec's scans of containers
    "types_within": "typescan",
    "contains_type": "typescan",
    # what a read hands out
    "copy_plain": "copytree",
    "first_to_export": "copytree",
    "set_immutable_types": "copytree",
    # msgpack packing and unpacking
    "pack_map": "packing",
    "pack_pairs": "packing",
    "unpack_simple": "unpack",
    "tuple_hook": "unpack",
    # the shared table
    "key_hash_common": "keyhash",
    "table_get": "tableprobe",
    "table_candidates": "tableprobe",
    "table_entry": "tableprobe",
    "table_changes": "tableprobe",
    "table_fill": "tablewalk",
    "table_index": "tablewalk",
    "table_merge": "tablewalk",
    "table_chunk": "tablewalk",
    "table_rows": "tablewalk",
}

#: Constants the compiled module exports beside them, and the twin module
#: holding each one's twin (``LAYOUT_CONSTANTS`` is the compiled module's
#: only: the twins read the layout modules themselves).
CONSTANTS: dict[str, str] = {
    "FUTEX": "words",
    "RECORD_HEADER": "words",
    "SCALAR_TYPES": "words",
}
