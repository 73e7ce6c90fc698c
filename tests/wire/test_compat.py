"""The compatibility description peers exchange in HELLO, and the receiver's judgement of it
(lynx_npu/wire/compat.py). The handshake over real sockets: tests/transport/test_compat.py."""
import pytest

import lynx_npu
from lynx_npu.codec import PAYLOAD_FORMAT
from lynx_npu.codec.lynx import LynxCodec
from lynx_npu.wire import CodecSpec, Compat, ReceiveLimits, params_to_json

LYNX = lynx_npu.get_codec("lynx")
PAPER = lynx_npu.get_codec("lynx", preset="paper")
INT8 = lynx_npu.get_codec("int8")


def test_round_trip_and_canonical_bytes():
    compat = Compat.of([LYNX, INT8, PAPER, LYNX])  # repeats are dropped
    assert [c.name for c in compat.codecs] == ["lynx", "int8", "lynx"]
    raw = compat.to_json()
    assert Compat.from_json(raw) == compat and Compat.from_json(raw).to_json() == raw
    assert raw.startswith(b'{"codecs":[["lynx",{"alpha_k":0.25,') and raw.endswith(
        b'"payload_format":%d}' % PAYLOAD_FORMAT)
    assert Compat().to_json() == b'{"codecs":[],"payload_format":%d}' % PAYLOAD_FORMAT


@pytest.mark.parametrize("raw,match", [
    (b"\xff", "not ASCII JSON"), (b"[1]", "JSON object"), (b"{}", "lacks 'payload_format'"),
    (b'{"payload_format":"2"}', "payload_format='2' must be a positive int"),
    (b'{"payload_format":0}', "payload_format=0"),
    (b'{"codecs":[],"extra":1,"payload_format":9}', r"unknown key\(s\) \['extra'\]"),
    (b'{"payload_format":9}', "lacks 'codecs'"),
    (b'{"codecs":{},"payload_format":9}', "'codecs' must be a list"),
    (b'{"codecs":[["lynx"]],"payload_format":9}', r"\[name, \{parameters\}\]"),
    (b'{"codecs":[["lynx",{"alpha_k":[1]}]],"payload_format":9}', "'alpha_k' must be a scalar"),
    (b"[" * 5000, "not ASCII JSON"),
])
def test_malformed_descriptions_are_named(raw, match):
    with pytest.raises(ValueError, match=match):
        Compat.from_json(raw)


def test_another_format_is_read_no_further_than_its_version():
    assert Compat.from_json(b'{"payload_format":10,"rules":{"new":[1]}}') == Compat(10)


def test_only_registered_codecs_and_descriptions_that_fit_a_hello():
    with pytest.raises(ValueError, match="not a registered codec"):
        Compat.of([LynxCodec()])  # built without the registry: no codec_id
    many = [lynx_npu.get_codec("lynx", alpha_k=1 + i) for i in range(30)]
    with pytest.raises(ValueError, match=r"HELLO frame carries at most 4096 \(WireLimits"):
        Compat.of(many)


@pytest.mark.parametrize("receiver,sender,reason", [
    (Compat(), Compat(), None),
    (Compat(), Compat.of([LYNX, INT8]), None),               # accepts what it can build
    (Compat.of([LYNX, INT8]), Compat.of([INT8]), None),       # a subset
    (Compat.of([LYNX]), Compat(10), "payload format differs: the sender's is 10, the "
                                   f"receiver's {PAYLOAD_FORMAT}"),
    (Compat(), Compat(1), f"payload format differs: the sender's is 1, the receiver's "
                          f"{PAYLOAD_FORMAT}"),
    (Compat.of([LYNX]), Compat(), "the sender declares no codecs; the receiver accepts only: lynx"),
    (Compat.of([LYNX, PAPER]), Compat.of([INT8]),
     "codec 'int8' is not accepted; the receiver accepts only: lynx, lynx"),
    (Compat.of([LYNX]), Compat.of([lynx_npu.get_codec("lynx", alpha_k=3, center="mean")]),
     "codec 'lynx' parameters differ from the receiver's: alpha_k: sender 3.0, receiver 0.25; "
     'center: sender "mean", receiver "midrange"'),
    # Against the closest of several accepted sets: only scalar_preview differs from this one.
    (Compat.of([PAPER, LYNX]), Compat.of([lynx_npu.get_codec("lynx", scalar_preview=False)]),
     "codec 'lynx' parameters differ from the receiver's: scalar_preview: sender false, "
     "receiver true"),
])
def test_the_receiver_judges(receiver, sender, reason):
    assert receiver.refusal(sender) == reason


def test_a_declared_codec_that_cannot_be_built_here_is_refused_by_parameter():
    params = {**LYNX.params(), "payload_format": PAYLOAD_FORMAT, "bits": 4}
    del params["alpha_v"]
    sender = Compat(PAYLOAD_FORMAT, (CodecSpec("lynx", params_to_json(params)),))
    assert "the sender's codec 'lynx' cannot be built here: codec 'lynx' parameters lack " \
           "'alpha_v'" in Compat().refusal(sender)
    params["alpha_v"] = -1.0
    sender = Compat(PAYLOAD_FORMAT, (CodecSpec("lynx", params_to_json(params)),))
    assert "has no parameter 'bits'" in Compat().refusal(sender)
    sender = Compat(PAYLOAD_FORMAT, (CodecSpec("zstd", b'{"payload_format":4}'),))
    assert "codec 'zstd' is not available here" in Compat().refusal(sender)


def test_a_sender_sends_only_what_it_declared():
    Compat().check_declared(PAPER)  # declared nothing: anything goes
    declared = Compat.of([LYNX])
    declared.check_declared(lynx_npu.get_codec("lynx"))  # equal parameters: the same codec
    with pytest.raises(ValueError, match=r"codec lynx \{.*\"alpha_k\":255.0.* was not declared"):
        declared.check_declared(PAPER)


LIMITS = ReceiveLimits(max_request_bytes=1 << 30, max_payload_bytes=1 << 20,
                       max_params_bytes=1024, max_layers=64, max_tokens=1 << 16,
                       max_kv_heads=32, max_head_dim=256)


def test_a_sender_names_its_session_and_a_receiver_its_limits():
    sender = Compat.of([INT8], session="0123456789abcdef" * 2)
    receiver = Compat.of([], limits=LIMITS)
    for compat in (sender, receiver):
        assert Compat.from_json(compat.to_json()) == compat
    assert sender.to_json().endswith(b'"session":"' + b"0123456789abcdef" * 2 + b'"}')
    assert b'"limits":{"max_head_dim":256,' in receiver.to_json()


@pytest.mark.parametrize("raw,match", [
    (b'{"codecs":[],"payload_format":9,"session":"ABC"}', "session='ABC' must be 32"),
    (b'{"codecs":[],"payload_format":9,"session":1}', "session=1 must be 32"),
    (b'{"codecs":[],"limits":{"max_layers":1},"payload_format":9}', "limits must be an object"),
    (b'{"codecs":[],"limits":[],"payload_format":9}', "limits must be an object"),
])
def test_malformed_sessions_and_limits_are_named(raw, match):
    with pytest.raises(ValueError, match=match):
        Compat.from_json(raw)


def test_receive_limits_say_what_would_be_refused():
    assert LIMITS.request_refusal(2, 100, 4, 64, 2, 100) is None
    assert LIMITS.request_refusal(65, 100, 4, 64, 2, 100) == (
        "num_layers=65 exceeds the receiver's max_layers=64")
    assert LIMITS.request_refusal(2, 100, 4, 300, 2, 100) == (
        "head_dim=300 exceeds the receiver's max_head_dim=256")
    assert "max_params_bytes=1024" in LIMITS.request_refusal(2, 100, 4, 64, 2, 2000)
    assert LIMITS.request_refusal(64, 1 << 16, 32, 256, 2, 10) == (
        "request KV of 137438953472 bytes exceeds the receiver's max_request_bytes=1073741824")
    assert LIMITS.page_refusal(256, 8, 64, 1 << 20) is None  # the shape allows 1.06 MiB
    assert "bound of 589824 " in LIMITS.page_refusal(256, 4, 64, 1 << 20)  # this one less
    assert LIMITS.page_refusal(256, 8, 64, (1 << 20) + 1) == (
        "a page payload of 1048577 bytes exceeds the receiver's bound of 1048576 "
        "(max_payload_bytes=1048576)")
    with pytest.raises(ValueError, match="max_layers=0 must be a positive int"):
        ReceiveLimits.from_dict({**LIMITS.to_dict(), "max_layers": 0})
    with pytest.raises(ValueError, match="max_tokens=True must be a positive int"):
        ReceiveLimits.from_dict({**LIMITS.to_dict(), "max_tokens": True})
