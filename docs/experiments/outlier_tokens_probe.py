"""Exploration (issue 19): does sending a layer's *outlier tokens* at full precision in the anchor
raise draft acceptance? The issue lists "the number and choice of tokens kept exact (sinks;
outlier tokens)"; sinks and recent tokens are in docs/codec.md, this is the outlier half.
Results: docs/codec.md "Outlier tokens in the anchor".

    python docs/experiments/outlier_tokens_probe.py --fractions 0.01 --criteria err \
        [every other option of lynx eval accept: --workloads, --prompts, --json, ...]

Runs ``lynx eval accept`` with the codecs replaced by ``lynx+o{criterion}{percent}``: the default
``lynx`` (reference codec, its recent-token window included), whose anchor-stage cache also
takes the full-stage values of the ``round(fraction * T)`` tokens of each layer chosen by
``criterion``, among the tokens after the sinks and before the window:

- ``err``: the largest anchor reconstruction error, K and V each relative to the layer's mean
  token error (sum over heads of the squared error against the full stage); the encoder can
  compute this, so a codec could choose the same tokens;
- ``kerr``: the same on K alone (K dominates the anchor's attention error, docs/codec.md);
- ``mag``: the largest absolute K value of the token (the tokens that stretch their chunks).

Bits: each chosen token is charged heads x head_dim x 2 (K, V) x 5 bits (its residual codes and,
at chunk 32, one bit per value of exact scalars, as ``recent_window_probe`` charges the window)
plus 16 bits for its index, on top of the default anchor's bytes.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

import lynx_npu
from lynx_npu.codec.lynx_layout import recent_window

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recent_window_probe import _Encoded, _Spec, run_accept  # noqa: E402


class OutlierExact:
    """``inner`` (a split codec) whose first stage also holds ``fraction`` of each layer's
    tokens, chosen by ``criterion``, at its last stage's precision."""

    def __init__(self, inner, fraction: float, criterion: str):
        self.inner, self.fraction, self.criterion = inner, fraction, criterion
        self.name, self.stages = inner.name, inner.stages

    def params(self) -> dict:
        return {**self.inner.params(), "outlier_fraction": self.fraction,
                "outlier_criterion": self.criterion}

    def encode(self, k, v):
        h, t, d = k.shape
        enc = self.inner.encode(k, v)
        n = round(self.fraction * t)
        cfg = self.inner.config
        lo, hi = min(cfg.num_sink_tokens, t), t - recent_window(cfg, t)
        n = max(0, min(n, hi - lo))
        ka, va = self.inner.decode(enc, stage=self.stages[0])
        kf, vf = self.inner.decode(enc, stage=self.stages[-1])
        if self.criterion == "mag":
            score = k.float().abs().amax(dim=(0, 2))
        else:
            ek = (ka.float() - kf.float()).pow(2).sum(dim=(0, 2))
            score = ek / ek[lo:hi].mean().clamp_min(1e-30)
            if self.criterion == "err":
                ev = (va.float() - vf.float()).pow(2).sum(dim=(0, 2))
                score = score + ev / ev[lo:hi].mean().clamp_min(1e-30)
        chosen = (lo + torch.topk(score[lo:hi], n).indices) if n else torch.zeros(0, dtype=torch.long)
        extra = math.ceil(n * (h * d * 2 * 5 + 16) / 8)
        wrapped = _Encoded(enc, extra, self.stages[0])
        wrapped.chosen = chosen
        return wrapped

    def decode(self, enc: _Encoded, stage: str):
        k, v = self.inner.decode(enc.inner, stage=stage)
        chosen = enc.chosen
        if stage != self.stages[0] or not len(chosen):
            return k, v
        kf, vf = self.inner.decode(enc.inner, stage=self.stages[-1])
        k, v = k.clone(), v.clone()
        k[:, chosen] = kf[:, chosen]
        v[:, chosen] = vf[:, chosen]
        return k, v


def main() -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--fractions", default="0.01")
    own.add_argument("--criteria", default="err")
    own.add_argument("--baseline", action="store_true", help="also run the default lynx")
    mine, rest = own.parse_known_args()
    specs = [_Spec("lynx", lambda: lynx_npu.get_codec("lynx"))] if mine.baseline else []
    for c in mine.criteria.split(","):
        for f in (float(x) for x in mine.fractions.split(",") if x):
            specs.append(_Spec(f"lynx+o{c}{100 * f:g}",
                               lambda f=f, c=c: OutlierExact(lynx_npu.get_codec("lynx"), f, c)))
    return run_accept(specs, rest, "outlier_tokens_probe")


if __name__ == "__main__":
    sys.exit(main())
