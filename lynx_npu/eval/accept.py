"""How many drafts survive verification: the accepted-prefix length of greedy tokens decoded on
a codec's reconstruction of the prompt's KV cache (the Lynx paper's Fig. 10(a) measure).

Per prompt: one exact prefill gives the first token (as the prefill instance would) and every
layer's post-RoPE K and V. The prompt's KV is then replaced by a reconstruction and the model
decodes greedily from the first token:

- drafts: from the codec's first stage (``anchor`` of a split codec such as ``lynx`` or
  ``quantspec``; the only stage of a one-stream codec such as ``kivi4``);
- targets: the exact cache (the prompt's KV cast to the KV dtype, e.g. BF16) for every codec,
  and for a split codec also its last stage (``full``: what Lynx verifies against).

The accepted length is ``accept_greedy(drafts, target)`` (lynx_npu/speculative): the drafts
agreeing with the target's greedy tokens. Comparing with the target's own greedy continuation is
the same as verifying the drafts in one pass: while the drafts agree, the target's context is
its own continuation. Tokens after the prompt get their KV from the model as it decodes; only
the prompt's KV is replaced. Decoding ignores EOS. All variants of a prompt decode in one batch
(same length, same first token), so the weights are read once per step for all of them.

Beside the lengths, a low-variance companion: the exact cache's greedy continuation is fed once
to every draft cache (teacher forcing), and ``kl`` is the mean over those positions of
KL(exact || draft) of the next-token distribution. An accepted length is decided by the first
near-tie token (misses fall where the exact cache's top two tokens are ~0.07 nats apart,
docs/codec.md), so two anchors of the same mean KL flip single prompts both ways; the KL compares
them on every position of every prompt.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from lynx_npu.speculative import accept_greedy

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v): [num_kv_heads, T, head_dim]
EXACT = "exact"


@dataclass(frozen=True)
class PromptKV:
    first_token: int   # the exact prefill's greedy token
    layers: Layers     # float32, post-RoPE, as the model's cache holds them


@dataclass(frozen=True)
class Row:
    """One curve: drafts from ``codec``'s ``draft_stage``, verified against ``target``
    (``"exact"`` or the codec's last stage)."""

    codec: str
    draft_stage: str
    target: str

    @property
    def label(self) -> str:
        return f"{self.codec} {self.draft_stage} -> {self.target}"


def rows_of(label: str, codec) -> list[Row]:
    """Drafts from the first stage; targets: the last stage of a split codec, and exact."""
    first, last = codec.stages[0], codec.stages[-1]
    return ([Row(label, first, last)] if last != first else []) + [Row(label, first, EXACT)]


def prefill(model, input_ids: torch.Tensor) -> PromptKV:
    """One exact forward pass over ``input_ids`` (int64 [T]) with a cache."""
    if input_ids.dim() != 1 or input_ids.numel() == 0:
        raise ValueError(f"input_ids must be a non-empty 1-D tensor, got shape "
                         f"{tuple(input_ids.shape)}")
    from transformers import DynamicCache

    # A cache built without the config has only full layers: a sliding-window layer (Gemma 3's
    # local layers) keeps every prompt position instead of its last window - 1 (the default
    # cache's), so the codecs see the whole prompt's KV as on every other layer, and the decode
    # cache (greedy_decode) refilled from it knows the prompt's length. The prefill's output is
    # the same either way: the mask, not the cache, applies the window.
    with torch.inference_mode():
        out = model(input_ids=input_ids[None].to(model.device), past_key_values=DynamicCache(),
                    use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    layers = [(layer.keys[0].float().clone(), layer.values[0].float().clone())
              for layer in cache.layers]
    return PromptKV(int(out.logits[0, -1].argmax()), layers)


def cast(layers: Layers, dtype: torch.dtype) -> Layers:
    """The exact cache as a serving engine stores it: each K and V cast to ``dtype``."""
    return [(k.to(dtype), v.to(dtype)) for k, v in layers]


@dataclass
class Reconstruction:
    stages: dict[str, Layers]   # stage -> per layer (k_hat, v_hat) in the KV dtype
    nbytes: dict[str, int]      # stage -> bytes on the wire up to that stage, every layer
    num_values: int             # K and V values of every layer


def reconstruct(codec, layers: Layers, stages: tuple[str, ...]) -> Reconstruction:
    """Encode each layer once (the codec reads ``layers`` in their dtype) and decode ``stages``.
    Codecs with a per-layer schedule (CacheGen) get the layer they encode."""
    out = Reconstruction({s: [] for s in stages}, {s: 0 for s in stages}, 0)
    for i, (k, v) in enumerate(layers):
        layer_codec = codec.for_layer(i, len(layers)) if hasattr(codec, "for_layer") else codec
        enc = layer_codec.encode(k, v)
        for stage in stages:
            out.stages[stage].append(layer_codec.decode(enc, stage=stage))
            out.nbytes[stage] += enc.nbytes(stage)
        out.num_values += 2 * k.numel()
    return out


def past_cache(model, variants: list[Layers]):
    """A decode cache holding the prompt caches of ``variants`` (same shapes) as one batch,
    built with the model's config (sliding-window layers keep their window, as in serving)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for i in range(len(variants[0])):
        k = torch.stack([layers[i][0] for layers in variants]).float().to(model.device)
        v = torch.stack([layers[i][1] for layers in variants]).float().to(model.device)
        cache.update(k, v, i)
    return cache


def greedy_decode(model, variants: list[Layers], first_token: int, num_tokens: int,
                  on_step: Callable[[], None] | None = None) -> list[list[int]]:
    """``num_tokens`` greedy tokens after ``first_token`` from each prompt cache of
    ``variants`` (same shapes), decoded as one batch; EOS is not special."""
    if num_tokens < 1 or not variants:
        raise ValueError(f"need num_tokens >= 1 and at least one variant, got {num_tokens=}, "
                         f"{len(variants)} variants")
    shapes = {tuple(k.shape) for layers in variants for k, _ in layers[:1]}
    if len(shapes) != 1:
        raise ValueError(f"variants have different prompt shapes {sorted(shapes)}")
    batch = len(variants)
    cache = past_cache(model, variants)
    token = torch.full((batch, 1), first_token, dtype=torch.int64, device=model.device)
    out: list[list[int]] = [[] for _ in range(batch)]
    with torch.inference_mode():
        for _ in range(num_tokens):
            logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits
            token = logits[:, -1].argmax(-1, keepdim=True)
            for row, t in zip(out, token[:, 0].tolist()):
                row.append(t)
            if on_step is not None:
                on_step()
    return out


def divergence(model, variants: list[Layers], tokens: list[int]) -> list[float]:
    """Mean KL(variants[0] || variant) of the next-token distribution after each of ``tokens``,
    fed (teacher forcing) to every prompt cache of ``variants`` in one batch; variants[0], the
    reference (the exact cache), gets 0. One value per variant, in nats."""
    if not tokens:
        raise ValueError("need at least one token to compare next-token distributions on")
    cache = past_cache(model, variants)
    ids = torch.tensor([tokens] * len(variants), dtype=torch.int64, device=model.device)
    with torch.inference_mode():
        logp = torch.log_softmax(model(input_ids=ids, past_key_values=cache,
                                       use_cache=True).logits.float(), dim=-1)
    ref = logp[0]
    kl = (ref.exp() * (ref - logp)).sum(-1).clamp_min(0)  # [variants, positions]
    return kl.mean(-1).tolist()


def accepted_length(drafts: list[int], target: list[int]) -> int:
    """Drafts kept by greedy verification against the target's greedy continuation (at least
    one token longer than the drafts)."""
    return accept_greedy(drafts, target[:len(drafts) + 1]).num_accepted


INTERVAL_KS = (10, 20)  # the paper's Fig. 10(a) reads P(>=10) and P(>=20)


def summarize(lengths: list[int], num_tokens: int) -> dict:
    """mean accepted length and ``p_at_least[k-1]`` = P(accepted >= k) for k = 1..num_tokens,
    with 95% bootstrap intervals over the prompts (``intervals``: the mean and P(>= k) for k in
    INTERVAL_KS): at 20-40 prompts one prompt moves P by 0.025-0.05, so a bar is missed or met
    only where the interval says so."""
    from .bootstrap import interval

    if not lengths:
        raise ValueError("no accepted lengths to summarize")
    bad = [n for n in lengths if not 0 <= n <= num_tokens]
    if bad:
        raise ValueError(f"accepted lengths {bad} are outside [0, {num_tokens=}]")
    n = len(lengths)
    spans = {"mean": interval(lengths)}
    spans.update({f"p_at_least_{k}": interval([float(x >= k) for x in lengths])
                  for k in INTERVAL_KS if k <= num_tokens})
    return {"num_prompts": n, "mean": sum(lengths) / n,
            "p_at_least": [sum(x >= k for x in lengths) / n for k in range(1, num_tokens + 1)],
            "intervals": {name: [i.low, i.high] for name, i in spans.items()},
            "lengths": list(lengths)}


@dataclass
class Prepared:
    """One prompt, ready to decode: its first token, every cache variant, the rows to report."""

    tokens: int
    first_token: int
    variants: dict[tuple[str, str], Layers]   # ("", "exact") or (codec label, stage)
    bits: dict[str, dict[str, float]]          # codec label -> stage -> bits per value
    rows: list[Row]


def prepare(model, input_ids: torch.Tensor, codecs: list[tuple[str, object]],
            kv_dtype: torch.dtype, on_stage: Callable[[str], None] | None = None) -> Prepared:
    """Prefill exactly, then reconstruct the prompt's KV with every codec's needed stages."""
    note = on_stage or (lambda _: None)
    note("prefill")
    kv = prefill(model, input_ids)
    exact = cast(kv.layers, kv_dtype)
    out = Prepared(int(input_ids.numel()), kv.first_token, {("", EXACT): exact}, {}, [])
    for label, codec in codecs:
        note(label)
        rows = rows_of(label, codec)
        stages = tuple(dict.fromkeys([r.draft_stage for r in rows]
                                     + [r.target for r in rows if r.target != EXACT]))
        rec = reconstruct(codec, exact, stages)
        for stage in stages:
            out.variants[label, stage] = rec.stages[stage]
        out.bits[label] = {s: 8.0 * rec.nbytes[s] / rec.num_values for s in stages}
        out.rows += rows
    return out


def verify(model, prepared: Prepared, num_tokens: int,
           on_step: Callable[[], None] | None = None) -> dict:
    """Decode ``num_tokens`` drafts (+ 1 target token) from every variant, then -> ``{"tokens",
    "first_token", "accepted": {row label: length}, "kl": {"codec stage": KL(exact || draft)
    along the exact continuation}, "bits": {codec: {stage: bits per value}}, "decoded":
    {variant: tokens}}``."""
    keys = list(prepared.variants)
    decoded = greedy_decode(model, [prepared.variants[key] for key in keys],
                            prepared.first_token, num_tokens + 1, on_step)
    tokens = dict(zip(keys, decoded))
    accepted = {}
    for row in prepared.rows:
        target = tokens["", EXACT] if row.target == EXACT else tokens[row.codec, row.target]
        accepted[row.label] = accepted_length(tokens[row.codec, row.draft_stage][:num_tokens],
                                              target)
    drafts = list(dict.fromkeys((row.codec, row.draft_stage) for row in prepared.rows))
    fed = [prepared.first_token] + tokens["", EXACT][:num_tokens - 1]  # predicts the N drafts
    kl = divergence(model, [prepared.variants["", EXACT]]
                    + [prepared.variants[key] for key in drafts], fed)[1:]
    return {"tokens": prepared.tokens, "first_token": prepared.first_token,
            "accepted": accepted, "kl": {f"{c} {s}": x for (c, s), x in zip(drafts, kl)},
            "bits": prepared.bits,
            "decoded": {(f"{c} {s}" if c else s): t for (c, s), t in tokens.items()}}


def measure_prompt(model, input_ids: torch.Tensor, codecs: list[tuple[str, object]],
                   num_tokens: int, kv_dtype: torch.dtype) -> dict:
    """``prepare`` then ``verify``: one prompt's accepted lengths (no progress)."""
    return verify(model, prepare(model, input_ids, codecs, kv_dtype), num_tokens)
