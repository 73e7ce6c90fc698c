"""The receiver's connections, in two pools (plain Python, no sockets touched here).

A connection is first *in the handshake*, then *established*. The pools are bounded apart, so
that peers that never finish a handshake cannot take the place of senders that did:

- at most ``max_handshakes`` in the handshake; one more evicts the oldest (the caller closes
  it), so connections that drip their handshake byte by byte cannot lock an honest sender
  out, who needs one round trip; each is also closed at its own deadline by its reader;
- at most ``max_connections`` established; one more is refused (at accept and, should the
  pool have filled meanwhile, when its handshake ends).
"""
from __future__ import annotations

import collections
import threading
from typing import Hashable


class ConnectionSlots:
    def __init__(self, max_connections: int, max_handshakes: int):
        self.max_connections = max_connections
        self.max_handshakes = max_handshakes
        self._lock = threading.Lock()
        self._handshaking: collections.OrderedDict[Hashable, None] = collections.OrderedDict()
        self._established: set[Hashable] = set()

    def admit(self, conn: Hashable) -> tuple[bool, Hashable | None]:
        """A new connection: -> (admitted, the connection it evicted or None). Not admitted
        when every established slot is taken."""
        with self._lock:
            if len(self._established) >= self.max_connections:
                return False, None
            evicted = None
            if len(self._handshaking) >= self.max_handshakes:
                evicted, _ = self._handshaking.popitem(last=False)  # the oldest
            self._handshaking[conn] = None
            return True, evicted

    def establish(self, conn: Hashable) -> bool:
        """The handshake succeeded: -> False if the connection was evicted meanwhile or every
        established slot is taken (the caller refuses it)."""
        with self._lock:
            if conn not in self._handshaking:
                return False
            del self._handshaking[conn]
            if len(self._established) >= self.max_connections:
                return False
            self._established.add(conn)
            return True

    def remove(self, conn: Hashable) -> None:
        with self._lock:
            self._handshaking.pop(conn, None)
            self._established.discard(conn)

    def all(self) -> list:
        with self._lock:
            return [*self._handshaking, *self._established]

    @property
    def num_handshaking(self) -> int:
        with self._lock:
            return len(self._handshaking)

    @property
    def num_established(self) -> int:
        with self._lock:
            return len(self._established)
