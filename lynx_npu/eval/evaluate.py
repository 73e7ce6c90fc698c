"""Run one codec over every captured layer and aggregate its error per stage.

Per stage: bits per value on the wire = 8 * sum over layers of ``enc.nbytes(stage)`` /
(2 * H * T * D * num_layers); K and V NMSE and attention vNMSE per layer (metrics.py),
averaged over layers (the mean of the per-layer values).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .capture import LayerQKV
from .metrics import attention_vnmse, causal_attention, nmse
from .progress import progress


@dataclass(frozen=True)
class LayerRef:
    """What the metrics need of one layer: the codec input and the reference attention."""

    q: torch.Tensor   # [num_heads, n, D] float32: the last n queries
    k: torch.Tensor   # [num_kv_heads, T, D] in the codec's input dtype
    v: torch.Tensor
    o: torch.Tensor   # [num_heads, n, D] float32: causal_attention(q, k, v, window=, scale=)
    window: int | None = None   # the layer's sliding window (None: global causal)
    scale: float | None = None  # the layer's softmax scale (None: 1/sqrt(D))


def build_refs(layers: list[LayerQKV], num_queries: int, kv_dtype: torch.dtype) -> list[LayerRef]:
    """Cast K/V to the codec input dtype and compute each layer's reference attention once.

    The reference is taken from the *cast* K/V, so a codec is charged only for its own error.
    """
    if num_queries < 1:
        raise ValueError(f"{num_queries=} must be >= 1")
    refs = []
    for layer in layers:
        n = min(num_queries, layer.k.shape[1])
        if layer.q.shape[1] < n:
            raise ValueError(f"layer has only {layer.q.shape[1]} captured queries; {n} needed")
        q = layer.q[:, -n:].float()
        k, v = layer.k.to(kv_dtype), layer.v.to(kv_dtype)
        o = causal_attention(q, k, v, window=layer.window, scale=layer.scale)
        refs.append(LayerRef(q, k, v, o, window=layer.window, scale=layer.scale))
    return refs


@dataclass
class StageResult:
    stage: str
    nbytes: int = 0
    num_values: int = 0
    per_layer_k_nmse: list[float] = field(default_factory=list)
    per_layer_v_nmse: list[float] = field(default_factory=list)
    per_layer_attn_vnmse: list[float] = field(default_factory=list)
    # Attention vNMSE with only K (resp. V) replaced: which side an error comes from.
    per_layer_attn_vnmse_k_only: list[float] = field(default_factory=list)
    per_layer_attn_vnmse_v_only: list[float] = field(default_factory=list)

    @property
    def bits_per_value(self) -> float:
        return 8.0 * self.nbytes / self.num_values

    def summary(self) -> dict:
        out = {"stage": self.stage, "bits_per_value": self.bits_per_value,
               "k_nmse": _mean(self.per_layer_k_nmse), "v_nmse": _mean(self.per_layer_v_nmse),
               "attn_vnmse": _mean(self.per_layer_attn_vnmse)}
        if self.per_layer_attn_vnmse_k_only:
            out["attn_vnmse_k_only"] = _mean(self.per_layer_attn_vnmse_k_only)
            out["attn_vnmse_v_only"] = _mean(self.per_layer_attn_vnmse_v_only)
        out["per_layer_attn_vnmse"] = list(self.per_layer_attn_vnmse)
        out["per_layer_k_nmse"] = list(self.per_layer_k_nmse)
        out["per_layer_v_nmse"] = list(self.per_layer_v_nmse)
        return out


@dataclass
class CodecResult:
    label: str
    stages: list[StageResult]
    encode_s: float = 0.0
    decode_s: float = 0.0


def evaluate_codec(codec, refs: list[LayerRef], *, label: str | None = None,
                   split_stages: tuple[str, ...] = ()) -> CodecResult:
    """Encode every layer with ``codec``, decode every stage, and measure the errors.

    For the stages in ``split_stages`` also measure attention vNMSE with only K or only V
    decoded (two more attention passes per layer and stage).
    """
    label = label or codec.name
    results = {s: StageResult(s) for s in codec.stages}
    enc_s = dec_s = 0.0
    with progress(len(refs), f"{label}: layer") as bar:
        for i, ref in enumerate(refs):
            # Codecs with a per-layer schedule (CacheGen's bins) get the layer they encode.
            layer_codec = codec.for_layer(i, len(refs)) if hasattr(codec, "for_layer") else codec
            t0 = time.perf_counter()
            enc = layer_codec.encode(ref.k, ref.v)
            enc_s += time.perf_counter() - t0
            for stage, res in results.items():
                t0 = time.perf_counter()
                k_hat, v_hat = layer_codec.decode(enc, stage=stage)
                dec_s += time.perf_counter() - t0
                res.nbytes += enc.nbytes(stage)
                res.num_values += 2 * ref.k.numel()
                res.per_layer_k_nmse.append(nmse(ref.k, k_hat))
                res.per_layer_v_nmse.append(nmse(ref.v, v_hat))
                res.per_layer_attn_vnmse.append(
                    attention_vnmse(ref.q, ref.k, ref.v, k_hat, v_hat, o=ref.o,
                                    window=ref.window, scale=ref.scale))
                if stage in split_stages:
                    res.per_layer_attn_vnmse_k_only.append(
                        attention_vnmse(ref.q, ref.k, ref.v, k_hat, ref.v, o=ref.o,
                                        window=ref.window, scale=ref.scale))
                    res.per_layer_attn_vnmse_v_only.append(
                        attention_vnmse(ref.q, ref.k, ref.v, ref.k, v_hat, o=ref.o,
                                        window=ref.window, scale=ref.scale))
            bar.update()
    return CodecResult(label, list(results.values()), enc_s, dec_s)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")
