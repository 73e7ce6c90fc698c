"""Decode side of the LMCache transport (lmcache.py has the design): for every request asked
for (``request``), looks its objects up in LMCache's L2 and reads them as they are stored:
the header object, then every anchor object of every pending request before any residual
object, and hands each page on exactly as the TCP receiver does (the same ReceiveHandle
bookkeeping, events and callbacks).

Threads: one fetcher (LMCache prefetch tasks: headers, then anchors, then residuals; each
object read is parsed as a wire frame, checked against what the header promised, admitted);
page workers (decode or hand on); one watchdog (deadlines).

What a peer controls is bounded before it is read: the header object has a fixed size, its
frame is checked by the wire decoder against ``ReceiverConfig.limits`` and the request's KV
against ``max_request_bytes``; every other object's size is computed here from the codec
(``PageSerde.page_nbytes``), never taken from the peer, so an object of another size is never
read. An object whose frame fails its CRC32C, breaks a limit, or describes another page fails
its request at once, naming the object; objects not stored by the deadline fail it then.
A request whose sender failed it (its abort object, looked up every ``ABORT_POLL_S`` with the
headers) fails at once with the sender's reason (RemoteError, as over TCP).
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from ..codec import codec_from_wire
from ..ops.page_serde import WirePage
from ..wire import (HEADER_SIZE, DTYPES, Kind, WireError, params_from_json, read_frame,
                    request_kv_bytes)
from .base import KVReceiver, OnEncoded, SerdeFactory, serde_for
from .config import ReceiverConfig
from .errors import RemoteError, TransferDeadlineError, TransferError, TransportClosed
from .lmcache_store import HEADER_OBJECT_BYTES, LMCacheConfig, LMCacheStore, namespace
from .rate_limit import TokenBucket
from .receive_state import OnPage, PageJob, ReceiveHandle, RequestRejected

log = logging.getLogger(__name__)
_BATCH_BYTES = 32 << 20  # residual bytes read per pass (the L1 must hold them)
# Objects one header may name. Planning and polling cost ~15 us each, and max_request_bytes
# caps KV bytes, not objects: one KV head of one dim within it is ~10^7 pages. A real model at
# 8 GiB of KV is ~10^5 (SmolLM2: 87K at pages of 256).
MAX_REQUEST_OBJECTS = 1 << 20
# How often the abort objects of unfinished requests are looked up: a sender's failure is
# learnt within this, against transfer_timeout_s (600 s) without it; polling them on every
# 2 ms pass would double the header lookups for nothing.
ABORT_POLL_S = 0.05
ABORT_KIND = int(Kind.ERROR)


@dataclass
class _Want:
    kind: int
    layer: int
    page: int
    token_start: int
    token_end: int
    size: int               # the whole object: frame header, parameters, page bytes


@dataclass
class _State:
    handle: ReceiveHandle
    stage: str = "header"                             # header -> anchor -> residual -> done
    anchors: dict = field(default_factory=dict)       # ObjectKey -> _Want, not yet read
    residuals: dict = field(default_factory=dict)
    keys: list = field(default_factory=list)          # every object of the request


class _Bytes:
    """read_exact over one object's bytes (wire.read_frame's input)."""

    def __init__(self, data: bytes):
        self.view, self.offset = memoryview(data), 0

    def __call__(self, n: int):
        if self.offset + n > len(self.view):
            raise WireError(f"the object ends after {len(self.view)} bytes, its frame "
                            f"announces more")
        out = self.view[self.offset:self.offset + n]
        self.offset += n
        return out


class LMCacheReceiver(KVReceiver):
    """Reads the requests an LMCacheSender stores for ``config.port`` (the port names this
    receiver's objects; nothing listens on it).

        with LMCacheReceiver(ReceiverConfig(port=8100), LMCacheConfig(directory)) as r:
            handle = r.request(request_id)
            handle.anchor_ready.wait(); handle.residual_ready.wait()

    Unlike the TCP receiver, only requests asked for with ``request`` are looked up (the
    connector asks for each one it loads). ``release`` deletes the request's objects from L2;
    a new receiver first removes what an earlier one of its port left behind. Of
    ReceiverConfig, the TCP connection options and ``secret`` do not apply.
    """

    def __init__(self, config: ReceiverConfig, store: LMCacheStore | LMCacheConfig,
                 on_page: OnPage | None = None, *, serde: SerdeFactory = serde_for,
                 on_encoded: OnEncoded | None = None):
        if on_page is not None and on_encoded is not None:
            raise ValueError("give on_page (decoded pages) or on_encoded (wire pages), not both")
        if config.port == 0:
            raise ValueError("ReceiverConfig(port=0): the LMCache transport names a receiver's "
                             "objects by its port; give the port senders are configured with")
        self.config, self.on_page, self.on_encoded, self.serde = config, on_page, on_encoded, serde
        self._own_store = not isinstance(store, LMCacheStore)
        self.store = LMCacheStore(store) if self._own_store else store
        self.host, self.port = config.host, config.port
        self.space = namespace(config.port)
        removed = self.store.sweep(self.space)
        if removed:
            log.info("LMCache receiver %s: removed %d objects an earlier receiver left",
                     self.space, removed)
        opts = self.store.config
        self.limiter = TokenBucket(opts.gbps) if opts.gbps else None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._states: dict[int, _State] = {}
        self._codecs: dict = {}
        self._next_abort_poll = 0.0
        self._jobs: queue.SimpleQueue[PageJob | None] = queue.SimpleQueue()
        self.reads = 0           # objects read
        self.read_order: collections.deque = collections.deque(maxlen=1 << 16)  # (rid, kind)
        targets = [(self._fetch_loop, "fetch"), (self._watchdog_loop, "recv-watchdog")]
        targets += [(self._decode_loop, f"decode-{i}") for i in range(config.num_decode_threads)]
        self._threads = [threading.Thread(target=f, daemon=True, name=f"lynx-lmc-{n}")
                         for f, n in targets]
        for t in self._threads:
            t.start()

    # -- public API (KVReceiver) -------------------------------------------------------------------
    def request(self, request_id: int, deadline_s: float | None = None) -> ReceiveHandle:
        if not isinstance(request_id, int) or not 0 <= request_id < 2**64:
            raise ValueError(f"{request_id=} must be an int in [0, 2**64)")
        with self._lock:
            state = self._states.get(request_id)
            if state is None:
                if self._closed.is_set():
                    raise TransportClosed("the receiver is closed")
                handle = ReceiveHandle(request_id, time.monotonic() + (
                    deadline_s or self.config.deadline_s))
                state = self._states[request_id] = _State(handle)
                state.keys.append(self.store.key(self.space, request_id, 0))
                state.keys.append(self.store.key(self.space, request_id, ABORT_KIND))
        self._wake.set()
        return state.handle

    def release(self, request_id: int) -> None:
        with self._lock:
            state = self._states.pop(request_id, None)
        if state is None:
            return
        if not state.handle.finished:
            state.handle.fail(TransportClosed(f"request {request_id} was released before "
                                              f"completing"))
        try:
            self.store.delete(state.keys)
        except Exception as e:  # noqa: BLE001 - cleanup must not fail the caller
            log.warning("request %d: deleting its LMCache objects failed: %s", request_id, e)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake.set()
        with self._lock:
            states = list(self._states.values())
        for s in states:
            if not s.handle.finished:
                s.handle.fail(TransportClosed(f"request {s.handle.request_id}: the receiver "
                                              f"was closed ({s.handle.progress()})"))
        for _ in range(self.config.num_decode_threads):
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=5)
        if self._own_store:
            self.store.close()

    def __enter__(self) -> "LMCacheReceiver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- reads ------------------------------------------------------------------------------------
    def _fetch_loop(self) -> None:
        while not self._closed.is_set():
            try:
                progressed = self._pass()
            except Exception:  # noqa: BLE001 - LMCache failing must not kill the thread
                log.exception("LMCache receiver: a read pass failed")
                progressed = False
            if not progressed:
                if self.limiter is not None:
                    self.limiter.mark_idle()
                self._wake.wait(self.store.config.poll_interval_s)
                self._wake.clear()

    def _pass(self) -> bool:
        """One look at LMCache: headers, then anchors; residuals only when no anchor was read.
        -> whether anything was read."""
        with self._lock:
            live = [s for s in self._states.values() if s.handle.error is None]
        headers = [s for s in live if s.stage == "header"]
        aborts = []
        if time.monotonic() >= self._next_abort_poll:
            self._next_abort_poll = time.monotonic() + ABORT_POLL_S
            aborts = [s for s in live if not s.handle.finished]
        read = False
        if headers or aborts:  # one size: one LMCache prefetch task
            got = self.store.fetch([(s.keys[0], HEADER_OBJECT_BYTES) for s in headers]
                                   + [(s.keys[1], HEADER_OBJECT_BYTES) for s in aborts])
            for s in aborts:
                data = got.get(s.keys[1])
                if data is not None:
                    self._on_abort(s, data)
            for s in headers:
                data = got.get(s.keys[0])
                if data is not None and s.handle.error is None:
                    read = True
                    self._on_header(s, data)
        anchors = [(k, w, s) for s in live if s.stage == "anchor"
                   for k, w in list(s.anchors.items())]
        if anchors:
            read |= self._read_objects(anchors)
        if read:
            return True
        residuals, total = [], 0
        for s in live:
            if s.stage != "residual":
                continue
            for k, w in list(s.residuals.items()):
                if residuals and total + w.size > _BATCH_BYTES:
                    break
                residuals.append((k, w, s))
                total += w.size
        return self._read_objects(residuals) if residuals else False

    def _read_objects(self, items: list) -> bool:
        got = self.store.fetch([(k, w.size) for k, w, _ in items])
        if not got:
            return False
        for key, want, state in items:
            data = got.get(key)
            if data is None:
                continue
            if self.limiter is not None:  # object by object, as a link would hand them on
                self.limiter.consume(len(data))
            self.reads += 1
            self.read_order.append((state.handle.request_id, want.kind))
            pending = state.anchors if want.kind == Kind.ANCHOR else state.residuals
            pending.pop(key, None)
            self._admit(state, want, data)
            with self._lock:
                if state.stage == "anchor" and not state.anchors:
                    state.stage = "residual" if state.residuals else "done"
                elif state.stage == "residual" and not state.residuals:
                    state.stage = "done"
        return True

    def _where(self, state: _State, want: _Want) -> str:
        return (f"request {state.handle.request_id}: layer {want.layer} page {want.page} "
                f"{Kind(want.kind).name} object")

    def _admit(self, state: _State, want: _Want, data: bytes) -> None:
        handle = state.handle
        if handle.error is not None:
            return
        try:
            frame = read_frame(_Bytes(data), self.config.limits)
            got = (int(frame.kind), frame.request_id, frame.layer, frame.page,
                   frame.token_start, frame.token_end)
            expected = (want.kind, handle.request_id, want.layer, want.page, want.token_start,
                        want.token_end)
            if got != expected:
                raise WireError(f"its frame is (kind, request, layer, page, tokens) {got}, "
                                f"expected {expected}")
            frame = dataclasses.replace(frame, payload=bytearray(frame.payload))
            jobs = handle.admit(frame, len(data), self._codec, self.config.max_request_bytes,
                                self.config.dequantize, self.config.defer_residual)
        except (WireError, RequestRejected) as e:
            error = TransferError(f"{self._where(state, want)}: {e}")
            log.warning("%s", error)
            handle.fail(error)
            return
        for job in jobs or ():
            self._jobs.put(job)

    def _on_header(self, state: _State, data: bytes) -> None:
        """The request's header object -> the anchor and residual objects to read."""
        handle, rid = state.handle, state.handle.request_id
        try:
            frame = read_frame(_Bytes(data), self.config.limits)
            if (frame.kind != Kind.ANCHOR or frame.request_id != rid or frame.layer != 0
                    or frame.page != 0 or frame.extra_pages or len(frame.payload) != 1):
                raise WireError(f"it is not the header of request {rid}")
            kv_bytes = request_kv_bytes(frame.num_layers, frame.num_tokens, frame.num_kv_heads,
                                        frame.head_dim, DTYPES[frame.dtype].itemsize)
            if kv_bytes > self.config.max_request_bytes:
                raise WireError(f"request KV of {kv_bytes} bytes exceeds the receiver's "
                                f"max_request_bytes={self.config.max_request_bytes}")
            try:
                codec, serde = self._codec(frame.codec_id, frame.params)
            except ValueError as e:
                raise WireError(f"cannot build its codec: {e}") from None
            has_residual = bytes(frame.payload) == b"\x01"

            def layer_sizes(i):  # a codec's split may differ by layer, its pages do not
                try:
                    return serde.for_layer(i, frame.num_layers).page_nbytes(
                        frame.num_tokens, frame.num_kv_heads, frame.head_dim,
                        DTYPES[frame.dtype])
                except ValueError as e:  # e.g. cachegen: sizes follow the values
                    raise WireError(f"its objects cannot be sized: {e}") from None
            first = layer_sizes(0)
            streams = 1 + (has_residual and any(r is not None for *_, r in first))
            objects = frame.num_layers * len(first) * streams
            if objects > MAX_REQUEST_OBJECTS:
                raise WireError(f"it names {objects} objects ({frame.num_layers} layers x "
                                f"{len(first)} pages x {streams} streams), over the receiver's "
                                f"{MAX_REQUEST_OBJECTS} per request")
            sizes = [first] + [layer_sizes(i) for i in range(1, frame.num_layers)]
        except WireError as e:
            error = TransferError(f"request {rid}: header object: {e}")
            log.warning("%s", error)
            handle.fail(error)
            return
        base = HEADER_SIZE + len(frame.params)
        anchors, residuals = {}, {}
        for layer in range(frame.num_layers):
            for page, (t0, t1, a, r) in enumerate(sizes[layer]):
                key = self.store.key(self.space, rid, int(Kind.ANCHOR), layer, page)
                anchors[key] = _Want(int(Kind.ANCHOR), layer, page, t0, t1, base + a)
                if r is not None and has_residual:
                    key = self.store.key(self.space, rid, int(Kind.RESIDUAL), layer, page)
                    residuals[key] = _Want(int(Kind.RESIDUAL), layer, page, t0, t1, base + r)
        with self._lock:
            state.anchors, state.residuals = anchors, residuals
            state.keys += list(anchors) + list(residuals)
            state.stage = "anchor"

    def _on_abort(self, state: _State, data: bytes) -> None:
        """The request's abort object: its sender failed it, and says why."""
        handle, rid = state.handle, state.handle.request_id
        if handle.finished:  # complete: its pages stand
            return
        try:
            frame = read_frame(_Bytes(data), self.config.limits)
            if frame.kind != Kind.ERROR or frame.request_id != rid:
                raise WireError(f"it is not an abort of request {rid}")
        except WireError as e:  # a sender stores one only for a request it failed
            error = TransferError(f"request {rid}: its abort object is unreadable ({e}): its "
                                  f"sender failed it")
        else:
            reason = bytes(frame.payload).decode("utf-8", errors="replace")
            error = RemoteError(f"request {rid}: the sender failed it: {reason}")
        log.info("%s", error)
        handle.fail(error)

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
            with self._lock:
                expired = [s for s in self._states.values()
                           if not s.handle.finished and now > s.handle.deadline]
            for s in expired:
                if s.stage == "header":
                    missing = "its header object was never stored"
                else:
                    missing = (f"{len(s.anchors)} anchor and {len(s.residuals)} residual "
                               f"objects not stored")
                s.handle.fail(TransferDeadlineError(
                    f"request {s.handle.request_id}: deadline passed after "
                    f"{now - s.handle.created_at:.2f} s: {missing} in "
                    f"{self.store.config.directory} ({s.handle.progress()})"))
