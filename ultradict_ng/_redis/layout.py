"""The Redis protocol of ultradict_ng: keys, fields, scripts and rules.

This docstring is the specification of the Redis backend, as
``ultradict_ng/_shm/layout.py`` is that of shared memory; the constants and the Lua
scripts below are the only place its numbers and steps live.  Who follows
which part: ``link.py`` (connections, script calls, what a failure means),
``opening.py`` (Creating and removing: create or attach), ``engine.py``
(Reading, Writing, Snapshots, removing), ``transaction.py`` (Transactions),
``lease.py`` (Lock), ``listener.py`` (Reading: the cached mode), ``feed.py``
(the change feed).

Keys
====
A dict named ``N`` owns these keys, all with the hash tag ``{ud:N}`` so that a
Redis Cluster keeps them in one hash slot (every script touches them together)::

    {ud:N}:meta    hash     configuration and counters (below)
    {ud:N}:log     stream   one entry per published mutation since the snapshot
    {ud:N}:snap    string   the whole dict at sequence number ``meta.snap``
    {ud:N}:lock    string   the lease: ``"<token>|<holder>"``, with a PX expiry
    {ud:N}:lockev  stream   one entry per release, for lock waiters (capped)

``meta`` fields: ``version`` (``VERSION``), ``epoch`` (random hex, fixed at
creation: tells a re-created dict of the same name from the old one; every
script checks it first and answers ``GONE`` when it differs or ``meta`` is
missing), ``codec`` (serializer id, as in shared memory), ``recurse`` (0/1),
``seq`` (number of mutations published, the change counter), ``snap`` (the
``seq`` the snapshot reflects), ``snapbytes``, ``logbytes`` (payload bytes in
``log``), ``minlog`` (log bytes always allowed before a snapshot is due),
``fence`` (the last lease token issued), ``created`` (server time),
``creator`` (``host:pid``).

The log
=======
Entry ``<seq>-1`` holds one field, named by the dict's epoch, whose value is
publish number ``seq``: one record, encoded by the dict's codec exactly as
a shared-memory stream record (``_codec/records.py``), or a transaction's
*bundle* -- byte 0xC1 followed by one msgpack array of the block's records
(``bin``, each encoded as above), applied in order.  0xC1 is never the first
byte of a record (msgpack reserves it; a pickle starts with PROTO, 0x80).
(The epoch in every entry lets a listener, which reads the stream without a
script, tell a re-created dict's entries from its own without asking the
server.)  Invariant, kept by every script: ``log`` holds the entries
``snap+1 .. seq``, in order, and also entry ``snap`` itself once a snapshot was taken -- so a
client that reflects a state ``seen`` with ``snap <= seen <= seq`` catches up
from ``log`` alone, and any other client loads ``snap`` and the entries after
it.  (Entry ``snap`` stays as a marker: a listener that reads the stream with
``XREAD`` and missed entries the trim removed still receives it, sees the gap
in the sequence numbers and syncs, even when nothing was written since.)

Reading (``SYNC``)
==================
A client's cache reflects sequence number ``seen`` of epoch ``epoch``.
``SYNC(epoch, seen)`` answers in one round trip ``[seq, 0]`` when nothing
changed, ``[seq, 1, r...]`` with the records ``seen+1 .. seq``, or
``[seq, 2, snap, snapshot, r...]`` when ``seen`` is older than the snapshot.
The client applies them in order and then reflects ``seq``.

Two read modes (``reads=``):

* ``"fresh"`` (default): every read runs ``SYNC`` first, so a read never
  returns a state older than one published before the read began -- except
  while the reading thread holds the lease with local time left on it
  (below), when no other client can publish and the cache is known current.
* ``"cached"``: a listener thread keeps ``XREAD BLOCK`` open on ``log`` and
  hands new entries to the cache; reads use the cache with no round trip.
  An entry of another epoch, or an idle period (the request timed out) after
  which ``HGET meta epoch`` does not answer our epoch, unvouches the cache:
  reads then run ``SYNC``, which raises ``Unlinked`` if the dict is gone.
  A read may miss a write published less than the listener's delivery
  latency ago (measured: docs/performance.md), and never one older than
  ``staleness`` seconds: the listener's request blocks at most
  ``min(staleness / 2, staleness - 0.12)`` seconds (a server with the
  default ``hz 10`` answers a timed-out block up to 100 ms late) and its reply
  must come within ``staleness`` of sending it;
  when none does the cache is marked unvouched and reads run ``SYNC`` (and
  raise ``BackendUnavailable`` if the server cannot answer) until the
  listener is back.  A gap in the entries it sees (trimmed) also makes the
  next read run ``SYNC``.

Writing (``WRITE``)
===================
``WRITE(epoch, expect, token, record, minlog)``, atomically on the server:

1. ``GONE`` if the epoch differs; ``CORRUPT`` (every script) if ``meta``'s
   counters are not numbers with ``0 <= snap <= seq`` (checked before any
   script writes anything: a Lua error does not undo earlier commands), or (``WRITE``,
   ``ACQUIRE``) the lock has no expiry -- this protocol never writes either,
   and a lock without expiry would block everybody forever.
2. Lease check: with a ``token`` (the writer holds the lease) the lock value
   must equal it, else ``FENCED`` -- the lease expired and maybe passed on:
   the write is refused and the writer gets ``LeaseLost``.  Without a token,
   a held lock answers ``LOCKED, pttl, last lockev id``: the writer waits for
   a release (``XREAD BLOCK`` on ``lockev`` after that id, at most ``pttl``)
   and sends again -- a write outside ``with d.lock`` waits for the holder,
   as in shared memory.
3. With ``expect`` (the writer's decision depended on its cache: a delete of
   a key it saw, ``setdefault``, a write into a nested dict), ``seq`` must
   equal it, else ``CONFLICT``: the writer syncs and redoes the operation.
   Writes whose effect does not depend on the state (a set, update or clear
   at the root) send no ``expect`` and never conflict.
4. ``seq += 1``, ``XADD log <seq>-1 r <record>``, ``logbytes += len``;
   answers the integer ``2 * seq + due``, ``due`` being 1 when a snapshot is
   due (``logbytes > max(minlog, SNAP_RATIO * snapbytes)``, "Snapshots") --
   one integer, the cheapest reply to parse; every other outcome is an array
   (the codes above).

The writer applies its record to its own cache when it reflected ``seq - 1``;
otherwise its next read syncs.  A write whose reply is lost (connection cut)
raises ``BackendUnavailable``: it may or may not have been applied, and the
cache is marked stale.

Transactions
============
``with d.transaction():`` (``transaction.py``) takes the lease (``ACQUIRE``:
the cache is current), applies the block's writes to the cache and keeps
their records; at its end one ``WRITE`` sends them as one bundle with the
token and ``expect`` = the ``seq`` the block began at: one entry, one
``seq``, so every reader -- ``SYNC``, a listener's ``XREAD COUNT n``, a feed
-- applies all of the block or none of it.  ``FENCED`` (the lease lapsed,
maybe passed on) publishes nothing and raises ``LeaseLost``; ``CONFLICT``
cannot happen under a live lease and would publish nothing
(``TransactionAborted``).  An exception leaving the block, a client that
dies in it, or a bundle larger than the server takes in one call
(``proto-max-bulk-len``, 512 MiB by default, asked with ``CONFIG GET`` for
bundles over 1 MiB: ``OutOfSpace``) send nothing.  After any outcome but success the handle's cache is dropped
and reloaded at the next read.  A lost reply leaves the block entirely
published or entirely not (one script); the cache is reloaded either way.

Snapshots (``SNAPSHOT``)
========================
When a write's reply says a snapshot is due the writer, if its cache reflects
some ``s > snap``, encodes its cache (the codec's dump of the tree, as a shared-memory full dump) and sends
``SNAPSHOT(epoch, s, blob)``: if ``snap < s <= seq`` the server stores it,
sets ``snap = s`` and trims ``log`` to the entries from ``s`` on (``XTRIM
MINID``; entry ``s`` stays, see "The log"), recomputing ``logbytes``; else it
ignores it (another writer's
newer snapshot won).  Server memory stays below about
``(1 + SNAP_RATIO) x`` the dict's encoded size plus ``minlog``.

Lock (``ACQUIRE``, ``RENEW``, ``RELEASE``)
==========================================
A lease with a fencing token.  ``ACQUIRE(epoch, seen, holder, lease_ms)``:
if ``lock`` is free, ``token = HINCRBY meta fence 1``, ``SET lock
"<token>|<holder>" PX lease_ms`` and answer ``[0, value, SYNC(seen)]`` -- the
lock and a current cache in one round trip; if it holds our own ``holder``
(a retry after a lost reply) answer the same; else ``LOCKED, pttl, last
lockev id``.  ``holder`` is ``host:pid:nonce`` (nonce: per attempt).
A keeper thread per lock renews a held lease each ``lease / 3`` seconds
(``RENEW``: ``PEXPIRE`` if the value is still ours, else ``FENCED``).
``RELEASE`` deletes the lock if it is still ours and appends our value to
``lockev`` (capped at ``LOCKEV_MAX``) to wake waiters; if it was no longer
ours the releaser gets ``LeaseLost`` -- unless one of the last ``LOCKEV_MAX``
release events carries our value (a repeat after a lost reply: released).
Renewals go out on a connection of their own that waits ``lease / 3`` at
most, so that neither this client's other calls nor a stalled server holding
another dict delay them.  A holder that dies stops renewing: waiters take
over ``pttl`` later (at most ``lease``).  A holder that stalls past its lease
is fenced: every later ``WRITE`` with its token is refused.  Local time left:
the holder counts its lease from the moment it *sent* the acquire or renewal
that succeeded, times ``LEASE_SAFETY``; while some is left, no other client
can hold the lock, so the holder's reads skip ``SYNC``.

Creating and removing
=====================
``CREATE(epoch, version, codec, recurse, minlog, creator, snapshot)`` makes
``meta`` and ``snap`` (``seq = snap = 0``) if ``meta`` does not exist and
answers ``[1]``; else it answers ``[0, version, codec, recurse, epoch,
minlog]`` of the existing dict -- exactly one of racing creators creates.
``UNLINK(epoch)`` deletes every key (``epoch`` empty: whatever epoch, for
``unlink_by_name``) and answers how many existed.  Handles of a removed dict
answer ``Unlinked`` to reads as well as writes: a client cannot tell an
unlink from a server that lost its data (restarted without persistence), so
it never serves its last state as current.  Users: the connection a handle
reads through is named ``ud:N:<host>:<pid>:<start>`` (``CLIENT SETNAME``);
``users()`` lists the connections so named (``CLIENT LIST``).

Changing the protocol
=====================
Keys, fields, entry format or script semantics change only with ``VERSION``
bumped; a client meeting another version raises ``IncompatibleLayout``.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["VERSION", "Keys", "keys_of", "SCRIPTS"]

VERSION = 2  # 2: a log entry may be a transaction's bundle
KEY_PREFIX = "ud:"
CLIENT_PREFIX = "ud:"

DEFAULT_LEASE = 3.0  # seconds
LEASE_SAFETY = 0.8  # local time left counts this share of the lease
DEFAULT_STALENESS = 0.5  # seconds, the cached mode's bound
DEFAULT_MINLOG = 1 << 20  # log bytes always allowed before a snapshot is due
SNAP_RATIO = 2  # a snapshot is due when the log outgrows this times the snapshot
LOCKEV_MAX = 16
WAIT_SLICE = 1.0  # seconds: blocking reads wake this often to check the dict still exists

# Reply codes (first element of every script's answer).
OK = 0
GONE = -1
FENCED = -2
LOCKED = -3
CONFLICT = -4
BAD_VERSION = -5
CORRUPT = -6  # meta's counters are not numbers, or the lock has no expiry: not ours

# SYNC kinds.
CURRENT = 0
ENTRIES = 1
SNAPSHOT = 2


class Keys(NamedTuple):
    meta: str
    log: str
    snap: str
    lock: str
    lockev: str


def keys_of(name: str) -> Keys:
    tag = "{" + KEY_PREFIX + name + "}"
    return Keys(tag + ":meta", tag + ":log", tag + ":snap", tag + ":lock", tag + ":lockev")


# Every script takes the five keys in Keys order: KEYS[1] meta, KEYS[2] log,
# KEYS[3] snap, KEYS[4] lock, KEYS[5] lockev; ARGV[1] is the epoch.

_CHECK = """
local meta = redis.call('HMGET', KEYS[1], 'epoch', 'seq', 'snap', 'logbytes', 'snapbytes')
if meta[1] == false or (ARGV[1] ~= '' and meta[1] ~= ARGV[1]) then return {-1} end
local function int(x)
  local n = tonumber(x)
  if n and n == math.floor(n) and n >= 0 and n < 2^53 then return n end
  return nil
end
local seq = int(meta[2])
local snapseq = int(meta[3])
if not seq or not snapseq or snapseq > seq or not int(meta[4]) or not int(meta[5]) then return {-6} end
"""

_DELTA = """
local function delta(seen)
  if seen == seq then return {seq, 0} end
  local snap = snapseq
  local out, from
  if seen >= snap and seen < seq then
    out = {seq, 1}
    from = seen
  else
    out = {seq, 2, snap, redis.call('GET', KEYS[3]) or ''}
    from = snap
  end
  for _, e in ipairs(redis.call('XRANGE', KEYS[2], (from + 1) .. '-1', '+')) do
    out[#out + 1] = e[2][2]
  end
  return out
end
local function last_event()
  local ev = redis.call('XREVRANGE', KEYS[5], '+', '-', 'COUNT', 1)
  if ev[1] then return ev[1][1] end
  return '0-0'
end
"""

SYNC = (
    _CHECK
    + _DELTA
    + """
return {0, delta(tonumber(ARGV[2]))}
"""
)

WRITE = (
    _CHECK
    + """
local holder = redis.call('GET', KEYS[4])
if holder then
  local pttl = redis.call('PTTL', KEYS[4])
  if pttl < 0 then return {-6} end
  if ARGV[3] == '' then
    local ev = redis.call('XREVRANGE', KEYS[5], '+', '-', 'COUNT', 1)
    return {-3, pttl, ev[1] and ev[1][1] or '0-0'}
  end
end
if ARGV[3] ~= '' and holder ~= ARGV[3] then return {-2} end
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= seq then return {-4} end
seq = seq + 1
redis.call('XADD', KEYS[2], seq .. '-1', ARGV[1], ARGV[4])
local logbytes = tonumber(meta[4]) + #ARGV[4]
redis.call('HSET', KEYS[1], 'seq', seq, 'logbytes', logbytes)
if logbytes > math.max(tonumber(ARGV[5]), SNAP_RATIO * tonumber(meta[5])) then return seq * 2 + 1 end
return seq * 2
""".replace("SNAP_RATIO", str(SNAP_RATIO))
)

ACQUIRE = (
    _CHECK
    + _DELTA
    + """
local holder = redis.call('GET', KEYS[4])
if holder and redis.call('PTTL', KEYS[4]) < 0 then return {-6} end
if holder then
  local bar = string.find(holder, '|', 1, true)
  if bar and string.sub(holder, bar + 1) == ARGV[3] then
    redis.call('PEXPIRE', KEYS[4], ARGV[4])
    return {0, holder, delta(tonumber(ARGV[2]))}
  end
  return {-3, redis.call('PTTL', KEYS[4]), last_event()}
end
local token = redis.call('HINCRBY', KEYS[1], 'fence', 1)
local value = token .. '|' .. ARGV[3]
redis.call('SET', KEYS[4], value, 'PX', ARGV[4])
return {0, value, delta(tonumber(ARGV[2]))}
"""
)

RENEW = (
    _CHECK
    + """
if redis.call('GET', KEYS[4]) ~= ARGV[2] then return {-2} end
redis.call('PEXPIRE', KEYS[4], ARGV[3])
return {0}
"""
)

RELEASE = (
    _CHECK
    + """
if redis.call('GET', KEYS[4]) ~= ARGV[2] then
  -- Released already (a repeat after a lost reply) if its release event is there.
  for _, e in ipairs(redis.call('XREVRANGE', KEYS[5], '+', '-', 'COUNT', ARGV[3])) do
    if e[2][2] == ARGV[2] then return {0} end
  end
  return {-2}
end
redis.call('DEL', KEYS[4])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], '*', 'r', ARGV[2])
return {0}
"""
)

SNAPSHOT_SCRIPT = (
    _CHECK
    + """
local s = tonumber(ARGV[2])
if s <= tonumber(meta[3]) or s > seq then return {0, 0} end
redis.call('SET', KEYS[3], ARGV[3])
redis.call('XTRIM', KEYS[2], 'MINID', s .. '-0')
local logbytes = 0
for _, e in ipairs(redis.call('XRANGE', KEYS[2], '-', '+')) do
  logbytes = logbytes + #e[2][2]
end
redis.call('HSET', KEYS[1], 'snap', s, 'snapbytes', #ARGV[3], 'logbytes', logbytes)
return {0, 1}
"""
)

# CREATE: ARGV = epoch, version, codec, recurse, minlog, creator, snapshot.
CREATE = """
local old = redis.call('HMGET', KEYS[1], 'version', 'codec', 'recurse', 'epoch', 'minlog')
if old[4] then return {0, old[1], old[2], old[3], old[4], old[5]} end
local now = redis.call('TIME')
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'epoch', ARGV[1], 'codec', ARGV[3],
           'recurse', ARGV[4], 'minlog', ARGV[5], 'creator', ARGV[6], 'seq', 0, 'snap', 0,
           'snapbytes', #ARGV[7], 'logbytes', 0, 'fence', 0, 'created', now[1])
redis.call('SET', KEYS[3], ARGV[7])
return {1}
"""

UNLINK = """
if ARGV[1] ~= '' and redis.pcall('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
"""

# META: the fields stats() shows, in one round trip.
META = """
local m = redis.call('HGETALL', KEYS[1])
return {m, redis.call('XLEN', KEYS[2]), redis.call('GET', KEYS[4]) or '', redis.call('PTTL', KEYS[4])}
"""

SCRIPTS = {
    "sync": SYNC,
    "write": WRITE,
    "acquire": ACQUIRE,
    "renew": RENEW,
    "release": RELEASE,
    "snapshot": SNAPSHOT_SCRIPT,
    "create": CREATE,
    "unlink": UNLINK,
    "meta": META,
}
