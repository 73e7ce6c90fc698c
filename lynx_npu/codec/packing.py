"""Dense bit packing shared by every codec and kernel.

Format: values of ``bits`` bits each are laid LSB-first into a little-endian bit stream, so value
``i`` occupies stream bits ``[i*bits, (i+1)*bits)``. Two 4-bit values share a byte (low nibble
first); 2-bit: four per byte; 3-, 5-, 6-bit values pack 8 values into ``bits`` bytes. A stream of
``n`` values takes exactly ``ceil(n * bits / 8)`` bytes; the unused high bits of the last byte
are zero.
"""
from __future__ import annotations

import torch


def packed_nbytes(num_values: int, bits: int) -> int:
    return (num_values * bits + 7) // 8


def _check_bits(bits: int) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"{bits=} must be in [1, 8]")


def pack_bits(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack the low ``bits`` bits of each value of a 1-D integer tensor into uint8 bytes."""
    _check_bits(bits)
    n = values.numel()
    v = values.reshape(-1).to(torch.int64) & ((1 << bits) - 1)
    pad = (-n) % 8
    if pad:
        v = torch.cat([v, v.new_zeros(pad)])
    groups = v.view(-1, 8)  # 8 values -> exactly `bits` bytes
    shifts = torch.arange(8, device=v.device, dtype=torch.int64) * bits
    words = (groups << shifts).sum(dim=1)  # < 2**64: 8 * bits <= 64
    byte_shifts = torch.arange(bits, device=v.device, dtype=torch.int64) * 8
    out = ((words.unsqueeze(1) >> byte_shifts) & 0xFF).to(torch.uint8).reshape(-1)
    return out[: packed_nbytes(n, bits)].contiguous()


def unpack_bits(data: torch.Tensor, bits: int, num_values: int, signed: bool = False) -> torch.Tensor:
    """Inverse of :func:`pack_bits`; ``signed`` sign-extends two's complement values."""
    _check_bits(bits)
    need = packed_nbytes(num_values, bits)
    if data.numel() < need:
        raise ValueError(f"packed stream has {data.numel()} bytes, need {need} for "
                         f"{num_values} values of {bits} bits")
    b = data.reshape(-1)[:need].to(torch.int64)
    pad = (-need) % bits
    if pad:
        b = torch.cat([b, b.new_zeros(pad)])
    byte_shifts = torch.arange(bits, device=b.device, dtype=torch.int64) * 8
    words = (b.view(-1, bits) << byte_shifts).sum(dim=1)
    shifts = torch.arange(8, device=b.device, dtype=torch.int64) * bits
    v = ((words.unsqueeze(1) >> shifts) & ((1 << bits) - 1)).reshape(-1)[:num_values]
    if signed:
        v = torch.where(v >= (1 << (bits - 1)), v - (1 << bits), v)
    return v
