"""What the Lynx connector's two halves tell each other every engine step.

Scheduler -> workers: :class:`LynxConnectorMeta` (KV to save and send, KV to load, requests to
forget). Workers -> scheduler: :class:`LynxWorkerMeta`, vLLM's worker-to-scheduler channel
(``build_connector_worker_meta``). The residual stream is reported here and not as a second
``finished_recving``, which vLLM only accepts for waiting requests (DESIGN §8). Under tensor
parallelism each rank reports once; ``aggregate`` sums the ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import TransferParams
from .vllm_compat import KVConnectorMetadata, KVConnectorWorkerMetadata


@dataclass(frozen=True)
class SaveJob:
    """Producer: the prompt of ``req_id`` is complete in ``block_ids``; send ``num_tokens``."""

    req_id: str
    params: TransferParams
    block_ids: tuple[int, ...]
    num_tokens: int


@dataclass(frozen=True)
class LoadJob:
    """Consumer: load ``num_tokens`` of transfer ``transfer_id`` into ``block_ids``."""

    req_id: str
    transfer_id: int
    block_ids: tuple[int, ...]
    num_tokens: int
    wait_full: bool = False   # no drafting allowed: load only the full-precision KV


@dataclass
class LynxConnectorMeta(KVConnectorMetadata):
    saves: list[SaveJob] = field(default_factory=list)
    loads: list[LoadJob] = field(default_factory=list)
    # Requests the scheduler let go of (finished, preempted, recomputing): the worker drops
    # their transfers and never writes their blocks again (the blocks may be reused now).
    releases: list[str] = field(default_factory=list)
    # This step's requests that were reported loaded before their whole anchor was in: the
    # workers make each layer's anchor wait for the forward (wait_for_layer_load).
    scheduled_early: list[str] = field(default_factory=list)
    # Transfer keys whose requests finished without loading them (refused the load: prompt
    # logprobs; aborted while queued): the workers drop their pages and receiver slots.
    discards: list[int] = field(default_factory=list)


@dataclass
class LoadReport:
    stage: str              # "anchor" (drafting starts) or "full" (exact from the start)
    first_frame_at: float   # time.monotonic() of the first frame's arrival
    anchor_ready_at: float
    loaded_at: float        # the anchor (or full KV) is in the paged cache
    count: int = 1          # ranks reporting
    decoded_by: str = ""    # the page serde's backend that wrote it (ops backend name)
    first_frame_bytes: int = 0  # wire bytes of that first frame (paced whole on a paced link)
    early: bool = False     # reported before the whole anchor was in (early_start_s)


@dataclass
class RefineReport:
    residual_ready_at: float
    refined_at: float       # the full-precision KV is in the paged cache (writes complete)
    count: int = 1
    anchor_ready_at: float | None = None  # when the whole anchor was in (a request started
                                          # early was reported loaded before that)


@dataclass
class LynxWorkerMeta(KVConnectorWorkerMetadata):
    loaded: dict[str, LoadReport] = field(default_factory=dict)
    refined: dict[str, RefineReport] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)    # req_id -> why the residual is lost

    def empty(self) -> bool:
        return not (self.loaded or self.refined or self.lost)

    def aggregate(self, other: "LynxWorkerMeta") -> "LynxWorkerMeta":
        out = LynxWorkerMeta(dict(self.loaded), dict(self.refined), dict(self.lost))
        for rid, rep in other.loaded.items():
            mine = out.loaded.get(rid)
            first = min(mine, rep, key=lambda r: r.first_frame_at) if mine else rep
            out.loaded[rid] = rep if mine is None else LoadReport(
                "anchor" if "anchor" in (mine.stage, rep.stage) else "full",
                first.first_frame_at,
                max(mine.anchor_ready_at, rep.anchor_ready_at),
                max(mine.loaded_at, rep.loaded_at), mine.count + rep.count,
                mine.decoded_by or rep.decoded_by, first.first_frame_bytes,
                mine.early or rep.early)
        for rid, rep in other.refined.items():
            mine = out.refined.get(rid)
            anchors = [r.anchor_ready_at for r in (mine, rep) if r and r.anchor_ready_at]
            out.refined[rid] = rep if mine is None else RefineReport(
                max(mine.residual_ready_at, rep.residual_ready_at),
                max(mine.refined_at, rep.refined_at), mine.count + rep.count,
                max(anchors) if anchors else None)
        for rid, why in other.lost.items():
            out.lost.setdefault(rid, why)
        return out
