"""Format v1 is frozen: today's encoder must produce the golden bytes, the decoder must read
them back to the same frames. A failure here means the wire format changed (bump VERSION)."""
import pathlib

import pytest

from lynx_npu.wire import HEADER_SIZE, decode_frame, encode_frame

from .golden_frames import FRAMES

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_encoder_reproduces_golden_bytes(name):
    assert encode_frame(FRAMES[name]) == (GOLDEN / f"{name}.bin").read_bytes()


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_decoder_reads_golden_bytes(name):
    frame = decode_frame((GOLDEN / f"{name}.bin").read_bytes())
    expected = FRAMES[name]
    assert bytes(frame.payload) == bytes(expected.payload)
    assert frame == type(frame)(**{**expected.__dict__, "payload": frame.payload})


def test_header_layout_by_hand():
    """Spot-check offsets against the table in frame.py, independently of the struct."""
    raw = (GOLDEN / "anchor_lynx.bin").read_bytes()
    le = lambda a, b: int.from_bytes(raw[a:b], "little")  # noqa: E731
    assert raw[:4] == b"LYNX" and raw[4] == 1 and raw[5] == 1  # magic, version, ANCHOR
    assert le(8, 16) == 0x0123456789ABCDEF
    assert (le(16, 18), le(18, 20), le(20, 24)) == (3, 30, 2)          # layer, layers, page
    assert (le(24, 28), le(28, 32), le(32, 36)) == (516, 772, 8192)   # token range, total
    assert (le(36, 38), raw[38], raw[39]) == (9, 2, 0)                 # lynx, bf16, ref_kind
    assert (le(40, 42), le(42, 44)) == (3, 64)
    params_len, payload_len = le(44, 46), le(46, 50)
    assert HEADER_SIZE == 58 and len(raw) == HEADER_SIZE + params_len + payload_len
    assert raw[HEADER_SIZE:HEADER_SIZE + params_len].startswith(b'{"alpha_k":3.0,')
