"""Side-by-side benchmark harness: ultradict_ng against its peers, the same loop for each.

Run from the repository root::

    python -m perf                 # full run
    python -m perf --quick         # short run (CI runs it)
    python -m perf --only read,write,lock --contenders ultradict_ng,dict
    python -m perf --help          # the workloads and contenders

Each workload module registers itself in :mod:`perf.registry`: its name,
number and aliases, its contenders, the targets it checks and how its table
and plot panel read.  :mod:`perf.cli` runs the chosen ones; :mod:`perf.run`
holds a run's state and cleans up after it (every process it starts ended,
every segment, file and server removed, also after Ctrl-C or SIGTERM);
:mod:`perf.report` prints the tables and writes ``<out>/latest.json``,
``latest.pyperf.json`` (for ``python -m pyperf compare_to``) and
``latest.png``.  Peers are imported lazily; a missing one is skipped with the
reason.
"""

__all__ = ["main"]


def main(argv=None):  # pragma: no cover - thin wrapper
    from .cli import main as _main

    return _main(argv)
