import pytest

from lynx_npu.eval.codec_specs import parse_codec_arg, parse_codec_spec, parse_value, select_codecs

AVAILABLE = ["bf16", "int8", "lynx"]


def test_values_parse_to_numbers_bools_none_and_strings():
    assert parse_value("3") == 3 and isinstance(parse_value("3"), int)
    assert parse_value("2.5") == 2.5 and parse_value("1e3") == 1000.0
    assert parse_value("true") is True and parse_value("False") is False
    assert parse_value("none") is None
    assert parse_value("token") == "token"


def test_spec_with_inline_overrides():
    s = parse_codec_spec("lynx:preset=paper:alpha_k=3")
    assert s.name == "lynx" and s.overrides == {"preset": "paper", "alpha_k": 3}
    assert s.label == "lynx:preset=paper:alpha_k=3"
    assert parse_codec_spec("int8").label == "int8"


def test_codec_arg():
    assert parse_codec_arg("lynx:alpha_k=3") == ("lynx", "alpha_k", 3)
    assert parse_codec_arg("lynx:v_axis=channel") == ("lynx", "v_axis", "channel")
    for bad in ("lynx", "lynx:alpha_k", ":a=1", "lynx:=3"):
        with pytest.raises(ValueError):
            parse_codec_arg(bad)


def test_default_selection_is_every_available_codec():
    assert [s.label for s in select_codecs(None, None, AVAILABLE)] == AVAILABLE


def test_codec_args_apply_to_every_spec_of_that_name_and_inline_values_win():
    specs = select_codecs("int8,lynx,lynx:preset=paper:alpha_k=8",
                          ["lynx:alpha_k=3", "lynx:num_sink_tokens=0"], AVAILABLE)
    assert [s.overrides for s in specs] == [
        {}, {"alpha_k": 3, "num_sink_tokens": 0},
        {"preset": "paper", "alpha_k": 8, "num_sink_tokens": 0}]
    assert specs[1].label == "lynx:alpha_k=3:num_sink_tokens=0"


def test_selection_errors():
    with pytest.raises(ValueError, match="unknown codec 'zstd'"):
        select_codecs("int8,zstd", None, AVAILABLE)
    with pytest.raises(ValueError, match="not selected"):
        select_codecs("int8", ["lynx:alpha_k=3"], AVAILABLE)
    with pytest.raises(ValueError, match="selects no codec"):
        select_codecs(",", None, AVAILABLE)
    with pytest.raises(ValueError, match="key=value"):
        select_codecs("lynx:alpha_k", None, AVAILABLE)


def test_real_codecs_build_with_overrides():
    import lynx_npu

    (spec,) = select_codecs("lynx:preset=paper", ["lynx:alpha_k=3"], lynx_npu.list_codecs())
    codec = spec.build()
    assert codec.params()["alpha_k"] == 3 and codec.params()["v_axis"] == "channel"
    (bad,) = select_codecs("lynx:alpha_k=-1", None, lynx_npu.list_codecs())
    with pytest.raises(ValueError, match="alpha_k"):
        bad.build()
