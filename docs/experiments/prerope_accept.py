"""Exploration (issue 19): draft acceptance and KL with K quantized before RoPE (KVQuant's
pre-RoPE keys): the encoder undoes RoPE on the cache's keys in float32 before the Lynx codec,
the decoder re-applies it after decoding (in float32, then the cache dtype). Bytes are the
plain codec's on the cache's own keys (the raw sink / window tokens stay in the cache dtype).
`plan` is the model's own plan (`lynx_npu/eval/model.py`). Results: docs/codec.md "K before RoPE".

    python docs/experiments/prerope_accept.py --variants lynx,lynx+prerope,plan,plan+prerope \
        [every other option of lynx eval accept: --workloads, --prompts, --json, ...]
"""
from __future__ import annotations

import argparse
import sys

import torch

import lynx_npu
from lynx_npu.eval import accept_cmd
from lynx_npu.eval.model import MODELS, load_model

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from recent_window_probe import _Spec, run_accept  # noqa: E402

_ROPE: dict = {}
MODEL = ["smollm2"]   # the model whose rotary embedding the keys carry (--model)


def rope(t: int, d: int, layer: int):
    """cos, sin [t, d] of positions 0..t-1 in ``layer``, from the model's own rotary embedding
    (Gemma 3's local and global layers have their own)."""
    model = load_model(MODEL[0]).model
    kind = getattr(model.config, "layer_types", None)
    kind = kind[layer] if kind and model.config.model_type.startswith("gemma3") else None
    if (t, d, kind) not in _ROPE:
        x, pos = torch.zeros(1, t, d), torch.arange(t)[None]
        cos, sin = (model.model.rotary_emb(x, pos, kind) if kind else model.model.rotary_emb(x, pos))
        if len(_ROPE) > 4:
            _ROPE.clear()
        _ROPE[t, d, kind] = cos[0].float(), sin[0].float()
    return _ROPE[t, d, kind]


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class _Encoded:
    def __init__(self, inner, nbytes: dict):
        self.inner, self._nbytes = inner, nbytes

    def nbytes(self, stage: str) -> int:
        return self._nbytes[stage]


class PreRope:
    def __init__(self, inner, layer: int = 0):
        self.inner, self.layer, self.name, self.stages = inner, layer, inner.name, inner.stages

    def params(self) -> dict:
        return {**self.inner.params(), "pre_rope_k": True}

    def for_layer(self, i: int, n: int):
        return PreRope(self.inner.for_layer(i, n) if hasattr(self.inner, "for_layer") else self.inner, i)

    def encode(self, k, v):
        h, t, d = k.shape
        cos, sin = rope(t, d, self.layer)
        kf = k.float()
        pre = kf * cos - rotate_half(kf) * sin
        plain = self.inner.encode(k, v)              # for the bytes only
        enc = self.inner.encode(pre, v.float())
        self.dt = k.dtype
        return _Encoded(enc, {s: plain.nbytes(s) for s in self.stages})

    def decode(self, enc: _Encoded, stage: str):
        k, v = self.inner.decode(enc.inner, stage=stage)
        t, d = k.shape[1], k.shape[2]
        cos, sin = rope(t, d, self.layer)
        kf = k.float()
        return (kf * cos + rotate_half(kf) * sin).to(self.dt), v.to(self.dt)


def main() -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--variants", default="lynx,lynx+prerope")
    mine, rest = own.parse_known_args()
    if "--model" in rest:
        MODEL[0] = rest[rest.index("--model") + 1]
    specs = []
    for name in mine.variants.split(","):
        base, _, pre = name.partition("+")
        over = dict(MODELS[MODEL[0]].lynx_plan) if base == "plan" else {}   # the model's plan
        make = (lambda over=over: PreRope(lynx_npu.get_codec("lynx", **over))) if pre else \
               (lambda over=over: lynx_npu.get_codec("lynx", **over))
        specs.append(_Spec(name, make))
    return run_accept(specs, rest, "prerope_accept")


if __name__ == "__main__":
    sys.exit(main())
