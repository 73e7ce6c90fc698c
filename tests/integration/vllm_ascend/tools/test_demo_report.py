"""lynx demo's numbers: time-to-k-th-token from the start of decoding, medians, the JSON
schema, reference matching. Synthetic runs: no engine needed."""
import json

from lynx_npu.integration.vllm_ascend.tools import demo_report
from lynx_npu.integration.vllm_ascend.tools.local_pair import TransferRun


def _run(codec, tokens, start, times, arrivals=None, **stats):
    return TransferRun(codec, list(tokens), list(arrivals or times), [], "length",
                       {"first_frame_at": start, "token_times": list(times), **stats})


def test_accepted_drafts_count_from_when_they_were_drafted():
    r = _run("lynx", [5, 6, 7], 10.0, [10.5, 10.6, 11.0], arrivals=[11.0, 11.0, 11.0],
             drafts_proposed=3, drafts_accepted=2)
    assert r.time_to_token(1) == 0.5 and r.time_to_token(3) == 1.0
    assert r.client_time_to_token(1) == 1.0


def test_decoding_starts_when_the_first_frame_was_sent():
    """On a paced link the first frame crosses whole: the clock starts that frame's link time
    before its arrival, so a codec with a larger first frame does not start later."""
    small = _run("int4", [1], 10.0, [10.5], first_frame_bytes=125_000)
    large = _run("int8", [1], 10.015, [10.5], first_frame_bytes=500_000)
    small.link_gbps = large.link_gbps = 0.2
    assert abs(small.start - 9.995) < 1e-9 and abs(large.start - 9.995) < 1e-9
    # sent together, first tokens together: one TTFT (from the arrivals: 0.500 and 0.485 s)
    assert abs(small.time_to_token(1) - 0.505) < 1e-9 and abs(large.time_to_token(1) - 0.505) < 1e-9
    unpaced = _run("int4", [1], 10.0, [10.5], first_frame_bytes=125_000)
    assert unpaced.start == 10.0  # no emulated link: the arrival itself
    assert TransferRun("int4", [], [], [], None, submitted_at=3.0).start == 3.0


def test_summary_json_and_reference():
    toks = list(range(64))
    other = toks[:10] + [99] * 54
    times = [1.0 + 0.1 * i for i in range(64)]
    runs = {
        "bf16": [_run("bf16", toks, 0.0, times), _run("bf16", toks, 0.0, times)],
        "int4": [_run("int4", other, 0.0, times), _run("int4", toks, 0.0, times)],
        "lynx-int8": [_run("lynx-int8", other, 0.0, times), _run("lynx-int8", toks, 0.0, times)],
        "lynx": [_run("lynx", other, 0.0, [t - 0.5 for t in times], drafts_proposed=8,
                      drafts_accepted=6, verifications=1),
                 _run("lynx", toks, 0.0, [t - 0.3 for t in times], drafts_proposed=4,
                      drafts_accepted=4, verifications=1)],
    }
    modes = ["bf16", "int4", "lynx-int8", "lynx"]
    results = demo_report.summarize(runs, modes)
    by = {r.mode: r for r in results}
    assert by["lynx"].matches_reference          # equals lynx-int8 on both prompts
    assert not by["int4"].matches_reference      # differs from bf16 on one prompt
    assert by["lynx"].ttft_s == 1.0 - 0.4        # median of 0.5 and 0.7
    assert by["lynx"].drafts_proposed == 6 and by["lynx"].drafts_accepted == 5
    assert by["lynx"].accepted_per_verification == 5.0  # (6 / 1 + 4 / 1) / 2
    assert abs(by["bf16"].tt64_s - 7.3) < 1e-9
    doc = json.loads(json.dumps(demo_report.to_json(results, 0.2, 2)))
    assert set(doc) == {"gbps", "prompts", "modes"} and doc["prompts"] == 2
    assert demo_report.to_json(results, 0.2, 2, "gemma3")["model"] == "gemma3"
    assert set(doc["modes"][0]) == {"mode", "ttft_s", "tt32_s", "tt64_s", "drafts_proposed",
                                    "drafts_accepted", "matches_reference"}
    assert "lynx" in demo_report.table(results)
    assert any("identical" in line for line in demo_report.targets(results))
    assert any("per verification: 5.0" in line for line in demo_report.targets(results))
    # the project's targets (issues 15, 19), judged on the medians; no int8 run: none against it
    ratio = by["lynx"].ttft_s / by["int4"].ttft_s
    line, = [x for x in demo_report.targets(results) if x.startswith("lynx TTFT / int4")]
    assert "(target <= 1.05)" in line and line.endswith("met" if ratio <= 1.05 else "MISSED")
    assert not any("/ int8" in x for x in demo_report.targets(results))


def test_a_reference_not_run_is_not_a_mismatch():
    """--modes int8,int4,lynx runs neither bf16 nor lynx-int8: nothing to compare, which the
    table and the JSON say ("-", null) instead of a mismatch ("NO")."""
    toks, times = list(range(8)), [1.0 + 0.1 * i for i in range(8)]
    runs = {"int4": [_run("int4", toks, 0.0, times)], "lynx": [_run("lynx", toks, 0.0, times)]}
    results = demo_report.summarize(runs, ["int4", "lynx"])
    assert all(r.matches_reference is None for r in results)
    row = next(line for line in demo_report.table(results).splitlines() if line.startswith("lynx"))
    assert " - " in row and "NO" not in row
    assert demo_report.to_json(results, 0.2, 1)["modes"][1]["matches_reference"] is None
