"""One adapter per contender, all with the same small interface.

A workload only ever sees a :class:`Handle`: ``h.m`` (the mapping its loops
index: ``m[k]``, ``m[k] = v``) and ``h.lock`` (a context manager for the
read-modify-write workloads).  The adapter creates a dict (``create``), opens a
second handle on it in this process (``open_second``), describes it for another
process (``child_spec``; the child calls :func:`attach_spec`), and removes it
(``destroy``).  Peers are imported lazily in :meth:`Adapter.load`, which raises
:class:`Unavailable` with the reason when a peer cannot be used.

Everything created is registered with the run (``run.own``) with a cleanup
function, so an exception or Ctrl-C anywhere still unlinks it.
"""

from __future__ import annotations

import importlib
import os
import pickle
import threading
from typing import Any, Callable, Dict, List, Optional, Type

__all__ = ["ADAPTERS", "ORDER", "ALIASES", "Adapter", "Handle", "Unavailable", "attach_spec",
           "close_child"]

PICKLE = pickle.HIGHEST_PROTOCOL


class Unavailable(Exception):
    """This contender cannot run here (missing package or binary)."""


class Handle:
    """One open dict: ``m`` for the loops, ``lock`` for the locked workloads."""

    __slots__ = ("m", "lock", "name", "extra")

    def __init__(self, m: Any, lock: Any, name: str, extra: Optional[Dict[str, Any]] = None) -> None:
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

    def __init__(self, run: Any) -> None:
        self.run = run

    # -- parent side -------------------------------------------------------------------
    def load(self) -> None:
        """Import the peer (raise Unavailable with the reason)."""

    def version(self) -> str:
        return "-"

    def create(self, initial: Optional[Dict[Any, Any]] = None, *,
               fit_bytes: int = 0) -> Handle:
        """A new dict holding ``initial``; ``fit_bytes``: the largest value it must hold."""
        raise NotImplementedError

    def open_second(self, h: Handle) -> Handle:
        """Another handle on the same dict, in this process."""
        raise NotImplementedError

    def close_second(self, h2: Handle) -> None:
        pass

    def child_spec(self, h: Handle) -> Dict[str, Any]:
        return {"adapter": self.key, "name": h.name}

    def inheritables(self) -> Dict[str, Any]:
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

    # -- child side --------------------------------------------------------------------
    @classmethod
    def child_attach(cls, spec: Dict[str, Any], inherit: Dict[str, Any]) -> Handle:
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


def _ultra_unlink_all(name: str, extra: List[str]) -> None:
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
                        names.add(line[i + 9:].split()[0])
        except OSError:
            continue
    return names


def ultra_orphans(new_entries: List[str], suspects: Optional[set] = None) -> List[str]:
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

    def _new(self, name: str, create: bool, fit_bytes: int = 0) -> Any:
        if not create:
            return self.UD(name=name, create=False)  # configuration comes from the creator
        kwargs: Dict[str, Any] = {}
        if self.shared_lock:
            kwargs["shared_lock"] = True
        if self.full_dump_size and fit_bytes:
            kwargs["full_dump_size"] = max(self.full_dump_size, int(fit_bytes * 1.25) + (1 << 20))
        return self.UD(name=name, create=True, **kwargs)

    def fallback(self, fit_bytes: int) -> Optional[str]:
        """The defaults failed for values of ``fit_bytes``: use a static full-dump segment."""
        if self.full_dump_size:
            return None
        self.full_dump_size = int(fit_bytes * 1.25) + (1 << 20)
        return (f"{self.label}: failed with its defaults for {fit_bytes:,}-byte values; retried with "
                f"full_dump_size={self.full_dump_size:,}")

    def create(self, initial=None, *, fit_bytes=0):
        name = self.run.new_name()
        dumps: List[str] = []
        self.run.own(name, lambda: _ultra_unlink_all(name, dumps + [_ultra_dump_name(name)]),
                     self.label)
        d = self._new(name, True, fit_bytes)
        if initial:
            if not UltraAdapter._seed_noted:
                UltraAdapter._seed_noted = True
                self.run.note(
                    "UltraDict: large dicts are seeded by filling its local data and calling its "
                    "dump() once (same end state as UltraDict(initial); that path appends one "
                    "stream record per key and re-dumps the whole dict every ~300 keys with the "
                    "10 kB default buffer: O(n^2), hours at 1M keys)")
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


class UltraSharedAdapter(UltraAdapter):
    key = "ultradict_shared"
    label = "UltraDict(shared_lock=True)"
    shared_lock = True

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
        self.run.note("shared-memory-dict: no lock of its own; the locked workloads (3, 4) use a "
                      "multiprocessing.Lock (spawn context) passed to every process")

    def version(self) -> str:
        return _version("shared-memory-dict")

    def inheritables(self):
        return {"smd_lock": self.lock}

    def size_for(self, initial: Optional[Dict[Any, Any]], fit_bytes: int) -> int:
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
            self.run.note("Manager().dict(): locked workloads use manager.Lock(); its server "
                          "process is started once and shut down at the end")
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
        self.live: Dict[str, int] = {}
        self.run.note(
            f"redis: private redis-server {self.server.version()} on 127.0.0.1:{self.server.port} "
            "(--save '' --appendonly no); m[k] = GET/SET of pickled values; the locked workloads "
            f"use a redis-py Lock around GET+SET with sleep={REDIS_LOCK_SLEEP} (its default polling "
            "interval is 0.1 s)")

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
                self.client.mset({prefix + str(k): pickle.dumps(v, PICKLE)
                                  for k, v in items[i:i + 10_000]})
        return Handle(RedisMap(self.client, prefix), self._lock(self.client, prefix), name,
                      {"prefix": prefix})

    def open_second(self, h):
        client = self.redis.Redis(host="127.0.0.1", port=self.server.port)
        return Handle(RedisMap(client, h.extra["prefix"]), self._lock(client, h.extra["prefix"]),
                      h.name, {"client": client, **h.extra})

    def close_second(self, h2):
        h2.extra["client"].close()

    def child_spec(self, h):
        return {"adapter": self.key, "name": h.name, "port": self.server.port,
                "prefix": h.extra["prefix"]}

    def destroy(self, h):
        prefix = h.extra["prefix"]
        self.live.pop(prefix, None)
        if not self.live:
            self.client.flushdb()
            return
        batch: List[Any] = []
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
        return Handle(RedisMap(client, prefix), client.lock(prefix + "__lock__", sleep=REDIS_LOCK_SLEEP),
                      spec["name"], {"client": client})

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


ORDER = ["ultradict_ng", "ultradict_shared", "ultradict", "smd", "manager", "redis", "dict"]
ADAPTERS: Dict[str, Type[Adapter]] = {
    "ultradict_ng": NgAdapter,
    "ultradict_shared": UltraSharedAdapter,
    "ultradict": UltraDefaultAdapter,
    "smd": SmdAdapter,
    "manager": ManagerAdapter,
    "redis": RedisAdapter,
    "dict": DictAdapter,
}
ALIASES = {
    "ng": "ultradict_ng", "ultradict-ng": "ultradict_ng", "shareddict": "ultradict_ng",
    "ultradict-shared": "ultradict_shared", "ultradict_shared_lock": "ultradict_shared",
    "ultradict-default": "ultradict", "ultradict_default": "ultradict",
    "shared-memory-dict": "smd", "shared_memory_dict": "smd",
    "mp-manager": "manager", "multiprocessing": "manager",
}


def attach_spec(spec: Dict[str, Any], inherit: Dict[str, Any]) -> Handle:
    """In a child process: open the dict ``spec`` describes."""
    return ADAPTERS[spec["adapter"]].child_attach(spec, inherit)


def close_child(spec: Dict[str, Any], h: Handle) -> None:
    ADAPTERS[spec["adapter"]].child_close(h)


def preload(modules: List[str]) -> None:
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
