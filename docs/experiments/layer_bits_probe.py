"""Exploration (issue 19): is the anchor's KL concentrated in a few layers, so that a 5-bit anchor
in those layers alone (a few hundredths of a bit per value on average) cuts it by the ~3x that
moves draft acceptance?

Phase 1 (``--rank``): on held-out prompts (QMSum meetings 28-34, MMLU-Pro questions of the
120-question set that the 40-question set does not test), the KL(exact || cache) along the exact
64-token greedy continuation (teacher forcing, as anchor_kl_probe.py) of caches that are exact
except one layer, which holds the default ``lynx`` anchor: one number per layer and prompt.
Layers are ranked by their mean share of the all-layer anchor KL.

Phase 2 (``--test``): on the acceptance sets (QMSum meetings 0-19, MMLU-Pro 40), the KL of the
default anchor against the anchor whose ``k`` top-ranked layers (from ``--order``) come from
``lynx:anchor_bits=5`` (5 + 3 split), for each ``k`` of ``--ks``, with the bits per value.

    python docs/experiments/layer_bits_probe.py --rank --json RANK.json
    python docs/experiments/layer_bits_probe.py --test --order 3,10,4 --ks 1,2,3 --json TEST.json
    python docs/experiments/layer_bits_probe.py --accept --order 3,10,4 --ks 1,2 \
        [every other option of lynx eval accept: --workloads, --prompts, --json, ...]

Phase 3 (``--accept``): ``lynx eval accept`` with codecs ``lynx+L{k}`` (the top ``k`` layers of
``--order`` from ``lynx:anchor_bits=5``, both stages, the other layers from ``lynx``; with
``--part k``, ``lynx+L{k}K``: only those layers' K from it).

Results: docs/codec.md "Where the anchor's KL sits, by layer".
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch

import lynx_npu
from lynx_npu.eval import accept_cmd
from lynx_npu.eval.accept import EXACT, divergence, greedy_decode, prepare
from lynx_npu.eval.model import load_model


def _prompts(loaded, paths, workload: str, which: str):
    tok = loaded.tokenizer
    if workload == "qmsum":
        ps = accept_cmd.qmsum_prompts(paths["qmsum"], tok, 35, 3072)
        return ps[28:] if which == "rank" else ps[:20]
    if which == "test":
        return accept_cmd.mmlu_pro_prompts(paths["mmlu_pro"], tok, 40, 5)
    tested = {pid for pid, _ in accept_cmd.mmlu_pro_prompts(paths["mmlu_pro"], tok, 40, 5)}
    return [p for p in accept_cmd.mmlu_pro_prompts(paths["mmlu_pro"], tok, 120, 5)
            if p[0] not in tested][:8]


class _Pair:
    """Both codecs' encodings of one layer; bytes: the base's plus ``share`` of the difference."""

    def __init__(self, base, five, share: float):
        self.base, self.five, self.share = base, five, share

    def nbytes(self, stage: str) -> int:
        b = self.base.nbytes(stage)
        return b + round(self.share * (self.five.nbytes(stage) - b))


class PartWide:
    """One layer's codec: K or V (``part``) from the 5 + 3 split, the other from the default."""

    def __init__(self, base, five, part: str):
        self.base, self.five, self.part = base, five, part
        self.name, self.stages = base.name, base.stages

    def encode(self, k, v):
        return _Pair(self.base.encode(k, v), self.five.encode(k, v), 0.5)

    def decode(self, enc: _Pair, stage: str):
        kb, vb = self.base.decode(enc.base, stage=stage)
        kf, vf = self.five.decode(enc.five, stage=stage)
        return (kf, vb) if self.part == "k" else (kb, vf)


class LayerBits:
    """``lynx`` with the 5 + 3 split in ``layers`` (K and V, or ``part`` alone); the accept
    harness asks ``for_layer``."""

    def __init__(self, layers, part: str = "kv"):
        self.layers, self.part = set(layers), part
        self.base, self.five = lynx_npu.get_codec("lynx"), lynx_npu.get_codec("lynx", anchor_bits=5)
        self.name, self.stages = self.base.name, self.base.stages
        self.wide = self.five if part == "kv" else PartWide(self.base, self.five, part)

    def params(self) -> dict:
        return {**self.base.params(), "anchor_bits_5_layers": sorted(self.layers),
                "anchor_bits_5_part": self.part}

    def for_layer(self, index: int, num_layers: int):
        return self.wide if index in self.layers else self.base


def _kl(model, reference, variants, fed, batch: int = 8) -> list[float]:
    out = []
    for i in range(0, len(variants), batch):
        out += divergence(model, [reference] + variants[i:i + batch], fed)[1:]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--rank", action="store_true")
    mode.add_argument("--test", action="store_true")
    mode.add_argument("--accept", action="store_true")
    p.add_argument("--order", default="", help="layers, most sensitive first (phase 2)")
    p.add_argument("--ks", default="1,2,3")
    p.add_argument("--part", choices=("kv", "k", "v"), default="kv",
                   help="--test: widen K and V of those layers, or only K, or only V (bits "
                        "charged: half the layer's difference for one part)")
    p.add_argument("--workloads", default="qmsum,mmlu_pro")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    args, rest = p.parse_known_args()
    if args.accept:
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
        from recent_window_probe import _Spec, run_accept
        order = [int(x) for x in args.order.split(",") if x]
        tag = "" if args.part == "kv" else args.part.upper()
        specs = [_Spec(f"lynx+L{k}{tag}", lambda k=k: LayerBits(order[:k], args.part))
                 for k in (int(x) for x in args.ks.split(",") if x)]
        rest += ["--workloads", args.workloads, "--threads", str(args.threads),
                 "--new-tokens", str(args.new_tokens)] + (["--json", args.json] if args.json else [])
        return run_accept(specs, rest, "layer_bits_probe")
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    torch.set_num_threads(args.threads)
    loaded = load_model("smollm2")
    paths = accept_cmd.data_paths(argparse.Namespace(qmsum=None, mmlu_pro=None,
                                                     workloads=args.workloads))
    codecs = [("lynx", lynx_npu.get_codec("lynx"))]
    if args.test:
        codecs.append(("lynx5", lynx_npu.get_codec("lynx", anchor_bits=5)))
        order = [int(x) for x in args.order.split(",") if x]
        ks = [int(x) for x in args.ks.split(",") if x]
    t0, rows = time.perf_counter(), []
    for workload in args.workloads.split(","):
        prompts = _prompts(loaded, paths, workload, "rank" if args.rank else "test")
        for n, (pid, ids) in enumerate(prompts, 1):
            prep = prepare(loaded.model, torch.tensor(ids, dtype=torch.int64), codecs,
                           torch.bfloat16)
            exact, anchor = prep.variants["", EXACT], prep.variants["lynx", "anchor"]
            cont = greedy_decode(loaded.model, [exact], prep.first_token, args.new_tokens)[0]
            fed = [prep.first_token] + cont[:-1]
            row = {"workload": workload, "id": pid, "tokens": len(ids)}
            if args.rank:
                variants = [anchor] + [[anchor[i] if i == layer else exact[i]
                                        for i in range(len(exact))]
                                       for layer in range(len(exact))]
                kl = _kl(loaded.model, exact, variants, fed)
                row.update(all=kl[0], per_layer=kl[1:])
                top = sorted(range(len(exact)), key=lambda i: -kl[1 + i])[:5]
                note = f"all {kl[0]:.2e}, top layers {top}"
            else:
                five = prep.variants["lynx5", "anchor"]
                b4, b5 = prep.bits["lynx"]["anchor"], prep.bits["lynx5"]["anchor"]
                def widen(i):
                    if args.part == "kv":
                        return five[i]
                    return (five[i][0], anchor[i][1]) if args.part == "k" else \
                        (anchor[i][0], five[i][1])
                share = 1.0 if args.part == "kv" else 0.5   # K and V have as many values
                variants = [anchor] + [[widen(i) if i in order[:k] else anchor[i]
                                        for i in range(len(exact))] for k in ks]
                kl = _kl(loaded.model, exact, variants, fed)
                nl = len(exact)
                row.update(kl={"default": kl[0], **{f"top{k}": v for k, v in zip(ks, kl[1:])}},
                           bits={"default": b4, **{f"top{k}": b4 + share * k * (b5 - b4) / nl
                                                   for k in ks}})
                note = ", ".join(f"{k} {v:.2e}" for k, v in row["kl"].items())
            rows.append(row)
            print(f"{workload} {n}/{len(prompts)} {pid}: {note}", flush=True)
    report = {"mode": "rank" if args.rank else "test", "part": args.part, "rows": rows,
              "total_s": time.perf_counter() - t0}
    if args.rank:
        nl = len(rows[0]["per_layer"])
        share = [statistics.fmean(r["per_layer"][i] / r["all"] for r in rows) for i in range(nl)]
        report["share"] = share
        report["order"] = sorted(range(nl), key=lambda i: -share[i])
        report["sum_of_layers_over_all"] = statistics.fmean(sum(r["per_layer"]) / r["all"]
                                                            for r in rows)
        print("order", report["order"][:8], "shares",
              [round(share[i], 3) for i in report["order"][:8]],
              "sum/all %.2f" % report["sum_of_layers_over_all"])
    else:
        report["order"], report["ks"] = order, ks
        for w in args.workloads.split(","):
            mine = [r for r in rows if r["workload"] == w]
            for key in mine[0]["kl"]:
                ratio = statistics.fmean(r["kl"][key] for r in mine) / \
                    statistics.fmean(r["kl"]["default"] for r in mine)
                lower = sum(r["kl"][key] < r["kl"]["default"] for r in mine)
                bits = statistics.fmean(r["bits"][key] for r in mine)
                print(f"{w} {key}: KL {ratio:.3f}x of the default, lower on {lower}/{len(mine)}, "
                      f"anchor {bits:.3f} bits/value")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
