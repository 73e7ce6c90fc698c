"""Connector configuration and per-request parameters: validation names the bad value."""
import pytest

from lynx_npu.integration.vllm_ascend.config import (LynxConnectorConfig, TransferParams,
                                                     parse_peer)


def test_roles_and_defaults():
    c = LynxConnectorConfig.from_vllm("kv_consumer", {"port": 17100})
    assert (c.role, c.port, c.max_drafts) == ("consumer", 17100, 64)
    p = LynxConnectorConfig.from_vllm("kv_producer", {"peer": "10.0.0.2:17100", "gbps": 10})
    assert (p.role, p.peer, p.gbps, p.codec) == ("producer", "10.0.0.2:17100", 10, "lynx")


@pytest.mark.parametrize("role, extra, match", [
    ("kv_both", {}, "kv_role"),
    ("kv_consumer", {"bogus": 1}, "bogus"),
    ("kv_consumer", {"role": "producer"}, "role"),
    ("kv_consumer", {"max_drafts": 500}, "max_drafts"),
    ("kv_consumer", {"port": 70000}, "port"),
    ("kv_producer", {"gbps": -1}, "gbps"),
    ("kv_producer", {"peer": "nohost"}, "peer"),
    ("kv_producer", {"wire_dtype": "int8"}, "wire_dtype"),
    ("kv_producer", {"secret": "short"}, "secret"),
    ("kv_consumer", {"residual_timeout_s": 0}, "residual_timeout_s"),
])
def test_bad_config_is_named(role, extra, match):
    with pytest.raises(ValueError, match=match):
        LynxConnectorConfig.from_vllm(role, extra)


def test_transfer_params():
    assert TransferParams.from_request(None) is None
    assert TransferParams.from_request({"other": 1}) is None
    t = TransferParams.from_request({"lynx": {"transfer_id": 7, "codec": "int8"}})
    assert (t.transfer_id, t.codec, t.drop_residual) == (7, "int8", False)
    assert TransferParams.from_request(t.to_dict()) == t


@pytest.mark.parametrize("raw, match", [
    ({"lynx": {}}, "transfer_id"),
    ({"lynx": {"transfer_id": 0}}, "transfer_id"),
    ({"lynx": {"transfer_id": True}}, "transfer_id"),
    ({"lynx": {"transfer_id": 1, "peer": "x"}}, "peer"),
    ({"lynx": {"transfer_id": 1, "max_drafts": -1}}, "max_drafts"),
    ({"lynx": {"transfer_id": 1, "extra": 2}}, "extra"),
    ({"lynx": 5}, "dict"),
])
def test_bad_transfer_params_are_named(raw, match):
    with pytest.raises(ValueError, match=match):
        TransferParams.from_request(raw)


def test_parse_peer():
    assert parse_peer("[::1]:80") == ("[::1]", 80)
    with pytest.raises(ValueError, match="peer"):
        parse_peer("host:0")
