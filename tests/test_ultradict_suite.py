"""UltraDict 0.0.6's own test module, as shipped, runs against the drop-in.

The sdist of ``UltraDict==0.0.6`` is downloaded from PyPI when the tests run
(once per session; its code is never committed here) and only its
``tests/`` and ``examples/`` are unpacked: UltraDict's implementation is not
on disk, so the one ``UltraDict`` module a subprocess can import is a
one-line shim that re-exports ``ultradict_ng.compat.UltraDict``.
``tests/tests.py`` then runs unmodified, under unittest, in a subprocess
started from the unpacked tree (its example tests run ``examples/*.py`` by
relative path, and those put ``..`` on ``sys.path``, which holds no
``UltraDict`` either).

Expected: 13 of its 14 tests pass.  ``test_cleanup`` fails: it counts the
process's open files (4 for one dict, 12 for a nested one) -- UltraDict's
internals, not its API (MIGRATING.md, "Not carried over").  Its
``examples/oop.py`` fails by design: it installs an UltraDict as an object's
``__dict__``, which needs a ``dict`` subclass (MIGRATING.md says why ours is
not one and what to write instead).

Without network (or pip) the download fails: a skip, except with
``CI=true``, where it is a failure -- CI reaches PyPI, and a green skip
there would hide a broken drop-in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import ultradict_ng
from tests.sdists import fetch_sdist, run_suite
from ultradict_ng._shm import layout as L
from ultradict_ng._shm.survey import report

VERSION = "0.0.6"
#: What of the sdist is unpacked: its test module and the examples it runs.
WANTED = ("tests/tests.py", "tests/__init__.py", "examples/")
#: The one test expected to fail, and why (its assertion counts open files).
KNOWN_FAILURE = "test_cleanup"
#: Dict names UltraDict's tests and examples hard-code (the rest are generated).
FIXED_NAMES = ("ultra_test", "my_name", "shared-class")
SHM = "/dev/shm"
#: The shim: the drop-in under UltraDict's module name.
SHIM = "from ultradict_ng.compat import UltraDict  # noqa: F401\n"
#: Runs tests.py's module under unittest and prints each test's outcome as one JSON line
#: (sturdier than parsing the verbose report, which a stray warning can interleave).
RUNNER = r"""
import importlib.util, json, sys, unittest
spec = importlib.util.spec_from_file_location("ultradict_tests", "tests/tests.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)

class Result(unittest.TextTestResult):
    outcomes = {}
    def addSuccess(self, test):
        super().addSuccess(test); self.outcomes[test._testMethodName] = ["ok", ""]
    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes[test._testMethodName] = ["FAIL", self._exc_info_to_string(err, test)]
    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes[test._testMethodName] = ["ERROR", self._exc_info_to_string(err, test)]
    def addSkip(self, test, reason):
        super().addSkip(test, reason); self.outcomes[test._testMethodName] = ["skip", reason]

suite = unittest.defaultTestLoader.loadTestsFromModule(module)
unittest.TextTestRunner(verbosity=2, resultclass=Result, stream=sys.stdout).run(suite)
print("OUTCOMES " + json.dumps(Result.outcomes), flush=True)
"""


@pytest.fixture(scope="session")
def ultradict_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """``(suite, shim)``: the unpacked tests/ and examples/, and the shim's directory."""
    root = tmp_path_factory.mktemp("ultradict_suite")
    suite = fetch_sdist("UltraDict", VERSION, root, lambda rel: rel if rel.startswith(WANTED) else None)
    assert (suite / "tests" / "tests.py").is_file() and (suite / "examples" / "oop.py").is_file()
    shim = root / "shim"
    shim.mkdir()
    (shim / "UltraDict.py").write_text(SHIM)
    return str(suite), str(shim)


def _env(shim: str) -> dict[str, str]:
    """The shim first on the path, then the ultradict_ng under test (children inherit it)."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(ultradict_ng.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (shim, package_root, env.get("PYTHONPATH", "")) if p)
    return env


def _run(cmd: list[str], cwd: str, shim: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``cmd`` with the shim on the path, in its own process group (its spawned
    workers end with it: a live one would keep the pipes open)."""
    return run_suite(cmd, cwd, _env(shim), timeout)


# -- what the run leaves in shared memory -------------------------------------------------


def _shm_entries() -> set[str]:
    return set(os.listdir(SHM)) if os.path.isdir(SHM) else set()


def _ours(base: str) -> bool:
    return base in FIXED_NAMES or base.startswith(L.GENERATED_PREFIX)


def _dead(name: str) -> bool:
    """True if no live process uses the dict ``name`` (a leftover, not a live dict of
    another program that happens to share a generated-name prefix)."""
    rep = report(name, load_keys=False)
    return rep is None or not rep.live_users


def _remove_stale_fixed_names() -> None:
    """A fixed name left by an earlier run that was killed would be attached to instead
    of created (UltraDict's nested example passes no ``create=``): remove it if dead."""
    for name in FIXED_NAMES:
        if os.path.exists(os.path.join(SHM, name)) and _dead(name):
            ultradict_ng.unlink_by_name(name)


@pytest.fixture
def shm_guard() -> Iterator[None]:
    """Fail the test if the run left dicts behind (and remove them): every dict
    UltraDict's tests make is auto-unlinked when its process exits."""
    _remove_stale_fixed_names()
    before = _shm_entries()
    started = time.time()
    yield
    bases = {e.split("@", 1)[0] for e in _shm_entries() - before}
    leftovers = []
    for base in sorted(b for b in bases if _ours(b)):
        try:
            created = os.stat(os.path.join(SHM, base)).st_ctime
        except OSError:
            created = started  # only derived segments: an orphan of this run
        if created >= started - 1 and _dead(base):
            leftovers.append(base)
            ultradict_ng.unlink_by_name(base)
    assert not leftovers, f"UltraDict's tests left dicts in {SHM}: {leftovers}"


# -- the tests ----------------------------------------------------------------------------


@pytest.mark.skipif(not os.path.isdir(SHM), reason="the leftover check lists /dev/shm (Linux)")
def test_ultradict_test_module_as_shipped(ultradict_tree: tuple[str, str], shm_guard: None) -> None:
    suite, shim = ultradict_tree
    done = _run([sys.executable, "-c", RUNNER], suite, shim, timeout=900)
    report_text = f"stdout:\n{done.stdout[-8000:]}\nstderr:\n{done.stderr[-8000:]}"
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("OUTCOMES ")]
    assert lines, f"UltraDict's test module did not finish (exit {done.returncode})\n{report_text}"
    outcomes: dict[str, list[str]] = json.loads(lines[-1][len("OUTCOMES ") :])
    assert len(outcomes) == 14, sorted(outcomes)
    passed = sorted(t for t, (status, _) in outcomes.items() if status == "ok")
    others = {t: o for t, o in outcomes.items() if o[0] != "ok"}
    assert list(others) == [KNOWN_FAILURE], f"{len(passed)} passed; not passing: {others}\n{report_text}"
    assert len(passed) == 13
    status, detail = others[KNOWN_FAILURE]
    # It counts open files with psutil; where psutil is not installed it fails on the import.
    assert (status == "FAIL" and "file handle count" in detail) or (
        status == "ERROR" and "No module named 'psutil'" in detail
    ), detail


@pytest.mark.skipif(not os.path.isdir(SHM), reason="the leftover check lists /dev/shm (Linux)")
def test_oop_example_fails_as_documented(ultradict_tree: tuple[str, str], shm_guard: None) -> None:
    """examples/oop.py makes an UltraDict an object's ``__dict__``: Python accepts
    only a ``dict`` (or a subclass) there, and ours is not one (MIGRATING.md)."""
    suite, shim = ultradict_tree
    done = _run([sys.executable, "examples/oop.py"], suite, shim, timeout=120)
    assert done.returncode == 1, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.stderr.splitlines()[-1] == (
        "TypeError: __dict__ must be set to a dictionary, not a 'UltraDict'"
    ), done.stderr
