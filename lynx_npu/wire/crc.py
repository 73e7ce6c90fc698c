"""CRC32C (Castagnoli), the checksum of every frame.

Uses the ``crc32c`` package (SSE4.2 / ARMv8 hardware CRC, ~10 GB/s, reads any buffer without
a copy); falls back to ``google-crc32c`` (needs a bytes copy). A pure-Python CRC would run at
~10 MB/s, far below a 1 Gbps link, so neither being installed is an error, not a slow path.
"""
from __future__ import annotations

try:
    from crc32c import crc32c as _crc32c

    def crc32c(data, value: int = 0) -> int:
        """CRC32C of ``data`` (any bytes-like), continuing from ``value``."""
        return _crc32c(data, value)

except ImportError:  # pragma: no cover - depends on the environment
    try:
        import google_crc32c as _google

        def crc32c(data, value: int = 0) -> int:
            """CRC32C of ``data`` (any bytes-like), continuing from ``value``."""
            return _google.extend(value, bytes(data))

    except ImportError:
        raise ImportError(
            "lynx_npu.wire needs a CRC32C implementation: pip install crc32c") from None
