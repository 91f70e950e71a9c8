/* ProcessState: the lock's per-process state with enter/exit as one call
 * each, the fast paths of SharedLock.  The twin is lockstate.py. */
#include "udng.h"
#include <stddef.h>
#include <structmember.h>

/* ---- ProcessState: the lock's per-process state and its fast paths ------- */

/* Mirrors lock._ProcessState (the pure-Python twin, used with the other
 * implementations): which thread of this process holds the dict's lock and
 * how often (reentrancy), and `mutex`, a threading.Lock that lets only one
 * of our threads compete for the shared word.  enter()/exit() are the
 * common cases of SharedLock.acquire()/release() in one call each; every
 * other case (waiting for another process, timeouts, recovery) stays in
 * Python and manipulates the same attributes. */

typedef struct {
    PyObject_HEAD
    PyObject *mutex;
    unsigned long owner;
    int owned;
    long count;
    PyObject *weakreflist;
} ProcessStateObject;

static PyObject *str_acquire, *str_release;

static PyObject *
ps_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    ProcessStateObject *self = (ProcessStateObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    PyObject *threading = PyImport_ImportModule("threading");
    if (threading == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->mutex = PyObject_CallMethod(threading, "Lock", NULL);
    Py_DECREF(threading);
    if (self->mutex == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
ps_dealloc(ProcessStateObject *self)
{
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    Py_XDECREF(self->mutex);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* (words, index, mine) with words a Words object; returns the word pointer. */
static uint64_t *
ps_word(PyObject *const *args, Py_ssize_t nargs, uint64_t *mine)
{
    if (nargs != 3 || !PyObject_TypeCheck(args[0], &udng_WordsType)) {
        PyErr_SetString(PyExc_TypeError, "expected (words: Words, index, owner word)");
        return NULL;
    }
    WordsObject *w = (WordsObject *)args[0];
    Py_ssize_t i;
    if (!udng_words_usable(w) || !udng_word_index(w, args[1], &i) || !udng_u64_arg(args[2], mine))
        return NULL;
    return &w->words[i];
}

/* enter(words, index, mine) -> bool.  True: the lock is held by the calling
 * thread (reentered, or the word was free and is now ours).  False: the
 * mutex is now held by the calling thread but another process holds the
 * word; the caller waits for it and then sets owner and count. */
static PyObject *
ps_enter(ProcessStateObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t mine;
    uint64_t *word = ps_word(args, nargs, &mine);
    if (word == NULL)
        return NULL;
    unsigned long me = PyThread_get_thread_ident();
    if (self->owned && self->owner == me) {
        self->count++;
        Py_RETURN_TRUE;
    }
    PyObject *mutex = self->mutex;
    Py_INCREF(mutex);
    PyObject *r = PyObject_CallMethodNoArgs(mutex, str_acquire);  /* may wait, may raise */
    Py_DECREF(mutex);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    uint64_t expected = 0;
    if (__atomic_compare_exchange_n(word, &expected, mine, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        self->owner = me;
        self->owned = 1;
        self->count = 1;
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

/* exit(words, index, mine) -> True, False, 2 or None.  None: the calling
 * thread does not hold the lock (nothing changed).  Otherwise one level is
 * released; on the last one the word is swapped from ours to 0 and the
 * mutex released.  False: the word was no longer ours (taken over).
 *
 * After the swap, the word after LOCK (LOCK_WAITERS, layout.py "Waiting and
 * waking") is loaded: if a process has registered a sleeping waiter, the
 * word after that (LOCK_SEQ) is incremented and one sleeper woken.  2: that
 * happened and woke nobody (a waiter about to sleep, or one that died while
 * registered: the caller may check the register).  An uncontended release
 * makes no system call. */
static PyObject *
ps_exit(ProcessStateObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t mine;
    uint64_t *word = ps_word(args, nargs, &mine);
    if (word == NULL)
        return NULL;
    if (!self->owned || self->owner != PyThread_get_thread_ident())
        Py_RETURN_NONE;
    if (--self->count > 0)
        Py_RETURN_TRUE;
    self->owned = 0;
    self->count = 0;
    WordsObject *w = (WordsObject *)args[0];
    int room = (word - w->words) + 3 < w->nwords;
    uint64_t expected = mine;
    int ok = __atomic_compare_exchange_n(word, &expected, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    int woke_nobody = 0;
    if (ok && room && __atomic_load_n(word + 1, __ATOMIC_SEQ_CST) != 0) {
        /* One wake at a time is in flight (LOCK_WAKING, word + 3); LOCK_SEQ
         * moves only with a wake, so that sleepers stay asleep meanwhile. */
        uint64_t idle = 0;
        if (__atomic_compare_exchange_n(word + 3, &idle, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            __atomic_add_fetch(word + 2, 1, __ATOMIC_SEQ_CST);
            /* (Woke nobody: a waiter between registering and sleeping will
             * see LOCK_SEQ moved and claim the wake.) */
            woke_nobody = udng_futex_wake_n(word + 2, 1) == 0;
        }
    }
    PyObject *mutex = self->mutex;
    Py_INCREF(mutex);
    PyObject *r = PyObject_CallMethodNoArgs(mutex, str_release);
    Py_DECREF(mutex);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    if (!ok)
        Py_RETURN_FALSE;
    if (woke_nobody)
        return PyLong_FromLong(2);
    Py_RETURN_TRUE;
}

static PyObject *
ps_get_owner(ProcessStateObject *self, void *closure)
{
    if (!self->owned)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(self->owner);
}

static int
ps_set_owner(ProcessStateObject *self, PyObject *value, void *closure)
{
    if (value == NULL || value == Py_None) {
        self->owned = 0;
        self->owner = 0;
        return 0;
    }
    unsigned long v = PyLong_AsUnsignedLong(value);
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    self->owner = v;
    self->owned = 1;
    return 0;
}

static PyObject *
ps_get_count(ProcessStateObject *self, void *closure)
{
    return PyLong_FromLong(self->count);
}

static int
ps_set_count(ProcessStateObject *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "count cannot be deleted");
        return -1;
    }
    long v = PyLong_AsLong(value);
    if (v == -1 && PyErr_Occurred())
        return -1;
    self->count = v;
    return 0;
}

static PyObject *
ps_get_mutex(ProcessStateObject *self, void *closure)
{
    Py_INCREF(self->mutex);
    return self->mutex;
}

static int
ps_set_mutex(ProcessStateObject *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "mutex cannot be deleted");
        return -1;
    }
    Py_INCREF(value);
    Py_SETREF(self->mutex, value);
    return 0;
}

static PyGetSetDef ps_getset[] = {
    {"owner", (getter)ps_get_owner, (setter)ps_set_owner, "thread ident of the holder, or None", NULL},
    {"count", (getter)ps_get_count, (setter)ps_set_count, "reentrancy depth of the holder", NULL},
    {"mutex", (getter)ps_get_mutex, (setter)ps_set_mutex, "threading.Lock held by the competing thread", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef ps_methods[] = {
    {"enter", (PyCFunction)(void (*)(void))ps_enter, METH_FASTCALL,
     "enter(words, index, mine) -> bool: reenter, or take the mutex and try the word once."},
    {"exit", (PyCFunction)(void (*)(void))ps_exit, METH_FASTCALL,
     "exit(words, index, mine) -> True/False/None: release one level (see the source)."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject udng_ProcessStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ultradict_ng._helper._native.ProcessState",
    .tp_basicsize = sizeof(ProcessStateObject),
    .tp_dealloc = (destructor)ps_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Per-process state of a dict's lock (see lock._ProcessState).",
    .tp_methods = ps_methods,
    .tp_getset = ps_getset,
    .tp_weaklistoffset = offsetof(ProcessStateObject, weakreflist),
    .tp_new = ps_new,
};


int
udng_lockstate_init(void)
{
    str_acquire = PyUnicode_InternFromString("acquire");
    str_release = PyUnicode_InternFromString("release");
    return str_acquire == NULL || str_release == NULL ? -1 : 0;
}
