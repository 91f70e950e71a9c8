/* scan_stream: recovery's scan of a stream file for its whole units
 * (_disk/layout.py, step 4c).  The twin is streamscan.py. */
#include "udng.h"

#include <string.h>

/* scan_stream(buffer, tag) -> (end, units, stopped): recovery's scan of a
 * stream file (_disk/layout.py, "Opening and recovery", step 4c) -- the
 * records from offset 0 carrying `tag`, each within the buffer, with a
 * right crc and a unit word matching its offset in its unit -- and where
 * the last whole unit ends, how many whole units precede it, and why the
 * scan stopped ("" at the buffer's end; the reasons are _helper/streamscan.py's,
 * word for word).  Why compiled: the twin's loop costs ~1.5 us a record, two
 * seconds for a full 64 MiB stream, a third of a recovery.  Each header is
 * read once into locals, so bytes changing under the scan cannot make it
 * read outside the buffer; the GIL is released (no Python object is touched
 * and the buffer export keeps the mapping alive). */
PyObject *
udng_native_scan_stream(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scan_stream(buffer, tag)");
        return NULL;
    }
    uint64_t tag;
    if (!udng_u64_arg(args[1], &tag))
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = (const unsigned char *)b.buf;
    Py_ssize_t size = b.len, pos = 0, start = 0, end = 0, units = 0;
    const char *stopped = NULL;
    Py_BEGIN_ALLOW_THREADS
    while (size - pos >= 16) {
        uint32_t length = udng_rd32le(p + pos), rtag = udng_rd32le(p + pos + 4);
        uint32_t crc = udng_rd32le(p + pos + 8), unit = udng_rd32le(p + pos + 12);
        if (!(length | rtag | crc | unit)) {
            stopped = "zeros";
            break;
        }
        if ((uint64_t)rtag != tag) {
            stopped = "a record of another generation";
            break;
        }
        if ((Py_ssize_t)length > size - pos - 16) {
            stopped = "a record running past the file";
            break;
        }
        Py_ssize_t body = pos + 16;
        if (udng_crc32(udng_crc32(0, p + pos, 8), p + body, length) != crc) {
            stopped = "a record failing its checksum";
            break;
        }
        if ((uint64_t)(unit >> 1) != (uint64_t)(pos - start)) {  /* UNIT_BACK_SHIFT */
            stopped = "a record not of the unit before it";
            break;
        }
        pos = body + (Py_ssize_t)length;
        if (unit & 1) {  /* UNIT_LAST */
            end = start = pos;
            units++;
        }
    }
    if (stopped == NULL && pos < size)
        stopped = "the file's end";
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    /* Records of a unit never finished, then an end (zeros, another
     * generation, the file's end): a writer killed inside a transaction, said
     * so -- not taken for an end followed by records (scanning.records_after). */
    if (start != pos && (stopped == NULL || !strcmp(stopped, "zeros")
                         || !strcmp(stopped, "a record of another generation")))
        stopped = "a transaction's records without its last";
    return Py_BuildValue("nns", end, units, stopped == NULL ? "" : stopped);
}
