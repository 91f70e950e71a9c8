"""The benchmark harness's registry: every workload registered once, targets evaluated from data.

No workload runs here (the smoke tests run them); this checks what the
command line, the tables and the targets are derived from.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

registry = pytest.importorskip("perf.registry")


def _rec(wl: str, case: str, contender: str, median: float, **kw: Any) -> dict[str, Any]:
    return {
        "workload": wl,
        "case": case,
        "contender": contender,
        "label": contender,
        "unit": kw.pop("unit", "ops/s"),
        "median": median,
        "n": 3,
        "params": kw.pop("params", {}),
        "ok": kw.pop("ok", None),
    }


def test_every_workload_registered_once() -> None:
    workloads = registry.load()
    assert not registry._FAILED, registry._FAILED
    numbers = [w.number for w in workloads]
    assert numbers == list(range(1, 18))  # a module that fails to import or register is caught
    names = {w.name for w in workloads}
    aliases = registry.aliases()
    assert not names & (set(aliases) - {str(n) for n in numbers} - names)
    for w in workloads:
        assert w.title and callable(w.run)
        for t in w.targets:  # a target reads its own workload's records
            picks = t.num if isinstance(t.num, tuple) else (t.num,)
            for p in [*picks, t.den]:
                assert p is None or p.workload == w.name, (w.name, t.text)
            assert t.measure is not None or t.num is not None, t.text


def test_ratio_target_passes_misses_and_says_why() -> None:
    t = registry.Target(
        "reads >= 4x the peer",
        4.0,
        num=registry.pick("read", case="hot key"),
        den=registry.pick("read", "peer", case="hot key"),
    )
    recs = [_rec("read", "hot key", "ultradict_ng", 40.0), _rec("read", "hot key", "peer", 8.0)]
    row = t.evaluate(recs, quick=False)
    assert row["status"] == "PASS" and row["measured"] == 5.0 and "caveat" not in row
    assert row["need"] == ">= 4x" and "ultradict_ng" in row["detail"] and "peer" in row["detail"]
    recs[1]["median"] = 20.0
    assert t.evaluate(recs, quick=True)["status"] == "MISS"
    assert t.evaluate(recs[:1], quick=False)["status"] == "n/a"


def test_fallback_pick_adds_a_caveat_and_exact_is_checked() -> None:
    t = registry.Target(
        "1M-key attach faster than the peer's",
        1.0,
        num=tuple(registry.pick("attach", "peer", case=c) for c in ("1M keys", "1k keys")),
        den=registry.pick("attach"),
        strict=True,
        exact=True,
    )
    recs = [_rec("attach", "1k keys", "peer", 2.0, ok=True), _rec("attach", "1k keys", "ultradict_ng", 1.0)]
    row = t.evaluate(recs, quick=False)
    assert row["measured"] == 2.0 and row["status"] == "PASS" and "1k keys" in row["caveat"]
    recs[0]["ok"] = False  # the count check failed: the ratio alone does not pass
    assert t.evaluate(recs, quick=False)["status"] == "MISS"


def test_bound_target_in_its_unit() -> None:
    t = registry.Target("wake-up <= 50 µs", 50e-6, num=registry.pick("wakeup"), at_most=True, unit="s")
    row = t.evaluate([_rec("wakeup", "x", "ultradict_ng", 20e-6, unit="s")], quick=False)
    assert row["status"] == "PASS" and row["measured_text"] == "20 µs" and row["need"] == "<= 50 µs"
    row = t.evaluate([_rec("wakeup", "x", "ultradict_ng", 80e-6, unit="s")], quick=False)
    assert row["status"] == "MISS"


def test_pyperf_suite_round_trips(tmp_path: Path) -> None:
    pyperf = pytest.importorskip("pyperf")
    from perf import report

    recs = [_rec("read", "hot key", "ultradict_ng", 4.0), _rec("attach", "1k", "peer", 0.5, unit="s")]
    recs[0]["values"], recs[1]["values"] = [4.0, 5.0], [0.5]
    path = os.path.join(tmp_path, "s.json")
    assert report.write_pyperf(path, recs) is None
    suite = pyperf.BenchmarkSuite.load(path)
    got = {b.get_name(): b.get_values() for b in suite.get_benchmarks()}
    assert got == {"read: hot key: ultradict_ng": (0.25, 0.2), "attach: 1k: peer": (0.5,)}


def test_perf_stays_small() -> None:
    lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "perf").glob("*.py"))
    assert lines < 8000, f"perf/ has {lines} lines"


def test_failed_measure_is_a_miss_without_a_number() -> None:
    t = registry.Target("stampede: 1 computation", 1.0, at_most=True, measure=lambda r: (float("nan"), "x"))
    row = t.evaluate([], quick=False)
    assert row["status"] == "MISS" and row["measured"] is None  # (NaN is no JSON)
