"""Faults between sender and receiver (tests/transport/fault_proxy.py): every request either
arrives bit-identical, with no page lost or applied twice, or fails with a clear error."""
import socket

import pytest

from lynx_npu.transport import TransferDeadlineError
from lynx_npu.wire import Frame, Kind, decode_frame, encode_frame

from .fault_proxy import ACTIONS, FaultProxy, random_plan
from .helpers import assert_kv_equal, expected_kv, make_layers, pair, small_codec

WAIT = 30
FAST = {"retransmit_s": 0.3, "reconnect_backoff_s": 0.01, "deadline_s": 25}


def _transfer_through(plan, sender_kw=None, num_layers=3, num_tokens=300, requests=(1,)):
    codec = small_codec("lynx")
    data = {rid: make_layers(num_layers, num_tokens, seed=rid) for rid in requests}
    calls = []

    def record(rid, layer, s, e, k, v, stage):
        calls.append((rid, layer, s, stage))

    with pair(sender_kw={**FAST, **(sender_kw or {})}, on_page=None,
              via=lambda port: FaultProxy(port, plan)) as (receiver, sender, proxy):
        sends = {rid: sender.send(rid, codec, layers) for rid, layers in data.items()}
        for rid, layers in data.items():
            handle = receiver.request(rid)
            assert handle.wait(WAIT)
            assert sends[rid].wait(WAIT)
            assert_kv_equal(handle, expected_kv(codec, layers))
            keys = [(kind, layer, page) for _, kind, layer, page, _ in handle.arrivals]
            assert len(keys) == len(set(keys)) == sends[rid].num_frames  # none lost, none twice
        return proxy.actions()


@pytest.mark.parametrize("action", ACTIONS)
def test_each_fault_alone_is_recovered(action):
    """The fault hits data frame 3 of the first connection (an anchor, mid-request)."""
    def plan(conn_no, frame_no, kind):
        return action if (conn_no, frame_no) == (0, 3) else "pass"
    assert _transfer_through(plan) == [action]


@pytest.mark.parametrize("seed", range(5))
def test_random_faults_over_two_connections(seed):
    actions = _transfer_through(random_plan(seed), sender_kw={"num_connections": 2},
                                requests=(1, 2))
    assert actions  # the plan did inject faults


def test_residual_that_never_arrives_fails_loudly_after_the_deadline():
    def plan(conn_no, frame_no, kind):
        return "drop_frame" if kind == Kind.RESIDUAL else "pass"
    codec, layers = small_codec("lynx"), make_layers(2, 200)
    with pair(receiver_kw={"deadline_s": 1.5}, sender_kw={**FAST, "deadline_s": 2.0},
              via=lambda port: FaultProxy(port, plan)) as (receiver, sender, _):
        sent = sender.send(1, codec, layers)
        handle = receiver.request(1)
        assert handle.anchor_ready.wait(WAIT)  # decoding could start on the anchor
        assert_kv_equal(handle, expected_kv(codec, layers, "anchor"))
        with pytest.raises(TransferDeadlineError, match=r"request 1: deadline passed .*anchor "
                                                        r"covers 400/400.*full precision 0/400"):
            handle.residual_ready.wait(WAIT)
        with pytest.raises(TransferDeadlineError, match="request 1: deadline passed"):
            sent.wait(WAIT)
        assert sent.anchor_acked.is_set() and not sent.done.is_set()


def test_unsupported_version_gets_an_error_naming_the_field():
    """A peer speaking another format version is told so (and the connection closed)."""
    from lynx_npu.transport import Receiver, ReceiverConfig
    from lynx_npu.transport.connection import FrameSocket, client_handshake
    from lynx_npu.wire import DEFAULT_LIMITS

    with Receiver(ReceiverConfig()) as receiver:
        sock = socket.create_connection(("127.0.0.1", receiver.port), timeout=10)
        conn = FrameSocket(sock, DEFAULT_LIMITS)
        client_handshake(conn, None)
        raw = bytearray(encode_frame(Frame(Kind.ACK, 1, ref_kind=1)))
        raw[4] = 4  # a future version
        sock.sendall(raw)
        reply = conn.read()
        conn.close()
    assert reply.kind == Kind.ERROR and b"'version'" in bytes(reply.payload)
    assert decode_frame(encode_frame(reply)).kind == Kind.ERROR
