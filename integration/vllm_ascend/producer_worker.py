"""Prefill side, in each worker: compress a finished prompt's KV straight out of the paged cache
and send it, anchor stream first, to the decode instance over the split-stream transport (the
embedded TCP one, or the Mooncake transfer engine: ``transport``, transports.py).

In ``wait_for_save`` of the step that completed the prompt (after its forward, before the
scheduler can free or reuse the blocks), the page serde compresses one layer after another on
the cache's device (lynx_npu.ops: the kernels read the blocks in place) and hands each encoded
layer to the sender as soon as it is made, so layer i+1 is compressed while layer i is on the
wire. On an accelerator the kernels and the copies to pinned host memory are queued on the
device, ordered before any later forward that could overwrite the blocks, and the sender waits
for each layer's bytes; on the CPU the kernel runs on this thread while the sender's threads
write the layers before it.
"""
from __future__ import annotations

import dataclasses

import queue

import torch

import lynx_npu
from lynx_npu.ops import EncodedLayer, PagedKVCache, WirePage, serde_for

from .config import LynxConnectorConfig, parse_peer
from .messages import SaveJob
from .transports import PeerUnavailable, Senders
from .vllm_compat import get_logger

log = get_logger(__name__)


class _Feed:
    """The layers of one request, handed from the encoding thread to the sender's thread."""

    def __init__(self, num_layers: int):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.num_layers = num_layers

    def put(self, layer: EncodedLayer | BaseException) -> None:
        self._queue.put(layer)

    def __iter__(self):
        for _ in range(self.num_layers):
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item


def _without_residual(layer: EncodedLayer) -> EncodedLayer:
    """Fault injection (``drop_residual``): the anchor frames only."""
    pages = [WirePage(p.index, p.token_start, p.token_end, p.anchor, None)
             for p in layer.wait().pages]
    return EncodedLayer(pages, layer.backend)


class ProducerWorker:
    def __init__(self, config: LynxConnectorConfig, rank: int, world_size: int):
        self.config, self.rank, self.world_size = config, rank, world_size
        self.kv: PagedKVCache | None = None
        self._saves: list[SaveJob] = []
        self._senders = Senders(config)
        self._serdes: dict[str, object] = {}

    def register(self, kv: PagedKVCache) -> None:
        self.kv = kv

    def bind(self, saves: list[SaveJob]) -> None:
        self._saves = list(saves)

    def wait_for_save(self) -> None:
        """Compress each completed prompt's KV (all layers) and start sending it."""
        saves, self._saves = self._saves, []
        for job in saves:
            if self.kv is None:
                raise RuntimeError("KV caches were never registered with the Lynx connector")
            try:
                self._save(job)
            except PeerUnavailable as e:  # nothing encoded: the decode side recomputes
                log.warning("Lynx: the KV of request %s is not sent: %s", job.req_id, e)
            except Exception:  # one bad request must not stop the others (or the engine)
                log.exception("Lynx: sending the KV of request %s failed", job.req_id)

    def _save(self, job: SaveJob) -> None:
        params = job.params
        peer = params.peer or self.config.peer
        if peer is None:
            raise ValueError(f"request {job.req_id}: no decode peer (set 'peer' in "
                             f"kv_connector_extra_config or in kv_transfer_params['lynx'])")
        name = params.codec or self.config.codec
        codec = self.config.codec_for(name)
        serde = self._serdes.get(name)
        if serde is None:
            serde = self._serdes[name] = serde_for(codec)
            log.info("Lynx: %s compresses on %s with the %r ops backend", name, self.kv.device,
                     serde.compress_backend(self.kv.device, self.kv.num_kv_heads,
                                            self.kv.head_size, self._wire_dtype()))
        kv, dtype = self.kv, self._wire_dtype()
        slots = kv.slots(job.block_ids, 0, job.num_tokens)
        feed = _Feed(kv.num_layers)
        # Each tensor-parallel rank sends its own heads to its own receiver (port + rank), so
        # the transfer id is the same on every rank. Never waits for the receiver (a sender
        # not made yet takes the request once it is up: transports.Senders).
        host, port = parse_peer(peer)
        self._senders.send_layers(
            host, port + self.rank, params.transfer_id, codec, feed, num_layers=kv.num_layers,
            num_tokens=job.num_tokens, num_kv_heads=kv.num_kv_heads, head_dim=kv.head_size,
            dtype=dtype)
        if dtype == kv.dtype:
            layers = serde.encode_layers(kv, slots.to(kv.device))
        else:  # wire_dtype: the cast needs the tokens gathered first
            layers = (serde.for_layer(i, kv.num_layers).encode(
                *(x.to(dtype) for x in kv.read(i, slots))) for i in range(kv.num_layers))
        keep = kv.num_layers - params.withhold_layers
        try:
            for i, layer in enumerate(layers):
                if i == params.fail_layer:  # fault injection: as a codec error would
                    raise RuntimeError(f"layer {i} failed to encode (fault injection: "
                                       f"fail_layer)")
                if i >= keep:  # fault injection (withhold_layers): a layer with no pages
                    layer = EncodedLayer([], layer.wait().backend)
                feed.put(_without_residual(layer) if params.drop_residual else layer)
        except Exception as e:
            feed.put(e)  # the request fails loudly on the sender's side too
            raise
        log.debug("Lynx: request %s queued as transfer %d (%s)", job.req_id,
                  params.transfer_id, name)

    def _wire_dtype(self) -> torch.dtype:
        if self.config.wire_dtype is None:
            return self.kv.dtype
        return getattr(torch, self.config.wire_dtype)

    def restart_transport(self) -> int:
        """Close every sender now (a transfer in flight fails on this side and its connection
        drops), as the transport dying would; the next transfer opens a new one. Returns how
        many were closed."""
        return self._senders.close()

    def set_link_rate(self, gbps: float | None) -> int:
        """Later transfers over the embedded TCP transport go at ``gbps`` (None: no limit).
        Closes the senders (call it between transfers); returns how many were closed."""
        config = dataclasses.replace(self.config, gbps=gbps)  # validated as at start-up
        closed = self._senders.close()
        self.config = self._senders.config = config
        return closed

    def close(self) -> None:
        self._senders.close()
