"""The example scripts run standalone, succeed, and say what they showed.

Each script checks its own claims and exits non-zero when one does not hold.
Every dict an example makes has the example process's pid in its name, so this
test checks for exactly its own leftovers in /dev/shm (the autouse fixture in
conftest.py checks the rest: no child process keeps running).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = [
    "repl_share.py",
    "nested_counters.py",
    "crash_cleanup.py",
    "parallel_writers.py",
    "shared_arrays.py",
]


@pytest.mark.parametrize("script", EXAMPLES)
def test_example_runs(script: str) -> None:
    path = os.path.join(ROOT, "examples", script)
    proc = subprocess.Popen(
        [sys.executable, path], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    mine = re.compile(rf".*-{proc.pid}(@\w+)?")
    leftovers = [e for e in os.listdir("/dev/shm") if mine.fullmatch(e)]
    for entry in leftovers:
        os.unlink(os.path.join("/dev/shm", entry))
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert stdout.strip(), f"{script} printed nothing\nstderr:\n{stderr}"
    assert not leftovers, f"{script} left shared memory behind: {leftovers}"
