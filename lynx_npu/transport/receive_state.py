"""Per-request bookkeeping on the receiver (plain Python plus the destination tensors).

A request is described by every one of its frames (codec, layers, tokens, shape); the first
frame fixes that description and later frames must agree. Pages are identified by
(layer, page index); a page's token range is fixed by its first frame and may not overlap
another page's. A frame seen before, with the same range, is a duplicate (acknowledged again,
applied never); the range is checked first, so a frame that reuses a page id for other tokens
fails the request instead of passing for a duplicate.

Each page moves through levels 0 (nothing) -> 1 (anchor dequantized) -> 2 (full precision);
a write only ever raises the level, so a late anchor decode cannot overwrite refined values.
A page's write (the consumer's callback, or the copy into ``k`` / ``v``) runs outside the
request's lock, so the reader threads keep admitting frames meanwhile (held, it serialised the
link behind the consumer: on loopback the readers spent most of their time waiting for it);
writes of one page are serialised, and ``fail`` returns only once no other thread is writing,
so after a release the consumer's memory (a freed cache block) is never written again.
``anchor_ready`` is set when every token of every layer is at level >= 1, ``residual_ready``
when all are at level 2 (one-stream codecs reach 2 directly and set both).
"""
from __future__ import annotations

import bisect
import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..wire import (DTYPES, Frame, FrameFieldError, FramePage, Kind, frame_pages,
                    request_kv_bytes)
from .events import StageEvent

OnPage = Callable[[int, int, int, int, torch.Tensor, torch.Tensor, str], None]


class RequestRejected(ValueError):
    """A frame contradicts its request's description: the request fails with this reason."""


@dataclass(frozen=True)
class PageJob:
    """Work for a decode thread: dequantize one page (anchor alone, or with its residual)."""

    handle: "ReceiveHandle"
    layer: int
    page: int
    token_start: int
    token_end: int
    anchor: memoryview              # the page's bytes (a view of its frame's payload)
    residual: memoryview | None


class ReceiveHandle:
    """One incoming request. ``k[layer]`` / ``v[layer]`` are ``[H, T, D]`` tensors (unless the
    receiver was given an ``on_page`` callback); ``anchor_ready`` / ``residual_ready`` are
    StageEvents (threading.Event-like, awaitable, raising the error if the request fails)."""

    def __init__(self, request_id: int, deadline: float):
        self.request_id = request_id
        self.deadline = deadline
        self.created_at = time.monotonic()
        self.owner = None  # the sender (session, address) whose frame opened it (RequestTable)
        self.anchor_ready = StageEvent(f"request {request_id} anchor_ready")
        self.residual_ready = StageEvent(f"request {request_id} residual_ready")
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.codec = None
        self.serde = None                     # the receiver's PageSerde of ``codec``
        self.num_layers = self.num_tokens = self.num_kv_heads = self.head_dim = 0
        self.dtype: torch.dtype | None = None
        self.anchor_ready_at: float | None = None
        self.residual_ready_at: float | None = None
        # (monotonic time, kind, layer, page, wire bytes) of every new frame, in arrival order
        self.arrivals: list[tuple[float, int, int, int, int]] = []
        self._lock = threading.Lock()
        self._written = threading.Condition(self._lock)  # a page write finished
        self._writing: dict[tuple[int, int], int] = {}  # page -> thread writing it now
        self._meta: tuple | None = None
        self._two_stream = False
        self._ranges: dict[int, dict[int, tuple[int, int]]] = {}
        self._sorted: dict[int, list[tuple[int, int]]] = {}
        self._received: set[tuple[int, int, int]] = set()
        self._stored: dict[tuple[int, int], list] = {}
        self._level: dict[tuple[int, int], int] = {}
        self._anchor_tokens: list[int] = []
        self._full_tokens: list[int] = []
        self._layers_anchor = self._layers_full = 0
        self._residual_tokens = 0             # residual frames' tokens received (all layers)
        self._held: list[PageJob] = []        # full-page jobs deferred until the residual is in

    # -- state --------------------------------------------------------------------------------
    @property
    def error(self) -> BaseException | None:
        return self.residual_ready.error or self.anchor_ready.error

    @property
    def finished(self) -> bool:
        return self.residual_ready.settled()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for full precision (raises if the request failed)."""
        return self.residual_ready.wait(timeout)

    @property
    def two_stream(self) -> bool:
        """Whether the request's codec splits into an anchor and a residual (known from its
        first frame)."""
        return self._two_stream

    def anchor_eta(self, now: float | None = None) -> float | None:
        """Seconds until the whole anchor is expected in, at the rate its pages have come so
        far (layer-tokens per second since the first frame); None before two frames' worth."""
        with self._lock:
            if self._meta is None or not self.arrivals:
                return None
            covered, total = sum(self._anchor_tokens), self.num_layers * self.num_tokens
            first = self.arrivals[0][0]
        if covered >= total:
            return 0.0
        elapsed = (time.monotonic() if now is None else now) - first
        if covered == 0 or elapsed <= 0:
            return None
        return (total - covered) * elapsed / covered

    def anchor_share(self) -> float:
        """The share of the anchor (layer-tokens) handed on so far."""
        with self._lock:
            if self._meta is None:
                return 0.0
            return sum(self._anchor_tokens) / (self.num_layers * self.num_tokens)

    def layer_anchor_in(self, layer: int) -> bool:
        """Whether every anchor page of ``layer`` was handed on (or the request settled)."""
        with self._lock:
            return self._layer_anchor_in(layer)

    def wait_layer_anchor(self, layer: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s until :meth:`layer_anchor_in`; returns whether it is."""
        with self._written:
            return self._written.wait_for(lambda: self._layer_anchor_in(layer), timeout)

    def _layer_anchor_in(self, layer: int) -> bool:
        if self.anchor_ready.settled():
            return True
        return (self._meta is not None and 0 <= layer < self.num_layers
                and self._anchor_tokens[layer] >= self.num_tokens)

    def progress(self) -> str:
        if self._meta is None:
            return "no frame received"
        total = self.num_layers * self.num_tokens
        return (f"anchor covers {sum(self._anchor_tokens)}/{total} and full precision "
                f"{sum(self._full_tokens)}/{total} layer-tokens")

    def fail(self, error: BaseException) -> None:
        """Fail the request; returns once no other thread writes one of its pages (settled
        first, so no write starts after it)."""
        with self._lock:
            self._stored.clear()
            self._held.clear()
        self.anchor_ready.fail(error)
        self.residual_ready.fail(error)
        me = threading.get_ident()  # a consumer callback may fail its own request
        with self._written:
            self._written.notify_all()  # wake wait_layer_anchor: the request has settled
            self._written.wait_for(lambda: all(t == me for t in self._writing.values()))

    def has(self, kind: int, layer: int, page: int) -> bool:
        """Whether this stream of the page was admitted already (a repeat needs no read)."""
        with self._lock:
            return (int(kind), layer, page) in self._received

    # -- admission (reader threads) -----------------------------------------------------------
    def admit(self, frame: Frame, wire_bytes: int, get_codec, max_request_bytes: int,
              dequantize: bool, defer_residual: bool = False) -> list[PageJob] | bool:
        """Record a data frame (one or more pages: wire.frame_pages). Returns False when every
        page is a duplicate, else the PageJobs to decode now (none when nothing can be decoded
        yet: a residual ahead of its anchor, no dequantize, or ``defer_residual`` holding full
        pages until the last residual frame is in). Raises RequestRejected when the frame
        contradicts the request. ``get_codec(codec_id, params)`` -> (codec, its PageSerde),
        called once, for the request's first frame."""
        try:
            parts = frame_pages(frame)
        except FrameFieldError as e:
            raise RequestRejected(f"layer {frame.layer} page {frame.page}: {e}") from None
        meta = (frame.codec_id, frame.params, frame.num_layers, frame.num_tokens, frame.dtype,
                frame.num_kv_heads, frame.head_dim)
        with self._lock:
            if self._meta is None:
                self._describe(frame, meta, get_codec, max_request_bytes)
            elif meta != self._meta:
                raise RequestRejected(
                    f"frame (layer {frame.layer}, page {frame.page}) describes the request as "
                    f"{_describe(meta)}, earlier frames as {_describe(self._meta)}")
            if self.finished:
                return False
            kind, layer = int(frame.kind), frame.layer
            if kind == Kind.RESIDUAL and not self._two_stream:
                raise RequestRejected(f"codec {self.codec.name!r} has one stream but a "
                                      f"residual frame arrived (layer {layer}, page {frame.page})")
            # the header, parameters and page table count with the first page
            overhead = wire_bytes - sum(part.payload.nbytes for part in parts)
            jobs, new, now = [], False, time.monotonic()
            for part in parts:
                self._check_range(layer, part.page, part.token_start, part.token_end)
                if (kind, layer, part.page) in self._received:
                    continue
                new = True
                self._received.add((kind, layer, part.page))
                self.arrivals.append((now, kind, layer, part.page,
                                      part.payload.nbytes + overhead))
                overhead = 0
                jobs += self._admit_page(kind, layer, part, dequantize, defer_residual)
            return jobs if new else False

    def _admit_page(self, kind: int, layer: int, part: FramePage, dequantize: bool,
                    defer_residual: bool) -> list[PageJob]:
        """One new page of a data frame (lock held)."""
        page, start, end = part.page, part.token_start, part.token_end
        if not dequantize:
            level = 1 if kind == Kind.ANCHOR and self._two_stream else 2
            if kind == Kind.RESIDUAL and (Kind.ANCHOR, layer, page) not in self._received:
                return []
            if kind == Kind.ANCHOR and (Kind.RESIDUAL, layer, page) in self._received:
                level = 2
            self._raise_level(layer, page, start, end, level)
            return []
        slot = self._stored.setdefault((layer, page), [None, None])
        slot[0 if kind == Kind.ANCHOR else 1] = part.payload
        if kind == Kind.RESIDUAL:
            self._residual_tokens += end - start
        if not self._two_stream:
            del self._stored[(layer, page)]
        job = None if slot[0] is None else PageJob(self, layer, page, start, end, *slot)
        if job is not None and (not defer_residual or job.residual is None):
            return [job]  # an anchor alone, or a full page applied as it comes
        if not defer_residual:
            return []  # a residual ahead of its anchor waits for it
        # Full pages wait for the last residual frame. The streams may arrive reordered (two
        # connections, Mooncake, LMCache), so whichever frame completes the count releases
        # them, and a page whose anchor comes after that goes at once; an anchor that finds
        # its residual in before then is decoded at anchor precision meanwhile.
        if job is not None:
            self._held.append(job)
        if self._residual_tokens < self.num_layers * self.num_tokens:
            early = job is not None and kind == Kind.ANCHOR
            return [dataclasses.replace(job, residual=None)] if early else []
        held, self._held = self._held, []
        return held

    def _describe(self, frame: Frame, meta: tuple, get_codec, max_request_bytes: int) -> None:
        dtype = DTYPES[frame.dtype]
        kv_bytes = request_kv_bytes(frame.num_layers, frame.num_tokens, frame.num_kv_heads,
                                    frame.head_dim, dtype.itemsize)
        if kv_bytes > max_request_bytes:
            raise RequestRejected(f"request KV of {kv_bytes} bytes exceeds the receiver's "
                                  f"max_request_bytes={max_request_bytes}")
        try:
            self.codec, self.serde = get_codec(frame.codec_id, frame.params)
        except ValueError as e:
            raise RequestRejected(f"cannot build its codec: {e}") from None
        self._meta = meta
        self._two_stream = len(self.codec.stages) > 1
        self.num_layers, self.num_tokens = frame.num_layers, frame.num_tokens
        self.num_kv_heads, self.head_dim, self.dtype = frame.num_kv_heads, frame.head_dim, dtype
        self._anchor_tokens = [0] * frame.num_layers
        self._full_tokens = [0] * frame.num_layers

    def _check_range(self, layer: int, page: int, start: int, end: int) -> None:
        ranges = self._ranges.setdefault(layer, {})
        known = ranges.get(page)
        if known is not None:
            if known != (start, end):
                raise RequestRejected(f"layer {layer} page {page} covers tokens [{start}, {end})"
                                      f" in one frame and {list(known)} in another")
            return
        spans = self._sorted.setdefault(layer, [])
        i = bisect.bisect_left(spans, (start, end))
        if (i > 0 and spans[i - 1][1] > start) or (i < len(spans) and spans[i][0] < end):
            raise RequestRejected(f"layer {layer} page {page} tokens [{start}, {end}) overlap "
                                  f"another page")
        spans.insert(i, (start, end))
        ranges[page] = (start, end)

    # -- application (decode threads) ---------------------------------------------------------
    def apply(self, job: PageJob, k: torch.Tensor | None, v: torch.Tensor | None,
              full: bool, on_page: OnPage | None) -> None:
        level = 2 if full or not self._two_stream else 1
        key, (s, e) = (job.layer, job.page), (job.token_start, job.token_end)
        with self._written:
            self._written.wait_for(lambda: key not in self._writing)
            if self.finished or self._level.get(key, 0) >= level:
                return
            if on_page is None and job.layer not in self.k:
                shape = (self.num_kv_heads, self.num_tokens, self.head_dim)
                self.k[job.layer] = torch.empty(shape, dtype=self.dtype)
                self.v[job.layer] = torch.empty(shape, dtype=self.dtype)
            self._writing[key] = threading.get_ident()
        written = False
        try:
            if on_page is not None:
                stage = ("full" if level == 2 else "anchor") if self._two_stream \
                    else self.codec.stages[-1]
                on_page(self.request_id, job.layer, s, e, k, v, stage)
            else:
                self.k[job.layer][:, s:e] = k
                self.v[job.layer][:, s:e] = v
            written = True
        finally:
            with self._written:
                del self._writing[key]
                self._written.notify_all()
                if written and not self.finished:  # failed meanwhile: nothing to count
                    if level == 2:
                        self._stored.pop(key, None)
                    self._raise_level(job.layer, job.page, s, e, level)

    def _raise_level(self, layer: int, page: int, start: int, end: int, level: int) -> None:
        """Count the page's tokens at its new level; set the events when a stage completes.
        Called with the lock held."""
        old = self._level.get((layer, page), 0)
        if level <= old:
            return
        self._level[(layer, page)] = level
        n = end - start
        if old == 0:
            self._anchor_tokens[layer] += n
            if self._anchor_tokens[layer] == self.num_tokens:
                self._layers_anchor += 1
        if level == 2:
            self._full_tokens[layer] += n
            if self._full_tokens[layer] == self.num_tokens:
                self._layers_full += 1
        now = time.monotonic()
        if self._layers_anchor == self.num_layers and self.anchor_ready_at is None:
            self.anchor_ready_at = now
            self.anchor_ready.set()
        if self._layers_full == self.num_layers and self.residual_ready_at is None:
            self.residual_ready_at = now
            self._stored.clear()
            self.residual_ready.set()


def _describe(meta: tuple) -> str:
    codec_id, params, layers, tokens, dtype, heads, dim = meta
    return (f"codec {codec_id} {params.decode(errors='replace')}, {layers} layers, {tokens} "
            f"tokens, dtype code {dtype}, {heads}x{dim}")
