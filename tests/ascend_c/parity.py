"""Helpers for the kernel-vs-reference parity tests: inputs and a per-chunk view of the streams.

Two kinds of input:
- ``exact_kv``: integer-valued KV whose every page and channel spans exactly [lo, lo + 64 * 2^e].
  Then every normalised value is a multiple of 1/64 and every chunk sum is exact in float32, in
  any addition order, so kernel and reference must agree byte for byte.
- ``random_kv``: Laplace K with outlier channels and an attention-sink-like first token,
  Gaussian V. Chunk sums round, so the float16 mean can differ by one ulp where the kernel's
  addition order differs from PyTorch's (see ascend_c/README.md, "Parity").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lynx_npu.codec.lynx_config import LynxConfig
from lynx_npu.codec.lynx_layout import page_layout, page_spans
from lynx_npu.codec.packing import unpack_bits

from ..ops.parity import random_kv  # noqa: F401  (re-exported for the Ascend C tests)

# K and V chunked by sizes of their own (LynxConfig.chunk_size, v_chunk_size) over the default
# preset: V on the token axis at 64 (the planned default: one chunk per token-head at head_dim
# 64, two at 128) and at 16, and V on the channel axis with a chunk unlike K's.
SPLIT_CHUNKS = [
    {"v_chunk_size": 64},
    {"v_chunk_size": 16},
    {"page_size": 128, "chunk_size": 16, "v_axis": "channel", "v_chunk_size": 64},
]
# head_dim 32 (below a 64 chunk: one chunk of 32), 64 and 128; ragged last pages and chunk tails
SPLIT_SHAPES = [(2, 37, 32), (2, 300, 64), (1, 517, 128)]
# K and V split by anchor bits of their own (LynxConfig.anchor_bits, v_anchor_bits): codes of every
# width from 1 to 7 bits (3, 5, 6, 7 straddle bytes), in K's and in V's streams
SPLIT_BITS = [
    {"anchor_bits": 5, "v_anchor_bits": 4},
    {"anchor_bits": 4, "v_anchor_bits": 5},
    {"anchor_bits": 6, "v_anchor_bits": 3},
    {"anchor_bits": 7, "v_anchor_bits": 2},
]


def exact_kv(cfg: LynxConfig, h: int, t: int, d: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for which in range(2):
        q = torch.randint(0, 65, (h, t, d), generator=g).float()
        for s in page_spans(cfg, t):            # each page and channel spans [0, 64]
            if s.num_tokens >= 2:
                q[:, s.body_start] = 0.0
                q[:, s.body_start + 1] = 64.0
        e = float(2 ** (which - 1))             # K on a grid of 0.5, V of 1
        out.append(((q - 32.0) * e).to(dtype))
    return out[0], out[1]


def edge_kv(cfg: LynxConfig, h: int, t: int, d: int, dtype: torch.dtype, *, exact: bool, seed: int = 0):
    """KV with, in every page, the chunks where the chunk scalars are extreme (the byte scalar
    grid's edge cases: lynx_tables.mu_on_grid / sigma_index), over ``exact_kv``'s pages whose
    every channel spans [0, 64] (tokens body_start and body_start + 1):

    - channel 0 constant over the layer: a constant page channel (xn = 0: mu = sigma = 0);
    - channels [w, 2w) (w: the tensor's token-axis chunk width, min(C, D)) copies of channel w:
      per token, a constant token-axis chunk at that channel's xn (mostly off the byte grid);
    - channels 1 and 3 constant over the page's second chunk of C tokens: constant channel-axis
      chunks inside a varying channel, off the byte grid (1) and at the channel's max (3: xn = 1,
      mu clamped to 255 / 256);
    - the page's first chunk of C tokens holds each channel's min and max: channel-axis chunks
      spanning their page channel's whole range (midrange mu = 0.5, sigma 0.5; mean: sigma up to
      the top level, or clamped to it); token body_start + 2 alternates min / max over the
      channels: token-axis chunks spanning the whole range; token body_start (all 0) and
      body_start + 1 (all 64): constant token-axis chunks at xn = 0 and xn = 1 (mu clamped to
      255 / 256);
    - channel 2 at its max over the rest of that first chunk: the mean close to 1, sigma clamped
      to the top level (need > every level).

    ``exact``: integer values (xn multiples of 1/64: chunk sums exact in any order, so either
    centre must give the reference's bytes); else uniform reals (the midrange only).
    """
    g = torch.Generator().manual_seed(seed)
    out = []
    for which in range(2):
        shape = (h, t, d)
        q = torch.randint(0, 65, shape, generator=g).float() if exact else torch.rand(shape, generator=g) * 64
        c = cfg.chunk("kv"[which])
        w = min(c, d)
        for s in page_spans(cfg, t):
            b, n = s.body_start, s.num_tokens
            if n >= 2:
                q[:, b] = 0.0
                q[:, b + 1] = 64.0
            if n >= 3:
                q[:, b + 2, 0::2] = 0.0
                q[:, b + 2, 1::2] = 64.0
            if n > c:
                q[:, b + c:b + min(2 * c, n), 1] = 23.0 if exact else 23.3
                q[:, b + c:b + min(2 * c, n), 3] = 64.0
            if n >= 3:
                q[:, b + 2:b + min(c, n), 2] = 64.0
        if d >= 2 * w:
            q[:, :, w:2 * w] = q[:, :, w:w + 1]
        q[:, :, 0] = 17.0
        e = float(2 ** (which - 1))
        out.append(((q - 32.0) * e).to(dtype))
    return out[0], out[1]


@dataclass
class PageView:
    """One page of one of K / V: its sections' bytes, per-value codes and per-value chunk ids."""

    gamma: torch.Tensor       # raw bytes
    sink: torch.Tensor        # raw bytes (empty without sinks)
    mu: torch.Tensor          # float16 [chunks]
    sigma: torch.Tensor       # float16 [chunks]
    anchor: torch.Tensor      # int64 [H * Tp * D] signed codes
    residual: torch.Tensor    # int64 [H * Tp * D] signed codes
    chunk_of: torch.Tensor    # int64 [H * Tp * D]: index into mu / sigma


def _chunk_ids(axis: str, h: int, tp: int, d: int, c: int) -> torch.Tensor:
    hh, tt, dd = torch.meshgrid(torch.arange(h), torch.arange(tp), torch.arange(d), indexing="ij")
    if axis == "channel":
        ids = (hh * -(-tp // c) + tt // c) * d + dd
    else:
        ids = (hh * tp + tt) * -(-d // c) + dd // c
    return ids.reshape(-1)


def page_views(cfg: LynxConfig, anchor: torch.Tensor, residual: torch.Tensor, shape, dtype):
    """Splits a layer's streams into [(page_span, {"k": PageView, "v": PageView})]."""
    h, t, d = shape
    out, a0, r0 = [], 0, 0
    for s in page_spans(cfg, t):
        lay = page_layout(cfg, h, d, dtype, s.num_tokens, s.num_sink)

        def sec(buf, base, name):
            x = lay.section(name)
            return buf[base + x.offset: base + x.offset + x.nbytes]

        views = {}
        n = h * s.num_tokens * d
        for w in "kv":
            stats = sec(anchor, a0, f"{w}_stats").contiguous().view(torch.float16).view(2, -1)
            views[w] = PageView(
                gamma=sec(anchor, a0, f"{w}_gamma"),
                sink=sec(anchor, a0, f"{w}_sink") if s.num_sink else anchor[:0],
                mu=stats[0], sigma=stats[1],
                anchor=unpack_bits(sec(anchor, a0, f"{w}_codes"), cfg.bits(w), n, signed=True),
                residual=unpack_bits(sec(residual, r0, f"{w}_res"), cfg.residual_bits(w), n, signed=True),
                chunk_of=_chunk_ids(cfg.axis(w), h, s.num_tokens, d, cfg.chunk(w)))
        out.append((s, views))
        a0 += lay.anchor_nbytes
        r0 += lay.residual_nbytes
    return out


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float16 distance in units in the last place (both non-negative here)."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()
