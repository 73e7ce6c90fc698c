"""The reference codec with its chunk sum in the kernels' fixed pairwise order.

lynx_ref.py sums each chunk with ``torch.sum``, whose order depends on the CPU's vector width
(and differs on CUDA), so its float32 sum can differ from any fixed order by an ulp, and the
fp16 mean then rarely by one fp16 ulp. The compiled kernels sum in one documented order:
zero-pad the chunk to a power of two and fold halves, s[i] += s[i + n/2]. ``tree_quantize`` is
``lynx_ref.quantize`` with only that sum replaced, so kernels can be checked byte for byte
(``patched_reference``), and the official reference within a measured rate.
"""
from __future__ import annotations

import contextlib

import torch

from lynx_npu.codec import lynx_ref, lynx_tables
from lynx_npu.codec.lynx_layout import SCALAR_DTYPE


def tree_sum(chunks: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim in the kernels' order."""
    n = chunks.shape[-1]
    p = 1
    while p < n:
        p *= 2
    s = torch.nn.functional.pad(chunks, (0, p - n))
    while s.shape[-1] > 1:
        h = s.shape[-1] // 2
        s = s[..., :h] + s[..., h:]
    return s[..., 0]


def tree_quantize(x: torch.Tensor, cfg, which: str):
    """lynx_ref.quantize with the chunk sum in tree order (everything else identical)."""
    n, h, tp, d = x.shape
    axis = cfg.axis(which)
    xf32 = x.float()
    gmin = xf32.amin(dim=2, keepdim=True)
    gmax = xf32.amax(dim=2, keepdim=True)
    scale = gmax - gmin
    xn = torch.where(scale > 0, (xf32 - gmin) / torch.where(scale > 0, scale, 1.0),
                     torch.zeros_like(xf32))
    chunks, mask = lynx_ref._chunked(xn, axis, cfg.chunk_size)
    count = mask.sum(dim=-1).to(torch.float32)
    mu = (tree_sum(chunks) / count).to(SCALAR_DTYPE)
    xc = chunks - mu.float().unsqueeze(-1)
    sigma = torch.where(mask, xc.abs(), 0.0).amax(dim=-1).to(SCALAR_DTYPE)
    sig32 = sigma.float().unsqueeze(-1)
    xfin = torch.where(sig32 > 0, xc / torch.where(sig32 > 0, sig32, 1.0), torch.zeros_like(xc))
    xfin = lynx_ref._unchunked(xfin, axis, tp if axis == "channel" else d)
    r = cfg.residual_bits
    thr = lynx_tables.thresholds(cfg.alpha(which), cfg.y_max, device=x.device)
    i = torch.searchsorted(thr, xfin.abs().contiguous(), right=True).to(torch.int64)
    m = (i + cfg.bias) >> r
    residual = (m << r) - i
    anchor = torch.where(xfin < 0, -m - 1, m)
    g = torch.stack([gmin.reshape(n, -1), gmax.reshape(n, -1)], dim=1).to(x.dtype)
    stats = torch.stack([lynx_ref._stats_order(mu, axis), lynx_ref._stats_order(sigma, axis)], dim=1)
    return anchor, residual, g, stats


@contextlib.contextmanager
def patched_reference():
    """Within the block, LynxCodec encodes with the tree-order chunk sum."""
    saved = lynx_ref.quantize
    lynx_ref.quantize = tree_quantize
    try:
        yield
    finally:
        lynx_ref.quantize = saved
