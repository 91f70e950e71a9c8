"""Pure-Python twin of keyhash.c: ``key_hash_common``, a shared table's key
hash for the common key types (the rest is ``_codec/keyhash.py``'s).
"""

from __future__ import annotations

from typing import Any, Optional

from .._codec.keyhash import key_hash

__all__ = ["key_hash_common"]

_COMMON_KEY_TYPES = frozenset({str, bytes, int, bool, float, type(None)})


def key_hash_common(key: Any) -> Optional[int]:
    """``key_hash(key)`` for the types the compiled one hashes itself (str,
    bytes, int, bool, float, None), else None: the caller then calls
    ``key_hash``.  A str with lone surrogates: None too (``key_hash`` raises)."""
    t = type(key)
    if t not in _COMMON_KEY_TYPES:
        return None
    if t is str:
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            return None
    return key_hash(key)
