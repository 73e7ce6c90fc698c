"""Exploration (issue 19, "total bytes no larger than INT8's"): the page range in one byte a bound.

Every page sends each channel's min and max (``gamma``) in the KV dtype: 2 x 16 bits per channel
per 256 tokens, 0.125 bits per value, the largest cost left after the scalars. Here each bound is
rounded *outward* (min down, max up, so nothing leaves [0, 1] after normalising) onto an 8-bit
grid relative to a power of two per page and head, S = 2^ceil(log2 max |bound|) over the head's
channels (one byte more per page and head: ~0.0005 bits per value):

  fp   sign + e e-bit exponent + m-bit mantissa (e + m = 7), |bound| / S in
       {0} u {2^(k - 2^e + 1) (1 + j / 2^m)} (subnormals below), the grid's largest level >= 1
  int  sign + 7 bits uniform: bound / S in {j / 127} (shows why the grid has to be relative)
  g8   as fp, but one S per 8 neighbouring channels of a page (what a kernel strip can compute:
       a multiple of 8 channels), one byte per 8 channels (~0.004 bits per value)

The codes are then computed against the rounded range, as the quantizer would if the kernels
rounded it, and both stages decode with it. Bits: the ``lynx`` row's less 0.0625 (half of
gamma's 0.125), plus the head byte. Results: docs/codec.md "The page range in one byte".

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python docs/experiments/gamma_byte_probe.py \\
        --tokens 4096 --queries 256 --quiet --out docs/results/gamma_byte_probe_smollm2.json
    (--widening: only how much e3m4 per 8 channels widens the page ranges, K and V; JSON
    docs/results/gamma_byte_widening_{smollm2,gemma3}.json with --queries 1)
"""
from __future__ import annotations

import argparse
import json

import torch

import lynx_npu
from lynx_npu.codec import lynx_ref
from lynx_npu.eval.evaluate import evaluate_codec
from lynx_npu.eval.kv_source import add_capture_arguments, capture_from_args
from lynx_npu.eval.model import MODELS

exact_range = lynx_ref.page_range


def fp_levels(e_bits: int, m_bits: int) -> torch.Tensor:
    """Non-negative magnitudes of a sign + e + m float, largest exponent 2^0 (so top >= 1)."""
    levels = [j / 2 ** m_bits * 2.0 ** (1 - 2 ** e_bits + 1) for j in range(2 ** m_bits)]  # subnormal
    for k in range(1, 2 ** e_bits):
        levels += [2.0 ** (k - 2 ** e_bits + 1) * (1 + j / 2 ** m_bits) for j in range(2 ** m_bits)]
    return torch.tensor(sorted(set(levels)), dtype=torch.float64)


def int_levels() -> torch.Tensor:
    return torch.arange(128, dtype=torch.float64) / 127


def outward(gmin: torch.Tensor, gmax: torch.Tensor, levels: torch.Tensor, group: int | None = None):
    """Round [gmin, gmax] (each [n, H, 1, D] float32) outward onto levels * S, one S per page and
    head (group None) or per ``group`` neighbouring channels."""
    amax = torch.maximum(gmin.abs(), gmax.abs()).double()
    if group is None:
        amax = amax.amax(dim=-1, keepdim=True)
    else:
        shape = amax.shape
        amax = amax.reshape(*shape[:-1], -1, group).amax(dim=-1, keepdim=True)
        amax = amax.expand(*shape[:-1], shape[-1] // group, group).reshape(shape)
    scale = torch.where(amax > 0, torch.exp2(torch.ceil(torch.log2(amax.clamp_min(1e-30)))), 1.0)
    lv = levels.to(gmin.device)

    def up(t):     # smallest grid value >= t (t in [-1, 1])
        pos = lv[torch.searchsorted(lv, t.clamp_min(0), right=False).clamp_max(len(lv) - 1)]
        neg = -lv[(torch.searchsorted(lv, (-t).clamp_min(0), right=True) - 1).clamp_min(0)]
        return torch.where(t >= 0, pos, neg)

    lo = -up(-gmin.double() / scale) * scale
    hi = up(gmax.double() / scale) * scale
    assert bool((lo <= gmin.double()).all()) and bool((hi >= gmax.double()).all())
    return lo.float(), hi.float()


def widening(refs, levels: torch.Tensor, group: int | None, page: int = 256, sinks: int = 4) -> dict:
    """How much the rounded range widens each page channel's (rounded width / exact width) over
    the whole pages of every layer, K and V: mean and quantiles."""
    out = {}
    for which in "kv":
        ratios = []
        for ref in refs:
            x = getattr(ref, which).float()  # [H, T, D]
            h, t, d = x.shape
            n = (t - sinks) // page
            pages = x[:, sinks:sinks + n * page].reshape(h, n, page, d).transpose(0, 1)
            gmin, gmax = exact_range(pages)
            lo, hi = outward(gmin, gmax, levels, group)
            w, wr = (gmax - gmin).flatten(), (hi - lo).flatten()
            ratios.append((wr / w)[w > 0])
        r = torch.cat(ratios).double()
        q = torch.quantile(r, torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64)).tolist()
        out[which] = {"mean": r.mean().item(), "median": q[0], "p90": q[1], "p99": q[2],
                      "max": r.max().item()}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_capture_arguments(p)
    p.add_argument("--variants", default="default,plan",
                   help="lynx variants: default, plan (the model's lynx_plan), v64 (V chunks of 64)")
    p.add_argument("--grids", default=None, help="comma-separated subset of the grids")
    p.add_argument("--widening", action="store_true",
                   help="only how much e3m4 per 8 channels widens the page ranges")
    p.add_argument("--out", default="/tmp/gamma_byte_probe.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    cap = capture_from_args(args)
    if args.widening:
        res = widening(cap.refs, fp_levels(3, 4), 8)
        print(json.dumps(res, indent=1))
        json.dump({"meta": cap.meta, "widening_e3m4_g8": res}, open(args.out, "w"), indent=1)
        return
    grids = {"exact": None, "e4m3": (fp_levels(4, 3), None), "e3m4": (fp_levels(3, 4), None),
             "e5m2": (fp_levels(5, 2), None), "int7": (int_levels(), None),
             "e3m4 g8": (fp_levels(3, 4), 8), "e4m3 g8": (fp_levels(4, 3), 8),
             "int7 g8": (int_levels(), 8)}
    if args.grids:
        grids = {k: v for k, v in grids.items() if k in args.grids.split(",")}
    res = {}
    variants = {"default": {}, "plan": dict(MODELS[args.model].lynx_plan), "v64": {"v_chunk_size": 64}}
    for spec in ["int8"] + args.variants.split(","):
        for name, levels in grids.items():
            if spec == "int8" and levels is not None:
                continue
            lynx_ref.page_range = exact_range if levels is None else (
                lambda x, lv=levels: outward(*exact_range(x), *lv))
            codec = lynx_npu.get_codec("int8") if spec == "int8" else lynx_npu.get_codec(
                "lynx", **variants[spec])
            label = f"{spec} {name}"
            r = evaluate_codec(codec, cap.refs, label=label, split_stages=tuple(codec.stages))
            res[label] = {st.stage: {k: v for k, v in st.summary().items()
                                     if not k.startswith("per_layer")} for st in r.stages}
            print(f"{label:60s}", "  ".join(f"{st}: {d['bits_per_value']:.4f} {d['attn_vnmse']:.3e}"
                                            for st, d in res[label].items()), flush=True)
    lynx_ref.page_range = exact_range
    json.dump({"meta": cap.meta, "results": res}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
