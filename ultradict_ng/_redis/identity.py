"""Who a process is on a Redis server: the names it writes into the lock,
the ``creator`` field and its connection names (layout: "Lock", "Creating
and removing"), and how a pid is read back out of them.

Its own module because the engine, the opening and the lease all need it,
and none of them should import another for it.
"""

from __future__ import annotations

import socket
from typing import Optional

from .._platform.owner import owner_word
from .._shm import layout as L

__all__ = ["HOST", "start_time", "pid_of_holder"]

#: This machine's name as holders and connection names carry it (no spaces or
#: colons: the fields around it are colon-separated).
HOST = socket.gethostname().replace(" ", "_").replace(":", "_") or "host"


def start_time() -> int:
    """This process's start time in clock ticks (0 without /proc), as owner
    words hold it: with the pid, it tells a process from a later one that
    reused its pid."""
    return owner_word() >> L.PID_BITS


def pid_of_holder(holder: str) -> Optional[int]:
    """The pid in a lock value ``"<token>|<host>:<pid>:<nonce>"``."""
    try:
        return int(holder.split("|", 1)[1].rsplit(":", 2)[1])
    except (IndexError, ValueError):
        return None
