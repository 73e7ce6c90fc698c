"""The host tiling function (C++) lays pages out exactly as lynx_npu.codec.lynx_layout (format v1)."""
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
    ({"cfg": LynxConfig(center="mean", chunk_size=12, page_size=24)}, "chunk_size=12 must be a multiple of 8"),
    ({"cfg": LynxConfig(center="mean", chunk_size=128, page_size=256), "head_dim": 256}, "chunk_size=128 must be <= 64"),
    ({"cfg": LynxConfig(center="mean", anchor_bits=5)}, "anchor_bits=5"),
    ({"dtype": torch.float32}, "float16 or bfloat16"),
    ({"head_dim": 2048}, "head_dim=2048"),
])
def test_unsupported_requests_name_the_value(host_build, kwargs, match):
    args = {"cfg": LynxConfig(center="mean"), "head_dim": 64, "dtype": torch.float16} | kwargs
    with pytest.raises(ValueError, match=match):
        host_build.make_tiling(args["cfg"], 2, 100, args["head_dim"], args["dtype"])


def test_every_supported_request_fits_the_unified_buffer(host_build):
    for d in (16, 64, 96, 128, 256):
        for mode in (0, 1, 2):
            t = host_build.make_tiling(LynxConfig(center="mean"), 8, 8192, d, torch.bfloat16, mode=mode,
                                       block_size=128, num_slots=1024)
            assert t.ub_bytes <= 192 * 1024 and t.rows_per_block >= 32


def test_too_wide_heads_for_one_chunk_of_rows_are_refused(host_build):
    with pytest.raises(ValueError, match="head_dim=512 with chunk_size=32 does not fit"):
        host_build.make_tiling(LynxConfig(center="mean"), 1, 300, 512, torch.bfloat16)
