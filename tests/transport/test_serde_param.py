"""The transport takes the page serde as a constructor parameter and moves bytes only: over
real loopback sockets, layers encoded from a paged cache arrive as wire pages that the
caller decodes straight into another paged cache, bit-identical to the codec's reference."""
import functools
import queue

import pytest
import torch

from lynx_npu.ops import KV_CACHE_LAYOUTS
from lynx_npu.ops.page_serde import serde_for
from lynx_npu.ops.paged_cache import PagedKVCache
from lynx_npu.transport import Receiver, ReceiverConfig, Sender, SenderConfig

from .helpers import D, H, assert_kv_equal, expected_kv, make_layers, small_codec

WAIT = 30


def _cache(num_layers, num_tokens, bs=16):
    nb = -(-num_tokens // bs) + 2
    lay = KV_CACHE_LAYOUTS["vllm_flash_nhd"]
    return PagedKVCache.build(lay, [lay.allocate(nb, bs, H, D, fill=0.0)
                                    for _ in range(num_layers)]), nb


def test_send_layers_from_a_paged_cache_into_a_paged_cache():
    codec, layers = small_codec("lynx"), make_layers(num_layers=3, num_tokens=200)
    src, nb = _cache(3, 200)
    dst, _ = _cache(3, 200)
    order = torch.randperm(nb, generator=torch.Generator().manual_seed(1))
    slots_src = src.slots(order.tolist(), 0, 200)
    slots_dst = dst.slots(order.flip(0).tolist(), 0, 200)
    for i, (k, v) in enumerate(layers):
        src.write(i, slots_src, k, v)
    pages: dict[int, list] = {}
    stages = []

    def on_encoded(rid, layer, page, stage):
        stages.append(stage)
        pages.setdefault(layer, []).append(page)

    serde = serde_for(codec)
    feed: queue.SimpleQueue = queue.SimpleQueue()

    def fed():  # a queue-fed iterator: the sender frames each layer as it is encoded
        for _ in range(3):
            yield feed.get()

    with Receiver(ReceiverConfig(), on_encoded=on_encoded) as receiver:
        with Sender(SenderConfig(port=receiver.port)) as sender:
            sent = sender.send_layers(9, codec, fed(), num_layers=3, num_tokens=200,
                                      num_kv_heads=H, head_dim=D, dtype=torch.bfloat16)
            for i in range(3):
                feed.put(serde.encode_cache(src.layer(i), slots_src))
            handle = receiver.request(9)
            assert handle.residual_ready.wait(WAIT) and sent.wait(WAIT)
    assert sent.compressed_by == {"cpu"}
    assert not handle.k and stages.count("full") == sum(len(p) for p in pages.values()) // 2
    want = expected_kv(codec, layers)
    for i, layer_pages in pages.items():
        # the latest stage of each page, as the vLLM consumer keeps them
        latest = {p.token_start: p for p in layer_pages if p.residual is not None}
        assert serde.decode_into(list(latest.values()), dst.layer(i), slots_dst) == "cpu"
        gk, gv = dst.read(i, slots_dst)
        assert torch.equal(gk, want[i][0]) and torch.equal(gv, want[i][1])


def test_serde_is_a_parameter_on_both_sides():
    """A sender whose serde runs the torch reference and a receiver decoding on the cpu
    kernel: the same bytes on the wire, the same KV at the end."""
    codec, layers = small_codec("lynx"), make_layers(num_layers=2, num_tokens=150)
    reference = functools.partial(serde_for, backend="torch")
    decoded_by = []

    def kernel_serde(c):
        s = serde_for(c, backend="cpu")
        decoded_by.append(s.decompress_backend("cpu", H, D, torch.bfloat16))
        return s

    with Receiver(ReceiverConfig(), serde=kernel_serde) as receiver:
        with Sender(SenderConfig(port=receiver.port), serde=reference) as sender:
            sent = sender.send(4, codec, layers)
            handle = receiver.request(4)
            assert handle.residual_ready.wait(WAIT) and sent.wait(WAIT)
    assert sent.compressed_by == {"torch"} and decoded_by == ["cpu"]
    assert_kv_equal(handle, expected_kv(codec, layers))


def test_device_tensors_are_refused_by_the_transport():
    from lynx_npu.ops.page_serde import as_bytes
    with pytest.raises(ValueError, match="stages device bytes"):
        as_bytes(torch.zeros(8, dtype=torch.uint8, device="meta"))
    with pytest.raises(ValueError, match="not both"):
        Receiver(ReceiverConfig(), on_page=lambda *a: None, on_encoded=lambda *a: None)


def test_send_layers_counts_its_layers():
    codec = small_codec("lynx")
    serde = serde_for(codec)
    k, v = make_layers(1, 64)[0]
    with Receiver(ReceiverConfig()) as receiver:
        with Sender(SenderConfig(port=receiver.port)) as sender:
            bad = sender.send_layers(1, codec, [serde.encode(k, v)], num_layers=2,
                                     num_tokens=64, num_kv_heads=H, head_dim=D,
                                     dtype=torch.bfloat16)
            with pytest.raises(Exception, match="1 layers were given; the request has 2"):
                bad.wait(WAIT)
