"""CacheGen baseline (``cachegen``): per-layer bin counts, per-token max scaling, per-channel
empirical symbol distributions and real entropy coding.

Followed: LMCache's CacheGen serde, read at LMCache/LMCache
``lmcache/storage_backend/serde/cachegen_encoder.py`` @ 19dce33f (``torch_quant_vectorized``,
``encode_function``), ``cachegen_decoder.py`` @ efa2f723 (``do_dequantize``),
``cachegen_basics.py`` @ 45ebf009 (``CacheGenConfig`` layer thresholds and bins,
``CACHEGEN_GPU_MAX_TOKENS_PER_CHUNK``) and ``lmcache/v1/storage_backend/naive_serde/
cachegen_basics.py`` @ 40e4eb39 (bins for generic models). Own implementation; no code copied.

What LMCache does, and so does this codec, per layer and per K / V:

- channels are ``num_kv_heads * head_dim``; ``MAX = bins // 2 - 1``;
- the scale is the absolute maximum of each *token* over all its channels (LMCache's
  ``amax(|x|, dim=-1)`` on ``[layers, tokens, channels]``), kept in the input dtype;
- symbols ``round(x * MAX / max + MAX)`` in ``[0, 2 * MAX]``; decode ``(s - MAX) / MAX * max``;
- bins by layer depth (LMCache defaults): K 32 bins below layer 10, then 16 (the older config
  names a third band from layer 20, also 16); V 32 bins below layer 2, then 16; a model with
  fewer layers than ``key_first_layers`` uses the first bins everywhere (LMCache: < 10 layers ->
  32 bins for K and V);
- a CDF per (chunk of ``chunk_size`` = 256 tokens, channel), sent with the data, and the
  symbols entropy coded against it (torchac there; constriction's range coder here).

Our contract encodes one layer per call, so the codec takes ``layer_index`` and ``num_layers``
(SmolLM2-135M: 30) and picks that layer's bins as LMCache does.

Differences from LMCache, all in its favour or neutral for size: LMCache codes each channel
as its own arithmetic-coded stream (for GPU parallelism) and sends an int32 length for each,
and stores the largest layer's ``bins + 1`` int16 CDF points per channel (33 on every layer
with the defaults); here K and V of a chunk share one range
coded stream and the CDF is ``2 * MAX`` uint16 points (cachegen_coder.py). A zero token
(max = 0) decodes to exact zeros instead of NaN.

Wire format of one chunk (= one page; little-endian, no padding):

    uint16 key_bins, uint16 value_bins
    k_max [tokens] and v_max [tokens]              in the input dtype (the values' own bits)
    k_table [channels, 2*MAX_k] uint16, v_table [channels, 2*MAX_v] uint16   (CDF points)
    uint32 words [rest]                            range coder output, K then V, channel-major

``nbytes`` is the sum of these buffers: the real serialized size, every side channel included.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from .base import (Codec, Encoded, EncodedPage, check_int, check_page, to_kv_dtype,
                   validate_kv)
from .cachegen_coder import cdf_table, decode_symbols, encode_symbols
from .registry import register_codec

_HEADER = np.dtype([("key_bins", "<u2"), ("value_bins", "<u2")])


@dataclass(frozen=True)
class CacheGenConfig:
    """LMCache's CacheGen bins by layer, plus which layer this codec encodes."""

    layer_index: int = 0
    num_layers: int = 30
    chunk_size: int = 256          # tokens per CDF / bitstream / page (LMCache chunk_size)
    key_first_layers: int = 10
    key_second_layers: int = 20
    key_first_bins: int = 32
    key_second_bins: int = 16
    key_third_bins: int = 16
    value_first_layers: int = 2
    value_first_bins: int = 32
    value_second_bins: int = 16

    def __post_init__(self):
        check_int("num_layers", self.num_layers, 1)
        check_int("layer_index", self.layer_index, 0, self.num_layers - 1)
        check_int("chunk_size", self.chunk_size, 1)
        for name in ("key_first_layers", "key_second_layers", "value_first_layers"):
            check_int(name, getattr(self, name), 0)
        if self.key_second_layers < self.key_first_layers:
            raise ValueError(f"{self.key_second_layers=} must be >= "
                             f"key_first_layers={self.key_first_layers}")
        for name in ("key_first_bins", "key_second_bins", "key_third_bins",
                     "value_first_bins", "value_second_bins"):
            check_int(name, getattr(self, name), 4, 256)

    @property
    def key_bins(self) -> int:
        i = self.layer_index
        if self.num_layers < self.key_first_layers or i < self.key_first_layers:
            return self.key_first_bins
        return self.key_second_bins if i < self.key_second_layers else self.key_third_bins

    @property
    def value_bins(self) -> int:
        if self.num_layers < self.key_first_layers or self.layer_index < self.value_first_layers:
            return self.value_first_bins
        return self.value_second_bins


@dataclass(frozen=True)
class CacheGenEncoded(Encoded):
    chunk_size: int
    pages: tuple[torch.Tensor, ...]  # uint8 1-D, one self-contained buffer per chunk

    def nbytes(self, stage: str = "full") -> int:
        self.check_stage(stage)
        return sum(p.numel() for p in self.pages)


def _half_range(bins: int) -> int:
    return bins // 2 - 1


def quantize(x: torch.Tensor, bins: int) -> tuple[np.ndarray, torch.Tensor]:
    """[H, T, D] -> symbols [T, H*D] int32 in [0, 2*MAX], per-token max [T] (input dtype)."""
    h, t, d = x.shape
    rows = x.permute(1, 0, 2).reshape(t, h * d)
    peak = rows.abs().amax(dim=1)  # an element of the input: exact in its dtype
    top = _half_range(bins)
    p = peak.float()
    factor = top / torch.where(p > 0, p, torch.ones_like(p))  # zero token -> symbols MAX
    scaled = rows.float() * factor[:, None]
    # A subnormal peak (bfloat16 / float32 below ~1e-38 / top) makes the factor overflow to
    # Inf: those tokens divide by the peak instead (x / peak is in [-1, 1]; the bytes of
    # every token whose factor is finite are unchanged).
    tiny = ~torch.isfinite(factor)
    if bool(tiny.any()):
        scaled = torch.where(tiny[:, None], rows.float() / p[:, None] * top, scaled)
    sym = torch.round(scaled + top).clamp_(0, 2 * top)
    return sym.to(torch.int32).numpy(), peak


def dequantize(sym: np.ndarray, peak: torch.Tensor, bins: int, h: int, d: int,
               dtype: torch.dtype) -> torch.Tensor:
    """Inverse of ``quantize`` up to rounding: -> [H, T, D] in ``dtype``."""
    top = _half_range(bins)
    x = (torch.from_numpy(sym).float() - top) / top * peak.float()[:, None]
    return to_kv_dtype(x.view(-1, h, d).permute(1, 0, 2).contiguous(), dtype)


def _sizes(tokens: int, channels: int, dtype: torch.dtype, kb: int, vb: int) -> list[int]:
    esize = torch.empty((), dtype=dtype).element_size()
    return [_HEADER.itemsize, tokens * esize, tokens * esize,
            channels * 2 * _half_range(kb) * 2, channels * 2 * _half_range(vb) * 2]


def encode_chunk(k: torch.Tensor, v: torch.Tensor, key_bins: int, value_bins: int) -> torch.Tensor:
    """One chunk of one layer ([H, T, D] each) -> its self-contained uint8 page buffer."""
    k_sym, k_max = quantize(k, key_bins)
    v_sym, v_max = quantize(v, value_bins)
    k_tab = cdf_table(k_sym, 2 * _half_range(key_bins) + 1)
    v_tab = cdf_table(v_sym, 2 * _half_range(value_bins) + 1)
    words = encode_symbols([(k_sym, k_tab), (v_sym, v_tab)])
    header = np.array([(key_bins, value_bins)], dtype=_HEADER)
    parts = [header.tobytes(), _tensor_bytes(k_max), _tensor_bytes(v_max),
             k_tab.astype("<u2").tobytes(), v_tab.astype("<u2").tobytes(),
             words.astype("<u4").tobytes()]
    return torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)


def decode_chunk(buf: torch.Tensor, tokens: int, h: int, d: int,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``encode_chunk``; the bins come from the page's own header."""
    raw = buf.detach().cpu().contiguous().numpy()
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ValueError(f"page buffer must be 1-D uint8, got {buf.dtype} {tuple(buf.shape)}")
    if raw.size < _HEADER.itemsize:
        raise ValueError(f"CacheGen page of {raw.size} bytes is shorter than its header")
    header = np.frombuffer(raw, dtype=_HEADER, count=1)[0]
    kb, vb = int(header["key_bins"]), int(header["value_bins"])
    if not (4 <= kb <= 256 and 4 <= vb <= 256):
        raise ValueError(f"corrupt CacheGen page header: key_bins={kb} value_bins={vb}")
    sizes = _sizes(tokens, h * d, dtype, kb, vb)
    fixed = sum(sizes)
    if raw.size < fixed or (raw.size - fixed) % 4:
        raise ValueError(f"CacheGen page of {raw.size} bytes does not fit {tokens} tokens x "
                         f"{h * d} channels: needs {fixed} fixed bytes + whole uint32 words")
    offs = np.cumsum([0] + sizes)
    k_max = _tensor_from(raw[offs[1]:offs[2]], dtype)
    v_max = _tensor_from(raw[offs[2]:offs[3]], dtype)
    k_tab = raw[offs[3]:offs[4]].view("<u2").reshape(h * d, -1)
    v_tab = raw[offs[4]:offs[5]].view("<u2").reshape(h * d, -1)
    words = raw[fixed:].copy().view("<u4")
    k_sym, v_sym = decode_symbols(words, [(tokens, k_tab), (tokens, v_tab)])
    return (dequantize(k_sym, k_max, kb, h, d, dtype), dequantize(v_sym, v_max, vb, h, d, dtype))


def _chunks(tokens: int, size: int) -> list[tuple[int, int, int]]:
    """(index, token_start, token_end) of each chunk; the last one may be short."""
    return [(i, s, min(s + size, tokens)) for i, s in enumerate(range(0, tokens, size))]


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _tensor_from(raw: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(raw.copy()).view(dtype)


class CacheGenCodec(Codec):
    """CacheGen as in LMCache's encoder, for one layer; see the module docstring."""

    name = "cachegen"
    stages = ("full",)

    def __init__(self, **params):
        self.config = CacheGenConfig(**params)

    @property
    def page_size(self) -> int:
        return self.config.chunk_size

    def params(self) -> dict:
        return asdict(self.config)

    def for_layer(self, layer_index: int, num_layers: int) -> "CacheGenCodec":
        """The same codec for another layer (harnesses that walk a model's layers use this)."""
        return CacheGenCodec(**{**self.params(), "layer_index": layer_index,
                                "num_layers": num_layers})

    def encode(self, k: torch.Tensor, v: torch.Tensor) -> CacheGenEncoded:
        pages = self.encode_pages(k, v)
        return CacheGenEncoded(tuple(k.shape), k.dtype, self.stages, self.config.chunk_size,
                               tuple(p.anchor for p in pages))

    def decode(self, enc: CacheGenEncoded, stage: str = "full"):
        enc.check_stage(stage)
        h, t, d = enc.shape
        spans = [(s, e) for _, s, e in _chunks(t, enc.chunk_size)]
        if len(spans) != len(enc.pages):
            raise ValueError(f"{len(enc.pages)} pages do not cover {t} tokens in chunks of "
                             f"{enc.chunk_size}")
        parts = [decode_chunk(p, e - s, h, d, enc.dtype) for p, (s, e) in zip(enc.pages, spans)]
        return torch.cat([p[0] for p in parts], dim=1), torch.cat([p[1] for p in parts], dim=1)

    def encode_pages(self, k: torch.Tensor, v: torch.Tensor) -> list[EncodedPage]:
        validate_kv(k, v)
        kb, vb = self.config.key_bins, self.config.value_bins
        k, v = k.detach().cpu(), v.detach().cpu()
        return [EncodedPage(i, s, e, encode_chunk(k[:, s:e], v[:, s:e], kb, vb), None)
                for i, s, e in _chunks(k.shape[1], self.config.chunk_size)]

    def decode_page(self, anchor, residual, token_start, token_end, *, num_kv_heads, head_dim,
                    dtype):
        if residual is not None:
            raise ValueError("cachegen is a one-stream codec: residual must be None")
        h, t, d = check_page(token_start, token_end, num_kv_heads, head_dim, dtype,
                             max_tokens=self.config.chunk_size)
        return decode_chunk(anchor, t, h, d, dtype)


register_codec("cachegen", CacheGenCodec)
