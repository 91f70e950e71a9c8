"""ultradict_ng: one dict shared by many processes through shared memory.

>>> from ultradict_ng import SharedDict
>>> d = SharedDict(name="stats")        # any process: the same dict by name
>>> d["hits"] = 1
>>> with d.lock:                         # atomic across processes
...     d["hits"] += 1

The shared-memory protocol is specified in :mod:`ultradict_ng.layout`.
"""

from .errors import (
    AlreadyExists,
    Closed,
    CorruptSegment,
    IncompatibleLayout,
    InvalidName,
    LockTimeout,
    NotFound,
    OutOfSpace,
    ParameterMismatch,
    PathGone,
    SharedDictError,
    Unlinked,
    UnsupportedType,
)
from .lock import SharedLock
from .shareddict import SharedDict
from .store import unlink_by_name

__version__ = "0.1.0"

__all__ = [
    "SharedDict",
    "SharedLock",
    "unlink_by_name",
    "SharedDictError",
    "AlreadyExists",
    "NotFound",
    "Unlinked",
    "InvalidName",
    "ParameterMismatch",
    "CorruptSegment",
    "IncompatibleLayout",
    "LockTimeout",
    "Closed",
    "UnsupportedType",
    "OutOfSpace",
    "PathGone",
    "__version__",
]
