import pytest
import torch
from hypothesis import given, strategies as st

from lynx_npu.codec.packing import pack_bits, packed_nbytes, unpack_bits


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [1, 7, 8, 9, 63, 64, 1000])
def test_roundtrip_is_bit_exact(bits, n):
    v = torch.randint(0, 1 << bits, (n,), generator=torch.Generator().manual_seed(n))
    packed = pack_bits(v, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == packed_nbytes(n, bits)
    assert torch.equal(unpack_bits(packed, bits, n), v)


def test_nibble_order_is_low_first():
    assert pack_bits(torch.tensor([1, 2, 15, 0]), 4).tolist() == [0x21, 0x0F]
    assert pack_bits(torch.tensor([1, 2, 3, 0]), 2).tolist() == [0b00111001]
    # 6-bit: 4 values in 3 bytes, LSB-first stream
    assert pack_bits(torch.tensor([63, 0, 0, 1]), 6).tolist() == [63, 0, 1 << 2]


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6])
def test_signed_values_sign_extend(bits):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    v = torch.arange(lo, hi + 1)
    assert torch.equal(unpack_bits(pack_bits(v, bits), bits, v.numel(), signed=True), v)


def test_unused_high_bits_are_zero():
    assert pack_bits(torch.tensor([7]), 3).tolist() == [7]


def test_short_stream_is_an_error():
    with pytest.raises(ValueError, match="need"):
        unpack_bits(torch.zeros(2, dtype=torch.uint8), 4, 5)
    with pytest.raises(ValueError, match="bits"):
        pack_bits(torch.tensor([1]), 9)


@given(bits=st.integers(1, 8), data=st.data())
def test_roundtrip_property(bits, data):
    vals = data.draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=1, max_size=200))
    v = torch.tensor(vals)
    assert unpack_bits(pack_bits(v, bits), bits, len(vals)).tolist() == vals
