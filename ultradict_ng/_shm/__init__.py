"""The shared-memory engine (internal): one dict as POSIX shared-memory
segments, under the protocol of :mod:`ultradict_ng._shm.layout`.

``store`` is the engine (what the facade calls); ``reader``/``writer`` replay
and append the update stream; ``control``, ``mapping``, ``segment`` and
``blobs`` hold the segments; ``lock``, ``waiting`` and ``users`` the words
processes share; ``cleanup``, ``peek`` and ``survey`` serve removal and the
command line.
"""
