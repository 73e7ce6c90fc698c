"""A request the sender fails on its own side (frame format 5): it sends an ERROR frame for it,
and the receiver fails the request at once instead of at its deadline (60 s here, the vLLM
connector's transfer_timeout_s 600 s), so a decode instance recomputes the prompt without
waiting. Before frame format 5 the receiver learnt nothing and waited its deadline out."""
import math

import pytest

from lynx_npu.transport import RemoteError, TransferError
from lynx_npu.wire import Frame, Kind

from .helpers import assert_kv_equal, expected_kv, make_layers, pair, small_codec
from .hostile_peer import RawPeer, frames_of

WAIT = 30  # a bound, never reached when the code works (the receiver's deadline is 60 s)


def _layers_failing_at(layer: int):
    """Three layers whose ``layer`` holds an infinite K: encoding it fails on the sender."""
    layers = make_layers(3, 300)
    layers[layer][0][0, 5, 0] = math.inf
    return layers


@pytest.mark.parametrize("layer", [0, 2], ids=["before_any_frame", "after_two_layers"])
def test_a_request_the_sender_fails_fails_on_the_receiver_at_once(layer):
    codec = small_codec("lynx")
    with pair() as (receiver, sender, _):
        sent = sender.send(7, codec, _layers_failing_at(layer))
        with pytest.raises(TransferError, match="request 7: encoding failed"):
            sent.wait(WAIT)
        # a RemoteError naming the sender's reason, not a timeout at the receiver's deadline
        with pytest.raises(RemoteError, match=r"request 7: the sender failed it: request 7: "
                                              r"encoding failed"):
            receiver.request(7).wait(WAIT)
        layers = make_layers(2, 100, seed=3)  # the connection serves the next request
        assert sender.send(8, codec, layers).wait(WAIT) and receiver.request(8).wait(WAIT)
        assert_kv_equal(receiver.request(8), expected_kv(codec, layers))


def test_an_abort_from_a_sender_that_does_not_own_the_request_changes_nothing():
    codec = small_codec("int8")
    layers = make_layers(2, 64)
    frames = frames_of(9, codec, layers)
    with pair() as (receiver, _, _):
        owner, other = RawPeer(receiver.port), RawPeer(receiver.port)
        try:
            assert owner.exchange(frames[0]).kind == Kind.ACK  # binds request 9 to its session
            other.send(Frame(Kind.ERROR, 9, payload=b"not yours"))
            for f in frames[1:]:
                assert owner.exchange(f).kind == Kind.ACK
        finally:
            owner.close()
            other.close()
        assert receiver.request(9).wait(WAIT)
        assert_kv_equal(receiver.request(9), expected_kv(codec, layers))


def test_an_abort_for_a_completed_request_keeps_its_pages():
    codec = small_codec("int8")
    layers = make_layers(1, 64)
    with pair() as (receiver, _, _):
        peer = RawPeer(receiver.port)
        try:
            for f in frames_of(4, codec, layers):
                assert peer.exchange(f).kind == Kind.ACK
            assert receiver.request(4).wait(WAIT)
            peer.send(Frame(Kind.ERROR, 4, payload=b"too late"))
            peer.send(Frame(Kind.ERROR, 5, payload=b"never sent"))  # a request not seen yet
            with pytest.raises(RemoteError, match="request 5: the sender failed it: never sent"):
                receiver.request(5).wait(WAIT)  # read in order: request 4's abort came first
        finally:
            peer.close()
        assert receiver.request(4).error is None
        assert_kv_equal(receiver.request(4), expected_kv(codec, layers))
