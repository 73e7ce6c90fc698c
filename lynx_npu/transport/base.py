"""The transfer interface: what the rest of lynx_npu asks of a KV transport.

A transport moves a request's pages from a prefill instance to a decode instance, every anchor
frame before any residual frame, and tells the decode side, per request, when the anchor stream
and when the residual stream has fully arrived. It moves bytes only: the page serde
(lynx_npu.ops.page_serde) turns caches into wire pages and back, on their device, and is given
to the transport as a constructor parameter (``serde=``, a ``codec -> PageSerde`` factory).

The embedded TCP split-stream transport (sender.py / receiver.py) is one implementation;
transfer engines (Mooncake, LMCache: DESIGN §5) are added beside it as other subclasses,
selected by the integration's configuration.

Sending side, :class:`KVSender`:
    handle = sender.send(request_id, codec, [(k, v), ...])           # dense layers, encoded
                                                                     # on the sender's thread
    handle = sender.send_layers(request_id, codec, encoded_layers, num_layers=..., ...)
    handle.anchor_acked / handle.done                                # StageEvents
Receiving side, :class:`KVReceiver`:
    handle = receiver.request(request_id)
    handle.anchor_ready / handle.residual_ready                      # StageEvents
"""
from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from typing import Callable

import torch

from ..ops.page_serde import EncodedLayer, PageSerde, WirePage, serde_for

SerdeFactory = Callable[[object], PageSerde]
# on_encoded(request_id, layer, page, stage): a received page, not decoded ("anchor" / "full")
OnEncoded = Callable[[int, int, WirePage, str], None]

__all__ = ["KVReceiver", "KVSender", "OnEncoded", "SerdeFactory", "serde_for"]


class KVSender(abc.ABC):
    """Moves requests' KV to one decode instance, anchor stream first."""

    @abc.abstractmethod
    def send(self, request_id: int, codec, layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
             deadline_s: float | None = None):
        """Dense layers ``(k, v)`` [num_kv_heads, num_tokens, head_dim], encoded by the serde
        layer after layer while earlier layers are on the wire. -> a send handle."""

    @abc.abstractmethod
    def send_layers(self, request_id: int, codec, layers: Iterable[EncodedLayer], *,
                    num_layers: int, num_tokens: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype, deadline_s: float | None = None):
        """Layers the caller encodes (``serde.encode_cache``), in order, as they become ready:
        each is sent once its bytes have landed (``EncodedLayer.wait``). -> a send handle."""

    @abc.abstractmethod
    def close(self) -> None: ...


class KVReceiver(abc.ABC):
    """Receives requests' KV; per request, anchor_ready and residual_ready."""

    @abc.abstractmethod
    def request(self, request_id: int, deadline_s: float | None = None):
        """The receive handle of ``request_id`` (created if nothing of it arrived yet)."""

    @abc.abstractmethod
    def release(self, request_id: int) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...
