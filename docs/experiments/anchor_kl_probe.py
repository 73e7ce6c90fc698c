"""A low-variance stand-in for draft acceptance (issue 19): how far does each anchor move the
model's next-token distribution along the exact continuation?

Draft acceptance on 20-40 prompts resolves differences of ~0.1 only: a prompt's accepted
length is decided by its first near-tie token, so two anchors of the same error flip single
prompts both ways (docs/codec.md). This probe measures what acceptance samples: per prompt,
prefill exactly, decode N greedy tokens from the exact cache, then feed those N tokens once
(teacher forcing) through every variant's anchor-stage cache and compare, position by position,
its next-token distribution with the exact cache's: KL(exact || anchor), top-1 agreement, and
the first disagreement (the accepted length against the exact target). Each prompt gives N
paired positions, so per-prompt means compare two anchors on the same tokens.

    python docs/experiments/anchor_kl_probe.py --variants "lynx,once8 C32/32 P256 half" \\
        --workloads mmlu_pro,qmsum --prompts 20 --new-tokens 64 --threads 1 --json OUT.json

``--variants``: codec names of the registry, labels of scalar_once_probe's ``variants()``, and
``lynx+rW`` (recent_window_probe.py: the last W tokens at full precision in the anchor).
Prompts, model loading and reconstruction are `lynx eval accept`'s own (lynx_npu.eval).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import lynx_npu  # noqa: E402
from lynx_npu.eval import accept_cmd  # noqa: E402
from lynx_npu.eval.accept import EXACT, greedy_decode, past_cache, prepare  # noqa: E402
from lynx_npu.eval.model import load_model  # noqa: E402

import scalar_once_probe  # noqa: E402
from recent_window_probe import RecentExact  # noqa: E402


def build(label: str):
    probe = dict(scalar_once_probe.variants())
    if label in probe:
        return probe[label]
    if label in lynx_npu.list_codecs():
        return lynx_npu.get_codec(label)
    if label.startswith("lynx+r") and label[6:].isdigit():  # recent_window_probe's variant
        return RecentExact(lynx_npu.get_codec("lynx"), int(label[6:]))
    raise SystemExit(f"unknown variant {label!r}; probe labels: {sorted(probe)}, "
                     f"lynx+rW (the last W tokens at full precision in the anchor)")


def teacher_forced(model, caches: list, tokens: list[int]) -> torch.Tensor:
    """log-softmax [variants, len(tokens), vocab] of the next token after each of ``tokens``,
    every cache fed the same tokens in one batch."""
    cache = past_cache(model, caches)
    ids = torch.tensor([tokens] * len(caches), dtype=torch.int64, device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
    return torch.log_softmax(logits.float(), dim=-1)


def compare(logp: torch.Tensor) -> list[dict]:
    """Row 0 is the exact cache; -> per other row: KL per position, agreement, first miss."""
    exact = logp[0]
    top2 = exact.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).tolist()  # exact cache's top-1 - top-2 log-prob
    want = exact.argmax(-1)
    out = []
    for row in logp[1:]:
        kl = (exact.exp() * (exact - row)).sum(-1).clamp_min(0)
        agree = (row.argmax(-1) == want).tolist()
        first_miss = agree.index(False) if False in agree else len(agree)
        out.append({"kl": kl.tolist(), "agree": sum(agree) / len(agree), "accepted": first_miss,
                    "margin_at_miss": margin[first_miss] if first_miss < len(agree) else None})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default="lynx,once8 C32/32 P256 half")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--workloads", default="mmlu_pro,qmsum")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--qmsum-tokens", type=int, default=3072)
    p.add_argument("--shots", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    labels = [x for x in args.variants.split(",") if x]
    codecs = [(label, build(label)) for label in labels]
    ns = argparse.Namespace(qmsum=None, mmlu_pro=None, workloads=args.workloads)
    paths = accept_cmd.data_paths(ns)
    loaded = load_model(args.model)
    t0 = time.perf_counter()
    report = {"model": args.model, "variants": labels, "new_tokens": args.new_tokens,
              "threads": args.threads, "workloads": {}}
    for workload in args.workloads.split(","):
        prompts = (accept_cmd.qmsum_prompts(paths[workload], loaded.tokenizer, args.prompts,
                                            args.qmsum_tokens) if workload == "qmsum" else
                   accept_cmd.mmlu_pro_prompts(paths[workload], loaded.tokenizer, args.prompts,
                                               args.shots))
        rows = []
        for n, (prompt_id, ids) in enumerate(prompts, 1):
            prepared = prepare(loaded.model, torch.tensor(ids, dtype=torch.int64), codecs,
                               torch.bfloat16)
            exact = prepared.variants["", EXACT]
            cont = greedy_decode(loaded.model, [exact], prepared.first_token,
                                 args.new_tokens)[0]
            fed = [prepared.first_token] + cont[:-1]  # row i predicts cont[i]
            anchors = [prepared.variants[label, build(label).stages[0]] for label in labels]
            res = compare(teacher_forced(loaded.model, [exact] + anchors, fed))
            row = {"id": prompt_id, "tokens": len(ids)}
            for label, r in zip(labels, res):
                row[label] = r
            rows.append(row)
            print(f"{workload} {n}/{len(prompts)} {prompt_id}: " + "; ".join(
                f"{label} KL {statistics.fmean(r['kl']):.4f} agree {r['agree']:.2f} "
                f"first miss {r['accepted']}" for label, r in zip(labels, res)), flush=True)
        summary = {}
        for label in labels:
            per_prompt = [statistics.fmean(r[label]["kl"]) for r in rows]
            summary[label] = {
                "mean_kl": statistics.fmean(per_prompt),
                "median_prompt_kl": statistics.median(per_prompt),
                "agree": statistics.fmean(r[label]["agree"] for r in rows),
                "mean_first_miss": statistics.fmean(r[label]["accepted"] for r in rows)}
        base = labels[0]
        for label in labels[1:]:
            diff = [statistics.fmean(r[label]["kl"]) - statistics.fmean(r[base]["kl"])
                    for r in rows]
            lower = sum(d < 0 for d in diff)
            # two-sided sign test: how often would a coin give a split this uneven
            k = min(lower, len(diff) - lower)
            p_sign = min(1.0, 2 * sum(math.comb(len(diff), i) for i in range(k + 1))
                         / 2 ** len(diff))
            summary[label]["vs_" + base] = {
                "mean_kl_ratio": summary[label]["mean_kl"] / summary[base]["mean_kl"],
                "prompts_lower_kl": lower, "prompts": len(diff), "sign_test_p": p_sign}
        report["workloads"][workload] = {"summary": summary, "prompts": rows}
        print(f"{workload}: " + json.dumps(summary, indent=1), flush=True)
    report["total_s"] = time.perf_counter() - t0
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
