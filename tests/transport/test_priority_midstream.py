"""Cross-request priority measured at the receiver, for requests that arrive while another's
residual is on the link. send_queue.py claims: any pending anchor frame, of any request, is
popped before any residual frame. So once a request's anchor frames are queued, no residual
frame popped after that may reach the receiver before the last of those anchors.

The sender is held (``Sender.paused``: nothing is popped) while the new requests are queued,
and the frames already popped are let land first, so "popped after" is exactly "arrived after
the resume"; the receiver's per-frame arrival times (``ReceiveHandle.arrivals``) are checked."""
import time

from lynx_npu.wire import Kind

from .helpers import make_layers, pair, small_codec

WAIT = 30  # seconds: a bound, never reached when the code works


def _settle(handles, quiet_s: float = 0.3) -> float:
    """Wait until no frame has arrived for ``quiet_s``; returns that moment."""
    count = -1
    while True:
        now = sum(len(h.arrivals) for h in handles)
        if now == count:
            return time.monotonic()
        count = now
        time.sleep(quiet_s)


def test_anchors_of_requests_queued_midstream_overtake_pending_residuals():
    codec = small_codec("lynx")
    first, later = 21, (22, 23, 24)
    with pair(sender_kw={"gbps": 0.02}) as (receiver, sender, _):
        a = receiver.request(first)
        sent = [sender.send(first, codec, make_layers(3, 700, seed=1))]
        assert a.anchor_ready.wait(WAIT)
        deadline = time.monotonic() + WAIT  # part of its residual is through, not all of it
        while not any(kind == Kind.RESIDUAL for _, kind, *_ in a.arrivals):
            assert time.monotonic() < deadline, "no residual frame arrived"
            time.sleep(0.01)
        assert not a.residual_ready.is_set(), "the first residual finished too soon"
        with sender.paused():
            sent += [sender.send(rid, codec, make_layers(2, 150 + 120 * i, seed=rid))
                     for i, rid in enumerate(later)]
            assert all(s.queued.wait(WAIT) for s in sent[1:])
            handles = [a] + [receiver.request(rid) for rid in later]
            resumed = _settle(handles)
        assert all(h.wait(WAIT) for h in handles) and all(s.wait(WAIT) for s in sent)
    before = [(t, kind) for h in handles for t, kind, *_ in h.arrivals if t < resumed]
    after = sorted((t, kind, h.request_id) for h in handles for t, kind, *_ in h.arrivals
                   if t >= resumed)
    assert any(kind == Kind.RESIDUAL for _, kind in before)  # the first residual was mid-way
    assert all(h.request_id == first for h in handles for t, *_ in h.arrivals if t < resumed)
    kinds = [kind for _, kind, _ in after]
    first_residual = kinds.index(Kind.RESIDUAL)
    # Every anchor frame of the three later requests, then the rest of every residual.
    assert kinds[:first_residual] == [Kind.ANCHOR] * first_residual
    assert Kind.ANCHOR not in kinds[first_residual:]
    assert {rid for _, _, rid in after[:first_residual]} == set(later)
    assert first_residual == sum(kind == Kind.ANCHOR for h in handles[1:]
                                 for _, kind, *_ in h.arrivals)
