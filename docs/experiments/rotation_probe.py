"""Exploration (issue 19): does an orthogonal rotation of K / V within a head before the lynx
codec lower the anchor's attention vNMSE?  Results: docs/codec.md "Rotations before the anchor".

    python docs/experiments/rotation_probe.py --tokens 2048 --queries 128 --quiet --out OUT.json"""
import argparse, json, sys, time, math
import torch
import lynx_npu
from lynx_npu.eval.kv_source import capture_from_args, add_capture_arguments
from lynx_npu.eval.evaluate import evaluate_codec

def hadamard(n, seed):
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    h = h / math.sqrt(n)
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
    return h * signs[None, :]   # orthogonal: H diag(s)

class Rotated:
    def __init__(self, codec, rk, rv):
        self.c, self.rk, self.rv = codec, rk, rv
        self.name, self.stages = codec.name + "+rot", codec.stages
    def encode(self, k, v):
        dt = k.dtype
        kr = (k.float() @ self.rk).to(dt) if self.rk is not None else k
        vr = (v.float() @ self.rv).to(dt) if self.rv is not None else v
        return self.c.encode(kr, vr)
    def decode(self, enc, stage):
        k, v = self.c.decode(enc, stage=stage)
        dt = k.dtype
        if self.rk is not None: k = (k.float() @ self.rk.T).to(dt)
        if self.rv is not None: v = (v.float() @ self.rv.T).to(dt)
        return k, v

p = argparse.ArgumentParser(); add_capture_arguments(p)
p.add_argument("--out", default="/tmp/rot/out.json")
p.add_argument("--set", action="append", default=[])
args = p.parse_args()
cap = capture_from_args(args)
D = cap.meta["head_dim"]; H = hadamard(D, 0)
over = {}
for s in args.set:
    k, v = s.split("="); over[k] = json.loads(v)
base = lynx_npu.get_codec("lynx", **over)
res = {}
for label, codec in [("lynx", base), ("rotK", Rotated(base, H, None)), ("rotV", Rotated(base, None, H)),
                     ("rotKV", Rotated(base, H, H)),
                     ("int4", lynx_npu.get_codec("int4")), ("kivi4", lynx_npu.get_codec("kivi4"))]:
    r = evaluate_codec(codec, cap.refs, label=label, split_stages=tuple(codec.stages[:1]))
    res[label] = {st.stage: {k: v for k, v in st.summary().items() if not k.startswith("per_layer")} for st in r.stages}
    print(label, json.dumps(res[label]), flush=True)
json.dump({"meta": cap.meta, "over": over, "results": res}, open(args.out, "w"), indent=1)
