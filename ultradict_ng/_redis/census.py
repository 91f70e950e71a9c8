"""What the server says about a Redis dict: its counters and lock (``stats``)
and the processes attached to it (``connections``: the connections named
after the dict, layout "Creating and removing")."""

from __future__ import annotations

from typing import Any, Optional

from .._engine import User
from . import layout as RL
from .identity import pid_of_holder
from .link import describe
from .state import EngineState

__all__ = ["stats", "connections"]


def _int(value: Any) -> Optional[int]:
    """A counter of ``meta``: None if it is not a number (foreign data)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def stats(engine: EngineState) -> dict[str, Any]:
    """``SharedDict.stats()`` of a Redis dict: one ``META`` round trip."""
    reply = engine.link.call("meta", [])
    fields = {reply[0][i].decode(errors="replace"): reply[0][i + 1] for i in range(0, len(reply[0]), 2)}
    if not fields:
        engine.raise_gone()
    holder = reply[2].decode(errors="replace") if reply[2] else ""
    return {
        "name": engine.name,
        "engine": "redis",
        "backend": describe(engine.backend),
        "reads": engine.reads,
        "serializer": engine.codec.name,
        "recurse": engine.recurse,
        "seq": _int(fields.get("seq")),
        "snapshot_seq": _int(fields.get("snap")),
        "snapshot_bytes": _int(fields.get("snapbytes")),
        "log_entries": _int(reply[1]),
        "log_bytes": _int(fields.get("logbytes")),
        "buffer_size": _int(fields.get("minlog")),
        "lock_holder": holder.split("|", 1)[1] if "|" in holder else None,
        "lock_ttl": _int(reply[3]) / 1000 if holder and _int(reply[3]) is not None else None,  # type: ignore[operator]
        "lock_pid": pid_of_holder(holder),
        "fence": _int(fields.get("fence")),
        "creator": fields.get("creator", b"").decode(errors="replace"),
        "cached_seq": engine.known,
    }


def connections(engine: EngineState) -> list[tuple[int, str, User]]:
    """``(client id, host, user)`` of every connection named after this dict,
    one per process (the first seen); layout: "Creating and removing"."""
    listing = engine.link.command("CLIENT", "LIST", "TYPE", "normal")
    prefix = f"name={RL.CLIENT_PREFIX}{engine.name}:"
    seen = set()
    out = []
    for line in listing.decode(errors="replace").splitlines():
        fields = dict(f.split("=", 1) for f in line.split(" ") if "=" in f)
        named = "name=" + fields.get("name", "")
        if not named.startswith(prefix):
            continue
        try:
            host, pid, start = named[len(prefix) :].rsplit(":", 2)
            user = User(int(pid), int(start), True)
            cid = int(fields.get("id", "0"))
        except ValueError:
            continue
        if (host, user) not in seen:
            seen.add((host, user))
            out.append((cid, host, user))
        elif cid:
            out.append((cid, host, user))
    return out
