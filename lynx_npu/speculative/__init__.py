"""Speculative verification of anchor-cache drafts: acceptance rules and draft bookkeeping."""
from .acceptance import Verdict, accept_greedy, accept_sample  # noqa: F401
from .drafts import DraftState, DraftStats, Phase  # noqa: F401
