"""Django settings for running Django's ``tests/cache`` suite against our backend.

The minimum Django's own ``tests/test_sqlite.py`` gives its suite, plus the ``cache``
test app (its ``Poll`` model; no migrations: the test database is made by syncdb).
The caches under test come from the runner's ``override_settings``.
"""

SECRET_KEY = "django_tests_secret_key"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3"}}  # in memory for tests
INSTALLED_APPS = ["cache"]
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
USE_TZ = False
