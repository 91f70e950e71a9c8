"""Adapters that make :class:`ultradict_ng.cache.SharedCache` the cache of a framework.

Each submodule imports its framework and nothing here imports them: import the one
you configure (Django: ``ultradict_ng.integrations.django.SharedCache`` as a cache
``BACKEND``).
"""
