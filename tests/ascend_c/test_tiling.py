"""The host tiling function (C++) lays pages out exactly as lynx_npu.codec.lynx_layout (format v1)."""
import ctypes
import re

import pytest
import torch

from lynx_npu.codec.lynx_config import LynxConfig
from lynx_npu.codec.lynx_layout import page_layout, page_spans

SECTIONS = ["k_codes", "v_codes", "k_gamma", "v_gamma", "k_stats", "v_stats", "k_sink", "v_sink",
            "k_res", "v_res"]
CASES = [
    (LynxConfig(center="mean"), 8, 4096, 128),
    (LynxConfig(center="mean"), 2, 5, 16),          # sinks only, no body page... plus a ragged one
    (LynxConfig(center="mean"), 3, 4, 64),          # exactly the sinks: page 0 has no body tokens
    (LynxConfig(center="mean"), 1, 261, 64),        # one full page after the sinks, then a 1-token page
    (LynxConfig(center="mean", page_size=64, chunk_size=16, num_sink_tokens=0), 4, 1000, 32),
    (LynxConfig(center="mean", alpha_k=255.0, alpha_v=255.0, v_axis="channel", num_sink_tokens=0), 2, 513, 80),
    # K and V chunks of their own sizes: V per token (64: one chunk per row at head_dim 64, two at
    # 128; 16), V per channel with a chunk unlike K's
    (LynxConfig(center="mean", v_chunk_size=64), 8, 4096, 128),
    (LynxConfig(center="mean", v_chunk_size=64), 2, 300, 64),
    (LynxConfig(center="mean", v_chunk_size=64), 2, 300, 32),
    (LynxConfig(center="mean", v_chunk_size=16), 3, 517, 64),
    (LynxConfig(center="mean", page_size=128, chunk_size=16, v_axis="channel", v_chunk_size=64), 2, 300, 64),
    # K and V splits of their own: k_codes / v_codes and k_res / v_res sections of different sizes
    (LynxConfig(center="mean", anchor_bits=5, v_anchor_bits=4), 8, 4096, 128),
    (LynxConfig(center="mean", anchor_bits=6, v_anchor_bits=3, num_sink_tokens=3), 3, 517, 16),
    (LynxConfig(center="mean", anchor_bits=2, v_anchor_bits=7, v_axis="channel"), 2, 300, 64),
]


@pytest.mark.parametrize("cfg,h,t,d", CASES)
def test_sections_match_the_python_layout(host_build, cfg, h, t, d):
    lib = host_build.library()
    tiling = host_build.make_tiling(cfg, h, t, d, torch.bfloat16)
    spans = page_spans(cfg, t)
    assert tiling.num_pages == len(spans)
    assert tiling.num_work == 2 * h * len(spans)
    total_a = total_r = 0
    for i, s in enumerate(spans):
        kind = 0 if i == 0 else (2 if i == len(spans) - 1 else 1)
        got = tiling.page_kind(kind, lib)
        want = page_layout(cfg, h, d, torch.bfloat16, s.num_tokens, s.num_sink)
        assert (got["num_tokens"], got["num_sink"]) == (want.num_tokens, want.num_sink)
        assert (got["anchor_nbytes"], got["residual_nbytes"]) == (want.anchor_nbytes, want.residual_nbytes)
        for name, off in zip(SECTIONS, got["offsets"]):
            if name.endswith("sink") and not s.num_sink:
                continue
            assert off == want.section(name).offset, name
        total_a += want.anchor_nbytes
        total_r += want.residual_nbytes
    assert (tiling.anchor_nbytes, tiling.residual_nbytes) == (total_a, total_r)


@pytest.mark.parametrize("kwargs,match", [
    ({"head_dim": 24}, "head_dim=24 must be a multiple of 16"),
    # K's and V's chunks are checked apart, each message naming its own field (\b: not v_chunk_size)
    ({"cfg": LynxConfig(center="mean", chunk_size=12, page_size=24)}, r"\bchunk_size=12 must be a multiple of 8"),
    ({"cfg": LynxConfig(center="mean", v_chunk_size=12)}, "v_chunk_size=12 must be a multiple of 8"),
    ({"cfg": LynxConfig(center="mean", chunk_size=128, k_axis="token"), "head_dim": 256},
     r"\bchunk_size=128 must be <= 64 for a token-axis chunk"),
    ({"cfg": LynxConfig(center="mean", v_chunk_size=128), "head_dim": 256},
     "v_chunk_size=128 must be <= 64 for a token-axis chunk"),
    ({"cfg": LynxConfig(center="mean", chunk_size=48, k_axis="token")},
     r"head_dim=64 must be a multiple of chunk_size=48 \(or smaller\)"),
    ({"cfg": LynxConfig(center="mean", v_chunk_size=48)},
     r"head_dim=64 must be a multiple of v_chunk_size=48 \(or smaller\)"),
    ({"cfg": LynxConfig(center="mean", v_chunk_size=64), "head_dim": 96},
     "head_dim=96 must be a multiple of v_chunk_size=64"),
    ({"dtype": torch.float32}, "float16 or bfloat16"),
    ({"head_dim": 2048}, "head_dim=2048"),
])
def test_unsupported_requests_name_the_value(host_build, kwargs, match):
    args = {"cfg": LynxConfig(center="mean"), "head_dim": 64, "dtype": torch.float16} | kwargs
    with pytest.raises(ValueError, match=match):
        host_build.make_tiling(args["cfg"], 2, 100, args["head_dim"], args["dtype"])


@pytest.mark.parametrize("k_chunk,v_chunk,k_bits,v_bits,v_axis,center,grid,match", [
    (48, 32, 4, 4, 1, 1, 0, r"page_size=256 must be a multiple of chunk_size=48 for a channel-axis chunk"),
    (32, 48, 4, 4, 0, 1, 0, r"page_size=256 must be a multiple of v_chunk_size=48 for a channel-axis chunk"),
    (32, 32, 4, 4, 2, 1, 0, r"v_axis=2 unknown"),
    # K's and V's anchor bits are checked apart (\b: not v_anchor_bits)
    (32, 32, 8, 4, 1, 1, 0, r"\banchor_bits=8 must be in \[2, 7\]"),
    (32, 32, 4, 1, 1, 1, 0, r"v_anchor_bits=1 must be in \[2, 7\]"),
    (32, 32, 4, 4, 1, 2, 0, r"center=2 unknown \(0 = mean, 1 = midrange\)"),
    (32, 32, 4, 4, 1, 1, 2, r"scalar_grid=2 unknown \(0 = float16, 1 = byte\)"),
])
def test_the_c_tiling_checks_k_and_v_apart(host_build, k_chunk, v_chunk, k_bits, v_bits, v_axis, center, grid,
                                           match):
    """Requests LynxConfig itself refuses, sent to the C function as they are (K per channel)."""
    lib = host_build.library()
    raw = (ctypes.c_uint8 * lib.lynx_host_tiling_bytes())()
    err = ctypes.create_string_buffer(512)
    # heads, tokens, head_dim, dtype bytes, page_size, K / V chunk, K / V anchor bits, K / V axis,
    # sinks, center, scalar grid, mode, use_residual, block_size, slot bytes, num_slots, UB bytes
    # (0: the A2's)
    rc = lib.lynx_host_tiling(2, 300, 64, 2, 256, k_chunk, v_chunk, k_bits, v_bits, 0, v_axis, 4, center, grid, 0,
                              1, 0, 8, 0, 0, raw, err, len(err))
    assert rc != 0
    assert re.search(match, err.value.decode()), err.value.decode()


# V per token in 64-value chunks takes head_dim <= 64 or a multiple of 64 (96 is refused above);
# K's 7-bit anchors beside V's 6-bit residuals need the widest code buffers; the byte scalar grid
# adds the sigma level table to compress
@pytest.mark.parametrize("grid", ["float16", "byte"])
@pytest.mark.parametrize("cfg,dims", [(LynxConfig(center="mean"), (16, 64, 96, 128, 256)),
                                      (LynxConfig(center="mean", v_chunk_size=64), (16, 48, 64, 128, 192, 256)),
                                      (LynxConfig(center="mean", anchor_bits=7, v_anchor_bits=2),
                                       (16, 64, 96, 128, 256))])
def test_every_supported_request_fits_the_unified_buffer(host_build, cfg, dims, grid):
    cfg = cfg.replace(scalar_grid=grid)
    for d in dims:
        for mode in (0, 1, 2):
            t = host_build.make_tiling(cfg, 8, 8192, d, torch.bfloat16, mode=mode, block_size=128, num_slots=1024)
            assert t.ub_bytes <= 192 * 1024 and t.rows_per_block >= 32


@pytest.mark.parametrize("cfg", [
    LynxConfig(v_chunk_size=64),
    LynxConfig(v_axis="channel", v_chunk_size=64),
    LynxConfig(page_size=128, chunk_size=16, v_axis="channel", v_chunk_size=64),
    LynxConfig(k_axis="token", chunk_size=16, v_axis="channel", v_chunk_size=32),
], ids=lambda c: f"k-{c.k_axis}{c.chunk_size}-v-{c.v_axis}{c.v_chunk_size}-p{c.page_size}")
@pytest.mark.parametrize("d", [32, 64, 128])
def test_row_blocks_hold_whole_chunks_of_k_and_of_v(host_build, cfg, d):
    """A channel-axis block is a multiple of that tensor's chunk; the buffers hold the larger one."""
    for mode in (0, 1):
        t = host_build.make_tiling(cfg, 8, 8192, d, torch.bfloat16, mode=mode)
        for w, rows in zip("kv", t.block_rows):
            assert rows > 0 and rows % (cfg.chunk(w) if cfg.axis(w) == "channel" else 8) == 0, (w, rows)
        assert t.rows_per_block == max(t.block_rows) and t.ub_bytes <= 192 * 1024


@pytest.mark.parametrize("split", [(4, 4), (5, 4), (4, 5), (6, 3), (7, 2), (2, 7)])
def test_k_and_v_carry_their_own_split(host_build, split):
    """The tiling holds each tensor's anchor bits, residual bits, y_max and bias (LynxConfig's)."""
    cfg = LynxConfig(anchor_bits=split[0], v_anchor_bits=split[1])
    for mode in (0, 1):
        t = host_build.make_tiling(cfg, 2, 300, 64, torch.bfloat16, mode=mode)
        assert t.anchor_bits == (cfg.bits("k"), cfg.bits("v")) == split
        assert t.residual_bits == (cfg.residual_bits("k"), cfg.residual_bits("v"))
        assert t.y_max == (cfg.y_max("k"), cfg.y_max("v"))
        assert t.bias == (cfg.bias("k"), cfg.bias("v"))


@pytest.mark.parametrize("d", [32, 64, 128])
def test_the_byte_grid_plans_the_sigma_level_table_for_compress_only(host_build, d):
    """Compress on the byte scalar grid holds the 256 float32 sigma levels (1 KiB) beside the
    thresholds; decompress reads float16 scalars and plans the same either way. (Each launch
    also checks the kernel allocated exactly the plan: test_compress_parity.)"""
    f16, byte = (LynxConfig(scalar_grid=g) for g in ("float16", "byte"))
    for mode in (0, 1, 2):
        a = host_build.make_tiling(f16, 2, 300, d, torch.bfloat16, mode=mode, block_size=16, num_slots=512)
        b = host_build.make_tiling(byte, 2, 300, d, torch.bfloat16, mode=mode, block_size=16, num_slots=512)
        assert a.block_rows == b.block_rows
        assert b.ub_bytes - a.ub_bytes == (256 * 4 if mode == 0 else 0), mode


@pytest.mark.parametrize("split", [(4, 4), (6, 3), (2, 7)])
def test_kernel_tables_are_the_reference_tables_padded(host_build, split):
    """The 128-entry tables the kernels take (payload format 8): thresholds and the end cells'
    split thresholds padded with +inf (compress), the magnitudes of (m << r) | field, exactly
    128 for every split (decompress); the old levels table is no kernel input any more."""
    from lynx_npu.codec import lynx_tables

    cfg = LynxConfig(anchor_bits=split[0], v_anchor_bits=split[1], alpha_v=20.0)
    for w in "kv":
        a, y, r = cfg.alpha(w), cfg.y_max(w), cfg.residual_bits(w)
        for kind, want, fill in (("thresholds", lynx_tables.thresholds(a, y), float("inf")),
                                 ("split", lynx_tables.split_thresholds(a, y, r), float("inf")),
                                 ("magnitudes", lynx_tables.magnitudes(a, y, r), None)):
            got = host_build.kernel_tables(cfg, w, kind)
            assert got.dtype == torch.float32 and got.shape == (host_build.TABLE_SIZE,) and got.is_contiguous()
            assert torch.equal(got[:want.numel()], want), (w, kind)
            if fill is None:
                assert want.numel() == host_build.TABLE_SIZE  # (top + 1) << r = 2^(a - 1 + r)
            else:
                assert bool((got[want.numel():] == fill).all())
    with pytest.raises(ValueError, match="kind='levels'"):
        host_build.kernel_tables(cfg, "k", "levels")


def test_too_wide_heads_for_one_chunk_of_rows_are_refused(host_build):
    with pytest.raises(ValueError, match="head_dim=512 with chunk_size=32 does not fit"):
        host_build.make_tiling(LynxConfig(center="mean"), 1, 300, 512, torch.bfloat16)
    # the message names the chunk whose smallest block does not fit: V's 64 rows here
    with pytest.raises(ValueError, match="head_dim=512 with v_chunk_size=64 does not fit"):
        host_build.make_tiling(LynxConfig(center="mean", k_axis="token", v_axis="channel", v_chunk_size=64),
                               1, 300, 512, torch.bfloat16)
