/* Words: seq_cst load/store/cas/add of the control words, record writes
 * (write_record; write_simple, a root-level scalar or JSON-like set encoded
 * straight into the stream), publish, and futex wait/wake on a word's low 32
 * bits (layout.py: "Waiting and waking").  Why compiled: a write takes the
 * lock, publishes STATE and releases -- three atomics, ~50 ns each here
 * against ~1-10 us through the atomics package.  The twin is words.py. */
#include "udng.h"
#include <stddef.h>
#include <string.h>
#include <structmember.h>
#if UDNG_FUTEX
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

/* ---- Words ---------------------------------------------------------------- */


int
udng_words_usable(WordsObject *self)
{
    if (!self->held) {
        PyObject *mod = PyImport_ImportModule("ultradict_ng.errors");
        PyObject *closed = mod ? PyObject_GetAttrString(mod, "Closed") : NULL;
        Py_XDECREF(mod);
        if (closed) {
            PyErr_SetString(closed, "this handle's shared memory was closed");
            Py_DECREF(closed);
        }
        return 0;
    }
    return 1;
}

int
udng_word_index(WordsObject *self, PyObject *arg, Py_ssize_t *out)
{
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred())
        return 0;
    if (i < 0 || i >= self->nwords) {
        PyErr_Format(PyExc_IndexError, "word index %zd outside 0..%zd", i, self->nwords - 1);
        return 0;
    }
    *out = i;
    return 1;
}


static int
words_init(WordsObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *buf;
    static char *kwlist[] = {"buffer", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:Words", kwlist, &buf))
        return -1;
    if (self->held) {
        PyErr_SetString(PyExc_RuntimeError, "Words is already initialised");
        return -1;
    }
    if (PyObject_GetBuffer(buf, &self->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    self->held = 1;
    if (((uintptr_t)self->view.buf & 7) != 0) {
        PyBuffer_Release(&self->view);
        self->held = 0;
        PyErr_SetString(PyExc_ValueError, "buffer is not 8-byte aligned");
        return -1;
    }
    self->words = (uint64_t *)self->view.buf;
    self->nwords = self->view.len / 8;
    return 0;
}

static void
words_dealloc(WordsObject *self)
{
    if (self->held) {
        PyBuffer_Release(&self->view);
        self->held = 0;
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
words_load(WordsObject *self, PyObject *arg)
{
    Py_ssize_t i;
    if (!udng_words_usable(self) || !udng_word_index(self, arg, &i))
        return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&self->words[i], __ATOMIC_SEQ_CST));
}

static PyObject *
words_store(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i;
    uint64_t v;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "store(index, value)");
        return NULL;
    }
    if (!udng_words_usable(self) || !udng_word_index(self, args[0], &i) || !udng_u64_arg(args[1], &v))
        return NULL;
    __atomic_store_n(&self->words[i], v, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

static PyObject *
words_cas(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i;
    uint64_t expected, desired;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "cas(index, expected, desired)");
        return NULL;
    }
    if (!udng_words_usable(self) || !udng_word_index(self, args[0], &i) || !udng_u64_arg(args[1], &expected) ||
        !udng_u64_arg(args[2], &desired))
        return NULL;
    int ok = __atomic_compare_exchange_n(&self->words[i], &expected, desired, 0,
                                         __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    PyObject *seen = PyLong_FromUnsignedLongLong(expected);
    if (seen == NULL)
        return NULL;
    PyObject *res = PyTuple_Pack(2, ok ? Py_True : Py_False, seen);
    Py_DECREF(seen);
    return res;
}

/* write_record(pos, tag, payload): the record header and payload at byte
 * offset pos of this buffer (the stream), with the checksum of layout.py:
 * crc32(payload, crc32(le32 length, le32 tag)).  Plain stores: the caller
 * publishes them afterwards with a seq_cst store of STATE.  Returns the
 * offset just past the record. */
static PyObject *
words_write_record(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t pos;
    uint64_t tag;
    Py_buffer payload;
    uint64_t unit = 1;
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "write_record(pos, tag, payload[, unit])");
        return NULL;
    }
    if (!udng_words_usable(self))
        return NULL;
    pos = PyLong_AsSsize_t(args[0]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    if (!udng_u64_arg(args[1], &tag))
        return NULL;
    if (nargs == 4 && !udng_u64_arg(args[3], &unit))
        return NULL;
    if (tag > 0xffffffffu || unit > 0xffffffffu) {
        PyErr_SetString(PyExc_OverflowError, "record tag or unit does not fit 32 bits");
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &payload, PyBUF_SIMPLE) < 0)
        return NULL;
    if (payload.len > 0xffffffffLL || pos < 0 || pos > self->view.len ||
        payload.len + 16 > self->view.len - pos) {
        PyBuffer_Release(&payload);
        PyErr_SetString(PyExc_ValueError, "record does not fit the stream at that offset");
        return NULL;
    }
    unsigned char *dst = (unsigned char *)self->view.buf + pos;
    memcpy(dst + 16, payload.buf, (size_t)payload.len);
    udng_put_header(dst, (uint32_t)payload.len, (uint32_t)tag, (uint32_t)unit);
    Py_ssize_t end = pos + 16 + payload.len;
    PyBuffer_Release(&payload);
    return PyLong_FromSsize_t(end);
}


/* The record [op, [], key] or [op, [], key, value] (a root-level delete or
 * set; value NULL: a delete) encoded as msgpack into w's buffer at byte
 * offset pos, with its header and checksum: the bytes write_record(pos, tag,
 * codec.dumps(record)) would store.  Returns the offset after it, or -1
 * with nothing written and no exception set when the key or value is not a
 * plain scalar or the record does not fit below `limit` (the stream's LIMIT)
 * and the buffer's end.  Only stores; the caller publishes.  Shared by
 * write_simple and the transaction write path (vb_ass_subscript). */
Py_ssize_t
udng_simple_record(WordsObject *w, Py_ssize_t pos, uint32_t tag, Py_ssize_t limit, long op,
              PyObject *key, PyObject *value, Py_ssize_t threshold, uint32_t unit, int plain)
{
    Py_ssize_t (*encode)(PyObject *, unsigned char *, Py_ssize_t) = plain ? udng_mp_plain_value : udng_mp_value;
    if (limit > w->view.len)
        limit = w->view.len;
    Py_ssize_t nk = udng_mp_scalar(key, NULL);
    if (nk < 0)
        return -1;
    Py_ssize_t nv = 0;
    if (value != NULL) {
        nv = encode(value, NULL, threshold);
        if (nv < 0)
            return -1;
    }
    Py_ssize_t length = 3 + nk + nv;  /* array header, op fixint, empty path */
    if (pos < 0 || pos > limit || length + 16 > limit - pos)
        return -1;
    unsigned char *dst = (unsigned char *)w->view.buf + pos;
    unsigned char *body = dst + 16;
    body[0] = (unsigned char)(value != NULL ? 0x94 : 0x93);  /* op, path, key[, value] */
    body[1] = (unsigned char)op;
    body[2] = 0x90;
    udng_mp_scalar(key, body + 3);
    if (value != NULL)
        encode(value, body + 3 + nk, threshold);
    udng_put_header(dst, (uint32_t)length, tag, unit);
    return pos + 16 + length;
}

/* write_simple(pos, tag, limit, op, key[, value[, threshold[, unit[, plain]]]])
 * -> end or None: the record of udng_simple_record written into this buffer; None
 * (nothing written) where udng_simple_record gives -1, and the caller takes the
 * general path.  With plain true the value may also be udng_mp_plain_value's (a
 * JSON-like tree): the caller stores a copy of it in its cache. */
static PyObject *
words_write_simple(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 5 || nargs > 9) {
        PyErr_SetString(PyExc_TypeError,
                        "write_simple(pos, tag, limit, op, key[, value[, threshold[, unit[, plain]]]])");
        return NULL;
    }
    if (!udng_words_usable(self))
        return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[0]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    uint64_t tag;
    if (!udng_u64_arg(args[1], &tag))
        return NULL;
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    long op = PyLong_AsLong(args[3]);
    if (op == -1 && PyErr_Occurred())
        return NULL;
    if (tag > 0xffffffffu || op < 0 || op > 127) {
        PyErr_SetString(PyExc_ValueError, "write_simple: tag or op out of range");
        return NULL;
    }
    Py_ssize_t threshold = 0;
    if (nargs >= 7) {
        threshold = PyLong_AsSsize_t(args[6]);
        if (threshold == -1 && PyErr_Occurred())
            return NULL;
    }
    uint64_t unit = 1;
    if (nargs >= 8 && !udng_u64_arg(args[7], &unit))
        return NULL;
    int plain = nargs == 9 ? PyObject_IsTrue(args[8]) : 0;
    if (plain < 0)
        return NULL;
    if (unit > 0xffffffffu) {
        PyErr_SetString(PyExc_OverflowError, "write_simple: unit does not fit 32 bits");
        return NULL;
    }
    Py_ssize_t end = udng_simple_record(self, pos, (uint32_t)tag, limit, op, args[4], nargs >= 6 ? args[5] : NULL,
                                   threshold, (uint32_t)unit, plain);
    if (end < 0)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(end);
}

/* ---- futex on a word's low 32 bits (layout.py: "Waiting and waking") ----- */

/* The futex word of a 64-bit word: its low 32 bits, wherever the byte order
 * puts them.  The kernel compares and sleeps on 32 bits; the 64-bit sequence
 * words only ever grow, so their low halves change with every increment. */
static uint32_t *
futex_word(uint64_t *w)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (uint32_t *)w + 1;
#else
    return (uint32_t *)w;
#endif
}

long
udng_futex_wake_n(uint64_t *w, int n)
{
#if UDNG_FUTEX
    long r = syscall(SYS_futex, futex_word(w), FUTEX_WAKE, n, NULL, NULL, 0);
    return r < 0 ? 0 : r;
#else
    (void)w; (void)n;
    return 0;
#endif
}

/* add(index, delta) -> the new value (seq_cst fetch-add, wrapping at 2**64). */
static PyObject *
words_add(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i;
    uint64_t d;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add(index, delta)");
        return NULL;
    }
    if (!udng_words_usable(self) || !udng_word_index(self, args[0], &i) || !udng_u64_arg(args[1], &d))
        return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_add_fetch(&self->words[i], d, __ATOMIC_SEQ_CST));
}

/* publish(index, value, watch) -> word watch: a seq_cst store of value, then a
 * seq_cst load of another word.  The writer's half of the no-lost-wake-up
 * rule: a waiter sets its bit in the watched word before it checks the
 * published one, so either the waiter sees the store or this load sees the
 * bit (both sides seq_cst; a plain load could pass the store on ARM). */
static PyObject *
words_publish(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i, j;
    uint64_t v;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "publish(index, value, watch)");
        return NULL;
    }
    if (!udng_words_usable(self) || !udng_word_index(self, args[0], &i) || !udng_u64_arg(args[1], &v) ||
        !udng_word_index(self, args[2], &j))
        return NULL;
    __atomic_store_n(&self->words[i], v, __ATOMIC_SEQ_CST);
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&self->words[j], __ATOMIC_SEQ_CST));
}

/* wait(index, expected, timeout) -> bool: sleep while the low 32 bits of the
 * word equal those of expected, at most timeout seconds (None: no limit).
 * False when the time ran out; True otherwise (woken, the value differed, or
 * a signal: the caller re-checks what it waits for).  The GIL is released
 * while asleep; a signal handler that raises (Ctrl-C) propagates. */
static PyObject *
words_wait(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i;
    uint64_t expected;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "wait(index, expected, timeout)");
        return NULL;
    }
    if (!udng_words_usable(self) || !udng_word_index(self, args[0], &i) || !udng_u64_arg(args[1], &expected))
        return NULL;
#if UDNG_FUTEX
    struct timespec ts, *tsp = NULL;
    if (args[2] != Py_None) {
        double t = PyFloat_AsDouble(args[2]);
        if (t == -1.0 && PyErr_Occurred())
            return NULL;
        if (!(t > 0.0))
            t = 0.0;
        if (t > 1e9)
            t = 1e9;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_nsec = 999999999L;
        tsp = &ts;
    }
    uint32_t *addr = futex_word(&self->words[i]);
    uint32_t val = (uint32_t)(expected & 0xFFFFFFFFu);
    long r;
    int err;
    Py_BEGIN_ALLOW_THREADS
    r = syscall(SYS_futex, addr, FUTEX_WAIT, val, tsp, NULL, 0);
    err = errno;
    Py_END_ALLOW_THREADS
    if (r == 0 || err == EAGAIN)
        Py_RETURN_TRUE;
    if (err == ETIMEDOUT)
        Py_RETURN_FALSE;
    if (err == EINTR) {
        if (PyErr_CheckSignals() < 0)
            return NULL;
        Py_RETURN_TRUE;
    }
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
#else
    PyErr_SetString(PyExc_NotImplementedError, "no futex on this platform");
    return NULL;
#endif
}

/* wake(index, count) -> how many sleepers were woken. */
static PyObject *
words_wake(WordsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wake(index, count)");
        return NULL;
    }
    if (!udng_words_usable(self) || !udng_word_index(self, args[0], &i))
        return NULL;
    long n = PyLong_AsLong(args[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1)
        n = 1;
    if (n > INT_MAX)
        n = INT_MAX;
#if UDNG_FUTEX
    return PyLong_FromLong(udng_futex_wake_n(&self->words[i], (int)n));
#else
    PyErr_SetString(PyExc_NotImplementedError, "no futex on this platform");
    return NULL;
#endif
}

static PyObject *
words_release(WordsObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->held) {
        PyBuffer_Release(&self->view);
        self->held = 0;
        self->words = NULL;
        self->nwords = 0;
    }
    Py_RETURN_NONE;
}

static PyMethodDef words_methods[] = {
    {"load", (PyCFunction)words_load, METH_O, "load(index) -> int: seq_cst load of a word."},
    {"store", (PyCFunction)(void (*)(void))words_store, METH_FASTCALL,
     "store(index, value): seq_cst store of a word."},
    {"cas", (PyCFunction)(void (*)(void))words_cas, METH_FASTCALL,
     "cas(index, expected, desired) -> (swapped, seen): seq_cst compare-and-swap."},
    {"write_record", (PyCFunction)(void (*)(void))words_write_record, METH_FASTCALL,
     "write_record(pos, tag, payload[, unit]) -> end: a stream record at byte offset pos."},
    {"write_simple", (PyCFunction)(void (*)(void))words_write_simple, METH_FASTCALL,
     "write_simple(pos, tag, limit, op, key[, value[, threshold[, unit[, plain]]]]) -> end or None: a root-level "
     "record of a scalar value (plain: or of a JSON-like one)."},
    {"add", (PyCFunction)(void (*)(void))words_add, METH_FASTCALL,
     "add(index, delta) -> new value: seq_cst fetch-add."},
    {"publish", (PyCFunction)(void (*)(void))words_publish, METH_FASTCALL,
     "publish(index, value, watch) -> word watch: seq_cst store, then seq_cst load."},
    {"wait", (PyCFunction)(void (*)(void))words_wait, METH_FASTCALL,
     "wait(index, expected, timeout) -> False on timeout: futex wait on the word's low 32 bits."},
    {"wake", (PyCFunction)(void (*)(void))words_wake, METH_FASTCALL,
     "wake(index, count) -> woken: futex wake on the word's low 32 bits."},
    {"release", (PyCFunction)words_release, METH_NOARGS,
     "release(): drop the buffer export; later operations raise Closed."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject udng_WordsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ultradict_ng._helper._native.Words",
    .tp_basicsize = sizeof(WordsObject),
    .tp_dealloc = (destructor)words_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Words(buffer): atomic 64-bit operations on the words of a writable buffer.",
    .tp_methods = words_methods,
    .tp_init = (initproc)words_init,
    .tp_new = PyType_GenericNew,
};

