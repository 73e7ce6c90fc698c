"""``lynx eval codecs``: every codec's wire size and error on real KV of a real model.

    lynx eval codecs --model smollm2 --data ../shared/data/paul_graham_essays --tokens 4096 \\
        --json OUT.json [--codecs int8,kivi4,lynx,lynx:preset=paper] [--codec-arg lynx:alpha_k=3]

Per codec and stage: bits per value on the wire, K NMSE, V NMSE, attention vNMSE (see
metrics.py and docs/eval.md). Prints a table, writes JSON, shows progress on stderr.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

from lynx_npu.cli_types import names, output_file

from .codec_specs import select_codecs
from .evaluate import CodecResult, evaluate_codec
from .kv_source import add_capture_arguments, capture_from_args
from .ops_codec import add_backend_argument, with_backend
from .progress import log


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_capture_arguments(parser)
    parser.add_argument("--json", dest="json_path", type=output_file, default=None,
                        help="write the results here (its directory must exist)")
    parser.add_argument("--codecs", type=names(what="codec spec"), default=None,
                        help="comma-separated codec specs (name or name:key=value:...); "
                             "default: every registered codec")
    parser.add_argument("--codec-arg", action="append", default=[], metavar="CODEC:KEY=VALUE",
                        help="override a codec parameter, e.g. lynx:alpha_k=3 (repeatable)")
    add_backend_argument(parser)


def run(args: argparse.Namespace) -> int:
    import lynx_npu

    t_start = time.perf_counter()
    specs = select_codecs(args.codecs, args.codec_arg, lynx_npu.list_codecs())
    # Bad parameters fail here, before the model is loaded.
    codecs = [(s.label, with_backend(s.build(), args.lynx_backend)) for s in specs]
    kv = capture_from_args(args)
    results: list[CodecResult] = []
    for label, codec in codecs:
        res = evaluate_codec(codec, kv.refs, label=label)
        log(f"{label}: encode {res.encode_s:.1f} s, decode {res.decode_s:.1f} s")
        results.append(res)
    report = make_report(kv.meta, codecs, results, time.perf_counter() - t_start)
    print(format_table(report))
    if args.json_path:
        path = pathlib.Path(args.json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1) + "\n")
        log(f"wrote {path}")
    return 0


def make_report(meta: dict, codecs, results: list[CodecResult], total_s: float) -> dict:
    rows = []
    for (label, codec), res in zip(codecs, results):
        params = codec.params() if hasattr(codec, "params") else {}
        for stage in res.stages:
            rows.append({"codec": label, **stage.summary(), "params": params,
                         "encode_s": res.encode_s, "decode_s": res.decode_s})
    return {**meta, "total_s": total_s, "codecs": rows}


def format_table(report: dict) -> str:
    head = ("codec", "stage", "bits/value", "K NMSE", "V NMSE", "attn vNMSE")
    lines = [f"{report['model']}, {report['tokens']} tokens of {report['data']}, "
             f"last {report['queries']} positions as queries, KV {report['kv_dtype']}, "
             f"{len(report['layers'])} layers"]
    width = max([len(head[0])] + [len(r["codec"]) for r in report["codecs"]])
    lines.append(f"{head[0]:<{width}}  {head[1]:<6}  {head[2]:>10}  {head[3]:>9}  {head[4]:>9}  "
                 f"{head[5]:>10}")
    for r in report["codecs"]:
        lines.append(f"{r['codec']:<{width}}  {r['stage']:<6}  {r['bits_per_value']:>10.3f}  "
                     f"{r['k_nmse']:>9.2e}  {r['v_nmse']:>9.2e}  {r['attn_vnmse']:>10.2e}")
    return "\n".join(lines)
