"""``lynx demo``: disaggregated prefill/decode with Lynx on this machine, against the baselines.

Starts a prefill and a decode vLLM instance with the bundled SmolLM2-135M-Instruct (or, with
``--model gemma3``, Gemma 3 270M: model_prep.py), prefills
real long QMSum prompts once, and moves each prompt's KV over the built-in split-stream
transport at an emulated link rate with every codec (bf16, int8, int4, lynx-int8, lynx); the
decode instance decodes 64 greedy tokens each time. Prints time to the 1st/32nd/64th token
from the start of decoding, drafts proposed/accepted and whether the output matched its
full-cache reference; ``--json`` and ``--plot`` write the numbers and a time-to-k-th-token
plot. See docs/demo.md for what is measured and why.
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import time

from lynx_npu.cli_types import (existing_path, int_in, names, not_a_file, number_in,
                                optional_output_file, output_file)

MODES = ("bf16", "int8", "int4", "lynx-int8", "lynx")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=("smollm2", "gemma3"), default="smollm2",
                        help="smollm2: SmolLM2-135M-Instruct (default); gemma3: Gemma 3 270M "
                             "base (sliding-window and global layers; vLLM allocates every "
                             "layer full-length, docs/demo.md)")
    parser.add_argument("--gbps", type=number_in(0, 1e5, low_open=True), default=0.2,
                        help="emulated prefill->decode link rate in Gbit/s (default 0.2: the "
                             "transfer dominates on this small model)")
    parser.add_argument("--transport", choices=("tcp", "mooncake", "lmcache"), default="tcp",
                        help="the KV transport between the instances: the embedded TCP split "
                             "stream (default), the Mooncake transfer engine, or LMCache objects "
                             "in a shared directory (docs/deploy.md)")
    parser.add_argument("--prompts", type=int_in(1, 1000), default=3,
                        help="QMSum prompts (default 3)")
    parser.add_argument("--prompt-tokens", type=int_in(1, 32768), default=1536,
                        help="tokens per prompt (default 1536)")
    parser.add_argument("--max-tokens", type=int_in(1, 4096), default=64,
                        help="tokens decoded per run")
    parser.add_argument("--modes", type=names(MODES, "mode"), default=",".join(MODES),
                        help=f"comma-separated codecs (default {','.join(MODES)})")
    parser.add_argument("--max-drafts", type=int_in(0, 120), default=64,
                        help="drafts per request before waiting for the residual (default 64)")
    parser.add_argument("--data", type=existing_path, default=None,
                        help="QMSum val.jsonl (default ../shared/data/qmsum/val.jsonl from the "
                             "repository root)")
    parser.add_argument("--json", dest="json_out", type=output_file, default=None,
                        metavar="OUT", help="write the summary JSON here")
    parser.add_argument("--plot", type=optional_output_file, default="lynx_demo_ttkt.png",
                        metavar="PNG",
                        help="time-to-k-th-token plot (default lynx_demo_ttkt.png; '' for none)")
    parser.add_argument("--model-dir", type=not_a_file, default=None,
                        help="where the converted model lives (default: the model's "
                             "directory under ~/.cache/lynx_npu)")


def run(args: argparse.Namespace) -> int:
    modes = [m.strip() for m in args.modes.split(",")]  # every option checked by its type
    # vLLM starts its engine processes by spawn; the parent must not be forked mid-thread.
    multiprocessing.set_start_method("spawn", force=True)
    return _main(args, modes)


def _main(args, modes: list[str]) -> int:
    from . import demo_report as report
    from .demo_data import load_prompts
    from lynx_npu.codec.lynx_config import describe_plan
    from lynx_npu.eval.model import MODELS

    from .local_pair import LocalPair, PairConfig, configure_cpu_threads
    from .model_prep import display_name, ensure_model_dir

    t_start = time.monotonic()
    say = _printer(t_start)
    configure_cpu_threads()
    model = str(ensure_model_dir(args.model_dir, log=say, model=args.model))
    plan = MODELS[args.model].lynx_plan
    if plan:
        say(f"[lynx] {display_name(args.model)}'s Lynx plan (lynx calibrate): "
            f"{describe_plan(plan)}")
    pair = LocalPair(PairConfig(model, gbps=args.gbps, transport=args.transport,
                                max_drafts=args.max_drafts, lynx_plan=plan or None,
                                max_model_len=max(4096, args.prompt_tokens + args.max_tokens
                                                  + 256)), log=say)
    try:
        prompts = load_prompts(pair.tokenizer, args.prompts, args.prompt_tokens, args.data)
        say(f"[lynx] {len(prompts)} QMSum prompts of {min(len(p.token_ids) for p in prompts)}"
            f"-{max(len(p.token_ids) for p in prompts)} tokens; modes {', '.join(modes)}; "
            f"{args.gbps:g} Gbps")
        say("[lynx] warm-up ...")
        for mode in modes:  # first use of each codec loads its decoder (kernels, tables)
            warm = pair.run(prompts[0].token_ids[:64], mode, max_tokens=4)
            say(f"[lynx] {mode:<9} compressed by {_compress_backend(model, mode, pair)}, "
                f"decompressed by {warm.stats.get('decoded_by') or '?'} (ops backends)")
        runs: dict[str, list] = {m: [] for m in modes}
        for i, prompt in enumerate(prompts):
            for j, mode in enumerate(modes):
                r = pair.run(prompt.token_ids, mode, max_tokens=args.max_tokens,
                             max_drafts=args.max_drafts)
                runs[mode].append(r)
                prefill = (f", prefill {r.prefill_done_at - r.submitted_at:.1f} s"
                           if j == 0 and r.prefill_done_at else "")
                drafts = (f", drafts {r.stats.get('drafts_accepted', 0)}/"
                          f"{r.stats.get('drafts_proposed', 0)} accepted"
                          if r.stats.get("drafts_proposed") else "")
                say(f"[lynx] prompt {i + 1}/{len(prompts)} {mode:<9} TTFT "
                    f"{r.time_to_token(1):.3f} s, TT{len(r.tokens)} "
                    f"{r.time_to_token(len(r.tokens)):.2f} s{drafts}{prefill}"
                    f"{_timeline(r)}")
    finally:
        pair.close()

    results = report.summarize(runs, modes)
    print()
    print(f"Lynx demo: {display_name(args.model)}, {len(prompts)} QMSum prompts, "
          f"{args.gbps:g} Gbps emulated link, medians (times from the start of decoding)")
    print(report.table(results))
    for line in report.targets(results):
        print(line)
    if args.json_out:
        report.write_json(args.json_out, results, args.gbps, len(prompts), args.model)
        print(f"JSON: {args.json_out}")
    if args.plot:
        report.plot(args.plot, runs, modes, args.gbps, display_name(args.model))
        print(f"plot: {args.plot}")
    print(f"total {time.monotonic() - t_start:.0f} s")
    return 0


def _compress_backend(model: str, mode: str, pair) -> str:
    """What the prefill worker's page serde compresses ``mode`` with: the same selection
    (lynx_npu.ops) on the same machine and environment, for the model's KV shape."""
    import json
    import pathlib

    import torch

    import lynx_npu
    from lynx_npu.ops import serde_for

    cfg = json.loads((pathlib.Path(model) / "config.json").read_text())
    heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    dtype = getattr(torch, pair.config.wire_dtype or pair.config.dtype)
    plan = pair.config.lynx_plan or {}
    codec = lynx_npu.get_codec(mode)
    if plan and set(plan) <= set(codec.params()):
        codec = lynx_npu.get_codec(mode, **plan)
    serde = serde_for(codec)
    layers = cfg["num_hidden_layers"]
    return " / ".join(dict.fromkeys(repr(serde.for_layer(i, layers).compress_backend(
        "cpu", heads, head_dim, dtype)) for i in range(layers)))


def _timeline(r) -> str:
    """Where the time went: anchor/residual complete, KV in the cache, verification."""
    loaded = "started early" if r.stats.get("early_start") else "in cache"
    marks = [("anchor", "anchor_ready_at"), (loaded, "loaded_at"),
             ("residual", "residual_ready_at"), ("refined", "refined_at"),
             ("verified", "verified_at")]
    parts = [f"{name} {r.stats[key] - r.start:.3f}" for name, key in marks
             if r.stats.get(key) is not None and (key != "residual_ready_at"
                                                  or r.stats.get("stage") == "anchor")]
    return f" [{', '.join(parts)}]" if parts else ""


def _printer(t0: float):
    def say(msg: str) -> None:
        print(f"{time.monotonic() - t0:6.1f}s {msg}", flush=True)
    return say


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m lynx_npu.integration.vllm_ascend.tools.demo")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
