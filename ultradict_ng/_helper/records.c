/* The stream's records: their CRC-32 and header, the reader's check of
 * copied stream bytes (parse_records, layout.py reader step 4), the length
 * of one msgpack object (framing), and the replay of runs of root-level
 * scalar sets (apply_sets, apply_simple).  Why compiled: a reader checks and
 * applies every record another process wrote; one C call per chunk instead
 * of a Python frame per record.  The twin is records.py. */
#include "udng.h"
#include <string.h>

/* ---- CRC-32 (the zlib / IEEE 802.3 polynomial), slicing by 8 ------------- */

static uint32_t crc_table[8][256];

void
udng_crc_init(void)
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

uint32_t
udng_crc32(uint32_t crc, const unsigned char *p, size_t n)
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


/* The 16-byte record header (layout.py, "Stream record") in front of the
 * `length` payload bytes already stored at rec + 16: le32 length, le32 tag,
 * le32 crc32(payload, crc32(length, tag)), le32 unit (1: a record that is a
 * whole mutation; a transaction's: its offset from the first, shifted). */
void
udng_put_header(unsigned char *rec, uint32_t length, uint32_t tag, uint32_t unit)
{
    unsigned char header[16];
    udng_wr32le(header, length);
    udng_wr32le(header + 4, tag);
    uint32_t crc = udng_crc32(0, header, 8);
    crc = udng_crc32(crc, rec + 16, length);
    udng_wr32le(header + 8, crc);
    udng_wr32le(header + 12, unit);
    memcpy(rec, header, 16);
}



/* The length of the one msgpack object at p[0:n], or -1 if p does not start
 * with a complete, well-formed object.  Ext payloads are opaque.  Every
 * pending item consumes at least one byte, so the loop ends within n bytes
 * whatever the counts claim. */
Py_ssize_t
udng_mp_skip(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t pos = 0;
    uint64_t pending = 1;
#define NEED(k) do { if ((Py_ssize_t)(k) > n - pos) return -1; } while (0)
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
        case 0xc5: case 0xda: NEED(2); len = udng_rd16be(p + pos); pos += 2; break;
        case 0xc6: case 0xdb: NEED(4); len = udng_rd32be(p + pos); pos += 4; break;
        case 0xc7: NEED(2); len = (uint64_t)p[pos] + 1; pos += 1; break;
        case 0xc8: NEED(3); len = udng_rd16be(p + pos) + 1; pos += 2; break;
        case 0xc9: NEED(5); len = udng_rd32be(p + pos) + 1; pos += 4; break;
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
        case 0xdc: NEED(2); pending += udng_rd16be(p + pos); pos += 2; continue;
        case 0xdd: NEED(4); pending += udng_rd32be(p + pos); pos += 4; continue;
        case 0xde: NEED(2); pending += 2 * udng_rd16be(p + pos); pos += 2; continue;
        case 0xdf: NEED(4); pending += 2 * udng_rd32be(p + pos); pos += 4; continue;
        default: return -1;  /* 0xc1: never used */
        }
        if (len > (uint64_t)(n - pos))
            return -1;
        pos += (Py_ssize_t)len;
    }
#undef NEED
    return pos;
}



PyObject *
udng_native_msgpack_length(PyObject *module, PyObject *arg)
{
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t r = udng_mp_skip((const unsigned char *)b.buf, b.len);
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

PyObject *
udng_native_parse_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 3 && nargs != 4) || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "parse_records(chunk: bytes, tag, base[, one_msgpack])");
        return NULL;
    }
    int one_msgpack = nargs == 4 ? PyObject_IsTrue(args[3]) : 0;
    if (one_msgpack < 0)
        return NULL;
    uint64_t tag;
    if (!udng_u64_arg(args[1], &tag))
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
            return PyErr_Format(PyExc_ValueError, "truncated record header at stream offset %zd", base + pos);
        }
        uint32_t length = udng_rd32le(p + pos), rtag = udng_rd32le(p + pos + 4), crc = udng_rd32le(p + pos + 8);
        Py_ssize_t start = pos + 16;
        if ((Py_ssize_t)length > n - start)
            problem = "overruns the published end";
        else if (rtag != (uint32_t)tag)
            problem = "belongs to another generation";
        else if (udng_crc32(udng_crc32(0, p + pos, 8), p + start, length) != crc)
            problem = "fails its checksum";
        else if (one_msgpack && udng_mp_skip(p + start, (Py_ssize_t)length) != (Py_ssize_t)length)
            problem = "is not exactly one msgpack object";
        if (problem != NULL) {
            Py_DECREF(out);
            return PyErr_Format(PyExc_ValueError, "record at stream offset %zd %s", base + pos, problem);
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



/* apply_sets(data, records, start, op_set, key_types) -> index.  Applies
 * records[start:] to the dict `data` while each is a root-level set of a
 * scalar key -- a list [op_set, [], key, value] with type(key) in key_types
 * (a frozenset) -- and returns the index of the first record it did not
 * apply (len(records) when all were).  Store._refresh's inline case of
 * _apply, one C loop for a replayed stream. */
PyObject *
udng_native_apply_sets(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
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

/* apply_simple(data, payloads, start, op_set[, op_del]) -> index.  Applies
 * the record payloads[start:] to `data` -- a dict, or a big dict's cache (a
 * TableCacheBase, whose own set and delete keep its bookkeeping:
 * tablecache.c) -- while each is a root-level set of a scalar key to a
 * scalar or a tuple of scalars, as msgpack wrote it -- exactly fixarray 4,
 * positive fixint op_set, fixarray 0, the key, the value -- or, given
 * op_del, a root-level delete of a scalar key (fixarray 3, op_del,
 * fixarray 0, the key) that the cache holds; it returns the index of the
 * first payload it did not apply (the caller decodes the rest; nothing is
 * applied twice).  The key and value decode as the codec decodes them
 * (unpack.c's udng_simple_value: msgpack's own result, or a decline).  A
 * delete of a key the cache does not hold stops here too: the caller's
 * general path then finds the record does not fit.
 *
 * Why: the reader's replay of a long stream into a dict cache decoded every
 * record to a list through msgpack's Unpacker and its ext hook (~1-2 us a
 * record) before apply_sets stored it; here one pass decodes the key and
 * value only (a recovery's million records: seconds).  A big dict's cache
 * took every record through that decode and a Python apply: a process
 * attaching to a million-key dict whose stream held a million writes
 * replayed them for 1.5-2.8 s.  Deletes are taken too because a stream of
 * sets and deletes (a cache that evicts) went to the general path at its
 * first delete. */

/* The key p[0..n) encodes, as apply_simple takes it: a scalar (a tuple is
 * no key here: apply_sets' rule); else NULL, no error set. */
static PyObject *
simple_key(const unsigned char *p, Py_ssize_t n)
{
    PyObject *key = udng_simple_value(p, n);
    if (key != NULL && PyTuple_CheckExact(key))
        Py_CLEAR(key);
    return key;
}

PyObject *
udng_native_apply_simple(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 4 && nargs != 5) || !(PyDict_CheckExact(args[0]) || udng_as_tablecache(args[0]) != NULL) ||
        !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "apply_simple(data: dict | TableCacheBase, payloads: list, start, op_set[, op_del])");
        return NULL;
    }
    PyObject *data = args[0], *payloads = args[1];
    int plain = PyDict_CheckExact(data);
    Py_ssize_t i = PyLong_AsSsize_t(args[2]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    long op_set = PyLong_AsLong(args[3]);
    if (op_set == -1 && PyErr_Occurred())
        return NULL;
    long op_del = nargs == 5 ? PyLong_AsLong(args[4]) : -1;
    if (op_del == -1 && PyErr_Occurred())
        return NULL;
    if (op_set < 0 || op_set > 0x7f)  /* (not a positive fixint: nothing is of this form) */
        return PyLong_FromSsize_t(i);
    if (op_del > 0x7f || op_del == op_set)
        op_del = -1;
    for (; i >= 0 && i < PyList_GET_SIZE(payloads); i++) {
        PyObject *b = PyList_GET_ITEM(payloads, i);
        if (!PyBytes_CheckExact(b))
            break;
        const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(b);
        Py_ssize_t n = PyBytes_GET_SIZE(b);
        if (op_del >= 0 && n >= 4 && p[0] == 0x93 && p[1] == (unsigned char)op_del && p[2] == 0x90) {
            if (udng_mp_skip(p + 3, n - 3) != n - 3)
                break;
            PyObject *key = simple_key(p + 3, n - 3);
            if (key == NULL)
                break;
            int r = plain ? PyDict_DelItem(data, key) : PyObject_DelItem(data, key);
            Py_DECREF(key);
            if (r < 0) {
                if (!PyErr_ExceptionMatches(PyExc_KeyError))
                    return NULL;
                PyErr_Clear();  /* (not held: the general path reports the record) */
                break;
            }
            continue;
        }
        if (n < 5 || p[0] != 0x94 || p[1] != (unsigned char)op_set || p[2] != 0x90)
            break;
        Py_ssize_t kl = udng_mp_skip(p + 3, n - 3);
        if (kl <= 0 || kl >= n - 3)
            break;
        PyObject *key = simple_key(p + 3, kl);
        if (key == NULL)
            break;
        PyObject *value = udng_simple_value(p + 3 + kl, n - 3 - kl);
        if (value == NULL) {
            Py_DECREF(key);
            break;
        }
        int r = plain ? PyDict_SetItem(data, key, value) : PyObject_SetItem(data, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (r < 0)
            return NULL;
    }
    return PyLong_FromSsize_t(i);
}

PyObject *
udng_native_crc32(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer data;
    uint64_t start = 0;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32(data, value=0)");
        return NULL;
    }
    if (nargs == 2 && !udng_u64_arg(args[1], &start))
        return NULL;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc = udng_crc32((uint32_t)start, (const unsigned char *)data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

