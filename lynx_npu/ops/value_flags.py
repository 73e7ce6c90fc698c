"""Input no Lynx page can carry, as a compress kernel flags it: the refusal without a second pass.

The reference codec refuses NaN / Inf and a page channel whose range (max - min) overflows
float32 (lynx_ref.quantize, docs/codec.md). A kernel that already reads every value for the page
min / max (Triton: pass 1, with NaN-propagating min / max) tests each channel's min and max
once and records what it found in a small device buffer, int32 [2, 2]:

    flags[w, 0]  w = 0 (k) / 1 (v): NaN or Inf in a body channel or a sink token
    flags[w, 1]                      a channel range past float32 (both ends finite)

each 0 if nothing was found, else ``num_pages * num_kv_heads - (page * num_kv_heads + head)``
of the first (page, head) flagged (kernels take the max: atomics, no ordering). Reading the
flags is the only synchronisation: ``ops.compress`` reads them right after its launch; the page
serde reads them when the layer's bytes are staged to host memory, which waits anyway.
"""
from __future__ import annotations

import torch

from .plan import F_BODY0, F_NUM_BODY, F_TOKEN0, LayerPlan

NONFINITE, RANGE = 0, 1


def new(device) -> torch.Tensor:
    """A zeroed flags buffer for one compress launch (K and V)."""
    return torch.zeros(2, 2, dtype=torch.int32, device=device)


def first_bad(flags: torch.Tensor, plan: LayerPlan) -> list[tuple[str, int, int, int]]:
    """[(tensor name, kind, page, head)] of the host ``flags`` of a launch over ``plan`` (k
    before v, NaN / Inf before a range), [] for clean input."""
    codes = flags.tolist()
    if not any(codes[0]) and not any(codes[1]):
        return []
    h = plan.num_kv_heads
    total = plan.num_pages * h
    out = []
    for w, name in enumerate("kv"):
        for kind in (NONFINITE, RANGE):
            code = codes[w][kind]
            if code > 0:
                idx = total - code
                out.append((name, kind, idx // h, idx % h))
    return out


def error(flags: torch.Tensor, plan: LayerPlan, tokens_per_layer: int | None = None
          ) -> ValueError | None:
    """The ValueError naming the first thing ``flags`` (host) found, or None. With
    ``tokens_per_layer`` the plan holds several layers of one request back to back
    (ops/layered.py): the message names the layer and the tokens within it."""
    bad = first_bad(flags, plan)
    if not bad:
        return None
    name, kind, page, head = bad[0]
    row = plan.table[page]
    t0, t1 = int(row[F_TOKEN0]), int(row[F_BODY0] + row[F_NUM_BODY])
    where = ""
    if tokens_per_layer:
        layer = t0 // tokens_per_layer
        t0, t1 = t0 - layer * tokens_per_layer, t1 - layer * tokens_per_layer
        where = f"layer {layer}, "
    where += f"head {head}, tokens [{t0}, {t1})"
    if kind == NONFINITE:
        return ValueError(f"{name} contains NaN or Inf (first in {where}); KV must be finite")
    return ValueError(f"{name}: a page channel's range (max - min) overflows float32, which "
                      f"Lynx normalises by (first in {where}); keep |{name}| below 2**127")
