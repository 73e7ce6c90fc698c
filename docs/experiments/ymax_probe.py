"""Issue 19, the full stage's unused codes: run ``scalar_once_probe.py`` with ``y_max`` widened.

A 4 + 4 value is coded as a magnitude I in [0, y_max] plus a sign; y_max = 112 keeps the chunk
extremes (|xf| = 1, code y_max = 7 << 4) exact in the anchor alone, but uses 225 of the 8 bits'
256 codes. The split allows I up to 120 (the largest I with (I + bias) >> r < 2^(a-1)):
finer full-stage levels, at the anchor's cost. YMAX_MODE:

  default  the codec as it is;
  wide     y_max + 2^r - 1 - bias (4 + 4: 120); the anchor decodes magnitude m at m << r;
  widetop  wide, and the anchor's top magnitude decodes at y_max (the extremes exact again).

    YMAX_MODE=wide python docs/experiments/ymax_probe.py docs/experiments/scalar_once_probe.py \\
        --model smollm2 --tokens 4096 --queries 256 --quiet --only "lynx,..." --out OUT.json

It patches ``LynxConfig.y_max`` and the anchor decode of ``lynx_ref`` and of the probe's own
quantizer in this process only (an experiment, not a codec option).
"""
import os
import runpy
import sys

import torch

from lynx_npu.codec import lynx_config, lynx_ref

MODE = os.environ.get("YMAX_MODE", "default")
if MODE not in ("default", "wide", "widetop"):
    raise SystemExit(f"YMAX_MODE={MODE!r}: default, wide or widetop")
_y_max = lynx_config.LynxConfig.y_max


def _wide_y_max(self, which):
    return _y_max(self, which) + (1 << self.residual_bits(which)) - 1 - self.bias(which)


def _anchor_residual(anchor, cfg, which):
    """The residual that makes the full-stage decode give the anchor's value."""
    m = torch.where(anchor < 0, -anchor - 1, anchor)
    i = m << cfg.residual_bits(which)
    if MODE == "widetop":
        i = torch.where(m == (1 << (cfg.bits(which) - 1)) - 1, cfg.y_max(which), i)
    return (m << cfg.residual_bits(which)) - i


_dequantize = lynx_ref.dequantize


def _ref_dequantize(anchor, residual, gamma, stats, cfg, which, dtype):
    if residual is None and MODE == "widetop":
        residual = _anchor_residual(anchor, cfg, which)
    return _dequantize(anchor, residual, gamma, stats, cfg, which, dtype)


def _patch_probe(namespace):
    for obj in list(namespace.values()):
        if not (isinstance(obj, type) and hasattr(obj, "_dequantize")):
            continue
        original = obj._dequantize

        def _dequantize_probe(self, q, which, stage, dtype, original=original):
            if stage != "anchor" or MODE != "widetop":
                return original(self, q, which, stage, dtype)
            anchor, _, gamma, mu, sigma, prev = q
            if prev is not None:   # the anchor stage decodes with the preview scalars
                mu, sigma = prev
            res = _anchor_residual(anchor, self.cfg[which], which)
            return original(self, (anchor, res, gamma, mu, sigma, None), which, "full", dtype)
        obj._dequantize = _dequantize_probe


if __name__ == "__main__":
    if MODE != "default":
        lynx_config.LynxConfig.y_max = _wide_y_max
        lynx_ref.dequantize = _ref_dequantize
    probe, sys.argv = sys.argv[1], sys.argv[1:]
    namespace = runpy.run_path(probe, run_name="ymax_probe")
    _patch_probe(namespace)
    namespace["main"]()
