"""Asymmetric min/scale quantization: the primitive of the int8, int4, kivi4 and quantspec codecs.

Groups are either per token per head (reduce over head_dim: ``axis="token"``) or per channel
over ``group`` consecutive tokens (``axis="channel"``, KIVI's key layout; the last group of a
ragged sequence is short). Scalars are float16 and the codes are computed from the *stored*
scalars, so the decoder sees exactly what the encoder assumed.
"""
from __future__ import annotations

import torch

SCALAR_DTYPE = torch.float16


def _grouped(x: torch.Tensor, axis: str, group: int) -> torch.Tensor:
    """[H, T, D] -> [H, G, n, D] (channel) or [H, T, D] (token) for reductions on dim -2/-1."""
    if axis == "token":
        return x
    h, t, d = x.shape
    ng = -(-t // group)
    pad = ng * group - t
    if pad:  # replicate the last token: min and max of the short group are unchanged
        x = torch.cat([x, x[:, -1:].expand(h, pad, d)], dim=1)
    return x.view(h, ng, group, d)


def scalar_shape(shape: tuple[int, int, int], axis: str, group: int) -> tuple[int, ...]:
    """The shape of the scale and min tensors ``quantize`` returns for an [H, T, D] input."""
    h, t, d = shape
    return (h, t, 1) if axis == "token" else (h, -(-t // group), 1, d)


def _reduce_dim(axis: str) -> int:
    return -1 if axis == "token" else -2


def quantize(x: torch.Tensor, bits: int, axis: str, group: int = 32, name: str = "x"):
    """-> (codes int64 [H,T,D] in [0, 2^bits), scale f16, min f16) with keepdim stat shapes.

    Every float16 input fits; bfloat16 / float32 input whose group minimum or step is past
    float16's range raises ValueError (``name`` is the tensor's name in it)."""
    t = x.shape[1]
    g = _grouped(x.float(), axis, group)
    dim = _reduce_dim(axis)
    mn = g.amin(dim=dim, keepdim=True).to(SCALAR_DTYPE)
    mx = g.amax(dim=dim, keepdim=True)
    qmax = (1 << bits) - 1
    scale = ((mx - mn.float()) / qmax).to(SCALAR_DTYPE)
    if not (bool(torch.isfinite(mn).all()) and bool(torch.isfinite(scale).all())):
        lo, hi = (float(v) for v in torch.aminmax(x.float()))
        raise ValueError(f"{name} spans [{lo:g}, {hi:g}]: its float16 scale or minimum would "
                         f"overflow (the affine codecs store them in float16, finite to 65504)")
    s32 = scale.float()
    q = torch.where(s32 > 0, (g - mn.float()) / torch.where(s32 > 0, s32, 1.0), 0.0)
    codes = q.round().clamp(0, qmax).to(torch.int64)
    return _ungrouped(codes, axis, t), scale, mn


def _ungrouped(g: torch.Tensor, axis: str, t: int) -> torch.Tensor:
    if axis == "token":
        return g
    h, ng, group, d = g.shape
    return g.reshape(h, ng * group, d)[:, :t]


def dequantize(codes: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor, axis: str,
               group: int = 32) -> torch.Tensor:
    """float32 [H, T, D] reconstruction of :func:`quantize`."""
    t = codes.shape[1]
    g = _grouped(codes.float(), axis, group)
    return _ungrouped(g * scale.float() + mn.float(), axis, t)


def step(scale: torch.Tensor, axis: str, t: int, group: int = 32) -> torch.Tensor:
    """The quantization step of every value, broadcast to [H, T, D]-compatible shape."""
    g = scale.float()
    if axis == "token":
        return g
    h, ng, _, d = g.shape
    return g.expand(h, ng, group, d).reshape(h, ng * group, d)[:, :t]
