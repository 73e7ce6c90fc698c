"""Frames over one TCP socket: exact reads, paced writes, and the handshake.

Reads allocate as bytes arrive, never what a header announces (a peer's 58-byte header
claiming 64 MiB costs 64 KiB until the bytes come), and run under a deadline or a timeout
the owner sets: the whole handshake must finish by its deadline (``FrameSocket.deadline``),
and after it every read gives up once the peer has been silent for the socket's timeout.

Handshake. Both sides send HELLO: a fresh 32-byte nonce, then their compatibility description
(lynx_npu.wire.compat: the payload format, and the codecs with every parameter that the sender
will send / the receiver accepts). With T = SHA-256(sender's description) + SHA-256(receiver's):
    sender   -> AUTH     HMAC-SHA256(secret, b"lynx-v3 sender"   + receiver_nonce + sender_nonce + T)
    receiver -> AUTH_OK  HMAC-SHA256(secret, b"lynx-v3 receiver" + sender_nonce + receiver_nonce + T)
         or  -> ERROR    ref_kind AUTH (a wrong tag) or HELLO (an incompatible sender): the reason
Without a secret both tags are empty. Each side checks the other's tag, so a peer without the
secret can neither send frames nor pose as the receiver; fresh nonces defeat replay; T binds
both descriptions to the tags, so neither can be altered in flight. A side configured with a
secret refuses a peer without one. The receiver judges compatibility (Compat.refusal) only
after the tag checks out; the sender raises IncompatiblePeerError with the receiver's reason,
which names both sides' values. Each side returns the other's description: the receiver binds
requests to the sender's session, the sender checks requests against the receiver's limits.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import hmac
import logging
import os
import secrets
import socket
import sys
import termios
import threading
import time

import numpy as np

from ..wire import (NONCE_BYTES, Compat, Frame, Kind, TruncatedFrameError,
                    UnsupportedVersionError, WireLimits, encode_frame, read_frame)
from .errors import AuthenticationError, IncompatiblePeerError, RemoteError
from .rate_limit import TokenBucket

log = logging.getLogger(__name__)


_FIRST_CHUNK = 64 << 10  # a read's first allocation; it then at most doubles what arrived


def _unfilled(size: int) -> memoryview:
    """``size`` writable bytes, not zeroed: the reader fills them before anything reads them
    (and drops them if the peer does not). Zero-filling each ~1 MiB payload took 12% of the
    H100 host's reader threads (py-spy, docs/benchmarks.md 2026-11-26 third session)."""
    return memoryview(np.empty(size, dtype=np.uint8))


class SocketReader:
    """``read_exact`` for read_frame: returns a fresh buffer of exactly n bytes (past 64 KiB a
    memoryview of unzeroed memory, every byte of it read from the peer), grown as the
    bytes arrive (at most twice what arrived, read or waiting in the kernel, and at least 64
    KiB), so a header that announces a large payload allocates nothing until
    the payload comes, and a payload already in the kernel's buffer is allocated once (growing
    by doubling copied each frame ~1.5 times over on loopback). Reads through a buffered file
    so a small header does not cost a system call of its own. With ``deadline`` set
    (time.monotonic()), every read must finish by then, however slowly the bytes drip."""

    def __init__(self, sock: socket.socket, buffer_bytes: int = 64 << 10):
        self._sock = sock
        self._file = sock.makefile("rb", buffering=buffer_bytes)
        self._buffer_bytes = buffer_bytes
        self.deadline: float | None = None
        self.pending_bytes = 0  # allocated for the frame part being read now

    def _queued(self) -> int:
        """Bytes that arrived and wait in the kernel (0 where the platform cannot say)."""
        try:
            return int.from_bytes(fcntl.ioctl(self._sock.fileno(), termios.FIONREAD,
                                              b"\0\0\0\0"), sys.byteorder)
        except (OSError, ValueError):
            return 0

    def _size(self, n: int, got: int) -> int:
        """Bytes to hold now: at most twice what arrived (read, or waiting in the kernel),
        counting up to one file buffer of bytes the header's read may have pulled in."""
        arrived = got + self._queued()
        return min(n, max(_FIRST_CHUNK, 2 * got, arrived + min(self._buffer_bytes, arrived)))

    def __call__(self, n: int) -> bytearray | memoryview:
        buf, got = (bytearray(n) if n <= _FIRST_CHUNK else _unfilled(self._size(n, 0))), 0
        try:
            while got < n:
                if got == len(buf):  # full: grow by what arrived, never to what was announced
                    grown = _unfilled(self._size(n, got))
                    grown[:got] = buf
                    buf = grown
                self.pending_bytes = len(buf)
                with memoryview(buf) as view:
                    r = self._read_into(view[got:])
                if not r:
                    raise TruncatedFrameError(f"connection closed after {got} of {n} bytes")
                got += r
        finally:
            self.pending_bytes = 0
        return buf

    def skip(self, n: int) -> None:
        """Read and drop ``n`` bytes (a refused frame's payload) in bounded pieces."""
        piece = bytearray(min(n, _FIRST_CHUNK))
        with memoryview(piece) as view:
            while n:
                r = self._read_into(view[:min(n, len(piece))])
                if not r:
                    raise TruncatedFrameError(f"connection closed with {n} bytes to skip")
                n -= r

    def _read_into(self, view: memoryview) -> int:
        try:
            if self.deadline is None:
                return self._file.readinto(view)
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("the read deadline passed")
            self._sock.settimeout(left)
            return self._file.readinto1(view)  # one recv: a drip cannot stretch the deadline
        except ValueError:  # the file was closed under us: close() from another thread
            return 0

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

    def skip(self, n: int) -> None:
        self._read.skip(n)

    @property
    def pending_bytes(self) -> int:
        """Bytes allocated for a frame still arriving (bounded by what arrived)."""
        return self._read.pending_bytes

    @contextlib.contextmanager
    def deadline(self, seconds: float):
        """Reads and writes inside must all finish within ``seconds`` in total."""
        self._read.deadline = time.monotonic() + seconds
        self.sock.settimeout(seconds)  # a write waits no longer than the whole budget
        try:
            yield self
        finally:
            self._read.deadline = None

    def write(self, *buffers) -> None:
        """Send the buffers back to back (one frame), paced by the limiter if any. Each paced
        piece of up to ``chunk_bytes`` goes out in one sendmsg (header and payload together);
        an unpaced frame goes out whole: on loopback, cutting a 315 KB frame into 256 KiB
        pieces halved the link (raw sockets, 2-core box: 18-21 against 36-42 Gbit/s)."""
        views = [memoryview(b).cast("B") for b in buffers]
        with self._write_lock:
            if self.limiter is None:
                _sendmsg_all(self.sock, views)
                return
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


def _tag(secret: bytes | None, role: bytes, first: bytes, second: bytes,
         transcript: bytes) -> bytes:
    if secret is None:
        return b""
    return hmac.new(secret, b"lynx-v3 " + role + first + second + transcript,
                    hashlib.sha256).digest()


def _transcript(sender_description: bytes, receiver_description: bytes) -> bytes:
    return (hashlib.sha256(sender_description).digest()
            + hashlib.sha256(receiver_description).digest())


def _hello(read) -> tuple[bytes, bytes]:
    """The peer's HELLO: (nonce, compatibility description)."""
    payload = bytes(_expect(read, Kind.HELLO).payload)
    return payload[:NONCE_BYTES], payload[NONCE_BYTES:]


def _expect(read, kind: Kind) -> Frame:
    frame = read()
    if frame.kind == Kind.ERROR:
        raise RemoteError(f"peer refused the connection: {bytes(frame.payload).decode()}")
    if frame.kind != kind:
        raise AuthenticationError(f"handshake expected {kind.name}, got {frame.kind.name}")
    return frame


def _read_peer(conn: FrameSocket) -> Frame:
    try:
        return conn.read()
    except UnsupportedVersionError as e:  # another frame format: retrying cannot help
        raise IncompatiblePeerError(f"the peer speaks another frame format: {e}") from None


def new_session() -> str:
    """A sender's session id: 128 random bits, shared by all its connections."""
    return secrets.token_hex(16)


def client_handshake(conn: FrameSocket, secret: bytes | None,
                     compat: Compat = Compat()) -> Compat:
    """Sender side, announcing ``compat`` (the codecs it will send, its session: a fresh one
    if it names none). Returns the receiver's description (its limits). Raises
    IncompatiblePeerError or AuthenticationError with the receiver's reason."""
    if not compat.session:
        compat = dataclasses.replace(compat, session=new_session())
    mine, description = os.urandom(NONCE_BYTES), compat.to_json()
    conn.send(Frame(Kind.HELLO, payload=mine + description))
    theirs, their_description = _hello(lambda: _read_peer(conn))
    transcript = _transcript(description, their_description)
    conn.send(Frame(Kind.AUTH, payload=_tag(secret, b"sender", theirs, mine, transcript)))
    reply = _read_peer(conn)
    if reply.kind == Kind.ERROR:
        reason = bytes(reply.payload).decode()
        if reply.ref_kind == Kind.HELLO:
            raise IncompatiblePeerError(f"the receiver refused this sender: {reason}")
        raise AuthenticationError(f"peer refused the connection: {reason}")
    if reply.kind != Kind.AUTH_OK:
        raise AuthenticationError(f"handshake expected AUTH_OK, got {reply.kind.name}")
    if not hmac.compare_digest(bytes(reply.payload),
                               _tag(secret, b"receiver", mine, theirs, transcript)):
        raise AuthenticationError("the receiver did not prove it knows the shared secret")
    try:
        return Compat.from_json(their_description)
    except ValueError as e:  # authenticated but malformed: a broken receiver, not a refusal
        raise IncompatiblePeerError(f"the receiver's description is malformed: {e}") from None


def server_handshake(conn: FrameSocket, secret: bytes | None,
                     compat: Compat = Compat()) -> Compat:
    """Receiver side, accepting what ``compat`` declares (nothing declared: any codec it can
    build). Returns the sender's description (its session). On failure tells the peer why,
    then raises AuthenticationError or IncompatiblePeerError."""
    theirs, their_description = _hello(conn.read)  # another version: _serve refuses it
    mine, description = os.urandom(NONCE_BYTES), compat.to_json()
    conn.send(Frame(Kind.HELLO, payload=mine + description))
    transcript = _transcript(their_description, description)
    tag = bytes(_expect(conn.read, Kind.AUTH).payload)
    if not hmac.compare_digest(tag, _tag(secret, b"sender", mine, theirs, transcript)):
        reason = ("authentication failed: wrong or missing shared secret" if secret else
                  "authentication failed: the receiver has no shared secret configured")
        _refuse(conn, Kind.AUTH, reason)
        raise AuthenticationError(reason)
    try:
        sender = Compat.from_json(their_description)
        reason = compat.refusal(sender) or (
            None if sender.session else "the sender names no session (frame format 3 "
                                        "requires one: its requests are bound to it)")
    except ValueError as e:
        reason = str(e)
    if reason is not None:
        log.warning("refusing an incompatible sender: %s", reason)
        _refuse(conn, Kind.HELLO, reason)
        raise IncompatiblePeerError(reason)
    conn.send(Frame(Kind.AUTH_OK, payload=_tag(secret, b"receiver", theirs, mine, transcript)))
    return sender


def _refuse(conn: FrameSocket, refused: Kind, reason: str) -> None:
    text = reason.encode("utf-8")[:conn.limits.max_error_bytes].decode("utf-8", "ignore")
    conn.send(Frame(Kind.ERROR, ref_kind=refused, payload=text.encode("utf-8")))
