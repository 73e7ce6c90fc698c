"""lynx bench ttkt's numbers on constructed runs (no engine): records, per-cell medians, lynx's
gain over int8, where it crosses zero along the link rate, the Fig. 11 check, JSON and plot."""
import json
import math

import pytest

from lynx_npu.integration.vllm_ascend.tools import ttkt_report as report
from lynx_npu.integration.vllm_ascend.tools.local_pair import TransferRun


def _run(codec, ttft, step=0.1, n=64, client_delay=0.0, **stats):
    times = [10.0 + ttft + step * i for i in range(n)]
    return TransferRun(codec, list(range(n)), [t + client_delay for t in times], [], "length",
                       {"first_frame_at": 10.0, "token_times": times, **stats}, submitted_at=9.0)


def _records(ttft_by_cell, prompts=(0,)):
    """{(length, gbps, mode): ttft} -> records, one per prompt, prompt p adding 0.1 * p s."""
    return [report.record(_run(mode, ttft + 0.1 * p), length=length, gbps=gbps, prompt=p,
                          prompt_tokens=length - 3)
            for (length, gbps, mode), ttft in ttft_by_cell.items() for p in prompts]


def test_record_times_from_the_start_of_decoding():
    r = report.record(_run("lynx", 0.5, client_delay=0.25, anchor_ready_at=10.2,
                           loaded_at=10.3, verified_at=11.0, drafts_proposed=9,
                           drafts_accepted=7), length=1024, gbps=0.2, prompt=1,
                      prompt_tokens=1020, prefill_s=3.0)
    assert r["ttft_s"] == pytest.approx(0.5) and r["tt32_s"] == pytest.approx(0.5 + 3.1)
    assert r["tt64_s"] == pytest.approx(0.5 + 6.3)
    assert r["client_tt64_s"] == pytest.approx(0.5 + 6.3 + 0.25)
    assert r["anchor_s"] == pytest.approx(0.2) and r["loaded_s"] == pytest.approx(0.3)
    assert r["residual_s"] is None and r["verified_s"] == pytest.approx(1.0)
    assert r["wait_s"] == pytest.approx(1.0) and r["drafts_accepted"] == 7
    assert r["step_s"] == pytest.approx(0.1)
    short = report.record(_run("int8", 1.0, n=8), length=256, gbps=1.0, prompt=0,
                          prompt_tokens=250)
    assert short["tt64_s"] == short["tt32_s"] == pytest.approx(1.7)  # k capped at 8 tokens
    with pytest.raises(ValueError, match="no tokens"):
        report.record(_run("int8", 1.0, n=0), length=256, gbps=1.0, prompt=0, prompt_tokens=250)


def test_cells_are_medians_over_prompts_and_gains_are_int8_minus_lynx():
    recs = _records({(1024, 0.2, "int8"): 2.0, (1024, 0.2, "lynx"): 1.5},
                    prompts=(0, 1, 2))
    cells = report.cells(recs)
    assert [(c["mode"], c["prompts"]) for c in cells] == [("int8", 3), ("lynx", 3)]
    assert cells[0]["ttft_s"] == pytest.approx(2.1)      # median of 2.0, 2.1, 2.2
    assert cells[0]["prompt_tokens"] == 1021
    (g,) = report.gains(cells)
    assert g["ttft_gain_s"] == pytest.approx(0.5) and g["tt64_gain_s"] == pytest.approx(0.5)
    assert g["tt64_ratio"] == pytest.approx((1.6 + 6.3) / (2.1 + 6.3))


def test_crossing_interpolated_in_log_rate():
    # gain +0.4 at 0.1 Gbps, -0.4 at 10 Gbps: crosses at 1 Gbps (midway in log10).
    recs = _records({(2048, 0.1, "int8"): 3.0, (2048, 0.1, "lynx"): 2.6,
                     (2048, 10.0, "int8"): 1.0, (2048, 10.0, "lynx"): 1.4,
                     (512, 0.1, "int8"): 1.0, (512, 0.1, "lynx"): 0.9,
                     (512, 10.0, "int8"): 1.0, (512, 10.0, "lynx"): 0.8})
    rows = report.gains(report.cells(recs))
    by = {c["length"]: c for c in report.crossings(rows, "tt64")}
    assert by[2048]["where"] == "crosses zero"
    assert by[2048]["crossing_gbps"] == [pytest.approx(1.0)]
    assert by[512] == {"length": 512, "metric": "tt64", "crossing_gbps": [],
                       "where": "positive at every rate"}
    with pytest.raises(ValueError, match="metric"):
        report.crossings(rows, "tt7")


def test_fig11_check_compares_the_corners():
    recs = _records({(7168, 0.05, "int8"): 9.0, (7168, 0.05, "lynx"): 6.0,
                     (7168, 5.0, "int8"): 1.0, (7168, 5.0, "lynx"): 1.0,
                     (1024, 0.05, "int8"): 2.0, (1024, 0.05, "lynx"): 1.8,
                     (1024, 5.0, "int8"): 0.5, (1024, 5.0, "lynx"): 0.6})
    check = report.fig11_check(report.gains(report.cells(recs)))
    assert check["long_slow"] == {"length": 7168, "gbps": 0.05,
                                  "tt64_gain_s": pytest.approx(3.0)}
    assert check["short_fast"]["tt64_gain_s"] == pytest.approx(-0.1)
    assert check["larger_at_long_slow"] is True
    with pytest.raises(ValueError, match="int8 and a lynx"):
        report.fig11_check([])


def test_summary_json_table_and_plot(tmp_path):
    recs = _records({(n, g, m): (1.0 + n / 1024 / g) * (0.8 if m == "lynx" else 1.0)
                     for n in (256, 512) for g in (0.05, 1.0) for m in ("int8", "lynx")})
    doc = report.summarize(recs, {"model": "m", "lengths": [256, 512]})
    path = tmp_path / "s.json"
    report.write_json(path, doc)
    back = json.loads(path.read_text())
    assert set(back) >= {"model", "records", "cells", "gains", "crossings", "fig11"}
    assert len(back["cells"]) == 8 and len(back["gains"]) == 4
    assert all(math.isfinite(c[k]) for c in back["cells"] for k in report.TIMES)
    assert {c["metric"] for c in back["crossings"]} == {"tt64", "ttft"}
    assert "+" in report.table(doc) and any("Fig. 11" in s for s in report.crossing_lines(doc))
    report.plot(tmp_path / "s.png", doc, "title")
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
