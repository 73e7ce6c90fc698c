"""Acceptance rules for verifying anchor-cache drafts against the refined (full) cache.

The drafts come from the same model on an approximate cache, sampled or argmax'd by the decode
loop; the verifier treats them as *deterministic proposals* (q = one-hot at the draft). For a
one-hot proposal the speculative-sampling rule of Leviathan et al. / Chen et al. reduces to:
accept d with probability p(d); on rejection sample from p with d removed and renormalised
(max(p - q, 0) normalised). The emitted token is then distributed exactly as p. Greedy decoding
is the limit: accept while the draft equals the target argmax.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class Verdict:
    num_accepted: int       # drafts kept, a prefix of the proposal
    next_token: int         # the target's token at the first disagreement, or the bonus token

    def emitted(self, drafts: Sequence[int]) -> list[int]:
        return list(drafts[: self.num_accepted]) + [self.next_token]


def accept_greedy(drafts: Sequence[int], target_ids: Sequence[int]) -> Verdict:
    """``target_ids[i]`` is the full-cache argmax after the verified prefix + ``drafts[:i]``."""
    if len(target_ids) != len(drafts) + 1:
        raise ValueError(f"need len(drafts) + 1 = {len(drafts) + 1} target tokens, "
                         f"got {len(target_ids)}")
    n = 0
    while n < len(drafts) and int(drafts[n]) == int(target_ids[n]):
        n += 1
    return Verdict(n, int(target_ids[n]))


def accept_sample(drafts: Sequence[int], target_probs: torch.Tensor,
                  generator: torch.Generator | None = None) -> Verdict:
    """Exact rejection sampling of deterministic drafts. ``target_probs``: [len(drafts)+1, V]."""
    if target_probs.dim() != 2 or target_probs.shape[0] != len(drafts) + 1:
        raise ValueError(f"target_probs must be [len(drafts) + 1, vocab] = "
                         f"[{len(drafts) + 1}, V], got {tuple(target_probs.shape)}")
    p = target_probs.double()
    for i, d in enumerate(drafts):
        d = int(d)
        if torch.rand((), generator=generator, dtype=torch.float64) < p[i, d]:
            continue
        residual = p[i].clone()
        residual[d] = 0.0
        total = residual.sum()
        if total <= 0:  # p is one-hot at d, so rejection had probability 0: cannot happen
            raise ValueError(f"rejected draft {d} at position {i} although p(d) = 1")
        return Verdict(i, int(torch.multinomial(residual / total, 1, generator=generator)))
    bonus = torch.multinomial(p[len(drafts)], 1, generator=generator)
    return Verdict(len(drafts), int(bonus))
