"""Frame encode/decode: round trips, and each malformed field rejected by name."""
import struct

import pytest
import torch

import lynx_npu
from lynx_npu.codec import codec_from_wire, wire_params
from lynx_npu.wire import (HEADER_SIZE, NONCE_BYTES, ChecksumError, Frame, FrameFieldError,
                           Kind, TruncatedFrameError, UnknownCodecError, UnsupportedVersionError,
                           WireError, WireLimits, crc32c, decode_frame, encode_frame,
                           frame_pages, page_table, params_from_json, params_to_json)

from .golden_frames import FRAMES


def _with_header(raw: bytes, offset: int, fmt: str, value) -> bytes:
    """Patch a header field and re-seal the header CRC, so the field check (not the CRC)
    is what rejects it."""
    b = bytearray(raw)
    struct.pack_into("<" + fmt, b, offset, value)
    params_len = int.from_bytes(b[44:46], "little")
    crc = crc32c(bytes(b[HEADER_SIZE:HEADER_SIZE + params_len]), crc32c(bytes(b[:54])))
    b[54:58] = crc.to_bytes(4, "little")
    return bytes(b)


def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value


def test_round_trip_real_codec_page():
    codec = lynx_npu.get_codec("lynx")
    k = torch.randn(2, 300, 16, dtype=torch.bfloat16)
    page = codec.encode_pages(k, -k)[1]
    frame = Frame(Kind.RESIDUAL, 1, 0, 1, page.index, page.token_start, page.token_end, 300,
                  codec.codec_id, 2, 0, 2, 16, params_to_json(wire_params(codec)),
                  memoryview(page.residual.numpy()))
    back = decode_frame(encode_frame(frame))
    assert bytes(back.payload) == page.residual.numpy().tobytes()
    assert back.key == (1, Kind.RESIDUAL, 0, page.index)
    assert codec_from_wire(back.codec_id, back.params_dict()).params() == codec.params()


@pytest.mark.parametrize("offset,fmt,value,field,exc", [
    (0, "4s", b"LYNY", "magic", FrameFieldError),
    (4, "B", 6, "version", UnsupportedVersionError),
    (4, "B", 4, "version", UnsupportedVersionError),
    (4, "B", 3, "version", UnsupportedVersionError),
    (4, "B", 2, "version", UnsupportedVersionError),
    (4, "B", 1, "version", UnsupportedVersionError),
    (5, "B", 3, "kind", FrameFieldError),
    (6, "H", 256, "extra_pages", FrameFieldError),  # 257 pages in 256 tokens
    (36, "H", 77, "codec_id", UnknownCodecError),
    (38, "B", 9, "dtype", FrameFieldError),
    (16, "H", 30, "layer", FrameFieldError),
    (18, "H", 0, "num_layers", FrameFieldError),
    (28, "I", 8193, "token_end", FrameFieldError),
    (24, "I", 772, "token_end", FrameFieldError),
    (20, "I", 517, "page", FrameFieldError),
    (40, "H", 0, "num_kv_heads", FrameFieldError),
    (42, "H", 5000, "head_dim", FrameFieldError),
    (39, "B", 1, "ref_kind", FrameFieldError),
    (44, "H", 5000, "params_len", FrameFieldError),
    (46, "I", 0xFFFFFFF0, "payload_len", FrameFieldError),
])
def test_bad_field_is_named(offset, fmt, value, field, exc):
    raw = _with_header(encode_frame(FRAMES["anchor_lynx"]), offset, fmt, value)
    with pytest.raises(exc) as info:
        decode_frame(raw)
    assert info.value.field == field and isinstance(info.value, WireError)
    assert isinstance(info.value, ValueError)


def test_unknown_version_is_reported_before_the_crc():
    raw = bytearray(encode_frame(FRAMES["ack"]))
    raw[4] = 7  # a future version may move the CRC; the version must be what is reported
    with pytest.raises(UnsupportedVersionError, match="version 7"):
        decode_frame(bytes(raw))


def test_payload_length_bounded_by_the_page_shape():
    """A 1-token page cannot announce a multi-megabyte payload (allocation guard)."""
    f = FRAMES["anchor_int8_fp16"]
    raw = _with_header(encode_frame(f), 46, "I", 1 << 20)
    with pytest.raises(FrameFieldError, match="payload_len"):
        decode_frame(raw)
    small = WireLimits(max_payload_bytes=64)
    with pytest.raises(FrameFieldError, match="payload_len"):
        decode_frame(encode_frame(f), small)


def test_corrupt_payload_carries_the_header_for_a_nack():
    raw = bytearray(encode_frame(FRAMES["anchor_lynx"]))
    raw[-5] ^= 0x10
    with pytest.raises(ChecksumError) as info:
        decode_frame(bytes(raw))
    assert info.value.where == "payload" and info.value.header.key == FRAMES["anchor_lynx"].key


def test_corrupt_header_or_params_is_a_header_checksum_error():
    for pos in (10, 30, HEADER_SIZE + 3):
        raw = bytearray(encode_frame(FRAMES["anchor_lynx"]))
        raw[pos] ^= 0x01
        with pytest.raises(ChecksumError) as info:
            decode_frame(bytes(raw))
        assert info.value.where == "header" and info.value.header is None


def test_truncated_and_trailing():
    raw = encode_frame(FRAMES["residual_lynx"])
    for n in (0, 10, HEADER_SIZE, len(raw) - 1):
        with pytest.raises(TruncatedFrameError):
            decode_frame(raw[:n])
    with pytest.raises(WireError, match="trailing"):
        decode_frame(raw + b"\0")


def test_control_payload_sizes():
    for payload in (b"short", bytes(NONCE_BYTES), bytes(NONCE_BYTES + 4097)):
        with pytest.raises(FrameFieldError, match="HELLO payload must be a 32-byte nonce"):
            decode_frame(encode_frame(Frame(Kind.HELLO, payload=payload)))
    hello = Frame(Kind.HELLO, payload=bytes(NONCE_BYTES) + b"{}")
    assert bytes(decode_frame(encode_frame(hello)).payload) == bytes(hello.payload)
    with pytest.raises(FrameFieldError, match="ref_kind"):
        decode_frame(encode_frame(Frame(Kind.ACK, 1, ref_kind=0)))
    with pytest.raises(FrameFieldError, match="ERROR text"):
        decode_frame(encode_frame(Frame(Kind.ERROR, payload=b"x" * 2000)))
    with pytest.raises(FrameFieldError, match="UTF-8"):
        decode_frame(encode_frame(Frame(Kind.ERROR, payload=b"\xff\xfe")))


@pytest.mark.parametrize("kind,ref_kind,ok", [
    (Kind.ERROR, 0, True), (Kind.ERROR, Kind.HELLO, True), (Kind.ERROR, Kind.AUTH, True),
    (Kind.ERROR, Kind.ANCHOR, False), (Kind.ERROR, Kind.AUTH_OK, False),
    (Kind.AUTH, Kind.HELLO, False), (Kind.AUTH_OK, 1, False),
])
def test_ref_kind_of_control_frames(kind, ref_kind, ok):
    """ERROR may name the handshake frame it refuses; other control frames carry none."""
    raw = encode_frame(Frame(kind, ref_kind=ref_kind, payload=b""))
    if ok:
        assert decode_frame(raw).ref_kind == ref_kind
    else:
        with pytest.raises(FrameFieldError, match="ref_kind"):
            decode_frame(raw)


@pytest.mark.parametrize("raw,match", [
    (b'{"b":1,"a":2}', "canonical"), (b"[1]", "object"), (b'{"a":[1]}', "scalar"),
    (b"\xff", "ASCII"), (b'{"a": 1}', "canonical"), (b'{"a":NaN}', "non-finite"),
])
def test_params_must_be_canonical_flat_json(raw, match):
    with pytest.raises(FrameFieldError, match=match):
        params_from_json(raw)


def test_params_to_json_rejects_non_json():
    with pytest.raises(ValueError, match="not JSON-able"):
        params_to_json({"x": object()})
    assert params_to_json({"b": 1, "a": "x"}) == b'{"a":"x","b":1}'


def test_encoder_rejects_out_of_range_field():
    with pytest.raises(ValueError, match="does not fit"):
        encode_frame(Frame(Kind.ACK, request_id=-1, ref_kind=1))


# -- multi-page data frames (frame format 4) -----------------------------------------------------
def _pages_frame(ends, sizes, table=None, extra=None, **kw):
    body = bytes(range(sum(sizes))) if sum(sizes) < 256 else bytes(sum(sizes))
    return Frame(Kind.ANCHOR, 9, 0, 1, 2, 512, ends[-1], 4096, 2, 1, 0, 2, 4,
                 params_to_json({"page_size": 256, "payload_format": 2}),
                 (page_table(ends, sizes) if table is None else table) + body,
                 extra_pages=len(ends) - 1 if extra is None else extra, **kw)


def test_multi_page_frame_splits_into_its_pages():
    frame = decode_frame(encode_frame(_pages_frame([768, 1024, 1030], [10, 20, 5])))
    pages = frame_pages(frame)
    assert [(p.page, p.token_start, p.token_end) for p in pages] == [
        (2, 512, 768), (3, 768, 1024), (4, 1024, 1030)]
    assert [bytes(p.payload) for p in pages] == [bytes(range(10)), bytes(range(10, 30)),
                                                 bytes(range(30, 35))]
    one = FRAMES["anchor_lynx"]
    assert [(p.page, bytes(p.payload)) for p in frame_pages(one)] == [(2, bytes(one.payload))]


@pytest.mark.parametrize("ends,sizes,table,why", [
    ([768, 1024, 1030], [10, 20, 5], page_table([1024, 768, 1030], [10, 20, 5]), "entry 1 ends"),
    ([768, 1024, 1030], [10, 20, 5], page_table([768, 1024, 1029], [10, 20, 5]), "entry 2 ends"),
    ([768, 1024, 1030], [10, 20, 5], page_table([768, 768, 1030], [10, 20, 5]), "entry 1 ends"),
    ([768, 1024, 1030], [10, 20, 5], page_table([768, 1024, 1030], [10, 20, 4]), "covers 58"),
    ([768, 1024, 1030], [10, 20, 5], page_table([768, 1024, 1030], [10, 30, 5]), "claims 30"),
    ([768, 1024, 1030], [10, 20, 5], page_table([768, 1024, 1030], [0, 30, 5]), "claims 0"),
    ([768, 1030], [1, 1], b"\x01", "cannot hold the table"),
])
def test_a_bad_page_table_is_named(ends, sizes, table, why):
    """The frame is intact (CRCs hold), its page table is not: frame_pages says why."""
    frame = decode_frame(encode_frame(_pages_frame(ends, sizes, table, extra=len(ends) - 1)))
    with pytest.raises(FrameFieldError, match=why) as info:
        frame_pages(frame)
    assert info.value.field == "payload"


def test_extra_pages_only_on_data_frames():
    raw = _with_header(encode_frame(FRAMES["ack"]), 6, "H", 1)
    with pytest.raises(FrameFieldError) as info:
        decode_frame(raw)
    assert info.value.field == "extra_pages"
