"""Upper bounds the frame decoder enforces before it allocates anything a peer asked for."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WireLimits:
    max_payload_bytes: int = 64 << 20   # one page of one layer; a 256-token fp32 page of
                                        # 128 heads x 128 dims is 32 MiB
    max_params_bytes: int = 1024        # canonical JSON of codec.params()
    max_error_bytes: int = 1024         # UTF-8 text of an ERROR frame
    max_compat_bytes: int = 4096        # a HELLO's compatibility description (wire/compat.py)
    max_layers: int = 4096
    max_tokens: int = 1 << 22           # tokens of one request
    max_kv_heads: int = 1024
    max_head_dim: int = 1024

    def __post_init__(self):
        for name in ("max_payload_bytes", "max_params_bytes", "max_error_bytes",
                     "max_compat_bytes", "max_layers", "max_tokens", "max_kv_heads",
                     "max_head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int")
        # The header's fields are u16/u32: a limit above the field's range would be a lie.
        if self.max_params_bytes > 0xFFFF:
            raise ValueError(f"{self.max_params_bytes=} must be <= 65535 (u16 field)")
        if self.max_layers > 0xFFFF:
            raise ValueError(f"{self.max_layers=} must be <= 65535 (u16 field)")
        for name in ("max_kv_heads", "max_head_dim"):
            if getattr(self, name) > 0xFFFF:
                raise ValueError(f"{name}={getattr(self, name)} must be <= 65535 (u16 field)")
        for name in ("max_payload_bytes", "max_tokens", "max_error_bytes", "max_compat_bytes"):
            if getattr(self, name) > 0xFFFFFFFF:
                raise ValueError(f"{name}={getattr(self, name)} must be < 2**32 (u32 field)")


DEFAULT_LIMITS = WireLimits()
