/* TableCacheBase: the compiled base of _shm/tablecache.py's TableCache.
 *
 * Why: a process that writes a big dict applies each of its root sets to
 * its TableCache (`data[key] = value`, Writer._set_root), as every process
 * applies the records it replays.  In Python that is four frames a write
 * (__setitem__, _counted, the mutex, Table.locate) around one probe: at a
 * million keys it made a random overwrite ~30% slower than on a small dict,
 * whose cache is a plain dict.  Here the same rule runs in one C call for
 * str and int keys (the keys msgpack tables hold most), for a set and for a
 * delete (tcb_fast_del), and everything else goes to the subclass's
 * `_setitem` / `_delitem`, which hold the rule in full.  The fields are the
 * cache's state (tablecache.py's docstring) that the compiled read path
 * reads where they lie (udng_tablecache_state): `hot`,
 * `dead`, `fresh`, `changed`, `_probe`, `_limit` and `pending`.
 *
 * The rule (TableCache._setitem): a key in `hot` is counted or fresh: its
 * value is replaced in place (order kept), and a counted one is `changed`.
 * Otherwise the key is counted iff it is not `dead` and an entry of the
 * table holds it (the probe, by its encoding), and it becomes `changed`;
 * else it is appended to `fresh`.
 *
 * Placed later: at a million keys, whether the table holds a key is a chain
 * of cache misses (its slot in the index, then its entry), each a page of its
 * own, ~0.5 us of a ~3 us write that the write itself does not need.  So the
 * compiled set of a key not in `hot` appends it to `fresh` marked True (not
 * placed yet: its place in the order is its set's, as a fresh key's) and to
 * `pending`, and `resolve` places the pending keys later, together: the
 * probes of a batch have their misses under way at once (a few times
 * cheaper a key than one by one), before anything reads what placing
 * decides (len, iteration, a dump: TableCache._settle; a delete places its
 * own key only).  A
 * process that counts between its writes (a bounded cache's set asks `len`)
 * would place its keys one at a time, each with a batch's overhead: so a set
 * that comes within EAGER_WITHIN sets of the last `resolve` places its key at
 * once, and only a run of sets with no count between waits.  Comparing
 * an exact str or int with the keys of `hot`, `dead` and `fresh` runs no
 * Python code, so no other thread runs between the checks and the stores
 * (callers hold the cache mutex anyway: records apply under it).
 */

#include "udng.h"
#include <structmember.h>




static PyObject *str_setitem, *str_delitem;

static int
tcb_traverse(TableCacheBaseObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->hot);
    Py_VISIT(self->dead);
    Py_VISIT(self->fresh);
    Py_VISIT(self->changed);
    Py_VISIT(self->probe);
    Py_VISIT(self->limit);
    Py_VISIT(self->pending);
    return 0;
}

static int
tcb_clear(TableCacheBaseObject *self)
{
    Py_CLEAR(self->hot);
    Py_CLEAR(self->dead);
    Py_CLEAR(self->fresh);
    Py_CLEAR(self->changed);
    Py_CLEAR(self->probe);
    Py_CLEAR(self->limit);
    Py_CLEAR(self->pending);
    return 0;
}

static void
tcb_dealloc(TableCacheBaseObject *self)
{
    PyObject_GC_UnTrack(self);  /* (a subclass's dealloc decrefs its heap type itself) */
    tcb_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Sets of keys not in `hot` after a `resolve` that place their key at once
 * (module docstring). */
#define EAGER_WITHIN 16

/* Whether the table `probe` counts `key`, probed now (a set placing its key
 * at once): 1 it does, 0 it does not (or the key is dead), 2 not decided
 * here (the key waits, and resolve's Python rule decides), -1 error. */
static int place_now(TableCacheBaseObject *self, PyObject *probe, PyObject *key);

/* Whether the fields the compiled set and delete use are of their types
 * (Python code may have assigned anything): else the subclass's rule runs. */
static int
fields_ok(TableCacheBaseObject *self)
{
    return self->hot != NULL && PyDict_CheckExact(self->hot) && self->fresh != NULL &&
           PyDict_CheckExact(self->fresh) && self->dead != NULL && PyAnySet_CheckExact(self->dead) &&
           self->changed != NULL && PyAnySet_CheckExact(self->changed) && self->pending != NULL &&
           PyList_CheckExact(self->pending);
}

/* The compiled set: 1 done, 0 not decided here (the caller takes
 * `_setitem`), -1 error.  The stores come after every check; of several,
 * the bookkeeping goes first, so that a store failing (MemoryError) leaves a
 * key in `pending`, `changed` or `fresh` without its value in `hot` -- a
 * KeyError at the next walk or dump -- never a new value the next dump would
 * miss (a key in `pending` not marked in `fresh` is skipped by `resolve`). */
static int
tcb_fast_set(TableCacheBaseObject *self, PyObject *key, PyObject *value)
{
    PyObject *hot = self->hot, *dead = self->dead, *fresh = self->fresh, *changed = self->changed;
    PyObject *pending = self->pending, *probe = self->probe;
    if (!fields_ok(self))
        return 0;
    if (!PyUnicode_CheckExact(key) && !PyLong_CheckExact(key))
        return 0;  /* (a key whose equality may run code, or that the probe does not take) */
    int held = PyDict_Contains(hot, key);
    if (held < 0)
        return -1;
    if (held) {  /* counted (changed now), fresh or not placed yet (both stay as they are) */
        PyObject *mark = PyDict_GetItemWithError(fresh, key);  /* (borrowed) */
        if (mark == NULL && (PyErr_Occurred() || PySet_Add(changed, key) < 0))
            return -1;
        return PyDict_SetItem(hot, key, value) < 0 ? -1 : 1;
    }
    if (probe != NULL && PyTuple_CheckExact(probe) && PyTuple_GET_SIZE(probe) == 4) {  /* placed later */
        int counted = self->since++ < EAGER_WITHIN && PyList_GET_SIZE(pending) == 0
                          ? place_now(self, probe, key)  /* (a count came lately: placed now) */
                          : 2;
        if (counted < 0)
            return -1;
        if (counted == 1)
            return PySet_Add(changed, key) < 0 || PyDict_SetItem(hot, key, value) < 0 ? -1 : 1;
        if (counted == 0)
            return PyDict_SetItem(fresh, key, Py_None) < 0 || PyDict_SetItem(hot, key, value) < 0 ? -1 : 1;
        if (PyList_Append(pending, key) < 0 || PyDict_SetItem(fresh, key, Py_True) < 0 ||
            PyDict_SetItem(hot, key, value) < 0)
            return -1;
        return 1;
    }
    int gone = PySet_Contains(dead, key);  /* (no table to probe: a dead key is fresh, the rest Python's) */
    if (gone <= 0)
        return gone;
    if (PyDict_SetItem(fresh, key, Py_None) < 0 || PyDict_SetItem(hot, key, value) < 0)
        return -1;
    return 1;
}

/* Start the reads of where placing `key` goes in the set `changed` (its
 * slot: PySetObject's table is public in CPython's headers) and in the dict
 * `fresh` (its index slot: the keys object is private, laid out as below
 * from 3.11 on; elsewhere only the set's read starts).  A prefetch never
 * faults, so an address from a layout that differed would cost one useless
 * read, nothing else. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030F0000
typedef struct {
    Py_ssize_t dk_refcnt;
    uint8_t dk_log2_size;
    uint8_t dk_log2_index_bytes;
    uint8_t dk_kind;
    uint32_t dk_version;
    Py_ssize_t dk_usable;
    Py_ssize_t dk_nentries;
    char dk_indices[];
} dict_keys_layout;
#endif

static inline void
prefetch_places(PyObject *changed, PyObject *fresh, PyObject *key)
{
    Py_hash_t hash = PyObject_Hash(key);  /* (an exact str or int: cached or computed, no code runs) */
    if (hash == -1) {
        PyErr_Clear();
        return;
    }
    PySetObject *so = (PySetObject *)changed;
    UDNG_PREFETCH(&so->table[(size_t)hash & (size_t)so->mask]);
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030F0000
    const dict_keys_layout *k = (const dict_keys_layout *)((PyDictObject *)fresh)->ma_keys;
    unsigned size_bits = k->dk_log2_size, width_bits = k->dk_log2_index_bytes - size_bits;
    if (size_bits < 48 && width_bits <= 3)
        UDNG_PREFETCH(k->dk_indices + (((size_t)hash & (((size_t)1 << size_bits) - 1)) << width_bits));
#else
    (void)fresh;
#endif
}

/* One key of a batch being placed: where its probe stands. */
typedef struct {
    PyObject *key;  /* borrowed from the batch */
    int state;      /* 1 probe under way; else its answer: 0 absent, 2 the Python rule decides */
    udng_locate lc;
} placing;

/* How far ahead of the key being placed its successors' probes run: the
 * slot read starts 2 * AHEAD keys ahead, the entry read AHEAD keys ahead. */
#define AHEAD 6
#define RING (2 * AHEAD + 1)

/* A key of the batch is placed iff it is still marked True in `fresh` when
 * its turn comes (placed, deleted or cleared since, it is not); a `dead` key
 * is fresh without a probe; with no table view (`t` NULL), and for what the
 * probe does not decide, the Python rule (`_counted`) decides. */
static int
placing_begin(TableCacheBaseObject *self, const table_view *t, PyObject *key, placing *p)
{
    p->key = key;
    p->state = 2;
    int gone = PySet_GET_SIZE(self->dead) ? PySet_Contains(self->dead, key) : 0;
    if (gone < 0)
        return -1;
    int probed = PyUnicode_CheckExact(key) || PyLong_CheckExact(key);
    if (gone)
        p->state = 0;
    else if (t != NULL && probed)
        p->state = udng_table_locate_begin(t, key, &p->lc);
    if (probed)
        prefetch_places(self->changed, self->fresh, key);
    return 0;
}

static int
place_now(TableCacheBaseObject *self, PyObject *probe, PyObject *key)
{
    Py_buffer pb;
    table_view t;
    if (udng_table_view_args(&PyTuple_GET_ITEM(probe, 0), &pb, &t) < 0) {
        PyErr_Clear();
        return 2;
    }
    placing p;  /* (one key of a batch, its probe run through at once) */
    int r = placing_begin(self, &t, key, &p);
    if (r == 0)
        r = p.state == 1 ? udng_table_locate_end(&p.lc) : p.state;
    PyBuffer_Release(&pb);
    return r;
}

/* Its answer placed: counted, out of `fresh` and into `changed`; absent,
 * fresh (its mark None, its place kept).  0, or -1 with an error set. */
static int
placing_end(TableCacheBaseObject *self, placing *p)
{
    int counted = p->state == 1 ? udng_table_locate_end(&p->lc) : p->state;
    PyObject *mark = PyDict_GetItemWithError(self->fresh, p->key);  /* (placed or gone since: skipped) */
    if (mark != Py_True)
        return mark == NULL && PyErr_Occurred() ? -1 : 0;
    if (counted == 2) {  /* (another type's entry of the same hash, a damaged one: the Python rule) */
        PyObject *r = PyObject_CallMethod((PyObject *)self, "_counted", "O", p->key);
        if (r == NULL)
            return -1;
        counted = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (counted < 0)
            return -1;
        mark = PyDict_GetItemWithError(self->fresh, p->key);  /* (Python ran: still to place?) */
        if (mark != Py_True)
            return mark == NULL && PyErr_Occurred() ? -1 : 0;
    }
    if (!counted)
        return PyDict_SetItem(self->fresh, p->key, Py_None);
    if (PySet_Add(self->changed, p->key) < 0)
        return -1;
    return PyDict_DelItem(self->fresh, p->key);
}

/* resolve(): place every key in `pending` (module docstring), emptying it.
 * The batch is taken out of `pending` first; on an error the keys not
 * placed yet go back in front of it, so a later call places them. */
static PyObject *
tcb_resolve(TableCacheBaseObject *self, PyObject *Py_UNUSED(ignored))
{
    self->since = 0;
    PyObject *batch = self->pending;
    if (batch == NULL || !PyList_CheckExact(batch) || PyList_GET_SIZE(batch) == 0)
        Py_RETURN_NONE;
    if (self->fresh == NULL || !PyDict_CheckExact(self->fresh) || self->dead == NULL ||
        !PyAnySet_CheckExact(self->dead) || self->changed == NULL || !PyAnySet_CheckExact(self->changed)) {
        PyErr_SetString(PyExc_TypeError, "TableCacheBase.resolve: fresh, dead or changed is not of its type");
        return NULL;
    }
    PyObject *empty = PyList_New(0);
    if (empty == NULL)
        return NULL;
    self->pending = empty;  /* (the batch's reference is ours now) */
    PyObject *probe = self->probe;
    Py_buffer pb;
    table_view view, *t = NULL;  /* (one buffer export for the batch, held until its end) */
    if (probe != NULL && PyTuple_CheckExact(probe) && PyTuple_GET_SIZE(probe) == 4) {
        if (udng_table_view_args(&PyTuple_GET_ITEM(probe, 0), &pb, &view) == 0)
            t = &view;
        else
            PyErr_Clear();  /* (no table to probe: each key is Python's, which raises what it must) */
    }
    placing ring[RING];
    Py_ssize_t n = PyList_GET_SIZE(batch), begun = 0, touched = 0, done = 0;
    int failed = 0;
    while (done < n && !failed) {
        /* (the list is ours alone: Python code run by a placing cannot change it) */
        if (begun < n && begun - done < 2 * AHEAD + 1) {
            if (placing_begin(self, t, PyList_GET_ITEM(batch, begun), &ring[begun % RING]) < 0)
                failed = 1;
            else
                begun++;
            continue;
        }
        if (touched < begun && touched - done < AHEAD + 1) {
            if (ring[touched % RING].state == 1)
                udng_table_locate_touch(&ring[touched % RING].lc);
            touched++;
            continue;
        }
        if (placing_end(self, &ring[done % RING]) < 0)
            failed = 1;
        else
            done++;
    }
    if (t != NULL)
        PyBuffer_Release(&pb);
    if (failed) {  /* the keys not placed, back in front of those set since */
        PyObject *rest = PyList_GetSlice(batch, done, n);
        if (rest != NULL && PyList_SetSlice(rest, PyList_GET_SIZE(rest), PyList_GET_SIZE(rest), self->pending) == 0)
            Py_SETREF(self->pending, rest);
        else
            Py_XDECREF(rest);
        Py_DECREF(batch);
        return NULL;
    }
    Py_DECREF(batch);
    Py_RETURN_NONE;
}

static PyMethodDef tcb_methods[] = {
    {"resolve", (PyCFunction)tcb_resolve, METH_NOARGS,
     "resolve() -> None: place the keys the compiled set left unplaced (pending): counted ones into changed, "
     "the rest fresh."},
    {NULL, NULL, 0, NULL},
};

/* The compiled delete (TableCache._delitem's rule for a str or int key): 1
 * done, 0 not decided here (the caller takes `_delitem`), -1 error (a
 * KeyError for a key the cache does not hold).  A key set and not placed yet
 * is placed now, alone: the table's, it becomes dead; either way it leaves
 * `fresh` and `hot`, and stays listed in `pending`, unmarked (resolve skips
 * it).  The other pending keys wait on: placing them all here reset the
 * count of sets since the last placing, and every set after a delete then
 * probed its key at once -- in a stream of sets and deletes, most of them.
 * A fresh key leaves `fresh` and `hot`; a counted one becomes `dead`,
 * leaving `hot` and `changed`.  Why compiled: a stream of sets and deletes
 * (a cache that evicts) replays each delete here, and a process deleting
 * keys of a big dict applies each of its own; in Python each was a few
 * frames around the same probe. */
static int
tcb_fast_del(TableCacheBaseObject *self, PyObject *key)
{
    if (!PyUnicode_CheckExact(key) && !PyLong_CheckExact(key))
        return 0;  /* (a key whose equality may run code, or that the probe does not take) */
    if (!fields_ok(self))
        return 0;
    PyObject *hot = self->hot, *dead = self->dead, *fresh = self->fresh, *changed = self->changed;
    PyObject *probe = self->probe;
    int table = probe != NULL && PyTuple_CheckExact(probe) && PyTuple_GET_SIZE(probe) == 4;
    PyObject *mark = PyDict_GetItemWithError(fresh, key);  /* (borrowed) */
    if (mark == NULL && PyErr_Occurred())
        return -1;
    if (mark != NULL && mark != Py_None && mark != Py_True)
        return 0;  /* (not a mark of ours: Python's) */
    if (mark == Py_None) {  /* fresh: it goes with its value */
        if (PyDict_DelItem(fresh, key) < 0 || PyDict_DelItem(hot, key) < 0)
            return -1;
        return 1;
    }
    int held = mark == NULL ? PyDict_Contains(hot, key) : 1;  /* (in hot and not fresh: counted) */
    if (held < 0)
        return -1;
    int counted = 1;
    if (mark == Py_True || !held) {  /* waiting to be placed (placed now, alone), or never read */
        if (!table)
            return 0;  /* (no table to probe: Python's) */
        counted = place_now(self, probe, key);  /* (a dead key is not counted) */
        if (counted < 0)
            return -1;
        if (counted == 2)
            return 0;
        if (counted == 0 && mark == NULL) {
            PyErr_SetObject(PyExc_KeyError, key);
            return -1;
        }
    }
    if (mark == Py_True) {  /* the table's becomes dead; it stays listed in pending, unmarked */
        if ((counted && PySet_Add(dead, key) < 0) || PyDict_DelItem(fresh, key) < 0 || PyDict_DelItem(hot, key) < 0)
            return -1;
        return 1;
    }
    if (PySet_Add(dead, key) < 0 || (held && PyDict_DelItem(hot, key) < 0) || PySet_Discard(changed, key) < 0)
        return -1;
    return 1;
}

static int
tcb_ass_subscript(TableCacheBaseObject *self, PyObject *key, PyObject *value)
{
    int r = value != NULL ? tcb_fast_set(self, key, value) : tcb_fast_del(self, key);
    if (r != 0)
        return r < 0 ? -1 : 0;
    PyObject *res = value != NULL
        ? PyObject_CallMethodObjArgs((PyObject *)self, str_setitem, key, value, NULL)
        : PyObject_CallMethodObjArgs((PyObject *)self, str_delitem, key, NULL);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

static PyMappingMethods tcb_as_mapping = {
    .mp_ass_subscript = (objobjargproc)tcb_ass_subscript,
};

static PyMemberDef tcb_members[] = {
    {"hot", T_OBJECT, offsetof(TableCacheBaseObject, hot), 0,
     "the current value of every fresh key and of the counted keys read or overwritten"},
    {"dead", T_OBJECT, offsetof(TableCacheBaseObject, dead), 0, "table keys deleted since the dump"},
    {"fresh", T_OBJECT, offsetof(TableCacheBaseObject, fresh), 0,
     "keys no counted entry holds (None) or not placed yet (True), in order"},
    {"changed", T_OBJECT, offsetof(TableCacheBaseObject, changed), 0,
     "counted keys whose value in hot may not be the table's"},
    {"_probe", T_OBJECT, offsetof(TableCacheBaseObject, probe), 0,
     "(buf, slots, start, end) of the table the compiled paths probe, or None"},
    {"_limit", T_OBJECT, offsetof(TableCacheBaseObject, limit), 0,
     "the most clean rows the cache keeps decoded (max_decoded), or None"},
    {"pending", T_OBJECT, offsetof(TableCacheBaseObject, pending), 0,
     "keys the compiled set left unplaced (marked True in fresh), in order; resolve() places them"},
    {"_since", T_PYSSIZET, offsetof(TableCacheBaseObject, since), 0,
     "sets of keys not in hot since the last resolve(): below 16 the compiled set places its key at once"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject udng_TableCacheBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ultradict_ng._helper._native.TableCacheBase",
    .tp_basicsize = sizeof(TableCacheBaseObject),
    .tp_dealloc = (destructor)tcb_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Base of TableCache: its state, and d[key] = value for str and int keys compiled.",
    .tp_traverse = (traverseproc)tcb_traverse,
    .tp_clear = (inquiry)tcb_clear,
    .tp_as_mapping = &tcb_as_mapping,
    .tp_members = tcb_members,
    .tp_methods = tcb_methods,
    .tp_new = PyType_GenericNew,
};

/* For readpath.c's read path, which reads a big dict's cache where it lies
 * instead of keeping copies of its fields: 1 when `cache` is a
 * TableCacheBase whose `hot`, `dead`, `fresh` and `changed` are of their
 * exact types and whose `_limit` is None or an int >= 0 -- the fields
 * (borrowed), `_probe` (borrowed; NULL when unset) and the bound (-1: none)
 * filled in; else 0, nothing filled in, no error set (the Python path
 * decides). */
int
udng_tablecache_state(PyObject *cache, PyObject **hot, PyObject **dead, PyObject **fresh,
                      PyObject **changed, PyObject **probe, Py_ssize_t *limit)
{
    TableCacheBaseObject *c = udng_as_tablecache(cache);
    if (c == NULL || c->hot == NULL || !PyDict_CheckExact(c->hot) || c->dead == NULL || !PyAnySet_CheckExact(c->dead) ||
        c->fresh == NULL || !PyDict_CheckExact(c->fresh) || c->changed == NULL ||
        !PyAnySet_CheckExact(c->changed))
        return 0;
    Py_ssize_t bound = -1;
    if (c->limit != NULL && c->limit != Py_None) {
        bound = PyLong_CheckExact(c->limit) ? PyLong_AsSsize_t(c->limit) : -1;
        if (bound < 0) {
            PyErr_Clear();
            return 0;
        }
    }
    *hot = c->hot;
    *dead = c->dead;
    *fresh = c->fresh;
    *changed = c->changed;
    *probe = c->probe;
    *limit = bound;
    return 1;
}

/* Ready the type and add it to the module `m`: 0, or -1 with an error set. */
int
udng_tablecache_add(PyObject *m)
{
    str_setitem = PyUnicode_InternFromString("_setitem");
    str_delitem = PyUnicode_InternFromString("_delitem");
    if (str_setitem == NULL || str_delitem == NULL || PyType_Ready(&udng_TableCacheBaseType) < 0)
        return -1;
    Py_INCREF(&udng_TableCacheBaseType);
    if (PyModule_AddObject(m, "TableCacheBase", (PyObject *)&udng_TableCacheBaseType) < 0) {
        Py_DECREF(&udng_TableCacheBaseType);
        return -1;
    }
    return 0;
}
