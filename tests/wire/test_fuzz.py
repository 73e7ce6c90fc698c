"""Fuzz the frame decoder: arbitrary bytes, mutated, cut and spliced valid frames, random
header fields behind a valid CRC and mutated streams of frames raise only WireError; and what
does decode is the one canonical encoding of its frame."""
import pathlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lynx_npu.wire import WireError, WireLimits, decode_frame

GOLDEN = [p.read_bytes() for p in sorted(
    (pathlib.Path(__file__).resolve().parent / "golden").glob("*.bin"))]
LIMITS = WireLimits(max_payload_bytes=1 << 16)
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decode(data: bytes) -> None:
    try:
        decode_frame(data, LIMITS)
    except WireError:
        pass  # the only acceptable failure


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes(data):
    _decode(data)


@FUZZ
@given(st.sampled_from(GOLDEN), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
                                         max_size=6), st.integers(0, 400))
def test_mutated_golden_frames(raw, flips, cut):
    b = bytearray(raw)
    for pos, val in flips:
        b[pos % len(b)] = val
    _decode(bytes(b[:len(b) - cut % (len(b) + 1)]))


@FUZZ
@given(st.sampled_from(GOLDEN), st.binary(min_size=1, max_size=64), st.integers(0, 400))
def test_spliced_golden_frames(raw, junk, at):
    at %= len(raw)
    _decode(raw[:at] + junk + raw[at:])


HEADER_FIELDS = st.tuples(
    st.sampled_from([b"LYNX", b"LYNX", b"LYNY"]), st.sampled_from([3, 3, 3, 2, 4]),
    st.sampled_from([1, 2, 16, 17, 18, 32, 33, 48, 0, 255]),
    st.sampled_from([0, 0, 1]), st.integers(0, 2**64 - 1), st.integers(0, 2**16 - 1),
    st.integers(0, 2**16 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 12),
    st.integers(0, 4), st.integers(0, 3), st.integers(0, 2**16 - 1), st.integers(0, 2**16 - 1))


@FUZZ
@given(HEADER_FIELDS, st.binary(max_size=40), st.binary(max_size=300), st.booleans())
def test_resealed_random_headers(fields, params, payload, good_payload_crc):
    """Random field values behind a *valid* header CRC reach the field checks themselves."""
    import struct

    from lynx_npu.wire import crc32c
    from lynx_npu.wire.frame import HEADER

    pcrc = crc32c(payload) if good_payload_crc else 0
    fixed = HEADER.pack(*fields, len(params), len(payload), pcrc, 0)
    crc = crc32c(params, crc32c(fixed[:54]))
    _decode_canonical(fixed[:54] + struct.pack("<I", crc) + params + payload)


def _decode_canonical(data: bytes) -> None:
    """Whatever decodes re-encodes to the very same bytes: the decoder accepts one encoding
    per frame, so no field can carry bytes past the checks."""
    from lynx_npu.wire import encode_frame
    try:
        frame = decode_frame(data, LIMITS)
    except WireError:
        return
    assert encode_frame(frame) == data


@FUZZ
@given(st.sampled_from(GOLDEN), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
                                         max_size=3))
def test_mutated_frames_that_decode_are_canonical(raw, flips):
    b = bytearray(raw)
    for pos, val in flips:
        b[pos % len(b)] = val
    _decode_canonical(bytes(b))


@FUZZ
@given(st.lists(st.sampled_from(GOLDEN), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3))
def test_a_mutated_stream_raises_only_wire_errors(frames, flips):
    """Frames back to back, mutated, read one after another the way a connection reads them
    (read_frame over a reader of the stream): each read ends in a frame or a WireError."""
    from lynx_npu.wire import BufferReader, read_frame

    b = bytearray(b"".join(frames))
    for pos, val in flips:
        b[pos % len(b)] = val
    reader = BufferReader(bytes(b))
    while reader.pos < len(b):
        try:
            read_frame(reader, LIMITS)
        except WireError:
            break
    assert reader.pos <= len(b)


_FIELD_BITS = [None, 8, 8, 16, 64, 16, 16, 32, 32, 32, 32, 16, 8, 8, 16, 16]  # HEADER[0:16]


def _field_values(bits: int):
    top = (1 << bits) - 1
    return st.one_of(st.integers(0, 4), st.integers(0, top), st.just(top),
                     st.integers(-2, 2).map(lambda d: ("delta", d)))


@FUZZ
@given(st.sampled_from(GOLDEN), st.lists(st.integers(1, 15).flatmap(
    lambda i: st.tuples(st.just(i), _field_values(_FIELD_BITS[i]))), min_size=1, max_size=3),
    st.booleans())
def test_golden_frames_with_fields_replaced_behind_valid_crcs(raw, changes, trim_payload):
    """A valid frame with one to three header fields changed (near their value, at the ends
    of their range, anywhere) and both CRCs resealed: the field checks themselves must refuse
    it with a WireError, or it decodes to its canonical encoding."""
    import struct

    from lynx_npu.wire import crc32c
    from lynx_npu.wire.frame import HEADER

    fields = list(HEADER.unpack_from(raw))
    params_len, payload_len = fields[16], fields[17]
    params = raw[HEADER.size:HEADER.size + params_len]
    payload = raw[HEADER.size + params_len:HEADER.size + params_len + payload_len]
    if trim_payload:
        payload = payload[:len(payload) // 2]
    for i, value in changes:
        if isinstance(value, tuple):
            value = min(max(fields[i] + value[1], 0), (1 << _FIELD_BITS[i]) - 1)
        fields[i] = value
    fields[16:20] = [len(params), len(payload), crc32c(payload), 0]
    fixed = HEADER.pack(*fields)
    crc = crc32c(params, crc32c(fixed[:54]))
    _decode_canonical(fixed[:54] + struct.pack("<I", crc) + params + payload)
