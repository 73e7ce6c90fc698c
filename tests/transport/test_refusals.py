"""Frames beyond the receiver's limits, over real sockets on loopback (issue 18 item 6): the
receiver refuses them explicitly (ERROR naming the limit, the request failed, the connection
kept), the sender reports that at once instead of retrying until its deadline, and checks the
receiver's limits (announced in its HELLO) before sending; a page id reused for other tokens
is refused, not acknowledged as a duplicate."""
import time

import pytest

from lynx_npu.transport import (Receiver, ReceiverConfig, RemoteError, Sender, SenderConfig,
                                TransferError)
from lynx_npu.wire import Frame, Kind, ReceiveLimits, WireLimits, page_table

from .helpers import assert_kv_equal, expected_kv, make_layers, small_codec
from .hostile_peer import RawPeer, frames_of, with_fields

WAIT = 30  # a bound, never reached when the code works
SMALL = WireLimits(max_layers=2, max_payload_bytes=6000)  # int8 pages fit, bf16 not
SLOW = dict(deadline_s=60, retransmit_s=30)  # a refusal must not wait for either


def test_the_receiver_announces_its_limits_in_the_handshake():
    cfg = ReceiverConfig(limits=SMALL, max_request_bytes=1 << 20)
    with Receiver(cfg) as r, Sender(SenderConfig(port=r.port)) as s:
        assert s.receiver_limits == ReceiveLimits.of(SMALL, 1 << 20)
        assert s.receiver_limits.max_payload_bytes == 6000


@pytest.mark.parametrize("field,value,named", [
    ("num_layers", 3, b"max_layers=2"),
    ("head_dim", 2000, b"max_head_dim=1024"),
])
def test_a_frame_past_a_limit_gets_an_error_naming_it_and_the_connection_stays(field, value,
                                                                              named):
    codec = small_codec("int8")
    frame = frames_of(3, codec, make_layers(1, 64))[0]
    with Receiver(ReceiverConfig(limits=SMALL)) as r:
        peer = RawPeer(r.port)
        peer.send_raw(with_fields(frame, **{field: value}))
        reply = peer.read()
        assert (reply.kind, reply.request_id) == (Kind.ERROR, 3)
        assert f"frame field '{field}'".encode() in bytes(reply.payload)
        assert named in bytes(reply.payload)
        with pytest.raises(RemoteError, match=field):
            r.request(3).wait(WAIT)  # failed on the receiver too
        good = frames_of(4, codec, make_layers(1, 64))[0]
        assert peer.exchange(good).kind == Kind.ACK  # the same connection goes on
        peer.close()


def test_a_payload_past_max_payload_bytes_is_refused_and_skipped():
    codec = small_codec("bf16")  # a 64-token page: 2 x 2 x 64 x 16 x 2 = 8 KiB > 6000
    big, small = frames_of(5, codec, make_layers(1, 64))[0], frames_of(6, small_codec("int8"),
                                                                          make_layers(1, 10))[0]
    with Receiver(ReceiverConfig(limits=SMALL)) as r:
        peer = RawPeer(r.port)
        reply = peer.exchange(big)  # sent whole: the receiver skips its payload
        assert (reply.kind, reply.request_id) == (Kind.ERROR, 5)
        assert b"frame field 'payload_len'" in bytes(reply.payload)
        assert b"max_payload_bytes=6000" in bytes(reply.payload)
        assert peer.exchange(small).kind == Kind.ACK
        peer.close()


def test_the_sender_refuses_what_the_receiver_would_refuse_before_sending():
    with Receiver(ReceiverConfig(limits=SMALL, max_request_bytes=1 << 20)) as r, \
            Sender(SenderConfig(port=r.port, **SLOW)) as s:
        with pytest.raises(ValueError, match="num_layers=3 exceeds the receiver's max_layers=2"):
            s.send(1, small_codec("int8"), make_layers(3, 64))
        with pytest.raises(ValueError, match="max_request_bytes=1048576"):
            s.send(1, small_codec("int8"), make_layers(1, 20000))
        start = time.monotonic()
        sent = s.send(2, small_codec("bf16"), make_layers(1, 64))  # 8 KiB pages
        with pytest.raises(TransferError, match=r"request 2: layer 0 page 0 anchor: a page "
                                                r"payload of 8192 bytes exceeds the receiver's "
                                                r"bound of 6000 \(max_payload_bytes=6000\)"):
            sent.wait(WAIT)
        assert time.monotonic() - start < 5
        assert not r.request(2).arrivals  # nothing of it was sent


def test_a_sender_unaware_of_the_limits_is_told_at_once():
    """Before the fix the receiver closed the connection and the sender resent until its
    deadline (60 s here, 600 s in the connector); now it fails within seconds, naming the
    limit, on both sides, and the connection serves the next request."""
    codec = small_codec("int8")
    with Receiver(ReceiverConfig(limits=SMALL)) as r, \
            Sender(SenderConfig(port=r.port, **SLOW)) as s:
        s.receiver_limits = None  # as a sender that never learnt them
        start = time.monotonic()
        sent = s.send(1, small_codec("bf16"), make_layers(1, 64))
        with pytest.raises(RemoteError, match=r"request 1: the receiver failed it: frame "
                                              r"refused: frame field 'payload_len'.*"
                                              r"max_payload_bytes=6000"):
            sent.wait(WAIT)
        assert time.monotonic() - start < 5
        with pytest.raises(RemoteError, match="max_payload_bytes=6000"):
            r.request(1).wait(WAIT)
        layers = make_layers(1, 10)
        assert s.send(2, codec, layers).wait(WAIT) and r.request(2).wait(WAIT)
        assert_kv_equal(r.request(2), expected_kv(codec, layers))


def test_a_page_reused_for_other_tokens_is_refused_not_acknowledged_as_a_duplicate():
    codec = small_codec("int8")
    page0, page1 = frames_of(9, codec, make_layers(1, 128))
    with Receiver(ReceiverConfig()) as r:
        peer = RawPeer(r.port)
        assert peer.exchange(page0).kind == Kind.ACK
        reused = Frame(**{**page1.__dict__, "page": 0})  # page 0 again, tokens [64, 128)
        reply = peer.exchange(reused)
        assert reply.kind == Kind.ERROR
        assert b"layer 0 page 0 covers tokens [64, 128) in one frame and [0, 64] in another" \
            in bytes(reply.payload)
        with pytest.raises(RemoteError, match=r"covers tokens \[64, 128\)"):
            r.request(9).wait(WAIT)
        peer.close()


def _merged(frames: list[Frame], table: bytes | None = None) -> Frame:
    """One multi-page frame of consecutive one-page frames of a stream (frame format 4)."""
    first, last = frames[0], frames[-1]
    table = table if table is not None else page_table(
        [f.token_end for f in frames], [len(f.payload) for f in frames])
    return Frame(**{**first.__dict__, "token_end": last.token_end,
                    "extra_pages": len(frames) - 1,
                    "payload": table + b"".join(bytes(f.payload) for f in frames)})


def test_a_multi_page_frame_is_applied_page_by_page_and_a_resend_is_a_duplicate():
    codec = small_codec("int8")  # one stream: pages of 64 tokens
    layers = make_layers(1, 200)
    frames = frames_of(7, codec, layers)
    with Receiver(ReceiverConfig()) as r:
        peer = RawPeer(r.port)
        merged = _merged(frames[:3])
        assert peer.exchange(merged).kind == Kind.ACK
        assert peer.exchange(merged).kind == Kind.ACK  # a resend: acknowledged, not applied
        assert peer.exchange(frames[3]).kind == Kind.ACK
        handle = r.request(7)
        assert handle.wait(WAIT)
        assert_kv_equal(handle, expected_kv(codec, layers))
        assert [a[3] for a in handle.arrivals] == [0, 1, 2, 3]  # every page once
        peer.close()


def test_a_broken_page_table_fails_its_request_naming_it_and_the_connection_stays():
    codec = small_codec("int8")
    frames = frames_of(8, codec, make_layers(1, 200))
    sizes = [len(f.payload) for f in frames[:3]]
    bad = _merged(frames[:3], page_table([64, 128, 192], [sizes[0], sizes[1] + 1, sizes[2]]))
    with Receiver(ReceiverConfig()) as r:
        peer = RawPeer(r.port)
        reply = peer.exchange(bad)
        assert (reply.kind, reply.request_id) == (Kind.ERROR, 8)
        assert b"page table entry 2 claims" in bytes(reply.payload)
        with pytest.raises(RemoteError, match="page table"):
            r.request(8).wait(WAIT)
        good = frames_of(9, codec, make_layers(1, 64))[0]
        assert peer.exchange(good).kind == Kind.ACK
        peer.close()
