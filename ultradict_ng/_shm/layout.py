"""The shared-memory protocol of ultradict_ng: segment layouts, offsets and rules.

This docstring is the specification; the constants below are the only place the
numbers live.  Who follows which part (modules of ``_shm/`` unless a path is given):
``control.py`` (control segment, creation and attach), ``_codec/records.py``
(the record's kinds and how one is applied), ``reader.py`` (Reader),
``writer.py`` (Writer, Dump), ``streamsize.py`` (Stream size), ``lock.py`` (Lock), ``waiting.py``
(Waiting and waking), ``changes.py`` (the change feed under "Reader"),
``users.py`` (Users), ``cleanup.py`` (Unlink and cleanup register),
``blobs.py`` (Blobs; the references themselves are plain data in
``_codec/placeholders.py``), ``survey.py`` (reading segments from outside).
Every segment is created, opened, written, mapped, listed and removed through
``_platform/segments.py`` (which the process pool's parcels use too: their protocol is
in :mod:`ultradict_ng.futures.layout`); primitives from ``speedups.py`` (the
compiled helper or its twins in ``_helper/``).  A big dict's table: ``table_layout.py``;
a cache's side segment: ``cache/layout.py``; Redis: ``_redis/layout.py``.

Segments
========
A dict named ``N`` owns these POSIX shared-memory segments (all mode 0600)::

    N             control segment   header, counters, lock word, cleanup register
    N@s           update stream     append-only records of mutations (see "Stream size")
    N@d<gen>      full dump         the whole dict at generation <gen> (base 36)
    N@b<id>       blob              one large value, immutable (see "Blobs"; base 36)
    N@c           cache side        a SharedCache's settings and recency (cache/layout.py)

User names may only contain ``[A-Za-z0-9_.-]``, so no user name can collide
with a derived name (they contain ``@``).  Nested dicts own no segments: they
are paths inside the root's tree, carried in the root's records and dumps, so
one lock covers the tree and the segments above are *all* the segments.

Control segment (``CONTROL_SIZE`` bytes, native-endian u64 words)
-----------------------------------------------------------------
===== ======= ==================================================================
word  offset  field
===== ======= ==================================================================
0     0       MAGIC: ``CONTROL_MAGIC``; stored *last* at creation (atomic store)
1     8       layout version (low u32), control size in bytes (high u32)
2     16      flags (low u32: bit 0 = recurse, bit 1 = the stream grows), serializer
              id (high u32: 1 msgpack, 2 pickle, 3 a custom object every attacher
              must pass itself)
3     24      stream size in bytes: the size of ``N@s`` (for a growing stream, its
              cap; only its first LIMIT bytes are reserved)
4     32      creation token (random u64: tells a re-created dict of the same
              name from the old one; keys the per-process lock state)
5     40      creator: owner word (pid and start time, as in LOCK) of the creating
              process, so that attachers can tell a dead creator from a slow one
6     48      dump size limit in bytes (0 = none): a mutation whose dump would be
              larger raises ``OutOfSpace`` and changes nothing
7     56      LIMIT: bytes of the stream writers may use (<= stream size; equal to
              it for a fixed stream).  Changed only under the lock, at a dump.
8     64      STATE: ``generation << 32 | stream end``  (the counter readers poll)
9     72      blob threshold in bytes: values of a blob kind at least this large go
              to blobs (0: never).  Written once, at creation.
10    80      CHANGE_WAITERS: bit i set while the process in wait slot i has a
              thread asleep waiting for a change (see "Waiting and waking")
11    88      CHANGE_SEQ: incremented by a writer that saw CHANGE_WAITERS != 0;
              change waiters sleep on its low 32 bits
16    128     LOCK: 0 when free, else the owner word (see "Lock" below)
17    136     LOCK_WAITERS: as CHANGE_WAITERS, for threads waiting for the lock
              (must stay LOCK + 1: the compiled release finds it there)
18    144     LOCK_SEQ: incremented by a releaser that saw LOCK_WAITERS != 0;
              lock waiters sleep on its low 32 bits (must stay LOCK + 2)
19    152     LOCK_WAKING: 1 while a woken lock waiter has not yet slept again or
              left (one wake in flight at a time; must stay LOCK + 3)
24    192     REG_LOW: oldest dump generation that may still exist
25    200     REG_HIGH: newest dump generation that may exist (written *before*
              the dump segment is created)
26    208     STATUS: bit 0 = unlinked (set before any segment is unlinked); bit 1 = a sync failed (files)
27    216     BLOB_NEXT: the id the next blob gets (ids start at 1); raised under
              the lock *before* the blob's segment is created
28    224     BLOB_LOW: every blob id below it is gone (cleanup scans
              ``BLOB_LOW .. BLOB_NEXT``)
29    232     CLOSING: owner word of a process removing the dict *because it has
              no live user* (``clean``, ``auto_unlink="last"``), else 0 (see "Users")
30    240     USER_OVERFLOW: attachments made while every user slot was taken
              (incremented at attach, decremented at detach; see "Users")
32-   256-    SYNCED, SYNC_LEADER, CLEAN_PENDING, SYNC_SEQ, DEAD: a dict kept in files
36    288     only (``_disk/layout.py``)
64-   512-    wait slots (``WAIT_SLOTS`` words): slot i holds the owner word (as
127   1016    LOCK) of the process that uses bit i of the WAITERS words; 0 = free
256-  2048-   user slots (``USER_SLOTS`` words): the owner word of each process
511   4088    attached to the dict (one slot per process, whatever its handles); 0 = free
===== ======= ==================================================================

STATE, LOCK and the register sit on separate 64-byte lines so that a lock
taken and released does not slow readers polling STATE; each WAITERS word sits
on the line of the word its wakers have just stored.

Stream record (in ``N@s``, at offsets ``0 .. end`` of the current generation)
-----------------------------------------------------------------------------
``u32 length | u32 generation (low 32 bits) | u32 crc32 | u32 unit | payload``;
the crc covers the first 8 header bytes and the payload.  Unit: ``UNIT_WHOLE``, or in a
transaction the offset from its first record << ``UNIT_BACK_SHIFT``, | ``UNIT_LAST`` on its
last (set before the publish); only recovery from files reads it (``_disk/layout.py``).  The payload is the
serializer's encoding of the record ``[op, path, *args]``: op is one of
``OP_*`` below and the kinds and shapes are tabled in ``_codec/records.py``, the one
definition every writer (codec, ``write_simple``) and reader (``apply``,
``apply_sets``) follows.

Stream size
-----------
A stream created with an explicit ``buffer_size`` is fixed: LIMIT = stream
size, reserved (``posix_fallocate``) at creation.  By default the stream
*grows*: ``N@s`` is created sparse at ``GROWING_STREAM_CAP`` bytes with the
first ``DEFAULT_STREAM_SIZE`` reserved, and at each dump the writer raises
LIMIT to ``STREAM_GROWTH`` times the dump's length (rounded up to
``STREAM_GRANULE``, at most the cap), reserving the pages first.  Why: a dump
costs time proportional to the dict, and a stream proportional to the dict
makes that cost amortised over proportionally many writes, so the cost of a
write stays flat as the dict grows.  The factor trades that against the
replay a process that fell behind does (up to LIMIT bytes of records, on top
of loading the dump).  Measured on 2 cores at 1M keys: with 2, a write costs
1.1-1.25x what it costs at 1k keys, and the worst replay about 1-2 dump
loads; with 1, 1.4-1.9x and about one dump load.  LIMIT never shrinks.  If the pages cannot
be reserved (shared memory full) LIMIT stays as it is and nothing fails.  In files, a writer
whose record passes LIMIT reserves instead up to the granule holding it (at most the target).
Readers never use LIMIT: records are bounded by STATE's end, which writers
keep within LIMIT and readers check against the stream size.

Dump (``N@d<gen>``)
-------------------
A msgpack dict's: a table (table_layout.py, "As a dump"); a pickle dict's: ``8 bytes
DUMP_MAGIC | u64 generation | u64 length | u32 crc32(payload) | u32 0 | payload``
(the serializer's encoding of the whole tree).  Written whole, header last, before
it is published; never changed after.  Generation 0 (empty) has no segment.

Blobs (``N@b<id>``)
-------------------
``8 bytes BLOB_MAGIC | u64 creation token | u64 id | u64 length | u32 kind |
u32 0 | zeros up to BLOB_HEADER (64) | payload``.  The payload is a value's raw
bytes: kind 1 ``bytes`` (or any contiguous buffer), 2 ``bytearray``, 3 a numpy
array (C order).  The record and the dumps hold a reference instead of the
value: msgpack ext 13 ``[id, kind, length, meta]`` (meta: nil, or for an array
``[dtype descr as numpy.lib.format writes it, shape]``), or the pickled
``BlobRef`` under the pickle serializer.  Each blob is referenced from at most
one place of one published state, is written completely before the record
that references it is published, and never changes afterwards; ids only grow,
so a name is never written twice.

Writer, for a mutation whose values hold buffers or arrays of at least the
threshold (before its step 2 encodes the record):

a. ``id = BLOB_NEXT``; ``BLOB_NEXT = id + 1`` (crash cleanup can find what b makes);
b. create ``N@b<id>`` exclusively, ``pwrite`` the payload, then the header
   (ENOSPC: unlink it, ``OutOfSpace``, nothing published);
c. the record, holding references, is published as any other (steps 3-5);
d. after the publish, unlink every blob the mutation dropped from the tree
   (the old values it overwrote, deleted or cleared).

A dump (step 4) also sweeps: every ``N@b*`` segment of an id in
``BLOB_LOW .. BLOB_NEXT`` that the dumped tree does not reference is the
leftover of a writer that died between a and d, and is unlinked; then
``BLOB_LOW`` = the lowest referenced id (``BLOB_NEXT`` if none).

Reader: a reference is mapped read-only on first use, after checking the
header (magic, token, id, length, kind) and the segment's size against it; a
mismatch is ``CorruptSegment``.  A blob that does not exist was dropped by a
state newer than the reader's cache (step d unlinks only after publishing):
the reader syncs and reads again -- never an error to the caller.  A mapping
stays valid after the name is unlinked, so an array or view a reader holds
never changes and keeps its memory until it is collected.

Inline arrays: a numpy array below the threshold is msgpack ext 14
``[descr, shape, bytes]`` in the record itself.

Writer (holds the lock for the whole mutation)
==============================================
1. Bring the local cache up to date (the reader algorithm, under the lock).
2. Check the mutation against the cache (missing key, missing nested path, STATUS.unlinked)
   and encode the record: errors are raised here, before any shared byte changes.
3. If ``end + record`` fits in the stream (``<= min(LIMIT, stream size)``):
   copy the record to ``stream[end:]``, then publish with one atomic
   (sequentially consistent) store ``STATE = gen << 32 | end + len(record)``.
   The payload is written before the store that makes it reachable.
4. Otherwise (stream full, a value larger than it, a bulk load: _bulk_load) write a dump:

   a. ``REG_HIGH = gen + 1`` (so crash cleanup can find what step b creates);
   b. create ``N@d<gen+1>``; if it exists it is the unpublished leftover of a
      writer that died between b and c (we hold the lock, so nobody else can be
      making it): unlink it and create it again;
   c. write payload, then header (a big dict's writer merges: table_layout.py, "As a
      dump"); for a growing stream raise LIMIT (see "Stream size"); publish
      ``STATE = (gen + 1) << 32 | 0``: one store publishes the dump, restarts the stream;
   d. unlink dumps ``REG_LOW .. gen`` and set ``REG_LOW = gen + 1``.
5. Apply the decoded record to the local cache, so every process holds
   identical data.  (A record of plain scalars -- None, bool, int within 64
   bits, float, str, bytes -- decodes to equal objects of the same types, so
   the writer applies it without decoding; tests/test_native.py checks that.)

Every process follows these steps byte for byte whichever implementation of the
primitives it uses (``speedups``: the compiled helper, or its twins with the
``atomics`` package through bound function pointers or its public API): every
atomic operation is sequentially consistent, and a record's bytes are plain
stores that precede the STATE store publishing them.  Processes on different
implementations share a dict.

A writer that dies at any instruction leaves STATE pointing at a complete
generation: records past ``end`` and an unpublished dump are invisible, and a
leftover segment is within ``REG_LOW .. REG_HIGH``.  If a dump cannot be made
(shared memory full) nothing was published and the error reaches the caller;
the local cache is reloaded from the shared state on the next access.

Transactions (``with d.transaction():``)
========================================
The block holds the lock throughout.  Each write in it does steps 1, 2 and 5 and writes its record
past STATE's end *without* storing STATE (no reader looks there; a root scalar set of the block's
thread: one compiled call, same bytes); blobs as in a-b, d deferred.  Records that no longer fit are
only applied to the cache.  Normal end: one STATE store ``gen << 32 | own end`` publishes all records
at once (a reader copies and applies them all, steps 3-4), or, if some did not fit, step 4's dump of
the cache; then d.  Exception, a nested block's exception, or a cache failure: no store, the block's
blobs unlinked, its records zeroed in files (a recovery scans past the end), the cache reloaded.  A
writer dying inside published nothing; later writes overwrite its records, the next dump sweeps its blobs.

Reader (no lock, no atomics call on the hit path)
=================================================
Hit path: ``words[STATE] == seen`` (one plain 8-byte load) -> answer from cache.
Otherwise, with the process-local cache mutex held:

1. ``st = words[STATE]``; split into (gen, end).
2. If gen differs from the cached generation: open ``N@d<gen>``.  If it is gone,
   a newer dump replaced it between our load of STATE and the open: go to 1
   (never fails the caller: the race UltraDict reported as
   CannotAttachSharedMemory).  Validate magic, generation, length (against the
   segment size) and crc, decode (or map: table_layout.py), replace the cache, ``pos = 0``.
3. Copy ``stream[pos:end]``, then load STATE again: if its generation moved, the
   stream may have been restarted while we copied, so the bytes may be torn:
   discard them and go to 1.  (Seqlock rule: the writer stores STATE before it
   overwrites the stream, so an unchanged generation proves the copy is intact
   on x86-TSO; the per-record generation tag and crc also catch it where loads
   can be reordered.)
4. Parse and check every record (length within the copied bytes, tag == gen,
   crc), then apply them in order, scalars' straight from their bytes; a
   failure after one was applied reloads the dump next round.  ``seen = st``.
5. After ``READER_RETRIES`` failed rounds (a writer dumping faster than we can
   read) take the lock and do 1-4 once more: nothing can change under the lock,
   so a failure then is real corruption -> ``CorruptSegment``.

Creation and attach
===================
The creator makes ``N`` with O_CREAT|O_EXCL (exactly one process wins a
create race), creates the stream, writes the header and any initial data, and
stores MAGIC last.  Attachers that find MAGIC == 0 wait (up to
``INIT_TIMEOUT``) for it; a MAGIC that is neither 0 nor ours is a foreign
segment (``CorruptSegment``); another layout version is ``IncompatibleLayout``.
A control segment whose MAGIC stays 0 and whose creator is dead was abandoned
mid-creation; ``unlink_by_name`` removes it.

Lock
====
The LOCK word is ``pid | (start_time & START_MASK) << PID_BITS``: the owner's
pid and its start time (clock ticks since boot, from /proc; 0 where there is no
/proc).  Acquire = CAS 0 -> own word; release = CAS own word -> 0.  While
waiting, a process checks every ``LOCK_CHECK_INTERVAL`` whether the owner is
alive: dead if the pid does not exist, is a zombie, or now belongs to a process
with another start time (pid reuse).  A dead owner's word is replaced by a CAS
from exactly the observed word, so of several waiters only one takes it over --
and first unlinks the dump it may have left unpublished (REG_HIGH past STATE's
generation: Writer, steps 4a-4c).  Threads of one process first serialise on a
process-local mutex shared by every handle of the same dict (keyed by name and
creation token), which also makes the lock reentrant across handles.  After
fork the child resets that local state: it never inherits "holding" the lock.
Limit: users must share a pid namespace (one container) to see each other live.

Waiting and waking
==================
Waiters sleep in the kernel and wakers make a system call only when someone
sleeps.  Two channels follow one rule: *change* (STATE moved: CHANGE_WAITERS,
CHANGE_SEQ) and *lock* (LOCK released: LOCK_WAITERS, LOCK_SEQ).  A futex
compares 32 bits, so sleepers wait on the low 32 bits of the SEQ word (byte
offset 0 of the word on little-endian machines, 4 on big-endian ones); STATE
itself cannot be the futex word, because its 32-bit halves repeat (a dump
resets ``end`` to 0).

Wait slots: a process that is about to put its first thread to sleep on a
dict claims a free slot (CAS 0 -> its owner word, starting at ``pid %
WAIT_SLOTS``); it keeps it while any of its threads waits on either channel and
frees it (CAS back to 0) when the last one is done.  Threads and handles of one
process share the slot and count themselves in process memory.  Bit i of a
WAITERS word is set (CAS loop, seq_cst) while the process of slot i has a
thread waiting on that channel.

Waiter (for a change: "STATE != the state my cache holds"; for the lock: "the
CAS 0 -> mine succeeds"):

1. set our bit in WAITERS (first waiting thread of the process);
2. ``s = SEQ``; check the condition (seq_cst load of STATE, or the CAS of LOCK):
   if it holds, go to 4;
3. futex-wait on SEQ's low half while it equals ``s``, for at most the time
   left (and at most ``WAIT_SLICE``; a lock waiter at most until its next
   owner-liveness check); then go to 2;
4. clear our bit (last waiting thread of the process), free the slot.

Waker: a writer publishes STATE, a releaser swaps LOCK to 0 (both seq_cst),
then loads WAITERS (seq_cst).  Only if it is not 0: SEQ += 1, then futex-wake
(all change waiters; for the lock, only if CAS LOCK_WAKING 0 -> 1 succeeds,
and then one waiter).

Lock waiters, in detail: a waiter woken with LOCK_WAKING = 1 claims it (CAS
1 -> its owner word) and is the *designated* waiter, the one wake in flight:
while the lock stays taken it sleeps at most ``LOCK_HANDOFF_POLL`` at a time
and tries again, keeping LOCK_WAKING so that releases meanwhile wake nobody;
it stores LOCK_WAKING = 0 (CAS from its word) when it stops waiting (lock
taken, timeout, error), and a waiter that stops without being designated
clears a pending 1 it may have been sent.  A waiter about to sleep that finds
LOCK_WAKING = 1 claims it first: a release whose wake woke nobody (a waiter
registered but not yet asleep, or one that took the lock, cleared LOCK_WAKING
and not yet its bit) leaves 1 behind; unclaimed it would stop every later
release from waking anyone.  The cost: a release while the designated waiter
sleeps is noticed up to ``LOCK_HANDOFF_POLL`` late.  Why: with more processes
than cores, every woken process that fails to take the lock is CPU taken from
the holder.  ``with d.lock: d[k] += 1`` by 8 processes on 2 cores ran at 0.14x
one process's rate waking on every release, 0.4x with one wake in flight,
0.46-0.49x with the designated waiter (4: 0.62-0.65x).  A designated waiter
that dies leaves LOCK_WAKING set: releasers stop waking, but sleepers wake at
their next liveness check and one that finds it set takes the role (two
designated waiters are harmless), clearing it when it stops.  No lost wake-up:
the waiter's bit store precedes its condition check and the waker's STATE/LOCK
store precedes its WAITERS load, so in the single order of seq_cst operations
either the waiter's check sees the new state or the waker sees the bit; then
SEQ moves after the waiter read ``s``, so the futex either refuses to sleep
(value changed) or is woken.  An uncontended write or release does one load
more and no system call.  ``unlink`` wakes every change waiter so (on STATUS.unlinked).

A waiter killed while registered leaves its bit and slot set: wakers then make
a futex call per publish that wakes nobody.  A waker whose wake woke nobody
while WAITERS != 0 checks the slots at most once per ``WAIT_SWEEP_INTERVAL``:
for each slot whose owner is dead (the lock's liveness rule), CAS the slot from
the dead word to its own owner word (so one sweeper owns the repair), clear
that bit in both WAITERS words, then CAS the slot to 0.  A live process's bits
are never cleared by another process.

A process that finds no free slot, or that cannot futex-wait (no compiled
helper and no ``syscall`` through ctypes, a platform without futex, or
``ULTRADICT_NG_WAIT=poll``), does not register: it polls the condition with
sleeps growing from ``POLL_FIRST`` to ``POLL_MAX`` -- correct, but slower to
wake and not free when idle.  Processes of both kinds share a dict.

Change feed (``changes.py``): a feed is a private reader (its own cache, its
own ``(gen, pos)``) that yields each record it applies, in stream order.  When
its generation is older than the published one it loads the dump, and instead
of the records it missed it yields the difference between its cache and the
dump, each change marked ``resync``; then the new generation's records as
usual.  So a feed never skips a change silently and never yields one twice.

Unlink and cleanup register
===========================
``unlink``/``unlink_by_name`` take the lock (recovering a dead owner; after
``UNLINK_LOCK_TIMEOUT`` they go on without it), set STATUS.unlinked, and unless
``N`` is now another segment (not of its token, or flag clear: a dict made
since, or a dict in files' rebuilt one) unlink ``N@d<g>`` for g in ``REG_LOW ..
REG_HIGH`` and the published gen (plus, where /dev/shm can be listed, every
``N@d*`` there, in case the register was damaged), every blob (``BLOB_LOW ..
BLOB_NEXT``, and every listed ``N@b*``), ``N@s``, then ``N``.  Writers check
STATUS under the lock and raise ``Unlinked``; a writer that published a dump
just as the flag appeared unlinks its own dump.

Orphans: a derived segment (``N@s``, ``N@d*``, ``N@b*``) with no ``N`` beside
it can only be left by a crash (a creator makes ``N`` first, an unlink removes
it last), and nothing can reach it.  Its remover first creates ``N`` itself,
exclusively and empty, so that no creator makes a dict under the name while
the orphans go (an attacher that finds the empty ``N`` waits for it, as for a
creator); it stops if ``N`` exists, and unlinks ``N`` when done.

Users (attached processes)
==========================
Every process that has the dict open holds one user slot: its owner word (as
LOCK: pid and start time), so that "is anyone still using this dict?" has an
answer after crashes.  Handles of one process share the slot and count
themselves in process memory; the slot is freed (CAS own word -> 0) when the
last of them is closed or collected, or at normal exit.

Attach (after MAGIC is seen and the header read; the creator does 1 before it
stores MAGIC, so a published dict always has its creator registered):

1. claim a slot: CAS 0 -> own word, starting at ``pid % USER_SLOTS``; if
   none is free, clear the slots of dead owners (CAS their word -> 0) and try
   once more; if still none, ``USER_OVERFLOW += 1`` (this attachment is
   counted but not named; detach subtracts it again);
2. load CLOSING (seq_cst): while it is not 0 and its owner is alive, wait
   (up to ``INIT_TIMEOUT``); a dead owner's word is replaced by 0 (CAS);
3. load STATUS: if unlinked, undo step 1 and treat the name as gone (the
   open creates a new dict or reports that there is none).

A forked child inherits its parent's open handles and so registers itself
(step 1) for each dict its parent had open, in the child, before ``fork()``
returns there.

Removing an unused dict ("close if unused": ``clean``, ``auto_unlink="last"``):

a. CAS CLOSING 0 -> own word (a live owner's word: another remover; wait up to
   0.4 s for it to finish, else stop; a dead owner's is taken over by CAS);
b. load every user slot (seq_cst): if one holds a live owner other than us, or
   USER_OVERFLOW != 0 and the processes mapping ``N`` cannot be listed (Linux
   lists them in ``/proc/<pid>/maps``), or any process but us maps ``N`` (for
   0.2 s: one that just left the register unmaps right after): store CLOSING = 0, stop;
c. unlink it (see "Unlink"), leaving CLOSING set.

No attacher is missed: the attacher's slot store precedes its load of CLOSING,
and the remover's CLOSING store precedes its load of the slots, so in the
single order of seq_cst operations either the remover sees the slot (and
stops) or the attacher sees CLOSING (and waits until the dict is unlinked,
then does not use it).  A process that attached without a slot is seen by
the ``/proc/<pid>/maps`` check (b), and so is any other mapping.  A user that
dies leaves its slot: it counts as not alive, and the next claim that finds
no free slot, or a ``clean``, frees it.

Changing the layout
===================
``LAYOUT_VERSION`` is stored in every control segment, and a process refuses
(``IncompatibleLayout``) a dict of another version.  Bump it with any change a
process of the previous version would misread or miswrite: a control word's
position or meaning, a flag, ``CONTROL_SIZE``, the record framing or checksum,
an ``OP_*`` or a record's shape, the dump header, a segment name, the msgpack
ext-type table (``_codec/ext.py``), an ordering rule above, or the module path
of a type the pickle serializer stores (a pickle names classes by module).
Not for changes inside one process (the cache, the hit path, the primitives'
implementation, timing, messages) nor for transactions (published records).
"""

from __future__ import annotations

import re
import sys

# -- names -------------------------------------------------------------------

#: Characters a user name may contain; '@' is reserved for derived names.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.\-]+")
#: macOS limits shm names to 31 bytes with the leading '/'; the longest suffix
#: we add is '@d' plus 8 base-36 digits.
MAX_SUFFIX = 10
MAX_NAME_LENGTH = (30 - MAX_SUFFIX) if sys.platform == "darwin" else 200
GENERATED_PREFIX = "udng_"

STREAM_SUFFIX, DUMP_SUFFIX, BLOB_SUFFIX, CACHE_SUFFIX = "@s", "@d", "@b", "@c"


def stream_name(name: str) -> str:
    return name + STREAM_SUFFIX


def dump_name(name: str, generation: int) -> str:
    return name + DUMP_SUFFIX + base36(generation)


def blob_name(name: str, blob_id: int) -> str:
    return name + BLOB_SUFFIX + base36(blob_id)


def base36(n: int) -> str:
    """``n`` in lower-case base 36: the short counters in segment names."""
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + out
        if not n:
            return out


# -- control segment -----------------------------------------------------------
CONTROL_MAGIC = int.from_bytes(b"UDNGctl\x01", "little")
LAYOUT_VERSION = 9  # 3: blobs; 4: waiting and waking; 5: users; 6: pickle placeholders moved
#                    7: N@c (cache/layout.py); 8: table dumps; 9: unit word, SYNCED (files)
CONTROL_SIZE = 4096  # one page: shared memory is allocated by pages anyway

W_MAGIC = 0
W_LAYOUT = 1
W_CONFIG = 2
W_STREAM_SIZE = 3
W_TOKEN = 4
W_CREATOR = 5
W_DUMP_LIMIT = 6
W_STREAM_LIMIT = 7
W_STATE = 8
W_BLOB_THRESHOLD = 9
W_CHANGE_WAITERS = 10
W_CHANGE_SEQ = 11
W_LOCK = 16
W_LOCK_WAITERS = 17  # LOCK + 1 (the compiled release relies on it)
W_LOCK_SEQ = 18  # LOCK + 2
W_LOCK_WAKING = 19  # LOCK + 3
W_REG_LOW = 24
W_REG_HIGH = 25
W_STATUS = 26
W_BLOB_NEXT = 27
W_BLOB_LOW = 28
W_CLOSING = 29
W_USER_OVERFLOW = 30
W_SYNCED, W_SYNC_LEADER, W_CLEAN_PENDING, W_SYNC_SEQ, W_DEAD = 32, 33, 34, 35, 36
W_WAIT_SLOTS = 64
WAIT_SLOTS = 64  # one bit each in a WAITERS word
W_USER_SLOTS = 256
USER_SLOTS = 256  # processes attached at once with a name in the register

FLAG_RECURSE, FLAG_GROWS = 1, 2
STATUS_UNLINKED, STATUS_SYNC_FAILED = 1, 2  # (the second: a dict kept in files, _disk/layout.py)

GEN_SHIFT = 32
END_MASK = GEN_MASK = (1 << 32) - 1

# -- stream ------------------------------------------------------------------
RECORD_HEADER = 16  # struct "<IIII": length, generation, crc, 0
RECORD_FORMAT = "<IIII"
UNIT_WHOLE = UNIT_LAST = UNIT_BACK_SHIFT = 1  # the record's unit word (see "Stream record")
MAX_UNIT_BACK = 1 << 31  # a transaction whose records span more ends with a dump
MIN_STREAM_SIZE = 64  # tiny streams are legal: every write then dumps (useful in tests)
MAX_STREAM_SIZE = END_MASK  # end must fit in the low half of STATE
DEFAULT_STREAM_SIZE = 1 << 20  # a fixed stream's default; a growing stream's start
GROWING_STREAM_CAP = 64 << 20  # size (cap) of a growing stream's segment
STREAM_GROWTH = 2  # a growing stream's LIMIT >= this times the last dump's length
STREAM_GRANULE = 1 << 20  # LIMIT grows in multiples of this

OP_SET = 1  # [OP_SET, path, key, value]
OP_DEL = 2  # [OP_DEL, path, key]
OP_CLEAR = 3  # [OP_CLEAR, path]
OP_UPDATE = 4  # [OP_UPDATE, path, [[key, value], ...]]

# -- dump --------------------------------------------------------------------
DUMP_MAGIC = b"UDNGdmp\x01"
DUMP_HEADER = 32  # struct "<8sQQII"
DUMP_FORMAT = "<8sQQII"
#: Stale generations one reclaim pass unlinks at most (a larger gap: a corrupted register).
MAX_RECLAIM = 64

# -- blobs -------------------------------------------------------------------
BLOB_MAGIC = b"UDNGblb\x01"
BLOB_FORMAT = "<8sQQQII"  # magic, token, id, length, kind, 0
BLOB_HEADER = 64  # payload offset: 64-byte aligned for any dtype and for SIMD loads
#: Blob kinds this large go to blobs: below, inline beats a segment (~40-60 µs; docs/performance.md).
DEFAULT_BLOB_THRESHOLD = 64 << 10
#: Ids of ``BLOB_LOW .. BLOB_NEXT`` a sweep tries at most where /dev/shm cannot be listed.
MAX_BLOB_SWEEP = 4096

# -- lock --------------------------------------------------------------------
PID_BITS = 24
PID_MASK, START_MASK = (1 << PID_BITS) - 1, (1 << 40) - 1

# -- timing ------------------------------------------------------------------
INIT_TIMEOUT = 5.0  # attachers wait this long for a creator to finish
READER_RETRIES = 200  # lock-free sync rounds before taking the lock
LOCK_CHECK_INTERVAL, LOCK_FIRST_CHECK = 0.2, 0.05  # owner-liveness checks while waiting: every, first after
LOCK_HANDOFF_POLL = 0.001  # the woken lock waiter re-tries this often while the lock stays taken
UNLINK_LOCK_TIMEOUT = 2.0
WAIT_SLICE = 1.0  # longest single futex sleep: a waiter re-checks at least this often
WAIT_SWEEP_INTERVAL = 1.0  # a process checks the wait slots for dead owners at most this often
POLL_FIRST = 0.00005  # polling fallback: first sleep between checks
POLL_MAX = 0.01  # polling fallback: longest sleep between checks
CLOSING_POLL = 0.001  # an attacher re-checks a dict being removed this often
