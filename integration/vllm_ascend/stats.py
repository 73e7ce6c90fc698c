"""Lynx's own statistics, reported through vLLM's KV-connector stats interface.

A Lynx verification checks up to ``max_drafts`` (64) drafts in one step, while vLLM's
spec-decoding statistics are sized for ``num_speculative_tokens`` (1 here: the null proposer
only switches on the verification machinery) and assert that no step accepts more. So the
scheduler keeps Lynx's verifications out of them (``LynxScheduler.make_spec_decoding_stats``)
and counts them here instead. vLLM takes these from the scheduler-side connector every step
(``get_kv_connector_stats``), ships ``data`` to the front end, rebuilds them with
``LynxConnector.build_kv_connector_stats`` and shows them in its periodic log line
("KV Transfer metrics: ...") and, through :class:`LynxPromMetrics`, on ``/metrics``.

Beside the counters, gauges: the decode workers report, every step, how many receiver slots
(transfers in progress, lynx_npu.transport) they hold; merged over tensor-parallel ranks, and
over a logging interval, as the largest value. Back to 0 once every request is finished,
aborted or recomputed (the leak checks of tests/integration/vllm_ascend/test_failures.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from .vllm_compat import KVConnectorPromMetrics, KVConnectorStats, create_metric_per_engine

# counter name -> what it counts (also the Prometheus help text)
COUNTERS = {
    "verifications": "Lynx verification steps (drafts checked against the refined cache)",
    "drafts_proposed": "Lynx draft tokens made on the anchor and sent to verification",
    "drafts_accepted": "Lynx draft tokens accepted by verification",
    "recomputes": "Lynx requests recomputed locally (residual lost or preempted while drafting)",
}
# gauge name -> what it measures; merged by max (over ranks and over an interval)
GAUGES = {
    "receiver_active_requests": "Lynx receiver slots held: transfers in progress on the "
                                "decode instance (largest over tensor-parallel ranks)",
}


@dataclass
class LynxStats(KVConnectorStats):
    """Counters over an interval; ``data`` maps each name of :data:`COUNTERS` to an int, and
    each name of :data:`GAUGES` reported to its latest (largest) value."""

    def __post_init__(self):
        unknown = set(self.data) - set(COUNTERS) - set(GAUGES)
        if unknown:
            raise ValueError(f"unknown Lynx stats {sorted(unknown)}; known: "
                             f"{list(COUNTERS) + list(GAUGES)}")
        for name in COUNTERS:
            self.data.setdefault(name, 0)

    @classmethod
    def gauges(cls, receiver_active_requests: int) -> "LynxStats":
        """A decode worker's report of this step: its gauges, no counts."""
        if not (isinstance(receiver_active_requests, int) and receiver_active_requests >= 0):
            raise ValueError(f"{receiver_active_requests=} must be an int >= 0")
        return cls(data={"receiver_active_requests": receiver_active_requests})

    def record_verification(self, num_drafts: int, num_accepted: int) -> None:
        if not 0 <= num_accepted <= num_drafts:
            raise ValueError(f"{num_accepted=} must be in [0, {num_drafts=}]")
        self.data["verifications"] += 1
        self.data["drafts_proposed"] += num_drafts
        self.data["drafts_accepted"] += num_accepted

    def record_recompute(self) -> None:
        self.data["recomputes"] += 1

    def reset(self) -> None:
        for name in COUNTERS:
            self.data[name] = 0
        for name in GAUGES:
            self.data.pop(name, None)

    def aggregate(self, other: KVConnectorStats) -> "LynxStats":
        merged = dict(self.data)
        for name, value in other.data.items():
            if name in COUNTERS:
                merged[name] = merged.get(name, 0) + value
            elif name in GAUGES:
                merged[name] = max(merged.get(name, value), value)
        return LynxStats(data=merged)

    def reduce(self) -> dict[str, int | float]:
        out = {f"lynx_{name}": self.data[name] for name in COUNTERS}
        proposed = self.data["drafts_proposed"]
        out["lynx_draft_acceptance"] = (round(self.data["drafts_accepted"] / proposed, 3)
                                        if proposed else 0.0)
        out.update((f"lynx_{name}", self.data[name]) for name in GAUGES if name in self.data)
        return out

    def is_empty(self) -> bool:
        return not any(self.data.get(name) for name in (*COUNTERS, *GAUGES))

    def take(self) -> "LynxStats | None":
        """This interval's counters (None if nothing happened), and start a new interval."""
        if self.is_empty():
            return None
        out = LynxStats(data=dict(self.data))
        self.reset()
        return out


class LynxPromMetrics(KVConnectorPromMetrics):
    """One Prometheus counter per :data:`COUNTERS` entry, ``vllm:lynx_<name>_total``, and one
    gauge per :data:`GAUGES` entry, ``vllm:lynx_<name>``."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters = {
            name: create_metric_per_engine(
                self._counter_cls(name=f"vllm:lynx_{name}", documentation=doc,
                                  labelnames=labelnames),
                per_engine_labelvalues)
            for name, doc in COUNTERS.items()}
        self.gauges = {
            name: create_metric_per_engine(
                self._gauge_cls(name=f"vllm:lynx_{name}", documentation=doc,
                                labelnames=labelnames, multiprocess_mode="mostrecent"),
                per_engine_labelvalues)
            for name, doc in GAUGES.items()}

    def observe(self, transfer_stats_data: dict, engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.items():
            if name in self.counters and value:
                self.counters[name][engine_idx].inc(value)
            elif name in self.gauges:
                self.gauges[name][engine_idx].set(value)
