"""Structured output with and without drafts under its grammar (2026-11-29).

Before acdc503 a request with a grammar was never drafted: it started once the full-precision KV
was in (``max_drafts=0`` gives that behaviour today). This decodes the same real QMSum prompts
under a JSON schema three ways on one LocalPair (SmolLM2 with its plan, as ``lynx demo``
deploys it): ``lynx`` (drafts under the grammar), ``lynx`` with ``max_drafts=0`` (the old
behaviour) and ``lynx-int8`` (the full-cache reference), and reports the time to the 1st /
16th / 32nd token (the paper's TTKT: an accepted draft counts from when it was drafted) and when
the 32nd reached the client, each from the start of decoding, with the drafts and equality.

    python docs/experiments/grammar_drafts.py --prompts 3 --gbps 0.2 --out OUT.json
"""
import argparse
import json
import statistics
import time

SCHEMA = {"type": "object", "properties": {"topic": {"type": "string", "maxLength": 80},
                                           "speakers": {"type": "integer"},
                                           "decisions": {"type": "array",
                                                         "items": {"type": "string"}}},
          "required": ["topic", "speakers", "decisions"]}
MODES = (("lynx", None), ("lynx, no drafts", 0), ("lynx-int8", None))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=1400)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--gbps", type=float, default=0.2)
    ap.add_argument("--data", default="../shared/data/qmsum/val.jsonl")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from lynx_npu.eval.model import MODELS
    from lynx_npu.integration.vllm_ascend.tools.demo_data import load_prompts
    from lynx_npu.integration.vllm_ascend.tools.local_pair import (LocalPair, PairConfig,
                                                                   configure_cpu_threads)
    from lynx_npu.integration.vllm_ascend.tools.model_prep import ensure_model_dir

    configure_cpu_threads()
    pair = LocalPair(PairConfig(str(ensure_model_dir()), gbps=args.gbps,
                                lynx_plan=MODELS["smollm2"].lynx_plan))
    try:
        prompts = load_prompts(pair.tokenizer, args.prompts, args.prompt_tokens, args.data)
        pair.run(prompts[0].token_ids, "lynx-int8", max_tokens=2)  # warm-up, computes prompt 0
        rows = []
        for n, p in enumerate(prompts):
            pair.run(p.token_ids, "lynx-int8", max_tokens=1)  # the prefill side's prefix cache
            runs = {}
            for label, cap in MODES:
                codec = label.split(",")[0]
                r = pair.run(p.token_ids, codec, max_tokens=args.max_tokens, ignore_eos=False,
                             max_drafts=cap, json_schema=SCHEMA)
                k = len(r.tokens)
                runs[label] = r
                rows.append({"prompt": n, "mode": label, "tokens": k,
                             "finish_reason": r.finish_reason,
                             "ttft_s": r.time_to_token(1),
                             "tt16_s": r.time_to_token(16) if k >= 16 else None,
                             "tt32_s": r.time_to_token(32) if k >= 32 else None,
                             "client_tt32_s": r.arrivals[31] - r.start if k >= 32 else None,
                             "drafts_proposed": r.stats.get("drafts_proposed"),
                             "drafts_accepted": r.stats.get("drafts_accepted"),
                             "stage": r.stats.get("stage"),
                             "text": pair.tokenizer.decode(r.tokens)})
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "text"}), flush=True)
            ref = runs["lynx-int8"].tokens
            for row in rows[-len(MODES):]:
                row["equals_reference"] = runs[row["mode"]].tokens == ref
    finally:
        pair.close()

    def median(mode, key):
        vals = [r[key] for r in rows if r["mode"] == mode and r[key] is not None]
        return statistics.median(vals) if vals else None

    summary = {label: {key: median(label, key) for key in
                       ("ttft_s", "tt16_s", "tt32_s", "client_tt32_s", "drafts_proposed",
                        "drafts_accepted")} for label, _ in MODES}
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gbps": args.gbps,
           "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
           "schema": SCHEMA, "summary_medians": summary, "runs": rows}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
