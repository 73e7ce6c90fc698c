"""Received pages decoded by the fast decoders (lynx_npu.ops for the Lynx family, vectorized
torch for bf16/int8/int4) are bit-identical to the reference codecs; others are untouched."""
import pytest
import torch

import lynx_npu
from lynx_npu.integration.vllm_ascend.page_decoder import (AffinePageDecoder, OpsPageDecoder,
                                                           accelerate)


@pytest.mark.parametrize("name", ["lynx", "lynx-int8", "lynx-int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [True, False])
def test_ops_pages_equal_reference(name, dtype, with_residual):
    torch.manual_seed(1)
    k, v = (torch.randn(3, 300, 64) * 2).to(dtype), torch.randn(3, 300, 64).to(dtype)
    codec = lynx_npu.get_codec(name)
    fast = accelerate(codec)
    assert isinstance(fast, OpsPageDecoder) and fast.stages == codec.stages
    for p in codec.encode_pages(k, v):
        res = p.residual if with_residual else None
        kw = dict(num_kv_heads=3, head_dim=64, dtype=dtype)
        want = codec.decode_page(p.anchor, res, p.token_start, p.token_end, **kw)
        got = fast.decode_page(p.anchor, res, p.token_start, p.token_end, **kw)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("name", ["bf16", "int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_affine_pages_equal_reference(name, dtype):
    torch.manual_seed(2)
    k, v = (torch.randn(3, 301, 64) * 3).to(dtype), torch.randn(3, 301, 64).to(dtype)
    codec = lynx_npu.get_codec(name)
    fast = accelerate(codec)
    assert isinstance(fast, AffinePageDecoder)
    for p in codec.encode_pages(k, v):
        kw = dict(num_kv_heads=3, head_dim=64, dtype=dtype)
        want = codec.decode_page(p.anchor, None, p.token_start, p.token_end, **kw)
        got = fast.decode_page(p.anchor, None, p.token_start, p.token_end, **kw)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ValueError, match="bytes"):
        fast.decode_page(p.anchor[:-2], None, p.token_start, p.token_end, **kw)


def test_other_codecs_unchanged():
    codec = lynx_npu.get_codec("kivi4")
    assert accelerate(codec) is codec
