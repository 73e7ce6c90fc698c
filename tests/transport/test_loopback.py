"""End-to-end transfers over loopback with real codecs: bit-identical KV, callbacks, several
connections, asyncio, strict anchor-before-residual priority."""
import asyncio

import pytest
import torch

from lynx_npu.transport import RemoteError, TransportClosed
from lynx_npu.wire import Kind

from .helpers import H, D, assert_kv_equal, expected_kv, make_layers, pair, small_codec

WAIT = 30  # seconds: a bound, never reached when the code works


@pytest.mark.parametrize("name", ["bf16", "int8", "int4", "lynx", "lynx-int4", "quantspec",
                                  "lynx-plan"])
def test_every_codec_arrives_bit_identical(name):
    codec, layers = small_codec(name), make_layers(num_layers=2, num_tokens=197)
    with pair() as (receiver, sender, _):
        sent = sender.send(11, codec, layers)
        handle = receiver.request(11)
        assert handle.residual_ready.wait(WAIT) and handle.anchor_ready.is_set()
        assert sent.wait(WAIT)
        assert_kv_equal(handle, expected_kv(codec, layers))
        frames = [(kind, layer, page) for _, kind, layer, page, _ in handle.arrivals]
        assert len(frames) == len(set(frames)) == sent.num_pages
        assert sum(n for *_, n in handle.arrivals) == sent.total_bytes


@pytest.mark.parametrize("frame_bytes,frames_per_stream", [(1 << 20, 1), (1, 4), (6000, 2)])
def test_pages_travel_in_frames_of_up_to_frame_bytes(frame_bytes, frames_per_stream):
    """A layer's stream of 4 pages (197 tokens, pages of 64; lynx pages of ~3 KB here) in one
    frame, one frame a page, or frames of at most 6000 bytes (two pages): the same KV arrives."""
    codec, layers = small_codec("lynx"), make_layers(num_layers=2, num_tokens=197)
    with pair(sender_kw={"frame_bytes": frame_bytes}) as (receiver, sender, _):
        sent = sender.send(12, codec, layers)
        handle = receiver.request(12)
        assert handle.wait(WAIT) and sent.wait(WAIT)
        assert_kv_equal(handle, expected_kv(codec, layers))
        assert sent.num_pages == 2 * 2 * 4
        assert sent.num_frames == 2 * 2 * frames_per_stream
        assert sum(n for *_, n in handle.arrivals) == sent.total_bytes


def test_a_paced_link_caps_frames_by_link_time():
    """gbps set: frames carry at most ``frame_s`` of link time (1 KB at 0.008 Gbps and 1 ms:
    one page each, pages being larger), whatever ``frame_bytes`` allows."""
    codec, layers = small_codec("lynx"), make_layers(num_layers=1, num_tokens=197)
    kw = {"frame_bytes": 1 << 20, "gbps": 0.008, "frame_s": 0.001}
    with pair(sender_kw=kw) as (receiver, sender, _):
        assert sender.config.frame_limit == 1000
        sent = sender.send(13, codec, layers)
        assert receiver.request(13).wait(WAIT) and sent.wait(WAIT)
        assert sent.num_frames == sent.num_pages == 2 * 4


def test_anchor_stage_then_refinement_through_on_page():
    codec, layers = small_codec("lynx"), make_layers(num_layers=2, num_tokens=300)
    calls = []
    record = lambda rid, layer, s, e, k, v, stage: calls.append((layer, s, e, stage, k, v))  # noqa
    with pair(on_page=record) as (receiver, sender, _):
        sender.send(5, codec, layers)
        handle = receiver.request(5)
        assert handle.residual_ready.wait(WAIT)
    assert not handle.k  # the callback replaces the destination tensors
    anchor, full = expected_kv(codec, layers, "anchor"), expected_kv(codec, layers, "full")
    seen = set()
    for layer, s, e, stage, k, v in calls:
        assert (layer, s, stage) not in seen, "a page was applied twice at the same stage"
        seen.add((layer, s, stage))
        ref = anchor if stage == "anchor" else full
        assert torch.equal(k, ref[layer][0][:, s:e]) and torch.equal(v, ref[layer][1][:, s:e])
    assert {st for *_, st, _, _ in [(c[0], c[1], c[2], c[3], 0, 0) for c in calls]} <= {
        "anchor", "full"}
    pages = len(codec.encode_pages(*layers[0]))
    assert sum(c[3] == "full" for c in calls) == 2 * pages


def test_several_connections_and_requests():
    codec = small_codec("lynx")
    reqs = {rid: make_layers(num_layers=2, num_tokens=150 + 40 * rid, seed=rid)
            for rid in (1, 2, 3)}
    with pair(sender_kw={"num_connections": 3, "send_buffer_bytes": 1 << 16}) as (
            receiver, sender, _):
        sends = [sender.send(rid, codec, layers) for rid, layers in reqs.items()]
        for rid, layers in reqs.items():
            handle = receiver.request(rid)
            assert handle.wait(WAIT)
            assert_kv_equal(handle, expected_kv(codec, layers))
        assert all(s.wait(WAIT) for s in sends)


def test_priority_every_anchor_before_any_residual():
    """Three requests queued together over one connection: the receiver sees every anchor
    frame of every request before the first residual frame."""
    codec = small_codec("lynx")
    with pair(sender_kw={"gbps": 0.05}) as (receiver, sender, _):
        with sender.paused():
            sends = [sender.send(rid, codec, make_layers(2, 260, seed=rid)) for rid in (7, 8, 9)]
            assert all(s.queued.wait(WAIT) for s in sends)  # every frame of all three
        handles = [receiver.request(rid) for rid in (7, 8, 9)]
        assert all(h.wait(WAIT) for h in handles)
    arrivals = sorted(a for h in handles for a in h.arrivals)
    kinds = [kind for _, kind, *_ in arrivals]
    first_residual = kinds.index(Kind.RESIDUAL)
    assert set(kinds[:first_residual]) == {Kind.ANCHOR}
    assert set(kinds[first_residual:]) == {Kind.RESIDUAL}
    assert all(h.anchor_ready_at <= min(x.residual_ready_at for x in handles) for h in handles)


def test_send_encoded_and_async_waiters():
    codec, layers = small_codec("lynx"), make_layers(num_layers=2, num_tokens=130)
    pages = [codec.encode_pages(k, v) for k, v in layers]

    async def main(receiver, sender):
        handle = receiver.request(3)
        sent = sender.send_encoded(3, codec, pages, num_tokens=130, num_kv_heads=H,
                                   head_dim=D, dtype=torch.bfloat16)
        await asyncio.wait_for(handle.anchor_ready, WAIT)
        await asyncio.wait_for(handle.residual_ready, WAIT)
        await asyncio.wait_for(sent, WAIT)
        return handle

    with pair(sender_kw={"gbps": 0.1}) as (receiver, sender, _):
        handle = asyncio.run(main(receiver, sender))
        assert_kv_equal(handle, expected_kv(codec, layers))
    # pre-encoded: every anchor frame is queued before any residual, so none overtakes one
    kinds = [kind for _, kind, *_ in handle.arrivals]
    assert kinds == sorted(kinds)


def test_contradicting_frames_fail_the_request_on_both_sides():
    """The same request id sent twice with different token counts: the receiver rejects the
    second description and both waiters get the reason."""
    codec = small_codec("int8")
    with pair(sender_kw={"deadline_s": 20}) as (receiver, sender, _):
        assert sender.send(4, codec, make_layers(1, 64)).wait(WAIT)
        assert receiver.request(4).wait(WAIT)
        receiver.release(4)
        first = sender.send(5, codec, make_layers(1, 64))
        assert receiver.request(5).wait(WAIT) and first.wait(WAIT)
        bad = sender.send(5, codec, make_layers(1, 70))  # the sender finished 5: id is free
        with pytest.raises(RemoteError, match="describes the request"):
            bad.wait(WAIT)


def test_receiver_refuses_requests_larger_than_its_bound():
    """The sender knows the receiver's bound from the handshake and refuses at send(); one
    that does not (its limits forgotten here) is refused by the receiver, on both sides."""
    codec = small_codec("bf16")
    with pair(receiver_kw={"max_request_bytes": 1000}) as (receiver, sender, _):
        with pytest.raises(ValueError, match="would refuse this request: request KV of 8192 "
                                             "bytes exceeds the receiver's max_request_bytes"):
            sender.send(1, codec, make_layers(1, 64))
        sender.receiver_limits = None
        sent = sender.send(1, codec, make_layers(1, 64))
        with pytest.raises(RemoteError, match="max_request_bytes"):
            sent.wait(WAIT)
        with pytest.raises(RemoteError, match="max_request_bytes"):
            receiver.request(1).wait(WAIT)


def test_close_wakes_waiters_with_an_error():
    codec = small_codec("lynx")
    with pair(sender_kw={"gbps": 0.001}) as (receiver, sender, _):
        sent = sender.send(1, codec, make_layers(2, 300))
        handle = receiver.request(1)
        sender.close()
        receiver.close()
        with pytest.raises(TransportClosed):
            sent.wait(WAIT)
        with pytest.raises(TransportClosed, match="closed"):
            handle.residual_ready.wait(WAIT)


def test_bad_send_arguments():
    codec = small_codec("lynx")
    # a slow link keeps request 2 in flight for the duplicate below (at full speed it could
    # be acknowledged first)
    with pair(sender_kw={"gbps": 0.001}) as (_, sender, _p):
        with pytest.raises(ValueError, match="non-empty"):
            sender.send(1, codec, [])
        with pytest.raises(ValueError, match="request_id"):
            sender.send(-1, codec, make_layers(1, 10))
        with pytest.raises(ValueError, match="codec_id"):
            sender.send(1, object(), make_layers(1, 10))
        sender.send(2, codec, make_layers(2, 300))
        with pytest.raises(ValueError, match="already being sent"):
            sender.send(2, codec, make_layers(1, 10))
        bad = sender.send(3, codec, [(torch.zeros(2, 4, 4), torch.zeros(2, 5, 4))])
        with pytest.raises(Exception, match="encoding failed.*shapes differ"):
            bad.wait(WAIT)
