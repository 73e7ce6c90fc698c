"""Where does the one-byte page range cost the anchor? (docs/codec.md "The page range in one
byte": e3m4 per 8 channels raised QMSum's anchor KL 18% while the essays' attention vNMSE moved
0.5%.) Per prompt: prefill exactly, encode every layer with SmolLM2's plan twice, once with the
exact page range and once with the range rounded outward (gamma_byte_probe.outward), then splice
the two anchors: K rounded everywhere, V rounded everywhere, both, and one layer's K and V
rounded at a time (``--keep-exact L,L``: also both rounded but in those layers; ``--no-layers``:
no one-layer splices). Every splice gets the same teacher-forced KL(exact || anchor) along the exact
cache's greedy continuation as anchor_kl_probe.py; K and V are quantized independently, so a
splice is exactly the anchor that rounding only there would give.

    python docs/experiments/gamma_byte_kl_probe.py --prompts 35 --json OUT.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import lynx_npu  # noqa: E402
from lynx_npu.codec import lynx_ref  # noqa: E402
from lynx_npu.eval import accept_cmd  # noqa: E402
from lynx_npu.eval.accept import cast, greedy_decode, prefill, reconstruct  # noqa: E402
from lynx_npu.eval.model import MODELS, load_model  # noqa: E402

import gamma_byte_probe as gb  # noqa: E402
from anchor_kl_probe import compare, teacher_forced  # noqa: E402


def anchors(codec, exact, rounded_range: bool, levels, group):
    if rounded_range:
        lynx_ref.page_range = lambda x: gb.outward(*gb.exact_range(x), levels, group)
    try:
        return reconstruct(codec, exact, ("anchor",)).stages["anchor"]
    finally:
        lynx_ref.page_range = gb.exact_range


def splices(base, rounded, keep_exact: tuple[int, ...], per_layer: bool) -> dict:
    out = {"K": [(r[0], b[1]) for b, r in zip(base, rounded)],
           "V": [(b[0], r[1]) for b, r in zip(base, rounded)],
           "KV": list(rounded)}
    if keep_exact:
        out["KV but " + ",".join(map(str, keep_exact))] = [
            b if j in keep_exact else r for j, (b, r) in enumerate(zip(base, rounded))]
    for i in range(len(base) if per_layer else 0):
        out[f"L{i}"] = [r if j == i else b for j, (b, r) in enumerate(zip(base, rounded))]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--workload", default="qmsum", choices=("qmsum", "mmlu_pro"))
    p.add_argument("--prompts", type=int, default=35)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--qmsum-tokens", type=int, default=3072)
    p.add_argument("--grid", default="e3m4", help="eEmM (sign + E exponent + M mantissa bits)")
    p.add_argument("--group", type=int, default=8, help="channels per power-of-two scale")
    p.add_argument("--keep-exact", default="", help="layers that keep the exact range, e.g. 17,18")
    p.add_argument("--no-layers", action="store_true", help="no one-layer splices")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    e, m = (int(x) for x in args.grid[1:].split("m"))
    levels = gb.fp_levels(e, m)
    codec = lynx_npu.get_codec("lynx", **dict(MODELS[args.model].lynx_plan))
    loaded = load_model(args.model)
    paths = accept_cmd.data_paths(argparse.Namespace(qmsum=None, mmlu_pro=None,
                                                     workloads=args.workload))
    prompts = (accept_cmd.qmsum_prompts(paths["qmsum"], loaded.tokenizer, args.prompts,
                                        args.qmsum_tokens) if args.workload == "qmsum" else
               accept_cmd.mmlu_pro_prompts(paths["mmlu_pro"], loaded.tokenizer, args.prompts, 5))
    t0 = time.perf_counter()
    rows = []
    for n, (prompt_id, ids) in enumerate(prompts, 1):
        kv = prefill(loaded.model, torch.tensor(ids, dtype=torch.int64))
        exact = cast(kv.layers, torch.bfloat16)
        base = anchors(codec, exact, False, levels, args.group)
        rounded = anchors(codec, exact, True, levels, args.group)
        keep = tuple(int(x) for x in args.keep_exact.split(",") if x)
        variants = {"plan": base, **splices(base, rounded, keep, not args.no_layers)}
        cont = greedy_decode(loaded.model, [exact], kv.first_token, args.new_tokens)[0]
        fed = [kv.first_token] + cont[:-1]
        res = compare(teacher_forced(loaded.model, [exact] + list(variants.values()), fed))
        row = {"id": prompt_id, "tokens": len(ids),
               "kl": {k: statistics.fmean(r["kl"]) for k, r in zip(variants, res)}}
        rows.append(row)
        kl = row["kl"]
        print(f"{n}/{len(prompts)} {prompt_id}: " + " ".join(
            f"{k} {x:.5f}" for k, x in kl.items() if not k.startswith("L"))
            + f" ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    names = list(rows[0]["kl"])
    mean = {k: statistics.fmean(r["kl"][k] for r in rows) for k in names}
    report = {"model": args.model, "workload": args.workload, "grid": args.grid,
              "group": args.group, "new_tokens": args.new_tokens, "threads": args.threads,
              "mean_kl": mean,
              "ratio_to_plan": {k: mean[k] / mean["plan"] for k in names},
              "prompts_higher_than_plan": {k: sum(r["kl"][k] > r["kl"]["plan"] for r in rows)
                                           for k in names},
              "prompts": rows, "total_s": time.perf_counter() - t0}
    print(json.dumps({k: round(v, 3) for k, v in report["ratio_to_plan"].items()}))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
