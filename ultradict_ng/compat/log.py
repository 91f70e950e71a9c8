"""``UltraDict.log``: UltraDict's log module API, over the ``ultradict_ng`` logger.

UltraDict's class attribute ``log`` is a *module*, not a ``logging.Logger``:
in its source tree the project's own small log module, whose API is
``log.set_level(log.Levels.error)``; code written for UltraDict (its own test
suite, for one) calls exactly that.  This module gives the same names, and
makes them act on the one logger our warnings go to (``ultradict_ng``):
setting the level here never touches other loggers of the program.

Every other attribute of ``logging.Logger`` (``setLevel``, ``addHandler``,
``level`` ...) is forwarded to that logger, so code that treated
``UltraDict.log`` as our logger keeps working.  The package on PyPI ships
without UltraDict's log module and falls back to the stdlib ``logging``
module; ``logging``'s module-level functions (``disable``, ``basicConfig``)
are deliberately not offered here: they act on the whole program, and code
that wants them imports ``logging`` itself (docs/migrating.md).
"""

from __future__ import annotations

import enum
import logging
from typing import Any, Union

__all__ = ["Levels", "set_level", "logger", "debug", "info", "warning", "error", "exception", "critical"]

#: The logger this module speaks for: where every ultradict_ng warning goes.
logger = logging.getLogger("ultradict_ng")


class Levels(enum.IntEnum):
    """UltraDict's level names (``Levels.error``), valued as ``logging``'s levels."""

    debug = logging.DEBUG
    info = logging.INFO
    warning = logging.WARNING
    error = logging.ERROR
    critical = logging.CRITICAL


def set_level(level: Union[Levels, int, str]) -> None:
    """Show messages of ``level`` and above: a :class:`Levels` member, a
    ``logging`` level number, or a level's name in any case (``"error"``)."""
    if isinstance(level, str):
        try:
            level = Levels[level.lower()]
        except KeyError:
            raise ValueError(
                f"unknown log level {level!r}; one of {', '.join(m.name for m in Levels)}"
            ) from None
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"a log level is a Levels member, an int or a name, not {level!r}")
    logger.setLevel(int(level))


def debug(msg: object, *args: Any, **kwargs: Any) -> None:
    kwargs.setdefault("stacklevel", 2)  # the record names our caller, not this function
    logger.debug(msg, *args, **kwargs)


def info(msg: object, *args: Any, **kwargs: Any) -> None:
    kwargs.setdefault("stacklevel", 2)
    logger.info(msg, *args, **kwargs)


def warning(msg: object, *args: Any, **kwargs: Any) -> None:
    kwargs.setdefault("stacklevel", 2)
    logger.warning(msg, *args, **kwargs)


def error(msg: object, *args: Any, **kwargs: Any) -> None:
    kwargs.setdefault("stacklevel", 2)
    logger.error(msg, *args, **kwargs)


def exception(msg: object, *args: Any, **kwargs: Any) -> None:
    kwargs.setdefault("stacklevel", 2)
    logger.exception(msg, *args, **kwargs)


def critical(msg: object, *args: Any, **kwargs: Any) -> None:
    kwargs.setdefault("stacklevel", 2)
    logger.critical(msg, *args, **kwargs)


def __getattr__(name: str) -> Any:
    """The rest of the ``Logger`` API (``setLevel``, ``handlers`` ...) from the logger.

    Private and dunder names are not forwarded: the import machinery and
    introspection probe modules for those (``__path__``, ``__wrapped__``) and
    must see this module's own answer, not the logger's.
    """
    if not name.startswith("_"):
        try:
            return getattr(logger, name)
        except AttributeError:
            pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
