"""Smoke test of workload 9 (large values to another process): it runs, records, cleans up.

``python -m perf --quick --only big`` with the contenders that need neither a
server nor the ``perf`` extra: ultradict_ng, raw shared memory, pickle 5
out-of-band buffers and multiprocessing.Pipe.  No timing is asserted (the
machine is noisy); only that every cell is there, measured or explained, with
the right value read back and nothing left in /dev/shm.  ultradict_ng's numpy
and view cells may be *unavailable* (its public API refusing them is a valid
answer); without numpy installed the numpy cells are unavailable for all.
Dict names carry this test session's prefix so the suite's leak check sees them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SESSION

ROOT = Path(__file__).resolve().parent.parent
CONTENDERS = ["ultradict_ng", "shm", "pickle5", "pipe"]
SIZES = [1 << 20, 10 << 20]
KINDS = ["numpy", "bytes", "view"]
METRICS = ["write", "1st read", "2nd read", "RSS added"]


@pytest.mark.slow
def test_perf_big_quick(tmp_path: Path) -> None:
    out = tmp_path / "results"
    cmd = [
        sys.executable,
        "-m",
        "perf",
        "--quick",
        "--only",
        "big",
        "--contenders",
        ",".join(CONTENDERS),
        "--name-prefix",
        "t" + SESSION,
        "--out",
        str(out),
        "--no-plot",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"

    data = json.loads((out / "latest.json").read_text())
    assert data["status"] == "complete"
    assert not data["leaks"], data["leaks"]
    assert not data["alerts"], data["alerts"]
    assert "== 9. large values" in proc.stdout
    # The reader processes share the harness's resource tracker: nothing may unbalance it.
    for bad in ("resource_tracker", "leaked shared_memory", "KeyError"):
        assert bad not in proc.stderr, proc.stderr
    numpy_here = importlib.util.find_spec("numpy") is not None

    recs = {
        (r["contender"], r["params"]["kind"], r["params"]["value_bytes"], r["params"]["metric"]): r
        for r in data["records"]
        if r["workload"] == "big"
    }
    for c in CONTENDERS:
        for kind in KINDS:
            for size in SIZES:
                cell = [recs.get((c, kind, size, m)) for m in METRICS]
                assert all(cell), f"missing records for {c} {kind} {size}"
                for r in cell:
                    assert r["error"] is None, (c, kind, size, r["error"])
                first = cell[0]
                if first["skipped"]:
                    assert first["skipped"].startswith("unavailable: "), first["skipped"]
                    assert not first["values"]
                    continue
                assert first["ok"] is True, (c, kind, size)  # the reader got the value written
                for r in cell:
                    assert len(r["values"]) == 1 and r["median"] is not None
                for r in cell[:3]:
                    assert r["median"] > 0  # seconds
                raw = recs[(c, kind, size, "1st read")]["raw"][0]
                assert raw["bytes"] == size and raw["wrong"] is None

    def measured(c: str, kind: str) -> bool:
        return all(not recs[(c, kind, s, "write")]["skipped"] for s in SIZES)

    # Shared memory by hand and pickle 5 carry everything (numpy when it is installed).
    for c in ("shm", "pickle5"):
        assert measured(c, "bytes") and measured(c, "view")
        assert measured(c, "numpy") == numpy_here
    assert measured("pipe", "bytes") and not measured("pipe", "view")
    assert measured("pipe", "numpy") == numpy_here
    assert measured("ultradict_ng", "bytes")  # bytes work before and after zero-copy values
    if numpy_here:
        zero_copy = recs[("shm", "numpy", 10 << 20, "RSS added")]["median"]
        assert zero_copy < 5, zero_copy  # MiB: the reader touched 2 elements of 10 MiB
