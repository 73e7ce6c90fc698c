"""Exploration (issue 19): attention error of the Lynx anchor and full stage with K quantized
before RoPE (``prerope_accept.PreRope``), on the `lynx eval codecs` capture (essays, last
queries). Results: docs/codec.md "K before RoPE".

    python docs/experiments/prerope_probe.py --tokens 4096 --queries 256 --quiet --json OUT.json \
        [--set 'layer_anchor_bits=[[18,5,4],[23,5,4]]' ...]
"""
import argparse
import json
import sys
import time

import lynx_npu
from lynx_npu.eval.capture import capture_qkv
from lynx_npu.eval.evaluate import build_refs, evaluate_codec
from lynx_npu.eval.kv_source import KV_DTYPES, add_capture_arguments
from lynx_npu.eval.model import load_model, load_text

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from prerope_accept import MODEL, PreRope  # noqa: E402

p = argparse.ArgumentParser()
add_capture_arguments(p)
p.add_argument("--json", required=True)
p.add_argument("--set", action="append", default=[], help="a Lynx parameter, key=JSON value")
args = p.parse_args()
MODEL[0] = args.model
loaded = load_model(args.model)
ids = load_text(args.data, args.tokens, loaded.tokenizer)
refs = build_refs(capture_qkv(loaded.model, ids, keep_last_queries=min(args.queries, args.tokens)),
                  args.queries, KV_DTYPES[args.kv_dtype])
over = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
base = lynx_npu.get_codec("lynx", **over)
res = {}
for label, codec in [("lynx", base), ("lynx+prerope", PreRope(base))]:
    t0 = time.perf_counter()
    r = evaluate_codec(codec, refs, label=label, split_stages=(base.stages[0],))
    res[label] = {st.stage: st.summary() for st in r.stages}
    a, f = res[label]["anchor"], res[label]["full"]
    print(f"{label}: anchor {a['bits_per_value']:.3f} bits, K NMSE {a['k_nmse']:.3e}, attention "
          f"vNMSE {a['attn_vnmse']:.3e} (K only {a['attn_vnmse_k_only']:.3e}, V only "
          f"{a['attn_vnmse_v_only']:.3e}); full {f['bits_per_value']:.3f} bits, K NMSE "
          f"{f['k_nmse']:.3e}, attention vNMSE {f['attn_vnmse']:.3e} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
json.dump({"command": "python " + " ".join(sys.argv), "args": vars(args), "over": over,
           "results": res}, open(args.json, "w"), indent=1, default=str)
