"""Shared helpers: small real KV, the expected result of a transfer, a receiver+sender pair."""
from __future__ import annotations

import contextlib

import torch

import lynx_npu
from lynx_npu.transport import Receiver, ReceiverConfig, Sender, SenderConfig

H, D = 2, 16


def make_layers(num_layers: int = 3, num_tokens: int = 300, seed: int = 0,
                dtype=torch.bfloat16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    lap = lambda: torch.distributions.Laplace(0.0, 1.0).sample((H, num_tokens, D))  # noqa: E731
    torch.manual_seed(seed)
    return [((lap() + torch.randn(H, num_tokens, D, generator=g)).to(dtype),
             lap().to(dtype)) for _ in range(num_layers)]


def small_codec(name: str = "lynx"):
    """Real codecs with small pages so a few hundred tokens make several frames per layer."""
    if name in ("lynx", "lynx-int4", "lynx-int8"):
        return lynx_npu.get_codec(name, page_size=64)
    if name == "lynx-plan":  # a per-layer plan: layer 1's K anchor of 5 bits, layer 0's V
        return lynx_npu.get_codec("lynx", page_size=64, layer_anchor_bits=((1, 5, 4),),
                                  layer_v_chunk_size=((0, 8),))  # chunks of 8
    codec = lynx_npu.get_codec(name)
    codec.page_size = 64
    return codec


def expected_kv(codec, layers, stage: str = "full"):
    """What the receiver must hold: codec.decode_page of the very pages the sender sends."""
    out = []
    for i, (k, v) in enumerate(layers):
        ks, vs = [], []
        # a split per layer (layer_anchor_bits): layer i as its own codec
        layer_codec = codec.for_layer(i, len(layers)) if codec.name.startswith("lynx") else codec
        for p in layer_codec.encode_pages(k, v):
            kp, vp = layer_codec.decode_page(p.anchor, p.residual if stage == "full" else None,
                                       p.token_start, p.token_end, num_kv_heads=k.shape[0],
                                       head_dim=k.shape[2], dtype=k.dtype)
            ks.append(kp)
            vs.append(vp)
        out.append((torch.cat(ks, 1), torch.cat(vs, 1)))
    return out


def assert_kv_equal(handle, expected) -> None:
    assert sorted(handle.k) == list(range(len(expected)))
    for i, (k, v) in enumerate(expected):
        assert torch.equal(handle.k[i], k), f"layer {i} K differs"
        assert torch.equal(handle.v[i], v), f"layer {i} V differs"


@contextlib.contextmanager
def pair(receiver_kw: dict | None = None, sender_kw: dict | None = None, on_page=None,
         via=None):
    """A Receiver and a Sender connected over loopback (through ``via(port)`` if given)."""
    with Receiver(ReceiverConfig(**(receiver_kw or {})), on_page=on_page) as receiver:
        proxy = via(receiver.port) if via else None
        try:
            port = proxy.port if proxy else receiver.port
            with Sender(SenderConfig(port=port, **(sender_kw or {}))) as sender:
                yield receiver, sender, proxy
        finally:
            if proxy:
                proxy.close()
