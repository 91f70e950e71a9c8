"""Helpers of tests/test_cachelib_cache.py: the workers its spawned processes run,
and the module it drops into cachelib's own unpacked tests/ to run them."""
