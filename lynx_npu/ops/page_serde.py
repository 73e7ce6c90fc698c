"""The page serde: paged KV cache -> wire pages -> paged KV cache, one interface for every codec.

It is what the transport, the vLLM connector and the benchmarks all use (LMCache's shape: a
pure serializer with exact sizes; the transport moves its bytes and knows nothing of devices):

    serde = serde_for(lynx_npu.get_codec("lynx"))
    layer = serde.encode_cache(cache.layer(i), slots)      # compress on the cache's device
    layer.wait()                                           # host bytes ready (pinned staging)
    for page in layer.pages: send(page.anchor, page.residual)         # memoryviews
    ...
    serde.decode_into(received_pages, cache.layer(i), slots)   # straight into the cache

Every serde gives the bytes of its codec's ``encode_pages`` (byte-identical, tested), so peers
need not run the same serde. Lynx codecs run on the ops kernels (lynx_serde.py); the baselines
keep their reference encoders behind the same interface (baseline_serde.py).
"""
from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from .kv_layouts import ResolvedCache


@dataclass(frozen=True)
class WirePage:
    """One page as the wire carries it: host bytes (anything bytes-like), residual None for
    one-stream codecs or a page whose residual has not arrived."""

    index: int
    token_start: int
    token_end: int
    anchor: memoryview
    residual: memoryview | None


class EncodedLayer:
    """A layer's wire pages. Their bytes may still be landing in host memory (a device-side
    copy): ``wait()`` before reading them. ``backend`` names what compressed the layer."""

    def __init__(self, pages: list[WirePage], backend: str, ready=None):
        self.pages, self.backend, self._ready = pages, backend, ready

    def wait(self) -> "EncodedLayer":
        if self._ready is not None:
            self._ready()
            self._ready = None
        return self

    @property
    def nbytes(self) -> int:
        return sum(len(p.anchor) + (len(p.residual) if p.residual is not None else 0)
                   for p in self.pages)


def as_bytes(data) -> memoryview:
    """A host uint8 tensor or any bytes-like object -> a flat memoryview, without a copy."""
    if isinstance(data, torch.Tensor):
        if data.device.type != "cpu":
            raise ValueError(f"wire bytes must be on the host, got a tensor on {data.device}: "
                             f"encode through a PageSerde, which stages device bytes")
        data = data.contiguous().view(torch.uint8).reshape(-1).numpy()
    return memoryview(data).cast("B")


def wire_pages(pages) -> list[WirePage]:
    """codec.encode_pages output (host tensors) -> WirePages."""
    return [WirePage(p.index, p.token_start, p.token_end, as_bytes(p.anchor),
                     as_bytes(p.residual) if p.residual is not None else None) for p in pages]


class PageSerde(abc.ABC):
    """Encodes layers into wire pages and decodes received pages, for one codec."""

    def __init__(self, codec, backend: str | None = None):
        self.codec, self.backend = codec, backend
        self.name, self.stages = codec.name, codec.stages

    @property
    def two_stream(self) -> bool:
        return len(self.stages) > 1

    def for_layer(self, layer: int, num_layers: int) -> "PageSerde":
        """The serde of layer ``layer`` of ``num_layers``: this one, unless the codec's split
        differs by layer (per_layer_serde.py)."""
        return self

    @abc.abstractmethod
    def page_nbytes(self, num_tokens: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype) -> list[tuple[int, int, int, int | None]]:
        """Exact wire sizes: (token_start, token_end, anchor bytes, residual bytes or None)."""

    @abc.abstractmethod
    def encode(self, k: torch.Tensor, v: torch.Tensor) -> EncodedLayer:
        """A dense layer k, v [num_kv_heads, num_tokens, head_dim] on any device."""

    @abc.abstractmethod
    def encode_cache(self, cache: ResolvedCache, slot_mapping: torch.Tensor) -> EncodedLayer:
        """Tokens ``slot_mapping[t]`` of one layer of a paged cache, on the cache's device."""

    @abc.abstractmethod
    def decode_page(self, anchor, residual, token_start: int, token_end: int, *,
                    num_kv_heads: int, head_dim: int, dtype: torch.dtype
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One received page -> host k, v [num_kv_heads, n, head_dim] (the anchor stage when
        ``residual`` is None for a two-stream codec)."""

    @abc.abstractmethod
    def decode_into(self, pages: Sequence[WirePage], cache: ResolvedCache,
                    slot_mapping: torch.Tensor, wire_dtype: torch.dtype | None = None) -> str:
        """Write received pages of one layer into a paged cache on its device: token t ->
        ``slot_mapping[t]`` (covering the layer's tokens). ``wire_dtype``: the pages' KV dtype
        where it is not the cache's (decoded, then cast). -> the backend that decoded."""

    def _decode_cast(self, pages: Sequence[WirePage], cache: ResolvedCache,
                     slot_mapping: torch.Tensor, wire_dtype: torch.dtype) -> str:
        """Pages of another dtype than the cache's: decode each, cast, scatter (torch)."""
        from .dest import paged, scatter_tokens
        dest = paged(cache, slot_mapping.to(cache.k.tensor.device, torch.int64))
        for p in pages:
            k, v = self.decode_page(p.anchor, p.residual, p.token_start, p.token_end,
                                    num_kv_heads=cache.num_kv_heads, head_dim=cache.head_size,
                                    dtype=wire_dtype)
            scatter_tokens(dest, p.token_start, k.to(dest.device), v.to(dest.device),
                           cache.num_kv_heads, cache.head_size)
        used = self.decompress_backend("cpu", cache.num_kv_heads, cache.head_size, wire_dtype)
        return f"{used} ({str(wire_dtype).split('.')[-1]} pages cast to the " \
               f"{str(cache.dtype).split('.')[-1]} cache)"

    def encode_layers(self, cache, slot_mapping: torch.Tensor) -> Iterator[EncodedLayer]:
        """Every layer of a PagedKVCache (``slot_mapping[t]``: token t of the request), in
        order, each as soon as it is encoded (kernels that can, take all layers at once)."""
        for i in range(cache.num_layers):
            yield self.for_layer(i, cache.num_layers).encode_cache(cache.layer(i), slot_mapping)

    def decode_layers(self, pages: Mapping[int, Sequence[WirePage]], cache,
                      slot_mapping: torch.Tensor, wire_dtype: torch.dtype | None = None) -> str:
        """``pages[layer]`` of a request into a PagedKVCache (``decode_into`` per layer, or
        one launch for all where the kernels can). -> the backend that decoded."""
        used = "none"
        for layer, layer_pages in sorted(pages.items()):
            used = self.for_layer(layer, cache.num_layers).decode_into(
                layer_pages, cache.layer(layer), slot_mapping, wire_dtype)
        return used

    def compress_backend(self, device, num_kv_heads: int, head_dim: int, dtype) -> str:
        """What ``encode*`` runs on for tensors on ``device`` ("reference" for baselines)."""
        return "reference"

    decompress_backend = compress_backend


def serde_for(codec, backend: str | None = None) -> PageSerde:
    """The serde of ``codec`` (a registry codec). ``backend`` forces an ops backend for the
    Lynx codecs (else the device's automatic choice, ops/backends.py)."""
    from .baseline_serde import BaselineSerde
    from .lynx_serde import LYNX_VARIANTS, LynxSerde
    from .per_layer_serde import PerLayerSerde

    if getattr(codec, "name", None) in LYNX_VARIANTS:
        return (PerLayerSerde if codec.config.per_layer else LynxSerde)(codec, backend)
    return BaselineSerde(codec, backend)
