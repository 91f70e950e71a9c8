/* The codec's scans of containers: types_within (may a dict be packed by
 * the fast packers?) and contains_type (does decoded data hold a foreign
 * Timestamp?), each one C walk during which no Python code runs, so no
 * container can change under it.  The twin is typescan.py. */
#include "udng.h"

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

PyObject *
udng_native_types_within(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
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

PyObject *
udng_native_contains_type(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
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
