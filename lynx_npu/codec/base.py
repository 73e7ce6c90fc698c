"""The codec contract every KV codec in the registry implements.

A codec encodes one layer: ``k``, ``v`` of shape ``[num_kv_heads, num_tokens, head_dim]``.
Progressive codecs expose several *stages* (``"anchor"`` then ``"full"``); ``nbytes(stage)``
is the exact number of bytes that stage puts on the wire, every scalar included.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


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
