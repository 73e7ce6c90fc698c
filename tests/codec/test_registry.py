import pytest
import torch

import lynx_npu
from lynx_npu.codec import CODEC_IDS, codec_from_wire

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


@pytest.mark.parametrize("name", ALL)
def test_wire_rebuild_gives_the_same_codec(name):
    codec = lynx_npu.get_codec(name)
    again = codec_from_wire(CODEC_IDS[name], codec.params())
    assert type(again) is type(codec) and again.params() == codec.params()
    with pytest.raises(ValueError, match="unknown codec id"):
        codec_from_wire(250, {})


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
