"""The example scripts run standalone, succeed, and say what they showed.

Each script checks its own claims and exits non-zero when one does not hold;
the autouse fixture in conftest.py checks that nothing is left in /dev/shm and
no child process keeps running.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = ["repl_share.py", "nested_counters.py", "crash_cleanup.py", "parallel_writers.py"]


@pytest.mark.parametrize("script", EXAMPLES)
def test_example_runs(script: str) -> None:
    path = os.path.join(ROOT, "examples", script)
    out = subprocess.run([sys.executable, path], cwd=ROOT, timeout=120, capture_output=True, text=True)
    assert out.returncode == 0, f"{script} exited {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    assert out.stdout.strip(), f"{script} printed nothing\nstderr:\n{out.stderr}"
