"""Parity helpers for the ops backends: inputs and the reference streams.

The reference (lynx_npu/codec/lynx_ref.py) fixes every float32 operation, the mean's summation
order included (an adjacent-pairs tree), so each compiled backend must reproduce its bytes
exactly: the tests compare with ``torch.equal``, no tolerance.
"""
from __future__ import annotations

import dataclasses

import torch

from lynx_npu.codec.lynx import LynxCodec
from lynx_npu.codec.lynx_config import LynxConfig
from lynx_npu.ops.plan import layer_plan

CENTERS = ["midrange", "mean"]


def random_kv(h: int, t: int, d: int, dtype: torch.dtype, seed: int = 0):
    """Real-looking KV: Laplace K with outlier channels and a sink-like first token, Gaussian V."""
    g = torch.Generator().manual_seed(seed)
    lap = torch.distributions.Laplace(0.0, 1.0)
    torch.manual_seed(seed)
    k = lap.sample((h, t, d)) * torch.linspace(0.2, 6, d)
    k[:, 0] *= 20
    v = torch.randn(h, t, d, generator=g) * 0.5
    return k.to(dtype), v.to(dtype)


def codec(cfg: LynxConfig) -> LynxCodec:
    return LynxCodec(**dataclasses.asdict(cfg))


def reference_streams(cfg: LynxConfig, k, v):
    """(anchor, residual) of the reference codec (on the CPU)."""
    enc = codec(cfg).encode(k.cpu(), v.cpu())
    return enc.anchor, enc.residual


def poisoned_compress(k, v, cfg, backend):
    """Compress into buffers pre-filled with 0x00, then 0xFF: both runs must give the same
    bytes, so no output byte (alignment padding included) is left unwritten."""
    from lynx_npu import ops

    p = layer_plan(cfg, k.shape[0], k.shape[1], k.shape[2], k.dtype)
    outs = []
    for fill in (0x00, 0xFF):
        a = torch.full((p.anchor_nbytes,), fill, dtype=torch.uint8, device=k.device)
        r = torch.full((p.residual_nbytes,), fill, dtype=torch.uint8, device=k.device)
        outs.append(ops.compress(k, v, cfg, backend=backend, out=(a, r)))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), \
        "some output bytes are not written"
    return outs[0][0].cpu(), outs[0][1].cpu()
