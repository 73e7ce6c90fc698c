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
import dataclasses
from dataclasses import dataclass

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_int(name: str, value, minimum: int, maximum: int | None = None) -> None:
    """A codec parameter that must be an int (a bool is not one) in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r} must be an int, got {type(value).__name__}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name}={value!r} must be {bound}")


def check_number(name: str, value, low: float, high: float) -> float:
    """A codec parameter that must be a real number (int or float, not a bool) in the open
    interval (low, high); returns it as a float, so 3 and 3.0 give the same parameters."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < high:
        raise ValueError(f"{name}={value!r} must be a number in ({low:g}, {high:g})")
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
        bad = ~torch.isfinite(x)
        if bool(bad.any()):
            idx = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{name} contains NaN or Inf (first at index {idx}); KV must be finite")


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


class TensorCodec(Codec):
    """A codec whose encoding is a fixed set of tensors (shapes depend only on the input shape).

    It gets the paged wire view for free: a page is ``page_size`` tokens encoded on their own,
    its fields' raw bytes concatenated in order (first stage -> anchor, later -> residual).
    """

    def __init__(self, page_size: int = 256):
        check_int("page_size", page_size, 1)
        self.page_size = page_size

    def params(self) -> dict:
        return {"page_size": self.page_size}

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
        shape = (num_kv_heads, token_end - token_start, head_dim)
        # The field shapes are those of any encoding of this shape: take them from zeros.
        zeros = torch.zeros(shape, dtype=dtype, device=anchor.device)
        template = self.encode(zeros, zeros)
        streams = {self.stages[0]: anchor}
        if residual is not None and len(self.stages) > 1:
            streams[self.stages[1]] = residual
        fields, offsets = [], {s: 0 for s in streams}
        for name, stage, t in template.fields:
            if stage not in streams:
                fields.append((name, stage, t))  # not received: placeholder, never read
                continue
            nb = t.numel() * t.element_size()
            buf = streams[stage]
            if offsets[stage] + nb > buf.numel():
                raise ValueError(f"{stage} page buffer of {buf.numel()} bytes is too short for "
                                 f"field {name!r} of {self.name}")
            raw = buf[offsets[stage]:offsets[stage] + nb].contiguous()
            fields.append((name, stage, raw.view(t.dtype).view(t.shape)))
            offsets[stage] += nb
        for stage, buf in streams.items():
            if offsets[stage] != buf.numel():
                raise ValueError(f"{stage} page buffer has {buf.numel()} bytes; {self.name} "
                                 f"expects {offsets[stage]}")
        enc = dataclasses.replace(template, fields=tuple(fields))
        stage = self.stages[-1] if len(streams) == len(self.stages) else self.stages[0]
        return self.decode(enc, stage)


def _cat_bytes(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.contiguous().view(torch.uint8).reshape(-1) for t in tensors])
