"""The protocol of a dict kept in files (``SharedDict(path=DIR)``): files, write and sync order, recovery.

This docstring is the specification; the constants below are the only place
the numbers and names live.  It extends the shared-memory protocol
(:mod:`ultradict_ng._shm.layout`), which stays whole: a dict kept in files *is* a
shared-memory dict whose stream, dumps and blobs are files of ``DIR`` mapped
into every process, plus the rules below for what must reach the disk, and
when.  Who follows which part: ``files.py`` (every file system call),
``_platform/directories.py`` (which derived names are files of ``DIR``),
``_platform/segments.py`` (those files made, a dump or blob written aside
and renamed), ``opening.py`` (Directory; Opening, steps 1-2),
``attaching.py`` (steps 3-4), ``recovery.py`` (step 4; its scan, 4c, in
``scanning.py``), ``syncing.py`` (Sync policies; ``clean`` removed at the
first write), ``lifetime.py`` (Closing and removal),
``_shm/writer.py`` (calls the sync after a write, the first-write removal,
and reserves the stream on demand: layout "Stream size").

Directory
=========
``DIR`` holds only these files (mode 0600)::

    dict.meta      what the dict is (JSON, below); its presence makes DIR a dict
    stream         the update stream (layout: "Stream size"), mapped shared
    dump.<gen>     the full dump of generation <gen> (base 36), never changed
    blob.<id>      one large value (layout: "Blobs"), never changed
    clean          written by a clean close only (see "Closing")
    cache          a SharedCache's side segment (cache_layout), mapped shared
    *.tmp          one of these being written; never read, removed at the next open

Names are matched whole (``is_own``), and a finished dump or blob must
begin with its magic (``magics_of``; ``files.dicts_file`` checks both):
``streamer.log``, ``dump.sql`` or ``blob.png`` is not a dict's file -- a
directory holding one is refused at creation, and no step reads, counts or
removes it.  Where ``dict.meta`` is missing, nothing vouches for the names
alone: ``clean`` must begin with ``CLEAN_MAGIC``, ``cache`` with its side
segment's magic, ``stream`` with a whole record -- or those two be empty
or zeros, as a creation killed early leaves them (``recovery.dicts_own``)
-- another program's ``stream`` is not taken for the records of a dict
that lost its description, nor removed as them.

The control segment stays in shared memory (``/dev/shm``): it is rebuilt from
the files whenever it is missing, as SQLite rebuilds its ``-shm`` index.  Its
name is ``CONTROL_PREFIX`` + the directory's device and inode numbers in
hex (``udng+803-1a2b3c``): every process that opens the directory finds the
same segment, a directory moved within its filesystem keeps it, and a copy
(``cp -r``: a new inode) is a dict of its own.  The names of derived segments
map to files: ``N@s`` -> ``stream``, ``N@d<g>`` -> ``dump.<g>``, ``N@b<id>``
-> ``blob.<id>``, ``N@c`` -> ``cache``; a process maps them so once it has
opened ``DIR``.

``dict.meta`` is a JSON object: ``format`` (``META_FORMAT``), ``version``
(``DISK_VERSION``), ``layout`` (``LAYOUT_VERSION`` of the shared-memory
protocol), ``token`` (the dict's creation token, as W_TOKEN), ``serializer``
(its id), ``recurse``, ``grows``, ``stream_size``, ``stream_limit``,
``dump_limit``, ``blob_threshold``, ``sync`` and ``sync_interval``.  It is
written once, whole (``write_whole``: to ``dict.meta.tmp``, synced, renamed,
the directory synced), after the stream file is synced: a directory without
it holds no dict, whatever else it holds.

Writes and syncs
================
Record (writer steps 3 and the transaction's end): unchanged in memory; the
record's unit word (layout: "Stream record") tells recovery where a
transaction ends.  What reaches the disk when depends on the policy.

Dump = checkpoint (writer step 4, in every policy): ``dump.<g>.tmp`` is
created and written (payload, header), its data synced, renamed to
``dump.<g>``, the directory synced -- all *before* STATE publishes it; then
older dumps are removed (layout: step 4d).  So a file named ``dump.<g>`` is
complete on the disk before any record of generation g overwrites the
stream, and a checkpoint never depends on the stream it replaces.  A writer
killed between the rename and STATE's store leaves ``dump.<g+1>`` whole and
unpublished (REG_HIGH > STATE's generation); the process that takes its lock
over removes it and syncs the directory before its own writes
(``segments.discard_unpublished``), since a recovery would take the newest
dump for the dict and skip the records of g written after it.  One nobody
takes over from holds every write (none came after it): taking it loses
nothing, and publishes the write in flight when its writer died, as a
whole record left unpublished at STATE's end does when the dict is rebuilt
from its files without a last close (a reboot, ``clean``).  A writer whose
checkpoint fails after the rename (an interrupt while it maps the dump to
read it in place) removes it the same way before the error leaves the write.

Blob (layout: "Blobs", step b, in every policy): written to ``blob.<id>.tmp``,
synced, renamed, the directory synced, before the record that references it
is written.  Step d is skipped: a blob the published state dropped may still
be referenced by what the disk holds (the record dropping it may not be
synced yet), so only a dump's sweep -- after the dump is on the disk --
removes blobs.  Blobs overwritten between two dumps take disk space until
the next dump, so they are counted: DEAD (control word) holds the bytes of
the blobs dropped since generation g's dump, ``(g & 0xFFFF) << 48 | bytes``
-- a writer adds its dropped ones by CAS after its publish, a count of an
older generation read as 0 (the dump since swept them) -- and the writer
whose addition makes it outweigh that dump (and ``STREAM_GRANULE``) writes
one then (``Durability.dropped``).  The last close records the count in
``clean`` and a clean reopen (step f) restores it, so values replaced by
many processes, or by one that opens the dict for each write, count
together: the disk holds at most about twice the dict plus the stream.

Cache side file (a ``SharedCache(path=DIR)``; cache_layout is its protocol):
created as ``cache.tmp`` under the dict's lock, its settings written, then
MAGIC, synced, renamed to ``cache``, the directory synced -- before the
cache's first entry is written.  Its settings words are never written
again, so no later write-back (whole or torn) changes them; every other
word and cell (counters, slots, sizes, recency) is written through the
mapping and never synced on its own: after a power loss it may be any mix
of its sectors' old and new contents, so a recovery that finds no matching
``clean`` marks it stale (step f), and the cache rebuilds it from its
entries (cache_layout, "Crashes").  A clean close syncs it before ``clean``,
and after a clean reopen a writer removes ``clean`` (step f) before its first
change of the side file, as before its first record: a reopen trusts the
side file only while it is as the close synced it (readers' recency stores
aside: any value of them is right).

Sync policies
=============
``sync`` (stored in ``dict.meta``; every handle of the dict uses it):

* ``"always"``: a write (a transaction's block) returns once its record is
  on the disk.  After publishing and releasing the lock, the writer waits
  until SYNCED >= the STATE its record published.  Group commit: a writer
  that finds SYNCED short claims SYNC_LEADER (CAS 0 -> its owner word),
  loads STATE, syncs the stream's range from SYNCED's end (or 0 in a newer
  generation) to that STATE's end, raises SYNCED to it (CAS loop, never
  lowering), stores SYNC_LEADER = 0, then SYNC_SEQ += 1 and wakes every
  sleeper on it.  A writer that finds a leader loads SYNC_SEQ, checks SYNCED
  and SYNC_LEADER again, and futex-waits on SYNC_SEQ's low half (polls
  from ``SYNC_POLL`` without futex): the leader's SYNCED and SYNC_LEADER
  stores precede its SYNC_SEQ increment, so the sleeper either sees them
  or is woken.  It leads itself only when no live leader remains (a dead
  leader's word is replaced by CAS, as the lock's; checked every
  ``LOCK_CHECK_INTERVAL``).  One sync covers every record published before
  it began, whoever wrote them.
* ``"interval"`` (``sync_interval`` seconds, default ``DEFAULT_SYNC_INTERVAL``):
  each process that wrote, or forked while it had the dict open, runs a
  daemon thread that syncs each dict as above, on the dict's own schedule,
  once SYNCED < STATE and at most every interval; a clean close, a normal
  exit and a ``multiprocessing`` worker's end (its finalizers: it leaves by
  ``os._exit``) sync.  A write is on the disk at most one interval after it
  returned (plus the sync's own time), also when its process went idle or
  exited normally -- or, forked, left by ``os._exit`` or was terminated
  while its parent has the dict open.
* ``"never"``: the operating system writes back when it chooses; a dump
  (above), a clean close and a normal exit sync.

A sync that fails (the disk's I/O error) -- or the removal of an unpublished
checkpoint, which a recovery would take, that cannot be made durable --
sets STATUS bit ``STATUS_SYNC_FAILED``
before its error is raised (``SyncFailed``), and from then on every sync of
the dict, by any handle, raises ``SyncFailed`` instead of syncing: Linux
reports a failed writeback once and marks the pages clean, so a later
``fdatasync`` would succeed without writing them, and SYNCED would count
records the disk never got.  Under ``interval`` and ``never`` no write waits
for a sync (it fails in the flusher thread, or in a close, and is logged
there), so every write that finds the bit raises ``SyncFailed`` once it is
published.  A last close that finds the bit records no
clean close (no ``clean``): the next open recovers from the files, and its
checkpoint writes the dict anew.  A new checkpoint is a sync too: with the
bit set it is refused before it is written.  One whose own sync (the file,
or the directory after its rename) fails is discarded unpublished, as any
failed checkpoint, and the bit stays clear: the write that made it raises
``SyncFailed`` (``OutOfSpace`` if the disk said it is full), and what was
published before is as durable as the stream's last sync made it.

A dump raises SYNCED to ``gen << 32`` (its generation, empty stream).  In
every policy a process killed loses nothing it published: its records are in
the page cache, which the kernel writes back.

Opening and recovery
====================
``SharedDict(path=DIR)``: ``DIR`` is created if missing (``create`` as for a
name) and locked exclusively: ``flock`` on the directory itself, held only
while opening or closing, never while the dict is used.  (Not on a lock
file: one removed while held -- by ``unlink()``, by a cleaner of old files
-- lets the next opener make and lock another, and two openers run at
once.)  Once it holds the lock, an opener checks that the path still names
the directory it locked (``unlink()`` may have removed it, and someone made
it again) and starts over if not.  Then:

1. no ``dict.meta``, or one that says ``"creating"``: remove any file of the
   list above (the leftovers of a creation that died), create the dict
   (control segment, ``stream`` file; with initial data, a ``dict.meta`` that
   says ``"creating"``, then the data), sync the stream and any dump, sync
   ``DIR`` and every directory above it (a new directory's entry is durable
   only then, whoever made it: this open, another, the user), write
   ``dict.meta``.  A
   directory holding other files is refused (``NotADict``); no
   ``dict.meta`` beside a dump, a blob, ``clean``, ``cache`` or records in
   the stream is a dict that lost its description, refused
   (``CorruptSegment``) -- removing them as leftovers would delete it.
2. ``dict.meta`` of another format or version: refused (``IncompatibleLayout``).
3. a control segment of the dict's token whose MAGIC is set: attach to it (the
   page cache holds what the dict holds) -- if a registered user is alive,
   or if no handle outside it has the dict open ("Limits") and the files
   still say what it says (``recovery.stale_control``: the checkpoint of its
   generation is there and none newer than the one it was making, the
   stream's records are whole up to its end, ``clean`` if there records its
   state).  Else (every user dead, and a backup put back in ``DIR``, another
   container's rebuild gone on from the files, or pages the kernel could not
   write back) it is removed and rebuilt as below, with a warning.  ``clean``
   removes the segment of a dict whose users all died without the directory
   lock (it knows no directory), holding the dict's: an attach that finds it
   removed, or flagged, looks again (step 3, then step 4: it is gone or
   flagged now); a file missing while it stands unflagged is
   ``CorruptSegment``.  A rebuild holds the lock of the segment of the
   dict's token it replaces (``clean`` removes under it; one that holds it
   is waited for until the name is gone): no ``clean`` removes the new one.
4. otherwise (none, half-created, or another token: a segment left by a
   directory that had this inode before) -- recovery:

   a. remove the segment if any; remove every ``*.tmp``;
   b. the newest ``dump.<g>`` is the checkpoint (every ``dump.<g>`` is whole:
      see above; one without a dump's first bytes is refused, naming it) --
      or the one ``clean`` names, if there (none follows a clean close: a
      newer one is another program's file, or a checkpoint never published
      -- its writer killed between its rename and STATE, and no process took
      the lock over, which removes it, before the last close -- removed in
      step d); none: generation 0, empty;
   c. scan the stream from offset 0: each record must lie within the file,
      carry tag ``g & GEN_MASK`` and a right crc; its unit word must be
      ``UNIT_WHOLE`` or, in a transaction, its offset from the transaction's
      first record (shifted).  A unit counts only when its last record is
      whole (``UNIT_LAST``); ``end`` = the end of the last whole unit.
      Anything past it (a torn write, a transaction that never ended, pages
      the disk never got) is ignored and logged -- also when the scan stops
      as at an end (zeros, a record of another generation) but a whole
      record of ``g`` lies within 64 KiB past it (``records_after``: damage
      that only looks like the end), or ``clean`` (of ``g``, the dict's token)
      names an end past it (``short_of_clean``: its close synced them first).
      If ``clean`` names a later generation
      than g (with the dict's token), or the scan found no record of g and
      the stream begins with a whole record of a later generation, that
      checkpoint is missing -- its records follow it, written only after it
      was synced and renamed (step 4d) -- and the open is refused,
      ``CorruptSegment`` naming it, nothing changed: opening the dump before
      it (or nothing) would drop what it held, and the next checkpoint would
      take its generation again, under which the stream's old records would
      come back (``missing_checkpoint``);
   d. remove the dict's checkpoints newer than g (never published: left
      there, one would be the newest checkpoint once ``clean`` is gone, and
      drop every write since as records of an older generation) and sync
      the directory; create the control segment from ``dict.meta`` (a new creator, the same
      token) with STATE = ``g << 32 | end``, REG_LOW = REG_HIGH = g, BLOB_NEXT
      past the highest ``blob.<id>``, SYNCED = STATE -- MAGIC only once step
      e is done, so that a segment a killed recovery left is rebuilt, not
      attached to (with STATE ``g << 32`` where the records were to be
      merged as bytes, an attacher would lose them); load it (the reader's
      steps: a dump failing its checks is ``CorruptSegment``
      naming the file; unless ``clean`` matches, every entry of a table
      read in place is checked too, ``Table.check``: step e's merge copies
      entries as bytes, and must not carry a damaged one on); then (d')
      remove the dict's checkpoints older than g -- a writer killed between
      publishing g and step 4d's removal left them, no reader looks below
      REG_LOW = g and nothing else would remove them -- only now, g loaded
      whole: a g failing its checks leaves every file as it was;
   e. unless ``clean`` holds exactly this ``(g, end, token)``: write a dump
      now (a checkpoint, generation g + 1).  Why: bytes past ``end`` of
      generation g may be records a power loss cut off from ``end``; left in
      generation g, a later write ending where one of them begins would make
      it valid again.  A new generation makes them all stale.  When the
      checkpoint is a table read in place (``PARTIAL_FROM`` entries or
      more, msgpack) and every record is a root-level set or delete of a
      str or int key (int keys only beside a table without bool, float or
      ext-typed keys -- ``Decimal``, ``complex`` -- which a dict may take as
      equal to them), it is merged from bytes
      (``StreamMerge``): STATE is made ``g << 32`` (nothing to replay), the
      table loaded in place, and the new one written from its entries and
      the records' value bytes, each entry it keeps checked -- no value
      decoded or encoded; else the records are replayed and the cache
      dumped.  A million keys and 1.14M records:
      recovery 0.25-0.30 s, against 1.3 s replayed.  Where the disk has no room
      for the checkpoint (``OutOfSpace``), the bytes past ``end`` up to the
      last nonzero one are zeroed instead and synced -- pages the file has,
      no room needed -- with a warning, and the dict stays in generation g
      (records planned as bytes are then replayed).  That is never the rule:
      every later opener then replays the whole stream (measured: an open
      and a ``copy()`` ~1.4 s, against ~0.5 s from a checkpoint);
   f. if ``clean`` matched: DEAD = the count it records (tagged g),
      CLEAN_PENDING = 1, and the first writer (under
      the lock, before its record) removes ``clean``, syncs the directory and
      stores CLEAN_PENDING = 0 -- a reopen that only reads syncs nothing;
      else remove ``clean`` (and sync the directory), and if a ``cache`` file
      is there, store 1 in its batch word (cache_layout ``W_BATCH``, a write
      of the page cache): the cache's next opener or writer rebuilds its
      slots, sizes and bytes from the entries.  Release the lock.

   Other openers wait on the lock: none sees a half-recovered dict.  A
   recovery killed at any step leaves the files as they were or with a
   complete newer checkpoint; the next opener recovers again.

Closing and removal
===================
A handle's close syncs the stream (every policy), then leaves the register
under the directory lock and, if it was the last, closes the dict there; it
drops its mark on the stream ("Limits") only after that, so that an opener
never finds a handle gone from the register with its mark left, nor the mark
gone with its last close still to write.  (A handle collected while its
own thread holds the directory lock -- a garbage collection inside an open
of the same dict -- leaves after that thread lets it go: ``dirlock.after_unlock``.)
The last process to close
(layout: "Users", the removal of an unused dict, with the directory locked)
removes the control segment only; zeroes the header of a whole record of
STATE's generation at STATE's end, if one lies there (a write never
published, its writer killed between writing and publishing it: every
process went on and closed without it, and a recovery must not replay it
later); syncs ``stream`` (and ``cache`` if there), then writes ``clean``
(``CLEAN_FORMAT``:
magic, generation, stream end, token, DEAD's bytes of that generation, crc)
with ``write_whole``.  A dict
kept in files is never removed automatically: ``unlink()`` first rewrites
``dict.meta`` to say ``"creating"`` (``write_whole``: a removal killed
midway leaves what step 1 removes as a creation's leftovers, never a dict
missing some files; with no room for it, ``dict.meta`` is removed first and
the directory synced: a dict that lost its description, refused), then
removes the control segment, every file above with ``dict.meta`` last, then
``DIR`` if it is empty -- with the
directory locked and only under the dict's lock (``REMOVE_LOCK_TIMEOUT``,
then ``LockTimeout`` and nothing removed; a dead holder's is taken over),
unlike a dict in shared memory, whose removal goes on without it after
``UNLINK_LOCK_TIMEOUT``.  Why: a writer makes its values' and checkpoints'
files by the directory's path, checking for the removal once, as it takes
the lock.  One that went on after a removal without the lock (a slow
``fsync``, a long transaction) wrote its files into the removed directory's
path -- into the next dict made there, over its values -- and had its
write acknowledged.  A handle closing a removed dict syncs nothing.

Limits
======
The directory lock and the control segment are per machine: two machines
sharing ``DIR`` over a network filesystem would each build their own control
segment and overwrite each other's files.  Opening refuses a directory whose
filesystem is NFS, CIFS/SMB or another network filesystem
(``NETWORK_FILESYSTEMS``; a FUSE mount by its subtype), found in Linux's
mount table -- read only when the directory's device is not a block
device's (major 0: network filesystems, tmpfs, FUSE).  Users must share
the machine's shared memory (one container or IPC namespace), as for a dict
in shared memory.  Each open handle holds ``flock(LOCK_SH)`` on its own
descriptor of ``stream`` (taken under the directory lock, dropped when the
descriptor closes, by the kernel too when its process dies); before step 4
rebuilds a dict, and before step 3 attaches to a segment whose registered
users are all dead, the opener tries ``LOCK_EX | LOCK_NB`` on a new
descriptor (unlocked before it is closed) and refuses (``InUseElsewhere``)
if that still fails after ``sharing.MARK_PATIENCE`` (a process killed shows
as dead while a thread of it, inside a system call, still holds its
descriptors): a handle has the dict open
whose control segment this opener cannot see -- in another IPC namespace
(a container with its own ``/dev/shm``), or removed while it ran.  Rebuilt
beside it, each side would overwrite the other's records.  A ``stream`` or
``cache`` (files written in place) with more than one hard link is refused
too (``NotADict``): a copy made by linking (``cp -al``) shares them with
another dict.  A read-only ``DIR`` is refused at open.  Linux is tested.
On macOS every sync above is ``F_FULLFSYNC`` (its ``fsync`` and ``msync``
leave the data in the drive's cache), as SQLite's ``fullfsync`` and LMDB do
there; that path is not tested here.  Windows is not supported.

Changing the layout
===================
``DISK_VERSION`` is stored in ``dict.meta``; bump it with any change of a
file's name or format or of an order above.  The records and dumps in the
files follow ``LAYOUT_VERSION``, which ``dict.meta`` records too.
"""

from __future__ import annotations

import struct
from typing import Optional

from .._shm import layout as L
from .._shm import table_layout as TL

META_FILE = "dict.meta"
STREAM_FILE = "stream"
DUMP_PREFIX = "dump."
BLOB_PREFIX = "blob."
CLEAN_FILE = "clean"
CACHE_FILE = "cache"
TMP_SUFFIX = ".tmp"

CONTROL_PREFIX = "udng+"
META_FORMAT = "ultradict_ng dict"
DISK_VERSION = 1

SYNC_MODES = ("always", "interval", "never")
DEFAULT_SYNC = "interval"
DEFAULT_SYNC_INTERVAL = 1.0
#: How long a removal (``unlink()``, ``rm PATH``) waits for the dict's lock
#: before it gives up, removing nothing (``LockTimeout``); a dead holder's is
#: taken over at once.
REMOVE_LOCK_TIMEOUT = 30.0
SYNC_POLL = 0.00005  # without futex, a group commit's follower first re-checks SYNCED after this

#: DEAD: the generation's low bits above, the bytes of dropped blobs below.
DEAD_SHIFT = 48
DEAD_BYTES = (1 << DEAD_SHIFT) - 1


def dead_word(generation: int, dead: int) -> int:
    """DEAD's word for ``dead`` bytes dropped since generation's dump."""
    return (generation & 0xFFFF) << DEAD_SHIFT | min(dead, DEAD_BYTES)


def dead_of(word: int, generation: int) -> int:
    """The bytes DEAD's ``word`` counts for ``generation`` (0: another's, swept since)."""
    return word & DEAD_BYTES if word >> DEAD_SHIFT == generation & 0xFFFF else 0


CLEAN_MAGIC = b"UDNGcln\x02"
#: magic, generation, stream end, token, DEAD's bytes, crc32 of the rest
CLEAN_FORMAT = struct.Struct("<8sQQQQI")

#: Filesystem types (``/proc/self/mountinfo``) a dict's directory may not be on:
#: machines sharing them cannot share the control segment nor the ``flock``.
NETWORK_FILESYSTEMS = (
    *("nfs", "nfs4", "cifs", "smb3", "smbfs", "afs", "ceph", "9p", "glusterfs", "lustre"),
    *("sshfs", "s3fs", "davfs", "gcsfuse", "rclone"),  # (FUSE subtypes)
)


def readable_version(version: object, layout: object) -> bool:
    """Whether ``dict.meta``'s version and layout are this one's: the very ints
    (JSON's ``"1"``, ``true`` and ``9.0`` compare equal in Python but are not)."""
    return (type(version), version, type(layout), layout) == (int, DISK_VERSION, int, L.LAYOUT_VERSION)


def control_name(device: int, inode: int) -> str:
    """The control segment's name of the directory ``(st_dev, st_ino)``."""
    return f"{CONTROL_PREFIX}{device:x}-{inode:x}"


def file_name(suffix: str) -> Optional[str]:
    """The file of a derived segment's suffix (``@s``, ``@d<g>``, ``@b<id>``, ``@c``), else None."""
    if suffix == L.STREAM_SUFFIX:
        return STREAM_FILE
    if suffix == L.CACHE_SUFFIX:
        return CACHE_FILE
    if suffix.startswith(L.DUMP_SUFFIX) and len(suffix) > 2:
        return DUMP_PREFIX + suffix[2:]
    if suffix.startswith(L.BLOB_SUFFIX) and len(suffix) > 2:
        return BLOB_PREFIX + suffix[2:]
    return None


def own_id(file: str, prefix: str) -> Optional[int]:
    """The id of ``file`` if it is named ``prefix<id>`` (``DUMP_PREFIX`` or
    ``BLOB_PREFIX``) with the id in base 36 as the dict writes it (lower
    case, no leading zero, at least 1), else None: ``dump.sql`` or
    ``blob.png`` is not a dict's file."""
    if not file.startswith(prefix):
        return None
    digits = file[len(prefix) :]
    if not digits or digits[0] == "0" or digits.strip("0123456789abcdefghijklmnopqrstuvwxyz"):
        return None
    return int(digits, 36)


def _named_own(file: str) -> bool:
    """Whether ``file``, taken whole, is the name of one of the dict's files."""
    if file in (META_FILE, STREAM_FILE, CLEAN_FILE, CACHE_FILE):
        return True
    return own_id(file, DUMP_PREFIX) is not None or own_id(file, BLOB_PREFIX) is not None


def aside_of(file: str) -> Optional[str]:
    """The file a ``.tmp`` file is being written as, else None.  A name that
    is the dict's taken whole is never one: id or generation 38401 is base 36
    ``tmp``, so ``blob.tmp`` and ``dump.tmp`` are a finished blob and dump."""
    if not file.endswith(TMP_SUFFIX) or _named_own(file):
        return None
    whole = file[: -len(TMP_SUFFIX)]
    return whole if _named_own(whole) else None


def is_own(file: str) -> bool:
    """Whether ``file`` is one of the files a dict's directory holds (the list
    under "Directory", or one of them being written: ``.tmp``).  Names are
    matched whole: a file that only begins like one (``dump.sql``,
    ``streamer.log``) is the user's, refused at creation, never removed."""
    return _named_own(file) or aside_of(file) is not None


def magics_of(file: str) -> tuple[bytes, ...]:
    """What the first 8 bytes of ``file`` must be for it to be the dict's:
    a dump's or a blob's magic for a finished dump or blob (their names alone
    cannot tell ``dump.sql`` from generation ``int("sql", 36)``); nothing
    to check for the other names (and for ``.tmp`` ones, whose headers come
    last)."""
    if own_id(file, DUMP_PREFIX) is not None:
        return (TL.TABLE_MAGIC, L.DUMP_MAGIC)
    if own_id(file, BLOB_PREFIX) is not None:
        return (L.BLOB_MAGIC,)
    return ()


def suffix_of(file: str) -> Optional[str]:
    """The derived segment's suffix of a file of the directory (a ``.tmp`` one's too), else None."""
    file = aside_of(file) or file
    if file == STREAM_FILE:
        return L.STREAM_SUFFIX
    if file == CACHE_FILE:
        return L.CACHE_SUFFIX
    for prefix, suffix in ((DUMP_PREFIX, L.DUMP_SUFFIX), (BLOB_PREFIX, L.BLOB_SUFFIX)):
        if own_id(file, prefix) is not None:
            return suffix + file[len(prefix) :]
    return None


def written_aside(suffix: str) -> bool:
    """Whether a derived segment is written to ``.tmp`` and renamed when whole (dumps, blobs, the cache's)."""
    return suffix.startswith((L.DUMP_SUFFIX, L.BLOB_SUFFIX, L.CACHE_SUFFIX))
