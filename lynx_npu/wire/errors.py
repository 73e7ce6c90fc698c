"""Errors the frame decoder raises. Every malformed input maps to one WireError subclass.

WireError is a ValueError, so code that treats bad input generically still catches it; the
subclasses let the transport tell a corrupt payload (NACK and re-request) from a corrupt or
unsupported header (drop the connection, which cannot be resynchronised).
"""
from __future__ import annotations


class WireError(ValueError):
    """A frame could not be decoded."""


class FrameFieldError(WireError):
    """A header field holds a value this decoder rejects; ``field`` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"frame field {field!r}: {message}")
        self.field = field
        self.header = None   # the frame's (CRC-verified) header, when the field check ran
        self.payload_len = 0  # after it: the payload the peer will still send


class UnsupportedVersionError(FrameFieldError):
    """The frame's format version is not one this decoder reads."""


class UnknownCodecError(FrameFieldError):
    """The frame names a codec id that is not in the registry's CODEC_IDS."""


class TruncatedFrameError(WireError):
    """The input ended before the frame did."""


class ChecksumError(WireError):
    """A CRC32C did not match; ``where`` is "header" or "payload"."""

    def __init__(self, where: str, expected: int, actual: int, header=None):
        super().__init__(f"{where} CRC32C mismatch: frame says {expected:#010x}, "
                         f"data gives {actual:#010x}")
        self.where = where
        self.header = header  # the (verified) header when only the payload is corrupt
