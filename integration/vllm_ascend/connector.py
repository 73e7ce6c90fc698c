"""LynxConnector: vLLM's KV-connector interface over Lynx's split-stream transfer.

    --kv-transfer-config '{"kv_connector": "LynxConnector",
        "kv_connector_module_path": "lynx_npu.integration.vllm_ascend.connector",
        "kv_role": "kv_producer" | "kv_consumer", "kv_connector_extra_config": {...}}'

The prefill instance (kv_producer) compresses and sends each request's prompt KV as soon as it
is computed; the decode instance (kv_consumer) loads the anchor stream asynchronously and starts
decoding on it, refining in place when the residual arrives. The decode instance also needs the
Lynx scheduler and the null proposer (see ``decode_engine_args`` in engine_config.py); this
class only moves KV and reports. The halves live in connector_scheduler.py (scheduler
process), producer_worker.py and consumer_worker.py (each worker).
"""
from __future__ import annotations

from typing import Any

from .config import LynxConnectorConfig
from .connector_scheduler import ConnectorScheduler
from .kv_cache_io import paged_kv_from_vllm
from .messages import LynxConnectorMeta
from .stats import LynxPromMetrics, LynxStats
from .vllm_compat import (KVConnectorBase, KVConnectorRole, KVConnectorTransferResults,
                          get_logger, layer_index, reasoning_parser, tensor_parallel,
                          worker_connector_stats)

log = get_logger(__name__)


class LynxConnector(KVConnectorBase):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        self.config = LynxConnectorConfig.from_vllm(ktc.kv_role,
                                                    ktc.kv_connector_extra_config)
        if (self.config.role == "consumer"
                and vllm_config.cache_config.enable_prefix_caching):
            raise ValueError("the Lynx decode instance needs enable_prefix_caching=False: "
                             "blocks holding anchor-precision KV must never be shared")
        self.rank, self.world_size = (0, vllm_config.parallel_config.tensor_parallel_size)
        self.scheduler_half: ConnectorScheduler | None = None
        self.worker = None
        self._load_blocks: dict[str, tuple[int, ...]] = {}  # worker side: blocks of each load
        self._layer_pos: dict[str, int] = {}
        if role == KVConnectorRole.SCHEDULER:
            self.scheduler_half = ConnectorScheduler(self.config, self.world_size,
                                                     reasoning_parser(vllm_config))
        else:
            self.rank, self.world_size = tensor_parallel(vllm_config)
            if self.config.role == "producer":
                from .producer_worker import ProducerWorker
                self.worker = ProducerWorker(self.config, self.rank, self.world_size)
            else:
                from .consumer_worker import ConsumerWorker
                self.worker = ConsumerWorker(self.config, self.rank, self.world_size)
                log.info("Lynx: decode receiver of rank %d listens on %s:%d", self.rank,
                         self.config.host, self.worker.port)

    # -- worker side -------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict) -> None:
        kv = paged_kv_from_vllm(kv_caches)
        # the transfers' layer i is the i-th attention layer in model order
        self._layer_pos = {name: i for i, name in enumerate(sorted(kv_caches,
                                                                  key=layer_index))}
        log.info("Lynx: KV cache layout %s, %d layers, block size %d, %d kv heads x %d",
                 kv.layout.name, kv.num_layers, kv.block_size, kv.num_kv_heads, kv.head_size)
        self.worker.register(kv)

    def bind_connector_metadata(self, connector_metadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if not isinstance(connector_metadata, LynxConnectorMeta):
            return
        if self.config.role == "producer":
            self.worker.bind(connector_metadata.saves)
        else:
            self._load_blocks.update((j.req_id, j.block_ids) for j in connector_metadata.loads)
            for req_id in connector_metadata.releases:
                self._load_blocks.pop(req_id, None)
            self.worker.bind(connector_metadata.loads, connector_metadata.releases,
                             connector_metadata.scheduled_early, connector_metadata.discards)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        return None  # loads start at bind and run beside the forward (consumer_worker.py)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads are asynchronous; only a request started before its whole anchor was in
        # (early_start_s) makes the forward wait here, layer by layer.
        layer = self._layer_pos.get(layer_name)
        if self.config.role == "consumer" and layer is not None:
            self.worker.wait_for_layer(layer)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return None  # the whole prompt is read once its last layer is written (wait_for_save)

    def wait_for_save(self) -> None:
        if self.config.role == "producer":
            self.worker.wait_for_save()

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        if self.config.role == "producer":
            return KVConnectorTransferResults()
        done, failed = self.worker.finish_step(finished_req_ids)
        return KVConnectorTransferResults(finished_recving=done, failed_recving=failed)

    def load_block_ids(self, req_id: str) -> tuple[int, ...]:
        """The blocks a request's load writes (vLLM 0.23 takes failed loads as block ids)."""
        return self._load_blocks.get(req_id, ())

    def build_connector_worker_meta(self):
        if self.config.role == "producer":
            return None
        return self.worker.take_meta()

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.close()

    # -- scheduler side ------------------------------------------------------------------------
    def on_new_request(self, request) -> None:
        self.scheduler_half.on_new_request(request)

    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)  # vLLM 0.32 only (vllm_compat)
        self.scheduler_half.blocks.bind(kv_cache_manager)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        if self.config.role == "producer":
            return 0, False
        return self.scheduler_half.num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if self.config.role == "consumer":
            self.scheduler_half.after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> LynxConnectorMeta:
        return self.scheduler_half.build_meta(scheduler_output)

    def update_connector_output(self, connector_output) -> None:
        self.scheduler_half.on_worker_output(connector_output)

    def request_finished(self, request, block_ids):
        return self.scheduler_half.request_finished(request)

    # -- statistics (stats.py): counted by the scheduler half, shown by vLLM's loggers ---------
    def get_kv_connector_stats(self) -> LynxStats | None:
        if self.scheduler_half is None:  # workers count nothing, but vLLM 0.23 needs a report
            if self.config.role == "consumer":  # the receiver-slot gauge (stats.GAUGES)
                return LynxStats.gauges(self.worker.receiver_active_requests)
            return worker_connector_stats(LynxStats())
        return self.scheduler_half.stats.take()

    @classmethod
    def build_kv_connector_stats(cls, data: dict | None = None) -> LynxStats:
        return LynxStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames,
                           per_engine_labelvalues) -> LynxPromMetrics:
        return LynxPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_loaded_kv_cache_group_ids(self, request) -> tuple[int, ...]:
        # The transfer carries the request's own blocks of every (single) attention group.
        return tuple(range(len(self._kv_cache_config.kv_cache_groups)))
