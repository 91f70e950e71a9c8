/*
 * ultradict_ng._helper._native: the optional compiled helper, this file its
 * module: the method table, the types and the constants.
 *
 * Every entry point has a pure-Python twin of the same name and signature;
 * _helper/entries.py lists them all, each with the C file that implements it
 * and its twin module, which is named after that file (words.c, words.py).
 * speedups.py imports one set or the other and nothing else in the package
 * knows which.  _native.pyi types both.  The twins must behave identically,
 * byte for byte in shared memory; tests/test_native.py checks each against
 * a reference, and CI runs the suite on both
 * (ULTRADICT_NG_SPEEDUPS=native|bound|public).
 *
 * The files, by concern (each says what it holds and why it is compiled):
 *
 *   records.c      CRC-32, record headers, parse_records, msgpack_length,
 *                  apply_sets, apply_simple, crc32
 *   streamscan.c   scan_stream
 *   streammerge.c  stream_merge_plan, stream_merge_write
 *   words.c        Words: atomics, write_record, write_simple, futex
 *   packing.c      msgpack encoding: scalars, rows, plain trees, pack_map,
 *                  pack_pairs
 *   unpack.c       unpack_simple, tuple_hook
 *   typescan.c     types_within, contains_type
 *   lockstate.c    ProcessState
 *   readpath.c     StoreBase, ViewBase
 *   cacheget.c     CacheGet
 *   copytree.c     copy_plain, first_to_export, set_immutable_types
 *   keyhash.c      key_hash_common
 *   tableprobe.c   the shared table's probe: table_get, table_candidates,
 *                  table_changes
 *   tablewalk.c    its entries written and walked: table_fill,
 *                  table_index, table_merge, table_chunk, table_rows
 *   tablecache.c   TableCacheBase
 *   udng.h         the one internal header: every cross-file declaration
 *
 * Memory model: every atomic operation is sequentially consistent (a store
 * publishes everything written before it, a load sees everything published
 * before it); record bytes are plain stores that precede the STATE store.
 *
 * Memory safety: a Words object holds a buffer export of the mapping for its
 * whole life (so the mapping cannot be closed under it) until release(), and
 * every index and offset is bounds-checked.
 */
#include "udng.h"

#if !defined(__GNUC__) && !defined(__clang__)
#error "ultradict_ng._helper._native needs the GCC/Clang __atomic builtins"
#endif

static PyMethodDef native_methods[] = {
    {"contains_type", (PyCFunction)(void (*)(void))udng_native_contains_type, METH_FASTCALL,
     "contains_type(obj, type, max_depth) -> bool: an object of exactly type anywhere inside obj."},
    {"apply_sets", (PyCFunction)(void (*)(void))udng_native_apply_sets, METH_FASTCALL,
     "apply_sets(data, records, start, op_set, key_types) -> index of the first record not applied."},
    {"apply_simple", (PyCFunction)(void (*)(void))udng_native_apply_simple, METH_FASTCALL,
     "apply_simple(data, payloads, start, op_set) -> index of the first payload not applied."},
    {"parse_records", (PyCFunction)(void (*)(void))udng_native_parse_records, METH_FASTCALL,
     "parse_records(chunk, tag, base[, one_msgpack]) -> [payload, ...]; ValueError says what is wrong."},
    {"scan_stream", (PyCFunction)(void (*)(void))udng_native_scan_stream, METH_FASTCALL,
     "scan_stream(buffer, tag) -> (end of the last whole unit, whole units, why the scan stopped)."},
    {"stream_merge_plan", (PyCFunction)(void (*)(void))udng_native_stream_merge_plan, METH_FASTCALL,
     "stream_merge_plan(stream, end, buf, slots, start, tend, op_set, op_del) -> None | (count, bytes, plan)."},
    {"stream_merge_write", (PyCFunction)(void (*)(void))udng_native_stream_merge_write, METH_FASTCALL,
     "stream_merge_write(plan, stream, buf, slots, start, tend, out, at) -> the offset after the entries."},
    {"msgpack_length", (PyCFunction)udng_native_msgpack_length, METH_O,
     "msgpack_length(data) -> length of the one msgpack object data starts with, or -1."},
    {"pack_map", (PyCFunction)(void (*)(void))udng_native_pack_map, METH_FASTCALL,
     "pack_map(obj, threshold) -> the codec's msgpack bytes of a dict of scalar keys and scalar or "
     "scalar-tuple values, or None (declined)."},
    {"pack_pairs", (PyCFunction)(void (*)(void))udng_native_pack_pairs, METH_FASTCALL,
     "pack_pairs(pairs, threshold) -> the codec's msgpack bytes of a list of [key, value] lists "
     "(pack_map's keys and values), or None (declined)."},
    {"types_within", (PyCFunction)(void (*)(void))udng_native_types_within, METH_FASTCALL,
     "types_within(container, types[, levels]) -> bool: every member (dict: keys and values) of an exact "
     "type in types, or within levels more levels a container whose members are."},
    {"first_to_export", (PyCFunction)udng_native_first_to_export, METH_O,
     "first_to_export(pairs) -> index of the first (key, value) whose value is not handed out as it is."},
    {"copy_plain", (PyCFunction)udng_native_copy_plain, METH_O,
     "copy_plain(value) -> the caller's own copy of a plain value (codec.copy_value's), or None."},
    {"set_immutable_types", (PyCFunction)udng_native_set_immutable_types, METH_O,
     "set_immutable_types(frozenset): value types ViewBase returns without copying."},
    {"crc32", (PyCFunction)(void (*)(void))udng_native_crc32, METH_FASTCALL,
     "crc32(data, value=0): the same result as zlib.crc32 (used to test write_record)."},
    {"key_hash_common", (PyCFunction)udng_native_key_hash_common, METH_O,
     "key_hash_common(key) -> _codec.keyhash.key_hash(key) for str, bytes, int, bool, float, None; else None."},
    {"table_get", (PyCFunction)(void (*)(void))udng_native_table_get, METH_FASTCALL,
     "table_get(buf, slots, start, end, key[, offset]) -> value bytes or None (ValueError for damage); "
     "with offset true, the checked entry's offset (0: absent) instead of its value."},
    {"table_candidates", (PyCFunction)(void (*)(void))udng_native_table_candidates, METH_FASTCALL,
     "table_candidates(buf, slots, start, end, h[, offsets]) -> [(key bytes, value bytes), ...] (with offsets: "
     "(offset, key bytes, value bytes)); ValueError (\"table ...\") for damage."},
    {"table_entry", (PyCFunction)(void (*)(void))udng_native_table_entry, METH_FASTCALL,
     "table_entry(buf, slots, start, end, off) -> (hash, key length, value length) of the checked entry; "
     "ValueError (\"table entry ...\") for damage."},
    {"table_fill", (PyCFunction)(void (*)(void))udng_native_table_fill, METH_FASTCALL,
     "table_fill(buf, off, packed_map, hashes) -> offset after the entries written from the map's pairs."},
    {"table_merge", (PyCFunction)(void (*)(void))udng_native_table_merge, METH_FASTCALL,
     "table_merge(dst, off, src, start, end, changes) -> offset after an old table's entries merged with "
     "the (offset, new value or None) changes; a damaged entry raises ValueError (\"table entry ...\")."},
    {"table_changes", (PyCFunction)(void (*)(void))udng_native_table_changes, METH_FASTCALL,
     "table_changes(buf, slots, start, end, dead, changed, hot) -> (changes, rest_dead, rest_changed): "
     "a merge's (offset, new value bytes or None) for the keys the compiled probe and packer decide."},
    {"table_index", (PyCFunction)(void (*)(void))udng_native_table_index, METH_FASTCALL,
     "table_index(buf, slots, start, end, count): write the index of the entries start..end."},
    {"table_chunk", (PyCFunction)(void (*)(void))udng_native_table_chunk, METH_FASTCALL,
     "table_chunk(buf, start, end, off, most) -> (msgpack map of up to most entries from off, next offset)."},
    {"table_rows", (PyCFunction)(void (*)(void))udng_native_table_rows, METH_FASTCALL,
     "table_rows(buf, start, end, off, out, skip=None, subst=None) -> offset where it stopped decoding "
     "rows into out (a dict, or a list of pairs), skip's keys left out, subst's values taken."},
    {"unpack_simple", (PyCFunction)(void (*)(void))udng_native_unpack_simple, METH_FASTCALL,
     "unpack_simple(data, default) -> the scalar or tuple of scalars data encodes, else default."},
    {"tuple_hook", (PyCFunction)(void (*)(void))udng_native_tuple_hook, METH_FASTCALL,
     "tuple_hook(fallback, code, data) -> a tuple of scalars for ext 1, else fallback(code, data)."},
    {NULL, NULL, 0, NULL},
};

/* Multi-phase initialisation (PEP 489): the module object holds its state
 * (udng.h: udng_state), filled by the exec slot and by set_immutable_types;
 * nothing Python gives the helper is kept in a static.  The types are static
 * (their read paths must not look the module up per call), so one
 * interpreter per process imports the helper (3.12+ says so). */
static int
native_traverse(PyObject *m, visitproc visit, void *arg)
{
    udng_state *st = udng_get_state(m);
    Py_VISIT(st->immutable_types);
    return 0;
}

static int
native_clear(PyObject *m)
{
    udng_state *st = udng_get_state(m);
    Py_CLEAR(st->immutable_types);
    return 0;
}

static void
native_free(void *m)
{
    native_clear((PyObject *)m);
}

static int
native_exec(PyObject *m)
{
    udng_crc_init();
    if (udng_lockstate_init() < 0 || udng_readpath_init() < 0)
        return -1;
    udng_get_state(m)->immutable_types = NULL;
    struct { const char *name; PyTypeObject *type; } types[] = {
        {"Words", &udng_WordsType}, {"ProcessState", &udng_ProcessStateType},
        {"StoreBase", &udng_StoreBaseType}, {"ViewBase", &udng_ViewBaseType},
        {"CacheGet", &udng_CacheGetType},
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (PyType_Ready(types[i].type) < 0)
            return -1;
    if (udng_tablecache_add(m) < 0)  /* (tablecache.c) */
        return -1;
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        Py_INCREF(types[i].type);
        if (PyModule_AddObject(m, types[i].name, (PyObject *)types[i].type) < 0) {
            Py_DECREF(types[i].type);
            return -1;
        }
    }
    /* Constants mirrored from _codec/records.py / layout.py (a test compares). */
    PyObject *scalars = PyTuple_Pack(6, (PyObject *)Py_TYPE(Py_None), (PyObject *)&PyBool_Type,
                                     (PyObject *)&PyLong_Type, (PyObject *)&PyFloat_Type,
                                     (PyObject *)&PyUnicode_Type, (PyObject *)&PyBytes_Type);
    if (scalars == NULL || PyModule_AddObject(m, "SCALAR_TYPES", scalars) < 0) {
        Py_XDECREF(scalars);
        return -1;
    }
    if (PyModule_AddIntConstant(m, "RECORD_HEADER", UDNG_RECORD_HEADER) < 0 ||
        PyModule_AddIntConstant(m, "FUTEX", UDNG_FUTEX) < 0)
        return -1;
    /* The layouts' numbers this helper is compiled with (udng.h), for the
     * test that compares them with the layout modules and the twins. */
    PyObject *layout = Py_BuildValue(
        "{s:i,s:i,s:i,s:i,s:i,s:i}", "RECORD_HEADER", UDNG_RECORD_HEADER, "TABLE_HEADER", UDNG_TABLE_HEADER,
        "TABLE_ENTRY_HEADER", UDNG_TABLE_ENTRY_HEADER, "TABLE_OFFSET_BITS", UDNG_TABLE_OFFSET_BITS,
        "COPY_DEPTH", UDNG_COPY_DEPTH, "PLAIN_DEPTH", UDNG_PLAIN_DEPTH);
    if (layout == NULL || PyModule_AddObject(m, "LAYOUT_CONSTANTS", layout) < 0) {
        Py_XDECREF(layout);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot native_slots[] = {
    {Py_mod_exec, native_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ultradict_ng._helper._native",
    .m_doc = "The optional compiled helper (see speedups.py and _native.pyi).",
    .m_size = sizeof(udng_state),
    .m_methods = native_methods,
    .m_slots = native_slots,
    .m_traverse = native_traverse,
    .m_clear = native_clear,
    .m_free = native_free,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModuleDef_Init(&native_module);
}
