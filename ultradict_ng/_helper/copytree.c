/* What a read hands out as it is, and the caller's own copies of the rest.
 *
 * A value read from a shared dict is decoded once per process into its
 * cache; a read of a mutable value (a dict, a list, a set, a bytearray, or
 * a container of them) must hand out a copy that shares no mutable object
 * with the cache (codec.copy_value: the caller may change it).  Copying a
 * decoded tree is the floor for such a read -- it allocates what a decode
 * would and skips the decoding -- and is what makes a JSON-like value read
 * faster than msgpack.unpackb of its bytes; in Python the copy cost ~4x
 * the decode.  Everything not plain (a placeholder of a blob or an array,
 * another type the pickle serializer stored) is left to the Python rules.
 *
 *   set_immutable_types(s) the types handed out without a copy, kept in
 *                          the module's state (udng.h)
 *   udng_copy_tree(v, imm) the copy, or NULL without an error: not plain
 *   copy_plain(v)          the same for Python: the copy, or None
 *   first_to_export(pairs) where a snapshot of items stops handing out as is
 *
 * The twin is copytree.py. */
#include "udng.h"

static inline int
scalar(PyObject *k)
{
    PyTypeObject *t = Py_TYPE(k);
    return t == &PyUnicode_Type || t == &PyLong_Type || t == &PyFloat_Type || t == &PyBool_Type ||
           t == &PyBytes_Type || k == Py_None;
}

/* A dict key whose hash runs no Python code (a scalar, or a tuple of them):
 * a copy only stores values under such keys (PyDict_SetItem hashes it). */
static int
plain_key(PyObject *k)
{
    if (scalar(k))
        return 1;
    if (!PyTuple_CheckExact(k))
        return 0;
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(k); i < n; i++)
        if (!scalar(PyTuple_GET_ITEM(k, i)))
            return 0;
    return 1;
}

static PyObject *copy_at(PyObject *v, int depth, PyObject *imm);

/* A copy of v's item (an immutable one as it is), or NULL (see copy_at). */
static inline PyObject *
copy_item(PyObject *item, int depth, PyObject *imm)
{
    if (udng_is_immutable(item, imm)) {
        Py_INCREF(item);
        return item;
    }
    return copy_at(item, depth, imm);
}

static PyObject *
copy_list(PyObject *v, int depth, PyObject *imm)
{
    Py_ssize_t n = PyList_GET_SIZE(v);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* (copy_item runs no Python code: v keeps its length) */
        PyObject *c = copy_item(PyList_GET_ITEM(v, i), depth, imm);
        if (c == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, c);
    }
    return out;
}

/* PyDict_Copy (which clones a compact table at once), then the values that
 * need their own copy stored over the shared ones. */
static PyObject *
copy_dict(PyObject *v, int depth, PyObject *imm)
{
    PyObject *out = PyDict_Copy(v);
    if (out == NULL)
        return NULL;
    Py_ssize_t pos = 0;
    PyObject *k, *item;
    while (PyDict_Next(v, &pos, &k, &item)) {
        if (udng_is_immutable(item, imm) || udng_is_immutable_tuple(item, imm))
            continue;
        PyObject *c = plain_key(k) ? copy_at(item, depth, imm) : NULL;
        if (c == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        int r = c == item ? 0 : PyDict_SetItem(out, k, c);
        Py_DECREF(c);
        if (r < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* A tuple holding something mutable: a new tuple of copies, or the tuple
 * itself when every copy is its item (tuples of immutable tuples). */
static PyObject *
copy_tuple(PyObject *v, int depth, PyObject *imm)
{
    Py_ssize_t n = PyTuple_GET_SIZE(v);
    PyObject *out = PyTuple_New(n);
    if (out == NULL)
        return NULL;
    int same = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(v, i);
        PyObject *c = copy_item(item, depth, imm);
        if (c == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        same &= c == item;
        PyTuple_SET_ITEM(out, i, c);
    }
    if (same) {
        Py_DECREF(out);
        Py_INCREF(v);
        return v;
    }
    return out;
}

/* The copy of v, nested `depth` containers deep (the root: 1), or NULL:
 * with an error set (memory), or without one (not plain, or too deep). */
static PyObject *
copy_at(PyObject *v, int depth, PyObject *imm)
{
    if (depth > UDNG_COPY_DEPTH)
        return NULL;
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyDict_Type)
        return copy_dict(v, depth + 1, imm);
    if (t == &PyList_Type)
        return copy_list(v, depth + 1, imm);
    if (t == &PyTuple_Type) {
        if (udng_is_immutable_tuple(v, imm)) {
            Py_INCREF(v);
            return v;
        }
        return copy_tuple(v, depth + 1, imm);
    }
    if (t == &PySet_Type)  /* (its members are hashable, kept with their hashes) */
        return PySet_New(v);
    if (t == &PyByteArray_Type)
        return PyByteArray_FromStringAndSize(PyByteArray_AS_STRING(v), PyByteArray_GET_SIZE(v));
    return NULL;
}

PyObject *
udng_copy_tree(PyObject *v, PyObject *imm)
{
    return copy_item(v, 1, imm);
}

/* copy_plain(value) -> the caller's own copy of a plain value (as
 * codec.copy_value makes it), or None: the value holds something else
 * (decided by the Python rules). */
PyObject *
udng_native_copy_plain(PyObject *module, PyObject *v)
{
    PyObject *out = udng_copy_tree(v, udng_get_state(module)->immutable_types);
    if (out == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return out;
}

PyObject *
udng_native_set_immutable_types(PyObject *module, PyObject *types)
{
    if (!PyFrozenSet_CheckExact(types)) {
        PyErr_SetString(PyExc_TypeError, "set_immutable_types needs a frozenset of types");
        return NULL;
    }
    Py_INCREF(types);
    Py_XSETREF(udng_get_state(module)->immutable_types, types);
    Py_RETURN_NONE;
}

/* first_to_export(pairs) -> index of the first (key, value) of the list
 * whose value the hit path would not hand out as it is (udng_is_immutable,
 * udng_is_immutable_tuple), or len(pairs): a snapshot of a big dict's items
 * checks a million values in one call, exporting only from there. */
PyObject *
udng_native_first_to_export(PyObject *module, PyObject *pairs)
{
    if (!PyList_CheckExact(pairs)) {
        PyErr_SetString(PyExc_TypeError, "first_to_export(pairs: list)");
        return NULL;
    }
    PyObject *imm = udng_get_state(module)->immutable_types;
    Py_ssize_t i = 0, n = PyList_GET_SIZE(pairs);
    for (; i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(pairs, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "first_to_export: pairs must be (key, value) tuples");
            return NULL;
        }
        PyObject *v = PyTuple_GET_ITEM(pair, 1);
        if (!udng_is_immutable(v, imm) && !udng_is_immutable_tuple(v, imm))
            break;
    }
    return PyLong_FromSsize_t(i);
}
