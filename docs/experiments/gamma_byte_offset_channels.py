"""Which page channels does the one-byte page range widen? (docs/codec.md "The page range in one
byte".) Rounding a bound outward to 5 significant bits of its own power of two moves it by up to
~3% of |bound|, so a channel far from zero (|midpoint| large against its span max - min, as in
K's massive channels) widens by |midpoint| / span times that. Per QMSum prompt: prefill
exactly, cut every layer's K and V into pages of 256 tokens after the 4 sinks, and report the
widening (rounded span / exact span) binned by offset = |midpoint| / span, with each bin's share
of the page channels and of the attention logits' weight (the channel's mean |K| squared, K only).

    python docs/experiments/gamma_byte_offset_channels.py --prompts 35 --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from lynx_npu.eval import accept_cmd  # noqa: E402
from lynx_npu.eval.accept import cast, prefill  # noqa: E402
from lynx_npu.eval.model import load_model  # noqa: E402

import gamma_byte_probe as gb  # noqa: E402

BINS = (0.0, 0.5, 1.0, 2.0, float("inf"))  # offset = |midpoint| / span


def page_channels(x: torch.Tensor, levels, group: int, page: int = 256, sinks: int = 4):
    """x [H, T, D] -> (offset, widening, mean square) per page channel, flattened."""
    h, t, d = x.shape
    n = (t - sinks) // page
    pages = x.float()[:, sinks:sinks + n * page].reshape(h, n, page, d).transpose(0, 1)
    gmin, gmax = gb.exact_range(pages)
    lo, hi = gb.outward(gmin, gmax, levels, group)
    span = gmax - gmin
    keep = (span > 0).flatten()
    offset = ((gmax + gmin).abs() / 2 / span).flatten()[keep]
    widening = ((hi - lo) / span).flatten()[keep]
    power = pages.pow(2).mean(dim=2, keepdim=True).flatten()[keep]
    return offset, widening, power


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prompts", type=int, default=35)
    p.add_argument("--qmsum-tokens", type=int, default=3072)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    levels = gb.fp_levels(3, 4)
    loaded = load_model(args.model)
    paths = accept_cmd.data_paths(argparse.Namespace(qmsum=None, mmlu_pro=None,
                                                     workloads="qmsum"))
    prompts = accept_cmd.qmsum_prompts(paths["qmsum"], loaded.tokenizer, args.prompts,
                                       args.qmsum_tokens)
    acc = {w: [] for w in "kv"}
    for n, (prompt_id, ids) in enumerate(prompts, 1):
        layers = cast(prefill(loaded.model, torch.tensor(ids, dtype=torch.int64)).layers,
                      torch.bfloat16)
        for k, v in layers:
            acc["k"].append(page_channels(k, levels, args.group))
            acc["v"].append(page_channels(v, levels, args.group))
        print(f"{n}/{len(prompts)} {prompt_id}", file=sys.stderr, flush=True)
    report = {"model": args.model, "prompts": len(prompts), "group": args.group, "grid": "e3m4",
              "bins": [list(b) for b in zip(BINS[:-1], BINS[1:])], "k": [], "v": []}
    for which in "kv":
        offset, widening, power = (torch.cat(t).double() for t in zip(*acc[which]))
        for lo, hi in zip(BINS[:-1], BINS[1:]):
            sel = (offset >= lo) & (offset < hi)
            w = widening[sel]
            report[which].append({
                "offset": [lo, hi], "channels": float(sel.double().mean()),
                "power": float(power[sel].sum() / power.sum()),
                "widening_mean": float(w.mean()) if w.numel() else None,
                "widening_p99": float(torch.quantile(w, 0.99)) if w.numel() else None,
                "widening_max": float(w.max()) if w.numel() else None})
        print(which.upper(), json.dumps(report[which], indent=None))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
