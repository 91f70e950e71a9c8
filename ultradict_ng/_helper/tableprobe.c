/*
 * The probe of a shared table (table_layout.py, "Probe"), compiled: the part
 * of a lookup in a big dict that is neither hashing (keyhash.c) nor decoding
 * the value (the serializer).  The twin is tableprobe.py.
 *
 *   table_get(buf, slots, start, end, key)   key: exactly str or bytes.
 *       Hashes the key, probes, and compares the entry's key *bytes* with the
 *       key's msgpack encoding (str: fixstr/str8/16/32 of its UTF-8; bytes:
 *       bin8/16/32), which is exact: a str equals only a str, and the codec
 *       always writes the shortest form.  Returns the value's bytes (a copy:
 *       large buffers and arrays live in blobs, so values are small), None
 *       when absent, or a str saying what is damaged (the caller raises
 *       CorruptSegment).  A str with lone surrogates: None (it cannot be a key).
 *   table_candidates(buf, slots, start, end, h[, offsets])
 *       For every other key: the (key bytes, value bytes) of each entry on
 *       h's probe chain whose full hash is h (almost always zero or one), for
 *       the caller to decode and compare with ==; or a str as above.  With
 *       offsets true, (offset, key bytes, value bytes): Table.find's probe.
 *   table_changes(buf, slots, start, end, dead, changed, hot)
 *       The changes a merge makes (dumps.py): (offset, None) for each key of
 *       the set `dead`, (offset, encoded hot[key]) for each of the set
 *       `changed`, for the exact str and int keys the probe decides and the
 *       values udng_pack_value encodes; the rest in two lists for the
 *       caller.  Returns (changes, rest_dead, rest_changed).
 *   udng_table_row_simple(probe, key, &out)   (C only)
 *       The first read of a big dict's key in compiled code: the probe of
 *       table_get, then the value decoded straight from the mapped entry when
 *       it is a scalar or a tuple of scalars (no bytes copy, no call).
 *   udng_table_locate_begin / _touch / _end(probe, key)   (C only)
 *       Whether the table holds a str or int key: the placing of the keys
 *       a big dict's cache took unplaced (tablecache.c), in three steps so
 *       that the probes of a batch of keys overlap their cache misses.
 *   They raise ValueError on input that does not fit (a malformed map, a
 *   count that disagrees, a buffer too small) before writing past anything.
 *
 * Every entry handed out has been checked as Table.entry checks it (aligned,
 * inside the entries, its zero word zero, its crc); the probe gives up with
 * an error after ``slots`` slots (an index without an empty slot is damaged).
 */
#include "udng.h"
#include <string.h>

/* Parse (buf, slots, start, end) and check them against the buffer. */
int
udng_table_view_args(PyObject *const *args, Py_buffer *pb, table_view *t)
{
    unsigned long long slots = PyLong_AsUnsignedLongLong(args[1]);
    unsigned long long start = PyLong_AsUnsignedLongLong(args[2]);
    unsigned long long end = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred())
        return -1;
    if (PyObject_GetBuffer(args[0], pb, PyBUF_SIMPLE) < 0)
        return -1;
    if (slots < 8 || (slots & (slots - 1)) || start != UDNG_TABLE_HEADER + 8 * slots || start > end ||
        end > (unsigned long long)pb->len) {
        PyBuffer_Release(pb);
        PyErr_SetString(PyExc_ValueError, "table bounds do not fit the buffer");
        return -1;
    }
    t->b = (const unsigned char *)pb->buf;
    t->slots = slots;
    t->start = start;
    t->end = end;
    t->len = pb->len;
    return 0;
}

/* The entry at off within the entries, its reserved word zero: NULL (lengths
 * set), else the reason.  Its crc is udng_table_entry_crc's. */
const char *
udng_table_entry_bounds(const table_view *t, uint64_t off, uint32_t *kl, uint32_t *vl)
{
    if ((off & 7) || off < t->start || off + UDNG_TABLE_ENTRY_HEADER > t->end)
        return "table entry offset outside the entries";
    const unsigned char *e = t->b + off;
    *kl = udng_rd32le(e + 8);
    *vl = udng_rd32le(e + 12);
    if (udng_rd32le(e + 20) != 0)
        return "table entry has a nonzero reserved word";
    if (off + UDNG_TABLE_ENTRY_HEADER + (uint64_t)*kl + *vl > t->end)
        return "table entry runs past the entries";
    return NULL;
}

/* The crc of the entry at off (within bounds: udng_table_entry_bounds): NULL when right, else the reason. */
const char *
udng_table_entry_crc(const table_view *t, uint64_t off, uint32_t kl, uint32_t vl)
{
    const unsigned char *e = t->b + off;
    uint32_t crc = udng_crc32(udng_crc32(0, e, 16), e + UDNG_TABLE_ENTRY_HEADER, (size_t)kl + vl);
    return crc != udng_rd32le(e + 16) ? "table entry fails its checksum" : NULL;
}

/* Check the entry at off; NULL when sound (lengths set), else the reason. */
const char *
udng_table_check_entry(const table_view *t, uint64_t off, uint32_t *kl, uint32_t *vl)
{
    const char *bad = udng_table_entry_bounds(t, off, kl, vl);
    return bad != NULL ? bad : udng_table_entry_crc(t, off, *kl, *vl);
}

/* The msgpack header of a str (is_str) or bytes payload of n bytes. */
static size_t
msgpack_head(int is_str, size_t n, unsigned char out[5])
{
    if (is_str && n < 32) {
        out[0] = (unsigned char)(0xa0 | n);
        return 1;
    }
    if (n < 256) {
        out[0] = is_str ? 0xd9 : 0xc4;
        out[1] = (unsigned char)n;
        return 2;
    }
    if (n < 65536) {
        out[0] = is_str ? 0xda : 0xc5;
        out[1] = (unsigned char)(n >> 8);
        out[2] = (unsigned char)n;
        return 3;
    }
    out[0] = is_str ? 0xdb : 0xc6;
    out[1] = (unsigned char)(n >> 24);
    out[2] = (unsigned char)(n >> 16);
    out[3] = (unsigned char)(n >> 8);
    out[4] = (unsigned char)n;
    return 5;
}

/* The str or bytes key's bytes (*data, *n), its msgpack header (head, *hl)
 * and hash (*h): 1; 0 a str that cannot be a key (lone surrogates); -1 error. */
static int
exact_key(PyObject *key, const char **data, Py_ssize_t *n, unsigned char *head, size_t *hl, uint64_t *h)
{
    int is_str = PyUnicode_CheckExact(key);
    if (is_str) {
        *data = PyUnicode_AsUTF8AndSize(key, n);
        if (*data == NULL) {
            PyErr_Clear();
            return 0;
        }
    } else if (PyBytes_CheckExact(key)) {
        *data = PyBytes_AS_STRING(key);
        *n = PyBytes_GET_SIZE(key);
    } else {
        PyErr_SetString(PyExc_TypeError, "table_get takes a str or bytes key");
        return -1;
    }
    if (udng_key_hash_common(key, h) != 1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "table_get: key not hashable here");
        return -1;
    }
    *hl = msgpack_head(is_str, (size_t)*n, head);
    return 1;
}

/* The probe for a key of hash h whose encoding is head[0..hl) + data[0..n):
 * NULL with *e the checked entry (*kl, *vl its lengths) or *e NULL when
 * absent; else what is damaged. */
static const char *
probe_exact(const table_view *t, uint64_t h, const unsigned char *head, size_t hl, const char *data,
            Py_ssize_t n, const unsigned char **e, uint32_t *kl, uint32_t *vl, int *same_hash)
{
    uint64_t mask = t->slots - 1, i = h & mask, tag = h & UDNG_TABLE_TAG_MASK;
    *e = NULL;
    for (uint64_t probes = 0;; probes++, i = (i + 1) & mask) {
        if (probes == t->slots)
            return "table index has no empty slot";
        uint64_t s;
        memcpy(&s, t->b + UDNG_TABLE_HEADER + 8 * i, 8); /* native order, as the index is written */
        if (s == 0)
            return NULL;
        if ((s & UDNG_TABLE_TAG_MASK) != tag)
            continue;
        uint64_t off = s & UDNG_TABLE_OFFSET_MASK;
        const char *bad = udng_table_check_entry(t, off, kl, vl);
        if (bad != NULL)
            return bad;
        const unsigned char *at = t->b + off;
        if (udng_rd64le(at) != h)
            continue;
        if (*kl != hl + (size_t)n || memcmp(at + UDNG_TABLE_ENTRY_HEADER, head, hl) != 0 ||
            memcmp(at + UDNG_TABLE_ENTRY_HEADER + hl, data, (size_t)n) != 0) {
            if (same_hash != NULL)
                *same_hash = 1;  /* another key of this hash: equal to ours only by == */
            continue;
        }
        *e = at;
        return NULL;
    }
}

/* An int's msgpack encoding in its shortest form (the serializer's: msgpack's
 * packer always chooses it) into out[9]: its length, or 0 for an int outside
 * the 64-bit range (not encoded so). */
static size_t
int_encoding(PyObject *key, unsigned char out[9])
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(key, &overflow);
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(key);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        out[0] = 0xcf;
        udng_wr64be(out + 1, u);
        return 9;
    }
    if (overflow < 0 || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (v >= 0) {
        if (v < 0x80) { out[0] = (unsigned char)v; return 1; }
        if (v <= 0xff) { out[0] = 0xcc; out[1] = (unsigned char)v; return 2; }
        if (v <= 0xffff) { out[0] = 0xcd; out[1] = (unsigned char)(v >> 8); out[2] = (unsigned char)v; return 3; }
        if (v <= 0xffffffffLL) {
            out[0] = 0xce;
            for (int i = 0; i < 4; i++)
                out[1 + i] = (unsigned char)(v >> (24 - 8 * i));
            return 5;
        }
        out[0] = 0xcf;
        udng_wr64be(out + 1, (uint64_t)v);
        return 9;
    }
    if (v >= -32) { out[0] = (unsigned char)(v & 0xff); return 1; }
    if (v >= -128) { out[0] = 0xd0; out[1] = (unsigned char)(v & 0xff); return 2; }
    if (v >= -32768) { out[0] = 0xd1; out[1] = (unsigned char)((v >> 8) & 0xff); out[2] = (unsigned char)(v & 0xff); return 3; }
    if (v >= -2147483648LL) {
        out[0] = 0xd2;
        for (int i = 0; i < 4; i++)
            out[1 + i] = (unsigned char)((v >> (24 - 8 * i)) & 0xff);
        return 5;
    }
    out[0] = 0xd3;
    udng_wr64be(out + 1, (uint64_t)v);
    return 9;
}

/* table_get(buf, slots, start, end, key[, offset]).  With offset true the
 * answer is the checked entry's offset (0: absent), and an int key is taken
 * too, probed by its own encoding: -1 when that does not decide -- an entry
 * of its hash holds other bytes (a key of another type may equal it: 1.0,
 * True), or the int has no 64-bit encoding; the caller then compares
 * decoded keys. */
PyObject *
udng_native_table_get(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 && nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "table_get(buf, slots, start, end, key[, offset])");
        return NULL;
    }
    int want_offset = 0;
    if (nargs == 6 && (want_offset = PyObject_IsTrue(args[5])) < 0)
        return NULL;
    const char *data = "";
    Py_ssize_t n = 0;
    unsigned char head[9];
    size_t hl;
    uint64_t h;
    int is_int = want_offset && PyLong_CheckExact(args[4]);
    if (is_int) {
        if (udng_key_hash_common(args[4], &h) != 1)
            return PyErr_Occurred() ? NULL : PyLong_FromLong(-1);
        hl = int_encoding(args[4], head);
        if (hl == 0)
            return PyLong_FromLong(-1);
    } else {
        int k = exact_key(args[4], &data, &n, head, &hl, &h);
        if (k <= 0) {
            if (k < 0)
                return NULL;
            if (want_offset)
                return PyLong_FromLong(0);
            Py_RETURN_NONE;
        }
    }
    Py_buffer pb;
    table_view t;
    if (udng_table_view_args(args, &pb, &t) < 0)
        return NULL;
    const unsigned char *e;
    uint32_t kl, vl;
    int same_hash = 0;
    const char *bad = probe_exact(&t, h, head, hl, data, n, &e, &kl, &vl, is_int ? &same_hash : NULL);
    PyObject *result = NULL;
    if (bad != NULL)
        PyErr_SetString(PyExc_ValueError, bad);
    else if (want_offset)
        result = e != NULL ? PyLong_FromUnsignedLongLong((unsigned long long)(e - t.b))
                           : PyLong_FromLong(same_hash ? -1 : 0);
    else if (e == NULL)
        { result = Py_None; Py_INCREF(result); }
    else
        result = PyBytes_FromStringAndSize((const char *)e + UDNG_TABLE_ENTRY_HEADER + kl, vl);
    PyBuffer_Release(&pb);
    return result;
}

/* The first step of a probe of a TableCache's `_probe` = (buf, slots,
 * start, end) for an exact str key (or an exact int: ints true), by its
 * encoding: the key's encoding and hash in *lc, the table's buffer held
 * there, and the read of the key's first slot started (UDNG_PREFETCH), so
 * that the caller's work until probe_finish overlaps that cache miss (at a
 * million keys the index is megabytes, the entries tens of them).  1 begun,
 * 0 absent without a probe (a str no table key can be), 2 not decided here
 * (the Python path decides), -1 never: every error is cleared into 2. */
static int
probe_key(PyObject *key, int ints, udng_locate *lc)
{
    lc->held = 0;
    lc->data = "";
    lc->n = 0;
    lc->is_int = ints && PyLong_CheckExact(key);
    if (lc->is_int) {
        if (udng_key_hash_common(key, &lc->h) != 1 || (lc->hl = int_encoding(key, lc->head)) == 0) {
            PyErr_Clear();
            return 2;
        }
    } else {
        int k = exact_key(key, &lc->data, &lc->n, lc->head, &lc->hl, &lc->h);
        if (k <= 0) {
            if (k < 0)
                PyErr_Clear();
            return k == 0 ? 0 : 2;
        }
    }
    return 1;
}

static int
probe_begin(PyObject *probe, PyObject *key, int ints, udng_locate *lc)
{
    lc->held = 0;
    if (!PyTuple_CheckExact(probe) || PyTuple_GET_SIZE(probe) != 4)
        return 2;
    int k = probe_key(key, ints, lc);
    if (k != 1)
        return k;
    if (udng_table_view_args(&PyTuple_GET_ITEM(probe, 0), &lc->pb, &lc->t) < 0) {
        PyErr_Clear();
        return 2;
    }
    lc->held = 1;
    UDNG_PREFETCH(lc->t.b + UDNG_TABLE_HEADER + 8 * (lc->h & (lc->t.slots - 1)));
    return 1;
}

/* The second read of a begun probe started: its first slot read (where
 * probe_begin's prefetch may still be on its way) and the entry it names
 * prefetched, both of its cache lines (an entry of a few fields spans two). */
void
udng_table_locate_touch(udng_locate *lc)
{
    uint64_t slot;
    memcpy(&slot, lc->t.b + UDNG_TABLE_HEADER + 8 * (lc->h & (lc->t.slots - 1)), 8);
    uint64_t off = slot & UDNG_TABLE_OFFSET_MASK;
    if (slot != 0 && off + UDNG_TABLE_ENTRY_HEADER <= lc->t.end) {
        UDNG_PREFETCH(lc->t.b + off);
        UDNG_PREFETCH(lc->t.b + off + 64);
    }
}

/* The probe begun by probe_begin: 1 probed (*e the checked entry or NULL
 * when absent, *kl and *vl its lengths; *same_hash set when an entry of the
 * int's hash holds other bytes; the buffer still held in lc->pb until the
 * caller releases it), 2 a damaged entry (the buffer released: the Python
 * path raises CorruptSegment). */
static int
probe_finish(udng_locate *lc, const unsigned char **e, uint32_t *kl, uint32_t *vl, int *same_hash)
{
    *same_hash = 0;
    if (probe_exact(&lc->t, lc->h, lc->head, lc->hl, lc->data, lc->n, e, kl, vl,
                    lc->is_int ? same_hash : NULL) != NULL) {
        udng_table_locate_drop(lc);
        return 2;
    }
    return 1;
}

/* Both steps at once (the compiled first read: its caller has looked in
 * `hot` already, so nothing is left to overlap). */
static int
cache_probe(PyObject *probe, PyObject *key, int ints, udng_locate *lc, const unsigned char **e,
            uint32_t *kl, uint32_t *vl, int *same_hash)
{
    int r = probe_begin(probe, key, ints, lc);
    return r != 1 ? r : probe_finish(lc, e, kl, vl, same_hash);
}

/* The compiled first read of a big dict (readpath.c's read path, for a
 * TableCache's `_probe` and an exact str key): 1 found, *out the value
 * decoded straight from the mapped entry (a new reference); 0 absent; 2 not
 * decided here (a value that is not a scalar or a tuple of them, a damaged
 * entry: the Python path decodes or raises CorruptSegment); -1 error.  The
 * buffer is held exported while it is read, so nothing can unmap it
 * meanwhile. */
int
udng_table_row_simple(PyObject *probe, PyObject *key, PyObject **out)
{
    udng_locate lc;
    const unsigned char *e;
    uint32_t kl, vl;
    int same_hash, r = cache_probe(probe, key, 0, &lc, &e, &kl, &vl, &same_hash);
    if (r != 1)
        return r;
    if (e == NULL) {
        r = 0;
    } else {
        *out = udng_simple_value(e + UDNG_TABLE_ENTRY_HEADER + kl, vl);
        r = *out != NULL ? 1 : PyErr_Occurred() ? -1 : 2;
    }
    PyBuffer_Release(&lc.pb);
    return r;
}

PyObject *
udng_native_table_candidates(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 && nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "table_candidates(buf, slots, start, end, h[, offsets])");
        return NULL;
    }
    unsigned long long h = PyLong_AsUnsignedLongLong(args[4]);
    if (h == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    int offsets = nargs == 6 ? PyObject_IsTrue(args[5]) : 0;
    if (offsets < 0)
        return NULL;
    Py_buffer pb;
    table_view t;
    if (udng_table_view_args(args, &pb, &t) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    const char *bad = NULL;
    uint64_t mask = t.slots - 1, i = h & mask, tag = h & UDNG_TABLE_TAG_MASK;
    for (uint64_t probes = 0; out != NULL; probes++, i = (i + 1) & mask) {
        if (probes == t.slots) {
            bad = "table index has no empty slot";
            break;
        }
        uint64_t s;
        memcpy(&s, t.b + UDNG_TABLE_HEADER + 8 * i, 8); /* native order, as the index is written */
        if (s == 0)
            break;
        if ((s & UDNG_TABLE_TAG_MASK) != tag)
            continue;
        uint64_t off = s & UDNG_TABLE_OFFSET_MASK;
        uint32_t kl, vl;
        if ((bad = udng_table_check_entry(&t, off, &kl, &vl)) != NULL)
            break;
        const unsigned char *e = t.b + off;
        if (udng_rd64le(e) != h)
            continue;
        const char *kb = (const char *)e + UDNG_TABLE_ENTRY_HEADER, *vb = kb + kl;
        PyObject *pair = offsets ? Py_BuildValue("(Ky#y#)", (unsigned long long)off, kb, (Py_ssize_t)kl, vb,
                                                 (Py_ssize_t)vl)
                                 : Py_BuildValue("(y#y#)", kb, (Py_ssize_t)kl, vb, (Py_ssize_t)vl);
        if (pair == NULL || PyList_Append(out, pair) < 0)
            Py_CLEAR(out);
        Py_XDECREF(pair);
    }
    PyBuffer_Release(&pb);
    if (bad != NULL) {
        Py_XDECREF(out);
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    return out;
}

/* table_entry(buf, slots, start, end, off) -> (hash, key length, value length)
 * of the entry at off, checked as the probe checks every entry it reads
 * (aligned, inside the entries, zero word, crc); ValueError, its message
 * starting "table entry", when it is not sound.  Table.entry's check, so
 * that the table has one. */
PyObject *
udng_native_table_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "table_entry(buf, slots, start, end, off)");
        return NULL;
    }
    unsigned long long off = PyLong_AsUnsignedLongLong(args[4]);
    if (off == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_buffer pb;
    table_view t;
    if (udng_table_view_args(args, &pb, &t) < 0)
        return NULL;
    uint32_t kl = 0, vl = 0;
    const char *bad = udng_table_check_entry(&t, off, &kl, &vl);
    PyObject *out = NULL;
    if (bad != NULL)
        PyErr_SetString(PyExc_ValueError, bad);
    else
        out = Py_BuildValue("(KII)", (unsigned long long)udng_rd64le(t.b + off), (unsigned int)kl, (unsigned int)vl);
    PyBuffer_Release(&pb);
    return out;
}



/* Whether a counted entry of the table `t` (a view whose buffer the caller
 * holds) holds the exact str or int `key` (TableCache._counted's probe, for the
 * placing of the keys the compiled set left unplaced: tablecache.c), in
 * three steps (udng.h) so that a batch of keys has its reads under way
 * together.  Begin returns 1 when the probe is under way (touch, then end
 * answers), else what end would have: 0 absent, 2 not decided here.  End: 1
 * it does, 0 it does not, 2 not decided here (a same-hash entry of other
 * bytes, which a key of another type may equal; an int with no 64-bit
 * encoding; a damaged entry: the Python path decides, or raises
 * CorruptSegment). */
int
udng_table_locate_begin(const table_view *t, PyObject *key, udng_locate *lc)
{
    int k = probe_key(key, 1, lc);
    if (k != 1)
        return k;
    lc->t = *t;  /* (the caller holds its buffer for the batch: lc->held stays 0) */
    UDNG_PREFETCH(lc->t.b + UDNG_TABLE_HEADER + 8 * (lc->h & (lc->t.slots - 1)));
    return 1;
}

int
udng_table_locate_end(udng_locate *lc)
{
    const unsigned char *e;
    uint32_t kl, vl;
    int same_hash, r = probe_finish(lc, &e, &kl, &vl, &same_hash);
    udng_table_locate_drop(lc);
    if (r != 1)
        return r;
    return e != NULL ? 1 : same_hash ? 2 : 0;
}

void
udng_table_locate_drop(udng_locate *lc)
{
    if (lc->held) {
        PyBuffer_Release(&lc->pb);
        lc->held = 0;
    }
}

/* The offset of the checked entry of t holding the exact str or int `key`
 * (found by its encoding, as table_get's offset probe), or 0 when this probe
 * does not find it or does not decide (another type, an entry of its hash
 * holding other bytes, an int beyond 64 bits, a str no key can be, a damaged
 * entry): the caller's Python path decides then, and raises what it must.
 * Never leaves an error set. */
static uint64_t
view_locate(const table_view *t, PyObject *key)
{
    const char *data = "";
    Py_ssize_t n = 0;
    unsigned char head[9];
    size_t hl;
    uint64_t h;
    int is_int = PyLong_CheckExact(key);
    if (is_int) {
        if (udng_key_hash_common(key, &h) != 1 || (hl = int_encoding(key, head)) == 0) {
            PyErr_Clear();
            return 0;
        }
    } else if (!PyUnicode_CheckExact(key) || exact_key(key, &data, &n, head, &hl, &h) != 1) {
        PyErr_Clear();
        return 0;
    }
    const unsigned char *e;
    uint32_t kl, vl;
    int same_hash = 0;
    if (probe_exact(t, h, head, hl, data, n, &e, &kl, &vl, is_int ? &same_hash : NULL) != NULL || e == NULL)
        return 0;
    return (uint64_t)(e - t->b);
}

/* Append (offset, value) -- value NULL: None -- to `changes`: 0, or -1 with an error set. */
static int
append_change(PyObject *changes, uint64_t off, PyObject *value)
{
    PyObject *item = Py_BuildValue("(KO)", (unsigned long long)off, value != NULL ? value : Py_None);
    if (item == NULL)
        return -1;
    int r = PyList_Append(changes, item);
    Py_DECREF(item);
    return r;
}

/* table_changes(buf, slots, start, end, dead, changed, hot) -> (changes,
 * rest_dead, rest_changed): a merge's changes in one call (dumps._merge),
 * so that a dump of a big dict does not pay a Python probe and a codec call
 * per changed key.  `changes` (unsorted) holds (offset, None) for each key of
 * the set `dead` and (offset, the codec's bytes of hot[key]) for each key of
 * the set `changed` whose entry view_locate finds and, for a changed key,
 * whose value udng_pack_value encodes; the keys it leaves are listed in
 * rest_dead and rest_changed, for the caller's general path (which also
 * raises for a key with no entry or a damaged one).  Only exact str and int
 * keys are looked up in `hot`, so no Python code runs while the sets are
 * iterated. */
PyObject *
udng_native_table_changes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyAnySet_CheckExact(args[4]) || !PyAnySet_CheckExact(args[5]) || !PyDict_CheckExact(args[6])) {
        PyErr_SetString(PyExc_TypeError, "table_changes(buf, slots, start, end, dead: set, changed: set, hot: dict)");
        return NULL;
    }
    Py_buffer pb;
    table_view t;
    if (udng_table_view_args(args, &pb, &t) < 0)
        return NULL;
    PyObject *hot = args[6], *result = NULL, *it = NULL, *key;
    PyObject *changes = PyList_New(0), *rest_dead = PyList_New(0), *rest_changed = PyList_New(0);
    if (changes == NULL || rest_dead == NULL || rest_changed == NULL)
        goto done;
    for (int pass = 0; pass < 2; pass++) {
        PyObject *rest = pass == 0 ? rest_dead : rest_changed;
        Py_XDECREF(it);
        it = PyObject_GetIter(args[4 + pass]);
        if (it == NULL)
            goto done;
        while ((key = PyIter_Next(it)) != NULL) {
            uint64_t off = 0;
            PyObject *value = NULL;
            int r = 0;
            if (PyUnicode_CheckExact(key) || PyLong_CheckExact(key)) {
                if (pass == 1) {
                    PyObject *v = PyDict_GetItemWithError(hot, key);  /* (borrowed) */
                    if (v == NULL && PyErr_Occurred())
                        r = -1;
                    else if (v != NULL && (value = udng_pack_value(v)) == NULL && PyErr_Occurred())
                        r = -1;
                }
                if (r == 0 && (pass == 0 || value != NULL))
                    off = view_locate(&t, key);
            }
            if (r == 0)
                r = off ? append_change(changes, off, value) : PyList_Append(rest, key);
            Py_XDECREF(value);
            Py_DECREF(key);
            if (r < 0)
                goto done;
        }
        if (PyErr_Occurred())
            goto done;
    }
    result = PyTuple_Pack(3, changes, rest_dead, rest_changed);
done:
    Py_XDECREF(it);
    Py_XDECREF(changes);
    Py_XDECREF(rest_dead);
    Py_XDECREF(rest_changed);
    PyBuffer_Release(&pb);
    return result;
}

