"""``python -m perf``: see :mod:`perf`."""

# Spawned children do not re-import a package's __main__ (multiprocessing skips
# "*.__main__"), but keep this module free of side effects all the same.
if __name__ == "__main__":
    import sys

    from perf.cli import main

    sys.exit(main())
