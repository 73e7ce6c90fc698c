"""The codec contract every KV codec in the registry implements.

A codec encodes one layer: ``k``, ``v`` of shape ``[num_kv_heads, num_tokens, head_dim]``.
Progressive codecs expose several *stages* (``"anchor"`` then ``"full"``); ``nbytes(stage)``
is the exact number of bytes that stage puts on the wire, every scalar included.

``params()`` lists every parameter that shapes a codec's bytes, so that ``get_codec(name,
**codec.params())`` rebuilds the same codec: frames carry them (registry.wire_params) and a
receiver rebuilds the codec from them alone. Configs check each parameter's type and range on
construction (``check_int`` / ``check_number``), so values from the wire meet the same checks
as values from the API.
"""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Upper bound of every size parameter (page, chunk and group sizes, sink tokens, layer
# counts): far above any real value, low enough that no product of them overflows int64.
MAX_SIZE = 1 << 20


def check_int(name: str, value, minimum: int, maximum: int = MAX_SIZE) -> None:
    """A codec parameter that must be an int (a bool is not one) in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={_short(value)} must be an int, got {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{name}={_short(value)} must be in [{minimum}, {maximum}]")


def _short(value) -> str:
    """repr of a value for an error message, cut short (a peer may send 10**300)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:24]}...({len(text)} characters)"


def check_number(name: str, value, low: float, high: float) -> float:
    """A codec parameter that must be a real number (int or float, not a bool) in the open
    interval (low, high); returns it as a float, so 3 and 3.0 give the same parameters."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < high:
        raise ValueError(f"{name}={_short(value)} must be a number in ({low:g}, {high:g})")
    return float(value)


def validate_kv(k: torch.Tensor, v: torch.Tensor) -> None:
    """Reject bad layer input with a ValueError that names the problem."""
    for name, x in (("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(
                f"{name} must have rank 3 [num_kv_heads, num_tokens, head_dim], got shape "
                f"{tuple(x.shape)}")
        if x.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} has dtype {x.dtype}; expected one of float16, bfloat16, float32")
        if x.shape[1] == 0:
            raise ValueError(f"{name} has zero tokens (shape {tuple(x.shape)}); need num_tokens >= 1")
        if x.shape[0] == 0 or x.shape[2] == 0:
            raise ValueError(f"{name} has an empty head or head_dim axis: shape {tuple(x.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: k {tuple(k.shape)} vs v {tuple(v.shape)}")
    if k.dtype != v.dtype:
        raise ValueError(f"k and v dtypes differ: k {k.dtype} vs v {v.dtype}")
    for name, x in (("k", k), ("v", v)):
        check_finite(name, x)


def check_finite(name: str, x: torch.Tensor) -> tuple[float, float]:
    """Refuse NaN and Inf in ``x`` with a ValueError naming the first; -> (min, max).

    One reduction pass (aminmax propagates NaN, and Inf is its own min or max); the index is
    only searched for on the error path."""
    if x.numel() == 0:
        return 0.0, 0.0
    lo, hi = (float(t) for t in torch.aminmax(x.detach()))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        bad = ~torch.isfinite(x.detach())
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} contains NaN or Inf (first at index {idx}: "
                         f"{float(x.detach()[idx])}); KV must be finite")
    return lo, hi


def to_kv_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float32 reconstruction -> the KV ``dtype``, saturated to its finite range.

    Reconstructions go through rounded scalars (float16 scales, page minima, chunk statistics),
    so a finite input at the edge of the dtype's range (65504 in float16) can come back a hair
    beyond it and round to Inf; the clamp keeps every output of a finite input finite and
    changes no value that was finite before."""
    top = torch.finfo(dtype).max
    return x.clamp(-top, top).to(dtype)


@dataclass(frozen=True)
class Encoded(abc.ABC):
    """One encoded layer. Subclasses hold the payload tensors."""

    shape: tuple[int, int, int]  # [num_kv_heads, num_tokens, head_dim]
    dtype: torch.dtype
    stages: tuple[str, ...]

    @abc.abstractmethod
    def nbytes(self, stage: str = "full") -> int:
        """Exact bytes on the wire up to and including ``stage``."""

    def check_stage(self, stage: str) -> None:
        if stage not in self.stages:
            raise ValueError(f"unknown stage {stage!r} for this codec; stages are {self.stages}")

    def bits_per_value(self, stage: str = "full") -> float:
        h, t, d = self.shape
        return 8.0 * self.nbytes(stage) / (2 * h * t * d)


class Codec(abc.ABC):
    """A KV codec. ``name`` is its registry name; ``stages`` its progressive stages."""

    name: str = ""
    stages: tuple[str, ...] = ("full",)

    @abc.abstractmethod
    def encode(self, k: torch.Tensor, v: torch.Tensor) -> Encoded: ...

    @abc.abstractmethod
    def decode(self, enc: Encoded, stage: str = "full") -> tuple[torch.Tensor, torch.Tensor]: ...

    def roundtrip(self, k: torch.Tensor, v: torch.Tensor, stage: str = "full"):
        return self.decode(self.encode(k, v), stage)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


@dataclass(frozen=True)
class EncodedPage:
    """One page of one layer: the transport's unit (one anchor frame + one residual frame)."""

    index: int
    token_start: int
    token_end: int
    anchor: torch.Tensor            # uint8 1-D: first stream (codes + every scalar)
    residual: torch.Tensor | None   # uint8 1-D, or None for one-stream codecs


@dataclass(frozen=True)
class TensorEncoded(Encoded):
    """An encoding made of named tensors, each belonging to one stage."""

    fields: tuple[tuple[str, str, torch.Tensor], ...]  # (name, stage, tensor)

    def nbytes(self, stage: str = "full") -> int:
        self.check_stage(stage)
        upto = self.stages.index(stage)
        return sum(t.numel() * t.element_size() for _, s, t in self.fields
                   if self.stages.index(s) <= upto)

    def __getitem__(self, name: str) -> torch.Tensor:
        for n, _, t in self.fields:
            if n == name:
                return t
        raise KeyError(name)


@dataclass(frozen=True)
class FieldSpec:
    """One field of a TensorEncoded: what ``encode`` would return, computed from the shape."""

    name: str
    stage: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


class TensorCodec(Codec):
    """A codec whose encoding is a fixed set of tensors (shapes depend only on the input shape).

    It gets the paged wire view for free: a page is ``page_size`` tokens encoded on their own,
    its fields' raw bytes concatenated in order (first stage -> anchor, later -> residual).
    ``field_specs`` states those fields arithmetically, so a received page's size is checked
    against its header's claim before anything of the claimed size is allocated.
    """

    def __init__(self, page_size: int = 256):
        check_int("page_size", page_size, 1)
        self.page_size = page_size

    def params(self) -> dict:
        return {"page_size": self.page_size}

    @abc.abstractmethod
    def field_specs(self, shape: tuple[int, int, int], dtype: torch.dtype
                    ) -> tuple[FieldSpec, ...]:
        """The fields ``encode`` returns for a layer of ``shape`` and ``dtype``, in order."""

    def page_nbytes(self, num_tokens: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype) -> dict[str, int]:
        """Exact bytes of one page per stream (stage name -> bytes), from arithmetic alone."""
        out = {s: 0 for s in self.stages}
        for f in self.field_specs((num_kv_heads, num_tokens, head_dim), dtype):
            out[f.stage] += f.nbytes
        return out

    def encode_pages(self, k: torch.Tensor, v: torch.Tensor) -> list[EncodedPage]:
        validate_kv(k, v)
        pages = []
        for i, start in enumerate(range(0, k.shape[1], self.page_size)):
            end = min(start + self.page_size, k.shape[1])
            enc = self.encode(k[:, start:end], v[:, start:end])
            first = [t for _, s, t in enc.fields if s == self.stages[0]]
            rest = [t for _, s, t in enc.fields if s != self.stages[0]]
            pages.append(EncodedPage(i, start, end, _cat_bytes(first),
                                     _cat_bytes(rest) if rest else None))
        return pages

    def decode_page(self, anchor, residual, token_start, token_end, *, num_kv_heads, head_dim,
                    dtype):
        shape = check_page(token_start, token_end, num_kv_heads, head_dim, dtype,
                           max_tokens=self.page_size)
        specs = self.field_specs(shape, dtype)
        streams = {self.stages[0]: anchor}
        if residual is not None and len(self.stages) > 1:
            streams[self.stages[1]] = residual
        # Sizes first, from the header's claim by arithmetic: a short frame claiming a huge
        # page is refused before anything of the claimed size exists.
        for stage, buf in streams.items():
            if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8 or buf.dim() != 1:
                raise ValueError(f"{stage} page buffer must be a 1-D uint8 tensor, got "
                                 f"{getattr(buf, 'dtype', type(buf).__name__)} "
                                 f"{tuple(getattr(buf, 'shape', ()))}")
            need = sum(f.nbytes for f in specs if f.stage == stage)
            if buf.numel() != need:
                raise ValueError(f"{stage} page buffer has {buf.numel()} bytes; {self.name} "
                                 f"expects {need} for {shape[1]} tokens x {shape[0]} heads x "
                                 f"{shape[2]} in {dtype}")
        fields, offsets = [], {s: 0 for s in streams}
        for f in specs:
            if f.stage not in streams:  # not received: a placeholder of no memory, never read
                fields.append((f.name, f.stage, torch.zeros((), dtype=f.dtype).expand(f.shape)))
                continue
            buf, off = streams[f.stage], offsets[f.stage]
            raw = buf[off:off + f.nbytes].contiguous()
            fields.append((f.name, f.stage, raw.view(f.dtype).view(f.shape)))
            offsets[f.stage] += f.nbytes
        enc = TensorEncoded(shape, dtype, self.stages, tuple(fields))
        stage = self.stages[-1] if len(streams) == len(self.stages) else self.stages[0]
        return self.decode(enc, stage)


def check_page(token_start, token_end, num_kv_heads, head_dim, dtype, *, max_tokens: int
               ) -> tuple[int, int, int]:
    """A received page's claimed geometry -> its [num_kv_heads, tokens, head_dim] shape, or a
    ValueError naming the bad value (every decode_page checks it before sizing anything)."""
    check_int("token_start", token_start, 0, 1 << 40)
    check_int("token_end", token_end, token_start + 1, token_start + max_tokens)
    check_int("num_kv_heads", num_kv_heads, 1)
    check_int("head_dim", head_dim, 1)
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"{dtype=} must be one of float16, bfloat16, float32")
    return num_kv_heads, token_end - token_start, head_dim


def _cat_bytes(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.contiguous().view(torch.uint8).reshape(-1) for t in tensors])
