"""Exceptions a transfer ends with. Every one names the request and what was missing."""
from __future__ import annotations


class TransferError(RuntimeError):
    """A transfer did not complete."""


class TransferDeadlineError(TransferError, TimeoutError):
    """The request's deadline passed before every frame arrived (or was acknowledged)."""


class RemoteError(TransferError):
    """The peer reported that the request (or the connection) failed; the text is its reason."""


class AuthenticationError(TransferError, ConnectionError):
    """The shared-secret handshake failed (wrong or missing secret on one side)."""


class TransportClosed(TransferError):
    """The sender or receiver was closed before the request completed."""
