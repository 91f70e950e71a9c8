/*
 * key_hash_common: _codec/keyhash.py's key_hash for the key types that fill
 * big dicts (str, bytes, int, bool, float, None), compiled, so that a probe of
 * a shared table does not spend most of its time hashing (measured: the
 * Python key_hash of a 13-character str ~0.5-0.8 us, most of it creating a
 * hashlib object).  Part of ultradict_ng._helper._native (setup.py lists both
 * sources); its twin is twins.key_hash_common.
 *
 * It returns None for every other type: the caller then uses the Python
 * key_hash, which knows them all and raises the errors.  It must give the
 * Python function's results bit for bit (keyhash.py is the definition;
 * tests/test_keyhash.py compares the two on generated keys):
 *
 *   str:    BLAKE2b (RFC 7693), 8-byte digest, personalisation "udng-str",
 *           of the UTF-8 encoding (a str with lone surrogates: None, so the
 *           Python function raises UnsupportedType);
 *   bytes:  the same with "udng-bytes";
 *   int, bool, float: SplitMix64's finaliser of Python's numeric hash (the
 *           unsalted, arithmetic one) xor the number tag; a NaN: of the NaN tag;
 *   None:   of the None tag.
 *
 * BLAKE2b is written here from the RFC's description (parameter block with
 * digest length 8, fanout and depth 1, no key, no salt, the personalisation
 * in its last 16 bytes); only the parts an 8-byte unkeyed digest needs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define T_NUMBER 0x9E3779B97F4A7C15ULL
#define T_NAN 0x632BE59BD9B4E019ULL
#define T_NONE 0x85EBCA77C2B2AE63ULL

static const uint64_t B2_IV[8] = {
    0x6A09E667F3BCC908ULL, 0xBB67AE8584CAA73BULL, 0x3C6EF372FE94F82BULL, 0xA54FF53A5F1D36F1ULL,
    0x510E527FADE682D1ULL, 0x9B05688C2B3E6C1FULL, 0x1F83D9ABFB41BD6BULL, 0x5BE0CD19137E2179ULL,
};

static const uint8_t B2_SIGMA[10][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
};

static inline uint64_t rotr64(uint64_t x, unsigned n) { return (x >> n) | (x << (64 - n)); }

static inline uint64_t load64_le(const unsigned char *p)
{
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = (x << 8) | p[i];
    return x;
}

#define B2_G(a, b, c, d, x, y)            \
    do {                                   \
        v[a] = v[a] + v[b] + (x);          \
        v[d] = rotr64(v[d] ^ v[a], 32);    \
        v[c] = v[c] + v[d];                \
        v[b] = rotr64(v[b] ^ v[c], 24);    \
        v[a] = v[a] + v[b] + (y);          \
        v[d] = rotr64(v[d] ^ v[a], 16);    \
        v[c] = v[c] + v[d];                \
        v[b] = rotr64(v[b] ^ v[c], 63);    \
    } while (0)

/* The compression function F on one 128-byte block; t: bytes hashed so far
 * (messages here are < 2**64 bytes, so the counter's high word is 0). */
static void b2_compress(uint64_t h[8], const unsigned char block[128], uint64_t t, int last)
{
    uint64_t v[16], m[16];
    for (int i = 0; i < 16; i++)
        m[i] = load64_le(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = B2_IV[i];
    }
    v[12] ^= t;
    if (last)
        v[14] = ~v[14];
    for (int r = 0; r < 12; r++) {
        const uint8_t *s = B2_SIGMA[r % 10];
        B2_G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        B2_G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        B2_G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        B2_G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        B2_G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        B2_G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        B2_G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        B2_G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (int i = 0; i < 8; i++)
        h[i] ^= v[i] ^ v[i + 8];
}

/* BLAKE2b with an 8-byte digest and a personalisation of at most 16 bytes;
 * the digest's 8 bytes read as a little-endian u64 (as keyhash.py reads them). */
static uint64_t blake2b_64(const unsigned char *data, size_t len, const char *person)
{
    unsigned char pers[16] = {0}, block[128];
    uint64_t h[8];
    memcpy(pers, person, strlen(person));
    for (int i = 0; i < 8; i++)
        h[i] = B2_IV[i];
    h[0] ^= 0x01010000ULL ^ 8; /* fanout 1, depth 1, no key, digest length 8 */
    h[6] ^= load64_le(pers);
    h[7] ^= load64_le(pers + 8);
    uint64_t t = 0;
    while (len > 128) {
        t += 128;
        b2_compress(h, data, t, 0);
        data += 128;
        len -= 128;
    }
    memset(block, 0, sizeof block);
    memcpy(block, data, len);
    b2_compress(h, block, t + len, 1);
    return h[0];
}

/* SplitMix64's finaliser (keyhash.mix). */
static inline uint64_t mix64(uint64_t h)
{
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL;
    return h ^ (h >> 31);
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
        *out = blake2b_64((const unsigned char *)s, (size_t)n, "udng-str");
        return 1;
    }
    if (t == &PyBytes_Type) {
        *out = blake2b_64((const unsigned char *)PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key),
                          "udng-bytes");
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
