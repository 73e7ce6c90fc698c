"""Output quality with a prompt's KV cache replaced by each codec's reconstruction.

Per prompt: one exact prefill (``accept.prefill``) gives the first token and the prompt's KV;
the KV is cast to the KV dtype (the exact cache, e.g. BF16) and every codec encodes that and is
decoded at its last stage (``lynx``: full = lynx-int8's output; ``lynx-int4``: its anchor). The
model then continues from each reconstruction (``accept.past_cache``); only the prompt's KV is
replaced, tokens after it get their KV from the model.

- ``continuation_nll``: the prompt is the context without its last token; the last token and
  the continuation but its last token are fed in one teacher-forced forward, so every scored
  token (the whole continuation) is predicted over the reconstructed KV.
- ``generate``: the prefill's greedy token (exact, as the prefill instance sends it), then
  greedy tokens decoded over each reconstruction (``accept.greedy_decode``, one batch).
- ``choose``: the prompt without its last token is reconstructed, the last token is fed and
  the answer is the option letter with the highest logit.

CacheGen's entropy coder is lossless, so its reconstruction is its quantizer's round trip
(``cachegen.quantize`` / ``dequantize`` with the layer's bins); computing it so skips the range
coder, ~50 s a 4K prompt on 2 cores (a test checks equality with ``decode(encode())``).
"""
from __future__ import annotations

from typing import Callable

import torch

from lynx_npu.codec.cachegen import CacheGenCodec, dequantize, quantize

from . import accept
from .accept import Layers


def reconstruct_last_stage(codec, layers: Layers) -> Layers:
    stage = codec.stages[-1]
    if isinstance(codec, CacheGenCodec):
        out = []
        for i, (k, v) in enumerate(layers):
            config = codec.for_layer(i, len(layers)).config
            out.append(tuple(dequantize(*quantize(x, bins), bins, x.shape[0], x.shape[2], x.dtype)
                             for x, bins in ((k, config.key_bins), (v, config.value_bins))))
        return out
    return accept.reconstruct(codec, layers, (stage,)).stages[stage]


def codec_caches(model, input_ids: torch.Tensor, codecs: list[tuple[str, object]],
                 kv_dtype: torch.dtype, on_stage: Callable[[str], None] | None = None
                 ) -> tuple[int, dict[str, Layers]]:
    """Exact prefill of ``input_ids`` -> (its greedy next token, {codec label: reconstruction})."""
    note = on_stage or (lambda _: None)
    note("prefill")
    kv = accept.prefill(model, input_ids)
    exact = accept.cast(kv.layers, kv_dtype)
    caches = {}
    for label, codec in codecs:
        note(label)
        caches[label] = reconstruct_last_stage(codec, exact)
    return kv.first_token, caches


def continuation_nll(model, layers: Layers, last_token: int, continuation: list[int]) -> float:
    """Mean negative log-likelihood (nats) of ``continuation`` after the prompt held in
    ``layers`` and its last token ``last_token`` (not in ``layers``)."""
    if not continuation:
        raise ValueError("continuation is empty")
    cache = accept.past_cache(model, [layers])
    fed = torch.tensor([[last_token] + continuation[:-1]], dtype=torch.int64, device=model.device)
    target = torch.tensor(continuation, dtype=torch.int64, device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=fed, past_key_values=cache, use_cache=True).logits[0].float()
    return float(torch.nn.functional.cross_entropy(logits, target))


def choose(model, variants: list[Layers], last_token: int, option_tokens: list[int]) -> list[int]:
    """Per variant, the index of the option whose token has the highest next-token logit."""
    cache = accept.past_cache(model, variants)
    fed = torch.full((len(variants), 1), last_token, dtype=torch.int64, device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=fed, past_key_values=cache, use_cache=True).logits[:, -1]
    return logits[:, option_tokens].argmax(-1).tolist()


def stop_ids(model, tokenizer) -> set[int]:
    """Tokens that end an answer: EOS (tokenizer and generation config) and end-of-turn."""
    ids = set()
    for source in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        ids.update(source if isinstance(source, (list, tuple)) else [source])
    for name in ("<end_of_turn>", "<|im_end|>", "<|endoftext|>"):
        i = tokenizer.convert_tokens_to_ids(name)
        if isinstance(i, int) and i != tokenizer.unk_token_id:
            ids.add(i)
    return {i for i in ids if i is not None}


def answer_text(tokenizer, tokens: list[int], stops: set[int]) -> str:
    """The tokens up to the first stop token, as text."""
    cut = next((n for n, t in enumerate(tokens) if t in stops), len(tokens))
    return tokenizer.decode(tokens[:cut], skip_special_tokens=True).strip()


def generate(model, caches: dict[str, Layers], first_token: int, num_tokens: int,
             on_step: Callable[[], None] | None = None) -> dict[str, list[int]]:
    """{label: [first_token] + num_tokens - 1 greedy tokens} from every reconstruction."""
    labels = list(caches)
    if num_tokens == 1:
        return {label: [first_token] for label in labels}
    rows = accept.greedy_decode(model, [caches[label] for label in labels], first_token,
                                num_tokens - 1, on_step)
    return {label: [first_token] + row for label, row in zip(labels, rows)}
