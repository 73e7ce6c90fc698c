"""The transport a Lynx connector instance moves KV over, chosen by ``transport`` in
``kv_connector_extra_config`` (config.py): the embedded TCP split stream (``tcp``, the default),
the Mooncake transfer engine (``mooncake``: lynx_npu/transport/mooncake.py) or LMCache objects
in a shared directory (``lmcache``: lynx_npu/transport/lmcache.py). The only module of the
integration that names transport classes; the workers see KVSender / KVReceiver.

An explicit ``mooncake`` or ``lmcache`` on a host where the engine or LMCache does not import
fails when the worker starts, naming the import error (EngineUnavailable / LMCacheUnavailable).
"""
from __future__ import annotations

from lynx_npu.transport import Receiver, ReceiverConfig, Sender, SenderConfig
from lynx_npu.transport.base import KVReceiver, KVSender, OnEncoded

from .config import LynxConnectorConfig, declared_codecs


def make_receiver(config: LynxConnectorConfig, rank: int, on_encoded: OnEncoded) -> KVReceiver:
    """The decode worker's receiver: listens on ``port + rank`` (tensor-parallel rank r)."""
    cfg = ReceiverConfig(host=config.host, port=config.port + rank if config.port else 0,
                         deadline_s=config.transfer_timeout_s,
                         sender_grace_s=config.sender_grace_s,
                         num_decode_threads=config.num_decode_threads,
                         defer_residual=config.defer_residual, secret=config.secret_bytes,
                         codecs=declared_codecs(config))
    if config.transport == "mooncake":
        from lynx_npu.transport.mooncake import MooncakeReceiver
        return MooncakeReceiver(cfg, config.mooncake_config(), on_encoded=on_encoded)
    if config.transport == "lmcache":
        from lynx_npu.transport.lmcache import LMCacheReceiver
        return LMCacheReceiver(cfg, config.lmcache_config(), on_encoded=on_encoded)
    return Receiver(cfg, on_encoded=on_encoded)


class Senders:
    """The prefill worker's senders, one per decode receiver, made on first use; over Mooncake
    they share one engine (one segment per worker process); over LMCache each has its own
    StorageManager on the shared directory."""

    def __init__(self, config: LynxConnectorConfig):
        self.config = config
        self._senders: dict[tuple[str, int], KVSender] = {}
        self._engine = None

    def get(self, host: str, port: int) -> KVSender:
        sender = self._senders.get((host, port))
        if sender is None:
            sender = self._senders[(host, port)] = self._make(host, port)
        return sender

    def _make(self, host: str, port: int) -> KVSender:
        c = self.config
        if c.transport == "mooncake":
            from lynx_npu.transport.mooncake import MooncakeEngine, MooncakeSender
            if self._engine is None:
                self._engine = MooncakeEngine(c.mooncake_config())
            return MooncakeSender(SenderConfig(port=port, host=host,
                                               deadline_s=c.transfer_timeout_s,
                                               secret=c.secret_bytes, codecs=declared_codecs(c)),
                                  self._engine)
        if c.transport == "lmcache":
            from lynx_npu.transport.lmcache import LMCacheSender
            return LMCacheSender(SenderConfig(port=port, host=host,
                                              deadline_s=c.transfer_timeout_s,
                                              codecs=declared_codecs(c)), c.lmcache_config())
        return Sender(SenderConfig(port=port, host=host, gbps=c.gbps,
                                   num_connections=c.num_connections,
                                   deadline_s=c.transfer_timeout_s, secret=c.secret_bytes,
                                   codecs=declared_codecs(c)))

    def close(self) -> int:
        """Close every sender (and the Mooncake engine); -> how many senders were open."""
        closed = len(self._senders)
        for sender in self._senders.values():
            sender.close()
        self._senders.clear()
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        return closed
