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
 *
 * Every entry handed out has been checked as Table.entry checks it (aligned,
 * inside the entries, its zero word zero, its crc); the probe gives up with
 * an error after ``slots`` slots (an index without an empty slot is damaged).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define T_HEADER 64
#define T_ENTRY 24
#define T_OFFSET_MASK ((1ULL << 40) - 1)
#define T_TAG_MASK (~T_OFFSET_MASK)

int udng_key_hash_common(PyObject *key, uint64_t *out);          /* keyhash.c */
uint32_t udng_crc32(uint32_t crc, const unsigned char *p, size_t n); /* _native.c */

static inline uint64_t rd64(const unsigned char *p)
{
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
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

PyObject *
udng_native_table_get(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "table_get(buf, slots, start, end, key)");
        return NULL;
    }
    PyObject *key = args[4];
    const char *data;
    Py_ssize_t n;
    int is_str = PyUnicode_CheckExact(key);
    if (is_str) {
        data = PyUnicode_AsUTF8AndSize(key, &n);
        if (data == NULL) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    } else if (PyBytes_CheckExact(key)) {
        data = PyBytes_AS_STRING(key);
        n = PyBytes_GET_SIZE(key);
    } else {
        PyErr_SetString(PyExc_TypeError, "table_get takes a str or bytes key");
        return NULL;
    }
    uint64_t h;
    if (udng_key_hash_common(key, &h) != 1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "table_get: key not hashable here");
        return NULL;
    }
    unsigned char head[5];
    size_t hl = msgpack_head(is_str, (size_t)n, head);
    Py_buffer pb;
    table_view t;
    if (view_args(args, &pb, &t) < 0)
        return NULL;
    PyObject *result = NULL;
    const char *bad = NULL;
    uint64_t mask = t.slots - 1, i = h & mask, tag = h & T_TAG_MASK;
    for (uint64_t probes = 0;; probes++, i = (i + 1) & mask) {
        if (probes == t.slots) {
            bad = "table index has no empty slot";
            break;
        }
        uint64_t s;
        memcpy(&s, t.b + T_HEADER + 8 * i, 8); /* native order, as the index is written */
        if (s == 0) {
            result = Py_None;
            Py_INCREF(result);
            break;
        }
        if ((s & T_TAG_MASK) != tag)
            continue;
        uint64_t off = s & T_OFFSET_MASK;
        uint32_t kl, vl;
        if ((bad = check_entry(&t, off, &kl, &vl)) != NULL)
            break;
        const unsigned char *e = t.b + off;
        if (rd64(e) != h || kl != hl + (size_t)n || memcmp(e + T_ENTRY, head, hl) != 0 ||
            memcmp(e + T_ENTRY + hl, data, (size_t)n) != 0)
            continue;
        result = PyBytes_FromStringAndSize((const char *)e + T_ENTRY + kl, vl);
        break;
    }
    PyBuffer_Release(&pb);
    if (bad != NULL)
        return PyUnicode_FromString(bad);
    return result;
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
