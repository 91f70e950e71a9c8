/*
 * ultradict_ng._helper._native: the optional compiled helper.
 *
 * Every entry point has a pure-Python twin of the same name and signature in
 * twins.py; speedups.py imports one set or the other and nothing else in
 * the package knows which.  _native.pyi types both.  The twins must behave
 * identically, byte for byte in shared memory; tests/test_native.py checks
 * each against a reference, and CI runs the suite on both
 * (ULTRADICT_NG_SPEEDUPS=native|bound|public).
 *
 * What is here, in file order, and why it is compiled:
 *
 *   crc_update          CRC-32 of zlib, slicing by 8 (record checksums).
 *   Words               seq_cst load/store/cas of the control words (a write
 *                       takes the lock, publishes STATE and releases: three
 *                       atomics, ~50 ns each here against ~1-10 us through
 *                       the atomics package), write_record (header, crc and
 *                       payload in one call) and write_simple (a root-level
 *                       scalar set/delete encoded as msgpack straight into
 *                       the stream: the same bytes as codec + write_record);
 *                       add (fetch-add), publish (store, then load the word
 *                       saying whether anyone sleeps), wait/wake (Linux futex
 *                       on a word's low 32 bits, GIL released while asleep).
 *   ProcessState        the lock's per-process state (holder thread,
 *                       reentrancy, competing mutex) with enter/exit as one
 *                       call each: the fast paths of SharedLock; exit wakes
 *                       one sleeping lock waiter when the register says
 *                       there are any (layout.py, "Waiting and waking").
 *   StoreBase/ViewBase  the bases of Store and SharedDict; ViewBase's
 *                       __getitem__ slot is the read hit path (one STATE load,
 *                       a compare, a dict lookup, an immutable-type check --
 *                       a tuple of immutable items counts) and
 *                       calls the Python _getitem_slow for everything else;
 *                       its __setitem__ slot writes a scalar set inside an
 *                       open transaction (a record past the published end,
 *                       the cache) and calls _setitem_slow otherwise.
 *   CacheGet            a SharedCache handle's get: the dict's hit path, then
 *                       the entry's expiry against CLOCK_REALTIME, the recency
 *                       store and the copy, in one call (cache_layout.py,
 *                       "Reading").
 *   types_within        the codec's scan of a container before packing.
 *   pack_map,           the codec's encoding of a dict (a dump) or an update
 *   pack_pairs          record's pairs of scalar keys and scalar or
 *                       scalar-tuple values, in one call.
 *   msgpack_length      the length of one msgpack object (framing check).
 *   parse_records       the reader's validation of copied stream bytes
 *                       (layout.py, reader step 4) in one call.
 *   scan_stream         recovery's scan of a stream file for its whole units
 *                       (_disk/layout.py, step 4c) in one call.
 *   contains_type       the codec's walk for foreign Timestamps after decoding.
 *   apply_sets          record.apply_all's runs of root-level scalar sets;
 *   apply_simple        the same straight from their payloads (a replay).
 *   key_hash_common     (keyhash.c) a shared table's key hash for common types.
 *   table_get,          (table.c) the probe of a shared table: by a str or
 *   table_candidates    bytes key, or the entries of one full hash;
 *   table_fill,         writing its entries from a packed msgpack map,
 *   table_merge,        a new one from an old one's entries and changes,
 *   table_changes,      those changes for the keys it probes and encodes,
 *   table_index,        its index from the entries, and walking it a
 *   table_chunk,        chunk of entries at a time (one packed map each),
 *   table_rows          or decoding its rows into a dict or a list of pairs (with unpack.c).
 *   unpack_simple,      (unpack.c) decoding a scalar or a tuple of scalars
 *   tuple_hook          without the codec's Python ext hook.
 *   SCALAR_TYPES,       constants mirrored from _codec/records.py and layout.py (a
 *   RECORD_HEADER,      test compares them); FUTEX: 1 where wait/wake are
 *   FUTEX               the kernel's futex (Linux), else 0 (wait/wake raise).
 *
 * Memory model: every atomic operation is sequentially consistent (a store
 * publishes everything written before it, a load sees everything published
 * before it); record bytes are plain stores that precede the STATE store.
 *
 * Memory safety: a Words object holds a buffer export of the mapping for its
 * whole life (so the mapping cannot be closed under it) until release(), and
 * every index and offset is bounds-checked.
 */
#include "udng.h"
#include <stddef.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#ifdef __linux__
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#define UDNG_FUTEX 1
#else
#define UDNG_FUTEX 0
#endif

#if !defined(__GNUC__) && !defined(__clang__)
#error "ultradict_ng._helper._native needs the GCC/Clang __atomic builtins"
#endif

/* ---- CRC-32 (the zlib / IEEE 802.3 polynomial), slicing by 8 ------------- */

static uint32_t crc_table[8][256];

static void
crc_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

static uint32_t
crc_update(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= crc;
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
              crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
              crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static void
put_u32le(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* The 16-byte record header (layout.py, "Stream record") in front of the
 * `length` payload bytes already stored at rec + 16: le32 length, le32 tag,
 * le32 crc32(payload, crc32(length, tag)), le32 unit (1: a record that is a
 * whole mutation; a transaction's: its offset from the first, shifted). */
static void
put_header(unsigned char *rec, uint32_t length, uint32_t tag, uint32_t unit)
{
    unsigned char header[16];
    put_u32le(header, length);
    put_u32le(header + 4, tag);
    uint32_t crc = crc_update(0, header, 8);
    crc = crc_update(crc, rec + 16, length);
    put_u32le(header + 8, crc);
    put_u32le(header + 12, unit);
    memcpy(rec, header, 16);
}

/* ---- Words ---------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int held;            /* view is a live export */
    uint64_t *words;     /* view.buf as 64-bit words */
    Py_ssize_t nwords;
} WordsObject;

static int
words_usable(WordsObject *self)
{
    if (!self->held) {
        PyObject *mod = PyImport_ImportModule("ultradict_ng.errors");
        PyObject *closed = mod ? PyObject_GetAttrString(mod, "Closed") : NULL;
        Py_XDECREF(mod);
        if (closed) {
            PyErr_SetString(closed, "this handle's shared memory was closed");
            Py_DECREF(closed);
        }
        return 0;
    }
    return 1;
}

static int
word_index(WordsObject *self, PyObject *arg, Py_ssize_t *out)
{
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred())
        return 0;
    if (i < 0 || i >= self->nwords) {
        PyErr_Format(PyExc_IndexError, "word index %zd outside 0..%zd", i, self->nwords - 1);
        return 0;
    }
    *out = i;
    return 1;
}

static int
u64_arg(PyObject *arg, uint64_t *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(arg);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return 0;
    *out = (uint64_t)v;
    return 1;
}

static int
words_init(WordsObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *buf;
    static char *kwlist[] = {"buffer", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:Words", kwlist, &buf))
        return -1;
    if (self->held) {
        PyErr_SetString(PyExc_RuntimeError, "Words is already initialised");
        return -1;
    }
    if (PyObject_GetBuffer(buf, &self->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    self->held = 1;
    if (((uintptr_t)self->view.buf & 7) != 0) {
        PyBuffer_Release(&self->view);
        self->held = 0;
        PyErr_SetString(PyExc_ValueError, "buffer is not 8-byte aligned");
        return -1;
    }
    self->words = (uint64_t *)self->view.buf;
    self->nwords = self->view.len / 8;
    return 0;
}

static void
words_dealloc(WordsObject *self)
{
    if (self->held) {
        PyBuffer_Release(&self->view);
        self->held = 0;
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
words_load(WordsObject *self, PyObject *arg)
{
    Py_ssize_t i;
    if (!words_usable(self) || !word_index(self, arg, &i))
        return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&self->words[i], __ATOMIC_SEQ_CST));
}

static PyObject *
words_store(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i;
    uint64_t v;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "store(index, value)");
        return NULL;
    }
    if (!words_usable(self) || !word_index(self, args[0], &i) || !u64_arg(args[1], &v))
        return NULL;
    __atomic_store_n(&self->words[i], v, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

static PyObject *
words_cas(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i;
    uint64_t expected, desired;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "cas(index, expected, desired)");
        return NULL;
    }
    if (!words_usable(self) || !word_index(self, args[0], &i) || !u64_arg(args[1], &expected) ||
        !u64_arg(args[2], &desired))
        return NULL;
    int ok = __atomic_compare_exchange_n(&self->words[i], &expected, desired, 0,
                                         __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    PyObject *seen = PyLong_FromUnsignedLongLong(expected);
    if (seen == NULL)
        return NULL;
    PyObject *res = PyTuple_Pack(2, ok ? Py_True : Py_False, seen);
    Py_DECREF(seen);
    return res;
}

/* write_record(pos, tag, payload): the record header and payload at byte
 * offset pos of this buffer (the stream), with the checksum of layout.py:
 * crc32(payload, crc32(le32 length, le32 tag)).  Plain stores: the caller
 * publishes them afterwards with a seq_cst store of STATE.  Returns the
 * offset just past the record. */
static PyObject *
words_write_record(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t pos;
    uint64_t tag;
    Py_buffer payload;
    uint64_t unit = 1;
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "write_record(pos, tag, payload[, unit])");
        return NULL;
    }
    if (!words_usable(self))
        return NULL;
    pos = PyLong_AsSsize_t(args[0]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    if (!u64_arg(args[1], &tag))
        return NULL;
    if (nargs == 4 && !u64_arg(args[3], &unit))
        return NULL;
    if (tag > 0xffffffffu || unit > 0xffffffffu) {
        PyErr_SetString(PyExc_OverflowError, "record tag or unit does not fit 32 bits");
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &payload, PyBUF_SIMPLE) < 0)
        return NULL;
    if (payload.len > 0xffffffffLL || pos < 0 || pos > self->view.len ||
        payload.len + 16 > self->view.len - pos) {
        PyBuffer_Release(&payload);
        PyErr_SetString(PyExc_ValueError, "record does not fit the stream at that offset");
        return NULL;
    }
    unsigned char *dst = (unsigned char *)self->view.buf + pos;
    memcpy(dst + 16, payload.buf, (size_t)payload.len);
    put_header(dst, (uint32_t)payload.len, (uint32_t)tag, (uint32_t)unit);
    Py_ssize_t end = pos + 16 + payload.len;
    PyBuffer_Release(&payload);
    return PyLong_FromSsize_t(end);
}


/* ---- write_simple: a scalar record encoded straight into the stream ------ */

/* The msgpack encoding of one scalar, byte for byte what msgpack-python's
 * Packer(use_bin_type=True) produces (tests/test_native.py compares them):
 * None, bool, int within 64 bits, float (as float 64), str (UTF-8), bytes.
 * Returns the encoded size, or -1 if the value is not such a scalar (no
 * exception set: the caller takes the general path).  With dst NULL only
 * measures. */
static Py_ssize_t
mp_scalar(PyObject *o, unsigned char *dst)
{
    PyTypeObject *t = Py_TYPE(o);
    if (o == Py_None) {
        if (dst) dst[0] = 0xc0;
        return 1;
    }
    if (t == &PyBool_Type) {
        if (dst) dst[0] = (o == Py_True) ? 0xc3 : 0xc2;
        return 1;
    }
    if (t == &PyLong_Type) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow == 0 && v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        if (overflow > 0) {
            unsigned long long u = PyLong_AsUnsignedLongLong(o);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                return -1;  /* beyond 64 bits: the codec's big-int ext */
            }
            if (dst) {
                dst[0] = 0xcf;
                for (int i = 0; i < 8; i++) dst[1 + i] = (unsigned char)(u >> (56 - 8 * i));
            }
            return 9;
        }
        if (overflow < 0)
            return -1;
        if (v < -(1LL << 5)) {
            if (v < -(1LL << 15)) {
                if (v < -(1LL << 31)) {
                    if (dst) {
                        dst[0] = 0xd3;
                        for (int i = 0; i < 8; i++) dst[1 + i] = (unsigned char)((unsigned long long)v >> (56 - 8 * i));
                    }
                    return 9;
                }
                if (dst) {
                    dst[0] = 0xd2;
                    for (int i = 0; i < 4; i++) dst[1 + i] = (unsigned char)((unsigned long long)v >> (24 - 8 * i));
                }
                return 5;
            }
            if (v < -(1LL << 7)) {
                if (dst) {
                    dst[0] = 0xd1;
                    dst[1] = (unsigned char)((unsigned long long)v >> 8);
                    dst[2] = (unsigned char)v;
                }
                return 3;
            }
            if (dst) {
                dst[0] = 0xd0;
                dst[1] = (unsigned char)v;
            }
            return 2;
        }
        if (v < (1LL << 7)) {
            if (dst) dst[0] = (unsigned char)v;  /* positive or negative fixint */
            return 1;
        }
        if (v < (1LL << 16)) {
            if (v < (1LL << 8)) {
                if (dst) {
                    dst[0] = 0xcc;
                    dst[1] = (unsigned char)v;
                }
                return 2;
            }
            if (dst) {
                dst[0] = 0xcd;
                dst[1] = (unsigned char)(v >> 8);
                dst[2] = (unsigned char)v;
            }
            return 3;
        }
        if (v < (1LL << 32)) {
            if (dst) {
                dst[0] = 0xce;
                for (int i = 0; i < 4; i++) dst[1 + i] = (unsigned char)(v >> (24 - 8 * i));
            }
            return 5;
        }
        if (dst) {
            dst[0] = 0xcf;
            for (int i = 0; i < 8; i++) dst[1 + i] = (unsigned char)((unsigned long long)v >> (56 - 8 * i));
        }
        return 9;
    }
    if (t == &PyFloat_Type) {
        if (dst) {
            double d = PyFloat_AS_DOUBLE(o);
            uint64_t bits;
            memcpy(&bits, &d, 8);
            dst[0] = 0xcb;
            for (int i = 0; i < 8; i++) dst[1 + i] = (unsigned char)(bits >> (56 - 8 * i));
        }
        return 9;
    }
    const char *data;
    Py_ssize_t n;
    int is_str;
    if (t == &PyUnicode_Type) {
        data = PyUnicode_AsUTF8AndSize(o, &n);
        if (data == NULL) {  /* lone surrogates: the codec reports it */
            PyErr_Clear();
            return -1;
        }
        is_str = 1;
    } else if (t == &PyBytes_Type) {
        data = PyBytes_AS_STRING(o);
        n = PyBytes_GET_SIZE(o);
        is_str = 0;
    } else {
        return -1;
    }
    if ((unsigned long long)n > 0xffffffffULL)
        return -1;
    Py_ssize_t head;
    if (is_str && n < 32) head = 1;
    else if (n < 256) head = 2;
    else if (n < 65536) head = 3;
    else head = 5;
    if (dst) {
        if (head == 1) dst[0] = (unsigned char)(0xa0 | n);
        else if (head == 2) { dst[0] = is_str ? 0xd9 : 0xc4; dst[1] = (unsigned char)n; }
        else if (head == 3) { dst[0] = is_str ? 0xda : 0xc5; dst[1] = (unsigned char)(n >> 8); dst[2] = (unsigned char)n; }
        else {
            dst[0] = is_str ? 0xdb : 0xc6;
            for (int i = 0; i < 4; i++) dst[1 + i] = (unsigned char)((uint64_t)n >> (24 - 8 * i));
        }
        memcpy(dst + head, data, (size_t)n);
    }
    return head + n;
}

/* A tuple of at most 15 scalars (mp_scalar's types; no bytes item of
 * `threshold` bytes or more when threshold > 0: those go to blobs) as the
 * codec encodes it: ext 1 (EXT_TUPLE) whose payload is the msgpack array of
 * the items -- byte for byte msgpack-python's ExtType encoding (fixext for
 * payloads of 1, 2, 4, 8 and 16 bytes, else ext 8/16/32).  Returns the
 * encoded size or -1 (not such a tuple; no exception set).  With dst NULL
 * only measures.  A cache entry (expires, slot, value) is such a tuple. */
static Py_ssize_t mp_tuple_ext(PyObject *o, unsigned char *dst, Py_ssize_t threshold);

static Py_ssize_t
mp_scalar_tuple(PyObject *o, unsigned char *dst, Py_ssize_t threshold)
{
    Py_ssize_t n = PyTuple_GET_SIZE(o);
    if (n > 15)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(o, i);
        if (PyDict_CheckExact(item) || PyList_CheckExact(item))
            return -1;  /* (scalars only: mp_tuple_ext checks and encodes them) */
    }
    return mp_tuple_ext(o, dst, threshold);
}

/* A value of write_simple: a scalar, or a tuple of scalars (above). */
static Py_ssize_t
mp_value(PyObject *o, unsigned char *dst, Py_ssize_t threshold)
{
    if (PyTuple_CheckExact(o))
        return mp_scalar_tuple(o, dst, threshold);
    return mp_scalar(o, dst);
}

/* ---- pack_map, pack_pairs: a big dict of scalar rows packed in one call ------ */

/* A key or value of pack_map/pack_pairs: mp_value's, and no bytes of
 * `threshold` bytes or more when threshold > 0 (those go to blobs). */
static Py_ssize_t
mp_item(PyObject *o, unsigned char *dst, Py_ssize_t threshold)
{
    if (threshold > 0 && PyBytes_CheckExact(o) && PyBytes_GET_SIZE(o) >= threshold)
        return -1;
    return mp_value(o, dst, threshold);
}

/* The codec's bytes of a value mp_item takes (a scalar, or a tuple of at most
 * 15 scalars), as a new bytes object, for table.c's table_changes; NULL with
 * no error set when it is not such a value (the caller's codec encodes it),
 * NULL with an error set on failure. */
PyObject *
udng_pack_value(PyObject *v)
{
    Py_ssize_t n = mp_item(v, NULL, 0);
    if (n < 0)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out != NULL)
        mp_item(v, (unsigned char *)PyBytes_AS_STRING(out), 0);
    return out;
}

/* The header of a msgpack map (base 0x80) or array (base 0x90) of n items:
 * fix, 16 or 32 bits, as msgpack-python writes it.  Its size; -1 if n does
 * not fit 32 bits.  With dst NULL only measures. */
static Py_ssize_t
mp_container_header(Py_ssize_t n, int is_map, unsigned char *dst)
{
    if ((unsigned long long)n > 0xffffffffULL)
        return -1;
    if (n < 16) {
        if (dst) dst[0] = (unsigned char)((is_map ? 0x80 : 0x90) | n);
        return 1;
    }
    if (n < 65536) {
        if (dst) {
            dst[0] = is_map ? 0xde : 0xdc;
            dst[1] = (unsigned char)(n >> 8);
            dst[2] = (unsigned char)n;
        }
        return 3;
    }
    if (dst) {
        dst[0] = is_map ? 0xdf : 0xdd;
        for (int i = 0; i < 4; i++) dst[1 + i] = (unsigned char)((uint64_t)n >> (24 - 8 * i));
    }
    return 5;
}

/* ---- plain values of write_simple: JSON-like trees --------------------------- */

/* A value write_simple takes with `plain` (a dict without nested views):
 * a scalar (mp_scalar's types, no bytes of `threshold` bytes or more when
 * threshold > 0: those go to blobs), or an exact dict (scalar keys) or list
 * of such values, at most UDNG_PLAIN_DEPTH containers deep -- the msgpack
 * map and array msgpack-python writes, which is the codec's encoding of them
 * (no ext type below).  Returns the encoded size, or -1 (not such a value;
 * no exception set).  With dst NULL only measures; no Python code runs, so
 * the two passes see the same tree.  The twin is words.plain_ok. */
#define UDNG_PLAIN_DEPTH 16
static Py_ssize_t
mp_plain(PyObject *o, unsigned char *dst, Py_ssize_t threshold, int depth)
{
    int is_map = PyDict_CheckExact(o);
    if (!is_map && !PyList_CheckExact(o)) {
        if (threshold > 0 && PyBytes_CheckExact(o) && PyBytes_GET_SIZE(o) >= threshold)
            return -1;
        return mp_scalar(o, dst);
    }
    if (depth >= UDNG_PLAIN_DEPTH)
        return -1;
    Py_ssize_t n = is_map ? PyDict_GET_SIZE(o) : PyList_GET_SIZE(o);
    Py_ssize_t total = mp_container_header(n, is_map, dst), m;
    if (total < 0)
        return -1;
    if (is_map) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &pos, &k, &v)) {
            if ((m = mp_scalar(k, dst ? dst + total : NULL)) < 0)
                return -1;
            total += m;
            if ((m = mp_plain(v, dst ? dst + total : NULL, threshold, depth + 1)) < 0)
                return -1;
            total += m;
        }
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            if ((m = mp_plain(PyList_GET_ITEM(o, i), dst ? dst + total : NULL, threshold, depth + 1)) < 0)
                return -1;
            total += m;
        }
    }
    return total;
}

/* A tuple as the codec encodes it: ext 1 (EXT_TUPLE) whose payload is the
 * msgpack array of its items (mp_plain's values) -- byte for byte
 * msgpack-python's ExtType encoding (fixext for payloads of 1, 2, 4, 8 and
 * 16 bytes, else ext 8/16/32).  -1 if an item is not such a value. */
static Py_ssize_t
mp_tuple_ext(PyObject *o, unsigned char *dst, Py_ssize_t threshold)
{
    Py_ssize_t n = PyTuple_GET_SIZE(o);
    Py_ssize_t payload = mp_container_header(n, 0, NULL), m;
    if (payload < 0)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((m = mp_plain(PyTuple_GET_ITEM(o, i), NULL, threshold, 1)) < 0)
            return -1;
        payload += m;
    }
    if ((unsigned long long)payload > 0xffffffffULL)
        return -1;
    Py_ssize_t head;
    if (payload == 1 || payload == 2 || payload == 4 || payload == 8 || payload == 16) head = 2;
    else if (payload < 256) head = 3;
    else if (payload < 65536) head = 4;
    else head = 6;
    if (dst) {
        unsigned char *p = dst;
        if (head == 2) *p++ = payload == 1 ? 0xd4 : payload == 2 ? 0xd5 : payload == 4 ? 0xd6 : payload == 8 ? 0xd7 : 0xd8;
        else if (head == 3) { *p++ = 0xc7; *p++ = (unsigned char)payload; }
        else if (head == 4) { *p++ = 0xc8; *p++ = (unsigned char)(payload >> 8); *p++ = (unsigned char)payload; }
        else {
            *p++ = 0xc9;
            for (int i = 0; i < 4; i++) *p++ = (unsigned char)((uint64_t)payload >> (24 - 8 * i));
        }
        *p++ = 1;  /* EXT_TUPLE */
        p += mp_container_header(n, 0, p);
        for (Py_ssize_t i = 0; i < n; i++)
            p += mp_plain(PyTuple_GET_ITEM(o, i), p, threshold, 1);
    }
    return head + payload;
}

/* A scalar, mp_plain's containers, and at the top a tuple of mp_plain's
 * values (a cache's entry (expires, slot, value): mp_tuple_ext). */
static Py_ssize_t
mp_plain_value(PyObject *o, unsigned char *dst, Py_ssize_t threshold)
{
    if (PyDict_CheckExact(o) || PyList_CheckExact(o))
        return mp_plain(o, dst, threshold, 0);
    if (!PyTuple_CheckExact(o))
        return mp_scalar(o, dst);  /* (as mp_value: a large bytes is the caller's to refuse) */
    return mp_tuple_ext(o, dst, threshold);
}

/* Pairs of a dict (is_map) or of a list of [key, value] lists: the size of
 * their encoding (header included) -- keys scalars (mp_scalar's types),
 * values scalars or tuples of at most 15 scalars -- or -1 if one does not
 * fit.  With dst non-NULL writes them (the caller measured first: no Python
 * code runs between the two passes, so nothing can change in between). */
static Py_ssize_t
mp_pairs(PyObject *c, int is_map, unsigned char *dst, Py_ssize_t threshold)
{
    Py_ssize_t n = is_map ? PyDict_GET_SIZE(c) : PyList_GET_SIZE(c);
    Py_ssize_t total = mp_container_header(n, is_map, dst);
    if (total < 0)
        return -1;
    Py_ssize_t pos = 0, i = 0;
    PyObject *k, *v;
    for (;;) {
        if (is_map) {
            if (!PyDict_Next(c, &pos, &k, &v))
                break;
        } else {
            if (i >= PyList_GET_SIZE(c))
                break;
            PyObject *pair = PyList_GET_ITEM(c, i++);
            if (!PyList_CheckExact(pair) || PyList_GET_SIZE(pair) != 2)
                return -1;
            k = PyList_GET_ITEM(pair, 0);
            v = PyList_GET_ITEM(pair, 1);
            if (dst) dst[total] = 0x92;
            total += 1;
        }
        if (threshold > 0 && PyBytes_CheckExact(k) && PyBytes_GET_SIZE(k) >= threshold)
            return -1;
        Py_ssize_t nk = mp_scalar(k, dst ? dst + total : NULL);
        if (nk < 0)
            return -1;
        total += nk;
        Py_ssize_t nv = mp_item(v, dst ? dst + total : NULL, threshold);
        if (nv < 0)
            return -1;
        total += nv;
    }
    return total;
}

static PyObject *
pack_pairs_common(PyObject *const *args, Py_ssize_t nargs, int is_map, const char *usage)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    Py_ssize_t threshold = PyLong_AsSsize_t(args[1]);
    if (threshold == -1 && PyErr_Occurred())
        return NULL;
    PyObject *c = args[0];
    if (is_map ? !PyDict_CheckExact(c) : !PyList_CheckExact(c))
        Py_RETURN_NONE;
    Py_ssize_t size = mp_pairs(c, is_map, NULL, threshold);
    if (size < 0)
        Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    Py_ssize_t written = mp_pairs(c, is_map, (unsigned char *)PyBytes_AS_STRING(out), threshold);
    if (written != size) {  /* cannot happen: nothing ran between the passes */
        Py_DECREF(out);
        PyErr_SetString(PyExc_RuntimeError, "pack_map: the container changed while packed");
        return NULL;
    }
    return out;
}

/* pack_map(obj, threshold) -> bytes or None: codec.dumps(obj) of a dict
 * whose keys are scalars and values scalars or tuples of at most 15 scalars
 * (none a bytes of threshold bytes or more when threshold > 0), byte for
 * byte; None (declined: the caller takes the general path) for anything else. */
static PyObject *
native_pack_map(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return pack_pairs_common(args, nargs, 1, "pack_map(obj, threshold)");
}

/* pack_pairs(pairs, threshold) -> bytes or None: as pack_map for a list of
 * [key, value] lists (an update record's pairs), packed as an array of
 * 2-item arrays. */
static PyObject *
native_pack_pairs(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return pack_pairs_common(args, nargs, 0, "pack_pairs(pairs, threshold)");
}

/* The record [op, [], key] or [op, [], key, value] (a root-level delete or
 * set; value NULL: a delete) encoded as msgpack into w's buffer at byte
 * offset pos, with its header and checksum: the bytes write_record(pos, tag,
 * codec.dumps(record)) would store.  Returns the offset after it, or -1
 * with nothing written and no exception set when the key or value is not a
 * plain scalar or the record does not fit below `limit` (the stream's LIMIT)
 * and the buffer's end.  Only stores; the caller publishes.  Shared by
 * write_simple and the transaction write path (vb_ass_subscript). */
static Py_ssize_t
simple_record(WordsObject *w, Py_ssize_t pos, uint32_t tag, Py_ssize_t limit, long op,
              PyObject *key, PyObject *value, Py_ssize_t threshold, uint32_t unit, int plain)
{
    Py_ssize_t (*encode)(PyObject *, unsigned char *, Py_ssize_t) = plain ? mp_plain_value : mp_value;
    if (limit > w->view.len)
        limit = w->view.len;
    Py_ssize_t nk = mp_scalar(key, NULL);
    if (nk < 0)
        return -1;
    Py_ssize_t nv = 0;
    if (value != NULL) {
        nv = encode(value, NULL, threshold);
        if (nv < 0)
            return -1;
    }
    Py_ssize_t length = 3 + nk + nv;  /* array header, op fixint, empty path */
    if (pos < 0 || pos > limit || length + 16 > limit - pos)
        return -1;
    unsigned char *dst = (unsigned char *)w->view.buf + pos;
    unsigned char *body = dst + 16;
    body[0] = (unsigned char)(value != NULL ? 0x94 : 0x93);  /* op, path, key[, value] */
    body[1] = (unsigned char)op;
    body[2] = 0x90;
    mp_scalar(key, body + 3);
    if (value != NULL)
        encode(value, body + 3 + nk, threshold);
    put_header(dst, (uint32_t)length, tag, unit);
    return pos + 16 + length;
}

/* write_simple(pos, tag, limit, op, key[, value[, threshold[, unit[, plain]]]])
 * -> end or None: the record of simple_record written into this buffer; None
 * (nothing written) where simple_record gives -1, and the caller takes the
 * general path.  With plain true the value may also be mp_plain_value's (a
 * JSON-like tree): the caller stores a copy of it in its cache. */
static PyObject *
words_write_simple(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 5 || nargs > 9) {
        PyErr_SetString(PyExc_TypeError,
                        "write_simple(pos, tag, limit, op, key[, value[, threshold[, unit[, plain]]]])");
        return NULL;
    }
    if (!words_usable(self))
        return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[0]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    uint64_t tag;
    if (!u64_arg(args[1], &tag))
        return NULL;
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    long op = PyLong_AsLong(args[3]);
    if (op == -1 && PyErr_Occurred())
        return NULL;
    if (tag > 0xffffffffu || op < 0 || op > 127) {
        PyErr_SetString(PyExc_ValueError, "write_simple: tag or op out of range");
        return NULL;
    }
    Py_ssize_t threshold = 0;
    if (nargs >= 7) {
        threshold = PyLong_AsSsize_t(args[6]);
        if (threshold == -1 && PyErr_Occurred())
            return NULL;
    }
    uint64_t unit = 1;
    if (nargs >= 8 && !u64_arg(args[7], &unit))
        return NULL;
    int plain = nargs == 9 ? PyObject_IsTrue(args[8]) : 0;
    if (plain < 0)
        return NULL;
    if (unit > 0xffffffffu) {
        PyErr_SetString(PyExc_OverflowError, "write_simple: unit does not fit 32 bits");
        return NULL;
    }
    Py_ssize_t end = simple_record(self, pos, (uint32_t)tag, limit, op, args[4], nargs >= 6 ? args[5] : NULL,
                                   threshold, (uint32_t)unit, plain);
    if (end < 0)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(end);
}

/* ---- futex on a word's low 32 bits (layout.py: "Waiting and waking") ----- */

/* The futex word of a 64-bit word: its low 32 bits, wherever the byte order
 * puts them.  The kernel compares and sleeps on 32 bits; the 64-bit sequence
 * words only ever grow, so their low halves change with every increment. */
static uint32_t *
futex_word(uint64_t *w)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (uint32_t *)w + 1;
#else
    return (uint32_t *)w;
#endif
}

/* Wake up to n processes sleeping on w; the number woken (0 without futex). */
static long
futex_wake_n(uint64_t *w, int n)
{
#if UDNG_FUTEX
    long r = syscall(SYS_futex, futex_word(w), FUTEX_WAKE, n, NULL, NULL, 0);
    return r < 0 ? 0 : r;
#else
    (void)w; (void)n;
    return 0;
#endif
}

/* add(index, delta) -> the new value (seq_cst fetch-add, wrapping at 2**64). */
static PyObject *
words_add(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i;
    uint64_t d;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add(index, delta)");
        return NULL;
    }
    if (!words_usable(self) || !word_index(self, args[0], &i) || !u64_arg(args[1], &d))
        return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_add_fetch(&self->words[i], d, __ATOMIC_SEQ_CST));
}

/* publish(index, value, watch) -> word watch: a seq_cst store of value, then a
 * seq_cst load of another word.  The writer's half of the no-lost-wake-up
 * rule: a waiter sets its bit in the watched word before it checks the
 * published one, so either the waiter sees the store or this load sees the
 * bit (both sides seq_cst; a plain load could pass the store on ARM). */
static PyObject *
words_publish(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i, j;
    uint64_t v;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "publish(index, value, watch)");
        return NULL;
    }
    if (!words_usable(self) || !word_index(self, args[0], &i) || !u64_arg(args[1], &v) ||
        !word_index(self, args[2], &j))
        return NULL;
    __atomic_store_n(&self->words[i], v, __ATOMIC_SEQ_CST);
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&self->words[j], __ATOMIC_SEQ_CST));
}

/* wait(index, expected, timeout) -> bool: sleep while the low 32 bits of the
 * word equal those of expected, at most timeout seconds (None: no limit).
 * False when the time ran out; True otherwise (woken, the value differed, or
 * a signal: the caller re-checks what it waits for).  The GIL is released
 * while asleep; a signal handler that raises (Ctrl-C) propagates. */
static PyObject *
words_wait(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i;
    uint64_t expected;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "wait(index, expected, timeout)");
        return NULL;
    }
    if (!words_usable(self) || !word_index(self, args[0], &i) || !u64_arg(args[1], &expected))
        return NULL;
#if UDNG_FUTEX
    struct timespec ts, *tsp = NULL;
    if (args[2] != Py_None) {
        double t = PyFloat_AsDouble(args[2]);
        if (t == -1.0 && PyErr_Occurred())
            return NULL;
        if (!(t > 0.0))
            t = 0.0;
        if (t > 1e9)
            t = 1e9;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_nsec = 999999999L;
        tsp = &ts;
    }
    uint32_t *addr = futex_word(&self->words[i]);
    uint32_t val = (uint32_t)(expected & 0xFFFFFFFFu);
    long r;
    int err;
    Py_BEGIN_ALLOW_THREADS
    r = syscall(SYS_futex, addr, FUTEX_WAIT, val, tsp, NULL, 0);
    err = errno;
    Py_END_ALLOW_THREADS
    if (r == 0 || err == EAGAIN)
        Py_RETURN_TRUE;
    if (err == ETIMEDOUT)
        Py_RETURN_FALSE;
    if (err == EINTR) {
        if (PyErr_CheckSignals() < 0)
            return NULL;
        Py_RETURN_TRUE;
    }
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
#else
    PyErr_SetString(PyExc_NotImplementedError, "no futex on this platform");
    return NULL;
#endif
}

/* wake(index, count) -> how many sleepers were woken. */
static PyObject *
words_wake(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wake(index, count)");
        return NULL;
    }
    if (!words_usable(self) || !word_index(self, args[0], &i))
        return NULL;
    long n = PyLong_AsLong(args[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1)
        n = 1;
    if (n > INT_MAX)
        n = INT_MAX;
#if UDNG_FUTEX
    return PyLong_FromLong(futex_wake_n(&self->words[i], (int)n));
#else
    PyErr_SetString(PyExc_NotImplementedError, "no futex on this platform");
    return NULL;
#endif
}

static PyObject *
words_release(WordsObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->held) {
        PyBuffer_Release(&self->view);
        self->held = 0;
        self->words = NULL;
        self->nwords = 0;
    }
    Py_RETURN_NONE;
}

static PyMethodDef words_methods[] = {
    {"load", (PyCFunction)words_load, METH_O, "load(index) -> int: seq_cst load of a word."},
    {"store", (PyCFunction)(void (*)(void))words_store, METH_FASTCALL,
     "store(index, value): seq_cst store of a word."},
    {"cas", (PyCFunction)(void (*)(void))words_cas, METH_FASTCALL,
     "cas(index, expected, desired) -> (swapped, seen): seq_cst compare-and-swap."},
    {"write_record", (PyCFunction)(void (*)(void))words_write_record, METH_FASTCALL,
     "write_record(pos, tag, payload[, unit]) -> end: a stream record at byte offset pos."},
    {"write_simple", (PyCFunction)(void (*)(void))words_write_simple, METH_FASTCALL,
     "write_simple(pos, tag, limit, op, key[, value[, threshold[, unit[, plain]]]]) -> end or None: a root-level "
     "record of a scalar value (plain: or of a JSON-like one)."},
    {"add", (PyCFunction)(void (*)(void))words_add, METH_FASTCALL,
     "add(index, delta) -> new value: seq_cst fetch-add."},
    {"publish", (PyCFunction)(void (*)(void))words_publish, METH_FASTCALL,
     "publish(index, value, watch) -> word watch: seq_cst store, then seq_cst load."},
    {"wait", (PyCFunction)(void (*)(void))words_wait, METH_FASTCALL,
     "wait(index, expected, timeout) -> False on timeout: futex wait on the word's low 32 bits."},
    {"wake", (PyCFunction)(void (*)(void))words_wake, METH_FASTCALL,
     "wake(index, count) -> woken: futex wake on the word's low 32 bits."},
    {"release", (PyCFunction)words_release, METH_NOARGS,
     "release(): drop the buffer export; later operations raise Closed."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WordsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ultradict_ng._helper._native.Words",
    .tp_basicsize = sizeof(WordsObject),
    .tp_dealloc = (destructor)words_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Words(buffer): atomic 64-bit operations on the words of a writable buffer.",
    .tp_methods = words_methods,
    .tp_init = (initproc)words_init,
    .tp_new = PyType_GenericNew,
};


/* ---- ProcessState: the lock's per-process state and its fast paths ------- */

/* Mirrors lock._ProcessState (the pure-Python twin, used with the other
 * implementations): which thread of this process holds the dict's lock and
 * how often (reentrancy), and `mutex`, a threading.Lock that lets only one
 * of our threads compete for the shared word.  enter()/exit() are the
 * common cases of SharedLock.acquire()/release() in one call each; every
 * other case (waiting for another process, timeouts, recovery) stays in
 * Python and manipulates the same attributes. */

typedef struct {
    PyObject_HEAD
    PyObject *mutex;
    unsigned long owner;
    int owned;
    long count;
    PyObject *weakreflist;
} ProcessStateObject;

static PyObject *str_acquire, *str_release;

static PyObject *
ps_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    ProcessStateObject *self = (ProcessStateObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    PyObject *threading = PyImport_ImportModule("threading");
    if (threading == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->mutex = PyObject_CallMethod(threading, "Lock", NULL);
    Py_DECREF(threading);
    if (self->mutex == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
ps_dealloc(ProcessStateObject *self)
{
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    Py_XDECREF(self->mutex);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* (words, index, mine) with words a Words object; returns the word pointer. */
static uint64_t *
ps_word(PyObject *const *args, Py_ssize_t nargs, uint64_t *mine)
{
    if (nargs != 3 || !PyObject_TypeCheck(args[0], &WordsType)) {
        PyErr_SetString(PyExc_TypeError, "expected (words: Words, index, owner word)");
        return NULL;
    }
    WordsObject *w = (WordsObject *)args[0];
    Py_ssize_t i;
    if (!words_usable(w) || !word_index(w, args[1], &i) || !u64_arg(args[2], mine))
        return NULL;
    return &w->words[i];
}

/* enter(words, index, mine) -> bool.  True: the lock is held by the calling
 * thread (reentered, or the word was free and is now ours).  False: the
 * mutex is now held by the calling thread but another process holds the
 * word; the caller waits for it and then sets owner and count. */
static PyObject *
ps_enter(ProcessStateObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t mine;
    uint64_t *word = ps_word(args, nargs, &mine);
    if (word == NULL)
        return NULL;
    unsigned long me = PyThread_get_thread_ident();
    if (self->owned && self->owner == me) {
        self->count++;
        Py_RETURN_TRUE;
    }
    PyObject *mutex = self->mutex;
    Py_INCREF(mutex);
    PyObject *r = PyObject_CallMethodNoArgs(mutex, str_acquire);  /* may wait, may raise */
    Py_DECREF(mutex);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    uint64_t expected = 0;
    if (__atomic_compare_exchange_n(word, &expected, mine, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        self->owner = me;
        self->owned = 1;
        self->count = 1;
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

/* exit(words, index, mine) -> True, False, 2 or None.  None: the calling
 * thread does not hold the lock (nothing changed).  Otherwise one level is
 * released; on the last one the word is swapped from ours to 0 and the
 * mutex released.  False: the word was no longer ours (taken over).
 *
 * After the swap, the word after LOCK (LOCK_WAITERS, layout.py "Waiting and
 * waking") is loaded: if a process has registered a sleeping waiter, the
 * word after that (LOCK_SEQ) is incremented and one sleeper woken.  2: that
 * happened and woke nobody (a waiter about to sleep, or one that died while
 * registered: the caller may check the register).  An uncontended release
 * makes no system call. */
static PyObject *
ps_exit(ProcessStateObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t mine;
    uint64_t *word = ps_word(args, nargs, &mine);
    if (word == NULL)
        return NULL;
    if (!self->owned || self->owner != PyThread_get_thread_ident())
        Py_RETURN_NONE;
    if (--self->count > 0)
        Py_RETURN_TRUE;
    self->owned = 0;
    self->count = 0;
    WordsObject *w = (WordsObject *)args[0];
    int room = (word - w->words) + 3 < w->nwords;
    uint64_t expected = mine;
    int ok = __atomic_compare_exchange_n(word, &expected, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    int woke_nobody = 0;
    if (ok && room && __atomic_load_n(word + 1, __ATOMIC_SEQ_CST) != 0) {
        /* One wake at a time is in flight (LOCK_WAKING, word + 3); LOCK_SEQ
         * moves only with a wake, so that sleepers stay asleep meanwhile. */
        uint64_t idle = 0;
        if (__atomic_compare_exchange_n(word + 3, &idle, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            __atomic_add_fetch(word + 2, 1, __ATOMIC_SEQ_CST);
            /* (Woke nobody: a waiter between registering and sleeping will
             * see LOCK_SEQ moved and claim the wake.) */
            woke_nobody = futex_wake_n(word + 2, 1) == 0;
        }
    }
    PyObject *mutex = self->mutex;
    Py_INCREF(mutex);
    PyObject *r = PyObject_CallMethodNoArgs(mutex, str_release);
    Py_DECREF(mutex);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    if (!ok)
        Py_RETURN_FALSE;
    if (woke_nobody)
        return PyLong_FromLong(2);
    Py_RETURN_TRUE;
}

static PyObject *
ps_get_owner(ProcessStateObject *self, void *closure)
{
    if (!self->owned)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(self->owner);
}

static int
ps_set_owner(ProcessStateObject *self, PyObject *value, void *closure)
{
    if (value == NULL || value == Py_None) {
        self->owned = 0;
        self->owner = 0;
        return 0;
    }
    unsigned long v = PyLong_AsUnsignedLong(value);
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    self->owner = v;
    self->owned = 1;
    return 0;
}

static PyObject *
ps_get_count(ProcessStateObject *self, void *closure)
{
    return PyLong_FromLong(self->count);
}

static int
ps_set_count(ProcessStateObject *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "count cannot be deleted");
        return -1;
    }
    long v = PyLong_AsLong(value);
    if (v == -1 && PyErr_Occurred())
        return -1;
    self->count = v;
    return 0;
}

static PyObject *
ps_get_mutex(ProcessStateObject *self, void *closure)
{
    Py_INCREF(self->mutex);
    return self->mutex;
}

static int
ps_set_mutex(ProcessStateObject *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "mutex cannot be deleted");
        return -1;
    }
    Py_INCREF(value);
    Py_SETREF(self->mutex, value);
    return 0;
}

static PyGetSetDef ps_getset[] = {
    {"owner", (getter)ps_get_owner, (setter)ps_set_owner, "thread ident of the holder, or None", NULL},
    {"count", (getter)ps_get_count, (setter)ps_set_count, "reentrancy depth of the holder", NULL},
    {"mutex", (getter)ps_get_mutex, (setter)ps_set_mutex, "threading.Lock held by the competing thread", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef ps_methods[] = {
    {"enter", (PyCFunction)(void (*)(void))ps_enter, METH_FASTCALL,
     "enter(words, index, mine) -> bool: reenter, or take the mutex and try the word once."},
    {"exit", (PyCFunction)(void (*)(void))ps_exit, METH_FASTCALL,
     "exit(words, index, mine) -> True/False/None: release one level (see the source)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ProcessStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ultradict_ng._helper._native.ProcessState",
    .tp_basicsize = sizeof(ProcessStateObject),
    .tp_dealloc = (destructor)ps_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Per-process state of a dict's lock (see lock._ProcessState).",
    .tp_methods = ps_methods,
    .tp_getset = ps_getset,
    .tp_weaklistoffset = offsetof(ProcessStateObject, weakreflist),
    .tp_new = ps_new,
};


/* ---- StoreBase and ViewBase: the read hit path in C ---------------------- */

/* StoreBase holds what the hit path of a read needs from store.Store: `seen`
 * (the STATE the local cache reflects, a Python int; -1 forces a reload),
 * `data` (the cache, a dict) and a pointer to the STATE word, bound with
 * _bind_state(words, index) to a Words object that keeps the mapping
 * exported.  ViewBase is the base of SharedDict (members `_store`, `_path`);
 * its __getitem__ answers from the cache when the view is the root and
 * STATE == seen -- one 8-byte load, one compare, one dict lookup -- and
 * hands out a value of an immutable type as it is, and a plain mutable one
 * (a list, a dict unless `recurse`, ...) as the caller's own copy
 * (copytree.c); everything else (a changed STATE, a nested view, a missing
 * key, a value holding a blob's placeholder, a closed handle) calls the
 * Python method `_getitem_slow(key)`, the one implementation of the full
 * rules.
 *
 * It also holds `pos` (the stream offset the cache has read or written up
 * to: Reader.pos) and the write path of an open transaction (layout.py,
 * "Transactions"), armed with _tx_fast(...) by the transaction's thread:
 * ViewBase's __setitem__ then writes a root-level scalar set of that thread
 * past the published end itself -- the record encoded into the stream at
 * `pos`, the cache updated, `pos` advanced -- and calls the Python method
 * `_setitem_slow(key, value)` for everything else (another thread, a nested
 * view, a value or key that is not a plain scalar, a large bytes value, an
 * old value that may hold blobs, a record that no longer fits, a closed
 * handle).  No Python code runs between its checks and its stores (scalar
 * keys hash and compare in C), so no other thread of this process sees a
 * half-made write, as the cache mutex guarantees on the Python path.  The
 * pure-Python twins are in twins.py (their transaction writes take the
 * Python path). */

static PyObject *str_evict;  /* "evict": a TableCache's drop of the older half of its clean rows */

typedef struct {
    PyObject_HEAD
    PyObject *seen;
    PyObject *data;
    PyObject *state_words;   /* a Words object, or NULL when unbound */
    Py_ssize_t state_index;
    PyObject *pos;           /* `pos` while the transaction path is not armed (an int) */
    /* The armed transaction write path (tx_thread 0: not armed). */
    unsigned long tx_thread;
    Py_ssize_t tx_pos;       /* `pos` while it is armed (no int made per write) */
    Py_ssize_t tx_start;     /* `pos` when it was armed: the transaction's first record */
    Py_ssize_t tx_last;      /* where the last record it wrote begins (-1: none since armed) */
    PyObject *tx_stream;     /* the stream's Words */
    uint32_t tx_tag;         /* gen & GEN_MASK */
    Py_ssize_t tx_limit;     /* LIMIT when armed (fixed while the lock is held) */
    Py_ssize_t tx_threshold; /* bytes values this long go to blobs (0: never) */
    Py_ssize_t tx_blob_index;/* index of BLOB_NEXT in state_words */
    long tx_op_set;
    char recurse;            /* nested dicts are live views: a dict value is not copied here */
} StoreBaseObject;

/* A big dict's cache (`data` a TableCache) is read where its fields lie, in
 * its compiled base (tablecache.c): `hot` (decoded values), `dead` (the
 * table's keys deleted since), `fresh` and `changed` (while both are empty,
 * every value in `hot` is a row the decoder made -- a scalar or a tuple of
 * scalars -- handed out without looking at its items), `_probe` (its table)
 * and `_limit` (the most clean rows `hot` keeps, -1 none, past which
 * table_miss asks its `evict` first, or 0: none kept). */
#include "tablecache.h"

static int
sb_traverse(StoreBaseObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->seen);
    Py_VISIT(self->data);
    Py_VISIT(self->state_words);
    Py_VISIT(self->pos);
    Py_VISIT(self->tx_stream);
    return 0;
}

static int
sb_clear(StoreBaseObject *self)
{
    Py_CLEAR(self->seen);
    Py_CLEAR(self->data);
    Py_CLEAR(self->state_words);
    Py_CLEAR(self->pos);
    self->tx_thread = 0;
    Py_CLEAR(self->tx_stream);
    return 0;
}

static void
sb_dealloc(StoreBaseObject *self)
{
    PyObject_GC_UnTrack(self);
    sb_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
sb_bind_state(StoreBaseObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_bind_state(words or None, index)");
        return NULL;
    }
    if (args[0] == Py_None) {
        Py_CLEAR(self->state_words);
        Py_RETURN_NONE;
    }
    if (!PyObject_TypeCheck(args[0], &WordsType)) {
        PyErr_SetString(PyExc_TypeError, "_bind_state needs a Words object");
        return NULL;
    }
    Py_ssize_t i;
    if (!words_usable((WordsObject *)args[0]) || !word_index((WordsObject *)args[0], args[1], &i))
        return NULL;
    Py_INCREF(args[0]);
    Py_XSETREF(self->state_words, args[0]);
    self->state_index = i;
    Py_RETURN_NONE;
}

/* Disarm the transaction write path, handing `pos` back to the Python int. */
static int
tx_disarm(StoreBaseObject *self)
{
    if (self->tx_thread != 0) {
        PyObject *pos = PyLong_FromSsize_t(self->tx_pos);
        if (pos == NULL)
            return -1;
        Py_XSETREF(self->pos, pos);
        self->tx_thread = 0;
    }
    Py_CLEAR(self->tx_stream);
    return 0;
}

/* `pos`: one variable for Python and C, held in C while the path is armed. */
static PyObject *
sb_get_pos(StoreBaseObject *self, void *closure)
{
    if (self->tx_thread != 0)
        return PyLong_FromSsize_t(self->tx_pos);
    if (self->pos == NULL) {
        PyErr_SetString(PyExc_AttributeError, "pos");
        return NULL;
    }
    Py_INCREF(self->pos);
    return self->pos;
}

static int
sb_set_pos(StoreBaseObject *self, PyObject *value, void *closure)
{
    if (value == NULL || !PyLong_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "pos must be an int");
        return -1;
    }
    if (self->tx_thread != 0) {
        Py_ssize_t pos = PyLong_AsSsize_t(value);
        if (pos == -1 && PyErr_Occurred())
            return -1;
        self->tx_pos = pos;
    }
    Py_INCREF(value);
    Py_XSETREF(self->pos, value);
    return 0;
}

/* `data`: the cache (a dict, or a big dict's TableCache). */
static PyObject *
sb_get_data(StoreBaseObject *self, void *closure)
{
    if (self->data == NULL) {
        PyErr_SetString(PyExc_AttributeError, "data");
        return NULL;
    }
    Py_INCREF(self->data);
    return self->data;
}

static int
sb_set_data(StoreBaseObject *self, PyObject *value, void *closure)
{
    Py_XINCREF(value);
    Py_XSETREF(self->data, value);
    return 0;
}

static PyGetSetDef sb_getset[] = {
    {"pos", (getter)sb_get_pos, (setter)sb_set_pos, "stream offset the cache reflects (written to, in a transaction)", NULL},
    {"data", (getter)sb_get_data, (setter)sb_set_data, "the local cache", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* _tx_fast(stream, tag, limit, threshold, blob_index, op_set): arm the
 * transaction write path for the calling thread (see above); the state
 * words must be bound.  _tx_fast(None): disarm. */
static PyObject *
sb_tx_fast(StoreBaseObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 1 && args[0] == Py_None) {
        if (tx_disarm(self) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    if (nargs != 6 || !PyObject_TypeCheck(args[0], &WordsType)) {
        PyErr_SetString(PyExc_TypeError, "_tx_fast(stream Words, tag, limit, threshold, blob_index, op_set) "
                                         "or _tx_fast(None)");
        return NULL;
    }
    if (self->state_words == NULL) {
        PyErr_SetString(PyExc_ValueError, "_tx_fast: no state words bound");
        return NULL;
    }
    uint64_t tag;
    Py_ssize_t limit, threshold, blob_index;
    if (!words_usable((WordsObject *)args[0]) || !u64_arg(args[1], &tag) ||
        !word_index((WordsObject *)self->state_words, args[4], &blob_index))
        return NULL;
    limit = PyLong_AsSsize_t(args[2]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    threshold = PyLong_AsSsize_t(args[3]);
    if (threshold == -1 && PyErr_Occurred())
        return NULL;
    long op_set = PyLong_AsLong(args[5]);
    if (op_set == -1 && PyErr_Occurred())
        return NULL;
    if (tag > 0xffffffffu || limit < 0 || threshold < 0 || op_set < 0 || op_set > 127) {
        PyErr_SetString(PyExc_ValueError, "_tx_fast: tag, limit, threshold or op_set out of range");
        return NULL;
    }
    if (tx_disarm(self) < 0)
        return NULL;
    if (self->pos == NULL) {
        PyErr_SetString(PyExc_ValueError, "_tx_fast: pos is not set");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(self->pos);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    self->tx_pos = self->tx_start = pos;
    self->tx_last = -1;
    Py_INCREF(args[0]);
    Py_XSETREF(self->tx_stream, args[0]);
    self->tx_tag = (uint32_t)tag;
    self->tx_limit = limit;
    self->tx_threshold = threshold;
    self->tx_blob_index = blob_index;
    self->tx_op_set = op_set;
    self->tx_thread = PyThread_get_thread_ident();
    Py_RETURN_NONE;
}

static PyMemberDef sb_members[] = {
    {"seen", T_OBJECT_EX, offsetof(StoreBaseObject, seen), 0, "STATE the cache reflects"},
    {"recurse", T_BOOL, offsetof(StoreBaseObject, recurse), 0,
     "nested dicts are live views (a dict value is read as a view, not copied)"},
    {"_tx_last", T_PYSSIZET, offsetof(StoreBaseObject, tx_last), READONLY,
     "offset of the last record the armed transaction path wrote (-1: none)"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef sb_methods[] = {
    {"_bind_state", (PyCFunction)(void (*)(void))sb_bind_state, METH_FASTCALL,
     "_bind_state(words, index): where the read hit path loads STATE (None: nowhere)."},
    {"_tx_fast", (PyCFunction)(void (*)(void))sb_tx_fast, METH_FASTCALL,
     "_tx_fast(stream, tag, limit, threshold, blob_index, op_set): arm the transaction write path "
     "for this thread; _tx_fast(None): disarm."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StoreBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ultradict_ng._helper._native.StoreBase",
    .tp_basicsize = sizeof(StoreBaseObject),
    .tp_dealloc = (destructor)sb_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Base of store.Store: the fields the C read hit path uses.",
    .tp_traverse = (traverseproc)sb_traverse,
    .tp_clear = (inquiry)sb_clear,
    .tp_members = sb_members,
    .tp_methods = sb_methods,
    .tp_getset = sb_getset,
    .tp_new = PyType_GenericNew,
};

typedef struct {
    PyObject_HEAD
    PyObject *store;
    PyObject *path;
} ViewObject;

static PyObject *str_getitem_slow;

static int
vb_traverse(ViewObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->store);
    Py_VISIT(self->path);
    return 0;
}

static int
vb_clear(ViewObject *self)
{
    Py_CLEAR(self->store);
    Py_CLEAR(self->path);
    return 0;
}

static void
vb_dealloc(ViewObject *self)
{
    PyObject_GC_UnTrack(self);
    vb_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The store of `view` when it is a root view whose cache is in sync (one
 * 8-byte load of STATE, a compare), else NULL.
 *
 * view_cached: the cached value of `key` when the store is so (cached_in:
 * given the store synced_root returned): 1 found (*out: a new
 * reference), 0 absent, 2 not answerable here (out of sync, a nested view,
 * a closed handle), 3 a key a big dict's cache has not decoded (*out: a new
 * reference to that cache, in sync when checked), -1 error (an unhashable
 * key: dict's TypeError).  The cache is a dict, or a big dict's TableCache
 * (_shm/tablecache.py), whose `hot` dict holds the current value of every
 * key in it: a hit there is a hit, a miss may be in the table.  cached_in's
 * *row (when not NULL) is set to whether a hit is known to be a decoded row
 * (nothing in `hot` but rows: no fresh or changed key), handed out unchecked. */
static inline StoreBaseObject *
synced_root(ViewObject *self)
{
    PyObject *store = self->store;
    if (store == NULL || !PyObject_TypeCheck(store, &StoreBaseType) || self->path == NULL ||
        !PyTuple_CheckExact(self->path) || PyTuple_GET_SIZE(self->path) != 0)
        return NULL;
    StoreBaseObject *s = (StoreBaseObject *)store;
    WordsObject *w = (WordsObject *)s->state_words;
    if (w == NULL || !w->held || s->seen == NULL || !PyLong_CheckExact(s->seen) || s->data == NULL)
        return NULL;
    unsigned long long seen = PyLong_AsUnsignedLongLong(s->seen);
    if (seen == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();  /* seen == -1: a reload is due */
        return NULL;
    }
    if (__atomic_load_n(&w->words[s->state_index], __ATOMIC_ACQUIRE) != seen)
        return NULL;
    return s;
}

static int
cached_in(StoreBaseObject *s, PyObject *key, PyObject **out, int *row)
{
    if (row != NULL)
        *row = 0;
    /* (The cache is held: a key's own __eq__ may run Python code, and
     * another thread then replace or close the cache.) */
    PyObject *data = s->data;
    int partial = !PyDict_CheckExact(data);
    if (partial) {  /* (its `hot`, read in its compiled base) */
        TableCacheBaseObject *c = udng_as_tablecache(data);
        if (c == NULL || c->hot == NULL || !PyDict_CheckExact(c->hot) || c->dead == NULL)
            return 2;
        data = c->hot;
    }
    Py_INCREF(data);
    PyObject *v = PyDict_GetItemWithError(data, key);  /* borrowed */
    Py_XINCREF(v);
    Py_DECREF(data);
    if (v != NULL) {
        *out = v;
        if (partial && row != NULL) {  /* (a key's __eq__ may have run code: `hot` still the store's?) */
            TableCacheBaseObject *c = udng_as_tablecache(s->data);
            *row = c != NULL && data == c->hot && c->fresh != NULL && PyDict_CheckExact(c->fresh) &&
                   PyDict_GET_SIZE(c->fresh) == 0 && c->changed != NULL && PyAnySet_CheckExact(c->changed) &&
                   PySet_GET_SIZE(c->changed) == 0;
        }
        return 1;
    }
    if (PyErr_Occurred())
        return -1;
    if (partial) {  /* the key may be in the table: the TableCache's own miss path */
        *out = s->data;
        Py_INCREF(*out);
        return 3;
    }
    return 0;
}

static int
view_cached(ViewObject *self, PyObject *key, PyObject **out)
{
    StoreBaseObject *s = synced_root(self);
    return s == NULL ? 2 : cached_in(s, key, out, NULL);
}


/* A first read of a big dict's str key in compiled code, for `cache`, the
 * store's TableCache just found in sync without the key in `hot`: what
 * TableCache._decode does, without its frames and mutex.  1 found (*out: a
 * new reference, kept in `hot`), 0 absent, 2 not decided here (the Python
 * path decides: a key of another type, a value the serializer decodes, a
 * damaged entry, a cache changed meanwhile), -1 error.
 *
 * Why no mutex: the mutex keeps a record applied by another thread between
 * a Python read's probe and its store in `hot` from being undone by the
 * value read before.  Here no other thread runs between the checks and the
 * store, except while decoding allocates (a collection may run finalizers,
 * which may release the GIL); so everything that decides is checked again
 * after the decode: the table still counted (`_probe` the same object:
 * clear() drops it), the key not put in `hot` (a record's value wins) and
 * not deleted (`dead`), and only then stored. */
static int
table_miss(StoreBaseObject *s, PyObject *cache, PyObject *key, PyObject **out)
{
    PyObject *hot, *dead, *fresh, *changed, *probe, *v = NULL;
    Py_ssize_t limit;
    if (!PyUnicode_CheckExact(key) || s->data != cache ||
        !udng_tablecache_state(cache, &hot, &dead, &fresh, &changed, &probe, &limit) || probe == NULL)
        return 2;
    Py_INCREF(hot);
    Py_INCREF(dead);
    Py_INCREF(probe);  /* (held: the check after the decode compares it by identity) */
    int r = 2;
    int gone = PySet_Contains(dead, key);
    if (gone != 0) {
        r = gone < 0 ? -1 : 0;
        goto done;
    }
    if (limit > 0 && PyDict_GET_SIZE(hot) - PyDict_GET_SIZE(fresh) - PySet_GET_SIZE(changed) >= limit) {
        /* (before the probe: evict runs Python code, which may let a record
         * in; the checks after the decode see what it did) */
        PyObject *res = PyObject_CallMethodNoArgs(cache, str_evict);
        if (res == NULL) {
            r = -1;
            goto done;
        }
        Py_DECREF(res);
    }
    r = udng_table_row_simple(probe, key, &v);
    if (r != 1)
        goto done;
    if (((TableCacheBaseObject *)cache)->probe != probe) {  /* (a TableCacheBase: checked above) */
        r = 2;  /* (the table cleared meanwhile: decided in Python) */
        goto done;
    }
    PyObject *set = PyDict_GetItemWithError(hot, key);  /* borrowed */
    if (set != NULL) {
        Py_INCREF(set);
        Py_SETREF(v, set);
        goto done;
    }
    if (PyErr_Occurred() || (gone = PySet_Contains(dead, key)) < 0) {
        r = -1;
        goto done;
    }
    if (gone) {
        r = 0;
        goto done;
    }
    if (limit != 0 && PyDict_SetItem(hot, key, v) < 0)
        r = -1;
done:
    Py_DECREF(probe);
    Py_DECREF(hot);
    Py_DECREF(dead);
    if (r == 1)
        *out = v;
    else
        Py_XDECREF(v);
    return r;
}

static PyObject *
vb_subscript(ViewObject *self, PyObject *key)
{
    PyObject *v;
    StoreBaseObject *s = synced_root(self);
    if (s != NULL && PyDict_CheckExact(s->data)) {
        /* A dict cache (every small dict's), written out: a read is ~20 ns,
         * and each step of the general path below costs a few percent. */
        v = PyDict_GetItemWithError(s->data, key);  /* borrowed (no code runs until returned) */
        if (v != NULL) {
            if (udng_is_immutable(v) || udng_is_immutable_tuple(v)) {
                Py_INCREF(v);
                return v;
            }
            if (!s->recurse || !PyDict_CheckExact(v)) {
                /* The caller's own copy (held: an allocation may collect,
                 * and a finalizer run Python code), else the slow path. */
                Py_INCREF(v);
                PyObject *c = udng_copy_tree(v);
                Py_DECREF(v);
                if (c != NULL || PyErr_Occurred())
                    return c;
            }
        } else if (PyErr_Occurred()) {
            return NULL;  /* an unhashable key: dict's TypeError */
        }
        return PyObject_CallMethodOneArg((PyObject *)self, str_getitem_slow, key);
    }
    int row = 0;
    int r = s == NULL ? 2 : cached_in(s, key, &v, &row);  /* (synced once, above) */
    if (r == 1 && row)
        return v;  /* (a row: a scalar or a tuple of scalars) */
    if (r == 3) {
        /* A first read of a big dict's key: decoded in compiled code when it
         * can be (table_miss), else by TableCache.__getitem__, which probes
         * the table and keeps the value decoded (or raises KeyError) without
         * the frames of the slow path -- which still exports what is not
         * immutable, from `hot` now.  (A cache replaced meanwhile still
         * answers for the state it was in sync with: it is kept mapped while
         * referenced.) */
        PyObject *cache = v;
        r = table_miss(s, cache, key, &v);
        if (r == 2) {
            v = PyObject_GetItem(cache, key);
            r = v == NULL ? -1 : 1;
        } else if (r == 0) {
            PyObject *k = PyTuple_Pack(1, key);  /* (KeyError(key), as dict raises it) */
            if (k != NULL) {
                PyErr_SetObject(PyExc_KeyError, k);
                Py_DECREF(k);
            }
            r = -1;
        }
        Py_DECREF(cache);
    }
    if (r == 1) {
        if (udng_is_immutable(v) || udng_is_immutable_tuple(v))
            return v;
        PyObject *c = s->recurse && PyDict_CheckExact(v) ? NULL : udng_copy_tree(v);
        Py_DECREF(v);
        if (c != NULL || PyErr_Occurred())
            return c;
    } else if (r < 0) {
        return NULL;
    }
    return PyObject_CallMethodOneArg((PyObject *)self, str_getitem_slow, key);
}

/* A scalar type (records.SCALAR_TYPES): a value that holds no blob. */
static int
is_scalar(PyObject *v)
{
    PyTypeObject *t = Py_TYPE(v);
    return v == Py_None || t == &PyBool_Type || t == &PyLong_Type || t == &PyFloat_Type ||
           t == &PyUnicode_Type || t == &PyBytes_Type;
}

/* The armed transaction write path (see StoreBase): 1 written, 0 not taken
 * (nothing changed: the caller takes the Python path), -1 error (nothing
 * changed). */
static int
tx_set(ViewObject *self, PyObject *key, PyObject *value)
{
    PyObject *store = self->store;
    if (store == NULL || !PyObject_TypeCheck(store, &StoreBaseType))
        return 0;
    StoreBaseObject *s = (StoreBaseObject *)store;
    if (s->tx_thread == 0 || s->tx_thread != PyThread_get_thread_ident() || self->path == NULL ||
        !PyTuple_CheckExact(self->path) || PyTuple_GET_SIZE(self->path) != 0)
        return 0;
    WordsObject *w = (WordsObject *)s->state_words, *stream = (WordsObject *)s->tx_stream;
    if (w == NULL || !w->held || stream == NULL || !stream->held || s->data == NULL ||
        !PyDict_CheckExact(s->data))
        return 0;  /* closed: the Python path raises Closed */
    if (!is_scalar(key) || (s->tx_threshold > 0 && PyBytes_CheckExact(value) &&
                            PyBytes_GET_SIZE(value) >= s->tx_threshold))
        return 0;  /* a key the stream's fast form does not take; a value for a blob */
    /* The cache is held from here: comparing the key with a cached key of a
     * class whose __eq__ is Python code may let another thread run, and
     * close or reload this handle. */
    PyObject *data = s->data;
    Py_INCREF(data);
    int done = 0;
    if (__atomic_load_n(&w->words[s->tx_blob_index], __ATOMIC_ACQUIRE) != 1) {
        /* Blobs were made: an old value that may hold one must be dropped
         * with it, which the Python path does. */
        PyObject *old = PyDict_GetItemWithError(data, key);  /* borrowed */
        if (old == NULL && PyErr_Occurred())
            done = -1;
        else if (old != NULL && !is_scalar(old))
            goto out;
    }
    if (done == 0) {
        Py_ssize_t back = s->tx_pos - s->tx_start;  /* the unit word: layout.py, "Stream record" */
        Py_ssize_t end = back >= ((Py_ssize_t)1 << 31)
                             ? -1
                             : simple_record(stream, s->tx_pos, s->tx_tag, s->tx_limit, s->tx_op_set, key,
                                             value, s->tx_threshold, (uint32_t)back << 1, 0);
        if (end < 0)
            goto out;  /* not a scalar value, or no room left: the Python path decides */
        if (PyDict_SetItem(data, key, value) < 0)
            done = -1;  /* the cache is unchanged and pos not moved: the record is not there */
        else {
            s->tx_last = s->tx_pos;
            s->tx_pos = end;
            done = 1;
        }
    }
out:
    Py_DECREF(data);
    return done;
}

static PyObject *str_setitem_slow, *str_delitem_slow, *str_set_root;
/* SharedDict._setitem_slow (set_root_write): when a handle's type has it, a
 * root view's set of a value that cannot be a SharedDict (an immutable
 * scalar, a tuple) is what it does after its checks -- hash(key), then
 * store.set_root(key, value) -- made here without its frame. */
static PyObject *root_setitem_slow;

/* self.<name>(*args[1:]) where the method is a plain function of the class
 * (as _setitem_slow and _delitem_slow are): found through the type's
 * attribute cache and called directly, skipping the instance lookup a
 * method call makes (writes outside transactions pay this call). */
static PyObject *
call_slow(PyObject *name, PyObject *const *args, size_t nargs)
{
    PyObject *func = _PyType_Lookup(Py_TYPE(args[0]), name);  /* borrowed */
    if (func != NULL && PyFunction_Check(func)) {
        Py_INCREF(func);
        PyObject *res = PyObject_Vectorcall(func, args, nargs, NULL);
        Py_DECREF(func);
        return res;
    }
    return PyObject_VectorcallMethod(name, args, nargs | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static int
vb_ass_subscript(ViewObject *self, PyObject *key, PyObject *value)
{
    PyObject *res;
    if (value == NULL) {
        PyObject *args[2] = {(PyObject *)self, key};
        res = call_slow(str_delitem_slow, args, 2);
    } else {
        int r = tx_set(self, key, value);
        if (r != 0)
            return r < 0 ? -1 : 0;
        if (root_setitem_slow != NULL && self->store != NULL && self->path != NULL &&
            PyTuple_CheckExact(self->path) && PyTuple_GET_SIZE(self->path) == 0 &&
            (udng_is_immutable(value) || PyTuple_CheckExact(value)) &&
            _PyType_Lookup(Py_TYPE(self), str_setitem_slow) == root_setitem_slow) {
            if (PyObject_Hash(key) == -1)  /* (unhashable: dict's TypeError, before any lock) */
                return -1;
            PyObject *args[3] = {self->store, key, value};
            res = PyObject_VectorcallMethod(str_set_root, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        } else {
            PyObject *args[3] = {(PyObject *)self, key, value};
            res = call_slow(str_setitem_slow, args, 3);
        }
    }
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

static PyMappingMethods vb_as_mapping = {
    .mp_subscript = (binaryfunc)vb_subscript,
    .mp_ass_subscript = (objobjargproc)vb_ass_subscript,
};

static PyMemberDef vb_members[] = {
    {"_store", T_OBJECT_EX, offsetof(ViewObject, store), 0, "the store (shared by nested views)"},
    {"_path", T_OBJECT_EX, offsetof(ViewObject, path), 0, "keys from the root to this view"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject ViewBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ultradict_ng._helper._native.ViewBase",
    .tp_basicsize = sizeof(ViewObject),
    .tp_dealloc = (destructor)vb_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Base of SharedDict: __getitem__'s hit path, __setitem__'s transaction path (see the source).",
    .tp_traverse = (traverseproc)vb_traverse,
    .tp_clear = (inquiry)vb_clear,
    .tp_as_mapping = &vb_as_mapping,
    .tp_members = vb_members,
    .tp_new = PyType_GenericNew,
};

/* ---- CacheGet: SharedCache.get without a Python frame ------------------- */

/* CacheGet(view, recency, loads, slow, missing) is a SharedCache handle's
 * `get(key, default=None)` (cache_layout.py, "Reading").  When `view`, the
 * cache's SharedDict, answers from its cache (view_cached), an entry
 * (expires, slot, value) whose expires is 0.0 or later than
 * clock_gettime(CLOCK_REALTIME) is a hit: the time is stored at
 * recency[slot] (recency: the side segment's f64 array, held as a buffer
 * export until release(); None without maxsize), and the value returned --
 * as it is when immutable, the caller's own copy when plain (copytree.c),
 * loads(value) when loads is not None (the pickle serializer) and the value
 * is bytes (plain data is stored as itself).  An absent
 * key, an expired entry or a claim (a tuple of 4) is a miss: `default`.
 * Anything else (a view out of sync, a value that is not plain, a slot out of
 * range, an int expiry, a released or closed handle) calls slow(key), the
 * Python rules, which returns the value or `missing`.  hits and misses count
 * this handle's outcomes.  Why compiled: the Python method costs ~0.5 us
 * over the dict's own hit path, most of a hit.  The twin is twins.CacheGet. */
typedef struct {
    PyObject_HEAD
    PyObject *view;
    PyObject *loads;
    PyObject *slow;
    PyObject *missing;
    Py_buffer rec;
    int rec_held;
    Py_ssize_t hits;
    Py_ssize_t misses;
    vectorcallfunc vectorcall;
} CacheGetObject;

static PyObject *cg_call(CacheGetObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static PyObject *
cg_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *view, *recency, *loads, *slow, *missing;
    static char *kwlist[] = {"view", "recency", "loads", "slow", "missing", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO:CacheGet", kwlist, &view, &recency, &loads,
                                     &slow, &missing))
        return NULL;
    if (!PyObject_TypeCheck(view, &ViewBaseType)) {
        PyErr_SetString(PyExc_TypeError, "CacheGet needs a SharedDict (a ViewBase)");
        return NULL;
    }
    if (!PyCallable_Check(slow) || (loads != Py_None && !PyCallable_Check(loads))) {
        PyErr_SetString(PyExc_TypeError, "CacheGet: slow and loads (unless None) must be callable");
        return NULL;
    }
    CacheGetObject *self = (CacheGetObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (recency != Py_None) {
        if (PyObject_GetBuffer(recency, &self->rec, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            Py_DECREF(self);
            return NULL;
        }
        self->rec_held = 1;
        if (((uintptr_t)self->rec.buf & 7) != 0 || self->rec.len % 8 != 0) {
            PyErr_SetString(PyExc_ValueError, "CacheGet: recency must be whole, aligned 8-byte words");
            Py_DECREF(self);
            return NULL;
        }
    }
    Py_INCREF(view);
    self->view = view;
    Py_INCREF(loads);
    self->loads = loads;
    Py_INCREF(slow);
    self->slow = slow;
    Py_INCREF(missing);
    self->missing = missing;
    self->vectorcall = (vectorcallfunc)cg_call;
    return (PyObject *)self;
}

static void
cg_release_buffer(CacheGetObject *self)
{
    if (self->rec_held) {
        self->rec_held = 0;
        PyBuffer_Release(&self->rec);
    }
}

static int
cg_traverse(CacheGetObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->view);
    Py_VISIT(self->loads);
    Py_VISIT(self->slow);
    Py_VISIT(self->missing);
    /* Not rec.obj, the recency memoryview whose buffer we hold: a handle
     * dropped unclosed is a cycle (the handle's get is this object, whose
     * `slow` is the handle's method), and a memoryview the collector clears
     * while we hold its export drops its memory anyway (BufferError, then a
     * crash when the mapping goes).  Unvisited, it counts as referenced from
     * outside: the collector clears us, which releases it, and it is freed
     * by its reference count.  It refers to nothing of ours: no leak. */
    return 0;
}

static int
cg_clear(CacheGetObject *self)
{
    cg_release_buffer(self);
    Py_CLEAR(self->view);
    Py_CLEAR(self->loads);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->missing);
    return 0;
}

static void
cg_dealloc(CacheGetObject *self)
{
    PyObject_GC_UnTrack(self);
    cg_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static double
realtime_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The value of a hit on entry e, or NULL without an error when e is not
 * answerable here (slow decides), or NULL with an error. */
static PyObject *
cg_hit(CacheGetObject *self, PyObject *e, double now, int *miss)
{
    *miss = 0;
    if (!PyTuple_CheckExact(e))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(e);
    if (n != 3 && n != 4)
        return NULL;
    PyObject *exp = PyTuple_GET_ITEM(e, 0);
    if (!PyFloat_CheckExact(exp))
        return NULL;
    double x = PyFloat_AS_DOUBLE(exp);
    if (!(x == 0.0 || x > now) || n == 4) {  /* expired, or a claim: absent */
        *miss = 1;
        return NULL;
    }
    PyObject *value = PyTuple_GET_ITEM(e, 2), *out;
    if (self->loads != Py_None && PyBytes_CheckExact(value)) {
        out = NULL;  /* a pickle: loads runs after the recency store */
    } else if (udng_is_immutable(value) || udng_is_immutable_tuple(value)) {
        Py_INCREF(value);
        out = value;
    } else {
        out = udng_copy_tree(value);
        if (out == NULL)
            return NULL;
    }
    /* The slot: an int below nslots (0 without recency), else no entry of ours. */
    PyObject *slot = PyTuple_GET_ITEM(e, 1);
    Py_ssize_t i = PyLong_CheckExact(slot) ? PyLong_AsSsize_t(slot) : -1;
    if (i == -1 && PyErr_Occurred())
        PyErr_Clear();
    if (i < 0 || i >= (self->rec_held ? self->rec.len / 8 : 1)) {
        Py_XDECREF(out);
        return NULL;
    }
    if (self->rec_held) {
        uint64_t bits;
        memcpy(&bits, &now, 8);
        __atomic_store_n((uint64_t *)self->rec.buf + i, bits, __ATOMIC_RELAXED);
    }
    if (out == NULL) {
        out = PyObject_CallOneArg(self->loads, value);
        if (out == NULL)
            return NULL;
    }
    return out;
}

static PyObject *
cg_call(CacheGetObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        PyErr_SetString(PyExc_TypeError, "get() takes no keyword arguments");
        return NULL;
    }
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "get() takes 1 or 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (self->view == NULL) {
        PyErr_SetString(PyExc_ValueError, "CacheGet: not initialized");
        return NULL;
    }
    PyObject *key = args[0], *dflt = nargs == 2 ? args[1] : Py_None;
    PyObject *e;
    int r = view_cached((ViewObject *)self->view, key, &e);
    if (r < 0)
        return NULL;
    if (r == 3) {  /* (a cache's entries are few: never a big dict's TableCache in practice) */
        Py_DECREF(e);
        r = 2;
    }
    if (r == 0) {
        self->misses++;
        Py_INCREF(dflt);
        return dflt;
    }
    if (r == 1) {
        int miss;
        /* Hold the view (a key's __eq__ above may have run Python code). */
        PyObject *out = cg_hit(self, e, realtime_now(), &miss);
        Py_DECREF(e);
        if (out != NULL) {
            self->hits++;
            return out;
        }
        if (PyErr_Occurred())
            return NULL;
        if (miss) {
            self->misses++;
            Py_INCREF(dflt);
            return dflt;
        }
    }
    PyObject *out = PyObject_CallOneArg(self->slow, key);
    if (out == NULL)
        return NULL;
    if (out == self->missing) {
        Py_DECREF(out);
        self->misses++;
        Py_INCREF(dflt);
        return dflt;
    }
    self->hits++;
    return out;
}

static PyObject *
cg_release(CacheGetObject *self, PyObject *unused)
{
    cg_release_buffer(self);
    Py_RETURN_NONE;
}

static PyMemberDef cg_members[] = {
    {"hits", T_PYSSIZET, offsetof(CacheGetObject, hits), 0, "hits of this handle"},
    {"misses", T_PYSSIZET, offsetof(CacheGetObject, misses), 0, "misses of this handle"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef cg_methods[] = {
    {"release", (PyCFunction)cg_release, METH_NOARGS,
     "release(): give back the recency buffer (before the side segment closes); later hits store no recency."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CacheGetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ultradict_ng._helper._native.CacheGet",
    .tp_basicsize = sizeof(CacheGetObject),
    .tp_dealloc = (destructor)cg_dealloc,
    .tp_vectorcall_offset = offsetof(CacheGetObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "CacheGet(view, recency, loads, slow, missing): SharedCache.get's hit path (see the source).",
    .tp_traverse = (traverseproc)cg_traverse,
    .tp_clear = (inquiry)cg_clear,
    .tp_members = cg_members,
    .tp_methods = cg_methods,
    .tp_new = cg_new,
};

static PyObject *
native_set_root_write(PyObject *module, PyObject *func)
{
    if (!PyFunction_Check(func)) {
        PyErr_SetString(PyExc_TypeError, "set_root_write needs a function");
        return NULL;
    }
    Py_INCREF(func);
    Py_XSETREF(root_setitem_slow, func);
    Py_RETURN_NONE;
}



/* types_within(container, types[, levels]) -> bool: whether every member of
 * a dict (keys and values), list, tuple, set or frozenset has one of the exact
 * `types` (a frozenset of at most 32 types) -- or, within `levels` more
 * levels (default 0), is itself an exact dict, list, tuple, set or frozenset
 * whose members do.  The codec's scan of a whole dict before a dump (a lookup
 * table's rows are tuples of scalars: levels 1, records of pairs 2), and of a
 * decoded dump for foreign Timestamps, at C speed: no Python code runs during
 * the scan, so no container can change under it. */
static int
type_in(PyTypeObject *t, PyTypeObject **allowed, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (allowed[i] == t)
            return 1;
    return 0;
}

static int within(PyObject *c, PyTypeObject **allowed, Py_ssize_t n, int levels);

/* 1 when m is allowed (see above), 0 when not, -1 on error. */
static int
member_within(PyObject *m, PyTypeObject **allowed, Py_ssize_t n, int levels)
{
    if (type_in(Py_TYPE(m), allowed, n))
        return 1;
    if (levels > 0 && (PyDict_CheckExact(m) || PyList_CheckExact(m) || PyTuple_CheckExact(m) ||
                       PyAnySet_CheckExact(m)))
        return within(m, allowed, n, levels - 1);
    return 0;
}

/* 1, 0 or -1 as member_within for every member of c; -2 if c is not a container. */
static int
within(PyObject *c, PyTypeObject **allowed, Py_ssize_t n, int levels)
{
    int r;
    if (PyDict_CheckExact(c)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(c, &pos, &k, &v))
            if ((r = member_within(k, allowed, n, levels)) != 1 || (r = member_within(v, allowed, n, levels)) != 1)
                return r;
        return 1;
    }
    if (PyList_CheckExact(c) || PyTuple_CheckExact(c)) {
        PyObject **items = PySequence_Fast_ITEMS(c);
        Py_ssize_t len = PySequence_Fast_GET_SIZE(c);
        for (Py_ssize_t i = 0; i < len; i++)
            if ((r = member_within(items[i], allowed, n, levels)) != 1)
                return r;
        return 1;
    }
    if (PyAnySet_CheckExact(c)) {
        PyObject *iter = PyObject_GetIter(c), *item;
        if (iter == NULL)
            return -1;
        r = 1;
        while (r == 1 && (item = PyIter_Next(iter)) != NULL) {
            r = member_within(item, allowed, n, levels);
            Py_DECREF(item);
        }
        Py_DECREF(iter);
        return PyErr_Occurred() ? -1 : r;
    }
    return -2;
}

static PyObject *
native_types_within(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 2 && nargs != 3) || !PyFrozenSet_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "types_within(container, frozenset of types[, levels])");
        return NULL;
    }
    long levels = 0;
    if (nargs == 3) {
        levels = PyLong_AsLong(args[2]);
        if (levels == -1 && PyErr_Occurred())
            return NULL;
        if (levels < 0 || levels > 16) {
            PyErr_SetString(PyExc_ValueError, "types_within: levels must be 0..16");
            return NULL;
        }
    }
    PyObject *c = args[0];
    PyTypeObject *allowed[32];
    Py_ssize_t n = 0;
    PyObject *it = PyObject_GetIter(args[1]), *t;
    if (it == NULL)
        return NULL;
    while ((t = PyIter_Next(it)) != NULL) {
        if (!PyType_Check(t) || n == 32) {
            Py_DECREF(t);
            Py_DECREF(it);
            PyErr_SetString(PyExc_TypeError, "types_within: at most 32 types");
            return NULL;
        }
        allowed[n++] = (PyTypeObject *)t;
        Py_DECREF(t);  /* the frozenset keeps it alive */
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    /* The most common member types first: the scan is a linear search. */
    PyTypeObject *common[] = {&PyLong_Type, &PyUnicode_Type, &PyFloat_Type, &PyBytes_Type, &PyBool_Type};
    Py_ssize_t front = 0;
    for (size_t j = 0; j < sizeof(common) / sizeof(common[0]); j++)
        for (Py_ssize_t i = front; i < n; i++)
            if (allowed[i] == common[j]) {
                allowed[i] = allowed[front];
                allowed[front++] = common[j];
                break;
            }
    int r = within(c, allowed, n, (int)levels);
    if (r == -2) {
        PyErr_SetString(PyExc_TypeError, "types_within: container must be a dict, list, tuple, set or frozenset");
        return NULL;
    }
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}



/* The length of the one msgpack object at p[0:n], or -1 if p does not start
 * with a complete, well-formed object.  Ext payloads are opaque.  Every
 * pending item consumes at least one byte, so the loop ends within n bytes
 * whatever the counts claim. */
static Py_ssize_t
mp_skip(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t pos = 0;
    uint64_t pending = 1;
#define NEED(k) do { if ((Py_ssize_t)(k) > n - pos) return -1; } while (0)
#define BE16(q) (((uint64_t)(q)[0] << 8) | (q)[1])
#define BE32(q) (((uint64_t)(q)[0] << 24) | ((uint64_t)(q)[1] << 16) | ((uint64_t)(q)[2] << 8) | (q)[3])
    while (pending) {
        NEED(1);
        unsigned char b = p[pos++];
        uint64_t len;
        pending--;
        if (b <= 0x7f || b >= 0xe0)
            continue;
        if ((b & 0xf0) == 0x80) { pending += 2 * (uint64_t)(b & 0x0f); continue; }
        if ((b & 0xf0) == 0x90) { pending += b & 0x0f; continue; }
        if ((b & 0xe0) == 0xa0) { NEED(b & 0x1f); pos += b & 0x1f; continue; }
        switch (b) {
        case 0xc0: case 0xc2: case 0xc3: continue;
        case 0xc4: case 0xd9: NEED(1); len = p[pos]; pos += 1; break;
        case 0xc5: case 0xda: NEED(2); len = BE16(p + pos); pos += 2; break;
        case 0xc6: case 0xdb: NEED(4); len = BE32(p + pos); pos += 4; break;
        case 0xc7: NEED(2); len = (uint64_t)p[pos] + 1; pos += 1; break;
        case 0xc8: NEED(3); len = BE16(p + pos) + 1; pos += 2; break;
        case 0xc9: NEED(5); len = BE32(p + pos) + 1; pos += 4; break;
        case 0xca: len = 4; break;
        case 0xcb: len = 8; break;
        case 0xcc: case 0xd0: len = 1; break;
        case 0xcd: case 0xd1: len = 2; break;
        case 0xce: case 0xd2: len = 4; break;
        case 0xcf: case 0xd3: len = 8; break;
        case 0xd4: len = 2; break;
        case 0xd5: len = 3; break;
        case 0xd6: len = 5; break;
        case 0xd7: len = 9; break;
        case 0xd8: len = 17; break;
        case 0xdc: NEED(2); pending += BE16(p + pos); pos += 2; continue;
        case 0xdd: NEED(4); pending += BE32(p + pos); pos += 4; continue;
        case 0xde: NEED(2); pending += 2 * BE16(p + pos); pos += 2; continue;
        case 0xdf: NEED(4); pending += 2 * BE32(p + pos); pos += 4; continue;
        default: return -1;  /* 0xc1: never used */
        }
        if (len > (uint64_t)(n - pos))
            return -1;
        pos += (Py_ssize_t)len;
    }
#undef NEED
#undef BE16
#undef BE32
    return pos;
}

/* For table.c. */
Py_ssize_t udng_mp_skip(const unsigned char *p, Py_ssize_t n) { return mp_skip(p, n); }

static PyObject *
native_msgpack_length(PyObject *module, PyObject *arg)
{
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t r = mp_skip((const unsigned char *)b.buf, b.len);
    PyBuffer_Release(&b);
    return PyLong_FromSsize_t(r);
}

/* parse_records(chunk, tag, base[, one_msgpack]) -> list of payloads, or a str saying what
 * is wrong: the validation of a reader's copied stream bytes (layout.py,
 * reader step 4) -- every header complete, every payload within the chunk,
 * every generation tag == tag, every crc right and, with one_msgpack,
 * every payload exactly one msgpack object -- in one call.  `base` is
 * the stream offset of chunk[0], for the messages, which are the ones of
 * Store._parse. */
static uint32_t
get_u32le(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static PyObject *
native_parse_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 3 && nargs != 4) || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "parse_records(chunk: bytes, tag, base[, one_msgpack])");
        return NULL;
    }
    int one_msgpack = nargs == 4 ? PyObject_IsTrue(args[3]) : 0;
    if (one_msgpack < 0)
        return NULL;
    uint64_t tag;
    if (!u64_arg(args[1], &tag))
        return NULL;
    Py_ssize_t base = PyLong_AsSsize_t(args[2]);
    if (base == -1 && PyErr_Occurred())
        return NULL;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]), pos = 0;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    while (pos < n) {
        const char *problem = NULL;
        if (n - pos < 16) {
            Py_DECREF(out);
            return PyUnicode_FromFormat("truncated record header at stream offset %zd", base + pos);
        }
        uint32_t length = get_u32le(p + pos), rtag = get_u32le(p + pos + 4), crc = get_u32le(p + pos + 8);
        Py_ssize_t start = pos + 16;
        if ((Py_ssize_t)length > n - start)
            problem = "overruns the published end";
        else if (rtag != (uint32_t)tag)
            problem = "belongs to another generation";
        else if (crc_update(crc_update(0, p + pos, 8), p + start, length) != crc)
            problem = "fails its checksum";
        else if (one_msgpack && mp_skip(p + start, (Py_ssize_t)length) != (Py_ssize_t)length)
            problem = "is not exactly one msgpack object";
        if (problem != NULL) {
            Py_DECREF(out);
            return PyUnicode_FromFormat("record at stream offset %zd %s", base + pos, problem);
        }
        PyObject *body = PyBytes_FromStringAndSize((const char *)p + start, length);
        if (body == NULL || PyList_Append(out, body) < 0) {
            Py_XDECREF(body);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(body);
        pos = start + length;
    }
    return out;
}


/* scan_stream(buffer, tag) -> (end, units, stopped): recovery's scan of a
 * stream file (_disk/layout.py, "Opening and recovery", step 4c) -- the
 * records from offset 0 carrying `tag`, each within the buffer, with a
 * right crc and a unit word matching its offset in its unit -- and where
 * the last whole unit ends, how many whole units precede it, and why the
 * scan stopped ("" at the buffer's end; the reasons are _helper/streamscan.py's,
 * word for word).  Why compiled: the twin's loop costs ~1.5 us a record, two
 * seconds for a full 64 MiB stream, a third of a recovery.  Each header is
 * read once into locals, so bytes changing under the scan cannot make it
 * read outside the buffer; the GIL is released (no Python object is touched
 * and the buffer export keeps the mapping alive). */
static PyObject *
native_scan_stream(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scan_stream(buffer, tag)");
        return NULL;
    }
    uint64_t tag;
    if (!u64_arg(args[1], &tag))
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = (const unsigned char *)b.buf;
    Py_ssize_t size = b.len, pos = 0, start = 0, end = 0, units = 0;
    const char *stopped = NULL;
    Py_BEGIN_ALLOW_THREADS
    while (size - pos >= 16) {
        uint32_t length = get_u32le(p + pos), rtag = get_u32le(p + pos + 4);
        uint32_t crc = get_u32le(p + pos + 8), unit = get_u32le(p + pos + 12);
        if (!(length | rtag | crc | unit)) {
            stopped = "zeros";
            break;
        }
        if ((uint64_t)rtag != tag) {
            stopped = "a record of another generation";
            break;
        }
        if ((Py_ssize_t)length > size - pos - 16) {
            stopped = "a record running past the file";
            break;
        }
        Py_ssize_t body = pos + 16;
        if (crc_update(crc_update(0, p + pos, 8), p + body, length) != crc) {
            stopped = "a record failing its checksum";
            break;
        }
        if ((uint64_t)(unit >> 1) != (uint64_t)(pos - start)) {  /* UNIT_BACK_SHIFT */
            stopped = "a record not of the unit before it";
            break;
        }
        pos = body + (Py_ssize_t)length;
        if (unit & 1) {  /* UNIT_LAST */
            end = start = pos;
            units++;
        }
    }
    if (stopped == NULL && pos < size)
        stopped = "the file's end";
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (stopped == NULL && start != pos)
        stopped = "a transaction's records without its last";
    return Py_BuildValue("nns", end, units, stopped == NULL ? "" : stopped);
}

/* contains_type(obj, type, max_depth) -> bool: whether an object of exactly
 * `type` is anywhere inside obj (lists, tuples, sets, frozensets, dict keys
 * and values), or a container nests deeper than max_depth (treated as found:
 * decoded data of ours never nests that deep).  The codec's check that decoded data
 * holds no msgpack Timestamp, as one C walk. */
static int
contains_type_rec(PyObject *o, PyTypeObject *t, int depth)
{
    if (Py_TYPE(o) == t)
        return 1;
    if (depth < 0 && (PyList_CheckExact(o) || PyTuple_CheckExact(o) || PyDict_CheckExact(o) ||
                      PyAnySet_CheckExact(o)))
        return 1;  /* a container deeper than max_depth */
    if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
        PyObject **items = PySequence_Fast_ITEMS(o);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyTypeObject *it = Py_TYPE(items[i]);
            if (it != t && (it == &PyLong_Type || it == &PyUnicode_Type || it == &PyFloat_Type ||
                            it == &PyBytes_Type))
                continue;  /* the common scalars: no call */
            int r = contains_type_rec(items[i], t, depth - 1);
            if (r)
                return r;
        }
        return 0;
    }
    if (PyDict_CheckExact(o)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &pos, &k, &v)) {
            int r = contains_type_rec(k, t, depth - 1);
            if (!r)
                r = contains_type_rec(v, t, depth - 1);
            if (r)
                return r;
        }
        return 0;
    }
    if (PyAnySet_CheckExact(o)) {
        PyObject *iter = PyObject_GetIter(o), *item;
        if (iter == NULL)
            return -1;
        int r = 0;
        while (!r && (item = PyIter_Next(iter)) != NULL) {
            r = contains_type_rec(item, t, depth - 1);
            Py_DECREF(item);
        }
        Py_DECREF(iter);
        if (r == 0 && PyErr_Occurred())
            return -1;
        return r;
    }
    return 0;
}

static PyObject *
native_contains_type(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "contains_type(obj, type, max_depth)");
        return NULL;
    }
    long depth = PyLong_AsLong(args[2]);
    if (depth == -1 && PyErr_Occurred())
        return NULL;
    int r = contains_type_rec(args[0], (PyTypeObject *)args[1], (int)depth);
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}

/* apply_sets(data, records, start, op_set, key_types) -> index.  Applies
 * records[start:] to the dict `data` while each is a root-level set of a
 * scalar key -- a list [op_set, [], key, value] with type(key) in key_types
 * (a frozenset) -- and returns the index of the first record it did not
 * apply (len(records) when all were).  Store._refresh's inline case of
 * _apply, one C loop for a replayed stream. */
static PyObject *
native_apply_sets(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(args[1]) ||
        !PyFrozenSet_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError, "apply_sets(data: dict, records: list, start, op_set, key_types)");
        return NULL;
    }
    PyObject *data = args[0], *records = args[1], *key_types = args[4];
    Py_ssize_t i = PyLong_AsSsize_t(args[2]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    long op_set = PyLong_AsLong(args[3]);
    if (op_set == -1 && PyErr_Occurred())
        return NULL;
    for (; i >= 0 && i < PyList_GET_SIZE(records); i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        if (!PyList_CheckExact(rec) || PyList_GET_SIZE(rec) != 4)
            break;
        PyObject *op = PyList_GET_ITEM(rec, 0), *path = PyList_GET_ITEM(rec, 1);
        int overflow = 0;
        if (!PyLong_CheckExact(op) || PyLong_AsLongAndOverflow(op, &overflow) != op_set || overflow ||
            !PyList_CheckExact(path) || PyList_GET_SIZE(path) != 0)
            break;
        PyObject *key = PyList_GET_ITEM(rec, 2);
        int ok = PySet_Contains(key_types, (PyObject *)Py_TYPE(key));
        if (ok < 0)
            return NULL;
        if (!ok)
            break;
        if (PyDict_SetItem(data, key, PyList_GET_ITEM(rec, 3)) < 0)
            return NULL;
    }
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromSsize_t(i);
}

/* apply_simple(data, payloads, start, op_set) -> index.  Applies the record
 * payloads[start:] to the dict `data` while each is a root-level set of a
 * scalar key to a scalar or a tuple of scalars, as msgpack wrote it --
 * exactly fixarray 4, positive fixint op_set, fixarray 0, the key, the value
 * -- and returns the index of the first payload it did not apply (the
 * caller decodes the rest; nothing is applied twice).  The key and value
 * decode as the codec decodes them (unpack.c's udng_simple_value: msgpack's
 * own result, or a decline).  Why: the reader's replay of a long stream into
 * a dict cache decoded every record to a list through msgpack's Unpacker and
 * its ext hook (~1-2 us a record) before apply_sets stored it; here one pass
 * decodes the key and value only (a recovery's million records: seconds). */

static PyObject *
native_apply_simple(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "apply_simple(data: dict, payloads: list, start, op_set)");
        return NULL;
    }
    PyObject *data = args[0], *payloads = args[1];
    Py_ssize_t i = PyLong_AsSsize_t(args[2]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    long op_set = PyLong_AsLong(args[3]);
    if (op_set == -1 && PyErr_Occurred())
        return NULL;
    if (op_set < 0 || op_set > 0x7f)  /* (not a positive fixint: nothing is of this form) */
        return PyLong_FromSsize_t(i);
    for (; i >= 0 && i < PyList_GET_SIZE(payloads); i++) {
        PyObject *b = PyList_GET_ITEM(payloads, i);
        if (!PyBytes_CheckExact(b))
            break;
        const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(b);
        Py_ssize_t n = PyBytes_GET_SIZE(b);
        if (n < 5 || p[0] != 0x94 || p[1] != (unsigned char)op_set || p[2] != 0x90)
            break;
        Py_ssize_t kl = mp_skip(p + 3, n - 3);
        if (kl <= 0 || kl >= n - 3)
            break;
        PyObject *key = udng_simple_value(p + 3, kl);
        if (key == NULL)
            break;
        if (PyTuple_CheckExact(key)) {  /* (a key is a scalar: apply_sets' rule) */
            Py_DECREF(key);
            break;
        }
        PyObject *value = udng_simple_value(p + 3 + kl, n - 3 - kl);
        if (value == NULL) {
            Py_DECREF(key);
            break;
        }
        int r = PyDict_SetItem(data, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (r < 0)
            return NULL;
    }
    return PyLong_FromSsize_t(i);
}

static PyObject *
native_crc32(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer data;
    uint64_t start = 0;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32(data, value=0)");
        return NULL;
    }
    if (nargs == 2 && !u64_arg(args[1], &start))
        return NULL;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc = crc_update((uint32_t)start, (const unsigned char *)data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

/* zlib's CRC-32, for table.c. */
uint32_t udng_crc32(uint32_t crc, const unsigned char *p, size_t n) { return crc_update(crc, p, n); }

static PyMethodDef native_methods[] = {
    {"contains_type", (PyCFunction)(void (*)(void))native_contains_type, METH_FASTCALL,
     "contains_type(obj, type, max_depth) -> bool: an object of exactly type anywhere inside obj."},
    {"apply_sets", (PyCFunction)(void (*)(void))native_apply_sets, METH_FASTCALL,
     "apply_sets(data, records, start, op_set, key_types) -> index of the first record not applied."},
    {"apply_simple", (PyCFunction)(void (*)(void))native_apply_simple, METH_FASTCALL,
     "apply_simple(data, payloads, start, op_set) -> index of the first payload not applied."},
    {"parse_records", (PyCFunction)(void (*)(void))native_parse_records, METH_FASTCALL,
     "parse_records(chunk, tag, base[, one_msgpack]) -> [payload, ...] or an error message (str)."},
    {"scan_stream", (PyCFunction)(void (*)(void))native_scan_stream, METH_FASTCALL,
     "scan_stream(buffer, tag) -> (end of the last whole unit, whole units, why the scan stopped)."},
    {"msgpack_length", (PyCFunction)native_msgpack_length, METH_O,
     "msgpack_length(data) -> length of the one msgpack object data starts with, or -1."},
    {"pack_map", (PyCFunction)(void (*)(void))native_pack_map, METH_FASTCALL,
     "pack_map(obj, threshold) -> the codec's msgpack bytes of a dict of scalar keys and scalar or "
     "scalar-tuple values, or None (declined)."},
    {"pack_pairs", (PyCFunction)(void (*)(void))native_pack_pairs, METH_FASTCALL,
     "pack_pairs(pairs, threshold) -> the codec's msgpack bytes of a list of [key, value] lists "
     "(pack_map's keys and values), or None (declined)."},
    {"types_within", (PyCFunction)(void (*)(void))native_types_within, METH_FASTCALL,
     "types_within(container, types[, levels]) -> bool: every member (dict: keys and values) of an exact "
     "type in types, or within levels more levels a container whose members are."},
    {"first_to_export", (PyCFunction)udng_native_first_to_export, METH_O,
     "first_to_export(pairs) -> index of the first (key, value) whose value is not handed out as it is."},
    {"copy_plain", (PyCFunction)udng_native_copy_plain, METH_O,
     "copy_plain(value) -> the caller's own copy of a plain value (codec.copy_value's), or None."},
    {"set_root_write", (PyCFunction)native_set_root_write, METH_O,
     "set_root_write(func): SharedDict._setitem_slow, whose root set of an immutable value ViewBase makes itself."},
    {"set_immutable_types", (PyCFunction)udng_native_set_immutable_types, METH_O,
     "set_immutable_types(frozenset): value types ViewBase returns without copying."},
    {"crc32", (PyCFunction)(void (*)(void))native_crc32, METH_FASTCALL,
     "crc32(data, value=0): the same result as zlib.crc32 (used to test write_record)."},
    {"key_hash_common", (PyCFunction)udng_native_key_hash_common, METH_O,
     "key_hash_common(key) -> _codec.keyhash.key_hash(key) for str, bytes, int, bool, float, None; else None."},
    {"table_get", (PyCFunction)(void (*)(void))udng_native_table_get, METH_FASTCALL,
     "table_get(buf, slots, start, end, key[, offset]) -> value bytes, None, or a damage message (str); "
     "with offset true, the checked entry's offset (0: absent) instead of its value."},
    {"table_candidates", (PyCFunction)(void (*)(void))udng_native_table_candidates, METH_FASTCALL,
     "table_candidates(buf, slots, start, end, h) -> [(key bytes, value bytes), ...] or a damage message."},
    {"table_fill", (PyCFunction)(void (*)(void))udng_native_table_fill, METH_FASTCALL,
     "table_fill(buf, off, packed_map, hashes) -> offset after the entries written from the map's pairs."},
    {"table_merge", (PyCFunction)(void (*)(void))udng_native_table_merge, METH_FASTCALL,
     "table_merge(dst, off, src, start, end, changes) -> offset after an old table's entries merged with "
     "the (offset, new value or None) changes; or the reason a changed entry is damaged."},
    {"table_changes", (PyCFunction)(void (*)(void))udng_native_table_changes, METH_FASTCALL,
     "table_changes(buf, slots, start, end, dead, changed, hot) -> (changes, rest_dead, rest_changed): "
     "a merge's (offset, new value bytes or None) for the keys the compiled probe and packer decide."},
    {"table_index", (PyCFunction)(void (*)(void))udng_native_table_index, METH_FASTCALL,
     "table_index(buf, slots, start, end, count): write the index of the entries start..end."},
    {"table_chunk", (PyCFunction)(void (*)(void))udng_native_table_chunk, METH_FASTCALL,
     "table_chunk(buf, start, end, off, most) -> (msgpack map of up to most entries from off, next offset)."},
    {"table_rows", (PyCFunction)(void (*)(void))udng_native_table_rows, METH_FASTCALL,
     "table_rows(buf, start, end, off, out, skip=None, subst=None) -> offset where it stopped decoding "
     "rows into out (a dict, or a list of pairs), skip's keys left out, subst's values taken."},
    {"unpack_simple", (PyCFunction)(void (*)(void))udng_native_unpack_simple, METH_FASTCALL,
     "unpack_simple(data, default) -> the scalar or tuple of scalars data encodes, else default."},
    {"tuple_hook", (PyCFunction)(void (*)(void))udng_native_tuple_hook, METH_FASTCALL,
     "tuple_hook(fallback, code, data) -> a tuple of scalars for ext 1, else fallback(code, data)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "ultradict_ng._helper._native",
    "The optional compiled helper (see speedups.py and _native.pyi).", -1, native_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    crc_init();
    str_acquire = PyUnicode_InternFromString("acquire");
    str_release = PyUnicode_InternFromString("release");
    if (str_acquire == NULL || str_release == NULL)
        return NULL;
    str_getitem_slow = PyUnicode_InternFromString("_getitem_slow");
    str_evict = PyUnicode_InternFromString("evict");
    if (str_evict == NULL)
        return NULL;
    str_setitem_slow = PyUnicode_InternFromString("_setitem_slow");
    str_delitem_slow = PyUnicode_InternFromString("_delitem_slow");
    str_set_root = PyUnicode_InternFromString("set_root");
    if (str_set_root == NULL)
        return NULL;
    if (str_getitem_slow == NULL || str_setitem_slow == NULL || str_delitem_slow == NULL)
        return NULL;
    if (PyType_Ready(&WordsType) < 0 || PyType_Ready(&ProcessStateType) < 0 ||
        PyType_Ready(&StoreBaseType) < 0 || PyType_Ready(&ViewBaseType) < 0 ||
        PyType_Ready(&CacheGetType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL)
        return NULL;
    struct { const char *name; PyTypeObject *type; } types[] = {
        {"Words", &WordsType}, {"ProcessState", &ProcessStateType},
        {"StoreBase", &StoreBaseType}, {"ViewBase", &ViewBaseType}, {"CacheGet", &CacheGetType},
    };
    if (udng_tablecache_add(m) < 0) {  /* (tablecache.c) */
        Py_DECREF(m);
        return NULL;
    }
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        Py_INCREF(types[i].type);
        if (PyModule_AddObject(m, types[i].name, (PyObject *)types[i].type) < 0) {
            Py_DECREF(types[i].type);
            Py_DECREF(m);
            return NULL;
        }
    }
    /* Constants this file mirrors from _codec/records.py / layout.py (a test compares). */
    PyObject *scalars = PyTuple_Pack(6, (PyObject *)Py_TYPE(Py_None), (PyObject *)&PyBool_Type,
                                     (PyObject *)&PyLong_Type, (PyObject *)&PyFloat_Type,
                                     (PyObject *)&PyUnicode_Type, (PyObject *)&PyBytes_Type);
    if (scalars == NULL || PyModule_AddObject(m, "SCALAR_TYPES", scalars) < 0 ||
        PyModule_AddIntConstant(m, "RECORD_HEADER", 16) < 0 ||
        PyModule_AddIntConstant(m, "FUTEX", UDNG_FUTEX) < 0) {
        Py_XDECREF(scalars);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
