"""One adapter per contender, all with the same small interface.

A workload only ever sees a :class:`Handle`: ``h.m`` (the mapping its loops
index: ``m[k]``, ``m[k] = v``) and ``h.lock`` (a context manager for the
read-modify-write workloads).  The adapter creates a dict (``create``), opens a
second handle on it in this process (``open_second``), describes it for another
process (``child_spec``; the child calls :func:`attach_spec`), and removes it
(``destroy``).  Peers are imported lazily in :meth:`Adapter.load`, which raises
:class:`Unavailable` with the reason when a peer cannot be used.

Workload 9 (large values, :mod:`perf.big`) uses a second small interface,
``big_*``: ``big_prepare`` (untimed setup), ``big_write`` (the timed write),
``big_spec`` (what the reader process needs), ``big_destroy``, and on the
reader's side ``big_open`` / ``big_get`` / ``big_close``.  Dict adapters get it
from :class:`Adapter` through their public mapping API (``m[k] = v``, ``m[k]``,
``m.view(k)``); the transports that are no dicts (raw shared memory, pickle 5
out-of-band buffers, SharedArray, InterProcessPyObjects, Pipe, Queue) implement
only that interface and run only in workload 9.

Workload 10 (wake-ups, :mod:`perf.wake`) has its code in that module; an
adapter only says whether its contender takes part (``wakeup``):
ultradict_ng, redis (pub/sub on its server), Pipe, and two adapters that exist
for it alone, ``multiprocessing.Event`` and ``multiprocessing.Condition``.

Everything created is registered with the run (``run.own``) with a cleanup
function, so an exception or Ctrl-C anywhere still unlinks it.
"""

from __future__ import annotations

import importlib
import os
import pickle
import struct
import threading
import warnings
from typing import Any, Callable, Optional

__all__ = ["ADAPTERS", "ORDER", "ALIASES", "Adapter", "Handle", "Unavailable", "attach_spec", "close_child"]

PICKLE = pickle.HIGHEST_PROTOCOL


class Unavailable(Exception):
    """This contender cannot run here (missing package or binary)."""


class Handle:
    """One open dict: ``m`` for the loops, ``lock`` for the locked workloads."""

    __slots__ = ("m", "lock", "name", "extra")

    def __init__(self, m: Any, lock: Any, name: str, extra: Optional[dict[str, Any]] = None) -> None:
        self.m = m
        self.lock = lock
        self.name = name
        self.extra = extra or {}


class Adapter:
    key = ""
    label = ""
    module: Optional[str] = None  # peer module a spawned child must import too
    #: Importing the peer changes process-wide state (UltraDict switches off the
    #: resource tracker for shared memory): every spawned child imports it too.
    global_side_effects = False
    #: Uses multiprocessing.shared_memory (whose resource-tracker registration
    #: UltraDict's import switches off): a child needs the parent's import state.
    uses_mp_shm = False
    cross_process = True  # False: the dict cannot be opened from another process
    server_based = False  # attach does not load the dict (Manager, Redis)
    #: A dict (workloads 1-8); False for the transports of workload 9.
    dict_like = True
    #: Runs in workload 9 (large values).
    big_values = False
    #: Workload 9: the reader must be receiving while the writer writes (Pipe, Queue).
    streaming = False
    #: Runs in workload 10 (wake-up latency; see :mod:`perf.wake`, which holds the code).
    wakeup = False

    def __init__(self, run: Any) -> None:
        self.run = run

    # -- parent side -------------------------------------------------------------------
    def load(self) -> None:
        """Import the peer (raise Unavailable with the reason)."""

    def version(self) -> str:
        return "-"

    def create(self, initial: Optional[dict[Any, Any]] = None, *, fit_bytes: int = 0) -> Handle:
        """A new dict holding ``initial``; ``fit_bytes``: the largest value it must hold."""
        raise NotImplementedError

    def open_second(self, h: Handle) -> Handle:
        """Another handle on the same dict, in this process."""
        raise NotImplementedError

    def close_second(self, h2: Handle) -> None:
        pass

    def child_spec(self, h: Handle) -> dict[str, Any]:
        return {"adapter": self.key, "name": h.name}

    def inheritables(self) -> dict[str, Any]:
        """Objects a spawned child can only receive at creation (multiprocessing locks)."""
        return {}

    def destroy(self, h: Handle) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        pass

    def min_writes(self, h: Handle, quick: bool, sample: Any = (123456, "123456")) -> int:
        """Writes a measurement needs so the contender's periodic full dumps are amortized."""
        return 1

    def fallback(self, fit_bytes: int) -> Optional[str]:
        """After a failure with values of ``fit_bytes``: switch to settings that fit, say which.

        Returns None when there is nothing else to try.
        """
        return None

    def runs(self, workload: str) -> bool:
        """Whether this contender takes part in ``workload``."""
        if workload == "wakeup":
            return self.wakeup
        return self.big_values if workload == "big" else self.dict_like

    # -- workload 9: large values, parent side -------------------------------------------
    # The defaults go through the public dict API: ``m[k] = value`` to write, ``m[k]``
    # to read, ``m.view(k)`` for a zero-copy memoryview.  Whatever raises (a type the
    # serializer refuses, a method that does not exist) is reported as unavailable.

    def big_unsupported(self, kind: str) -> Optional[str]:
        """Why this contender cannot carry ``kind`` at all (checked before anything runs)."""
        return None

    def big_prepare(self, size: int, kind: str) -> Any:
        """Untimed setup for one value of ``size`` bytes; returns the state."""
        return self.create(fit_bytes=size)

    def big_write(self, state: Any, key: Any, value: Any) -> None:
        """The timed write."""
        state.m[key] = value

    def big_spec(self, state: Any) -> dict[str, Any]:
        """What the reader process gets (plus kind, key and the expected value)."""
        return self.child_spec(state)

    def big_channel(self, state: Any) -> Any:
        """An object the reader process receives at its creation (a Pipe end, a Queue)."""
        return None

    def big_destroy(self, state: Any, ok: bool = True) -> None:
        """Remove everything ``big_prepare``/``big_write`` made (``ok``: the reader finished)."""
        self.destroy(state)

    # -- workload 9, reader side (classmethods: they run in the spawned reader) ----------
    @classmethod
    def big_open(cls, spec: dict[str, Any], channel: Any) -> Any:
        """Attach (the start of the first access)."""
        return cls.child_attach(spec, {})

    @classmethod
    def big_get(cls, h: Any, spec: dict[str, Any], first: bool) -> Any:
        """One access: the value usable (an array, bytes, or a memoryview for kind 'view')."""
        if spec["kind"] == "view":
            return h.m.view(spec["key"])
        return h.m[spec["key"]]

    @classmethod
    def big_close(cls, h: Any) -> None:
        cls.child_close(h)

    # -- child side --------------------------------------------------------------------
    @classmethod
    def child_attach(cls, spec: dict[str, Any], inherit: dict[str, Any]) -> Handle:
        raise NotImplementedError

    @classmethod
    def child_close(cls, h: Handle) -> None:
        close = getattr(h.m, "close", None)
        if close is not None:
            close()


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "?"


# -- ultradict_ng ------------------------------------------------------------------------


class NgAdapter(Adapter):
    key = "ultradict_ng"
    label = "ultradict_ng"
    module = "ultradict_ng"
    big_values = True
    wakeup = True

    def load(self) -> None:
        from ultradict_ng import SharedDict

        self.SD = SharedDict

    def version(self) -> str:
        import ultradict_ng

        return getattr(ultradict_ng, "__version__", _version("ultradict_ng"))

    def create(self, initial=None, *, fit_bytes=0):
        name = self.run.new_name()
        SD = self.SD
        self.run.own(name, lambda: SD.unlink_by_name(name), self.label)
        d = SD(initial, name=name, create=True) if initial else SD(name=name, create=True)
        return Handle(d, d.lock, name)

    def open_second(self, h):
        d = self.SD(name=h.name, create=False)
        return Handle(d, d.lock, h.name)

    def close_second(self, h2):
        h2.m.close()

    def destroy(self, h):
        try:
            h.m.close()  # the creating handle auto-unlinks
        finally:
            self.SD.unlink_by_name(h.name)  # and make sure of it
            self.run.disown(h.name)

    def min_writes(self, h, quick, sample=(123456, "123456")):
        # A small record ([op, path, key, value] + its header) is ~28 bytes:
        # the 1 MiB default stream fills every ~37k writes, then a full dump.
        per_fill = max(1, h.m.buffer_size // 28)
        return int(per_fill * (1.1 if quick else 2.5))

    @classmethod
    def child_attach(cls, spec, inherit):
        from ultradict_ng import SharedDict

        d = SharedDict(name=spec["name"], create=False)
        return Handle(d, d.lock, spec["name"])


# -- UltraDict -------------------------------------------------------------------------------


def _ultra_dump_name(name: str) -> str:
    """The dynamic full-dump segment UltraDict's control block currently names."""
    try:
        with open(os.path.join("/dev/shm", name), "rb") as f:
            raw = f.read(275)[20:275]
        return raw.decode("utf-8", "replace").strip().strip("\x00")
    except OSError:
        return ""


def _ultra_unlink_all(name: str, extra: list[str]) -> None:
    from UltraDict import UltraDict

    for seg in [name, name + "_memory", name + "_full", *extra]:
        if seg:
            UltraDict.unlink_by_name(seg, ignore_errors=True)


def _mapped_shm() -> set:
    """Names of /dev/shm segments some process currently maps."""
    names = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    i = line.find("/dev/shm/")
                    if i >= 0:
                        names.add(line[i + 9 :].split()[0])
        except OSError:
            continue
    return names


def ultra_orphans(new_entries: list[str], suspects: Optional[set] = None) -> list[str]:
    """Unnamed segments (``psm_*``) that appeared during the run and are UltraDict full dumps.

    UltraDict writes each dynamic full dump to a fresh ``psm_*`` segment:
    0xFF, a 4-byte length, 0xFF, then the pickle (0x80 ...).  Those left
    behind are recognised by that header (or, for a dump whose writer was
    killed before it wrote anything, by having appeared while our worker
    processes were using UltraDict: ``suspects``) and by nobody mapping them.
    """
    out = []
    suspects = suspects or set()
    candidates = [e for e in new_entries if e.startswith("psm_")]
    if not candidates:
        return out
    mapped = _mapped_shm()
    for e in candidates:
        try:
            with open(os.path.join("/dev/shm", e), "rb") as f:
                head = f.read(7)
        except OSError:
            continue
        dump_header = len(head) == 7 and head[0] == 0xFF and head[5] == 0xFF and head[6] == 0x80
        if (dump_header or e in suspects) and e not in mapped:
            out.append(e)
    return out


def unlink_segment(name: str) -> None:
    try:
        from UltraDict import UltraDict

        UltraDict.unlink_by_name(name, ignore_errors=True)
    except ImportError:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            pass


class UltraAdapter(Adapter):
    module = "UltraDict"
    global_side_effects = True
    uses_mp_shm = True
    shared_lock = False

    _seed_noted = False

    def load(self) -> None:
        try:
            from UltraDict import UltraDict
        except ImportError as exc:
            raise Unavailable(f"UltraDict is not installed ({exc}); pip install -e '.[perf]'") from None
        self.UD = UltraDict

    def version(self) -> str:
        return _version("UltraDict")

    #: Set only if a workload cannot run with the defaults (see :meth:`fallback`).
    full_dump_size: Optional[int] = None

    def _new(self, name: str, create: bool, fit_bytes: int = 0, full_dump_size: Optional[int] = None) -> Any:
        if not create:
            return self.UD(name=name, create=False)  # configuration comes from the creator
        kwargs: dict[str, Any] = {}
        if self.shared_lock:
            kwargs["shared_lock"] = True
        if full_dump_size:
            kwargs["full_dump_size"] = full_dump_size
        elif self.full_dump_size and fit_bytes:
            kwargs["full_dump_size"] = max(self.full_dump_size, int(fit_bytes * 1.25) + (1 << 20))
        return self.UD(name=name, create=True, **kwargs)

    def fallback(self, fit_bytes: int) -> Optional[str]:
        """The defaults failed for values of ``fit_bytes``: use a static full-dump segment."""
        if self.full_dump_size:
            return None
        self.full_dump_size = int(fit_bytes * 1.25) + (1 << 20)
        return (
            f"{self.label}: failed with its defaults for {fit_bytes:,}-byte values; retried with "
            f"full_dump_size={self.full_dump_size:,}"
        )

    def create(self, initial=None, *, fit_bytes=0, full_dump_size=None):
        name = self.run.new_name()
        dumps: list[str] = []
        self.run.own(name, lambda: _ultra_unlink_all(name, dumps + [_ultra_dump_name(name)]), self.label)
        d = self._new(name, True, fit_bytes, full_dump_size)
        if initial:
            if not UltraAdapter._seed_noted:
                UltraAdapter._seed_noted = True
                self.run.note(
                    "UltraDict: large dicts are seeded by filling its local data and calling its "
                    "dump() once (same end state as UltraDict(initial); that path appends one "
                    "stream record per key and re-dumps the whole dict every ~300 keys with the "
                    "10 kB default buffer: O(n^2), hours at 1M keys)"
                )
            with d.lock:
                d.data.update(initial)
                d.dump()
        return Handle(d, d.lock, name, {"dumps": dumps})

    def open_second(self, h):
        d = self._new(h.name, False)
        return Handle(d, d.lock, h.name)

    def close_second(self, h2):
        h2.m.close()

    def destroy(self, h):
        dump = _ultra_dump_name(h.name)
        try:
            h.m.close(unlink=True)
        finally:
            _ultra_unlink_all(h.name, [dump])
            self.run.disown(h.name)

    def min_writes(self, h, quick, sample=(123456, "123456")):
        record = len(h.m.serializer.dumps((True, *sample))) + 6
        per_fill = max(1, h.m.buffer_size // record)
        return int(per_fill * (1.1 if quick else 2.5))

    @classmethod
    def child_attach(cls, spec, inherit):
        from UltraDict import UltraDict

        d = UltraDict(name=spec["name"], create=False)
        return Handle(d, d.lock, spec["name"])

    @staticmethod
    def big_full_dump_size(size: int) -> int:
        """Workload 9: a static full-dump segment that holds the pickled value with room to spare."""
        return size + size // 16 + (1 << 20)

    def big_prepare(self, size, kind):
        # buffer_size stays at its default (10 kB): a large value never fits the
        # update stream, so every write is a full dump (pickle of the whole dict) into
        # the static full-dump segment, and attaching loads (unpickles) that dump.
        return self.create(full_dump_size=self.big_full_dump_size(size))


class UltraSharedAdapter(UltraAdapter):
    key = "ultradict_shared"
    label = "UltraDict(shared_lock=True)"
    shared_lock = True
    #: Workload 9 runs UltraDict once, in this configuration (UltraDict() differs
    #: only in its lock, which one write and one read do not exercise).
    big_values = True

    def load(self) -> None:
        super().load()
        try:
            import atomics  # noqa: F401  (UltraDict's shared lock needs it)
        except ImportError:
            raise Unavailable("UltraDict(shared_lock=True) needs the atomics package") from None


class UltraDefaultAdapter(UltraAdapter):
    key = "ultradict"
    label = "UltraDict()"
    shared_lock = False


# -- shared-memory-dict -----------------------------------------------------------------------


SMD_SMALL = 4096


class SmdAdapter(Adapter):
    key = "smd"
    label = "shared-memory-dict"
    module = "shared_memory_dict"
    uses_mp_shm = True

    def load(self) -> None:
        try:
            from shared_memory_dict import SharedMemoryDict
        except ImportError as exc:
            raise Unavailable(f"shared-memory-dict is not installed ({exc})") from None
        self.SMD = SharedMemoryDict
        # It has no cross-process lock of its own: the locked workloads use this.
        self.lock = self.run.ctx.Lock()
        self.run.note(
            "shared-memory-dict: no lock of its own; the locked workloads (3, 4) use a "
            "multiprocessing.Lock (spawn context) passed to every process"
        )

    def version(self) -> str:
        return _version("shared-memory-dict")

    def inheritables(self):
        return {"smd_lock": self.lock}

    def size_for(self, initial: Optional[dict[Any, Any]], fit_bytes: int) -> int:
        """Its fixed size: the whole pickled dict must fit, with room for the writes."""
        need = len(pickle.dumps(initial, PICKLE)) if initial else 0
        size = max(SMD_SMALL, int(need * 1.5) + (64 << 10) if need else SMD_SMALL)
        if fit_bytes:
            size = max(size, int(fit_bytes * 1.25) + (1 << 20))
        return size

    def create(self, initial=None, *, fit_bytes=0):
        name = self.run.new_name()
        size = self.size_for(initial, fit_bytes)
        self.run.own(name, lambda: _smd_unlink(name), self.label)
        d = self.SMD(name=name, size=size)
        if initial:
            d.update(initial)
        return Handle(d, self.lock, name, {"size": size})

    def open_second(self, h):
        d = self.SMD(name=h.name, size=h.extra["size"])
        return Handle(d, self.lock, h.name, h.extra)

    def close_second(self, h2):
        h2.m.shm.close()

    def child_spec(self, h):
        return {"adapter": self.key, "name": h.name, "size": h.extra["size"]}

    def destroy(self, h):
        try:
            h.m.shm.close()
            try:
                h.m.shm.unlink()
            except FileNotFoundError:
                pass
        finally:
            self.run.disown(h.name)

    def shutdown(self):
        self.lock = None  # its named semaphore goes with it

    @classmethod
    def child_attach(cls, spec, inherit):
        from shared_memory_dict import SharedMemoryDict

        d = SharedMemoryDict(name=spec["name"], size=spec["size"])
        return Handle(d, inherit["smd_lock"], spec["name"])

    @classmethod
    def child_close(cls, h):
        h.m.shm.close()


def _smd_unlink(name: str) -> None:
    from multiprocessing import shared_memory

    try:
        shm = shared_memory.SharedMemory(name="sm_" + name)
    except FileNotFoundError:
        return
    shm.close()
    shm.unlink()


# -- multiprocessing.Manager ------------------------------------------------------------------


class ManagerAdapter(Adapter):
    key = "manager"
    label = "Manager().dict()"
    server_based = True
    manager: Any = None

    def version(self) -> str:
        import platform

        return "stdlib " + platform.python_version()

    def _mgr(self) -> Any:
        if self.manager is None:
            self.manager = self.run.ctx.Manager()
            self.run.note(
                "Manager().dict(): locked workloads use manager.Lock(); its server "
                "process is started once and shut down at the end"
            )
        return self.manager

    def create(self, initial=None, *, fit_bytes=0):
        mgr = self._mgr()
        name = self.run.new_name()
        m = mgr.dict(initial or {})
        return Handle(m, mgr.Lock(), name)

    def open_second(self, h):
        # A second proxy with its own connection to the manager.
        return Handle(pickle.loads(pickle.dumps(h.m)), h.lock, h.name)

    def child_spec(self, h):
        return {"adapter": self.key, "name": h.name, "proxy": h.m, "lock": h.lock}

    def destroy(self, h):
        try:
            h.m.clear()
        except Exception:
            pass
        h.m = h.lock = None

    def shutdown(self):
        if self.manager is not None:
            mgr, self.manager = self.manager, None
            mgr.shutdown()

    @classmethod
    def child_attach(cls, spec, inherit):
        return Handle(spec["proxy"], spec["lock"], spec["name"])

    @classmethod
    def child_close(cls, h):
        h.m = h.lock = None


# -- Redis ------------------------------------------------------------------------------------


REDIS_LOCK_SLEEP = 0.001


class RedisMap:
    """``m[k]`` = GET, ``m[k] = v`` = SET; values pickled (like UltraDict/smd/Manager do)."""

    __slots__ = ("_get", "_set", "_p")

    def __init__(self, client: Any, prefix: str) -> None:
        self._get = client.get
        self._set = client.set
        self._p = prefix

    def __getitem__(self, key: Any) -> Any:
        raw = self._get(self._p + str(key))
        if raw is None:
            raise KeyError(key)
        return pickle.loads(raw)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._set(self._p + str(key), pickle.dumps(value, PICKLE))

    def get(self, key: Any, default: Any = None) -> Any:
        raw = self._get(self._p + str(key))
        return default if raw is None else pickle.loads(raw)


class RedisAdapter(Adapter):
    key = "redis"
    label = "redis"
    module = "redis"
    server_based = True
    wakeup = True  # pub/sub, on the server this adapter starts
    server: Any = None
    client: Any = None

    def load(self) -> None:
        from .redis_server import RedisServer, redis_binary

        try:
            import redis
        except ImportError as exc:
            raise Unavailable(f"redis-py is not installed ({exc})") from None
        binary = redis_binary()
        if not binary:
            raise Unavailable("no redis-server binary on PATH (the harness never installs it)")
        self.redis = redis
        self.server = RedisServer.start(binary)
        self.run.own_resource("redis-server", self.shutdown)
        self.client = redis.Redis(host="127.0.0.1", port=self.server.port)
        self.client.ping()
        self.live: dict[str, int] = {}
        self.run.note(
            f"redis: private redis-server {self.server.version()} on 127.0.0.1:{self.server.port} "
            "(--save '' --appendonly no); m[k] = GET/SET of pickled values; the locked workloads "
            f"use a redis-py Lock around GET+SET with sleep={REDIS_LOCK_SLEEP} (its default polling "
            "interval is 0.1 s)"
        )

    def version(self) -> str:
        return f"redis-py {_version('redis')}, server {self.server.version() if self.server else '-'}"

    def _lock(self, client: Any, prefix: str) -> Any:
        return client.lock(prefix + "__lock__", sleep=REDIS_LOCK_SLEEP)

    def create(self, initial=None, *, fit_bytes=0):
        name = self.run.new_name()
        prefix = name + ":"
        self.live[prefix] = 1
        if initial:
            items = list(initial.items())
            for i in range(0, len(items), 10_000):
                self.client.mset({prefix + str(k): pickle.dumps(v, PICKLE) for k, v in items[i : i + 10_000]})
        return Handle(
            RedisMap(self.client, prefix), self._lock(self.client, prefix), name, {"prefix": prefix}
        )

    def open_second(self, h):
        client = self.redis.Redis(host="127.0.0.1", port=self.server.port)
        return Handle(
            RedisMap(client, h.extra["prefix"]),
            self._lock(client, h.extra["prefix"]),
            h.name,
            {"client": client, **h.extra},
        )

    def close_second(self, h2):
        h2.extra["client"].close()

    def child_spec(self, h):
        return {"adapter": self.key, "name": h.name, "port": self.server.port, "prefix": h.extra["prefix"]}

    def destroy(self, h):
        prefix = h.extra["prefix"]
        self.live.pop(prefix, None)
        if not self.live:
            self.client.flushdb()
            return
        batch: list[Any] = []
        for k in self.client.scan_iter(match=prefix + "*", count=10_000):
            batch.append(k)
            if len(batch) >= 10_000:
                self.client.unlink(*batch)
                batch = []
        if batch:
            self.client.unlink(*batch)

    def incr_loop(self, key: str) -> Callable[[int], float]:
        """INCR: Redis's own atomic increment (not the same shape: reported as a note)."""
        import time

        incr = self.client.incr

        def loop(n: int) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                incr(key)
            return time.perf_counter() - t0

        return loop

    def shutdown(self):
        if self.client is not None:
            try:
                self.client.close()
            except Exception:
                pass
            self.client = None
        if self.server is not None:
            server, self.server = self.server, None
            server.stop()

    @classmethod
    def child_attach(cls, spec, inherit):
        import redis

        client = redis.Redis(host="127.0.0.1", port=spec["port"])
        prefix = spec["prefix"]
        return Handle(
            RedisMap(client, prefix),
            client.lock(prefix + "__lock__", sleep=REDIS_LOCK_SLEEP),
            spec["name"],
            {"client": client},
        )

    @classmethod
    def child_close(cls, h):
        h.extra["client"].close()


# -- plain dict -------------------------------------------------------------------------------


class DictAdapter(Adapter):
    key = "dict"
    label = "dict"
    cross_process = False

    def version(self) -> str:
        import platform

        return "stdlib " + platform.python_version()

    def create(self, initial=None, *, fit_bytes=0):
        return Handle(dict(initial) if initial else {}, threading.Lock(), self.run.new_name())

    def open_second(self, h):
        return h

    def destroy(self, h):
        h.m.clear()


# -- workload 9 transports: no dicts, only the big_* interface -------------------------------


def _nbytes(value: Any) -> int:
    return int(value.nbytes) if hasattr(value, "nbytes") else len(value)


def _is_bytes(value: Any) -> bool:
    return isinstance(value, (bytes, bytearray))


def attach_shm(name: str) -> Any:
    """Attach an existing ``multiprocessing.shared_memory`` segment without tracking it.

    Before Python 3.13 every process that attaches registers the segment with
    the resource tracker, which unlinks it (and warns about a "leak") when the
    tracker ends.  Unregistering afterwards is no cure in a multiprocessing
    child: it shares its parent's tracker, where the creator's registration and
    the attacher's are one entry, so the attacher's unregister drops the
    creator's.  3.13+: ``track=False``; older: no registration while attaching.
    """
    from multiprocessing import resource_tracker, shared_memory

    try:
        return shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]
    except TypeError:
        pass
    register = resource_tracker.register
    resource_tracker.register = lambda name, rtype: None  # type: ignore[assignment]
    try:
        return shared_memory.SharedMemory(name=name)
    finally:
        resource_tracker.register = register  # type: ignore[assignment]


def untrack_shared_memory() -> None:
    """In a process that only attaches (workload 9's reader): no resource-tracker
    registration of shared memory at all, as in a process that imported UltraDict.

    A spawned reader shares the harness's tracker (see :func:`attach_shm`); a
    peer that registers and unregisters on its own (InterProcessPyObjects'
    consumer does) would otherwise drop the creator's registration.
    """
    from multiprocessing import resource_tracker

    register, unregister = resource_tracker.register, resource_tracker.unregister

    def _register(name: str, rtype: str) -> None:
        if rtype != "shared_memory":
            register(name, rtype)

    def _unregister(name: str, rtype: str) -> None:
        if rtype != "shared_memory":
            unregister(name, rtype)

    resource_tracker.register = _register  # type: ignore[assignment]
    resource_tracker.unregister = _unregister  # type: ignore[assignment]


def _shm_unlink_name(name: str) -> None:
    try:
        import _posixshmem  # type: ignore[import-not-found]

        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass
    except ImportError:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            pass


def _shm_release(state: dict[str, Any]) -> None:
    """Close and unlink the segment of ``state`` (by name when it was never opened here)."""
    seg = state.pop("seg", None)
    if seg is None:
        _shm_unlink_name(state["name"])
        return
    try:
        seg.close()
    except BufferError:
        pass  # a view is still exported somewhere; the unlink is what matters
    try:
        seg.unlink()
    except FileNotFoundError:
        pass


def _close_quietly(seg: Any) -> None:
    try:
        seg.close()
    except BufferError:
        pass


def _copy_into(buf: Any, offset: int, value: Any) -> dict[str, Any]:
    """Copy a bytes value or a numpy array into ``buf`` at ``offset``; its description."""
    n = _nbytes(value)
    if _is_bytes(value):
        buf[offset : offset + n] = value
        return {"nbytes": n}
    import numpy as np

    dst = np.ndarray(value.shape, value.dtype, buffer=buf, offset=offset)
    dst[...] = value
    del dst
    return {"nbytes": n, "shape": list(value.shape), "dtype": value.dtype.str}


def _from_buffer(buf: Any, offset: int, spec: dict[str, Any]) -> Any:
    """The value of ``spec['kind']`` over ``buf``: an array or a view without copying, bytes by copying."""
    n = spec["nbytes"]
    kind = spec["kind"]
    if kind == "numpy":
        import numpy as np

        return np.ndarray(tuple(spec["shape"]), np.dtype(spec["dtype"]), buffer=buf, offset=offset)
    if kind == "bytes":
        return bytes(buf[offset : offset + n])
    return buf[offset : offset + n].toreadonly()


class _Transport(Adapter):
    """A way to move one large value between processes that is not a dict (workload 9 only)."""

    dict_like = False
    big_values = True

    def version(self) -> str:
        import platform

        return "stdlib " + platform.python_version()

    @classmethod
    def big_close(cls, h: Any) -> None:
        pass


class ShmAdapter(_Transport):
    """``multiprocessing.shared_memory.SharedMemory(create=True)`` + one copy into it."""

    key = "shm"
    label = "SharedMemory (raw)"
    module = "multiprocessing.shared_memory"  # imported by the reader before its clock starts

    def big_prepare(self, size, kind):
        name = self.run.new_name()
        st: dict[str, Any] = {"name": name, "seg": None, "meta": None}
        self.run.own(name, lambda: _shm_release(st), self.label)
        return st

    def big_write(self, state, key, value):
        from multiprocessing import shared_memory

        seg = state["seg"] = shared_memory.SharedMemory(
            name=state["name"], create=True, size=max(1, _nbytes(value))
        )
        state["meta"] = _copy_into(seg.buf, 0, value)

    def big_spec(self, state):
        return {"adapter": self.key, "name": state["name"], **state["meta"]}

    def big_destroy(self, state, ok=True):
        try:
            _shm_release(state)
        finally:
            self.run.disown(state["name"])

    @classmethod
    def big_open(cls, spec, channel):
        return attach_shm(spec["name"])

    @classmethod
    def big_get(cls, seg, spec, first):
        return _from_buffer(seg.buf, 0, spec)

    @classmethod
    def big_close(cls, seg):
        _close_quietly(seg)


_P5_ALIGN = 64


def _align(n: int) -> int:
    return (n + _P5_ALIGN - 1) // _P5_ALIGN * _P5_ALIGN


class Pickle5Adapter(ShmAdapter):
    """``pickle.dumps(value, protocol=5, buffer_callback=...)`` into one segment.

    Layout: ``<stream length, buffer count, (offset, length) per buffer>`` (u64
    each), the pickle stream inline, then each out-of-band buffer 64-byte
    aligned.  The reader unpickles the stream with ``buffers=`` views of the
    segment: an array comes back over shared memory, without a copy.  A bytes
    value is pickled as ``pickle.PickleBuffer(value)`` (plain bytes would go
    in-band), so it comes back as a read-only memoryview; kind 'bytes' then
    copies it with ``bytes()``.
    """

    key = "pickle5"
    label = "pickle5 out-of-band + shm"

    def big_write(self, state, key, value):
        from multiprocessing import shared_memory

        bufs: list[Any] = []
        obj = pickle.PickleBuffer(value) if _is_bytes(value) else value
        stream = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
        raws = [b.raw() for b in bufs]
        head = 16 + 16 * len(raws)
        layout: list[tuple[int, int]] = []
        end = _align(head + len(stream))
        for r in raws:
            layout.append((end, r.nbytes))
            end = _align(end + r.nbytes)
        seg = state["seg"] = shared_memory.SharedMemory(name=state["name"], create=True, size=end)
        buf = seg.buf
        try:
            struct.pack_into(
                f"<QQ{2 * len(layout)}Q",
                buf,
                0,
                len(stream),
                len(layout),
                *[x for pair in layout for x in pair],
            )
            buf[head : head + len(stream)] = stream
            for (off, n), r in zip(layout, raws):
                buf[off : off + n] = r
        finally:
            del buf
            for r in raws:
                r.release()
            for b in bufs:
                b.release()
        state["meta"] = {
            "nbytes": _nbytes(value),
            "segment_bytes": end,
            "stream_bytes": len(stream),
            "buffers": len(layout),
        }

    @classmethod
    def big_get(cls, seg, spec, first):
        buf = seg.buf
        slen, count = struct.unpack_from("<QQ", buf, 0)
        offs = struct.unpack_from(f"<{2 * count}Q", buf, 16)
        head = 16 + 16 * count
        buffers = [buf[offs[2 * i] : offs[2 * i] + offs[2 * i + 1]] for i in range(count)]
        obj = pickle.loads(buf[head : head + slen], buffers=buffers)
        if spec["kind"] == "bytes":
            return bytes(obj)
        return obj


class PipeAdapter(_Transport):
    """``multiprocessing.Pipe``: ``send``/``recv`` for arrays, ``send_bytes``/``recv_bytes`` for bytes."""

    key = "pipe"
    label = "multiprocessing.Pipe"
    streaming = True
    wakeup = True

    def big_unsupported(self, kind):
        if kind == "view":
            return "a message arrives as a copy: no zero-copy view"
        return None

    def big_prepare(self, size, kind):
        r, w = self.run.ctx.Pipe(duplex=False)
        return {"r": r, "w": w}

    def big_channel(self, state):
        return state["r"]

    def big_write(self, state, key, value):
        if _is_bytes(value):
            state["w"].send_bytes(value)
        else:
            state["w"].send(value)

    def big_spec(self, state):
        return {"adapter": self.key}

    def big_destroy(self, state, ok=True):
        for end in ("w", "r"):
            conn = state.pop(end, None)
            if conn is not None:
                conn.close()

    @classmethod
    def big_open(cls, spec, channel):
        return channel

    @classmethod
    def big_get(cls, conn, spec, first):
        return conn.recv_bytes() if spec["kind"] == "bytes" else conn.recv()

    @classmethod
    def big_close(cls, conn):
        conn.close()


class QueueAdapter(PipeAdapter):
    """``multiprocessing.Queue``: ``put`` (returns at once; a feeder thread pickles and sends) / ``get``."""

    key = "queue"
    label = "multiprocessing.Queue"

    def big_prepare(self, size, kind):
        return {"q": self.run.ctx.Queue()}

    def big_channel(self, state):
        return state["q"]

    def big_write(self, state, key, value):
        state["q"].put(value)

    def big_destroy(self, state, ok=True):
        q = state.pop("q", None)
        if q is None:
            return
        q.close()
        if ok:
            q.join_thread()  # everything was received: the feeder thread has finished
        else:
            q.cancel_join_thread()  # the reader may be gone: do not wait on a full pipe

    @classmethod
    def big_get(cls, q, spec, first):
        return q.get(timeout=900)

    @classmethod
    def big_close(cls, q):
        q.close()


def _sa_delete(name: str) -> None:
    try:
        import SharedArray  # type: ignore[import-not-found]

        SharedArray.delete("shm://" + name)
    except (OSError, ImportError):
        _shm_unlink_name(name)


class SharedArrayAdapter(_Transport):
    """PyPI ``SharedArray``: ``sa.create('shm://name', shape, dtype)`` + a copy; readers ``sa.attach``.

    A bytes value is stored as a uint8 array; kind 'bytes' copies it out with
    ``tobytes()``, kind 'view' is ``memoryview`` of the attached array.
    """

    key = "sharedarray"
    label = "SharedArray"
    module = "SharedArray"

    def load(self) -> None:
        try:
            import numpy  # noqa: F401
            import SharedArray  # noqa: F401
        except ImportError as exc:
            raise Unavailable(f"SharedArray is not installed ({exc}); pip install -e '.[perf]'") from None

    def version(self) -> str:
        return _version("SharedArray")

    def big_prepare(self, size, kind):
        name = self.run.new_name()
        self.run.own(name, lambda: _sa_delete(name), self.label)
        return {"name": name}

    def big_write(self, state, key, value):
        import numpy as np
        import SharedArray as sa

        src = np.frombuffer(value, np.uint8) if _is_bytes(value) else value
        arr = sa.create("shm://" + state["name"], src.shape, src.dtype)
        arr[...] = src
        del arr
        state["nbytes"] = _nbytes(value)

    def big_spec(self, state):
        return {"adapter": self.key, "name": state["name"], "nbytes": state["nbytes"]}

    def big_destroy(self, state, ok=True):
        try:
            _sa_delete(state["name"])
        finally:
            self.run.disown(state["name"])

    @classmethod
    def big_open(cls, spec, channel):
        import SharedArray as sa

        # Attaching is the access itself (sa.attach maps the segment); the handle
        # keeps the last mapping, as an attached segment stays mapped elsewhere.
        return {"sa": sa, "arr": None}

    @classmethod
    def big_get(cls, h, spec, first):
        arr = h["arr"] = h["sa"].attach("shm://" + spec["name"])
        if spec["kind"] == "bytes":
            return arr.tobytes()
        if spec["kind"] == "view":
            return memoryview(arr).toreadonly()
        return arr

    @classmethod
    def big_close(cls, h):
        h["arr"] = None


def _import_ippo() -> Any:
    """``ipc_py_objects`` (InterProcessPyObjects), without its 'Unsupported Python Version' warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import ipc_py_objects  # type: ignore[import-not-found]
    return ipc_py_objects


def _ippo_release(state: dict[str, Any]) -> None:
    sm = state.pop("sm", None)
    if sm is not None:
        try:
            sm.close()  # the creator's close unlinks
        except BufferError:
            pass
    ip = _import_ippo()
    ip.SharedMemory.unlink_by_name(state["name"])  # ignores a missing segment


class IppoAdapter(_Transport):
    """InterProcessPyObjects 1.0.7: a message queue in one shared-memory block.

    The writer creates the block (``SharedMemory(name, create=True, size=...)``,
    untimed: it zeroes the block) and, as its timed write, ``put_message_2``
    inside ``wait_my_turn``.  The reader attaches (``init_consumer``) and takes the
    message (``take_message``): an array comes back mapped on the block, bytes
    as a copy.  The second access re-maps the object from its offset
    (``get_obj``); kind 'view' is ``get_obj_buffer(offset)`` both times.
    """

    key = "ippo"
    label = "InterProcessPyObjects"
    module = "ipc_py_objects"

    def load(self) -> None:
        try:
            import numpy  # noqa: F401

            _import_ippo()
        except Exception as exc:  # a broken cengal_light wheel raises more than ImportError
            raise Unavailable(
                f"InterProcessPyObjects does not import ({exc!r}); it needs "
                "cengal_light==4.4.0: pip install -e '.[perf]'"
            ) from None

    def version(self) -> str:
        return f"{_version('InterProcessPyObjects')} (cengal_light {_version('cengal_light')})"

    @staticmethod
    def block_size(size: int) -> int:
        return size + size // 8 + (1 << 20)

    def big_prepare(self, size, kind):
        ip = _import_ippo()
        name = self.run.new_name()
        st: dict[str, Any] = {"name": name, "sm": None}
        self.run.own(name, lambda: _ippo_release(st), self.label)
        st["sm"] = ip.SharedMemory(name, create=True, size=self.block_size(size))
        return st

    def big_write(self, state, key, value):
        ip = _import_ippo()
        sm = state["sm"]
        with ip.wait_my_turn(sm):
            mapped, offset = sm.put_message_2(value)
        del mapped
        state["offset"] = offset

    def big_spec(self, state):
        return {"adapter": self.key, "name": state["name"], "offset": state["offset"]}

    def big_destroy(self, state, ok=True):
        try:
            _ippo_release(state)
        finally:
            self.run.disown(state["name"])

    @classmethod
    def big_open(cls, spec, channel):
        ip = _import_ippo()
        sm = ip.SharedMemory(spec["name"], create=False)
        sm.init_consumer()
        return (ip, sm)

    @classmethod
    def big_get(cls, h, spec, first):
        ip, sm = h
        with ip.wait_my_turn(sm):
            if spec["kind"] == "view":
                return sm.get_obj_buffer(spec["offset"])
            if first:
                return sm.take_message()
            return sm.get_obj(spec["offset"])

    @classmethod
    def big_close(cls, h):
        _close_quietly(h[1])


# -- workload 10 only: multiprocessing's waits (the code is in perf.wake) --------------------


class _WaitOnly(Adapter):
    """A multiprocessing synchronisation primitive: it takes part in workload 10 only."""

    dict_like = False
    wakeup = True

    def version(self) -> str:
        import platform

        return "stdlib " + platform.python_version()


class EventAdapter(_WaitOnly):
    key = "event"
    label = "multiprocessing.Event"


class ConditionAdapter(_WaitOnly):
    key = "condition"
    label = "multiprocessing.Condition"


ORDER = [
    "ultradict_ng",
    "ultradict_shared",
    "ultradict",
    "smd",
    "manager",
    "redis",
    "dict",
    "shm",
    "pickle5",
    "sharedarray",
    "ippo",
    "pipe",
    "queue",
    "event",
    "condition",
]
ADAPTERS: dict[str, type[Adapter]] = {
    "ultradict_ng": NgAdapter,
    "ultradict_shared": UltraSharedAdapter,
    "ultradict": UltraDefaultAdapter,
    "smd": SmdAdapter,
    "manager": ManagerAdapter,
    "redis": RedisAdapter,
    "dict": DictAdapter,
    "shm": ShmAdapter,
    "pickle5": Pickle5Adapter,
    "sharedarray": SharedArrayAdapter,
    "ippo": IppoAdapter,
    "pipe": PipeAdapter,
    "queue": QueueAdapter,
    "event": EventAdapter,
    "condition": ConditionAdapter,
}
ALIASES = {
    "ng": "ultradict_ng",
    "ultradict-ng": "ultradict_ng",
    "shareddict": "ultradict_ng",
    "ultradict-shared": "ultradict_shared",
    "ultradict_shared_lock": "ultradict_shared",
    "ultradict-default": "ultradict",
    "ultradict_default": "ultradict",
    "shared-memory-dict": "smd",
    "shared_memory_dict": "smd",
    "mp-manager": "manager",
    "multiprocessing": "manager",
    "raw-shm": "shm",
    "shared_memory": "shm",
    "sharedmemory": "shm",
    "pickle5-oob": "pickle5",
    "pickle-oob": "pickle5",
    "pickle5_oob": "pickle5",
    "shared-array": "sharedarray",
    "shared_array": "sharedarray",
    "interprocesspyobjects": "ippo",
    "ipc_py_objects": "ippo",
    "mp-pipe": "pipe",
    "mp-queue": "queue",
    "mp-event": "event",
    "mp-condition": "condition",
    "cond": "condition",
}


def attach_spec(spec: dict[str, Any], inherit: dict[str, Any]) -> Handle:
    """In a child process: open the dict ``spec`` describes."""
    return ADAPTERS[spec["adapter"]].child_attach(spec, inherit)


def close_child(spec: dict[str, Any], h: Handle) -> None:
    ADAPTERS[spec["adapter"]].child_close(h)


def preload(modules: list[str]) -> None:
    """Import the peers the parent imported, so every process patches alike.

    (UltraDict, on import, disables the resource tracker for shared memory in
    that process; keeping all processes in the same state avoids the tracker
    unlinking or warning about segments registered by one and released by another.)
    """
    for mod in modules:
        try:
            importlib.import_module(mod)
        except ImportError:
            pass
