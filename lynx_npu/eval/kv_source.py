"""Command-line glue shared by ``lynx eval codecs`` and ``lynx eval sweep``: which model, text,
token count, queries and KV dtype, and the capture of every layer's KV from them."""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from lynx_npu.cli_types import MAX_TOKENS, existing_path, int_in, layer_list

from .evaluate import LayerRef, build_refs
from .progress import log, progress, set_enabled

KV_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_capture_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2",
                        help="model to capture KV from: a bundled one (smollm2, the default; "
                             "gemma3) or a Hugging Face model directory")
    parser.add_argument("--data", type=existing_path, default="../shared/data/paul_graham_essays",
                        help="folder of .txt essays, concatenated in sorted order")
    parser.add_argument("--tokens", type=int_in(1, MAX_TOKENS), default=4096,
                        help="sequence length (default 4096)")
    parser.add_argument("--queries", type=int_in(1, MAX_TOKENS), default=256,
                        help="last positions used as causal queries for attention vNMSE (default 256)")
    parser.add_argument("--kv-dtype", choices=list(KV_DTYPES), default="bfloat16",
                        help="dtype the KV cache is stored in and the codecs read (default bfloat16; "
                             "the model computes in float32)")
    parser.add_argument("--layers", type=layer_list, default=None,
                        help="layer subset, e.g. '0-3,10' (default: every layer)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def parse_layers(text: str | None, num_layers: int) -> list[int]:
    if text is None:
        return list(range(num_layers))
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            idx = range(int(lo), int(hi) + 1) if sep else [int(lo)]
        except ValueError:
            raise ValueError(f"--layers {text!r}: {part!r} is not an index or a range a-b") from None
        for i in idx:
            if not 0 <= i < num_layers:
                raise ValueError(f"--layers {text!r}: layer {i} is outside 0..{num_layers - 1}")
            if i not in out:
                out.append(i)
    return out


@dataclass(frozen=True)
class CapturedKV:
    meta: dict              # model, tokens, data, queries, kv_dtype, layers, timings
    refs: list[LayerRef]    # one per evaluated layer


def capture_from_args(args: argparse.Namespace) -> CapturedKV:
    from .capture import capture_qkv
    from .model import load_model, load_text

    set_enabled(not args.quiet)
    if args.tokens < 1 or args.queries < 1:
        raise ValueError(f"--tokens {args.tokens} and --queries {args.queries} must be >= 1")
    t0 = time.perf_counter()
    log(f"loading model {args.model!r} ...")
    loaded = load_model(args.model)
    ids = load_text(args.data, args.tokens, loaded.tokenizer)
    load_s = time.perf_counter() - t0
    num_layers = loaded.model.config.num_hidden_layers
    layers = parse_layers(args.layers, num_layers)
    t0 = time.perf_counter()
    with progress(num_layers, f"capturing {args.tokens} tokens: layer") as bar:
        captured = capture_qkv(loaded.model, ids, keep_last_queries=min(args.queries, args.tokens),
                               on_layer=lambda i: bar.update())
    refs = build_refs([captured[i] for i in layers], args.queries, KV_DTYPES[args.kv_dtype])
    capture_s = time.perf_counter() - t0
    log(f"model loaded in {load_s:.1f} s, KV of {len(layers)} layers captured in {capture_s:.1f} s")
    meta = {"model": args.model, "tokens": args.tokens, "data": str(args.data),
            "queries": min(args.queries, args.tokens), "kv_dtype": args.kv_dtype, "layers": layers,
            "num_heads": refs[0].q.shape[0], "num_kv_heads": refs[0].k.shape[0],
            "head_dim": refs[0].k.shape[2],
            # per evaluated layer: its sliding window (None: global causal attention)
            "layer_windows": [r.window for r in refs], "load_s": load_s, "capture_s": capture_s}
    return CapturedKV(meta, refs)
