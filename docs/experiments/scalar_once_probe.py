"""Exploration (issue 19, "total bytes no larger than INT8's"): send each chunk scalar once, at
the precision the quantizer uses.  Results: docs/codec.md "Scalars sent once".

The default split ``lynx`` codec quantizes against exact float16 chunk scalars (mu, sigma),
sends a one-byte preview of each in the anchor and the exact float16 pair again in the
residual: ~9.64 bits/value in total.  The variants here quantize against *coarse stored*
scalars instead, so the anchor and the full stage reconstruct with exactly them and nothing
is sent twice:

  mu_q    = u / (2^b_mu - 1),  u = round(mu * (2^b_mu - 1))     (mu = chunk midrange, as lynx)
  sigma_q = the smallest stored level >= max |xn - mu_q| over the chunk (chosen *after*
            rounding mu, so every |xf| <= 1 and nothing clips), levels 0 and
            2^(smin + (-smin) (u - 1) / (2^b_sigma - 2)), u = 1 .. 2^b_sigma - 1 (geometric;
            smin = -14 and 8 bits is the preview grid of lynx_stream.py; ``sigma_max_log2``
            moves the top level; ``half``: mu = u / 2^b_mu and levels 2^smin .. 0.5 exactly
            plus one top level 0.5 + 2^-b_mu)

then codes exactly as lynx_ref.quantize (tables, split, sign) and decode exactly as
lynx_ref.dequantize with those scalars.  Per variant: K chunk size / scalar bits, V chunk
size / scalar bits, page size.  The row ``ref-f16`` is this reimplementation with the
reference's float16 scalars and preview bytes for the anchor stage: it must (and does)
reproduce the ``lynx`` codec row, bytes and errors.

Bits charged (exact, per layer, summed over layers like ``lynx eval codecs``): every page
is laid out as lynx_layout.stream_layout lays out a real page (``_sections``: each section
starts at a multiple of 32 bytes, zero-padded):
  anchor   k_codes, v_codes (packed 4-bit), k_gamma, v_gamma ([2, H*D] bf16 min / max),
           k_scalars, v_scalars (mu bytes then sigma bytes: packed_nbytes(nc, b_mu) +
           packed_nbytes(nc, b_sigma)), k_sink, v_sink (page 0: 4 exact bf16 tokens)
  residual k_res, v_res (packed 4-bit)  [ref-f16 only: + k_stats, v_stats float16 [2, nc]]
bits/value = 8 * bytes / (2 * H * T * D), sinks, gamma and padding included.

Measurement: ``lynx eval codecs``'s (lynx_npu.eval.evaluate.evaluate_codec), the baseline
rows ``lynx``, ``int8``, ``int4``, ``kivi4`` in the same run; K-only / V-only attention vNMSE
for both stages.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 nice -n 19 \\
        python docs/experiments/scalar_once_probe.py --tokens 2048 --queries 128 --quiet \\
        --out docs/results/scalar_once_probe_smollm2.json
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import torch

import lynx_npu
from lynx_npu.codec import lynx_ref, lynx_stream, lynx_tables
from lynx_npu.codec.base import to_kv_dtype
from lynx_npu.codec.lynx_config import make_config
from lynx_npu.codec.lynx_layout import _sections, page_spans
from lynx_npu.codec.packing import packed_nbytes
from lynx_npu.eval.evaluate import evaluate_codec
from lynx_npu.eval.kv_source import add_capture_arguments, capture_from_args


@dataclass(frozen=True)
class Scalars:
    chunk: int
    mu_bits: int | None      # None: the reference's float16 scalars (+ previews in the anchor)
    sigma_bits: int | None
    sigma_min_log2: float = -14.0
    sigma_max_log2: float = 0.0   # top level; >= log2(0.5 + 1 / (2 (2^mu_bits - 1))) needed
    half: bool = False  # mu = u / 2^b (0.5 on the grid); sigma levels 2^smin .. 2^-1 exactly,
                        # then one top level 0.5 + 2^-b_mu: a chunk spanning its page channel's
                        # whole range (sigma = 0.5 at mu = 0.5) is stored exactly
    f16_levels: bool = False  # sigma levels rounded to float16, so the kernels can keep
                              # float16 stats that lie on the grid (a lossless byte map)

    def nbytes(self, nc: int) -> int:
        if self.mu_bits is None:
            return 2 * nc                # [2, nc] uint8 previews (the f16 go to the residual)
        return packed_nbytes(nc, self.mu_bits) + packed_nbytes(nc, self.sigma_bits)

    def sigma_levels(self) -> torch.Tensor:
        steps = (1 << self.sigma_bits) - 2
        u = torch.arange(steps + 1, dtype=torch.float64)
        lo, hi = self.sigma_min_log2, self.sigma_max_log2
        if self.half:
            u = u[:-1]
            lv = torch.exp2(lo + u * ((-1.0 - lo) / (steps - 1)))
            lv[-1] = 0.5
            lv = torch.cat([lv, torch.tensor([0.5 + 2.0 ** -self.mu_bits], dtype=torch.float64)])
        else:
            lv = torch.exp2(lo + u * ((hi - lo) / steps))
            lv[-1] = 2.0 ** hi
        levels = torch.cat([torch.zeros(1, dtype=torch.float64), lv]).float()
        return levels.half().float() if self.f16_levels else levels


@dataclass
class Enc:
    shape: tuple
    dtype: torch.dtype
    pages: list            # per page: dict which -> (anchor, residual, gamma, mu, sigma, prev)
    sinks: tuple
    anchor_nbytes: int
    residual_nbytes: int
    stages = ("anchor", "full")

    def nbytes(self, stage="full"):
        return self.anchor_nbytes + (self.residual_nbytes if stage == "full" else 0)


class ScalarOnce:
    """Lynx (default config) with stored chunk scalars of chosen precision."""

    stages = ("anchor", "full")

    def __init__(self, name, k: Scalars, v: Scalars, page_size=256):
        self.name, self.sc = name, {"k": k, "v": v}
        self.cfg = {w: make_config(None, page_size=page_size, chunk_size=s.chunk)
                    for w, s in self.sc.items()}
        self.page_size = page_size

    # -- one side, n pages of equal length [n, H, Tp, D] -------------------------------------
    def _quantize(self, x, which):
        cfg, sc = self.cfg[which], self.sc[which]
        n, h, tp, d = x.shape
        axis = cfg.axis(which)
        xf32 = x.float()
        gmin, gmax = xf32.amin(dim=2, keepdim=True), xf32.amax(dim=2, keepdim=True)
        xn = (xf32 - gmin) * lynx_ref.reciprocal_or_zero(gmax - gmin)
        chunks, mask = lynx_ref._chunked(xn, axis, cfg.chunk_size)
        big = torch.finfo(torch.float32).max
        hi = torch.where(mask, chunks, -big).amax(dim=-1)
        lo = torch.where(mask, chunks, big).amin(dim=-1)
        mid = (hi + lo) / 2
        if sc.mu_bits is None:                       # the reference, bit for bit
            mu = mid.to(torch.float16).float()
            xc = chunks - mu.unsqueeze(-1)
            sigma = torch.where(mask, xc.abs(), 0.0).amax(dim=-1).to(torch.float16).float()
        else:
            qm = (1 << sc.mu_bits) - (0 if sc.half else 1)
            lv = sc.sigma_levels()
            mu = torch.round(mid.clamp(0, 1) * qm).clamp(max=(1 << sc.mu_bits) - 1) / qm
            # max |xn - mu| over the chunk = half its range + |mu - mid|: the rounded mu is the
            # grid point that needs the smallest sigma
            need = torch.maximum(hi - mu, mu - lo)
            idx = torch.searchsorted(lv, need.contiguous(), right=False)
            idx = idx.clamp(max=lv.numel() - 1)
            xc = chunks - mu.unsqueeze(-1)
            sigma = lv[idx]
            assert bool((sigma >= need).all())
        xfin = xc * lynx_ref.reciprocal_or_zero(sigma.unsqueeze(-1))
        xfin = lynx_ref._unchunked(xfin, axis, tp if axis == "channel" else d)
        r = cfg.residual_bits(which)
        thr = lynx_tables.thresholds(cfg.alpha(which), cfg.y_max(which))
        i = torch.searchsorted(thr, xfin.abs().contiguous(), right=True).to(torch.int64)
        m = (i + cfg.bias(which)) >> r
        residual = (m << r) - i
        anchor = torch.where(xfin < 0, -m - 1, m)
        gamma = torch.stack([gmin, gmax]).to(x.dtype)
        prev = None
        if sc.mu_bits is None:   # anchor-stage stand-ins: lynx_stream's preview bytes, expanded
            st = torch.stack([mu.reshape(n, -1), sigma.reshape(n, -1)], dim=1).to(torch.float16)
            ex = lynx_stream.expand(lynx_stream.preview(st)).float()
            prev = (ex[:, 0].view_as(mu), ex[:, 1].view_as(sigma))
        return anchor, residual, gamma, mu, sigma, prev

    def _dequantize(self, q, which, stage, dtype):
        cfg = self.cfg[which]
        anchor, residual, gamma, mu, sigma, prev = q
        if stage == "anchor" and prev is not None:
            mu, sigma = prev
        n, h, tp, d = anchor.shape
        axis = cfg.axis(which)
        neg = anchor < 0
        m = torch.where(neg, -anchor - 1, anchor)
        i = m << cfg.residual_bits(which)
        if stage == "full":
            i = i - residual
        lv = lynx_tables.levels(cfg.alpha(which), cfg.y_max(which))
        mag = lv[i.clamp(0, cfg.y_max(which))]
        xfin = torch.where(neg, -mag, mag)
        chunks, _ = lynx_ref._chunked(xfin, axis, cfg.chunk_size)
        xn = lynx_ref._unchunked(chunks * sigma.unsqueeze(-1) + mu.unsqueeze(-1), axis,
                                 tp if axis == "channel" else d)
        g = gamma.float()
        return to_kv_dtype(xn * (g[1] - g[0]) + g[0], dtype)

    # -- bytes of one page, laid out like lynx_layout.stream_layout --------------------------
    def _page_nbytes(self, h, d, es, tp, ns):
        nv = h * tp * d
        anchor = [("k_codes", packed_nbytes(nv, 4)), ("v_codes", packed_nbytes(nv, 4)),
                  ("k_gamma", 2 * h * d * es), ("v_gamma", 2 * h * d * es)]
        residual = [("k_res", packed_nbytes(nv, 4)), ("v_res", packed_nbytes(nv, 4))]
        for w in "kv":
            sc, cfg = self.sc[w], self.cfg[w]
            a_len = tp if cfg.axis(w) == "channel" else d
            nc = nv // a_len * -(-a_len // sc.chunk)
            anchor.append((f"{w}_scalars", sc.nbytes(nc)))
            if sc.mu_bits is None:
                residual.append((f"{w}_stats", 2 * nc * 2))
        if ns:
            anchor += [("k_sink", h * ns * d * es), ("v_sink", h * ns * d * es)]
        return _sections(anchor)[1], _sections(residual)[1]

    def encode(self, k, v):
        h, t, d = k.shape
        cfg = self.cfg["k"]
        spans = page_spans(cfg, t)
        pages, a_n, r_n = [], 0, 0
        es = k.element_size()
        for s in spans:
            pg = {}
            for w, x in (("k", k), ("v", v)):
                pg[w] = self._quantize(x[:, s.body_start:s.token_end].unsqueeze(0), w)
            pages.append(pg)
            a, r = self._page_nbytes(h, d, es, s.num_tokens, s.num_sink)
            a_n, r_n = a_n + a, r_n + r
        ns = spans[0].num_sink
        return Enc(tuple(k.shape), k.dtype, pages, (k[:, :ns], v[:, :ns]), a_n, r_n)

    def decode(self, enc, stage="full"):
        out = []
        for j, w in enumerate("kv"):
            parts = [enc.sinks[j]] + [self._dequantize(pg[w], w, stage, enc.dtype)[0]
                                      for pg in enc.pages]
            out.append(torch.cat(parts, dim=1))
        return out[0], out[1]


def variants():
    f16 = Scalars(32, None, None)
    narrow = (-4.0, -0.95)   # sigma grid 2^-4 .. 0.518 (page-normalised sigma <= 0.5 + mu error)

    def once(label, kc, vc, kb, vb, grid=(-5.0, 0.0), page=256, half=False, f16=False):
        k = Scalars(kc, kb[0], kb[1], *grid, half, f16)
        v = Scalars(vc, vb[0], vb[1], *grid, half, f16)
        return label, ScalarOnce(label, k, v, page)

    b8, b7, b6 = (8, 8), (7, 7), (6, 6)
    return [
        ("ref-f16", ScalarOnce("ref-f16", f16, f16)),
        # mu bits / sigma bits, K chunk / V chunk, page; sigma grid 2^-5 .. 1 unless named
        once("once8 C32/32 P256 s-14..0", 32, 32, b8, b8, (-14.0, 0.0)),   # the preview grids
        once("once8 C32/32 P256", 32, 32, b8, b8),
        once("once8 C32/32 P256 narrow", 32, 32, b8, b8, narrow),
        once("once8 C32/32 P512", 32, 32, b8, b8, page=512),
        once("once7 C32/32 P256", 32, 32, b7, b7),
        once("once7 C32/32 P512", 32, 32, b7, b7, page=512),
        once("once6 C32/32 P256", 32, 32, b6, b6),
        once("once6 C32/32 P512", 32, 32, b6, b6, page=512),
        once("once6 C32/32 P512 narrow", 32, 32, b6, b6, narrow, 512),
        once("once5/7 C32/32 P512 narrow", 32, 32, (5, 7), (5, 7), narrow, 512),
        once("K7/7 V5/5 C32/32 P512 narrow", 32, 32, b7, (5, 5), narrow, 512),
        once("K6/7 V6/5 C32/32 P512 narrow", 32, 32, (6, 7), (6, 5), narrow, 512),
        once("once6/7 C32/32 P1024 narrow", 32, 32, (6, 7), (6, 7), narrow, 1024),
        once("once5/6 C32/32 P256 narrow", 32, 32, (5, 6), (5, 6), narrow),
        once("once8 C32/64 P256 s-14..0", 32, 64, b8, b8, (-14.0, 0.0)),
        once("once8 C32/64 P256", 32, 64, b8, b8),
        once("once8 C32/64 P512", 32, 64, b8, b8, page=512),
        once("once7 C32/64 P256", 32, 64, b7, b7),
        once("once7 C32/64 P256 narrow", 32, 64, b7, b7, narrow),
        once("once8/6 C32/64 P256", 32, 64, (8, 6), (8, 6)),
        once("once6/8 C32/64 P256", 32, 64, (6, 8), (6, 8)),
        once("once6/8 C32/64 P256 narrow", 32, 64, (6, 8), (6, 8), narrow),
        # "half" grids: mu = u / 2^b, sigma 2^-4 .. 0.5 exactly + one top level
        once("once8 C32/32 P256 half", 32, 32, b8, b8, narrow, half=True),
        once("once8 C32/32 P256 half f16", 32, 32, b8, b8, narrow, half=True, f16=True),
        once("once6 C32/32 P512 half", 32, 32, b6, b6, narrow, 512, True),
        once("K6/7 V6/5 C32/32 P512 half", 32, 32, (6, 7), (6, 5), narrow, 512, True),
        once("K7/7 V5/5 C32/32 P512 half", 32, 32, b7, (5, 5), narrow, 512, True),
        once("once5/6 C32/32 P256 half", 32, 32, (5, 6), (5, 6), narrow, half=True),
        once("once7 C32/64 P256 half", 32, 64, b7, b7, narrow, half=True),
        once("once6/8 C32/64 P256 half", 32, 64, (6, 8), (6, 8), narrow, half=True),
    ]


def sigma_quantiles(refs):
    """Where the page-normalised chunk sigmas lie (default config): to size the sigma grid."""
    out = {}
    for which, axis_c in (("k", 32), ("v", 32)):
        cfg = make_config(None)
        vals = []
        for ref in refs:
            x = ref.k if which == "k" else ref.v
            body = x[:, 4:4 + 7 * 256].reshape(x.shape[0], 7, 256, -1).transpose(0, 1)
            _, _, _, stats = lynx_ref.quantize(body, cfg, which)
            vals.append(stats[:, 1].float().flatten())
        v = torch.cat(vals)
        qs = [0.001, 0.01, 0.1, 0.5, 0.9, 0.99]
        out[which] = {str(q): float(torch.quantile(v[torch.randperm(v.numel(), generator=
                      torch.Generator().manual_seed(0))[:1 << 20]], q)) for q in qs}
        out[which]["min"] = float(v.min())
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_capture_arguments(p)
    p.add_argument("--out", default="/tmp/scalar_once_probe.json")
    p.add_argument("--only", default=None, help="comma-separated variant labels (default all)")
    args = p.parse_args()
    torch.set_num_threads(1)
    cap = capture_from_args(args)
    res, t0 = {}, time.perf_counter()
    rows = [(c, lynx_npu.get_codec(c)) for c in ("lynx", "int8", "int4", "kivi4")] + variants()
    if args.only:
        keep = set(args.only.split(","))
        rows = [r for r in rows if r[0] in keep]
    for label, codec in rows:
        r = evaluate_codec(codec, cap.refs, label=label, split_stages=tuple(codec.stages))
        res[label] = {st.stage: {k: v for k, v in st.summary().items()
                                 if not k.startswith("per_layer")} for st in r.stages}
        line = "  ".join(f"{st}: {d['bits_per_value']:.4f} b {d['attn_vnmse']:.3e} "
                         f"(K {d.get('attn_vnmse_k_only', float('nan')):.2e} "
                         f"V {d.get('attn_vnmse_v_only', float('nan')):.2e})"
                         for st, d in res[label].items())
        print(f"{label:30s} {line}", flush=True)
    sq = sigma_quantiles(cap.refs)
    print("sigma quantiles", json.dumps(sq), flush=True)
    meta = dict(cap.meta, elapsed_s=time.perf_counter() - t0)
    json.dump({"meta": meta, "sigma_quantiles": sq, "results": res}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
