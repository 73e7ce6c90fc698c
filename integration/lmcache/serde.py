"""The Lynx codecs as an LMCache serde: Lynx-compressed KV at LMCache's L2.

LMCache (0.5.x) runs a serde around an L2 adapter (``"serde": {"type": "lynx", ...}`` in the
adapter's JSON): ``serialize`` turns one L1 object (a chunk of KV) into bytes on the way to L2,
``deserialize`` turns them back on a load; the load buffer is sized by
``estimate_serialized_size`` and the fs adapter stores the whole buffer, so the estimate is the
object's exact size, computed from the layout alone.

Layout (LMCache's ``MemoryLayoutDesc`` of an attention object, lmcache_driven transfer): one
``(shape, dtype)`` per kernel group, shape ``[2 (K, V), num_layers, num_tokens, num_kv_heads x
head_dim]``. The description does not split heads from head_dim, so ``head_dim`` is a serde
parameter. Each layer's K and V go through the project's page serde (lynx_npu.ops: the ops
kernels, the bytes of the codec's ``encode_pages``) as ``[num_kv_heads, num_tokens,
head_dim]``.

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

    def __post_init__(self):
        if self.codec not in LYNX_VARIANTS:
            raise ValueError(f"codec={self.codec!r} is not a Lynx codec; the lynx serde takes "
                             f"one of {', '.join(LYNX_VARIANTS)}")
        check_int("head_dim", self.head_dim, 1)
        check_int("max_workers", self.max_workers, 1, 64)
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
        known = {"head_dim", "codec", "stage", "codec_params", "max_workers"}
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
        for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
            shape = tuple(int(s) for s in shape)
            if len(shape) != 4 or shape[0] != KV_SIZE:
                raise ValueError(f"lynx serde: kernel group {i} has shape {shape}; expected "
                                 f"[2 (K, V), num_layers, num_tokens, num_kv_heads * head_dim] "
                                 f"(MLA and flattened layouts are not supported)")
            if dtype not in FLOAT_DTYPES:
                raise ValueError(f"lynx serde: kernel group {i} has dtype {dtype}; expected one "
                                 f"of float16, bfloat16, float32")
            _, layers, tokens, hidden = shape
            if min(layers, tokens, hidden) < 1:
                raise ValueError(f"lynx serde: kernel group {i} has an empty axis: {shape}")
            if hidden % hd:
                raise ValueError(f"lynx serde: kernel group {i}'s last axis {hidden} is not a "
                                 f"multiple of head_dim={hd}")
            out.append(_Group(layers, tokens, hidden // hd, dtype))
        return out

    def _pages(self, g: _Group):
        return self.serde.page_nbytes(g.num_tokens, g.num_kv_heads, self.config.head_dim,
                                      g.dtype)

    def payload_nbytes(self, groups: list[_Group]) -> int:
        total = 0
        for g in groups:
            per_layer = sum(a + ((r or 0) if self.num_streams > 1 else 0)
                            for _, _, a, r in self._pages(g))
            total += g.num_layers * per_layer
        return total

    def nbytes(self, shapes, dtypes) -> int:
        """The exact serialized size of an object of this layout."""
        return HEADER_NBYTES + self.payload_nbytes(self.groups(shapes, dtypes))

    def _config_crc(self, groups: list[_Group]) -> int:
        desc = json.dumps([self.codec.name, self._params, self.stage, self.config.head_dim,
                           [(g.num_layers, g.num_tokens, g.num_kv_heads, _dtype_name(g.dtype))
                            for g in groups]])
        return crc32c(desc.encode())

    # -- serialize -----------------------------------------------------------------------------
    def serialize(self, tensors: list[torch.Tensor], out: np.ndarray) -> int:
        """KV tensors of each group -> ``out`` (uint8, at least ``nbytes``); -> bytes written."""
        groups = self.groups([t.shape for t in tensors], [t.dtype for t in tensors])
        need = HEADER_NBYTES + self.payload_nbytes(groups)
        if out.size < need:
            raise ValueError(f"lynx serde: destination holds {out.size} bytes; the object "
                             f"needs {need}")
        hd = self.config.head_dim
        streams: list[list] = [[] for _ in range(self.num_streams)]
        for t, g in zip(tensors, groups):
            for layer in range(g.num_layers):
                k, v = (t[i, layer].reshape(g.num_tokens, g.num_kv_heads, hd)
                        .transpose(0, 1).contiguous() for i in range(KV_SIZE))
                for page in self.serde.encode(k, v).wait().pages:
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
        # offsets: stream s of (group, layer, page) in the payload
        mv = memoryview(payload)
        pos = [0, 0]
        starts = [0, 0]
        starts[1] = sum(g.num_layers * sum(a for _, _, a, _ in self._pages(g)) for g in groups)
        pos[1] = starts[1]
        for t, g in zip(tensors, groups):
            pages = self._pages(g)
            for layer in range(g.num_layers):
                for ts, te, an, rn in pages:
                    anchor = mv[pos[0]:pos[0] + an]
                    pos[0] += an
                    residual = None
                    if self.num_streams > 1:
                        residual = mv[pos[1]:pos[1] + rn]
                        pos[1] += rn
                    k, v = self.serde.decode_page(anchor, residual, ts, te,
                                                  num_kv_heads=g.num_kv_heads, head_dim=hd,
                                                  dtype=g.dtype)
                    for i, x in enumerate((k, v)):
                        t[i, layer, ts:te].copy_(x.transpose(0, 1).reshape(te - ts, -1))
