/* The compiled helper's internal header: every function one C file of the
 * helper calls in another is declared here, once, so a changed signature
 * fails to compile instead of being retyped by hand in each caller; with
 * them the objects two files share, the byte-order helpers and the
 * constants mirrored from the layout modules (the module exports them and
 * tests/test_native.py compares them with the layouts).  Every .c file of the helper includes this first. */
#ifndef UDNG_H
#define UDNG_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* A hint that *p will be read soon (a no-op where the compiler has none):
 * a big dict's probe starts its memory reads before the work that does not
 * depend on them, so that their cache misses overlap. */
#if defined(__GNUC__) || defined(__clang__)
#define UDNG_PREFETCH(p) __builtin_prefetch((const void *)(p))
#else
#define UDNG_PREFETCH(p) ((void)(p))
#endif

/* ---- byte order: the layouts' little-endian words, msgpack's big-endian ------ */

static inline uint32_t udng_rd32le(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t udng_rd64le(const unsigned char *p)
{
    return (uint64_t)udng_rd32le(p) | (uint64_t)udng_rd32le(p + 4) << 32;
}
static inline void udng_wr32le(unsigned char *p, uint32_t x)
{
    p[0] = (unsigned char)x; p[1] = (unsigned char)(x >> 8);
    p[2] = (unsigned char)(x >> 16); p[3] = (unsigned char)(x >> 24);
}
static inline void udng_wr64le(unsigned char *p, uint64_t x)
{
    udng_wr32le(p, (uint32_t)x);
    udng_wr32le(p + 4, (uint32_t)(x >> 32));
}
static inline uint32_t udng_rd16be(const unsigned char *p) { return ((uint32_t)p[0] << 8) | p[1]; }
static inline uint32_t udng_rd32be(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t udng_rd64be(const unsigned char *p)
{
    return ((uint64_t)udng_rd32be(p) << 32) | udng_rd32be(p + 4);
}
static inline void udng_wr64be(unsigned char *p, uint64_t x)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(x >> (56 - 8 * i));
}

/* ---- the module's state (multi-phase initialisation, PEP 489) ------------------ */

/* What Python code gives the helper lives in the module object, not in a
 * static: the frozenset of value types a read hands out without a copy
 * (codec.IMMUTABLE_TYPES, given by set_immutable_types), for the module's
 * functions.  The read paths of the types carry their own reference to it
 * (StoreBase's _immutable_types, set by each store). */
typedef struct {
    PyObject *immutable_types;  /* a frozenset, or NULL before set_immutable_types */
} udng_state;

static inline udng_state *
udng_get_state(PyObject *module)
{
    return (udng_state *)PyModule_GetState(module);
}

/* ---- copytree.c: what a read hands out as it is, and copies of the rest -- */

/* A value of an immutable type: the scalars by pointer compare, the rest
 * (frozenset, date, Decimal, ...) by membership in `immutable` (the frozenset
 * of codec.IMMUTABLE_TYPES; NULL: the scalars only -- the rest then takes
 * the Python rules, which hand it out as it is).  Inline: every read of the
 * hit path asks it. */
static inline int
udng_is_immutable(PyObject *v, PyObject *immutable)
{
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyLong_Type || t == &PyUnicode_Type || t == &PyFloat_Type || t == &PyBool_Type ||
        t == &PyBytes_Type || v == Py_None)
        return 1;
    /* (Never in the set: a tuple is judged by its items, the rest are mutable.
     * Ruled out here, the hit path's usual values skip a set lookup.) */
    if (immutable == NULL || t == &PyTuple_Type || t == &PyDict_Type || t == &PyList_Type)
        return 0;
    int r = PySet_Contains(immutable, (PyObject *)t);
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
udng_is_immutable_tuple(PyObject *v, PyObject *immutable)
{
    if (!PyTuple_CheckExact(v))
        return 0;
    for (Py_ssize_t i = 0, n = PyTuple_GET_SIZE(v); i < n; i++)
        if (!udng_is_immutable(PyTuple_GET_ITEM(v, i), immutable))
            return 0;
    return 1;
}

/* The caller's own copy of a plain value (codec.copy_value's result), a new
 * reference; NULL without an error when the value holds anything but
 * immutable values (`immutable`, as above), lists, dicts, tuples, sets and
 * bytearrays, or is nested deeper than UDNG_COPY_DEPTH (copytree.COPY_DEPTH;
 * the Python rules decide); NULL with an error when memory runs out. */
#define UDNG_COPY_DEPTH 64
PyObject *udng_copy_tree(PyObject *v, PyObject *immutable);

PyObject *udng_native_copy_plain(PyObject *module, PyObject *v);
PyObject *udng_native_first_to_export(PyObject *module, PyObject *pairs);
PyObject *udng_native_set_immutable_types(PyObject *module, PyObject *types);

/* ---- records.c: the stream's records ----------------------------------------- */

/* The length in bytes of a record's header (layout.py: RECORD_HEADER; a
 * test compares the module's constant with the layout's). */
#define UDNG_RECORD_HEADER 16

/* Fills the CRC tables: once, at module init, before any udng_crc32. */
void udng_crc_init(void);
/* zlib's CRC-32 (zlib.crc32(p[:n], crc)). */
uint32_t udng_crc32(uint32_t crc, const unsigned char *p, size_t n);
/* The record header in front of the `length` payload bytes already at
 * rec + UDNG_RECORD_HEADER (layout.py, "Stream record"). */
void udng_put_header(unsigned char *rec, uint32_t length, uint32_t tag, uint32_t unit);
/* The length of the one msgpack object at p, or -1. */
Py_ssize_t udng_mp_skip(const unsigned char *p, Py_ssize_t n);
PyObject *udng_native_msgpack_length(PyObject *module, PyObject *arg);
PyObject *udng_native_parse_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_apply_sets(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_apply_simple(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_crc32(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* ---- streamscan.c ------------------------------------------------------------------ */

PyObject *udng_native_scan_stream(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* ---- streammerge.c ----------------------------------------------------------------- */

PyObject *udng_native_stream_merge_plan(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_stream_merge_write(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* ---- words.c: the control words, record writes, futex ------------------------------ */

/* 1 where Words.wait/wake are the kernel's futex (Linux), else 0. */
#ifdef __linux__
#define UDNG_FUTEX 1
#else
#define UDNG_FUTEX 0
#endif

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int held;            /* view is a live export */
    uint64_t *words;     /* view.buf as 64-bit words */
    Py_ssize_t nwords;
} WordsObject;

extern PyTypeObject udng_WordsType;

/* An int argument as an unsigned 64-bit value: 1, or 0 with an error set. */
static inline int
udng_u64_arg(PyObject *arg, uint64_t *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(arg);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return 0;
    *out = (uint64_t)v;
    return 1;
}

/* 1 while the Words object's buffer is held, else 0 with Closed set. */
int udng_words_usable(WordsObject *self);
/* A word index argument, bounds-checked: 1, or 0 with an error set. */
int udng_word_index(WordsObject *self, PyObject *arg, Py_ssize_t *out);
/* Wakes up to n processes sleeping on w: the number woken (0 without futex). */
long udng_futex_wake_n(uint64_t *w, int n);
/* A root-level scalar (or, with plain, JSON-like) set or delete record
 * written at pos: the offset after it, or -1 (declined, nothing written). */
Py_ssize_t udng_simple_record(WordsObject *w, Py_ssize_t pos, uint32_t tag, Py_ssize_t limit, long op,
                              PyObject *key, PyObject *value, Py_ssize_t threshold, uint32_t unit,
                              int plain);

/* ---- packing.c: msgpack encoding of scalars, rows and plain trees --------------- */

/* The deepest JSON-like tree write_simple's plain path encodes (words.PLAIN_DEPTH). */
#define UDNG_PLAIN_DEPTH 16

/* Each: the encoded size, or -1 (declined, no error set); dst NULL measures. */
Py_ssize_t udng_mp_scalar(PyObject *o, unsigned char *dst);
Py_ssize_t udng_mp_value(PyObject *o, unsigned char *dst, Py_ssize_t threshold);
Py_ssize_t udng_mp_plain_value(PyObject *o, unsigned char *dst, Py_ssize_t threshold);
/* The codec's msgpack bytes of a scalar or a tuple of scalars, or NULL. */
PyObject *udng_pack_value(PyObject *v);
PyObject *udng_native_pack_map(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_pack_pairs(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* ---- typescan.c: the codec's scans of containers ------------------------------------ */

PyObject *udng_native_types_within(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_contains_type(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* ---- lockstate.c: the lock's per-process state -------------------------------------- */

extern PyTypeObject udng_ProcessStateType;
/* Interns the method names it calls: 0, or -1 with an error set (module init). */
int udng_lockstate_init(void);

/* ---- readpath.c: StoreBase and ViewBase, the read hit path -------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *store;
    PyObject *path;
} ViewObject;

extern PyTypeObject udng_StoreBaseType;
extern PyTypeObject udng_ViewBaseType;
/* Interns the method names it calls: 0, or -1 with an error set (module init). */
int udng_readpath_init(void);
/* A root view's cached value of key (readpath.c says what each result means:
 * 1 found, 0 absent, 2 not answerable here, 3 a big dict's row not decoded
 * yet, -1 error). */
int udng_view_cached(ViewObject *self, PyObject *key, PyObject **out);
/* The frozenset of immutable types the view's store carries (borrowed), or NULL. */
PyObject *udng_view_immutable(ViewObject *view);

/* ---- cacheget.c: SharedCache.get's hit path ------------------------------------------- */

extern PyTypeObject udng_CacheGetType;

/* ---- keyhash.c ---------------------------------------------------------------- */

int udng_key_hash_common(PyObject *key, uint64_t *out);
PyObject *udng_native_key_hash_common(PyObject *module, PyObject *key);
/* The hash of the str whose UTF-8 is p[0..n) (key_hash's). */
uint64_t udng_str_hash(const unsigned char *p, size_t n);
/* The hash of the int of that sign and magnitude (key_hash's). */
uint64_t udng_int_hash(int negative, uint64_t magnitude);

/* ---- unpack.c ------------------------------------------------------------------- */

PyObject *udng_simple_value(const unsigned char *p, Py_ssize_t n);
PyObject *udng_native_unpack_simple(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_tuple_hook(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* ---- the shared table (table_layout.py; a test compares the constants) ------------ */

#define UDNG_TABLE_HEADER 64
#define UDNG_TABLE_ENTRY_HEADER 24
#define UDNG_TABLE_OFFSET_BITS 40
#define UDNG_TABLE_OFFSET_MASK ((1ULL << UDNG_TABLE_OFFSET_BITS) - 1)
#define UDNG_TABLE_TAG_MASK (~UDNG_TABLE_OFFSET_MASK)

/* A table's bounds in a buffer: (buf, slots, start, end), checked. */
typedef struct {
    const unsigned char *b;
    uint64_t slots, start, end;
    Py_ssize_t len;
} table_view;

/* ---- tableprobe.c ------------------------------------------------------------------- */

/* Parses (buf, slots, start, end) from args[0..3] and checks them against the
 * buffer: 0 (pb held), or -1 with an error set. */
int udng_table_view_args(PyObject *const *args, Py_buffer *pb, table_view *t);
/* Checks the entry at off: NULL when sound (lengths set), else the reason. */
const char *udng_table_check_entry(const table_view *t, uint64_t off, uint32_t *kl, uint32_t *vl);
/* Its two halves: bounds and reserved word; the crc (of an entry within bounds). */
const char *udng_table_entry_bounds(const table_view *t, uint64_t off, uint32_t *kl, uint32_t *vl);
const char *udng_table_entry_crc(const table_view *t, uint64_t off, uint32_t kl, uint32_t vl);
int udng_table_row_simple(PyObject *probe, PyObject *key, PyObject **out);
/* A probe of a TableCache's table for the placing of unplaced keys, in
 * three steps: udng_table_locate_begin hashes the key and starts the read of
 * its slot in the table `t`, whose buffer the caller holds for the batch; udng_table_locate_touch reads the
 * slot and starts the read of its entry; udng_table_locate_end finishes it
 * (or udng_table_locate_drop lets it go).  Between the steps the caller
 * starts other keys' probes, so that their cache misses overlap. */
typedef struct {
    Py_buffer pb;
    table_view t;
    const char *data;
    Py_ssize_t n;
    unsigned char head[9];
    size_t hl;
    uint64_t h;
    int is_int;
    int held;  /* pb is held: end or drop must release it */
} udng_locate;
int udng_table_locate_begin(const table_view *t, PyObject *key, udng_locate *lc);
void udng_table_locate_touch(udng_locate *lc);
int udng_table_locate_end(udng_locate *lc);
void udng_table_locate_drop(udng_locate *lc);
PyObject *udng_native_table_get(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_table_candidates(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_table_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_table_changes(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* ---- tablewalk.c -------------------------------------------------------------------- */

PyObject *udng_native_table_fill(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_table_merge(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_table_index(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_table_chunk(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *udng_native_table_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* ---- tablecache.c: TableCacheBase ------------------------------------------------------- */

/* TableCacheBase's fields (tablecache.c), shared with readpath.c's read path,
 * which reads a big dict's cache where it lies instead of keeping copies of
 * its fields: a hit in `hot` is the hot path of a big dict, and one call or
 * attribute lookup more is a few percent of it. */
typedef struct {
    PyObject_HEAD
    PyObject *hot;      /* dict: decoded values */
    PyObject *dead;     /* set: the table's keys deleted since */
    PyObject *fresh;    /* dict: keys no counted entry holds (None) or not placed yet (True), in order */
    PyObject *changed;  /* set: counted keys whose value in hot may not be the table's */
    PyObject *probe;    /* (buf, slots, start, end), or None / NULL */
    PyObject *limit;    /* the most clean rows hot keeps, or None / NULL */
    PyObject *pending;  /* list: keys the compiled set left unplaced (True in fresh) */
    Py_ssize_t since;   /* compiled sets of keys not in hot since the last resolve() */
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

int udng_tablecache_add(PyObject *m);

#endif
