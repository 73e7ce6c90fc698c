"""Exploration (issue 19): does sending the tokens the prompt's last queries attend to most
(SnapKV's observation window) at full precision in the anchor raise draft acceptance? Sinks,
recent tokens and outlier tokens (by error or magnitude) are in docs/codec.md; this is the
attention-chosen half of "the number and choice of tokens kept exact".
Results: docs/codec.md "Attention-chosen tokens in the anchor".

    python docs/experiments/salient_tokens_probe.py --fractions 0.01,0.02 [--plan] [--baseline] \
        [every other option of lynx eval accept: --workloads, --prompts, --json, ...]

Runs ``lynx eval accept`` with the codecs replaced by ``lynx+aP`` (P percent): the ``lynx``
reference codec (SmolLM2's plan with ``--plan``; its recent-token window included) whose
anchor-stage cache also takes the full-stage values of ``round(fraction * T)`` tokens of each
layer: those with the most attention from the prompt's last ``--queries`` tokens (summed over
the queries and every head), among the tokens after the sinks and before the window. The
scores come from the exact prefill (its last queries re-run with eager attention on the exact
cache of the tokens before them): a prefill instance has them, an encoder of K and V alone not.

Bits: each chosen token is charged heads x head_dim x 2 (K, V) x 5 bits (its residual codes and
about one bit per value of scalars, as ``recent_window_probe`` charges the window) plus 16 bits
for its index, on top of the anchor's bytes; the full stage is unchanged.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

import lynx_npu
from lynx_npu.codec.lynx_layout import recent_window
from lynx_npu.eval import accept
from lynx_npu.eval.model import model_spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recent_window_probe import _Encoded, _Spec, run_accept  # noqa: E402

_SCORES: list[torch.Tensor] = []   # per layer: attention each prompt token gets, [kv heads, T]


def attention_scores(model, input_ids: torch.Tensor, queries: int) -> list[torch.Tensor]:
    """Per layer, the attention weight every prompt token receives from the last ``queries``
    prompt tokens, summed over those queries and each KV head's query heads (eager attention,
    exact cache): [kv heads, T]."""
    from transformers import DynamicCache

    t = int(input_ids.numel())
    q = min(queries, t - 1)
    ids = input_ids[None].to(model.device)
    saved = model.config._attn_implementation
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=ids[:, :t - q], past_key_values=cache, use_cache=True, logits_to_keep=1)
        model.set_attn_implementation("eager")
        try:
            out = model(input_ids=ids[:, t - q:], past_key_values=cache, use_cache=True,
                        output_attentions=True, logits_to_keep=1)
        finally:
            model.set_attn_implementation(saved)
    kv_heads = model.config.num_key_value_heads
    return [a[0].float().sum(dim=1).reshape(kv_heads, -1, t).sum(dim=1)  # [H, q, T] -> [Hkv, T]
            for a in out.attentions]


class SalientExact:
    """``inner`` (a split codec) whose first stage also holds ``fraction`` of each layer's
    tokens (``per_head``: of its (KV head, token) rows) at its last stage's precision, chosen by
    ``criterion``: ``attn``, the attention the prompt's last queries give them; ``attn_err``,
    that attention times the row's anchor error (K and V, each relative to the layer's mean)."""

    def __init__(self, inner, fraction: float, criterion: str = "attn", per_head: bool = False,
                 layer: int | None = None):
        if criterion not in ("attn", "attn_err"):
            raise ValueError(f"unknown criterion {criterion!r}")
        self.inner, self.fraction, self.layer = inner, fraction, layer
        self.criterion, self.per_head = criterion, per_head
        self.name, self.stages = inner.name, inner.stages

    def params(self) -> dict:
        return {**self.inner.params(), "salient_fraction": self.fraction,
                "salient_criterion": self.criterion, "salient_per_head": self.per_head}

    def for_layer(self, layer: int, num_layers: int) -> "SalientExact":
        inner = (self.inner.for_layer(layer, num_layers) if hasattr(self.inner, "for_layer")
                 else self.inner)
        return SalientExact(inner, self.fraction, self.criterion, self.per_head, layer)

    def encode(self, k, v):
        h, t, d = k.shape
        enc = self.inner.encode(k, v)
        cfg = self.inner.config
        lo, hi = min(cfg.num_sink_tokens, t), t - recent_window(cfg, t)
        score = _SCORES[self.layer]
        if tuple(score.shape) != (h, t):
            raise ValueError(f"layer {self.layer}: scores {tuple(score.shape)} for {(h, t)}")
        score = score.clone()
        if self.criterion == "attn_err":
            ka, va = self.inner.decode(enc, stage=self.stages[0])
            kf, vf = self.inner.decode(enc, stage=self.stages[-1])
            ek = (ka.float() - kf.float()).pow(2).sum(-1)  # [h, t]
            ev = (va.float() - vf.float()).pow(2).sum(-1)
            score *= (ek / ek[:, lo:hi].mean().clamp_min(1e-30)
                      + ev / ev[:, lo:hi].mean().clamp_min(1e-30))
        mask = torch.zeros(h, t, dtype=torch.bool)
        if self.per_head:
            n = max(0, min(round(self.fraction * h * (hi - lo)), h * (hi - lo)))
            if n:
                flat = torch.topk(score[:, lo:hi].reshape(-1), n).indices
                sub = torch.zeros(h * (hi - lo), dtype=torch.bool)
                sub[flat] = True
                mask[:, lo:hi] = sub.view(h, hi - lo)
            extra = math.ceil(n * (d * 2 * 5 + 16) / 8)
        else:
            n = max(0, min(round(self.fraction * t), hi - lo))
            if n:
                mask[:, lo + torch.topk(score[:, lo:hi].sum(0), n).indices] = True
            extra = math.ceil(n * (h * d * 2 * 5 + 16) / 8)
        wrapped = _Encoded(enc, extra, self.stages[0])
        wrapped.mask = mask
        return wrapped

    def decode(self, enc: _Encoded, stage: str):
        k, v = self.inner.decode(enc.inner, stage=stage)
        mask = enc.mask
        if stage != self.stages[0] or not bool(mask.any()):
            return k, v
        kf, vf = self.inner.decode(enc.inner, stage=self.stages[-1])
        return torch.where(mask[..., None], kf, k), torch.where(mask[..., None], vf, v)


def main() -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--fractions", default="0.01,0.02")
    own.add_argument("--queries", type=int, default=32)
    own.add_argument("--criteria", default="attn", help="attn, attn_err; a trailing 'h' (attnh) "
                     "chooses per (KV head, token) row")
    own.add_argument("--plan", action="store_true", help="SmolLM2's lynx_plan as the inner codec")
    own.add_argument("--baseline", action="store_true", help="also run the inner codec alone")
    mine, rest = own.parse_known_args()
    kw = dict(model_spec("smollm2").lynx_plan) if mine.plan else {}

    original = accept.prefill

    def prefill(model, input_ids):
        kv = original(model, input_ids)
        _SCORES[:] = attention_scores(model, input_ids, mine.queries)
        return kv

    accept.prefill = prefill
    specs = [_Spec("lynx", lambda: lynx_npu.get_codec("lynx", **kw))] if mine.baseline else []
    for c in mine.criteria.split(","):
        crit, per_head = (c[:-1], True) if c.endswith("h") else (c, False)
        for f in (float(x) for x in mine.fractions.split(",") if x):
            specs.append(_Spec(f"lynx+{c}{100 * f:g}",
                               lambda f=f, crit=crit, ph=per_head:
                               SalientExact(lynx_npu.get_codec("lynx", **kw), f, crit, ph)))
    return run_accept(specs, rest, "salient_tokens_probe")


if __name__ == "__main__":
    sys.exit(main())
