"""The codec (internal): how values become bytes and back -- no I/O.

``codec`` holds the serializers (msgpack, pickle, custom) and copying of
values; ``ext`` the msgpack ext type table, ``encode``/``decode`` the msgpack
paths; ``records`` the update stream's record format, shared by both engines;
``safe_pickle`` the reader that runs no code; ``arrays`` the optional
numpy/torch glue.
"""
