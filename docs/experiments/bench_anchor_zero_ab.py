"""A/B of the anchor-stage decode table on a GPU, for the signed-zero anchor that was measured
and not adopted (docs/codec.md, "The anchor's zero bucket"): ``lynx bench kernels`` once with
its table (a zero magnitude decodes at its bucket's centre) and once with today's (at 0),
alternated in one process. The Triton kernels are the same; only the 16 values of
``anchor_levels`` differ. Needs the variant applied:

    git apply docs/experiments/anchor_zero.patch
    python docs/experiments/bench_anchor_zero_ab.py OUT_DIR [--rounds 2]
    git checkout lynx_npu ascend_c gpu
"""
import argparse
import pathlib

import numpy as np

from lynx_npu.eval import bench_kernels
from lynx_npu.ops import tables

CURRENT = getattr(tables, "anchor_signed_levels", None)  # defined by the patch


def today(alpha: float, y_max: int, anchor_bits: int) -> np.ndarray:
    return tables.signed_levels(alpha, y_max, anchor_bits)[
        np.arange(1 << anchor_bits) << (8 - anchor_bits)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if CURRENT is None:
        raise SystemExit("apply docs/experiments/anchor_zero.patch first (see the docstring)")
    out = pathlib.Path(args.out)
    for r in range(args.rounds):
        for name, fn in (("signed_zero", CURRENT), ("today", today)):
            tables.anchor_signed_levels = fn
            tables._DEVICE_CACHE.clear()
            parser = argparse.ArgumentParser()
            bench_kernels.add_arguments(parser)
            bench_kernels.run(parser.parse_args(
                ["--device", "cuda", "--json", str(out / f"{name}_{r}.json")]))


if __name__ == "__main__":
    main()
