/*
 * key_hash_common: _codec/keyhash.py's key_hash for the key types that fill
 * big dicts (str, bytes, int, bool, float, None), compiled, so that a probe of
 * a shared table does not spend most of its time hashing (measured: the
 * Python key_hash of a 13-character str ~0.5-0.8 us).  Part of ultradict_ng._helper._native (pyproject.toml lists both
 * sources); its twin is keyhash.key_hash_common.
 *
 * It returns None for every other type: the caller then uses the Python
 * key_hash, which knows them all and raises the errors.  It must give the
 * Python function's results bit for bit (keyhash.py is the definition;
 * tests/test_keyhash.py compares the two on generated keys):
 *
 *   str:    keyhash._words of the UTF-8 encoding with the str tag (a str
 *           with lone surrogates: None, so the Python function raises
 *           UnsupportedType);
 *   bytes:  the same with the bytes tag;
 *   int, bool, float: SplitMix64's finaliser of Python's numeric hash (the
 *           unsalted, arithmetic one) xor the number tag; a NaN: of the NaN tag;
 *   None:   of the None tag.
 */
#include "udng.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

#define T_NUMBER 0x9E3779B97F4A7C15ULL
#define T_NAN 0x632BE59BD9B4E019ULL
#define T_NONE 0x85EBCA77C2B2AE63ULL

#define T_STR 0x3C6EF372FE94F82BULL
#define T_BYTES 0xA54FF53A5F1D36F1ULL
#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P5 0x27D4EB2F165667C5ULL


static inline uint64_t rotl64(uint64_t x, unsigned n) { return (x << n) | (x >> (64 - n)); }

static inline uint64_t mix64(uint64_t h);

/* keyhash._words: the bytes as little-endian u64 words, the last zero-padded,
 * each folded in with xxHash64's round, from tag ^ length * P5. */
static uint64_t words_hash(const unsigned char *p, size_t n, uint64_t tag)
{
    uint64_t acc = tag ^ ((uint64_t)n * P5);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = rotl64(acc ^ (udng_rd64le(p + i) * P2), 31) * P1;
    if (i < n) {
        unsigned char last[8] = {0};
        memcpy(last, p + i, n - i);
        acc = rotl64(acc ^ (udng_rd64le(last) * P2), 31) * P1;
    }
    return mix64(acc);
}

/* SplitMix64's finaliser (keyhash.mix). */
static inline uint64_t mix64(uint64_t h)
{
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL;
    return h ^ (h >> 31);
}

/* A str key's hash from its UTF-8 bytes (key_hash of that str). */
uint64_t udng_str_hash(const unsigned char *p, size_t n)
{
    return words_hash(p, n, T_STR);
}

/* An int key's hash from its sign and magnitude (key_hash of that int):
 * Python's numeric hash of it -- the magnitude modulo 2**61 - 1, negated
 * for a negative number, -1 made -2 -- through the number tag. */
uint64_t udng_int_hash(int negative, uint64_t magnitude)
{
    uint64_t h = magnitude % 0x1FFFFFFFFFFFFFFFULL;
    if (negative) {
        h = (uint64_t)(-(int64_t)h);
        if (h == UINT64_MAX)
            h = (uint64_t)-2;
    }
    return mix64(h ^ T_NUMBER);
}

/* 1 and *out set for a type handled here; 0 for any other type; -1 on error. */
int udng_key_hash_common(PyObject *key, uint64_t *out)
{
    PyTypeObject *t = Py_TYPE(key);
    if (t == &PyUnicode_Type) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(key, &n);
        if (s == NULL) { /* lone surrogates: the Python function says why it refuses */
            PyErr_Clear();
            return 0;
        }
        *out = words_hash((const unsigned char *)s, (size_t)n, T_STR);
        return 1;
    }
    if (t == &PyBytes_Type) {
        *out = words_hash((const unsigned char *)PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key),
                          T_BYTES);
        return 1;
    }
    if (key == Py_None) {
        *out = mix64(T_NONE);
        return 1;
    }
    if (t == &PyFloat_Type && isnan(PyFloat_AS_DOUBLE(key))) {
        *out = mix64(T_NAN);
        return 1;
    }
    if (t == &PyLong_Type || t == &PyBool_Type || t == &PyFloat_Type) {
        Py_hash_t h = PyObject_Hash(key);
        if (h == -1 && PyErr_Occurred())
            return -1;
        *out = mix64((uint64_t)h ^ T_NUMBER);
        return 1;
    }
    return 0;
}

PyObject *
udng_native_key_hash_common(PyObject *module, PyObject *key)
{
    uint64_t h;
    int r = udng_key_hash_common(key, &h);
    if (r < 0)
        return NULL;
    if (r == 0)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(h);
}
