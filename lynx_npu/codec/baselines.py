"""Baseline codecs measured beside Lynx: bf16, int8, int4, kivi4 and quantspec.

Every baseline takes ``page_size`` (tokens per wire page, TensorCodec); ``kivi4`` and
``quantspec`` also their ``group_size``.

- ``int8`` / ``int4``: asymmetric, one (scale, min) per token per head.
- ``kivi4``: KIVI's layout: K per channel over groups of 32 tokens, V per token per head.
- ``quantspec``: QuantSpec's hierarchical INT8 = 16 * upper + lower: the upper INT4 is
  asymmetric (K per channel over ``group_size`` tokens, V per token), the lower INT4 quantizes
  the upper's error symmetrically with step scale/16 (QuantSpec §4.2). Stages anchor/full.
"""
from __future__ import annotations

import torch

from . import affine
from .base import FieldSpec, TensorCodec, TensorEncoded, check_int, to_kv_dtype, validate_kv
from .packing import pack_bits, packed_nbytes, unpack_bits
from .registry import register_codec


class BF16Codec(TensorCodec):
    name = "bf16"

    def encode(self, k, v) -> TensorEncoded:
        validate_kv(k, v)
        return TensorEncoded(tuple(k.shape), k.dtype, self.stages,
                             (("k", "full", k.to(torch.bfloat16).contiguous()),
                              ("v", "full", v.to(torch.bfloat16).contiguous())))

    def field_specs(self, shape, dtype):
        return tuple(FieldSpec(w, "full", torch.bfloat16, tuple(shape)) for w in "kv")

    def decode(self, enc, stage="full"):
        enc.check_stage(stage)
        # float16 65504 is bfloat16 65536: back in float16 that would be Inf
        return tuple(to_kv_dtype(enc[w].float(), enc.dtype) for w in "kv")


class AffineCodec(TensorCodec):
    """Asymmetric uniform quantization with a per-tensor (K, V) grouping axis."""

    def __init__(self, bits: int, k_axis: str, v_axis: str, group_size: int = 32,
                 page_size: int = 256):
        super().__init__(page_size)
        check_int("bits", bits, 2, 8)
        check_int("group_size", group_size, 1)
        self.bits, self.group_size = bits, group_size
        self.axes = {"k": k_axis, "v": v_axis}

    def encode(self, k, v) -> TensorEncoded:
        validate_kv(k, v)
        fields = []
        for which, x in (("k", k), ("v", v)):
            codes, scale, mn = affine.quantize(x, self.bits, self.axes[which], self.group_size,
                                               which)
            fields += [(f"{which}_codes", "full", pack_bits(codes.reshape(-1), self.bits)),
                       (f"{which}_scale", "full", scale), (f"{which}_min", "full", mn)]
        return TensorEncoded(tuple(k.shape), k.dtype, self.stages, tuple(fields))

    def field_specs(self, shape, dtype):
        out = []
        for which in "kv":
            scalars = affine.scalar_shape(shape, self.axes[which], self.group_size)
            out += [FieldSpec(f"{which}_codes", "full", torch.uint8,
                              (packed_nbytes(_numel(shape), self.bits),)),
                    FieldSpec(f"{which}_scale", "full", affine.SCALAR_DTYPE, scalars),
                    FieldSpec(f"{which}_min", "full", affine.SCALAR_DTYPE, scalars)]
        return tuple(out)

    def decode(self, enc, stage="full"):
        enc.check_stage(stage)
        out = []
        for which in "kv":
            codes = unpack_bits(enc[f"{which}_codes"], self.bits, _numel(enc.shape)).view(enc.shape)
            out.append(to_kv_dtype(affine.dequantize(codes, enc[f"{which}_scale"],
                                                     enc[f"{which}_min"], self.axes[which],
                                                     self.group_size), enc.dtype))
        return out[0], out[1]


def _numel(shape) -> int:
    h, t, d = shape
    return h * t * d


class Int8Codec(AffineCodec):
    name = "int8"

    def __init__(self, page_size: int = 256):
        super().__init__(8, "token", "token", page_size=page_size)


class Int4Codec(AffineCodec):
    name = "int4"

    def __init__(self, page_size: int = 256):
        super().__init__(4, "token", "token", page_size=page_size)


class Kivi4Codec(AffineCodec):
    name = "kivi4"

    def __init__(self, group_size: int = 32, page_size: int = 256):
        super().__init__(4, "channel", "token", group_size, page_size)

    def params(self) -> dict:
        return {**super().params(), "group_size": self.group_size}


class QuantSpecCodec(TensorCodec):
    name = "quantspec"
    stages = ("anchor", "full")

    def __init__(self, group_size: int = 128, page_size: int = 256):
        super().__init__(page_size)
        check_int("group_size", group_size, 1)
        self.group_size = group_size
        self.axes = {"k": "channel", "v": "token"}

    def params(self) -> dict:
        return {**super().params(), "group_size": self.group_size}

    def encode(self, k, v) -> TensorEncoded:
        validate_kv(k, v)
        upper, lower = [], []
        for which, x in (("k", k), ("v", v)):
            axis = self.axes[which]
            codes, scale, mn = affine.quantize(x, 4, axis, self.group_size, which)
            err = x.float() - affine.dequantize(codes, scale, mn, axis, self.group_size)
            lstep = affine.step(scale, axis, x.shape[1], self.group_size) / 16
            low = torch.where(lstep > 0, err / torch.where(lstep > 0, lstep, 1.0), 0.0)
            low = low.round().clamp(-8, 7).to(torch.int64)
            upper += [(f"{which}_upper", "anchor", pack_bits(codes.reshape(-1), 4)),
                      (f"{which}_scale", "anchor", scale), (f"{which}_min", "anchor", mn)]
            lower.append((f"{which}_lower", "full", pack_bits(low.reshape(-1), 4)))
        return TensorEncoded(tuple(k.shape), k.dtype, self.stages, tuple(upper + lower))

    def field_specs(self, shape, dtype):
        codes = (packed_nbytes(_numel(shape), 4),)
        upper, lower = [], []
        for which in "kv":
            scalars = affine.scalar_shape(shape, self.axes[which], self.group_size)
            upper += [FieldSpec(f"{which}_upper", "anchor", torch.uint8, codes),
                      FieldSpec(f"{which}_scale", "anchor", affine.SCALAR_DTYPE, scalars),
                      FieldSpec(f"{which}_min", "anchor", affine.SCALAR_DTYPE, scalars)]
            lower.append(FieldSpec(f"{which}_lower", "full", torch.uint8, codes))
        return tuple(upper + lower)

    def decode(self, enc, stage="full"):
        enc.check_stage(stage)
        out = []
        n = _numel(enc.shape)
        for which in "kv":
            axis = self.axes[which]
            codes = unpack_bits(enc[f"{which}_upper"], 4, n).view(enc.shape)
            scale = enc[f"{which}_scale"]
            x = affine.dequantize(codes, scale, enc[f"{which}_min"], axis, self.group_size)
            if stage == "full":
                low = unpack_bits(enc[f"{which}_lower"], 4, n, signed=True).view(enc.shape)
                x = x + low.float() * (affine.step(scale, axis, enc.shape[1], self.group_size) / 16)
            out.append(to_kv_dtype(x, enc.dtype))
        return out[0], out[1]


register_codec("bf16", BF16Codec)
register_codec("int8", Int8Codec)
register_codec("int4", Int4Codec)
register_codec("kivi4", Kivi4Codec)
register_codec("quantspec", QuantSpecCodec)
