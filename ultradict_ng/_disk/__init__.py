"""A dict kept in files: the same shared dict, surviving restarts, reboots and
power loss (``SharedDict(path=...)``).  The protocol is in ``layout.py``."""
