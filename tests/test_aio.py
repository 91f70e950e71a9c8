"""The asyncio face (ultradict_ng.aio): waiting, the feed and the lock never
block the event loop; cancellation leaves nothing held, registered or
running.  Runs on every engine (conftest: each_backend); shm_only tests are
about shared memory's wait register."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import threading
import time
from typing import Any

import pytest

from ultradict_ng import Change, LockTimeout, SharedDict, Unlinked
from ultradict_ng._shm import layout as L
from ultradict_ng.aio import AsyncSharedDict

pytestmark = pytest.mark.usefixtures("each_backend")

#: A holder's lease on Redis in the dead-holder test: how soon its lock comes back.
SHORT_LEASE = 0.5


def waiting_mode() -> str:
    from ultradict_ng._shm import waiting

    return waiting.MODE


def _writer(name: str, count: int, pause: float) -> None:
    d = SharedDict(name=name)
    for _ in range(count):
        time.sleep(pause)
        with d.lock:
            d["k"] = d["k"] + 1
    d.close()


def _holder(name: str, seconds: float, ready: mp.synchronize.Event, kwargs: dict[str, Any]) -> None:
    d = SharedDict(name=name, **kwargs)
    with d.lock:
        ready.set()
        time.sleep(seconds)
    d.close()


class _Ticker:
    """Counts event-loop turns: a blocked loop stops counting."""

    def __init__(self) -> None:
        self.ticks = 0
        self.longest = 0.0

    async def run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.001)
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now
            self.ticks += 1


def _registered(d: SharedDict) -> tuple:
    w = d._store._map.words
    slots = [w[L.W_WAIT_SLOTS + i] for i in range(L.WAIT_SLOTS)]
    return w[L.W_CHANGE_WAITERS], w[L.W_LOCK_WAITERS], sum(1 for s in slots if s)


def _helpers() -> int:
    """The face's helper threads alive now."""
    return sum(1 for t in threading.enumerate() if t.name == "ultradict_ng-aio-wait")


async def _helpers_settled() -> int:
    """The helper threads alive once those of earlier tests have ended (each
    ends one slice after its last future left): a count taken while one is
    still ending would make the difference a test checks off by one."""
    await _until(lambda: _helpers() == 0, lambda: None)
    return _helpers()


async def _until(predicate: Any, poke: Any, seconds: float = 3.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        poke()
        await asyncio.sleep(0.05)


def test_wait_and_feed_follow_a_spawned_writer_without_blocking_the_loop(name):
    async def main() -> None:
        ad = AsyncSharedDict(name=name, create=True)
        ad["k"] = 0
        ticker = _Ticker()
        tick = asyncio.create_task(ticker.run())
        values = []

        async def follow() -> None:
            async for change in ad.changes(timeout=3):
                assert isinstance(change, Change) and change.op == "set" and change.key == "k"
                values.append(change.value)
                if change.value == 20:
                    return

        feed = asyncio.create_task(follow())
        await asyncio.sleep(0.05)
        proc = mp.get_context("spawn").Process(target=_writer, args=(name, 20, 0.01))
        proc.start()
        try:
            wakes = 0
            while ad["k"] < 20:
                assert await ad.wait_for_change(timeout=10)
                wakes += 1
            await asyncio.wait_for(feed, 10)
        finally:
            proc.join(20)
            tick.cancel()
        assert values == list(range(1, 21))  # every change, in order, once
        assert 1 <= wakes <= 20
        assert ticker.longest < 0.5  # the loop kept turning while we waited
        ad.unlink()
        assert proc.exitcode == 0

    asyncio.run(main())


def test_wait_for_change_timeout_and_immediate_return(name):
    async def main() -> None:
        ad = AsyncSharedDict(name=name, create=True)
        t0 = time.monotonic()
        assert await ad.wait_for_change(timeout=0.2) is False
        assert time.monotonic() - t0 >= 0.19
        other = SharedDict(name=name)
        other["x"] = 1  # lands before the call: seen at once
        t0 = time.monotonic()
        assert await ad.wait_for_change(timeout=5) is True
        assert time.monotonic() - t0 < 1 and ad["x"] == 1
        with pytest.raises(ValueError):
            await ad.wait_for_change(timeout=-1)
        other.close()
        ad.unlink()

    asyncio.run(main())


def test_coroutines_waiting_for_the_same_change_share_one_helper_thread(name):
    async def main() -> None:
        ad = AsyncSharedDict(name=name, create=True)
        before = await _helpers_settled()
        tasks = [asyncio.create_task(ad.wait_for_change(timeout=10)) for _ in range(20)]
        await asyncio.sleep(0.2)
        assert _helpers() - before == 1
        ad["x"] = 1
        assert await asyncio.gather(*tasks) == [True] * 20
        ad.unlink()

    asyncio.run(main())


def test_cancelled_wait_and_feed_leave_nothing_registered_or_running(name, each_backend):
    async def main() -> None:
        ad = AsyncSharedDict(name=name, create=True)
        before = await _helpers_settled()
        waiting = asyncio.create_task(ad.wait_for_change())

        async def consume() -> None:
            async for _ in ad.changes():
                pass

        feeding = asyncio.create_task(consume())
        await asyncio.sleep(0.2)
        assert _helpers() - before == 2  # one for the wait, one for the feed
        if each_backend == "shm" and waiting_mode() == "futex":
            assert _registered(ad.dict)[0] != 0  # the helpers sleep on the futex for them
        waiting.cancel()
        feeding.cancel()
        for task in (waiting, feeding):
            with pytest.raises(asyncio.CancelledError):
                await task
        await _until(lambda: _helpers() == before, lambda: None)  # each ends after its slice
        assert _helpers() == before
        if each_backend == "shm":
            assert _registered(ad.dict) == (0, 0, 0)
        ad.unlink()

    asyncio.run(main())


def test_unlink_wakes_an_async_waiter(name):
    async def main() -> None:
        ad = AsyncSharedDict(name=name, create=True)
        other = SharedDict(name=name)
        task = asyncio.create_task(ad.wait_for_change(timeout=10))
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        other.unlink()
        with pytest.raises(Unlinked):
            await task
        assert time.monotonic() - t0 < 2
        other.close()
        ad.close()

    asyncio.run(main())


def test_a_closed_handle_raises_in_the_waiting_coroutine(name):
    async def main() -> None:
        from ultradict_ng import Closed

        other = SharedDict(name=name, create=True)
        ad = AsyncSharedDict(name=name)
        task = asyncio.create_task(ad.wait_for_change(timeout=10))
        await asyncio.sleep(0.1)
        ad.close()
        other["x"] = 1
        with pytest.raises(Closed):
            await asyncio.wait_for(task, 5)
        other.unlink()
        other.close()

    asyncio.run(main())


def test_async_lock_serialises_coroutines_and_processes(name):
    async def main() -> None:
        ad = AsyncSharedDict(name=name, create=True)
        ad["k"] = 0

        async def incr(n: int) -> None:
            for _ in range(n):
                async with ad.lock:
                    v = ad["k"]
                    await asyncio.sleep(0)  # another coroutine runs here: must not get the lock
                    ad["k"] = v + 1

        proc = mp.get_context("spawn").Process(target=_writer, args=(name, 100, 0.001))
        proc.start()
        await asyncio.gather(*(incr(100) for _ in range(4)))
        proc.join(30)
        assert proc.exitcode == 0
        assert ad["k"] == 500
        await ad.set("a", 1)
        await ad.update(b=2)
        assert await ad.pop("a") == 1
        await ad.delete("b")
        await ad.clear()
        assert len(ad) == 0
        ad.unlink()

    asyncio.run(main())


def test_awaited_writes_inside_the_async_lock_take_it_again(name):
    """The lock is reentrant, as the synchronous one: ``await d.set(...)``
    inside ``async with d.lock`` takes it again (through the loop's turn it
    waited for itself, for ever), and another coroutine still waits for the
    whole block."""

    async def main() -> None:
        ad = AsyncSharedDict(name=name, create=True)
        seen: list[Any] = []

        async def other() -> None:
            await ad.set("other", 1)
            seen.append(dict(ad))

        async def block() -> None:
            async with ad.lock:
                rival = asyncio.ensure_future(other())
                await ad.set("a", 1)
                await asyncio.sleep(0.05)  # (the rival runs here: it must wait)
                await ad.update(b=2)
                assert await ad.pop("a") == 1
                async with ad.lock:
                    await ad.set("c", 3)
                assert not seen and ad.lock._lock.held()
            await rival

        try:
            await asyncio.wait_for(block(), 10)
            assert seen == [{"b": 2, "c": 3, "other": 1}] and not ad.lock.locked()
        finally:
            ad.unlink()

    asyncio.run(main())


@pytest.mark.parametrize("face", ["wrapped again", "another handle"])
def test_the_async_lock_shuts_out_every_face_of_the_dict_in_the_loop(name, face):
    """Writes awaited through another face of the dict -- ``wrap`` of the same
    handle, or another handle in this process -- wait for a block of
    ``async with d.lock``: the thread holds the shared lock, so only the
    loop's turn, shared by the faces, keeps them out."""

    async def main() -> None:
        ad = AsyncSharedDict(name=name, create=True)
        other = (
            AsyncSharedDict.wrap(ad.dict)
            if face == "wrapped again"
            else AsyncSharedDict(name=name, create=False)
        )
        ad["n"] = 0

        async def block() -> None:
            for _ in range(20):
                async with ad.lock:
                    n = ad["n"]
                    await asyncio.sleep(0)  # (the other face's writers run here: they must wait)
                    await ad.set("n", n + 1)

        async def bump() -> None:
            for _ in range(20):
                async with other.lock:
                    n = other["n"]
                    await asyncio.sleep(0)
                    await other.set("n", n + 1)

        try:
            await asyncio.wait_for(asyncio.gather(block(), bump(), bump()), 30)
            assert ad["n"] == 60
        finally:
            if face == "another handle":
                other.close()
            ad.unlink()

    asyncio.run(main())


def test_the_async_lock_keeps_no_event_loop_alive_once_it_is_idle(name):
    """The lock's turns are per loop, shared by the dict's faces in the
    process: an idle one is dropped, not kept -- with its loop -- for as long
    as a handle of the dict lives (a handle used from repeated
    ``asyncio.run``)."""
    import gc
    import weakref

    d = SharedDict(name=name, create=True)
    loops: list[Any] = []

    async def main() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        ad = AsyncSharedDict.wrap(d)

        async def worker() -> None:
            async with ad.lock:
                await asyncio.sleep(0)

        await asyncio.gather(worker(), worker())

    try:
        for _ in range(5):
            asyncio.run(main())
        gc.collect()
        assert [r for r in loops if r() is not None] == []
    finally:
        d.unlink()
        d.close()


def test_async_lock_waits_for_another_process_without_blocking_and_times_out(name):
    async def main() -> None:
        ad = AsyncSharedDict(name=name, create=True)
        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        proc = ctx.Process(target=_holder, args=(name, 1.0, ready, {}))
        proc.start()
        try:
            assert ready.wait(30)
            ticker = _Ticker()
            tick = asyncio.create_task(ticker.run())
            assert ad.lock.locked()
            with pytest.raises(LockTimeout) as info:
                await ad.lock.acquire(timeout=0.2)
            assert info.value.pid == proc.pid
            t0 = time.monotonic()
            async with ad.lock:  # taken once the holder releases (about 0.8 s on)
                assert ad.dict.lock.held()
                assert time.monotonic() - t0 < 5
            tick.cancel()
            assert ticker.longest < 0.5 and ticker.ticks > 100
        finally:
            proc.join(20)
        ad.unlink()

    asyncio.run(main())


def test_cancelled_lock_acquire_holds_nothing(name):
    async def main() -> None:
        ad = AsyncSharedDict(name=name, create=True)
        other = SharedDict(name=name)
        release = threading.Event()
        held = threading.Event()

        def hold() -> None:
            with other.lock:
                held.set()
                release.wait(5)

        before = await _helpers_settled()
        thread = threading.Thread(target=hold)
        thread.start()
        assert held.wait(5)
        task = asyncio.create_task(ad.lock.acquire())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        thread.join(5)
        assert ad.dict.lock.owner_pid is None  # nobody holds it
        assert ad.dict.lock.try_acquire()  # and it is free for us
        ad.dict.lock.release()
        async with ad.lock:  # the coroutines' turn lock was released too
            pass
        await _until(lambda: _helpers() == before, lambda: None)
        assert _helpers() == before
        other.close()
        ad.unlink()

    asyncio.run(main())


def test_dead_holder_recovered_by_an_async_waiter(name, each_backend):
    # Shared memory: the waiter sees the holder is dead; Redis: its lease runs out.
    kwargs = {"lease": SHORT_LEASE} if each_backend == "redis" else {}
    bound = 1.5 if each_backend == "shm" else SHORT_LEASE + 1.0

    async def main() -> None:
        ad = AsyncSharedDict(name=name, create=True)
        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        proc = ctx.Process(target=_holder, args=(name, 60.0, ready, kwargs))
        proc.start()
        assert ready.wait(30)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        t0 = time.monotonic()
        await ad.lock.acquire(timeout=5)
        assert time.monotonic() - t0 < bound  # within a second of its death (or its lease)
        ad.lock.release()
        ad.unlink()

    asyncio.run(main())


def _read_in_a_spawned_process(ad: AsyncSharedDict) -> Any:
    async def main() -> Any:
        ad["from the child"] = 2
        return type(ad).__name__, ad["k"]

    return asyncio.run(main())


def test_an_async_handle_travels_to_another_process(name):
    """Pickled (a pool's argument), an AsyncSharedDict travels as its dict's
    handle does and arrives wrapped again (it raised "cannot pickle")."""
    import concurrent.futures

    ad = AsyncSharedDict(name=name, create=True)
    try:
        ad["k"] = 1
        with concurrent.futures.ProcessPoolExecutor(1, mp.get_context("spawn")) as pool:
            assert pool.submit(_read_in_a_spawned_process, ad).result(timeout=120) == ("AsyncSharedDict", 1)
        assert ad["from the child"] == 2
    finally:
        ad.unlink()
        ad.close()
