"""One process's connections to the Redis server that holds one dict.

``Link.call`` runs a protocol script (``layout.SCRIPTS``) on a dedicated
connection: the command is packed once and sent with redis-py's
``Connection`` directly, skipping the client's pool checkout, retry wrapper
and reply callbacks -- on loopback those cost more than the server's work,
and the default read mode pays one call per read.  ``Link.blocking`` lends a
separate connection for ``XREAD BLOCK`` (a blocked connection cannot carry
other commands).

What a failure means (layout: "Writing"): a connection error on a call that
is safe to repeat (``SYNC``, ``ACQUIRE`` -- its holder names the attempt --,
``RENEW``, ``RELEASE``, ``META``) reconnects and sends once more; on a
``WRITE`` or ``SNAPSHOT`` the outcome is unknown, so it raises
``BackendUnavailable`` at once.  ``NOSCRIPT`` (a restarted server) loads the
scripts and sends again (the script did not run).  ``MOVED``/``ASK`` (a
cluster slot moved) refreshes the slot map and sends again (it did not run
either).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Optional
from urllib.parse import urlsplit, urlunsplit

from .._platform import faults
from ..errors import BackendUnavailable, CorruptSegment, OutOfSpace
from . import layout as RL

__all__ = ["Link", "connect_client", "describe", "DEFAULT_TIMEOUT"]

#: Seconds a call waits for its reply unless the client given sets socket_timeout.
DEFAULT_TIMEOUT = 10.0


def _pack_words(words: Sequence[bytes]) -> bytes:
    """RESP bulk strings for ``words`` (without the array header)."""
    return b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)


_SHAS = {name: hashlib.sha1(body.encode()).hexdigest() for name, body in RL.SCRIPTS.items()}
_SENT_POINTS = {"write": "redis-write-sent", "snapshot": "redis-snapshot-sent"}
_SAFE_TO_REPEAT = frozenset({"sync", "acquire", "renew", "release", "meta", "create", "unlink"})


def _redis() -> Any:
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("the Redis backend needs redis-py: pip install 'ultradict-ng[redis]'") from exc
    return redis


def describe(url: str) -> str:
    """``url`` without its password, for messages and stats."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.hostname or ""
    if parts.username:
        netloc = parts.username + ":***@" + netloc
    else:
        netloc = ":***@" + netloc
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def connect_client(backend: Any) -> tuple[Any, str]:
    """``(client, url)`` for a ``backend`` given as a URL or a ready client.

    A URL names one server or any node of a cluster: the server is asked
    (``INFO cluster``) and a cluster gets a ``RedisCluster`` client.  ``url``
    is what a pickled handle carries to another process (the client's
    address when a client object was given)."""
    redis = _redis()
    from redis.cluster import RedisCluster

    if isinstance(backend, (redis.Redis, RedisCluster)):
        return backend, _url_of(backend)
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a redis:// URL or a redis client, not {type(backend).__name__}")
    try:
        probe = redis.Redis.from_url(backend, socket_connect_timeout=5, socket_timeout=10)
    except ValueError as exc:
        raise ValueError(f"not a Redis URL: {describe(backend)!r} ({exc})") from None
    try:
        clustered = bool(probe.info("cluster").get("cluster_enabled"))
    except redis.ResponseError:  # INFO disabled (ACL): a single server
        clustered = False
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise BackendUnavailable(f"cannot reach Redis at {describe(backend)}: {exc}") from None
    finally:
        probe.close()
    if clustered:
        return RedisCluster.from_url(backend), backend
    return redis.Redis.from_url(backend), backend


def _url_of(client: Any) -> str:
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        cluster: Any = client
        node = cluster.get_default_node() or next(iter(cluster.get_nodes()))
        kwargs = node.redis_connection.connection_pool.connection_kwargs if node.redis_connection else {}
        host, port, db = node.host, node.port, 0
    else:
        kwargs = client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
        host, port, db = kwargs.get("host", "localhost"), kwargs.get("port", 6379), kwargs.get("db", 0)
    scheme = "rediss" if kwargs.get("ssl") or "ssl_context" in kwargs or _is_ssl(client) else "redis"
    auth = ""
    if kwargs.get("password"):
        auth = f"{kwargs.get('username') or ''}:{kwargs['password']}@"
    return f"{scheme}://{auth}{host}:{port}/{db}"


def _is_ssl(client: Any) -> bool:
    pool = getattr(client, "connection_pool", None)
    return pool is not None and "SSL" in getattr(pool.connection_class, "__name__", "")


class Link:
    """The connections of one engine (one dict, one process)."""

    def __init__(self, client: Any, keys: RL.Keys, client_name: Optional[str]) -> None:
        from redis.cluster import RedisCluster

        self.client = client
        self.keys = keys
        self.cluster = isinstance(client, RedisCluster)
        self.client_name = client_name
        #: seconds a call may wait for its reply (the client's socket_timeout if
        #: it set one): a server that stalls gives BackendUnavailable, not a hang
        self.timeout = float(
            self._node_client().connection_pool.connection_kwargs.get("socket_timeout") or DEFAULT_TIMEOUT
        )
        self._guard = threading.Lock()  # one command at a time on the dedicated connection
        self._conn: Any = None
        self._spare: list[Any] = []  # blocking connections not in use
        self._spare_guard = threading.Lock()
        # The RESP bytes of "EVALSHA <sha> 5 <keys>" per script, packed once.
        self._prefix = {
            name: _pack_words([b"EVALSHA", sha.encode(), b"5", *(k.encode() for k in keys)])
            for name, sha in _SHAS.items()
        }
        self._last_sync: tuple[Any, Any] = (None, None)  # (args, packed): fresh reads repeat them
        self._peek = b"*4\r\n" + _pack_words([b"HMGET", keys.meta.encode(), b"seq", b"epoch"])
        self.closed = False

    # -- connections ------------------------------------------------------------------

    def _node_client(self) -> Any:
        if self.cluster:
            node = self.client.get_node_from_key(self.keys.meta)
            return self.client.get_redis_connection(node)
        return self.client

    def _new_connection(self, name: Optional[str], socket_timeout: Optional[float]) -> Any:
        pool = self._node_client().connection_pool
        kwargs = dict(pool.connection_kwargs)
        kwargs["decode_responses"] = False  # payloads are binary
        kwargs["protocol"] = 2
        kwargs["client_name"] = name
        kwargs.pop("retry", None)  # we decide what is repeated (module docstring)
        kwargs["retry_on_error"] = []
        kwargs["retry_on_timeout"] = False
        if socket_timeout is not None:
            kwargs["socket_timeout"] = socket_timeout
        kwargs.pop("maint_notifications_config", None)
        try:
            return pool.connection_class(**kwargs)
        except TypeError:  # an older redis-py without some of these parameters
            for key in ("protocol", "retry_on_error", "maint_notifications_config"):
                kwargs.pop(key, None)
            return pool.connection_class(**kwargs)

    def _refresh_slots(self) -> None:
        if self.cluster:
            self.client.nodes_manager.initialize()

    def disconnect(self) -> None:
        with self._guard:
            if self._conn is not None:
                self._conn.disconnect()
                self._conn = None

    def after_fork(self) -> None:
        """In a forked child: the parent's sockets are not ours.  redis-py
        closes them without a shutdown when the pid differs, so the parent's
        connections stay intact."""
        self._guard = threading.Lock()
        self._spare_guard = threading.Lock()
        for conn in [self._conn, *self._spare]:
            if conn is not None:
                conn.disconnect()
        self._conn = None
        self._spare = []

    def close(self) -> None:
        self.closed = True
        self.disconnect()
        with self._spare_guard:
            spare, self._spare = self._spare, []
        for conn in spare:
            conn.disconnect()

    # -- scripts ----------------------------------------------------------------------

    def call(self, script: str, args: Sequence[Any]) -> Any:
        """Run protocol script ``script`` with ARGV ``args``; its reply."""
        redis = _redis()
        packed = None
        repeat = script in _SAFE_TO_REPEAT
        with self._guard:
            for attempt in range(4):
                conn = self._conn
                try:
                    if conn is not None and not repeat and self._went_away(conn):
                        # A connection the server closed while idle (CLIENT KILL, a
                        # restart, its idle timeout) would take the send and then
                        # lose the reply: a write must go out on a live one.
                        self._drop_locked()
                        conn = None
                    if conn is None:
                        conn = self._conn = self._new_connection(self.client_name, self.timeout)
                        conn.connect()
                    if packed is None:
                        packed = self._pack(script, args)
                    conn.send_packed_command(packed, check_health=False)
                    if faults.armed is not None and script in _SENT_POINTS:
                        faults.hit(_SENT_POINTS[script])
                    reply = conn.read_response()
                    if type(reply) is list and (not reply or reply[0] == RL.CORRUPT):
                        raise CorruptSegment(
                            f"the keys of {self.keys.meta} on Redis do not hold an ultradict_ng dict "
                            "this version can read (counters that are not numbers, or a lock "
                            "without expiry)"
                        )
                    return reply
                except redis.exceptions.NoScriptError:
                    self._load_scripts(conn)
                    continue
                except redis.ResponseError as exc:
                    if isinstance(exc, redis.exceptions.AskError) and attempt < 3:
                        # (MovedError too.)  The slot moved: the script did not run.
                        self._drop_locked()
                        self._refresh_slots()
                        continue
                    raise self._translate(exc) from None
                except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                    self._drop_locked()
                    if not repeat or attempt >= 1:
                        outcome = "" if repeat else " (the write may or may not have been applied)"
                        raise BackendUnavailable(
                            f"lost the connection to Redis for {self.keys.meta}{outcome}: {exc}"
                        ) from None
                    if self.cluster:
                        try:
                            self._refresh_slots()
                        except Exception:
                            pass
            raise BackendUnavailable(f"Redis kept redirecting {self.keys.meta}")  # pragma: no cover

    @staticmethod
    def _went_away(conn: Any) -> bool:
        """The idle connection has something to read: the server closed it
        (or sent what nobody asked for); either way it is not to be used."""
        try:
            return bool(conn.can_read(timeout=0))
        except Exception:
            return True

    def _translate(self, exc: Exception) -> Exception:
        """Our error for an error reply (module docstring).  redis-py turns
        some replies into classes and strips their code from the text."""
        redis = _redis()
        ex = redis.exceptions
        text = str(exc)
        unavailable = (
            ex.AskError,
            ex.TryAgainError,
            ex.ClusterError,
            ex.BusyLoadingError,
            ex.ReadOnlyError,
            ex.MasterDownError,
        )
        if isinstance(exc, unavailable) or text.startswith(
            ("LOADING", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "MASTERDOWN", "MOVED", "ASK")
        ):
            return BackendUnavailable(f"Redis cannot serve {self.keys.meta} now: {type(exc).__name__} {text}")
        if (
            isinstance(exc, ex.OutOfMemoryError)
            or text.startswith("OOM")
            or "OOM command not allowed" in text
        ):
            return OutOfSpace(
                f"Redis is out of memory (maxmemory) for {self.keys.meta}; nothing was changed: {text}"
            )
        if "WRONGTYPE" in text or "script" in text.lower() or text.startswith("ERR"):
            # A key of the dict holds something this protocol never writes.
            return CorruptSegment(
                f"the keys of {self.keys.meta} on Redis do not hold an ultradict_ng "
                f"dict this version can read: {text}"
            )
        return BackendUnavailable(f"Redis refused a command for {self.keys.meta}: {text}")

    def _pack(self, script: str, args: Sequence[Any]) -> list[bytes]:
        """The command's RESP chunks (redis-py's packer costs ~60 us for nine
        arguments; this, a few)."""
        if script == "sync":
            last_args, last_packed = self._last_sync
            if last_args == args:
                packed: list[bytes] = last_packed
                return packed
        chunks = [b"*%d\r\n" % (8 + len(args)) + self._prefix[script]]
        small = bytearray()
        for arg in args:
            data = arg if type(arg) is bytes else str(arg).encode()
            if len(data) > 16384:  # large payloads go out as they are, not copied
                chunks.append(bytes(small) + b"$%d\r\n" % len(data))
                chunks.append(data)
                small = bytearray(b"\r\n")
            else:
                small += b"$%d\r\n" % len(data)
                small += data
                small += b"\r\n"
        if small:
            chunks.append(bytes(small))
        if len(chunks) > 1 and len(chunks[0]) + len(chunks[1]) < 16384:
            chunks[0:2] = [chunks[0] + chunks[1]]
        if script == "sync":
            self._last_sync = (list(args), chunks)
        return chunks

    def _drop_locked(self) -> None:
        if self._conn is not None:
            try:
                self._conn.disconnect()
            except Exception:
                pass
            self._conn = None

    def _load_scripts(self, conn: Any) -> None:
        for name, body in RL.SCRIPTS.items():
            conn.send_command("SCRIPT", "LOAD", body)
            if conn.read_response().decode() != _SHAS[name]:  # pragma: no cover - sha1 is sha1
                raise BackendUnavailable("Redis answered an unexpected script hash")

    def peek(self) -> Any:
        """``HMGET meta seq epoch``: the cheapest check that nothing changed (a
        native command costs the server a tenth of a script call)."""
        return self._plain([self._peek], None)

    def call_aside(self, script: str, args: Sequence[Any], timeout: float) -> Any:
        """Run a script on a borrowed connection that waits at most ``timeout``
        for its reply: for the lease keeper, which must neither queue behind
        this link's other calls nor let one stalled server delay the renewals
        of leases held on others."""
        redis = _redis()
        try:
            with self.blocking(timeout) as conn:
                if self._went_away(conn):
                    raise redis.ConnectionError("the idle connection was closed by the server")
                conn.send_packed_command(self._pack(script, args), check_health=False)
                try:
                    return conn.read_response()
                except redis.exceptions.NoScriptError:
                    self._load_scripts(conn)
                    conn.send_packed_command(self._pack(script, args), check_health=False)
                    return conn.read_response()
        except redis.ResponseError as exc:
            raise self._translate(exc) from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise BackendUnavailable(f"lost the connection to Redis for {self.keys.meta}: {exc}") from None

    def command(self, *args: Any) -> Any:
        """A plain command on the dedicated connection (reconnects once)."""
        return self._plain(None, args)

    def _plain(self, packed: Optional[list[bytes]], args: Optional[Sequence[Any]]) -> Any:
        """A command that is safe to repeat: once after a lost connection, and
        after a moved slot (it did not run)."""
        redis = _redis()
        with self._guard:
            lost = 0
            for _ in range(4):
                conn = self._conn
                try:
                    if conn is None:
                        conn = self._conn = self._new_connection(self.client_name, self.timeout)
                        conn.connect()
                    if packed is not None:
                        conn.send_packed_command(packed, check_health=False)
                    else:
                        conn.send_command(*(args or ()), check_health=False)
                    return conn.read_response()
                except redis.ResponseError as exc:
                    if isinstance(exc, redis.exceptions.AskError):
                        self._drop_locked()
                        self._refresh_slots()
                        continue
                    raise self._translate(exc) from None
                except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                    self._drop_locked()
                    lost += 1
                    if lost > 1:
                        raise BackendUnavailable(
                            f"lost the connection to Redis for {self.keys.meta}: {exc}"
                        ) from None
            raise BackendUnavailable(f"Redis kept redirecting {self.keys.meta}")

    # -- blocking reads -----------------------------------------------------------------

    @contextlib.contextmanager
    def blocking(self, socket_timeout: float) -> Iterator[Any]:
        """A connection of its own for one blocking command; back to a free
        list afterwards unless the command failed (then it is dropped)."""
        with self._spare_guard:
            conn = self._spare.pop() if self._spare else None
        if conn is None:
            conn = self._new_connection(None, socket_timeout)
        conn.socket_timeout = socket_timeout
        if conn._sock is not None:
            conn._sock.settimeout(socket_timeout)
        ok = False
        try:
            yield conn
            ok = True
        finally:
            if ok and not self.closed:
                with self._spare_guard:
                    self._spare.append(conn)
            else:
                conn.disconnect()

    def xread(self, stream: str, after: str, block: float, socket_timeout: float) -> Optional[list[Any]]:
        """``XREAD BLOCK`` on ``stream`` after id ``after``: its entries
        ``[(id, fields), ...]``, or None when ``block`` seconds passed.
        Connection failures raise ``BackendUnavailable``."""
        redis = _redis()
        for attempt in range(2):  # (reading is safe to repeat: once, on a fresh connection)
            try:
                with self.blocking(socket_timeout) as conn:
                    if self._went_away(conn):
                        raise redis.ConnectionError("the idle connection was closed by the server")
                    conn.send_command(
                        "XREAD",
                        "COUNT",
                        10000,
                        "BLOCK",
                        max(1, int(block * 1000)),
                        "STREAMS",
                        stream,
                        after,
                        check_health=False,
                    )
                    reply = conn.read_response()
                break
            except redis.ResponseError as exc:
                if isinstance(exc, redis.exceptions.AskError):
                    self._refresh_slots()
                raise self._translate(exc) from None
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                if attempt:
                    raise BackendUnavailable(f"lost the connection to Redis for {stream}: {exc}") from None
        if not reply:
            return None
        entries: list[Any] = reply[0][1]
        return entries
