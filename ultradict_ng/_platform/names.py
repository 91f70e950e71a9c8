"""Dict names: what a user may pass, and the names we make up.

A name is the control segment's name in the shared-memory filesystem; the
derived names (layout: "Segments") add a suffix with ``@``, which no user name
may contain, so no user name collides with a derived one.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from .._disk import layout as D
from .._shm import layout as L
from ..errors import InvalidName

__all__ = ["validate_name", "generate_name"]


def validate_name(name: Any, control: bool = False) -> str:
    """``name`` if it can name a dict on this platform, else :class:`InvalidName`.
    ``control``: a dict kept in files' control segment's name passes too (what
    ``clean`` removes when its processes left it)."""
    if control and isinstance(name, str) and _CONTROL.fullmatch(name):
        return name
    if not isinstance(name, str):
        raise InvalidName(f"a shared dict name must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidName("a shared dict name must not be empty")
    if len(name) > L.MAX_NAME_LENGTH:
        raise InvalidName(
            f"shared dict name {name!r} is {len(name)} characters long; at most "
            f"{L.MAX_NAME_LENGTH} fit in a segment name on this platform"
        )
    if name.startswith(D.CONTROL_PREFIX):
        raise InvalidName(
            f"{name!r} is the shared memory of a dict kept in files: open that dict by its directory (path=)"
        )
    if not L.NAME_PATTERN.fullmatch(name):
        raise InvalidName(
            f"shared dict name {name!r} may only contain letters, digits, '_', '.' and '-' "
            "(no '/': it names a file in the shared-memory filesystem)"
        )
    return name


#: The name of a dict kept in files' control segment (``layout.control_name``).
_CONTROL = re.compile(re.escape(D.CONTROL_PREFIX) + "[0-9a-f]+-[0-9a-f]+")


def generate_name() -> str:
    """A fresh unique name (``udng_`` and 12 hex digits)."""
    return L.GENERATED_PREFIX + secrets.token_hex(6)
