"""How the command line prints: sizes, tables, and values it must not load.

Values are described, never materialised: a large value is a placeholder
whose type, dtype, shape and size are known without mapping its segment, and
a pickled object the safe unpickler did not build is named by its class.
The JSON forms keep what JSON can hold as it is and describe the rest as
``{"type": ..., "size": ...}`` objects, so a script can tell a str from a
description.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import sys
from collections.abc import Sequence
from typing import Any, Optional

from .._codec.placeholders import (
    KIND_BYTEARRAY,
    KIND_BYTES,
    KIND_NDARRAY,
    KIND_TENSOR,
    BlobRef,
    InlineArray,
    PickledBlobs,
)
from .._codec.safe_pickle import Opaque

__all__ = ["size", "table", "describe", "to_json", "text_lines", "dumps", "cannot_list"]

_KIND_NAMES = {
    KIND_BYTES: "bytes",
    KIND_BYTEARRAY: "bytearray",
    KIND_NDARRAY: "ndarray",
    KIND_TENSOR: "tensor",
}
#: Longest repr the text form prints of one value before cutting it.
MAX_REPR = 200


def size(n: Optional[int]) -> str:
    """``n`` bytes for people: 512 B, 4.0 KiB, 1.5 MiB."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - not reached


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """Columns aligned on the widest cell; the columns numbered in ``right`` right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [
            str(c).rjust(widths[i]) if i in right else str(c).ljust(widths[i]) for i, c in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _descr(descr: Any) -> str:
    return descr if isinstance(descr, str) else json.dumps(descr)


def describe(value: Any) -> Optional[dict[str, Any]]:
    """The description of a value JSON cannot hold as it is, or None if it can
    (or is a container to walk)."""
    tp = type(value)
    if tp is BlobRef:
        out: dict[str, Any] = {
            "type": _KIND_NAMES.get(value.kind, f"kind {value.kind}"),
            "size": value.length,
            "storage": "blob",
        }
        if value.meta is not None:
            out["dtype"], out["shape"] = _descr(value.meta[0]), list(value.meta[1])
        return out
    if tp is InlineArray:
        return {
            "type": "tensor" if value.tensor else "ndarray",
            "dtype": _descr(value.descr),
            "shape": list(value.shape),
            "size": len(value.data),
        }
    if tp is PickledBlobs:
        return {
            "type": "pickled value",
            "size": len(value.data) + sum(r.length for r in value.refs),
            "blobs": len(value.refs),
        }
    if isinstance(value, Opaque):
        return {"type": value.qualname, "loaded": False}
    if tp in (bytes, bytearray):
        return {"type": tp.__name__, "size": len(value)}
    if tp is float and not math.isfinite(value):
        return {"type": "float", "value": repr(value)}
    if tp in (complex, decimal.Decimal, datetime.timedelta, datetime.timezone, range, slice):
        return {"type": tp.__name__, "value": str(value)}
    if tp in (datetime.datetime, datetime.date, datetime.time):
        return {"type": tp.__name__, "value": value.isoformat()}
    return None


def to_json(value: Any) -> Any:
    """``value`` as JSON can hold it (module docstring)."""
    described = describe(value)
    if described is not None:
        return described
    tp = type(value)
    if value is None or tp in (bool, int, float, str):
        return value
    if tp is list:
        return [to_json(v) for v in value]
    if tp is dict:
        if all(type(k) is str for k in value):
            return {k: to_json(v) for k, v in value.items()}
        return {"type": "dict", "items": [[to_json(k), to_json(v)] for k, v in value.items()]}
    if tp in (tuple, set, frozenset):
        items = list(value) if tp is tuple else sorted(value, key=repr)
        return {"type": tp.__name__, "items": [to_json(v) for v in items]}
    return {"type": f"{tp.__module__}.{tp.__qualname__}", "repr": _cut(repr(value))}


def _cut(text: str) -> str:
    return text if len(text) <= MAX_REPR else text[: MAX_REPR - 3] + "..."


def short(value: Any) -> str:
    """One line for a leaf value in the text form."""
    d = describe(value)
    if d is None:
        return _cut(repr(value))
    if "value" in d:
        return f"{d['type']}({d['value']})"
    if "dtype" in d:
        where = ", in a blob" if d.get("storage") == "blob" else ""
        return f"{d['type']} {d['dtype']} {tuple(d['shape'])} {size(d['size'])}{where}"
    if d.get("loaded") is False:
        return f"<{d['type']} object, not unpickled>"
    where = ", in a blob" if d.get("storage") == "blob" else ""
    extra = f", {d['blobs']} blob(s)" if "blobs" in d else ""
    return f"{d['type']}, {size(d['size'])}{where}{extra}"


def text_lines(node: dict[Any, Any], indent: int = 0) -> list[str]:
    """A dict tree as indented ``key: value`` lines (nested dicts expanded)."""
    out = []
    pad = "  " * indent
    for key, value in node.items():
        if type(value) is dict and value:
            out.append(f"{pad}{key!r}:")
            out.extend(text_lines(value, indent + 1))
        else:
            out.append(f"{pad}{key!r}: {short(value) if type(value) is not dict else '{}'}")
    return out


def dumps(obj: Any) -> str:
    """JSON text for ``--json`` output."""
    return json.dumps(obj, indent=2, sort_keys=False, default=str)


def cannot_list(command: str, hint: str) -> bool:
    """True (after saying so on stderr) where the shared-memory filesystem cannot be
    listed, which ``command`` needs (macOS)."""
    from .._platform.listing import listable

    if listable():
        return False
    print(
        f"this platform's shared memory cannot be listed (no /dev/shm): {command} needs the listing; {hint}",
        file=sys.stderr,
    )
    return True
