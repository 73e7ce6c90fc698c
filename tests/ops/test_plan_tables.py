"""Page plans agree with the byte layout; the kernels' code lookup equals searchsorted."""
import pytest
import torch

from lynx_npu.codec import lynx_tables
from lynx_npu.codec.lynx_config import LynxConfig
from lynx_npu.codec.lynx_layout import page_layout, page_spans
from lynx_npu.ops import plan as P
from lynx_npu.ops.tables import (codes_via_buckets, codes_via_log_search,
                                 codes_via_poly_search, log_search, poly_search,
                                 quant_tables, recip_table)


@pytest.mark.parametrize("t", [1, 4, 5, 255, 257, 1000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_plan_rows_match_page_layout(t, dtype):
    cfg = LynxConfig(center="mean", page_size=128, chunk_size=32, num_sink_tokens=4)
    h, d = 3, 40
    plan = P.layer_plan(cfg, h, t, d, dtype)
    a_off = r_off = 0
    for row, span in zip(plan.table.tolist(), page_spans(cfg, t)):
        lay = page_layout(cfg, h, d, dtype, span.num_tokens, span.num_sink)
        assert row[P.F_TOKEN0] == span.token_start and row[P.F_NUM_BODY] == span.num_tokens
        for s in lay.anchor:
            assert row[P.F_SECTION + P.SECTIONS.index(s.name)] == a_off + s.offset
        for s in lay.residual:
            assert row[P.F_SECTION + P.SECTIONS.index(s.name)] == r_off + s.offset
        pads = sum(row[P.F_PADS + 2 * i + 1] for i in range(P.NUM_PADS))
        used = sum(s.nbytes for s in lay.anchor + lay.residual)
        assert pads + used == lay.anchor_nbytes + lay.residual_nbytes
        a_off += lay.anchor_nbytes
        r_off += lay.residual_nbytes
    assert (plan.anchor_nbytes, plan.residual_nbytes) == (a_off, r_off)


def test_page_plan_counts_from_the_page():
    cfg = LynxConfig(center="mean", num_sink_tokens=4)
    p0 = P.page_plan(cfg, 2, 64, torch.bfloat16, 0, 260)
    p1 = P.page_plan(cfg, 2, 64, torch.bfloat16, 260, 516)
    assert p0.table[0, P.F_NUM_SINK] == 4 and p1.table[0, P.F_NUM_SINK] == 0
    assert p1.table[0, P.F_TOKEN0] == 0 and p1.token_offset == 260
    with pytest.raises(ValueError, match="page_size"):
        P.page_plan(cfg, 2, 64, torch.bfloat16, 260, 1000)


def reference_codes(a: torch.Tensor, alpha: float, cfg: LynxConfig):
    """lynx_ref.quantize's (I, h) of |x| = a and its code byte (m << r) | (field ^ bias), the
    anchor magnitude and residual field as the compress kernel stores them."""
    r, y_max, bias = cfg.residual_bits("k"), cfg.y_max("k"), cfg.bias("k")
    thr = lynx_tables.thresholds(alpha, y_max)
    split = lynx_tables.split_thresholds(alpha, y_max, r)
    i = torch.searchsorted(thr, a, right=True)
    h = (a >= split[i]).long()
    m = (i + bias) >> r
    d = (m << r) - i
    field = torch.where((m == 0) | (m == y_max >> r), 2 * d + 1 - h, d) & ((1 << r) - 1)
    return i, h, (m << r) | (field ^ bias)


def decode44(v: torch.Tensor) -> torch.Tensor:
    """The 4 + 4 code byte of ``_settle``'s v (its low byte), as gpu/lynx_compress.py
    ``_pack44`` decodes it (here per value): anchor bits 5-7; residual nibble v >> 1 in a
    middle cell (bits 5-7 not all equal), v + 7 (+ 1 in the top cell: bit 7) in an end cell."""
    v = v & 255
    h = v >> 1
    mid = (((v ^ h) & 0x60) + 0x60) & 0x80 != 0
    q = torch.where(mid, h, v + 7 + (v >> 7)) & 15
    return (h & 0x70) | q


def check_search(x: torch.Tensor, got: tuple, alpha: float, cfg: LynxConfig):
    """The search's half-step count F gives the reference's I = (F + 1) >> 1 and, where the
    split is used (finite), h = 1 - (F & 1); its code byte is the reference's, and so is the
    4 + 4 path's decoding of v."""
    f, byte, v = got
    i, h, want = reference_codes(x, alpha, cfg)
    split = lynx_tables.split_thresholds(alpha, cfg.y_max("k"), cfg.residual_bits("k"))
    assert torch.equal((f + 1) >> 1, i)
    used = torch.isfinite(split[i])
    assert torch.equal((1 - (f & 1))[used], h[used])
    assert torch.equal(byte, want)
    if cfg.residual_bits("k") == 4:
        assert torch.equal(decode44(v), want)


def near_every_threshold(alpha: float, cfg: LynxConfig, k: int) -> torch.Tensor:
    """Every threshold and split value (levels[1 ..]) and k float32 neighbours each side,
    clamped to [0, 1], with 0, 1 and values past 1."""
    y_max = cfg.y_max("k")
    pts = torch.cat([lynx_tables.thresholds(alpha, y_max), lynx_tables.levels(alpha, y_max)[1:]])
    near = (pts.view(torch.int32)[:, None] + torch.arange(-k, k + 1)).view(torch.float32)
    return torch.cat([near.flatten().clamp(0.0, 1.0), torch.tensor([0.0, 1.0, 1.0004, 3.0])])


@pytest.mark.parametrize("alpha", [0.01, 0.5, 3.0, 255.0, 1e5])
@pytest.mark.parametrize("anchor_bits", [2, 3, 4, 6, 7])
def test_bucket_lookup_is_searchsorted(alpha, anchor_bits):
    cfg = LynxConfig(center="mean", anchor_bits=anchor_bits, alpha_k=alpha)
    thr = lynx_tables.thresholds(alpha, cfg.y_max("k"))
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(50000, generator=g) * 1.001, torch.rand(20000, generator=g) * 1e-3,
                   near_every_threshold(alpha, cfg, 1)])
    want = torch.searchsorted(thr, x, right=True)
    assert torch.equal(codes_via_buckets(x, quant_tables(alpha, cfg.y_max("k"))), want)
    search = log_search(alpha, cfg.y_max("k"), cfg.residual_bits("k"))
    # exact whatever the float32 log2 returns within its error bound (the GPU's is approximate)
    for err in (0.0, 2.0 ** -21, -(2.0 ** -21)):
        check_search(x, codes_via_log_search(x, search, err), alpha, cfg)
    poly = poly_search(alpha, cfg.y_max("k"))
    if poly is not None:
        check_search(x, codes_via_poly_search(x, poly, search), alpha, cfg)


@pytest.mark.parametrize("anchor_bits", [2, 3, 4, 5, 6, 7])
def test_search_gives_the_end_cells_codes(anchor_bits):
    """The end cells' search (ops/tables.py: the half-step grid, the code byte from the table
    entry): at every threshold and split value and 256 float32 neighbours each side, I, h and
    the code byte equal the reference's, by the quadratic (both roundings occur: the default
    alphas and alpha 0.01) and by the log (with its log2 off by +-2**-21), for every split."""
    cfg = LynxConfig(anchor_bits=anchor_bits)
    for alpha in (cfg.alpha_k, cfg.alpha_v, 0.01, 3.0):
        x = near_every_threshold(float(alpha), cfg, 256)
        search = log_search(float(alpha), cfg.y_max("k"), cfg.residual_bits("k"))
        for err in (0.0, 2.0 ** -21, -(2.0 ** -21)):
            check_search(x, codes_via_log_search(x, search, err), alpha, cfg)
        poly = poly_search(float(alpha), cfg.y_max("k"))
        if poly is not None:
            check_search(x, codes_via_poly_search(x, poly, search), alpha, cfg)
    assert poly_search(0.5, LynxConfig().y_max("v")).floor
    assert not poly_search(0.25, LynxConfig().y_max("k")).floor


def test_poly_search_where_the_alpha_law_is_nearly_linear():
    """The default alphas get the quadratic code search; large ones keep the log (no quadratic
    keeps every half-step threshold within its window). Every float32 in [0, 1] near a
    threshold or split value (2**12 neighbours each side) is coded exactly."""
    cfg = LynxConfig(center="midrange")
    for alpha in (cfg.alpha_k, cfg.alpha_v):
        poly = poly_search(float(alpha), cfg.y_max("k"))
        assert poly is not None, alpha
        x = near_every_threshold(float(alpha), cfg, 4096)
        search = log_search(float(alpha), cfg.y_max("k"), cfg.residual_bits("k"))
        check_search(x, codes_via_poly_search(x, poly, search), float(alpha), cfg)
    assert poly_search(255.0, cfg.y_max("k")) is None and poly_search(3.0, cfg.y_max("k")) is None


def test_log_search_refuses_an_alpha_too_small_for_float32():
    with pytest.raises(ValueError, match="too small"):
        log_search(1e-6, 112, 4)


def test_recip_table_gives_every_float16_reciprocal_exactly():
    """The compress kernel's 1 / sigma (gpu/lynx_compress.py ``_sigma_recip``): the table entry of
    the 10 mantissa bits, the exponent subtracted in the bits; for every positive finite
    float16, equal to float32 division."""
    sig = torch.arange(1, 0x7C00, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    b = sig.view(torch.int32)
    t = recip_table(torch.device("cpu")).view(torch.int32)[(b >> 13) & 1023]
    got = (t - (b & 0x7F800000) + (127 << 23)).view(torch.float32)
    assert torch.equal(got, 1.0 / sig)
