"""The transport a Lynx connector instance moves KV over, chosen by ``transport`` in
``kv_connector_extra_config`` (config.py): the embedded TCP split stream (``tcp``, the default),
the Mooncake transfer engine (``mooncake``: lynx_npu/transport/mooncake.py) or LMCache objects
in a shared directory (``lmcache``: lynx_npu/transport/lmcache.py). The only module of the
integration that names transport classes; the workers see KVSender / KVReceiver.

An explicit ``mooncake`` or ``lmcache`` on a host where the engine or LMCache does not import
fails when the worker starts, naming the import error (EngineUnavailable / LMCacheUnavailable).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from lynx_npu.transport import Receiver, ReceiverConfig, Sender, SenderConfig, TransferError
from lynx_npu.transport.base import KVReceiver, KVSender, OnEncoded

from .config import LynxConnectorConfig, declared_codecs
from .vllm_compat import get_logger

log = get_logger(__name__)


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


class PeerUnavailable(TransferError):
    """No sender to this decode receiver for now: making one failed a moment ago."""


# After a failed attempt to reach a decode receiver, its requests fail at once for this long
# (nothing encoded, nothing waited for); the first request after it tries again.
RETRY_S = 5.0
# Decode receivers a prefill worker keeps a sender to (or is reaching): a request may name its
# own (kv_transfer_params' peer), so this bounds the threads and connections requests naming
# ever new ones could make. A deployment has a few decode instances, each a receiver per rank.
MAX_PEERS = 64


@dataclass
class _Peer:
    sender: KVSender | None = None
    pending: list = field(default_factory=list)  # (args, kwargs) of send_layers, in order
    dialing: bool = False
    error: str = ""                              # why the last attempt failed
    failed_at: float = 0.0


class Senders:
    """The prefill worker's senders, one per decode receiver, made on first use; over Mooncake
    they share one engine (one segment per worker process); over LMCache each has its own
    StorageManager on the shared directory.

    ``send_layers`` never waits for a decode receiver: making a sender (connect and handshake)
    runs on a thread of its own, and the requests to that receiver wait in order meanwhile and
    go once it is up. A worker's step used to make it in place, so a hung decode receiver (one
    that accepts and never answers) held every prefill step 15 s (connect_timeout_s x
    handshake_attempts), for requests to every other decode instance too. If making it fails,
    the waiting requests fail (logged) and so does every request to that receiver for
    ``RETRY_S`` after, at once (PeerUnavailable, before any encoding)."""

    def __init__(self, config: LynxConnectorConfig):
        self.config = config
        self._peers: dict[tuple[str, int], _Peer] = {}
        self._engine = None
        self._engine_lock = threading.Lock()
        self._lock = threading.Lock()
        self._generation = 0  # close() ends the senders (and dials) of the one before

    def get(self, host: str, port: int) -> KVSender:
        """The sender to ``host:port``, made now (on this thread) if there is none."""
        with self._lock:
            peer = self._peers.setdefault((host, port), _Peer())
            if peer.sender is not None:
                return peer.sender
        sender = self._make(host, port)
        with self._lock:
            if peer.sender is None:
                peer.sender, peer.error = sender, ""
                return sender
        sender.close()  # made twice at once: keep the first
        return peer.sender

    def send_layers(self, host: str, port: int, *args, **kwargs) -> KVSender | None:
        """``KVSender.send_layers(*args, **kwargs)`` on the sender to ``host:port`` -> that
        sender, or None while it is being made (the request goes once it is up)."""
        with self._lock:
            key = (host, port)
            peer = self._peers.get(key) or self._new_peer(key)
            sender = peer.sender
            if sender is None:
                since = time.monotonic() - peer.failed_at
                if peer.error and not peer.dialing and since < RETRY_S:
                    raise PeerUnavailable(
                        f"the decode receiver {host}:{port} could not be reached {since:.1f} s "
                        f"ago ({peer.error}); tried again {RETRY_S:g} s after that")
                peer.pending.append((args, kwargs))
                if not peer.dialing:
                    peer.dialing = True
                    threading.Thread(target=self._dial, args=(key, peer, self._generation),
                                     daemon=True, name="lynx-dial").start()
                return None
        sender.send_layers(*args, **kwargs)
        return sender

    def _new_peer(self, key: tuple[str, int]) -> _Peer:
        """(under _lock) A receiver not seen before; receivers that failed RETRY_S ago are
        forgotten first if MAX_PEERS are known."""
        if len(self._peers) >= MAX_PEERS:
            now = time.monotonic()
            for k in [k for k, p in self._peers.items() if p.sender is None and not p.dialing
                      and now - p.failed_at >= RETRY_S]:
                del self._peers[k]
        if len(self._peers) >= MAX_PEERS:
            raise PeerUnavailable(f"the prefill worker already sends to, or reaches, "
                                  f"{len(self._peers)} decode receivers (MAX_PEERS); not "
                                  f"{key[0]}:{key[1]}")
        peer = self._peers[key] = _Peer()
        return peer

    def dialing(self, host: str, port: int) -> int:
        """How many requests wait for the sender to ``host:port`` being made (0: none is)."""
        with self._lock:
            peer = self._peers.get((host, port))
            return len(peer.pending) if peer is not None and peer.dialing else 0

    def _dial(self, key: tuple[str, int], peer: _Peer, generation: int) -> None:
        try:
            made, error = self._make(*key), ""
        except Exception as e:  # noqa: BLE001 - unreachable, refused, a hung receiver
            made, error = None, f"{type(e).__name__}: {e}"
        sender = made
        while True:  # the waiting requests, in order; ones that come meanwhile wait behind
            with self._lock:
                current = generation == self._generation and self._peers.get(key) is peer
                if not current:
                    sender, error = None, "the prefill's transport was closed meanwhile"
                elif sender is not None and peer.sender is not None:
                    sender = peer.sender  # get() made one meanwhile: keep that one
                batch, peer.pending = peer.pending, []
                if not batch:
                    peer.dialing = False
                    if sender is not None:
                        peer.sender, peer.error = sender, ""
                    elif current:
                        peer.error, peer.failed_at = error, time.monotonic()
                    break
            for args, kwargs in batch:
                rid = args[0] if args else kwargs.get("request_id")
                if sender is None:
                    log.warning("Lynx: the KV of transfer %s is not sent: the decode "
                                "receiver %s:%d could not be reached (%s)", rid, *key, error)
                    continue
                try:
                    sender.send_layers(*args, **kwargs)
                except Exception:  # noqa: BLE001 - one bad request must not stop the others
                    log.exception("Lynx: sending the KV of transfer %s failed", rid)
        if made is not None and made is not sender:
            made.close()  # not kept: closed meanwhile, or get() made another

    def _make(self, host: str, port: int) -> KVSender:
        c = self.config
        if c.transport == "mooncake":
            from lynx_npu.transport.mooncake import MooncakeEngine, MooncakeSender
            with self._engine_lock:  # senders to two receivers may be made at once
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
        """Close every sender (and the Mooncake engine); -> how many senders were open. A
        sender still being made is closed once made; its waiting requests are not sent."""
        with self._lock:
            self._generation += 1
            senders = [p.sender for p in self._peers.values() if p.sender is not None]
            self._peers.clear()
        for sender in senders:
            sender.close()
        closed = len(senders)
        with self._engine_lock:
            if self._engine is not None:
                self._engine.close()
                self._engine = None
        return closed
