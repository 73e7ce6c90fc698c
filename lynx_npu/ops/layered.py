"""One kernel launch for every layer of a request (backends that take row offsets, Triton).

On a GPU a layer of a 16K-token Llama-8B request is ~70 MB: its kernels take ~40 us, about what
the host needs to prepare and launch them, so layer-by-layer launches leave the device idle
half the time. Pages are independent, so a request's pages of all layers can be one plan:

* compress: layer l's pages follow layer 0's with their tokens shifted by l * T; the per-token
  row offsets the kernel reads (the fused gather) then include each layer's offset from layer
  0's cache (PagedKVCache.layer_offsets), so K and V of every layer are read through one base
  pointer each; the outputs are the layers' wire buffers back to back.
* decompress: the staged pages of several layers in one plan, each row with the offset of its
  layer's cache from layer 0's (``layer_offsets`` of the launcher).
"""
from __future__ import annotations

import torch

from .paged_cache import PagedKVCache, row_offsets
from .plan import F_BODY0, F_PADS, F_SECTION, F_TOKEN0, NUM_PADS, LayerPlan
from .wire_layout import LayerWire


def request_plan(lw: LayerWire, num_layers: int, device) -> tuple[LayerPlan, torch.Tensor | None]:
    """The compress plan of ``num_layers`` layers of ``lw`` in one buffer (layer l at
    ``l * lw.nbytes``), and its preview offsets on ``device`` (cached on ``lw``)."""
    key = ("request", num_layers, str(torch.device(device)))
    if key not in lw._on_device:
        p, t, nb = lw.plan.num_pages, lw.num_tokens, lw.nbytes
        layer = torch.arange(num_layers, dtype=torch.int64).repeat_interleave(p)
        table = lw.plan.table.repeat(num_layers, 1)
        table[:, F_TOKEN0] += layer * t
        table[:, F_BODY0] += layer * t
        table[:, F_SECTION:F_PADS] += (layer * nb)[:, None]
        table[:, F_PADS:F_PADS + 2 * NUM_PADS:2] += (layer * nb)[:, None]
        plan = LayerPlan(lw.plan.config, lw.num_kv_heads, num_layers * t, lw.head_dim,
                         lw.dtype, (), num_layers * nb, num_layers * nb, table)
        prev = None
        if lw.preview_offsets is not None:
            prev = (lw.preview_offsets.repeat(num_layers, 1) + (layer * nb)[:, None]).to(device)
        plan.on(device)
        lw._on_device[key] = (plan, prev)
    return lw._on_device[key]


def request_rows(cache: PagedKVCache, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 [num_layers * T] row offsets of K and V: token t of layer l at index l * T + t."""
    rows = row_offsets(cache.layer(0), slots)
    out = []
    for deltas in cache.layer_offsets:
        d = torch.tensor(deltas, dtype=torch.int64).to(rows.device, non_blocking=True)
        out.append((d[:, None] + rows[None, :]).reshape(-1))
    return out[0], out[1]


def page_layer_offsets(cache: PagedKVCache, layers: list[int], device) -> torch.Tensor:
    """int64 [len(layers), 2]: the K / V offsets of each page's layer (decompress rows)."""
    k, v = cache.layer_offsets
    return torch.tensor([[k[i], v[i]] for i in layers], dtype=torch.int64).to(device)
