"""lynx eval quality end to end on a tiny random Llama (1-2 prompts per task, data cut from the
real files), and its refusals of bad flags."""
import argparse
import json

import pytest
import torch

from lynx_npu.cli import main as lynx_main
from lynx_npu.eval import quality_cmd
from lynx_npu.eval.model import LoadedModel

from .quality_fixtures import byte_tokenizer, data_dir, tiny_llama

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return data_dir(tmp_path_factory.mktemp("data"))


def _args(argv):
    parser = argparse.ArgumentParser()
    quality_cmd.add_arguments(parser)
    return parser.parse_args(argv)


def test_every_task_end_to_end(data, tmp_path, capsys):
    tok = byte_tokenizer()
    loaded = LoadedModel("tiny", tiny_llama(len(tok)), tok)
    out, png = tmp_path / "q.json", tmp_path / "q.png"
    args = _args(["--data", str(data), "--codecs", "bf16,int4,cachegen,lynx-int4,lynx",
                  "--ppl-samples", "2", "--ppl-context", "96-160", "--ppl-tokens", "16",
                  "--needle-samples", "2", "--needle-lengths", "400", "--needle-depths", "0.5",
                  "--needle-new-tokens", "4", "--qmsum-samples", "1", "--qmsum-tokens", "600",
                  "--qmsum-new-tokens", "4", "--mmlu-samples", "2", "--shots", "1",
                  "--resamples", "200", "--json", str(out), "--plot", str(png), "--quiet",
                  "--threads", "1"])  # 2 threads on 2 busy cores: 100x slower
    threads = torch.get_num_threads()
    try:
        assert quality_cmd.execute(args, loaded) == 0
    finally:
        torch.set_num_threads(threads)
    report = json.loads(out.read_text())
    assert list(report["tasks"]) == ["ppl", "needle", "qmsum", "mmlu"] and report["complete"]
    assert png.stat().st_size > 10_000
    for task, n in (("ppl", 2), ("needle", 2), ("qmsum", 1), ("mmlu", 2)):
        info = report["tasks"][task]
        assert info["num_samples"] == len(info["samples"]) == n
        assert list(info["results"]) == ["bf16", "int4", "cachegen", "lynx-int4", "lynx"]
        base = info["results"]["bf16"]
        assert base["diff_vs_bf16"] == {"value": 0.0, "low": 0.0, "high": 0.0}
        assert base["within_noise"] is True and base["low"] <= base["value"] <= base["high"]
    ppl = report["tasks"]["ppl"]
    assert [s["tokens"] for s in ppl["samples"]] == [96, 160]
    assert ppl["results"]["bf16"]["value"] > 1 and ppl["metric"] == "perplexity"
    # a random model over 258 byte tokens: int4's KV error moves its perplexity
    assert ppl["results"]["int4"]["value"] != ppl["results"]["bf16"]["value"]
    mmlu = report["tasks"]["mmlu"]
    assert mmlu["chance"] == pytest.approx(sum(1 / s["num_options"] for s in mmlu["samples"]) / 2)
    assert all(s["scores"]["bf16"] in (0.0, 1.0) for s in mmlu["samples"])
    needle = report["tasks"]["needle"]["samples"][0]
    assert 0 <= needle["scores"]["lynx"] <= 1 and "answers" in needle
    assert all(r["in_bf16_interval"] in (True, False) for r in ppl["results"].values())
    table = capsys.readouterr().out
    assert "ppl: perplexity (lower is better), 2 samples" in table
    assert "paired difference from bf16 outside the noise:" in table and "chance" in table
    # the table again from the JSON's per-prompt scores, nothing measured
    again = tmp_path / "again.json"
    assert lynx_main(["eval", "quality", "--from-json", str(out), "--resamples", "200",
                      "--json", str(again)]) == 0
    assert capsys.readouterr().out.strip() == table.strip()
    assert json.loads(again.read_text())["tasks"]["ppl"]["results"] == ppl["results"]
    # two reports' tasks merged: the ppl task of one and the others of the second
    first = dict(report, tasks={"ppl": report["tasks"]["ppl"]})
    second = dict(report, tasks={t: i for t, i in report["tasks"].items() if t != "ppl"})
    (tmp_path / "a.json").write_text(json.dumps(first))
    (tmp_path / "b.json").write_text(json.dumps(second))
    merged = tmp_path / "merged.json"
    assert lynx_main(["eval", "quality", "--from-json", str(tmp_path / "a.json"), "--from-json",
                      str(tmp_path / "b.json"), "--resamples", "200", "--json", str(merged)]) == 0
    assert capsys.readouterr().out.strip() == table.strip()
    assert list(json.loads(merged.read_text())["tasks"]) == ["ppl", "needle", "qmsum", "mmlu"]
    assert _lynx(["eval", "quality", "--from-json", str(tmp_path / "a.json"), "--from-json",
                  str(out)]) == 1
    assert "repeats task(s) ['ppl']" in capsys.readouterr().err


def _lynx(argv):
    try:
        return lynx_main(argv)
    except SystemExit as e:
        return e.code


def test_bad_flags_fail_with_a_clear_error(data, tmp_path, capsys):
    assert _lynx(["eval", "quality", "--tasks", "ppl,poetry"]) == 2
    assert "unknown task 'poetry'; choose from ppl, needle, qmsum, mmlu" in capsys.readouterr().err
    assert _lynx(["eval", "quality", "--ppl-context", "7000-2000"]) == 2
    assert "MIN <= MAX" in capsys.readouterr().err
    assert _lynx(["eval", "quality", "--needle-depths", "0,2"]) == 2
    assert "must be in [0, 1]" in capsys.readouterr().err
    assert _lynx(["eval", "quality", "--data", str(data), "--codecs", "bf16,zip"]) == 1
    assert "unknown codec 'zip'" in capsys.readouterr().err
    assert _lynx(["eval", "quality", "--data", str(data), "--codecs", "bf16,bf16"]) == 1
    assert "names a codec twice" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert _lynx(["eval", "quality", "--from-json", str(tmp_path / "bad.json")]) == 1
    assert "is not a lynx eval quality report" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert _lynx(["eval", "quality", "--data", str(tmp_path / "empty"), "--tasks", "qmsum"]) == 1
    err = capsys.readouterr().err
    assert "qmsum data" in err and "qmsum/val.jsonl" in err and "not found" in err
