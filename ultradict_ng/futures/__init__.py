"""A drop-in :mod:`concurrent.futures` process pool that moves large arrays
and buffers through shared memory instead of pickling them into a pipe::

    from ultradict_ng.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=2) as ex:
        out = ex.submit(np.add, big, 1).result()   # an array over shared memory

Everything else of :mod:`concurrent.futures` is re-exported, so
``import ultradict_ng.futures as cf`` can replace ``import concurrent.futures
as cf``.  How it works and how long the shared memory of a result lives:
:mod:`ultradict_ng.futures.executor`; the segment layout: ``layout.py``,
"Pool parcels"; crash leftovers: :func:`remove_leftovers` (the command
line's ``ultradict-ng clean`` does the same).
"""

from concurrent.futures import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    CancelledError,
    Executor,
    ThreadPoolExecutor,
    TimeoutError,
    as_completed,
    wait,
)
from concurrent.futures.process import BrokenProcessPool

from .executor import DEFAULT_SHM_THRESHOLD, Future, ProcessPoolExecutor
from .leftovers import ParcelReport, parcels, remove_leftovers

__all__ = [
    "ProcessPoolExecutor",
    "Future",
    "DEFAULT_SHM_THRESHOLD",
    "parcels",
    "ParcelReport",
    "remove_leftovers",
    "BrokenProcessPool",
    "ALL_COMPLETED",
    "FIRST_COMPLETED",
    "FIRST_EXCEPTION",
    "CancelledError",
    "Executor",
    "ThreadPoolExecutor",
    "TimeoutError",
    "as_completed",
    "wait",
]
