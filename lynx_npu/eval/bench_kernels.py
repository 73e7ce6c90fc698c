"""``lynx bench kernels``: compress / decompress bandwidth of the lynx_npu.ops backends.

Per op it reports the effective bandwidth, (bytes read + bytes written) / time, beside the
device's copy bandwidth measured in the same run the same way (a tensor copy of the KV: its
bytes read + written). Ops: ``compress`` (KV -> anchor + residual), ``decompress_anchor``
(anchor -> KV), ``decompress_full`` (anchor + residual -> KV), ``decompress_paged`` (anchor +
residual -> a paged KV cache: ``vllm_flash_nhd`` on cuda, ``vllm_cpu`` on cpu,
``vllm_ascend`` on npu, blocks in shuffled order). Each result also carries ``kv_gbps``: KV
bytes (the uncompressed side) per second, the unit of the CPU target.

Shapes. cpu: SmolLM2-135M, 30 layers x [3 kv heads, 8192 tokens, 64] bf16 (189 MB of K+V),
one call per layer. cuda / npu: Llama-8B-sized KV of 16K tokens, 65536 channels x 16384
tokens bf16 (2.15 GB): K and V of [256, 16384, 128], i.e. the 32 layers x 8 kv heads stacked
along the head axis in one call (layers are independent, so this is the same work as 32 calls);
``--layers 32 --kv-heads 8`` times the 32 per-layer calls instead.
The KV is synthetic (Laplacian values with per-channel scales); kernel speed does not depend
on the values. Every op writes into buffers allocated once (streams, dense KV, the paged
cache), as a serving instance does; before 2026-11-30 the compress and dense decompress ops
allocated theirs per call, which on the CPU timed the first touch of ~190 MB of fresh pages
too. Timing: wall clock (cpu), median of ``--repeats`` after warm-up. On accelerators,
device events around back-to-back calls (``--repeats`` rounds of enough calls to fill ~50 ms,
median per call): the device's throughput in steady state, with the host's launch work
overlapped as in a pipelined transfer (a single call also counts the ~0.1 ms the host spends
before the first kernel starts, reported as ``latency_s``). When the host launches slower than
the device runs (small per-layer calls: ``--layers 30 --kv-heads 24`` on an H200 takes 5-8 ms
of wall time per 30 layers for 0.8-1.9 ms of kernels), the events time the host; so on CUDA each
result also carries ``kernel_s`` / ``kernel_gbps``, the kernels' own device time per call
(torch.profiler), the figure to compare kernels by.

JSON (``--json``): {"device": str, "copy_gbps": float, "results": [{"op", "backend", "shape":
[layers, kv_heads, tokens, head_dim], "gbps", "kv_gbps", "seconds", and on accelerators
"latency_s": one call's time, on CUDA "kernel_s" and "kernel_gbps": device time in kernels}],
plus "dtype", "config",
"threads" (cpu)}.

Config: ``--preset``, then ``--center``, ``--plan MODEL`` (a bundled model's ``lynx_plan``) and
``--set KEY=VALUE`` (any Lynx parameter). A per-layer plan times each layer with its own config
(``LynxConfig.for_layer``), so ``--plan smollm2`` on the CPU's default shape (SmolLM2's 30
layers) times that model's deployment config; on accelerators, use ``--layers`` for it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch

from lynx_npu.cli_types import MAX_TOKENS, int_in, names, output_file
from lynx_npu.codec.lynx_config import PRESETS, LynxConfig, make_config
from lynx_npu.eval.codec_specs import parse_pairs
from lynx_npu.eval.model import MODELS
from lynx_npu import ops
from lynx_npu.ops.kv_layouts import KV_CACHE_LAYOUTS, get_layout

PAGED_LAYOUT = {"cuda": "vllm_flash_nhd", "cpu": "vllm_cpu", "npu": "vllm_ascend"}
DEFAULT_SHAPE = {"cpu": (30, 3, 8192, 64), "cuda": (1, 256, 16384, 128),
                 "npu": (1, 256, 16384, 128)}
BLOCK_SIZE = {"cuda": 16, "cpu": 32, "npu": 128}
OPS = ("compress", "decompress_anchor", "decompress_full", "decompress_paged")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cpu", "cuda", "npu"),
                        help="default: cuda if available, else cpu")
    parser.add_argument("--backend", type=names([b.value for b in ops.Backend], "backend"),
                        default=None,
                        help="comma-separated backends (default: the device's automatic choice)")
    parser.add_argument("--json", type=output_file, metavar="OUT.json",
                        help="write the results here")
    parser.add_argument("--layers", type=int_in(1, 1024))
    parser.add_argument("--kv-heads", type=int_in(1, 1024))
    parser.add_argument("--tokens", type=int_in(1, MAX_TOKENS))
    parser.add_argument("--head-dim", type=int_in(1, 4096))
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--preset", default=None, choices=sorted(PRESETS),
                        help="lynx config preset (default: default)")
    parser.add_argument("--center", default=None, choices=["mean", "midrange"],
                        help="chunk centre (default: the preset's)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="set",
                        help="a Lynx parameter over the preset (repeatable; values as in "
                             "--codec-arg: int, float, true/false, JSON list), e.g. "
                             "--set anchor_bits=5 --set v_chunk_size=64")
    parser.add_argument("--plan", default=None, choices=sorted(MODELS),
                        help="a bundled model's lynx_plan over the preset (its per-layer "
                             "splits and V chunks: each layer is timed with its own config)")
    parser.add_argument("--ops", type=names(OPS, "op"), default=",".join(OPS),
                        help=f"comma-separated subset of {OPS}")
    parser.add_argument("--repeats", type=int_in(1, 100000), default=None,
                        help="timed repetitions (default 10 on accelerators, 5 on cpu)")
    parser.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0)
    parser.add_argument("--paged-layout", default=None, choices=sorted(KV_CACHE_LAYOUTS),
                        help="KV cache layout of decompress_paged (ops/kv_layouts.py; default: "
                             + ", ".join(f"{d} {n}" for d, n in PAGED_LAYOUT.items()) + ")")
    parser.add_argument("--block-order", choices=("random", "sequential"), default="random",
                        help="order of the paged cache's blocks in the slot mapping")


def _log(message: str) -> None:
    print(f"[lynx bench kernels] {message}", file=sys.stderr, flush=True)


def _sync(device: str) -> None:
    if device != "cpu":
        getattr(torch, device).synchronize()


def _time(fn, device: str, repeats: int, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` (device events on accelerators)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        if device == "cpu":
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        else:
            mod = getattr(torch, device)
            start, end = mod.Event(enable_timing=True), mod.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _time_steady(fn, device: str, repeats: int, target_s: float = 0.05) -> float:
    """Median seconds per call of ``fn()`` run back to back between two device events, in
    ``repeats`` rounds of ~``target_s`` each (accelerators only)."""
    single = _time(fn, device, 3)
    calls = max(1, min(1000, int(target_s / max(single, 1e-6))))
    mod = getattr(torch, device)
    times = []
    for _ in range(repeats):
        start, end = mod.Event(enable_timing=True), mod.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def kernel_seconds(fn, device: str, repeats: int) -> float | None:
    """Seconds per call the device spends in kernels (torch.profiler's device time, summed
    over every kernel of ``repeats`` calls after one warm-up), or None off CUDA. Beside the
    events' time it tells a host-bound call (the host launches slower than the device runs:
    small per-layer calls) from a device-bound one."""
    if device != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fn()
    _sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        _sync(device)
    return sum(e.self_device_time_total for e in prof.key_averages()) / 1e6 / repeats


def timer_for(device: str):
    """The harness's timer: wall clock on the CPU, back-to-back calls between device events
    on accelerators (``_time_steady``)."""
    return _time if device == "cpu" else _time_steady


def copy_gbps(kv, device: str, repeats: int) -> float:
    """The device's copy bandwidth on ``kv`` ([(k, v)] per layer): a tensor copy of every
    layer, bytes read + written per second (GB/s), timed as the ops are."""
    copies = [(torch.empty_like(k), torch.empty_like(v)) for k, v in kv]
    kv_bytes = sum(k.numel() * k.element_size() * 2 for k, _ in kv)

    def copy_all():
        for (k, v), (ck, cv) in zip(kv, copies):
            ck.copy_(k)
            cv.copy_(v)

    return 2 * kv_bytes / timer_for(device)(copy_all, device, repeats) / 1e9


def synthetic_kv(layers, heads, tokens, head_dim, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(layers):
        scale = torch.rand(1, 1, head_dim, generator=g) * 4 + 0.1
        lap = torch.distributions.Laplace(0.0, 1.0)
        k = (lap.sample((heads, tokens, head_dim)) * scale).to(dtype)
        v = (torch.randn(heads, tokens, head_dim, generator=g) * 0.5).to(dtype)
        out.append((k.to(device), v.to(device)))
    return out


def _paged_setup(layout_name, heads, tokens, head_dim, dtype, device, seed, random_order=True):
    bs = BLOCK_SIZE[device]
    nblocks = -(-tokens // bs)
    cache = get_layout(layout_name).allocate(nblocks, bs, heads, head_dim, dtype, device)
    order = torch.randperm(nblocks, generator=torch.Generator().manual_seed(seed)) \
        if random_order else torch.arange(nblocks)
    slots = (order.repeat_interleave(bs) * bs + torch.arange(bs).repeat(nblocks))[:tokens]
    return cache, slots.to(device)


def bench_config(args) -> LynxConfig:
    """The preset, then ``--center``, ``--plan``'s parameters and ``--set``'s, later winning;
    unknown parameters and bad values raise ValueError naming them."""
    overrides = {"center": args.center} if args.center else {}
    if args.plan:
        overrides.update(MODELS[args.plan].lynx_plan)
    overrides.update(parse_pairs(args.set, "--set"))
    return make_config(args.preset, **overrides)


def run(args) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device != "cpu" and not (hasattr(torch, device) and getattr(torch, device).is_available()):
        _log(f"device {device} is not available here")
        return 2
    layers, heads, tokens, head_dim = DEFAULT_SHAPE[device]
    layers = args.layers or layers
    heads, tokens, head_dim = args.kv_heads or heads, args.tokens or tokens, args.head_dim or head_dim
    dtype = getattr(torch, args.dtype)
    cfg = bench_config(args)
    layer_cfgs = [cfg.for_layer(i, layers) for i in range(layers)]
    repeats = args.repeats or (5 if device == "cpu" else 10)
    want_ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for o in want_ops:
        if o not in OPS:
            raise ValueError(f"unknown op {o!r}; ops: {', '.join(OPS)}")
    shape = [layers, heads, tokens, head_dim]
    _log(f"device {device}, shape {shape} {args.dtype}, config {cfg}")
    kv = synthetic_kv(layers, heads, tokens, head_dim, dtype, device, args.seed)
    kv_bytes = sum(k.numel() * k.element_size() * 2 for k, _ in kv)
    timer = timer_for(device)
    copy = copy_gbps(kv, device, repeats)
    _log(f"copy {copy:.1f} GB/s (read + write)")
    backends = args.backend.split(",") if args.backend else [None]
    results = []
    for backend in backends:
        name = ops.backend_for(device, layer_cfgs[0], heads, head_dim, dtype, backend)
        streams = [ops.compress(k, v, c, backend=backend) for (k, v), c in zip(kv, layer_cfgs)]
        a_bytes = sum(a.numel() for a, _ in streams)
        r_bytes = sum(r.numel() for _, r in streams)
        # Every op writes buffers allocated once, as serving does (staging buffers, the paged
        # cache): a fresh CPU tensor per call would time the kernel's first touch of its pages.
        packed = [(torch.empty_like(a), torch.empty_like(r)) for a, r in streams]
        dense = [(torch.empty_like(k), torch.empty_like(v)) for k, v in kv]
        layout = args.paged_layout or PAGED_LAYOUT[device]
        paged = [_paged_setup(layout, heads, tokens, head_dim, dtype, device, args.seed + i,
                              args.block_order == "random") for i in range(layers)] \
            if "decompress_paged" in want_ops else []
        jobs = {
            "compress": (lambda: [ops.compress(k, v, c, backend=backend, out=o)
                                  for (k, v), c, o in zip(kv, layer_cfgs, packed)],
                         kv_bytes + a_bytes + r_bytes),
            "decompress_anchor": (lambda: [ops.decompress(a, None, c, k.shape, dtype,
                                                          backend=backend, out=o)
                                           for (a, _), (k, _), c, o
                                           in zip(streams, kv, layer_cfgs, dense)],
                                  a_bytes + kv_bytes),
            "decompress_full": (lambda: [ops.decompress(a, r, c, k.shape, dtype,
                                                        backend=backend, out=o)
                                         for (a, r), (k, _), c, o
                                         in zip(streams, kv, layer_cfgs, dense)],
                                a_bytes + r_bytes + kv_bytes),
            "decompress_paged": (lambda: [ops.decompress_paged(a, r, c, tokens, cache, slots,
                                                               layout, backend=backend)
                                          for (a, r), (cache, slots), c
                                          in zip(streams, paged, layer_cfgs)],
                                 a_bytes + r_bytes + kv_bytes),
        }
        for op in want_ops:
            fn, nbytes = jobs[op]
            sec = timer(fn, device, repeats)
            res = {"op": op, "backend": name, "shape": shape, "gbps": nbytes / sec / 1e9,
                   "kv_gbps": kv_bytes / sec / 1e9, "seconds": sec}
            if device != "cpu":
                res["latency_s"] = _time(fn, device, repeats)
            kernel_s = kernel_seconds(fn, device, repeats)
            if kernel_s:
                res["kernel_s"], res["kernel_gbps"] = kernel_s, nbytes / kernel_s / 1e9
            results.append(res)
            _log(f"{name:8s} {op:18s} {res['gbps']:8.2f} GB/s ({res['gbps'] / copy:6.1%} of "
                 f"copy), KV {res['kv_gbps']:.2f} GB/s, {sec * 1e3:.2f} ms"
                 + (f" (one call {res['latency_s'] * 1e3:.2f} ms)" if "latency_s" in res else "")
                 + (f"; kernels {res['kernel_gbps']:.2f} GB/s, {kernel_s * 1e3:.2f} ms"
                    + (" (host-bound)" if sec > 1.5 * kernel_s else "") if kernel_s else ""))
    out = {"device": device_name(device), "copy_gbps": copy, "results": results,
           "dtype": args.dtype, "config": dataclasses.asdict(cfg)}
    if "decompress_paged" in want_ops:
        out["paged"] = {"layout": args.paged_layout or PAGED_LAYOUT[device],
                        "block_order": args.block_order}
    if device == "cpu":
        out["threads"] = torch.get_num_threads()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    return 0


def device_name(device: str) -> str:
    if device == "cuda":
        return f"cuda: {torch.cuda.get_device_name()}"
    if device == "cpu":
        import platform
        try:
            with open("/proc/cpuinfo") as f:
                model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
        except OSError:
            model = platform.processor()
        return f"cpu: {model or platform.machine()} ({torch.get_num_threads()} threads)"
    return device


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="lynx bench kernels", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
