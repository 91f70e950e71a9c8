"""The compiled helper's seam (internal).

``_native`` is the optional C extension (typed by ``_native.pyi``);
``twins`` holds its pure-Python twins, with the same names and results.
Nobody imports either directly: :mod:`ultradict_ng.speedups` picks one.
"""
