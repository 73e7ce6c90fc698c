"""Decode-side state of each Lynx request, shared by the connector's scheduler half (which
records what the workers report) and the Lynx scheduler (which acts on it). Plain Python.

The draft bookkeeping itself is :class:`lynx_npu.speculative.DraftState`; this adds what vLLM needs
around it: which transfer the request loads, how many tensor-parallel ranks have the refined
KV in place, why a residual was lost, and the timestamps reported back to the client.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from lynx_npu.speculative import DraftState, Phase

from .messages import LoadReport, RefineReport


@dataclass
class LynxDecodeRequest:
    req_id: str
    transfer_id: int                  # the client's (reported back)
    transfer_key: int                 # what the KV travels under (TransferParams.key)
    world_size: int
    drafts: DraftState
    load_requested: bool = False      # blocks allocated and the load sent to the workers
    loaded: LoadReport | None = None  # anchor (or full KV) in the paged cache, all ranks
    refined_ranks: int = 0            # ranks whose cache holds the full-precision prompt KV
    refine: RefineReport | None = None
    lost: str | None = None           # the residual will not come: recompute locally
    stop_parked: bool = False         # a draft met a stop condition: wait for the residual
    grammar_steps: int = 0            # drafts the request's grammar advanced by (structured
    #                                   output): rolled back before verification
    draft_times: list[float] = field(default_factory=list)   # monotonic time of each draft
    verified_at: float | None = None
    # Generation time of every token the client got: an accepted draft counts from when it was
    # drafted (the paper's time-to-k-th-token), every other token from when it was sampled.
    token_times: list[float] = field(default_factory=list)

    @property
    def phase(self) -> Phase:
        return self.drafts.phase

    @property
    def residual_in_cache(self) -> bool:
        return self.refined_ranks >= self.world_size

    def on_load_report(self, report: LoadReport) -> None:
        self.loaded = report if self.loaded is None else self.loaded
        if report.stage == "full":
            self.refined_ranks += report.count
            self.refine = self.refine or RefineReport(report.anchor_ready_at, report.loaded_at,
                                                       report.count)

    def on_refine_report(self, report: RefineReport) -> None:
        self.refined_ranks += report.count
        self.refine = report if self.refine is None else self.refine

    def start_decoding(self) -> None:
        """The anchor is in the cache: draft, or decode exactly if the residual is too."""
        if self.residual_in_cache:
            self.drafts.on_residual_ready()
        self.drafts.on_anchor_ready()
        if self.drafts.phase is Phase.VERIFY and not self.drafts.drafts:
            self.start_decoding_exact()

    def start_decoding_exact(self) -> None:
        """The full-precision KV is in before any draft: nothing to verify. DraftState has no
        transition for this (spec/drafts.py), so the phase is set here."""
        self.drafts.residual_ready = True
        self.drafts.phase = Phase.EXACT

    def stats(self) -> dict:
        """What the client gets in the final output's kv_transfer_params["lynx"]."""
        s = self.drafts.stats
        out = {"transfer_id": self.transfer_id, "phase": self.phase.value,
               "drafts_proposed": s.proposed, "drafts_accepted": s.accepted,
               "verifications": s.verifications, "draft_times": list(self.draft_times),
               "token_times": list(self.token_times), "verified_at": self.verified_at,
               "residual_lost": self.lost, "reported_at": time.monotonic()}
        if self.loaded is not None:
            out.update(stage=self.loaded.stage, first_frame_at=self.loaded.first_frame_at,
                       first_frame_bytes=self.loaded.first_frame_bytes,
                       early_start=self.loaded.early,
                       anchor_ready_at=self.loaded.anchor_ready_at,
                       loaded_at=self.loaded.loaded_at, decoded_by=self.loaded.decoded_by)
        if self.refine is not None:
            if self.refine.anchor_ready_at is not None:  # the anchor's own time, also
                out["anchor_ready_at"] = self.refine.anchor_ready_at  # when started early
            out.update(residual_ready_at=self.refine.residual_ready_at,
                       refined_at=self.refine.refined_at)
        return out


def new_decode_request(req_id: str, transfer_id: int, transfer_key: int, world_size: int,
                       max_drafts: int) -> LynxDecodeRequest:
    return LynxDecodeRequest(req_id, transfer_id, transfer_key, world_size,
                             DraftState(req_id, max_drafts=max_drafts))
