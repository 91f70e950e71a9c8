"""The command line's progress bar: entries done / total and entries per
second on stderr, for the commands that move many entries (``dump``, ``load``)."""

from __future__ import annotations

import os
import sys
import time
from typing import Optional

__all__ = ["Progress"]


class Progress:
    """entries done / total and entries per second on stderr, redrawn at most
    ten times a second and erased at the end -- only on a terminal (a log file
    full of carriage returns helps nobody), never with ``--quiet``."""

    def __init__(self, label: str, total: Optional[int], quiet: bool) -> None:
        self.label, self.total = label, total
        self.enabled = not quiet and sys.stderr.isatty()
        self.start = self.next = time.monotonic()
        self.shown = False

    def tick(self, done: int, fraction: Optional[float] = None) -> None:
        """``fraction``: how far along when the total is unknown (bytes read / size)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + 0.1
        if self.total:
            fraction = min(done / self.total, 1.0)
        counts = f"{done:,}/{self.total:,} entries" if self.total is not None else f"{done:,} entries"
        text = f"{counts}  {done / max(now - self.start, 1e-6):,.0f}/s"
        try:
            cols = os.get_terminal_size(sys.stderr.fileno()).columns or 80  # (0: a pty never sized)
        except OSError:
            cols = 80
        line = f"{self.label} {text}"
        if fraction is not None:
            width = max(10, min(40, cols - len(line) - 10))
            filled = int(width * fraction)
            line = f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {100 * fraction:3.0f}%  {text}"
        sys.stderr.write("\r" + line[: max(cols - 1, 1)] + "\x1b[K")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.shown = False
