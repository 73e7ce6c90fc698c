"""One layer's CPU kernel times at a K split (docs/benchmarks.md, "A plan's wide layers on the
CPU"): K and V of [3, 8192, 64] bf16 (a SmolLM2 layer), K's anchor ``BITS`` wide (V 4 + 4),
one thread, the least of 60 calls of each op (robust to the shared box's bursts, which the
median of ``lynx bench kernels`` is not). ``python docs/experiments/cpu_split_ab.py BITS LABEL``.
"""
import sys, time, torch
from lynx_npu import ops
from lynx_npu.codec.lynx_config import make_config
from lynx_npu.eval.bench_kernels import synthetic_kv
torch.set_num_threads(1)
bits = int(sys.argv[1])
cfg = make_config(anchor_bits=bits)
(k, v), = synthetic_kv(1, 3, 8192, 64, torch.bfloat16, "cpu", 0)
a, r = ops.compress(k, v, cfg, backend="cpu")
out = {}
for name, fn in (("anchor", lambda: ops.decompress(a, None, cfg, k.shape, torch.bfloat16, backend="cpu")),
                 ("full", lambda: ops.decompress(a, r, cfg, k.shape, torch.bfloat16, backend="cpu")),
                 ("compress", lambda: ops.compress(k, v, cfg, backend="cpu"))):
    ts = []
    for _ in range(60):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    out[name] = round(min(ts) * 1e3, 3)
print(sys.argv[2], bits, out)
