"""The UltraDict drop-in: ``from ultradict_ng import UltraDict`` (or
``from ultradict_ng.compat import UltraDict, UltraLock, Exceptions, ...``).

The class and how it opens a dict are in :mod:`.ultradict`, UltraDict's
exception classes and the mapping from ours in :mod:`.errors`, its lock API
in :mod:`.lock`, its log module API (``UltraDict.log``) in :mod:`.log`.
``MIGRATING.md`` says what differs and why.
"""

import sys as _sys

from . import errors
from .errors import _rebuild_error  # noqa: F401  (named by exceptions pickled when compat.py held them)
from .lock import DEFAULT_SLEEP_TIME
from .ultradict import *  # noqa: F401,F403
from .ultradict import _reattach  # noqa: F401  (named by handles pickled before 0.2)
from .ultradict import __all__ as _all

__all__ = [*_all, "DEFAULT_SLEEP_TIME"]

# Exceptions pickled by 0.1 (a Pool's results, a queue's items kept on disk) name
# their classes and ``_rebuild_error`` in ``ultradict_ng.compat_errors``, this
# package's errors module before it moved here.  Unpickling imports that name:
# importing ``ultradict_ng`` imports this package first, and the import system
# then finds the alias in ``sys.modules`` (tests/test_compat.py loads such pickles).
_sys.modules.setdefault("ultradict_ng.compat_errors", errors)
