"""Fast decoding of received pages, bit-identical to the reference codecs.

The decode instance dequantizes every page on its critical path, and the reference codecs are
written for clarity, not speed (the baselines' paged decode even re-encodes a zero template per
page). So that every mode is timed with an efficient decoder:

* Lynx-family codecs (lynx, lynx-int4, lynx-int8) go through lynx_npu.ops (the compiled CPU
  kernel, Triton on GPU, Ascend C on NPU), all through the same call, so the split-stream and
  one-stream paths stay bit-identical to each other (``lynx-int8``'s one stream is the anchor
  followed by the residual);
* bf16, int8 and int4 (per token per head) are unpacked here with a few vectorized torch ops.

Other codecs are left as they are. Tests check every decoder against the reference.
"""
from __future__ import annotations

import torch

from lynx_npu import ops
from lynx_npu.codec.lynx_layout import page_layout, page_sinks

LYNX_FAMILY = ("lynx", "lynx-int4", "lynx-int8")


class OpsPageDecoder:
    """Wraps a Lynx-family codec; every attribute but ``decode_page`` is the codec's."""

    def __init__(self, codec):
        self._codec = codec

    def __getattr__(self, name):
        return getattr(self._codec, name)

    def decode_page(self, anchor: torch.Tensor, residual: torch.Tensor | None,
                    token_start: int, token_end: int, *, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype):
        cfg = self._codec.config
        if self._codec.name == "lynx-int8":
            ns = page_sinks(cfg, token_start, token_end)
            lay = page_layout(cfg, num_kv_heads, head_dim, dtype, token_end - token_start - ns,
                              ns)
            if anchor.numel() != lay.anchor_nbytes + lay.residual_nbytes:
                raise ValueError(f"lynx-int8 page has {anchor.numel()} bytes, expected "
                                 f"{lay.anchor_nbytes + lay.residual_nbytes}")
            anchor, residual = anchor[:lay.anchor_nbytes], anchor[lay.anchor_nbytes:]
        elif self._codec.name == "lynx-int4":
            residual = None
        else:  # the split codec's pages may carry scalar previews: to the kernel layout
            anchor, residual, _ = self._codec.kernel_page(
                anchor, residual, token_start, token_end, num_kv_heads=num_kv_heads,
                head_dim=head_dim, dtype=dtype)
        return ops.decompress_page(anchor, residual, cfg, token_start, token_end,
                                   num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype)


class AffinePageDecoder:
    """bf16 / int8 / int4 pages: the fields of TensorCodec.encode_pages, decoded directly."""

    def __init__(self, codec):
        self._codec = codec

    def __getattr__(self, name):
        return getattr(self._codec, name)

    def decode_page(self, anchor: torch.Tensor, residual: torch.Tensor | None,
                    token_start: int, token_end: int, *, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype):
        h, t, d = num_kv_heads, token_end - token_start, head_dim
        n = h * t * d
        if self._codec.name == "bf16":
            if anchor.numel() != 4 * n:
                raise ValueError(f"bf16 page has {anchor.numel()} bytes, expected {4 * n}")
            raw = anchor.view(torch.bfloat16).view(2, h, t, d).to(dtype)
            return raw[0], raw[1]
        bits = self._codec.bits
        code_bytes, scalar_bytes = (n * bits + 7) // 8, 2 * h * t
        if anchor.numel() != 2 * (code_bytes + 2 * scalar_bytes):
            raise ValueError(f"{self._codec.name} page has {anchor.numel()} bytes, expected "
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
            x = codes.view(h, t, d).float() * scale.float().view(h, t, 1) \
                + mn.float().view(h, t, 1)
            out.append(x.to(dtype))
        return out[0], out[1]


def _affine_per_token(codec) -> bool:
    return (getattr(codec, "name", None) in ("int8", "int4")
            and codec.axes == {"k": "token", "v": "token"} and codec.bits in (4, 8))


def accelerate(codec):
    name = getattr(codec, "name", None)
    if name in LYNX_FAMILY:
        return OpsPageDecoder(codec)
    if name == "bf16" or _affine_per_token(codec):
        return AffinePageDecoder(codec)
    return codec
