/* StoreBase and ViewBase: the read hit path of a SharedDict (and a
 * transaction's scalar writes) without a Python frame.  The twin is
 * readpath.py. */
#include "udng.h"
#include <stddef.h>
#include <string.h>
#include <structmember.h>

/* ---- StoreBase and ViewBase: the read hit path in C ---------------------- */

/* StoreBase holds what the hit path of a read needs from store.Store: `seen`
 * (the STATE the local cache reflects, a Python int; -1 forces a reload),
 * `data` (the cache, a dict) and a pointer to the STATE word, bound with
 * _bind_state(words, index) to a Words object that keeps the mapping
 * exported.  ViewBase is the base of SharedDict (members `_store`, `_path`);
 * its __getitem__ answers from the cache when the view is the root and
 * STATE == seen -- one 8-byte load, one compare, one dict lookup -- and
 * hands out a value of an immutable type as it is, and a plain mutable one
 * (a list, a dict unless `recurse`, ...) as the caller's own copy
 * (copytree.c); everything else (a changed STATE, a nested view, a missing
 * key, a value holding a blob's placeholder, a closed handle) calls the
 * Python method `_getitem_slow(key)`, the one implementation of the full
 * rules.
 *
 * It also holds `pos` (the stream offset the cache has read or written up
 * to: Reader.pos) and the write path of an open transaction (layout.py,
 * "Transactions"), armed with _tx_fast(...) by the transaction's thread:
 * ViewBase's __setitem__ then writes a root-level scalar set of that thread
 * past the published end itself -- the record encoded into the stream at
 * `pos`, the cache updated, `pos` advanced -- and calls the Python method
 * `_setitem_slow(key, value)` for everything else (another thread, a nested
 * view, a value or key that is not a plain scalar, a large bytes value, an
 * old value that may hold blobs, a record that no longer fits, a closed
 * handle).  No Python code runs between its checks and its stores (scalar
 * keys hash and compare in C), so no other thread of this process sees a
 * half-made write, as the cache mutex guarantees on the Python path.  The
 * pure-Python twins are in readpath.py (their transaction writes take the
 * Python path). */

static PyObject *str_evict;  /* "evict": a TableCache's drop of the older half of its clean rows */

typedef struct {
    PyObject_HEAD
    PyObject *seen;
    PyObject *data;
    PyObject *state_words;   /* a Words object, or NULL when unbound */
    Py_ssize_t state_index;
    PyObject *pos;           /* `pos` while the transaction path is not armed (an int) */
    /* The armed transaction write path (tx_thread 0: not armed). */
    unsigned long tx_thread;
    Py_ssize_t tx_pos;       /* `pos` while it is armed (no int made per write) */
    Py_ssize_t tx_start;     /* `pos` when it was armed: the transaction's first record */
    Py_ssize_t tx_last;      /* where the last record it wrote begins (-1: none since armed) */
    PyObject *tx_stream;     /* the stream's Words */
    uint32_t tx_tag;         /* gen & GEN_MASK */
    Py_ssize_t tx_limit;     /* LIMIT when armed (fixed while the lock is held) */
    Py_ssize_t tx_threshold; /* bytes values this long go to blobs (0: never) */
    Py_ssize_t tx_blob_index;/* index of BLOB_NEXT in state_words */
    long tx_op_set;
    char recurse;            /* nested dicts are live views: a dict value is not copied here */
    PyObject *immutable;     /* the frozenset of codec.IMMUTABLE_TYPES (NULL: scalars only) */
} StoreBaseObject;

/* A big dict's cache (`data` a TableCache) is read where its fields lie, in
 * its compiled base (tablecache.c): `hot` (decoded values), `dead` (the
 * table's keys deleted since), `fresh` and `changed` (while both are empty,
 * every value in `hot` is a row the decoder made -- a scalar or a tuple of
 * scalars -- handed out without looking at its items), `_probe` (its table)
 * and `_limit` (the most clean rows `hot` keeps, -1 none, past which
 * table_miss asks its `evict` first, or 0: none kept). */

static int
sb_traverse(StoreBaseObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->seen);
    Py_VISIT(self->data);
    Py_VISIT(self->state_words);
    Py_VISIT(self->pos);
    Py_VISIT(self->tx_stream);
    Py_VISIT(self->immutable);
    return 0;
}

static int
sb_clear(StoreBaseObject *self)
{
    Py_CLEAR(self->seen);
    Py_CLEAR(self->data);
    Py_CLEAR(self->state_words);
    Py_CLEAR(self->pos);
    self->tx_thread = 0;
    Py_CLEAR(self->tx_stream);
    Py_CLEAR(self->immutable);
    return 0;
}

static void
sb_dealloc(StoreBaseObject *self)
{
    PyObject_GC_UnTrack(self);
    sb_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
sb_bind_state(StoreBaseObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_bind_state(words or None, index)");
        return NULL;
    }
    if (args[0] == Py_None) {
        Py_CLEAR(self->state_words);
        Py_RETURN_NONE;
    }
    if (!PyObject_TypeCheck(args[0], &udng_WordsType)) {
        PyErr_SetString(PyExc_TypeError, "_bind_state needs a Words object");
        return NULL;
    }
    Py_ssize_t i;
    if (!udng_words_usable((WordsObject *)args[0]) || !udng_word_index((WordsObject *)args[0], args[1], &i))
        return NULL;
    Py_INCREF(args[0]);
    Py_XSETREF(self->state_words, args[0]);
    self->state_index = i;
    Py_RETURN_NONE;
}

/* Disarm the transaction write path, handing `pos` back to the Python int. */
static int
tx_disarm(StoreBaseObject *self)
{
    if (self->tx_thread != 0) {
        PyObject *pos = PyLong_FromSsize_t(self->tx_pos);
        if (pos == NULL)
            return -1;
        Py_XSETREF(self->pos, pos);
        self->tx_thread = 0;
    }
    Py_CLEAR(self->tx_stream);
    return 0;
}

/* `pos`: one variable for Python and C, held in C while the path is armed. */
static PyObject *
sb_get_pos(StoreBaseObject *self, void *closure)
{
    if (self->tx_thread != 0)
        return PyLong_FromSsize_t(self->tx_pos);
    if (self->pos == NULL) {
        PyErr_SetString(PyExc_AttributeError, "pos");
        return NULL;
    }
    Py_INCREF(self->pos);
    return self->pos;
}

static int
sb_set_pos(StoreBaseObject *self, PyObject *value, void *closure)
{
    if (value == NULL || !PyLong_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "pos must be an int");
        return -1;
    }
    if (self->tx_thread != 0) {
        Py_ssize_t pos = PyLong_AsSsize_t(value);
        if (pos == -1 && PyErr_Occurred())
            return -1;
        self->tx_pos = pos;
    }
    Py_INCREF(value);
    Py_XSETREF(self->pos, value);
    return 0;
}

/* `data`: the cache (a dict, or a big dict's TableCache). */
static PyObject *
sb_get_data(StoreBaseObject *self, void *closure)
{
    if (self->data == NULL) {
        PyErr_SetString(PyExc_AttributeError, "data");
        return NULL;
    }
    Py_INCREF(self->data);
    return self->data;
}

static int
sb_set_data(StoreBaseObject *self, PyObject *value, void *closure)
{
    Py_XINCREF(value);
    Py_XSETREF(self->data, value);
    return 0;
}

/* _immutable_types: a frozenset, or None (kept as NULL): checked here, so
 * that the read paths load the field and use it as it is. */
static PyObject *
sb_get_immutable(StoreBaseObject *self, void *closure)
{
    PyObject *imm = self->immutable != NULL ? self->immutable : Py_None;
    Py_INCREF(imm);
    return imm;
}

static int
sb_set_immutable(StoreBaseObject *self, PyObject *value, void *closure)
{
    if (value != NULL && value != Py_None && !PyFrozenSet_CheckExact(value)) {
        PyErr_SetString(PyExc_TypeError, "_immutable_types must be a frozenset of types or None");
        return -1;
    }
    PyObject *imm = value == Py_None ? NULL : value;
    Py_XINCREF(imm);
    Py_XSETREF(self->immutable, imm);
    return 0;
}

static PyGetSetDef sb_getset[] = {
    {"_immutable_types", (getter)sb_get_immutable, (setter)sb_set_immutable,
     "the value types a read hands out without a copy (codec.IMMUTABLE_TYPES); None: the scalars", NULL},
    {"pos", (getter)sb_get_pos, (setter)sb_set_pos, "stream offset the cache reflects (written to, in a transaction)", NULL},
    {"data", (getter)sb_get_data, (setter)sb_set_data, "the local cache", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* _tx_fast(stream, tag, limit, threshold, blob_index, op_set): arm the
 * transaction write path for the calling thread (see above); the state
 * words must be bound.  _tx_fast(None): disarm. */
static PyObject *
sb_tx_fast(StoreBaseObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 1 && args[0] == Py_None) {
        if (tx_disarm(self) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    if (nargs != 6 || !PyObject_TypeCheck(args[0], &udng_WordsType)) {
        PyErr_SetString(PyExc_TypeError, "_tx_fast(stream Words, tag, limit, threshold, blob_index, op_set) "
                                         "or _tx_fast(None)");
        return NULL;
    }
    if (self->state_words == NULL) {
        PyErr_SetString(PyExc_ValueError, "_tx_fast: no state words bound");
        return NULL;
    }
    uint64_t tag;
    Py_ssize_t limit, threshold, blob_index;
    if (!udng_words_usable((WordsObject *)args[0]) || !udng_u64_arg(args[1], &tag) ||
        !udng_word_index((WordsObject *)self->state_words, args[4], &blob_index))
        return NULL;
    limit = PyLong_AsSsize_t(args[2]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    threshold = PyLong_AsSsize_t(args[3]);
    if (threshold == -1 && PyErr_Occurred())
        return NULL;
    long op_set = PyLong_AsLong(args[5]);
    if (op_set == -1 && PyErr_Occurred())
        return NULL;
    if (tag > 0xffffffffu || limit < 0 || threshold < 0 || op_set < 0 || op_set > 127) {
        PyErr_SetString(PyExc_ValueError, "_tx_fast: tag, limit, threshold or op_set out of range");
        return NULL;
    }
    if (tx_disarm(self) < 0)
        return NULL;
    if (self->pos == NULL) {
        PyErr_SetString(PyExc_ValueError, "_tx_fast: pos is not set");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(self->pos);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    self->tx_pos = self->tx_start = pos;
    self->tx_last = -1;
    Py_INCREF(args[0]);
    Py_XSETREF(self->tx_stream, args[0]);
    self->tx_tag = (uint32_t)tag;
    self->tx_limit = limit;
    self->tx_threshold = threshold;
    self->tx_blob_index = blob_index;
    self->tx_op_set = op_set;
    self->tx_thread = PyThread_get_thread_ident();
    Py_RETURN_NONE;
}

static PyMemberDef sb_members[] = {
    {"seen", T_OBJECT_EX, offsetof(StoreBaseObject, seen), 0, "STATE the cache reflects"},
    {"recurse", T_BOOL, offsetof(StoreBaseObject, recurse), 0,
     "nested dicts are live views (a dict value is read as a view, not copied)"},
    {"_tx_last", T_PYSSIZET, offsetof(StoreBaseObject, tx_last), READONLY,
     "offset of the last record the armed transaction path wrote (-1: none)"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef sb_methods[] = {
    {"_bind_state", (PyCFunction)(void (*)(void))sb_bind_state, METH_FASTCALL,
     "_bind_state(words, index): where the read hit path loads STATE (None: nowhere)."},
    {"_tx_fast", (PyCFunction)(void (*)(void))sb_tx_fast, METH_FASTCALL,
     "_tx_fast(stream, tag, limit, threshold, blob_index, op_set): arm the transaction write path "
     "for this thread; _tx_fast(None): disarm."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject udng_StoreBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ultradict_ng._helper._native.StoreBase",
    .tp_basicsize = sizeof(StoreBaseObject),
    .tp_dealloc = (destructor)sb_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Base of store.Store: the fields the C read hit path uses.",
    .tp_traverse = (traverseproc)sb_traverse,
    .tp_clear = (inquiry)sb_clear,
    .tp_members = sb_members,
    .tp_methods = sb_methods,
    .tp_getset = sb_getset,
    .tp_new = PyType_GenericNew,
};


static PyObject *str_getitem_slow;

static int
vb_traverse(ViewObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->store);
    Py_VISIT(self->path);
    return 0;
}

static int
vb_clear(ViewObject *self)
{
    Py_CLEAR(self->store);
    Py_CLEAR(self->path);
    return 0;
}

static void
vb_dealloc(ViewObject *self)
{
    PyObject_GC_UnTrack(self);
    vb_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The store of `view` when it is a root view whose cache is in sync (one
 * 8-byte load of STATE, a compare), else NULL.
 *
 * udng_view_cached: the cached value of `key` when the store is so (cached_in:
 * given the store synced_root returned): 1 found (*out: a new
 * reference), 0 absent, 2 not answerable here (out of sync, a nested view,
 * a closed handle), 3 a key a big dict's cache has not decoded (*out: a new
 * reference to that cache, in sync when checked), -1 error (an unhashable
 * key: dict's TypeError).  The cache is a dict, or a big dict's TableCache
 * (_shm/tablecache.py), whose `hot` dict holds the current value of every
 * key in it: a hit there is a hit, a miss may be in the table.  cached_in's
 * *row (when not NULL) is set to whether a hit is known to be a decoded row
 * (nothing in `hot` but rows: no fresh or changed key), handed out unchecked. */
static inline StoreBaseObject *
synced_root(ViewObject *self)
{
    PyObject *store = self->store;
    if (store == NULL || !PyObject_TypeCheck(store, &udng_StoreBaseType) || self->path == NULL ||
        !PyTuple_CheckExact(self->path) || PyTuple_GET_SIZE(self->path) != 0)
        return NULL;
    StoreBaseObject *s = (StoreBaseObject *)store;
    WordsObject *w = (WordsObject *)s->state_words;
    if (w == NULL || !w->held || s->seen == NULL || !PyLong_CheckExact(s->seen) || s->data == NULL)
        return NULL;
    unsigned long long seen = PyLong_AsUnsignedLongLong(s->seen);
    if (seen == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();  /* seen == -1: a reload is due */
        return NULL;
    }
    if (__atomic_load_n(&w->words[s->state_index], __ATOMIC_ACQUIRE) != seen)
        return NULL;
    return s;
}

static int
cached_in(StoreBaseObject *s, PyObject *key, PyObject **out, int *row)
{
    if (row != NULL)
        *row = 0;
    /* (The cache is held: a key's own __eq__ may run Python code, and
     * another thread then replace or close the cache.) */
    PyObject *data = s->data;
    int partial = !PyDict_CheckExact(data);
    if (partial) {  /* (its `hot`, read in its compiled base) */
        TableCacheBaseObject *c = udng_as_tablecache(data);
        if (c == NULL || c->hot == NULL || !PyDict_CheckExact(c->hot) || c->dead == NULL)
            return 2;
        data = c->hot;
    }
    Py_INCREF(data);
    PyObject *v = PyDict_GetItemWithError(data, key);  /* borrowed */
    Py_XINCREF(v);
    Py_DECREF(data);
    if (v != NULL) {
        *out = v;
        if (partial && row != NULL) {  /* (a key's __eq__ may have run code: `hot` still the store's?) */
            TableCacheBaseObject *c = udng_as_tablecache(s->data);
            *row = c != NULL && data == c->hot && c->fresh != NULL && PyDict_CheckExact(c->fresh) &&
                   PyDict_GET_SIZE(c->fresh) == 0 && c->changed != NULL && PyAnySet_CheckExact(c->changed) &&
                   PySet_GET_SIZE(c->changed) == 0;
        }
        return 1;
    }
    if (PyErr_Occurred())
        return -1;
    if (partial) {  /* the key may be in the table: the TableCache's own miss path */
        *out = s->data;
        Py_INCREF(*out);
        return 3;
    }
    return 0;
}

int
udng_view_cached(ViewObject *self, PyObject *key, PyObject **out)
{
    StoreBaseObject *s = synced_root(self);
    return s == NULL ? 2 : cached_in(s, key, out, NULL);
}


/* A first read of a big dict's str key in compiled code, for `cache`, the
 * store's TableCache just found in sync without the key in `hot`: what
 * TableCache._decode does, without its frames and mutex.  1 found (*out: a
 * new reference, kept in `hot`), 0 absent, 2 not decided here (the Python
 * path decides: a key of another type, a value the serializer decodes, a
 * damaged entry, a cache changed meanwhile), -1 error.
 *
 * Why no mutex: the mutex keeps a record applied by another thread between
 * a Python read's probe and its store in `hot` from being undone by the
 * value read before.  Here no other thread runs between the checks and the
 * store, except while decoding allocates (a collection may run finalizers,
 * which may release the GIL); so everything that decides is checked again
 * after the decode: the table still counted (`_probe` the same object:
 * clear() drops it), the key not put in `hot` (a record's value wins) and
 * not deleted (`dead`), and only then stored. */
static int
table_miss(StoreBaseObject *s, PyObject *cache, PyObject *key, PyObject **out)
{
    PyObject *hot, *dead, *fresh, *changed, *probe, *v = NULL;
    Py_ssize_t limit;
    if (!PyUnicode_CheckExact(key) || s->data != cache ||
        !udng_tablecache_state(cache, &hot, &dead, &fresh, &changed, &probe, &limit) || probe == NULL)
        return 2;
    Py_INCREF(hot);
    Py_INCREF(dead);
    Py_INCREF(probe);  /* (held: the check after the decode compares it by identity) */
    int r = 2;
    int gone = PySet_Contains(dead, key);
    if (gone != 0) {
        r = gone < 0 ? -1 : 0;
        goto done;
    }
    if (limit > 0 && PyDict_GET_SIZE(hot) - PyDict_GET_SIZE(fresh) - PySet_GET_SIZE(changed) >= limit) {
        /* (before the probe: evict runs Python code, which may let a record
         * in; the checks after the decode see what it did) */
        PyObject *res = PyObject_CallMethodNoArgs(cache, str_evict);
        if (res == NULL) {
            r = -1;
            goto done;
        }
        Py_DECREF(res);
    }
    r = udng_table_row_simple(probe, key, &v);
    if (r != 1)
        goto done;
    if (((TableCacheBaseObject *)cache)->probe != probe) {  /* (a TableCacheBase: checked above) */
        r = 2;  /* (the table cleared meanwhile: decided in Python) */
        goto done;
    }
    PyObject *set = PyDict_GetItemWithError(hot, key);  /* borrowed */
    if (set != NULL) {
        Py_INCREF(set);
        Py_SETREF(v, set);
        goto done;
    }
    if (PyErr_Occurred() || (gone = PySet_Contains(dead, key)) < 0) {
        r = -1;
        goto done;
    }
    if (gone) {
        r = 0;
        goto done;
    }
    if (limit != 0 && PyDict_SetItem(hot, key, v) < 0)
        r = -1;
done:
    Py_DECREF(probe);
    Py_DECREF(hot);
    Py_DECREF(dead);
    if (r == 1)
        *out = v;
    else
        Py_XDECREF(v);
    return r;
}

static PyObject *
vb_subscript(ViewObject *self, PyObject *key)
{
    PyObject *v;
    StoreBaseObject *s = synced_root(self);
    if (s != NULL && PyDict_CheckExact(s->data)) {
        /* A dict cache (every small dict's), written out: a read is ~20 ns,
         * and each step of the general path below costs a few percent. */
        v = PyDict_GetItemWithError(s->data, key);  /* borrowed (no code runs until returned) */
        if (v != NULL) {
            PyObject *imm = s->immutable;  /* (a frozenset or NULL: its setter checks) */
            if (udng_is_immutable(v, imm) || udng_is_immutable_tuple(v, imm)) {
                Py_INCREF(v);
                return v;
            }
            if (!s->recurse || !PyDict_CheckExact(v)) {
                /* The caller's own copy (held: an allocation may collect,
                 * and a finalizer run Python code), else the slow path. */
                Py_INCREF(v);
                PyObject *c = udng_copy_tree(v, imm);
                Py_DECREF(v);
                if (c != NULL || PyErr_Occurred())
                    return c;
            }
        } else if (PyErr_Occurred()) {
            return NULL;  /* an unhashable key: dict's TypeError */
        }
        return PyObject_CallMethodOneArg((PyObject *)self, str_getitem_slow, key);
    }
    int row = 0;
    int r = s == NULL ? 2 : cached_in(s, key, &v, &row);  /* (synced once, above) */
    if (r == 1 && row)
        return v;  /* (a row: a scalar or a tuple of scalars) */
    if (r == 3) {
        /* A first read of a big dict's key: decoded in compiled code when it
         * can be (table_miss), else by TableCache.__getitem__, which probes
         * the table and keeps the value decoded (or raises KeyError) without
         * the frames of the slow path -- which still exports what is not
         * immutable, from `hot` now.  (A cache replaced meanwhile still
         * answers for the state it was in sync with: it is kept mapped while
         * referenced.) */
        PyObject *cache = v;
        r = table_miss(s, cache, key, &v);
        if (r == 2) {
            v = PyObject_GetItem(cache, key);
            r = v == NULL ? -1 : 1;
        } else if (r == 0) {
            PyObject *k = PyTuple_Pack(1, key);  /* (KeyError(key), as dict raises it) */
            if (k != NULL) {
                PyErr_SetObject(PyExc_KeyError, k);
                Py_DECREF(k);
            }
            r = -1;
        }
        Py_DECREF(cache);
    }
    if (r == 1) {
        if (udng_is_immutable(v, s->immutable) || udng_is_immutable_tuple(v, s->immutable))
            return v;
        PyObject *c = s->recurse && PyDict_CheckExact(v) ? NULL : udng_copy_tree(v, s->immutable);
        Py_DECREF(v);
        if (c != NULL || PyErr_Occurred())
            return c;
    } else if (r < 0) {
        return NULL;
    }
    return PyObject_CallMethodOneArg((PyObject *)self, str_getitem_slow, key);
}

/* A scalar type (records.SCALAR_TYPES): a value that holds no blob. */
static int
is_scalar(PyObject *v)
{
    PyTypeObject *t = Py_TYPE(v);
    return v == Py_None || t == &PyBool_Type || t == &PyLong_Type || t == &PyFloat_Type ||
           t == &PyUnicode_Type || t == &PyBytes_Type;
}

/* The armed transaction write path (see StoreBase): 1 written, 0 not taken
 * (nothing changed: the caller takes the Python path), -1 error (nothing
 * changed). */
static int
tx_set(ViewObject *self, PyObject *key, PyObject *value)
{
    PyObject *store = self->store;
    if (store == NULL || !PyObject_TypeCheck(store, &udng_StoreBaseType))
        return 0;
    StoreBaseObject *s = (StoreBaseObject *)store;
    if (s->tx_thread == 0 || s->tx_thread != PyThread_get_thread_ident() || self->path == NULL ||
        !PyTuple_CheckExact(self->path) || PyTuple_GET_SIZE(self->path) != 0)
        return 0;
    WordsObject *w = (WordsObject *)s->state_words, *stream = (WordsObject *)s->tx_stream;
    if (w == NULL || !w->held || stream == NULL || !stream->held || s->data == NULL ||
        !PyDict_CheckExact(s->data))
        return 0;  /* closed: the Python path raises Closed */
    if (!is_scalar(key) || (s->tx_threshold > 0 && PyBytes_CheckExact(value) &&
                            PyBytes_GET_SIZE(value) >= s->tx_threshold))
        return 0;  /* a key the stream's fast form does not take; a value for a blob */
    /* The cache is held from here: comparing the key with a cached key of a
     * class whose __eq__ is Python code may let another thread run, and
     * close or reload this handle. */
    PyObject *data = s->data;
    Py_INCREF(data);
    int done = 0;
    if (__atomic_load_n(&w->words[s->tx_blob_index], __ATOMIC_ACQUIRE) != 1) {
        /* Blobs were made: an old value that may hold one must be dropped
         * with it, which the Python path does. */
        PyObject *old = PyDict_GetItemWithError(data, key);  /* borrowed */
        if (old == NULL && PyErr_Occurred())
            done = -1;
        else if (old != NULL && !is_scalar(old))
            goto out;
    }
    if (done == 0) {
        Py_ssize_t back = s->tx_pos - s->tx_start;  /* the unit word: layout.py, "Stream record" */
        Py_ssize_t end = back >= ((Py_ssize_t)1 << 31)
                             ? -1
                             : udng_simple_record(stream, s->tx_pos, s->tx_tag, s->tx_limit, s->tx_op_set, key,
                                             value, s->tx_threshold, (uint32_t)back << 1, 0);
        if (end < 0)
            goto out;  /* not a scalar value, or no room left: the Python path decides */
        if (PyDict_SetItem(data, key, value) < 0)
            done = -1;  /* the cache is unchanged and pos not moved: the record is not there */
        else {
            s->tx_last = s->tx_pos;
            s->tx_pos = end;
            done = 1;
        }
    }
out:
    Py_DECREF(data);
    return done;
}

static PyObject *str_setitem_slow, *str_delitem_slow, *str_set_root, *str_setitem_inline;

/* Whether a root view's set of a value that cannot be a SharedDict (an
 * immutable scalar, a tuple) may be made here: when the handle's class says
 * that its `_setitem_slow` does only its checks, hash(key), then
 * store.set_root(key, value) -- by naming that same function
 * `_setitem_inline` too (SharedDict does; a subclass that overrides
 * `_setitem_slow` is then called, as it must be).  Two lookups in the
 * type's attribute cache: the class, not a global, holds the answer. */
static inline int
root_write_inlined(PyTypeObject *t)
{
    PyObject *slow = _PyType_Lookup(t, str_setitem_slow);  /* borrowed */
    return slow != NULL && slow == _PyType_Lookup(t, str_setitem_inline);
}

PyObject *
udng_view_immutable(ViewObject *view)
{
    PyObject *store = view->store;
    if (store == NULL || !PyObject_TypeCheck(store, &udng_StoreBaseType))
        return NULL;
    return ((StoreBaseObject *)store)->immutable;
}

/* self.<name>(*args[1:]) where the method is a plain function of the class
 * (as _setitem_slow and _delitem_slow are): found through the type's
 * attribute cache and called directly, skipping the instance lookup a
 * method call makes (writes outside transactions pay this call). */
static PyObject *
call_slow(PyObject *name, PyObject *const *args, size_t nargs)
{
    PyObject *func = _PyType_Lookup(Py_TYPE(args[0]), name);  /* borrowed */
    if (func != NULL && PyFunction_Check(func)) {
        Py_INCREF(func);
        PyObject *res = PyObject_Vectorcall(func, args, nargs, NULL);
        Py_DECREF(func);
        return res;
    }
    return PyObject_VectorcallMethod(name, args, nargs | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static int
vb_ass_subscript(ViewObject *self, PyObject *key, PyObject *value)
{
    PyObject *res;
    if (value == NULL) {
        PyObject *args[2] = {(PyObject *)self, key};
        res = call_slow(str_delitem_slow, args, 2);
    } else {
        int r = tx_set(self, key, value);
        if (r != 0)
            return r < 0 ? -1 : 0;
        if (self->store != NULL && self->path != NULL && PyTuple_CheckExact(self->path) &&
            PyTuple_GET_SIZE(self->path) == 0 &&
            (udng_is_immutable(value, udng_view_immutable(self)) || PyTuple_CheckExact(value)) &&
            root_write_inlined(Py_TYPE(self))) {
            if (PyObject_Hash(key) == -1)  /* (unhashable: dict's TypeError, before any lock) */
                return -1;
            PyObject *args[3] = {self->store, key, value};
            res = PyObject_VectorcallMethod(str_set_root, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        } else {
            PyObject *args[3] = {(PyObject *)self, key, value};
            res = call_slow(str_setitem_slow, args, 3);
        }
    }
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

static PyMappingMethods vb_as_mapping = {
    .mp_subscript = (binaryfunc)vb_subscript,
    .mp_ass_subscript = (objobjargproc)vb_ass_subscript,
};

static PyMemberDef vb_members[] = {
    {"_store", T_OBJECT_EX, offsetof(ViewObject, store), 0, "the store (shared by nested views)"},
    {"_path", T_OBJECT_EX, offsetof(ViewObject, path), 0, "keys from the root to this view"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject udng_ViewBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ultradict_ng._helper._native.ViewBase",
    .tp_basicsize = sizeof(ViewObject),
    .tp_dealloc = (destructor)vb_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Base of SharedDict: __getitem__'s hit path, __setitem__'s transaction path (see the source).",
    .tp_traverse = (traverseproc)vb_traverse,
    .tp_clear = (inquiry)vb_clear,
    .tp_as_mapping = &vb_as_mapping,
    .tp_members = vb_members,
    .tp_new = PyType_GenericNew,
};





int
udng_readpath_init(void)
{
    str_getitem_slow = PyUnicode_InternFromString("_getitem_slow");
    str_evict = PyUnicode_InternFromString("evict");
    str_setitem_slow = PyUnicode_InternFromString("_setitem_slow");
    str_delitem_slow = PyUnicode_InternFromString("_delitem_slow");
    str_set_root = PyUnicode_InternFromString("set_root");
    str_setitem_inline = PyUnicode_InternFromString("_setitem_inline");
    return str_getitem_slow == NULL || str_evict == NULL || str_setitem_slow == NULL ||
                   str_delitem_slow == NULL || str_set_root == NULL || str_setitem_inline == NULL
               ? -1
               : 0;
}
