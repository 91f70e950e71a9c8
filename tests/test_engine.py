"""The backend seam: SharedDict works on any engine that implements ``engine.Engine``.

``LocalEngine`` below is a second engine built only from the interface's
contract -- a "server" object holding the authoritative dict and a change
counter, each engine a client with a private cache, a shared lock word and a
bound counter (the shape a Redis engine has).  The facade, its nested views,
iteration and the compiled read hit path run on it unchanged, and agree
with a plain dict model.  (mypy checks that Store implements the Protocol:
see the end of store.py.)
"""

from __future__ import annotations

import copy
import random
import threading
from typing import Any

import pytest

from ultradict_ng import SharedDict
from ultradict_ng._codec import records as record
from ultradict_ng._codec.codec import MSGPACK
from ultradict_ng._engine import Engine
from ultradict_ng._shm import layout as L
from ultradict_ng._shm.lock import ShmLock
from ultradict_ng._shm.store import Store
from ultradict_ng.errors import PathGone, Unlinked
from ultradict_ng.speedups import StoreBase, Words


class Server:
    """The shared state of LocalEngine: one dict, a STATE word and a lock word."""

    def __init__(self) -> None:
        self.data: dict[Any, Any] = {}
        self.buf = bytearray(8 * 32)  # laid out like a control segment: STATE, LOCK words
        self.words = Words(self.buf)
        self.unlinked = False


class LocalEngine(StoreBase):
    """An engine that implements the interface and nothing of shared memory."""

    def __init__(self, server: Server, name: str, recurse: bool) -> None:
        self.server = server
        self.name = name
        self.recurse = recurse
        self.codec = MSGPACK
        self.lock = ShmLock(server.words, name, id(server))  # a lock word in the server's buffer
        self.mutex = threading.RLock()
        self.created = True
        self.words = memoryview(server.buf).cast("Q")
        self.seen = -1
        self.data = {}
        self._closed = False
        self._bind_state(server.words, L.W_STATE)  # the compiled hit path checks it

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def buffer_size(self) -> int:
        return 0

    def sync(self) -> None:
        with self.mutex:
            state = self.words[L.W_STATE]
            if state != self.seen:  # a whole-state fetch, as a remote engine would
                self.data = MSGPACK.loads(MSGPACK.dumps(self.server.data))
                self.seen = state

    def reload(self) -> None:
        self.seen = -1
        self.sync()

    def node(self, path: Any) -> dict[Any, Any]:
        node = self.data
        for key in path:
            node = node.get(key) if type(node) is dict else None
            if type(node) is not dict:
                raise PathGone(f"no nested dict at {list(path)!r}")
        return node

    def materialize(self, stored: Any) -> Any:
        return stored.value()  # an InlineArray: this engine keeps no blobs

    def view(self, stored: Any) -> memoryview:
        return memoryview(stored.data)

    def begin_write(self) -> None:
        self.lock.acquire()
        self.mutex.acquire()
        self.sync()
        if self.server.unlinked:
            self.end_write()
            raise Unlinked(self.name)

    def commit(self, rec: list[Any]) -> None:
        payload, decoded = self.codec.encode_record(rec)  # UnsupportedType: nothing changed
        record.apply(self.server.data, copy.deepcopy(decoded))
        self.server.words.store(L.W_STATE, self.words[L.W_STATE] + 1)
        record.apply(self.data, decoded)
        self.seen = self.words[L.W_STATE]

    def end_write(self) -> None:
        self.mutex.release()
        self.lock.release()

    def set_root(self, key: Any, value: Any) -> None:
        self.write(record.set_((), key, value))

    def write(self, rec: list[Any]) -> None:
        self.begin_write()
        try:
            self.commit(rec)
        finally:
            self.end_write()

    def force_dump(self) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {"name": self.name, "engine": "local", "keys": len(self.server.data)}

    def close(self) -> None:
        self._closed = True
        self._bind_state(None, 0)

    def unlink(self) -> int:
        self.server.unlinked = True
        return 1


def test_store_has_every_member_of_the_interface():
    from ultradict_ng._redis.engine import RedisEngine

    members = {n for n in vars(Engine) if not n.startswith("_")} | set(Engine.__annotations__)
    for member in members:
        assert hasattr(Store, member) or member in Store.__slots__ or member in ("seen", "data"), member
        assert hasattr(RedisEngine, member) or member in (
            "seen",
            "data",
            "name",
            "recurse",
            "codec",
            "mutex",
            "created",
            "words",
            "lock",
        ), member  # (set in __init__)


def _pair(recurse: bool = True):
    server = Server()
    a = SharedDict._on_engine(LocalEngine(server, "local", recurse))
    b = SharedDict._on_engine(LocalEngine(server, "local", recurse))
    return a, b


def test_facade_runs_on_another_engine_against_a_dict_model():
    a, b = _pair()
    model: dict[Any, Any] = {}
    rng = random.Random(7)
    for step in range(3000):
        d = a if rng.random() < 0.5 else b
        key = rng.choice(["k", "l", 3, (1, 2), None])
        op = rng.randrange(9)
        if op == 0:
            d[key] = model[key] = rng.random()
        elif op == 1:
            assert d.pop(key, "none") == model.pop(key, "none")
        elif op == 2:
            assert d.setdefault(key, [step]) == model.setdefault(key, [step])
        elif op == 3:
            d.update({key: step}, z=step)
            model.update({key: step}, z=step)
        elif op == 4 and rng.random() < 0.05:
            d.clear()
            model.clear()
        elif op == 5:
            d["nested"] = {"x": step}
            model["nested"] = {"x": step}
            d["nested"]["y"] = step  # a live nested view on the other engine
            model["nested"]["y"] = step
        elif op == 6 and model:
            assert d.popitem() == model.popitem()
        elif op == 7:
            assert (key in d) == (key in model)
            assert d.get(key, "none") == model.get(key, "none")
        other = b if d is a else a
        assert len(other) == len(model)
        assert other.copy() == model
        assert list(other.keys()) == list(model)
        if key in model and type(model[key]) is not dict:
            assert other[key] == model[key]  # the hit path, through the bound counter
    assert a == b == model
    assert a.stats()["engine"] == "local"


def test_nested_view_on_another_engine_reports_a_gone_path():
    a, b = _pair()
    a["n"] = {"x": 1}
    view = b["n"]
    a["n"] = 5
    with pytest.raises(PathGone):
        view["x"]


def test_closed_and_unlinked_on_another_engine():
    a, b = _pair()
    a["k"] = 1
    assert b.unlink() == 1
    with pytest.raises(Unlinked):
        a["k"] = 2
    assert b["k"] == 1  # reads keep the last state


def test_an_update_record_applies_its_pairs_in_order_and_refuses_other_shapes():
    data = {"a": 0}
    record.apply(data, record.update((), [["b", 1], ["a", 2], ["b", 3]]))
    assert data == {"a": 2, "b": 3} and list(data) == ["a", "b"]
    for pairs in ({"c": 1}, [["c", 1, 2]], [["c"]], [[["unhashable"], 1]], 5):
        with pytest.raises(record.Inconsistent):
            record.apply(data, [record.update((), [])[0], [], pairs])
    assert data == {"a": 2, "b": 3}
