/* msgpack encoding, byte for byte msgpack-python's Packer(use_bin_type=True):
 * scalars and tuples of scalars (the codec's ext 1) for write_simple and the
 * table's rows, JSON-like trees (write_simple's plain values), and a big
 * dict's pairs packed in one call (pack_map, pack_pairs).  Why compiled:
 * the codec's general path walks types and calls hooks per value.  The twin
 * is packing.py. */
#include "udng.h"
#include <string.h>

/* ---- write_simple: a scalar record encoded straight into the stream ------ */

/* The msgpack encoding of one scalar, byte for byte what msgpack-python's
 * Packer(use_bin_type=True) produces (tests/test_native.py compares them):
 * None, bool, int within 64 bits, float (as float 64), str (UTF-8), bytes.
 * Returns the encoded size, or -1 if the value is not such a scalar (no
 * exception set: the caller takes the general path).  With dst NULL only
 * measures. */
Py_ssize_t
udng_mp_scalar(PyObject *o, unsigned char *dst)
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

/* A tuple of at most 15 scalars (udng_mp_scalar's types; no bytes item of
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
Py_ssize_t
udng_mp_value(PyObject *o, unsigned char *dst, Py_ssize_t threshold)
{
    if (PyTuple_CheckExact(o))
        return mp_scalar_tuple(o, dst, threshold);
    return udng_mp_scalar(o, dst);
}

/* ---- pack_map, pack_pairs: a big dict of scalar rows packed in one call ------ */

/* A key or value of pack_map/pack_pairs: udng_mp_value's, and no bytes of
 * `threshold` bytes or more when threshold > 0 (those go to blobs). */
static Py_ssize_t
mp_item(PyObject *o, unsigned char *dst, Py_ssize_t threshold)
{
    if (threshold > 0 && PyBytes_CheckExact(o) && PyBytes_GET_SIZE(o) >= threshold)
        return -1;
    return udng_mp_value(o, dst, threshold);
}

/* The codec's bytes of a value mp_item takes (a scalar, or a tuple of at most
 * 15 scalars), as a new bytes object, for tableprobe.c's table_changes; NULL with
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
 * a scalar (udng_mp_scalar's types, no bytes of `threshold` bytes or more when
 * threshold > 0: those go to blobs), or an exact dict (scalar keys) or list
 * of such values, at most UDNG_PLAIN_DEPTH containers deep -- the msgpack
 * map and array msgpack-python writes, which is the codec's encoding of them
 * (no ext type below).  Returns the encoded size, or -1 (not such a value;
 * no exception set).  With dst NULL only measures; no Python code runs, so
 * the two passes see the same tree.  The twin is words.plain_ok. */
static Py_ssize_t
mp_plain(PyObject *o, unsigned char *dst, Py_ssize_t threshold, int depth)
{
    int is_map = PyDict_CheckExact(o);
    if (!is_map && !PyList_CheckExact(o)) {
        if (threshold > 0 && PyBytes_CheckExact(o) && PyBytes_GET_SIZE(o) >= threshold)
            return -1;
        return udng_mp_scalar(o, dst);
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
            if ((m = udng_mp_scalar(k, dst ? dst + total : NULL)) < 0)
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
Py_ssize_t
udng_mp_plain_value(PyObject *o, unsigned char *dst, Py_ssize_t threshold)
{
    if (PyDict_CheckExact(o) || PyList_CheckExact(o))
        return mp_plain(o, dst, threshold, 0);
    if (!PyTuple_CheckExact(o))
        return udng_mp_scalar(o, dst);  /* (as udng_mp_value: a large bytes is the caller's to refuse) */
    return mp_tuple_ext(o, dst, threshold);
}

/* Pairs of a dict (is_map) or of a list of [key, value] lists: the size of
 * their encoding (header included) -- keys scalars (udng_mp_scalar's types),
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
        Py_ssize_t nk = udng_mp_scalar(k, dst ? dst + total : NULL);
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
PyObject *
udng_native_pack_map(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return pack_pairs_common(args, nargs, 1, "pack_map(obj, threshold)");
}

/* pack_pairs(pairs, threshold) -> bytes or None: as pack_map for a list of
 * [key, value] lists (an update record's pairs), packed as an array of
 * 2-item arrays. */
PyObject *
udng_native_pack_pairs(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return pack_pairs_common(args, nargs, 0, "pack_pairs(pairs, threshold)");
}

