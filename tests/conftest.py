"""Fixtures shared by the suite.

Every test is checked for leftovers: a new entry in /dev/shm or a child
process still running after the test fails it.  Names are unique per test so
that tests (and parallel runs) never see each other's dicts.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

SHM = "/dev/shm"
#: Unique to this pytest session: every dict name the suite makes contains it, so
#: the leak check below never mistakes (or deletes) the segments of another
#: program -- or of a second test session running at the same time -- for ours.
SESSION = uuid.uuid4().hex[:6]
#: Names this session creates: the ``name`` fixture, the state machine
#: (``unique_name``) and the perf smoke test (12 hex digits).  The example
#: scripts name their dicts after their own pid; test_examples checks those.
OURS = re.compile(rf"(t|sm){SESSION}[0-9a-f]{{8,12}}(@\w+)?")


#: Soak mode: ``ULTRADICT_NG_SOAK=<seconds>`` runs the torture suite that long and
#: scales the counts of the other reliability suites (kills, fuzz examples, cycles).
SOAK_SECONDS = float(os.environ.get("ULTRADICT_NG_SOAK", "0") or 0)


def soak_scaled(n: int) -> int:
    """``n`` in CI; in soak mode, ``n`` per 30 s of soak time."""
    return n if not SOAK_SECONDS else max(n, int(n * SOAK_SECONDS / 30))


def unique_name(prefix: str = "t") -> str:
    """A dict name unique to this session and call (``prefix`` is 't' or 'sm')."""
    return prefix + SESSION + uuid.uuid4().hex[:8]


#: Process-pool parcels (layout: "Pool parcels") start with this.
PARCELS = "@udp"


def _descends_from_us(pid: int) -> bool:
    """Whether ``pid`` is this process or a live descendant of it (/proc's parent chain)."""
    me = os.getpid()
    for _ in range(64):
        if pid == me:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _maker_pid(entry: str) -> int:
    """The maker's pid from a parcel's name (``@udp<pool>.<maker>-<seq>``), 0 if none."""
    try:
        return int(entry.rsplit(".", 1)[1].split("-", 1)[0], 36)
    except (IndexError, ValueError):
        return 0


def _ours_or_abandoned(entry: str) -> bool:
    """A parcel is this session's when its pool is this process; one whose
    pool died (a test killed it), or whose header was never written, counts
    too -- unless its maker is alive and not this session's: a pool of
    another program (a benchmark or a second suite running beside this one)
    making it right now.  Those are never touched."""
    from ultradict_ng.futures.leftovers import parcels

    for rep in parcels():
        if rep.name == entry:
            if rep.owner_pid == os.getpid():
                return True
            if rep.status not in ("abandoned", "creating"):
                return False
            maker = rep.maker_pid or _maker_pid(entry)
            return not (maker and os.path.exists(f"/proc/{maker}") and not _descends_from_us(maker))
    return False


def _shm_entries(parcels: bool) -> set[str]:
    """This session's dict segments, and every parcel when ``parcels``."""
    if not os.path.isdir(SHM):
        return set()
    return {e for e in os.listdir(SHM) if OURS.fullmatch(e) or (parcels and e.startswith(PARCELS))}


#: Pids of servers the session keeps running across tests (the Redis fixtures).
SERVICE_PIDS: set[int] = set()


def _service_pids() -> set[int]:
    """multiprocessing's own long-lived helpers (resource tracker, forkserver)
    and the session's servers: not strays."""
    from multiprocessing import forkserver, resource_tracker

    pids = {
        getattr(resource_tracker._resource_tracker, "_pid", None),
        getattr(forkserver._forkserver, "_forkserver_pid", None),
    }
    return {p for p in pids if p} | SERVICE_PIDS


def _children() -> set[int]:
    """Pids of this process's live children (zombies are reaped first)."""
    multiprocessing.active_children()  # joins finished multiprocessing children
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
            pids = {int(p) for p in f.read().split()}
    except OSError:
        return set()
    live = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            live.add(pid)
    return live - _service_pids()


@pytest.fixture(autouse=True)
def no_leftovers(request: Any) -> Iterator[None]:
    """Fail the test if it leaves shared-memory segments or child processes behind.

    Parcels are looked for only around the tests of ``POOL_FILES``, the only ones
    that make them, and which run on one pytest-xdist worker: an abandoned parcel
    (its pool dead) cannot be told apart from the other worker's, which this
    check would otherwise count, and remove under the test that is looking at it.
    """
    parcels = os.path.basename(str(request.node.fspath)) in POOL_FILES
    before = _shm_entries(parcels)
    children_before = _children()
    yield
    import gc

    gc.collect()  # finalizers of dropped handles (auto_unlink) run now
    leaked = sorted(
        e for e in _shm_entries(parcels) - before if not e.startswith(PARCELS) or _ours_or_abandoned(e)
    )
    stray = sorted(_children() - children_before)
    for pid in stray:  # end only the processes this test started
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    described = list(leaked)
    if any(e.startswith(PARCELS) for e in leaked):  # whose: the pids, for the message
        from ultradict_ng.futures.leftovers import parcels as parcel_reports

        whose = {r.name: f"{r.status}, owner {r.owner_pid}, maker {r.maker_pid}" for r in parcel_reports()}
        described = [f"{e} ({whose[e]})" if e in whose else e for e in leaked]
    for entry in leaked:
        try:
            os.unlink(os.path.join(SHM, entry))
        except FileNotFoundError:
            pass
    assert not leaked, f"test left shared-memory segments behind: {described}"
    assert not stray, f"test left child processes running: {stray}"


@pytest.fixture
def name() -> str:
    """A dict name unique to this test."""
    return unique_name()


@pytest.fixture
def dicts():
    """``dicts(...)`` makes a SharedDict that is closed (unlinked) after the test, pass or fail."""
    from ultradict_ng import SharedDict

    made: list[Any] = []

    def make(*args: Any, **kwargs: Any) -> Any:
        made.append(SharedDict(*args, **kwargs))
        return made[-1]

    yield make
    for d in reversed(made):
        d.close()


@pytest.fixture(params=["futex", "poll"])
def mode(request: Any, monkeypatch: Any) -> str:
    """This process's waiters on the futex or polling (what ULTRADICT_NG_WAIT sets)."""
    from ultradict_ng._shm import waiting
    from ultradict_ng.speedups import FUTEX

    if request.param == "futex" and not FUTEX:
        pytest.skip("no futex on this platform")
    monkeypatch.setattr(waiting, "MODE", request.param)
    return request.param


# -- the Redis backend --------------------------------------------------------------------
#
# Suites that hold for every engine run once per backend: a module opts in
# with ``pytestmark = pytest.mark.usefixtures("each_backend")``; under
# "redis" ``ULTRADICT_NG_BACKEND`` points every SharedDict (and every child
# process, which inherits the environment) at a real redis-server this session
# started.  Tests about one engine's machinery carry ``@pytest.mark.shm_only``
# and are not collected for "redis".  ``ULTRADICT_NG_TEST_BACKENDS=shm`` runs
# the shared suites on shared memory only (CI's second and third passes).

BACKENDS = [b for b in os.environ.get("ULTRADICT_NG_TEST_BACKENDS", "shm,redis").split(",") if b]


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "shm_only: the test is about the shared-memory engine")


#: Test files that make process-pool parcels.  Under pytest-xdist they run on one
#: worker (``--dist loadgroup``), and only their tests look for leaked parcels: a
#: parcel left by a pool a test killed is "abandoned" (its maker is dead, so whose
#: it was cannot be told), and a leak check on the other worker would count it.
POOL_FILES = {
    "test_futures.py",
    "test_futures_leaks.py",
    "test_futures_small.py",
    "test_cli.py",
    "test_protocol.py",
    "test_perf_smoke.py",
    "test_perf_large.py",
    "test_docs.py",  # the process pool's guide page runs a pool
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the group marks
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:
        if os.path.basename(str(item.fspath)) in POOL_FILES:
            item.add_marker(pytest.mark.xdist_group("pool"))
    items[:] = [
        item
        for item in items
        if not (
            getattr(item, "callspec", None) is not None
            and item.callspec.params.get("each_backend") == "redis"
            and item.get_closest_marker("shm_only") is not None
        )
    ]


def pytest_collection_finish(session: Any) -> None:
    """On a pytest-xdist worker under ``--dist loadgroup``, the pool's tests must carry
    their group (xdist appends ``@pool`` to their ids): where it does not, they would
    run on both workers, and their leak checks would count each other's parcels."""
    config = session.config
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist's --dist loadgroup is not in effect with pytest {pytest.__version__} "
            f"(e.g. {lost[0]}): install the test extra's pytest (pip install -e '.[test]')"
        )


#: Control segments of dicts kept in files in /dev/shm as the run began.
_CONTROLS_BEFORE: set[str] = set()


def _unused_controls() -> set[str]:
    """Control segments of dicts kept in files (``udng+``) no live process uses."""
    from ultradict_ng._disk.layout import CONTROL_PREFIX
    from ultradict_ng._shm.survey import report

    out = set()
    for entry in os.listdir(SHM) if os.path.isdir(SHM) else ():
        if entry.startswith(CONTROL_PREFIX) and "@" not in entry:
            rep = report(entry, load_keys=False)
            making = rep is not None and rep.status == "creating"  # (its creator alive, at work now)
            if rep is not None and not rep.live_users and not making:
                out.add(entry)
    return out


def pytest_sessionstart(session: Any) -> None:
    """Every control segment there as the run begins is not the run's, in use
    or not: one a process of another program uses now may be left unused
    when it ends during the run."""
    if not hasattr(session.config, "workerinput"):  # (the run's own process: once per run)
        from ultradict_ng._disk.layout import CONTROL_PREFIX

        if os.path.isdir(SHM):
            _CONTROLS_BEFORE.update(e for e in os.listdir(SHM) if e.startswith(CONTROL_PREFIX))


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """The run fails if it left a dict kept in files' control segment behind.

    Per test, ``durable_dir`` finds those of the directories still there; a
    directory a test removed, or one under a plain ``tmp_path``, takes the
    name of its segment with it (named by device and inode), so the whole run
    is checked once more at its end: no live user, and not there before."""
    if hasattr(session.config, "workerinput"):
        return
    left = sorted(_unused_controls() - _CONTROLS_BEFORE)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"control segments of dicts kept in files left behind: {left}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Any]:
    """One redis-server (no persistence) for the session; tests use unique names."""
    from tests.redis_servers import RedisServer, require_redis

    require_redis()
    server = RedisServer.start()
    assert server.proc is not None
    SERVICE_PIDS.add(server.proc.pid)
    yield server
    server.stop()
    SERVICE_PIDS.discard(server.proc.pid)


def _redis_keys(server: Any) -> list[str]:
    return sorted(k.decode() if isinstance(k, bytes) else str(k) for k in server.execute("KEYS", "*"))


@pytest.fixture
def redis_url(redis_server: Any) -> Iterator[str]:
    """The session server's URL; the test fails if it leaves keys behind."""
    before = _redis_keys(redis_server)
    yield redis_server.url
    import gc

    gc.collect()  # finalizers of dropped handles (auto_unlink) run now
    left = [k for k in _redis_keys(redis_server) if k not in before]
    if left:
        redis_server.execute("DEL", *left)
    assert not left, f"test left Redis keys behind: {left}"


@pytest.fixture(params=[b for b in ("shm", "redis") if b in BACKENDS])
def each_backend(request: Any, monkeypatch: Any) -> Iterator[str]:
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        monkeypatch.setenv("ULTRADICT_NG_BACKEND", url)
    else:
        monkeypatch.delenv("ULTRADICT_NG_BACKEND", raising=False)
    yield request.param


@pytest.fixture
def durable_dir(tmp_path: Any) -> Iterator[str]:
    """A directory for a dict kept in files (not yet made: the dict makes it).

    Afterwards, every directory under the test's ``tmp_path`` (copies too) must
    have no control segment left in shared memory: a closed dict kept in files
    leaves only its files."""
    yield str(tmp_path / ("dict" + SESSION))
    import gc

    from ultradict_ng._disk.layout import control_name

    gc.collect()
    leaked = []
    for root, dirs, _files in os.walk(tmp_path):
        for d in dirs:
            st = os.stat(os.path.join(root, d))
            entry = control_name(st.st_dev, st.st_ino)
            if os.path.exists(os.path.join(SHM, entry)):
                leaked.append(f"{entry} ({os.path.join(root, d)})")
                os.unlink(os.path.join(SHM, entry))
    assert not leaked, f"dicts kept in files left control segments behind: {leaked}"
