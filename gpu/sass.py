"""SASS of the Lynx Triton kernels without a GPU: ``python -m lynx_npu.gpu.sass [op] [k|v]``.

Compiles one kernel launch of the default configuration for sm_90 (H100) with the Triton
wheel's own ptxas, disassembles it with the wheel's nvdisasm and prints the instruction count
of every loop (per iteration) and of the whole kernel, by opcode. The counts track the issue
cost of a change before any device time is spent (docs/benchmarks.md). ``op``: compress
(default), full, anchor, paged. ``--out DIR`` keeps the .ptx / .cubin / .sass files;
``--set KEY=VALUE`` compiles another config's launch (e.g. ``--set anchor_bits=5``: a plan's
wide layer).
Launch arguments are captured from the real launcher under TRITON_INTERPRET=1 (CPU tensors)
and specialised as Triton does on a GPU: integers equal to 1 become constants, pointers and
integers divisible by 16 get that divisibility.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lynx_npu import ops
from lynx_npu.codec.lynx_config import make_config
from lynx_npu.eval.codec_specs import parse_pairs
from lynx_npu.ops import dest as _dest
from lynx_npu.ops.kv_layouts import get_layout, resolve
from lynx_npu.ops.plan import layer_plan

from . import launch

_PTR = {torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32",
        torch.int64: "i64", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def _capture(op: str, which: str, shape=(8, 512, 128), overrides=None):
    """(jit function, args, kwargs) of the K or V launch of ``op`` (Lynx parameters
    ``overrides`` over the default config)."""
    calls = []

    class _Grab:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append((self.fn, a, kw))

    cfg = make_config("default", **(overrides or {}))
    h, t, d = shape
    k = torch.randn(h, t, d).to(torch.bfloat16)
    v = torch.randn(h, t, d).to(torch.bfloat16)
    plan = layer_plan(cfg, h, t, d, torch.bfloat16)
    saved = os.environ.get("TRITON_INTERPRET"), launch.lynx_compress_kernel, \
        launch.lynx_decompress_kernel
    os.environ["TRITON_INTERPRET"] = "1"  # the launchers accept CPU tensors
    try:
        anchor, residual = ops.compress(k, v, cfg, backend="torch")
        launch.lynx_compress_kernel = _Grab(saved[1])
        launch.lynx_decompress_kernel = _Grab(saved[2])
        if op == "compress":
            launch.compress(k, v, plan)
        elif op == "paged":
            cache = get_layout("vllm_flash_nhd").allocate(t // 16, 16, h, d, torch.bfloat16, "cpu")
            launch.decompress(anchor, residual, plan,
                              _dest.paged(resolve("vllm_flash_nhd", cache), torch.arange(t)))
        else:
            launch.decompress(anchor, residual if op == "full" else None, plan,
                              _dest.dense(torch.empty_like(k), torch.empty_like(v)))
    finally:
        if saved[0] is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved[0]
        launch.lynx_compress_kernel, launch.lynx_decompress_kernel = saved[1], saved[2]
    fn, args, kw = calls["kv".index(which)]
    if "INTERPRET" in kw:  # captured under the interpreter; compiled for the GPU
        kw = {**kw, "INTERPRET": False}
    if "PACK_ASM" in kw:  # the launcher's GPU choice (bfloat16 KV here)
        kw = {**kw, "PACK_ASM": launch.TUNING["compress"]["PACK_ASM"] is not False}
    return fn, args, kw


def compile_sm90(fn, args, kw):
    """-> (compiled kernel, SASS text)."""
    sig, consts, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        val = kw.get(p.name, args[i] if i < len(args) else p.default)
        if p.is_constexpr or (isinstance(val, int) and not isinstance(val, bool) and val == 1):
            sig[p.name], consts[(i,)] = "constexpr", val
            continue
        if isinstance(val, torch.Tensor):
            sig[p.name] = "*" + _PTR[val.dtype]
        elif isinstance(val, bool):
            sig[p.name] = "i1"
        elif isinstance(val, int):
            sig[p.name] = "i32" if -2 ** 31 <= val < 2 ** 31 else "i64"
        else:
            sig[p.name] = "fp32"
        if sig[p.name].startswith("*") or (isinstance(val, int) and val % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    opts = {"num_warps": kw.get("num_warps", 4), "enable_fp_fusion": False}
    if kw.get("maxnreg"):
        opts["maxnreg"] = kw["maxnreg"]
    ck = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs),
                        target=GPUTarget("cuda", 90, 32), options=opts)
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                            "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    return ck, sass


def loop_counts(sass: str) -> tuple[list[tuple[int, collections.Counter]], collections.Counter]:
    """Per loop (a backward branch): its instructions by opcode; and the whole kernel's."""
    ins, labels, pending = [], {}, []
    for line in sass.splitlines():
        m = re.match(r"^\.(L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            addr = int(m.group(1), 16)
            for name in pending:
                labels[name] = addr
            pending = []
            ins.append((addr, re.sub(r"^@!?U?P\w+\s+", "", m.group(2)).split()[0].split(".")[0],
                        m.group(2)))
    total = collections.Counter(op for _, op, _ in ins)
    loops = []
    for addr, _, text in ins:
        m = re.search(r"BRA\s+`?\(?\.?(L_x_\d+)", text)
        if m and labels.get(m.group(1), addr) < addr:
            start = labels[m.group(1)]
            loops.append((start, collections.Counter(op for a, op, _ in ins if start <= a <= addr)))
    return loops, total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lynx_npu.gpu.sass")
    p.add_argument("op", nargs="?", default="compress",
                   choices=["compress", "full", "anchor", "paged"])
    p.add_argument("which", nargs="?", default="k", choices=["k", "v"])
    p.add_argument("--out", help="directory for the .ptx / .cubin / .sass files")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a Lynx parameter over the default config (repeatable), e.g. "
                        "--set anchor_bits=5")
    args = p.parse_args(argv)
    if not hasattr(launch.lynx_compress_kernel, "params"):
        print("run without TRITON_INTERPRET=1: the kernels must be compilable", file=sys.stderr)
        return 2
    fn, a, kw = _capture(args.op, args.which, overrides=parse_pairs(args.set, "--set"))
    ck, sass = compile_sm90(fn, a, kw)
    loops, total = loop_counts(sass)
    print(f"{args.op} {args.which}: {sum(total.values())} instructions, "
          f"{ck.metadata.shared} B shared memory")
    for start, c in loops:
        print(f"  loop at {start:#x}: {sum(c.values())} per iteration: "
              + ", ".join(f"{op} {n}" for op, n in c.most_common(12)))
    print("  kernel: " + ", ".join(f"{op} {n}" for op, n in total.most_common(16)))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        base = os.path.join(args.out, f"{args.op}_{args.which}")
        for ext, data in (("ptx", ck.asm["ptx"]), ("sass", sass)):
            with open(f"{base}.{ext}", "w") as f:
                f.write(data)
        with open(f"{base}.cubin", "wb") as f:
            f.write(ck.asm["cubin"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
