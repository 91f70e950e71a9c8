"""Options of a dict checked: before anything is made (``validate_options``),
and against what an existing dict stores (``check_options``).

Apart from ``store.py`` because a dict kept in files (``_disk``) checks the
same things against what its files store.
"""

from __future__ import annotations

from typing import Any, Optional

from .._codec.codec import Codec
from .._engine import Options
from .._platform.directories import directory_of
from ..errors import ParameterMismatch
from . import layout as L
from .control import Header

__all__ = ["validate_options", "check_options", "blob_threshold"]


def validate_options(options: Options) -> None:
    """The checks of ``Store.open`` on options (a dict kept in files' too): errors before anything is made."""
    if (  # (none of them given, as most opens go: nothing to check)
        options.buffer_size is None
        and options.dump_limit is None
        and options.blob_threshold is None
        and options.max_decoded is None
        and options.auto_unlink is None
        and not options.create_defaults
    ):
        return
    for size in (options.buffer_size, options.for_create("buffer_size")):
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool):
                raise TypeError("buffer_size must be an int (bytes)")
            if not L.MIN_STREAM_SIZE <= size <= L.MAX_STREAM_SIZE:
                raise ValueError(
                    f"buffer_size must be between {L.MIN_STREAM_SIZE} and {L.MAX_STREAM_SIZE} bytes"
                )
    for limit in (options.dump_limit, options.for_create("dump_limit")):
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise ValueError("dump_limit must be a non-negative int (bytes) or None")
    for threshold in (options.blob_threshold, options.for_create("blob_threshold")):
        if threshold is not None:
            blob_threshold(threshold)
    limit = options.max_decoded
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
        raise TypeError(f"max_decoded must be an int (a count of values) or None, not {limit!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"max_decoded must be 0 or more, not {limit}")
    for auto in (options.auto_unlink, options.for_create("auto_unlink")):
        if not (auto is None or isinstance(auto, int) or auto == "last"):
            raise ValueError(f"auto_unlink must be True, False, None or 'last', not {auto!r}")


def blob_threshold(value: Any) -> int:
    """The blob threshold to store: None -> the default; 0 -> never."""
    if value is None:
        return L.DEFAULT_BLOB_THRESHOLD
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("blob_threshold must be a non-negative int (bytes; 0: never) or None")
    return value


def check_options(name: str, header: Header, stored: Codec, codec: Optional[Codec], options: Options) -> None:
    """ParameterMismatch if an attacher gave a value that differs from the stored one."""
    mismatches = []
    if options.recurse is not None and bool(options.recurse) != header.recurse:
        mismatches.append(f"recurse={header.recurse}")
    if codec is not None and codec.id != stored.id:
        mismatches.append(f"serializer={stored.name!r}")
    if options.buffer_size is not None and (header.grows or options.buffer_size != header.stream_size):
        mismatches.append(
            "buffer_size=None (a growing stream)" if header.grows else f"buffer_size={header.stream_size}"
        )
    if options.dump_limit is not None and options.dump_limit != header.dump_limit:
        mismatches.append(f"dump_limit={header.dump_limit}")
    if options.blob_threshold is not None and options.blob_threshold != header.blob_threshold:
        mismatches.append(f"blob_threshold={header.blob_threshold}")
    if mismatches:
        where = directory_of(name)
        raise ParameterMismatch(
            f"shared dict {name!r} exists with {', '.join(mismatches)}; pass only the name to attach "
            "with its stored configuration"
            if where is None
            else f"the dict kept in {where!r} was created with {', '.join(mismatches)}; pass only path= "
            "to open it with its stored configuration"
        )
