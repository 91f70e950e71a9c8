"""Named crash points in the write and dump paths, for crash-injection tests.

A test arms one point; the process then dies there -- ``os._exit`` or SIGKILL --
the N-th time it passes it, so the protocol's claim "a writer that dies at any
instruction leaves a state everybody can continue from" is tested at the
instructions that matter.  Arm it in the process that should die:

* environment: ``ULTRADICT_NG_FAULT=POINT[:ACTION[:N]]`` (read at import, so it
  reaches spawned children and unrelated interpreters), e.g.
  ``ULTRADICT_NG_FAULT=record-written:kill:3``;
* in-process: ``faults.arm("dump-published", action="exit", after=1)``.

ACTION is ``kill`` (SIGKILL, the default) or ``exit`` (``os._exit(70)``).
Disarmed, each point costs one global load and an ``is None`` test.

==================== ================================================================
point                where the process dies
==================== ================================================================
lock-held            right after taking the lock for a write, before anything else
record-written       record bytes are in the stream, STATE not yet stored
record-published     STATE stored, the writer's own cache not yet updated
dump-registered      REG_HIGH names the new generation, its segment not yet created
dump-created         the new dump segment exists, its payload not yet written
dump-written         the dump is complete, STATE not yet stored (unpublished)
dump-published       STATE names the new dump, old generations not yet unlinked
blob-registered      BLOB_NEXT counts a new blob, its segment not yet created
blob-written         the blob segment is complete, the record referencing it unpublished
transaction-written  a transaction's records are in the stream (or its cache is whole), nothing published
transaction-published  a transaction is published, the blobs it dropped not yet unlinked
user-registered      an attacher holds its user slot, CLOSING not yet checked
closing-claimed      a remover (clean, auto_unlink="last") holds CLOSING, users not yet checked
closing-checked      a remover found no user, the dict not yet unlinked
parcel-created       a pool parcel exists and is reserved, its header not yet written
parcel-written       a pool parcel is complete, its reference not yet sent
redis-write-sent     a WRITE script was sent to Redis, its reply not yet read
redis-snapshot-sent  a SNAPSHOT script was sent to Redis, its reply not yet read
redis-lease-taken    the Redis lease was granted, the holder has not used it yet
cache-slot-taken     a cache writer took a slot for a new key, the entry not yet written
cache-entry-removed  a cache entry is deleted, its slot not yet pushed back (nor bytes)
cache-claimed        cached() wrote its claim, the computation not yet started
sync-leading         a group commit's leader holds SYNC_LEADER, its sync not yet made
recovery-scanned     recovery of a dict in files scanned its stream, no control segment yet
recovery-loaded      recovery made and loaded the control segment, no checkpoint yet
recovery-checkpointed  recovery wrote its checkpoint, ``clean`` not yet removed
==================== ================================================================
"""

from __future__ import annotations

import os
import signal
from typing import Optional

__all__ = ["POINTS", "arm", "disarm", "hit", "armed"]

POINTS = (
    "lock-held",
    "record-written",
    "record-published",
    "dump-registered",
    "dump-created",
    "dump-written",
    "dump-published",
    "blob-registered",
    "blob-written",
    "transaction-written",
    "transaction-published",
    "user-registered",
    "closing-claimed",
    "closing-checked",
    "parcel-created",
    "parcel-written",
    "redis-write-sent",
    "redis-snapshot-sent",
    "redis-lease-taken",
    "cache-slot-taken",
    "cache-entry-removed",
    "cache-claimed",
    "sync-leading",
    "recovery-scanned",
    "recovery-loaded",
    "recovery-checkpointed",
)


class _Fault:
    __slots__ = ("point", "action", "remaining")

    def __init__(self, point: str, action: str, after: int) -> None:
        if point not in POINTS:
            raise ValueError(f"unknown fault point {point!r}; known: {', '.join(POINTS)}")
        if action not in ("kill", "exit"):
            raise ValueError(f"fault action must be 'kill' or 'exit', not {action!r}")
        if after < 1:
            raise ValueError("after must be >= 1")
        self.point = point
        self.action = action
        self.remaining = after


#: The armed fault, or None.  Code on the hot paths tests ``faults.armed is None``.
armed: Optional[_Fault] = None


def arm(point: str, action: str = "kill", after: int = 1) -> None:
    """Die at ``point`` the ``after``-th time this process passes it."""
    global armed
    armed = _Fault(point, action, after)


def disarm() -> None:
    global armed
    armed = None


def hit(point: str) -> None:
    """Called at each point (only when something is armed)."""
    fault = armed
    if fault is None or fault.point != point:
        return
    fault.remaining -= 1
    if fault.remaining:
        return
    if fault.action == "exit":
        os._exit(70)
    os.kill(os.getpid(), signal.SIGKILL)


def _from_environment() -> None:
    spec = os.environ.get("ULTRADICT_NG_FAULT")
    if not spec:
        return
    parts = spec.split(":")
    arm(parts[0], parts[1] if len(parts) > 1 else "kill", int(parts[2]) if len(parts) > 2 else 1)


_from_environment()
