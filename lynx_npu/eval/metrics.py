"""Error metrics of a KV codec on one layer, all computed in float32.

- ``nmse(x, x_hat) = ||x - x_hat||^2 / ||x||^2``, the sums over the whole tensor (a layer's K
  or V, every head, token and channel).
- Attention-output vNMSE: for the last ``n`` positions of a T-token sequence as causal
  queries (the query at position t attends keys 0..t), with softmax scale 1/sqrt(D) and GQA
  (query head h reads KV head h // (num_heads / num_kv_heads), as transformers' ``repeat_kv``),
  ``o`` is the attention output on the original K/V and ``o_hat`` on the decoded K/V with the
  same queries; ``vnmse = mean over (query head, query) of ||o - o_hat||^2 / ||o||^2``.
- Per-layer attention pattern: ``window`` (a sliding-window layer, e.g. Gemma 3's local layers
  with window 512) restricts the query at position t to keys t-window+1 .. t, exactly as
  transformers' ``sliding_window_overlay`` (``kv_idx > q_idx - window``); ``scale`` overrides
  1/sqrt(D) (Gemma 3 uses ``query_pre_attn_scalar ** -0.5``). Both are captured per layer.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def nmse(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """||x - x_hat||^2 / ||x||^2 over the whole tensor (0 when both are all zero)."""
    _check_same_shape("x", x, "x_hat", x_hat)
    x, x_hat = x.float(), x_hat.float()
    err = (x - x_hat).pow(2).sum()
    ref = x.pow(2).sum()
    if ref == 0:
        return 0.0 if err == 0 else math.inf
    return float(err / ref)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                     window: int | None = None, scale: float | None = None) -> torch.Tensor:
    """Attention of the *last* queries of a sequence over all its keys, causally.

    ``q`` [num_heads, n, D] holds the queries of positions T-n .. T-1 of the sequence whose
    keys/values ``k``, ``v`` are [num_kv_heads, T, D]; returns ``o`` [num_heads, n, D] float32.
    ``window``: a sliding-window layer's window (the query at t sees keys > t - window);
    ``scale``: the softmax scale (default 1/sqrt(D)).
    """
    hq, n, d = q.shape
    hkv, t, dk = k.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if d != dk:
        raise ValueError(f"q head_dim {d} != k head_dim {dk}")
    if hq % hkv:
        raise ValueError(f"num_heads={hq} must be a multiple of num_kv_heads={hkv}")
    if n > t:
        raise ValueError(f"{n} queries but only {t} keys: queries are the last positions")
    # SDPA's fused CPU kernel (float32 in, float32 accumulation) is ~3x faster than explicit
    # matmul + softmax here; enable_gqa maps query head h to KV head h // (hq / hkv).
    if window is not None and window < 1:
        raise ValueError(f"{window=} must be >= 1 or None")
    q_pos = torch.arange(t - n, t)[:, None]
    visible = torch.arange(t)[None, :] <= q_pos   # [n, T]
    if window is not None:
        visible &= torch.arange(t)[None, :] > q_pos - window
    o = F.scaled_dot_product_attention(q.float()[None], k.float()[None], v.float()[None],
                                       attn_mask=visible,
                                       scale=1.0 / math.sqrt(d) if scale is None else scale,
                                       enable_gqa=True)
    return o[0]


def vector_nmse(o: torch.Tensor, o_hat: torch.Tensor) -> float:
    """Mean over vectors (all leading axes) of ||o - o_hat||^2 / ||o||^2 along the last axis."""
    _check_same_shape("o", o, "o_hat", o_hat)
    o, o_hat = o.float(), o_hat.float()
    err = (o - o_hat).pow(2).sum(-1)
    ref = o.pow(2).sum(-1).clamp_min(torch.finfo(torch.float32).tiny)
    return float((err / ref).mean(dtype=torch.float64))


def attention_vnmse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_hat: torch.Tensor,
                    v_hat: torch.Tensor, o: torch.Tensor | None = None, *,
                    window: int | None = None, scale: float | None = None) -> float:
    """vNMSE of the causal attention output of the last queries ``q`` when ``k, v`` are
    replaced by ``k_hat, v_hat``. Pass ``o = causal_attention(q, k, v, window=, scale=)`` (the
    same window and scale) to reuse it."""
    _check_same_shape("k", k, "k_hat", k_hat)
    _check_same_shape("v", v, "v_hat", v_hat)
    if o is None:
        o = causal_attention(q, k, v, window=window, scale=scale)
    return vector_nmse(o, causal_attention(q, k_hat, v_hat, window=window, scale=scale))


def _check_same_shape(na: str, a: torch.Tensor, nb: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{na} shape {tuple(a.shape)} != {nb} shape {tuple(b.shape)}")
