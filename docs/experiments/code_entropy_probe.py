"""Would entropy coding shrink Lynx's streams?  Order-0 empirical entropy of the default
codec's anchor and residual codes on real KV (issue 19's bytes question; docs/codec.md
"Entropy of the codes").

    python docs/experiments/code_entropy_probe.py --tokens 2048 --queries 16 --out OUT.json

Quantizes each captured layer's body (the tokens after the sinks, whole pages of
``page_size``) with the reference quantizer (lynx_ref.quantize, the default ``lynx`` config)
and reports, per K/V and stream, the entropy in bits per value of the code histogram taken
globally, per page, per page and head, and per page and channel (the last is a lower bound
for a coder with one table per channel per page, before the tables' own cost).
"""
import argparse, json, math, sys, time
import torch
import lynx_npu
from lynx_npu.codec import lynx_ref
from lynx_npu.eval.kv_source import add_capture_arguments, capture_from_args

def H(counts):
    p = counts[counts > 0].double() / counts.sum()
    return float(-(p * p.log2()).sum())

def main():
    ap = argparse.ArgumentParser(); add_capture_arguments(ap); ap.add_argument("--out")
    args = ap.parse_args(); torch.set_num_threads(1)
    cap = capture_from_args(args)
    cfg = lynx_npu.get_codec("lynx").config
    P, S = cfg.page_size, cfg.num_sink_tokens
    tot = {}
    for ref in cap.refs:
        for which, x in (("k", ref.k), ("v", ref.v)):
            body = x[:, S:, :]
            n = body.shape[1] // P
            pages = body[:, :n * P, :].reshape(body.shape[0], n, P, body.shape[2]).permute(1, 0, 2, 3)
            a, r, g, st = lynx_ref.quantize(pages, cfg, which)
            for name, codes in (("anchor", a), ("residual", r)):
                c = codes - codes.min()
                d = tot.setdefault((which, name), {"bits_page": 0.0, "bits_page_head": 0.0, "bits_global": torch.zeros(64, dtype=torch.long), "n": 0, "bits_chan": 0.0})
                for i in range(c.shape[0]):
                    cnt = torch.bincount(c[i].reshape(-1), minlength=64)
                    d["bits_page"] += H(cnt) * c[i].numel()
                    for h in range(c.shape[1]):
                        d["bits_page_head"] += H(torch.bincount(c[i, h].reshape(-1), minlength=64)) * c[i, h].numel()
                    for ch in range(c.shape[3]):
                        col = c[i, :, :, ch]
                        d["bits_chan"] += H(torch.bincount(col.reshape(-1), minlength=64)) * col.numel()
                d["bits_global"] += torch.bincount(c.reshape(-1), minlength=64)
                d["n"] += c.numel()
    out = {}
    for (which, name), d in tot.items():
        out[f"{which}_{name}"] = {"order0_global": H(d["bits_global"]), "order0_per_page": d["bits_page"] / d["n"],
                                  "order0_per_page_head": d["bits_page_head"] / d["n"],
                                  "order0_per_page_channel": d["bits_chan"] / d["n"], "values": d["n"],
                                  "hist": (d["bits_global"][d["bits_global"] > 0]).tolist()}
        print(which, name, {k: round(v, 3) if isinstance(v, float) else v for k, v in out[f"{which}_{name}"].items() if k != "hist"})
    if args.out: json.dump({"meta": cap.meta, "config": str(cfg), "entropy": out}, open(args.out, "w"), indent=1)

main()
