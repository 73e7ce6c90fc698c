"""Compress kernel (host build) vs the reference codec: same wire bytes, for both chunk centres
and both scalar grids.

Exact-arithmetic inputs must give identical streams with either centre. With the midrange (the
default: max, min, one add and an exact halving, no addition order) realistic inputs must too.
With the mean, realistic inputs may differ only where a chunk's mean lands on the other side of a
rounding boundary of mu (float32 chunk sums in a different addition order): one float16 ulp, or
one step of the byte grid; those chunks are rare (documented bound below), and their codes still
decode within one quantization step of the reference.
"""
import dataclasses

import pytest
import torch

from lynx_npu.codec import lynx_tables
from lynx_npu.codec.lynx import EncodedLynx, LynxCodec

from .parity import (SPLIT_BITS, SPLIT_CHUNKS, SPLIT_SHAPES, edge_kv, exact_kv, page_views, random_kv,
                     ulp_distance)

DTYPES = [torch.bfloat16, torch.float16]
CENTERS = ["midrange", "mean"]  # LynxConfig.center; "midrange" is the default config's
GRIDS = ["float16", "byte"]     # LynxConfig.scalar_grid: any float16 mu / sigma, or the byte grid
# (preset, overrides): default (K per channel, V per token, 4 sinks), the paper's literal axes,
# small pages / chunks (many pages, ragged chunk tails), head_dim smaller than the chunk. Each
# runs with both centres (the `center` parameter overrides the preset's).
CONFIGS = [
    ("default", {}),
    ("paper", {}),
    ("default", {"page_size": 64, "chunk_size": 16, "num_sink_tokens": 3}),
    ("default", {"page_size": 48, "chunk_size": 8, "v_chunk_size": 8, "v_axis": "channel", "alpha_k": 20.0}),
]
SHAPES = [(2, 1, 16), (2, 3, 32), (1, 37, 64), (3, 200, 16), (2, 300, 64), (1, 517, 128)]
# Measured on random_kv (see README): <= 2e-4 of channel-axis chunks; the bound leaves margin.
MAX_MEAN_ULP_RATE = 2e-3


def _ids(val):
    return str(val).replace("torch.", "").replace(" ", "")


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("center", CENTERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("preset,overrides", CONFIGS, ids=_ids)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_exact_inputs_give_identical_bytes(host_build, grid, center, dtype, preset, overrides, shape):
    codec = LynxCodec(preset, **{**overrides, "center": center, "scalar_grid": grid})
    k, v = exact_kv(codec.config, *shape, dtype)
    ref = codec.encode(k, v)
    anchor, residual = host_build.compress(k, v, codec.config)
    assert torch.equal(anchor, ref.anchor)
    assert torch.equal(residual, ref.residual)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("preset,overrides", [("default", {}), ("paper", {"center": "midrange"})], ids=_ids)
# (4, 2048, 128): ~1M values per stream, where 6-14 codes of each depend on normalising by a
# multiplication with RN(1 / scale) and RN(1 / sigma) rather than a division (lynx_ref.py)
@pytest.mark.parametrize("shape", [(4, 1100, 64), (3, 301, 128), (4, 2048, 128)], ids=_ids)
def test_midrange_random_inputs_give_identical_bytes(host_build, grid, dtype, preset, overrides, shape):
    codec = LynxCodec(preset, **overrides, scalar_grid=grid)
    assert codec.config.center == "midrange"
    k, v = random_kv(*shape, dtype, seed=1)
    ref = codec.encode(k, v)
    anchor, residual = host_build.compress(k, v, codec.config)
    assert torch.equal(anchor, ref.anchor)
    assert torch.equal(residual, ref.residual)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("center", CENTERS)
@pytest.mark.parametrize("overrides", SPLIT_CHUNKS, ids=_ids)
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=_ids)
def test_k_and_v_chunks_of_their_own_give_identical_bytes(host_build, grid, center, overrides, shape):
    """Each of K, V quantized with its own chunk: exact inputs with either centre, realistic
    ones with the midrange, give the reference's bytes."""
    codec = LynxCodec("default", **overrides, center=center, scalar_grid=grid)
    inputs = [exact_kv(codec.config, *shape, torch.bfloat16)]
    if center == "midrange":
        inputs.append(random_kv(*shape, torch.float16, seed=1))
    for k, v in inputs:
        ref = codec.encode(k, v)
        anchor, residual = host_build.compress(k, v, codec.config)
        assert torch.equal(anchor, ref.anchor)
        assert torch.equal(residual, ref.residual)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("center", CENTERS)
@pytest.mark.parametrize("v_axis", ["token", "channel"])
@pytest.mark.parametrize("split", SPLIT_BITS, ids=_ids)
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=_ids)
def test_k_and_v_splits_of_their_own_give_identical_bytes(host_build, grid, center, v_axis, split, shape):
    """Each of K, V packed with its own anchor / residual bits: exact inputs with either centre,
    realistic ones with the midrange, give the reference's bytes."""
    codec = LynxCodec("default", **split, v_axis=v_axis, center=center, scalar_grid=grid)
    inputs = [exact_kv(codec.config, *shape, torch.bfloat16)]
    if center == "midrange":
        inputs.append(random_kv(*shape, torch.float16, seed=1))
    for k, v in inputs:
        ref = codec.encode(k, v)
        anchor, residual = host_build.compress(k, v, codec.config)
        assert torch.equal(anchor, ref.anchor)
        assert torch.equal(residual, ref.residual)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
# the presets as they are, and with V chunked by 64 (token axis in "default", channel in "paper")
@pytest.mark.parametrize("preset,overrides", [("default", {}), ("paper", {}), ("default", {"v_chunk_size": 64}),
                                              ("paper", {"v_chunk_size": 64})], ids=_ids)
def test_mean_random_inputs_differ_only_by_mean_rounding(host_build, grid, dtype, preset, overrides):
    codec = LynxCodec(preset, **overrides, center="mean", scalar_grid=grid)
    cfg = codec.config
    shape = (4, 1100, 64)
    k, v = random_kv(*shape, dtype, seed=1)
    ref = codec.encode(k, v)
    anchor, residual = host_build.compress(k, v, cfg)
    assert anchor.numel() == ref.anchor.numel() and residual.numel() == ref.residual.numel()

    off_chunks = total_chunks = 0
    ours = page_views(cfg, anchor, residual, shape, dtype)
    theirs = page_views(cfg, ref.anchor, ref.residual, shape, dtype)
    for (span, mine), (_, want) in zip(ours, theirs):
        for w in "kv":
            a, b = mine[w], want[w]
            assert torch.equal(a.gamma, b.gamma) and torch.equal(a.sink, b.sink)
            bad = a.mu != b.mu
            if grid == "float16":  # one float16 ulp
                assert bool((ulp_distance(a.mu[bad], b.mu[bad]) <= 1).all())
            else:                  # one step of the byte grid
                step = (a.mu[bad].float() - b.mu[bad].float()).abs()
                assert bool((step == 1 / lynx_tables.MU_STEPS).all()), step
            # sigma and the codes may move only in chunks whose mean moved
            assert torch.equal(a.sigma[~bad], b.sigma[~bad])
            same = ~bad[a.chunk_of]
            assert torch.equal(a.anchor[same], b.anchor[same])
            assert torch.equal(a.residual[same], b.residual[same])
            off_chunks += int(bad.sum())
            total_chunks += bad.numel()
    assert off_chunks <= MAX_MEAN_ULP_RATE * total_chunks, (off_chunks, total_chunks)

    # the kernel's stream decodes (with the reference decoder) within one quantization step: the
    # largest gap between adjacent reconstruction levels of the tensor's full stage, i.e. of its
    # magnitude table (payload format 8: the end cells' half codes lie between the levels)
    got_k, got_v = codec.decode(EncodedLynx(shape, dtype, codec.stages, cfg, anchor, residual), "full")
    want_k, want_v = codec.decode(ref, "full")
    for w, got, want, x in (("k", got_k, want_k, k), ("v", got_v, want_v, v)):
        mags = lynx_tables.magnitudes(cfg.alpha(w), cfg.y_max(w), cfg.residual_bits(w))
        step = float(mags.unique().diff().max())            # unique() sorts
        assert 0 < step <= float(lynx_tables.levels(cfg.alpha(w), cfg.y_max(w)).diff().max())
        span = (x.float().amax(dim=1) - x.float().amin(dim=1)).max()  # largest page scale bound
        err = (got.float() - want.float()).abs().max()
        assert err <= step * span + 2 ** -7 * x.float().abs().max(), (w, err, step * span)


@pytest.mark.parametrize("split", [{}, {"anchor_bits": 6, "v_anchor_bits": 3}, {"anchor_bits": 2, "v_anchor_bits": 7}],
                         ids=_ids)
def test_end_cells_use_every_residual_field(host_build, split):
    """Payload format 8: in the end cells (anchor magnitude 0 and top) the kernel's residual
    fields take all 2^r values (the half codes h = |xf| >= split[I] of each code, and the anchor's
    own level), and equal the reference's; the middle cells keep the signed offset (m << r) - I."""
    codec = LynxCodec("default", **split)
    cfg = codec.config
    shape = (2, 600, 64)
    k, v = random_kv(*shape, torch.bfloat16, seed=3)
    ref = codec.encode(k, v)
    anchor, residual = host_build.compress(k, v, cfg)
    assert torch.equal(anchor, ref.anchor) and torch.equal(residual, ref.residual)
    for w in "kv":
        r, top = cfg.residual_bits(w), cfg.y_max(w) >> cfg.residual_bits(w)
        views = [vs[w] for _, vs in page_views(cfg, anchor, residual, shape, torch.bfloat16)]
        a = torch.cat([view.anchor for view in views])
        m = torch.where(a < 0, -a - 1, a)
        field = torch.cat([view.residual for view in views]) & ((1 << r) - 1)
        for cell in (0, top):
            assert set(field[m == cell].tolist()) == set(range(1 << r)), (w, cell)
        if top > 1:  # middle cells: d = (m << r) - I in [-2^(r-1), 2^(r-1) - 1], every value used
            mid = (m > 0) & (m < top)
            assert set(field[mid].tolist()) == set(range(1 << r)), w


# (preset, overrides): K per channel / V per token (the default), both per channel with chunks of
# their own, K per token; small pages (ragged last page and chunk tails, several pages)
EDGE_CONFIGS = [
    ("default", {"page_size": 64, "chunk_size": 16, "num_sink_tokens": 3}),
    ("default", {"page_size": 48, "chunk_size": 8, "v_axis": "channel", "v_chunk_size": 16}),
    ("default", {"page_size": 64, "k_axis": "token", "chunk_size": 16, "v_chunk_size": 64}),
    ("paper", {}),
]
EDGE_SHAPES = [(2, 7, 16), (2, 150, 32), (1, 300, 128)]


# exact inputs with either centre, realistic ones with the midrange (the mean's realistic inputs:
# test_mean_random_inputs_differ_only_by_mean_rounding)
@pytest.mark.parametrize("center,exact", [("midrange", True), ("mean", True), ("midrange", False)],
                         ids=["midrange-exact", "mean-exact", "midrange-real"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("preset,overrides", EDGE_CONFIGS, ids=_ids)
@pytest.mark.parametrize("shape", EDGE_SHAPES, ids=_ids)
def test_byte_grid_edge_chunks_give_identical_bytes(host_build, center, exact, dtype, preset, overrides, shape):
    """Constant channels and chunks (sigma 0, or the lowest level), chunks spanning their page
    channel's whole range (sigma 0.5, the top level, or clamped to it), constant chunks at
    xn = 1 (mu clamped to 255 / 256): the byte grid gives the reference's bytes, and its
    scalars are the grid's."""
    codec = LynxCodec(preset, **overrides, center=center, scalar_grid="byte")
    cfg = codec.config
    k, v = edge_kv(cfg, *shape, dtype, exact=exact)
    ref = codec.encode(k, v)
    anchor, residual = host_build.compress(k, v, cfg)
    assert torch.equal(anchor, ref.anchor)
    assert torch.equal(residual, ref.residual)

    levels = lynx_tables.sigma_levels()
    mus, sigmas = [], []
    for _, views in page_views(cfg, anchor, residual, shape, dtype):
        for view in views.values():
            mus.append(view.mu.float())
            sigmas.append(view.sigma.float())
    mu, sigma = torch.cat(mus), torch.cat(sigmas)
    u = mu * lynx_tables.MU_STEPS
    assert bool((u == u.round()).all() and (u >= 0).all() and (u <= 255).all())
    assert bool(torch.isin(sigma, levels).all())
    # the edge cases are there: constant chunks (sigma 0), chunks spanning the whole range (0.5
    # with the midrange, the top level with the mean); once pages hold two chunks, constant chunks
    # at xn = 1 (mu 255 / 256) and off the grid (the lowest non-zero level)
    assert bool((sigma == 0).any())
    assert bool((sigma == (0.5 if center == "midrange" else levels[-1])).any())
    if shape[1] > 64:
        assert bool((mu == 255 / 256).any())
        if not exact:
            assert bool((sigma == levels[1]).any())


@pytest.mark.parametrize("center", CENTERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_byte_grid_changes_the_scalars_and_float16_does_not_snap(host_build, center, dtype):
    """The grid flag reaches the kernel: on realistic KV the byte grid's streams differ from the
    float16 grid's, every byte-grid scalar lies on the grid and not every float16 one does."""
    shape = (2, 300, 64)
    k, v = random_kv(*shape, dtype, seed=2)
    levels = lynx_tables.sigma_levels()
    out = {}
    for grid in GRIDS:
        cfg = LynxCodec(center=center, scalar_grid=grid).config
        anchor, residual = host_build.compress(k, v, cfg)
        views = [view for _, vs in page_views(cfg, anchor, residual, shape, dtype) for view in vs.values()]
        mu = torch.cat([view.mu.float() for view in views])
        sigma = torch.cat([view.sigma.float() for view in views])
        on_grid = (mu * 256 == (mu * 256).round()) & torch.isin(sigma, levels)
        out[grid] = anchor, on_grid
    assert not torch.equal(out["byte"][0], out["float16"][0])
    assert bool(out["byte"][1].all()) and not bool(out["float16"][1].all())


def test_rejects_what_it_cannot_run(host_build):
    k, v = random_kv(2, 10, 24, torch.bfloat16)
    with pytest.raises(ValueError, match="head_dim=24"):
        host_build.compress(k, v)
    k, v = random_kv(2, 10, 32, torch.float32)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        host_build.compress(k, v)
    k, v = random_kv(2, 10, 32, torch.bfloat16)
    cfg = LynxCodec().config
    for field, value in (("scalar_grid", "int8"), ("center", "median")):
        bad = dataclasses.replace(cfg)
        object.__setattr__(bad, field, value)  # past LynxConfig's own check: a value from elsewhere
        with pytest.raises(ValueError, match=f"{field}='{value}'"):
            host_build.compress(k, v, bad)
