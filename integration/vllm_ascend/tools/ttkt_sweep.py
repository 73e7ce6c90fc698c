"""``lynx bench ttkt``: time to the k-th token across prompt lengths and link rates (issue 20,
the shape of the Lynx paper's Fig. 11 on this machine).

One LocalPair (the ``lynx demo`` setup: a prefill and a decode vLLM instance in this process,
the split-stream transport on loopback at an emulated link rate) serves the whole sweep. For
each prompt length, each of ``--prompts`` real QMSum prompts is prefilled once on the prefill
instance (no transfer; its prefix cache then holds the prompt), and for each link rate and each
mode its KV is moved and 64 tokens are decoded. Modes alternate their order from prompt to
prompt, so drift on a busy machine does not favour one.

The link rate changes between runs by closing the prefill worker's senders and giving the
connector a new config with the new rate (``dataclasses.replace``, so it is validated as at
start-up); the next transfer opens a new sender through the product's own path. This runs a
function on the prefill worker (``collective_rpc``), which vLLM allows only with
``VLLM_ALLOW_INSECURE_SERIALIZATION=1``: the sweep sets it for its own engine processes.

Reports per (length, rate, mode) the medians of TTFT, TT32, TT64 from the start of decoding and
the client-visible times, Lynx's gain over int8 and where it crosses zero (ttkt_report.py).
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import pathlib
import platform
import subprocess
import sys
import time

from lynx_npu.cli_types import (existing_path, int_in, names, not_a_file, number_in,
                                optional_output_file, output_file)

MODES = ("bf16", "int8", "int4", "lynx-int8", "lynx")
REQUIRED_MODES = ("int8", "lynx")  # the gain is lynx's over int8
SPEC_HEADROOM = 256                # max_model_len beyond prompt + output (drafts, padding)


def _list_of(item, what: str):
    """A comma-separated list of distinct items, each checked by the cli_types ``item``."""
    def parse(text: str):
        parts = [p.strip() for p in text.split(",")]
        if not text.strip() or any(not p for p in parts):
            raise argparse.ArgumentTypeError(
                f"{text!r} must be a comma-separated list of {what}s, none empty")
        values = [item(p) for p in parts]
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"{text!r} repeats a {what}")
        return values
    parse.__name__ = f"{what} list"
    return parse


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in names(MODES, "mode")(text).split(",")]
    missing = [m for m in REQUIRED_MODES if m not in modes]
    if missing:
        raise argparse.ArgumentTypeError(
            f"{text!r} lacks {', '.join(missing)}: the sweep reports lynx's gain over int8")
    if len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"{text!r} repeats a mode")
    return modes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lengths", type=_list_of(int_in(64, 131072), "prompt length"),
                        default="1024,2048,4096,7168",
                        help="prompt lengths in tokens (default 1024,2048,4096,7168; the "
                             "model's context must hold each plus --max-tokens)")
    parser.add_argument("--gbps", type=_list_of(number_in(0, 1e5, low_open=True), "link rate"),
                        default="0.05,0.2,1,5",
                        help="emulated link rates in Gbit/s (default 0.05,0.2,1,5: from "
                             "transfer-dominated to compute-dominated on a 2-core CPU)")
    parser.add_argument("--modes", type=_modes, default="int8,lynx",
                        help=f"comma-separated codecs, int8 and lynx among them (default "
                             f"int8,lynx; any of {','.join(MODES)})")
    parser.add_argument("--prompts", type=int_in(1, 100), default=2,
                        help="QMSum prompts per length (default 2)")
    parser.add_argument("--max-tokens", type=int_in(1, 4096), default=64,
                        help="tokens decoded per run (default 64: TT64)")
    parser.add_argument("--max-drafts", type=int_in(0, 120), default=64,
                        help="drafts per request before waiting for the residual (default 64)")
    parser.add_argument("--data", type=existing_path, default=None,
                        help="QMSum val.jsonl (default ../shared/data/qmsum/val.jsonl)")
    parser.add_argument("--json", dest="json_out", type=output_file, default=None,
                        metavar="OUT", help="write every run, the cells and the gains here")
    parser.add_argument("--plot", type=optional_output_file, default="lynx_ttkt_sweep.png",
                        metavar="PNG", help="gain vs context and vs link rate (default "
                                            "lynx_ttkt_sweep.png; '' for none)")
    parser.add_argument("--model-dir", type=not_a_file, default=None,
                        help="where the converted model lives (default ~/.cache/lynx_npu/...)")


def run(args: argparse.Namespace) -> int:
    # vLLM starts its engine processes by spawn; the parent must not be forked mid-thread.
    multiprocessing.set_start_method("spawn", force=True)
    return _main(args)


def set_prefill_link_rate(worker, gbps: float) -> int:
    """Run on the prefill worker (``collective_rpc``): later transfers go at ``gbps``. Closes
    its senders (call it between transfers) and returns how many were closed."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return get_kv_transfer_group().worker.set_link_rate(gbps)


def prefill_only(pair, token_ids: list[int]) -> float:
    """Compute the prompt on the prefill instance without a transfer (a request without Lynx
    parameters is served locally), so its prefix cache holds it; returns the seconds taken."""
    from vllm import SamplingParams

    t0 = time.monotonic()
    pair.prefill.generate([{"prompt_token_ids": list(token_ids)}],
                          SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    return time.monotonic() - t0


def sweep(pair, prompts: dict[int, list], rates: list[float], modes: list[str], *,
          max_tokens: int, max_drafts: int, say) -> list[dict]:
    """Every (length, prompt, rate, mode) run, as ttkt_report records."""
    from . import ttkt_report as report

    total = sum(len(ps) for ps in prompts.values()) * len(rates) * len(modes)
    todo = [(n, g) for n, ps in prompts.items() for _ in ps for g in rates for _ in modes]
    done: list[tuple[int, float, float]] = []  # (length, rate, seconds) of finished runs
    records, current, t_last = [], pair.config.gbps, time.monotonic()
    for length, plist in prompts.items():
        for i, prompt in enumerate(plist):
            ids = prompt.token_ids
            prefill_s = prefill_only(pair, ids)
            say(f"[ttkt] {length} tokens, prompt {i + 1}/{len(plist)} ({len(ids)} tokens): "
                f"prefilled in {prefill_s:.1f} s")
            for gbps in rates:
                if gbps != current:
                    pair.prefill.collective_rpc(set_prefill_link_rate, args=(gbps,))
                    current = pair.link_gbps = gbps
                for mode in (modes if i % 2 == 0 else modes[::-1]):
                    r = pair.run(ids, mode, max_tokens=max_tokens, max_drafts=max_drafts)
                    if "first_frame_at" not in r.stats:
                        raise RuntimeError(f"{mode} at {gbps:g} Gbps, {len(ids)}-token prompt: "
                                           f"no KV arrived (the decode instance computed the "
                                           f"prompt itself); stats {r.stats}")
                    rec = report.record(r, length=length, gbps=gbps, prompt=i,
                                        prompt_tokens=len(ids), prefill_s=prefill_s)
                    records.append(rec)
                    now = time.monotonic()
                    done.append((length, gbps, now - t_last))  # prefill and rate change included
                    t_last = now
                    eta = eta_seconds(done, todo[len(done):])
                    say(f"[ttkt] {len(records)}/{total} {length} tok {gbps:g} Gbps {mode:<9} "
                        f"TTFT {rec['ttft_s']:.2f} TT{min(64, rec['tokens'])} "
                        f"{rec['tt64_s']:.2f} client {rec['client_tt64_s']:.2f} s, KV in "
                        f"{rec['loaded_s']:.2f} s, ETA {eta / 60:.1f} min")
    return records


def eta_seconds(done: list[tuple[int, float, float]], todo: list[tuple[int, float]]) -> float:
    """Seconds left: a run costs about a + c * length / rate (the transfer grows with
    length / rate; the 64 decode steps vary less), fitted to the finished runs (least squares,
    each term at least 0); the mean run time until two cells differ. On the 2-core default
    sweep this came within 25% of the time left from the 6th run on."""
    import numpy as np

    if not done:
        return float("nan")
    secs = np.array([s for _, _, s in done])
    if len({n / g for n, g, _ in done}) < 2:
        return float(secs.mean()) * len(todo)
    x = np.array([[1.0, n / g] for n, g, _ in done])
    coef = np.clip(np.linalg.lstsq(x, secs, rcond=None)[0], 0, None)
    return float(sum(coef @ np.array([1.0, n / g]) for n, g in todo))


def _main(args) -> int:
    from . import ttkt_report as report
    from .demo_data import load_prompts
    from .local_pair import LocalPair, PairConfig, configure_cpu_threads
    from .model_prep import ensure_model_dir

    t_start, commit = time.monotonic(), _commit()  # the tree measured, before others commit
    say = _printer(t_start)
    configure_cpu_threads()
    # set_prefill_link_rate is a function sent to this sweep's own prefill worker.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    model = ensure_model_dir(args.model_dir, log=say)
    lengths, rates, modes = list(args.lengths), list(args.gbps), list(args.modes)
    max_model_len, kv_bytes = _engine_sizes(model, max(lengths) + args.max_tokens)
    pair = LocalPair(PairConfig(str(model), gbps=rates[0], max_drafts=args.max_drafts,
                                max_model_len=max_model_len, kv_cache_bytes=kv_bytes), log=say)
    startup_s = time.monotonic() - t_start
    load_before = os.getloadavg()  # other work on the machine: recorded beside the times
    try:
        prompts = {n: load_prompts(pair.tokenizer, args.prompts, n, args.data)
                   for n in lengths}
        say(f"[ttkt] {len(lengths)} lengths x {len(rates)} rates x {len(modes)} modes x "
            f"{args.prompts} prompts; warm-up ...")
        for mode in modes:  # first use of each codec loads its decoder (kernels, tables)
            pair.run(prompts[lengths[0]][0].token_ids[:64], mode, max_tokens=4)
        records = sweep(pair, prompts, rates, modes, max_tokens=args.max_tokens,
                        max_drafts=args.max_drafts, say=say)
    finally:
        pair.close()
    meta = {"command": "lynx bench ttkt " + " ".join(sys.argv[3:] if sys.argv[1:3] ==
                                                      ["bench", "ttkt"] else sys.argv[1:]),
            "model": pathlib.Path(model).name, "lengths": lengths, "gbps": rates,
            "modes": modes, "prompts": args.prompts, "max_tokens": args.max_tokens,
            "max_drafts": args.max_drafts, "machine": _machine(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit, "startup_s": startup_s,
            "loadavg_1m": {"start": load_before[0], "end": os.getloadavg()[0]},
            "wall_s": time.monotonic() - t_start}
    doc = report.summarize(records, meta)
    print()
    print(f"lynx bench ttkt: {meta['model']}, {args.prompts} QMSum prompts per length, medians "
          f"(s from the start of decoding); gain = int8 - lynx")
    print(report.table(doc))
    for line in report.crossing_lines(doc):
        print(line)
    if args.json_out:
        report.write_json(args.json_out, doc)
        print(f"JSON: {args.json_out}")
    if args.plot:
        report.plot(args.plot, doc, f"Lynx's gain over int8 (int8 - lynx; top TT64, bottom "
                                    f"TTFT), {meta['model']}, median of {args.prompts} QMSum "
                                    f"prompts per point, {meta['date']}")
        print(f"plot: {args.plot}")
    print(f"total {time.monotonic() - t_start:.0f} s (engine start-up {startup_s:.0f} s)")
    return 0


def _engine_sizes(model, tokens: int) -> tuple[int, int]:
    """max_model_len for ``tokens`` (prompt + output) and a KV cache holding one such request
    in float32 (the engines' dtype on CPU), at least PairConfig's default."""
    cfg = json.loads((pathlib.Path(model) / "config.json").read_text())
    limit = cfg.get("max_position_embeddings")
    max_model_len = tokens + SPEC_HEADROOM
    if limit is not None and max_model_len > limit:
        raise ValueError(f"--lengths up to {tokens} tokens with --max-tokens need a context of "
                         f"{max_model_len} tokens; the model holds {limit}")
    heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = cfg["num_hidden_layers"] * 2 * heads * head_dim * 4
    return max_model_len, max(512 << 20, int(1.25 * per_token * max_model_len))


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=pathlib.Path(__file__).parent,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _printer(t0: float):
    from lynx_npu.eval.progress import log

    def say(msg: str) -> None:
        log(f"{time.monotonic() - t0:6.1f}s {msg}")
    return say


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m lynx_npu.integration.vllm_ascend.tools.ttkt_sweep")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
