"""Prefill side of the LMCache transport (lmcache.py has the design): stores a request's header
object, then every anchor object, and only once LMCache reports all of them in L2 its residual
objects. Each object holds one wire frame exactly as the TCP transport sends it (header,
parameters, the page's anchor or residual bytes; both CRC32Cs).

Threads: one pipeline thread (a request's layers, encoded by the serde or handed in by the
caller as they become ready -> frames; anchors queued at once, residuals held); one writer
(pops the queue, anchors of any request before any residual, into LMCache's L1; what L1 has
no room for goes again a moment later); LMCache's store thread reports objects stored in L2
(anchor_acked once every anchor is, done once all are); one watchdog (deadlines).

A request this sender fails for a reason the receiver cannot see (its KV did not encode,
LMCache refused a write) gets an abort object: the ERROR frame the TCP sender would send
(frame format 5), zero padded to the header object's size, so that the receiver fails the
request at once instead of at its deadline. Best effort, as over TCP: written ahead of every
other object, not retried if LMCache refuses it outright. Deadlines and ``close`` are not told
(the receiver keeps its own deadline, and a sender closing may be a restart).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from ..ops.page_serde import EncodedLayer, WirePage
from ..wire import Frame, Kind, encode_frame
from .base import KVSender, SerdeFactory, serde_for
from .config import SenderConfig
from .errors import TransferDeadlineError, TransferError, TransportClosed
from .lmcache_store import HEADER_OBJECT_BYTES, LMCacheConfig, LMCacheStore, namespace
from .request_checks import abort_bytes, request_meta
from .send_queue import SendQueue
from .sender import SendHandle

log = logging.getLogger(__name__)
HEADER_KIND = 0  # the request's header object (LMCacheStore.key kind 0)
ABORT_KIND = int(Kind.ERROR)  # the abort object of a request this sender failed


def abort_object(request_id: int, error: BaseException) -> bytes:
    """The abort object of a request: its ERROR frame (request_checks.abort_bytes), zero
    padded to HEADER_OBJECT_BYTES (the receiver reads it in one size, with the headers)."""
    data = abort_bytes(request_id, error)
    return data + bytes(HEADER_OBJECT_BYTES - len(data))


@dataclass
class _Put:
    key: tuple                 # (request_id, kind, layer, seq): unique in the queue
    handle: SendHandle
    objects: list              # [(ObjectKey, bytes)]


@dataclass
class _Request:
    handle: SendHandle
    keys: list = field(default_factory=list)          # every object written or queued
    pending: set = field(default_factory=set)         # ObjectKeys not yet in L2
    pending_anchor: int = 0
    produced_all: bool = False
    residuals: list = field(default_factory=list)     # (ObjectKey, bytes) held back
    residuals_queued: bool = False


def header_frame(request_id: int, meta: dict, has_residual: bool) -> bytes:
    """The request's header object: an ANCHOR wire frame covering all its tokens (layer 0,
    page 0) whose one-byte payload says whether residual objects follow; zero padded."""
    frame = Frame(Kind.ANCHOR, request_id, 0, meta["num_layers"], 0, 0, meta["num_tokens"],
                  meta["num_tokens"], meta["codec_id"], meta["dtype"], 0, meta["num_kv_heads"],
                  meta["head_dim"], meta["params"], b"\x01" if has_residual else b"\x00")
    data = encode_frame(frame)
    return data + bytes(HEADER_OBJECT_BYTES - len(data))


def check_sizable(serde, num_tokens: int = 256, num_kv_heads: int = 1, head_dim: int = 64,
                  dtype: torch.dtype = torch.bfloat16) -> None:
    """Refuse a codec whose object sizes follow the values (cachegen's entropy coding): the
    receiver plans a request's objects from its header alone."""
    try:
        serde.page_nbytes(num_tokens, num_kv_heads, head_dim, dtype)
    except ValueError as e:
        raise ValueError(f"over LMCache the receiver sizes a request's objects from its "
                         f"header: {e}; send it over tcp or mooncake") from None


class LMCacheSender(KVSender):
    """Stores requests' KV as LMCache objects for the LMCacheReceiver of ``config.port``.

        with LMCacheSender(SenderConfig(port=decode_port), LMCacheConfig(directory)) as s:
            s.send(request_id, codec, [(k0, v0), ...]).wait()

    ``store``: an LMCacheConfig (this sender builds and closes its own StorageManager) or an
    LMCacheStore shared in the process (left open). Of SenderConfig, ``port`` names the
    receiver (its objects' namespace), ``deadline_s`` and ``codecs`` apply; ``host``,
    ``secret`` and the TCP options do not (the shared directory's permissions are the access
    control); ``gbps`` is refused (LMCacheConfig.gbps on the receiver paces its reads).
    """

    def __init__(self, config: SenderConfig, store: LMCacheStore | LMCacheConfig,
                 serde: SerdeFactory = serde_for):
        if config.gbps is not None:
            raise ValueError(f"{config.gbps=}: over LMCache the receiver reads the objects; "
                             f"emulate a link rate with LMCacheConfig(gbps=...) on the receiver")
        self.config, self.serde = config, serde
        self._own_store = not isinstance(store, LMCacheStore)
        self.store = LMCacheStore(store) if self._own_store else store
        self.space = namespace(config.port)
        self._serdes: dict = {}
        self.queue = SendQueue()
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._requests: dict[int, _Request] = {}
        self._jobs: list = []
        self._jobs_cond = threading.Condition(self._lock)
        self._seq = 0
        self._threads = [threading.Thread(target=f, daemon=True, name=f"lynx-lmc-{n}")
                         for f, n in ((self._pipeline_loop, "pipeline"),
                                      (self._write_loop, "write"),
                                      (self._watchdog_loop, "send-watchdog"))]
        for t in self._threads:
            t.start()

    # -- public API (KVSender) -----------------------------------------------------------------
    def send(self, request_id: int, codec, layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
             deadline_s: float | None = None) -> SendHandle:
        if not isinstance(layers, Sequence) or len(layers) == 0:
            raise ValueError("layers must be a non-empty sequence of (k, v) pairs")
        k0 = layers[0][0]
        if not isinstance(k0, torch.Tensor) or k0.dim() != 3:
            raise ValueError("each layer must be (k, v) tensors [num_kv_heads, num_tokens, "
                             "head_dim]")
        meta = self._meta(codec, len(layers), k0.shape[1], k0.shape[0], k0.shape[2], k0.dtype)
        serde = self._serde(codec, meta)
        return self._submit(request_id, meta, ((i, serde.for_layer(i, len(layers)).encode(*layers[i]))
                                               for i in range(len(layers))), deadline_s)

    def send_layers(self, request_id: int, codec, layers: Iterable[EncodedLayer], *,
                    num_layers: int, num_tokens: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype, deadline_s: float | None = None) -> SendHandle:
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"{num_layers=} must be a positive int")
        meta = self._meta(codec, num_layers, num_tokens, num_kv_heads, head_dim, dtype)

        def numbered():
            count = 0
            for i, layer in enumerate(layers):
                if i >= num_layers:
                    raise ValueError(f"more than {num_layers=} layers were given")
                count += 1
                yield i, layer
            if count != num_layers:
                raise ValueError(f"{count} layers were given; the request has {num_layers}")
        return self._submit(request_id, meta, numbered(), deadline_s)

    def close(self) -> None:
        """Stop now: requests not yet stored fail with TransportClosed."""
        if self._closed.is_set():
            return
        self._closed.set()
        self.queue.close()
        with self._lock:
            self._jobs_cond.notify_all()
        self._fail_all(TransportClosed("the sender was closed before the request was stored"))
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)
        if self._own_store:
            self.store.close()

    def __enter__(self) -> "LMCacheSender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- intake -----------------------------------------------------------------------------------
    def _meta(self, codec, num_layers, num_tokens, num_kv_heads, head_dim, dtype) -> dict:
        # no handshake, so no receiver limits: the receiver checks the header (lmcache_receiver)
        meta = request_meta(self.config.compat, codec, num_layers, num_tokens, num_kv_heads,
                            head_dim, dtype, None)
        header_frame(0, meta, True)  # fits its object, and every field its header slot
        check_sizable(self._serde(codec, meta).for_layer(0, num_layers), int(num_tokens),
                      int(num_kv_heads), int(head_dim), dtype)
        return meta

    def _serde(self, codec, meta: dict):
        key = (meta["codec_id"], meta["params"])
        with self._lock:
            serde = self._serdes.get(key)
            if serde is None:
                if len(self._serdes) >= 64:
                    self._serdes.clear()
                serde = self._serdes[key] = self.serde(codec)
        return serde

    def _submit(self, request_id, meta, layer_pages, deadline_s) -> SendHandle:
        if not isinstance(request_id, int) or not 0 <= request_id < 2**64:
            raise ValueError(f"{request_id=} must be an int in [0, 2**64)")
        if self._closed.is_set():
            raise TransportClosed("the sender is closed")
        handle = SendHandle(request_id, time.monotonic() + (deadline_s or self.config.deadline_s))
        with self._lock:
            if request_id in self._requests:
                raise ValueError(f"request {request_id} is already being sent")
            self._requests[request_id] = _Request(handle)
            self._jobs.append((handle, meta, layer_pages))
            self._jobs_cond.notify()
        return handle

    def _pipeline_loop(self) -> None:
        while True:
            with self._lock:
                self._jobs_cond.wait_for(lambda: self._jobs or self._closed.is_set())
                if self._closed.is_set():
                    return
                handle, meta, layer_pages = self._jobs.pop(0)
            try:
                for layer, encoded in layer_pages:
                    if handle.done.settled():
                        break
                    handle.compressed_by.add(encoded.backend)
                    self._stage(handle, meta, layer, encoded.wait().pages)
            except Exception as e:  # bad KV, a codec error
                error = TransferError(f"request {handle.request_id}: encoding failed: {e}")
                error.__cause__ = e
                self._fail(handle, error, tell_receiver=True)
                continue
            with self._lock:
                req = self._requests.get(handle.request_id)
                if req is not None:
                    req.produced_all = True
            handle.queued.set()
            self._check_progress(handle.request_id)

    def _stage(self, handle: SendHandle, meta: dict, layer: int, pages: list[WirePage]) -> None:
        """One layer's pages -> anchor objects (queued now) and residual objects (held)."""
        rid, anchors, residuals = handle.request_id, [], []
        for page in pages:
            for kind, data in ((Kind.ANCHOR, page.anchor), (Kind.RESIDUAL, page.residual)):
                if data is None:
                    continue
                frame = Frame(kind, rid, layer, meta["num_layers"], page.index,
                              page.token_start, page.token_end, meta["num_tokens"],
                              meta["codec_id"], meta["dtype"], 0, meta["num_kv_heads"],
                              meta["head_dim"], meta["params"], data)
                obj = (self.store.key(self.space, rid, int(kind), layer, page.index),
                       encode_frame(frame))
                (anchors if kind == Kind.ANCHOR else residuals).append(obj)
        if layer == 0:
            header = header_frame(rid, meta, any(p.residual is not None for p in pages))
            anchors.insert(0, (self.store.key(self.space, rid, HEADER_KIND), header))
        with self._lock:
            req = self._requests.get(rid)
            if req is None or handle.done.settled():
                return
            for key, data in anchors + residuals:
                req.keys.append(key)
                req.pending.add(key)
                handle.num_frames += 1
                handle.num_pages += 1
                handle.total_bytes += len(data)
            req.pending_anchor += len(anchors)
            handle.anchor_bytes += sum(len(d) for _, d in anchors)
            req.residuals += residuals
            self._seq += 1
            put = _Put((rid, int(Kind.ANCHOR), layer, self._seq), handle, anchors)
        self.queue.push(Kind.ANCHOR, put.key, put)

    # -- writing ----------------------------------------------------------------------------------
    def _write_loop(self) -> None:
        while not self._closed.is_set():
            put = self.queue.pop(timeout=0.1)
            if put is None:
                continue
            if put.handle.done.settled() and put.key[1] != ABORT_KIND:
                continue
            if put.handle.started_at is None:
                put.handle.started_at = time.monotonic()
            try:
                refused = set(self.store.put(put.objects, self._on_stored))
            except Exception as e:  # LMCache refused the write outright
                if put.key[1] == ABORT_KIND:  # best effort: the receiver's deadline remains
                    log.warning("request %d: storing its abort object failed: %s",
                                put.handle.request_id, e)
                    continue
                error = TransferError(f"request {put.handle.request_id}: LMCache write "
                                      f"failed: {type(e).__name__}: {e}")
                error.__cause__ = e
                self._fail(put.handle, error, tell_receiver=True)
                continue
            if refused:  # L1 is full until the store thread drains it: again shortly
                put.objects = [o for o in put.objects if o[0] in refused]
                with self._lock:
                    self._seq += 1
                    put.key = put.key[:3] + (self._seq,)
                self._closed.wait(0.005)
                self.queue.push(Kind(put.key[1]), put.key, put)

    def _on_stored(self, key) -> None:
        rid = int.from_bytes(key.chunk_hash[:8], "big")
        with self._lock:
            req = self._requests.get(rid)
            if req is None or key not in req.pending:
                return
            req.pending.discard(key)
            if key.cache_salt != "residual":
                req.pending_anchor -= 1
        self._check_progress(rid)

    def _check_progress(self, request_id: int) -> None:
        push = None
        with self._lock:
            req = self._requests.get(request_id)
            if req is None:
                return
            anchor_done = req.produced_all and req.pending_anchor == 0
            if anchor_done and not req.residuals_queued and req.residuals:
                req.residuals_queued = True
                self._seq += 1
                push = _Put((request_id, int(Kind.RESIDUAL), 0, self._seq), req.handle,
                            req.residuals)
                req.residuals = []
            all_done = req.produced_all and not req.pending
            if all_done:
                del self._requests[request_id]
        if anchor_done:
            req.handle.anchor_acked.set()
        if push is not None:
            self.queue.push(Kind.RESIDUAL, push.key, push)
        if all_done:
            req.handle.done.set()

    # -- failures ---------------------------------------------------------------------------------
    def _fail(self, handle: SendHandle, error: BaseException,
              tell_receiver: bool = False) -> None:
        """Fail ``handle`` here and delete what was stored of it; ``tell_receiver`` (a failure
        the receiver cannot see) also queues its abort object ahead of every other object."""
        with self._lock:
            req = self._requests.get(handle.request_id)
            if req is None or req.handle is not handle:
                req = None
            else:
                del self._requests[handle.request_id]
                if tell_receiver:
                    self._seq += 1
                    abort = _Put((handle.request_id, ABORT_KIND, 0, self._seq), handle, [(
                        self.store.key(self.space, handle.request_id, ABORT_KIND),
                        abort_object(handle.request_id, error))])
                    self.queue.push(Kind.ERROR, abort.key, abort)
        if req is not None:
            try:  # what was stored of it is of no use
                self.store.delete(req.keys, force=False)
            except Exception:  # noqa: BLE001 - the store may be closing
                log.debug("deleting the objects of failed request %d failed", handle.request_id)
        handle.queued.fail(error)
        handle.anchor_acked.fail(error)
        handle.done.fail(error)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            handles = [r.handle for r in self._requests.values()]
        for handle in handles:
            self._fail(handle, error)

    def _watchdog_loop(self) -> None:
        while not self._closed.wait(0.05):
            now = time.monotonic()
            with self._lock:
                expired = [(r.handle, len(r.pending)) for r in self._requests.values()
                           if now > r.handle.deadline]
            for handle, missing in expired:
                self._fail(handle, TransferDeadlineError(
                    f"request {handle.request_id}: deadline passed with {missing} of "
                    f"{handle.num_frames} objects not yet stored in LMCache's L2 "
                    f"({self.store.config.directory})"))
