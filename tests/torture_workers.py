"""Worker processes of the torture suite (spawned: must be importable).

Writer ``wid`` owns the nested subtree ``d["w<wid>"]`` and mutates it with every
kind of operation while keeping a plain-dict model of it; a sequence number
``seq`` in the subtree only grows.  Readers check every snapshot they see:
values well-formed, no ``seq`` going back in time, iteration never raising.

A dict or cache is named by ``name``, or kept in files when ``name`` is a
path (it holds a ``/``): :func:`open_dict` and :func:`open_cache` open either.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator
from typing import Any, Optional

from ultradict_ng import SharedDict
from ultradict_ng.cache import SharedCache


def open_dict(where: str, *initial: Any, **options: Any) -> SharedDict:
    """The dict named ``where``, or kept in the directory ``where``."""
    if os.sep in where:
        return SharedDict(*initial, path=where, **options)
    return SharedDict(*initial, name=where, **options)


def open_cache(where: str, **options: Any) -> SharedCache:
    """The cache named ``where``, or kept in the directory ``where``."""
    return SharedCache(path=where, **options) if os.sep in where else SharedCache(where, **options)


def k_value(i: int) -> list[Any]:
    return [i, "v" * (i % 7)]


#: Size of the occasional "huge" value of the growing-stream variant: its dumps
#: exceed the initial stream, so the stream grows while readers read.
HUGE = 700_000


#: Length of the numpy arrays of the blob variant: a checksum pattern, every
#: element equal to the writer's seq at the time (mod 65521), so that a torn or
#: half-written array is visible anywhere in it.
ARRAY_LEN = 40_000


def array_for(seq: int) -> Any:
    import numpy as np

    return np.full(ARRAY_LEN, seq % 65521, dtype=np.uint16)


def check_array(value: Any) -> None:
    """A stored array is read-only, whole, and carries one seq everywhere."""
    import numpy as np

    assert type(value) is np.ndarray and value.dtype == np.uint16 and value.shape == (ARRAY_LEN,)
    assert not value.flags.writeable
    assert value[0] == value[-1] and int(value.min()) == int(value.max()), "torn array"


def writer(
    name: str, wid: int, seconds: float, results: Any, huge: bool = False, arrays: bool = False
) -> None:
    rng = random.Random(wid)
    d = open_dict(name, create=False)
    sub = d[f"w{wid}"]
    model: dict[str, Any] = {}
    seq = ops = increments = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seq += 1
        r = rng.random()
        key = f"k{rng.randrange(8)}"
        if r < 0.35:
            sub[key] = model[key] = k_value(seq)
        elif r < 0.45:
            if key in model:
                del sub[key]
                del model[key]
        elif r < 0.55:
            assert sub.pop(key, None) == model.pop(key, None)
        elif r < 0.58:
            sub.clear()
            model.clear()
        elif r < 0.70:
            sub["nested"] = model["nested"] = {"a": seq, "b": {"c": seq}}
        elif r < 0.78:
            if "nested" in model:
                sub["nested"]["b"]["c"] = seq
                model["nested"]["b"]["c"] = seq
        elif r < 0.81:
            if arrays and rng.random() < 0.5:
                sub["arr"] = array_for(seq)
                model["arr"] = ("array", seq)  # compared by the test with array_for(seq)
            elif huge and rng.random() < 0.02:
                sub["huge"] = model["huge"] = bytes([seq % 256]) * HUGE
            else:
                sub["large"] = model["large"] = bytes([seq % 256]) * 3000
        elif r < 0.86:
            items = {f"u{rng.randrange(4)}": k_value(seq) for _ in range(3)}
            sub.update(items)
            model.update(items)
        elif r < 0.90:
            # A transaction: "ta" and "tb" change together (readers check they are
            # equal in every snapshot), or -- rolled back -- not at all.
            # The root-level pair "ra<wid>"/"rb<wid>" goes the same way (scalars
            # of the block's thread: the compiled write path), and now and then
            # a run of root-level scalars long enough to fill the stream.
            roll_back = rng.random() < 0.3
            try:
                with d.transaction():
                    sub["ta"] = seq
                    d[f"ra{wid}"] = seq
                    if rng.random() < 0.1:
                        for j in range(300):
                            d[f"rr{wid}_{j}"] = f"{seq}:{j}"
                    d[f"rb{wid}"] = seq
                    sub["tb"] = seq
                    if roll_back:
                        raise LookupError("roll back")
            except LookupError:
                pass
            if not roll_back:
                model["ta"] = model["tb"] = seq
        else:
            with d.lock:
                d["total"] += 1
            increments += 1
        sub["seq"] = model["seq"] = seq
        ops += 2
    results.put(("writer", wid, model, ops, increments))
    d.close()


def check_subtree(wid: int, sub: Any, last_seq: dict[int, int]) -> None:
    if "seq" in sub:
        seq = sub["seq"]
        assert type(seq) is int and seq >= last_seq.get(wid, 0), (wid, seq, last_seq.get(wid))
        last_seq[wid] = seq
    for key, value in sub.items():
        if key[0] in "ku":
            assert type(value) is list and value == k_value(value[0]), (key, value)
        elif key == "large":
            assert type(value) is bytes and len(value) == 3000 and len(set(value)) == 1
        elif key == "huge":
            assert type(value) is bytes and len(value) == HUGE and len(set(value)) == 1
        elif key == "nested":
            assert value["a"] <= value["b"]["c"], value
        elif key == "arr":
            check_array(value)
        elif key in ("ta", "tb"):
            assert sub.get("ta") == sub.get("tb"), ("half a transaction", sub.get("ta"), sub.get("tb"))
        else:
            assert key == "seq", key


def reader(name: str, writers: int, seconds: float, results: Any) -> None:
    d = open_dict(name, create=False)
    last_seq: dict[int, int] = {}
    passes = 0
    errors: list[str] = []
    held: list[Any] = []  # arrays read earlier: they must never change
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            snapshot = d.copy()  # deep, consistent
            for wid in range(writers):
                check_subtree(wid, snapshot[f"w{wid}"], last_seq)
                pair = (snapshot.get(f"ra{wid}"), snapshot.get(f"rb{wid}"))
                assert pair[0] == pair[1], ("half a transaction at the root", pair)
                run = [snapshot[k] for k in snapshot if k.startswith(f"rr{wid}_")]
                assert len({v.split(":")[0] for v in run}) <= 1, ("half a run", sorted(set(run))[:3])
                if "arr" in snapshot[f"w{wid}"]:
                    held = (held + [(snapshot[f"w{wid}"]["arr"], int(snapshot[f"w{wid}"]["arr"][0]))])[-20:]
            for arr, first in held:
                check_array(arr)
                assert int(arr[0]) == first, "an array held by a reader changed"
            for key, value in d.items():  # live views, iterated while writers write
                if key.startswith("w"):
                    value.copy()
                elif key.startswith("r"):
                    assert type(value) in (int, str), (key, value)
                else:
                    assert key == "total" and type(value) is int
            passes += 1
        except Exception as exc:  # every failure is reported, none ignored
            errors.append(f"{type(exc).__name__}: {exc}")
            if len(errors) > 20:
                break
    results.put(("reader", passes, errors, dumps_of(d)))
    d.close()


def ballast_row(i: int) -> Any:
    """The value of ballast key ``b%06d``: the rows of the big variant (never written again)."""
    return (i, f"v{i}", i * 0.5)


def big_reader(
    name: str, writers: int, seconds: float, ballast: int, results: Any, max_decoded: Optional[int] = None
) -> None:
    """A reader of a big dict that never copies it whole but every 25th pass:
    each writer's subtree through its nested view, 200 random ballast rows and
    absent keys, ``len``; every dump it loads is read in place (a TableCache),
    keeping at most ``max_decoded`` rows decoded (dropping the older ones
    while records and dumps arrive)."""
    rng = random.Random()
    d = open_dict(name, create=False, max_decoded=max_decoded)
    last_seq: dict[int, int] = {}
    passes = in_place = 0
    errors: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            for wid in range(writers):
                check_subtree(wid, d[f"w{wid}"].copy(), last_seq)
            for _ in range(200):
                i = rng.randrange(ballast)
                row = d[f"b{i:06d}"]
                assert row == ballast_row(i), (i, row)
            assert f"b{ballast + rng.randrange(1000):06d}" not in d
            assert d.get(f"x{rng.randrange(1000)}") is None
            assert len(d) >= ballast, len(d)
            if passes % 25 == 0:
                snapshot = d.copy()
                rows = [k for k in snapshot if k[0] == "b"]
                assert len(rows) == ballast and rows[:2] == ["b000000", "b000001"], len(rows)
                for wid in range(writers):
                    check_subtree(wid, snapshot[f"w{wid}"], last_seq)
                    pair = (snapshot.get(f"ra{wid}"), snapshot.get(f"rb{wid}"))
                    assert pair[0] == pair[1], ("half a transaction at the root", pair)
            in_place += type(d._store.data).__name__ == "TableCache"
            passes += 1
        except Exception as exc:  # every failure is reported, none ignored
            errors.append(f"{type(exc).__name__}: {exc}")
            if len(errors) > 20:
                break
    results.put(("reader", passes, errors, dumps_of(d), in_place))
    d.close()


def dumps_of(d: Any) -> int:
    """Full dumps so far (shared memory) or the snapshot's sequence number (Redis)."""
    gen = getattr(d._store, "gen", None)
    return int(gen) if gen is not None else int(d.stats()["snapshot_seq"])


def apply_change(replica: dict[str, Any], ch: Any) -> None:
    """A change-feed item applied to a plain replica of the dict."""
    node: Any = replica
    for key in ch.path:
        node = node[key]
    if ch.op == "set":
        node[ch.key] = ch.value
    elif ch.op == "delete":
        del node[ch.key]
    else:
        node.clear()


def feed_follower(name: str, ready: Any, results: Any) -> None:
    """Follow the writers through ``changes()`` onto a replica until the test sets
    ``done``; the replica must then equal the dict."""
    d = open_dict(name, create=False)
    replica = d.copy()  # the feed starts at the state this handle last saw
    it = d.changes(timeout=60)
    ready.put("feed")
    items = resyncs = 0
    errors: list[str] = []
    try:
        for ch in it:
            apply_change(replica, ch)
            items += 1
            resyncs += ch.resync
            if ch.path == () and ch.key == "done":
                break
        else:
            errors.append("the feed ended before 'done'")
        final = d.copy()
        if replica != final:
            diff = sorted(k for k in set(final) | set(replica) if final.get(k) != replica.get(k))
            shown = {k: (str(replica.get(k))[:400], str(final.get(k))[:400]) for k in diff[:2]}
            errors.append(f"the replica differs from the dict at {diff} ({resyncs} resyncs): {shown}")
    except Exception as exc:  # every failure is reported
        errors.append(f"{type(exc).__name__}: {exc}")
    results.put(("feed", items, resyncs, errors))
    d.close()


def wait_follower(name: str, writers: int, ready: Any, results: Any) -> None:
    """Follow the writers with ``wait_for_change`` until ``done``: every wake-up
    shows a newer state (seqs never go back), no wait times out while the writers
    write, and the last state seen is the final one."""
    from ultradict_ng._shm import layout as L

    L.WAIT_SLICE = 60.0  # only a wake-up ends a sleep in time
    d = open_dict(name, create=False)
    last_seq: dict[int, int] = {}
    wakes = 0
    errors: list[str] = []
    d.get("done")
    ready.put("wait")
    try:
        # "done" is read from the snapshot each wake-up shows, never by a read of
        # its own: such a read would catch up with the writers' last writes and
        # "done" together, and end the loop without checking the state they made.
        snapshot: dict[str, Any] = {}
        while not snapshot.get("done"):
            t0 = time.monotonic()
            ok = d.wait_for_change(timeout=20)
            waited = time.monotonic() - t0
            if not ok or waited > 8:  # writers write all the time, and "done" right after
                errors.append(f"a wait returned {ok} after {waited:.1f}s: a lost wake-up")
                break
            wakes += 1
            snapshot = d.copy()
            for wid in range(writers):
                check_subtree(wid, snapshot[f"w{wid}"], last_seq)
                pair = (snapshot.get(f"ra{wid}"), snapshot.get(f"rb{wid}"))
                assert pair[0] == pair[1], ("half a transaction at the root", pair)
                run = [snapshot[k] for k in snapshot if k.startswith(f"rr{wid}_")]
                assert len({v.split(":")[0] for v in run}) <= 1, ("half a run", sorted(set(run))[:3])
        final = d.copy()
        for wid in range(writers):
            if final[f"w{wid}"].get("seq") != last_seq.get(wid):
                errors.append(
                    f"writer {wid}: last seq seen {last_seq.get(wid)}, final {final[f'w{wid}'].get('seq')}"
                )
    except Exception as exc:  # every failure is reported
        errors.append(f"{type(exc).__name__}: {exc}")
    results.put(("wait", wakes, 0, errors))
    d.close()


# -- the shared cache ---------------------------------------------------------------------
#
# Writers set, add, delete, touch, incr, set_many, delete_many, pop, expire and clear
# on one bounded SharedCache over CACHE_KEYS shared keys (always full: every new key
# evicts); readers check every read.  A value is ``[key, wid, seq, deadline, pad]``:
# whole (``pad`` follows from ``seq``), this key's, and -- ``deadline`` being the
# writer's clock before its write plus the ttl, 0.0 for none, -1.0 for a ttl <= 0
# (never stored) -- not read after its expiry.

#: Keys shared by the cache writers (about twice what the bound holds).
CACHE_KEYS = 96
#: Slack of the expiry check: a read that began CACHE_MARGIN s after a value's
#: deadline must not return it.  A writer whose write took longer than that
#: (preempted between its clock read and the cache's) reports the value as a stall.
CACHE_MARGIN = 0.002


def cache_value(key: str, wid: int, seq: int, deadline: float) -> list[Any]:
    return [key, wid, seq, deadline, "x" * (seq % 37)]


def _cache_ttl(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.4:
        return None
    if r < 0.75:
        return rng.uniform(0.001, 0.03)  # expires while readers read
    if r < 0.92:
        return rng.uniform(5.0, 60.0)
    return rng.choice([0, -1.0])  # already expired: removes the key


def cache_writer(
    name: str, total_name: str, wid: int, seconds: float, results: Any, ready: Any = None
) -> None:
    """Writer ``wid``; with ``results`` None a victim the test SIGKILLs at a random
    instant (it never touches the total).  Own counter ``n<wid>``: incremented from
    the exact value this writer keeps (``default`` restores it after an eviction),
    so it only grows."""

    victim = results is None
    rng = random.Random(os.getpid() if victim else wid)
    c = open_cache(name, create=False)
    totals = open_cache(total_name, create=False)
    mine = increments = seq = ops = 0
    stalls: list[Any] = []  # (wid, seq) of values whose write took longer than CACHE_MARGIN
    errors: list[str] = []
    if ready is not None:
        ready.set()

    @contextlib.contextmanager
    def timed(ttl: Any) -> Iterator[float]:
        """The deadline to write a value with; with a ttl > 0 the block runs under
        the lock, so that the time the write takes is the writer's own (not a wait
        for the lock)."""
        if ttl is None or ttl <= 0:
            yield 0.0 if ttl is None else -1.0
            return
        with c.lock:
            t0 = time.time()
            yield 0.0 if victim else t0 + ttl  # a victim cannot report its stalls
            if time.time() - t0 > CACHE_MARGIN:
                stalls.append((wid, seq))

    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            seq += 1
            ops += 1
            r = rng.random()
            key = f"k{rng.randrange(CACHE_KEYS)}"
            ttl = _cache_ttl(rng)
            if r < 0.30:
                with timed(ttl) as d:
                    c.set(key, cache_value(key, wid, seq, d), ttl=ttl)
            elif r < 0.38:
                c.delete(key)
            elif r < 0.46:
                with timed(ttl) as d:
                    c.add(key, cache_value(key, wid, seq, d), ttl=ttl)
            elif r < 0.58:
                delta = rng.randrange(1, 4)
                mine += delta
                got = c.incr(f"n{wid}", delta, default=mine - delta)
                if got != mine:
                    errors.append(f"incr of n{wid} returned {got}, not {mine}")
                    mine = got
                if not victim:
                    totals.incr("total", default=0)
                    increments += 1
            elif r < 0.64:
                # touch: only to an earlier expiry than the value's deadline (the value stays)
                short = rng.choice([rng.uniform(0.001, 0.03), 0])
                with c.lock:
                    t0 = time.time()
                    v = c.get(key)
                    if v is not None and (v[3] == 0.0 or t0 + short + CACHE_MARGIN <= v[3]):
                        c.touch(key, short)
                        if time.time() - t0 > CACHE_MARGIN:
                            stalls.append((v[1], v[2]))
            elif r < 0.72:
                keys = [f"k{rng.randrange(CACHE_KEYS)}" for _ in range(3)]
                with timed(ttl) as d:
                    c.set_many({k: cache_value(k, wid, seq, d) for k in keys}, ttl=ttl)
            elif r < 0.78:
                c.delete_many([f"k{rng.randrange(CACHE_KEYS)}" for _ in range(3)])
            elif r < 0.80:
                v = c.pop(key, None)
                if v is not None and (type(v) is not list or v[0] != key):
                    errors.append(f"pop({key!r}) returned {v!r}")
            elif r < 0.801:
                c.expire()
            elif r < 0.8012:
                c.clear()
            else:
                c.get(key)
    except Exception as exc:  # reported, the test fails
        errors.append(f"{type(exc).__name__}: {exc}")
    if not victim:
        results.put(("writer", wid, mine, increments, ops, stalls, errors))
    c.close()
    totals.close()


def check_cache_value(key: str, v: Any, t0: float, errors: list[Any]) -> None:
    """A value read from the cache at a read that began at ``t0`` (time.time())."""
    if v is None:
        return
    if not (
        type(v) is list
        and len(v) == 5
        and v[0] == key
        and type(v[1]) is int
        and type(v[2]) is int
        and v[4] == "x" * (v[2] % 37)
    ):
        errors.append((f"{key!r} read as {v!r}: not a whole value of that key", None))
    elif v[3] == -1.0:
        errors.append((f"{key!r} read as {v!r}, written with a ttl <= 0", None))
    elif v[3] and t0 > v[3] + CACHE_MARGIN:
        errors.append((f"{key!r} read {t0 - v[3]:.4f}s after its expiry: {v!r}", (v[1], v[2])))


def dead_batch(c: Any) -> bool:
    """Whether a writer died inside set_many/delete_many (call it holding
    ``c.lock``, so no live batch is open): until the next writer rebuilds it,
    the side segment may disagree with the entries (cache_layout, "Crashes") --
    what ``check_side`` checks is then the rebuild's to restore."""
    from ultradict_ng.cache import layout as C

    return bool(c._side.words[C.W_BATCH])


def check_side(c: Any) -> tuple[int, int]:
    """The side segment agrees with the entries (call it holding ``c.lock``): every
    entry has its own slot, handed out and not on the free stack, the free stack
    holds distinct slots, ``bytes`` covers every entry's recorded size and no
    recorded size is below the entry's.  Returns (slots leaked by crashes, the bytes
    count's excess over the recorded sizes): both 0 when nobody crashed."""
    from ultradict_ng.cache import layout as C

    side = c._side
    w = side.words
    items = list(c._d.items())
    if not side.nslots:
        return 0, 0
    nxt, free = w[C.W_NEXT], w[C.W_FREE]
    assert free <= nxt <= side.nslots, ("free, next, nslots", free, nxt, side.nslots)
    slots = [e[1] for _, e in items]
    assert len(set(slots)) == len(slots), f"two entries share a slot: {sorted(slots)}"
    assert all(0 <= s < nxt for s in slots), ("an entry's slot was never handed out", nxt, slots)
    stack = list(side.free[:free])
    assert len(set(stack)) == free, f"a slot twice on the free stack: {stack}"
    assert not set(stack) & set(slots), f"live slots on the free stack: {set(stack) & set(slots)}"
    assert all(s < nxt for s in stack), ("a free slot never handed out", nxt, stack)
    held = sum(side.sizes[s] for s in slots)
    if c.maxbytes:
        assert w[C.W_BYTES] >= held, ("bytes below the entries' sizes", w[C.W_BYTES], held)
        for key, e in items:
            assert side.sizes[e[1]] >= c._size(key, e[2]), ("a size under-counted", key)
    return nxt - free - len(slots), w[C.W_BYTES] - held


def cache_reader(name: str, total_name: str, writers: int, seconds: float, exact: bool, results: Any) -> None:
    """Reads all the time; every read checked (``check_cache_value``), counters
    never go back, ``len`` and stats within the bounds; every 64 passes, under the
    lock, the bytes bound exactly and ``check_side`` (with ``exact``: no leaks)."""

    rng = random.Random()
    c = open_cache(name, create=False)
    totals = open_cache(total_name, create=False)
    maxsize, maxbytes = c.maxsize, c.maxbytes
    last: dict[str, int] = {}
    errors: list[Any] = []
    passes = 0

    def grows(key: str, v: Any) -> None:
        if v is not None:
            if type(v) is not int or v < last.get(key, 0):
                errors.append((f"counter {key} went from {last.get(key)} to {v!r}", None))
            last[key] = v

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(errors) < 20:
        try:
            for _ in range(8):
                key = f"k{rng.randrange(CACHE_KEYS)}"
                t0 = time.time()
                check_cache_value(key, c.get(key), t0, errors)
            keys = [f"k{rng.randrange(CACHE_KEYS)}" for _ in range(4)]
            t0 = time.time()
            for key, v in c.get_many(keys).items():
                check_cache_value(key, v, t0, errors)
            for wid in range(writers):
                grows(f"n{wid}", c.get(f"n{wid}"))
            grows("total", totals.get("total"))
            n, s = len(c), c.stats()
            if maxsize is not None:
                assert n <= maxsize and s["size"] <= maxsize, ("over maxsize", n, s["size"])
            if maxbytes is not None:  # lock-free: a writer may hold one entry's bytes in advance
                assert s["bytes"] <= maxbytes + 200, ("over maxbytes", s["bytes"])
            if passes % 16 == 0:
                for key in c:
                    assert key[0] in "kn", key
            if passes % 64 == 0:
                with c.lock:
                    if maxbytes is not None:
                        assert c.stats()["bytes"] <= maxbytes, ("over maxbytes", c.stats()["bytes"])
                    if dead_batch(c):  # (a victim died in a batch: the next writer rebuilds)
                        assert not exact, "a batch left open with nobody killed"
                    else:
                        leaked, excess = check_side(c)
                        assert not exact or (leaked, excess) == (0, 0), (
                            "leaked slots, bytes",
                            leaked,
                            excess,
                        )
            passes += 1
        except Exception as exc:  # every failure is reported, none ignored
            errors.append((f"{type(exc).__name__}: {exc}", None))
    results.put(("reader", passes, errors))
    c.close()
    totals.close()
