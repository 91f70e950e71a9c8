"""``doctor``: can this machine run ultradict_ng well, and what will bite?

Each check is ``(name, level, message)`` with level "ok", "warn" or "fail".
The thresholds come from what goes wrong in practice: a container's default
``/dev/shm`` is 64 MiB (Docker), which one large array or a few dumps fill;
a full ``/dev/shm`` turns every write that needs a page into ``OutOfSpace``.
"""

from __future__ import annotations

import os
import platform
import sys
from argparse import Namespace

from .. import speedups
from .._platform.listing import listable
from .._platform.segments import SHM_DIR
from .._shm import layout as L
from .._shm import waiting
from . import paths, render

__all__ = ["checks", "cmd_doctor"]

Check = tuple[str, str, str]
#: Below this, /dev/shm is "container-sized" (Docker's default is 64 MiB).
SMALL_SHM = 1 << 30
#: Free space below this (or below 10% of the size) is worth a warning.
LOW_FREE = 64 << 20


def _shm_checks() -> list[Check]:
    if not listable():
        if sys.platform == "darwin":
            return [
                (
                    "shared memory",
                    "warn",
                    "macOS: no /dev/shm to list, so `ls` and `clean` cannot "
                    "work; names are limited to 20 characters; waiters poll (no futex)",
                )
            ]
        return [("shared memory", "fail", f"{SHM_DIR} does not exist here")]
    st = os.statvfs(SHM_DIR)
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    out: list[Check] = []
    if total < SMALL_SHM:
        out.append(
            (
                "/dev/shm size",
                "warn",
                f"{render.size(total)}: container-sized (Docker's default is 64 MiB); large "
                "values and dumps need room -- `docker run --shm-size=2g` or mount a bigger tmpfs",
            )
        )
    else:
        out.append(("/dev/shm size", "ok", render.size(total)))
    if free == 0:
        out.append(
            (
                "/dev/shm free",
                "fail",
                "full: every write that needs a page raises OutOfSpace; "
                "`ultradict-ng clean` removes what no live process uses",
            )
        )
    elif free < LOW_FREE or free < total // 10:
        out.append(("/dev/shm free", "warn", f"{render.size(free)} of {render.size(total)}: nearly full"))
    else:
        out.append(("/dev/shm free", "ok", f"{render.size(free)} of {render.size(total)}"))
    return out


def checks() -> list[Check]:
    out = _shm_checks()
    impl = speedups.IMPLEMENTATION
    if impl == "native":
        out.append(("compiled helper", "ok", "in use (_native)"))
    else:
        out.append(
            (
                "compiled helper",
                "warn",
                f"not in use: the {impl!r} fallback runs (reads are the same, writes and the lock "
                "are slower); reinstall with a C compiler present to build it",
            )
        )
    if waiting.MODE == "futex":
        out.append(("waiting", "ok", "futex: waiters sleep in the kernel"))
    else:
        out.append(
            (
                "waiting",
                "warn",
                "polling with back-off (no futex here, or ULTRADICT_NG_WAIT=poll): "
                "wake-ups are slower and idle waiters cost some CPU",
            )
        )
    version = sys.version_info
    if version >= (3, 9):
        out.append(("python", "ok", platform.python_version()))
    else:  # pragma: no cover - the package does not install there
        out.append(("python", "fail", f"{platform.python_version()}: ultradict_ng needs 3.9 or newer"))
    if sys.platform.startswith("linux"):
        proc = os.path.exists(f"/proc/{os.getpid()}/stat")
        out.append(
            (
                "os",
                "ok" if proc else "warn",
                f"Linux {platform.release()}"
                + (
                    "" if proc else ": no /proc, so dead lock holders and users cannot be told from live ones"
                ),
            )
        )
    elif sys.platform == "darwin":
        out.append(("os", "warn", "macOS: should work, not tested in CI (see docs/guarantees.md, Platforms)"))
    else:
        out.append(("os", "fail", f"{sys.platform}: not supported (no POSIX shared memory)"))
    out.append(("layout", "ok", f"version {L.LAYOUT_VERSION}: dicts of other versions are refused"))
    return out


def cmd_doctor(args: Namespace) -> int:
    found = checks()
    for path in args.paths:  # dicts kept in files: their files checked, read-only
        found += [(f"{path}: {n}", lv, m) for n, lv, m in paths.file_checks(path)]
    if args.json:
        print(render.dumps([{"check": n, "level": lv, "message": m} for n, lv, m in found]))
    else:
        width = max(len(n) for n, _, _ in found)
        for name, level, message in found:
            print(f"{level.upper():<4}  {name:<{width}}  {message}")
    return 1 if any(lv == "fail" for _, lv, _ in found) else 0
