"""Split-stream sender (TCP): frames layer after layer on its own thread while earlier pages
are on the wire, and sends every pending anchor frame (of any request) before any residual frame.

Pages come from the page serde it is given (``serde=``, lynx_npu.ops.page_serde): the serde
encodes on the KV's device and stages the bytes to host memory; this file moves bytes only.

Threads: one pipeline thread (the serde's encode per layer, or a caller's encoded layers as
they become ready -> frames -> the two queues);
per connection, a writer (pops the queues, paces through the shared token bucket, reconnects
after a failure) and a reader (ACK / NACK / ERROR from the receiver); one watchdog (deadlines,
retransmission of frames left unacknowledged for ``retransmit_s``).

Delivery: a frame stays in ``_frames`` until the receiver acknowledges it. When a connection
drops, its unacknowledged frames go back to the queues and are resent on the next connection:
the receiver keeps what it already had (it acknowledges duplicates and applies nothing twice),
so a transfer resumes by page id with nothing lost or duplicated. A NACK (payload CRC failed)
re-queues that one frame. A connection the receiver closed (idle) is opened again only when
there are frames to send.

Peers: every connection announces one session id (the receiver binds the sender's requests
to it); the receiver announces its limits, and a request it would refuse is refused here
before any of it is sent (send() raises, or the request fails naming the limit: the checks
in request_checks.py, which the MooncakeSender shares). ``Sender()``
retries a handshake cut or corrupted in transit (``handshake_attempts``), then raises
HandshakeError; a refusal (authentication, compatibility) is raised at once.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from ..codec import EncodedPage
from ..ops.page_serde import EncodedLayer, WirePage, wire_pages
from ..wire import (DATA_KINDS, Frame, Kind, ReceiveLimits, WireError, crc32c, pack_header,
                    page_table, table_nbytes)
from ..wire.limits import DEFAULT_LIMITS
from .base import KVSender, SerdeFactory, serde_for
from .config import SenderConfig
from .connection import FrameSocket, client_handshake, new_session
from .errors import (HandshakeError, RemoteError, TransferDeadlineError, TransferError,
                     TransportClosed)
from .events import StageEvent
from .priority import lower_this_thread
from .rate_limit import TokenBucket
from .request_checks import DownClock, abort_bytes, abort_key, page_refused, request_meta
from .send_queue import SendQueue

log = logging.getLogger(__name__)
Key = tuple[int, int, int, int]  # (request_id, kind, layer, page)


@dataclass
class _OutFrame:
    key: Key               # (request, kind, layer, first page)
    header: bytes          # header + params, sealed (payload CRC included)
    payload: tuple         # the payload's pieces: a page table (multi-page frames), pages
    nbytes: int
    num_pages: int = 1


class SendHandle:
    """One request on the sender. ``anchor_acked`` / ``done`` are StageEvents: set when every
    anchor frame / every frame is acknowledged by the receiver; they fail on error."""

    def __init__(self, request_id: int, deadline: float):
        self.request_id = request_id
        self.deadline = deadline
        self.queued = StageEvent(f"request {request_id} queued")  # every frame made and queued
        self.anchor_acked = StageEvent(f"request {request_id} anchor acked")
        self.done = StageEvent(f"request {request_id} done")
        self.anchor_bytes = 0   # wire bytes of anchor frames (headers included)
        self.total_bytes = 0    # wire bytes of all frames
        self.num_frames = 0
        self.num_pages = 0      # page streams (a frame carries one or more pages of a stream)
        self.started_at: float | None = None   # first byte handed to a socket (monotonic)
        self.compressed_by: set[str] = set()   # what encoded the layers (EncodedLayer.backend)
        self._unacked: set[Key] = set()
        self._unacked_anchor = 0
        self._produced_all = False

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)

    def __await__(self):
        return self.done.__await__()

    @property
    def failed(self) -> bool:
        return self.done.error is not None


class _Link:
    """One TCP connection to the receiver; reconnects after failures."""

    def __init__(self, sender: "Sender", index: int):
        self.sender, self.index = sender, index
        self.conn: FrameSocket | None = None
        self.generation = 0
        self.last_error = ""
        self.thread = threading.Thread(target=self._write_loop, daemon=True,
                                       name=f"lynx-send-{index}")

    def open(self) -> None:
        """The first connection (from Sender()): a handshake that fails in transit (a frame
        cut or corrupted, a timeout, a receiver full for now) is tried ``handshake_attempts``
        times in all, then HandshakeError; a refusal is raised at once, and so is a failed TCP
        connect (nothing listens there)."""
        cfg, backoff = self.sender.config, self.sender.config.reconnect_backoff_s
        for attempt in range(1, cfg.handshake_attempts + 1):
            sock = self._dial()
            try:
                return self._greet(sock)
            except HandshakeError:
                raise
            except (OSError, WireError, TransferError) as e:
                last = f"{type(e).__name__}: {e}"
                log.debug("handshake with %s:%d failed (attempt %d): %s", cfg.host, cfg.port,
                          attempt, e)
            if attempt < cfg.handshake_attempts:
                time.sleep(backoff)
                backoff = min(1.0, backoff * 2)
        raise HandshakeError(f"the handshake with {cfg.host}:{cfg.port} failed "
                             f"{cfg.handshake_attempts} times; last: {last}")

    def connect(self) -> None:
        self._greet(self._dial())

    def _dial(self) -> socket.socket:
        cfg = self.sender.config
        sock = socket.create_connection((cfg.host, cfg.port), timeout=cfg.connect_timeout_s)
        if cfg.send_buffer_bytes is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, cfg.send_buffer_bytes)
        return sock

    def _greet(self, sock: socket.socket) -> None:
        cfg = self.sender.config
        conn = FrameSocket(sock, DEFAULT_LIMITS, self.sender.limiter, cfg.chunk_bytes)
        try:
            with conn.deadline(cfg.connect_timeout_s):
                receiver = client_handshake(conn, cfg.secret, self.sender.compat)
        except BaseException:
            conn.close()
            raise
        sock.settimeout(None)
        with self.sender._lock:
            if receiver.limits is not None:
                self.sender.receiver_limits = receiver.limits
            self.generation += 1
            self.conn = conn
            gen = self.generation
        threading.Thread(target=self._read_loop, args=(conn, gen), daemon=True,
                         name=f"lynx-ack-{self.index}").start()

    def drop(self, gen: int, reason: str) -> None:
        """Close connection ``gen`` (if current) and re-queue what was in flight on it."""
        with self.sender._lock:
            if gen != self.generation or self.conn is None:
                return
            conn, self.conn = self.conn, None
            self.last_error = reason
        conn.close()
        log.debug("link %d generation %d dropped: %s", self.index, gen, reason)
        self.sender._requeue_inflight(self.index, gen)

    def _reconnect(self) -> bool:
        backoff = self.sender.config.reconnect_backoff_s
        while not self.sender._closed.is_set():
            try:
                self.connect()
                return True
            except HandshakeError as e:  # refused: retrying cannot help, fail now
                self.sender._fail_all(e)
                self.last_error = str(e)
            except (OSError, WireError, TransferError) as e:
                self.last_error = f"reconnect failed: {e}"
            if self.sender._closed.wait(backoff):
                break
            backoff = min(1.0, backoff * 2)
        return False

    def _write_loop(self) -> None:
        s = self.sender
        lower_this_thread(s.config.thread_nice)
        while not s._closed.is_set():
            if self.conn is None:
                if not s.queue.wait_for_frames(0.1):
                    continue  # nothing to send: stay disconnected (the receiver closes idlers)
                if not self._reconnect():
                    return
            with s._lock:
                conn, gen = self.conn, self.generation
            if conn is None:
                continue
            idle = len(s.queue) == 0
            item = s.queue.pop(timeout=0.1)
            if item is None:
                continue
            if idle and s.limiter is not None:
                s.limiter.mark_idle()
            if not s._start_send(item, self.index, gen):
                continue  # acknowledged or its request failed meanwhile
            try:
                conn.write(item.header, *item.payload)
            except OSError as e:
                self.drop(gen, f"send failed: {e}")
                s._requeue(item.key)

    def _read_loop(self, conn: FrameSocket, gen: int) -> None:
        s = self.sender
        try:
            while True:
                frame = conn.read()
                if frame.kind == Kind.ACK:
                    s._on_ack(frame.key)
                elif frame.kind == Kind.NACK:
                    s._on_nack(frame.key)
                elif frame.kind == Kind.ERROR:
                    s._on_error(frame.request_id, bytes(frame.payload).decode("utf-8"))
                else:
                    raise WireError(f"unexpected {frame.kind.name} frame from the receiver")
        except (OSError, WireError) as e:
            if not s._closed.is_set():
                self.drop(gen, f"receive failed: {e}")


class Sender(KVSender):
    """Connects to a Receiver and moves KV caches to it, anchor stream first.

        with Sender(SenderConfig(port=receiver.port, gbps=10)) as sender:
            handle = sender.send(request_id, codec, [(k0, v0), (k1, v1), ...])
            handle.wait()                 # every frame acknowledged (raises on failure)

    ``serde(codec) -> PageSerde`` encodes dense layers (default: lynx_npu.ops' serde_for).
    """

    def __init__(self, config: SenderConfig, serde: SerdeFactory = serde_for):
        self.config = config
        self.serde = serde
        # One session for every connection: the receiver binds this sender's requests to it.
        self.session = new_session()
        self.compat = dataclasses.replace(config.compat, session=self.session)
        # The receiver's limits, from its handshake (None: it announced none).
        self.receiver_limits: ReceiveLimits | None = None
        self._serdes: dict = {}
        self.limiter = (TokenBucket(config.gbps, config.burst_bytes, config.early_s)
                        if config.gbps else None)
        self.queue = SendQueue()
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._requests: dict[int, SendHandle] = {}
        self._frames: dict[Key, _OutFrame] = {}                 # produced, not yet acked
        self._inflight: dict[Key, tuple[int, int, float]] = {}  # key -> (link, gen, sent at)
        self._jobs: list = []
        self._jobs_cond = threading.Condition(self._lock)
        self._links = [_Link(self, i) for i in range(config.num_connections)]
        try:
            for link in self._links:
                link.open()  # fail fast: unreachable receiver or bad secret raise here
        except BaseException:
            self._close_links()
            raise
        self._threads = [threading.Thread(target=self._compress_loop, daemon=True,
                                          name="lynx-compress"),
                         threading.Thread(target=self._watchdog_loop, daemon=True,
                                          name="lynx-send-watchdog")]
        self._threads += [link.thread for link in self._links]
        for t in self._threads:
            t.start()

    # -- public API ------------------------------------------------------------------------
    def send(self, request_id: int, codec, layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
             deadline_s: float | None = None) -> SendHandle:
        """Queue one request: ``layers[i] = (k, v)``, each ``[num_kv_heads, num_tokens,
        head_dim]``. Layers are compressed on the sender's thread while earlier ones are sent."""
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
        """Queue one request whose layers the caller encodes (``serde.encode_cache``): the
        pipeline thread takes ``layers`` in order as they come (a generator or a queue-fed
        iterator may block until the next is encoded) and frames each once its bytes have
        landed, so layer i+1 is encoded while layer i is on the wire."""
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
        """Queue one request whose pages are all made already (``pages[layer]``: host
        EncodedPages of ``codec.encode_pages``, or WirePages): benchmarks use it to time the
        link alone, and every anchor frame is queued before any residual frame."""
        if not isinstance(pages, Sequence) or len(pages) == 0:
            raise ValueError("pages must be a non-empty sequence (one list per layer)")
        meta = self._meta(codec, len(pages), num_tokens, num_kv_heads, head_dim, dtype)
        pages = [EncodedLayer([p if isinstance(p, WirePage) else wire_pages([p])[0]
                               for p in layer], "pre-encoded") for layer in pages]
        # Everything is known already: queue every anchor frame before any residual frame, so
        # a writer that outruns the queueing never sends a residual while anchors are to come.
        passes = [(i, layer, (Kind.ANCHOR,)) for i, layer in enumerate(pages)]
        passes += [(i, layer, (Kind.RESIDUAL,)) for i, layer in enumerate(pages)]
        return self._submit(request_id, meta, passes, deadline_s)

    @contextlib.contextmanager
    def paused(self):
        """Hold the writers while requests are queued (then the anchors of every request
        queued inside go out before any residual frame)."""
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
        self._close_links()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)

    def __enter__(self) -> "Sender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- request intake and compression --------------------------------------------------------
    def _meta(self, codec, num_layers, num_tokens, num_kv_heads, head_dim, dtype) -> dict:
        return request_meta(self.config.compat, codec, num_layers, num_tokens, num_kv_heads,
                            head_dim, dtype, self.receiver_limits)

    def _submit(self, request_id, meta, layer_pages, deadline_s) -> SendHandle:
        if not isinstance(request_id, int) or not 0 <= request_id < 2**64:
            raise ValueError(f"{request_id=} must be an int in [0, 2**64)")
        if self._closed.is_set():
            raise TransportClosed("the sender is closed")
        deadline = time.monotonic() + (deadline_s or self.config.deadline_s)
        handle = SendHandle(request_id, deadline)
        with self._lock:
            if request_id in self._requests:
                raise ValueError(f"request {request_id} is already being sent")
            self._requests[request_id] = handle
            self._jobs.append((handle, meta, layer_pages))
            self._jobs_cond.notify()
        return handle

    def _serde(self, codec, meta: dict):
        """One serde per codec and parameters (it holds per-device staging state)."""
        key = (meta["codec_id"], meta["params"])
        with self._lock:
            serde = self._serdes.get(key)
            if serde is None:
                if len(self._serdes) >= 64:
                    self._serdes.clear()
                serde = self._serdes[key] = self.serde(codec)
        return serde

    def _compress_loop(self) -> None:
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
                    self._enqueue_layer(handle, meta, layer, encoded.wait().pages, kinds)
            except Exception as e:  # bad KV or a codec error: the request fails, loudly
                error = TransferError(f"request {handle.request_id}: encoding failed: {e}")
                error.__cause__ = e
                self._fail(handle, error, tell_receiver=True)
                continue
            with self._lock:
                handle._produced_all = True
            handle.queued.set()
            self._check_progress(handle)

    def _enqueue_layer(self, handle: SendHandle, meta: dict, layer: int, pages, kinds) -> None:
        out, limits = [], self.receiver_limits
        for kind in (Kind.ANCHOR, Kind.RESIDUAL):
            if kind not in kinds:
                continue
            stream = [(page, memoryview(data).cast("B")) for page in pages  # host bytes
                      for data in (page.anchor if kind == Kind.ANCHOR else page.residual,)
                      if data is not None]
            for group in self._frame_groups(stream, limits, meta):
                first, last = group[0][0], group[-1][0]
                views = [view for _, view in group]
                if len(group) > 1:
                    views.insert(0, memoryview(page_table(
                        [p.token_end for p, _ in group], [v.nbytes for _, v in group])))
                size = sum(v.nbytes for v in views)
                refused = page_refused(limits, handle.request_id, meta, layer, first.index, kind,
                                       last.token_end - first.token_start,
                                       size - table_nbytes(len(group) - 1))
                if refused:  # the receiver would refuse it: fail now, not by the deadline
                    self._fail(handle, refused, tell_receiver=True)
                    return
                crc = 0
                for v in views:
                    crc = crc32c(v, crc)
                frame = Frame(kind, handle.request_id, layer, meta["num_layers"], first.index,
                              first.token_start, last.token_end, meta["num_tokens"],
                              meta["codec_id"], meta["dtype"], 0, meta["num_kv_heads"],
                              meta["head_dim"], meta["params"], extra_pages=len(group) - 1)
                header = pack_header(frame, crc, size)
                out.append(_OutFrame((handle.request_id, int(kind), layer, first.index), header,
                                     tuple(views), len(header) + size, len(group)))
                # Hand the GIL to a waiting writer now rather than after the interpreter's
                # 5 ms switch interval: at 1 Gbps a frame is due every ~0.5 ms.
                time.sleep(0)
        with self._lock:
            if handle.done.settled():
                return
            for f in out:
                self._frames[f.key] = f
                handle._unacked.add(f.key)
                handle.num_frames += 1
                handle.num_pages += f.num_pages
                handle.total_bytes += f.nbytes
                if f.key[1] == Kind.ANCHOR:
                    handle._unacked_anchor += 1
                    handle.anchor_bytes += f.nbytes
        for f in out:
            self.queue.push(Kind(f.key[1]), f.key, f)

    def _frame_groups(self, stream, limits, meta):
        """Consecutive pages of one stream (by index and tokens) in frames of at most
        ``frame_limit`` bytes and within what the receiver accepts of a frame of their tokens
        (max_payload_bytes, the shape bound), each at least one page."""
        cap = self.config.frame_limit
        if limits:
            cap = min(cap, limits.max_payload_bytes)
        group, size = [], 0
        for page, view in stream:
            grown = size + view.nbytes + table_nbytes(len(group))
            prev = group[-1][0] if group else None
            if group and (grown > cap or page.index != prev.index + 1
                          or page.token_start != prev.token_end
                          or limits and limits.page_refusal(
                              page.token_end - group[0][0].token_start, meta["num_kv_heads"],
                              meta["head_dim"], size + view.nbytes)):
                yield group
                group, size = [], 0
            group.append((page, view))
            size += view.nbytes
        if group:
            yield group

    # -- delivery bookkeeping (called from link threads) ---------------------------------------
    def _start_send(self, item: _OutFrame, link: int, gen: int) -> bool:
        with self._lock:
            if item.key not in self._frames:
                return False
            if self._links[link].generation != gen or self._links[link].conn is None:
                requeue = True  # the connection died since the pop: send it on the next one
            elif item.key[1] == Kind.ERROR:  # an abort: nothing acknowledges it
                del self._frames[item.key]
                return True
            else:
                requeue = False
                now = time.monotonic()
                self._inflight[item.key] = (link, gen, now)
                handle = self._requests.get(item.key[0])
                if handle is not None and handle.started_at is None:
                    handle.started_at = now
        if requeue:
            self.queue.push(Kind(item.key[1]), item.key, item)
        return not requeue

    def _requeue(self, key: Key) -> None:
        with self._lock:
            self._inflight.pop(key, None)
            frame = self._frames.get(key)
        if frame is not None:
            self.queue.push(Kind(key[1]), key, frame)

    def _requeue_inflight(self, link: int, gen: int) -> None:
        with self._lock:
            keys = [k for k, (lk, g, _) in self._inflight.items() if lk == link and g == gen]
        for key in sorted(keys, key=lambda k: k[1]):  # anchors first
            self._requeue(key)

    def _on_ack(self, key: Key) -> None:
        with self._lock:
            self._inflight.pop(key, None)
            if self._frames.pop(key, None) is None:
                return  # a duplicate acknowledgement
            handle = self._requests.get(key[0])
            if handle is None:
                return
            handle._unacked.discard(key)
            if key[1] == Kind.ANCHOR:
                handle._unacked_anchor -= 1
        self._check_progress(handle)

    def _on_nack(self, key: Key) -> None:
        log.debug("NACK %s: resending", key)
        self._requeue(key)

    def _on_error(self, request_id: int, reason: str) -> None:
        if request_id == 0:
            self._fail_all(RemoteError(f"the receiver rejected the connection: {reason}"))
            return
        with self._lock:
            handle = self._requests.get(request_id)
        if handle is not None:
            self._fail(handle, RemoteError(f"request {request_id}: the receiver failed it: "
                                           f"{reason}"))

    def _check_progress(self, handle: SendHandle) -> None:
        with self._lock:
            produced = handle._produced_all
            anchor_done = produced and handle._unacked_anchor == 0
            all_done = produced and not handle._unacked
            if all_done:
                self._requests.pop(handle.request_id, None)
        if anchor_done:
            handle.anchor_acked.set()
        if all_done:
            handle.done.set()

    def _fail(self, handle: SendHandle, error: BaseException, tell_receiver: bool = False) -> None:
        """Fail ``handle`` here; ``tell_receiver`` (a failure the receiver cannot see: encoding,
        a page it would refuse) also queues an ERROR frame for the request, ahead of every data
        frame, so that the receiver fails it at once instead of waiting out its own deadline
        (frame format 5; best effort: not resent if lost). Deadlines are not told: the
        receiver keeps its own, and says better what arrived by it."""
        abort = None
        if tell_receiver:
            data = abort_bytes(handle.request_id, error)
            abort = _OutFrame(abort_key(handle.request_id), data, (), len(data), 0)
        with self._lock:
            if self._requests.get(handle.request_id) is handle:
                del self._requests[handle.request_id]
            for key in handle._unacked:
                self._frames.pop(key, None)
                self._inflight.pop(key, None)
            handle._unacked.clear()
            if abort is not None:
                self._frames[abort.key] = abort
        if abort is not None:
            self.queue.push(Kind.ERROR, abort.key, abort)
        handle.queued.fail(error)
        handle.anchor_acked.fail(error)
        handle.done.fail(error)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            handles = list(self._requests.values())
        for handle in handles:
            self._fail(handle, error)

    # -- watchdog: deadlines and retransmission ------------------------------------------------
    def _watchdog_loop(self) -> None:
        tick = min(0.05, self.config.retransmit_s / 4)
        down = DownClock(self.config.receiver_grace_s)
        while not self._closed.wait(tick):
            now = time.monotonic()
            with self._lock:  # frames produced and not acknowledged need a connection
                waiting = list(self._requests.values()) if self._frames else []
                connected = any(link.conn is not None for link in self._links)
            gone = down.gone(now, bool(waiting), connected)
            if gone:
                links = "; ".join(link.last_error for link in self._links if link.last_error)
                for handle in waiting:
                    self._fail(handle, TransferError(
                        f"request {handle.request_id}: no connection to the receiver "
                        f"{self.config.host}:{self.config.port} for {gone:.1f} s "
                        f"(receiver_grace_s={self.config.receiver_grace_s:g}"
                        + (f"; last link error: {links})" if links else ")")))
            with self._lock:
                expired = [h for h in self._requests.values() if now > h.deadline]
                stale = [k for k, (_, _, t) in self._inflight.items()
                         if now - t > self.config.retransmit_s]
            for handle in expired:
                missing = len(handle._unacked)
                links = "; ".join(link.last_error for link in self._links if link.last_error)
                self._fail(handle, TransferDeadlineError(
                    f"request {handle.request_id}: deadline passed with {missing} of "
                    f"{handle.num_frames} frames unacknowledged"
                    + (f" (last link error: {links})" if links else "")))
            for key in stale:
                log.debug("retransmit %s (unacknowledged for %.1f s)", key,
                          self.config.retransmit_s)
                self._requeue(key)

    def _close_links(self) -> None:
        for link in self._links:
            with self._lock:
                conn, link.conn = link.conn, None
            if conn is not None:
                conn.close()

