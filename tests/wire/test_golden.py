"""Frame format v5 is frozen: today's encoder must produce the golden bytes, the decoder must
read them back to the same frames. A failure here means the frame format changed (bump
VERSION and regenerate with tests/wire/make_golden.py --force)."""
import pathlib

import pytest

from lynx_npu.codec import codec_from_wire
from lynx_npu.wire import (HEADER_SIZE, NONCE_BYTES, Compat, UnsupportedVersionError,
                           decode_frame, encode_frame)

from .golden_frames import FRAMES, INT8_PARAMS, LYNX_PARAMS, RECEIVER, SENDER

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
    assert raw[:4] == b"LYNX" and raw[4] == 5 and raw[5] == 1  # magic, version, ANCHOR
    assert le(6, 8) == 0                                               # extra_pages: one page
    assert le(8, 16) == 0x0123456789ABCDEF
    assert (le(16, 18), le(18, 20), le(20, 24)) == (3, 30, 2)          # layer, layers, page
    assert (le(24, 28), le(28, 32), le(32, 36)) == (516, 772, 8192)   # token range, total
    assert (le(36, 38), raw[38], raw[39]) == (9, 2, 0)                 # lynx, bf16, ref_kind
    assert (le(40, 42), le(42, 44)) == (3, 64)
    params_len, payload_len = le(44, 46), le(46, 50)
    assert HEADER_SIZE == 58 and len(raw) == HEADER_SIZE + params_len + payload_len
    params = raw[HEADER_SIZE:HEADER_SIZE + params_len]
    assert params.startswith(b'{"alpha_k":3.0,') and b'"payload_format":9,' in params


def test_hello_and_error_layout_by_hand():
    raw = (GOLDEN / "hello_sender.bin").read_bytes()
    assert raw[5] == 16 and int.from_bytes(raw[44:46], "little") == 0  # HELLO, no params
    payload = raw[HEADER_SIZE:]
    assert payload[:NONCE_BYTES] == bytes(range(32))
    assert Compat.from_json(payload[NONCE_BYTES:]) == SENDER
    assert payload[NONCE_BYTES:].startswith(b'{"codecs":[["lynx",{"alpha_k":3.0,')
    assert payload.endswith(b'"payload_format":9,"session":"00112233445566778899aabbccddeeff"}')
    payload = (GOLDEN / "hello_receiver.bin").read_bytes()[HEADER_SIZE:]
    assert Compat.from_json(payload[NONCE_BYTES:]) == RECEIVER
    assert payload[NONCE_BYTES:] == (
        b'{"codecs":[],"limits":{"max_head_dim":1024,"max_kv_heads":1024,"max_layers":4096,'
        b'"max_params_bytes":1024,"max_payload_bytes":67108864,"max_request_bytes":8589934592,'
        b'"max_tokens":4194304},"payload_format":9}')
    raw = (GOLDEN / "error_incompatible.bin").read_bytes()
    assert (raw[5], raw[39]) == (48, 16)  # ERROR, ref_kind HELLO: refused as incompatible


def test_literal_parameters_are_complete_payload_format_9_sets():
    lynx = codec_from_wire(9, LYNX_PARAMS)
    assert lynx.params()["alpha_k"] == 3.0
    assert lynx.config.layer_anchor_bits == ((18, 5, 4),)
    assert lynx.config.layer_v_chunk_size == ((3, 64),)
    assert lynx.config.scalar_grid == "byte"
    assert codec_from_wire(2, INT8_PARAMS).params() == {"page_size": 256}
    # a format-8 peer sent the same parameters, but its windowed pages' residual streams
    # repeated the window's rows: refused by name, never decoded as format 9
    with pytest.raises(ValueError, match="payload_format=8 is not supported: this build reads "
                                         "payload format 9"):
        codec_from_wire(9, {**LYNX_PARAMS, "payload_format": 8})
    old = {k: v for k, v in LYNX_PARAMS.items() if k != "scalar_grid"}
    with pytest.raises(ValueError, match="scalar_grid"):
        codec_from_wire(9, old)  # a format-9 frame must carry every parameter


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_an_older_peer_is_refused_by_version(version):
    """The first frame a format-1, -2, -3 or -4 peer sends (kept from before each bump) is
    refused, naming both versions, before anything else of it is read."""
    raw = (GOLDEN / f"v{version}_hello.bin").read_bytes()
    assert raw[4] == version
    with pytest.raises(UnsupportedVersionError, match=f"format version {version} is not "
                                                      r"supported \(this decoder reads "
                                                      r"version 5\)"):
        decode_frame(raw)


def test_multi_page_layout_by_hand():
    """Frame format 4: extra_pages at offset 6, then a (token_end, nbytes) u32 pair per page
    opening the payload, then the pages' bytes."""
    raw = (GOLDEN / "residual_lynx_pages.bin").read_bytes()
    le = lambda a, b: int.from_bytes(raw[a:b], "little")  # noqa: E731
    assert raw[5] == 2 and le(6, 8) == 2                               # RESIDUAL, 3 pages
    assert (le(20, 24), le(24, 28), le(28, 32)) == (0, 0, 772)         # first page, tokens
    body = raw[HEADER_SIZE + le(44, 46):]
    assert len(body) == le(46, 50) == 3 * 8 + 96
    assert [(le(HEADER_SIZE + le(44, 46) + 8 * i, HEADER_SIZE + le(44, 46) + 8 * i + 4),
             int.from_bytes(body[8 * i + 4:8 * i + 8], "little")) for i in range(3)] == [
        (260, 40), (516, 32), (772, 24)]
