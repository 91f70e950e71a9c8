"""Pure-Python twins of unpack.c: ``unpack_simple`` (a scalar or a tuple of
scalars decoded without the codec's Python ext hook) and ``tuple_hook`` (the
codec's root ext hook for a tuple of scalars).  tests/test_native.py compares
them with the compiled ones.
"""

from __future__ import annotations

from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]

__all__ = ["unpack_simple", "tuple_hook"]

_SCALARS = frozenset({type(None), bool, int, float, str, bytes})
_EXT_TUPLE = 1


class _Declined(Exception):
    pass


def _decline(code: int, data: bytes) -> Any:
    raise _Declined


def _tuple_of_scalars(code: int, data: bytes) -> Any:
    if code != _EXT_TUPLE:
        raise _Declined
    items = msgpack.unpackb(data, raw=False, ext_hook=_decline)
    if type(items) is not list or not all(type(x) in _SCALARS for x in items):
        raise _Declined
    return tuple(items)


def unpack_simple(data: bytes, default: Any) -> Any:
    """The scalar or tuple of scalars ``data`` encodes (as the codec decodes
    it), else ``default``: anything else, and anything msgpack rejects."""
    if type(data) is not bytes:
        raise TypeError("unpack_simple(data: bytes, default)")
    try:
        value = msgpack.unpackb(data, raw=False, ext_hook=_tuple_of_scalars)
    except Exception:  # (_Declined, and whatever msgpack raises on bad data)
        return default
    return value if type(value) in _SCALARS or type(value) is tuple else default


def tuple_hook(fallback: Any, code: int, data: bytes) -> Any:
    """The codec's root ext hook: an ext 1 of scalars decoded here, anything
    else by ``fallback``."""
    if type(code) is int and type(data) is bytes and code == _EXT_TUPLE:
        try:
            return _tuple_of_scalars(code, data)
        except Exception:
            pass
    return fallback(code, data)
