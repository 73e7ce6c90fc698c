"""Checks of the page serde shared by tests/ops (cpu backend) and tests/gpu (triton).

What the serde must give is fixed by the codecs themselves: the bytes of
``codec.encode_pages`` and the values of ``codec.decode_page`` (both run here on the CPU).
"""
from __future__ import annotations

import torch

import lynx_npu
from lynx_npu.ops import KV_CACHE_LAYOUTS
from lynx_npu.ops.page_serde import serde_for
from lynx_npu.ops.paged_cache import PagedKVCache
from lynx_npu.ops.wire_layout import layer_wire

from .parity import random_kv

POISON = -7.0


def small_codec(name: str, **overrides):
    """Real codecs, with pages of 64 tokens where the codec has pages (several per layer)."""
    if name.startswith("lynx"):
        return lynx_npu.get_codec(name, **{"page_size": 64, "chunk_size": 16, **overrides})
    codec = lynx_npu.get_codec(name)
    codec.page_size = 64
    return codec


def reference_pages(codec, k, v):
    return codec.encode_pages(k.cpu(), v.cpu())


def reference_kv(codec, pages, h, d, dtype, stage):
    ks, vs = [], []
    for p in pages:
        res = p.residual if stage == "full" else None
        k, v = codec.decode_page(p.anchor, res, p.token_start, p.token_end, num_kv_heads=h,
                                 head_dim=d, dtype=dtype)
        ks.append(k)
        vs.append(v)
    return torch.cat(ks, 1), torch.cat(vs, 1)


def assert_same_bytes(encoded, ref) -> None:
    assert len(encoded.pages) == len(ref)
    for got, want in zip(encoded.pages, ref):
        assert (got.index, got.token_start, got.token_end) == (want.index, want.token_start,
                                                               want.token_end)
        assert bytes(got.anchor) == want.anchor.numpy().tobytes(), f"page {want.index} anchor"
        if want.residual is None:
            assert got.residual is None
        else:
            assert bytes(got.residual) == want.residual.numpy().tobytes(), \
                f"page {want.index} residual"


def block_slots(num_tokens: int, num_blocks: int, block_size: int, order: str, seed: int = 0):
    if order == "random":
        blocks = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    else:
        blocks = torch.arange(num_blocks)
    t = torch.arange(num_tokens)
    return blocks[t // block_size] * block_size + t % block_size


def make_cache(layout: str, h: int, t: int, d: int, dtype, device, block_size=16, spare=3):
    nb = -(-t // block_size) + spare
    tensors = KV_CACHE_LAYOUTS[layout].allocate(nb, block_size, h, d, dtype, device,
                                                fill=POISON)
    return PagedKVCache.build(layout, [tensors]), nb


def check_encode_cache(name: str, layout: str, order: str, device, backend=None, h=2, t=150,
                       d=32, dtype=torch.bfloat16, **overrides) -> str:
    """A layer written into a paged cache on ``device`` encodes to the reference pages."""
    codec = small_codec(name, **overrides)
    k, v = random_kv(h, t, d, dtype, seed=t)
    cache, nb = make_cache(layout, h, t, d, dtype, device)
    slots = block_slots(t, nb, cache.block_size, order)
    cache.write(0, slots, k, v)
    serde = serde_for(codec, backend)
    encoded = serde.encode_cache(cache.layer(0), slots.to(device) if order == "random"
                                 else slots).wait()
    assert_same_bytes(encoded, reference_pages(codec, k, v))
    return encoded.backend


def check_encode_slots(name: str, layout: str, slots: torch.Tensor, device, backend=None,
                       h=2, d=32, dtype=torch.bfloat16, block_size=16, num_blocks=None,
                       **overrides) -> str:
    """A layer written at ``slots`` (any slot mapping: whole blocks in any order, a first block
    entered part way, single tokens anywhere) of a paged cache on ``device`` encodes to the
    reference pages."""
    codec = small_codec(name, **overrides)
    t = slots.numel()
    k, v = random_kv(h, t, d, dtype, seed=t + 7)
    nb = num_blocks or int(slots.max()) // block_size + 1
    tensors = KV_CACHE_LAYOUTS[layout].allocate(nb, block_size, h, d, dtype, device,
                                                fill=POISON)
    cache = PagedKVCache.build(layout, [tensors])
    cache.write(0, slots, k, v)
    encoded = serde_for(codec, backend).encode_cache(cache.layer(0), slots.to(device)).wait()
    assert_same_bytes(encoded, reference_pages(codec, k, v))
    return encoded.backend


def check_decode_into(name: str, layout: str, stage: str, device, backend=None, h=2, t=150,
                      d=32, dtype=torch.bfloat16, **overrides) -> str:
    """Received pages written into a paged cache on ``device`` equal the reference decode;
    padding slots (-1) and slots of other requests are left alone."""
    codec = small_codec(name, **overrides)
    k, v = random_kv(h, t, d, dtype, seed=t + 1)
    ref = reference_pages(codec, k, v)
    serde = serde_for(codec, backend)
    pages = serde.encode(k.to(device), v.to(device)).wait().pages
    if stage == "anchor":
        pages = [type(p)(p.index, p.token_start, p.token_end, p.anchor, None) for p in pages]
    cache, nb = make_cache(layout, h, t, d, dtype, device)
    slots = block_slots(t, nb, cache.block_size, "random", seed=5).clone()
    slots[3::11] = -1
    used = serde.decode_into(pages, cache.layer(0), slots.to(device))
    wk, wv = reference_kv(codec, ref, h, d, dtype, stage)
    keep = slots >= 0
    gk, gv = cache.read(0, slots[keep])
    assert torch.equal(gk.cpu(), wk[:, keep]) and torch.equal(gv.cpu(), wv[:, keep])
    written = torch.zeros(nb * cache.block_size, dtype=torch.bool)
    written[slots[keep]] = True
    rest = torch.arange(nb * cache.block_size)[~written]
    ok, ov = cache.read(0, rest)
    assert bool((ok == POISON).all()) and bool((ov == POISON).all()), "a foreign slot changed"
    return used


def check_every_byte_written(name: str, device, backend=None, h=2, t=150, d=32,
                             dtype=torch.bfloat16, **overrides) -> None:
    """Compressing into a buffer poisoned with 0x00, then 0xFF, gives the same wire bytes."""
    codec = small_codec(name, **overrides)
    serde = serde_for(codec, backend)
    k, v = random_kv(h, t, d, dtype, seed=3)
    k, v = k.to(device), v.to(device)
    lw = layer_wire(name, codec.config, h, t, d, dtype)
    _, impl = serde._select(k.device, h, d, dtype)
    out = []
    for fill in (0x00, 0xFF):
        buf = torch.full((lw.nbytes,), fill, dtype=torch.uint8, device=device)
        layer = serde.to_wire(serde.compress(impl, k, v, lw, out=buf), lw, "x").wait()
        out.append([(bytes(p.anchor), bytes(p.residual or b"")) for p in layer.pages])
    assert out[0] == out[1], "some wire bytes are not written"


def check_request(name: str, layout: str, device, backend=None, num_layers=3, h=2, t=150,
                  d=32, dtype=torch.bfloat16, **overrides) -> str:
    """Every layer of a request: encode_layers from a cache of separately allocated layers
    gives each layer's reference pages; decode_layers of pages at mixed stages (anchor-only
    for even layers, full for odd ones) into another cache gives the reference decode."""
    codec = small_codec(name, **overrides)
    serde = serde_for(codec, backend)
    bs = 16
    nb = -(-t // bs) + 3
    lay = KV_CACHE_LAYOUTS[layout]
    src = PagedKVCache.build(layout, [lay.allocate(nb, bs, h, d, dtype, device, fill=POISON)
                                      for _ in range(num_layers)])
    dst = PagedKVCache.build(layout, [lay.allocate(nb, bs, h, d, dtype, device, fill=POISON)
                                      for _ in range(num_layers)])
    slots = block_slots(t, nb, bs, "random", seed=11).to(device)
    kv = [random_kv(h, t, d, dtype, seed=i) for i in range(num_layers)]
    for i, (k, v) in enumerate(kv):
        src.write(i, slots, k, v)
    layers = list(serde.encode_layers(src, slots))
    assert len(layers) == num_layers
    received = {}
    # a codec with a split per layer (layer_anchor_bits) encodes layer i with its own
    per_layer = [codec.for_layer(i, num_layers) if hasattr(codec, "for_layer") else codec
                 for i in range(num_layers)]
    for i, layer in enumerate(layers):
        assert_same_bytes(layer.wait(), reference_pages(per_layer[i], *kv[i]))
        two = serde.two_stream and i % 2 == 0
        received[i] = [type(p)(p.index, p.token_start, p.token_end, p.anchor, None) if two
                       else p for p in layer.pages]
    used = serde.decode_layers(received, dst, slots)
    for i, (k, v) in enumerate(kv):
        stage = "anchor" if serde.two_stream and i % 2 == 0 else "full"
        ref = per_layer[i]
        wk, wv = reference_kv(ref, reference_pages(ref, k, v), h, d, dtype, stage)
        gk, gv = dst.read(i, slots)
        assert torch.equal(gk.cpu(), wk) and torch.equal(gv.cpu(), wv), (i, stage)
    return used
