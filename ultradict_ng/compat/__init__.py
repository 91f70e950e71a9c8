"""The UltraDict drop-in: ``from ultradict_ng import UltraDict`` (or
``from ultradict_ng.compat import UltraDict, UltraLock, Exceptions, ...``).

The class and how it opens a dict are in :mod:`.ultradict`, UltraDict's
exception classes and the mapping from ours in :mod:`.errors`, its lock API
in :mod:`.lock`, its log module API (``UltraDict.log``) in :mod:`.log`.
``docs/migrating.md`` says what differs and why.
"""

from .lock import DEFAULT_SLEEP_TIME
from .ultradict import *  # noqa: F403
from .ultradict import __all__ as _all

__all__ = [*_all, "DEFAULT_SLEEP_TIME"]
