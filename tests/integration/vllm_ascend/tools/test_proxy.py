"""The proxy's request split: same prompt to both servers, one token on the prefill side, the
same transfer id on both."""
import pytest

from lynx_npu.integration.vllm_ascend.config import TransferParams
from lynx_npu.integration.vllm_ascend.tools.proxy import new_transfer_id, split_request


def test_split_chat_request():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}, "max_completion_tokens": 64, "n": 1}
    pre, dec = split_request(body, 42)
    assert pre["messages"] == dec["messages"] == body["messages"]
    assert pre["max_tokens"] == pre["max_completion_tokens"] == 1 and pre["stream"] is False
    assert "stream_options" not in pre and "n" not in pre
    assert dec["stream"] is True and dec["max_completion_tokens"] == 64
    for b in (pre, dec):
        assert TransferParams.from_request(b["kv_transfer_params"]).transfer_id == 42
    assert "kv_transfer_params" not in body  # the client's body is not modified


def test_bad_input():
    with pytest.raises(ValueError, match="JSON object"):
        split_request([1], 1)
    with pytest.raises(ValueError, match="transfer_id"):
        split_request({}, 0)
    assert 0 < new_transfer_id() < 2**63


def test_client_may_choose_codec_and_draft_cap_only():
    body = {"prompt": "x", "kv_transfer_params": {"lynx": {"codec": "lynx-int8", "max_drafts": 0}}}
    pre, dec = split_request(body, 7)
    for b in (pre, dec):
        p = TransferParams.from_request(b["kv_transfer_params"])
        assert (p.transfer_id, p.codec, p.max_drafts) == (7, "lynx-int8", 0)
    for bad in ({"lynx": {"peer": "evil:1"}}, {"lynx": {"transfer_id": 3}},
                {"lynx": {"drop_residual": True}}, {"other": {}}, {"lynx": 5}, [1]):
        with pytest.raises(ValueError, match="kv_transfer_params"):
            split_request({"prompt": "x", "kv_transfer_params": bad}, 7)
