"""The receiver's requests against hostile peers, over real sockets on loopback (issue 18 items
4 and 5): refused, completed and abandoned requests free their slot; a request belongs to the
sender session that opened it, and frames of it from another session are refused; a request
whose sender is gone (no connection for sender_grace_s) fails then."""
import time

import pytest

from lynx_npu.transport import (Receiver, ReceiverConfig, RemoteError, Sender, SenderConfig,
                                TransferDeadlineError, TransferError)
from lynx_npu.transport.request_table import RequestTable
from lynx_npu.wire import Frame, Kind

from .fault_proxy import FaultProxy
from .helpers import assert_kv_equal, expected_kv, make_layers, pair, small_codec
from .hostile_peer import RawPeer, frames_of

WAIT = 30  # a bound, never reached when the code works


def _until(condition, timeout_s: float = 10.0) -> None:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "condition not reached"
        time.sleep(0.01)


def _real_transfer(port: int, receiver: Receiver, rid: int = 1) -> None:
    codec, layers = small_codec("lynx"), make_layers(2, 150, seed=rid)
    with Sender(SenderConfig(port=port)) as s:
        assert s.send(rid, codec, layers).wait(WAIT)
    handle = receiver.request(rid)
    assert handle.wait(WAIT)
    assert_kv_equal(handle, expected_kv(codec, layers))


# -- item 4: request slots are freed when a request completes, fails or is abandoned ----------
def test_refused_and_completed_requests_free_their_slots():
    """Before the fix 256 refused one-frame requests made every later transfer fail with
    'holds max_requests=256'. Here 3 x max_requests refused and as many completed ones."""
    codec = small_codec("int8")
    bad = Frame(**{**frames_of(0, codec, make_layers(1, 10))[0].__dict__,
                   "params": b'{"page_size":0,"payload_format":2}'})  # does not build
    with Receiver(ReceiverConfig(max_requests=4)) as r:
        peer = RawPeer(r.port)
        for rid in range(100, 112):
            reply = peer.exchange(Frame(**{**bad.__dict__, "request_id": rid}))
            assert reply.kind == Kind.ERROR and b"cannot build its codec" in bytes(reply.payload)
        for rid in range(200, 212):  # one-page requests that complete
            (frame,) = frames_of(rid, codec, make_layers(1, 10, seed=rid))
            assert peer.exchange(frame).kind == Kind.ACK
            assert r.request(rid).wait(WAIT)  # complete (decoded): its slot is free again
        peer.close()
        _until(lambda: r.num_active_requests == 0)  # the last ones decode after their ACK
        assert r.request(105).error is not None  # a refused request still says why
        _real_transfer(r.port, r, rid=50)


def test_abandoned_requests_free_their_slots_at_their_deadline():
    codec = small_codec("int8")
    first = {rid: frames_of(rid, codec, make_layers(1, 100))[0] for rid in (0, 1, 2, 3, 9)}
    with Receiver(ReceiverConfig(max_requests=4, deadline_s=3.0)) as r:
        peer = RawPeer(r.port)
        for rid in range(4):  # the first of two pages each, then nothing more
            assert peer.exchange(first[rid]).kind == Kind.ACK
        reply = peer.exchange(first[9])
        assert reply.kind == Kind.ERROR and b"max_requests=4" in bytes(reply.payload)
        _until(lambda: r.num_active_requests == 0)  # abandoned: their deadline passed
        with pytest.raises(TransferDeadlineError):
            r.request(0).wait(WAIT)
        assert peer.exchange(first[9]).kind == Kind.ACK
        peer.close()
        _real_transfer(r.port, r, rid=50)


def test_finished_requests_are_kept_for_request_up_to_a_bound():
    table = RequestTable(max_requests=2, max_finished=3, deadline_s=60)
    handles = []
    for rid in range(5):
        handle, refusal = table.for_frame(rid, owner="a")
        assert refusal is None
        handle.fail(RemoteError("done"))
        handles.append(handle)
    table.sweep()
    assert table.num_active == 0 and table.num_finished == 3
    assert table.claim(4) is handles[4]             # kept
    assert table.claim(0) is not handles[0]         # the oldest was forgotten
    assert table.for_frame(1, owner="a") == (None, None)  # late duplicates are acknowledged


# -- item 5: a request belongs to the session that opened it ---------------------------------
def test_junk_from_another_session_is_refused_and_the_real_transfer_is_exact():
    codec = small_codec("int8")
    layers = make_layers(3, 300)
    junk = frames_of(7, codec, make_layers(3, 300, seed=99))  # same metadata, other values
    with Receiver(ReceiverConfig()) as r, \
            Sender(SenderConfig(port=r.port, gbps=0.005)) as s:  # slow: still in progress
        sent = s.send(7, codec, layers)
        handle = r.request(7)
        _until(lambda: handle.arrivals)  # the real sender opened request 7
        peer = RawPeer(r.port)
        for frame in junk:
            reply = peer.exchange(frame)
            assert reply.kind == Kind.ERROR and reply.request_id == 7
            assert b"belongs to another sender session" in bytes(reply.payload)
        peer.close()
        assert handle.wait(WAIT) and sent.wait(WAIT)
        assert_kv_equal(handle, expected_kv(codec, layers))
        assert handle.error is None


def test_junk_sent_first_is_not_merged_with_the_real_transfer():
    """Before the fix the real transfer 'succeeded' on both sides with wrong values. Now the
    junk owns the id: the real sender is refused at once and the request never completes."""
    codec = small_codec("int8")
    layers = make_layers(1, 300)
    junk = frames_of(8, codec, make_layers(1, 300, seed=99))
    with Receiver(ReceiverConfig(deadline_s=20)) as r:
        peer = RawPeer(r.port)
        for frame in junk[:2]:  # part of the request, every page's metadata right
            assert peer.exchange(frame).kind == Kind.ACK
        with Sender(SenderConfig(port=r.port, deadline_s=60)) as s:
            start = time.monotonic()
            sent = s.send(8, codec, layers)
            with pytest.raises(RemoteError, match="request 8 belongs to another sender session"):
                sent.wait(WAIT)
            assert time.monotonic() - start < 5
        handle = r.request(8)
        assert not handle.residual_ready.is_set()
        assert len(handle.arrivals) == 2  # the junk's two frames, nothing of the real sender
        peer.close()


# -- a sender that is gone: its requests fail after sender_grace_s, not at their deadline -------
@pytest.mark.parametrize("how", ["closed", "silent"])
def test_a_request_whose_sender_is_gone_fails_after_the_grace_not_at_its_deadline(how):
    """A sender sends the first frame of request 9, then its connection closes (its process
    died: "closed"), or it goes silent with the connection open (its host died: "silent"; the
    receiver's idle timeout closes it). The request fails sender_grace_s after its last
    connection ended, naming that, not at its 60 s deadline (the vLLM connector's 600 s); a
    request of another sender after it completes. Before, the error below was a wait that ran
    out."""
    codec = small_codec("int8")
    gone, kept = make_layers(2, 64, seed=1), make_layers(2, 64, seed=2)
    config = ReceiverConfig(deadline_s=60, sender_grace_s=0.5,
                            idle_timeout_s=0.5 if how == "silent" else 60)
    with Receiver(config) as receiver:
        peer = RawPeer(receiver.port)
        try:
            assert peer.exchange(frames_of(9, codec, gone)[0]).kind == Kind.ACK
            if how == "closed":
                peer.close()
            with pytest.raises(TransferError, match=r"request 9: its sender's connection ended "
                                                    r"\d+\.\d s ago and it has not come back "
                                                    r"\(sender_grace_s=0.5; "):
                receiver.request(9).wait(WAIT)
        finally:
            peer.close()
        other = RawPeer(receiver.port)
        try:
            for f in frames_of(10, codec, kept):  # a live sender is served as before
                assert other.exchange(f).kind == Kind.ACK
        finally:
            other.close()
        assert receiver.request(10).wait(WAIT)
        assert_kv_equal(receiver.request(10), expected_kv(codec, kept))


def test_a_sender_that_reconnects_within_the_grace_keeps_its_requests():
    """The connection is cut mid-request (data frame 3); the sender reconnects with its session
    within the grace and resends: the request completes exactly, not failed as gone."""
    codec, layers = small_codec("lynx"), make_layers(3, 300)

    def plan(conn_no, frame_no, kind):
        return "drop_conn" if (conn_no, frame_no) == (0, 3) else "pass"
    with pair(receiver_kw={"sender_grace_s": 2.0},
              sender_kw={"retransmit_s": 0.3, "reconnect_backoff_s": 0.01},
              via=lambda port: FaultProxy(port, plan)) as (receiver, sender, proxy):
        assert sender.send(1, codec, layers).wait(WAIT)
        assert receiver.request(1).wait(WAIT)
        assert_kv_equal(receiver.request(1), expected_kv(codec, layers))
        assert proxy.actions() == ["drop_conn"]


def test_grace_is_validated():
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="sender_grace_s"):
            ReceiverConfig(sender_grace_s=bad)
