"""Golden payloads: real ``get_codec(...).encode_pages`` output on a small fixed KV, frozen as
payload format 9 (lynx_npu.codec.registry.PAYLOAD_FORMAT) in frame format 3.

For every case, tests/wire/make_golden.py writes to golden/payload/:

    <case>.frames.bin  the frames a Sender makes of the layer (request RID, layer 0 of 1):
                       page by page, the anchor frame then the residual frame (if any)
    <case>.expect.bin  what a receiver decodes from those frames alone, stage by stage
                       (``stages``: anchor-only then full for two-stream codecs), each stage
                       K then V as [H, T, D] in the KV dtype, little-endian

The KV comes from numpy's legacy RandomState (its streams are frozen by numpy's compatibility
policy), so the fixtures do not move with a torch or numpy release.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

import lynx_npu
from lynx_npu.codec import codec_from_wire, wire_params
from lynx_npu.wire import (DTYPE_CODES, BufferReader, Frame, Kind, encode_frame, params_to_json,
                           read_frame)

SEED = 20261125
SHAPE = (2, 40, 8)  # [num_kv_heads, num_tokens, head_dim]: 4 sinks + 36 tokens, ragged chunks
RID = 0x5EED


@dataclass(frozen=True)
class Case:
    codec: str
    dtype: torch.dtype
    overrides: dict = field(default_factory=dict)
    shape: tuple[int, int, int] = SHAPE

    def build(self):
        return lynx_npu.get_codec(self.codec, **self.overrides)


CASES: dict[str, Case] = {
    "lynx": Case("lynx", torch.bfloat16),                              # get_codec("lynx")
    "lynx_paper": Case("lynx", torch.bfloat16, {"preset": "paper"}),
    # float16 chunk scalars: previews in the anchor, the exact scalars after the residual codes
    "lynx_f16_scalars": Case("lynx", torch.bfloat16, {"scalar_grid": "float16"}),
    "lynx_f16_window": Case("lynx", torch.bfloat16, {"page_size": 64, "chunk_size": 16,
                                                     "recent_tokens": 16,
                                                     "scalar_grid": "float16"}, (1, 1033, 8)),
    "lynx_pages": Case("lynx", torch.bfloat16, {"page_size": 16, "chunk_size": 8}),  # 3 pages
    # 1033 tokens (>= 64 x 16): a recent-token window of 16, 11 rows in one page, 5 in the last
    "lynx_window": Case("lynx", torch.bfloat16, {"page_size": 64, "chunk_size": 16,
                                                 "recent_tokens": 16}, (1, 1033, 8)),
    # a K anchor of 5 bits beside V's 4 (a calibrated layer's split, lynx_config.for_layer)
    "lynx_k5": Case("lynx", torch.bfloat16, {"anchor_bits": 5}),
    # V chunks of a whole head_dim (a layer planned at v_chunk_size 64 on SmolLM2's head_dim 64)
    "lynx_v8": Case("lynx", torch.bfloat16, {"v_chunk_size": 8}),
    "lynx_int4": Case("lynx-int4", torch.bfloat16),
    "lynx_int8": Case("lynx-int8", torch.float16),
    "int8": Case("int8", torch.float16),
    "int4": Case("int4", torch.bfloat16),
    "kivi4": Case("kivi4", torch.bfloat16),
    "quantspec": Case("quantspec", torch.bfloat16),
    "bf16": Case("bf16", torch.float32),
    "cachegen": Case("cachegen", torch.bfloat16),
}


def make_kv(dtype: torch.dtype, shape=SHAPE) -> tuple[torch.Tensor, torch.Tensor]:
    """K with per-channel scales and offsets and a large first token (a sink), Laplacian V."""
    rng = np.random.RandomState(SEED)
    h, t, d = shape
    k = rng.standard_normal((h, t, d)) * rng.uniform(0.5, 3.0, (h, 1, d)) \
        + 2 * rng.standard_normal((h, 1, d))
    k[:, 0] *= 8
    v = rng.laplace(0.0, 1.0, (h, t, d))
    return torch.from_numpy(k).to(dtype), torch.from_numpy(v).to(dtype)


def encode_case(case: Case) -> bytes:
    """The frames of the case's layer, back to back, as the Sender builds them."""
    codec = case.build()
    k, v = make_kv(case.dtype, case.shape)
    h, t, d = k.shape
    params = params_to_json(wire_params(codec))
    out = []
    for page in codec.encode_pages(k, v):
        for kind, data in ((Kind.ANCHOR, page.anchor), (Kind.RESIDUAL, page.residual)):
            if data is not None:
                out.append(encode_frame(Frame(
                    kind, RID, 0, 1, page.index, page.token_start, page.token_end, t,
                    codec.codec_id, DTYPE_CODES[case.dtype], 0, h, d, params,
                    data.contiguous().numpy().tobytes())))
    return b"".join(out)


def decode_frames(raw: bytes) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """What a receiver makes of the frames alone: [(stage, K, V)], the codec rebuilt from the
    frames' parameters; two-stream codecs give the anchor-only stage, then the full one."""
    reader, frames = BufferReader(raw), []
    while reader.pos < len(reader.view):
        frames.append(read_frame(reader))
    first = frames[0]
    codec = codec_from_wire(first.codec_id, first.params_dict())
    pages: dict[int, dict[Kind, Frame]] = {}
    for f in frames:
        pages.setdefault(f.page, {})[f.kind] = f
    two_stream = any(Kind.RESIDUAL in p for p in pages.values())
    stages = (codec.stages[0], codec.stages[-1]) if two_stream else (codec.stages[-1],)
    out = []
    for stage in stages:
        shape = (first.num_kv_heads, first.num_tokens, first.head_dim)
        k = torch.zeros(shape, dtype=first.torch_dtype)
        v = torch.zeros_like(k)
        for page in pages.values():
            anchor = page[Kind.ANCHOR]
            residual = page.get(Kind.RESIDUAL) if stage == "full" else None
            kp, vp = codec.decode_page(
                _bytes(anchor), None if residual is None else _bytes(residual),
                anchor.token_start, anchor.token_end, num_kv_heads=anchor.num_kv_heads,
                head_dim=anchor.head_dim, dtype=anchor.torch_dtype)
            k[:, anchor.token_start:anchor.token_end] = kp
            v[:, anchor.token_start:anchor.token_end] = vp
        out.append((stage, k, v))
    return out


def expectation_bytes(decoded: list[tuple[str, torch.Tensor, torch.Tensor]]) -> bytes:
    return b"".join(x.contiguous().view(torch.uint8).numpy().tobytes()
                    for _, k, v in decoded for x in (k, v))


def _bytes(frame: Frame) -> torch.Tensor:
    return torch.frombuffer(bytearray(frame.payload), dtype=torch.uint8)
