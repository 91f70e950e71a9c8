"""Writer process for crash tests: ``python -m tests.crash_worker NAME START COUNT``.

Writes ``d["k<i % 5>"] = i`` for i in START..START+COUNT-1 (plus a value larger
than the stream every 4th write, so dumps happen), printing ``ack KEY VALUE``
after each write returns: the parent knows exactly which writes were
acknowledged before the process died (at an armed fault point or by SIGKILL).
"""

from __future__ import annotations

import sys

from ultradict_ng import SharedDict


def main() -> None:
    name, start, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    d = SharedDict(name=name, create=False)
    for i in range(start, start + count):
        key = f"k{i % 5}"
        if i % 4 == 3:
            d["big"] = bytes([i % 256]) * 300
        d[key] = i
        print(f"ack {key} {i}", flush=True)
    d.close()


if __name__ == "__main__":
    main()
