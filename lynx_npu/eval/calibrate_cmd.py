"""``lynx calibrate``: a model's Lynx plan (``lynx_plan``): the layers whose anchor it needs
wider (``layer_anchor_bits``) and, with ``--v-chunk-size``, larger V chunks in the layers that
bear them (``v_chunk_size`` and ``layer_v_chunk_size``).

    lynx calibrate --model smollm2 --json plan.json [--layers 2] [--part k] [--v-chunk-size 64]

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

V chunks (``--v-chunk-size N``): V's chunk scalars cost as much anchor as K's, and chunks of a
whole head_dim (64 on SmolLM2) take 0.127 bits per value off the anchor, but raise the full
stage's error most in a few layers (docs/codec.md, "V's chunk size by layer"). Per calibration
prompt, every layer's full-stage attention vNMSE (the last 256 queries) with V chunks of 32 and
of N; the plan takes N everywhere but in the layers where it costs most, until the mean over
layers is within ``--v-full-margin`` (5%) of the chunks of 32.

The JSON holds the plan (``lynx_plan``: Lynx codec parameters, for ``kv_connector_extra_config``
and ``lynx eval ... --codec-arg``), the rankings and every prompt's numbers.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

from ..cli_types import int_in, names, number_in, output_file
from ..codec.lynx_config import describe_plan
from .progress import log, muted, set_enabled

EVAL_QMSUM, EVAL_MMLU_SMALL, EVAL_MMLU = 35, 40, 120   # the eval sets the prompts avoid


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2",
                        help="a bundled model (smollm2, the default; gemma3) or a Hugging Face "
                             "model directory (the one vllm serve is given)")
    parser.add_argument("--json", dest="json_path", type=output_file, required=True,
                        help="where the plan and the ranking go")
    parser.add_argument("--layers", type=int_in(1, 64), default=2,
                        help="at most this many layers to widen (default 2)")
    parser.add_argument("--budget", type=number_in(2.0, 16.0), default=4.75,
                        help="the widened anchor's mean bits per value stay within this")
    parser.add_argument("--part", choices=("k", "kv"), default="k",
                        help="widen K's anchor (default) or K's and V's")
    parser.add_argument("--v-chunk-size", type=int_in(2, 1024), default=None,
                        help="V chunks of this size where the full stage bears them (off)")
    parser.add_argument("--v-full-margin", type=number_in(0.0, 10.0), default=0.05,
                        help="the full stage's mean attention vNMSE stays within this much of "
                             "V chunks of 32 (default 0.05)")
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


def keep_v_chunks(base: list[float], wide: list[float], margin: float) -> list[int]:
    """The layers that keep the base V chunks, in layer order: those where the wider chunks
    raise the full stage's error (``wide`` against ``base``, per layer) most, until the mean
    over layers is within ``1 + margin`` of the base's."""
    cur, keep = list(wide), []
    target = (1 + margin) * statistics.fmean(base)
    for i in sorted(range(len(base)), key=lambda i: base[i] - wide[i]):
        if statistics.fmean(cur) <= target:
            break
        cur[i] = base[i]
        keep.append(i)
    return sorted(keep)


def full_stage_errors(model, ids, codecs: list, queries: int = 256) -> list[tuple]:
    """Per codec: (each layer's full-stage attention vNMSE, anchor bits per value) on the KV
    of ``ids`` (bf16, as deployed)."""
    import torch

    from .capture import capture_qkv
    from .evaluate import build_refs, evaluate_codec

    refs = build_refs(capture_qkv(model, ids, keep_last_queries=min(queries, len(ids))),
                      queries, torch.bfloat16)
    out = []
    for codec in codecs:
        with muted():  # the prompt's line says how far calibration is
            stages = {s.stage: s for s in evaluate_codec(codec, refs).stages}
        out.append((stages["full"].per_layer_attn_vnmse, stages["anchor"].bits_per_value))
    return out


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
            if args.v_chunk_size:
                (base_err, base_bits), (wide_err, wide_bits) = full_stage_errors(
                    loaded.model, torch.tensor(ids, dtype=torch.int64),
                    [base, lynx_npu.get_codec("lynx", v_chunk_size=args.v_chunk_size)])
                rows[-1].update(full_vnmse=base_err, full_vnmse_wide=wide_err,
                                anchor_bits_wide=wide_bits)
            top = sorted(range(len(per_layer)), key=lambda i: -per_layer[i])[:3]
            log(f"{workload} {n}/{len(prompts)} ({pid}, {len(ids)} tokens): anchor KL "
                f"{whole:.2e}, worst layers {top}")
    nl = len(rows[0]["per_layer"])
    share = [statistics.fmean(r["per_layer"][i] / r["all"] for r in rows) for i in range(nl)]
    bits = statistics.fmean(r["anchor_bits"] for r in rows)
    lynx_plan, v_report, planned = {}, {}, bits
    if args.v_chunk_size:
        base_err = [statistics.fmean(r["full_vnmse"][i] for r in rows) for i in range(nl)]
        wide_err = [statistics.fmean(r["full_vnmse_wide"][i] for r in rows) for i in range(nl)]
        keep = keep_v_chunks(base_err, wide_err, args.v_full_margin)
        wide_bits = statistics.fmean(r["anchor_bits_wide"] for r in rows)
        planned = bits + (nl - len(keep)) / nl * (wide_bits - bits)
        lynx_plan = {"v_chunk_size": args.v_chunk_size,
                     "layer_v_chunk_size": [[i, base.config.v_chunk_size] for i in keep]}
        mean = statistics.fmean([base_err[i] if i in keep else wide_err[i] for i in range(nl)])
        v_report = {"full_vnmse": base_err, "full_vnmse_wide": wide_err,
                    "planned_full_vs_base": mean / statistics.fmean(base_err)}
    num = layers_within(args.budget, planned, nl, args.part, args.layers)
    plan = plan_of(share, num, args.part, base.config)
    planned += len(plan) * (1.0 if args.part == "kv" else 0.5) / nl
    lynx_plan = {"layer_anchor_bits": plan, **lynx_plan} if plan else lynx_plan
    report = {"command": "lynx " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["calibrate"]
              else None, "model": args.model, "part": args.part,
              "lynx_plan": lynx_plan, "anchor_bits": bits, "planned_anchor_bits": planned,
              "order": sorted(range(nl), key=lambda i: -share[i]), "share": share, **v_report,
              "rows": rows, "total_s": time.perf_counter() - t0}
    pathlib.Path(args.json_path).write_text(json.dumps(report, indent=1))
    print(f"lynx_plan {json.dumps(lynx_plan)}: {describe_plan(lynx_plan)} (layers by share of "
          f"the anchor KL: " + ", ".join(f"{i} {share[i]:.2f}" for i in report["order"][:args.layers + 2])
          + (f"; the full stage's attention vNMSE {v_report['planned_full_vs_base']:.3f}x V "
             f"chunks of {base.config.v_chunk_size}'s" if v_report else "")
          + f"; anchor {bits:.3f} -> {planned:.3f} bits per value, budget {args.budget}); "
          f"written to {args.json_path}")
    return 0
