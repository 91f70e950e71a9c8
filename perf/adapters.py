"""One adapter per contender, all with the same small interface.

A workload sees a :class:`Handle` (``h.m``: the mapping, ``h.lock``).  An adapter's ``load``
imports the peer (or raises :class:`Unavailable`); ``create``, ``open_second`` (here),
``child_spec`` (for :func:`attach_spec` in a child) and ``destroy`` handle a dict; ``big_*``
serve workload 9, also for the transports that are no dicts.  Everything created is
registered with the run (``run.own``): an exception or Ctrl-C anywhere still unlinks it.
"""

from __future__ import annotations

import importlib
import itertools
import os
import pickle
import platform
import struct
import threading
import time
import warnings
from contextlib import suppress
from typing import Any, Callable, Optional

PICKLE = pickle.HIGHEST_PROTOCOL
PERF_EXTRA = "pip install -e '.[perf]'"


class Unavailable(Exception):
    """This contender cannot run here (missing package or binary)."""


class Handle:
    """One open dict: ``m`` for the loops, ``lock`` for the locked workloads."""

    __slots__ = ("m", "lock", "name", "extra")

    def __init__(self, m: Any, lock: Any, name: str, extra: Optional[dict[str, Any]] = None) -> None:
        self.m, self.lock, self.name, self.extra = m, lock, name, extra or {}


def _version(dist: str) -> str:
    from importlib.metadata import version

    with suppress(Exception):
        return version(dist)
    return "?"


class Adapter:
    key = label = ""
    aliases = ""  # other --contenders names, space-separated
    module: Optional[str] = None  # peer module a spawned child must import too
    dist: Optional[str] = None  # distribution whose version is reported (None: the stdlib)
    needs: tuple[tuple[str, str], ...] = ()  # (module load imports, why not: {exc} is the error)
    global_side_effects = False  # its import changes process state (UltraDict: the resource tracker)
    uses_mp_shm = False  # multiprocessing.shared_memory: a child needs the parent's imports
    cross_process = True  # False: the dict cannot be opened from another process
    server_based = False  # attach does not load the dict (Manager, Redis)
    dict_like, big_values, wakeup = True, False, False  # takes part in workloads 1-8, 9, 10
    streaming = False  # workload 9: the reader must be receiving while the writer writes
    spec_extra: tuple[str, ...] = ()  # Handle.extra entries a child needs to attach
    inheritables = staticmethod(lambda: {})  # what a child can only receive at its creation (locks)
    shutdown = staticmethod(lambda: None)
    #: (h, quick, sample): writes a measurement needs to amortize the periodic full dumps
    min_writes = staticmethod(lambda h, quick, sample=None: 1)
    #: (fit_bytes): after a failure with values that large, switch to settings that fit, say which
    fallback = staticmethod(lambda fit_bytes: None)
    child_close = staticmethod(lambda h: getattr(h.m, "close", lambda: None)())
    # Workload 9: untimed big_prepare, timed big_write, big_spec and big_channel for the
    # reader, big_destroy (ok: the reader finished); then, in the reader, big_open,
    # big_get (one access: an array, bytes, or a memoryview for kind 'view') and big_close.
    # A dict goes through m[k] = v, m[k] and m.view(k); what raises is reported unavailable.
    big_unsupported = staticmethod(lambda kind: None)  # why it cannot carry kind at all
    big_channel = staticmethod(lambda state: None)  # what the reader gets at its creation (a Pipe end)
    big_open = classmethod(lambda cls, spec, channel: cls.child_attach(spec, {}))
    big_get = staticmethod(
        lambda h, spec, first: h.m.view(spec["key"]) if spec["kind"] == "view" else h.m[spec["key"]]
    )
    big_close = classmethod(lambda cls, h: cls.child_close(h))

    def __init__(self, run: Any) -> None:
        self.run = run

    def load(self) -> None:
        for mod, why in self.needs:
            try:
                importlib.import_module(mod)
            except ImportError as exc:
                raise Unavailable(why.format(exc=exc)) from None

    def version(self) -> str:
        return _version(self.dist) if self.dist else "stdlib " + platform.python_version()

    def runs(self, workload: str) -> bool:
        return {"wakeup": self.wakeup, "big": self.big_values}.get(workload, self.dict_like)

    # create(initial=None, *, fit_bytes=0) -> Handle (fit_bytes: the largest value it must
    # hold), destroy(h) and the child's child_attach(spec, inherit): in each dict adapter
    def open_second(self, h: Handle) -> Handle:
        return self.child_attach(self.child_spec(h), self.inheritables())

    def close_second(self, h2: Handle) -> None:
        self.child_close(h2)

    def child_spec(self, h: Handle) -> dict[str, Any]:
        return {"adapter": self.key, "name": h.name, **{k: h.extra[k] for k in self.spec_extra}}

    def _named(self, cleanup: Callable[[str], Any]) -> str:
        """A new name; the run calls ``cleanup(name)`` at its end unless :meth:`_release` did."""
        name = self.run.new_name()
        self.run.own(name, lambda: cleanup(name), self.label)
        return name

    def _release(self, name: str, unlink: Callable[[], Any], close: Callable[[], Any] = lambda: None) -> None:
        """``close()``, then ``unlink()`` whatever happened; disown ``name`` once it is unlinked."""
        try:
            close()
        finally:
            unlink()
            self.run.disown(name)

    def big_prepare(self, size: int, kind: str) -> Any:
        return self.create(fit_bytes=size)

    def big_write(self, state: Any, key: Any, value: Any) -> None:
        state.m[key] = value

    def big_spec(self, state: Any) -> dict[str, Any]:
        return self.child_spec(state)

    def big_destroy(self, state: Any, ok: bool = True) -> None:
        self.destroy(state)


class _OwnLock(Adapter):
    """A named dict with a lock of its own (``d.lock``): ultradict_ng and UltraDict."""

    peer = ""  # the class, in ``module``

    @classmethod
    def child_attach(cls, spec, inherit):
        d = getattr(__import__(cls.module), cls.peer)(name=spec["name"], create=False)
        return Handle(d, d.lock, spec["name"])

    def min_writes(self, h, quick, sample=(123456, "123456")):
        """Enough writes to fill the update stream 1.1 (full mode: 2.5) times."""
        return int(max(1, h.m.buffer_size // self.record_bytes(h, sample)) * (1.1 if quick else 2.5))


class NgAdapter(_OwnLock):
    key = label = module = "ultradict_ng"
    peer, aliases = "SharedDict", "ng ultradict-ng shareddict"
    big_values = wakeup = True
    # [op, path, key, value] + its header: the 1 MiB stream fills every ~37k writes
    record_bytes = staticmethod(lambda h, sample: 28)

    def load(self):
        from ultradict_ng import SharedDict

        self.SD = SharedDict

    def version(self):
        import ultradict_ng

        return getattr(ultradict_ng, "__version__", _version("ultradict_ng"))

    def create(self, initial=None, *, fit_bytes=0):
        name = self._named(self.SD.unlink_by_name)
        d = self.SD(initial or {}, name=name, create=True)
        return Handle(d, d.lock, name)

    def destroy(self, h):
        # The creating handle auto-unlinks on close; unlink_by_name makes sure of it.
        self._release(h.name, lambda: self.SD.unlink_by_name(h.name), h.m.close)


def unlink_segment(name: str) -> None:
    with suppress(FileNotFoundError):
        os.unlink(os.path.join("/dev/shm", name))  # what shm_unlink does on Linux


def _ultra_dump_name(name: str) -> str:
    """The dynamic full-dump segment UltraDict's control block currently names."""
    with suppress(OSError), open(os.path.join("/dev/shm", name), "rb") as f:
        return f.read(275)[20:275].decode("utf-8", "replace").strip().strip("\x00")
    return ""


def _ultra_unlink_all(name: str, extra: list[str]) -> None:
    for seg in filter(None, [name, name + "_memory", name + "_full", *extra]):
        unlink_segment(seg)


def ultra_orphans(new_entries: list[str], suspects: Optional[set] = None) -> list[str]:
    """Unnamed segments (``psm_*``) that appeared during the run and are UltraDict full dumps:
    headed 0xFF, a 4-byte length, 0xFF, the pickle (0x80 ...), or among ``suspects`` (appeared
    while our workers used UltraDict: a writer killed before it wrote), and mapped by nobody."""
    found = []
    for e in [e for e in new_entries if e.startswith("psm_")]:
        with suppress(OSError), open(os.path.join("/dev/shm", e), "rb") as f:
            head = f.read(7)
            if (len(head) == 7 and head[0] == head[5] == 0xFF and head[6] == 0x80) or e in (suspects or ()):
                found.append(e)
    mapped = set()  # segments some process maps
    for pid in filter(str.isdigit, os.listdir("/proc") if found else []):
        with suppress(OSError), open(f"/proc/{pid}/maps") as f:
            mapped.update(line[line.find("/dev/shm/") + 9 :].split()[0] for line in f if "/dev/shm/" in line)
    return [e for e in found if e not in mapped]


class UltraAdapter(_OwnLock):
    module = dist = peer = "UltraDict"
    needs = (("UltraDict", "UltraDict is not installed ({exc}); " + PERF_EXTRA),)
    global_side_effects = uses_mp_shm = True
    shared_lock = False
    full_dump_size: Optional[int] = None  # set only if a workload cannot run with the defaults
    record_bytes = staticmethod(lambda h, sample: len(h.m.serializer.dumps((True, *sample))) + 6)

    def fallback(self, fit_bytes):  # use a static full-dump segment
        if self.full_dump_size:
            return None
        self.full_dump_size = int(fit_bytes * 1.25) + (1 << 20)
        return (
            f"{self.label}: failed with its defaults for {fit_bytes:,}-byte values; retried with "
            f"full_dump_size={self.full_dump_size:,}"
        )

    def create(self, initial=None, *, fit_bytes=0, full_dump_size=None):
        from UltraDict import UltraDict

        name = self._named(lambda n: _ultra_unlink_all(n, [_ultra_dump_name(n)]))
        if not full_dump_size and self.full_dump_size and fit_bytes:
            full_dump_size = max(self.full_dump_size, int(fit_bytes * 1.25) + (1 << 20))
        opts: dict[str, Any] = {"shared_lock": True} if self.shared_lock else {}
        if full_dump_size:
            opts["full_dump_size"] = full_dump_size
        d = UltraDict(name=name, create=True, **opts)
        if initial:
            self.run.note(
                "UltraDict: large dicts are seeded by filling its local data and calling its "
                "dump() once (same end state as UltraDict(initial); that path appends one "
                "stream record per key and re-dumps the whole dict every ~300 keys with the "
                "10 kB default buffer: O(n^2), hours at 1M keys)"
            )
            with d.lock:
                d.data.update(initial)
                d.dump()
        return Handle(d, d.lock, name)

    def destroy(self, h):
        dump = _ultra_dump_name(h.name)  # (closing removes the control block that names it)
        self._release(h.name, lambda: _ultra_unlink_all(h.name, [dump]), lambda: h.m.close(unlink=True))

    def big_prepare(self, size, kind):
        # buffer_size stays at its default (10 kB): each write of a large value is a full dump
        # (pickle of the whole dict) into the static full-dump segment; attaching unpickles it.
        return self.create(full_dump_size=size + size // 16 + (1 << 20))


class UltraSharedAdapter(UltraAdapter):
    key, label = "ultradict_shared", "UltraDict(shared_lock=True)"
    aliases = "ultradict-shared ultradict_shared_lock"
    needs = UltraAdapter.needs + (("atomics", "UltraDict(shared_lock=True) needs the atomics package"),)
    shared_lock = True
    big_values = True  # workload 9 runs UltraDict once: its lock makes no difference there


class UltraDefaultAdapter(UltraAdapter):
    key, label, aliases = "ultradict", "UltraDict()", "ultradict-default ultradict_default"


class SmdAdapter(Adapter):
    key, label, module = "smd", "shared-memory-dict", "shared_memory_dict"
    dist, aliases = label, "shared-memory-dict shared_memory_dict"
    needs = ((module, "shared-memory-dict is not installed ({exc})"),)
    uses_mp_shm = True
    spec_extra = ("size",)
    child_close = staticmethod(lambda h: h.m.shm.close())

    def load(self):
        super().load()
        self.lock = self.run.ctx.Lock()
        self.run.note(
            "shared-memory-dict: no lock of its own; the locked workloads (3, 4) use a "
            "multiprocessing.Lock (spawn context) passed to every process"
        )

    def inheritables(self):
        return {"smd_lock": self.lock}

    @staticmethod
    def _unlink(name: str) -> None:
        from multiprocessing import shared_memory

        with suppress(FileNotFoundError):
            shm = shared_memory.SharedMemory(name="sm_" + name)  # (unlink() unregisters it)
            shm.close()
            shm.unlink()

    def create(self, initial=None, *, fit_bytes=0):
        # Its size is fixed: the whole pickled dict must fit, with room for the writes.
        need = len(pickle.dumps(initial, PICKLE)) if initial else 0
        size = max(4096, int(need * 1.5) + (64 << 10)) if need else 4096
        if fit_bytes:
            size = max(size, int(fit_bytes * 1.25) + (1 << 20))
        h = self.child_attach({"name": self._named(self._unlink), "size": size}, self.inheritables())
        if initial:
            h.m.update(initial)
        return h

    def destroy(self, h):
        self._release(h.name, lambda: self._unlink(h.name), h.m.shm.close)

    def shutdown(self):
        self.lock = None  # its named semaphore goes with it

    @classmethod
    def child_attach(cls, spec, inherit):
        from shared_memory_dict import SharedMemoryDict

        d = SharedMemoryDict(name=spec["name"], size=spec["size"])
        return Handle(d, inherit["smd_lock"], spec["name"], {"size": spec["size"]})


class ManagerAdapter(Adapter):
    key, label, aliases = "manager", "Manager().dict()", "mp-manager multiprocessing"
    server_based = True
    manager: Any = None
    child_attach = staticmethod(lambda spec, inherit: Handle(spec["proxy"], spec["lock"], spec["name"]))

    def create(self, initial=None, *, fit_bytes=0):
        if self.manager is None:
            self.manager = self.run.ctx.Manager()
            self.run.note(
                "Manager().dict(): locked workloads use manager.Lock(); its server "
                "process is started once and shut down at the end"
            )
        return Handle(self.manager.dict(initial or {}), self.manager.Lock(), self.run.new_name())

    def open_second(self, h):
        return Handle(pickle.loads(pickle.dumps(h.m)), h.lock, h.name)  # a proxy with its own connection

    def child_spec(self, h):
        return {"adapter": self.key, "name": h.name, "proxy": h.m, "lock": h.lock}

    def destroy(self, h):
        with suppress(Exception):
            h.m.clear()
        self.child_close(h)

    def shutdown(self):
        mgr, self.manager = self.manager, None
        if mgr is not None:
            mgr.shutdown()

    @classmethod
    def child_close(cls, h):
        h.m = h.lock = None


REDIS_LOCK_SLEEP = 0.001


class RedisMap:
    """``m[k]`` = GET, ``m[k] = v`` = SET; values pickled (like UltraDict/smd/Manager do)."""

    __slots__ = ("_get", "_set", "_p")

    def __init__(self, client: Any, prefix: str) -> None:
        self._get, self._set, self._p = client.get, client.set, prefix

    def __getitem__(self, key: Any) -> Any:
        raw = self._get(self._p + str(key))
        if raw is None:
            raise KeyError(key)
        return pickle.loads(raw)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._set(self._p + str(key), pickle.dumps(value, PICKLE))


class RedisAdapter(Adapter):
    key = label = module = "redis"
    server_based = True
    wakeup = True  # pub/sub, on the server this adapter starts
    spec_extra = ("port", "prefix")
    server: Any = None
    client: Any = None
    child_close = staticmethod(lambda h: h.extra["client"].close())

    def load(self):
        from .redis_server import RedisServer, redis_binary

        try:
            import redis
        except ImportError as exc:
            raise Unavailable(f"redis-py is not installed ({exc})") from None
        binary = redis_binary()
        if not binary:
            raise Unavailable("no redis-server binary on PATH (the harness never installs it)")
        self.server = RedisServer.start(binary)
        self.run.own_resource("redis-server", self.shutdown)
        self.client = redis.Redis(host="127.0.0.1", port=self.server.port)
        self.client.ping()
        self.live: set[str] = set()
        self.run.note(
            f"redis: private redis-server {self.server.version()} on 127.0.0.1:{self.server.port} "
            "(--save '' --appendonly no); m[k] = GET/SET of pickled values; the locked workloads "
            f"use a redis-py Lock around GET+SET with sleep={REDIS_LOCK_SLEEP} (its default polling "
            "interval is 0.1 s)"
        )

    def version(self):
        return f"redis-py {_version('redis')}, server {self.server.version() if self.server else '-'}"

    def create(self, initial=None, *, fit_bytes=0):
        name = self.run.new_name()
        self.live.add(name + ":")
        items = iter((initial or {}).items())
        while chunk := list(itertools.islice(items, 10_000)):
            self.client.mset({f"{name}:{k}": pickle.dumps(v, PICKLE) for k, v in chunk})
        return self._handle(self.client, name + ":", name, port=self.server.port)

    @staticmethod
    def _handle(client: Any, prefix: str, name: str, /, **extra: Any) -> Handle:
        lock = client.lock(prefix + "__lock__", sleep=REDIS_LOCK_SLEEP)
        return Handle(RedisMap(client, prefix), lock, name, {"prefix": prefix, **extra})

    def destroy(self, h):
        self.live.discard(h.extra["prefix"])
        if not self.live:
            return self.client.flushdb()
        keys = self.client.scan_iter(match=h.extra["prefix"] + "*", count=10_000)
        while batch := list(itertools.islice(keys, 10_000)):
            self.client.unlink(*batch)

    def incr_loop(self, key: str) -> Callable[[int], float]:
        """INCR: Redis's own atomic increment (not the same shape: reported as a note)."""
        incr = self.client.incr

        def loop(n: int) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                incr(key)
            return time.perf_counter() - t0

        return loop

    def shutdown(self):
        client, server, self.client, self.server = self.client, self.server, None, None
        if client is not None:
            with suppress(Exception):
                client.close()
        if server is not None:
            server.stop()

    @classmethod
    def child_attach(cls, spec, inherit):
        import redis

        client = redis.Redis(host="127.0.0.1", port=spec["port"])
        return cls._handle(client, spec["prefix"], spec["name"], client=client)


class DictAdapter(Adapter):
    key = label = "dict"
    cross_process = False
    open_second = staticmethod(lambda h: h)
    destroy = staticmethod(lambda h: h.m.clear())

    def create(self, initial=None, *, fit_bytes=0):
        return Handle(dict(initial or {}), threading.Lock(), self.run.new_name())


# workload 9's transports: no dicts, only the big_* interface
def _nbytes(value: Any) -> int:
    return int(value.nbytes) if hasattr(value, "nbytes") else len(value)


def _is_bytes(value: Any) -> bool:
    return isinstance(value, (bytes, bytearray))


def attach_shm(name: str) -> Any:
    """Attach a segment untracked: an attacher's resource-tracker registration would unlink it
    at the end, and a multiprocessing child shares its parent's tracker, so unregistering
    drops the creator's.  3.13+: ``track=False``; older: no registration while attaching."""
    from multiprocessing import resource_tracker, shared_memory

    with suppress(TypeError):
        return shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]
    register = resource_tracker.register
    resource_tracker.register = lambda name, rtype: None  # type: ignore[assignment]
    try:
        return shared_memory.SharedMemory(name=name)
    finally:
        resource_tracker.register = register  # type: ignore[assignment]


def untrack_shared_memory() -> None:
    """In workload 9's reader: no tracking of shared memory (as after importing UltraDict): in the
    tracker it shares, a peer's own register + unregister (ippo's) would drop the creator's."""
    from multiprocessing import resource_tracker

    def skip_shm(fn: Callable[[str, str], None]) -> Callable[[str, str], None]:
        return lambda name, rtype: None if rtype == "shared_memory" else fn(name, rtype)

    resource_tracker.register = skip_shm(resource_tracker.register)  # type: ignore[assignment]
    resource_tracker.unregister = skip_shm(resource_tracker.unregister)  # type: ignore[assignment]


def _close_quietly(seg: Any) -> None:
    with suppress(BufferError):  # a view is still exported somewhere; the unlink is what matters
        seg.close()


class _Transport(Adapter):
    """Moves one large value, no dict; state: ``name`` (``free(state)`` releases it), ``spec``."""

    dict_like, big_values = False, True
    big_spec = staticmethod(lambda state: state["spec"])
    big_channel = staticmethod(lambda state: state.get("channel"))
    big_close = staticmethod(_close_quietly)

    @staticmethod
    def free(state: dict[str, Any]) -> None:
        """Close and unlink the segment of ``state`` (by name when it was never opened here)."""
        seg = state.pop("seg", None)
        if seg is None:
            return unlink_segment(state["name"])
        _close_quietly(seg)
        with suppress(FileNotFoundError):
            seg.unlink()

    def big_prepare(self, size, kind):
        st: dict[str, Any] = {}
        st["name"] = self._named(lambda n: self.free(st))
        st["spec"] = {"adapter": self.key, "name": st["name"]}
        return st

    def big_destroy(self, state, ok=True):
        self._release(state["name"], lambda: self.free(state))


class ShmAdapter(_Transport):
    """``multiprocessing.shared_memory.SharedMemory(create=True)`` + one copy into it."""

    key, label, aliases = "shm", "SharedMemory (raw)", "raw-shm shared_memory sharedmemory"
    module = "multiprocessing.shared_memory"  # imported by the reader before its clock starts
    big_open = staticmethod(lambda spec, channel: attach_shm(spec["name"]))

    @staticmethod
    def _segment(state: dict[str, Any], size: int) -> Any:
        from multiprocessing import shared_memory

        state["seg"] = shared_memory.SharedMemory(name=state["name"], create=True, size=size)
        return state["seg"].buf

    def big_write(self, state, key, value):
        n = _nbytes(value)
        buf = self._segment(state, max(1, n))
        state["spec"]["nbytes"] = n
        if _is_bytes(value):
            buf[:n] = value
        else:
            import numpy as np

            np.ndarray(value.shape, value.dtype, buffer=buf)[...] = value
            state["spec"].update(shape=list(value.shape), dtype=value.dtype.str)

    @classmethod
    def big_get(cls, seg, spec, first):
        if spec["kind"] == "numpy":
            import numpy as np

            return np.ndarray(tuple(spec["shape"]), np.dtype(spec["dtype"]), buffer=seg.buf)
        view = seg.buf[: spec["nbytes"]]
        return bytes(view) if spec["kind"] == "bytes" else view.toreadonly()


class Pickle5Adapter(ShmAdapter):
    """``pickle.dumps(value, protocol=5, buffer_callback=...)`` into one segment: ``<stream length,
    buffer count, (offset, length) per buffer>`` (u64), the stream, each buffer 64-byte aligned.
    Bytes go as a ``PickleBuffer`` (else in-band), come back as a read-only memoryview."""

    key, label, aliases = "pickle5", "pickle5 out-of-band + shm", "pickle5-oob pickle-oob pickle5_oob"

    def big_write(self, state, key, value):
        bufs: list[Any] = []
        obj = pickle.PickleBuffer(value) if _is_bytes(value) else value
        stream = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
        raws = [b.raw() for b in bufs]
        head = 16 + 16 * len(raws)
        layout: list[int] = []  # offset, length of each buffer
        end = (head + len(stream) + 63) // 64 * 64
        for r in raws:
            layout += [end, r.nbytes]
            end = (end + r.nbytes + 63) // 64 * 64
        buf = self._segment(state, end)
        try:
            struct.pack_into(f"<QQ{len(layout)}Q", buf, 0, len(stream), len(raws), *layout)
            buf[head : head + len(stream)] = stream
            for off, r in zip(layout[::2], raws):
                buf[off : off + r.nbytes] = r
        finally:
            del buf
            for b in raws + bufs:
                b.release()
        spec = state["spec"]
        spec.update(nbytes=_nbytes(value), segment_bytes=end, stream_bytes=len(stream), buffers=len(raws))

    @classmethod
    def big_get(cls, seg, spec, first):
        buf = seg.buf
        slen, count = struct.unpack_from("<QQ", buf, 0)
        offs = struct.unpack_from(f"<{2 * count}Q", buf, 16)
        buffers = [buf[off : off + n] for off, n in zip(offs[::2], offs[1::2])]
        obj = pickle.loads(buf[16 + 16 * count : 16 + 16 * count + slen], buffers=buffers)
        return bytes(obj) if spec["kind"] == "bytes" else obj


class PipeAdapter(_Transport):
    """``multiprocessing.Pipe``: ``send``/``recv`` for arrays, ``send_bytes``/``recv_bytes`` for bytes."""

    key, label, aliases = "pipe", "multiprocessing.Pipe", "mp-pipe"
    streaming = wakeup = True
    big_open = staticmethod(lambda spec, channel: channel)
    big_get = staticmethod(
        lambda conn, spec, first: conn.recv_bytes() if spec["kind"] == "bytes" else conn.recv()
    )
    big_unsupported = staticmethod(
        lambda kind: "a message arrives as a copy: no zero-copy view" if kind == "view" else None
    )

    def big_prepare(self, size, kind):
        r, w = self.run.ctx.Pipe(duplex=False)
        return {"channel": r, "w": w, "spec": {"adapter": self.key}}

    def big_write(self, state, key, value):
        (state["w"].send_bytes if _is_bytes(value) else state["w"].send)(value)

    def big_destroy(self, state, ok=True):
        for conn in filter(None, (state.pop("w", None), state.pop("channel", None))):
            conn.close()


class QueueAdapter(PipeAdapter):
    """``multiprocessing.Queue``: ``put`` (returns at once; a feeder thread pickles and sends) / ``get``."""

    key, label, aliases = "queue", "multiprocessing.Queue", "mp-queue"
    big_get = staticmethod(lambda q, spec, first: q.get(timeout=900))

    def big_prepare(self, size, kind):
        return {"channel": self.run.ctx.Queue(), "spec": {"adapter": self.key}}

    def big_write(self, state, key, value):
        state["channel"].put(value)

    def big_destroy(self, state, ok=True):
        q = state.pop("channel", None)
        if q is not None:
            q.close()
            # All received: the feeder thread has finished; else do not wait on a full pipe.
            q.join_thread() if ok else q.cancel_join_thread()


class SharedArrayAdapter(_Transport):
    """PyPI ``SharedArray``: ``sa.create('shm://name', shape, dtype)`` + a copy; readers ``sa.attach``
    (bytes: a uint8 array; kind 'bytes' copies it out with ``tobytes()``)."""

    key, label, aliases = "sharedarray", "SharedArray", "shared-array shared_array"
    module = dist = label
    missing = "SharedArray is not installed ({exc}); " + PERF_EXTRA
    needs = (("numpy", missing), ("SharedArray", missing))
    free = staticmethod(lambda state: unlink_segment(state["name"]))  # what SharedArray.delete does
    big_close = staticmethod(lambda h: h.update(arr=None))

    def big_write(self, state, key, value):
        import numpy as np
        import SharedArray as sa

        src = np.frombuffer(value, np.uint8) if _is_bytes(value) else value
        sa.create("shm://" + state["name"], src.shape, src.dtype)[...] = src
        state["spec"]["nbytes"] = _nbytes(value)

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
        return memoryview(arr).toreadonly() if spec["kind"] == "view" else arr


def _import_ippo() -> Any:
    """``ipc_py_objects`` (InterProcessPyObjects), without its 'Unsupported Python Version' warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import ipc_py_objects  # type: ignore[import-not-found]
    return ipc_py_objects


class IppoAdapter(_Transport):
    """InterProcessPyObjects 1.0.7: a message queue in one block (made untimed: it is zeroed);
    the timed write is ``put_message_2``.  The reader takes the message, then re-maps it from
    its offset (``get_obj``); kind 'view' is ``get_obj_buffer(offset)`` both times."""

    key, label, module = "ippo", "InterProcessPyObjects", "ipc_py_objects"
    aliases = "interprocesspyobjects ipc_py_objects"
    big_close = staticmethod(lambda h: _close_quietly(h[1]))

    @staticmethod
    def free(state: dict[str, Any]) -> None:
        sm = state.pop("sm", None)
        if sm is not None:
            _close_quietly(sm)  # the creator's close unlinks
        _import_ippo().SharedMemory.unlink_by_name(state["name"])  # ignores a missing segment

    def load(self):
        try:
            import numpy  # noqa: F401

            _import_ippo()
        except Exception as exc:  # a broken cengal_light wheel raises more than ImportError
            raise Unavailable(
                f"InterProcessPyObjects does not import ({exc!r}); it needs cengal_light==4.4.0: {PERF_EXTRA}"
            ) from None

    def version(self):
        return f"{_version('InterProcessPyObjects')} (cengal_light {_version('cengal_light')})"

    def big_prepare(self, size, kind):
        st = super().big_prepare(size, kind)
        st["sm"] = _import_ippo().SharedMemory(st["name"], create=True, size=size + size // 8 + (1 << 20))
        return st

    def big_write(self, state, key, value):
        with _import_ippo().wait_my_turn(state["sm"]):
            mapped, state["spec"]["offset"] = state["sm"].put_message_2(value)
        del mapped

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
            return sm.take_message() if first else sm.get_obj(spec["offset"])


class EventAdapter(Adapter):  # workload 10 only (the code is in perf.wake), as is Condition
    key, label, aliases = "event", "multiprocessing.Event", "mp-event"
    dict_like, wakeup = False, True


class ConditionAdapter(EventAdapter):
    key, label, aliases = "condition", "multiprocessing.Condition", "mp-condition cond"


_ALL = [NgAdapter, UltraSharedAdapter, UltraDefaultAdapter, SmdAdapter, ManagerAdapter, RedisAdapter]
_ALL += [DictAdapter, ShmAdapter, Pickle5Adapter, SharedArrayAdapter, IppoAdapter, PipeAdapter]
_ALL += [QueueAdapter, EventAdapter, ConditionAdapter]
ADAPTERS: dict[str, type[Adapter]] = {c.key: c for c in _ALL}
ORDER = list(ADAPTERS)
ALIASES = {alias: c.key for c in ADAPTERS.values() for alias in c.aliases.split()}


def attach_spec(spec: dict[str, Any], inherit: dict[str, Any]) -> Handle:
    """In a child process: open the dict ``spec`` describes."""
    return ADAPTERS[spec["adapter"]].child_attach(spec, inherit)


def close_child(spec: dict[str, Any], h: Handle) -> None:
    ADAPTERS[spec["adapter"]].child_close(h)


def preload(modules: list[str]) -> None:
    """Import the peers the parent imported, so that every process patches alike (UltraDict's
    import switches off the resource tracker for shared memory: processes in different states
    would unlink or warn about segments registered by one and released by another)."""
    for mod in modules:
        with suppress(ImportError):
            importlib.import_module(mod)
