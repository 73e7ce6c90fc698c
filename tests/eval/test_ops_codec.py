import pytest
import torch

import lynx_npu
from lynx_npu.eval.capture import LayerQKV
from lynx_npu.eval.evaluate import build_refs, evaluate_codec
from lynx_npu.eval.ops_codec import OpsLynxCodec, with_backend
from lynx_npu.eval.progress import set_enabled


def _refs():
    g = torch.Generator().manual_seed(3)
    layers = [LayerQKV(torch.randn(6, 300, 64, generator=g), torch.randn(2, 300, 64, generator=g),
                       torch.randn(2, 300, 64, generator=g)) for _ in range(2)]
    return build_refs(layers, num_queries=32, kv_dtype=torch.bfloat16)


@pytest.mark.parametrize("name", ["lynx", "lynx-int4", "lynx-int8"])
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_ops_path_has_the_reference_sizes_and_about_its_error(name, backend):
    set_enabled(False)
    refs = _refs()
    # The mean centre: a configuration the CPU kernel runs (auto falls back to the reference
    # for the ones it does not).
    codec = lynx_npu.get_codec(name, center="mean")
    ref = evaluate_codec(codec, refs)
    fast = evaluate_codec(with_backend(codec, backend), refs)
    set_enabled(True)
    for a, b in zip(ref.stages, fast.stages):
        assert a.stage == b.stage and a.nbytes == b.nbytes
        ea, eb = a.summary()["attn_vnmse"], b.summary()["attn_vnmse"]
        if backend == "torch":  # the torch backend *is* the reference
            assert ea == eb
        else:                   # a kernel: at most a rare off-by-one code
            assert eb == pytest.approx(ea, rel=0.05)


def test_with_backend_passthrough_and_errors():
    int8 = lynx_npu.get_codec("int8")
    assert with_backend(int8, "cpu") is int8
    lynx = lynx_npu.get_codec("lynx")
    assert with_backend(lynx, "reference") is lynx
    assert with_backend(lynx, "auto").params()["ops_backend"] == "auto"
    with pytest.raises(ValueError, match="'gpu9' is not one of"):
        OpsLynxCodec(lynx, "gpu9")
    with pytest.raises(ValueError, match="no lynx_npu.ops kernel"):
        OpsLynxCodec(int8, "cpu")
