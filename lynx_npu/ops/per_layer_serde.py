"""The serde of a codec whose config differs by layer (Lynx's per-layer plan).

Each layer has one config (``codec.for_layer``), and the kernels and page layouts see only
that: this serde keeps one ``LynxSerde`` per distinct layer config and hands out the layer's
(``for_layer``). A request's layers of one config stay one batch (one launch per K / V where
the backend can, ops/layered.py), so a model with two calibrated layers costs two launches
instead of one, never one per layer.

Methods that handle one layer need to know which: here they raise, naming ``for_layer``,
instead of guessing a split.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import torch

from .page_serde import EncodedLayer, PageSerde, WirePage


class PerLayerSerde(PageSerde):
    def __init__(self, codec, backend: str | None = None):
        super().__init__(codec, backend)
        self._serdes: dict = {}

    def for_layer(self, layer: int, num_layers: int) -> PageSerde:
        from .lynx_serde import LynxSerde
        codec = self.codec.for_layer(layer, num_layers)
        serde = self._serdes.get(codec.config)
        if serde is None:
            serde = self._serdes[codec.config] = LynxSerde(codec, self.backend)
        return serde

    def groups(self, num_layers: int) -> list[tuple[PageSerde, list[int]]]:
        """(serde, its layers in order) per distinct layer config, by first layer."""
        out: dict[int, tuple[PageSerde, list[int]]] = {}
        for i in range(num_layers):
            serde = self.for_layer(i, num_layers)
            out.setdefault(id(serde), (serde, []))[1].append(i)
        return list(out.values())

    def encode_layers(self, cache, slot_mapping: torch.Tensor) -> Iterator[EncodedLayer]:
        # Each group's layers come in order from its own generator; taking them in layer order
        # keeps the pipeline (layer i ready before layer i + 1 is asked for).
        n = cache.num_layers
        group_of, streams = {}, []
        for serde, layers in self.groups(n):
            streams.append(iter(serde.encode_layers(cache.subset(layers), slot_mapping)))
            group_of.update((i, len(streams) - 1) for i in layers)
        for i in range(n):
            yield next(streams[group_of[i]])

    def decode_layers(self, pages: Mapping[int, Sequence[WirePage]], cache,
                      slot_mapping: torch.Tensor, wire_dtype: torch.dtype | None = None) -> str:
        used = []
        for serde, layers in self.groups(cache.num_layers):
            mine = [i for i in layers if i in pages]
            if mine:
                sub = cache.subset(mine)
                used.append(serde.decode_layers({j: pages[i] for j, i in enumerate(mine)},
                                                sub, slot_mapping, wire_dtype))
        return " / ".join(dict.fromkeys(used)) or "none"

    def compress_backend(self, device, num_kv_heads: int, head_dim: int, dtype) -> str:
        """What every layer config runs on ("cpu", or e.g. "cpu / torch" where they differ)."""
        n = self.codec.config.planned_layers[-1] + 2  # the listed layers and another
        serdes = dict.fromkeys(self.for_layer(i, n) for i in range(n))
        return " / ".join(dict.fromkeys(s.compress_backend(device, num_kv_heads, head_dim, dtype)
                                        for s in serdes))

    decompress_backend = compress_backend

    # -- one layer: which one? ---------------------------------------------------------------
    def _which_layer(self, *_, **__):
        raise ValueError(f"codec {self.name!r} differs by layer (a per-layer plan): take the "
                         f"layer's serde with serde.for_layer(layer, num_layers)")

    page_nbytes = encode = encode_cache = decode_page = decode_into = _which_layer
