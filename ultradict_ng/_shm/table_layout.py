"""The table: the form a big dict's entries take in shared memory.

Part of the shared-memory protocol (:mod:`ultradict_ng._shm.layout`), apart because
it is new: ``_shm/table.py`` writes and reads it.  A msgpack dict's dump
(layout: "Dump") is a table; readers still decode it whole.  The rules of
:mod:`ultradict_ng._shm.layout` ("Changing the layout") apply: a change a process
of the previous version would misread bumps ``LAYOUT_VERSION`` there.

A table holds one dict's entries so that a process that has only *mapped* it
answers a lookup with a hash, a probe and the decoding of one entry.  It is
written completely, header last, before anything makes it reachable, and never
changes afterwards.  Header and entries are little-endian, the index is in
the machine's byte order (as the control words: every process reading a
segment runs on the machine that holds it); every offset is from the
table's first byte::

    header   TABLE_HEADER (64) bytes, struct TABLE_FORMAT:
             8 bytes TABLE_MAGIC | u64 generation | u64 count | u64 slots |
             u64 entries start | u64 entries end | u64 creation token |
             u32 crc32 of the 56 bytes before it | u32 0
    index    ``slots`` u64 (a power of two >= 8, count <= slots * TABLE_MAX_LOAD):
             0 = empty, else ``hash & TABLE_TAG_MASK | entry offset``
             (the top 24 bits of the entry's hash; the offset fits in 40 bits)
    entries  from ``start = TABLE_HEADER + 8 * slots`` to ``end``, in the
             dict's insertion order, each 8-byte aligned:
             u64 hash | u32 key length | u32 value length | u32 crc32 | u32 0 |
             key | value | zero padding to 8;  the crc covers the first 16
             header bytes, then key and value

Hash: ``_codec/keyhash.key_hash`` of the key (equal keys hash equal in every
process, whatever ``PYTHONHASHSEED``).  Key and value: the serializer's
encoding of each (msgpack only: a pickled key cannot be hashed without being
decoded).  Keys are unique under ``==``.

Probe: slot ``hash & (slots - 1)``, then the next ones (linear, wrapping)
until an empty slot (absent).  A slot whose tag matches leads to its entry;
the entry's full hash must match, then its key must equal the one looked
for: a str or bytes key is compared as its encoding (exact: a str equals
only a str, and the serializer always writes msgpack's shortest form), any
other is decoded and compared with ``==``.  The load bound guarantees an
empty slot; a probe that meets none, an offset outside the entries or not
aligned, an entry running past ``end``, failing its crc or with a nonzero
reserved word, a header failing its crc or its bounds
(``start``, ``end`` and the segment's size), or a walk that counts other than
``count`` entries: ``CorruptSegment``.  Opening checks the header only;
entries are checked where they are read.  The index is not checksummed:
verifying it would make opening cost O(table), which is what the table is
for avoiding.  A damaged slot -- in shared memory only a process that can
write the segment (mode 0600: one of the dict's own users) can make one; a
checkpoint on a disk can also be damaged there, which ``doctor`` finds
(``Table.check_index``) -- leads a probe to an entry that its hash and key
checks reject, or to an empty slot: the key reads as absent.  Walks
(iteration, a whole decode) never use the index.

Merge: a new table is the old one's entries in order, minus those deleted
(an entry deleted and set again moves to the end, as in a ``dict``), with
overwritten values replaced in place, then the new keys in insertion order.
Unchanged entries are copied as byte runs with their hashes and crcs; the
index is rebuilt from the new entries' headers.  Nothing unchanged is decoded.

As a dump
---------
A msgpack dict's dump ``N@d<gen>`` (layout: "Dump") is a table of its root:
each key and value encoded by the serializer (nested dicts as plain dicts
inside values), the table's generation the dump's, its token the dict's
(W_TOKEN).  The writer packs the root whole and one compiled pass splits it
into entries (``_shm/table.py``, ``write_map``).  A reader checks the header
(magic, crc, bounds, token, generation); a failure is a failed dump check
(layout: "Reader", step 2: retry, ``CorruptSegment`` under the lock).  Then:

* below ``PARTIAL_FROM`` entries (``_shm/tablecache.py``: 4,096, or the
  process's ``ULTRADICT_NG_PARTIAL_FROM``) it decodes the whole: the entries,
  each checked, joined into one serializer map (``table_chunk``) and decoded
  in one call, a count that does not add up being a failed check;
* at or above it, the segment stays mapped as the base of the process's cache,
  a ``TableCache``: the table, the keys deleted since (``dead``), the keys
  added since in order (``fresh``), the values read or written since
  (``hot``); records apply to those.  A value is decoded, and its entry
  checked, when first read, and kept in ``hot``: under the process's cache
  mutex, so that a record applied meanwhile (a delete) is not undone by the
  value read before it -- or, in the compiled read path of a str key and a
  row of scalars, with no other thread running between its checks and its
  store, the checks made again after the decode (whose allocations may run a
  collection's finalizers).  A process that bounds its cache
  (``max_decoded=N``) drops the older half of the clean values (decoded from
  the table, not ``fresh`` nor changed since) before storing past N, or (0)
  stores none: the table holds each of them, so a later read decodes it
  again; nothing shared is involved.  The table never changes and stays valid after
  its name is unlinked, so nothing read from it can be torn or go missing: an
  entry failing its check is ``CorruptSegment`` at once (no retry changes it).
  A process that writes keeps the same cache: its records apply to it as a
  reader's do, and a check or an old value decodes only the key it is about
  (a blob sweep, only due while blobs exist, and a root ``clear`` of a dict
  holding blobs walk every value).  Its dump is a merge (below); a change
  feed and the command line decode whole.

* A writer's dump of a ``TableCache`` is a merge of its table with the
  changes: ``dead`` keys' entries removed, ``changed`` keys' entries given
  their value in ``hot`` anew (an overwrite, or a value the serializer
  decoded, which a nested record may have changed in place), ``fresh`` keys
  appended in order; every other entry is copied as bytes.  The new table
  is written, indexed and checked (its entries add up to its count) before
  it is published, exactly as any dump (layout: "Writer", step 4): a writer
  killed during the merge leaves the previous dump and the stream, which
  the others continue from.  Then the writer's cache becomes the new table
  at or above ``PARTIAL_FROM`` entries, keeping the values it decoded (each
  is the new table's; those not scalars or tuples of them stay ``changed``),
  or a ``dict`` of it below.  A ``TableCache`` that a ``clear`` left without
  a table is packed whole, as a ``dict`` is.

Why this form (and not another engine's)
----------------------------------------
* LMDB keeps one copy-on-write B+tree: a write copies the pages on its path,
  readers are pinned to the snapshot they began in, and freed pages are
  reused once no reader's slot names an older snapshot.  It orders keys by
  their bytes; a dict orders them by insertion and never needs a range, and a
  lookup through a B+tree written in Python costs a page decode per level
  where a hash probe costs one slot and one entry.
* LSM trees (LevelDB, RocksDB) write into a small mutable level (memtable and
  log) and merge it into large immutable sorted runs, reading newest first.
  The stream already is such a mutable level -- a log every process replays
  into a small private map -- so one immutable level suffices for dicts that
  fit in memory, and a merge rewrites it whole, as a major compaction does,
  copying entries rather than re-encoding them.
* Bitcask appends values to a log and keeps a hash index of their offsets in
  each process's memory, merging the live entries into a new file now and
  then.  The table is that merged file with its index beside it in the same
  immutable segment, so that no process builds or holds an index of its own.

Readers are pinned as in LMDB, by the segment itself: a table they mapped
stays valid after a newer one replaces and unlinks it.
"""

from __future__ import annotations

__all__ = [
    "TABLE_MAGIC",
    "TABLE_HEADER",
    "TABLE_FORMAT",
    "TABLE_ENTRY_FORMAT",
    "TABLE_ENTRY_HEADER",
    "TABLE_MAX_LOAD",
    "TABLE_OFFSET_MASK",
    "TABLE_TAG_MASK",
]

TABLE_MAGIC = b"UDNGtbl\x01"
TABLE_HEADER = 64
TABLE_FORMAT = "<8sQQQQQQII"  # magic, generation, count, slots, start, end, token, crc, 0
TABLE_ENTRY_FORMAT = "<QIIII"  # hash, key length, value length, crc, 0
TABLE_ENTRY_HEADER = 24
TABLE_MAX_LOAD = 0.7  # linear probing: ~2 probes per hit, ~6 per miss at the bound
TABLE_OFFSET_MASK = (1 << 40) - 1
TABLE_TAG_MASK = ((1 << 64) - 1) ^ TABLE_OFFSET_MASK
