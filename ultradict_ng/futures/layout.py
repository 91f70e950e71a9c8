"""The process pool's shared-memory protocol: parcels.

Pool parcels (``@udp<pool>.<maker>-<seq>``; ``ultradict_ng.futures``)
=====================================================================
The process pool moves what is large in a task's call and its result in
*parcels*, one segment each at most, private to one pool (a call or result with
nothing large in it has none: its pickle travels in the pipe, as in the
standard pool): not a dict, no control segment, no lock,
and no bump of ``LAYOUT_VERSION`` when it changes (its own magic has a
version byte).  Names start with ``@`` (no dict or derived name can): ``<pool>``
is the pool's random token, ``<maker>`` the creating process's pid and
``<seq>`` its counter (base 36).  Layout: ``8 bytes PARCEL_MAGIC | u64 owner
word (the pool's process: pid and start time, as LOCK) | u64 maker word |
u64 payload length | zeros up to PARCEL_HEADER (64)``, then the out-of-band
buffers of a pickle (protocol 5), each at a multiple of 64, then the pickle
stream itself when it is as large as the threshold (a smaller stream travels
in the pipe).  Where each piece is travels in the pipe, never in the segment:
a parcel holds only raw bytes, and nothing read from it is unpickled except
what the pipe's own pickle says to rebuild.

Maker: create exclusively, ``ftruncate`` + ``posix_fallocate`` to the full
size (a full ``/dev/shm`` is ``OutOfSpace`` here, and the segment is unlinked
again), ``pwrite`` the header, then the payload; only then does the reference
go into the pipe.  Taker: open, **unlink the name at once** (the descriptor,
then the mapping, keep the memory until the last array over it is collected;
a parcel is never opened by name twice), check magic, owner and length, map
(read-write, shared), rebuild.

Who removes a parcel: its taker (a worker its call's, as the task starts; the
pool its result's, as its result thread reads the reference); the pool, every
name with its prefix, once it can make no parcel any more -- when its result
thread has ended (which joins every worker and the feeder thread first: after
``shutdown``, waiting or not, or after the pool broke, e.g. a call that no
worker took), at ``shutdown(wait=True)``, and at interpreter exit; and, after a crash,
``clean``: a parcel whose owner is dead (nobody will take it; a process that
still maps it keeps its mapping, and no parcel is opened by name twice),
or whose header is still zero ``PARCEL_STALE`` seconds after it was made (its
maker died between creating and writing the header).  A parcel of a live pool
is never touched from outside.  Workers check every ``POOL_WATCH_INTERVAL``
that the pool's process is alive and exit when it is not, so that no worker
of a killed pool maps a parcel for ever.

The rest of the package's shared memory (the dicts) is specified in
:mod:`ultradict_ng._shm.layout`; both go through ``_platform/segments.py``.
"""

from __future__ import annotations

POOL_PREFIX = "@udp"
PARCEL_MAGIC = b"UDNGpcl\x01"
PARCEL_FORMAT = "<8sQQQ"  # magic, owner word, maker word, payload length
PARCEL_HEADER = 64
PARCEL_ALIGN = 64  # every buffer starts at a multiple of it: aligned for any dtype and SIMD
PARCEL_STALE = 60.0  # seconds after which a parcel with a zero header counts as abandoned
POOL_WATCH_INTERVAL = 1.0  # workers check this often that the pool's process is alive
