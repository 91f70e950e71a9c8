"""Corruption fuzz: hypothesis damages the control, stream and dump segments of a
live dict (bit flips, overwritten bytes and words, zeroed ranges, truncated dumps,
foreign segments under our names).  Every outcome must be a state the dict really
had, or a SharedDictError with a message -- never another exception, a hang, a
crash or a huge allocation -- and cleanup must still leave nothing behind.

Not covered, by design: shrinking (ftruncate) a segment that processes have
mapped.  Touching the lost pages raises SIGBUS in every such process; no
user-space library can turn that into an exception.  Segments are mode 0600, so
only the dict's own user can do it.  Nor the payload bytes of a blob: they are
not checksummed, because a reader maps them without reading them (zero-copy at
any size); its header and size are checked, and are fuzzed here.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable

import hypothesis.strategies as st
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings

from tests.conftest import soak_scaled, unique_name
from ultradict_ng import SharedDict, SharedDictError, unlink_by_name
from ultradict_ng._platform import listing, segments
from ultradict_ng._platform.owner import owner_alive, owner_word
from ultradict_ng._platform.segments import Segment
from ultradict_ng._shm import layout as L

EDITS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "byte", "word", "zero", "truncate"]),
        st.integers(0, 1 << 16),  # offset, folded into the segment
        st.integers(0, (1 << 64) - 1),  # bit / byte / word value
    ),
    min_size=1,
    max_size=4,
)


class Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang("operation did not finish within 20 s")


def build(name: str) -> list[dict[Any, Any]]:
    """A dict with a dump and stream records after it; returns its history of states."""
    history: list[dict[Any, Any]] = [{}]
    d = SharedDict(name=name, recurse=True, buffer_size=512, auto_unlink=False, blob_threshold=1000)
    ops: list[Callable[[dict[Any, Any]], None]] = [
        lambda m: m.update({"a": 1, ("t", 1): [1, 2.5, None]}),
        lambda m: m.__setitem__("big", b"x" * 600),  # dump
        lambda m: m.__setitem__("blob", [b"y" * 3000, 1]),  # a blob (id 1)
        lambda m: m.__setitem__("blob2", bytearray(b"z" * 2000)),  # the latest blob (id 2)
        lambda m: m.__setitem__("n", {"inner": {"deep": "v"}}),
        lambda m: m.__setitem__("a", 2),
        lambda m: m.pop(("t", 1)),
        lambda m: m.__setitem__("s", frozenset({1, 2})),
    ]
    model: dict[Any, Any] = {}
    for op in ops:
        op(d)
        op(model)
        history.append(SharedDict.copy(d))
    d.close()
    return history


def mapped_here(seg_name: str) -> bool:
    """Whether this process maps the segment (every handle of the test is in it)."""
    with open("/proc/self/maps") as maps:
        return any(line.rstrip().endswith(f"/dev/shm/{seg_name}") for line in maps)


def damage(name: str, target: str, edits: list[Any]) -> None:
    if target == "foreign-blob":
        bname = L.blob_name(name, 2)
        segments.unlink(bname)
        foreign = Segment.create(bname, 64 + edits[0][1] % 4096)
        foreign.buf[:8] = edits[0][2].to_bytes(8, "little")
        foreign.close()
        return
    if target == "foreign-dump":
        # A foreign segment in place of the published dump.
        seg = Segment.attach(name)
        gen = int.from_bytes(seg.buf[8 * L.W_STATE : 8 * L.W_STATE + 8], "little") >> 32
        seg.close()
        dname = L.dump_name(name, gen)
        segments.unlink(dname)
        foreign = Segment.create(dname, 64 + edits[0][1] % 4096)
        foreign.buf[:8] = edits[0][2].to_bytes(8, "little")
        foreign.close()
        return
    if target == "control":
        seg_name = name
    elif target == "stream":
        seg_name = L.stream_name(name)
    elif target == "blob":
        seg_name = L.blob_name(name, 1 + edits[0][2] % 2)
    else:
        ctrl = Segment.attach(name)
        gen = int.from_bytes(ctrl.buf[8 * L.W_STATE : 8 * L.W_STATE + 8], "little") >> 32
        ctrl.close()
        seg_name = L.dump_name(name, gen)
    seg = Segment.attach(seg_name)
    # A blob's edits stay in its header (see the module docstring).
    limit = L.BLOB_HEADER if target == "blob" else seg.size
    try:
        for kind, offset, value in edits:
            offset %= seg.size if kind == "truncate" else limit
            if kind == "flip":
                seg.buf[offset] ^= 1 << (value % 8)
            elif kind == "byte":
                seg.buf[offset] = value % 256
            elif kind == "word":
                at = offset - offset % 8
                if at + 8 <= seg.size:
                    seg.buf[at : at + 8] = value.to_bytes(8, "little")
            elif kind == "zero":
                end = min(limit, offset + 1 + value % 64)
                seg.buf[offset:end] = bytes(end - offset)
            elif kind == "truncate" and target in ("dump", "blob"):
                # Only dumps and blobs nobody mapped yet (see the module docstring):
                # a reader of a dump read in place (a TableCache) keeps it mapped.
                seg.close()
                if not mapped_here(seg_name):
                    os.truncate(f"/dev/shm/{seg_name}", offset)
                return
    finally:
        seg.close()


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run one operation, ``fn(*args, **kwargs)``: its result, or the SharedDictError
    it raised. Anything else fails."""
    try:
        return fn(*args, **kwargs)
    except SharedDictError as exc:
        assert str(exc), f"{type(exc).__name__} without a message"
        return exc


@settings(max_examples=soak_scaled(120), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    target=st.sampled_from(["control", "stream", "dump", "foreign-dump", "blob", "foreign-blob"]), edits=EDITS
)
def test_corruption_never_crashes_hangs_or_lies(target: str, edits: list[Any]) -> None:
    name = unique_name()
    retries = L.READER_RETRIES
    L.READER_RETRIES = 5  # the outcome is the same, the fuzz just gets there sooner
    old_handler = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(20)
    handles: list[SharedDict] = []
    try:
        history = build(name)
        reader = SharedDict(name=name, create=False)
        handles.append(reader)
        damage(name, target, edits)

        def fresh_copy() -> Any:
            h = SharedDict(name=name, create=False)
            handles.append(h)
            return h.copy()

        def write_then_read() -> Any:
            reader["w"] = 1
            return reader.copy()

        def bounded_reads() -> Any:
            """Every key read one by one by a handle keeping 2 rows decoded
            (max_decoded: a big dict's reads drop and decode rows again)."""
            h = SharedDict(name=name, create=False, max_decoded=2)
            handles.append(h)
            return [(k, h.get(k, None)) for k in sorted({k for s in history for k in s}, key=repr) * 2]

        states = history + [dict(h, w=1) for h in history]
        for op in (fresh_copy, reader.copy, write_then_read, fresh_copy):
            out = attempt(op)
            if isinstance(out, dict):
                assert out in states, f"{op.__name__} returned a state the dict never had: {out!r}"
        out = attempt(bounded_reads)
        if isinstance(out, list):
            for k, v in out:
                assert v in [s.get(k) for s in states], f"read {k!r} as {v!r}, a value it never had"
        attempt(lambda: reader.lock.acquire(timeout=1) and reader.lock.release())
    finally:
        for h in handles:
            h.close()
        try:
            outcome = attempt(lambda: unlink_by_name(name))
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old_handler)
            L.READER_RETRIES = retries
        if isinstance(outcome, SharedDictError):
            # Refusing to delete what no longer looks like ours is right; the test cleans up.
            for entry in listing.listed(name):
                segments.unlink(entry)
        leftovers = listing.listed(name)
        for entry in leftovers:
            segments.unlink(entry)
    assert not leftovers, f"unlink_by_name left {leftovers}"


#: The words of the wait register (layout: "Waiting and waking") and its slots.
WAIT_TARGETS = st.one_of(
    st.sampled_from([L.W_CHANGE_WAITERS, L.W_CHANGE_SEQ, L.W_LOCK_WAITERS, L.W_LOCK_SEQ, L.W_LOCK_WAKING]),
    st.integers(L.W_WAIT_SLOTS, L.W_WAIT_SLOTS + L.WAIT_SLOTS - 1),
)
#: Garbage, and the owner words that mean something: ours, a dead process's, a live one's.
WAIT_VALUES = st.one_of(
    st.integers(0, (1 << 64) - 1), st.sampled_from(["mine", "dead", "live", 0, 1, (1 << 64) - 1, 0xFFFFFFFF])
)


def _word(value: Any) -> int:
    if value == "mine":
        return owner_word()
    if value == "dead":  # a pid above any pid_max: no such process
        return L.PID_MASK | (12345 << L.PID_BITS)
    if value == "live":
        return owner_word(os.getppid())
    return int(value)


@settings(max_examples=soak_scaled(30), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    edits=st.lists(st.tuples(WAIT_TARGETS, WAIT_VALUES), min_size=1, max_size=6),
    fill=st.sampled_from([None, None, "live", "dead", "mine", 0xDEADBEEF]),
)
def test_garbage_in_the_wait_register_never_hangs_or_crashes(edits: list[Any], fill: Any) -> None:
    """Whatever the WAITERS, SEQ and WAKING words and the slots hold (every slot
    taken, ours, dead owners, random bits), waits end at their timeout or at a
    write, the lock and the feed work, and cleanup leaves nothing."""
    name = unique_name()
    old_handler = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(20)
    handles: list[SharedDict] = []
    try:
        d = SharedDict(name=name, buffer_size=256)
        handles.append(d)
        r = SharedDict(name=name, create=False)
        handles.append(r)
        d["k"] = 0
        r.get("k")
        atomic = d._store._map.atomic
        if fill is not None:
            for i in range(L.WAIT_SLOTS):
                atomic.store(L.W_WAIT_SLOTS + i, _word(fill))
        for index, value in edits:
            atomic.store(index, _word(value))

        t0 = time.monotonic()
        assert r.wait_for_change(timeout=0.05) is False
        assert time.monotonic() - t0 < 2.0
        timer = threading.Timer(0.02, lambda: d.__setitem__("k", 1))
        t0 = time.monotonic()
        timer.start()
        assert r.wait_for_change(timeout=5) is True and r["k"] == 1
        assert time.monotonic() - t0 < 2.0, "the write did not wake the waiter"
        timer.join()
        with d.lock(timeout=2):
            d["k"] = 2
        assert [(c.op, c.key, c.value) for c in r.changes(timeout=0.02)] == [("set", "k", 2)]
        d["k"] = 3  # a write that may find garbage bits: wakes, maybe sweeps
        assert r["k"] == 3 and r.wait_for_change(timeout=0) is False
    finally:
        for h in reversed(handles):
            h.close()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)
    assert not listing.listed(name)


#: The words of the user register (layout: "Users"): CLOSING, USER_OVERFLOW, the slots.
USER_TARGETS = st.one_of(
    st.sampled_from([L.W_CLOSING, L.W_USER_OVERFLOW]),
    st.integers(L.W_USER_SLOTS, L.W_USER_SLOTS + L.USER_SLOTS - 1),
)


@pytest.mark.slow
@settings(max_examples=soak_scaled(30), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    edits=st.lists(st.tuples(USER_TARGETS, WAIT_VALUES), min_size=1, max_size=6),
    fill=st.sampled_from([None, None, "live", "dead", "mine", 0xDEADBEEF]),
)
def test_garbage_in_the_user_register_never_hangs_or_crashes(edits: list[Any], fill: Any) -> None:
    """Whatever CLOSING, USER_OVERFLOW and the user slots hold (every slot taken,
    ours, dead owners, random bits), an attach works or raises a SharedDictError
    within INIT_TIMEOUT + 1 s, users() and stats() answer, a working handle reads
    and writes the dict's real contents, and the remove protocol and cleanup end."""
    from ultradict_ng._shm.control import Header, attach_control
    from ultradict_ng._shm.mapping import Mapping
    from ultradict_ng._shm.users import remove_if_unused

    name = unique_name()
    init_timeout = L.INIT_TIMEOUT
    L.INIT_TIMEOUT = 0.5  # a live CLOSING makes attachers wait this long
    old_handler = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(20)
    handles: list[SharedDict] = []
    m = None
    try:
        d = SharedDict({"k": 0}, name=name, buffer_size=256, auto_unlink=False)
        m = Mapping(attach_control(name), None)  # unregistered: the garbage is all there is
        token = Header.read(name, m.words).token
        d.close()  # our slot is free again: the next attach claims one
        if fill is not None:
            for i in range(L.USER_SLOTS):
                m.atomic.store(L.W_USER_SLOTS + i, _word(fill))
        for index, value in edits:
            m.atomic.store(index, _word(value))

        expected = 0
        for _ in range(2):
            t0 = time.monotonic()

            def open_() -> SharedDict:
                h = SharedDict(name=name, create=False)
                handles.append(h)
                return h

            h = attempt(open_)
            assert time.monotonic() - t0 < L.INIT_TIMEOUT + 1.0, "the attach did not end in time"
            if isinstance(h, SharedDict):
                assert m.words[L.W_CLOSING] == 0  # it attached only with nobody removing
                assert h["k"] == expected
                expected += 1
                h["k"] = expected
                found = h.users()
                assert all(isinstance(u.pid, int) and isinstance(u.alive, bool) for u in found)
                # named in a slot, unless every slot looked taken by a live process
                assert os.getpid() in {u.pid for u in found if u.alive} or (
                    len(found) == L.USER_SLOTS and all(u.alive for u in found)
                )
                assert isinstance(h.stats()["users"], int)
                h.close()
            else:
                # only a remover that looks alive keeps an attacher out
                closing = m.words[L.W_CLOSING]
                assert closing != 0 and owner_alive(closing), f"attach failed with no live remover: {h!r}"
                m.atomic.store(L.W_CLOSING, 0)  # the "remover" gave up: the next round attaches
        verdict = attempt(lambda: remove_if_unused(name, m, token))
        assert not isinstance(verdict, SharedDictError) or str(verdict)
    finally:
        for h in handles:
            h.close()
        if m is not None:
            m.release()
        try:
            attempt(lambda: unlink_by_name(name))
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old_handler)
            L.INIT_TIMEOUT = init_timeout
        leftovers = listing.listed(name)
        for entry in leftovers:
            segments.unlink(entry)
    assert not leftovers, f"unlink_by_name left {leftovers}"


# -- the Redis engine: garbage in its keys ---------------------------------------------------

REDIS_EDITS = st.lists(
    st.one_of(
        st.tuples(
            st.just("meta"),
            st.sampled_from(["seq", "snap", "epoch", "codec", "version", "logbytes", "snapbytes", "recurse"]),
            st.one_of(st.binary(max_size=12), st.integers(-5, 10**6).map(str)),
        ),
        st.tuples(st.just("snap"), st.binary(max_size=64)),
        st.tuples(
            st.just("log"),
            st.one_of(
                st.binary(max_size=32),
                # a transaction's bundle (0xC1, then a msgpack array of records): garbage after the
                # marker, and well-formed arrays of garbage records
                st.binary(max_size=32).map(lambda b: b"\xc1" + b),
                st.lists(
                    st.one_of(st.binary(max_size=12), st.integers(-(1 << 63), (1 << 64) - 1)), max_size=3
                ).map(lambda items: b"\xc1" + msgpack.packb(items)),
            ),
        ),
        st.tuples(st.just("wrongtype"), st.sampled_from(["meta", "log", "snap", "lock", "lockev"])),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=soak_scaled(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(edits=REDIS_EDITS)
def test_garbage_in_redis_keys_never_crashes_hangs_or_lies(redis_server: Any, edits: list[Any]) -> None:
    """Whatever another program writes into a dict's keys, every operation on
    a handle answers or raises one of our errors (never a raw redis-py or Lua
    error, never a hang), and a handle never returns a value nobody wrote."""
    import redis as redis_py

    from ultradict_ng._redis import layout as RL

    name = unique_name()
    r = redis_py.Redis.from_url(redis_server.url)
    keys = RL.keys_of(name)
    a = SharedDict(name=name, backend=redis_server.url, buffer_size=64)
    b = SharedDict(name=name, backend=redis_server.url)
    written = {f"k{i}": i for i in range(6)}
    try:
        for k, v in written.items():
            a[k] = v
        for edit in edits:
            try:
                if edit[0] == "meta":
                    r.hset(keys.meta, edit[1], edit[2])
                elif edit[0] == "snap":
                    r.set(keys.snap, edit[1])
                elif edit[0] == "log":  # a garbage record, published as the next one
                    seq = int(r.hget(keys.meta, "seq") or b"0")
                    r.xadd(keys.log, {"r": edit[1]}, id=f"{seq + 1}-1")
                    r.hset(keys.meta, "seq", seq + 1)
                else:
                    key = getattr(keys, edit[1])
                    r.delete(key)
                    r.set(key, b"not a stream or hash")
            except (ValueError, redis_py.ResponseError):
                pass  # this edit does not apply after an earlier one
        for handle in (b, a):
            attempt(handle._store.reload)
            got = attempt(handle.copy)
            if isinstance(got, dict):
                for k, v in got.items():
                    assert written.get(k, v) == v or k not in written, (k, v)
            attempt(handle.__setitem__, "after", 1)
            attempt(handle.pop, "k1", None)
            attempt(handle.stats)
            attempt(handle.wait_for_change, 0.01)
        c = attempt(lambda: SharedDict(name=name, backend=redis_server.url, create=False))
        if isinstance(c, SharedDict):
            attempt(c.copy)
            c.close()
    finally:
        b.close()
        a.close()
        r.delete(*keys)
        r.close()
