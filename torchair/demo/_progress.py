"""A one-line progress bar on stderr for the demo (plain lines when stderr is not a terminal)."""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Iterator, TextIO


class Bar:
    """``[#####-----] 12/40 label``, redrawn in place on a terminal; elsewhere (a log, a pipe)
    only milestones are printed, one line each, so logs stay short."""

    WIDTH = 30

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and bool(getattr(self.stream, "isatty", lambda: False)())
        self._lock = threading.Lock()

    def update(self, done: int, label: str, milestone: bool = False) -> None:
        with self._lock:
            self.done = done
            if not self.enabled:
                return
            if self.tty:
                filled = self.WIDTH * min(done, self.total) // self.total
                bar = "#" * filled + "-" * (self.WIDTH - filled)
                self.stream.write(f"\r\033[K[{bar}] {done}/{self.total} {label}")
                self.stream.flush()
            elif milestone:
                self.stream.write(f"  {label}\n")
                self.stream.flush()

    @contextlib.contextmanager
    def waiting(self, label: str) -> Iterator[None]:
        """Show ``label`` with the seconds spent so far, refreshed while the block runs."""
        start = time.perf_counter()
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(0.5):
                if self.tty:
                    self.update(self.done, f"{label} ({time.perf_counter() - start:.0f} s)")

        self.update(self.done, label, milestone=True)
        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
