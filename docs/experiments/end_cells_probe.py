"""Issue 19 (measured 2026-11-29 on payload format 7): the full stage's end cells.

Built since as payload format 8, with other levels (each end-cell code split at its own level;
docs/codec.md "As built"): this probe patches the format-7 quantizer's codes, so it reproduces
its JSON only at a format-7 commit (660a1f4).

A 4 + 4 value is a sign and a magnitude code I in [0, 112]; the anchor keeps m = (I + 7) >> 4 and
the residual the rest, so anchor cell m holds the 16 codes I = 16m - 7 .. 16m + 8, but its two
end cells only part of them: m = 0 the 9 codes 0..8 (I = 0 is the same level for both signs),
m = 7 the 8 codes 105..112; 31 of the 256 (anchor, residual) pairs decode nowhere new. This
probe re-codes only those two cells with 16 full-stage levels each, uniform in the alpha-law
domain y = ln(1 + alpha |xf|) / ln(1 + alpha) * 112 and each keeping the anchor's own level
(residual code 0 still decodes to it, so the anchor stage and the window's made-up residual are
unchanged): m = 0 at y = k * 8.5 / 16, m = 7 at y = 104.5 + (k + 1) * 7.5 / 16 (k = 0..15; the
chunk extreme y = 112 exact). Every other code, the anchor and the bytes are the codec's.

It patches ``lynx_ref.quantize`` / ``dequantize`` in this process (an experiment, not a codec
option) and runs the real reference codec (``get_codec("lynx", **overrides)``: pages, sinks, the
recent-token window, bits with every scalar) on captured KV, for each config of ``--configs``
(``;``-separated ``key=value,...`` overrides; ``default`` for none), beside INT8 (per token per
head) in the same run; attention vNMSE as ``lynx eval codecs`` computes it.

    OMP_NUM_THREADS=1 python docs/experiments/end_cells_probe.py --tokens 4096 --quiet \\
        --configs "default;v_chunk_size=64;page_size=512,v_chunk_size=64" --out OUT.json
"""
import argparse
import contextlib
import json
import math

import torch

import lynx_npu
from lynx_npu.codec import lynx_ref
from lynx_npu.codec.base import to_kv_dtype
from lynx_npu.eval.kv_source import add_capture_arguments, capture_from_args
from lynx_npu.eval.metrics import attention_vnmse

_quantize, _dequantize = lynx_ref.quantize, lynx_ref.dequantize


def _cells(cfg, which):
    """(top magnitude, y_max, bottom step, top start, top step) of the end cells."""
    y_max = cfg.y_max(which)
    half = (1 << cfg.residual_bits(which)) // 2
    n = 1 << cfg.residual_bits(which)
    return ((1 << (cfg.bits(which) - 1)) - 1, y_max, (half + 0.5) / n, y_max - (half - 0.5),
            (half - 0.5) / n)


def _y(xf, cfg, which):
    alpha = cfg.alpha(which)
    return torch.log1p(alpha * xf.abs().double()) / math.log1p(alpha) * cfg.y_max(which)


def _signed(code, r):  # [0, 2^r) -> the r-bit signed residual field
    return torch.where(code >= (1 << (r - 1)), code - (1 << r), code)


def _xfin(x, gamma, stats, cfg, which):
    """The chunk-normalised values the quantizer coded, from its own scalars."""
    n, h, tp, d = x.shape
    axis = cfg.axis(which)
    g = gamma.float().view(n, 2, h, 1, d)
    xn = (x.float() - g[:, 0]) * lynx_ref.reciprocal_or_zero(g[:, 1] - g[:, 0])
    a_len = d if axis == "channel" else tp
    mu = lynx_ref._stats_unorder(stats[:, 0].float(), axis, h, a_len)
    sigma = lynx_ref._stats_unorder(stats[:, 1].float(), axis, h, a_len)
    chunks, _ = lynx_ref._chunked(xn, axis, cfg.chunk(which))
    xf = (chunks - mu.unsqueeze(-1)) * lynx_ref.reciprocal_or_zero(sigma.unsqueeze(-1))
    return lynx_ref._unchunked(xf, axis, tp if axis == "channel" else d)


def quantize(x, cfg, which):
    anchor, residual, gamma, stats = _quantize(x, cfg, which)
    top, _, lo_w, hi_0, hi_w = _cells(cfg, which)
    r = cfg.residual_bits(which)
    y = _y(_xfin(x, gamma, stats, cfg, which), cfg, which)
    m = torch.where(anchor < 0, -anchor - 1, anchor)
    k_lo = torch.clamp(torch.round(y / lo_w), 0, 15).long()            # code k: level k
    k_hi = torch.clamp(torch.round((y - hi_0) / hi_w - 1), 0, 15).long()
    code = torch.where(m == 0, k_lo, torch.where(m == top, 15 - k_hi, 0))  # 0: the anchor's
    residual = torch.where((m == 0) | (m == top), _signed(code, r), residual)
    return anchor, residual, gamma, stats


def dequantize(anchor, residual, gamma, stats, cfg, which, dtype):
    if residual is None:
        return _dequantize(anchor, None, gamma, stats, cfg, which, dtype)
    top, y_max, lo_w, hi_0, hi_w = _cells(cfg, which)
    r = cfg.residual_bits(which)
    m = torch.where(anchor < 0, -anchor - 1, anchor)
    code = residual & ((1 << r) - 1)
    y = torch.where(m == 0, code * lo_w, hi_0 + (16 - code) * hi_w).double()
    end = (m == 0) | (m == top)
    # the codec's own decode, then the end cells' values in place
    out = _dequantize(anchor, torch.where(end, 0, residual), gamma, stats, cfg, which,
                      torch.float32)
    alpha = cfg.alpha(which)
    mag = (torch.expm1(y / y_max * math.log1p(alpha)) / alpha).float()
    mag = torch.where(m == top, torch.where(code == 0, 1.0, mag), mag)
    xf = torch.where(anchor < 0, -mag, mag)
    n, h, tp, d = anchor.shape
    axis = cfg.axis(which)
    mu = lynx_ref._stats_unorder(stats[:, 0].float(), axis, h, d if axis == "channel" else tp)
    sigma = lynx_ref._stats_unorder(stats[:, 1].float(), axis, h, d if axis == "channel" else tp)
    chunks, _ = lynx_ref._chunked(xf, axis, cfg.chunk(which))
    xn = lynx_ref._unchunked(chunks * sigma.unsqueeze(-1) + mu.unsqueeze(-1), axis,
                             tp if axis == "channel" else d)
    g = gamma.float().view(n, 2, h, 1, d)
    ends = xn * (g[:, 1] - g[:, 0]) + g[:, 0]
    return to_kv_dtype(torch.where(end, ends, out), dtype)


@contextlib.contextmanager
def end_cells():
    lynx_ref.quantize, lynx_ref.dequantize = quantize, dequantize
    try:
        yield
    finally:
        lynx_ref.quantize, lynx_ref.dequantize = _quantize, _dequantize


def _overrides(text):
    if text == "default":
        return {}
    out = {}
    for item in text.split(","):
        key, value = item.split("=")
        out[key.strip()] = int(value) if value.strip().isdigit() else value.strip()
    return out


def _attn(ref, k_hat, v_hat):
    kw = dict(window=ref.window, scale=ref.scale)
    return (attention_vnmse(ref.q, ref.k, ref.v, k_hat, v_hat, ref.o, **kw),
            attention_vnmse(ref.q, ref.k, ref.v, k_hat, ref.v, ref.o, **kw),
            attention_vnmse(ref.q, ref.k, ref.v, ref.k, v_hat, ref.o, **kw))


def _run(codec, refs, stages=("anchor", "full")):
    """-> per-layer rows and bits per value of each stage, through the codec's streams."""
    rows, nbits, values = [], dict.fromkeys(stages, 0), 0
    for ref in refs:
        enc = codec.encode(ref.k, ref.v)
        row = {}
        for stage in stages:
            nbits[stage] += 8 * enc.nbytes(stage)
            row[stage], row[stage + "_k_only"], row[stage + "_v_only"] = _attn(
                ref, *codec.decode(enc, stage=stage))
        values += 2 * ref.k.numel()
        rows.append(row)
    mean = {key: sum(r[key] for r in rows) / len(rows) for key in rows[0]}
    mean.update({f"{s}_bits": nbits[s] / values for s in nbits})
    return mean, rows


def main() -> None:
    ap = argparse.ArgumentParser()
    add_capture_arguments(ap)
    ap.add_argument("--configs", default="default")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    kv = capture_from_args(args)
    int8, _ = _run(lynx_npu.get_codec("int8"), kv.refs, ("full",))
    results = {"int8": int8}
    for text in args.configs.split(";"):
        codec = lynx_npu.get_codec("lynx", **_overrides(text))
        base, _ = _run(codec, kv.refs)
        with end_cells():
            ends, rows = _run(codec, kv.refs)
        if ends["anchor_bits"] != base["anchor_bits"] or ends["full_bits"] != base["full_bits"]:
            raise SystemExit("the end cells changed the bytes")
        # the anchor changes only in its recent-token window (full-stage codes in the anchor)
        summary = {"full_bits": base["full_bits"], "anchor_bits": base["anchor_bits"],
                   "anchor": base["anchor"], "anchor_end_cells": ends["anchor"],
                   "full": base["full"],
                   "full_end_cells": ends["full"],
                   "full_k_only": base["full_k_only"], "full_v_only": base["full_v_only"],
                   "full_end_cells_k_only": ends["full_k_only"],
                   "full_end_cells_v_only": ends["full_v_only"],
                   "end_cells_ratio": ends["full"] / base["full"],
                   "full_over_int8_5": base["full"] / (int8["full"] / 5),
                   "full_end_cells_over_int8_5": ends["full"] / (int8["full"] / 5)}
        results[text] = {"summary": summary, "layers_end_cells": rows}
        print(text, json.dumps(summary, indent=1), flush=True)
    with open(args.out, "w") as f:
        json.dump({"meta": {k: v for k, v in kv.meta.items() if k != "layer_windows"},
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
