"""Fuzz the frame decoder: arbitrary bytes and mutated valid frames raise only WireError."""
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
    st.sampled_from([b"LYNX", b"LYNY"]), st.integers(0, 2), st.integers(0, 255),
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
    _decode(fixed[:54] + struct.pack("<I", crc) + params + payload)
