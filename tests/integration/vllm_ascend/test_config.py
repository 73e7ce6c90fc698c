"""Connector configuration and per-request parameters: validation names the bad value, and
parsing is strict (issue 18 item 10: booleans, numbers, hosts, peers, codecs, secrets)."""
import secrets

import pytest

from lynx_npu.integration.vllm_ascend.config import (LynxConnectorConfig, TransferParams,
                                                     parse_peer, secret_bits)

GOOD_SECRET = "8854f32bc1c197af688b08a6d1008b82"  # secrets.token_hex(16)


def test_roles_and_defaults():
    c = LynxConnectorConfig.from_vllm("kv_consumer", {"port": 17100})
    assert (c.role, c.port, c.max_drafts, c.early_start_s) == ("consumer", 17100, 64, 0.05)
    assert LynxConnectorConfig.from_vllm("kv_consumer", {"early_start_s": 0}).early_start_s == 0
    p = LynxConnectorConfig.from_vllm("kv_producer", {"peer": "10.0.0.2:17100", "gbps": 10})
    assert (p.role, p.peer, p.gbps, p.codec) == ("producer", "10.0.0.2:17100", 10, "lynx")


def test_fail_layer_is_a_layer_index_or_none():
    t = TransferParams.from_request({"lynx": {"transfer_id": 1, "fail_layer": 0}})
    assert t.fail_layer == 0 and TransferParams(1).fail_layer is None
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="fail_layer"):
            TransferParams.from_request({"lynx": {"transfer_id": 1, "fail_layer": bad}})


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
    ("kv_consumer", {"sender_grace_s": 0}, "sender_grace_s"),
    ("kv_consumer", {"early_start_s": -0.01}, r"early_start_s=-0.01 must be a finite number"),
    ("kv_consumer", {"early_start_s": "0.05"}, "early_start_s='0.05' must be a number"),
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


def test_transfer_key_binds_the_id_to_the_prompt():
    t, prompt = TransferParams(7), list(range(1000, 1300))
    key = t.key(prompt)
    assert 0 < key < 2**63 and key != 7
    assert t.key(list(prompt)) == key == TransferParams(7, codec="int8").key(prompt)
    others = [t.key(prompt[:-1]), t.key(prompt[:-1] + [1]), t.key(prompt[::-1]),
              TransferParams(8).key(prompt), t.key([]), t.key(prompt + [0])]
    assert len({key, *others}) == 1 + len(others)   # any other token or id: another key
    assert t.key(None) == 7   # prompt embeddings: the id alone
    # what the producer's and the consumer's vLLM requests hold: lists of ints, or tuples
    assert t.key(tuple(prompt)) == key


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
    assert parse_peer("[::1]:80") == ("::1", 80)  # what a socket connects to
    assert parse_peer("10.0.0.2:17100") == ("10.0.0.2", 17100)
    assert parse_peer("decode-1.cluster.local:17100") == ("decode-1.cluster.local", 17100)
    with pytest.raises(ValueError, match="peer"):
        parse_peer("host:0")


@pytest.mark.parametrize("peer", [
    " host:80", "host:80 ", "http://h:80", "h:80/x", "host:\u0668\u0660",  # Arabic-Indic 80
    "h\u00f6st:80", "host:+80", "host:080000", ":80", "host:", "[10.0.0.1]:80", "::1:80",
    "999.1.1.1:80", "a..b:80", "-a:80", "[::1:80", "host", 80, "",
])
def test_a_peer_is_parsed_strictly(peer):
    with pytest.raises(ValueError, match="peer"):
        parse_peer(peer)
    with pytest.raises(ValueError, match="peer"):
        LynxConnectorConfig.from_vllm("kv_producer", {"peer": peer})
    with pytest.raises(ValueError, match="peer"):
        TransferParams.from_request({"lynx": {"transfer_id": 1, "peer": peer}})


@pytest.mark.parametrize("key", ["defer_residual"])
def test_booleans_are_booleans_or_exactly_true_false(key):
    for given, want in ((True, True), (False, False), ("true", True), ("false", False)):
        c = LynxConnectorConfig.from_vllm("kv_consumer", {key: given})
        assert getattr(c, key) is want
    for bad in ("False", "no", "0", "", 0, 1, None, [], "false "):
        with pytest.raises(ValueError, match=f"{key}="):
            LynxConnectorConfig.from_vllm("kv_consumer", {key: bad})
    with pytest.raises(ValueError, match=key):
        LynxConnectorConfig(role="consumer", **{key: "false"})  # the dataclass itself: bools


def test_drop_residual_is_a_boolean_too():
    t = TransferParams.from_request({"lynx": {"transfer_id": 1, "drop_residual": "false"}})
    assert t.drop_residual is False
    with pytest.raises(ValueError, match="drop_residual"):
        TransferParams.from_request({"lynx": {"transfer_id": 1, "drop_residual": "yes"}})


def test_withhold_layers_is_a_count():
    t = TransferParams.from_request({"lynx": {"transfer_id": 1, "withhold_layers": 2}})
    assert t.withhold_layers == 2 and TransferParams(1).withhold_layers == 0
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="withhold_layers"):
            TransferParams.from_request({"lynx": {"transfer_id": 1, "withhold_layers": bad}})


@pytest.mark.parametrize("role, extra, match", [
    ("kv_consumer", {"residual_timeout_s": float("inf")}, r"residual_timeout_s=inf must be a "
                                                          r"finite number in \(0, 3600\]"),
    ("kv_consumer", {"transfer_timeout_s": float("nan")}, "transfer_timeout_s=nan"),
    ("kv_consumer", {"transfer_timeout_s": 10**6}, r"in \(0, 86400\]"),
    ("kv_consumer", {"residual_timeout_s": True}, "must be a number, got bool"),
    ("kv_consumer", {"residual_timeout_s": "30"}, "must be a number, got str"),
    ("kv_consumer", {"num_decode_threads": 10**6}, r"num_decode_threads=1000000 must be a "
                                                   r"finite number in \[1, 64\]"),
    ("kv_consumer", {"num_decode_threads": 2.0}, "num_decode_threads=2.0 must be an int"),
    ("kv_producer", {"num_connections": 0}, r"num_connections=0 must be a finite number in "
                                            r"\[1, 16\]"),
    ("kv_producer", {"num_connections": "2"}, "num_connections='2' must be"),
    ("kv_consumer", {"port": True}, "port=True must be an int"),
    ("kv_consumer", {"max_drafts": False}, "max_drafts=False must be an int"),
    ("kv_producer", {"gbps": float("inf")}, "gbps=inf"),
    ("kv_producer", {"gbps": True}, "gbps=True"),
    ("kv_consumer", {"host": ""}, "host='' must be a host name or IP address .*0.0.0.0"),
    ("kv_consumer", {"host": " 127.0.0.1"}, "host=' 127.0.0.1' must be"),
    ("kv_consumer", {"host": "h\u00f6st"}, "ASCII host name"),
    ("kv_consumer", {"host": None}, "host=None"),
    ("kv_producer", {"codec": "zstd"}, "codec='zstd' is not a codec; codecs: bf16, "),
    ("kv_producer", {"codec": "LYNX"}, "codec='LYNX' is not a codec"),
    ("kv_producer", {"codec": "cachegen", "transport": "lmcache", "lmcache_dir": "/tmp"},
     "codec='cachegen' with transport='lmcache': .* value-dependent page sizes; send it over "
     "tcp or mooncake"),
    ("kv_producer", {"secret": " " * 16}, r"secret has 16 characters and ~0 bits"),
    ("kv_producer", {"secret": "a" * 64}, "~0 bits"),
    ("kv_producer", {"secret": "aaaaaaaabbbbbbbb"}, "~16 bits"),
    ("kv_producer", {"secret": "password12345678"}, "~62 bits"),
    ("kv_producer", {"secret": 1234567890123456789}, "secret must be a string"),
])
def test_bad_values_are_refused_by_name(role, extra, match):
    with pytest.raises(ValueError, match=match):
        LynxConnectorConfig.from_vllm(role, extra)


def test_the_secret_is_never_echoed():
    with pytest.raises(ValueError) as e:
        LynxConnectorConfig.from_vllm("kv_producer", {"secret": "hunter2hunter2hunter2"})
    assert "hunter2" not in str(e.value)


def test_good_values_pass():
    c = LynxConnectorConfig.from_vllm("kv_consumer", {
        "host": "0.0.0.0", "port": 17100, "residual_timeout_s": 30, "transfer_timeout_s": 600.0,
        "num_decode_threads": 4, "secret": GOOD_SECRET})
    assert (c.host, c.num_decode_threads) == ("0.0.0.0", 4)
    assert LynxConnectorConfig.from_vllm("kv_consumer", {"host": "::1"}).host == "::1"
    assert LynxConnectorConfig.from_vllm("kv_consumer", {"host": "decode-0"}).host == "decode-0"
    for _ in range(20):  # every secret the docs' recipe makes passes
        LynxConnectorConfig.from_vllm("kv_producer", {"secret": secrets.token_hex(16)})
    assert secret_bits(GOOD_SECRET) > 100


def test_a_request_codec_is_checked_against_the_registry():
    with pytest.raises(ValueError, match="codec='nope' is not a codec"):
        TransferParams.from_request({"lynx": {"transfer_id": 1, "codec": "nope"}})
    with pytest.raises(ValueError, match="max_drafts=True must be an int"):
        TransferParams.from_request({"lynx": {"transfer_id": 1, "max_drafts": True}})


@pytest.mark.parametrize("params, match", [
    ("lynx", "kv_transfer_params must be a dict, got str"),
    (["lynx"], "kv_transfer_params must be a dict, got list"),
    (5, "kv_transfer_params must be a dict, got int"),
    ({"lynx": "x"}, r"kv_transfer_params\['lynx'\] must be a dict, got str"),
    ({"lynx": [1]}, r"must be a dict, got list"),
    ({"lynx": {1: 2, "transfer_id": 1}}, "unknown kv_transfer_params"),
])
def test_malformed_request_params_are_value_errors(params, match):
    with pytest.raises(ValueError, match=match):
        TransferParams.from_request(params)


def test_both_sides_declare_the_registry_and_a_different_build_is_refused():
    """The workers announce every registered codec in the handshake: equal builds connect; a
    prefill build whose lynx differs in one parameter is refused naming it."""
    import lynx_npu
    from lynx_npu.transport import IncompatiblePeerError, Receiver, ReceiverConfig, Sender, \
        SenderConfig

    from lynx_npu.integration.vllm_ascend.config import declared_codecs

    assert [c.name for c in declared_codecs()] == lynx_npu.list_codecs()
    with Receiver(ReceiverConfig(codecs=declared_codecs(), handshake_timeout_s=5)) as receiver:
        with Sender(SenderConfig(port=receiver.port, codecs=declared_codecs())):
            pass
        other = tuple(lynx_npu.get_codec("lynx", alpha_k=0.5) if c.name == "lynx" else c
                      for c in declared_codecs())
        with pytest.raises(IncompatiblePeerError, match="alpha_k"):
            Sender(SenderConfig(port=receiver.port, codecs=other))


def test_a_lynx_plan_reaches_every_lynx_codec_and_both_sides_must_agree():
    """``lynx_plan`` (what `lynx calibrate` writes: Lynx codec parameters) is checked as the
    codec checks them, given to every Lynx codec, and a decode instance without the prefill's
    plan, or with another, refuses it in the handshake, naming the parameter."""
    from lynx_npu.transport import IncompatiblePeerError, Receiver, ReceiverConfig, Sender, \
        SenderConfig

    from lynx_npu.integration.vllm_ascend.config import declared_codecs

    plan = {"layer_anchor_bits": [[18, 5, 4], [23, 5, 4]], "v_chunk_size": 64,
            "layer_v_chunk_size": [[3, 32], [4, 32]]}
    c = LynxConnectorConfig.from_vllm("kv_producer", {"lynx_plan": plan})
    assert c.lynx_plan == {"layer_anchor_bits": ((18, 5, 4), (23, 5, 4)), "v_chunk_size": 64,
                           "layer_v_chunk_size": ((3, 32), (4, 32))}
    for name in ("lynx", "lynx-int8"):
        cfg = c.codec_for(name).config
        assert (cfg.layer_anchor_bits, cfg.v_chunk_size, cfg.layer_v_chunk_size) == \
            tuple(c.lynx_plan.values())
    assert c.codec_for("int8").params() == {"page_size": 256}
    bad_anchor = plan["layer_anchor_bits"]
    for bad, match in (({"layer_anchor_bits": bad_anchor[::-1]}, "increasing order"),
                       ({"layer_anchor_bits": [[18, 9, 4]]}, "K's anchor bits of layer 18"),
                       ({"layer_anchor_bits": [18, 5, 4]}, r"must be \[layer, K's anchor bits"),
                       ({"layer_v_chunk_size": [[3, 0]]}, "V's chunk size of layer 3"),
                       ({"preset": "paper"}, r"unknown Lynx parameter\(s\) \['preset'\]"),
                       ({"v_chunk": 64}, r"unknown Lynx parameter\(s\) \['v_chunk'\]"),
                       ([[18, 5, 4]], "must be a dict of Lynx codec parameters")):
        with pytest.raises(ValueError, match=match):
            LynxConnectorConfig.from_vllm("kv_producer", {"lynx_plan": bad})
    with pytest.raises(ValueError, match=r"unknown kv_connector_extra_config keys .*"
                                         r"'layer_anchor_bits'"):
        LynxConnectorConfig.from_vllm("kv_producer", {"layer_anchor_bits": bad_anchor})
    for other, named in (({}, "layer_anchor_bits"),
                         ({"lynx_plan": {**plan, "layer_v_chunk_size": [[3, 32]]}},
                          "layer_v_chunk_size")):
        consumer = LynxConnectorConfig.from_vllm("kv_consumer", other)
        with Receiver(ReceiverConfig(codecs=declared_codecs(consumer),
                                     handshake_timeout_s=5)) as r:
            with pytest.raises(IncompatiblePeerError, match=named):
                Sender(SenderConfig(port=r.port, codecs=declared_codecs(c)))
