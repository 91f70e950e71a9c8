"""ultradict_ng: one dict shared by many processes through shared memory.

>>> from ultradict_ng import SharedDict
>>> d = SharedDict(name="stats")        # any process: the same dict by name
>>> d["hits"] = 1
>>> with d.lock:                         # atomic across processes
...     d["hits"] += 1

The shared-memory protocol is specified in :mod:`ultradict_ng.layout`.
"""

from . import errors
from ._backends import unlink_by_name
from ._lock import SharedLock
from .changes import SUPERSEDED, Change
from .compat import UltraDict
from .errors import *  # noqa: F403  (every exception, listed in errors.__all__)
from .shareddict import SharedDict

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
