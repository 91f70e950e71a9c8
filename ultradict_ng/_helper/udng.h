/* The compiled helper's internal header: every function one C file of the
 * helper calls in another is declared here, once, so a changed signature
 * fails to compile instead of being retyped by hand in each caller.
 * (TableCacheBase's fields, read where they lie by the read path, are in
 * tablecache.h.)  Every .c file of the helper includes this first. */
#ifndef UDNG_H
#define UDNG_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* ---- copytree.c: what a read hands out as it is, and copies of the rest -- */

/* The frozenset of value types a read hands out without a copy
 * (codec.IMMUTABLE_TYPES), given by set_immutable_types(); NULL before. */
extern PyObject *udng_immutable_types;

/* A value of an immutable type: the scalars by pointer compare, the rest
 * (frozenset, date, Decimal, ...) by membership in udng_immutable_types.
 * Inline: every read of the hit path asks it. */
static inline int
udng_is_immutable(PyObject *v)
{
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyLong_Type || t == &PyUnicode_Type || t == &PyFloat_Type || t == &PyBool_Type ||
        t == &PyBytes_Type || v == Py_None)
        return 1;
    if (udng_immutable_types == NULL)
        return 0;
    int r = PySet_Contains(udng_immutable_types, (PyObject *)t);
    if (r < 0) {
        PyErr_Clear();
        return 0;
    }
    return r;
}

/* A tuple whose items are all of immutable types (one level: a tuple inside
 * is not looked into): as immutable as they are, handed out as it is --
 * the value shape of lookup tables, (int, str, float). */
static inline int
udng_is_immutable_tuple(PyObject *v)
{
    if (!PyTuple_CheckExact(v))
        return 0;
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(v); i < n; i++)
        if (!udng_is_immutable(PyTuple_GET_ITEM(v, i)))
            return 0;
    return 1;
}

/* The caller's own copy of a plain value (codec.copy_value's result), a new
 * reference; NULL without an error when the value holds anything but
 * immutable values, lists, dicts, tuples, sets and bytearrays, or is nested
 * deeper than UDNG_COPY_DEPTH (the Python rules decide); NULL with an error
 * when memory runs out. */
#define UDNG_COPY_DEPTH 64
PyObject *udng_copy_tree(PyObject *v);

PyObject *udng_native_copy_plain(PyObject *module, PyObject *v);
PyObject *udng_native_first_to_export(PyObject *module, PyObject *pairs);
PyObject *udng_native_set_immutable_types(PyObject *module, PyObject *types);

/* ---- _native.c -------------------------------------------------------------- */

/* zlib's CRC-32. */
uint32_t udng_crc32(uint32_t crc, const unsigned char *p, size_t n);
/* The codec's msgpack bytes of a scalar or a tuple of scalars, or NULL. */
PyObject *udng_pack_value(PyObject *v);
/* The length of the one msgpack object at p, or -1. */
Py_ssize_t udng_mp_skip(const unsigned char *p, Py_ssize_t n);

/* ---- keyhash.c ---------------------------------------------------------------- */

int udng_key_hash_common(PyObject *key, uint64_t *out);
PyObject *udng_native_key_hash_common(PyObject *module, PyObject *key);

/* ---- unpack.c ------------------------------------------------------------------- */

PyObject *udng_simple_value(const unsigned char *p, Py_ssize_t n);
PyObject *udng_native_unpack_simple(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_tuple_hook(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* ---- table.c ------------------------------------------------------------------- */

int udng_table_row_simple(PyObject *probe, PyObject *key, PyObject **out);
int udng_table_locate(PyObject *probe, PyObject *key);
PyObject *udng_native_table_get(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_table_candidates(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_table_fill(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_table_merge(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_table_changes(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_table_index(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_table_chunk(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_table_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* ---- tablecache.c --------------------------------------------------------------- */

int udng_tablecache_add(PyObject *m);

#endif
