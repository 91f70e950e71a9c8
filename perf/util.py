"""Small helpers: statistics, number formatting, time-boxed loops, a watchdog."""

from __future__ import annotations

import contextlib
import gc
import math
import os
import signal
import statistics
import sys
import time
import timeit
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Optional

SHM_DIR = "/dev/shm"


# -- statistics ------------------------------------------------------------------------


def summarize(values: Sequence[float]) -> dict[str, Optional[float]]:
    """Median, quartiles and range of the repetitions (None when there are none)."""
    vals = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return {"median": None, "min": None, "max": None, "q1": None, "q3": None, "n": 0}
    if len(vals) >= 2:
        q1, _, q3 = statistics.quantiles(vals, n=4, method="inclusive")
    else:
        q1 = q3 = vals[0]
    return {
        "median": statistics.median(vals),
        "min": min(vals),
        "max": max(vals),
        "q1": q1,
        "q3": q3,
        "n": len(vals),
    }


def percentile(values: Sequence[float], p: float) -> Optional[float]:
    """Nearest-rank percentile (p in 0..100)."""
    vals = sorted(values)
    if not vals:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(vals)))
    return vals[min(rank, len(vals)) - 1]


# -- formatting ------------------------------------------------------------------------


def fmt_rate(x: Optional[float]) -> str:
    if x is None:
        return "-"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def fmt_seconds(x: Optional[float]) -> str:
    if x is None:
        return "-"
    ax = abs(x)
    if ax >= 1:
        return f"{x:.3g} s"
    if ax >= 1e-3:
        return f"{x * 1e3:.3g} ms"
    if ax >= 1e-6:
        return f"{x * 1e6:.3g} µs"
    return f"{x * 1e9:.3g} ns"


def fmt_gbps(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:.0f} GB/s"
    return f"{x:.3g} GB/s"


def fmt_mib(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if abs(x) < 1:
        return f"{x * 1024:.3g} KiB"
    return f"{x:.3g} MiB"


FORMATTERS: dict[str, Callable[[Optional[float]], str]] = {
    "ops/s": fmt_rate,
    "s": fmt_seconds,
    "s/op": fmt_seconds,
    "GB/s": fmt_gbps,
    "MiB": fmt_mib,
    "CPU-s": lambda x: "-" if x is None else f"{x:.3g} CPU-s",
}


def fmt_value(x: Optional[float], unit: str) -> str:
    return FORMATTERS.get(unit, lambda v: "-" if v is None else f"{v:.3g}")(x)


def fmt_count(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def fmt_bytes(n: int) -> str:
    for div, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= div:
            return f"{n / div:.3g} {suffix}"
    return f"{n} B"


# -- time-boxed loops ------------------------------------------------------------------


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Disable the cyclic GC around a timed loop, as :mod:`timeit` does."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Timer(timeit.Timer):
    """A :class:`timeit.Timer` whose ``timeit(n)`` runs a loop that times its own n operations.

    Its seconds are scaled by ``scale``: :meth:`timeit.Timer.autorange` stops at
    0.2 of them, and the scale makes that a tenth of the measurement's box.
    """

    def __init__(self, loop: Callable[[int], float], scale: float) -> None:
        self._loop = loop
        self._scale = scale

    def timeit(self, number: int = 1) -> float:
        return self._loop(number) * self._scale


def calibrate(loop: Callable[[int], float], box: float, min_ops: int = 1, max_ops: int = 50_000_000) -> int:
    """Op count for which ``loop(n)`` (n operations, returns their seconds) takes about ``box`` seconds.

    The standard library's :meth:`timeit.Timer.autorange` tries 1, 2, 5, 10, ...
    operations (the first call is the warm-up) until a try takes a tenth of the
    box; the count is scaled from there to the box.
    """
    scale = 0.2 / (box / 10)
    number, took = _Timer(loop, scale).autorange()
    target = int(number * box * scale / took) if took > 0 else max_ops
    return max(min_ops, min(max_ops, target))


# -- watchdog --------------------------------------------------------------------------


class CellTimeout(Exception):
    """A measurement exceeded its watchdog limit."""


@contextlib.contextmanager
def watchdog(seconds: float, what: str) -> Iterator[None]:
    """Raise :class:`CellTimeout` in the main thread if the block runs too long.

    Uses SIGALRM/ITIMER_REAL: it interrupts a Python-level busy-wait (for
    example a spin lock whose holder died).  Nested use keeps the outer timer.
    """
    if not hasattr(signal, "setitimer") or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        yield
        return

    def _fire(signum: int, frame: Any) -> None:
        raise CellTimeout(f"{what}: still running after {seconds:.0f} s (watchdog)")

    old = signal.signal(signal.SIGALRM, _fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- shared memory ---------------------------------------------------------------------


def shm_entries() -> list[str]:
    try:
        return sorted(os.listdir(SHM_DIR))
    except OSError:
        return []


_T0 = time.perf_counter()


def log(msg: str) -> None:
    """Progress on stderr (stdout carries the tables), with seconds since start."""
    print(f"[{time.perf_counter() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def now() -> float:
    return time.perf_counter()
