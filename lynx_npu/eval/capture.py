"""Capture the post-RoPE Q, K, V of every attention layer of a Hugging Face Llama-style model.

Transformers (>= 4.48, tested on 5.19) routes attention through ``AttentionInterface``:
``LlamaAttention.forward`` projects, applies rotary embeddings, then calls the function
registered under ``config._attn_implementation`` with ``(module, query, key, value, mask, ...)``
of shapes ``[batch, heads, T, D]`` and keyword arguments that include the layer's ``scaling``
and, for a sliding-window layer (Gemma 3's local layers), ``sliding_window``; both are kept. We register one more function, ``"lynx_capture"``, that
records exactly those tensors (what the attention kernel sees) and then runs the stock SDPA
kernel, so the model's output is unchanged. The mask interface gets SDPA's mask builder under
the same name.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

CAPTURE_IMPL = "lynx_capture"


@dataclass(frozen=True)
class LayerQKV:
    """One layer's attention inputs for a single sequence (float32, CPU)."""

    q: torch.Tensor                  # [num_heads, T, D], post-RoPE
    k: torch.Tensor                  # [num_kv_heads, T, D], post-RoPE
    v: torch.Tensor                  # [num_kv_heads, T, D]
    out: torch.Tensor | None = None  # [num_heads, T, D]: the kernel's output (before o_proj)
    window: int | None = None        # sliding window of a local layer (Gemma 3), None = global
    scale: float | None = None       # softmax scale the layer uses (None: 1/sqrt(D))

    @property
    def num_kv_groups(self) -> int:
        return self.q.shape[0] // self.k.shape[0]


class _Recorder:
    def __init__(self, keep_output: bool, keep_last_queries: int | None,
                 on_layer: Callable[[int], None] | None):
        self.keep_output = keep_output
        self.keep_last_queries = keep_last_queries
        self.on_layer = on_layer
        self.layers: dict[int, LayerQKV] = {}


_ACTIVE: _Recorder | None = None


def _capture_attention(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    rec = _ACTIVE
    if rec is not None:
        if query.shape[0] != 1:
            raise ValueError(f"capture expects batch size 1, got query shape {tuple(query.shape)}")
        q = query[0]
        o = out[0].transpose(0, 1) if rec.keep_output else None  # [T, H, D] -> [H, T, D]
        if rec.keep_last_queries is not None:  # keys and values always keep every position
            q = q[:, -rec.keep_last_queries:]
            o = o[:, -rec.keep_last_queries:] if o is not None else None
        idx = module.layer_idx
        rec.layers[idx] = LayerQKV(
            q=q.detach().float().clone(), k=key[0].detach().float().clone(),
            v=value[0].detach().float().clone(),
            out=o.detach().float().clone() if o is not None else None,
            window=kwargs.get("sliding_window"), scale=kwargs.get("scaling"))
        if rec.on_layer is not None:
            rec.on_layer(idx)
    return out, weights


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(CAPTURE_IMPL, _capture_attention)
    AttentionMaskInterface.register(CAPTURE_IMPL, sdpa_mask)


@contextlib.contextmanager
def _attention_implementation(model, impl: str):
    previous = model.config._attn_implementation
    model.set_attn_implementation(impl)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def capture_qkv(model, input_ids: torch.Tensor, *, keep_output: bool = False,
                keep_last_queries: int | None = None,
                on_layer: Callable[[int], None] | None = None) -> list[LayerQKV]:
    """One forward pass over ``input_ids`` (int64 [T]); returns every layer's Q/K/V in order.

    ``keep_last_queries`` keeps only the last queries (the metric needs no more) to save
    memory; ``on_layer(i)`` is called as each layer is captured (for progress).
    """
    global _ACTIVE
    if input_ids.dim() != 1 or input_ids.numel() == 0:
        raise ValueError(f"input_ids must be a non-empty 1-D tensor, got shape {tuple(input_ids.shape)}")
    if keep_last_queries is not None and keep_last_queries < 1:
        raise ValueError(f"{keep_last_queries=} must be >= 1 or None")
    _register()
    rec = _Recorder(keep_output, keep_last_queries, on_layer)
    # Only the decoder stack: the LM head over T x vocab logits is large and not needed.
    body = model.get_decoder() if hasattr(model, "get_decoder") else model
    _ACTIVE = rec
    try:
        with _attention_implementation(model, CAPTURE_IMPL), torch.inference_mode():
            body(input_ids=input_ids[None].to(model.device), use_cache=False)
    finally:
        _ACTIVE = None
    num_layers = model.config.num_hidden_layers
    if sorted(rec.layers) != list(range(num_layers)):
        raise RuntimeError(f"captured layers {sorted(rec.layers)} of {num_layers}: the model does not "
                           f"route attention through transformers' AttentionInterface")
    return [rec.layers[i] for i in range(num_layers)]
