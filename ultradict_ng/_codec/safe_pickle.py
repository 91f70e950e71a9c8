"""Reading a pickle dict without running the code its pickles name.

A pickle names callables (``module.name``) and the unpickler calls them: that
is how any object is rebuilt, and why loading a pickle from shared memory runs
code chosen by whoever wrote it.  The command line must show a pickle dict's
contents all the same (``show``, ``watch``, counting keys), so it decodes with
an unpickler whose ``find_class`` never returns a real callable except for a
short list of value types whose constructors only build values.  Every other
name becomes an :class:`Opaque` stand-in that records the name and swallows
its arguments and state: containers, strings and numbers (which pickle builds
with opcodes, not calls) come out exact, and objects come out as "an instance
of ``module.name``, not loaded".
"""

from __future__ import annotations

import datetime
import decimal
import io
import pickle
from typing import Any

from ..errors import CorruptSegment
from .codec import Codec, PickleCodec, describe_error
from .placeholders import BlobRef, PickledBlobs

__all__ = ["Opaque", "safe_loads", "SafePickleCodec"]

#: Constructors that only build a value from plain arguments.
_ALLOWED: dict[tuple[str, str], Any] = {
    ("builtins", "complex"): complex,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "bytearray"): bytearray,
    ("builtins", "bytes"): bytes,
    ("builtins", "slice"): slice,
    ("builtins", "range"): range,
    ("datetime", "datetime"): datetime.datetime,
    ("datetime", "date"): datetime.date,
    ("datetime", "time"): datetime.time,
    ("datetime", "timedelta"): datetime.timedelta,
    ("datetime", "timezone"): datetime.timezone,
    ("decimal", "Decimal"): decimal.Decimal,
    # Our own placeholders of large values (they hold ids and bytes, and map nothing).
    (BlobRef.__module__, "BlobRef"): BlobRef,
    (PickledBlobs.__module__, "PickledBlobs"): PickledBlobs,
}


class Opaque:
    """An object of class ``qualname`` that was not unpickled: whatever the
    pickle passes to it (arguments, state, items) is dropped."""

    qualname = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"<{self.qualname} object, not unpickled>"


_stand_ins: dict[str, type] = {}


def _stand_in(qualname: str) -> type:
    cls = _stand_ins.get(qualname)
    if cls is None:
        cls = _stand_ins[qualname] = type("Opaque", (Opaque,), {"qualname": qualname})
    return cls


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        return allowed if allowed is not None else _stand_in(f"{module}.{name}")


def safe_loads(data: bytes) -> Any:
    """``pickle.loads`` that calls no constructor outside the value types above."""
    return _Unpickler(io.BytesIO(data)).load()


class SafePickleCodec(PickleCodec):
    """The pickle serializer's reading half, made safe (module docstring).
    Reading only: it must never be used to write a dict."""

    def loads(self, data: Any) -> Any:
        try:
            return safe_loads(bytes(data))
        except Exception as exc:
            raise CorruptSegment(f"cannot decode pickle data: {describe_error(exc)}") from exc

    def dumps(self, obj: Any) -> bytes:
        raise TypeError("SafePickleCodec only reads")


#: The codec the command line reads pickle dicts with.
SAFE_PICKLE: Codec = SafePickleCodec()
