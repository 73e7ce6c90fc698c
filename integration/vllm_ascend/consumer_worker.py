"""Decode side, in each worker: receive the split stream, put the anchor into the paged cache
(vLLM's async load), later refine it in place to full precision, and report both.

Every step: at ``bind`` the worker forgets the requests the scheduler released, polls the
receiver, and starts copy jobs on a background thread (anchor -> blocks when ``anchor_ready``;
full KV -> blocks when ``residual_ready``); in ``finish_step`` (after the step's forward) it
joins them and reports. A job therefore never outlives the step it started in: the scheduler
frees a request's blocks only between steps and tells the worker at the next ``bind``, so no
late write can land in a reused block. A refine overlaps the step's forward; drafts that read a
half-refined block are only different drafts, never wrong output (the refined values are
reported only once every write is done, and verification runs after that).
"""
from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass

from lynx_npu.transport import Receiver, ReceiverConfig

from .config import LynxConnectorConfig
from .kv_cache_io import PagedKV
from .page_decoder import accelerate
from .messages import LoadJob, LoadReport, LynxWorkerMeta, RefineReport
from .vllm_compat import get_logger

log = get_logger(__name__)


@dataclass
class _Transfer:
    job: LoadJob
    handle: object                     # lynx_npu.transport.ReceiveHandle
    stage: str = "waiting"             # waiting -> anchor (drafting) -> done
    anchor_ready_at: float | None = None
    busy: bool = False                 # a copy job of this step touches its blocks


class _Receiver(Receiver):
    """The transport's receiver, decoding Lynx pages with lynx_npu.ops (page_decoder.py).

    Overrides the receiver's codec construction (``_codec``), which has no public hook yet."""

    def _codec(self, codec_id, params):
        return accelerate(super()._codec(codec_id, params))


class ConsumerWorker:
    def __init__(self, config: LynxConnectorConfig, rank: int, world_size: int):
        self.config, self.rank, self.world_size = config, rank, world_size
        self.receiver = (_Receiver if config.fast_decode else Receiver)(ReceiverConfig(
            host=config.host, port=config.port + rank if config.port else 0,
            deadline_s=config.transfer_timeout_s, num_decode_threads=config.num_decode_threads,
            secret=config.secret_bytes))
        self.kv: PagedKV | None = None
        self._transfers: dict[str, _Transfer] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lynx-copy")
        self._jobs: list[tuple[str, str, concurrent.futures.Future]] = []
        self._meta = LynxWorkerMeta()
        self._finished_recving: set[str] = set()
        self._failed_recving: set[str] = set()

    @property
    def port(self) -> int:
        return self.receiver.port

    def register(self, kv: PagedKV) -> None:
        self.kv = kv

    # -- per step ------------------------------------------------------------------------------
    def bind(self, loads: list[LoadJob], releases: list[str]) -> None:
        for req_id in releases:
            self._drop(req_id, report_recving=True)
        for job in loads:
            log.debug("Lynx: %s waits for transfer %d (%d tokens)", job.req_id, job.transfer_id,
                      job.num_tokens)
            handle = self.receiver.request(job.transfer_id)
            self._transfers[job.req_id] = _Transfer(job, handle)
        self._poll()

    def finish_step(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        """Join this step's copy jobs and apply their results; returns (finished_recving,
        failed_recving) for vLLM."""
        jobs, self._jobs = self._jobs, []
        for req_id, what, fut in jobs:
            error = fut.exception()
            self._finish_copy(req_id, what, error)
        for req_id in finished_req_ids:
            self._drop(req_id, report_recving=True)
        done, failed = self._finished_recving, self._failed_recving
        self._finished_recving, self._failed_recving = set(), set()
        return done, failed

    def take_meta(self) -> LynxWorkerMeta | None:
        meta, self._meta = self._meta, LynxWorkerMeta()
        return None if meta.empty() else meta

    # -- internals -----------------------------------------------------------------------------
    def _poll(self) -> None:
        now = time.monotonic()
        for req_id, t in list(self._transfers.items()):
            h = t.handle
            if t.stage == "waiting":
                full = h.residual_ready.is_set()
                # No drafting allowed (max_drafts 0): start only on the full-precision KV.
                if h.anchor_ready.is_set() and (full or not t.job.wait_full):
                    self._start(req_id, t, "full" if full else "anchor")
                elif h.error is not None:
                    log.warning("Lynx: transfer %d for %s failed before its anchor: %s",
                                t.job.transfer_id, req_id, h.error)
                    self._failed_recving.add(req_id)
                    self._finished_recving.add(req_id)
                    self._drop(req_id)
            elif t.stage == "anchor" and not t.busy:
                if h.residual_ready.is_set():
                    self._start(req_id, t, "refine")
                elif h.residual_ready.error is not None:
                    self._lose(req_id, f"residual transfer failed: {h.residual_ready.error}")
                elif now - (t.anchor_ready_at or now) > self.config.residual_timeout_s:
                    self._lose(req_id, f"residual not complete {self.config.residual_timeout_s}"
                                       f" s after the anchor ({h.progress()})")

    def _start(self, req_id: str, t: _Transfer, what: str) -> None:
        if self.kv is None:
            raise RuntimeError("KV caches were never registered with the Lynx connector")
        if t.handle.num_tokens != t.job.num_tokens:
            self._finish_copy(req_id, what, ValueError(
                f"transfer {t.job.transfer_id} carries {t.handle.num_tokens} tokens, the "
                f"request expects {t.job.num_tokens}"))
            return
        t.busy = True
        self._jobs.append((req_id, what, self._pool.submit(self._copy, t)))

    def _copy(self, t: _Transfer) -> None:
        """Runs on the copy thread; touches only the request's blocks and its handle."""
        slots = self.kv.slots(t.job.block_ids, 0, t.job.num_tokens)
        for layer in range(self.kv.num_layers):
            self.kv.scatter(layer, slots, t.handle.k[layer], t.handle.v[layer])

    def _finish_copy(self, req_id: str, what: str, error: BaseException | None) -> None:
        t = self._transfers.get(req_id)
        if t is None:
            return
        t.busy = False
        h = t.handle
        if error is not None:
            log.warning("Lynx: loading transfer %d (%s) for %s failed: %s", t.job.transfer_id,
                        what, req_id, error)
            if what == "refine":
                self._lose(req_id, f"refine failed: {error}")
            else:
                self._failed_recving.add(req_id)
                self._finished_recving.add(req_id)
                self._drop(req_id)
            return
        now = time.monotonic()
        log.debug("Lynx: %s %s in the cache (transfer %d)", req_id, what, t.job.transfer_id)
        if what == "refine":
            self._meta.refined[req_id] = RefineReport(h.residual_ready_at, now)
            self._drop(req_id)
            return
        first = h.arrivals[0][0] if h.arrivals else h.created_at
        t.anchor_ready_at = h.anchor_ready_at
        self._meta.loaded[req_id] = LoadReport(what, first, h.anchor_ready_at, now)
        self._finished_recving.add(req_id)
        if what == "full":
            self._drop(req_id)
        else:
            t.stage = "anchor"

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
        self.receiver.release(t.job.transfer_id)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.receiver.close()
