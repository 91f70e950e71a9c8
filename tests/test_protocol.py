"""The shared-memory protocol under adversity: races, corruption, foreign segments, full memory."""

from __future__ import annotations

import datetime
import errno
import multiprocessing
import os
import pickle
import re
import secrets
import stat
import struct
import subprocess
import sys
import textwrap
import time
import zlib

import pytest

from tests import helpers
from ultradict_ng import (
    CorruptSegment,
    IncompatibleLayout,
    OutOfSpace,
    SharedDict,
    SharedDictError,
    unlink_by_name,
)
from ultradict_ng._platform import segments
from ultradict_ng._platform.owner import owner_word
from ultradict_ng._platform.segments import Segment
from ultradict_ng._shm import layout as L
from ultradict_ng._shm import table_layout as TL
from ultradict_ng._shm.table import Table
from ultradict_ng.futures import parcel

spawn = multiprocessing.get_context("spawn")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ours(name):
    return sorted(e for e in os.listdir("/dev/shm") if e == name or e.startswith(name + "@"))


def test_readers_never_fail_while_writers_dump_constantly(name):
    """Spawned writers on a 256-byte stream (a dump every few writes, dump segments
    unlinked under the reader); this process reads and iterates throughout: no
    exception, no key going back in time, the final state exact."""
    d = SharedDict(name=name, buffer_size=256)
    writers = [spawn.Process(target=helpers.sequence_writer, args=(name, w, 600)) for w in range(3)]
    for p in writers:
        p.start()
    last = {}
    passes = 0
    gens = set()
    while any(p.is_alive() for p in writers) or passes == 0:
        for key, value in d.items():
            if key.startswith("w"):
                assert type(value) is int and value >= last.get(key, -1), (key, value, last)
                last[key] = value
            elif key.startswith("big"):
                assert type(value) is bytes and len(value) == 5000 and len(set(value)) == 1
            elif key.startswith("tmp"):
                assert type(value) is list and value[1] == str(value[0])
        gens.add(d._store.gen)
        for _ in range(20):  # (cheap reads in between: the generations seen do not depend
            d.get("total")  # on how many full passes a loaded machine allows)
            gens.add(d._store.gen)
        passes += 1
    try:
        for p in writers:
            p.join(60)
            assert p.exitcode == 0
        assert {k: d[k] for k in d if k.startswith("w")} == {f"w{w}": 599 for w in range(3)}
        assert d["total"] == 3 * 120
        # The writers dumped many times while this process read (the final
        # generation counts the dumps), and it read across several of them.
        # (How many it catches depends on how fast the writers finish: it was
        # > 10 before bulk writes got faster, and failed on loaded machines.)
        assert d._store.gen > 10, f"too few dumps made ({d._store.gen}): the test did not exercise them"
        assert len(gens) > 3, f"too few dumps observed ({len(gens)}): the test did not exercise them"
    finally:
        d.close()
    assert ours(name) == []


def test_dump_unlinked_between_state_load_and_open_is_retried(name, monkeypatch):
    """The CannotAttachSharedMemory race, forced: the first open of each dump fails
    as if a newer dump had replaced it; the reader retries and succeeds."""
    writer = SharedDict(name=name, buffer_size=64)
    reader = SharedDict(name=name)
    real_attach = Segment.attach.__func__
    failed = set()

    def flaky_attach(cls, seg_name):
        if "@d" in seg_name and seg_name not in failed:
            failed.add(seg_name)
            raise FileNotFoundError(seg_name)
        return real_attach(cls, seg_name)

    monkeypatch.setattr(Segment, "attach", classmethod(flaky_attach))
    for i in range(20):
        writer[i] = "x" * 100  # every write dumps
        assert reader[i] == "x" * 100
    assert len(failed) == 20
    reader.close()
    writer.close()


def test_foreign_segment_under_our_name(name):
    seg = Segment.create(name, 4096)
    seg.buf[:16] = b"NOT OURS AT ALL!"
    seg.close()
    try:
        with pytest.raises(CorruptSegment) as info:
            SharedDict(name=name)
        assert name in str(info.value) and isinstance(info.value, ValueError)
        with pytest.raises(CorruptSegment):
            unlink_by_name(name)
        assert segments.exists(name)  # a foreign segment is never removed
    finally:
        segments.unlink(name)


def test_small_foreign_segment(name):
    seg = Segment.create(name, 16)
    seg.close()
    try:
        with pytest.raises(CorruptSegment):
            SharedDict(name=name)
    finally:
        segments.unlink(name)


def test_other_layout_version(name):
    d = SharedDict(name=name)
    d._store._map.words[L.W_LAYOUT] = 99 | (L.CONTROL_SIZE << 32)
    with pytest.raises(IncompatibleLayout) as info:
        SharedDict(name=name)
    assert "99" in str(info.value)
    with pytest.raises(IncompatibleLayout):
        unlink_by_name(name)
    d._store._map.words[L.W_LAYOUT] = L.LAYOUT_VERSION | (L.CONTROL_SIZE << 32)
    d.close()


def test_half_made_dict_of_a_dead_creator(name, monkeypatch):
    """A creator killed before publishing MAGIC: attachers get a clear error, not a
    hang; unlink_by_name removes what it left."""
    monkeypatch.setattr(L, "INIT_TIMEOUT", 0.3)
    helpers.make_half_created(name, 0x7FFFFF, stream=True)  # a pid that does not exist
    t0 = time.monotonic()
    with pytest.raises(CorruptSegment) as info:
        SharedDict(name=name)
    assert time.monotonic() - t0 < 0.2  # a dead creator is not waited for
    assert "never initialised" in str(info.value) and "died" in str(info.value)
    assert unlink_by_name(name) == 2
    assert ours(name) == []


def test_half_made_dict_of_a_live_creator_is_waited_for(name, monkeypatch):
    """MAGIC still 0 but the creator alive: wait up to INIT_TIMEOUT, then a clear error
    -- and unlink_by_name refuses to pull the dict from under its creator."""
    monkeypatch.setattr(L, "INIT_TIMEOUT", 0.3)
    from ultradict_ng._shm.lock import owner_word

    helpers.make_half_created(name, owner_word())  # we are the (slow) creator
    try:
        t0 = time.monotonic()
        with pytest.raises(CorruptSegment) as info:
            SharedDict(name=name)
        assert 0.3 <= time.monotonic() - t0 < 3
        assert "never initialised" in str(info.value)
        with pytest.raises(CorruptSegment) as info2:
            unlink_by_name(name)
        assert "being created" in str(info2.value)
    finally:
        segments.unlink(name)


def test_foreign_segment_with_zero_magic_is_never_unlinked(name):
    """Another program's page whose first word is 0 (and whose 'creator' word holds a
    dead pid by chance) is not a half-made dict: unlink_by_name refuses it."""
    with open(f"/dev/shm/{name}", "wb") as f:
        f.write(bytes(8) + os.urandom(L.CONTROL_SIZE - 8))
    try:
        with pytest.raises(CorruptSegment) as info:
            unlink_by_name(name)
        assert "not an ultradict_ng control segment" in str(info.value)
        assert os.path.exists(f"/dev/shm/{name}")
    finally:
        segments.unlink(name)


def test_empty_segment_left_before_ftruncate(name, monkeypatch):
    monkeypatch.setattr(L, "INIT_TIMEOUT", 0.2)
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    with pytest.raises(CorruptSegment):
        SharedDict(name=name, create=False)
    assert unlink_by_name(name) == 1


def test_corrupted_record_is_detected_never_applied(name):
    writer = SharedDict(name=name)
    reader = SharedDict(name=name)
    writer["a"] = "payload"
    mv = writer._store._map.stream_mv
    mv[L.RECORD_HEADER + 2] ^= 0xFF  # flip a payload byte of the published record
    with pytest.raises(CorruptSegment) as info:
        reader["a"]
    assert "checksum" in str(info.value)
    assert reader._store.data == {}  # nothing was applied
    mv[L.RECORD_HEADER + 2] ^= 0xFF
    assert reader["a"] == "payload"  # and it recovers once the bytes are right
    reader.close()
    writer.close()


def test_stale_generation_records_are_rejected(name):
    """STATE pointing into records of the previous generation (a torn restart) must
    not be applied: the generation tag gives them away."""
    d = SharedDict(name=name, buffer_size=4096)
    for i in range(5):
        d[i] = i
    old_end = d._store.pos
    d["big"] = b"x" * 5000  # dump: generation 1, stream restarts at 0
    gen = d._store.gen
    d._store._map.atomic.store(L.W_STATE, (gen << L.GEN_SHIFT) | old_end)
    with pytest.raises(CorruptSegment) as info:
        SharedDict(name=name)
    assert "another generation" in str(info.value)
    d._store._map.atomic.store(L.W_STATE, gen << L.GEN_SHIFT)
    d.close()


@pytest.mark.parametrize("serializer", ["msgpack", "pickle"])
@pytest.mark.parametrize("field", ["length", "crc", "magic"])
def test_corrupted_dump_header(name, field, serializer):
    """Both dump forms (a msgpack dict's is a table: these bytes are its count,
    slots and magic; a pickle dict's is the payload form)."""
    d = SharedDict(name=name, buffer_size=64, serializer=serializer)
    d["k"] = "v" * 100
    dname = L.dump_name(name, d._store.gen)
    seg = Segment.attach(dname)
    assert bytes(seg.buf[:8]) == (TL.TABLE_MAGIC if serializer == "msgpack" else L.DUMP_MAGIC)
    if field == "length":
        seg.buf[16:24] = (2**60).to_bytes(8, "little")  # must not allocate 2**60 bytes
    elif field == "crc":
        seg.buf[24] ^= 0xFF
    else:
        seg.buf[0] ^= 0xFF
    seg.close()
    with pytest.raises(CorruptSegment) as info:
        SharedDict(name=name)
    assert dname in str(info.value)
    d.close()
    assert ours(name) == []


def _rewrite_table_header(buf, **fields):
    """Change fields of the table header at the start of ``buf`` and give it a
    valid crc again: damage only the checks behind the crc can find."""
    names = ("magic", "generation", "count", "slots", "start", "end", "token")
    header = struct.Struct(TL.TABLE_FORMAT)
    values = dict(zip(names, header.unpack_from(buf, 0)))
    values.update(fields)
    head = header.pack(*(values[n] for n in names), 0, 0)[:-8]
    header.pack_into(buf, 0, *(values[n] for n in names), zlib.crc32(head), 0)


@pytest.mark.parametrize("damage", ["entry-value", "entry-length", "token", "generation", "count", "end"])
def test_damaged_table_dump_is_corrupt_never_a_wrong_dict(name, damage):
    """A table dump (layout: "Dump") is checked where the header's crc cannot
    vouch for it: each entry's crc and bounds, the token (another dict's
    table), the generation (another generation's), the count and the end (a
    table that lost or gained entries).  Each gives CorruptSegment naming the
    dump -- the value bytes damaged would otherwise decode to another value:
    at open where the dump is decoded whole, at the read of the damaged part
    where it is read in place (ULTRADICT_NG_PARTIAL_FROM=0): copy() reads all."""
    d = SharedDict(name=name, buffer_size=64)
    d.update({f"key{i}": f"value{i:03d}" for i in range(20)})
    d["big"] = "v" * 100  # does not fit the stream: a dump of all 21 keys
    gen = d._store.gen
    dname = L.dump_name(name, gen)
    seg = Segment.attach(dname)
    with memoryview(seg.buf) as buf:
        table = Table(buf, d._store.token)
        first = table.start
        last_entry = list(table.offsets())[-1]
        table.close()
        if damage == "entry-value":
            buf[first + TL.TABLE_ENTRY_HEADER + 5] ^= 0x01  # inside the first entry's bytes
        elif damage == "entry-length":
            buf[first + 12] ^= 0x02  # the value length word: the entries no longer chain
        elif damage == "token":
            _rewrite_table_header(buf, token=d._store.token ^ 1)
        elif damage == "generation":
            _rewrite_table_header(buf, generation=gen + 1)
        elif damage == "count":
            _rewrite_table_header(buf, count=21 - 1)
        else:  # the last entry falls outside
            _rewrite_table_header(buf, end=last_entry)
    seg.close()
    opened = []
    with pytest.raises(CorruptSegment) as info:
        opened.append(SharedDict(name=name, create=False))
        opened[0].copy()
    assert dname in str(info.value)
    for h in opened:
        h.close()
    d.close()
    assert ours(name) == []


def test_dump_forms(name):
    """A msgpack dict's dump is a table indexing every root key (a probe finds
    each, equal keys of other types included); a pickle dict's is the payload form."""
    keys = [
        1,
        2.5,
        "s",
        b"b",
        (1, "t"),
        frozenset({1, 2}),
        None,
        True,
        datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc),
    ]
    d = SharedDict(name=name, buffer_size=64)
    d.update({k: [i, "x" * 50] for i, k in enumerate(keys)})
    seg = Segment.attach(L.dump_name(name, d._store.gen))
    with memoryview(seg.buf) as buf:
        table = Table(buf, d._store.token)
        try:
            assert table.count == len(keys) - 1  # True == 1: one key
            loads = d._store.codec.loads
            for k in keys + [
                1.0,
                (1.0, "t"),
                frozenset({2, 1}),
                datetime.datetime(2026, 1, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=1))),
            ]:
                assert loads(table.lookup(k, loads)) == d[k]
        finally:
            table.close()
    seg.close()
    d.close()
    p = SharedDict(name=name + "p", buffer_size=64, serializer="pickle")
    p.update({k: "x" * 50 for k in range(5)})
    seg = Segment.attach(L.dump_name(p.name, p._store.gen))
    assert bytes(seg.buf[:8]) == L.DUMP_MAGIC
    seg.close()
    q = SharedDict(name=p.name)
    assert q.copy() == p.copy()
    q.close()
    p.close()


def test_state_end_beyond_stream(name):
    d = SharedDict(name=name, buffer_size=4096)
    d._store._map.atomic.store(L.W_STATE, 10**6)
    with pytest.raises(CorruptSegment) as info:
        SharedDict(name=name)
    assert "outside" in str(info.value)
    d._store._map.atomic.store(L.W_STATE, 0)
    d.close()


def test_full_shared_memory_during_dump_changes_nothing(name, monkeypatch):
    d = SharedDict(name=name, buffer_size=64)
    other = SharedDict(name=name)
    d["keep"] = 1
    before = ours(name)

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(OutOfSpace) as info:
        d["big"] = "x" * 1000
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
    assert name in str(info.value)
    assert d.copy() == {"keep": 1} and other.copy() == {"keep": 1}
    assert ours(name) == before  # no partial segment left
    monkeypatch.undo()
    d["big"] = "x" * 1000  # still usable
    assert other["big"] == "x" * 1000
    other.close()
    d.close()


def test_full_shared_memory_at_creation(name, monkeypatch):
    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(OutOfSpace):
        SharedDict(name=name)
    assert ours(name) == []


def test_no_address_space_to_map_is_no_full_shared_memory(name):
    """A process at its address-space limit (``RLIMIT_AS``) cannot map a new
    segment: ``mmap``'s ENOMEM is that, not full shared memory, so it stays
    the system's error -- not ``OutOfSpace`` -- and leaves no segment."""
    code = textwrap.dedent(
        f"""
        import os, resource
        from ultradict_ng import OutOfSpace, SharedDict
        status = open("/proc/self/status").read().split("VmSize:")[1]
        vm = int(status.split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (64 << 20), resource.RLIM_INFINITY))
        try:
            SharedDict(name={name!r}, buffer_size=512 << 20)
        except OutOfSpace as exc:
            print("OutOfSpace", exc)
        except OSError as exc:
            print("errno", exc.errno)
        print(sorted(n for n in os.listdir("/dev/shm") if n.startswith({name!r})))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[:2] == ["errno 12", "[]"], out.stdout + out.stderr


def _parcels(pool):
    return sorted(e for e in os.listdir("/dev/shm") if e.startswith(parcel.pool_prefix(pool)))


def _no_room(*args):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_shared_memory_is_reported_in_the_words_of_what_was_made(name, monkeypatch):
    """The dict's segments, a large value and a pool parcel all go through one
    module, and a full /dev/shm still says which of them found no room; nothing
    of any of them is left behind."""
    pool = secrets.token_hex(5)
    d = SharedDict(name=name, blob_threshold=1024)
    try:
        monkeypatch.setattr(os, "posix_fallocate", _no_room)
        monkeypatch.setattr(os, "pwrite", _no_room)
        with pytest.raises(OutOfSpace, match=re.escape(f"for a 3000-byte value of shared dict {name!r}: ")):
            d["big"] = b"x" * 3000
        with pytest.raises(OutOfSpace, match=r"for a \d+-byte pool parcel: "):
            parcel.pack(pickle.PickleBuffer(bytearray(20_000)), pool, owner_word(), 4096)
        other = name + "x"
        with pytest.raises(OutOfSpace, match=re.escape(f"for segment {other!r} ({L.CONTROL_SIZE} bytes): ")):
            SharedDict(name=other)
        monkeypatch.undo()
        assert ours(name) == [name, L.stream_name(name)] and ours(other) == [] and _parcels(pool) == []
        assert d.copy() == {}
    finally:
        d.close()


def test_parcels_go_through_a_mapping_where_pwrite_is_refused(monkeypatch):
    """Where shared memory cannot be written through its descriptor (macOS), a
    parcel is written through a mapping: the same bytes as with pwrite."""
    pool = secrets.token_hex(5)
    me = owner_word()
    obj = (pickle.PickleBuffer(bytearray(os.urandom(20_000))), os.urandom(30_000))

    def contents(p):
        with open(f"/dev/shm/{p.name}", "rb") as f:
            return f.read()

    def refuse(*args):
        raise OSError(errno.ENXIO, "no write on shared memory here")

    try:
        written = parcel.pack(obj, pool, me, 4096)
        monkeypatch.setattr(os, "pwrite", refuse)
        mapped = parcel.pack(obj, pool, me, 4096)
        monkeypatch.undo()
        assert mapped.spans == written.spans and len(mapped.spans) == 2  # a buffer, and the stream
        assert contents(mapped) == contents(written)
        for p in (written, mapped):
            view, data = parcel.unpack(p, me)
            assert bytes(view) == bytes(obj[0].raw()) and data == obj[1]
        assert _parcels(pool) == []
    finally:
        for entry in _parcels(pool):
            segments.unlink(entry)


def test_pwrite_refused_after_the_first_byte_is_an_error(monkeypatch):
    """Only a refusal before anything was written means "write through a
    mapping"; one in the middle is a real error, and the parcel is removed."""
    pool = secrets.token_hex(5)
    real_pwrite, calls = os.pwrite, []

    def refuse_the_second(fd, data, offset):
        calls.append(offset)
        if len(calls) > 1:
            raise OSError(errno.ENXIO, "no write on shared memory here")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", refuse_the_second)
    try:
        with pytest.raises(OSError) as info:
            parcel.pack(pickle.PickleBuffer(bytearray(20_000)), pool, owner_word(), 4096)
        monkeypatch.undo()
        assert info.value.errno == errno.ENXIO and len(calls) == 2
        assert _parcels(pool) == []
    finally:
        for entry in _parcels(pool):
            segments.unlink(entry)


def test_unsupported_initial_data_leaves_nothing(name):
    with pytest.raises(TypeError):
        SharedDict({"x": object()}, name=name)
    assert ours(name) == []


def test_segments_are_private_to_the_user(name):
    d = SharedDict(name=name, buffer_size=64)
    d["x"] = "y" * 100
    for entry in ours(name):
        assert stat.S_IMODE(os.stat(f"/dev/shm/{entry}").st_mode) == 0o600, entry
    d.close()


def test_attaching_process_exit_neither_unlinks_nor_warns(name):
    """Python < 3.13's resource tracker would unlink (and warn about) segments a
    process attached; ours are not registered with it."""
    d = SharedDict({"a": 1}, name=name)
    code = f"from ultradict_ng import SharedDict\nd = SharedDict(name={name!r}, create=False)\nd['b'] = 2\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "leaked" not in out.stderr and "resource_tracker" not in out.stderr
    assert d["b"] == 2 and len(ours(name)) == 2
    d.close()


def test_every_error_is_a_shared_dict_error():
    import ultradict_ng.errors as E

    for n in E.__all__:
        assert issubclass(getattr(E, n), SharedDictError)


@pytest.mark.parametrize(
    "write, expected",
    [
        (lambda d: d.__setitem__("a", 1), {"x": 0, "a": 1}),  # scalar: the compiled fast path
        (lambda d: d.__setitem__("a", [1, (2,)]), {"x": 0, "a": [1, (2,)]}),  # general commit
        (lambda d: d.__delitem__("x"), {}),  # through Store._apply
        (lambda d: d.update(a=1, b=2.5), {"x": 0, "a": 1, "b": 2.5}),
    ],
    ids=["scalar-set", "composite-set", "delete", "update"],
)
def test_interrupt_after_publish_does_not_desync_the_cache(name, write, expected):
    """A KeyboardInterrupt between publishing a record and applying it locally must
    not leave this handle's cache silently behind the shared state, on every
    write path (the interrupt fires right after the STATE store)."""
    from ultradict_ng._shm import layout as L

    d = SharedDict(name=name)
    d["x"] = 0
    other = SharedDict(name=name)
    mapping = d._store._map
    real = mapping.atomic

    class StoreThenInterrupt:
        """The mapping's atomic words, but a store of STATE is followed by an interrupt."""

        def __getattr__(self, attr):
            return getattr(real, attr)

        def store(self, index, value):
            real.store(index, value)
            if index == L.W_STATE:
                raise KeyboardInterrupt

        def publish(self, index, value, watch):  # the STATE store that also checks for waiters
            seen = real.publish(index, value, watch)
            if index == L.W_STATE:
                raise KeyboardInterrupt
            return seen

    mapping.atomic = StoreThenInterrupt()
    try:
        with pytest.raises(KeyboardInterrupt):
            write(d)
    finally:
        mapping.atomic = real
    assert other.copy() == expected  # published: everyone sees it
    assert d.copy() == expected  # and this handle too: its cache reloaded
    d["b"] = 2
    assert d.copy() == {**expected, "b": 2}
    other.close()
    d.close()


class _Interleave:
    """Stands in for a reader's stream mapping: runs ``action`` (a writer's work)
    just before the reader's first copy, i.e. after the reader loaded STATE."""

    def __init__(self, real, action):
        self.real, self.action, self.fired = real, action, 0

    def __getitem__(self, index):
        if not self.fired:
            self.fired = 1
            self.action()
        return self.real[index]

    def release(self):
        self.real.release()


def test_stream_restarted_between_state_load_and_copy(name):
    """The torn-read race, forced deterministically: after the reader loaded STATE,
    the writer dumps (restarting the stream) and writes new records over the bytes
    the reader is about to copy.  The reader must notice (STATE re-check, then the
    records' generation tag and crc) and end up with the right data."""
    writer = SharedDict(name=name, buffer_size=256)
    reader = SharedDict(name=name)
    writer["a"] = "old"
    assert reader["a"] == "old"
    writer["b"] = "seen-by-nobody-yet"

    def writer_restarts_stream():
        writer["big"] = "y" * 300  # larger than the stream: dump, stream restarts at 0
        writer["b"] = "new-b"
        writer["c"] = "c" * 20

    interleave = _Interleave(reader._store._map.stream_mv, writer_restarts_stream)
    reader._store._map.stream_mv = interleave
    assert reader.copy() == {"a": "old", "b": "new-b", "big": "y" * 300, "c": "c" * 20}
    assert interleave.fired == 1
    reader.close()
    writer.close()


def test_aligned_record_of_the_next_generation_is_not_applied(name):
    """Worse than torn bytes: after the restart the writer lays down records of
    exactly the same sizes, so the reader's copy holds a *valid* record of the new
    generation at the offset it expects.  Applying it on top of the old
    generation would show a state that never existed (b updated, 'big' missing)."""
    writer = SharedDict(name=name, buffer_size=256)
    reader = SharedDict(name=name)
    writer["a"] = "old"
    assert reader["a"] == "old"
    writer["b"] = "B1"

    def writer_restarts_stream():
        writer["big"] = "y" * 300  # dump: generation 1, stream restarts at 0
        writer["a"] = "old"  # same size as the first record: ends where it ended
        writer["b"] = "B2"  # same size and offset as the record the reader will copy

    interleave = _Interleave(reader._store._map.stream_mv, writer_restarts_stream)
    reader._store._map.stream_mv = interleave
    assert reader.copy() == {"a": "old", "b": "B2", "big": "y" * 300}
    assert interleave.fired == 1
    reader.close()
    writer.close()


FILL_SCRIPT = r"""
import os
from ultradict_ng import OutOfSpace, SharedDict
import sys
threshold = int(sys.argv[1])  # 0: values inline, in dumps; else: in blobs
d = SharedDict(name="fill", buffer_size=64 * 1024, blob_threshold=threshold)
other = SharedDict(name="fill")
good = {}
size = 16 * 1024
for i in range(10_000):
    value = bytes([i % 256]) * size
    try:
        d[i] = value
    except OutOfSpace as exc:
        assert exc.errno == 28 and "fill" in str(exc), exc
        break
    good[i] = value
    size = int(size * 1.3)
else:
    raise SystemExit("shared memory never filled up")
assert d.copy() == good and other.copy() == good, "a failed write changed the dict"
entries = sorted(os.listdir("/dev/shm"))
blobs = [e for e in entries if "@b" in e]
if threshold:  # control, stream, at most the current dump, a blob per value: no partial one
    assert len(blobs) == len(good) and len(entries) - len(blobs) <= 3, entries
else:  # control, stream, current dump: no partial segment
    assert len(entries) == 3 and not blobs, entries
d.pop(max(good))  # still usable: shrink, then write something small
d["small"] = 1
assert other["small"] == 1
other.close()
d.close()
assert os.listdir("/dev/shm") == [], os.listdir("/dev/shm")
print("filled after", len(good), "writes")
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/unshare"),
    reason="needs root and unshare to mount a private, tiny /dev/shm",
)
@pytest.mark.parametrize("threshold", [0, 1024], ids=["dumps", "blobs"])
def test_really_full_dev_shm(tmp_path, threshold):
    """/dev/shm really full (a private 2 MiB tmpfs): OutOfSpace, nothing changed, no
    partial segment, and no SIGBUS -- the pages are reserved (dumps) or written with
    pwrite (blobs) before anything is published."""
    script = tmp_path / "fill.py"
    script.write_text(FILL_SCRIPT)
    out = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f"mount -t tmpfs -o size=2m tmpfs /dev/shm && exec {sys.executable} {script} {threshold}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "filled after" in out.stdout


# -- the growing stream (layout: "Stream size") ------------------------------------------


def _allocated(seg_name):
    return os.stat(f"/dev/shm/{seg_name}").st_blocks * 512


def test_default_stream_grows_with_the_dict(name):
    """The stream follows the dict: after a dump LIMIT is >= STREAM_GROWTH x the
    dump, reserved in /dev/shm; writes then fill it before the next dump."""
    d = SharedDict(name=name)
    other = SharedDict(name=name)
    store = d._store
    assert store.grows and store.stream_size == L.GROWING_STREAM_CAP
    assert d.buffer_size == L.DEFAULT_STREAM_SIZE == store.limit()
    assert _allocated(L.stream_name(name)) < 2 * L.DEFAULT_STREAM_SIZE  # sparse beyond LIMIT
    big = {f"key-{i}": "v" * 40 for i in range(40_000)}  # ~2 MB encoded: dumps at once
    d.update(big)
    gen = store.gen
    assert gen >= 1
    dump = os.stat(f"/dev/shm/{L.dump_name(name, gen)}").st_size
    assert d.buffer_size == store.limit() >= L.STREAM_GROWTH * dump
    assert store.limit() % L.STREAM_GRANULE == 0
    assert _allocated(L.stream_name(name)) >= store.limit()
    for i in range(40_000):  # ~1.3 MB of records: more than the initial stream, no dump
        d[f"key-{i}"] = i
    assert store.gen == gen and store.pos > L.DEFAULT_STREAM_SIZE
    expected = {**big, **{f"key-{i}": i for i in range(40_000)}}
    assert other.copy() == expected
    late = SharedDict(name=name)  # attaches: dump + replay of the long stream
    assert late.copy() == expected and late.buffer_size == d.buffer_size
    late.close()
    other.close()
    d.close()


def test_explicit_buffer_size_is_fixed(name):
    d = SharedDict(name=name, buffer_size=4096)
    d.update({i: "v" * 40 for i in range(1000)})
    assert not d._store.grows and d.buffer_size == 4096 == d._store.limit()
    with pytest.raises(SharedDictError, match="buffer_size=4096"):
        SharedDict(name=name, buffer_size=8192)
    d.close()


def test_attaching_with_a_buffer_size_to_a_growing_stream_is_a_mismatch(name):
    d = SharedDict(name=name)
    with pytest.raises(SharedDictError, match="growing stream"):
        SharedDict(name=name, buffer_size=L.DEFAULT_STREAM_SIZE)
    d.close()


def test_stream_that_cannot_grow_keeps_working(name, monkeypatch):
    """Shared memory full when the stream should grow: LIMIT stays, nothing fails."""
    d = SharedDict(name=name)
    other = SharedDict(name=name)

    def full(seg_name, length):
        raise OutOfSpace(f"no room to grow {seg_name!r}")

    monkeypatch.setattr(segments, "reserve", full)
    big = {i: "v" * 40 for i in range(40_000)}
    d.update(big)
    assert d._store.gen >= 1 and d.buffer_size == L.DEFAULT_STREAM_SIZE
    for i in range(40_000):  # keeps dumping at the old LIMIT
        d[i] = i
    assert other.copy() == {i: i for i in range(40_000)}
    monkeypatch.undo()
    d.update({-1: "x" * 3_000_000})  # a dump that can grow the stream again
    assert d.buffer_size >= 3_000_000
    assert other[-1] == "x" * 3_000_000
    other.close()
    d.close()


@pytest.mark.parametrize("limit", [0, 17, L.GROWING_STREAM_CAP * 4, 2**64 - 1])
def test_corrupted_limit_never_lets_a_write_escape_the_stream(name, limit):
    d = SharedDict(name=name)
    other = SharedDict(name=name)
    d._store._map.words[L.W_STREAM_LIMIT] = limit
    for i in range(300):
        d[f"k{i}"] = "v" * (i % 50)
    assert other.copy() == {f"k{i}": "v" * (i % 50) for i in range(300)}
    assert d._store.pos <= d._store.stream_size
    other.close()
    d.close()


GROW_FILL_SCRIPT = r"""
import os
from ultradict_ng import OutOfSpace, SharedDict
d = SharedDict(name="growfill")  # a growing stream in a 4 MiB /dev/shm
other = SharedDict(name="growfill")
good = {}
failures = 0
for i in range(200_000):
    try:
        d[i] = "x" * 200
    except OutOfSpace as exc:
        assert exc.errno == 28, exc
        failures += 1
        assert d.copy() == good and other.copy() == good, "a failed write changed the dict"
        if failures > 3:
            break
        continue
    good[i] = "x" * 200
else:
    raise SystemExit("shared memory never filled up")
assert other.copy() == good
d.close()
other.close()
print("filled after", len(good), "writes; stream", d.buffer_size)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/unshare"),
    reason="needs root and unshare to mount a private, tiny /dev/shm",
)
def test_really_full_dev_shm_with_a_growing_stream(tmp_path):
    """A growing stream in a private 4 MiB tmpfs: writes succeed or raise OutOfSpace
    with nothing changed, and never hit an unreserved page (SIGBUS, exit -7)."""
    script = tmp_path / "growfill.py"
    script.write_text(GROW_FILL_SCRIPT)
    out = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f"mount -t tmpfs -o size=4m tmpfs /dev/shm && exec {sys.executable} {script}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "filled after" in out.stdout
