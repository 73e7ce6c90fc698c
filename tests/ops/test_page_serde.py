"""The page serde on the CPU: wire bytes identical to each codec's encode_pages, from dense
layers and from every paged-cache layout; received pages decoded straight into every layout
equal to the codec's decode_page, at both stages; exact sizes; bad input named."""
import pytest
import torch

from lynx_npu.ops import KV_CACHE_LAYOUTS, list_backends
from lynx_npu.ops.page_serde import serde_for

from .parity import random_kv
from .serde_checks import (POISON, assert_same_bytes, block_slots, check_decode_into,
                           check_encode_cache, check_every_byte_written, check_request,
                           make_cache, reference_kv, reference_pages, small_codec)

LYNX = ["lynx", "lynx-int4", "lynx-int8"]
BASELINES = ["bf16", "int8", "int4", "kivi4"]
LAYOUTS = sorted(KV_CACHE_LAYOUTS)
CPU_BACKEND = "cpu" if list_backends()["cpu"] is None else None


@pytest.fixture(autouse=True)
def _needs_cpu_backend():
    if CPU_BACKEND is None:
        pytest.skip(f"cpu backend unavailable: {list_backends()['cpu']}")


@pytest.mark.parametrize("name", LYNX + BASELINES)
@pytest.mark.parametrize("t", [3, 64, 150, 301, 2569])  # 2569: a window over two pages
def test_dense_encode_gives_encode_pages_bytes(name, t):
    codec = small_codec(name)
    k, v = random_kv(2, t, 32, torch.bfloat16, seed=t)
    encoded = serde_for(codec).encode(k, v).wait()
    assert_same_bytes(encoded, reference_pages(codec, k, v))
    assert encoded.backend == ("cpu" if name in LYNX else "reference")


@pytest.mark.parametrize("preset", [{}, {"preset": "paper"}, {"center": "mean", "anchor_bits": 3},
                                    {"v_axis": "channel", "num_sink_tokens": 0},
                                    {"scalar_grid": "float16"},
                                    {"scalar_grid": "float16", "center": "mean"}])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_configs_and_dtypes(preset, dtype):
    codec = small_codec("lynx", **preset)
    k, v = random_kv(3, 200, 48, dtype, seed=2)
    assert_same_bytes(serde_for(codec).encode(k, v).wait(), reference_pages(codec, k, v))


@pytest.mark.parametrize("name", LYNX)
def test_every_byte_written(name):
    check_every_byte_written(name, "cpu")
    check_every_byte_written(name, "cpu", t=5, d=24, chunk_size=8)  # pads past the table's


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("order", ["random", "sequential"])
@pytest.mark.parametrize("name", ["lynx", "lynx-int8", "int8"])
def test_encode_from_every_cache_layout(layout, order, name):
    check_encode_cache(name, layout, order, "cpu")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name,stage", [("lynx", "anchor")] + [
    (n, "full") for n in LYNX + ["int4", "bf16", "kivi4"]])
def test_decode_into_every_cache_layout(layout, name, stage):
    used = check_decode_into(name, layout, stage, "cpu")
    assert used == ("cpu" if name in LYNX else "reference")


@pytest.mark.parametrize("grid", ["byte", "float16"])
@pytest.mark.parametrize("stage", ["anchor", "full"])
def test_a_window_over_two_pages_decodes_as_the_codec(stage, grid):
    """2569 tokens in pages of 64: the window of 32 is the last 5 rows of one page and 27 of
    the one before; at the anchor stage both take the full-stage path on a made-up residual.
    On the byte grid every page's scalars come from the anchor's bytes, at both stages."""
    assert check_decode_into("lynx", "vllm_cpu", stage, "cpu", t=2569,
                             scalar_grid=grid) == "cpu"


@pytest.mark.parametrize("name", LYNX + BASELINES)
def test_decode_page_equals_codec(name):
    codec = small_codec(name)
    k, v = random_kv(2, 150, 32, torch.bfloat16, seed=9)
    serde = serde_for(codec)
    for p in codec.encode_pages(k, v):
        for res in {p.residual, None} if name == "lynx" else {p.residual}:
            kw = dict(num_kv_heads=2, head_dim=32, dtype=torch.bfloat16)
            want = codec.decode_page(p.anchor, res, p.token_start, p.token_end, **kw)
            got = serde.decode_page(p.anchor.numpy().tobytes(),
                                    None if res is None else memoryview(res.numpy()),
                                    p.token_start, p.token_end, **kw)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("name", LYNX + ["bf16", "int8", "kivi4"])
def test_page_nbytes_are_exact(name):
    codec = small_codec(name)
    k, v = random_kv(2, 211, 32, torch.bfloat16, seed=4)
    sizes = serde_for(codec).page_nbytes(211, 2, 32, torch.bfloat16)
    pages = codec.encode_pages(k, v)
    assert sizes == [(p.token_start, p.token_end, p.anchor.numel(),
                      None if p.residual is None else p.residual.numel()) for p in pages]


def test_reference_backend_gives_the_same_bytes():
    codec = small_codec("lynx")
    k, v = random_kv(2, 150, 32, torch.bfloat16, seed=6)
    encoded = serde_for(codec, backend="torch").encode(k, v).wait()
    assert encoded.backend == "torch"
    assert_same_bytes(encoded, reference_pages(codec, k, v))


def test_bad_pages_are_named():
    codec = small_codec("lynx")
    k, v = random_kv(2, 100, 32, torch.bfloat16)
    serde = serde_for(codec)
    p = serde.encode(k, v).wait().pages[0]
    kw = dict(num_kv_heads=2, head_dim=32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"anchor frame of page \[0, 68\): anchor page buffer "
                                         r"has \d+ bytes; the layout needs \d+ \(or more"):
        serde.decode_page(p.anchor[:-1], None, p.token_start, p.token_end, **kw)
    last = serde_for(small_codec("lynx")).encode(*random_kv(2, 2100, 32, torch.bfloat16)).wait()
    q = last.pages[-1]  # 48 tokens, the last 32 of them the recent-token window
    with pytest.raises(ValueError, match=r"anchor frame of page \[2052, 2100\): anchor page "
                                         r"buffer has \d+ bytes; with its window of 32 recent "
                                         r"rows the layout needs \d+"):
        serde.decode_page(q.anchor[:-1], None, q.token_start, q.token_end, **kw)
    with pytest.raises(ValueError, match="residual frame"):
        serde.decode_page(p.anchor, p.residual[1:], p.token_start, p.token_end, **kw)
    # a windowed page's residual frame leaves out the window's rows (payload format 9): one
    # that holds them (what format 8 sent) is refused by size, naming both
    whole = serde_for(small_codec("lynx", recent_tokens=0)).encode(
        *random_kv(2, 2100, 32, torch.bfloat16)).wait().pages[-1]
    assert len(whole.residual) > len(q.residual)
    with pytest.raises(ValueError, match=rf"residual frame of page \[2052, 2100\) has "
                                         rf"{len(whole.residual)} bytes; lynx needs "
                                         rf"{len(q.residual)}"):
        serde.decode_page(q.anchor, whole.residual, q.token_start, q.token_end, **kw)
    with pytest.raises(ValueError, match="one stream"):
        serde_for(small_codec("lynx-int8")).decode_page(p.anchor, p.residual, p.token_start,
                                                       p.token_end, **kw)
    with pytest.raises(ValueError, match="host"):
        from lynx_npu.ops.page_serde import as_bytes
        as_bytes(torch.zeros(4, dtype=torch.uint8, device="meta"))


@pytest.mark.parametrize("name", ["lynx", "lynx-int8", "int8"])
def test_every_layer_of_a_request(name):
    assert check_request(name, "vllm_cpu", "cpu") == ("cpu" if name in LYNX else "reference")


def test_every_layer_of_a_request_with_its_window():
    """One launch for all layers, staged once: each layer's windows are filled from its own
    frames, and the anchor-only layers decode them (2100 tokens: a window of 32)."""
    assert check_request("lynx", "vllm_cpu", "cpu", num_layers=2, t=2100) == "cpu"


# A split per layer (layer_anchor_bits): each layer's bytes and values are its own config's,
# the layers of one config one batch (ops/per_layer_serde.py).
LAYER_PLANS = {"one wide layer": ((1, 5, 5),), "two splits": ((0, 6, 6), (3, 3, 3)),
               "K-only": ((1, 5, 4), (2, 5, 4))}


@pytest.mark.parametrize("name", ["lynx", "lynx-int8"])
@pytest.mark.parametrize("plan", list(LAYER_PLANS.values()), ids=list(LAYER_PLANS))
def test_every_layer_of_a_request_with_a_split_per_layer(name, plan):
    assert check_request(name, "vllm_cpu", "cpu", num_layers=4, layer_anchor_bits=plan) == "cpu"


# V chunks per layer (layer_v_chunk_size), alone and beside a split per layer: at d=32 a V
# chunk of 32 is one chunk per token-head, as 64 is at SmolLM2's head_dim 64.
V_CHUNK_PLANS = {"V chunks": dict(v_chunk_size=32, layer_v_chunk_size=((1, 16), (2, 16))),
                 "V chunks and splits": dict(v_chunk_size=32, layer_v_chunk_size=((0, 16),),
                                             layer_anchor_bits=((0, 5, 4), (3, 5, 4)))}


@pytest.mark.parametrize("name", ["lynx", "lynx-int8"])
@pytest.mark.parametrize("plan", list(V_CHUNK_PLANS.values()), ids=list(V_CHUNK_PLANS))
def test_every_layer_of_a_request_with_v_chunks_per_layer(name, plan):
    assert check_request(name, "vllm_cpu", "cpu", num_layers=4, **plan) == "cpu"


def test_a_split_per_layer_needs_the_layer():
    serde = serde_for(small_codec("lynx", layer_anchor_bits=((1, 5, 5),)))
    k, v = random_kv(2, 40, 32, torch.bfloat16)
    with pytest.raises(ValueError, match="for_layer"):
        serde.encode(k, v)
    with pytest.raises(ValueError, match="for_layer"):
        serde.page_nbytes(40, 2, 32, torch.bfloat16)
    wide, base = serde.for_layer(1, 4), serde.for_layer(0, 4)
    assert wide.config.anchor_bits == 5 and base.config.anchor_bits == 4
    assert serde.for_layer(2, 4) is base
    assert serde.compress_backend("cpu", 2, 32, torch.bfloat16) == "cpu"  # before any layer
    assert bytes(wide.encode(k, v).wait().pages[0].anchor) == \
        small_codec("lynx", anchor_bits=5, v_anchor_bits=5).encode_pages(k, v)[0].anchor.numpy().tobytes()


@pytest.mark.parametrize("name,stage", [("lynx", "anchor"), ("lynx", "full"),
                                        ("lynx-int8", "full"), ("int8", "full")])
@pytest.mark.parametrize("which", ["all", "a run", "a gap"])
def test_pages_of_another_dtype_decode_cast_into_the_cache(name, stage, which):
    """bfloat16 pages into a float32 cache (the demo's engines: wire_dtype on the connector):
    every page's tokens hold the bf16 decode cast to float32, whether the pages are one run of
    tokens (one launch) or have a gap (page by page); nothing else is written."""
    codec = small_codec(name)
    h, t, d = 2, 300, 32
    k, v = random_kv(h, t, d, torch.bfloat16, seed=4)
    pages = reference_pages(codec, k, v)
    if stage == "anchor":
        pages = [type(p)(p.index, p.token_start, p.token_end, p.anchor, None) for p in pages]
    chosen = {"all": pages, "a run": pages[1:3], "a gap": [pages[0], pages[2]]}[which]
    cache, nb = make_cache("vllm_cpu", h, t, d, torch.float32, "cpu")
    slots = block_slots(t, nb, cache.block_size, "random", seed=1)
    serde = serde_for(codec)
    used = serde.decode_into(chosen, cache.layer(0), slots, wire_dtype=torch.bfloat16)
    assert "bfloat16 pages cast to the float32 cache" in used
    wk, wv = reference_kv(codec, pages, h, d, torch.bfloat16, stage)
    mine = torch.zeros(t, dtype=torch.bool)
    for p in chosen:
        mine[p.token_start:p.token_end] = True
    gk, gv = cache.read(0, slots[mine])
    assert torch.equal(gk, wk[:, mine].float()) and torch.equal(gv, wv[:, mine].float())
    ok, ov = cache.read(0, slots[~mine])
    assert bool((ok == POISON).all()) and bool((ov == POISON).all()), "another token changed"
