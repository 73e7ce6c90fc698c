"""Payload format 4 is frozen: real codec output on a fixed KV (golden_payloads.py) must be
the committed frames byte for byte, and the committed frames must decode, through a codec
rebuilt from their parameters alone, to the committed expectation. A failure means a codec's
bytes or defaults changed: bump PAYLOAD_FORMAT (lynx_npu/codec/registry.py) and regenerate
(python tests/wire/make_golden.py --force)."""
import pathlib

import pytest

import lynx_npu
from lynx_npu.codec import PAYLOAD_FORMAT, wire_params
from lynx_npu.wire import BufferReader, read_frame

from .golden_payloads import CASES, decode_frames, encode_case, expectation_bytes, make_kv

PAYLOAD = pathlib.Path(__file__).resolve().parent / "golden" / "payload"


def _case(name):
    if CASES[name].codec == "cachegen":
        pytest.importorskip("constriction")
    return CASES[name]


@pytest.mark.parametrize("name", sorted(CASES))
def test_encoder_reproduces_the_committed_frames(name):
    assert encode_case(_case(name)) == (PAYLOAD / f"{name}.frames.bin").read_bytes()


@pytest.mark.parametrize("name", sorted(CASES))
def test_decoder_gives_the_committed_expectation(name):
    case = _case(name)
    decoded = decode_frames((PAYLOAD / f"{name}.frames.bin").read_bytes())
    assert expectation_bytes(decoded) == (PAYLOAD / f"{name}.expect.bin").read_bytes()
    # ...and the expectation is a reconstruction of the KV, not any fixed bytes.
    k, v = make_kv(case.dtype, case.shape)
    for stage, k_hat, v_hat in decoded:
        for x, x_hat in ((k, k_hat), (v, v_hat)):
            err = (x.float() - x_hat.float()).norm() / x.float().norm()
            assert err < 0.2, (stage, float(err))


@pytest.mark.parametrize("name", sorted(CASES))
def test_frames_carry_every_parameter_explicitly(name):
    case = _case(name)
    reader = BufferReader((PAYLOAD / f"{name}.frames.bin").read_bytes())
    frame = read_frame(reader)
    assert frame.params_dict() == wire_params(case.build())
    assert frame.params_dict()["payload_format"] == PAYLOAD_FORMAT


def test_the_cases_cover_every_registered_codec():
    assert {c.codec for c in CASES.values()} == set(lynx_npu.list_codecs())
    lynx = [c for c in CASES.values() if c.codec == "lynx"]
    assert {} in [c.overrides for c in lynx] and {"preset": "paper"} in [c.overrides for c in lynx]

