"""tools/load.py's arithmetic and parsing, without servers."""
import pytest

from lynx_npu.integration.vllm_ascend.tools import load

METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.125
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
"""


def test_percentiles_interpolate():
    assert load.percentile([], 0.5) is None
    assert load.percentile([3.0], 0.95) == 3.0
    assert load.percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert load.percentile([float(i) for i in range(101)], 0.95) == pytest.approx(95.0)


def test_gauges_summed_over_engines():
    assert load.parse_gauges(METRICS) == {"vllm:num_requests_running": 2.0,
                                          "vllm:num_requests_waiting": 0.0,
                                          "vllm:kv_cache_usage_perc": 0.375}


def test_the_lynx_receiver_gauge_is_read_where_exported():
    lynx = METRICS + 'vllm:lynx_receiver_active_requests{engine="0",model_name="m"} 3.0\n'
    assert load.parse_gauges(lynx)["vllm:lynx_receiver_active_requests"] == 3.0
    assert "vllm:lynx_receiver_active_requests" not in load.parse_gauges(METRICS)


def test_a_missing_gauge_is_named():
    with pytest.raises(ValueError, match="vllm:kv_cache_usage_perc"):
        load.parse_gauges(METRICS.replace("kv_cache_usage_perc", "other"))


def test_bad_prompt_lengths_refused(capsys):
    with pytest.raises(SystemExit) as e:
        load.main(["--model", "m", "--prompt-tokens", "300,abc"])
    assert e.value.code == 2 and "--prompt-tokens" in capsys.readouterr().err
