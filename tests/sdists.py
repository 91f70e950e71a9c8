"""Other projects' own test suites, from their sdists on PyPI, at test time.

UltraDict's, Django's and cachelib's tests judge our drop-in and backends;
their code is never committed here.  :func:`fetch_sdist` downloads one sdist
and unpacks the files a suite needs.  Without network (or pip) the download
fails: a skip, except with ``CI=true``, where it is a failure -- CI reaches
PyPI, and a green skip there would hide a broken backend.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Callable, Optional

import pytest


def ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def fetch_sdist(
    project: str, version: str, root: Path, place: Callable[[str], Optional[str]], into: str = "suite"
) -> Path:
    """Download ``project==version``'s sdist into ``root`` and unpack into
    ``root/into`` each file whose path inside the archive (below its top
    directory) ``place`` maps to a relative target (None: not wanted)."""
    download = root / "download"
    # The sdist only (tests are not in wheels); its build requirements as wheels,
    # so preparing its metadata never compiles anything.  (Order matters: pip's
    # ``--only-binary :all:`` clears any ``--no-binary`` given before it.)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--only-binary",
        ":all:",
        "--no-binary",
        project,
        "--timeout",
        "30",
        f"{project}=={version}",
        "-d",
        str(download),
    ]
    try:
        proc = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, check=False
        )
        problem = None if proc.returncode == 0 else proc.stdout[-3000:]
    except subprocess.TimeoutExpired:
        problem = "pip download timed out"
    archives = sorted(download.glob("*.tar.gz")) if download.exists() else []
    if problem is None and len(archives) != 1:
        problem = f"expected one sdist in {download}, found {archives}"
    if problem is not None:
        reason = f"cannot download {project}=={version}'s sdist from PyPI: {problem}"
        if ci():
            pytest.fail(
                reason + "\n(CI=true: CI reaches PyPI, so this is a failure, not a skip)", pytrace=False
            )
        pytest.skip(reason)
    out = root / into
    with tarfile.open(archives[0]) as tar:
        for member in tar.getmembers():
            _, _, rel = member.name.partition("/")
            if not member.isfile() or ".." in rel.split("/"):
                continue
            target = place(rel)
            if target is None:
                continue
            data = tar.extractfile(member)
            assert data is not None
            path = out / target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data.read())
    return out


def run_suite(
    cmd: list[str], cwd: str, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a suite's ``cmd`` in its own process group; on timeout end that group
    (only it: its workers too) and fail with what it printed."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd} ran over {timeout} s\nstdout:\n{out[-5000:]}\nstderr:\n{err[-5000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
