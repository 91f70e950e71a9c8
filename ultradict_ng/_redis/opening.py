"""Opening a dict on Redis: checking the options, creating it or attaching to
it (layout: "Creating and removing"), checking what an attacher finds."""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from typing import Any, Callable, Optional, TypeVar

from .._codec import records as R
from .._codec.codec import CUSTOM_ID, Codec, codec_by_id, codec_for
from .._engine import Options
from .._platform.names import generate_name, validate_name
from ..errors import AlreadyExists, CorruptSegment, IncompatibleLayout, NotFound, ParameterMismatch
from . import layout as RL
from .identity import HOST, start_time
from .link import Link, connect_client, describe
from .listener import Listener
from .state import EngineState

__all__ = ["open_redis"]

#: The engine class opening makes (a RedisEngine).
E = TypeVar("E", bound=EngineState)

READ_MODES = ("fresh", "cached")


def open_redis(
    cls: Callable[..., E],
    name: Optional[str],
    create: Optional[bool],
    options: Options,
    initial: Optional[Sequence[Sequence[Any]]],
    backend: Any,
    reads: Optional[str],
    lease: Optional[float],
    staleness: Optional[float],
) -> E:
    """Create or attach to the dict ``name`` on ``backend`` (as ``SharedDict``)."""
    name = generate_name() if name is None else validate_name(name)
    reads = reads or "fresh"
    if reads not in READ_MODES:
        raise ValueError(f"reads must be one of {READ_MODES}, not {reads!r}")
    lease = RL.DEFAULT_LEASE if lease is None else float(lease)
    if not 0.05 <= lease <= 3600:
        raise ValueError("lease must be between 0.05 and 3600 seconds")
    staleness = RL.DEFAULT_STALENESS if staleness is None else float(staleness)
    if not 0.01 <= staleness <= 3600:
        raise ValueError("staleness must be between 0.01 and 3600 seconds")
    # (blob_threshold has no effect: values travel inline, arrays too.)
    minlog = options.buffer_size
    if minlog is not None and (not isinstance(minlog, int) or isinstance(minlog, bool) or minlog < 1):
        raise ValueError("buffer_size must be a positive int (bytes of log before a snapshot) or None")
    codec = codec_for(options.serializer) if options.serializer is not None else None
    client, url = connect_client(backend)
    keys = RL.keys_of(name)
    link = Link(client, keys, f"{RL.CLIENT_PREFIX}{name}:{HOST}:{os.getpid()}:{start_time()}")
    try:
        created, fields = _create_or_find(link, name, create, options, codec, initial, minlog)
        version, codec_id, recurse, epoch, stored_minlog = fields
        if version != RL.VERSION:
            raise IncompatibleLayout(
                f"shared dict {name!r} on {describe(url)} has protocol version {version}, "
                f"this ultradict_ng speaks {RL.VERSION}"
            )
        if codec_id == CUSTOM_ID:
            if codec is None or codec.id != CUSTOM_ID:
                raise ParameterMismatch(
                    f"shared dict {name!r} uses a custom serializer object; pass the same "
                    "serializer= to attach to it"
                )
            stored_codec = codec
        else:
            stored_codec = codec_by_id(codec_id)
        if not created:
            mismatches = []
            if options.recurse is not None and bool(options.recurse) != recurse:
                mismatches.append(f"recurse={recurse}")
            if codec is not None and codec.id != stored_codec.id:
                mismatches.append(f"serializer={stored_codec.name!r}")
            if minlog is not None and minlog != stored_minlog:
                mismatches.append(f"buffer_size={stored_minlog}")
            if mismatches:
                raise ParameterMismatch(
                    f"shared dict {name!r} exists with {', '.join(mismatches)}; pass only the "
                    "name to attach with its stored configuration"
                )
        engine = cls(
            link, name, stored_codec, recurse, epoch, created, url, reads, lease, staleness, stored_minlog
        )
    except BaseException:
        link.close()
        raise
    try:
        engine.sync_remote()
        if reads == "cached":
            engine.listener = Listener(engine)
            engine.listener.start()
        auto = options.auto_unlink
        if auto is None:
            auto = created
        engine.arm_finalizer(auto)
    except BaseException:
        engine.close()
        raise
    return engine


def _create_or_find(
    link: Link,
    name: str,
    create: Optional[bool],
    options: Options,
    codec: Optional[Codec],
    initial: Optional[Sequence[Sequence[Any]]],
    minlog: Optional[int],
) -> tuple[bool, tuple[int, int, bool, str, int]]:
    if create is False:
        got = link.command("HMGET", link.keys.meta, "version", "codec", "recurse", "epoch", "minlog")
        if got[3] is None:
            raise NotFound(f"no shared dict {name!r} on this Redis server")
        return False, _fields(got, link.keys.meta)
    use = codec or codec_for(options.for_create("serializer") or "msgpack")
    recurse = bool(options.for_create("recurse"))
    tree: dict[Any, Any] = {}
    if initial:
        _, decoded = use.encode_record(R.update((), [list(p) for p in initial]))
        R.apply(tree, decoded)
    snapshot = use.dumps(tree)
    epoch = secrets.token_hex(8)
    reply = link.call(
        "create",
        [
            epoch,
            RL.VERSION,
            use.id,
            int(recurse),
            minlog or RL.DEFAULT_MINLOG,
            f"{HOST}:{os.getpid()}",
            snapshot,
        ],
    )
    if reply[0] == 1 or (len(reply) > 4 and reply[4] == epoch.encode()):
        # (The second: our own CREATE, repeated after its reply was lost.)
        return True, (RL.VERSION, use.id, recurse, epoch, minlog or RL.DEFAULT_MINLOG)
    if create:
        raise AlreadyExists(f"shared dict {name!r} already exists on this Redis server")
    return False, _fields(reply[1:], link.keys.meta)


def _fields(got: Sequence[Any], key: str) -> tuple[int, int, bool, str, int]:
    """The stored configuration of a dict (``CREATE``'s answer, or ``HMGET``)."""
    try:
        version, codec_id, recurse, epoch, minlog = got
        return (
            int(version),
            int(codec_id),
            bool(int(recurse)),
            epoch.decode("ascii"),
            int(minlog or RL.DEFAULT_MINLOG),
        )
    except (TypeError, ValueError, AttributeError):
        fields = dict(zip(("version", "codec", "recurse", "epoch", "minlog"), got))
        raise CorruptSegment(
            f"{key} on Redis is not the configuration of an ultradict_ng dict (version, codec, "
            f"recurse, epoch, minlog): {fields!r}"
        ) from None
