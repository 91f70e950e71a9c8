/*
 * The probe of a shared table (table_layout.py, "Probe"), compiled: the part
 * of a lookup in a big dict that is neither hashing (keyhash.c) nor decoding
 * the value (the serializer).  Part of ultradict_ng._helper._native; the
 * twins are twins.table_get and twins.table_candidates.
 *
 *   table_get(buf, slots, start, end, key)   key: exactly str or bytes.
 *       Hashes the key, probes, and compares the entry's key *bytes* with the
 *       key's msgpack encoding (str: fixstr/str8/16/32 of its UTF-8; bytes:
 *       bin8/16/32), which is exact: a str equals only a str, and the codec
 *       always writes the shortest form.  Returns the value's bytes (a copy:
 *       large buffers and arrays live in blobs, so values are small), None
 *       when absent, or a str saying what is damaged (the caller raises
 *       CorruptSegment).  A str with lone surrogates: None (it cannot be a key).
 *   table_candidates(buf, slots, start, end, h)
 *       For every other key: the (key bytes, value bytes) of each entry on
 *       h's probe chain whose full hash is h (almost always zero or one), for
 *       the caller to decode and compare with ==; or a str as above.
 *   table_fill(buf, off, packed, hashes)
 *       Writes one entry per pair of the msgpack map ``packed`` (a dict
 *       packed by the codec: each key and value is encoded exactly as alone),
 *       with hashes[i] for the i-th pair, from ``off``; returns the offset
 *       after them.  With buf None it writes nothing and returns the same
 *       offset (how the caller sizes the segment).  Building from one packed map is what makes a bulk load
 *       cost memory copies: one pack of the whole dict, no object per entry.
 *   table_merge(dst, off, src, start, end, changes)
 *       A merged dump's entries (table_layout.py, "Merge"): the old table's
 *       entries with the (offset, new value bytes or None) changes applied,
 *       the runs between them copied as bytes; dst None only counts them.
 *   table_changes(buf, slots, start, end, dead, changed, hot)
 *       The changes a merge makes (dumps.py): (offset, None) for each key of
 *       the set `dead`, (offset, encoded hot[key]) for each of the set
 *       `changed`, for the exact str and int keys the probe decides and the
 *       values udng_pack_value encodes; the rest in two lists for the
 *       caller.  Returns (changes, rest_dead, rest_changed).
 *   table_index(buf, slots, start, end, count)
 *       Writes the index of the entries between start and end.
 *   table_chunk(buf, start, end, off, most)
 *       (packed, next offset): the entries from ``off`` on -- at most
 *       ``most`` of them, each checked -- as one msgpack map (a header, then
 *       the keys' and values' bytes), so that a walk decodes thousands of
 *       pairs in one serializer call instead of two calls a pair; next
 *       offset == end when the walk is done.  A damaged entry: ValueError
 *       whose message starts "table entry" (the caller raises CorruptSegment).
 *   table_rows(buf, start, end, off, out, skip=None, subst=None)
 *       Decodes the entries from ``off`` on into ``out`` -- a dict (out[key] =
 *       value) or a list ((key, value) appended) -- leaving out the keys in
 *       the set ``skip`` and taking the values of the keys in the dict
 *       ``subst`` from it (a big dict's deleted and changed keys), each entry
 *       checked, while both key and value are a scalar or a
 *       tuple of scalars (unpack.c: a lookup table's keys and rows), and
 *       returns the offset where it stopped: end, or the first entry that is
 *       not so, for the serializer (table_chunk from there).  A walk of a
 *       million rows makes no bytes object and calls no serializer.  A
 *       damaged entry: ValueError, as table_chunk.
 *   udng_table_row_simple(probe, key, &out)   (C only)
 *       The first read of a big dict's key in compiled code: the probe of
 *       table_get, then the value decoded straight from the mapped entry when
 *       it is a scalar or a tuple of scalars (no bytes copy, no call).
 *   udng_table_locate(probe, key)   (C only)
 *       Whether the table holds a str or int key: the compiled set of a
 *       record into a big dict's cache (tablecache.c).
 *   They raise ValueError on input that does not fit (a malformed map, a
 *   count that disagrees, a buffer too small) before writing past anything.
 *
 * Every entry handed out has been checked as Table.entry checks it (aligned,
 * inside the entries, its zero word zero, its crc); the probe gives up with
 * an error after ``slots`` slots (an index without an empty slot is damaged).
 */
#include "udng.h"
#include <stdint.h>
#include <string.h>

#define T_HEADER 64
#define T_ENTRY 24
#define T_OFFSET_MASK ((1ULL << 40) - 1)
#define T_TAG_MASK (~T_OFFSET_MASK)


static inline uint64_t rd64(const unsigned char *p)
{
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

static inline void wr64be(unsigned char *p, uint64_t x)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(x >> (56 - 8 * i));
}

static inline uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

typedef struct {
    const unsigned char *b;
    uint64_t slots, start, end;
    Py_ssize_t len;
} table_view;

/* Parse (buf, slots, start, end) and check them against the buffer. */
static int
view_args(PyObject *const *args, Py_buffer *pb, table_view *t)
{
    unsigned long long slots = PyLong_AsUnsignedLongLong(args[1]);
    unsigned long long start = PyLong_AsUnsignedLongLong(args[2]);
    unsigned long long end = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred())
        return -1;
    if (PyObject_GetBuffer(args[0], pb, PyBUF_SIMPLE) < 0)
        return -1;
    if (slots < 8 || (slots & (slots - 1)) || start != T_HEADER + 8 * slots || start > end ||
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

/* Check the entry at off; NULL when sound (lengths set), else the reason. */
static const char *
check_entry(const table_view *t, uint64_t off, uint32_t *kl, uint32_t *vl)
{
    if ((off & 7) || off < t->start || off + T_ENTRY > t->end)
        return "table entry offset outside the entries";
    const unsigned char *e = t->b + off;
    *kl = rd32(e + 8);
    *vl = rd32(e + 12);
    if (rd32(e + 20) != 0)
        return "table entry has a nonzero reserved word";
    if (off + T_ENTRY + (uint64_t)*kl + *vl > t->end)
        return "table entry runs past the entries";
    uint32_t crc = udng_crc32(udng_crc32(0, e, 16), e + T_ENTRY, (size_t)*kl + *vl);
    if (crc != rd32(e + 16))
        return "table entry fails its checksum";
    return NULL;
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
    uint64_t mask = t->slots - 1, i = h & mask, tag = h & T_TAG_MASK;
    *e = NULL;
    for (uint64_t probes = 0;; probes++, i = (i + 1) & mask) {
        if (probes == t->slots)
            return "table index has no empty slot";
        uint64_t s;
        memcpy(&s, t->b + T_HEADER + 8 * i, 8); /* native order, as the index is written */
        if (s == 0)
            return NULL;
        if ((s & T_TAG_MASK) != tag)
            continue;
        uint64_t off = s & T_OFFSET_MASK;
        const char *bad = check_entry(t, off, kl, vl);
        if (bad != NULL)
            return bad;
        const unsigned char *at = t->b + off;
        if (rd64(at) != h)
            continue;
        if (*kl != hl + (size_t)n || memcmp(at + T_ENTRY, head, hl) != 0 ||
            memcmp(at + T_ENTRY + hl, data, (size_t)n) != 0) {
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
        wr64be(out + 1, u);
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
        wr64be(out + 1, (uint64_t)v);
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
    wr64be(out + 1, (uint64_t)v);
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
    if (view_args(args, &pb, &t) < 0)
        return NULL;
    const unsigned char *e;
    uint32_t kl, vl;
    int same_hash = 0;
    const char *bad = probe_exact(&t, h, head, hl, data, n, &e, &kl, &vl, is_int ? &same_hash : NULL);
    PyObject *result = NULL;
    if (bad != NULL)
        result = PyUnicode_FromString(bad);
    else if (want_offset)
        result = e != NULL ? PyLong_FromUnsignedLongLong((unsigned long long)(e - t.b))
                           : PyLong_FromLong(same_hash ? -1 : 0);
    else if (e == NULL)
        { result = Py_None; Py_INCREF(result); }
    else
        result = PyBytes_FromStringAndSize((const char *)e + T_ENTRY + kl, vl);
    PyBuffer_Release(&pb);
    return result;
}

/* The probe of a TableCache's `_probe` = (buf, slots, start, end) for an
 * exact str key (or an exact int: ints true) by its encoding, shared by the
 * compiled first read and the compiled set: 1 probed (*e the checked entry
 * or NULL when absent, *kl and *vl its lengths; *same_hash set when an
 * entry of the int's hash holds other bytes; the buffer held in *pb until
 * the caller releases it), 0 absent without a probe (a str no table key can
 * be), 2 not decided here (the Python path decides), -1 never: every error
 * is cleared into 2. */
static int
cache_probe(PyObject *probe, PyObject *key, int ints, Py_buffer *pb, table_view *t,
            const unsigned char **e, uint32_t *kl, uint32_t *vl, int *same_hash)
{
    if (!PyTuple_CheckExact(probe) || PyTuple_GET_SIZE(probe) != 4)
        return 2;
    const char *data = "";
    Py_ssize_t n = 0;
    unsigned char head[9];
    size_t hl;
    uint64_t h;
    int is_int = ints && PyLong_CheckExact(key);
    if (is_int) {
        if (udng_key_hash_common(key, &h) != 1 || (hl = int_encoding(key, head)) == 0) {
            PyErr_Clear();
            return 2;
        }
    } else {
        int k = exact_key(key, &data, &n, head, &hl, &h);
        if (k <= 0) {
            if (k < 0)
                PyErr_Clear();
            return k == 0 ? 0 : 2;
        }
    }
    if (view_args(&PyTuple_GET_ITEM(probe, 0), pb, t) < 0) {
        PyErr_Clear();
        return 2;
    }
    *same_hash = 0;
    if (probe_exact(t, h, head, hl, data, n, e, kl, vl, is_int ? same_hash : NULL) != NULL) {
        PyBuffer_Release(pb);
        return 2;  /* (a damaged entry: the Python path raises CorruptSegment) */
    }
    return 1;
}

/* The compiled first read of a big dict (_native.c's read path, for a
 * TableCache's `_probe` and an exact str key): 1 found, *out the value
 * decoded straight from the mapped entry (a new reference); 0 absent; 2 not
 * decided here (a value that is not a scalar or a tuple of them, a damaged
 * entry: the Python path decodes or raises CorruptSegment); -1 error.  The
 * buffer is held exported while it is read, so nothing can unmap it
 * meanwhile. */
int
udng_table_row_simple(PyObject *probe, PyObject *key, PyObject **out)
{
    Py_buffer pb;
    table_view t;
    const unsigned char *e;
    uint32_t kl, vl;
    int same_hash, r = cache_probe(probe, key, 0, &pb, &t, &e, &kl, &vl, &same_hash);
    if (r != 1)
        return r;
    if (e == NULL) {
        r = 0;
    } else {
        *out = udng_simple_value(e + T_ENTRY + kl, vl);
        r = *out != NULL ? 1 : PyErr_Occurred() ? -1 : 2;
    }
    PyBuffer_Release(&pb);
    return r;
}

PyObject *
udng_native_table_candidates(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "table_candidates(buf, slots, start, end, h)");
        return NULL;
    }
    unsigned long long h = PyLong_AsUnsignedLongLong(args[4]);
    if (h == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_buffer pb;
    table_view t;
    if (view_args(args, &pb, &t) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    const char *bad = NULL;
    uint64_t mask = t.slots - 1, i = h & mask, tag = h & T_TAG_MASK;
    for (uint64_t probes = 0; out != NULL; probes++, i = (i + 1) & mask) {
        if (probes == t.slots) {
            bad = "table index has no empty slot";
            break;
        }
        uint64_t s;
        memcpy(&s, t.b + T_HEADER + 8 * i, 8); /* native order, as the index is written */
        if (s == 0)
            break;
        if ((s & T_TAG_MASK) != tag)
            continue;
        uint64_t off = s & T_OFFSET_MASK;
        uint32_t kl, vl;
        if ((bad = check_entry(&t, off, &kl, &vl)) != NULL)
            break;
        const unsigned char *e = t.b + off;
        if (rd64(e) != h)
            continue;
        PyObject *pair = Py_BuildValue("(y#y#)", (const char *)e + T_ENTRY, (Py_ssize_t)kl,
                                       (const char *)e + T_ENTRY + kl, (Py_ssize_t)vl);
        if (pair == NULL || PyList_Append(out, pair) < 0)
            Py_CLEAR(out);
        Py_XDECREF(pair);
    }
    PyBuffer_Release(&pb);
    if (bad != NULL) {
        Py_XDECREF(out);
        return PyUnicode_FromString(bad);
    }
    return out;
}

static inline void wr32(unsigned char *p, uint32_t x)
{
    p[0] = (unsigned char)x; p[1] = (unsigned char)(x >> 8);
    p[2] = (unsigned char)(x >> 16); p[3] = (unsigned char)(x >> 24);
}

static inline void wr64(unsigned char *p, uint64_t x)
{
    wr32(p, (uint32_t)x);
    wr32(p + 4, (uint32_t)(x >> 32));
}

/* The pair count of the map header at p (n bytes), and its length; -1 if none. */
static Py_ssize_t
map_header(const unsigned char *p, Py_ssize_t n, uint64_t *count)
{
    if (n >= 1 && (p[0] & 0xf0) == 0x80) {
        *count = p[0] & 0x0f;
        return 1;
    }
    if (n >= 3 && p[0] == 0xde) {
        *count = ((uint64_t)p[1] << 8) | p[2];
        return 3;
    }
    if (n >= 5 && p[0] == 0xdf) {
        *count = ((uint64_t)p[1] << 24) | ((uint64_t)p[2] << 16) | ((uint64_t)p[3] << 8) | p[4];
        return 5;
    }
    return -1;
}

/* The buffers of a writer of entries (table_fill, table_merge): `dst`
 * writable, or None for a dry run that only counts (out: no memory, no
 * limit), and `src` readable: 0, or -1 with an error set and nothing held. */
static int
writer_buffers(PyObject *dst, PyObject *src, Py_buffer *out, Py_buffer *in)
{
    if (dst == Py_None) {
        out->buf = NULL;
        out->len = PY_SSIZE_T_MAX;
        out->obj = NULL;
    } else if (PyObject_GetBuffer(dst, out, PyBUF_WRITABLE) < 0) {
        return -1;
    }
    if (PyObject_GetBuffer(src, in, PyBUF_SIMPLE) < 0) {
        if (dst != Py_None)
            PyBuffer_Release(out);
        return -1;
    }
    return 0;
}

PyObject *
udng_native_table_fill(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "table_fill(buf, off, packed, hashes: list)");
        return NULL;
    }
    Py_ssize_t off = PyLong_AsSsize_t(args[1]);
    if (off == -1 && PyErr_Occurred())
        return NULL;
    PyObject *hashes = args[3];
    Py_buffer out, in;
    int dry = args[0] == Py_None;
    if (writer_buffers(args[0], args[2], &out, &in) < 0)
        return NULL;
    const unsigned char *p = (const unsigned char *)in.buf;
    unsigned char *b = (unsigned char *)out.buf;
    Py_ssize_t n = in.len, pos;
    uint64_t count;
    const char *bad = NULL;
    pos = map_header(p, n, &count);
    if (pos < 0)
        bad = "table_fill: packed is not a msgpack map";
    else if (count != (uint64_t)PyList_GET_SIZE(hashes))
        bad = "table_fill: the map's pair count differs from the hashes'";
    else if (off < T_HEADER || (off & 7) || off > out.len)
        bad = "table_fill: offset outside the buffer";
    for (uint64_t i = 0; bad == NULL && i < count; i++) {
        Py_ssize_t kl = udng_mp_skip(p + pos, n - pos);
        Py_ssize_t vl = kl < 0 ? -1 : udng_mp_skip(p + pos + kl, n - pos - kl);
        if (kl < 0 || vl < 0) {
            bad = "table_fill: a malformed pair in the map";
            break;
        }
        if ((uint64_t)kl > 0xFFFFFFFFULL || (uint64_t)vl > 0xFFFFFFFFULL) {
            bad = "a key or value of 4 GiB or more cannot go in a table entry";
            break;
        }
        Py_ssize_t size = (T_ENTRY + kl + vl + 7) & ~(Py_ssize_t)7;
        if (size > out.len - off) {
            bad = "table_fill: the buffer is too small";
            break;
        }
        unsigned long long h = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(hashes, (Py_ssize_t)i));
        if (h == (unsigned long long)-1 && PyErr_Occurred())
            goto error;
        if (dry) {
            pos += kl + vl;
            off += size;
            continue;
        }
        unsigned char *e = b + off;
        wr64(e, h);
        wr32(e + 8, (uint32_t)kl);
        wr32(e + 12, (uint32_t)vl);
        wr32(e + 20, 0);
        memcpy(e + T_ENTRY, p + pos, (size_t)(kl + vl));
        memset(e + T_ENTRY + kl + vl, 0, (size_t)(size - T_ENTRY - kl - vl));
        wr32(e + 16, udng_crc32(udng_crc32(0, e, 16), e + T_ENTRY, (size_t)(kl + vl)));
        pos += kl + vl;
        off += size;
    }
    if (bad == NULL && pos != n)
        bad = "table_fill: bytes after the map";
    PyBuffer_Release(&in);
    if (!dry)
        PyBuffer_Release(&out);
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    return PyLong_FromSsize_t(off);
error:
    PyBuffer_Release(&in);
    if (!dry)
        PyBuffer_Release(&out);
    return NULL;
}

PyObject *
udng_native_table_index(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "table_index(buf, slots, start, end, count)");
        return NULL;
    }
    unsigned long long slots = PyLong_AsUnsignedLongLong(args[1]);
    unsigned long long start = PyLong_AsUnsignedLongLong(args[2]);
    unsigned long long end = PyLong_AsUnsignedLongLong(args[3]);
    unsigned long long count = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer out;
    if (PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE) < 0)
        return NULL;
    unsigned char *b = (unsigned char *)out.buf;
    const char *bad = NULL;
    if (slots < 8 || (slots & (slots - 1)) || start != T_HEADER + 8 * slots || start > end ||
        end > (unsigned long long)out.len || end > T_OFFSET_MASK || count >= slots)
        bad = "table_index: bounds do not fit the buffer";
    else {
        memset(b + T_HEADER, 0, 8 * slots);
        uint64_t mask = slots - 1, off = start, seen = 0;
        while (off < end) {
            if (off + T_ENTRY > end || seen == count) {
                bad = "table_index: the entries do not add up to count";
                break;
            }
            uint64_t h = rd64(b + off), s;
            uint64_t next = (off + T_ENTRY + rd32(b + off + 8) + (uint64_t)rd32(b + off + 12) + 7) & ~7ULL;
            if (next > end) {
                bad = "table_index: an entry runs past the end";
                break;
            }
            uint64_t i = h & mask;
            for (;;) {
                memcpy(&s, b + T_HEADER + 8 * i, 8);
                if (s == 0)
                    break;
                i = (i + 1) & mask;
            }
            s = (h & T_TAG_MASK) | off;
            memcpy(b + T_HEADER + 8 * i, &s, 8);
            off = next;
            seen++;
        }
        if (bad == NULL && seen != count)
            bad = "table_index: the entries do not add up to count";
    }
    PyBuffer_Release(&out);
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *
udng_native_table_chunk(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "table_chunk(buf, start, end, off, most)");
        return NULL;
    }
    unsigned long long start = PyLong_AsUnsignedLongLong(args[1]);
    unsigned long long end = PyLong_AsUnsignedLongLong(args[2]);
    unsigned long long off = PyLong_AsUnsignedLongLong(args[3]);
    unsigned long long most = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer pb;
    if (PyObject_GetBuffer(args[0], &pb, PyBUF_SIMPLE) < 0)
        return NULL;
    table_view t = {(const unsigned char *)pb.buf, 8, start, end, pb.len};
    const char *bad = NULL;
    if (start < T_HEADER || start > end || end > (unsigned long long)pb.len || off < start || off > end ||
        most == 0 || most > 0xFFFFFFFFULL)
        bad = "table_chunk: bounds do not fit the buffer";
    /* First pass: how many entries and bytes; each entry checked. */
    uint64_t n = 0, bytes = 0, pos = off;
    while (bad == NULL && pos < end && n < most) {
        uint32_t kl, vl;
        if ((bad = check_entry(&t, pos, &kl, &vl)) != NULL)
            break;
        bytes += (uint64_t)kl + vl;
        pos = (pos + T_ENTRY + kl + vl + 7) & ~7ULL;
        n++;
    }
    PyObject *out = NULL;
    if (bad == NULL) {
        out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(5 + bytes));
        if (out != NULL) {
            unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
            size_t hl;
            if (n < 16) {
                w[0] = (unsigned char)(0x80 | n);
                hl = 1;
            } else if (n < 65536) {
                w[0] = 0xde; w[1] = (unsigned char)(n >> 8); w[2] = (unsigned char)n;
                hl = 3;
            } else {
                w[0] = 0xdf; w[1] = (unsigned char)(n >> 24); w[2] = (unsigned char)(n >> 16);
                w[3] = (unsigned char)(n >> 8); w[4] = (unsigned char)n;
                hl = 5;
            }
            unsigned char *q = w + hl;
            for (uint64_t p = off, i = 0; i < n; i++) {
                uint32_t kl = rd32(t.b + p + 8), vl = rd32(t.b + p + 12);
                memcpy(q, t.b + p + T_ENTRY, (size_t)kl + vl);
                q += (size_t)kl + vl;
                p = (p + T_ENTRY + kl + vl + 7) & ~7ULL;
            }
            if (_PyBytes_Resize(&out, (Py_ssize_t)(q - w)) < 0)
                out = NULL;
        }
    }
    PyBuffer_Release(&pb);
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    if (out == NULL)
        return NULL;
    PyObject *r = Py_BuildValue("(NK)", out, (unsigned long long)pos);
    return r;
}

/* table_rows(buf, start, end, off, out) -> offset where it stopped */
/* One decoded row into `out`: out[key] = value (a dict), or a (key, value)
 * pair appended (a list), left untracked by the collector when both are
 * (the rows of a lookup table: a million pairs it need not scan).  0, or -1
 * with an error set. */
static int
row_out(PyObject *out, PyObject *key, PyObject *value)
{
    if (PyDict_CheckExact(out))
        return PyDict_SetItem(out, key, value);
    PyObject *pair = PyTuple_Pack(2, key, value);
    if (pair == NULL)
        return -1;
    if (!PyObject_GC_IsTracked(key) && !PyObject_GC_IsTracked(value))
        PyObject_GC_UnTrack(pair);
    int r = PyList_Append(out, pair);
    Py_DECREF(pair);
    return r;
}

PyObject *
udng_native_table_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *skip = nargs > 5 ? args[5] : Py_None, *subst = nargs > 6 ? args[6] : Py_None;
    if (nargs < 5 || nargs > 7 || !(PyDict_CheckExact(args[4]) || PyList_CheckExact(args[4])) ||
        !(skip == Py_None || PyAnySet_CheckExact(skip)) || !(subst == Py_None || PyDict_CheckExact(subst))) {
        PyErr_SetString(PyExc_TypeError, "table_rows(buf, start, end, off, out: dict | list, "
                                         "skip: set | None = None, subst: dict | None = None)");
        return NULL;
    }
    if (skip != Py_None && PySet_GET_SIZE(skip) == 0)
        skip = Py_None;
    if (subst != Py_None && PyDict_GET_SIZE(subst) == 0)
        subst = Py_None;
    unsigned long long start = PyLong_AsUnsignedLongLong(args[1]);
    unsigned long long end = PyLong_AsUnsignedLongLong(args[2]);
    unsigned long long off = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *out = args[4];
    Py_buffer pb;
    if (PyObject_GetBuffer(args[0], &pb, PyBUF_SIMPLE) < 0)
        return NULL;
    table_view t = {(const unsigned char *)pb.buf, 8, start, end, pb.len};
    const char *bad = NULL;
    int failed = 0;
    if (start < T_HEADER || start > end || end > (unsigned long long)pb.len || off < start || off > end)
        bad = "table_rows: bounds do not fit the buffer";
    uint64_t pos = off;
    while (bad == NULL && pos < end) {
        uint32_t kl, vl;
        if ((bad = check_entry(&t, pos, &kl, &vl)) != NULL)
            break;
        const unsigned char *body = t.b + pos + T_ENTRY;
        PyObject *key = udng_simple_value(body, kl);
        if (key == NULL)
            break;
        PyObject *value = udng_simple_value(body + kl, vl);
        if (value == NULL) {
            Py_DECREF(key);
            break;
        }
        /* (scalars and tuples of them: their hash and == run no Python code) */
        int r = skip == Py_None ? 0 : PySet_Contains(skip, key);
        if (r == 0 && subst != Py_None) {
            PyObject *now = PyDict_GetItemWithError(subst, key);  /* borrowed */
            if (now != NULL) {
                Py_INCREF(now);
                Py_SETREF(value, now);
            } else if (PyErr_Occurred()) {
                r = -1;
            }
        }
        if (r == 0)
            r = row_out(out, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (r < 0) {
            failed = 1;
            break;
        }
        pos = (pos + T_ENTRY + kl + vl + 7) & ~7ULL;
    }
    PyBuffer_Release(&pb);
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        return NULL;
    }
    if (failed)
        return NULL;
    return PyLong_FromUnsignedLongLong(pos);
}

/* Whether a counted entry of the table `probe` = (buf, slots, start, end)
 * holds the exact str or int `key` (TableCache._counted's probe, for the
 * compiled set of a record: tablecache.c): 1 it does, 0 it does not, 2 not
 * decided here (a same-hash entry of other bytes, which a key of another
 * type may equal; an int with no 64-bit encoding; a damaged entry: the
 * Python path decides, or raises CorruptSegment). */
int
udng_table_locate(PyObject *probe, PyObject *key)
{
    Py_buffer pb;
    table_view t;
    const unsigned char *e;
    uint32_t kl, vl;
    int same_hash, r = cache_probe(probe, key, 1, &pb, &t, &e, &kl, &vl, &same_hash);
    if (r != 1)
        return r;
    PyBuffer_Release(&pb);
    return e != NULL ? 1 : same_hash ? 2 : 0;
}

/* table_merge(dst, off, src, start, end, changes: list) -> the offset in dst
 * after the merged entries (dst None: only counted, from off), or the reason
 * a changed entry is damaged (a str).  `src[start:end]` are an old table's
 * entries; `changes` are (offset, value) pairs sorted by offset, each the
 * start of an entry of it (checked here: bounds, checksum): value None drops
 * the entry, bytes replace its value (hash, key and place kept, a new header
 * and checksum).  The runs of entries between two changes are copied as
 * bytes, never walked: a merge costs its changes plus a memcpy of the rest. */
PyObject *
udng_native_table_merge(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyList_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError, "table_merge(dst, off, src, start, end, changes: list)");
        return NULL;
    }
    Py_ssize_t off = PyLong_AsSsize_t(args[1]);
    Py_ssize_t start = PyLong_AsSsize_t(args[3]);
    Py_ssize_t end = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *changes = args[5];
    int dry = args[0] == Py_None;
    Py_buffer out, in;
    if (writer_buffers(args[0], args[2], &out, &in) < 0)
        return NULL;
    PyObject *result = NULL;
    const char *usage = NULL, *bad = NULL;
    table_view t = {(const unsigned char *)in.buf, 0, (uint64_t)start, (uint64_t)end, in.len};
    unsigned char *b = (unsigned char *)out.buf;
    if (off < 0 || (off & 7) || off > out.len || start < T_HEADER || (start & 7) || start > end || end > in.len) {
        usage = "table_merge: bounds do not fit the buffers";
        goto done;
    }
    Py_ssize_t pos = start;
    for (Py_ssize_t i = 0; i <= PyList_GET_SIZE(changes); i++) {
        Py_ssize_t at = end;
        PyObject *value = Py_None;
        if (i < PyList_GET_SIZE(changes)) {
            PyObject *item = PyList_GET_ITEM(changes, i);
            if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) {
                usage = "table_merge: a change is not an (offset, value) pair";
                goto done;
            }
            at = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
            if (at == -1 && PyErr_Occurred())
                goto done;
            value = PyTuple_GET_ITEM(item, 1);
            if (value != Py_None && !PyBytes_CheckExact(value)) {
                usage = "table_merge: a new value is not bytes";
                goto done;
            }
            if (at < pos) {
                usage = "table_merge: offsets not sorted, or not the start of an entry";
                goto done;
            }
        }
        Py_ssize_t run = at - pos;  /* the unchanged entries before it */
        if (run < 0) {  /* (the last changed entry's padding past an unaligned end) */
            bad = "table entry runs past the entries";
            goto done;
        }
        if (run > out.len - off) {
            usage = "table_merge: the buffer is too small";
            goto done;
        }
        if (!dry)
            memcpy(b + off, t.b + pos, (size_t)run);
        off += run;
        if (i == PyList_GET_SIZE(changes))
            break;
        uint32_t kl, vl;
        if ((bad = check_entry(&t, (uint64_t)at, &kl, &vl)) != NULL)
            goto done;
        pos = (at + T_ENTRY + kl + vl + 7) & ~(Py_ssize_t)7;
        if (value == Py_None)
            continue;
        Py_ssize_t nvl = PyBytes_GET_SIZE(value);
        if ((uint64_t)nvl > 0xFFFFFFFFULL) {
            usage = "a key or value of 4 GiB or more cannot go in a table entry";
            goto done;
        }
        Py_ssize_t size = (T_ENTRY + kl + nvl + 7) & ~(Py_ssize_t)7;
        if (size > out.len - off) {
            usage = "table_merge: the buffer is too small";
            goto done;
        }
        if (!dry) {
            unsigned char *e = b + off;
            const unsigned char *old = t.b + at;
            memcpy(e, old, 8);  /* (the hash, as stored) */
            wr32(e + 8, kl);
            wr32(e + 12, (uint32_t)nvl);
            wr32(e + 20, 0);
            memcpy(e + T_ENTRY, old + T_ENTRY, kl);
            memcpy(e + T_ENTRY + kl, PyBytes_AS_STRING(value), (size_t)nvl);
            memset(e + T_ENTRY + kl + nvl, 0, (size_t)(size - T_ENTRY - kl - nvl));
            wr32(e + 16, udng_crc32(udng_crc32(0, e, 16), e + T_ENTRY, (size_t)kl + (size_t)nvl));
        }
        off += size;
    }
    result = PyLong_FromSsize_t(off);
done:
    if (bad != NULL)
        result = PyUnicode_FromString(bad);
    else if (usage != NULL)
        PyErr_SetString(PyExc_ValueError, usage);
    PyBuffer_Release(&in);
    if (!dry)
        PyBuffer_Release(&out);
    return result;
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
    if (view_args(args, &pb, &t) < 0)
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
