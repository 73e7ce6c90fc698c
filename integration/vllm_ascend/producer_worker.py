"""Prefill side, in each worker: read a finished prompt's KV out of the paged cache and send it,
anchor stream first, to the decode instance over the split-stream transport.

The gather runs in ``wait_for_save`` of the step that completed the prompt (after its forward,
before the scheduler can free or reuse the blocks); compression and sending run on a
background thread, so the engine does not wait for the link. With ``precompress`` every layer
is encoded before the first byte goes out (the demo uses it to time the link alone, since the
CPU reference codec is far slower than the NPU / GPU kernels); otherwise the sender compresses
layer i+1 while layer i is on the wire.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import torch

import lynx_npu
from lynx_npu.codec import EncodedPage
from lynx_npu.transport import Sender, SenderConfig

from .config import LynxConnectorConfig, parse_peer
from .kv_cache_io import PagedKV
from .messages import SaveJob
from .vllm_compat import get_logger

log = get_logger(__name__)


@dataclass
class _Outgoing:
    job: SaveJob
    transfer_id: int
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    queued_at: float


class ProducerWorker:
    def __init__(self, config: LynxConnectorConfig, rank: int, world_size: int):
        self.config, self.rank, self.world_size = config, rank, world_size
        self.kv: PagedKV | None = None
        self._saves: list[SaveJob] = []
        self._senders: dict[tuple[str, int], Sender] = {}
        self._queue: queue.SimpleQueue[_Outgoing | None] = queue.SimpleQueue()
        self._handles: list = []
        self._thread = threading.Thread(target=self._send_loop, daemon=True,
                                        name="lynx-producer")
        self._thread.start()

    def register(self, kv: PagedKV) -> None:
        self.kv = kv

    def bind(self, saves: list[SaveJob]) -> None:
        self._saves = list(saves)

    def wait_for_save(self) -> None:
        """Gather each completed prompt's KV (all layers) and queue it for sending."""
        saves, self._saves = self._saves, []
        for job in saves:
            if self.kv is None:
                raise RuntimeError("KV caches were never registered with the Lynx connector")
            slots = self.kv.slots(job.block_ids, 0, job.num_tokens)
            layers = [self.kv.gather(i, slots) for i in range(self.kv.num_layers)]
            if self.config.wire_dtype is not None:
                dtype = getattr(torch, self.config.wire_dtype)
                layers = [(k.to(dtype), v.to(dtype)) for k, v in layers]
            # Each tensor-parallel rank sends its own heads to its own receiver (port + rank),
            # so the transfer id is the same on every rank.
            self._queue.put(_Outgoing(job, job.params.transfer_id, layers, time.monotonic()))

    def _sender(self, peer: str) -> Sender:
        host, port = parse_peer(peer)
        port += self.rank  # tensor-parallel rank r talks to the decode receiver of rank r
        sender = self._senders.get((host, port))
        if sender is None:
            sender = Sender(SenderConfig(port=port, host=host, gbps=self.config.gbps,
                                         deadline_s=self.config.transfer_timeout_s,
                                         secret=self.config.secret_bytes))
            self._senders[(host, port)] = sender
        return sender

    def _send_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._send(item)
            except Exception:  # one bad request must not stop the others
                log.exception("Lynx: sending the KV of request %s failed", item.job.req_id)

    def _send(self, item: _Outgoing) -> None:
        params = item.job.params
        peer = params.peer or self.config.peer
        if peer is None:
            raise ValueError(f"request {item.job.req_id}: no decode peer (set 'peer' in "
                             f"kv_connector_extra_config or in kv_transfer_params['lynx'])")
        codec = lynx_npu.get_codec(params.codec or self.config.codec)
        sender = self._sender(peer)
        k0 = item.layers[0][0]
        if self.config.precompress or params.drop_residual:
            pages = [codec.encode_pages(k, v) for k, v in item.layers]
            if params.drop_residual:  # fault injection: the residual stream never leaves
                pages = [[EncodedPage(p.index, p.token_start, p.token_end, p.anchor, None)
                          for p in layer] for layer in pages]
            handle = sender.send_encoded(item.transfer_id, codec, pages,
                                         num_tokens=k0.shape[1], num_kv_heads=k0.shape[0],
                                         head_dim=k0.shape[2], dtype=k0.dtype)
        else:
            handle = sender.send(item.transfer_id, codec, item.layers)
        self._handles = [h for h in self._handles if not h.done.settled()] + [handle]
        log.debug("Lynx: request %s sent as transfer %d (%s)", item.job.req_id,
                  item.transfer_id, codec.name)

    def close(self) -> None:
        self._queue.put(None)
        for sender in self._senders.values():
            sender.close()

