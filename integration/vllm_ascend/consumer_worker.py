"""Decode side, in each worker: receive the split stream, decode each page straight into the paged
cache, report the anchor as vLLM's async load and the refine afterwards.

The receiver's threads verify pages and hand them, still encoded, to a :class:`PageInbox`
(never touching the cache). Every engine step, at ``bind``, the worker forgets the requests the
scheduler released, then starts one job on a background thread that decodes the pages waiting
in the inbox into their blocks with the request's page serde (lynx_npu.ops: one kernel launch
per layer and stage, on the cache's device); ``finish_step`` (after the step's forward) joins
it and reports. So a job never outlives its step: the scheduler frees a request's blocks only
between steps and names it at the next ``bind``, and no late write can land in a reused block.
Because pages are decoded as they arrive, little is left when the anchor (or residual) completes.

A refine overlaps the step's forward; drafts that read a half-refined block are only different
drafts, never wrong output: the refine is reported only once every full-precision page is
written, and verification runs after that. A residual that completes while a forward runs
starts its refine at that forward's next layer wait (``wait_for_layer``), or after its last
one at ``finish_step``, as a job of the same step, so the scheduler hears of it a step sooner.

Several requests can load one transfer: the samples of one prompt (``n > 1``) share its
transfer key (``TransferParams.key``). Each page is then decoded into every one's blocks, from
one read of the stream's state per step, so all of them see the same stages. A request that
comes after the transfer's first pages were decoded (or after one of them was started early)
cannot be given those pages again and recomputes its prompt locally.
"""
from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import threading
import time
from dataclasses import dataclass

from lynx_npu.ops import PagedKVCache, WirePage

from .config import LynxConnectorConfig
from .messages import LoadJob, LoadReport, LynxWorkerMeta, RefineReport
from .transports import make_receiver
from .vllm_compat import get_logger

log = get_logger(__name__)
Page = tuple[int, WirePage]   # (layer, page)
# A request started early waits for its anchor's layers at most this many early_start_s after
# its first forward began: a stalled link costs the engine one bounded wait, not a hung step.
_EARLY_WAIT_FACTOR = 4
# Transfers whose pages wait for a request at most (the receiver keeps as many finished ones:
# ReceiverConfig.max_finished_requests); older ones are dropped first.
_MAX_WAITING = 256


def _first_frame(handle) -> tuple[float, int]:
    """(arrival time, wire bytes) of a transfer's first frame: its pages are the first entries
    of ``arrivals``, appended together at one time (receive_state.admit)."""
    if not handle.arrivals:
        return handle.created_at, 0
    first = handle.arrivals[0][0]
    return first, sum(a[4] for a in itertools.takewhile(lambda a: a[0] == first,
                                                        handle.arrivals))


class PageInbox:
    """Received (encoded) pages per transfer, the latest stage of each page only, until
    decoded into the cache or dropped.

    A transfer's pages may come before any request follows it (the decode request still
    queued), so they wait here; ``sweep`` drops those that no request followed within a time
    limit, and the oldest beyond a count: a request that never comes (finished or refused
    before its load, a broken or hostile sender) must not hold host memory for good."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pages: dict[int, dict[tuple[int, int], WirePage]] = {}
        self._first: dict[int, float] = {}   # first page's arrival (monotonic), until closed
        # closed transfers (oldest first): late pages of them are dropped
        self._closed: collections.OrderedDict[int, None] = collections.OrderedDict()

    def on_page(self, transfer_id: int, layer: int, page: WirePage, stage: str) -> None:
        with self._lock:
            if transfer_id not in self._closed:
                self._first.setdefault(transfer_id, time.monotonic())
                self._pages.setdefault(transfer_id, {})[(layer, page.token_start)] = page

    def take_layer(self, transfer_id: int, layer: int) -> list[Page]:
        with self._lock:
            pages = self._pages.get(transfer_id, {})
            return [(layer, pages.pop(key)) for key in [k for k in pages if k[0] == layer]]

    def take(self, transfer_id: int) -> list[Page]:
        with self._lock:
            pages = self._pages.pop(transfer_id, {})
        return [(layer, p) for (layer, _), p in pages.items()]

    def num_transfers(self) -> int:
        """Transfers with pages waiting to be decoded."""
        with self._lock:
            return len(self._pages)

    def close(self, transfer_id: int) -> None:
        with self._lock:
            self._close(transfer_id)

    def sweep(self, followed, now: float, max_age_s: float,
              max_waiting: int) -> list[tuple[int, str]]:
        """Close the transfers no request follows whose first page came more than
        ``max_age_s`` ago, and the oldest beyond ``max_waiting`` of them. -> [(id, why)]"""
        with self._lock:
            waiting = sorted((t, rid) for rid, t in self._first.items() if rid not in followed)
            young = [rid for t, rid in waiting if now - t <= max_age_s]
            dropped = [(rid, f"no request loaded it within {max_age_s:g} s")
                       for t, rid in waiting if now - t > max_age_s]
            dropped += [(rid, f"{max_waiting} newer transfers wait for their requests")
                        for rid in young[:max(0, len(young) - max_waiting)]]
            for rid, _ in dropped:
                self._close(rid)
        return dropped

    def _close(self, transfer_id: int) -> None:
        self._pages.pop(transfer_id, None)
        self._first.pop(transfer_id, None)
        self._closed[transfer_id] = None
        self._closed.move_to_end(transfer_id)
        while len(self._closed) > 4096:
            self._closed.popitem(last=False)


@dataclass
class _Transfer:
    job: LoadJob
    handle: object                     # lynx_npu.transport.ReceiveHandle
    stage: str = "waiting"             # waiting -> anchor (drafting) -> dropped
    anchor_ready_at: float | None = None
    decoded_by: str = ""               # the backend that decoded its pages into the cache
    # Started early (``early_start_s``): until every anchor page is in the cache, a forward
    # that runs it waits for each layer's anchor before reading the layer (wait_for_layer),
    # until ``early_deadline`` (set by the first such forward).
    early: bool = False
    early_deadline: float | None = None
    anchor_in_at_poll: bool = False    # the whole anchor had arrived when this step began


@dataclass
class _Stream:
    """One transfer and the requests that load it (more than one: samples of one prompt)."""
    handle: object                     # lynx_npu.transport.ReceiveHandle
    followers: list[str]
    taken: bool = False                # pages were taken from the inbox: a new follower would
    #                                    miss them


@dataclass(frozen=True)
class _State:
    """A stream's state, read once per step for all its requests (before its pages are taken:
    a stage's pages are all in the inbox before its event is set)."""
    anchor: bool
    full: bool
    error: object
    residual_error: object


class ConsumerWorker:
    def __init__(self, config: LynxConnectorConfig, rank: int, world_size: int):
        self.config, self.rank, self.world_size = config, rank, world_size
        self.inbox = PageInbox()
        self.receiver = make_receiver(config, rank, self.inbox.on_page)  # tcp or mooncake
        self.kv: PagedKVCache | None = None
        self.decoded_by: set[str] = set()   # the backends that decoded pages (logged once)
        self._transfers: dict[str, _Transfer] = {}
        self._streams: dict[int, _Stream] = {}   # by transfer key
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lynx-copy")
        self._jobs: list[tuple[str, str, concurrent.futures.Future]] = []
        self._meta = LynxWorkerMeta()
        self._finished_recving: set[str] = set()
        self._failed_recving: set[str] = set()
        self._early_now: list[str] = []   # this step's requests started before their anchor
        # transfers dropped before any request followed them, and why (a late request for one
        # recomputes at once instead of waiting out its transfer timeout)
        self._dropped: collections.OrderedDict[int, str] = collections.OrderedDict()

    @property
    def port(self) -> int:
        return self.receiver.port

    @property
    def receiver_active_requests(self) -> int:
        """Receiver slots held now (transfers in progress); the stats' gauge of that name. The
        Mooncake receiver keeps no slot count: there, the transfers this worker follows."""
        n = getattr(self.receiver, "num_active_requests", None)
        return len(self._streams) if n is None else n

    def leak_state(self) -> dict:
        """What this worker still holds for Lynx requests (all empty when none is in flight):
        receiver slots, transfers followed, pages waiting in the inbox, copy jobs."""
        return {"receiver_active_requests": self.receiver_active_requests,
                "transfers": {rid: t.stage for rid, t in self._transfers.items()},
                "streams": {key: list(s.followers) for key, s in self._streams.items()},
                "inbox": self.inbox.num_transfers(), "jobs": len(self._jobs)}

    def register(self, kv: PagedKVCache) -> None:
        self.kv = kv

    # -- per step ------------------------------------------------------------------------------
    def bind(self, loads: list[LoadJob], releases: list[str],
             scheduled_early: list[str] = (), discards: list[int] = ()) -> None:
        """One engine step: ``scheduled_early`` are the requests in this step's forward that
        were reported loaded before their whole anchor was in; ``discards`` the transfers
        whose requests finished without loading them."""
        for req_id in releases:
            self._drop(req_id, report_recving=True)
        for key in discards:
            if key not in self._streams:
                self._discard(key, "its request finished without loading it", logging.INFO)
        for job in loads:
            log.debug("Lynx: %s waits for transfer %d (%d tokens)", job.req_id, job.transfer_id,
                      job.num_tokens)
            self._follow(job)
        self._poll()
        self._early_now = [rid for rid in scheduled_early
                           if rid in self._transfers and self._transfers[rid].early]

    def wait_for_layer(self, layer: int) -> None:
        """Before this step's forward reads ``layer``: the anchor pages of that layer of every
        request started early are in the cache. A layer still missing at the request's
        ``early_deadline`` means a stalled link: the request is lost (recomputed locally), as
        after any transfer failure past the anchor; this forward goes on."""
        for req_id in self._early_now:
            t = self._transfers.get(req_id)
            if t is None or not t.early:
                continue
            now = time.monotonic()
            if t.early_deadline is None:
                t.early_deadline = now + _EARLY_WAIT_FACTOR * self.config.early_start_s
            left = t.early_deadline - now
            if not (t.handle.wait_layer_anchor(layer, left) if left > 0
                    else t.handle.layer_anchor_in(layer)):
                # The anchor stalled after the request was scheduled: what this forward drafts
                # would read blocks never written (stale KV, which a draft may even match), so
                # the request recomputes locally, as for any transfer lost after its anchor.
                self._lose(req_id, f"layer {layer}'s anchor was not in "
                                   f"{_EARLY_WAIT_FACTOR * self.config.early_start_s:g} s after "
                                   f"the request was started early ({t.handle.progress()})")
                continue
            for rid, _, fut in self._jobs:  # this step's earlier pages of the request
                if rid == req_id:
                    fut.exception()  # applied at finish_step
            pages = self.inbox.take_layer(t.job.transfer_id, layer)
            if not pages:
                continue
            self._streams[t.job.transfer_id].taken = True
            error = self._pool.submit(self._write, t.job, t.handle.serde, t.handle.dtype,
                                      pages).exception()
            if error is not None:
                self._lose(req_id, f"writing transfer {t.job.transfer_id} into the cache "
                                   f"failed: {error}")
        self._refine_in_step()

    def _refine_in_step(self, skip: set[str] = frozenset()) -> None:
        """A residual that completed during this step's forward starts its refine now, as a job
        of this step (joined at its finish_step like every other), not at the next step's
        bind: the scheduler can verify one step sooner (docs/demo.md, 2026-11-30: residual ->
        verified took four ~0.17 s steps). Only drafting requests alone on their stream, not
        those in ``skip`` (finished in this step)."""
        for key, stream in self._streams.items():
            h = stream.handle
            if len(stream.followers) != 1 or not h.residual_ready.is_set():
                continue
            req_id = stream.followers[0]
            if req_id in skip:
                continue
            t = self._transfers.get(req_id)
            if t is None or t.stage != "anchor" or any(
                    rid == req_id and what == "refine" for rid, what, _ in self._jobs):
                continue
            state = _State(True, True, h.error, h.residual_ready.error)  # full before pages
            self._poll_one(req_id, t, state, self.inbox.take(key), time.monotonic())

    def finish_step(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        """Join this step's copy jobs and apply their results; returns (finished_recving,
        failed_recving) for vLLM. A residual that completed after the forward's last layer
        wait refines here, joined at once: what is left is the pages that came since this
        step's bind (the rest were decoded as they came), and the scheduler hears of it a
        step sooner."""
        self._refine_in_step(skip=finished_req_ids)
        jobs, self._jobs = self._jobs, []
        for req_id, what, fut in jobs:
            error = fut.exception()
            self._finish_copy(req_id, what, error, "" if error else fut.result())
        for req_id in finished_req_ids:
            self._drop(req_id, report_recving=True)
        for t in self._transfers.values():
            if t.early and t.anchor_in_at_poll:
                t.early = False  # every anchor page was taken into this step's jobs: done
        done, failed = self._finished_recving, self._failed_recving
        self._finished_recving, self._failed_recving = set(), set()
        return done, failed

    def take_meta(self) -> LynxWorkerMeta | None:
        meta, self._meta = self._meta, LynxWorkerMeta()
        return None if meta.empty() else meta

    # -- internals -----------------------------------------------------------------------------
    def _follow(self, job: LoadJob) -> None:
        dropped = self._dropped.get(job.transfer_id)
        if dropped is not None:   # its pages are gone: waiting would only time out
            self._fail_load(job.req_id, f"transfer {job.transfer_id} was dropped ({dropped})")
            return
        stream = self._streams.get(job.transfer_id)
        if stream is None:
            stream = self._streams[job.transfer_id] = _Stream(
                self.receiver.request(job.transfer_id), [])
        stream.followers.append(job.req_id)
        self._transfers[job.req_id] = _Transfer(job, stream.handle)
        if stream.taken or any(self._transfers[rid].early or self._transfers[rid].stage != "waiting"
                               for rid in stream.followers[:-1]):
            self._fail_load(job.req_id, f"transfer {job.transfer_id} is already being decoded "
                                        f"into another request's blocks (a sample of the same "
                                        f"prompt that started first)")

    def _poll(self) -> None:
        now = time.monotonic()
        for key, why in self.inbox.sweep(self._streams, now, self.config.transfer_timeout_s,
                                         _MAX_WAITING):
            self._discard(key, why)
        for key, stream in list(self._streams.items()):
            h = stream.handle
            full = h.residual_ready.is_set()   # first: a full stream has its anchor
            state = _State(h.anchor_ready.is_set(), full, h.error, h.residual_ready.error)
            pages = self.inbox.take(key)
            stream.taken = stream.taken or bool(pages)
            for req_id in list(stream.followers):
                self._poll_one(req_id, self._transfers[req_id], state, pages, now)

    def _poll_one(self, req_id: str, t: _Transfer, state: _State, pages: list[Page],
                  now: float) -> None:
        h = t.handle
        if t.stage == "waiting":
            # No drafting allowed (max_drafts 0): start only on the full-precision KV.
            ready = state.anchor and (state.full or not t.job.wait_full)
            if not ready and state.error is not None:
                self._fail_load(req_id, f"transfer failed before its anchor: {state.error}")
                return
            what = ("full" if state.full else "anchor") if ready else (
                "early" if self._may_start_early(t, now) else "progress")
        else:
            t.anchor_in_at_poll = state.anchor
            if not state.full and state.residual_error is not None:
                self._lose(req_id, f"residual transfer failed: {state.residual_error}")
                return
            if not state.full and now - t.anchor_ready_at > self.config.residual_timeout_s:
                self._lose(req_id, f"residual not complete {self.config.residual_timeout_s}"
                                   f" s after the anchor ({h.progress()})")
                return
            what = "refine" if state.full else "progress"
        error = None if what == "progress" else self._mismatch(t.job, h)
        if error is not None:
            if what == "refine":
                self._lose(req_id, error)
            else:
                self._fail_load(req_id, error)
            return
        if pages or what != "progress":
            self._jobs.append((req_id, what, self._pool.submit(self._write, t.job, h.serde,
                                                               h.dtype, pages)))

    def _mismatch(self, job: LoadJob, h) -> str | None:
        """Why the transfer cannot fill the request's blocks, or None: the sender's frames
        say how many tokens, layers, KV heads and head size it carries; they must be the
        request's tokens and the cache's shape (fewer layers would leave the others holding
        what the blocks held before; other heads of the same page size would scramble them)."""
        if h.num_tokens != job.num_tokens:
            return (f"transfer {job.transfer_id} carries {h.num_tokens} tokens, the "
                    f"request expects {job.num_tokens}")
        kv = self.kv
        if kv is not None and (h.num_layers, h.num_kv_heads, h.head_dim) != (
                kv.num_layers, kv.num_kv_heads, kv.head_size):
            return (f"transfer {job.transfer_id} carries {h.num_layers} layers of "
                    f"{h.num_kv_heads} KV heads x {h.head_dim}, the cache has "
                    f"{kv.num_layers} layers of {kv.num_kv_heads} KV heads x {kv.head_size}")
        return None

    def _may_start_early(self, t: _Transfer, now: float) -> bool:
        """A split-stream transfer whose anchor is expected within ``early_start_s``: its
        request may be scheduled now, its first forward waiting layer by layer for the rest."""
        h = t.handle
        if (self.config.early_start_s <= 0 or t.job.wait_full or not h.two_stream
                or len(self._streams[t.job.transfer_id].followers) > 1):
            return False  # (a shared stream's pages go to all its requests in whole steps)
        # Not before half of it is in: the link's first burst (a paced sender's bucket
        # starts full) makes the early rate look far higher than the link's.
        if h.anchor_share() < 0.5:
            return False
        eta = h.anchor_eta(now)
        return eta is not None and eta <= self.config.early_start_s

    def _write(self, job: LoadJob, serde, wire_dtype, pages: list[Page]) -> str:
        """Runs on the copy thread; touches only this request's blocks: every layer's waiting
        pages decoded into the cache in one call of the request's serde."""
        if self.kv is None:
            raise RuntimeError("KV caches were never registered with the Lynx connector")
        if not pages:
            return ""
        for _, p in pages:
            if p.token_end > job.num_tokens:
                raise ValueError(f"page [{p.token_start}, {p.token_end}) is beyond the "
                                 f"request's {job.num_tokens} tokens")
        slots = self.kv.slots(job.block_ids, 0, job.num_tokens)
        by_layer: dict[int, list[WirePage]] = {}
        for layer, p in pages:
            by_layer.setdefault(layer, []).append(p)
        used = serde.decode_layers(by_layer, self.kv, slots, wire_dtype)
        if used not in self.decoded_by:
            self.decoded_by.add(used)
            log.info("Lynx: %s pages decode into the %s cache on %s with %r", serde.name,
                     self.kv.layout.name, self.kv.device, used)
        return used

    def _finish_copy(self, req_id: str, what: str, error: BaseException | None,
                     decoded_by: str) -> None:
        t = self._transfers.get(req_id)
        if t is None:
            return
        t.decoded_by = decoded_by or t.decoded_by
        if error is not None:
            why = f"writing transfer {t.job.transfer_id} into the cache failed: {error}"
            if t.stage == "anchor":
                self._lose(req_id, why)
            else:
                self._fail_load(req_id, why)
            return
        if what == "progress":
            return
        h, now = t.handle, time.monotonic()
        log.debug("Lynx: %s %s in the cache (transfer %d)", req_id, what, t.job.transfer_id)
        if what == "refine":
            self._meta.refined[req_id] = RefineReport(h.residual_ready_at, now,
                                                      anchor_ready_at=h.anchor_ready_at)
            self._drop(req_id)
            return
        first, first_bytes = _first_frame(h)
        # Started early, the anchor may be complete by now, yet pages that came after this
        # step began wait in the inbox: the first forward still takes them layer by layer.
        early = what == "early"
        anchor_at = h.anchor_ready_at or now
        self._meta.loaded[req_id] = LoadReport("full" if what == "full" else "anchor", first,
                                               anchor_at, now, decoded_by=t.decoded_by,
                                               first_frame_bytes=first_bytes, early=early)
        self._finished_recving.add(req_id)
        if what == "full":
            self._drop(req_id)
        else:
            t.stage, t.anchor_ready_at = "anchor", anchor_at
            t.early = early

    def _fail_load(self, req_id: str, why: str) -> None:
        """Before the anchor: vLLM recomputes the prompt (kv_load_failure_policy=recompute);
        ``why`` reaches the request's statistics (``residual_lost``)."""
        log.warning("Lynx: request %s: %s; recomputing it locally", req_id, why)
        self._meta.lost[req_id] = why
        self._failed_recving.add(req_id)
        self._finished_recving.add(req_id)
        self._drop(req_id)

    def _lose(self, req_id: str, why: str) -> None:
        log.warning("Lynx: request %s falls back to local recompute: %s", req_id, why)
        self._meta.lost[req_id] = why
        self._drop(req_id)

    def _drop(self, req_id: str, report_recving: bool = False) -> None:
        t = self._transfers.pop(req_id, None)
        if t is None:
            return
        if report_recving and t.stage == "waiting":
            # vLLM holds a waiting request's blocks until its load is reported finished.
            self._finished_recving.add(req_id)
        key = t.job.transfer_id
        stream = self._streams[key]
        stream.followers.remove(req_id)
        if not stream.followers:
            del self._streams[key]
            self.inbox.close(key)
            self.receiver.release(key)

    def _discard(self, key: int, why: str, level: int = logging.WARNING) -> None:
        """Free a transfer no request follows: its pages, its receiver slot (late frames of it
        are acknowledged and dropped)."""
        log.log(level, "Lynx: transfer %d dropped: %s", key, why)
        self.inbox.close(key)
        self.receiver.release(key)
        self._dropped[key] = why
        while len(self._dropped) > 4096:
            self._dropped.popitem(last=False)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.receiver.close()
