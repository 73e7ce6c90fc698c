"""Split-stream receiver (TCP): accepts sender connections, verifies every frame, acknowledges
it, and hands each page on as it arrives (residual frames refine their page to full precision):
decoded by the page serde it is given (``serde=``) into the request's tensors or ``on_page``,
or, with ``on_encoded``, as wire bytes to a caller that decodes them straight into its own
cache (lynx_npu.ops.page_serde ``decode_into``).

Threads: one acceptor; per connection, a reader (handshake, read_frame, ACK / NACK / ERROR);
``num_decode_threads`` page workers (decode or hand on); one watchdog failing requests whose
deadline passed and freeing the slots of finished ones.

Faults: a payload whose CRC fails is NACKed (the sender resends it); a corrupt or truncated
header, or any stream error, closes the connection (the sender reconnects and resends what
was not acknowledged; duplicates are acknowledged and ignored); a frame of another version
gets an ERROR naming the field, then the connection is closed; a data frame whose intact
header breaks a limit (or names an unknown codec) gets an ERROR for its request, which fails,
and its payload is skipped; a request past its deadline fails with TransferDeadlineError on
every waiter; one whose sender has had no connection for
``sender_grace_s`` (the sender died) fails then (request_table.py).

Hostile peers (issue 18): reads allocate what arrived, not what a header announced
(connection.SocketReader); the whole handshake has a deadline, and slow handshakes are
evicted oldest first (connection_slots.py); a connection silent for ``idle_timeout_s`` is
closed; finished requests free their slot (request_table.py); a request belongs to the sender
session that opened it.
"""
from __future__ import annotations

import logging
import math
import queue
import select
import socket
import threading
import time

from ..codec import codec_from_wire
from ..ops.page_serde import WirePage
from ..wire import (DATA_KINDS, HEADER_SIZE, ChecksumError, FrameFieldError, Frame, Kind,
                    UnsupportedVersionError, WireError, encode_frame, params_from_json)
from .base import KVReceiver, OnEncoded, SerdeFactory, serde_for
from .config import ReceiverConfig
from .connection import FrameSocket, server_handshake
from .connection_slots import ConnectionSlots
from .errors import RemoteError, TransferError, TransportClosed
from .priority import lower_this_thread
from .receive_state import OnPage, PageJob, ReceiveHandle, RequestRejected
from .request_table import RequestTable

log = logging.getLogger(__name__)
_ACK_BATCH = 16


def _poll_ms(seconds: float) -> int:
    """poll()'s timeout for ``seconds`` from now: whole milliseconds, rounded up, >= 0."""
    return max(0, math.ceil(seconds * 1000))


class Receiver(KVReceiver):
    """Listens (loopback by default) for Senders and assembles their requests.

        with Receiver(ReceiverConfig()) as receiver:     # receiver.port: where to connect
            handle = receiver.request(request_id)        # or wait for it to appear
            handle.anchor_ready.wait()                   # decode may start on handle.k/.v
            handle.residual_ready.wait()                 # refined to full precision

    Pages go to one of: ``on_encoded(request_id, layer, WirePage, stage)`` (not decoded: the
    caller decodes into its cache), ``on_page(request_id, layer, start, end, k, v, stage)``
    (decoded), or the handle's ``k`` / ``v`` tensors. ``serde(codec) -> PageSerde`` decodes
    (default: lynx_npu.ops' serde_for).
    """

    def __init__(self, config: ReceiverConfig = ReceiverConfig(), on_page: OnPage | None = None,
                 *, serde: SerdeFactory = serde_for, on_encoded: OnEncoded | None = None):
        if on_page is not None and on_encoded is not None:
            raise ValueError("give on_page (decoded pages) or on_encoded (wire pages), not both")
        self.config = config
        self.on_page = on_page
        self.on_encoded = on_encoded
        self.serde = serde
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._requests = RequestTable(config.max_requests, config.max_finished_requests,
                                      config.deadline_s)
        self._conns = ConnectionSlots(config.max_connections, config.max_handshakes)
        self._codecs: dict[tuple[int, bytes], object] = {}
        self._jobs: queue.SimpleQueue[PageJob | None] = queue.SimpleQueue()
        self._listener = socket.create_server((config.host, config.port))
        self._listener.settimeout(0.1)  # accept() polls so close() never waits on it
        self.host, self.port = self._listener.getsockname()[:2]
        self._threads = [threading.Thread(target=self._accept_loop, daemon=True,
                                          name="lynx-accept"),
                         threading.Thread(target=self._watchdog_loop, daemon=True,
                                          name="lynx-recv-watchdog")]
        self._threads += [threading.Thread(target=self._decode_loop, daemon=True,
                                           name=f"lynx-decode-{i}")
                          for i in range(config.num_decode_threads)]
        for t in self._threads:
            t.start()

    # -- public API ------------------------------------------------------------------------
    def request(self, request_id: int, deadline_s: float | None = None) -> ReceiveHandle:
        """The handle of ``request_id``, created now if no frame of it has arrived yet (its
        deadline then counts from this call)."""
        return self._requests.claim(request_id, deadline_s)

    def release(self, request_id: int) -> None:
        """Forget a request (and drop its KV tensors); late duplicates are still acknowledged."""
        handle = self._requests.release(request_id)
        if handle is not None and not handle.finished:
            handle.fail(TransportClosed(f"request {request_id} was released before completing"))

    @property
    def num_connections(self) -> int:
        """Connections held now, in the handshake or past it."""
        return len(self._conns.all())

    @property
    def num_active_requests(self) -> int:
        """Requests in progress (each takes one of ``max_requests`` slots)."""
        self._requests.sweep()
        return self._requests.num_active

    def buffered_bytes(self) -> int:
        """Bytes allocated for frames still arriving, over every connection: bounded by what
        arrived (at most twice it, and 64 KiB a connection), never by what headers claim."""
        return sum(conn.pending_bytes for conn in self._conns.all())

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._listener.close()
        conns, handles = self._conns.all(), self._requests.handles()
        for conn in conns:
            conn.close()
        for handle in handles:
            if not handle.finished:
                handle.fail(TransportClosed(f"request {handle.request_id}: the receiver was "
                                            f"closed ({handle.progress()})"))
        for _ in range(self.config.num_decode_threads):
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> "Receiver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- connections -------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                sock, address = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn = FrameSocket(sock, self.config.limits)
            admitted, evicted = self._conns.admit(conn)
            if evicted is not None:
                log.warning("closing the oldest of %d unfinished handshakes to admit a new "
                            "connection", self.config.max_handshakes)
                evicted.close()
            if not admitted:
                self._refuse(conn, f"too many connections (max_connections="
                                   f"{self.config.max_connections})", timeout_s=1.0)
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, address[0]),
                             daemon=True, name="lynx-recv-conn").start()

    def _serve(self, conn: FrameSocket, peer: str) -> None:
        acks: list[bytes] = []  # acknowledgements go out in batches (one system call each)
        lower_this_thread(self.config.thread_nice)
        owner = None
        try:
            with conn.deadline(self.config.handshake_timeout_s):
                sender = server_handshake(conn, self.config.secret, self.config.compat)
            if not self._conns.establish(conn):  # filled meanwhile: the sender reconnects
                log.warning("closing a connection past its handshake: max_connections=%d",
                            self.config.max_connections)
                return
            owner = (sender.session, peer)
            self._requests.connected(owner)
            conn.sock.settimeout(self.config.idle_timeout_s)  # per read: silence closes it
            poller = select.poll()
            poller.register(conn.sock, select.POLLIN)
            ack_due = None
            while not self._closed.is_set():
                # Flush once a batch is full, the oldest reply has waited ack_delay_s, or no
                # frame comes before then: one send per batch, not one per frame.
                if acks:
                    now = time.monotonic()
                    if ack_due is None:
                        ack_due = now + self.config.ack_delay_s
                    if len(acks) >= _ACK_BATCH or now >= ack_due \
                            or not poller.poll(_poll_ms(ack_due - now)):
                        conn.send_many(acks)
                        acks, ack_due = [], None
                try:
                    frame = conn.read()
                except ChecksumError as e:
                    if e.where == "payload" and e.header.kind in DATA_KINDS:
                        log.debug("payload CRC failed for %s: NACK", e.header.key)
                        acks.append(encode_frame(Frame(
                            Kind.NACK, e.header.request_id, layer=e.header.layer,
                            page=e.header.page, ref_kind=int(e.header.kind))))
                        continue
                    raise
                except FrameFieldError as e:
                    if e.header is None or e.header.kind not in DATA_KINDS:
                        raise
                    # An intact header past a limit: refuse its request by id, then skip the
                    # payload the sender is sending anyway, keeping the connection.
                    acks.append(encode_frame(self._on_refused(e.header, owner, str(e))))
                    conn.skip(e.payload_len)
                    continue
                if frame.kind == Kind.ERROR:  # the sender failed this request on its side
                    self._requests.abort(frame, owner)
                    continue
                if frame.kind not in DATA_KINDS:
                    raise WireError(f"unexpected {frame.kind.name} frame after the handshake")
                reply = self._on_data(frame, owner)
                if reply is not None:
                    acks.append(encode_frame(reply))
            if acks:
                conn.send_many(acks)
        except UnsupportedVersionError as e:
            self._refuse(conn, str(e))  # another frame format: tell it why
        except (OSError, WireError, TransferError) as e:
            if not self._closed.is_set():
                log.debug("connection closed: %s", e)
        finally:
            conn.close()
            self._conns.remove(conn)
            if owner is not None:
                self._requests.disconnected(owner, time.monotonic())

    def _refuse(self, conn: FrameSocket, reason: str, timeout_s: float | None = None) -> None:
        log.warning("refusing a sender: %s", reason)
        try:
            if timeout_s is not None:
                conn.sock.settimeout(timeout_s)
            conn.send(self._error(0, reason))
        except OSError:
            pass

    # -- frames -------------------------------------------------------------------------------
    def _on_refused(self, header: Frame, owner, reason: str) -> Frame:
        """A data frame broke a limit: its request fails here (if this sender owns it) and
        the sender is told, naming the limit."""
        rid = header.request_id
        handle, refusal = self._requests.for_frame(rid, owner)
        if handle is not None:
            handle.fail(RemoteError(f"request {rid}: a frame was refused: {reason}"))
        log.warning("request %d: refusing a frame: %s", rid, refusal or reason)
        return self._error(rid, refusal or f"frame refused: {reason}")

    def _on_data(self, frame: Frame, owner) -> Frame | None:
        rid = frame.request_id
        ack = Frame(Kind.ACK, rid, layer=frame.layer, page=frame.page, ref_kind=int(frame.kind))
        handle, refusal = self._requests.for_frame(rid, owner)
        if refusal is not None:
            return self._error(rid, refusal)
        if handle is None:
            return ack  # a late duplicate of a released request
        if handle.error is not None:
            return self._error(rid, str(handle.error))
        wire_bytes = HEADER_SIZE + len(frame.params) + len(frame.payload)
        try:
            jobs = handle.admit(frame, wire_bytes, self._codec, self.config.max_request_bytes,
                                self.config.dequantize, self.config.defer_residual)
        except RequestRejected as e:
            handle.fail(RemoteError(f"request {rid}: {e}"))
            return self._error(rid, str(e))
        for job in jobs or ():
            self._jobs.put(job)
        return ack

    def _error(self, rid: int, reason: str) -> Frame:
        text = reason.encode("utf-8", errors="replace")[:self.config.limits.max_error_bytes]
        return Frame(Kind.ERROR, rid, payload=text.decode("utf-8", errors="ignore").encode())

    def _codec(self, codec_id: int, params: bytes):
        """-> (codec, its serde) of a frame's codec id and parameters (cached)."""
        key = (codec_id, params)
        with self._lock:
            codec = self._codecs.get(key)
        if codec is None:
            codec = codec_from_wire(codec_id, params_from_json(params))
            codec = (codec, self.serde(codec))  # one serde per codec: it keeps staging state
            with self._lock:
                if len(self._codecs) >= 64:  # peers choose params: keep the cache bounded
                    self._codecs.clear()
                self._codecs[key] = codec
        return codec

    # -- decoding -------------------------------------------------------------------------------
    def _decode_loop(self) -> None:
        lower_this_thread(self.config.thread_nice)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            handle = job.handle
            if handle.finished:
                continue
            try:
                full = job.residual is not None
                if self.on_encoded is not None:
                    page = WirePage(job.page, job.token_start, job.token_end,
                                    memoryview(job.anchor),
                                    memoryview(job.residual) if full else None)
                    handle.apply(job, page, None, full, self._hand_on)
                    continue
                k, v = handle.serde.for_layer(job.layer, handle.num_layers).decode_page(
                    job.anchor, job.residual, job.token_start, job.token_end,
                    num_kv_heads=handle.num_kv_heads, head_dim=handle.head_dim,
                    dtype=handle.dtype)
                handle.apply(job, k, v, full, self.on_page)
            except Exception as e:  # a page that passed its CRC but does not decode
                log.warning("request %d layer %d page %d failed to decode: %s",
                            handle.request_id, job.layer, job.page, e)
                error = TransferError(f"request {handle.request_id}: layer {job.layer} page "
                                      f"{job.page} failed to decode: {e}")
                error.__cause__ = e
                handle.fail(error)

    def _hand_on(self, request_id, layer, start, end, page, _, stage) -> None:
        self.on_encoded(request_id, layer, page, stage)

    # -- deadlines ---------------------------------------------------------------------------
    def _watchdog_loop(self) -> None:
        while not self._closed.wait(0.05):
            now = time.monotonic()
            self._requests.fail_overdue(now, self.config.sender_grace_s)
            self._requests.sweep()
