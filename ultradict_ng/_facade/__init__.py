"""The facade's internals (internal): what :class:`~ultradict_ng.SharedDict`
is built from -- its views (``views``: keys, values, items), the handle
registry that lets nested views and pickles find their dict (``handle``) and
the checking of its constructor's arguments (``arguments``)."""
