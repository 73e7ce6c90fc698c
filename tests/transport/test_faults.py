"""Faults between sender and receiver (tests/transport/fault_proxy.py): every request either
arrives bit-identical, with no page lost or applied twice, or fails with a clear error.

The adversarial part (issue 18): every fault kind of the proxy on 20 transfers running
concurrently over one sender, one fault in each transfer, all bit-identical; and transfers that
cannot finish beside ones that can: the first fail by their deadline on both sides, naming
what arrived, while the others complete."""
import random
import socket
import threading
import time

import pytest

from lynx_npu.transport import TransferDeadlineError
from lynx_npu.wire import VERSION, Frame, Kind, decode_frame, encode_frame

from .fault_proxy import ALL_ACTIONS, FaultProxy, random_plan
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
            assert len(keys) == len(set(keys)) == sends[rid].num_pages  # none lost, none twice
        return proxy.actions()


@pytest.mark.parametrize("action", ALL_ACTIONS)
def test_each_fault_alone_is_recovered(action):
    """The fault hits data frame 3 of the first connection (an anchor, mid-request)."""
    def plan(conn_no, frame_no, kind):
        return action if (conn_no, frame_no) == (0, 3) else "pass"
    assert _transfer_through(plan) == [action]


@pytest.mark.parametrize("seed", range(5))
def test_random_faults_over_two_connections(seed):
    # one page a frame: 36 frames a request for the plan to hit (multi-page frames under
    # faults: the twenty-transfer suite below)
    actions = _transfer_through(random_plan(seed), sender_kw={"num_connections": 2,
                                                              "frame_bytes": 1},
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
        raw[4] = VERSION + 1  # a future version
        sock.sendall(raw)
        reply = conn.read()
        conn.close()
    assert reply.kind == Kind.ERROR and b"'version'" in bytes(reply.payload)
    assert decode_frame(encode_frame(reply)).kind == Kind.ERROR


# -- the adversarial suite: >= 20 transfers per fault kind, concurrent over one sender --------
N_TRANSFERS = 20


def _one_fault_per_request(action: str, frames_per_request: int, seed: int = 0):
    """A by_frame plan: in every request, the first transmission of one frame (chosen at
    random: anchor or residual, any layer and page) gets ``action``; everything else, and
    every retransmission, passes."""
    rng, seen, lock = random.Random(seed), set(), threading.Lock()
    chosen: dict[int, int] = {}  # rid -> index of its faulted frame in order of first sight
    counts: dict[int, int] = {}

    def by_frame(conn_no, key):
        rid = key[0]
        with lock:
            if key in seen:
                return "pass"
            seen.add(key)
            index = counts.get(rid, 0)
            counts[rid] = index + 1
            target = chosen.setdefault(rid, rng.randrange(frames_per_request))
        return action if index == target else "pass"

    return by_frame


@pytest.mark.parametrize("action", ALL_ACTIONS)
def test_twenty_concurrent_transfers_under_each_fault_are_bit_identical(action):
    """20 requests (2 layers x 192 tokens, pages of 64: 12 pages each, in 4 frames of 3 pages)
    sent at once over one sender with two connections; one frame of every request is faulted.
    Every request arrives bit-identical to codec.decode_page of its pages, every frame once, none applied twice."""
    codec = small_codec("lynx")
    data = {rid: make_layers(2, 192, seed=rid) for rid in range(1, N_TRANSFERS + 1)}
    frames_per_request, pages_per_request = 2 * 2, 2 * 2 * 3  # (layer, stream) frames
    proxy_of = lambda port: FaultProxy(  # noqa: E731
        port, by_frame=_one_fault_per_request(action, frames_per_request))
    with pair(sender_kw={**FAST, "num_connections": 2}, via=proxy_of) as (receiver, sender,
                                                                          proxy):
        sends = {rid: sender.send(rid, codec, layers) for rid, layers in data.items()}
        for rid, layers in data.items():
            handle = receiver.request(rid)
            assert handle.wait(WAIT), f"request {rid}"
            assert sends[rid].wait(WAIT), f"request {rid}"
            assert_kv_equal(handle, expected_kv(codec, layers))
            keys = [(kind, layer, page) for _, kind, layer, page, _ in handle.arrivals]
            assert len(keys) == len(set(keys)) == sends[rid].num_pages == pages_per_request
            assert sends[rid].num_frames == frames_per_request
        faulted = proxy.faulted()
    assert sorted(faulted) == [(rid, action) for rid in data]  # each request hit once


def test_transfers_that_cannot_finish_fail_by_their_deadline_beside_ones_that_do():
    """20 requests at once over one sender: requests 1-5 lose every frame (nothing arrives),
    6-10 every residual frame (the anchor arrives), 11-20 pass through random faults. The
    first ten fail with TransferDeadlineError on both sides, each by its deadline and naming
    what arrived; the other ten are bit-identical. Nothing hangs."""
    deadline_s = 3.0
    rng, lock = random.Random(7), threading.Lock()

    def by_frame(conn_no, key):
        rid, kind = key[0], key[1]
        if rid <= 5 or (rid <= 10 and kind == Kind.RESIDUAL):
            return "drop_frame"
        with lock:
            return rng.choice(("delay", "reorder", "corrupt_payload", "duplicate")) \
                if rng.random() < 0.15 else "pass"

    codec = small_codec("lynx")
    data = {rid: make_layers(2, 128, seed=rid) for rid in range(1, N_TRANSFERS + 1)}
    with pair(receiver_kw={"deadline_s": deadline_s},
              sender_kw={**FAST, "deadline_s": deadline_s, "num_connections": 2},
              via=lambda port: FaultProxy(port, by_frame=by_frame)) as (receiver, sender, _):
        start = time.monotonic()
        sends = {rid: sender.send(rid, codec, layers) for rid, layers in data.items()}
        handles = {rid: receiver.request(rid) for rid in data}
        for rid in range(11, N_TRANSFERS + 1):
            assert handles[rid].wait(WAIT) and sends[rid].wait(WAIT), f"request {rid}"
            assert_kv_equal(handles[rid], expected_kv(codec, data[rid]))
        for rid in range(1, 11):
            arrived = r"\(no frame received\)" if rid <= 5 else (r"anchor covers 256/256.*"
                                                               r"full precision 0/256")
            with pytest.raises(TransferDeadlineError,
                               match=rf"request {rid}: deadline passed .*{arrived}"):
                handles[rid].wait(WAIT)
            with pytest.raises(TransferDeadlineError, match=rf"request {rid}: deadline passed"):
                sends[rid].wait(WAIT)
            assert sends[rid].anchor_acked.is_set() == (rid > 5)
        elapsed = time.monotonic() - start
        assert elapsed < deadline_s + 5.0, elapsed  # by the deadline (plus ticks and load)
        assert receiver.num_active_requests == 0     # the failed requests freed their slots


def _stalled(serde, layers, go):
    """Layer 0 at once, the rest once ``go`` is set (a prefill still encoding)."""
    yield serde.encode(*layers[0])
    go.wait(WAIT)
    for k, v in layers[1:]:
        yield serde.encode(k, v)


def test_a_receiver_that_is_gone_fails_the_senders_requests_after_the_grace():
    """The receiver dies mid-request (closed after layer 0 arrived; later frames have nowhere
    to go): the sender fails the request receiver_grace_s after it lost the connection,
    naming it, instead of holding its KV to the deadline (60 s here, the vLLM connector's
    transfer_timeout_s 600 s); so does a request sent while the receiver is still gone.
    Before, the error below was a wait that ran out."""
    import threading

    from lynx_npu.ops import serde_for
    from lynx_npu.transport import Receiver, ReceiverConfig, Sender, SenderConfig, TransferError
    codec, layers = small_codec("lynx"), make_layers(3, 300)
    go = threading.Event()
    receiver = Receiver(ReceiverConfig())
    port = receiver.port
    try:
        with Sender(SenderConfig(port=port, receiver_grace_s=0.5, deadline_s=60,
                                 **{k: v for k, v in FAST.items() if k != "deadline_s"})) as s:
            serde = serde_for(codec)
            handle = s.send_layers(3, codec, _stalled(serde, layers, go), num_layers=3,
                                   num_tokens=300, num_kv_heads=layers[0][0].shape[0],
                                   head_dim=layers[0][0].shape[2], dtype=layers[0][0].dtype)
            arrived = receiver.request(3)
            deadline = time.monotonic() + WAIT
            while not arrived.arrivals:
                assert time.monotonic() < deadline, "layer 0 never arrived"
                time.sleep(0.01)
            receiver.close()
            go.set()
            gone = (rf"no connection to the receiver 127.0.0.1:{port} for \d+\.\d s "
                    rf"\(receiver_grace_s=0.5; last link error: ")
            with pytest.raises(TransferError, match=rf"request 3: {gone}"):
                handle.wait(WAIT)
            with pytest.raises(TransferError, match=rf"request 4: {gone}"):
                s.send(4, codec, layers).wait(WAIT)
    finally:
        go.set()
        receiver.close()
