"""Decode received Lynx pages with lynx_npu.ops (the compiled CPU kernel, Triton on GPU, Ascend
C on NPU) instead of the pure-PyTorch reference codec.

The decode instance dequantizes every page on its critical path, and the reference is written
for clarity, not speed. Every Lynx-family codec (lynx, lynx-int4, lynx-int8) goes through the
same ops call, so the split-stream and one-stream paths stay bit-identical to each other
(``lynx-int8``'s one stream is the anchor followed by the residual). Other codecs are left as
they are. The ops choose their backend by device and fall back to their torch reference.
"""
from __future__ import annotations

import torch

from lynx_npu import ops
from lynx_npu.codec.lynx_layout import page_layout

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
            ns = min(cfg.num_sink_tokens, token_end) if token_start == 0 else 0
            lay = page_layout(cfg, num_kv_heads, head_dim, dtype, token_end - token_start - ns,
                              ns)
            if anchor.numel() != lay.anchor_nbytes + lay.residual_nbytes:
                raise ValueError(f"lynx-int8 page has {anchor.numel()} bytes, expected "
                                 f"{lay.anchor_nbytes + lay.residual_nbytes}")
            anchor, residual = anchor[:lay.anchor_nbytes], anchor[lay.anchor_nbytes:]
        elif self._codec.name == "lynx-int4":
            residual = None
        return ops.decompress_page(anchor, residual, cfg, token_start, token_end,
                                   num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype)


def accelerate(codec):
    return OpsPageDecoder(codec) if getattr(codec, "name", None) in LYNX_FAMILY else codec
