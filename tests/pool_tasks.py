"""Tasks of the process-pool tests (``test_futures.py``), importable by spawned
workers, and the helpers those tests share with the workers.

No task runs longer than its bounded waits: a task blocked on a gate file
gives up after ``GATE_LIMIT`` seconds, so a test that fails before opening its
gate still ends.
"""

from __future__ import annotations

import mmap
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

try:
    import numpy as np
except ImportError:  # pragma: no cover - the tests skip without numpy
    np = None  # type: ignore[assignment]

GATE_LIMIT = 60.0


# -- plain tasks -----------------------------------------------------------------------------------


def identity(x: Any) -> Any:
    return x


def add(a: Any, b: Any) -> Any:
    return a + b


def square(x: Any) -> Any:
    return x * x


def pid() -> int:
    return os.getpid()


def pid_and(x: Any) -> Any:
    return os.getpid(), x


def kwargs_echo(*args: Any, **kwargs: Any) -> Any:
    return args, kwargs


class CustomError(Exception):
    """An exception with extra arguments, to check they travel back."""

    def __init__(self, msg: str, code: int) -> None:
        super().__init__(msg, code)
        self.code = code


def fail(msg: str) -> None:
    raise ValueError(msg)


def fail_custom(msg: str, code: int) -> None:
    raise CustomError(msg, code)


def return_unpicklable(with_array: bool = False) -> Any:
    import threading

    lock = threading.Lock()
    return (np.ones(50_000), lock) if with_array else lock


def sleep_return(seconds: float, value: Any) -> Any:
    time.sleep(seconds)
    return value


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(GATE_LIMIT)  # never reached


# -- gates: a task waits until the test creates a file ---------------------------------------------


def wait_for(path: str, limit: float = GATE_LIMIT) -> bool:
    deadline = time.monotonic() + limit
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def gated(value: Any, path: Optional[str]) -> Any:
    """Return ``value`` once ``path`` exists (at once when ``path`` is None)."""
    if path is not None and not wait_for(path):
        raise RuntimeError(f"gate {path} never opened")
    return value


# -- initializers ----------------------------------------------------------------------------------

_init_value: Any = None


def init_record(directory: str, value: Any) -> None:
    """Initializer: remember ``value``, leave a file named after this worker's pid."""
    global _init_value
    _init_value = value
    with open(os.path.join(directory, f"init-{os.getpid()}"), "w") as f:
        f.write(repr(value))


def init_value() -> Any:
    return os.getpid(), _init_value


def init_fail() -> None:
    raise RuntimeError("initializer failed on purpose")


# -- what a worker sees ----------------------------------------------------------------------------


def backing(obj: Any) -> str:
    """Follow ``.base`` / ``memoryview.obj`` from ``obj`` to the object that
    owns the memory: ``"mmap"`` for a mapping, else that object's type name."""
    seen = 0
    while seen < 100:
        seen += 1
        if isinstance(obj, mmap.mmap):
            return "mmap"
        if isinstance(obj, memoryview):
            obj = obj.obj
            continue
        nxt = getattr(obj, "base", None)
        if nxt is None:
            return type(obj).__name__
        obj = nxt
    return "cycle"


def mapping_path(address: int) -> Optional[str]:
    """The path of the mapping of this process holding ``address`` ("" for an
    anonymous one), or None if no mapping holds it."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                return parts[5].strip() if len(parts) > 5 else ""
    return None


def shm_mappings() -> list[str]:
    """The pool-parcel mappings of this process (one line per mapped range)."""
    with open("/proc/self/maps") as f:
        return [
            line.split(None, 5)[5].strip()
            for line in f
            if len(line.split(None, 5)) > 5 and "/dev/shm/@udp" in line
        ]


def data_address(a: Any) -> int:
    return int(a.__array_interface__["data"][0])


def parcel_backed(a: Any) -> bool:
    """``a``'s memory is a mapping of a pool parcel whose name is already gone."""
    path = mapping_path(data_address(a)) or ""
    return path.startswith("/dev/shm/@udp") and path.endswith("(deleted)")


def describe(a: Any) -> dict[str, Any]:
    """How an array arrived in the worker."""
    return {
        "type": type(a).__name__,
        "dtype": a.dtype.str if a.dtype.names is None else a.dtype.descr,
        "shape": a.shape,
        "writeable": bool(a.flags.writeable),
        "c": bool(a.flags.c_contiguous),
        "f": bool(a.flags.f_contiguous),
        "backing": backing(a),
        "parcel": parcel_backed(a) if a.size else None,
    }


def describe_all(*arrays: Any) -> list[dict[str, Any]]:
    return [describe(a) for a in arrays]


def describe_tree(obj: Any) -> Any:
    """``describe`` for every array in a nest of lists, tuples, dicts and Box/Holder."""
    if np is not None and isinstance(obj, np.ndarray):
        return describe(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(describe_tree(x) for x in obj)
    if isinstance(obj, dict):
        return {k: describe_tree(v) for k, v in obj.items()}
    if isinstance(obj, (Box, Holder)):
        return type(obj).__name__, describe_tree(vars(obj))
    return type(obj).__name__


def backing_of(obj: Any) -> str:
    return backing(obj)


def write_and_sum(a: Any, value: Any) -> Any:
    """Write into the received array (it must be writable) and return its sum."""
    a[...] = value
    return a.sum()


def mutate_bytearray(b: bytearray) -> Any:
    b[0] = (b[0] + 1) % 256
    return type(b).__name__, bytes(b[:4]), len(b)


def is_same(a: Any, b: Any) -> bool:
    return a is b


def same_in_nest(nest: dict[str, Any]) -> list[bool]:
    """``{"x": a, "y": [a, b], "z": (a,)}``: which entries are the very object ``x``."""
    x = nest["x"]
    return [nest["y"][0] is x, nest["y"][1] is x, nest["z"][0] is x]


def twice(n: int) -> Any:
    """One array returned twice (the result should hold one object)."""
    a = np.arange(n, dtype=np.float64)
    return a, [a], {"a": a}


# -- results made in the worker --------------------------------------------------------------------


def make_array(n: int, dtype: str = "f8") -> Any:
    return np.arange(n).astype(dtype)


def make_readonly(n: int) -> Any:
    a = np.arange(n, dtype=np.float64)
    a.setflags(write=False)
    return a


def make_strided(kind: str, n: int) -> Any:
    """Non-contiguous results."""
    base = np.arange(n * 12, dtype=np.float64).reshape(n * 3, 4)
    if kind == "step":
        return base[::3, 1]
    if kind == "transpose":
        return base.T
    if kind == "columns":
        return base[:, ::2]
    if kind == "reversed":
        return base[::-1]
    raise ValueError(kind)


def make_pair(n: int) -> Any:
    return np.arange(n, dtype=np.float64), np.arange(n, dtype=np.int32)


def make_bytes(n: int) -> Any:
    return bytes(range(256)) * (n // 256), bytearray(b"\x07" * n)


# -- containers ------------------------------------------------------------------------------------


@dataclass
class Box:
    array: Any
    meta: dict[str, Any]


class Holder:
    """A plain object (pickled through its ``__dict__``)."""

    def __init__(self, first: Any, second: Any) -> None:
        self.first = first
        self.second = second


def swap_holder(h: Holder) -> Holder:
    return Holder(h.second, h.first)


def box_twice(b: Box) -> Box:
    return Box(b.array * 2, dict(b.meta, doubled=True))


def fill_and_return(a: Any, value: Any) -> Any:
    """Write ``value`` all over the received array and send it back."""
    a[...] = value
    return a


def gated_pid(path: str) -> int:
    """This worker's pid, once ``path`` exists."""
    return int(gated(os.getpid(), path))


def started_then_gated(started: str, path: str, value: Any) -> Any:
    """Create ``started`` (the call has been taken and rebuilt), then wait for ``path``."""
    with open(started, "w"):
        pass
    return gated(value, path)


def arg_mapping(a: Any) -> Optional[str]:
    """The mapping of this worker that holds ``a``'s data."""
    return mapping_path(data_address(a))


def fail_with_mapping(a: Any) -> None:
    """Fail while ``a`` is alive in this frame (the traceback holds it)."""
    raise ValueError(mapping_path(data_address(a)))


# -- how a task travels ----------------------------------------------------------------------------


def caller() -> str:
    """The name of the function that called this task in the worker: the standard
    pool's worker loop, unless something wraps the call."""
    return sys._getframe(1).f_code.co_name


class Counted:
    """Counts its own picklings; arrives as a :class:`Rebuilt` saying which pickling
    of it was sent (1: it was pickled once)."""

    def __init__(self) -> None:
        self.n = 0

    def __reduce__(self) -> Any:
        self.n += 1
        return Rebuilt, (self.n,)


@dataclass
class Rebuilt:
    n: int


def counted(payload: Any = None) -> Any:
    """A result the worker pickles, beside ``payload``."""
    return Counted(), payload


class ArrivalError(Exception):
    pass


def _refuse() -> None:
    raise ArrivalError("this object does not load in the pool's process")


class RefusesToArrive:
    """Pickles in the worker; fails to load in the pool's process."""

    def __reduce__(self) -> Any:
        return _refuse, ()


def refusing_result(n: int) -> Any:
    """A result that cannot be rebuilt by the pool, beside ``n`` float64."""
    return np.arange(n, dtype=np.float64), RefusesToArrive()
