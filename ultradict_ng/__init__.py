"""ultradict_ng: one dict shared by many processes through shared memory.

>>> from ultradict_ng import SharedDict
>>> d = SharedDict(name="stats")        # any process: the same dict by name
>>> d["hits"] = 1
>>> with d.lock:                         # atomic across processes
...     d["hits"] += 1

The shared-memory protocol is specified in :mod:`ultradict_ng._shm.layout`.
"""

import sys as _sys

from . import errors
from ._engine.backends import unlink_by_name
from ._platform.lock import SharedLock

# The protocol specs live beside the code that implements them; their former
# top-level import paths (``import ultradict_ng.layout``) keep working.
from ._shm import layout as _layout
from ._shm import table_layout as _table_layout
from .cache import layout as _cache_layout
from .changes import SUPERSEDED, Change
from .compat import UltraDict
from .errors import *  # noqa: F403  (every exception, listed in errors.__all__)
from .shareddict import SharedDict

for _old, _spec in (("layout", _layout), ("table_layout", _table_layout), ("cache_layout", _cache_layout)):
    _sys.modules.setdefault(f"{__name__}.{_old}", _spec)
    globals().setdefault(_old, _spec)
del _old, _spec

__version__ = "0.2.0"

__all__ = [
    "SharedDict",
    "SharedLock",
    "UltraDict",
    "Change",
    "SUPERSEDED",
    "unlink_by_name",
    "__version__",
    *errors.__all__,
]
