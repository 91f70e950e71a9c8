"""The protocol of a SharedCache (``ultradict_ng.cache``): its entries and its side segment.

A cache named ``N`` is the shared dict ``N`` (layout.py: every rule of the dict
holds unchanged) plus one segment of its own, ``N@c``, the *side segment*.

Entries
=======
Every value of the dict ``N`` is an entry, a tuple::

    (expires, slot, value)           a value
    (expires, slot, owner, token)    a claim: the cached() decorator's "being computed"

``expires`` is a float of ``time.time()`` seconds, ``0.0`` for never; an entry
whose ``expires`` is not after the reader's clock is expired: every reader
treats it as absent from that instant on, whoever wrote it, and the next
writer that meets it deletes it (the memory is reclaimed by the dict's
delete).  ``value`` is the user's value, which the dict's codec stores
(serializer "msgpack"); with serializer "pickle", the same for plain data the
codec gives back exactly -- a str, int, float, bool or None, or a dict, list,
set or frozenset of those, bytes and tuples, at most 16 levels deep -- and
for anything else (bytes at the top included) its ``pickle.dumps`` bytes: a
stored bytes is a pickle, and a read of plain data is a copy, not an
unpickling.  ``slot``
indexes the side segment's recency and size arrays.  A claim's ``owner`` is an
owner word (pid and start time, as layout.py's LOCK) and ``token`` a random
u64 telling two claims of one process apart.  All changes of entries are
made under the dict's lock, so that a read-check-write (``add``, ``incr``,
eviction, claims) is atomic; reads take no lock.

Why entries and not a second dict of metadata: one entry is one record of
the dict's stream, so a value and its expiry become visible together, in
one publish -- a reader can never see a new value with an old expiry.

Side segment ``N@c`` (native-endian; u64 words, f64 where said)
===============================================================
===== ================================================================================
word  field
===== ================================================================================
0     MAGIC: ``SIDE_MAGIC``, stored last at creation (attachers wait for it)
1     version: ``SIDE_VERSION``
2     the dict's creation token (layout.py word 4): a side segment whose token is
      not the dict's belongs to an earlier dict of the same name and is replaced
3     nslots: length of the recency and size arrays (0: an unbounded cache)
4     maxsize (0: none)
5     maxbytes (0: none)
6     default ttl, f64 seconds (0.0: none)
7     serializer: 1 msgpack, 2 pickle
8     cull: 0 evict one entry at a time; n + 1 evict len // n at once; 1 clear all
9     evictions (count; written under the dict's lock)
10    expirations (count; under the lock)
11    bytes: the sum of the sizes of live entries (under the lock; see Crashes)
12    next never-used slot (under the lock)
13    free: how many slots the free stack holds (under the lock)
14    flags: bit 0 set once an entry with an expiry or a claim was written (until
      then ``len`` is the dict's, else a scan that skips those)
15    batch: 1 while a ``set_many``/``delete_many`` transaction is open (under the lock)
===== ================================================================================

Then three arrays of ``nslots`` 8-byte cells: ``recency`` (f64: the
``time.time()`` of the entry's last read or write), ``size`` (u64: the
entry's stored size, for maxbytes) and the free stack (u64 slot numbers).

Slots: an entry keeps its slot for life; a new key takes a slot from the free
stack, else the next never-used one; a removed entry's slot is pushed back.
Recency is written by every reader *without the lock* (a plain aligned 8-byte
store: a race between two readers leaves one of their times, either is
right); it is advisory only: eviction reads it, nothing else does.

Reading (no lock): the reader looks ``key`` up in its handle of the dict (every
rule of layout.py for a read: a synced cache, or a sync first); an entry of 3
items whose ``expires`` is 0.0 or after its clock (``CLOCK_REALTIME``, what
``time.time()`` reads) is a hit: it stores that time at ``recency[slot]``, then
returns the value (a private copy of a mutable one; bytes unpickled with
"pickle").
Anything else -- no entry, an expired one, a claim -- is a miss.  The compiled
helper does all of it in one call (``speedups.CacheGet``); its twin calls the
Python method, same rules.

Eviction: when a new key would make ``len > maxsize`` (or the bytes exceed
maxbytes), the writer samples ``SAMPLES`` keys and removes the least
recently used of them (expired ones first) -- approximated LRU, within 0.5%
of exact LRU's hit ratio on Zipf traces (perf workload 15) -- or with
``cull`` set removes ``len // n`` entries in exact LRU order (Django's
CULL_FREQUENCY), or everything.

Crashes: a writer killed between the dict's publish and the side segment's
update leaks at most one slot (taken before the entry is written, pushed
back after it is deleted: a slot is never given to two live entries) and
leaves ``bytes`` too high by at most one entry (added before the write,
subtracted after the delete): the bounds hold, conservatively.  When the
slots run out (a leak per crash), the next writer rebuilds the free stack and
``bytes`` from the entries (``rebuild``).  ``set_many`` and ``delete_many`` are one
transaction of the dict: their entries' changes are published at its end, but
the slots and bytes they free (deletes, evictions) change the side segment as
they go.  So ``batch`` is set before the first change and cleared after the
publish; a batch that ends without publishing (an exception) is rebuilt at
once, and a writer that finds ``batch`` set (its writer died in the batch:
its entries are all still there, some of their slots on the free stack) rebuilds
before it changes anything.  A ``clear`` (and a cull that empties the cache)
is marked a batch too, from before the dict's clear to after the side's
slots and bytes are reset: a writer killed between leaves a side the next
writer rebuilds, not ``bytes`` counting every entry gone.  A creator killed before MAGIC
leaves a segment that attachers replace after ``INIT_TIMEOUT``.  The side
segment is removed with the dict (``unlink_by_name``, the dict's cleanup).

Kept in files (``SharedCache(path=DIR)``): the side segment is the file
``cache`` of DIR, made whole before the first entry and never removed by a
close (``_disk/layout.py``, "Cache side file").  A recovery that finds no
clean close sets ``batch`` in it (its words may be older than the entries);
an opener that finds ``batch`` set takes the lock -- which a live batch
holds to its end -- and, if it is still set, rebuilds before its first read
of ``len``, as a writer does.  A rebuild also sets the expiring flag if an
entry expires or is a claim.
"""

from __future__ import annotations

from .._shm import layout as L

SIDE_MAGIC = 0x75646E6763616368  # "udngcach"
SIDE_VERSION = 2  # 2: word 15 is the batch flag
HEADER_WORDS = 16
W_MAGIC, W_VERSION, W_TOKEN, W_NSLOTS, W_MAXSIZE, W_MAXBYTES, W_TTL, W_SERIALIZER = range(8)
W_CULL, W_EVICTIONS, W_EXPIRATIONS, W_BYTES, W_NEXT, W_FREE, W_FLAGS, W_BATCH = range(8, 16)
FLAG_EXPIRING = 1
SERIALIZERS = {"msgpack": 1, "pickle": 2}
#: Keys sampled per eviction (8: 0.995x exact LRU's hit ratio on a Zipf 0.9 trace).
SAMPLES = 8
#: Expired entries looked for per write of an expiring cache (reclaiming memory).
EXPIRE_SAMPLES = 3
#: Slots of a cache bounded only by bytes.
BYTES_ONLY_SLOTS = 1 << 20
#: Bound on maxsize, maxbytes and cull_frequency: far above any machine's
#: memory, and below what the settings words (u64) and the side file's
#: size (27 bytes a slot, in an off_t) can hold.
MAX_SETTING = 1 << 56
INIT_TIMEOUT = 2.0  # attachers wait this long for a side segment's MAGIC


def cache_name(name: str) -> str:
    """The side segment of the cache ``name``."""
    return name + L.CACHE_SUFFIX


def nslots_for(maxsize: int, maxbytes: int) -> int:
    """Slots for a cache of these bounds: one per entry it can hold, plus room
    for the slots crashes leak before a rebuild."""
    if maxsize:
        return maxsize + max(16, maxsize // 8)
    return BYTES_ONLY_SLOTS if maxbytes else 0


def side_size(nslots: int) -> int:
    return 8 * (HEADER_WORDS + 3 * nslots)
