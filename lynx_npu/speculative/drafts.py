"""Per-request draft bookkeeping on the decode side: plain Python, no device code.

Lifecycle (DESIGN §6):
    WAITING_ANCHOR --anchor_ready--> DRAFTING --residual_ready--> VERIFY --verified--> EXACT
In DRAFTING every generated token is a draft (never emitted); at ``max_drafts`` the request
parks until the residual lands. ``verify`` applies an acceptance verdict and returns the tokens
that may now reach the client. A residual that cannot be had turns the request to RECOMPUTE:
its drafts are dropped and decoding restarts from the prompt on an exact cache.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .acceptance import Verdict


class Phase(enum.Enum):
    WAITING_ANCHOR = "waiting_anchor"
    DRAFTING = "drafting"
    VERIFY = "verify"
    EXACT = "exact"
    RECOMPUTE = "recompute"


@dataclass
class DraftStats:
    proposed: int = 0
    accepted: int = 0
    verifications: int = 0


@dataclass
class DraftState:
    request_id: str
    max_drafts: int = 64
    phase: Phase = Phase.WAITING_ANCHOR
    drafts: list[int] = field(default_factory=list)
    residual_ready: bool = False
    stats: DraftStats = field(default_factory=DraftStats)

    def __post_init__(self):
        if self.max_drafts < 0:
            raise ValueError(f"{self.max_drafts=} must be >= 0")

    def on_anchor_ready(self) -> None:
        self._expect(Phase.WAITING_ANCHOR)
        self.phase = Phase.VERIFY if self.residual_ready else Phase.DRAFTING

    def on_residual_ready(self) -> None:
        self.residual_ready = True
        if self.phase is Phase.DRAFTING:
            self.phase = Phase.VERIFY

    def on_residual_lost(self) -> None:
        """No residual within the deadline: drop the drafts, recompute exactly."""
        if self.phase in (Phase.EXACT, Phase.RECOMPUTE):
            return
        self.drafts.clear()
        self.phase = Phase.RECOMPUTE

    def can_draft(self) -> bool:
        return self.phase is Phase.DRAFTING and len(self.drafts) < self.max_drafts

    def add_draft(self, token: int) -> None:
        if not self.can_draft():
            raise RuntimeError(f"request {self.request_id}: cannot draft in phase "
                               f"{self.phase.value} with {len(self.drafts)}/{self.max_drafts} drafts")
        self.drafts.append(int(token))

    def preempted(self) -> None:
        """Preemption frees the blocks that held the drafts' KV: the drafts go with them."""
        self.drafts.clear()

    def verify(self, verdict: Verdict) -> list[int]:
        """Apply the verdict; returns the tokens to emit (accepted drafts + one target token)."""
        self._expect(Phase.VERIFY)
        if verdict.num_accepted > len(self.drafts):
            raise ValueError(f"verdict accepts {verdict.num_accepted} of {len(self.drafts)} drafts")
        out = verdict.emitted(self.drafts)
        self.stats.proposed += len(self.drafts)
        self.stats.accepted += verdict.num_accepted
        self.stats.verifications += 1
        self.drafts = []
        self.phase = Phase.EXACT
        return out

    def _expect(self, phase: Phase) -> None:
        if self.phase is not phase:
            raise RuntimeError(f"request {self.request_id}: expected phase {phase.value}, "
                               f"is {self.phase.value}")
