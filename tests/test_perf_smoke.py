"""Smoke test of the benchmark harness: ``python -m perf`` runs and writes its JSON.

Only contenders that need neither the ``perf`` extra nor a server (ultradict_ng
and a plain dict) and cheap workloads, so this stays fast and self-contained.
Dicts carry this test session's name prefix (``t<session>`` + 12 hex digits), so
the suite's leak check (conftest.py) sees any segment the run would leave behind.
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


@pytest.mark.slow
def test_perf_quick_smoke(tmp_path: Path) -> None:
    out = tmp_path / "results"
    cmd = [
        sys.executable,
        "-m",
        "perf",
        "--quick",
        "--only",
        "read,write,lock",
        "--contenders",
        "ultradict_ng,dict",
        "--name-prefix",
        "t" + SESSION,
        "--out",
        str(out),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"

    data = json.loads((out / "latest.json").read_text())
    assert data["status"] == "complete"
    assert data["machine"]["cpu_count"] >= 1
    ng = {r["workload"]: r for r in data["records"] if r["contender"] == "ultradict_ng"}
    for wl in ("read", "write", "lock"):
        rec = ng[wl]
        assert rec["error"] is None, rec["error"]
        assert isinstance(rec["median"], float) and rec["median"] > 0
        assert len(rec["values"]) == data["options"]["repeat"] == 3
        assert all(r["ops"] > 0 and r["seconds"] > 0 for r in rec["raw"])
    assert ng["lock"]["ok"] is True  # exact count after the locked increments
    assert not data["leaks"], data["leaks"]
    assert "== 1. hot-key read" in proc.stdout and "== targets" in proc.stdout
    if importlib.util.find_spec("matplotlib") is not None:  # the plot is optional
        assert (out / "latest.png").stat().st_size > 0


@pytest.mark.slow
def test_perf_wakeup_quick_smoke(tmp_path: Path) -> None:
    """Workload 10's wake-up latency part, quick mode, ultradict_ng and multiprocessing.Event.

    (The idle-waiter and lock parts take fixed wall times of seconds each: left to
    ``python -m perf --quick`` in CI.)
    """
    from ultradict_ng import SharedDict

    out = tmp_path / "results"
    cmd = [
        sys.executable,
        "-m",
        "perf",
        "--quick",
        "--only",
        "wakeup",
        "--wake-parts",
        "latency",
        "--contenders",
        "ultradict_ng,event",
        "--name-prefix",
        "t" + SESSION,
        "--out",
        str(out),
        "--no-plot",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"

    data = json.loads((out / "latest.json").read_text())
    assert data["status"] == "complete"
    assert not data["leaks"], data["leaks"]
    rows = {r["contender"]: r for r in data["records"] if r["workload"] == "wakeup"}
    assert set(rows) == {"ultradict_ng", "ultradict_ng:poll", "ultradict_ng:spin", "event"}
    measured = ["ultradict_ng:spin", "event"]
    if hasattr(SharedDict, "wait_for_change"):
        measured += ["ultradict_ng", "ultradict_ng:poll"]
    else:
        assert "does not exist" in rows["ultradict_ng"]["skipped"]
    for key in measured:
        rec = rows[key]
        assert rec["error"] is None, rec["error"]
        assert len(rec["values"]) == rec["params"]["rounds"] == 200, key
        assert all(0 < v < 5 for v in rec["values"]), key
        assert rec["params"]["lost"] == 0 and rec["ok"] is True, key
        assert not rec["params"]["waiter"]["imported_before_env"], key
    assert (
        rows["ultradict_ng:poll"].get("skipped")
        or rows["ultradict_ng:poll"]["params"]["waiter"]["env"] == "poll"
    )
    assert "== 10. wake-up" in proc.stdout and "wake-up median <= 50 µs" in proc.stdout


@pytest.mark.slow
def test_perf_transactions_quick_smoke(tmp_path: Path) -> None:
    """Workload 13 on shared memory (Redis rows: skipped or measured, never failed)."""
    out = tmp_path / "results"
    cmd = [
        sys.executable,
        "-m",
        "perf",
        "--quick",
        "--only",
        "transactions",
        "--name-prefix",
        "t" + SESSION,
        "--out",
        str(out),
        "--no-plot",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    data = json.loads((out / "latest.json").read_text())
    assert data["status"] == "complete" and not data["leaks"], data["leaks"]
    rows = {
        (r["params"]["backend"], r["params"]["mode"]): r
        for r in data["records"]
        if r["workload"] == "transactions"
    }
    for mode in ("transaction", "lock", "plain"):
        rec = rows[("shm", mode)]
        assert rec["error"] is None and rec["ok"] is True, rec
        assert len(rec["values"]) == 3 and rec["median"] > 0
        assert rows[("redis", mode)]["error"] is None
    assert "== 13. 2,000 writes" in proc.stdout
    assert "transactions: 2,000 writes in one transaction" in proc.stdout


def test_perf_bigdict_quick_smoke(tmp_path: Path) -> None:
    """Workload 14 at 10k keys: SharedDict, the table and py-lmdb each load the
    dict and a fresh reader reads it back right (no alert), the loading
    process's overwrites are measured with their 1,000-key reference, with
    the table of results, the targets and its panel of the plot."""
    out = tmp_path / "results"
    cmd = [
        sys.executable,
        "-m",
        "perf",
        "--quick",
        "--only",
        "bigdict",
        "--name-prefix",
        "t" + SESSION,
        "--out",
        str(out),
        "--repeat",
        "1",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    data = json.loads((out / "latest.json").read_text())
    assert data["status"] == "complete" and not data["leaks"], data["leaks"]
    assert not data.get("alerts"), data.get("alerts")
    rows = {
        (r["params"]["contender"], r["params"]["metric"]): r
        for r in data["records"]
        if r["workload"] == "bigdict"
    }
    for contender in ("ultradict_ng", "table", "lmdb"):
        for metric in ("load", "open", "random", "hot", "private", "items"):
            rec = rows[(contender, metric)]
            assert rec["error"] is None and rec.get("skipped") is None, rec
            assert rec["median"] is not None and (rec["median"] > 0 or metric == "private"), rec
        assert rows[(contender, "hot")]["params"]["dict_hot"]
    overwrite = rows[("ultradict_ng", "overwrite")]  # (the loading process's, against a 1,000-key dict)
    assert overwrite["median"] > 0 and len(overwrite["params"]["small"]) == len(overwrite["values"]) == 1
    assert overwrite["params"]["placed"][0] > 0  # (the same with a len() after: the placing's cost shown)
    assert "overwrites by the loading process >= 0.8x" in proc.stdout
    assert "with a len() after: " in proc.stdout
    assert "== 14. a big dict" in proc.stdout
    assert "big dict (10,000 keys): random-key reads" in proc.stdout
    if "no plot" not in proc.stdout:
        assert (out / "latest.png").stat().st_size > 10_000


@pytest.mark.slow
def test_perf_cache_quick_smoke(tmp_path: Path) -> None:
    """Workload 15 in quick mode: ours measured in every part, peers measured or
    skipped (never failed), the exact LRUs agree, the run's JSON (and plot)."""
    out = tmp_path / "results"
    cmd = [
        sys.executable,
        "-m",
        "perf",
        "--quick",
        "--only",
        "cache",
        "--name-prefix",
        "t" + SESSION,
        "--out",
        str(out),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    data = json.loads((out / "latest.json").read_text())
    assert data["status"] == "complete" and not data["leaks"], data["leaks"]
    assert not data["alerts"], data["alerts"]
    rows = {(r["params"]["part"], r["params"]["contender"], r["case"]): r for r in data["records"]}
    for rec in rows.values():
        assert rec["error"] is None, rec
    ours = [r for (part, c, _), r in rows.items() if c in ("ours", "cached")]
    assert len(ours) == 9  # 2 Django, 4 plain, 1 hit ratio (quick: a=0.9), 2 stampede
    for r in ours:
        if r["params"]["part"] == "django" and importlib.util.find_spec("django") is None:
            continue
        assert r.get("skipped") is None and r["median"] is not None and r["median"] > 0, r
    if importlib.util.find_spec("cachelib") is not None:
        for op in ("get", "set"):
            assert rows[("cachelib", "cl_ours", f"cachelib API, dict value: {op}")]["median"] > 0
    hit = {c: r["median"] for (part, c, _), r in rows.items() if part == "hit"}
    if hit.get("cachetools") is not None:
        assert hit["cachetools"] == hit["exact"]  # both exact LRU on the same trace
    lru = rows[("stampede", "lru_cache", "stampede: computations")]
    assert lru["values"] == [8.0] * len(lru["values"])  # one per process, the reference
    assert "== 15. shared cache" in proc.stdout and "cache: stampede" in proc.stdout
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "latest.png").stat().st_size > 10_000
