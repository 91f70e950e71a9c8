/*
 * A shared table's entries written and walked (table_layout.py, "Dump" and
 * "Merge"): a bulk load, a merged dump, the index, and the walks of items()
 * and of a decode of the whole table.  The twin is tablewalk.py.
 *
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
 *       A damaged changed entry: ValueError whose message starts "table
 *       entry", as table_chunk's.
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
 *       checked, while the key and -- unless skipped or replaced, then it
 *       is not decoded -- the value are a scalar or a tuple of scalars
 *       (unpack.c: a lookup table's keys and rows), and returns the offset
 *       where it stopped: end, or the first entry that is not so, for the
 *       serializer (table_chunk from there).  A walk of a
 *       million rows makes no bytes object and calls no serializer.  A
 *       damaged entry: ValueError, as table_chunk.
 *   They raise ValueError on input that does not fit (a malformed map, a
 *   count that disagrees, a buffer too small) before writing past anything.
 *
 * Every entry handed out has been checked as Table.entry checks it (aligned,
 * inside the entries, its zero word zero, its crc); the probe gives up with
 * an error after ``slots`` slots (an index without an empty slot is damaged).
 */
#include "udng.h"
#include <string.h>

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
    else if (off < UDNG_TABLE_HEADER || (off & 7) || off > out.len)
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
        Py_ssize_t size = (UDNG_TABLE_ENTRY_HEADER + kl + vl + 7) & ~(Py_ssize_t)7;
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
        udng_wr64le(e, h);
        udng_wr32le(e + 8, (uint32_t)kl);
        udng_wr32le(e + 12, (uint32_t)vl);
        udng_wr32le(e + 20, 0);
        memcpy(e + UDNG_TABLE_ENTRY_HEADER, p + pos, (size_t)(kl + vl));
        memset(e + UDNG_TABLE_ENTRY_HEADER + kl + vl, 0, (size_t)(size - UDNG_TABLE_ENTRY_HEADER - kl - vl));
        udng_wr32le(e + 16, udng_crc32(udng_crc32(0, e, 16), e + UDNG_TABLE_ENTRY_HEADER, (size_t)(kl + vl)));
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
    if (slots < 8 || (slots & (slots - 1)) || start != UDNG_TABLE_HEADER + 8 * slots || start > end ||
        end > (unsigned long long)out.len || end > UDNG_TABLE_OFFSET_MASK || count >= slots)
        bad = "table_index: bounds do not fit the buffer";
    else {
        memset(b + UDNG_TABLE_HEADER, 0, 8 * slots);
        uint64_t mask = slots - 1, off = start, seen = 0;
        while (off < end) {
            if (off + UDNG_TABLE_ENTRY_HEADER > end || seen == count) {
                bad = "table_index: the entries do not add up to count";
                break;
            }
            uint64_t h = udng_rd64le(b + off), s;
            uint64_t next = (off + UDNG_TABLE_ENTRY_HEADER + udng_rd32le(b + off + 8) + (uint64_t)udng_rd32le(b + off + 12) + 7) & ~7ULL;
            if (next > end) {
                bad = "table_index: an entry runs past the end";
                break;
            }
            uint64_t i = h & mask;
            for (;;) {
                memcpy(&s, b + UDNG_TABLE_HEADER + 8 * i, 8);
                if (s == 0)
                    break;
                i = (i + 1) & mask;
            }
            s = (h & UDNG_TABLE_TAG_MASK) | off;
            memcpy(b + UDNG_TABLE_HEADER + 8 * i, &s, 8);
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
    if (start < UDNG_TABLE_HEADER || start > end || end > (unsigned long long)pb.len || off < start || off > end ||
        most == 0 || most > 0xFFFFFFFFULL)
        bad = "table_chunk: bounds do not fit the buffer";
    /* First pass: how many entries and bytes; each entry checked. */
    uint64_t n = 0, bytes = 0, pos = off;
    while (bad == NULL && pos < end && n < most) {
        uint32_t kl, vl;
        if ((bad = udng_table_check_entry(&t, pos, &kl, &vl)) != NULL)
            break;
        bytes += (uint64_t)kl + vl;
        pos = (pos + UDNG_TABLE_ENTRY_HEADER + kl + vl + 7) & ~7ULL;
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
                uint32_t kl = udng_rd32le(t.b + p + 8), vl = udng_rd32le(t.b + p + 12);
                memcpy(q, t.b + p + UDNG_TABLE_ENTRY_HEADER, (size_t)kl + vl);
                q += (size_t)kl + vl;
                p = (p + UDNG_TABLE_ENTRY_HEADER + kl + vl + 7) & ~7ULL;
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
    if (start < UDNG_TABLE_HEADER || start > end || end > (unsigned long long)pb.len || off < start || off > end)
        bad = "table_rows: bounds do not fit the buffer";
    uint64_t pos = off;
    while (bad == NULL && pos < end) {
        uint32_t kl, vl;
        if ((bad = udng_table_check_entry(&t, pos, &kl, &vl)) != NULL)
            break;
        const unsigned char *body = t.b + pos + UDNG_TABLE_ENTRY_HEADER;
        PyObject *key = udng_simple_value(body, kl);
        if (key == NULL)
            break;
        /* (scalars and tuples of them: their hash and == run no Python code)
         * The key is looked up before its value is decoded: a value left out
         * or replaced is never decoded (after a long stream replayed, most
         * of a big dict's values are replaced). */
        PyObject *value = NULL;
        int r = skip == Py_None ? 0 : PySet_Contains(skip, key);
        if (r == 0 && subst != Py_None) {
            value = PyDict_GetItemWithError(subst, key);  /* borrowed */
            if (value != NULL)
                Py_INCREF(value);
            else if (PyErr_Occurred())
                r = -1;
        }
        if (r == 0 && value == NULL) {
            value = udng_simple_value(body + kl, vl);
            if (value == NULL) {
                Py_DECREF(key);
                break;
            }
        }
        if (r == 0)
            r = row_out(out, key, value);
        Py_DECREF(key);
        Py_XDECREF(value);
        if (r < 0) {
            failed = 1;
            break;
        }
        pos = (pos + UDNG_TABLE_ENTRY_HEADER + kl + vl + 7) & ~7ULL;
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
    if (off < 0 || (off & 7) || off > out.len || start < UDNG_TABLE_HEADER || (start & 7) || start > end || end > in.len) {
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
        if ((bad = udng_table_check_entry(&t, (uint64_t)at, &kl, &vl)) != NULL)
            goto done;
        pos = (at + UDNG_TABLE_ENTRY_HEADER + kl + vl + 7) & ~(Py_ssize_t)7;
        if (value == Py_None)
            continue;
        Py_ssize_t nvl = PyBytes_GET_SIZE(value);
        if ((uint64_t)nvl > 0xFFFFFFFFULL) {
            usage = "a key or value of 4 GiB or more cannot go in a table entry";
            goto done;
        }
        Py_ssize_t size = (UDNG_TABLE_ENTRY_HEADER + kl + nvl + 7) & ~(Py_ssize_t)7;
        if (size > out.len - off) {
            usage = "table_merge: the buffer is too small";
            goto done;
        }
        if (!dry) {
            unsigned char *e = b + off;
            const unsigned char *old = t.b + at;
            memcpy(e, old, 8);  /* (the hash, as stored) */
            udng_wr32le(e + 8, kl);
            udng_wr32le(e + 12, (uint32_t)nvl);
            udng_wr32le(e + 20, 0);
            memcpy(e + UDNG_TABLE_ENTRY_HEADER, old + UDNG_TABLE_ENTRY_HEADER, kl);
            memcpy(e + UDNG_TABLE_ENTRY_HEADER + kl, PyBytes_AS_STRING(value), (size_t)nvl);
            memset(e + UDNG_TABLE_ENTRY_HEADER + kl + nvl, 0, (size_t)(size - UDNG_TABLE_ENTRY_HEADER - kl - nvl));
            udng_wr32le(e + 16, udng_crc32(udng_crc32(0, e, 16), e + UDNG_TABLE_ENTRY_HEADER, (size_t)kl + (size_t)nvl));
        }
        off += size;
    }
    result = PyLong_FromSsize_t(off);
done:
    if (bad != NULL) {  /* (a damaged entry: the message starts "table entry", as table_chunk's) */
        Py_CLEAR(result);
        PyErr_SetString(PyExc_ValueError, bad);
    } else if (usage != NULL)
        PyErr_SetString(PyExc_ValueError, usage);
    PyBuffer_Release(&in);
    if (!dry)
        PyBuffer_Release(&out);
    return result;
}

