"""Worker processes of the torture suite (spawned: must be importable).

Writer ``wid`` owns the nested subtree ``d["w<wid>"]`` and mutates it with every
kind of operation while keeping a plain-dict model of it; a sequence number
``seq`` in the subtree only grows.  Readers check every snapshot they see:
values well-formed, no ``seq`` going back in time, iteration never raising.
"""

from __future__ import annotations

import random
import time
from typing import Any, Dict, List

from ultradict_ng import SharedDict


def k_value(i: int) -> List[Any]:
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


def writer(name: str, wid: int, seconds: float, results: Any, huge: bool = False,
           arrays: bool = False) -> None:
    rng = random.Random(wid)
    d = SharedDict(name=name, create=False)
    sub = d[f"w{wid}"]
    model: Dict[str, Any] = {}
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


def check_subtree(wid: int, sub: Any, last_seq: Dict[int, int]) -> None:
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
    d = SharedDict(name=name, create=False)
    last_seq: Dict[int, int] = {}
    passes = 0
    errors: List[str] = []
    held: List[Any] = []  # arrays read earlier: they must never change
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
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none ignored
            errors.append(f"{type(exc).__name__}: {exc}")
            if len(errors) > 20:
                break
    results.put(("reader", passes, errors, dumps_of(d)))
    d.close()


def dumps_of(d: Any) -> int:
    """Full dumps so far (shared memory) or the snapshot's sequence number (Redis)."""
    gen = getattr(d._store, "gen", None)
    return int(gen) if gen is not None else int(d.stats()["snapshot_seq"])


def apply_change(replica: Dict[str, Any], ch: Any) -> None:
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
    d = SharedDict(name=name, create=False)
    replica = d.copy()  # the feed starts at the state this handle last saw
    it = d.changes(timeout=60)
    ready.put("feed")
    items = resyncs = 0
    errors: List[str] = []
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
            errors.append(f"the replica differs from the dict at {diff}")
    except Exception as exc:  # noqa: BLE001 - every failure is reported
        errors.append(f"{type(exc).__name__}: {exc}")
    results.put(("feed", items, resyncs, errors))
    d.close()


def wait_follower(name: str, writers: int, ready: Any, results: Any) -> None:
    """Follow the writers with ``wait_for_change`` until ``done``: every wake-up
    shows a newer state (seqs never go back), no wait times out while the writers
    write, and the last state seen is the final one."""
    from ultradict_ng import layout as L

    L.WAIT_SLICE = 60.0  # only a wake-up ends a sleep in time
    d = SharedDict(name=name, create=False)
    last_seq: Dict[int, int] = {}
    wakes = 0
    errors: List[str] = []
    d.get("done")
    ready.put("wait")
    try:
        # "done" is read from the snapshot each wake-up shows, never by a read of
        # its own: such a read would catch up with the writers' last writes and
        # "done" together, and end the loop without checking the state they made.
        snapshot: Dict[str, Any] = {}
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
                errors.append(f"writer {wid}: last seq seen {last_seq.get(wid)}, final {final[f'w{wid}'].get('seq')}")
    except Exception as exc:  # noqa: BLE001 - every failure is reported
        errors.append(f"{type(exc).__name__}: {exc}")
    results.put(("wait", wakes, 0, errors))
    d.close()
