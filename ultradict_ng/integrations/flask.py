"""Flask-Caching's ``CACHE_TYPE`` for the shared cache.

    app.config.update(CACHE_TYPE="ultradict_ng.integrations.flask.SharedCache",
                      CACHE_OPTIONS={"name": "myapp-cache"}, CACHE_THRESHOLD=10_000)

Why a module of its own: Flask-Caching builds a backend whose ``CACHE_TYPE``
path contains "cachelib" by calling the class with ``CACHE_ARGS`` and
``CACHE_OPTIONS`` alone, and calls ``factory(app, config, args, kwargs)`` --
the only way its own settings (``CACHE_THRESHOLD``, ``CACHE_KEY_PREFIX``) reach
a backend -- only for a subclass of *its* ``BaseCache``.  This class is
:class:`ultradict_ng.integrations.cachelib.SharedCache` (every method, the
same entries) made such a subclass, under a path without "cachelib".
Importing this module imports Flask-Caching (the ``flask`` extra).
"""

from __future__ import annotations

from flask_caching.backends.base import BaseCache as _FlaskCachingBase

from . import cachelib as _cachelib

__all__ = ["SharedCache"]


class SharedCache(_cachelib.SharedCache, _FlaskCachingBase):
    """The cachelib backend, as Flask-Caching's backend (``factory`` is the cachelib one's)."""
