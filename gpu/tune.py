"""Time launch variants of the Lynx Triton kernels on one GPU: ``python -m lynx_npu.gpu.tune``.

For each variant (compress: strip width BD, num_warps, groups per thread per step RPT, search
table in shared or global memory, register cap; decompress: tokens per program TB, num_warps)
it times compress (and its K and V kernels) / decompress_full / decompress_anchor on the
benchmark KV (K and V of [256, 16384, 128] bf16, 2.15 GB), checks that the bytes (or values)
equal the default variant's, and prints effective GB/s against the device copy (device events
around back-to-back calls, as ``lynx bench kernels``). ``--json`` writes it all; ``--set KEY=VALUE`` tunes another config (e.g.
``page_size=512``); ``--compress-only``
skips the decompress variants. ``--check H`` first
compares the default variant with the torch reference codec, run on the GPU, on the first H
heads of that KV (both chunk centres): compressed bytes and both decompressed stages.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

from lynx_npu import ops
from lynx_npu.codec.lynx import LynxCodec
from lynx_npu.codec.lynx_config import make_config
from lynx_npu.eval.bench_kernels import _time_steady as _time, synthetic_kv
from lynx_npu.eval.codec_specs import parse_pairs

from . import launch

# BD: channels per program (a strip of all the page's tokens); RPT: groups of 8 values per
# thread per step; SMEM False reads the search table from global memory instead; maxnreg caps
# the registers (per kernel: {"k": .., "v": ..}) for more programs per SM; False turns off
# X_WORDS (bfloat16 read as words of two), EVICT (L2 eviction hints), PACK_ASM (4 + 4 codes
# packed in PTX), POLY (the quadratic code search). The first entry is the launcher's default
# (launch.py ``_blocks``: whole chunks per thread, K on 2 warps with RPT 4, V on 4 warps with
# RPT 2, the table in shared memory, no cap, all of those on); the others are variants last
# compared with it on the H100 (docs/benchmarks.md).
COMPRESS = [dict(), dict(RPT=2), dict(RPT=4), dict(num_warps=2), dict(num_warps=4),
            dict(SMEM=False), dict(X_WORDS=False), dict(EVICT=False), dict(PACK_ASM=False),
            dict(POLY=False), dict(BD=64)]
DEFAULTS = dict(launch.TUNING["compress"])  # the launcher's own choices
# TB: tokens per program (all head_dim channels; at most the chunk on the channel axis).
DECOMPRESS = [dict(TB=32, num_warps=4), dict(TB=16, num_warps=2), dict(TB=64, num_warps=8)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lynx_npu.gpu.tune")
    p.add_argument("--heads", type=int, default=256)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json")
    p.add_argument("--center", default="midrange", choices=["midrange", "mean"])
    p.add_argument("--check", type=int, default=0, metavar="H",
                   help="compare with the reference on the first H heads, then time")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="set",
                   help="a Lynx parameter over the default config, e.g. --set page_size=512")
    p.add_argument("--compress-only", action="store_true", help="time no decompress variant")
    p.add_argument("--once", action="store_true",
                   help="run each op once with the defaults (for a profiler), time nothing")
    args = p.parse_args(argv)
    cfg = make_config(center=args.center, **parse_pairs(args.set, "--set"))
    (k, v), = synthetic_kv(1, args.heads, args.tokens, args.head_dim, torch.bfloat16, "cuda")
    if args.once:
        a, r = ops.compress(k, v, cfg, backend="triton")
        ops.decompress(a, r, cfg, k.shape, k.dtype, backend="triton")
        ops.decompress(a, None, cfg, k.shape, k.dtype, backend="triton")
        torch.cuda.synchronize()
        return 0
    if args.check:
        check(k[:args.check], v[:args.check])
    kv_bytes = 2 * k.numel() * k.element_size()
    ck, cv = torch.empty_like(k), torch.empty_like(v)
    copy = 2 * kv_bytes / _time(lambda: (ck.copy_(k), cv.copy_(v)), "cuda", args.repeats) / 1e9
    del ck, cv
    rows = []
    print(f"device {torch.cuda.get_device_name()}, copy {copy:.0f} GB/s", flush=True)
    base = None
    for var in COMPRESS:
        launch.TUNING["compress"].update({**DEFAULTS, **var})
        a, r = ops.compress(k, v, cfg, backend="triton")
        if base is None:
            base = (a, r)
        same = bool(torch.equal(a, base[0]) and torch.equal(r, base[1]))
        sec = _time(lambda: ops.compress(k, v, cfg, backend="triton"), "cuda", args.repeats)
        gbps = (kv_bytes + a.numel() + r.numel()) / sec / 1e9
        us = [t for _, t in kernel_times(lambda: ops.compress(k, v, cfg, backend="triton"))]
        rows.append({"op": "compress", **var, "gbps": gbps, "same_bytes": same,
                     "kernel_us": us})
        print(f"compress {var}: {gbps:.0f} GB/s ({gbps / copy:.0%}), same bytes {same}; "
              f"K, V kernels {', '.join(f'{t:.0f}' for t in us)} us", flush=True)
    launch.TUNING["compress"].update(DEFAULTS)
    a, r = base
    ref = None
    for var in ([] if args.compress_only else DECOMPRESS):
        launch.TUNING["decompress"].update({"TB": None, "num_warps": None, **var})
        for op, res in (("decompress_full", r), ("decompress_anchor", None)):
            out = ops.decompress(a, res, cfg, k.shape, k.dtype, backend="triton")
            key = op
            if ref is None:
                ref = {}
            ref.setdefault(key, out)
            same = bool(torch.equal(out[0], ref[key][0]) and torch.equal(out[1], ref[key][1]))
            sec = _time(lambda: ops.decompress(a, res, cfg, k.shape, k.dtype, backend="triton"),
                        "cuda", args.repeats)
            nbytes = kv_bytes + a.numel() + (r.numel() if res is not None else 0)
            gbps = nbytes / sec / 1e9
            rows.append({"op": op, **var, "gbps": gbps, "same_values": same})
            print(f"{op} {var}: {gbps:.0f} GB/s ({gbps / copy:.0%}), same values {same}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_gbps": copy,
                       "shape": [args.heads, args.tokens, args.head_dim], "rows": rows}, f,
                      indent=1)
    return 0


def kernel_times(fn, repeats: int = 5) -> list[tuple[str, float]]:
    """Device time of each kernel one call of ``fn`` launches (in launch order: K, then V),
    the median over ``repeats`` profiled calls."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        runs.append([(e.name, e.device_time) for e in prof.events()
                     if e.device_time > 0 and "lynx" in e.name])
    n = min(len(r) for r in runs)
    return [(runs[0][i][0], sorted(r[i][1] for r in runs)[len(runs) // 2]) for i in range(n)]


def check(k: torch.Tensor, v: torch.Tensor) -> None:
    """Print how many bytes / values of the triton backend differ from the reference codec."""
    for center in ("midrange", "mean"):
        cfg = make_config(center=center)
        ref = LynxCodec(**dataclasses.asdict(cfg))
        enc = ref.encode(k, v)
        a, r = ops.compress(k, v, cfg, backend="triton")
        bad = [int((a != enc.anchor).sum()), int((r != enc.residual).sum())]
        for stage, res in (("anchor", None), ("full", r)):
            gk, gv = ops.decompress(a, res, cfg, k.shape, k.dtype, backend="triton")
            wk, wv = ref.decode(enc, stage)
            bad.append(int((gk != wk).sum() + (gv != wv).sum()))
        print(f"check {center} {list(k.shape)}: differing anchor / residual bytes {bad[0]} / "
              f"{bad[1]} of {a.numel()} / {r.numel()}; decompressed values anchor {bad[2]}, "
              f"full {bad[3]} of {2 * k.numel()}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
