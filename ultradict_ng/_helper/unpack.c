/*
 * Decoding of the values a big dict holds most, compiled: a scalar, or a
 * tuple of scalars (the codec's ext 1, _codec/ext.py) -- a lookup table's
 * rows.  Part of ultradict_ng._helper._native; the twins are in
 * _helper/unpack.py.
 *
 * Why: the codec decodes a tuple through msgpack's ext_hook, a Python
 * function that runs a nested unpackb for the items: ~0.6 us a tuple, six
 * times what msgpack takes for the same items as a plain array.  A reader of
 * a big dict decodes one value per first read and every value per walk, so
 * that callback was most of the cost of both.
 *
 *   unpack_simple(data, default)
 *       The value of ``data`` (bytes) when it is exactly one msgpack scalar
 *       (nil, bool, int, float 32/64, str, bin) or one ext 1 whose payload is
 *       an array of such scalars (a tuple); else ``default``: the caller
 *       takes the codec's general path, which gives the same value or the
 *       error.  Declined too: truncated or trailing bytes, a str that is not
 *       UTF-8 -- whatever msgpack would reject or decode otherwise -- so the
 *       result is msgpack's, never a second opinion.
 *   table_rows (tablewalk.c) decodes a table's entries with the same function.
 *   tuple_hook(fallback, code, data)
 *       The codec's root ext hook (functools.partial binds ``fallback``, the
 *       Python hook): an ext 1 whose payload is an array of scalars becomes
 *       the tuple here; anything else is fallback(code, data).
 *
 * Scalars decode as msgpack decodes them with raw=False: a str through
 * strict UTF-8, a bin as bytes, a float 32 widened to a double.
 */
#include "udng.h"
#include <stdint.h>
#include <string.h>

#define EXT_TUPLE 1


/* The scalar at p (n bytes left): a new reference, *used set; NULL when it is
 * not a scalar, is cut short or does not decode (any error cleared: the
 * caller declines and the general path raises it). */
static PyObject *
scalar_at(const unsigned char *p, Py_ssize_t n, Py_ssize_t *used)
{
    if (n < 1)
        return NULL;
    unsigned int b = p[0];
    Py_ssize_t len, head;
    PyObject *v;
#define NEED(k) do { if (n < (Py_ssize_t)(k)) return NULL; } while (0)
    if (b <= 0x7f) {
        *used = 1;
        return PyLong_FromLong((long)b);
    }
    if (b >= 0xe0) {
        *used = 1;
        return PyLong_FromLong((long)(int8_t)b);
    }
    if (b >= 0xa0 && b <= 0xbf) {
        len = b & 0x1f;
        head = 1;
        goto str;
    }
    switch (b) {
    case 0xc0: *used = 1; Py_RETURN_NONE;
    case 0xc2: *used = 1; Py_RETURN_FALSE;
    case 0xc3: *used = 1; Py_RETURN_TRUE;
    case 0xc4: NEED(2); len = p[1]; head = 2; goto bin;
    case 0xc5: NEED(3); len = udng_rd16be(p + 1); head = 3; goto bin;
    case 0xc6: NEED(5); len = udng_rd32be(p + 1); head = 5; goto bin;
    case 0xca: {
        NEED(5);
        uint32_t bits = udng_rd32be(p + 1);
        float f;
        memcpy(&f, &bits, 4);
        *used = 5;
        return PyFloat_FromDouble((double)f);
    }
    case 0xcb: {
        NEED(9);
        uint64_t bits = udng_rd64be(p + 1);
        double d;
        memcpy(&d, &bits, 8);
        *used = 9;
        return PyFloat_FromDouble(d);
    }
    case 0xcc: NEED(2); *used = 2; return PyLong_FromLong((long)p[1]);
    case 0xcd: NEED(3); *used = 3; return PyLong_FromLong((long)udng_rd16be(p + 1));
    case 0xce: NEED(5); *used = 5; return PyLong_FromUnsignedLongLong(udng_rd32be(p + 1));
    case 0xcf: NEED(9); *used = 9; return PyLong_FromUnsignedLongLong(udng_rd64be(p + 1));
    case 0xd0: NEED(2); *used = 2; return PyLong_FromLong((long)(int8_t)p[1]);
    case 0xd1: NEED(3); *used = 3; return PyLong_FromLong((long)(int16_t)udng_rd16be(p + 1));
    case 0xd2: NEED(5); *used = 5; return PyLong_FromLongLong((long long)(int32_t)udng_rd32be(p + 1));
    case 0xd3: NEED(9); *used = 9; return PyLong_FromLongLong((long long)(int64_t)udng_rd64be(p + 1));
    case 0xd9: NEED(2); len = p[1]; head = 2; goto str;
    case 0xda: NEED(3); len = udng_rd16be(p + 1); head = 3; goto str;
    case 0xdb: NEED(5); len = udng_rd32be(p + 1); head = 5; goto str;
    default: return NULL;
    }
str:
    if (len > n - head)
        return NULL;
    v = PyUnicode_DecodeUTF8((const char *)p + head, len, NULL);
    if (v == NULL) {
        PyErr_Clear();
        return NULL;
    }
    *used = head + len;
    return v;
bin:
    if (len > n - head)
        return NULL;
    v = PyBytes_FromStringAndSize((const char *)p + head, len);
    if (v == NULL) {
        PyErr_Clear();
        return NULL;
    }
    *used = head + len;
    return v;
#undef NEED
}

/* The tuple of the ext 1 payload p[0..n): exactly an array of scalars, or
 * NULL (declined, no error set). */
static PyObject *
tuple_payload(const unsigned char *p, Py_ssize_t n)
{
    if (n < 1)
        return NULL;
    unsigned int b = p[0];
    Py_ssize_t count, pos;
    if (b >= 0x90 && b <= 0x9f) {
        count = b & 0x0f;
        pos = 1;
    } else if (b == 0xdc && n >= 3) {
        count = udng_rd16be(p + 1);
        pos = 3;
    } else if (b == 0xdd && n >= 5) {
        count = udng_rd32be(p + 1);
        pos = 5;
    } else {
        return NULL;
    }
    if (count > n - pos)  /* (every item takes a byte at least: no huge tuple of garbage) */
        return NULL;
    PyObject *t = PyTuple_New(count);
    if (t == NULL) {
        PyErr_Clear();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t used;
        PyObject *item = scalar_at(p + pos, n - pos, &used);
        if (item == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, item);
        pos += used;
    }
    if (pos != n) {
        Py_DECREF(t);
        return NULL;
    }
    /* Scalars only: no cycle can pass through it, and the collector would
     * untrack it at its first pass (as it does every such tuple) -- after
     * traversing it: a million rows decoded at once made one pass of ~0.3 s. */
    PyObject_GC_UnTrack(t);
    return t;
}

/* The value p[0..n) encodes when it is exactly a scalar or an ext 1 of
 * scalars; else NULL, no error set.  (Also for tablewalk.c's table_rows.) */
PyObject *
udng_simple_value(const unsigned char *p, Py_ssize_t n)
{
    PyObject *v = NULL;
    if (n >= 1) {
        unsigned int b = p[0];
        Py_ssize_t len = -1, head = 0;
        switch (b) {  /* ext: fixext 1/2/4/8/16, ext 8/16/32; then the type byte */
        case 0xd4: len = 1; head = 2; break;
        case 0xd5: len = 2; head = 2; break;
        case 0xd6: len = 4; head = 2; break;
        case 0xd7: len = 8; head = 2; break;
        case 0xd8: len = 16; head = 2; break;
        case 0xc7: if (n >= 3) { len = p[1]; head = 3; } break;
        case 0xc8: if (n >= 4) { len = udng_rd16be(p + 1); head = 4; } break;
        case 0xc9: if (n >= 6) { len = udng_rd32be(p + 1); head = 6; } break;
        default: break;
        }
        if (len >= 0) {
            if (n >= head && p[head - 1] == EXT_TUPLE && len == n - head)
                v = tuple_payload(p + head, len);
        } else {
            Py_ssize_t used;
            v = scalar_at(p, n, &used);
            if (v != NULL && used != n)
                Py_CLEAR(v);
        }
    }
    return v;
}

/* unpack_simple(data, default) */
PyObject *
udng_native_unpack_simple(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "unpack_simple(data: bytes, default)");
        return NULL;
    }
    PyObject *v = udng_simple_value((const unsigned char *)PyBytes_AS_STRING(args[0]),
                                    PyBytes_GET_SIZE(args[0]));
    if (v == NULL) {
        v = args[1];
        Py_INCREF(v);
    }
    return v;
}

/* tuple_hook(fallback, code, data) */
PyObject *
udng_native_tuple_hook(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "tuple_hook(fallback, code, data)");
        return NULL;
    }
    if (PyLong_CheckExact(args[1]) && PyBytes_CheckExact(args[2])) {
        int overflow;
        long code = PyLong_AsLongAndOverflow(args[1], &overflow);
        if (code == EXT_TUPLE && !overflow) {
            PyObject *t = tuple_payload((const unsigned char *)PyBytes_AS_STRING(args[2]),
                                        PyBytes_GET_SIZE(args[2]));
            if (t != NULL)
                return t;
        }
    }
    return PyObject_Vectorcall(args[0], args + 1, 2, NULL);
}
