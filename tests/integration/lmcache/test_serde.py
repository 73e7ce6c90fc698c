"""The Lynx LMCache serde against LMCache's real MemoryObj / factory: the size estimate is the
exact serialized size, a round trip equals the codec applied directly (same bytes as the
codec's encode_pages, same values as its decode_page), and bad input is refused by name."""
import pytest
import torch

from .conftest import lmcache_or_skip

lmcache_or_skip()

import lynx_npu  # noqa: E402
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey  # noqa: E402
from lmcache.v1.distributed.serde import SerdeConfig, create_serde_processor  # noqa: E402
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj  # noqa: E402

from lynx_npu.integration.lmcache import factory  # noqa: E402
from lynx_npu.integration.lmcache.serde import (HEADER_NBYTES, LynxObjectCodec,  # noqa: E402
                                                LynxSerdeConfig)

KEY = ObjectKey(chunk_hash=b"\x01" * 32, model_name="m", kv_rank=0)


def memory_obj(shapes, dtypes, fill=0) -> TensorMemoryObj:
    shapes = [torch.Size(s) for s in shapes]
    n = sum(s.numel() * d.itemsize for s, d in zip(shapes, dtypes))
    raw = torch.full((n,), fill, dtype=torch.uint8)
    meta = MemoryObjMetadata(shape=shapes[0], dtype=dtypes[0], address=0, phy_size=n,
                             ref_count=1, shapes=shapes, dtypes=dtypes)
    return TensorMemoryObj(raw, meta, None)


def kv_obj(shapes, dtype, seed=0) -> TensorMemoryObj:
    g = torch.Generator().manual_seed(seed)
    obj = memory_obj(shapes, [dtype] * len(shapes))
    for i, s in enumerate(shapes):
        obj.get_tensor(i).copy_(torch.randn(s, generator=g) * 3 + 0.5)
    return obj


def serde(codec="lynx", head_dim=64, **kw):
    c = LynxObjectCodec(LynxSerdeConfig(head_dim=head_dim, codec=codec, **kw))
    return c, factory.LynxSerializer(c), factory.LynxDeserializer(c)


def store_and_load(codec, shapes, dtype, head_dim=64, **kw):
    c, ser, de = serde(codec, head_dim, **kw)
    src = kv_obj(shapes, dtype)
    size = ser.estimate_serialized_size(MemoryLayoutDesc([torch.Size(s) for s in shapes],
                                                         [dtype] * len(shapes)))
    # pre-filled 0xFF: every byte the estimate counts must be written
    buf = memory_obj([(size,)], [torch.uint8], fill=0xFF)
    written = ser.serialize(src, buf, KEY)
    out = memory_obj(shapes, [dtype] * len(shapes), fill=0xFF)
    de.deserialize(buf, out, KEY)
    return c, src, buf, written, size, out


def direct(codec, kv: torch.Tensor, head_dim: int, stage: str):
    """The codec applied directly to one group [2, L, T, H*D]: each layer's encode_pages, and
    the values its decode_page gives (anchor stage: the residual left out)."""
    _, layers, tokens, hidden = kv.shape
    h = hidden // head_dim
    frames, out = ([], []), torch.empty_like(kv)
    for layer in range(layers):
        k, v = (kv[i, layer].reshape(tokens, h, head_dim).transpose(0, 1).contiguous()
                for i in range(2))
        for p in codec.encode_pages(k, v):
            frames[0].append(p.anchor.numpy().tobytes())
            residual = p.residual if stage == "full" else None
            if residual is not None:
                frames[1].append(residual.numpy().tobytes())
            dk, dv = codec.decode_page(p.anchor, residual, p.token_start, p.token_end,
                                       num_kv_heads=h, head_dim=head_dim, dtype=kv.dtype)
            for i, x in enumerate((dk, dv)):
                out[i, layer, p.token_start:p.token_end] = x.transpose(0, 1).reshape(
                    p.token_end - p.token_start, hidden)
    return b"".join(frames[0]) + b"".join(frames[1]), out


LAYOUTS = [  # (codec, stage, shapes of the kernel groups, dtype, head_dim)
    ("lynx", None, [(2, 3, 256, 192)], torch.float32, 64),    # SmolLM2's 3 heads x 64
    ("lynx", "anchor", [(2, 3, 256, 192)], torch.float32, 64),
    ("lynx", None, [(2, 2, 128, 256)], torch.float16, 128),
    ("lynx-int4", None, [(2, 2, 384, 128)], torch.bfloat16, 64),  # 1.5 codec pages
    ("lynx-int8", None, [(2, 2, 128, 64)], torch.float32, 32),
    ("lynx", None, [(2, 2, 128, 192), (2, 1, 128, 64)], torch.float32, 64),  # two groups
]


@pytest.mark.parametrize("codec,stage,shapes,dtype,head_dim", LAYOUTS)
def test_round_trip_is_the_codec_applied_directly(codec, stage, shapes, dtype, head_dim):
    c, src, buf, written, size, out = store_and_load(codec, shapes, dtype, head_dim,
                                                     stage=stage)
    assert written == size == buf.tensor.numel()  # the estimate is exact
    ref_codec = lynx_npu.get_codec(codec)
    stage = stage or ref_codec.stages[-1]
    payloads, offset = [], 0
    for i in range(len(shapes)):
        payload, values = direct(ref_codec, src.get_tensor(i), head_dim, stage)
        payloads.append(payload)
        assert torch.equal(out.get_tensor(i), values), f"group {i}: values differ"
    raw = buf.tensor.numpy().tobytes()[HEADER_NBYTES:]
    # every anchor frame first (all groups, all layers), then the residuals
    anchors = b"".join(p[:len(p) - _residual_nbytes(c, s, dtype, head_dim)]
                       for p, s in zip(payloads, shapes))
    assert raw[:len(anchors)] == anchors
    assert raw == anchors + b"".join(p[len(p) - _residual_nbytes(c, s, dtype, head_dim):]
                                     for p, s in zip(payloads, shapes))
    # the codec really compressed, and (lossy) really changed the values
    assert size < sum(torch.Size(s).numel() * dtype.itemsize for s in shapes)


def _residual_nbytes(c, shape, dtype, head_dim) -> int:
    if c.num_streams < 2:
        return 0
    _, layers, tokens, hidden = shape
    return layers * sum(r for _, _, _, r in c.serde.page_nbytes(tokens, hidden // head_dim,
                                                                 head_dim, dtype))


def test_size_estimate_tracks_the_stage_and_codec():
    desc = MemoryLayoutDesc([torch.Size((2, 30, 256, 192))], [torch.bfloat16])
    sizes = {(name, stage): serde(name, stage=stage)[1].estimate_serialized_size(desc)
             for name, stage in (("lynx", None), ("lynx", "anchor"), ("lynx-int4", None),
                                 ("lynx-int8", None))}
    raw = 2 * 30 * 256 * 192 * 2
    assert sizes[("lynx", "anchor")] < sizes[("lynx", None)] < raw
    assert sizes[("lynx-int4", None)] < sizes[("lynx-int8", None)] < raw


def test_factory_registered_and_async_processor_round_trip():
    from lmcache.v1.distributed.serde import get_registered_serde_types
    assert "lynx" in get_registered_serde_types()
    proc = create_serde_processor(SerdeConfig("lynx", {"head_dim": 64, "codec": "lynx-int8"}))
    try:
        shapes = [(2, 2, 128, 192)]
        desc = MemoryLayoutDesc([torch.Size(shapes[0])], [torch.float32])
        src = kv_obj(shapes, torch.float32)
        buf = memory_obj([(proc.estimate_serialized_size(desc),)], [torch.uint8])
        out = memory_obj(shapes, [torch.float32])
        assert _wait(proc.query_serialize_result, proc.submit_serialize([src], [buf], [KEY]))
        assert _wait(proc.query_deserialize_result, proc.submit_deserialize([buf], [out], [KEY]))
        _, values = direct(lynx_npu.get_codec("lynx-int8"), src.tensor, 64, "full")
        assert torch.equal(out.tensor, values)
        # a corrupt object: the task fails (LMCache then treats the load as a miss)
        buf.tensor[HEADER_NBYTES + 5] ^= 0xFF
        assert _wait(proc.query_deserialize_result,
                     proc.submit_deserialize([buf], [out], [KEY])) is False
    finally:
        proc.close()


def _wait(query, task, timeout=30.0):
    import time
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = query(task)
        if r is not None:
            return r
        time.sleep(0.01)
    raise AssertionError("serde task did not finish")


# -- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    ({"head_dim": 64, "codec": "int8"}, "not a Lynx codec"),
    ({"head_dim": 64, "codec": "nope"}, "not a Lynx codec"),
    ({"codec": "lynx"}, "needs head_dim"),
    ({"head_dim": 0}, "head_dim"),
    ({"head_dim": 64, "codec": "lynx-int8", "stage": "anchor"}, "not a stage of codec"),
    ({"head_dim": 64, "colour": 1}, "no parameter 'colour'"),
    ({"head_dim": 64, "codec_params": {"page_size": -3}}, "page_size"),
])
def test_bad_config_is_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        create_serde_processor(SerdeConfig("lynx", kwargs))


@pytest.mark.parametrize("shape,dtype,match", [
    ((2, 2, 128, 192), torch.int8, "dtype torch.int8"),
    ((2, 2, 128, 100), torch.float32, "not a multiple of head_dim=64"),
    ((1, 2, 128, 192), torch.float32, "shape"),          # MLA: K only
    ((2, 128, 192), torch.float32, "shape"),
    ((2, 0, 128, 192), torch.float32, "empty axis"),
])
def test_bad_layout_is_refused_by_name(shape, dtype, match):
    _, ser, _ = serde()
    with pytest.raises(ValueError, match=match):
        ser.estimate_serialized_size(MemoryLayoutDesc([torch.Size(shape)], [dtype]))


def _stored(codec="lynx", shapes=((2, 2, 128, 192),), dtype=torch.float32, **kw):
    c, src, buf, *_ = store_and_load(codec, list(shapes), dtype, **kw)
    return buf


def _load(buf, codec="lynx", shapes=((2, 2, 128, 192),), dtype=torch.float32, **kw):
    _, _, de = serde(codec, **kw)
    de.deserialize(buf, memory_obj(list(shapes), [dtype] * len(shapes)), KEY)


def test_corrupt_bytes_are_refused_by_name():
    buf = _stored()
    buf.tensor[HEADER_NBYTES + 100] ^= 0x01
    with pytest.raises(ValueError, match="CRC32C .* the stored object is corrupt"):
        _load(buf)
    buf = _stored()
    buf.tensor[0] = ord("X")
    with pytest.raises(ValueError, match="not a lynx object"):
        _load(buf)


def test_truncated_object_is_refused():
    buf = _stored()
    short = memory_obj([(buf.tensor.numel() - 1,)], [torch.uint8])
    short.tensor.copy_(buf.tensor[:-1])
    with pytest.raises(ValueError, match="truncated"):
        _load(short)


def test_object_of_another_configuration_is_refused():
    buf = _stored(codec="lynx-int8")
    with pytest.raises(ValueError, match="codec id 8"):
        _load(buf, codec="lynx")
    buf = _stored(codec="lynx", stage="anchor")
    with pytest.raises(ValueError, match="1 stream"):
        _load(buf, codec="lynx")
    buf = _stored()  # same size, other scale parameters
    with pytest.raises(ValueError, match="other codec parameters"):
        _load(buf, codec_params={"alpha_k": 0.5})


def test_wrong_destination_is_refused():
    buf = _stored()
    with pytest.raises(ValueError, match="dtype torch.int32"):
        _load(buf, dtype=torch.int32)
    with pytest.raises(ValueError, match="head_dim or layout"):  # another layout than stored
        _load(buf, shapes=((2, 4, 128, 192),))


# -- kv_layout="vllm_cpu_vec": vLLM-CPU's cache as LMCache copies it ---------------------------

def test_vllm_cpu_vec_layout_reads_k_transposed_then_v_per_block_and_head():
    """One block of 4 tokens, 2 heads, head_dim 3, built as vLLM-CPU ("vec" ISA) lays it out:
    per (block, head) K as [head_dim, block_size] then V as [block_size, head_dim]; LMCache's
    object is that memory seen as [1, L, tokens, heads * 2 * head_dim]."""
    from lynx_npu.integration.lmcache.serde import split_to_vllm_cpu_vec, vllm_cpu_vec_to_split
    layers, bs, h, d = 2, 4, 2, 3
    g = torch.Generator().manual_seed(1)
    k = torch.randn(layers, h, bs, d, generator=g)
    v = torch.randn(layers, h, bs, d, generator=g)
    cache = torch.cat([k.transpose(2, 3).reshape(layers, h, -1),
                       v.reshape(layers, h, -1)], dim=-1)           # [L, H, 2 * bs * d]
    obj = cache.reshape(layers, h, bs, 2 * d).permute(0, 2, 1, 3).reshape(1, layers, bs, -1)
    split = vllm_cpu_vec_to_split(obj, d, bs)
    assert torch.equal(split[0], k.permute(0, 2, 1, 3).reshape(layers, bs, h * d))
    assert torch.equal(split[1], v.permute(0, 2, 1, 3).reshape(layers, bs, h * d))
    back = torch.empty_like(obj)
    split_to_vllm_cpu_vec(split, back, d, bs)
    assert torch.equal(back, obj)


def test_vllm_cpu_vec_round_trip_is_the_codec_applied_directly():
    from lynx_npu.integration.lmcache.serde import vllm_cpu_vec_to_split
    shape, bs = (1, 3, 256, 3 * 2 * 64), 128
    c, ser, de = serde("lynx", 64, kv_layout="vllm_cpu_vec", block_size=bs)
    src = kv_obj([shape], torch.float32)
    size = ser.estimate_serialized_size(MemoryLayoutDesc([torch.Size(shape)], [torch.float32]))
    buf = memory_obj([(size,)], [torch.uint8], fill=0xFF)
    assert ser.serialize(src, buf, KEY) == size
    out = memory_obj([shape], [torch.float32], fill=0xFF)
    de.deserialize(buf, out, KEY)
    split = vllm_cpu_vec_to_split(src.get_tensor(0), 64, bs)
    payload, values = direct(lynx_npu.get_codec("lynx"), split, 64, "full")
    assert buf.tensor.numpy().tobytes()[HEADER_NBYTES:] == payload
    assert torch.equal(vllm_cpu_vec_to_split(out.get_tensor(0), 64, bs), values)
    # the split layout's serde refuses this object shape, naming it
    with pytest.raises(ValueError, match="expected \\[2 \\(K, V\\)"):
        serde("lynx", 64)[1].estimate_serialized_size(
            MemoryLayoutDesc([torch.Size(shape)], [torch.float32]))
    with pytest.raises(ValueError, match="block_size=96"):
        serde("lynx", 64, kv_layout="vllm_cpu_vec", block_size=96)[1].estimate_serialized_size(
            MemoryLayoutDesc([torch.Size(shape)], [torch.float32]))
    with pytest.raises(ValueError, match="kv_layout='nhd'"):
        LynxSerdeConfig(head_dim=64, kv_layout="nhd")


def test_vllm_cpu_vec_refuses_the_amx_tile_layout_where_vllm_uses_it():
    """bfloat16 in blocks of 128 is vLLM's AMX tile layout on a CPU with AMX tiles, which
    vllm_cpu_vec would misread: refused by name there, read as vllm_cpu_vec elsewhere (and in
    blocks of 16 or as float16 everywhere)."""
    shape = torch.Size((1, 2, 256, 2 * 2 * 64))
    amx = bool(torch.cpu._is_amx_tile_supported())
    for dtype, bs, tiled in ((torch.bfloat16, 128, amx), (torch.bfloat16, 16, False),
                             (torch.float16, 128, False)):
        ser = serde("lynx", 64, kv_layout="vllm_cpu_vec", block_size=bs)[1]
        desc = MemoryLayoutDesc([shape], [dtype])
        if tiled:
            with pytest.raises(ValueError, match="AMX tile layout.*--dtype float16 or float32"):
                ser.estimate_serialized_size(desc)
        else:
            assert ser.estimate_serialized_size(desc) > 0
