/* TableCacheBase: the compiled base of _shm/tablecache.py's TableCache.
 *
 * Why: a process that writes a big dict applies each of its root sets to
 * its TableCache (`data[key] = value`, Writer._set_root), as every process
 * applies the records it replays.  In Python that is four frames a write
 * (__setitem__, _counted, the mutex, Table.locate) around one probe: at a
 * million keys it made a random overwrite ~30% slower than on a small dict,
 * whose cache is a plain dict.  Here the same rule runs in one C call for
 * str and int keys (the keys msgpack tables hold most), and everything else
 * goes to the subclass's `_setitem` / `_delitem`, which hold the rule in
 * full.  The fields are the cache's state (tablecache.py's docstring) that
 * the compiled read path reads where they lie (udng_tablecache_state): `hot`,
 * `dead`, `fresh`, `changed`, `_probe` and `_limit`.
 *
 * The rule (TableCache._setitem): a key in `hot` is counted or fresh: its
 * value is replaced in place (order kept), and a counted one is `changed`.
 * Otherwise the key is counted iff it is not `dead` and an entry of the
 * table holds it (the probe, by its encoding), and it becomes `changed`;
 * else it is appended to `fresh`.  Comparing an exact str or int with the
 * keys of `hot`, `dead` and `fresh` runs no Python code, so no other thread
 * runs between the checks and the stores (callers hold the cache mutex
 * anyway: records apply under it).
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
    return 0;
}

static void
tcb_dealloc(TableCacheBaseObject *self)
{
    PyObject_GC_UnTrack(self);  /* (a subclass's dealloc decrefs its heap type itself) */
    tcb_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Start the read of the slot of `set` where `key` would be (a key whose
 * hash runs no Python code: an exact str or int).  PySetObject's table is
 * public in CPython's headers, unlike a dict's index. */
static inline void
prefetch_set_slot(PyObject *set, PyObject *key)
{
    Py_hash_t hash = PyObject_Hash(key);
    if (hash == -1) {
        PyErr_Clear();
        return;
    }
    PySetObject *so = (PySetObject *)set;
    UDNG_PREFETCH(&so->table[(size_t)hash & (size_t)so->mask]);
}

int
udng_tablecache_prefetch_begin(PyObject *cache, PyObject *key, udng_locate *lc)
{
    if (PyDict_CheckExact(cache) || (!PyUnicode_CheckExact(key) && !PyLong_CheckExact(key)))
        return 0;
    TableCacheBaseObject *self = udng_as_tablecache(cache);
    if (self == NULL || self->probe == NULL || self->probe == Py_None)
        return 0;
    if (udng_table_locate_prefetch(self->probe, key, lc) != 1)
        return 0;
    if (self->changed != NULL && PyAnySet_CheckExact(self->changed))
        prefetch_set_slot(self->changed, key);
    return 1;
}

void
udng_tablecache_prefetch_end(udng_locate *lc)
{
    udng_table_locate_touch(lc);
    udng_table_locate_drop(lc);
}

/* The compiled set: 1 done, 0 not decided here (the caller takes
 * `_setitem`), -1 error.  The stores come after every check; of two, the
 * bookkeeping goes first, so that a store failing (MemoryError) leaves a
 * key in `changed` or `fresh` without its value in `hot` -- a KeyError at
 * the next walk or dump -- never a new value the next dump would miss.
 *
 * At a million keys each step is a cache miss of its own: the key's place
 * in `hot`, its slot and entry in the table, its place in `changed`.  So
 * the table's probe and the read of `changed` start first, and the lookups
 * in `hot` and `dead` run while they are on their way (a key already in
 * `hot` wastes the probe's start: a hash and a buffer, ~30 ns). */
static int
tcb_fast_set(TableCacheBaseObject *self, PyObject *key, PyObject *value)
{
    PyObject *hot = self->hot, *dead = self->dead, *fresh = self->fresh, *changed = self->changed;
    if (hot == NULL || dead == NULL || fresh == NULL || changed == NULL || !PyDict_CheckExact(hot) ||
        !PyDict_CheckExact(fresh) || !PyAnySet_CheckExact(dead) || !PyAnySet_CheckExact(changed))
        return 0;
    if (!PyUnicode_CheckExact(key) && !PyLong_CheckExact(key))
        return 0;  /* (a key whose equality may run code, or that the probe does not take) */
    udng_locate lc;  /* begun: 1 under way, else the probe's answer (0 absent, 2 Python decides) */
    int begun = self->probe == NULL || self->probe == Py_None ? 2
                                                               : udng_table_locate_begin(self->probe, key, &lc);
    prefetch_set_slot(changed, key);
    int held = PyDict_Contains(hot, key);
    if (held < 0)
        goto error;
    int counted;
    if (held) {
        if (begun == 1)
            udng_table_locate_drop(&lc);
        int is_fresh = PyDict_Contains(fresh, key);
        if (is_fresh < 0)
            return -1;
        counted = !is_fresh;
    } else {
        int gone = PySet_Contains(dead, key);
        if (gone < 0)
            goto error;
        if (gone) {
            if (begun == 1)
                udng_table_locate_drop(&lc);
            counted = 0;
        } else {  /* (begun 2 with no probe: no table counts, or another serializer's) */
            int r = begun == 1 ? udng_table_locate_end(&lc) : begun;
            if (r < 0 || r == 2)
                return r < 0 ? -1 : 0;
            counted = r;
        }
    }
    if (counted) {
        if (PySet_Add(changed, key) < 0 || PyDict_SetItem(hot, key, value) < 0)
            return -1;
    } else if (held) {
        if (PyDict_SetItem(hot, key, value) < 0)
            return -1;
    } else if (PyDict_SetItem(fresh, key, Py_None) < 0 || PyDict_SetItem(hot, key, value) < 0) {
        return -1;
    }
    return 1;
error:
    if (begun == 1)
        udng_table_locate_drop(&lc);
    return -1;
}

static int
tcb_ass_subscript(TableCacheBaseObject *self, PyObject *key, PyObject *value)
{
    if (value != NULL) {
        int r = tcb_fast_set(self, key, value);
        if (r != 0)
            return r < 0 ? -1 : 0;
    }
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
    {"fresh", T_OBJECT, offsetof(TableCacheBaseObject, fresh), 0, "keys no counted entry holds, in order"},
    {"changed", T_OBJECT, offsetof(TableCacheBaseObject, changed), 0,
     "counted keys whose value in hot may not be the table's"},
    {"_probe", T_OBJECT, offsetof(TableCacheBaseObject, probe), 0,
     "(buf, slots, start, end) of the table the compiled paths probe, or None"},
    {"_limit", T_OBJECT, offsetof(TableCacheBaseObject, limit), 0,
     "the most clean rows the cache keeps decoded (max_decoded), or None"},
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
