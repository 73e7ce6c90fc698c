"""``lynx eval sweep``: one-at-a-time sweeps of the lynx codec's options on real KV.

    lynx eval sweep --model smollm2 --data ../shared/data/paul_graham_essays --tokens 4096 \\
        --json sweep.json --plot sweep.png [--preset paper] [--set num_sink_tokens=0] \\
        [--alpha-k 1,2,3,...] [--alpha-v ...] [--v-axis channel,token] [--sinks 0,1,2,4,8] \\
        [--anchor-bits 2,3,4,6] [--center mean,midrange] [--sweep alpha_k,alpha_v]

Each swept parameter varies alone around the base configuration (the preset plus ``--set``
overrides); every point reports bits per value and K/V NMSE and attention vNMSE of both
stages, plus the anchor's attention vNMSE with only K or only V decoded. Identical configurations are
evaluated once. The PNG has one panel per swept parameter.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

from lynx_npu.cli_types import names, output_file

from .codec_specs import parse_value
from .evaluate import evaluate_codec
from .kv_source import add_capture_arguments, capture_from_args
from .ops_codec import add_backend_argument, with_backend
from .progress import log

# parameter -> (command-line flag, default values)
ALPHAS = "0.125,0.25,0.5,1,2,3,5,8,16,32,64,255"
SWEEPS: dict[str, tuple[str, str]] = {
    "alpha_k": ("--alpha-k", ALPHAS),
    "alpha_v": ("--alpha-v", ALPHAS),
    "v_axis": ("--v-axis", "channel,token"),
    "num_sink_tokens": ("--sinks", "0,1,2,4,8"),
    "anchor_bits": ("--anchor-bits", "2,3,4,6"),
    "center": ("--center", "mean,midrange"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_capture_arguments(parser)
    parser.add_argument("--json", dest="json_path", type=output_file, default="sweep.json",
                        help="results JSON (its directory must exist)")
    parser.add_argument("--plot", type=output_file, default=None,
                        help="PNG path (default: the JSON path with .png)")
    parser.add_argument("--preset", default=None, help="base lynx preset (default: the codec default)")
    parser.add_argument("--set", dest="base_set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a base lynx parameter (repeatable)")
    parser.add_argument("--sweep", type=names(SWEEPS, "swept parameter"),
                        default=",".join(SWEEPS),
                        help=f"parameters to sweep (default all: {','.join(SWEEPS)})")
    add_backend_argument(parser)
    for param, (flag, default) in SWEEPS.items():
        parser.add_argument(flag, dest=f"values_{param}", default=default,
                            type=names(what="value"),
                            help=f"values of {param} (default {default})")


def sweep_plan(args: argparse.Namespace) -> tuple[dict, dict[str, list]]:
    """-> (base overrides, {param: values}); validates every configuration up front."""
    import lynx_npu

    base = {"preset": args.preset} if args.preset else {}
    for item in args.base_set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r} must look like key=value")
        base[key] = parse_value(value)
    params = [p.strip() for p in args.sweep.split(",") if p.strip()]
    unknown = [p for p in params if p not in SWEEPS]
    if unknown or not params:
        raise ValueError(f"--sweep {args.sweep!r}: unknown {unknown}; choose from {list(SWEEPS)}")
    plan = {p: [parse_value(v) for v in getattr(args, f"values_{p}").split(",") if v.strip()]
            for p in params}
    for param, values in plan.items():
        for value in values:
            lynx_npu.get_codec("lynx", **{**base, param: value})  # bad values fail before capture
    return base, plan


def run(args: argparse.Namespace) -> int:
    import lynx_npu

    t_start = time.perf_counter()
    base, plan = sweep_plan(args)
    kv = capture_from_args(args)
    base_params = with_backend(lynx_npu.get_codec("lynx", **base), args.lynx_backend).params()
    cache: dict[str, dict] = {}   # params JSON -> point result: shared configurations run once
    points = []
    total = sum(len(v) for v in plan.values())
    for param, values in plan.items():
        for value in values:
            codec = with_backend(lynx_npu.get_codec("lynx", **{**base, param: value}),
                                 args.lynx_backend)
            key = json.dumps(codec.params(), sort_keys=True)
            label = f"{param}={value}"
            if key not in cache:
                log(f"[{len(points) + 1}/{total}] {label}")
                res = evaluate_codec(codec, kv.refs, label=label, split_stages=("anchor",))
                cache[key] = {s.stage: _stage_fields(s.summary()) for s in res.stages}
                cache[key]["encode_s"], cache[key]["decode_s"] = res.encode_s, res.decode_s
            points.append({"param": param, "value": value, "params": codec.params(),
                           **cache[key]})
    report = {**kv.meta, "codec": "lynx", "base": base_params,
              "total_s": time.perf_counter() - t_start, "points": points}
    print(format_sweep_table(report))
    json_path = pathlib.Path(args.json_path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    plot_path = pathlib.Path(args.plot) if args.plot else json_path.with_suffix(".png")
    from .sweep_plot import plot_sweep

    plot_sweep(report, plot_path)
    log(f"wrote {json_path} and {plot_path} ({report['total_s']:.0f} s)")
    return 0


def _stage_fields(summary: dict) -> dict:
    keep = ("bits_per_value", "k_nmse", "v_nmse", "attn_vnmse", "attn_vnmse_k_only",
            "attn_vnmse_v_only", "per_layer_attn_vnmse")
    return {k: summary[k] for k in keep if k in summary}


def format_sweep_table(report: dict) -> str:
    lines = [f"lynx sweep on {report['model']}, {report['tokens']} tokens, base "
             + ", ".join(f"{k}={v}" for k, v in report["base"].items()),
             f"{'point':<22} {'anchor b/v':>10} {'anchor vNMSE':>12} {'K-only':>9} {'V-only':>9}"
             f" {'full b/v':>9} {'full vNMSE':>10}"]
    for p in report["points"]:
        a = p.get("anchor") or {}
        f = p.get("full") or {}
        lines.append(
            f"{p['param'] + '=' + str(p['value']):<22} {_num(a, 'bits_per_value', '.3f'):>10} "
            f"{_num(a, 'attn_vnmse'):>12} {_num(a, 'attn_vnmse_k_only'):>9} "
            f"{_num(a, 'attn_vnmse_v_only'):>9} {_num(f, 'bits_per_value', '.3f'):>9} "
            f"{_num(f, 'attn_vnmse'):>10}")
    return "\n".join(lines)


def _num(d: dict, key: str, fmt: str = ".2e") -> str:
    return format(d[key], fmt) if key in d else "-"
