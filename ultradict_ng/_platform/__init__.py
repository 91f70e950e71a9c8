"""The platform layer (internal): what every engine stands on -- named
segments (``segments``, ``names``), the lock (``lock``), process identity and
ownership (``owner``), fork handling (``forks``) and the named fault points
the crash tests arm (``faults``)."""
