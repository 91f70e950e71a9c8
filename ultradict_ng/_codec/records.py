"""The stream record: what one mutation is, defined once.

A record is the list ``[op, path, *args]`` (op codes in :mod:`layout`,
``OP_*``); ``path`` is the list of keys from the root to the nested dict the
mutation applies to (``[]`` for the root):

=============  ======================================  =========================
op             record                                  effect on the dict at path
=============  ======================================  =========================
``OP_SET``     ``[OP_SET, path, key, value]``          ``node[key] = value``
``OP_DEL``     ``[OP_DEL, path, key]``                 ``del node[key]``
``OP_CLEAR``   ``[OP_CLEAR, path]``                    ``node.clear()``
``OP_UPDATE``  ``[OP_UPDATE, path, [[k, v], ...]]``    ``node[k] = v`` for each
=============  ======================================  =========================

The serializer encodes the whole list; the stream frames the encoding
(layout: "Stream record").  Who follows this definition:

* the facade builds records with :func:`set_`, :func:`delete`, :func:`clear`
  and :func:`update`;
* the codec's ``encode_record`` encodes them (fast paths: every field of
  :data:`SCALAR_TYPES`; a set of a JSON-like value -- dicts and lists of
  them, or a tuple of such at the top -- by a strict Packer);
* ``Words.write_simple`` (compiled or twin) encodes a root-level set or delete
  of scalars (with ``plain``: of such a JSON-like value too, the writer's
  cache then taking a copy of it) straight into the stream -- the same bytes
  as the codec;
* every process applies decoded records with :func:`apply_all` (runs of
  root-level scalar sets in one ``speedups.apply_sets`` call, the rest with
  :func:`apply`), the writer to its own cache as well as readers.

A new kind of record means a new ``OP_*`` in layout.py (a layout version
bump), a constructor here and a branch in :func:`apply`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._shm import layout as L
from ..speedups import apply_sets

__all__ = [
    "SCALAR_TYPES",
    "Inconsistent",
    "set_",
    "delete",
    "clear",
    "update",
    "apply",
    "apply_all",
]

#: Types whose values the msgpack serializer encodes natively and exactly and
#: decodes to an equal object of the same type: a record made only of them
#: needs neither a type walk before encoding nor a decode by its writer.  They
#: are also the key types for which ``dict[key] = value`` runs no Python code.
#: (``_native.SCALAR_TYPES`` mirrors this set; tests/test_native.py compares.)
SCALAR_TYPES: frozenset[type] = frozenset({type(None), bool, int, float, str, bytes})

_OP_SET, _OP_DEL, _OP_CLEAR, _OP_UPDATE = L.OP_SET, L.OP_DEL, L.OP_CLEAR, L.OP_UPDATE


class Inconsistent(Exception):
    """A validated record does not fit the cache: the reader reloads from the dump."""


def set_(path: Sequence[Any], key: Any, value: Any) -> list[Any]:
    return [_OP_SET, list(path), key, value]


def delete(path: Sequence[Any], key: Any) -> list[Any]:
    return [_OP_DEL, list(path), key]


def clear(path: Sequence[Any]) -> list[Any]:
    return [_OP_CLEAR, list(path)]


def update(path: Sequence[Any], pairs: list[list[Any]]) -> list[Any]:
    return [_OP_UPDATE, list(path), pairs]


def apply(data: dict[Any, Any], rec: Any) -> None:
    """Apply one decoded record to the cache ``data`` (a dict, or a big dict's
    ``TableCache``: the same mapping methods); :class:`Inconsistent` if it is
    malformed or does not fit (a missing key, a path that is not a dict)."""
    try:
        op = rec[0]
        node = data
        for key in rec[1]:
            node = node[key]
            if type(node) is not dict:
                raise Inconsistent(f"record path {rec[1]!r} does not lead to a dict")
        if op == _OP_SET:
            node[rec[2]] = rec[3]
        elif op == _OP_DEL:
            del node[rec[2]]
        elif op == _OP_CLEAR:
            node.clear()
        elif op == _OP_UPDATE:
            if type(rec[2]) is not list:
                raise Inconsistent(f"update record pairs are a {type(rec[2]).__name__}, not a list")
            node.update(rec[2])  # (pairs of [key, value], assigned in order, in C)
        else:
            raise Inconsistent(f"unknown record operation {op!r}")
    except Inconsistent:
        raise
    except Exception as exc:  # malformed record: wrong shapes, missing keys, unhashable keys
        raise Inconsistent(f"record does not apply to the cached dict: {exc!r}") from None


def apply_all(data: dict[Any, Any], records: list[Any]) -> None:
    """Apply decoded records in order: runs of root-level sets of scalar keys
    in one ``apply_sets`` call each, every other record with :func:`apply`.
    On an exception some records may have been applied (the caller reloads).
    A cache that is not a ``dict`` (a reader's ``TableCache``) takes every
    record through :func:`apply` (``apply_sets`` stores into a dict only)."""
    if type(data) is not dict:
        for rec in records:
            apply(data, rec)
        return
    i, n = 0, len(records)
    while i < n:
        i = apply_sets(data, records, i, _OP_SET, SCALAR_TYPES)
        if i < n:
            apply(data, records[i])
            i += 1
