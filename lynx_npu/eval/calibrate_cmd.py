"""``lynx calibrate``: the layers whose anchor a model needs wider (its ``layer_anchor_bits``).

    lynx calibrate --model smollm2 --json plan.json [--layers 2] [--part k]

Drafts break where the anchor's error moves the model's next-token distribution most, and for
SmolLM2 that is a few layers (docs/codec.md, "Where the anchor's KL sits"). Per calibration
prompt: prefill exactly, decode the exact greedy continuation, then for each layer alone the
KL(exact || cache) along it (teacher forcing) of a cache that is exact but for that layer,
which holds the default ``lynx`` anchor. Layers are ranked by their mean share of the
all-layer anchor KL; the top ones get one more anchor bit, K's alone (``--part k``: the damage
measured is K's, and half the bytes) or K's and V's: as many as ``--layers`` allows and the
anchor's mean bits per value on the calibration prompts stay within ``--budget`` (4.75, issue
19's; Gemma 3's 18 layers pay 0.028 bits each for K, so it gets one).

Calibration prompts are held out from ``lynx eval accept``'s default sets: the last
``--qmsum-prompts`` of the first 35 usable QMSum meetings, and the first ``--mmlu-prompts``
MMLU-Pro questions of the 120-question set that the 40-question set does not hold.

The JSON holds the plan (``layer_anchor_bits``) for ``kv_connector_extra_config`` and
``--codec-arg 'lynx:layer_anchor_bits=[...]'``, the ranking and every prompt's numbers.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

from ..cli_types import int_in, names, output_file
from .progress import log, set_enabled

EVAL_QMSUM, EVAL_MMLU_SMALL, EVAL_MMLU = 35, 40, 120   # the eval sets the prompts avoid


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="model (default smollm2)")
    parser.add_argument("--json", dest="json_path", type=output_file, required=True,
                        help="where the plan and the ranking go")
    parser.add_argument("--layers", type=int_in(1, 64), default=2,
                        help="at most this many layers to widen (default 2)")
    parser.add_argument("--budget", type=float, default=4.75,
                        help="the widened anchor's mean bits per value stay within this")
    parser.add_argument("--part", choices=("k", "kv"), default="k",
                        help="widen K's anchor (default) or K's and V's")
    parser.add_argument("--workloads", type=names(("qmsum", "mmlu_pro"), "workload"),
                        default="qmsum,mmlu_pro")
    parser.add_argument("--qmsum-prompts", type=int_in(1, EVAL_QMSUM), default=7)
    parser.add_argument("--mmlu-prompts", type=int_in(1, EVAL_MMLU - EVAL_MMLU_SMALL), default=8)
    parser.add_argument("--qmsum-tokens", type=int_in(64, 1 << 20), default=3072)
    parser.add_argument("--new-tokens", type=int_in(1, 4096), default=64)
    parser.add_argument("--qmsum", default=None, help="QMSum val.jsonl (default: LYNX_DATA)")
    parser.add_argument("--mmlu-pro", default=None, help="MMLU-Pro jsonl (default: LYNX_DATA)")
    parser.add_argument("--threads", type=int_in(1, 1024), default=None)
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def calibration_prompts(loaded, paths: dict, workload: str, args) -> list:
    from .accept_cmd import mmlu_pro_prompts, qmsum_prompts

    tok = loaded.tokenizer
    if workload == "qmsum":
        return qmsum_prompts(paths["qmsum"], tok, EVAL_QMSUM, args.qmsum_tokens)[
            EVAL_QMSUM - args.qmsum_prompts:]
    tested = {pid for pid, _ in mmlu_pro_prompts(paths["mmlu_pro"], tok, EVAL_MMLU_SMALL, 5)}
    return [p for p in mmlu_pro_prompts(paths["mmlu_pro"], tok, EVAL_MMLU, 5)
            if p[0] not in tested][:args.mmlu_prompts]


def layer_kl(model, exact, anchor, fed, batch: int = 8) -> tuple[float, list[float]]:
    """(KL of the all-anchor cache, KL of each one-layer-anchor cache) along ``fed``."""
    from .accept import divergence

    variants = [anchor] + [[anchor[i] if i == layer else exact[i] for i in range(len(exact))]
                           for layer in range(len(exact))]
    kl = []
    for i in range(0, len(variants), batch):
        kl += divergence(model, [exact] + variants[i:i + batch], fed)[1:]
    return kl[0], kl[1:]


def layers_within(budget: float, bits: float, num_layers: int, part: str, most: int) -> int:
    """How many layers can widen (one more bit for K, half the values, or K and V) while an
    anchor of ``bits`` per value stays within ``budget``."""
    per_layer = (1.0 if part == "kv" else 0.5) / num_layers
    return max(0, min(most, int((budget - bits) / per_layer + 1e-9)))


def plan_of(share: list[float], num: int, part: str, base) -> list[list[int]]:
    """The ``num`` layers of largest share, in layer order, with one more anchor bit."""
    top = sorted(sorted(range(len(share)), key=lambda i: -share[i])[:num])
    k, v = base.anchor_bits + 1, base.v_anchor_bits + (part == "kv")
    return [[i, k, v] for i in top]


def run(args: argparse.Namespace) -> int:
    import lynx_npu
    import torch

    from .accept import EXACT, greedy_decode, prepare
    from .accept_cmd import data_paths
    from .model import load_model

    t0 = time.perf_counter()
    set_enabled(not args.quiet)
    paths = data_paths(argparse.Namespace(qmsum=args.qmsum, mmlu_pro=args.mmlu_pro,
                                          workloads=args.workloads))
    if args.threads:
        torch.set_num_threads(args.threads)
    base = lynx_npu.get_codec("lynx")
    log(f"loading model {args.model!r} ...")
    loaded = load_model(args.model)
    rows = []
    for workload in args.workloads.split(","):
        prompts = calibration_prompts(loaded, paths, workload, args)
        for n, (pid, ids) in enumerate(prompts, 1):
            prep = prepare(loaded.model, torch.tensor(ids, dtype=torch.int64),
                           [("lynx", base)], torch.bfloat16)
            exact, anchor = prep.variants["", EXACT], prep.variants["lynx", "anchor"]
            if args.layers > len(exact):
                raise ValueError(f"--layers {args.layers}: the model has {len(exact)} layers")
            cont = greedy_decode(loaded.model, [exact], prep.first_token, args.new_tokens)[0]
            whole, per_layer = layer_kl(loaded.model, exact, anchor,
                                        [prep.first_token] + cont[:-1])
            rows.append({"workload": workload, "id": pid, "tokens": len(ids), "all": whole,
                         "per_layer": per_layer, "anchor_bits": prep.bits["lynx"]["anchor"]})
            top = sorted(range(len(per_layer)), key=lambda i: -per_layer[i])[:3]
            log(f"{workload} {n}/{len(prompts)} ({pid}, {len(ids)} tokens): anchor KL "
                f"{whole:.2e}, worst layers {top}")
    nl = len(rows[0]["per_layer"])
    share = [statistics.fmean(r["per_layer"][i] / r["all"] for r in rows) for i in range(nl)]
    bits = statistics.fmean(r["anchor_bits"] for r in rows)
    num = layers_within(args.budget, bits, nl, args.part, args.layers)
    plan = plan_of(share, num, args.part, base.config)
    report = {"command": "lynx " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["calibrate"]
              else None, "model": args.model, "part": args.part,
              "layer_anchor_bits": plan, "anchor_bits": bits,
              "planned_anchor_bits": bits + len(plan) * (1.0 if args.part == "kv" else 0.5) / nl,
              "order": sorted(range(nl), key=lambda i: -share[i]), "share": share,
              "rows": rows, "total_s": time.perf_counter() - t0}
    pathlib.Path(args.json_path).write_text(json.dumps(report, indent=1))
    print(f"layer_anchor_bits {json.dumps(plan)} (layers by share of the anchor KL: "
          + ", ".join(f"{i} {share[i]:.2f}" for i in report["order"][:args.layers + 2])
          + f"; anchor {bits:.3f} -> {report['planned_anchor_bits']:.3f} bits per value, budget "
          f"{args.budget}); written to {args.json_path}")
    return 0
