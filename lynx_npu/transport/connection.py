"""Frames over one TCP socket: exact reads, paced writes, and the authentication handshake.

Handshake (both sides send HELLO with a fresh 32-byte nonce, then):
    sender   -> AUTH     HMAC-SHA256(secret, b"lynx-v1 sender"   + receiver_nonce + sender_nonce)
    receiver -> AUTH_OK  HMAC-SHA256(secret, b"lynx-v1 receiver" + sender_nonce + receiver_nonce)
Without a secret both tags are empty. Each side checks the other's tag, so a peer without the
secret can neither send frames nor pose as the receiver; fresh nonces defeat replay. A side
configured with a secret refuses a peer without one.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import threading

from ..wire import (NONCE_BYTES, Frame, Kind, TruncatedFrameError, WireLimits, encode_frame,
                    read_frame)
from .errors import AuthenticationError, RemoteError
from .rate_limit import TokenBucket


class SocketReader:
    """``read_exact`` for read_frame: fills a fresh buffer of exactly n bytes (n is already
    bounded by the decoder's limits when this is called). Reads through a buffered file so a
    small header does not cost a system call of its own."""

    def __init__(self, sock: socket.socket, buffer_bytes: int = 256 << 10):
        self._file = sock.makefile("rb", buffering=buffer_bytes)

    def __call__(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            try:
                r = self._file.readinto(view[got:])
            except ValueError:  # the file was closed under us: close() from another thread
                r = 0
            if not r:
                raise TruncatedFrameError(f"connection closed after {got} of {n} bytes")
            got += r
        return buf

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:
            pass


class FrameSocket:
    """A connected socket plus a write lock; optional pacing through a shared TokenBucket."""

    def __init__(self, sock: socket.socket, limits: WireLimits,
                 limiter: TokenBucket | None = None, chunk_bytes: int = 64 << 10):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.limits = limits
        self.limiter = limiter
        self.chunk_bytes = chunk_bytes
        self._read = SocketReader(sock)
        self._write_lock = threading.Lock()
        self.closed = False

    def read(self) -> Frame:
        return read_frame(self._read, self.limits)

    def write(self, *buffers) -> None:
        """Send the buffers back to back (one frame), paced by the limiter if any. Each paced
        piece of up to ``chunk_bytes`` goes out in one sendmsg (header and payload together)."""
        views = [memoryview(b).cast("B") for b in buffers]
        with self._write_lock:
            while views:
                piece, size = [], 0
                while views and size < self.chunk_bytes:
                    take = views[0][:self.chunk_bytes - size]
                    piece.append(take)
                    size += len(take)
                    views[0] = views[0][len(take):]
                    if not len(views[0]):
                        views.pop(0)
                if self.limiter is not None:
                    self.limiter.consume(size)
                _sendmsg_all(self.sock, piece)

    def send_many(self, frames: list[bytes]) -> None:
        """Unpaced control frames (acknowledgements), several in one system call."""
        with self._write_lock:
            _sendmsg_all(self.sock, [memoryview(f) for f in frames])

    def send(self, frame: Frame) -> None:
        self.write(encode_frame(frame))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._read.close()
        self.sock.close()


def _sendmsg_all(sock: socket.socket, views: list[memoryview]) -> None:
    while views:
        sent = sock.sendmsg(views)
        while sent and views:  # drop what went out; keep the rest of a partly sent view
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def _tag(secret: bytes | None, role: bytes, first: bytes, second: bytes) -> bytes:
    if secret is None:
        return b""
    return hmac.new(secret, b"lynx-v1 " + role + first + second, hashlib.sha256).digest()


def _expect(conn: FrameSocket, kind: Kind) -> Frame:
    frame = conn.read()
    if frame.kind == Kind.ERROR:
        raise RemoteError(f"peer refused the connection: {bytes(frame.payload).decode()}")
    if frame.kind != kind:
        raise AuthenticationError(f"handshake expected {kind.name}, got {frame.kind.name}")
    return frame


def client_handshake(conn: FrameSocket, secret: bytes | None) -> None:
    """Sender side. Raises AuthenticationError (or RemoteError with the receiver's reason)."""
    mine = os.urandom(NONCE_BYTES)
    conn.send(Frame(Kind.HELLO, payload=mine))
    theirs = bytes(_expect(conn, Kind.HELLO).payload)
    conn.send(Frame(Kind.AUTH, payload=_tag(secret, b"sender", theirs, mine)))
    try:
        ok = _expect(conn, Kind.AUTH_OK)
    except RemoteError as e:
        raise AuthenticationError(str(e)) from None
    if not hmac.compare_digest(bytes(ok.payload), _tag(secret, b"receiver", mine, theirs)):
        raise AuthenticationError("the receiver did not prove it knows the shared secret")


def server_handshake(conn: FrameSocket, secret: bytes | None) -> None:
    """Receiver side. On failure tells the peer why, then raises AuthenticationError."""
    theirs = bytes(_expect(conn, Kind.HELLO).payload)
    mine = os.urandom(NONCE_BYTES)
    conn.send(Frame(Kind.HELLO, payload=mine))
    tag = bytes(_expect(conn, Kind.AUTH).payload)
    if not hmac.compare_digest(tag, _tag(secret, b"sender", mine, theirs)):
        reason = ("authentication failed: wrong or missing shared secret" if secret else
                  "authentication failed: the receiver has no shared secret configured")
        conn.send(Frame(Kind.ERROR, payload=reason.encode()))
        raise AuthenticationError(reason)
    conn.send(Frame(Kind.AUTH_OK, payload=_tag(secret, b"receiver", theirs, mine)))
