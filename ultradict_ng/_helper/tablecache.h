/* TableCacheBase's fields (tablecache.c), shared with _native.c's read path,
 * which reads a big dict's cache where it lies instead of keeping copies of
 * its fields: a hit in `hot` is the hot path of a big dict, and one call or
 * attribute lookup more is a few percent of it. */
#ifndef UDNG_TABLECACHE_H
#define UDNG_TABLECACHE_H

#include <Python.h>

typedef struct {
    PyObject_HEAD
    PyObject *hot;      /* dict: decoded values */
    PyObject *dead;     /* set: the table's keys deleted since */
    PyObject *fresh;    /* dict: keys no counted entry holds, in order */
    PyObject *changed;  /* set: counted keys whose value in hot may not be the table's */
    PyObject *probe;    /* (buf, slots, start, end), or None / NULL */
    PyObject *limit;    /* the most clean rows hot keeps, or None / NULL */
} TableCacheBaseObject;

extern PyTypeObject udng_TableCacheBaseType;

/* `o` as a TableCacheBase (an instance of a subclass: TableCache), or NULL.
 * Its fields may be anything Python code assigned: callers check types. */
static inline TableCacheBaseObject *
udng_as_tablecache(PyObject *o)
{
    PyTypeObject *t = Py_TYPE(o);
    if (t->tp_base == &udng_TableCacheBaseType || t == &udng_TableCacheBaseType ||
        PyType_IsSubtype(t, &udng_TableCacheBaseType))
        return (TableCacheBaseObject *)o;
    return NULL;
}

/* The whole state, checked (tablecache.c): 1 and the fields filled in, or 0. */
int udng_tablecache_state(PyObject *cache, PyObject **hot, PyObject **dead, PyObject **fresh,
                          PyObject **changed, PyObject **probe, Py_ssize_t *limit);

#endif
