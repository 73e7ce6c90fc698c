"""The lynx codecs evaluated through ``lynx_npu.ops`` (a compiled kernel) instead of the
pure-PyTorch reference: the same config and wire layout, ~100x faster on the CPU, so sweeps
take minutes. The kernels match the reference up to a documented rate of off-by-one codes, so
numbers meant to characterise the format itself come from the reference (the default)."""
from __future__ import annotations

import torch

from lynx_npu.codec import validate_kv
from lynx_npu.codec.lynx import EncodedLynx, LynxCodec

LYNX_FAMILY = ("lynx", "lynx-int4", "lynx-int8")


class OpsLynxCodec:
    """Wraps a lynx-family codec: ``encode``/``decode`` run ``lynx_npu.ops`` on ``backend``."""

    def __init__(self, codec: LynxCodec, backend: str):
        from lynx_npu.ops import Backend

        names = [b.value for b in Backend]
        if backend not in names:
            raise ValueError(f"lynx backend {backend!r} is not one of reference, {', '.join(names)}")
        if codec.name not in LYNX_FAMILY:
            raise ValueError(f"codec {codec.name!r} has no lynx_npu.ops kernel; "
                             f"only {', '.join(LYNX_FAMILY)} do")
        self.codec, self.backend = codec, backend
        self.name, self.stages, self.config = codec.name, codec.stages, codec.config

    def params(self) -> dict:
        return {**self.codec.params(), "ops_backend": self.backend}

    def encode(self, k: torch.Tensor, v: torch.Tensor) -> EncodedLynx:
        from lynx_npu import ops

        validate_kv(k, v)
        anchor, residual = ops.compress(k, v, self.config, backend=self.backend)
        anchor, residual = self.codec.layer_to_stream(anchor, residual, k.shape, k.dtype)
        # The one-stream lynx-int8 keeps both halves; lynx-int4 sends the anchor alone.
        keep_residual = "full" in self.stages
        return EncodedLynx(tuple(k.shape), k.dtype, self.stages, self.config, anchor,
                           residual if keep_residual else None)

    def decode(self, enc: EncodedLynx, stage: str = "full"):
        from lynx_npu import ops

        enc.check_stage(stage)
        anchor, residual = self.codec.layer_from_stream(
            enc.anchor, enc.residual if stage == "full" else None, enc.shape, enc.dtype)
        return ops.decompress(anchor, residual, self.config, enc.shape, enc.dtype,
                              backend=self.backend)


def add_backend_argument(parser) -> None:
    from lynx_npu.ops import Backend

    parser.add_argument("--lynx-backend", default="reference",
                        choices=["reference", *(b.value for b in Backend)],
                        help="run the lynx codecs on a lynx_npu.ops backend (auto, cpu, torch, "
                             "triton, ...) instead of the pure-PyTorch reference (default)")


def with_backend(codec, backend: str):
    """``codec`` itself for the reference or a codec without kernels, else its ops wrapper."""
    if backend == "reference" or codec.name not in LYNX_FAMILY:
        return codec
    return OpsLynxCodec(codec, backend)
