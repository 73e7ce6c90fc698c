"""``lynx bench transfer`` end to end on a tiny shape: two spawned processes, JSON schema."""
import json

import pytest

from lynx_npu.cli import main


def test_bench_transfer_writes_the_documented_json(tmp_path, capsys):
    out, png = tmp_path / "t.json", tmp_path / "t.png"
    rc = main(["bench", "transfer", "--gbps", "0.5", "--tokens", "300", "--layers", "2",
               "--codec", "int8,lynx", "--json", str(out), "--plot", str(png),
               "--timeout", "60", "--frame-bytes", "4096"])
    assert rc == 0
    report = json.loads(out.read_text())
    assert set(report) == {"gbps", "tokens", "results"}
    assert report["gbps"] == 0.5 and report["tokens"] == 300
    assert [r["codec"] for r in report["results"]] == ["int8", "lynx"]
    for r in report["results"]:
        assert set(r) == {"codec", "anchor_bytes", "total_bytes", "anchor_ready_s",
                          "complete_s", "achieved_gbps"}
        assert 0 < r["anchor_ready_s"] <= r["complete_s"]
        assert 0 < r["anchor_bytes"] <= r["total_bytes"]
    int8, lynx = report["results"]
    assert int8["anchor_bytes"] == int8["total_bytes"]  # one stream
    assert int8["anchor_ready_s"] == int8["complete_s"]
    assert lynx["anchor_bytes"] < lynx["total_bytes"]   # split stream
    assert png.stat().st_size > 10_000
    assert json.loads(capsys.readouterr().out) == report


def test_bench_transfer_rejects_unknown_codec(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "transfer", "--codec", "int8,zip"])
    assert e.value.code == 2 and "argument --codec: unknown codec 'zip'" in capsys.readouterr().err
