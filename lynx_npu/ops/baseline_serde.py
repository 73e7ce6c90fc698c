"""The page serde of the baseline codecs (bf16, int8, int4, kivi4, quantspec, cachegen, ...).

They have no kernels: pages are their reference ``encode_pages`` (on the KV's device, then
copied to the host) and ``decode_page``. The reference paged decode of the tensor codecs
re-encodes a zero template for every page, which would make the baselines look slower than
they are, so the per-token affine codecs (bf16, int8, int4 per token per head) are unpacked
here with a few vectorized torch ops instead: the same values, bit for bit (tested).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from lynx_npu.codec.base import TensorCodec

from .dest import paged, scatter_tokens
from .kv_layouts import ResolvedCache
from .page_serde import EncodedLayer, PageSerde, WirePage, as_bytes, wire_pages
from .paged_cache import read_tokens


def _affine_per_token(codec) -> bool:
    return (codec.name == "bf16" or codec.name in ("int8", "int4")
            and getattr(codec, "axes", None) == {"k": "token", "v": "token"}
            and codec.bits in (4, 8))


def decode_affine(codec, anchor: torch.Tensor, num_kv_heads: int, num_tokens: int,
                  head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 / int8 / int4 (per token per head) page -> k, v: the fields of
    TensorCodec.encode_pages (codes, scale, min per K then V), unpacked directly."""
    h, t, d = num_kv_heads, num_tokens, head_dim
    n = h * t * d
    if codec.name == "bf16":
        if anchor.numel() != 4 * n:
            raise ValueError(f"bf16 page has {anchor.numel()} bytes, expected {4 * n}")
        raw = anchor.view(torch.bfloat16).view(2, h, t, d).to(dtype)
        return raw[0], raw[1]
    bits = codec.bits
    code_bytes, scalar_bytes = (n * bits + 7) // 8, 2 * h * t
    if anchor.numel() != 2 * (code_bytes + 2 * scalar_bytes):
        raise ValueError(f"{codec.name} page has {anchor.numel()} bytes, expected "
                         f"{2 * (code_bytes + 2 * scalar_bytes)}")
    out, off = [], 0
    for _ in "kv":
        packed = anchor[off:off + code_bytes]
        off += code_bytes
        scale = anchor[off:off + scalar_bytes].clone().view(torch.float16)
        off += scalar_bytes
        mn = anchor[off:off + scalar_bytes].clone().view(torch.float16)
        off += scalar_bytes
        if bits == 8:
            codes = packed
        else:  # two values per byte, low nibble first (codec/packing.py)
            codes = torch.stack((packed & 0xF, packed >> 4), dim=1).reshape(-1)[:n]
        x = codes.view(h, t, d).float() * scale.float().view(h, t, 1) + mn.float().view(h, t, 1)
        out.append(x.to(dtype))
    return out[0], out[1]


def _tensor(data) -> torch.Tensor:
    if isinstance(data, torch.Tensor):
        return data
    return torch.frombuffer(bytearray(as_bytes(data)), dtype=torch.uint8)


class BaselineSerde(PageSerde):
    def page_nbytes(self, num_tokens, num_kv_heads, head_dim, dtype):
        if not isinstance(self.codec, TensorCodec):  # entropy-coded: sizes follow the values
            raise ValueError(f"codec {self.name!r} has value-dependent page sizes")
        zeros = torch.zeros(num_kv_heads, num_tokens, head_dim, dtype=dtype)
        return [(p.token_start, p.token_end, p.anchor.numel(),
                 None if p.residual is None else p.residual.numel())
                for p in self.codec.encode_pages(zeros, zeros)]

    def encode(self, k: torch.Tensor, v: torch.Tensor) -> EncodedLayer:
        pages = [type(p)(p.index, p.token_start, p.token_end, p.anchor.cpu(),
                         p.residual.cpu() if p.residual is not None else None)
                 for p in self.codec.encode_pages(k, v)]
        return EncodedLayer(wire_pages(pages), "reference")

    def encode_cache(self, cache: ResolvedCache, slot_mapping: torch.Tensor) -> EncodedLayer:
        return self.encode(*read_tokens(cache, slot_mapping))

    def decode_page(self, anchor, residual, token_start, token_end, *, num_kv_heads, head_dim,
                    dtype):
        a = _tensor(anchor)
        if _affine_per_token(self.codec):
            return decode_affine(self.codec, a, num_kv_heads, token_end - token_start, head_dim,
                                 dtype)
        return self.codec.decode_page(a, None if residual is None else _tensor(residual),
                                      token_start, token_end, num_kv_heads=num_kv_heads,
                                      head_dim=head_dim, dtype=dtype)

    def decode_into(self, pages: Sequence[WirePage], cache: ResolvedCache,
                    slot_mapping: torch.Tensor, wire_dtype: torch.dtype | None = None) -> str:
        if wire_dtype is not None and wire_dtype != cache.dtype:
            return self._decode_cast(pages, cache, slot_mapping, wire_dtype)
        dest = paged(cache, slot_mapping.to(cache.k.tensor.device, torch.int64))
        for p in pages:
            k, v = self.decode_page(p.anchor, p.residual, p.token_start, p.token_end,
                                    num_kv_heads=cache.num_kv_heads, head_dim=cache.head_size,
                                    dtype=cache.dtype)
            scatter_tokens(dest, p.token_start, k.to(dest.device), v.to(dest.device),
                           cache.num_kv_heads, cache.head_size)
        return "reference"
