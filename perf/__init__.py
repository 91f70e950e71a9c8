"""Side-by-side benchmark harness: ultradict_ng against its peers.

Run from the repository root::

    python -m perf                 # full run (about 15 minutes)
    python -m perf --quick         # about a minute
    python -m perf --only read,write,lock --contenders ultradict_ng,dict
    python -m perf --help

Contenders (``--contenders``): ``ultradict_ng``, ``ultradict_shared``
(``UltraDict(shared_lock=True)``), ``ultradict`` (``UltraDict()``, fork-only
RLock), ``smd`` (shared-memory-dict), ``manager`` (``multiprocessing.Manager().dict()``),
``redis`` (redis-py against a private ``redis-server`` the harness starts, when
the binary exists) and ``dict`` (a plain dict: the ceiling).  Workload 9 adds
ways to move one large value that are no dicts: ``shm`` (raw
``multiprocessing.shared_memory`` + a copy), ``pickle5`` (pickle protocol 5 with
out-of-band buffers in a segment), ``sharedarray`` (PyPI SharedArray), ``ippo``
(InterProcessPyObjects), ``pipe`` and ``queue`` (multiprocessing); they run
only there, and of the dicts only ultradict_ng and UltraDict(shared_lock=True)
run there.  Workload 10 adds ``event`` and ``condition`` (multiprocessing.Event and
Condition) and runs only them, ultradict_ng, ``redis`` (pub/sub) and ``pipe``.
Workload 11 has contenders of its own, process pools: ``stdlib``
(``concurrent.futures.ProcessPoolExecutor``), ``npshmex``
(``npshmex.ProcessPoolExecutor``), ``handwritten`` (the standard pool with
``multiprocessing.shared_memory.SharedMemory`` managed by hand) and
``ultradict_ng`` (``ultradict_ng.futures.ProcessPoolExecutor``).
Workload 12 compares ultradict_ng's Redis backend (``SharedDict(...,
backend="redis://...")``, both read modes) with ``redis`` (raw redis-py GET/SET),
``pottery`` (``RedisDict``, ``Redlock``) and ``redis_dict`` (redis-dict's
``RedisDict``), on the run's one private redis-server.
Peers are imported lazily; a missing one is skipped with a note.

Workloads (``--only``, by name or number): 1 ``read``, 2 ``write``, 3 ``lock``,
4 ``contend``, 5 ``latency``, 6 ``attach``, 7 ``growth``, 8 ``values``, 9 ``big``
(large numpy arrays and bytes to another process: write, first and second
read, the reader's RSS; see :mod:`perf.big`), 10 ``wakeup`` (a write in one process
-> a waiter in another returns: ``wait_for_change`` against polling, Event,
Condition, Pipe and Redis pub/sub; the CPU of 10 idle waiters; ``with d.lock:
d[k] += 1`` in 1-8 processes; in futex and ``ULTRADICT_NG_WAIT=poll`` modes;
see :mod:`perf.wake`), 11 ``pool`` (``submit(add_one, np.ones(int(2e7)))`` round
trip with one worker, and ``list(ex.map(add_one, arrays))`` over 64 arrays of
10 MiB with two, each contender in a fresh driver process; and small tasks without
arrays against the standard pool, see :mod:`perf.pool_small`; see :mod:`perf.pool`), 12
``redis`` (the Redis backend: hot-key reads, writes, 4-process locked increments,
dead-holder takeover, cached-read staleness; see :mod:`perf.redis_backend`), 15
``cache`` (``ultradict_ng.cache`` and its Django backend against LocMemCache,
FileBasedCache, diskcache, Django's RedisCache, shared-memory-dict and cachetools;
hit ratios on Zipf traces; a stampede of 8 processes; own table, targets and
``<out>/cache/latest.{json,png}``; see :mod:`perf.cache`).

Output: tables on stdout, ``<out>/latest.json`` (machine info and every raw
repetition) and ``<out>/latest.png`` (one panel per workload).

Cleanup: every process the harness starts (worker pool, attach probes, the
readers of workload 9, the waiters and lockers of workload 10, the drivers of
workload 11 and their executors' workers, the children of workload 12, the
Manager server, redis-server) is
ended and every segment it creates is unlinked, also after an exception,
Ctrl-C or SIGTERM; /dev/shm is compared before and after and anything left is
reported.  Dict names are
``<prefix><12 hex digits>`` (``--name-prefix``, default ``perf_``; the test suite
uses ``udng_`` so that its leak check sees them).

Modules: :mod:`perf.cli` (options, orchestration, cleanup), :mod:`perf.adapters`
(one adapter per contender), :mod:`perf.workloads`, :mod:`perf.big` (workload 9
and its reader process), :mod:`perf.wake`, :mod:`perf.wake_child` and
:mod:`perf.wake_report` (workload 10: parent side, spawned processes, table and
targets), :mod:`perf.pool`, :mod:`perf.pool_small` and :mod:`perf.pool_tasks`
(workload 11: parent side, table, targets and plot panel; its small-task rows;
the spawned driver and the task functions),
:mod:`perf.redis_backend` and :mod:`perf.redis_children` (workload 12: parent side,
table, targets and plot panel; the spawned children),
:mod:`perf.procs` (code that runs in spawned processes), :mod:`perf.report`
(tables, targets, JSON, plot), :mod:`perf.redis_server`, :mod:`perf.util`.
"""

__all__ = ["main"]


def main(argv=None):  # pragma: no cover - thin wrapper
    from .cli import main as _main

    return _main(argv)
