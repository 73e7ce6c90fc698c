"""Parity helpers for the ops backends: inputs, reference streams, and stream comparison.

Inputs:
- ``random_kv``: real-looking KV (Laplace K with outlier channels and a sink-like first token,
  Gaussian V). Chunk sums round in float32, so the fp16 mean depends on the addition order.
- ``exact_kv``: integer-grid KV in which every page and channel spans [lo, lo + 64 * 2^e], so
  every normalised value is a multiple of 1/64 and every chunk sum is exact in any order:
  kernels and the official reference must agree byte for byte.

Kernels sum chunks in a fixed pairwise order (tree_reference.py); against the official
reference, whose torch.sum order depends on the CPU, ``compare_streams`` checks that every
difference is explained: a chunk mean off by one fp16 ulp (and its sigma by at most one),
codes change only inside those chunks, everything else (gamma, sinks, padding, all
other codes) identical; it returns the measured rates. A mean one fp16 ulp apart moves a code
by one step of the alpha-law grid in most cases, by two where sigma is small against the mean's
ulp; ``assert_values_within_one_step`` bounds the effect on decoded values.
"""
from __future__ import annotations

import dataclasses

import torch

from lynx_npu.codec import lynx_tables
from lynx_npu.codec.lynx import LynxCodec
from lynx_npu.codec.lynx_config import LynxConfig
from lynx_npu.codec.lynx_layout import page_spans
from lynx_npu.codec.packing import unpack_bits
from lynx_npu.ops.plan import layer_plan

from .tree_reference import patched_reference

# Bounds on the measured differences to the official reference (docs/kernels.md, "Parity").
MAX_MU_DIFF_RATE = 2e-3      # fraction of chunks whose fp16 mean differs (by one ulp)
MAX_CODE_DIFF_RATE = 5e-4    # fraction of values whose 8-bit code differs (by one)


def random_kv(h: int, t: int, d: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lap = torch.distributions.Laplace(0.0, 1.0)
    torch.manual_seed(seed)
    k = lap.sample((h, t, d)) * torch.linspace(0.2, 6, d)
    k[:, 0] *= 20
    v = torch.randn(h, t, d, generator=g) * 0.5
    return k.to(dtype), v.to(dtype)


def exact_kv(cfg: LynxConfig, h: int, t: int, d: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for which in range(2):
        q = torch.randint(0, 65, (h, t, d), generator=g).float()
        for s in page_spans(cfg, t):  # each page and channel spans exactly [0, 64]
            if s.num_tokens >= 2:
                q[:, s.body_start] = 0.0
                q[:, s.body_start + 1] = 64.0
        out.append(((q - 32.0) * 2.0 ** (which - 1)).to(dtype))
    return out[0], out[1]


def codec(cfg: LynxConfig) -> LynxCodec:
    return LynxCodec(**dataclasses.asdict(cfg))


def reference_streams(cfg: LynxConfig, k, v, tree: bool = False):
    """(anchor, residual) of the official reference, or of it with the kernels' sum order."""
    if tree:
        with patched_reference():
            enc = codec(cfg).encode(k.cpu(), v.cpu())
    else:
        enc = codec(cfg).encode(k.cpu(), v.cpu())
    return enc.anchor, enc.residual


def _sections(cfg, shape, dtype, anchor, residual):
    """Yield (which, page, {name: bytes}) for every page of a layer's streams."""
    h, t, d = shape
    plan = layer_plan(cfg, h, t, d, dtype)
    for page in plan.pages:
        lay = page.layout
        for which in "kv":
            secs = {}
            for stream, base, buf in (("a", page.anchor_offset, anchor),
                                      ("r", page.residual_offset, residual)):
                for s in (lay.anchor if stream == "a" else lay.residual):
                    if s.name.startswith(which):
                        secs[s.name[2:]] = buf[base + s.offset: base + s.offset + s.nbytes]
            yield which, page, secs


def _chunk_ids(axis: str, h: int, tp: int, d: int, c: int) -> torch.Tensor:
    hh, tt, dd = torch.meshgrid(torch.arange(h), torch.arange(tp), torch.arange(d), indexing="ij")
    if axis == "channel":
        ids = (hh * -(-tp // c) + tt // c) * d + dd
    else:
        ids = (hh * tp + tt) * -(-d // c) + dd // c
    return ids.reshape(-1)


def _padding(cfg, shape, dtype, buf, which_stream: str) -> torch.Tensor:
    """The alignment-padding bytes of a stream (must be zero)."""
    h, t, d = shape
    plan = layer_plan(cfg, h, t, d, dtype)
    out = []
    for page in plan.pages:
        base = page.anchor_offset if which_stream == "anchor" else page.residual_offset
        secs = page.layout.anchor if which_stream == "anchor" else page.layout.residual
        for a, b in zip(secs, secs[1:]):
            out.append(buf[base + a.offset + a.nbytes: base + b.offset])
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.uint8)


def compare_streams(cfg: LynxConfig, shape, dtype, got, want) -> dict:
    """Check kernel streams ``got`` against reference streams ``want`` (see module doc)."""
    ga, gr = (x.cpu() for x in got)
    wa, wr = (x.cpu() for x in want)
    assert ga.shape == wa.shape and gr.shape == wr.shape
    assert not _padding(cfg, shape, dtype, ga, "anchor").any()
    assert not _padding(cfg, shape, dtype, gr, "residual").any()
    h, _, d = shape
    n_chunks = mu_diff = n_values = code_diff = max_diff = 0
    r, ab = cfg.residual_bits, cfg.anchor_bits
    pairs = zip(_sections(cfg, shape, dtype, ga, gr), _sections(cfg, shape, dtype, wa, wr))
    for (which, page, gs), (_, _, ws) in pairs:
        for name in ("gamma", "sink"):
            if name in gs:
                assert torch.equal(gs[name], ws[name]), f"{which}_{name} differs on page {page.span}"
        tp = page.span.num_tokens
        if not tp:
            continue
        gst, wst = gs["stats"].view(torch.float16).view(2, -1), ws["stats"].view(torch.float16).view(2, -1)
        ulps = (gst.view(torch.int16).int() - wst.view(torch.int16).int()).abs()
        assert int(ulps[0].max()) <= 1, f"{which} chunk mean differs by {int(ulps[0].max())} ulp"
        # sigma = max |x - mu| moves with the mean (plus its own fp16 rounding)
        dmu = (gst[0].float() - wst[0].float()).abs()
        dsg = (gst[1].float() - wst[1].float()).abs()
        ulp_sg = torch.finfo(torch.float16).eps * wst[1].float().abs() + 2.0 ** -24
        assert bool((dsg <= dmu + ulp_sg).all()), f"{which} chunk sigma moved more than its mean"
        bad_chunk = (ulps > 0).any(0)
        n = h * tp * d

        def code(secs):
            a = unpack_bits(secs["codes"], ab, n, signed=True)
            res = unpack_bits(secs["res"], r, n, signed=True)
            m = torch.where(a < 0, -a - 1, a)
            mag = (m << r) - res
            return torch.where(a < 0, -mag, mag), a < 0

        gc, gneg = code(gs)
        wc, wneg = code(ws)
        diff = (gc - wc).abs()
        # a zero code may carry either sign (x = -0.0 vs +0.0 after centring): same value
        diff = torch.where((gc.abs() == 0) & (wc.abs() == 0), 0, diff)
        ids = _chunk_ids(cfg.axis(which), h, tp, d, cfg.chunk_size)
        changed = diff > 0
        max_diff = max(max_diff, int(diff.max()) if diff.numel() else 0)
        assert bool(bad_chunk[ids[changed]].all()), \
            f"{which}: {int((changed & ~bad_chunk[ids]).sum())} codes differ in chunks with equal stats"
        n_chunks += bad_chunk.numel()
        mu_diff += int(bad_chunk.sum())
        n_values += n
        code_diff += int(changed.sum())
    return {"chunks": n_chunks, "stat_diff_chunks": mu_diff, "values": n_values,
            "code_diff_values": code_diff, "max_code_diff": max_diff,
            "stat_diff_rate": mu_diff / max(n_chunks, 1), "code_diff_rate": code_diff / max(n_values, 1)}


def assert_within_bounds(stats: dict) -> None:
    assert stats["stat_diff_rate"] <= MAX_MU_DIFF_RATE, stats
    assert stats["code_diff_rate"] <= MAX_CODE_DIFF_RATE, stats


def assert_values_within_one_step(cfg: LynxConfig, shape, dtype, got, want) -> None:
    """Decoded values of two streams (both stages) differ by at most one quantization step:
    the widest level gap (+ one fp16 ulp of the chunk mean and scale) times the page scale,
    plus the KV dtype's rounding."""
    h, t, d = shape
    c = codec(cfg)
    bound = {"k": torch.zeros(h, t, d), "v": torch.zeros(h, t, d)}
    for which, page, secs in _sections(cfg, shape, dtype, *(x.cpu() for x in want)):
        if not page.span.num_tokens:
            continue
        g = secs["gamma"].view(dtype).float().view(2, h, d)
        lv = lynx_tables.levels(cfg.alpha(which), cfg.y_max)
        gap = float((lv[1:] - lv[:-1]).max()) + 2.0 ** -10
        s = page.span
        bound[which][:, s.body_start:s.token_end] = ((g[1] - g[0]) * gap)[:, None, :]
    eps = torch.finfo(dtype).eps
    for stage in ("anchor", "full"):
        enc = [c._wrap(tuple(shape), dtype, *(x.cpu() for x in st)) for st in (got, want)]
        (gk, gv), (wk, wv) = c.decode(enc[0], stage), c.decode(enc[1], stage)
        if stage == "anchor":  # anchor codes move by one anchor step: 2**residual_bits codes
            scale = 2 ** cfg.residual_bits
        else:
            scale = 1
        for which, x, y in (("k", gk, wk), ("v", gv, wv)):
            err = (x.float() - y.float()).abs()
            lim = bound[which] * scale + 2 * eps * y.float().abs()
            assert bool((err <= lim).all()), \
                f"{stage} {which}: error {float((err - lim).max())} above one step"
