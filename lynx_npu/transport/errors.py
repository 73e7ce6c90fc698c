"""Exceptions a transfer ends with. Every one names the request and what was missing."""
from __future__ import annotations


class TransferError(RuntimeError):
    """A transfer did not complete."""


class TransferDeadlineError(TransferError, TimeoutError):
    """The request's deadline passed before every frame arrived (or was acknowledged)."""


class RemoteError(TransferError):
    """The peer reported that the request (or the connection) failed; the text is its reason."""


class HandshakeError(TransferError, ConnectionError):
    """The peers met but did not agree to talk; retrying cannot help, so a sender fails its
    requests at once instead of reconnecting until their deadline."""


class AuthenticationError(HandshakeError):
    """The shared-secret handshake failed (wrong or missing secret on one side)."""


class IncompatiblePeerError(HandshakeError):
    """The receiver refused the sender's payload format or codec parameters; the message
    names both sides' values (lynx_npu.wire.compat)."""


class TransportClosed(TransferError):
    """The sender or receiver was closed before the request completed."""
