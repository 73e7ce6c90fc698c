"""Upper bounds the frame decoder enforces before it allocates anything a peer asked for, and
the receiver's bounds as it announces them to a sender (``ReceiveLimits``, in its HELLO)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields


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


def max_data_payload(token_count: int, num_kv_heads: int, head_dim: int) -> int:
    """Largest payload a page may declare: K and V in float32 plus 64 KiB of scalars. Any
    codec's page is smaller (bf16 passthrough is half of it), so a peer cannot make a short
    page allocate a large buffer."""
    return 2 * token_count * num_kv_heads * head_dim * 4 + (64 << 10)


def request_kv_bytes(num_layers: int, num_tokens: int, num_kv_heads: int, head_dim: int,
                     itemsize: int) -> int:
    """Destination KV of a request: K and V of every layer in the KV dtype."""
    return 2 * num_layers * num_tokens * num_kv_heads * head_dim * itemsize


@dataclass(frozen=True)
class ReceiveLimits:
    """What a receiver accepts, announced in its HELLO (frame format 3) so that a sender
    refuses a request it would refuse, before sending a byte of it. The same checks run on
    the receiver (frame.read_frame, transport/receive_state.py), with the same names."""

    max_request_bytes: int   # destination KV of one request (request_kv_bytes)
    max_payload_bytes: int
    max_params_bytes: int
    max_layers: int
    max_tokens: int
    max_kv_heads: int
    max_head_dim: int

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if type(value) is not int or not 1 <= value < 2**63:
                raise ValueError(f"{f.name}={value!r} must be a positive int")

    @classmethod
    def of(cls, limits: WireLimits, max_request_bytes: int) -> "ReceiveLimits":
        return cls(max_request_bytes, **{f.name: getattr(limits, f.name) for f in fields(cls)
                                         if f.name != "max_request_bytes"})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj) -> "ReceiveLimits":
        """Exactly these keys, each a positive int; ValueError names what is wrong."""
        names = {f.name for f in fields(cls)}
        if not isinstance(obj, dict) or set(obj) != names:
            got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise ValueError(f"limits must be an object with exactly {sorted(names)}, got {got}")
        return cls(**obj)

    def request_refusal(self, num_layers: int, num_tokens: int, num_kv_heads: int,
                        head_dim: int, itemsize: int, params_len: int) -> str | None:
        """Why the receiver would refuse a request of this shape, or None."""
        for name, value, bound in (("num_layers", num_layers, "max_layers"),
                                   ("num_tokens", num_tokens, "max_tokens"),
                                   ("num_kv_heads", num_kv_heads, "max_kv_heads"),
                                   ("head_dim", head_dim, "max_head_dim")):
            if value > getattr(self, bound):
                return f"{name}={value} exceeds the receiver's {bound}={getattr(self, bound)}"
        if params_len > self.max_params_bytes:
            return (f"codec parameters of {params_len} bytes exceed the receiver's "
                    f"max_params_bytes={self.max_params_bytes}")
        kv_bytes = request_kv_bytes(num_layers, num_tokens, num_kv_heads, head_dim, itemsize)
        if kv_bytes > self.max_request_bytes:
            return (f"request KV of {kv_bytes} bytes exceeds the receiver's "
                    f"max_request_bytes={self.max_request_bytes}")
        return None

    def page_refusal(self, token_count: int, num_kv_heads: int, head_dim: int,
                     payload_len: int) -> str | None:
        """Why the receiver would refuse a page payload of this size, or None."""
        cap = min(self.max_payload_bytes, max_data_payload(token_count, num_kv_heads, head_dim))
        if payload_len > cap:
            return (f"a page payload of {payload_len} bytes exceeds the receiver's bound of "
                    f"{cap} (max_payload_bytes={self.max_payload_bytes})")
        return None
