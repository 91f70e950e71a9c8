"""A SharedCache kept in files (``SharedCache(path=DIR)``): its entries and
settings outlive its processes and a reboot; its side file is rebuilt from the
entries after a recovery that found no clean close, and kept as it was after
one that did; the Django and cachelib backends open it by directory.

Power loss is simulated in tests/test_powerloss.py (every disk state opens as
a whole cache); Django's and cachelib's own suites run on it in
tests/test_django_cache.py and tests/test_cachelib_cache.py.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.durable_workers import audit_side
from tests.test_durable import reboot
from ultradict_ng._disk import layout as D
from ultradict_ng.cache import SharedCache
from ultradict_ng.cache import layout as C
from ultradict_ng.errors import NotFound, ParameterMismatch

pytestmark = pytest.mark.shm_only

spawn = multiprocessing.get_context("spawn")

FILL = """
import os, signal, sys
from ultradict_ng.cache import SharedCache
c = SharedCache(path=sys.argv[1], create=False)
for i in range(int(sys.argv[2])):
    c.set(f"k{i}", "v" * (i % 7) + str(i), ttl=None if i % 3 else 3600)
c.delete("k1")
print(repr(sorted((k, c[k]) for k in c)), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no close: no clean file
"""


def _fill_and_die(path: str, n: int) -> str:
    """The cache's entries (a sorted repr) as the killed writer left them."""
    out = subprocess.run(
        [sys.executable, "-c", FILL, path, str(n)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == -signal.SIGKILL and out.stdout.startswith("[("), out.stderr
    return out.stdout.strip()


def _read_in_child(path: str, key: str, q: Any) -> None:
    c = SharedCache(path=path, create=False)
    q.put((c.get(key), c.maxsize, c.default_ttl))
    c.close()


def test_a_cache_outlives_its_processes_and_a_reboot(durable_dir):
    c = SharedCache(path=durable_dir, maxsize=50, ttl=600, sync="always")
    for i in range(80):
        c.set(f"k{i}", i)
    c.set("short", 1, ttl=0.3)
    kept = {k: c[k] for k in c}
    assert len(kept) == 50 and c.stats()["evictions"] == 31
    c.close()
    assert sorted(os.listdir(durable_dir)) == ["cache", "clean", "dict.meta", "stream"]
    reboot(durable_dir)
    time.sleep(0.35)
    c = SharedCache(path=durable_dir)  # (settings come from the files)
    assert (c.maxsize, c.default_ttl, c.serializer) == (50, 600.0, "msgpack")
    assert {k: c[k] for k in c} == {k: v for k, v in kept.items() if k != "short"}  # expiry is data
    assert c.stats()["evictions"] == 31  # (the counters were synced with the clean close)
    for i in range(100, 140):  # the bound holds after the reboot
        c.set(f"k{i}", i)
    assert len(c) == 50 and c.get("k139") == 139
    q = spawn.Queue()
    p = spawn.Process(target=_read_in_child, args=(durable_dir, "k139", q))
    p.start()
    assert q.get(timeout=60) == (139, 50, 600.0)
    p.join(60)
    assert p.exitcode == 0
    c2 = pickle.loads(pickle.dumps(c))  # (by directory: what spawn sends)
    assert c2.directory == c.directory == durable_dir and c2.get("k139") == 139
    c2.close()
    with pytest.raises(ParameterMismatch, match="maxsize=50"):
        SharedCache(path=durable_dir, maxsize=10)
    sent = pickle.dumps(c)
    c.unlink()
    c.close()
    assert not os.path.exists(durable_dir)
    new = SharedCache(path=durable_dir, maxsize=50)  # (another cache at the path: often the same inode)
    with pytest.raises(NotFound, match="is gone"):
        pickle.loads(sent)  # (the cache it was of is not there)
    new.unlink()
    new.close()


@pytest.mark.parametrize("bounds", [{"maxsize": 40}, {"maxbytes": 2000}, {}])
def test_after_a_crash_and_a_reboot_the_side_file_is_rebuilt(durable_dir, bounds):
    c = SharedCache(path=durable_dir, sync="never", **bounds)
    side_file = os.path.join(durable_dir, D.CACHE_FILE)
    with open(side_file, "rb") as f:
        as_created = f.read()  # (what the disk may hold of it after a power loss)
    c.close()
    expected = _fill_and_die(durable_dir, 60)
    reboot(durable_dir)
    assert not os.path.exists(os.path.join(durable_dir, D.CLEAN_FILE))  # (killed: no clean close)
    with open(side_file, "r+b") as f:
        f.write(as_created)  # the side file as the power loss left it: older than the entries
    c = SharedCache(path=durable_dir, create=False)
    assert audit_side(c) == ""  # rebuilt at open: slots, sizes, bytes, the expiring flag
    assert repr(sorted((k, c[k]) for k in c)) == expected
    for i in range(60, 90):  # and it works on: bounds, slots
        c.set(f"k{i}", i)
    assert audit_side(c) == ""
    if "maxsize" in bounds:
        assert len(c) == 40
    if "maxbytes" in bounds:
        assert c.stats()["bytes"] <= 2000
    c.unlink()
    c.close()


def test_after_a_clean_close_the_side_file_is_kept_as_it_was(durable_dir):
    c = SharedCache(path=durable_dir, maxsize=20)
    for i in range(30):
        c.set(f"k{i}", i)
    hot = min(c, key=lambda k: c._side.recency[c._d[k][1]])  # the least recently used ...
    assert c.get(hot) is not None  # ... made the most recently used
    recency = list(c._side.recency)
    words = list(c._side.words)
    c.close()
    reboot(durable_dir)
    c = SharedCache(path=durable_dir)
    assert list(c._side.recency) == recency and list(c._side.words) == words  # no rebuild
    assert c._side.words[C.W_BATCH] == 0
    c.set("new", 1)  # evicts the least recently used, as before the reboot
    assert hot in c and len(c) == 20
    c.unlink()
    c.close()


def test_a_writer_killed_in_a_batch_is_rebuilt_after_a_reboot(durable_dir):
    c = SharedCache(path=durable_dir, maxsize=30)
    c.set_many({f"k{i}": i for i in range(10)})
    c._side.words[C.W_BATCH] = 1  # (what a writer killed inside set_many leaves)
    c._side.words[C.W_NEXT] = 0
    c.close()
    reboot(durable_dir)
    c = SharedCache(path=durable_dir)
    assert audit_side(c) == "" and len(c) == 10
    c.unlink()
    c.close()


@pytest.mark.parametrize("then", ["survivors write on", "a reboot"])
@pytest.mark.parametrize("point", ["cache-slot-taken", "cache-entry-removed"])
def test_a_writer_killed_at_a_cache_point(durable_dir, point, then):
    """A writer of a full cache kept in files killed after taking a slot, or
    after deleting an evicted entry before giving its slot back and its bytes
    (which then count one entry too many: cache_layout, "Crashes"): the
    others write on within the bounds, and a reboot's reopen rebuilds a side
    file that matches the entries, bytes and all."""
    c = SharedCache(path=durable_dir, maxsize=20, maxbytes=1 << 20, sync="never")
    for i in range(20):
        c[f"pre{i}"] = i
    if then == "a reboot":
        c.close()
    env = {**os.environ, "ULTRADICT_NG_FAULT": f"{point}:kill:5"}
    p = subprocess.run(
        [sys.executable, "-m", "tests.cache_workers", "writer", durable_dir, "9", "200", "-"],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert p.returncode == -signal.SIGKILL, p.stderr
    if then == "a reboot":
        reboot(durable_dir)
        c = SharedCache(path=durable_dir)
        assert audit_side(c) == "" and len(c) <= 20, audit_side(c)
    for i in range(200):
        c[f"after{i}"] = i
        assert len(c) <= 20
    assert len(c) == 20 and all(c[k] == int(k[5:]) for k in c if k.startswith("after"))
    audit = audit_side(c)
    if then == "a reboot" or point == "cache-slot-taken":
        assert audit == "", audit
    else:  # (the dead writer's bytes still counted: too many, never too few)
        assert audit == "" or audit.startswith("bytes ") and int(audit.split()[1]) > int(audit.split()[3]), (
            audit
        )
    c.unlink()
    c.close()


# -- the Django backend: OPTIONS["PATH"] ------------------------------------------------------


def _django_backend(params: dict[str, Any]) -> Any:
    pytest.importorskip("django")
    from ultradict_ng.integrations.django import SharedCache as DjangoCache

    return DjangoCache(params.pop("LOCATION", ""), params)


DJANGO_CHILD = """
import sys
import django
from django.conf import settings
settings.configure(CACHES={"default": {
    "BACKEND": "ultradict_ng.integrations.django.SharedCache",
    "OPTIONS": {"PATH": sys.argv[1], "SYNC": "always", "MAX_ENTRIES": 100},
}})
django.setup()
from django.core.cache import cache
if sys.argv[2] == "set":
    cache.set("greeting", {"hello": ["world", 1.5]}, None)
    cache.set("counter", 10)
    cache.incr("counter", 5)
else:
    print(repr((cache.get("greeting"), cache.get("counter"))))
"""


def test_django_cache_kept_in_files_survives_a_reboot(durable_dir):
    pytest.importorskip("django")
    for step in ("set", "get"):
        out = subprocess.run(
            [sys.executable, "-c", DJANGO_CHILD, durable_dir, step],
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        )
        assert out.returncode == 0, out.stderr
        if step == "set":
            reboot(durable_dir)
    assert out.stdout.strip() == repr(({"hello": ["world", 1.5]}, 15))
    c = SharedCache(path=durable_dir, create=False)
    assert (c.maxsize, c.serializer) == (100, "pickle")
    c.unlink()
    c.close()


@pytest.mark.parametrize(
    "params, problem",
    [
        ({"LOCATION": "x", "OPTIONS": {"PATH": "/tmp/x"}}, "not both"),
        ({"OPTIONS": {"PATH": "DIR", "AUTO_UNLINK": "last"}}, "AUTO_UNLINK does not apply"),
        ({"LOCATION": "x", "OPTIONS": {"SYNC": "always"}}, "set OPTIONS\\['PATH'\\] too"),
        ({"OPTIONS": {"PATH": "DIR", "SYNC": "sometimes"}}, "SYNC must be one of"),
        ({"OPTIONS": {"PATH": "DIR", "SYNC_INTERVAL": 0}}, "SYNC_INTERVAL must be"),
        (
            {"OPTIONS": {"PATH": "DIR", "SYNC": "never", "SYNC_INTERVAL": 2}},
            "SYNC_INTERVAL is for SYNC 'interval'",
        ),
        ({"OPTIONS": {"PATH": ""}}, "PATH must be"),
    ],
)
def test_django_path_options_are_checked_before_anything_is_made(durable_dir, params, problem):
    pytest.importorskip("django")
    from django.core.exceptions import ImproperlyConfigured

    options = params.get("OPTIONS", {})
    if options.get("PATH") == "DIR":
        options["PATH"] = durable_dir
    with pytest.raises(ImproperlyConfigured, match=problem):
        _django_backend(params)
    assert not os.path.exists(durable_dir)


# -- the cachelib backend: path= --------------------------------------------------------------


def test_cachelib_cache_kept_in_files(durable_dir):
    pytest.importorskip("cachelib")
    from ultradict_ng.integrations.cachelib import SharedCache as CachelibCache

    with pytest.raises(ValueError, match="not both"):
        CachelibCache(name="x", path=durable_dir)
    with pytest.raises(ValueError, match="never removed automatically"):
        CachelibCache(path=durable_dir, auto_unlink="last")
    with pytest.raises(ValueError, match="pass path= too"):
        CachelibCache(name="x", sync="always")
    assert not os.path.exists(durable_dir)
    cache = CachelibCache(path=durable_dir, threshold=10, sync="always", default_timeout=0)
    cache.set("a", {"b": 1})
    assert cache.inc("n", 2) == 2
    cache.close()
    reboot(durable_dir)
    again = CachelibCache(path=durable_dir, threshold=None)
    assert again.get("a") == {"b": 1} and again.get("n") == 2 and again.cache.maxsize == 10
    again.cache.unlink()
    again.close()


def test_killing_the_writer_mid_eviction_then_rebooting_keeps_the_bounds(durable_dir):
    """A writer SIGKILLed at random while it evicts; after a reboot the cache
    holds at most maxsize entries and its side file passes the audit."""
    c = SharedCache(path=durable_dir, maxsize=25, sync="never")
    c.close()
    code = (
        "import sys\nfrom ultradict_ng.cache import SharedCache\n"
        "c = SharedCache(path=sys.argv[1], create=False)\nprint('ready', flush=True)\n"
        "i = 0\nwhile True:\n    c.set(f'k{i}', 'x' * (i % 50))\n    i += 1\n"
    )
    for round_ in range(3):
        p = subprocess.Popen([sys.executable, "-c", code, durable_dir], stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        time.sleep(0.05 + 0.05 * round_)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        p.stdout.close()
        reboot(durable_dir)
        c = SharedCache(path=durable_dir)
        assert audit_side(c) == "" and 0 < len(c) <= 25
        c.close()
    c = SharedCache(path=durable_dir)
    c.unlink()
    c.close()


def test_a_stored_setting_mismatch_names_the_directory(durable_dir):
    """Kept in files, the cache is its directory: the error names it, not its shared memory."""
    c = SharedCache(path=durable_dir, maxsize=10)
    with pytest.raises(ParameterMismatch, match=f"cache '{durable_dir}' was created with maxsize=10, not 20"):
        SharedCache(path=durable_dir, maxsize=20)
    c.unlink()
    c.close()


@pytest.mark.parametrize(
    "settings", [{"maxbytes": 2**64}, {"maxsize": 5, "cull_frequency": 2**64}, {"maxsize": 2**64}]
)
def test_a_limit_beyond_the_side_files_words_is_refused_before_anything_is_made(durable_dir, settings):
    with pytest.raises(ValueError, match="below 2\\*\\*56"):
        SharedCache(path=durable_dir, **settings)
    assert not os.path.exists(durable_dir)


def test_a_cache_whose_side_file_cannot_be_made_leaves_no_dict(durable_dir, monkeypatch):
    """The dict is made first, then the side file (its slots): when that
    fails (no room for the slots of a large maxsize, an interrupt) the dict
    this call made is removed again -- and one another opener made the cache
    in meanwhile stays."""
    from ultradict_ng.cache import side
    from ultradict_ng.errors import OutOfSpace

    write_new = side._write_new

    def no_room(*args: Any) -> Any:
        raise OutOfSpace("no room on the disk for the cache's slots")

    monkeypatch.setattr(side, "_write_new", no_room)
    with pytest.raises(OutOfSpace):
        SharedCache(path=durable_dir, maxsize=10)
    assert not os.path.exists(durable_dir)

    def another_made_it(name: str, token: int, settings: Any) -> Any:
        made = write_new(name, token, settings)
        made.close()
        raise OutOfSpace("no room")

    monkeypatch.setattr(side, "_write_new", another_made_it)
    with pytest.raises(OutOfSpace):
        SharedCache(path=durable_dir, maxsize=10)
    monkeypatch.undo()
    c = SharedCache(path=durable_dir)
    assert c.maxsize == 10
    c.unlink()
    c.close()


@pytest.mark.parametrize("where", ["another process", "another handle here"])
def test_a_refused_cache_creation_leaves_the_dict_another_opened(durable_dir, monkeypatch, where):
    """Another process, or another handle of this one, that opened the new
    dict (to make the cache in it next) keeps it: the refused creator
    removes the dict only while nothing else uses it, asked under the
    locks an opener registers under."""
    from ultradict_ng import SharedDict
    from ultradict_ng.cache import opening, side
    from ultradict_ng.errors import OutOfSpace

    code = (
        f"import sys\nfrom ultradict_ng import SharedDict\nd = SharedDict(path={durable_dir!r})\n"
        "print('open', flush=True)\nsys.stdin.readline()\nd.close()\n"
    )

    def no_room(*args: Any) -> Any:
        raise OutOfSpace("no room for the cache's slots")

    monkeypatch.setattr(side, "_write_new", no_room)
    others: list[Any] = []
    real_open_side = opening.open_side

    def with_another_opener(*args: Any, **kwargs: Any) -> Any:
        if where == "another process":
            p = subprocess.Popen(
                [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            others.append(p)
            assert p.stdout is not None and p.stdout.readline().strip() == "open"
        else:
            others.append(SharedDict(path=durable_dir))
        return real_open_side(*args, **kwargs)

    monkeypatch.setattr(opening, "open_side", with_another_opener)
    try:
        with pytest.raises(OutOfSpace):
            SharedCache(path=durable_dir, maxsize=10)
        assert os.path.exists(os.path.join(durable_dir, D.META_FILE))  # (the other's dict)
    finally:
        for other in others:
            if isinstance(other, subprocess.Popen):
                other.communicate("\n", timeout=60)
            else:
                other.close()
    monkeypatch.undo()
    c = SharedCache(path=durable_dir, maxsize=10)
    c["k"] = 1
    assert c.maxsize == 10 and c["k"] == 1
    c.unlink()
    c.close()


def test_a_dict_kept_in_files_opened_as_a_cache_is_refused_naming_its_directory(durable_dir):
    from ultradict_ng import SharedDict
    from ultradict_ng.errors import ParameterMismatch

    d = SharedDict(path=durable_dir)
    d["k"] = 1
    d.close()
    with pytest.raises(
        ParameterMismatch, match=f"shared dict {durable_dir!r} holds keys but is not a SharedCache"
    ):
        SharedCache(path=durable_dir)
    d = SharedDict(path=durable_dir)
    d.unlink()
    d.close()


@pytest.mark.parametrize("damage", ["zeroed", "cut to nothing", "a NaN ttl"])
def test_a_damaged_side_file_is_named_and_doctor_fails_it(durable_dir, damage):
    """The side file holds the cache's settings and slots: damaged, every
    open refuses the cache while it holds entries -- naming the file, not a
    segment -- and ``doctor`` fails it instead of reporting the dict whole."""
    import struct

    from ultradict_ng.cli.paths import file_checks
    from ultradict_ng.errors import CorruptSegment

    c = SharedCache(path=durable_dir, maxsize=50)
    c["a"] = 1
    c.close()
    side = os.path.join(durable_dir, D.CACHE_FILE)
    assert [c for c in file_checks(durable_dir) if c[0] == "cache"] == [
        ("cache", "ok", "its settings and slots are whole")
    ]
    size = os.path.getsize(side)
    with open(side, "r+b") as f:
        if damage == "zeroed":
            f.write(bytes(size))
        elif damage == "cut to nothing":
            f.truncate(0)
        else:
            f.seek(C.W_TTL * 8)
            f.write(struct.pack("d", float("nan")))
    (check,) = [c for c in file_checks(durable_dir) if c[0] == "cache"]
    assert check[1] == "fail" and side in check[2], check
    with pytest.raises(CorruptSegment, match=f"the cache's file {side}"):
        SharedCache(path=durable_dir)
    from ultradict_ng import SharedDict

    e = SharedDict(path=durable_dir)  # (the cache cannot open: removed through a plain handle)
    e.unlink()
    e.close()
