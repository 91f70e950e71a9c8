"""What the Redis engine's helper modules see of the engine: :class:`EngineState`.

The census, the feed, the lease, the listener, the transaction and the
opening of a dict each act on one :class:`~ultradict_ng._redis.engine.RedisEngine`,
which imports them all.  They name it through this protocol, so that none of
them imports the engine module back (type checking included): the engine's
modules form no cycle.  mypy checks at the end of ``engine.py`` that the
engine satisfies it.
"""

from __future__ import annotations

from typing import Any, NoReturn, Protocol

from .._codec.codec import Codec
from . import layout as RL
from .link import Link

__all__ = ["EngineState"]


class EngineState(Protocol):
    """A Redis engine's state and the methods its helpers call (engine.py
    documents each; ``tx``, ``lock`` and ``listener`` are the transaction,
    the lease lock and the listener thread, typed loosely here because their
    modules take this protocol in turn)."""

    link: Link
    name: str
    codec: Codec
    recurse: bool
    epoch: str
    backend: str
    reads: str
    staleness: float
    minlog: int
    keys: RL.Keys
    words: Any
    seen: int
    data: dict[Any, Any]
    known: int
    stale: bool
    mutex: Any
    lock: Any
    listener: Any
    tx: Any

    @property
    def closed(self) -> bool: ...

    def sync_remote(self) -> None: ...

    def apply_delta(self, delta: list[Any]) -> None: ...

    def raise_gone(self) -> NoReturn: ...

    def _snapshot_quietly(self) -> None: ...

    def bump(self) -> None: ...

    def arm_finalizer(self, auto_unlink: Any) -> None: ...

    def close(self) -> None: ...
