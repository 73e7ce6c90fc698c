"""Exploration (issue 19): how much could *fitted* anchor levels buy over the alpha-law ones?

The anchor stage reconstructs each value from 4 bits: the chunk-normalised value ``xf`` in
[-1, 1] (lynx_ref.quantize) is coded as a sign and a magnitude ``m`` in 0..7, decoded at
``levels[m << r]`` (15 distinct values: +0 and -0 coincide). This probe takes the ``xf`` of every
value of real KV (the default ``lynx`` config, the tokens after the sinks in whole pages) and
compares, in the value domain (each value's error scaled by its chunk's ``sigma`` and its page
channel's range, i.e. exactly the anchor's reconstruction error), the squared error of

- ``alpha``: today's anchor levels;
- ``alpha-zero``: the same with +0 and -0 decoded at +-levels[2^r / 4] instead of 0 (the
  zero-bucket variant of docs/codec.md, for reference);
- ``midrise-16``: 16 uniform levels +-(2j + 1) / 16, j = 0..7 (the anchor of an MSB split of a
  signed 8-bit mid-rise code: no zero level, every code used, the chunk extremes +-1 not exact);
- ``lloyd-sym``: 8 magnitudes fitted by weighted Lloyd-Max on |xf| (sign kept, 16 levels with
  distinct +-0 buckets allowed as the smallest magnitude), per K / V;
- ``lloyd-16``: 16 free levels fitted by weighted Lloyd-Max on xf, per K / V: the bound for any
  4-bit scalar quantizer of xf after this normalisation, fitted on the very data it codes.

    python docs/experiments/fitted_levels_probe.py --tokens 2048 --queries 16 --out OUT.json

Results: docs/codec.md "Fitted anchor levels".
"""
import argparse
import json
import sys

import torch

import lynx_npu
from lynx_npu.codec import lynx_ref, lynx_tables
from lynx_npu.eval.kv_source import add_capture_arguments, capture_from_args


def _xf_and_scale(pages: torch.Tensor, cfg, which: str):
    """[n, H, P, D] pages -> (xf, scale): xf as lynx_ref.quantize computes it, and the factor
    (sigma * page range) that turns an xf error into a value error."""
    n, h, tp, d = pages.shape
    axis = cfg.axis(which)
    x = pages.float()
    gmin, gmax = x.amin(dim=2, keepdim=True), x.amax(dim=2, keepdim=True)
    rng = gmax - gmin
    xn = (x - gmin) * lynx_ref.reciprocal_or_zero(rng)
    chunks, mask = lynx_ref._chunked(xn, axis, cfg.chunk_size)
    hi, lo = chunks.amax(dim=-1), chunks.amin(dim=-1)
    mu = ((hi + lo) / 2).to(torch.float16).float()
    xc = chunks - mu.unsqueeze(-1)
    sigma = xc.abs().amax(dim=-1).to(torch.float16).float()
    xf = xc * lynx_ref.reciprocal_or_zero(sigma.unsqueeze(-1))
    length = tp if axis == "channel" else d
    xf = lynx_ref._unchunked(xf, axis, length)
    sig = lynx_ref._unchunked(sigma.unsqueeze(-1).expand_as(xc).contiguous(), axis, length)
    return xf.reshape(-1), (sig * rng.expand_as(x)).reshape(-1)


def _lloyd(x: torch.Tensor, w: torch.Tensor, init: torch.Tensor, iters: int = 60) -> torch.Tensor:
    """Weighted 1-D Lloyd-Max from ``init`` (sorted levels) -> fitted sorted levels."""
    lv = init.double().clone()
    x, w = x.double(), w.double()
    for _ in range(iters):
        edges = (lv[1:] + lv[:-1]) / 2
        idx = torch.bucketize(x, edges)
        num = torch.zeros_like(lv).index_add_(0, idx, w * x)
        den = torch.zeros_like(lv).index_add_(0, idx, w)
        lv = torch.where(den > 0, num / den.clamp_min(1e-300), lv)
        lv, _ = lv.sort()
    return lv


def _mse(x: torch.Tensor, w: torch.Tensor, lv: torch.Tensor) -> float:
    edges = (lv[1:] + lv[:-1]) / 2
    q = lv[torch.bucketize(x.double(), edges)]
    return float((w.double() * (x.double() - q) ** 2).sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_capture_arguments(ap)
    ap.add_argument("--sample", type=int, default=4_000_000,
                    help="values per K / V used to fit (all values are scored)")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cap = capture_from_args(args)
    cfg = lynx_npu.get_codec("lynx").config
    P, S = cfg.page_size, cfg.num_sink_tokens
    out = {}
    for which in ("k", "v"):
        xs, ws = [], []
        for ref in cap.refs:
            x = getattr(ref, which)
            body = x[:, S:, :]
            n = body.shape[1] // P
            pages = body[:, :n * P, :].reshape(body.shape[0], n, P, body.shape[2]).permute(1, 0, 2, 3)
            xf, scale = _xf_and_scale(pages, cfg, which)
            xs.append(xf)
            ws.append(scale ** 2)
        xf, w = torch.cat(xs), torch.cat(ws)
        r = cfg.residual_bits(which)
        lv = lynx_tables.levels(cfg.alpha(which), cfg.y_max(which)).double()
        mags = lv[torch.arange(8) << r]
        alpha = torch.cat([-mags.flip(0), mags[1:]])             # 15 distinct levels
        q = lv[(1 << r) // 4:(1 << r) // 4 + 1]                 # +-0 at +-levels[2^r / 4]
        zero = torch.cat([-mags[1:].flip(0), -q, q, mags[1:]])
        gen = torch.Generator().manual_seed(0)
        pick = torch.randperm(xf.numel(), generator=gen)[:args.sample]
        sym_mag = _lloyd(xf[pick].abs(), w[pick], mags)
        sym = torch.cat([-sym_mag.flip(0), sym_mag])
        free = _lloyd(xf[pick], w[pick], torch.linspace(-1, 1, 16))
        half = (2 * torch.arange(8, dtype=torch.float64) + 1) / 16
        midrise = torch.cat([-half.flip(0), half])
        base = _mse(xf, w, alpha)
        row = {"values": xf.numel(),
               "mse": {"alpha": base, "alpha-zero": _mse(xf, w, zero),
                       "midrise-16": _mse(xf, w, midrise), "lloyd-sym": _mse(xf, w, sym),
                       "lloyd-16": _mse(xf, w, free)},
               "levels": {"alpha": alpha.tolist(), "lloyd-sym": sym.tolist(),
                          "lloyd-16": free.tolist()}}
        row["ratio"] = {k: v / base for k, v in row["mse"].items()}
        out[which] = row
        print(which, {k: round(v, 4) for k, v in row["ratio"].items()}, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": cap.meta, "config": str(cfg), "result": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
