"""Pure-Python twins of every entry point of the compiled helper ``_native``.

Same names, same signatures, same results, same bytes in shared memory:
:mod:`ultradict_ng.speedups` exports either ``_native``'s objects or these,
and no other module knows which (the msgpack ``fallback.py`` / py-lmdb
``cffi.py`` shape).  Each twin lives in the module named after the C file
that implements it (``records.c`` / :mod:`.records`); :mod:`.entries` lists
them, and this module gathers them from that list, so that adding one is a
line there, not here.  ``_native.pyi`` describes both implementations;
tests/test_native.py compares each pair on generated inputs, and CI runs the
whole suite on both.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .entries import CONSTANTS, ENTRY_POINTS
from .words import BoundWords, PublicWords

__all__ = ["BoundWords", "PublicWords", *ENTRY_POINTS, *CONSTANTS]  # pyright: ignore[reportUnsupportedDunderAll]


def _gather() -> dict[str, Any]:
    """Every twin and constant, by name, from the module :mod:`.entries` names."""
    return {
        name: getattr(import_module(f".{module}", __package__), name)
        for name, module in {**ENTRY_POINTS, **CONSTANTS}.items()
    }


globals().update(_gather())
