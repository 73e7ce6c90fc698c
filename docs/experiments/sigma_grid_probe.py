"""Exploration (issue 19, the byte scalar grid): where the 256 sigma levels should start.

``scalar_once_probe.py``'s ``once8 C32/32 P256 half f16`` quantizer (mu = u / 256, sigma the
first of 256 float16 levels >= max |xn - mu|: 0, 254 geometric levels 2^lo .. 2^-1, 0.5 + 2^-8)
with the lowest level 2^lo for lo in -4, -6, -8, -10, -14, beside the `lynx` and `int8` codecs
in the same run. A higher floor gives finer steps (a smaller anchor error) but a chunk much
narrower than its page channel gets sigma 2^lo. Results: docs/codec.md "The byte grid".

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python docs/experiments/sigma_grid_probe.py \\
        --tokens 4096 --queries 256 --quiet --out docs/results/sigma_grid_probe_smollm2.json
    (and --model gemma3 ... --out docs/results/sigma_grid_probe_gemma3.json)
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

import lynx_npu
from lynx_npu.eval.evaluate import evaluate_codec
from lynx_npu.eval.kv_source import add_capture_arguments, capture_from_args

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import scalar_once_probe as probe  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_capture_arguments(p)
    p.add_argument("--out", default="/tmp/sigma_grid_probe.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    cap = capture_from_args(args)
    rows = [(c, lynx_npu.get_codec(c)) for c in ("lynx", "int8")]
    for lo in (-4.0, -6.0, -8.0, -10.0, -14.0):
        s = probe.Scalars(32, 8, 8, lo, -0.95, True, True)
        rows.append((f"half lo={lo}", probe.ScalarOnce(f"h{lo}", s, s, 256)))
    res = {}
    for label, codec in rows:
        r = evaluate_codec(codec, cap.refs, label=label, split_stages=tuple(codec.stages))
        res[label] = {st.stage: {k: v for k, v in st.summary().items()
                                 if not k.startswith("per_layer")} for st in r.stages}
        print(f"{label:20s}", "  ".join(f"{st}: {d['bits_per_value']:.4f} {d['attn_vnmse']:.3e}"
                                        for st, d in res[label].items()), flush=True)
    json.dump({"meta": cap.meta, "results": res}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
