"""Prefill side of the Mooncake transport: registers each layer's encoded pages with the
transfer engine and tells the receiver, over its control connection, where each anchor and
residual lies (lynx_npu/transport/mooncake.py has the protocol; mooncake_descriptor.py the
descriptor). The receiver reads the bytes itself and acknowledges each page stream once it has
them intact; a request's registered memory is released when the request is done or failed.

Threads: one pipeline thread (a request's layers, encoded by the serde or handed in by the
caller as they become ready -> one registered buffer per layer and pass -> descriptor frames ->
the two queues, anchors first); one writer (pops the queues onto the control connection and
reconnects after a failure, or once it has descriptors again after the receiver closed an idle
connection, resending every unacknowledged descriptor: the receiver applies nothing twice); per connection a reader (ACK / NACK / ERROR); one watchdog (deadlines, and
descriptors left unacknowledged for ``retransmit_s`` sent again).

Limits: as the TCP Sender, it keeps the limits the receiver announced in its HELLO (each
handshake's, from the first in the constructor on) and refuses a request past them before
offering any of it (request_checks.py): ``send()`` raises ValueError naming the limit, and a
page past ``max_payload_bytes`` fails its request before that page's descriptor is sent.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..codec import EncodedPage
from ..ops.page_serde import EncodedLayer, WirePage, wire_pages
from ..wire import DATA_KINDS, Frame, Kind, ReceiveLimits, WireError, crc32c, encode_frame
from ..wire.limits import DEFAULT_LIMITS
from .base import KVSender, SerdeFactory, serde_for
from .config import SenderConfig
from .connection import FrameSocket, client_handshake, new_session
from .errors import (HandshakeError, RemoteError, TransferDeadlineError, TransferError,
                     TransportClosed)
from .mooncake_descriptor import PageDescriptor
from .mooncake_engine import MooncakeConfig, MooncakeEngine
from .request_checks import DownClock, abort_bytes, abort_key, page_refused, request_meta
from .send_queue import SendQueue
from .sender import SendHandle

log = logging.getLogger(__name__)
Key = tuple[int, int, int, int]  # (request_id, kind, layer, page)


@dataclass
class _OutFrame:
    key: Key
    data: bytes    # the whole control frame (header, parameters, descriptor)
    nbytes: int    # page bytes it points at


@dataclass
class _Request:
    handle: SendHandle
    unacked: set = field(default_factory=set)
    unacked_anchor: int = 0
    produced_all: bool = False
    buffers: list = field(default_factory=list)  # registered addresses, released at the end


def _check_config(config: SenderConfig) -> None:
    if config.gbps is not None:
        raise ValueError(f"{config.gbps=}: over Mooncake the receiver reads the bytes; emulate "
                         f"a link rate with MooncakeConfig(gbps=...) on the receiver")
    if config.num_connections != 1:
        raise ValueError(f"{config.num_connections=}: the Mooncake transport uses one control "
                         f"connection (the engine moves the bytes)")


class MooncakeSender(KVSender):
    """Connects to a MooncakeReceiver's control port and lends it the KV to read.

        with MooncakeSender(SenderConfig(port=receiver.port)) as sender:
            sender.send(request_id, codec, [(k0, v0), ...]).wait()

    ``engine``: a MooncakeConfig (this sender starts and closes its own engine) or a
    MooncakeEngine shared by several senders of the process (left open). SenderConfig's
    ``gbps`` and ``num_connections`` do not apply (ValueError); the rest do.
    """

    def __init__(self, config: SenderConfig,
                 engine: MooncakeEngine | MooncakeConfig = MooncakeConfig(),
                 serde: SerdeFactory = serde_for):
        _check_config(config)
        self.config, self.serde = config, serde
        self._own_engine = not isinstance(engine, MooncakeEngine)
        self.engine = MooncakeEngine(engine) if self._own_engine else engine
        self._serdes: dict = {}
        self.queue = SendQueue()
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._requests: dict[int, _Request] = {}
        self._frames: dict[Key, _OutFrame] = {}   # descriptors not yet acknowledged
        self._inflight: dict[Key, float] = {}     # written, not yet acknowledged: when
        self._jobs: list = []
        self._jobs_cond = threading.Condition(self._lock)
        self._conn: FrameSocket | None = None
        self._generation = 0
        self.last_error = ""
        # One session for every connection: the receiver binds this sender's requests to it
        # (a reconnect under a new one would see its own requests refused).
        self.session = new_session()
        self._compat = dataclasses.replace(config.compat, session=self.session)
        # The receiver's limits, from its handshake (None: it announced none); a request past
        # them is refused here before any descriptor of it is sent (request_checks.py).
        self.receiver_limits: ReceiveLimits | None = None
        try:
            self._connect()  # fail fast: unreachable receiver or a refused handshake
        except BaseException:
            if self._own_engine:
                self.engine.close()
            raise
        self._threads = [threading.Thread(target=f, daemon=True, name=f"lynx-mc-{n}")
                         for f, n in ((self._pipeline_loop, "pipeline"),
                                      (self._write_loop, "send"),
                                      (self._watchdog_loop, "send-watchdog"))]
        for t in self._threads:
            t.start()

    # -- public API (KVSender) -----------------------------------------------------------------
    def send(self, request_id: int, codec, layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
             deadline_s: float | None = None) -> SendHandle:
        """Dense layers ``(k, v)`` [num_kv_heads, num_tokens, head_dim], encoded by the serde
        on the pipeline thread while earlier layers are being read."""
        if not isinstance(layers, Sequence) or len(layers) == 0:
            raise ValueError("layers must be a non-empty sequence of (k, v) pairs")
        k0 = layers[0][0]
        if not isinstance(k0, torch.Tensor) or k0.dim() != 3:
            raise ValueError("each layer must be (k, v) tensors [num_kv_heads, num_tokens, "
                             "head_dim]")
        meta = self._meta(codec, len(layers), k0.shape[1], k0.shape[0], k0.shape[2], k0.dtype)
        serde = self._serde(codec, meta)
        return self._submit(request_id, meta, ((i, serde.for_layer(i, len(layers)).encode(*layers[i]),
                                                DATA_KINDS) for i in range(len(layers))), deadline_s)

    def send_layers(self, request_id: int, codec, layers: Iterable[EncodedLayer], *,
                    num_layers: int, num_tokens: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype, deadline_s: float | None = None) -> SendHandle:
        """Layers the caller encodes, taken in order as they become ready."""
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"{num_layers=} must be a positive int")
        meta = self._meta(codec, num_layers, num_tokens, num_kv_heads, head_dim, dtype)

        def numbered():
            count = 0
            for i, layer in enumerate(layers):
                if i >= num_layers:
                    raise ValueError(f"more than {num_layers=} layers were given")
                count += 1
                yield i, layer, DATA_KINDS
            if count != num_layers:
                raise ValueError(f"{count} layers were given; the request has {num_layers}")
        return self._submit(request_id, meta, numbered(), deadline_s)

    def send_encoded(self, request_id: int, codec,
                     pages: Sequence[Sequence[EncodedPage | WirePage]], *, num_tokens: int,
                     num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                     deadline_s: float | None = None) -> SendHandle:
        """Pages made already (``pages[layer]``): every anchor is offered before any residual."""
        if not isinstance(pages, Sequence) or len(pages) == 0:
            raise ValueError("pages must be a non-empty sequence (one list per layer)")
        meta = self._meta(codec, len(pages), num_tokens, num_kv_heads, head_dim, dtype)
        pages = [EncodedLayer([p if isinstance(p, WirePage) else wire_pages([p])[0]
                               for p in layer], "pre-encoded") for layer in pages]
        passes = [(i, layer, (Kind.ANCHOR,)) for i, layer in enumerate(pages)]
        passes += [(i, layer, (Kind.RESIDUAL,)) for i, layer in enumerate(pages)]
        return self._submit(request_id, meta, passes, deadline_s)

    @contextlib.contextmanager
    def paused(self):
        """Hold the control connection while requests are queued: the receiver then learns of
        every anchor queued inside before any residual."""
        self.queue.pause()
        try:
            yield self
        finally:
            self.queue.resume()

    def close(self) -> None:
        """Stop now: requests not yet complete fail with TransportClosed."""
        if self._closed.is_set():
            return
        self._closed.set()
        self.queue.close()
        with self._lock:
            self._jobs_cond.notify_all()
        self._fail_all(TransportClosed("the sender was closed before the request completed"))
        self._drop_conn()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)
        if self._own_engine:
            self.engine.close()

    def __enter__(self) -> "MooncakeSender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- intake and staging ----------------------------------------------------------------------
    def _meta(self, codec, num_layers, num_tokens, num_kv_heads, head_dim, dtype) -> dict:
        return request_meta(self.config.compat, codec, num_layers, num_tokens, num_kv_heads,
                            head_dim, dtype, self.receiver_limits)

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
                for layer, encoded, kinds in layer_pages:
                    if handle.done.settled():
                        break
                    handle.compressed_by.add(encoded.backend)
                    self._stage(handle, meta, layer, encoded.wait().pages, kinds)
            except Exception as e:  # bad KV, a codec error, or the engine refused memory
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

    def _stage(self, handle: SendHandle, meta: dict, layer: int, pages, kinds) -> None:
        """Copy one layer's streams of ``kinds`` into one registered buffer and queue a
        descriptor frame per page and stream."""
        pieces = [(page, kind, memoryview(data).cast("B")) for page in pages
                  for kind, data in ((Kind.ANCHOR, page.anchor), (Kind.RESIDUAL, page.residual))
                  if data is not None and kind in kinds]
        limits = self.receiver_limits
        for page, kind, view in pieces:
            refused = page_refused(limits, handle.request_id, meta, layer, page.index, kind,
                                   page.token_end - page.token_start, view.nbytes)
            if refused:  # the receiver would refuse its descriptor: fail now, offer no more
                self._fail(handle, refused, tell_receiver=True)
                return
        total = sum(view.nbytes for *_, view in pieces)
        if total == 0:
            return
        buf, addr = self.engine.buffer(total)
        with self._lock:
            req = self._requests.get(handle.request_id)
            if req is None or handle.done.settled():
                self.engine.release(addr)
                return
            req.buffers.append(addr)
        host, offset, out = buf.numpy(), 0, []
        for page, kind, view in pieces:
            n = view.nbytes
            host[offset:offset + n] = np.frombuffer(view, dtype=np.uint8)
            desc = PageDescriptor(self.engine.segment, addr + offset, n, crc32c(view))
            frame = Frame(kind, handle.request_id, layer, meta["num_layers"], page.index,
                          page.token_start, page.token_end, meta["num_tokens"],
                          meta["codec_id"], meta["dtype"], 0, meta["num_kv_heads"],
                          meta["head_dim"], meta["params"], desc.pack())
            out.append(_OutFrame((handle.request_id, int(kind), layer, page.index),
                                 encode_frame(frame), n))
            offset += n
        with self._lock:
            req = self._requests.get(handle.request_id)
            if req is None or handle.done.settled():
                return
            for f in out:
                self._frames[f.key] = f
                req.unacked.add(f.key)
                handle.num_frames += 1
                handle.num_pages += 1
                handle.total_bytes += f.nbytes + len(f.data)
                if f.key[1] == Kind.ANCHOR:
                    req.unacked_anchor += 1
                    handle.anchor_bytes += f.nbytes + len(f.data)
        for f in out:
            self.queue.push(Kind(f.key[1]), f.key, f)

    # -- the control connection --------------------------------------------------------------------
    def _connect(self) -> None:
        cfg = self.config
        sock = socket.create_connection((cfg.host, cfg.port), timeout=cfg.connect_timeout_s)
        conn = FrameSocket(sock, DEFAULT_LIMITS)
        try:
            receiver = client_handshake(conn, cfg.secret, self._compat)
        except BaseException:
            conn.close()
            raise
        sock.settimeout(None)
        with self._lock:
            if receiver.limits is not None:
                self.receiver_limits = receiver.limits
            self._generation += 1
            self._conn, gen = conn, self._generation
        threading.Thread(target=self._read_loop, args=(conn, gen), daemon=True,
                         name="lynx-mc-ack").start()
        # Everything not yet acknowledged goes again (a new connection: the receiver may have
        # missed it); anchors first. The receiver acknowledges duplicates and applies nothing
        # twice.
        with self._lock:
            pending = sorted(self._frames.values(), key=lambda f: f.key[1])
        for f in pending:
            self.queue.push(Kind(f.key[1]), f.key, f)

    def _drop_conn(self, gen: int | None = None, reason: str = "") -> None:
        with self._lock:
            if self._conn is None or (gen is not None and gen != self._generation):
                return
            conn, self._conn = self._conn, None
            if reason:
                self.last_error = reason
        conn.close()

    def _reconnect(self) -> bool:
        backoff = self.config.reconnect_backoff_s
        while not self._closed.is_set():
            try:
                self._connect()
                return True
            except HandshakeError as e:  # refused: retrying cannot help
                self.last_error = str(e)
                self._fail_all(e)
            except (OSError, WireError, TransferError) as e:
                self.last_error = f"reconnect failed: {e}"
            if self._closed.wait(backoff):
                break
            backoff = min(1.0, backoff * 2)
        return False

    def _write_loop(self) -> None:
        while not self._closed.is_set():
            if self._conn is None:
                if not self.queue.wait_for_frames(0.1):
                    continue  # nothing to send: stay disconnected (the receiver closes idlers)
                if not self._reconnect():
                    return
            item = self.queue.pop(timeout=0.1)
            if item is None:
                continue
            with self._lock:
                conn, gen = self._conn, self._generation
                req = self._requests.get(item.key[0])
                if item.key[1] == Kind.ERROR:  # an abort: nothing acknowledges it
                    if self._frames.pop(item.key, None) is None:
                        continue
                elif item.key not in self._frames or req is None:
                    continue  # acknowledged, or its request failed, meanwhile
                else:
                    self._inflight[item.key] = time.monotonic()
                    if req.handle.started_at is None:
                        req.handle.started_at = self._inflight[item.key]
            if conn is None:
                continue  # _connect re-queues it
            try:
                conn.write(item.data)
            except OSError as e:
                self._drop_conn(gen, f"send failed: {e}")

    def _read_loop(self, conn: FrameSocket, gen: int) -> None:
        try:
            while True:
                frame = conn.read()
                if frame.kind == Kind.ACK:
                    self._on_ack(frame.key)
                elif frame.kind == Kind.NACK:  # the descriptor frame arrived corrupt: again
                    with self._lock:
                        f = self._frames.get(frame.key)
                    if f is not None:
                        self.queue.push(Kind(f.key[1]), f.key, f)
                elif frame.kind == Kind.ERROR:
                    self._on_error(frame.request_id, bytes(frame.payload).decode("utf-8"))
                else:
                    raise WireError(f"unexpected {frame.kind.name} frame from the receiver")
        except (OSError, WireError) as e:
            if not self._closed.is_set():
                self._drop_conn(gen, f"receive failed: {e}")

    # -- bookkeeping ----------------------------------------------------------------------------
    def _on_ack(self, key: Key) -> None:
        with self._lock:
            self._inflight.pop(key, None)
            if self._frames.pop(key, None) is None:
                return  # a duplicate acknowledgement
            req = self._requests.get(key[0])
            if req is None:
                return
            req.unacked.discard(key)
            if key[1] == Kind.ANCHOR:
                req.unacked_anchor -= 1
        self._check_progress(key[0])

    def _on_error(self, request_id: int, reason: str) -> None:
        if request_id == 0:
            self._fail_all(RemoteError(f"the receiver rejected the connection: {reason}"))
            return
        with self._lock:
            req = self._requests.get(request_id)
        if req is not None:
            self._fail(req.handle, RemoteError(f"request {request_id}: the receiver failed it: "
                                               f"{reason}"))

    def _check_progress(self, request_id: int) -> None:
        with self._lock:
            req = self._requests.get(request_id)
            if req is None:
                return
            anchor_done = req.produced_all and req.unacked_anchor == 0
            all_done = req.produced_all and not req.unacked
            if all_done:
                del self._requests[request_id]
        if anchor_done:
            req.handle.anchor_acked.set()
        if all_done:
            self._release(req)
            req.handle.done.set()

    def _release(self, req: _Request) -> None:
        for addr in req.buffers:
            self.engine.release(addr)
        req.buffers.clear()

    def _fail(self, handle: SendHandle, error: BaseException, tell_receiver: bool = False) -> None:
        """Fail ``handle`` here; ``tell_receiver`` (a failure the receiver cannot see: encoding,
        a page it would refuse) also queues an ERROR frame for the request, ahead of every
        descriptor, so that the receiver fails it at once instead of waiting out its own
        deadline (frame format 5; best effort). Deadlines are not told: the receiver keeps its
        own."""
        abort = None
        if tell_receiver:
            abort = _OutFrame(abort_key(handle.request_id), abort_bytes(handle.request_id, error), 0)
        with self._lock:
            req = self._requests.get(handle.request_id)
            if req is None or req.handle is not handle:
                req = None
            else:
                del self._requests[handle.request_id]
                for key in req.unacked:
                    self._frames.pop(key, None)
                    self._inflight.pop(key, None)
                req.unacked.clear()
            if abort is not None:
                self._frames[abort.key] = abort
        if abort is not None:
            self.queue.push(Kind.ERROR, abort.key, abort)
        if req is not None:
            self._release(req)
        handle.queued.fail(error)
        handle.anchor_acked.fail(error)
        handle.done.fail(error)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            handles = [r.handle for r in self._requests.values()]
        for handle in handles:
            self._fail(handle, error)

    def _watchdog_loop(self) -> None:
        tick = min(0.05, self.config.retransmit_s / 4)
        down = DownClock(self.config.receiver_grace_s)
        while not self._closed.wait(tick):
            now = time.monotonic()
            with self._lock:  # descriptors not acknowledged need the control connection
                waiting = [r.handle for r in self._requests.values()] if self._frames else []
                connected = self._conn is not None
            gone = down.gone(now, bool(waiting), connected)
            for handle in waiting if gone else ():
                self._fail(handle, TransferError(
                    f"request {handle.request_id}: no control connection to the receiver "
                    f"{self.config.host}:{self.config.port} for {gone:.1f} s "
                    f"(receiver_grace_s={self.config.receiver_grace_s:g}"
                    + (f"; last error: {self.last_error})" if self.last_error else ")")))
            with self._lock:
                expired = [(r.handle, len(r.unacked)) for r in self._requests.values()
                           if now > r.handle.deadline]
                stale = [self._frames[k] for k, t in self._inflight.items()
                         if now - t > self.config.retransmit_s and k in self._frames]
                for f in stale:
                    del self._inflight[f.key]
            for f in stale:  # lost on the way, or the receiver is slow: it ignores repeats
                self.queue.push(Kind(f.key[1]), f.key, f)
            for handle, missing in expired:
                self._fail(handle, TransferDeadlineError(
                    f"request {handle.request_id}: deadline passed with {missing} of "
                    f"{handle.num_frames} page streams not yet read by the receiver"
                    + (f" (last control connection error: {self.last_error})"
                       if self.last_error else "")))
