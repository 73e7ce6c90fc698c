"""Decode side of the Mooncake transport: learns from the control connection where each page's
anchor and residual lie in the sender's engine segment, reads them with its own transfer engine
(every pending anchor, of any request, before any residual), checks them, and hands each page on
exactly as the TCP receiver does (the same ReceiveHandle bookkeeping, events and callbacks).

Threads: one acceptor; per control connection a reader (handshake, descriptor frames -> the
fetch queue; it waits while the queue is full); one fetcher (batches of engine reads into a
registered staging buffer, anchors first; CRC check; admission; ACK / ERROR); page workers
(decode or hand on); one watchdog (deadlines).

Faults: a descriptor frame whose payload CRC fails is NACKed (the sender sends it again); a
descriptor this receiver refuses (malformed, a length beyond the page's cap, a segment that is
not the control peer's) fails its request on both sides, naming the field, and so does a
descriptor frame whose intact header breaks a limit (WireLimits, or an unknown codec; its
payload is skipped in 64 KiB pieces: the connection and its other requests go on, as over
TCP); an engine read that fails, or bytes whose CRC32C differs from the descriptor's, is tried
again ``read_retries`` times, then fails the request naming the segment, address and status;
a request past its deadline fails with TransferDeadlineError on every waiter; one whose sender has had no control
connection for ``sender_grace_s`` (the sender died) fails then (request_table.py).

Hostile peers, as the TCP receiver (receiver.py): control reads allocate what arrived; the whole
handshake has a deadline and slow handshakes are evicted oldest first (connection_slots.py); a
control connection silent for ``idle_timeout_s`` is closed (the sender reconnects when it has
descriptors to send); only requests in progress take one of ``max_requests`` slots, and a
request belongs to the sender session and peer that sent its first descriptor: another
session's descriptors for it are refused and read nothing (request_table.py).
"""
from __future__ import annotations

import collections
import dataclasses
import ipaddress
import logging
import queue
import socket
import threading
import time
from dataclasses import dataclass

from ..codec import codec_from_wire
from ..ops.page_serde import WirePage
from ..wire import (DATA_KINDS, HEADER_SIZE, ChecksumError, Frame, FrameFieldError, Kind,
                    UnknownCodecError, UnsupportedVersionError, WireError, crc32c, encode_frame,
                    params_from_json)
from .base import KVReceiver, OnEncoded, SerdeFactory, serde_for
from .config import ReceiverConfig
from .connection import FrameSocket, server_handshake
from .connection_slots import ConnectionSlots
from .errors import RemoteError, TransferError, TransportClosed
from .mooncake_descriptor import DescriptorError, PageDescriptor, parse_descriptor, split_segment
from .mooncake_engine import MooncakeConfig, MooncakeEngine
from .rate_limit import TokenBucket
from .receive_state import OnPage, PageJob, ReceiveHandle, RequestRejected
from .request_table import RequestTable

log = logging.getLogger(__name__)


@dataclass
class _Fetch:
    """One page stream to read: where (the descriptor) and what it is (the frame's header)."""

    conn: FrameSocket
    frame: Frame
    desc: PageDescriptor
    handle: ReceiveHandle


class FetchQueue:
    """Page streams waiting to be read, with strict priority: any pending anchor, of any
    request, is taken before any residual. Bounded: ``put`` waits while it is full."""

    def __init__(self, max_items: int):
        self._streams = {Kind.ANCHOR: collections.deque(), Kind.RESIDUAL: collections.deque()}
        self._max = max_items
        self._cond = threading.Condition()
        self._closed = False

    def put(self, item: _Fetch) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self._closed or len(self) < self._max)
            if self._closed:
                return False
            self._streams[Kind(item.frame.kind)].append(item)
            self._cond.notify_all()
            return True

    def take(self, budget: int) -> list[_Fetch] | None:
        """Anchors (or, with none pending, residuals) in arrival order, up to ``budget`` bytes
        (at least one); None once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or len(self) > 0)
            if self._closed:
                return None
            stream = self._streams[Kind.ANCHOR] or self._streams[Kind.RESIDUAL]
            out = [stream.popleft()]
            total = out[0].desc.length
            while stream and total + stream[0].desc.length <= budget:
                total += stream[0].desc.length
                out.append(stream.popleft())
            self._cond.notify_all()
            return out

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        return len(self._streams[Kind.ANCHOR]) + len(self._streams[Kind.RESIDUAL])


def _same_host(a: str, b: str) -> bool:
    def norm(host: str):
        ip = ipaddress.ip_address(host.split("%")[0])
        return ip.ipv4_mapped if ip.version == 6 and ip.ipv4_mapped else ip
    return norm(a) == norm(b)


class MooncakeReceiver(KVReceiver):
    """Listens (loopback by default) for MooncakeSenders' control connections and reads their
    requests through the transfer engine.

        with MooncakeReceiver(ReceiverConfig()) as receiver:   # receiver.port: control port
            handle = receiver.request(request_id)
            handle.anchor_ready.wait(); handle.residual_ready.wait()

    Pages go to ``on_encoded`` (wire pages, not decoded), ``on_page`` (decoded) or the
    handle's ``k`` / ``v`` tensors, as with the TCP Receiver. ``engine``: a MooncakeConfig
    (its own engine, closed with the receiver) or a shared MooncakeEngine.
    """

    def __init__(self, config: ReceiverConfig = ReceiverConfig(),
                 engine: MooncakeEngine | MooncakeConfig = MooncakeConfig(),
                 on_page: OnPage | None = None, *, serde: SerdeFactory = serde_for,
                 on_encoded: OnEncoded | None = None):
        if on_page is not None and on_encoded is not None:
            raise ValueError("give on_page (decoded pages) or on_encoded (wire pages), not both")
        self.config, self.on_page, self.on_encoded, self.serde = config, on_page, on_encoded, serde
        self._own_engine = not isinstance(engine, MooncakeEngine)
        self.engine = MooncakeEngine(engine) if self._own_engine else engine
        opts = self.engine.config
        # The default burst (64 KiB), not a batch: a batch's bytes are booked on the emulated
        # link before it is read, and an idle link earns no credit (mark_idle in _fetch_loop).
        self.limiter = TokenBucket(opts.gbps) if opts.gbps else None
        self._staging, self._staging_addr = self.engine.buffer(opts.batch_bytes)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._requests = RequestTable(config.max_requests, config.max_finished_requests,
                                      config.deadline_s)
        self._conns = ConnectionSlots(config.max_connections, config.max_handshakes)
        self._codecs: dict[tuple[int, bytes], tuple] = {}
        self._fetches = FetchQueue(opts.max_pending_pages)
        self._queued: set[tuple[int, int, int, int]] = set()  # keys in the fetch queue
        self._jobs: queue.SimpleQueue[PageJob | None] = queue.SimpleQueue()
        self.reads = 0  # engine batch reads issued (a measure of batching)
        try:
            self._listener = socket.create_server((config.host, config.port))
        except BaseException:
            self._close_engine()
            raise
        self._listener.settimeout(0.1)
        self.host, self.port = self._listener.getsockname()[:2]
        targets = [(self._accept_loop, "accept"), (self._fetch_loop, "fetch"),
                   (self._watchdog_loop, "recv-watchdog")]
        targets += [(self._decode_loop, f"decode-{i}") for i in range(config.num_decode_threads)]
        self._threads = [threading.Thread(target=f, daemon=True, name=f"lynx-mc-{n}")
                         for f, n in targets]
        for t in self._threads:
            t.start()

    # -- public API (KVReceiver) -------------------------------------------------------------------
    def request(self, request_id: int, deadline_s: float | None = None) -> ReceiveHandle:
        return self._requests.claim(request_id, deadline_s)

    def release(self, request_id: int) -> None:
        handle = self._requests.release(request_id)
        if handle is not None and not handle.finished:
            handle.fail(TransportClosed(f"request {request_id} was released before completing"))

    @property
    def num_connections(self) -> int:
        """Control connections held now, in the handshake or past it."""
        return len(self._conns.all())

    @property
    def num_active_requests(self) -> int:
        """Requests in progress (each takes one of ``max_requests`` slots)."""
        self._requests.sweep()
        return self._requests.num_active

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._listener.close()
        self._fetches.close()
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
        self._close_engine()

    def __enter__(self) -> "MooncakeReceiver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _close_engine(self) -> None:
        if any(t.is_alive() for t in getattr(self, "_threads", ())):
            # a read still running (an unresponsive peer: up to MC_TRANSFER_TIMEOUT) may
            # write into the staging buffer: leave it registered and alive
            log.warning("Mooncake receiver closed with a read in flight; its staging buffer "
                        "stays allocated")
            return
        self.engine.release(self._staging_addr)
        if self._own_engine:
            self.engine.close()

    # -- control connections --------------------------------------------------------------------
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
                try:
                    sock.settimeout(1.0)
                    conn.send(self._error(0, f"too many connections (max_connections="
                                             f"{self.config.max_connections})"))
                except OSError:
                    pass
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, address[0]), daemon=True,
                             name="lynx-mc-conn").start()

    def _serve(self, conn: FrameSocket, peer: str) -> None:
        owner = None
        try:
            with conn.deadline(self.config.handshake_timeout_s):
                sender = server_handshake(conn, self.config.secret, self.config.compat)
            if not self._conns.establish(conn):  # filled meanwhile: the sender reconnects
                log.warning("closing a control connection past its handshake: "
                            "max_connections=%d", self.config.max_connections)
                return
            owner = (sender.session, peer)
            self._requests.connected(owner)
            conn.sock.settimeout(self.config.idle_timeout_s)  # per read: silence closes it
            while not self._closed.is_set():
                try:
                    frame = conn.read()
                except ChecksumError as e:
                    if e.where == "payload" and e.header.kind in DATA_KINDS:
                        h = e.header
                        self._send(conn, [Frame(Kind.NACK, h.request_id, layer=h.layer,
                                                page=h.page, ref_kind=int(h.kind))])
                        continue
                    raise
                except FrameFieldError as e:
                    if e.header is None or e.header.kind not in DATA_KINDS:
                        raise
                    # An intact header past a limit: refuse its request by id, then skip the
                    # payload the sender sends anyway (in 64 KiB pieces), keeping the
                    # connection and every other request on it.
                    self._send(conn, [self._on_refused(e.header, owner, str(e))])
                    conn.skip(e.payload_len)
                    continue
                if frame.kind == Kind.ERROR:  # the sender failed this request on its side
                    self._requests.abort(frame, owner)
                    continue
                if frame.kind not in DATA_KINDS:
                    raise WireError(f"unexpected {frame.kind.name} frame after the handshake")
                reply = self._on_descriptor(conn, peer, owner, frame)
                if reply is not None:
                    self._send(conn, [reply])
        except (UnsupportedVersionError, UnknownCodecError) as e:
            self._send(conn, [self._error(0, str(e))])
        except (OSError, WireError, TransferError) as e:
            if not self._closed.is_set():
                log.debug("control connection closed: %s", e)
        finally:
            conn.close()
            self._conns.remove(conn)
            if owner is not None:
                self._requests.disconnected(owner, time.monotonic())

    def _on_refused(self, header: Frame, owner, reason: str) -> Frame:
        """A descriptor frame broke a limit: its request fails here (if this sender owns it)
        and the sender is told, naming the limit."""
        rid = header.request_id
        handle, refusal = self._requests.for_frame(rid, owner)
        where = f"layer {header.layer} page {header.page} {Kind(header.kind).name}"
        if handle is not None and not handle.finished:  # a completed request keeps its pages
            handle.fail(RemoteError(f"request {rid}: {where}: frame refused: {reason}"))
        log.warning("request %d: refusing a descriptor frame: %s", rid, refusal or reason)
        return self._error(rid, refusal or f"{where}: frame refused: {reason}")

    def _on_descriptor(self, conn: FrameSocket, peer: str, owner, frame: Frame) -> Frame | None:
        """Queue a descriptor frame's read; -> a reply to send now (ACK of a late duplicate,
        ERROR of a refused request) or None."""
        rid = frame.request_id
        handle, refusal = self._requests.for_frame(rid, owner)
        if refusal is not None:
            return self._error(rid, refusal)
        if handle is None:
            return _ack(frame)  # a late duplicate of a released request
        if handle.error is not None:
            return self._error(rid, str(handle.error))
        if handle.finished or handle.has(frame.kind, frame.layer, frame.page):
            return _ack(frame)
        try:
            if frame.extra_pages:  # a descriptor names one page's bytes
                raise DescriptorError("extra_pages", f"a descriptor frame carries one page, "
                                                     f"this one claims {frame.extra_pages + 1}")
            desc = parse_descriptor(frame.payload, frame, self.config.limits)
            host, _ = split_segment(desc.segment)
            if not _same_host(host, peer):
                raise DescriptorError("segment", f"{desc.segment} is not on the control "
                                                 f"connection's peer {peer}")
        except DescriptorError as e:
            return self._reject(handle, f"layer {frame.layer} page {frame.page} "
                                        f"{Kind(frame.kind).name}: {e}")
        with self._lock:
            if frame.key in self._queued:
                return None  # a repeat of a queued read: its ACK comes when it is read
            self._queued.add(frame.key)
        if not self._fetches.put(_Fetch(conn, frame, desc, handle)):
            with self._lock:
                self._queued.discard(frame.key)
        return None

    def _send(self, conn: FrameSocket, frames: list[Frame]) -> None:
        try:
            conn.send_many([encode_frame(f) for f in frames])
        except OSError:
            pass  # the sender resends what it did not see acknowledged

    def _error(self, rid: int, reason: str) -> Frame:
        text = reason.encode("utf-8", errors="replace")[:self.config.limits.max_error_bytes]
        return Frame(Kind.ERROR, rid, payload=text.decode("utf-8", errors="ignore").encode())

    def _reject(self, handle: ReceiveHandle, reason: str) -> Frame:
        handle.fail(RemoteError(f"request {handle.request_id}: {reason}"))
        return self._error(handle.request_id, reason)

    # -- reads ------------------------------------------------------------------------------------
    def _fetch_loop(self) -> None:
        while True:
            if self.limiter is not None and not len(self._fetches):
                self.limiter.mark_idle()
            batch = self._fetches.take(self.engine.config.batch_bytes)
            if batch is None:
                return
            replies: dict[FrameSocket, list[Frame]] = collections.defaultdict(list)
            live = []
            with self._lock:
                self._queued.difference_update(item.frame.key for item in batch)
            for item in batch:
                if item.handle.error is not None:
                    continue  # its ERROR went out when it failed
                # A repeat (retransmitted while its first copy was being read) is not read
                # again: the sender may have released the memory once that copy was acked.
                if item.handle.finished or item.handle.has(item.frame.kind, item.frame.layer,
                                                           item.frame.page):
                    replies[item.conn].append(_ack(item.frame))
                else:
                    live.append(item)
            for item, data in self._read(live):
                reply = self._admit(item, data)
                if reply is not None:
                    replies[item.conn].append(reply)
            for conn, frames in replies.items():
                self._send(conn, frames)

    def _read(self, items: list[_Fetch]):
        """Yield (item, bytes) for every item read intact, (item, error text) otherwise, in
        order. One engine batch per segment when all goes well; item by item to find the
        failing one(s) when it does not."""
        view = self._staging.numpy()
        i = 0
        while i < len(items):
            group = [items[i]]
            while (i + len(group) < len(items)
                   and items[i + len(group)].desc.segment == group[0].desc.segment):
                group.append(items[i + len(group)])
            i += len(group)
            if sum(it.desc.length for it in group) <= len(view) and self._read_group(group):
                datas, offset = [], 0
                for it in group:  # copied out before a retry can reuse the staging buffer
                    datas.append(view[offset:offset + it.desc.length].tobytes())
                    offset += it.desc.length
                for it, data in zip(group, datas):
                    yield it, (data if crc32c(data) == it.desc.crc else self._retry(it))
                continue
            for it in group:
                yield it, self._retry(it)

    def _read_group(self, group: list[_Fetch], offset: int = 0) -> int:
        """One engine batch read of ``group`` into the staging buffer; -> True if it succeeded."""
        local, remote, lengths = [], [], []
        for it in group:
            local.append(self._staging_addr + offset)
            remote.append(it.desc.address)
            lengths.append(it.desc.length)
            offset += it.desc.length
        if self.limiter is not None:
            self.limiter.consume(sum(lengths))
        self.reads += 1
        status = self.engine.read(group[0].desc.segment, local, remote, lengths)
        return status == 0

    def _retry(self, item: _Fetch) -> bytes | str:
        """Read one page stream alone (in pieces if it exceeds the staging buffer) up to
        ``read_retries`` more times; -> its bytes, or why it could not be had."""
        d, size = item.desc, len(self._staging)
        why = ""
        for _ in range(self.engine.config.read_retries):
            out = bytearray()
            for start in range(0, d.length, size):
                n = min(size, d.length - start)
                piece = dataclasses.replace(item, desc=dataclasses.replace(
                    d, address=d.address + start, length=n))
                if not self._read_group([piece]):
                    why = (f"the engine read of {n} bytes at {d.address + start:#x} from "
                           f"segment {d.segment} failed (both engines must use one protocol; "
                           f"this receiver's is {self.engine.config.protocol!r})")
                    break
                out += self._staging.numpy()[:n].tobytes()
            else:
                if crc32c(out) == d.crc:
                    return bytes(out)
                why = f"the {d.length} bytes read from segment {d.segment} fail their CRC32C"
        return why or "no read was attempted (read_retries=0)"

    def _admit(self, item: _Fetch, data: bytes | str) -> Frame | None:
        """Hand read bytes to the request's bookkeeping; -> ACK, ERROR, or None (the request
        failed meanwhile: its ERROR went out then)."""
        handle, frame = item.handle, item.frame
        if handle.error is not None:
            return None
        where = f"layer {frame.layer} page {frame.page} {Kind(frame.kind).name}"
        if isinstance(data, str):
            log.warning("request %d %s: %s", handle.request_id, where, data)
            error = TransferError(f"request {handle.request_id}: {where}: {data}")
            handle.fail(error)
            return self._error(handle.request_id, f"{where}: {data}")
        full = dataclasses.replace(frame, payload=bytearray(data))
        wire_bytes = HEADER_SIZE + len(frame.params) + len(frame.payload) + len(data)
        try:
            jobs = handle.admit(full, wire_bytes, self._codec, self.config.max_request_bytes,
                                self.config.dequantize, self.config.defer_residual)
        except RequestRejected as e:
            return self._reject(handle, str(e))
        for job in jobs or ():
            self._jobs.put(job)
        return _ack(frame)

    def _codec(self, codec_id: int, params: bytes):
        key = (codec_id, params)
        with self._lock:
            codec = self._codecs.get(key)
        if codec is None:
            codec = codec_from_wire(codec_id, params_from_json(params))
            codec = (codec, self.serde(codec))
            with self._lock:
                if len(self._codecs) >= 64:
                    self._codecs.clear()
                self._codecs[key] = codec
        return codec

    # -- decoding (as the TCP receiver) ---------------------------------------------------------
    def _decode_loop(self) -> None:
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
                error = TransferError(f"request {handle.request_id}: layer {job.layer} page "
                                      f"{job.page} failed to decode: {e}")
                error.__cause__ = e
                handle.fail(error)

    def _hand_on(self, request_id, layer, start, end, page, _, stage) -> None:
        self.on_encoded(request_id, layer, page, stage)

    def _watchdog_loop(self) -> None:
        while not self._closed.wait(0.05):
            now = time.monotonic()
            self._requests.fail_overdue(now, self.config.sender_grace_s)
            self._requests.sweep()


def _ack(frame: Frame) -> Frame:
    return Frame(Kind.ACK, frame.request_id, layer=frame.layer, page=frame.page,
                 ref_kind=int(frame.kind))
