"""The ``torch`` backend: the reference codec (lynx_npu.codec) behind the ops interface.

Runs on every device torch runs on; it is the specification the compiled backends match and
the quiet fallback of automatic backend choice.
"""
from __future__ import annotations

import dataclasses

import torch

from lynx_npu.codec.lynx import LynxCodec

from .dest import Destination, scatter_tokens
from .plan import LayerPlan

NAME = "torch"
CHECKS_VALUES = True  # the reference codec's encode validates its input
WRITES_TILES = True   # decompress writes through scatter_tokens, which takes tiled caches


def supports(cfg, num_kv_heads, head_dim, dtype) -> str | None:
    return None


def _codec(cfg) -> LynxCodec:
    # ops buffers are the kernel layout: scalar previews are the codec's stream format only
    return LynxCodec(**dataclasses.asdict(cfg.kernel))


def compress(k: torch.Tensor, v: torch.Tensor, plan: LayerPlan):
    enc = _codec(plan.config).encode(k, v)
    return enc.anchor, enc.residual


def decompress(anchor: torch.Tensor, residual: torch.Tensor | None, plan: LayerPlan,
               dest: Destination) -> None:
    codec = _codec(plan.config)
    for page in plan.pages:
        s, lay = page.span, page.layout
        a = anchor[page.anchor_offset:page.anchor_offset + lay.anchor_nbytes]
        r = None
        if residual is not None:
            r = residual[page.residual_offset:page.residual_offset + lay.residual_nbytes]
        k, v = codec.decode_page(a, r, s.token_start + plan.token_offset,
                                 s.token_end + plan.token_offset,
                                 num_kv_heads=plan.num_kv_heads, head_dim=plan.head_dim,
                                 dtype=plan.dtype)
        scatter_tokens(dest, s.token_start, k, v, plan.num_kv_heads, plan.head_dim)
