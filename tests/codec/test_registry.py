import pytest
import torch

import lynx_npu
from lynx_npu.codec import CODEC_IDS, PAYLOAD_FORMAT, codec_from_wire, wire_params

ALL = ["bf16", "int8", "int4", "kivi4", "quantspec", "lynx-int4", "lynx-int8", "lynx"]


def test_every_issue_codec_is_registered():
    assert set(ALL) <= set(lynx_npu.list_codecs())


def test_unknown_codec_and_bad_parameter_are_value_errors():
    with pytest.raises(ValueError, match="unknown codec 'zstd'"):
        lynx_npu.get_codec("zstd")
    with pytest.raises(ValueError, match="bad parameter"):
        lynx_npu.get_codec("int8", bits=3)
    with pytest.raises(ValueError, match="group_size"):
        lynx_npu.get_codec("kivi4", group_size=0)


WIRE = lynx_npu.list_codecs()  # every registered codec can go on the wire


@pytest.mark.parametrize("name", WIRE)
def test_wire_rebuild_gives_the_same_codec(name):
    codec = lynx_npu.get_codec(name)
    params = wire_params(codec)
    assert params == {"payload_format": PAYLOAD_FORMAT, **codec.params()}
    again = codec_from_wire(CODEC_IDS[name], params)
    assert type(again) is type(codec) and again.params() == codec.params()
    with pytest.raises(ValueError, match="unknown codec id"):
        codec_from_wire(250, params)


@pytest.mark.parametrize("name", WIRE)
def test_a_missing_wire_parameter_is_named_never_defaulted(name):
    params = wire_params(lynx_npu.get_codec(name))
    for key in params:
        partial = {k: v for k, v in params.items() if k != key}
        with pytest.raises(ValueError, match=f"lack '{key}'"):
            codec_from_wire(CODEC_IDS[name], partial)


@pytest.mark.parametrize("name,key,value", [
    ("lynx", "preset", "paper"),      # an API convenience, not a parameter: never on the wire
    ("lynx", "alpha", 3.0), ("int8", "bits", 4), ("bf16", "group_size", 32),
    ("cachegen", "bins", 16),
])
def test_an_unknown_wire_parameter_is_named(name, key, value):
    params = {**wire_params(lynx_npu.get_codec(name)), key: value}
    with pytest.raises(ValueError, match=f"has no parameter '{key}'"):
        codec_from_wire(CODEC_IDS[name], params)


# the format before and after this build's, and its own in the wrong type
@pytest.mark.parametrize("value", [1, PAYLOAD_FORMAT - 1, PAYLOAD_FORMAT + 1, str(PAYLOAD_FORMAT),
                                   float(PAYLOAD_FORMAT), True, None])
def test_another_payload_format_is_refused_by_name(value):
    params = {**wire_params(lynx_npu.get_codec("lynx")), "payload_format": value}
    with pytest.raises(ValueError, match=rf"payload_format={value!r} is not supported: this "
                                         rf"build reads payload format {PAYLOAD_FORMAT}"):
        codec_from_wire(CODEC_IDS["lynx"], params)


@pytest.mark.parametrize("name,key,value,match", [
    ("lynx", "page_size", 256.0, "page_size=256.0 must be an int"),
    ("lynx", "chunk_size", 0, r"chunk_size=0 must be in \[1, 1048576\]"),
    ("lynx", "chunk_size", 48, "must be a multiple of"),
    ("lynx", "alpha_k", True, r"alpha_k=True must be a number in \(0, 1e\+06\)"),
    ("lynx", "alpha_v", 0, "alpha_v=0 must be a number"),
    ("lynx", "alpha_v", 1e7, "alpha_v=10000000.0 must be a number"),
    ("lynx", "anchor_bits", 8, r"anchor_bits=8 must be in \[2, 7\]"),
    ("lynx", "center", "median", "center='median' must be one of"),
    ("lynx", "k_axis", None, "k_axis=None must be one of"),
    ("lynx", "scalar_preview", 1, "scalar_preview=1 must be a bool"),
    ("lynx", "num_sink_tokens", -1, r"num_sink_tokens=-1 must be in \[0, 1048576\]"),
    # issue 18 item 8: each of these was accepted, from the API and from a peer's frame
    ("lynx", "anchor_bits", 2.5, "anchor_bits=2.5 must be an int"),
    ("lynx", "num_sink_tokens", 1.5, "num_sink_tokens=1.5 must be an int"),
    ("lynx", "page_size", True, "page_size=True must be an int"),
    ("lynx", "num_sink_tokens", 1 << 21, r"num_sink_tokens=2097152 must be in \[0, 1048576\]"),
    ("kivi4", "group_size", 10**300, r"group_size=1000.*\(301 characters\) must be in \[1, "),
    ("quantspec", "group_size", 10**300, r"group_size=1000.*\(301 characters\) must be in"),
    ("int8", "page_size", 1 << 40, r"page_size=1099511627776 must be in \[1, 1048576\]"),
    ("cachegen", "chunk_size", 10**300, r"chunk_size=1000.* must be in \[1, 1048576\]"),
    ("cachegen", "num_layers", 10**18, r"num_layers=1000000000000000000 must be in"),
    ("lynx-int8", "scalar_preview", True, "scalar_preview=True needs the split codec"),
    ("int8", "page_size", 0, r"page_size=0 must be in \[1, 1048576\]"),
    ("kivi4", "group_size", "32", "group_size='32' must be an int"),
    ("quantspec", "group_size", False, "group_size=False must be an int"),
    ("cachegen", "key_first_bins", 3, r"key_first_bins=3 must be in \[4, 256\]"),
    ("cachegen", "layer_index", 30, r"layer_index=30 must be in \[0, 29\]"),
])
def test_a_bad_value_is_named_from_the_wire_as_from_the_api(name, key, value, match):
    with pytest.raises(ValueError, match=match):
        lynx_npu.get_codec(name, **{key: value})
    params = {**wire_params(lynx_npu.get_codec(name)), key: value}
    with pytest.raises(ValueError, match=match):
        codec_from_wire(CODEC_IDS[name], params)


def test_alpha_given_as_int_or_float_is_one_parameter_set():
    three = lynx_npu.get_codec("lynx", alpha_k=3)
    assert wire_params(three) == wire_params(lynx_npu.get_codec("lynx", alpha_k=3.0))
    assert type(three.params()["alpha_k"]) is float


GOOD = torch.zeros(2, 5, 4)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("k,v,match", [
    (torch.full((2, 5, 4), float("nan")), GOOD, "NaN or Inf"),
    (GOOD.clone().index_fill_(1, torch.tensor([3]), float("inf")), GOOD, "NaN or Inf"),
    (torch.zeros(2, 5), torch.zeros(2, 5), "rank 3"),
    (torch.zeros(2, 5, 4), torch.zeros(2, 6, 4), "shapes differ"),
    (torch.zeros(2, 0, 4), torch.zeros(2, 0, 4), "zero tokens"),
    (torch.zeros(2, 5, 4, dtype=torch.int32), torch.zeros(2, 5, 4, dtype=torch.int32), "dtype"),
    (GOOD, GOOD.half(), "dtypes differ"),
])
def test_bad_input_names_the_problem(name, k, v, match):
    with pytest.raises(ValueError, match=match):
        lynx_npu.get_codec(name).encode(k, v)
