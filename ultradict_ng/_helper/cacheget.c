/* CacheGet: SharedCache.get's hit path (cache/layout.py, "Reading") in one
 * call.  The twin is cacheget.py. */
#include "udng.h"
#include <stddef.h>
#include <structmember.h>
#include <time.h>

/* ---- CacheGet: SharedCache.get without a Python frame ------------------- */

/* CacheGet(view, recency, loads, slow, missing) is a SharedCache handle's
 * `get(key, default=None)` (cache/layout.py, "Reading").  When `view`, the
 * cache's SharedDict, answers from its cache (udng_view_cached), an entry
 * (expires, slot, value) whose expires is 0.0 or later than
 * clock_gettime(CLOCK_REALTIME) is a hit: the time is stored at
 * recency[slot] (recency: the side segment's f64 array, held as a buffer
 * export until release(); None without maxsize), and the value returned --
 * as it is when immutable, the caller's own copy when plain (copytree.c),
 * loads(value) when loads is not None (the pickle serializer) and the value
 * is bytes (plain data is stored as itself).  An absent
 * key, an expired entry or a claim (a tuple of 4) is a miss: `default`.
 * Anything else (a view out of sync, a value that is not plain, a slot out of
 * range, an int expiry, a released or closed handle) calls slow(key), the
 * Python rules, which returns the value or `missing`.  hits and misses count
 * this handle's outcomes.  Why compiled: the Python method costs ~0.5 us
 * over the dict's own hit path, most of a hit.  The twin is cacheget.CacheGet. */
typedef struct {
    PyObject_HEAD
    PyObject *view;
    PyObject *loads;
    PyObject *slow;
    PyObject *missing;
    Py_buffer rec;
    int rec_held;
    Py_ssize_t hits;
    Py_ssize_t misses;
    vectorcallfunc vectorcall;
} CacheGetObject;

static PyObject *cg_call(CacheGetObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static PyObject *
cg_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *view, *recency, *loads, *slow, *missing;
    static char *kwlist[] = {"view", "recency", "loads", "slow", "missing", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO:CacheGet", kwlist, &view, &recency, &loads,
                                     &slow, &missing))
        return NULL;
    if (!PyObject_TypeCheck(view, &udng_ViewBaseType)) {
        PyErr_SetString(PyExc_TypeError, "CacheGet needs a SharedDict (a ViewBase)");
        return NULL;
    }
    if (!PyCallable_Check(slow) || (loads != Py_None && !PyCallable_Check(loads))) {
        PyErr_SetString(PyExc_TypeError, "CacheGet: slow and loads (unless None) must be callable");
        return NULL;
    }
    CacheGetObject *self = (CacheGetObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (recency != Py_None) {
        if (PyObject_GetBuffer(recency, &self->rec, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            Py_DECREF(self);
            return NULL;
        }
        self->rec_held = 1;
        if (((uintptr_t)self->rec.buf & 7) != 0 || self->rec.len % 8 != 0) {
            PyErr_SetString(PyExc_ValueError, "CacheGet: recency must be whole, aligned 8-byte words");
            Py_DECREF(self);
            return NULL;
        }
    }
    Py_INCREF(view);
    self->view = view;
    Py_INCREF(loads);
    self->loads = loads;
    Py_INCREF(slow);
    self->slow = slow;
    Py_INCREF(missing);
    self->missing = missing;
    self->vectorcall = (vectorcallfunc)cg_call;
    return (PyObject *)self;
}

static void
cg_release_buffer(CacheGetObject *self)
{
    if (self->rec_held) {
        self->rec_held = 0;
        PyBuffer_Release(&self->rec);
    }
}

static int
cg_traverse(CacheGetObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->view);
    Py_VISIT(self->loads);
    Py_VISIT(self->slow);
    Py_VISIT(self->missing);
    /* Not rec.obj, the recency memoryview whose buffer we hold: a handle
     * dropped unclosed is a cycle (the handle's get is this object, whose
     * `slow` is the handle's method), and a memoryview the collector clears
     * while we hold its export drops its memory anyway (BufferError, then a
     * crash when the mapping goes).  Unvisited, it counts as referenced from
     * outside: the collector clears us, which releases it, and it is freed
     * by its reference count.  It refers to nothing of ours: no leak. */
    return 0;
}

static int
cg_clear(CacheGetObject *self)
{
    cg_release_buffer(self);
    Py_CLEAR(self->view);
    Py_CLEAR(self->loads);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->missing);
    return 0;
}

static void
cg_dealloc(CacheGetObject *self)
{
    PyObject_GC_UnTrack(self);
    cg_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static double
realtime_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The value of a hit on entry e, or NULL without an error when e is not
 * answerable here (slow decides), or NULL with an error. */
static PyObject *
cg_hit(CacheGetObject *self, PyObject *e, double now, int *miss)
{
    PyObject *imm = udng_view_immutable((ViewObject *)self->view);  /* (the store's: borrowed) */
    *miss = 0;
    if (!PyTuple_CheckExact(e))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(e);
    if (n != 3 && n != 4)
        return NULL;
    PyObject *exp = PyTuple_GET_ITEM(e, 0);
    if (!PyFloat_CheckExact(exp))
        return NULL;
    double x = PyFloat_AS_DOUBLE(exp);
    if (!(x == 0.0 || x > now) || n == 4) {  /* expired, or a claim: absent */
        *miss = 1;
        return NULL;
    }
    PyObject *value = PyTuple_GET_ITEM(e, 2), *out;
    if (self->loads != Py_None && PyBytes_CheckExact(value)) {
        out = NULL;  /* a pickle: loads runs after the recency store */
    } else if (udng_is_immutable(value, imm) || udng_is_immutable_tuple(value, imm)) {
        Py_INCREF(value);
        out = value;
    } else {
        out = udng_copy_tree(value, imm);
        if (out == NULL)
            return NULL;
    }
    /* The slot: an int below nslots (0 without recency), else no entry of ours. */
    PyObject *slot = PyTuple_GET_ITEM(e, 1);
    Py_ssize_t i = PyLong_CheckExact(slot) ? PyLong_AsSsize_t(slot) : -1;
    if (i == -1 && PyErr_Occurred())
        PyErr_Clear();
    if (i < 0 || i >= (self->rec_held ? self->rec.len / 8 : 1)) {
        Py_XDECREF(out);
        return NULL;
    }
    if (self->rec_held) {
        uint64_t bits;
        memcpy(&bits, &now, 8);
        __atomic_store_n((uint64_t *)self->rec.buf + i, bits, __ATOMIC_RELAXED);
    }
    if (out == NULL) {
        out = PyObject_CallOneArg(self->loads, value);
        if (out == NULL)
            return NULL;
    }
    return out;
}

static PyObject *
cg_call(CacheGetObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        PyErr_SetString(PyExc_TypeError, "get() takes no keyword arguments");
        return NULL;
    }
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "get() takes 1 or 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (self->view == NULL) {
        PyErr_SetString(PyExc_ValueError, "CacheGet: not initialized");
        return NULL;
    }
    PyObject *key = args[0], *dflt = nargs == 2 ? args[1] : Py_None;
    PyObject *e;
    int r = udng_view_cached((ViewObject *)self->view, key, &e);
    if (r < 0)
        return NULL;
    if (r == 3) {  /* (a cache's entries are few: never a big dict's TableCache in practice) */
        Py_DECREF(e);
        r = 2;
    }
    if (r == 0) {
        self->misses++;
        Py_INCREF(dflt);
        return dflt;
    }
    if (r == 1) {
        int miss;
        /* Hold the view (a key's __eq__ above may have run Python code). */
        PyObject *out = cg_hit(self, e, realtime_now(), &miss);
        Py_DECREF(e);
        if (out != NULL) {
            self->hits++;
            return out;
        }
        if (PyErr_Occurred())
            return NULL;
        if (miss) {
            self->misses++;
            Py_INCREF(dflt);
            return dflt;
        }
    }
    PyObject *out = PyObject_CallOneArg(self->slow, key);
    if (out == NULL)
        return NULL;
    if (out == self->missing) {
        Py_DECREF(out);
        self->misses++;
        Py_INCREF(dflt);
        return dflt;
    }
    self->hits++;
    return out;
}

static PyObject *
cg_release(CacheGetObject *self, PyObject *unused)
{
    cg_release_buffer(self);
    Py_RETURN_NONE;
}

static PyMemberDef cg_members[] = {
    {"hits", T_PYSSIZET, offsetof(CacheGetObject, hits), 0, "hits of this handle"},
    {"misses", T_PYSSIZET, offsetof(CacheGetObject, misses), 0, "misses of this handle"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef cg_methods[] = {
    {"release", (PyCFunction)cg_release, METH_NOARGS,
     "release(): give back the recency buffer (before the side segment closes); later hits store no recency."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject udng_CacheGetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ultradict_ng._helper._native.CacheGet",
    .tp_basicsize = sizeof(CacheGetObject),
    .tp_dealloc = (destructor)cg_dealloc,
    .tp_vectorcall_offset = offsetof(CacheGetObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "CacheGet(view, recency, loads, slow, missing): SharedCache.get's hit path (see the source).",
    .tp_traverse = (traverseproc)cg_traverse,
    .tp_clear = (inquiry)cg_clear,
    .tp_members = cg_members,
    .tp_methods = cg_methods,
    .tp_new = cg_new,
};
