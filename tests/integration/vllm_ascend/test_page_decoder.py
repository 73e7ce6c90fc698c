"""Received Lynx pages decoded through lynx_npu.ops are bit-identical to the reference codec,
for every Lynx-family codec and stage; other codecs are untouched."""
import pytest
import torch

import lynx_npu
from lynx_npu.integration.vllm_ascend.page_decoder import OpsPageDecoder, accelerate


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


def test_other_codecs_unchanged():
    codec = lynx_npu.get_codec("int8")
    assert accelerate(codec) is codec
