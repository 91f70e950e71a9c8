"""Helpers of tests/test_django_cache.py: the settings and the runner of Django's own
cache suite (Django's test code itself is downloaded at test time, never stored here),
and the worker functions of the multi-process tests."""
