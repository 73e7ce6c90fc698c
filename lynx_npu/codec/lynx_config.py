"""Configuration of the Lynx hierarchical codec (Algorithm 1 of the Lynx paper + DESIGN §3).

Every value is quantized to an 8-bit magnitude code ``I`` in ``[0, y_max]`` plus a sign, then
split into an ``a``-bit anchor (sign + top bits) and an ``r = 8 - a``-bit signed correction.
``y_max = (2**(a-1) - 1) << r`` is the largest value whose anchor magnitude still fits beside
the sign, so the chunk maximum (|x| = 1) is reconstructed exactly by the anchor alone and
nothing is clamped (4+4: y_max = 112, anchor [-8, 7], residual [-8, 7]; the paper's literal
127 would need an 18-value anchor). K and V have a split each (``anchor_bits``,
``v_anchor_bits``). A model's per-layer plan overrides the split (``layer_anchor_bits``: a wider K
anchor where it matters, docs/codec.md "Where the anchor's KL sits") and V's chunk size
(``layer_v_chunk_size``: V chunks of 32 where 64 would cost the full stage most, docs/codec.md
"V's chunk size by layer") layer by layer: ``for_layer`` gives a layer's own config.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from .base import check_int, check_number

TOTAL_BITS = 8
AXES = ("channel", "token")
CENTERS = ("midrange", "mean")
SCALAR_GRIDS = ("byte", "float16")


@dataclass(frozen=True)
class LynxConfig:
    page_size: int = 256         # tokens per page (P): scalars gamma are per channel per page
    chunk_size: int = 32         # values per K chunk (C): scalars mu, sigma are per chunk
    v_chunk_size: int = 32       # values per V chunk (docs/codec.md: why not 64)
    alpha_k: float = 0.25        # alpha-law skew of the log transform, K (measured: README)
    alpha_v: float = 0.5         # alpha-law skew of the log transform, V
    anchor_bits: int = 4         # K's sign + MSBs sent first; its residual holds 8 - anchor_bits
    v_anchor_bits: int = 4       # V's
    k_axis: str = "channel"      # chunks of K: "channel" = C tokens of one channel (paper)
    v_axis: str = "token"        # chunks of V: "token" = C head_dim values of one token (KIVI)
    num_sink_tokens: int = 4     # leading tokens of the sequence sent exact with the anchor
    center: str = "midrange"     # chunk centre mu: "midrange" (max+min)/2, or "mean" (paper)
    # The values mu and sigma may take: "byte" = one of 256 each (lynx_tables.py), so the
    # streams carry each scalar once, as one byte (8.66 bits/value in total instead of 9.68 on
    # SmolLM2, the anchor's error within 2%: docs/codec.md "The byte grid"); "float16" = any
    # float16 (the paper's), sent as previews + exact values. A quantizer setting: the kernels
    # compute the scalars on the grid (still stored as float16, so decompression is unchanged).
    scalar_grid: str = "byte"
    # The anchor stream carries 8-bit previews of mu and sigma, the residual their exact float16
    # values (lynx_stream.py): anchor ~4.6 instead of ~5.1 bits/value, full stage unchanged.
    # A stream format, not a quantizer setting: kernels (lynx_npu.ops) never see it.
    scalar_preview: bool = False
    # The anchor of the page(s) holding the layer's last ``recent_tokens`` tokens also carries
    # their residual codes and their chunks' exact scalars (lynx_stream.py): drafts are
    # computed on those tokens at full precision, where attention looks most (docs/codec.md).
    # A stream format too: the kernels never see it.
    recent_tokens: int = 0
    # (layer, K's anchor bits, V's) for the layers whose split differs from the one above, in
    # layer order: a model's own (``lynx calibrate``). A per-layer plan: the kernels and the
    # page layout see one layer's config (``for_layer``), never this.
    layer_anchor_bits: tuple = ()
    # (layer, V's chunk size) for the layers whose V chunks differ from v_chunk_size: the same
    # kind of per-layer plan (``lynx calibrate --v-chunk-size``).
    layer_v_chunk_size: tuple = ()

    def __post_init__(self):
        # Types as well as ranges: a config rebuilt from a frame's JSON parameters
        # (registry.codec_from_wire) meets exactly these checks.
        check_int("page_size", self.page_size, 1)
        check_int("chunk_size", self.chunk_size, 1)
        check_int("v_chunk_size", self.v_chunk_size, 1)
        for which in "kv":
            if self.axis(which) == "channel" and self.page_size % self.chunk(which):
                name = "chunk_size" if which == "k" else "v_chunk_size"
                raise ValueError(f"page_size={self.page_size} must be a multiple of "
                                 f"{name}={self.chunk(which)} (chunks of {which.upper()} "
                                 f"along tokens)")
        for name in ("alpha_k", "alpha_v"):  # stored as float: alpha 3 and 3.0 are one config
            object.__setattr__(self, name, check_number(name, getattr(self, name), 0, 1e6))
        check_int("anchor_bits", self.anchor_bits, 2, TOTAL_BITS - 1)  # the residual: the rest
        check_int("v_anchor_bits", self.v_anchor_bits, 2, TOTAL_BITS - 1)
        object.__setattr__(self, "layer_anchor_bits", _layer_plan(
            "layer_anchor_bits", self.layer_anchor_bits, ("K's anchor bits", "V's"),
            lambda what, bits: check_int(what, bits, 2, TOTAL_BITS - 1)))
        object.__setattr__(self, "layer_v_chunk_size", _layer_plan(
            "layer_v_chunk_size", self.layer_v_chunk_size, ("V's chunk size",),
            self._check_v_chunk))
        for name in ("k_axis", "v_axis"):
            if not isinstance(getattr(self, name), str) or getattr(self, name) not in AXES:
                raise ValueError(f"{name}={getattr(self, name)!r} must be one of {AXES}")
        if not isinstance(self.center, str) or self.center not in CENTERS:
            raise ValueError(f"center={self.center!r} must be one of {CENTERS}")
        if not isinstance(self.scalar_grid, str) or self.scalar_grid not in SCALAR_GRIDS:
            raise ValueError(f"scalar_grid={self.scalar_grid!r} must be one of {SCALAR_GRIDS}")
        if not isinstance(self.scalar_preview, bool):
            raise ValueError(f"scalar_preview={self.scalar_preview!r} must be a bool")
        check_int("num_sink_tokens", self.num_sink_tokens, 0)
        check_int("recent_tokens", self.recent_tokens, 0)

    def bits(self, which: str) -> int:
        """Anchor bits of ``which`` ("k" or "v")."""
        return self.v_anchor_bits if which == "v" else self.anchor_bits

    def residual_bits(self, which: str) -> int:
        return TOTAL_BITS - self.bits(which)

    def y_max(self, which: str) -> int:
        return ((1 << (self.bits(which) - 1)) - 1) << self.residual_bits(which)

    def bias(self, which: str) -> int:
        """Round-half-down bias (+7 for 4+4): the residual becomes a centred signed correction."""
        return (1 << (self.residual_bits(which) - 1)) - 1

    def _check_v_chunk(self, what: str, size) -> None:
        check_int(what, size, 1)
        if self.v_axis == "channel" and self.page_size % size:
            raise ValueError(f"page_size={self.page_size} must be a multiple of {what}={size} "
                             f"(chunks of V along tokens)")

    @property
    def per_layer(self) -> bool:
        return bool(self.layer_anchor_bits or self.layer_v_chunk_size)

    @property
    def planned_layers(self) -> tuple:
        """The layers the per-layer plan lists, in order."""
        return tuple(sorted({t[0] for t in self.layer_anchor_bits + self.layer_v_chunk_size}))

    def for_layer(self, layer: int, num_layers: int) -> "LynxConfig":
        """Layer ``layer``'s own config (of ``num_layers``): its split and V chunk size from
        the per-layer plan (or the config's own), and no plan. A listed layer the model does
        not have is an error: the plan was made for another model."""
        check_int("layer", layer, 0, num_layers - 1)
        if not self.per_layer:
            return self
        for name in ("layer_anchor_bits", "layer_v_chunk_size"):
            plan = getattr(self, name)
            if plan and plan[-1][0] >= num_layers:
                raise ValueError(f"{name} names layer {plan[-1][0]}, but the model has "
                                 f"{num_layers} layers: a plan calibrated for another model")
        k, v = next(((kb, vb) for i, kb, vb in self.layer_anchor_bits if i == layer),
                    (self.anchor_bits, self.v_anchor_bits))
        vc = next((c for i, c in self.layer_v_chunk_size if i == layer), self.v_chunk_size)
        return self.replace(anchor_bits=k, v_anchor_bits=v, v_chunk_size=vc,
                            layer_anchor_bits=(), layer_v_chunk_size=())

    def alpha(self, which: str) -> float:
        return float(self.alpha_k if which == "k" else self.alpha_v)

    def chunk(self, which: str) -> int:
        """Values per chunk of ``which`` ("k" or "v")."""
        return self.v_chunk_size if which == "v" else self.chunk_size

    def axis(self, which: str) -> str:
        return self.k_axis if which == "k" else self.v_axis

    @property
    def kernel(self) -> "LynxConfig":
        """This config without its stream formats: what lynx_npu.ops kernels are given."""
        if self.per_layer:
            raise ValueError("this config differs by layer (a per-layer plan: "
                             "layer_anchor_bits, layer_v_chunk_size): take a layer's config "
                             "with for_layer(layer, num_layers)")
        return self.replace(scalar_preview=False, recent_tokens=0)

    def replace(self, **changes) -> "LynxConfig":
        return dataclasses.replace(self, **changes)


def plan_text(plan: tuple) -> str:
    """A per-layer plan as the compact JSON text codec parameters carry (frames and the
    handshake take scalar parameters only): ``[[18,5,4],[23,5,4]]``, ``[]`` for none."""
    return json.dumps([list(t) for t in plan], separators=(",", ":"))


def describe_plan(plan: dict) -> str:
    """A model's Lynx plan (codec parameters) in words, for logs: "K + V anchor bits 5 + 4 in
    layers 18, 23; V chunks of 64, 32 in layers 3-10"."""
    cfg = make_config(**plan)
    parts = []
    splits: dict = {}
    for layer, k, v in cfg.layer_anchor_bits:
        splits.setdefault((k, v), []).append(layer)
    parts += [f"K + V anchor bits {k} + {v} in {_layers(ls)}" for (k, v), ls in splits.items()]
    chunks: dict = {}
    for layer, c in cfg.layer_v_chunk_size:
        chunks.setdefault(c, []).append(layer)
    if "v_chunk_size" in plan or chunks:
        parts.append(f"V chunks of {cfg.v_chunk_size}" + "".join(
            f", {c} in {_layers(ls)}" for c, ls in chunks.items()))
    parts += [f"{k}={plan[k]!r}" for k in plan
              if k not in ("layer_anchor_bits", "layer_v_chunk_size", "v_chunk_size")]
    return "; ".join(parts) or "none"


def _layers(layers: list) -> str:
    """[3, 4, 5, 9] -> "layers 3-5, 9"."""
    runs, start = [], layers[0]
    for a, b in zip(layers, layers[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(runs)


def _layer_plan(name: str, value, fields: tuple, check) -> tuple:
    """Plan ``name`` as a tuple of (layer, *fields) int tuples, strictly increasing in layer,
    from a sequence or its JSON text (``plan_text``); ``check(what, value)`` checks a field."""
    shape = f"[[layer, {', '.join(fields)}], ...]"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"{name}={value[:64]!r} is not JSON text of {shape}") from None
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{name}={value!r} must be a sequence {shape}")
    out = []
    for item in value:
        if not isinstance(item, (tuple, list)) or len(item) != 1 + len(fields):
            raise ValueError(f"{name} entry {item!r} must be [layer, {', '.join(fields)}]")
        check_int(f"{name} layer", item[0], 0)
        for field, x in zip(fields, item[1:]):
            check(f"{name} {field} of layer {item[0]}", x)
        if out and item[0] <= out[-1][0]:
            raise ValueError(f"{name} must list each layer once, in increasing order: layer "
                             f"{item[0]} after {out[-1][0]}")
        out.append(tuple(item))
    return tuple(out)


PRESETS: dict[str, LynxConfig] = {
    # The paper's literal axes (K and V chunked per channel), no exact sinks, mu-law alpha.
    "paper": LynxConfig(alpha_k=255.0, alpha_v=255.0, k_axis="channel", v_axis="channel",
                        v_chunk_size=32, num_sink_tokens=0, center="mean",
                        scalar_grid="float16"),
    "default": LynxConfig(),
}


def make_config(preset: str | None = None, **overrides) -> LynxConfig:
    if preset is None:
        preset = "default"
    if preset not in PRESETS:
        raise ValueError(f"unknown lynx preset {preset!r}; presets: {', '.join(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(LynxConfig)}
    unknown = set(overrides) - fields
    if unknown:
        raise ValueError(f"unknown lynx parameter(s) {sorted(unknown)}; parameters: {sorted(fields)}")
    return PRESETS[preset].replace(**overrides)
