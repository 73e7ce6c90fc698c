"""Token-bucket rate limiter that emulates a link of a given bandwidth (the paper emulates
10-50 Gbps this way). One bucket is shared by every connection of a sender, and it paces every
byte written (headers included).

``consume(n)`` returns once the n bytes would have finished crossing the link: the bucket keeps
a virtual clock ``_t`` (when the link is next free). A write that comes late (the writer was
descheduled) may catch up by at most ``burst_bytes``, so scheduling jitter costs no link time;
``mark_idle()`` (called when the send queue ran empty) forfeits that credit, so a transfer that
starts on an idle link gets no free burst and its timing is honest from the first byte.
"""
from __future__ import annotations

import threading
import time
from typing import Callable


class TokenBucket:
    def __init__(self, gbps: float, burst_bytes: int = 64 << 10, early_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        if not gbps > 0:
            raise ValueError(f"{gbps=} must be > 0")
        if burst_bytes < 1:
            raise ValueError(f"{burst_bytes=} must be >= 1")
        self.bytes_per_s = gbps * 1e9 / 8
        self.burst_s = burst_bytes / self.bytes_per_s
        self.early_s = early_s  # writes may leave this early: fewer, longer sleeps
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._t = float("-inf")

    def reserve(self, nbytes: int) -> float:
        """Book ``nbytes`` on the link; returns the clock time at which they have crossed it."""
        with self._lock:
            now = self._clock()
            self._t = max(self._t, now - self.burst_s) + nbytes / self.bytes_per_s
            return self._t

    def mark_idle(self) -> None:
        """The link had nothing to send: the time since it was last busy earns no credit."""
        with self._lock:
            self._t = max(self._t, self._clock())

    def consume(self, nbytes: int) -> None:
        done = self.reserve(nbytes)
        while True:
            wait = done - self._clock()
            if wait <= self.early_s:
                return
            self._sleep(wait)
