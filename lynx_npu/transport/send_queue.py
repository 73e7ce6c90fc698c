"""The sender's queues with strict priority: any pending anchor frame, of any request, is popped
before any residual frame, and an abort (ERROR: a request the sender failed) before both. FIFO
within a stream. A key is queued at most once (a frame re-requested twice, by a NACK and a
retransmit timer, is sent once)."""
from __future__ import annotations

import collections
import threading
from typing import Hashable

from ..wire import Kind


class SendQueue:
    def __init__(self):
        self._streams = {Kind.ERROR: collections.deque(), Kind.ANCHOR: collections.deque(),
                         Kind.RESIDUAL: collections.deque()}
        self._keys: set[Hashable] = set()
        self._cond = threading.Condition()
        self._paused = False
        self._closed = False

    def push(self, kind: Kind, key: Hashable, item) -> bool:
        with self._cond:
            if key in self._keys or self._closed:
                return False
            self._keys.add(key)
            self._streams[Kind(kind)].append((key, item))
            self._cond.notify_all()  # writers popping and idle links waiting to reconnect
            return True

    def pop(self, timeout: float | None = None):
        """The next item (anchors first), or None after ``timeout`` or once closed."""
        with self._cond:
            ready = lambda: self._closed or (not self._paused and bool(self._keys))  # noqa: E731
            if not self._cond.wait_for(ready, timeout) or self._closed:
                return None
            stream = next(s for s in self._streams.values() if s)  # in priority order
            key, item = stream.popleft()
            self._keys.discard(key)
            return item

    def wait_for_frames(self, timeout: float) -> bool:
        """True once any item is queued (paused or not); False after ``timeout`` or closed."""
        with self._cond:
            return self._cond.wait_for(lambda: self._closed or bool(self._keys), timeout) \
                and not self._closed

    def pause(self) -> None:
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._keys)
