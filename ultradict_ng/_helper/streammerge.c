/* stream_merge_plan / stream_merge_write: recovery's checkpoint merged from
 * the bytes of a table and of the stream's records (_disk/layout.py, step e;
 * table_layout.py, "Merge").  The twin is streammerge.py.
 *
 * Why compiled, and why from bytes: a recovery with a full stream decoded
 * the checkpoint (a million rows: 0.4 s), replayed a million records into
 * it (0.3-0.4 s) and encoded the result again (0.4 s) -- Python objects for
 * every row and every record, to produce bytes that are, entry for entry,
 * the old table's and the records' own.  Here the records' keys go into a
 * private hash map (the last value and the dict order each key's history
 * gives it), the old table is walked once in order, and the new entries are
 * its entries kept, given a record's value bytes, or dropped, then the keys
 * the table did not hold: no value is decoded, nothing is encoded.  A
 * million keys and 1.14M records: ~0.2 s.
 *
 * Only root-level sets and deletes of str and int keys qualify (the form
 * msgpack writes: fixarray 4, op_set, fixarray 0, key, value / fixarray 3,
 * op_del, fixarray 0, key), each key in msgpack's shortest form -- of valid
 * UTF-8 for a str -- so that two keys are equal exactly when their bytes
 * are, and each value exactly one msgpack object.  Any other record, a
 * delete of a key that neither the table nor an earlier record holds, or
 * int keys beside a table holding a bool, a float or an ext-typed key
 * (True == 1 == 1.0 == Decimal(1) == complex(1) in a dict, not in bytes)
 * makes the plan None: the caller takes the
 * general path (decode, replay, encode), which also reports what is
 * wrong.  The records are the caller's scanned prefix (step c: whole, of the
 * generation, their crcs right); the table's entries are checked here --
 * bounds and reserved word each, the crc of each one kept (copied as bytes;
 * one dropped or given a new value matched a record's key and hash) -- a
 * damaged one: ValueError "table entry ...", as the walks say it.
 *
 * A key's history decides its place, as a dict's would: a key the table
 * holds keeps its place while no delete came (its value the last set's);
 * once deleted its entry goes, and a set after the delete appends it; a key
 * the table does not hold is appended by the set that made it present last.
 * `order` counts the sets that found their key absent (in the records'
 * history alone); the appended keys are written in that order. */
#include "udng.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t h;
    uint32_t kpos, klen, vpos, vlen, order;
    uint8_t live, had_del, first_del, in_table;
} mkey;

typedef struct {
    mkey *keys;        /* the records' distinct keys */
    uint32_t *decide;  /* per old entry: 0 kept, KEY_DROP dropped, else key index + 1 (new value) */
    uint32_t *appended;/* key indexes, in order */
    uint64_t nkeys, count, nold, nappended, bytes, stream_len, table_end;
    int ints;          /* an int key among the records' */
} merge_plan;

#define KEY_DROP UINT32_MAX
#define BATCH 16  /* records hashed ahead, their map slots prefetched */
#define PLAN_NAME "ultradict_ng._helper._native.stream_merge_plan"

static void
plan_free(merge_plan *p)
{
    if (p == NULL)
        return;
    free(p->keys);
    free(p->decide);
    free(p->appended);
    free(p);
}

static void
plan_capsule_free(PyObject *capsule)
{
    plan_free((merge_plan *)PyCapsule_GetPointer(capsule, PLAN_NAME));
}

static inline uint64_t
entry_size(uint64_t kl, uint64_t vl)
{
    return (UDNG_TABLE_ENTRY_HEADER + kl + vl + 7) & ~(uint64_t)7;
}

/* Whether p[0..n) is UTF-8 as Python's strict decoder takes it (no
 * overlong forms, no surrogates, nothing past U+10FFFF). */
static int
valid_utf8(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp, min;
        if ((c & 0xe0) == 0xc0) { k = 1; cp = c & 0x1f; min = 0x80; }
        else if ((c & 0xf0) == 0xe0) { k = 2; cp = c & 0x0f; min = 0x800; }
        else if ((c & 0xf8) == 0xf0) { k = 3; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (k > n - i - 1)
            return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (p[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += k + 1;
    }
    return 1;
}

/* The str key at p[0..n): its whole encoding's length (*kl) and its UTF-8
 * (*data, *dl), if it is a str in the shortest form of valid UTF-8. */
static int
str_key(const unsigned char *p, size_t n, size_t *kl, const unsigned char **data, size_t *dl)
{
    size_t hl, len;
    if (n < 1)
        return 0;
    unsigned char b = p[0];
    if ((b & 0xe0) == 0xa0) { hl = 1; len = b & 0x1f; }
    else if (b == 0xd9 && n >= 2) { hl = 2; len = p[1]; if (len < 32) return 0; }
    else if (b == 0xda && n >= 3) { hl = 3; len = udng_rd16be(p + 1); if (len < 256) return 0; }
    else if (b == 0xdb && n >= 5) { hl = 5; len = udng_rd32be(p + 1); if (len < 65536) return 0; }
    else return 0;
    if (len > n - hl || !valid_utf8(p + hl, len))
        return 0;
    *kl = hl + len;
    *data = p + hl;
    *dl = len;
    return 1;
}

/* The int key at p[0..n): its encoding's length (*kl) and its hash (*h), if
 * it is an int in msgpack's shortest form (what its packer writes: the
 * positive fixint or an unsigned type for n >= 0, the negative fixint or a
 * signed type below 0, each the smallest that holds it). */
static int
int_key(const unsigned char *p, size_t n, size_t *kl, uint64_t *h)
{
    unsigned char b = p[0];
    uint64_t u;
    int64_t v;
    if (b < 0x80 || b >= 0xe0) {
        *kl = 1;
        *h = b < 0x80 ? udng_int_hash(0, b) : udng_int_hash(1, (uint64_t)(0x100 - b));
        return 1;
    }
    size_t need = b == 0xcc || b == 0xd0 ? 2 : b == 0xcd || b == 0xd1 ? 3 : b == 0xce || b == 0xd2 ? 5 : 9;
    if ((b < 0xcc || b > 0xd3) || n < need)
        return 0;
    *kl = need;
    switch (b) {
    case 0xcc: u = p[1]; if (u < 0x80) return 0; break;
    case 0xcd: u = udng_rd16be(p + 1); if (u <= 0xff) return 0; break;
    case 0xce: u = udng_rd32be(p + 1); if (u <= 0xffff) return 0; break;
    case 0xcf: u = udng_rd64be(p + 1); if (u <= 0xffffffffULL) return 0; break;
    default:
        v = b == 0xd0 ? (int8_t)p[1] : b == 0xd1 ? (int16_t)udng_rd16be(p + 1)
          : b == 0xd2 ? (int32_t)udng_rd32be(p + 1) : (int64_t)udng_rd64be(p + 1);
        if (v >= (b == 0xd0 ? -32 : b == 0xd1 ? -128 : b == 0xd2 ? -32768 : -2147483648LL))
            return 0;
        *h = udng_int_hash(1, (uint64_t)0 - (uint64_t)v);
        return 1;
    }
    *h = udng_int_hash(0, u);
    return 1;
}

/* One record's key (at *kpos, *kl bytes, hashed *h; *is_int for an int)
 * and what it does: 1 (set: *vpos, *vlen), 0 (delete), -1 not simple. */
static int
simple_record(const unsigned char *s, uint64_t base, uint32_t n, long op_set, long op_del, uint64_t *kpos,
              size_t *kl, uint64_t *h, int *is_int, uint64_t *vpos, uint32_t *vlen)
{
    const unsigned char *p = s + base;
    int set;
    if (n >= 5 && p[0] == 0x94 && p[1] == (unsigned char)op_set && p[2] == 0x90)
        set = 1;
    else if (op_del >= 0 && n >= 4 && p[0] == 0x93 && p[1] == (unsigned char)op_del && p[2] == 0x90)
        set = 0;
    else
        return -1;
    const unsigned char *data;
    size_t dl;
    *is_int = 0;
    if (str_key(p + 3, n - 3, kl, &data, &dl))
        *h = udng_str_hash(data, dl);
    else if (int_key(p + 3, n - 3, kl, h))
        *is_int = 1;
    else
        return -1;
    *kpos = base + 3;
    if (!set)
        return 3 + *kl == n ? 0 : -1;
    uint64_t at = 3 + *kl;
    if (at >= n || udng_mp_skip(p + at, (Py_ssize_t)(n - at)) != (Py_ssize_t)(n - at))
        return -1;
    *vpos = base + at;
    *vlen = (uint32_t)(n - at);
    return 1;
}

/* The records' keys into plan->keys, through the map ix (mask + 1 slots: 0
 * empty, else the hash's top 32 bits | key index + 1).  1 done, 0 a record
 * not simple (the reading ends there) or a delete of a key the history
 * made absent (told once every record is read), -1 records that do not fit
 * `end`.  Runs without the GIL: no Python object is touched. */
static int
map_records(merge_plan *plan, const unsigned char *s, uint64_t end, long op_set, long op_del, uint64_t *ix,
            uint64_t mask, uint32_t *order)
{
    uint64_t pos = 0, used = 0, rh[BATCH], rk[BATCH], rv[BATCH];
    int absent = 0;  /* a delete of a key the history made absent: known once every record is read */
    size_t rkl[BATCH];
    uint32_t rvl[BATCH];
    int rset[BATCH];
    while (pos < end) {
        int nb = 0;
        uint64_t q = pos;
        while (nb < BATCH && q < end) {  /* parse and hash ahead, start the slots' reads */
            if (end - q < 16 || udng_rd32le(s + q) > end - q - 16)
                return -1;
            uint32_t n = udng_rd32le(s + q);
            int is_int;
            rv[nb] = 0;
            rvl[nb] = 0;
            rset[nb] = simple_record(s, q + 16, n, op_set, op_del, &rk[nb], &rkl[nb], &rh[nb], &is_int, &rv[nb],
                                     &rvl[nb]);
            if (rset[nb] < 0)
                return 0;
            plan->ints |= is_int;
            __builtin_prefetch(&ix[rh[nb] & mask]);
            nb++;
            q += 16 + (uint64_t)n;
        }
        for (int j = 0; j < nb; j++) {
            uint64_t h = rh[j], tag = h & ~(uint64_t)0xffffffff, i = h & mask;
            mkey *e;
            for (;; i = (i + 1) & mask) {
                uint64_t x = ix[i];
                if (x == 0) {
                    e = &plan->keys[used];
                    memset(e, 0, sizeof *e);
                    e->h = h;
                    e->kpos = (uint32_t)rk[j];
                    e->klen = (uint32_t)rkl[j];
                    ix[i] = tag | ++used;
                    break;
                }
                if ((x & ~(uint64_t)0xffffffff) != tag)
                    continue;
                e = &plan->keys[(x & 0xffffffff) - 1];
                if (e->h == h && e->klen == rkl[j] && memcmp(s + e->kpos, s + rk[j], rkl[j]) == 0)
                    break;
            }
            if (!rset[j]) {
                if (!e->live) {
                    if (e->had_del)
                        absent = 1;  /* (deleted twice: the general path reports it) */
                    e->first_del = 1;  /* (the table must hold it: checked after the walk) */
                }
                e->live = 0;
                e->had_del = 1;
            } else {
                if (!e->live)
                    e->order = ++*order;
                e->live = 1;
                e->vpos = (uint32_t)rv[j];
                e->vlen = rvl[j];
            }
        }
        pos = q;
    }
    plan->nkeys = used;
    return absent ? 0 : 1;
}

/* stream_merge_plan(stream, end, buf, slots, start, tend, op_set, op_del)
 * -> None | (count, entries bytes, plan).  The merge of the records
 * stream[0:end) into the table (buf, slots, start, tend): how many entries
 * and entry bytes the new table holds, and the plan stream_merge_write
 * follows; None when a record does not qualify (above). */
PyObject *
udng_native_stream_merge_plan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "stream_merge_plan(stream, end, buf, slots, start, tend, op_set, op_del)");
        return NULL;
    }
    uint64_t end;
    if (!udng_u64_arg(args[1], &end))
        return NULL;
    long op_set = PyLong_AsLong(args[6]), op_del = PyLong_AsLong(args[7]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer sb, tb;
    table_view t;
    if (udng_table_view_args(args + 2, &tb, &t) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[0], &sb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&tb);
        return NULL;
    }
    PyObject *result = NULL;
    merge_plan *plan = NULL;
    uint64_t *ix = NULL;
    if (end > (uint64_t)sb.len || end > UINT32_MAX || op_set < 0 || op_set > 0x7f || op_del > 0x7f) {
        PyErr_SetString(PyExc_ValueError, "stream_merge_plan: end or ops out of range");
        goto done;
    }
    const unsigned char *s = (const unsigned char *)sb.buf;
    uint64_t nrec = 0;
    for (uint64_t pos = 0; pos + 16 <= end; nrec++)
        pos += 16 + (uint64_t)udng_rd32le(s + pos);
    uint64_t cap = 16;
    while (cap < nrec + nrec / 2)
        cap <<= 1;
    uint64_t nold = udng_rd64le(t.b + 16);  /* the header's count (Table checked it) */
    plan = calloc(1, sizeof *plan);
    ix = calloc(cap, sizeof *ix);
    if (plan == NULL || ix == NULL || nold > (t.end - t.start) / UDNG_TABLE_ENTRY_HEADER) {
        if (plan == NULL || ix == NULL)
            PyErr_NoMemory();
        else
            PyErr_SetString(PyExc_ValueError, "table entry count does not fit the entries");
        goto done;
    }
    plan->keys = malloc(sizeof(mkey) * (nrec + 1));
    plan->decide = malloc(sizeof(uint32_t) * (nold + 1));
    if (plan->keys == NULL || plan->decide == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    uint32_t order = 0;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = map_records(plan, s, end, op_set, op_del, ix, cap - 1, &order);
    Py_END_ALLOW_THREADS
    if (r < 0) {
        PyErr_SetString(PyExc_ValueError, "stream_merge_plan: the records do not fit the end");
        goto done;
    }
    if (r == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* The walk: each old entry checked, looked up, decided. */
    uint64_t nkeys = plan->nkeys, off = t.start, k = 0, bytes = 0, count = 0, mask = cap - 1;
    const char *bad = NULL;
    while (off < t.end && bad == NULL) {
        uint32_t kl, vl;
        if ((bad = udng_table_entry_bounds(&t, off, &kl, &vl)) != NULL || k == nold) {
            bad = bad != NULL ? bad : "table entries outnumber the table's count";
            break;
        }
        const unsigned char *en = t.b + off;
        uint64_t h = udng_rd64le(en), tag = h & ~(uint64_t)0xffffffff, i = h & mask;
        uint32_t d = 0;
        unsigned char k0 = kl ? en[UDNG_TABLE_ENTRY_HEADER] : 0;
        if (plan->ints && (k0 == 0xc2 || k0 == 0xc3 || k0 == 0xca || k0 == 0xcb
                           || (k0 >= 0xc7 && k0 <= 0xc9) || (k0 >= 0xd4 && k0 <= 0xd8))) {
            /* (a bool, float or ext key -- Decimal(1) and complex(1) equal 1 too --
               may equal an int one: replayed) */
            result = Py_NewRef(Py_None);
            goto done;
        }
        for (;; i = (i + 1) & mask) {
            uint64_t x = ix[i];
            if (x == 0)
                break;
            if ((x & ~(uint64_t)0xffffffff) != tag)
                continue;
            uint32_t ki = (uint32_t)(x & 0xffffffff) - 1;
            mkey *e = &plan->keys[ki];
            if (e->h == h && e->klen == kl && memcmp(s + e->kpos, en + UDNG_TABLE_ENTRY_HEADER, kl) == 0) {
                e->in_table = 1;
                d = e->had_del ? KEY_DROP : ki + 1;
                break;
            }
        }
        if (d == 0 && (bad = udng_table_entry_crc(&t, off, kl, vl)) != NULL)
            break;  /* (kept: copied as bytes, so checked; one dropped or given a new value matched its key) */
        plan->decide[k++] = d;
        if (d == 0)
            bytes += entry_size(kl, vl);
        else if (d != KEY_DROP)
            bytes += entry_size(kl, plan->keys[d - 1].vlen);
        count += d != KEY_DROP;
        off += entry_size(kl, vl);
    }
    if (bad == NULL && (off != t.end || k != nold))
        bad = "table entries do not add up to the table's count";
    if (bad != NULL) {
        PyErr_SetString(PyExc_ValueError, bad);
        goto done;
    }
    /* The appended keys, in order: present at the end and not in place in the table. */
    plan->appended = malloc(sizeof(uint32_t) * ((uint64_t)order + 1));
    if (plan->appended == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memset(plan->appended, 0xff, sizeof(uint32_t) * ((uint64_t)order + 1));
    for (uint64_t i = 0; i < nkeys; i++) {
        mkey *e = &plan->keys[i];
        if (!e->in_table && e->first_del) {  /* a delete of a key nothing held: the general path says so */
            result = Py_NewRef(Py_None);
            goto done;
        }
        if (!e->live || (e->in_table && !e->had_del))
            continue;
        plan->appended[e->order] = (uint32_t)i;
        bytes += entry_size(e->klen, e->vlen);
        count++;
    }
    uint64_t w = 0;
    for (uint64_t j = 1; j <= order; j++)
        if (plan->appended[j] != UINT32_MAX)
            plan->appended[w++] = plan->appended[j];
    plan->nappended = w;
    plan->count = count;
    plan->nold = nold;
    plan->bytes = bytes;
    plan->stream_len = end;
    plan->table_end = t.end;
    PyObject *capsule = PyCapsule_New(plan, PLAN_NAME, plan_capsule_free);
    if (capsule == NULL)
        goto done;
    plan = NULL;  /* (the capsule's now) */
    result = Py_BuildValue("(KKN)", (unsigned long long)count, (unsigned long long)bytes, capsule);
done:
    plan_free(plan);
    free(ix);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&tb);
    return result;
}

/* One entry: hash, key (from src at kpos), value (from vsrc at vpos), crc. */
static void
put_entry(unsigned char *x, uint64_t h, const unsigned char *key, uint32_t kl, const unsigned char *value,
          uint32_t vl)
{
    uint64_t size = entry_size(kl, vl);
    udng_wr64le(x, h);
    udng_wr32le(x + 8, kl);
    udng_wr32le(x + 12, vl);
    memset(x + 16, 0, 8);
    memcpy(x + UDNG_TABLE_ENTRY_HEADER, key, kl);
    memcpy(x + UDNG_TABLE_ENTRY_HEADER + kl, value, vl);
    memset(x + UDNG_TABLE_ENTRY_HEADER + kl + vl, 0, size - UDNG_TABLE_ENTRY_HEADER - kl - vl);
    uint32_t crc = udng_crc32(udng_crc32(0, x, 16), x + UDNG_TABLE_ENTRY_HEADER, (size_t)kl + vl);
    udng_wr32le(x + 16, crc);
}

/* stream_merge_write(plan, stream, buf, slots, start, tend, out, at) -> end:
 * the plan's entries written to out from offset at (the old entries kept,
 * revalued or dropped, then the appended ones, each with its crc); the
 * offset after them.  stream and the table must be the plan's. */
PyObject *
udng_native_stream_merge_write(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "stream_merge_write(plan, stream, buf, slots, start, tend, out, at)");
        return NULL;
    }
    merge_plan *plan = (merge_plan *)PyCapsule_GetPointer(args[0], PLAN_NAME);
    uint64_t at;
    if (plan == NULL || !udng_u64_arg(args[7], &at))
        return NULL;
    Py_buffer sb, tb, ob;
    table_view t;
    if (udng_table_view_args(args + 2, &tb, &t) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &sb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&tb);
        return NULL;
    }
    if (PyObject_GetBuffer(args[6], &ob, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&sb);
        PyBuffer_Release(&tb);
        return NULL;
    }
    PyObject *result = NULL;
    if ((uint64_t)sb.len < plan->stream_len || t.end != plan->table_end || at > (uint64_t)ob.len ||
        plan->bytes > (uint64_t)ob.len - at) {
        PyErr_SetString(PyExc_ValueError, "stream_merge_write: not the plan's buffers, or out too small");
        goto done;
    }
    const unsigned char *s = (const unsigned char *)sb.buf;
    unsigned char *o = (unsigned char *)ob.buf;
    uint64_t w = at, off = t.start;
    Py_BEGIN_ALLOW_THREADS
    for (uint64_t k = 0; k < plan->nold; k++) {
        const unsigned char *en = t.b + off;
        uint32_t kl = udng_rd32le(en + 8), vl = udng_rd32le(en + 12);
        uint64_t size = entry_size(kl, vl);
        uint32_t d = plan->decide[k];
        if (d == 0) {
            memcpy(o + w, en, size);
            w += size;
        } else if (d != KEY_DROP) {
            const mkey *e = &plan->keys[d - 1];
            put_entry(o + w, udng_rd64le(en), en + UDNG_TABLE_ENTRY_HEADER, kl, s + e->vpos, e->vlen);
            w += entry_size(kl, e->vlen);
        }
        off += size;
    }
    for (uint64_t j = 0; j < plan->nappended; j++) {
        const mkey *e = &plan->keys[plan->appended[j]];
        put_entry(o + w, e->h, s + e->kpos, e->klen, s + e->vpos, e->vlen);
        w += entry_size(e->klen, e->vlen);
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromUnsignedLongLong(w);
done:
    PyBuffer_Release(&ob);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&tb);
    return result;
}
