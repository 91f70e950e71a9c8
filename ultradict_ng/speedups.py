"""The one seam between the package and its compiled helper.

Every hot primitive -- atomic words, record writing and futex waits (``Words``), the
lock's per-process state (``ProcessState``), the bases carrying the read hit path
(``StoreBase``, ``ViewBase``, and ``CacheGet`` for the shared cache), the reader's
record checks and replay (``parse_records``, ``apply_sets``, ``apply_simple``), recovery's
scan of a stream file (``scan_stream``) and the codec's type
scans (``types_within``, ``contains_type``), the copies a read hands out
(``copy_plain``) and its packers of big dicts
(``pack_map``, ``pack_pairs``) and its decoder of their values (``unpack_simple``,
``tuple_hook``, ``table_rows``) -- is imported from here, and only
from here.  This module takes them from the compiled ``ultradict_ng._helper._native``
or from :mod:`ultradict_ng._helper.twins`, its pure-Python twins with identical
names, signatures and results; ``_native.pyi`` types both.  Nothing else in
the package branches on which one is in use.

The choice is made once, at import, after a self-test on private buffers:

========== ======================================================================
``native`` the compiled helper (default when it was built and passes its test)
``bound``  the twins, atomics through patomic function pointers (the default
           without a compiler)
``public`` the twins, atomics through the ``atomics`` public API only (the
           default when ``bound``'s self-test fails: an ``atomics`` whose
           internals changed)
========== ======================================================================

``ULTRADICT_NG_SPEEDUPS=native|bound|public`` forces one (``native`` fails
at import without the helper, so CI can insist on it);
``ULTRADICT_NG_ATOMICS``, this switch's former name, is still read when the
new one is not set.  Processes on different implementations share a dict:
both write the same bytes (layout.py) with sequentially consistent atomics.
"""

from __future__ import annotations

import os
import zlib
from typing import TYPE_CHECKING, Any, Callable

from ._helper.entries import CONSTANTS, ENTRY_POINTS
from ._shm import layout as L

if TYPE_CHECKING:  # (bound below from the list; the stub types both implementations)
    from ._helper._native import *  # noqa: F403

try:
    from ._helper import _native as _compiled
except ImportError:  # not compiled: no C compiler at install time
    _compiled = None  # type: ignore[assignment]

__all__ = ["IMPLEMENTATION", "ENV_VAR", *ENTRY_POINTS, *CONSTANTS]  # pyright: ignore[reportUnsupportedDunderAll]

ENV_VAR = "ULTRADICT_NG_SPEEDUPS"
_OLD_ENV_VAR = "ULTRADICT_NG_ATOMICS"
#: The twins' flavours of ``Words``.  The twins are imported only when a process
#: uses them: they import ``atomics`` (~35 ms), which the compiled helper never needs.
_FLAVOURS = ("bound", "public")


def _twin_words(flavour: str) -> Any:
    from ._helper import words

    return words.BoundWords if flavour == "bound" else words.PublicWords


def _words_work(make: Callable[[Any], Any]) -> bool:
    """Atomics and record writing of one implementation, on private buffers,
    against the values (and bytes) they must give."""
    buf = bytearray(64)
    try:
        words = make(buf)
        try:
            words.store(1, 7)
            ok1, seen1 = words.cas(1, 7, 2**64 - 1)
            ok2, seen2 = words.cas(1, 7, 3)
            good = (ok1, seen1, ok2, seen2, words.load(1), words.load(0)) == (
                True,
                7,
                False,
                2**64 - 1,
                2**64 - 1,
                0,
            )
            end = words.write_record(16, 0xDEADBEEF, b"payload")
        finally:
            words.release()
        crc = zlib.crc32(
            b"payload", zlib.crc32((7).to_bytes(4, "little") + (0xDEADBEEF).to_bytes(4, "little"))
        )
        record = (7).to_bytes(4, "little") + (0xDEADBEEF).to_bytes(4, "little") + crc.to_bytes(4, "little")
        return (
            good
            and buf[8:16] == b"\xff" * 8
            and end == 16 + L.RECORD_HEADER + 7
            and bytes(buf[16:39]) == record + L.UNIT_WHOLE.to_bytes(4, "little") + b"payload"
        )
    except Exception:
        return False


def _choose() -> str:
    forced = (os.environ.get(ENV_VAR) or os.environ.get(_OLD_ENV_VAR) or "").strip().lower()
    choices = ("native", *_FLAVOURS)
    if forced and forced not in choices:
        var = ENV_VAR if os.environ.get(ENV_VAR) else _OLD_ENV_VAR
        raise ImportError(f"{var}={forced!r}: expected one of {', '.join(choices)}")
    if forced in ("", "native"):
        if _compiled is not None and _words_work(_compiled.Words):
            return "native"
        if forced:
            raise ImportError(
                f"{ENV_VAR}=native, but ultradict_ng._helper._native is not compiled or fails its self-test"
            )
    if forced:
        return forced
    return "bound" if _words_work(_twin_words("bound")) else "public"


#: "native", "bound" or "public": which implementation this process uses.
IMPLEMENTATION: str = _choose()


def _bound() -> dict[str, Any]:
    """Every entry point and constant of the implementation in use, by name:
    the compiled module's, or the twins' (``_helper/entries.py`` lists them)."""
    names = (*ENTRY_POINTS, *CONSTANTS)
    if IMPLEMENTATION == "native":
        return {name: getattr(_compiled, name) for name in names}
    from ._helper import twins

    bound = {name: getattr(twins, name) for name in names}
    bound["Words"] = _twin_words(IMPLEMENTATION)
    return bound


globals().update(_bound())
