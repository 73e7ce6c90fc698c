"""The transport's plain-Python parts on their own: token bucket (fake clock), priority queue,
StageEvent, per-request bookkeeping, configuration checks."""
import asyncio
import threading

import pytest

from lynx_npu.ops.page_serde import serde_for
from lynx_npu.transport import ReceiverConfig, SenderConfig, StageEvent, TokenBucket
from lynx_npu.transport.receive_state import ReceiveHandle, RequestRejected
from lynx_npu.transport.send_queue import SendQueue
from lynx_npu.wire import Frame, Kind

from .helpers import small_codec


class FakeClock:
    def __init__(self):
        self.now = 100.0
        self.slept = []

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.slept.append(s)
        self.now += s


def test_token_bucket_paces_bytes_at_the_link_rate():
    clock = FakeClock()
    bucket = TokenBucket(gbps=8.0, burst_bytes=1000, clock=clock, sleep=clock.sleep)  # 1 GB/s
    start = clock.now
    for _ in range(10):
        bucket.consume(1_000_000)
    # 10 MB at 1 GB/s: done 10 ms after start, less the one burst earned while idle
    assert clock.now - start == pytest.approx(0.01 - 1e-6, abs=1e-12)


def test_token_bucket_idle_time_earns_at_most_the_burst():
    clock = FakeClock()
    bucket = TokenBucket(gbps=8.0, burst_bytes=1000, clock=clock, sleep=clock.sleep)
    bucket.consume(1000)
    clock.now += 5.0  # a long idle period
    assert bucket.reserve(2_000_000) == pytest.approx(clock.now + 0.002 - 1e-6, abs=1e-12)


def test_token_bucket_idle_link_gives_no_free_burst():
    clock = FakeClock()
    bucket = TokenBucket(gbps=8.0, burst_bytes=10_000, clock=clock, sleep=clock.sleep)
    start = clock.now
    bucket.mark_idle()
    assert bucket.reserve(1000) == pytest.approx(start + 1e-6, abs=1e-12)  # full cost
    clock.now = start + 3e-6  # the writer comes back 2 us late: it may catch up
    assert bucket.reserve(1000) == pytest.approx(start + 2e-6, abs=1e-12)
    bucket.mark_idle()  # ... unless the queue ran empty meanwhile
    assert bucket.reserve(1000) == pytest.approx(start + 4e-6, abs=1e-12)


def test_token_bucket_rejects_bad_rate():
    with pytest.raises(ValueError, match="gbps"):
        TokenBucket(0)


def test_queue_strict_priority_and_dedup():
    q = SendQueue()
    q.push(Kind.RESIDUAL, "r1", "r1")
    q.push(Kind.ANCHOR, "a1", "a1")
    q.push(Kind.RESIDUAL, "r2", "r2")
    assert not q.push(Kind.RESIDUAL, "r1", "again")  # already queued
    q.push(Kind.ANCHOR, "a2", "a2")
    assert [q.pop(0) for _ in range(4)] == ["a1", "a2", "r1", "r2"]
    assert q.pop(0.01) is None
    q.pause()
    q.push(Kind.ANCHOR, "a3", "a3")
    assert q.pop(0.01) is None  # paused
    q.resume()
    assert q.pop(0) == "a3"
    q.close()
    assert q.pop(None) is None


def test_stage_event_threads_and_asyncio():
    ok, bad = StageEvent("ok"), StageEvent("bad")
    assert not ok.wait(0.01)
    threading.Timer(0.05, ok.set).start()
    assert ok.wait(10) and ok.is_set()
    bad.fail(RuntimeError("boom"))
    bad.set()  # settled already: stays failed
    with pytest.raises(RuntimeError, match="boom"):
        bad.wait(10)

    async def main():
        later = StageEvent("later")
        asyncio.get_running_loop().call_later(0.02, lambda: threading.Thread(
            target=later.set).start())
        await asyncio.wait_for(later, 10)
        await ok
        with pytest.raises(RuntimeError, match="boom"):
            await bad
    asyncio.run(main())


def _frame(kind=Kind.ANCHOR, layer=0, page=0, s=0, e=10, tokens=20, codec=None, **kw):
    codec = codec or small_codec("lynx")
    from lynx_npu.wire import params_to_json
    return Frame(kind, 1, layer, 2, page, s, e, tokens, codec.codec_id, 2, 0, 2, 16,
                 params_to_json(codec.params()), bytearray(8), **kw)


def _admit(handle, frame, dequantize=True, defer_residual=False):
    codec = small_codec("lynx")
    return handle.admit(frame, 100, lambda cid, p: (codec, serde_for(codec)), 1 << 30,
                        dequantize, defer_residual)


def test_receive_state_duplicates_overlaps_and_mismatches():
    h = ReceiveHandle(1, deadline=1e18)
    assert _admit(h, _frame(Kind.RESIDUAL)) == []  # residual ahead of its anchor: waits
    job, = _admit(h, _frame())
    assert job.residual is not None  # the anchor's job carries the early residual
    assert _admit(h, _frame()) is False  # duplicate
    with pytest.raises(RequestRejected, match="overlap"):
        _admit(h, _frame(page=1, s=5, e=15))
    _admit(h, _frame(layer=1))
    with pytest.raises(RequestRejected, match=r"covers tokens \[0, 12\)"):
        _admit(h, _frame(Kind.RESIDUAL, layer=1, page=0, s=0, e=12))
    with pytest.raises(RequestRejected, match="describes the request"):
        _admit(h, _frame(page=1, s=10, e=20, tokens=21))
    big = ReceiveHandle(2, deadline=1e18)
    with pytest.raises(RequestRejected, match="max_request_bytes"):
        big.admit(_frame(), 100, lambda c, p: (small_codec("lynx"), None), 10, True)


def test_deferred_residual_pages_are_released_together():
    """defer_residual: anchors decode at once; full pages wait for the last residual frame."""
    h = ReceiveHandle(1, deadline=1e18)
    pages = [(layer, page, page * 10, page * 10 + 10) for layer in (0, 1) for page in (0, 1)]
    for layer, page, s, e in pages:
        job, = _admit(h, _frame(Kind.ANCHOR, layer, page, s, e), defer_residual=True)
        assert job.residual is None
    for i, (layer, page, s, e) in enumerate(pages):
        jobs = _admit(h, _frame(Kind.RESIDUAL, layer, page, s, e), defer_residual=True)
        if i < len(pages) - 1:
            assert jobs == []
    assert sorted((j.layer, j.page) for j in jobs) == [p[:2] for p in pages]
    assert all(j.residual is not None for j in jobs)
    assert _admit(h, _frame(Kind.RESIDUAL, 1, 1, 10, 20), defer_residual=True) is False


@pytest.mark.parametrize("late_anchor", [0, 1, 3])
def test_deferred_residual_pages_release_whatever_page_comes_last(late_anchor):
    """defer_residual with the streams reordered (two connections; Mooncake and LMCache
    guarantee no order): a residual that arrives ahead of its anchor still counts, and the
    held pages are released by whichever frame completes the last page, anchor or residual.
    (The last residual ahead of its anchor once left every held page waiting for ever.)"""
    h = ReceiveHandle(1, deadline=1e18)
    pages = [(layer, page, page * 10, page * 10 + 10) for layer in (0, 1) for page in (0, 1)]
    late = pages[late_anchor]
    decoded = []
    for layer, page, s, e in pages:
        if (layer, page, s, e) != late:
            decoded += _admit(h, _frame(Kind.ANCHOR, layer, page, s, e), defer_residual=True)
    assert all(j.residual is None for j in decoded) and len(decoded) == 3
    for i, (layer, page, s, e) in enumerate(pages):  # the late page's ahead of its anchor
        jobs = _admit(h, _frame(Kind.RESIDUAL, layer, page, s, e), defer_residual=True)
        assert jobs == [] if i < len(pages) - 1 else jobs
    assert sorted((j.layer, j.page) for j in jobs) == sorted(p[:2] for p in pages if p != late)
    job, = _admit(h, _frame(Kind.ANCHOR, *late), defer_residual=True)
    assert (job.layer, job.page) == late[:2]
    assert all(j.residual is not None for j in [*jobs, job])


def test_deferred_residual_anchor_after_its_residual_decodes_at_anchor_level_first():
    """An anchor that finds its residual in while other residual frames are still to come
    is decoded at once at anchor precision; its full page waits with the rest."""
    h = ReceiveHandle(1, deadline=1e18)
    assert _admit(h, _frame(Kind.RESIDUAL, 0, 0, 0, 10), defer_residual=True) == []
    job, = _admit(h, _frame(Kind.ANCHOR, 0, 0, 0, 10), defer_residual=True)
    assert job.residual is None
    assert [j.residual is None for j in _admit(h, _frame(Kind.ANCHOR, 0, 1, 10, 20),
                                               defer_residual=True)] == [True]
    for layer in (1,):
        for page, s in ((0, 0), (1, 10)):
            _admit(h, _frame(Kind.ANCHOR, layer, page, s, s + 10), defer_residual=True)
            _admit(h, _frame(Kind.RESIDUAL, layer, page, s, s + 10), defer_residual=True)
    jobs = _admit(h, _frame(Kind.RESIDUAL, 0, 1, 10, 20), defer_residual=True)
    assert sorted((j.layer, j.page) for j in jobs) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_receive_state_levels_only_rise_and_events_fire():
    """Without dequantization: anchor_ready when every token has its anchor, residual_ready
    when every token has both."""
    h = ReceiveHandle(1, deadline=1e18)
    spans = [(0, 0, 10), (0, 1, 20)]  # (layer, page, end) with 20 tokens, and layer 1 alike
    for layer in (0, 1):
        for _, page, end in spans:
            _admit(h, _frame(Kind.ANCHOR, layer, page, end - 10, end), dequantize=False)
    assert h.anchor_ready.is_set() and not h.residual_ready.is_set()
    for layer in (0, 1):
        for _, page, end in spans:
            _admit(h, _frame(Kind.RESIDUAL, layer, page, end - 10, end), dequantize=False)
    assert h.residual_ready.is_set() and "full precision 40/40" in h.progress()


def test_configs_name_the_bad_value():
    with pytest.raises(ValueError, match="port"):
        SenderConfig(port=0)
    with pytest.raises(ValueError, match="gbps"):
        SenderConfig(port=1, gbps=-1)
    with pytest.raises(ValueError, match="num_connections"):
        SenderConfig(port=1, num_connections=0)
    with pytest.raises(ValueError, match="frame_s"):
        SenderConfig(port=1, frame_s=0)
    with pytest.raises(ValueError, match="deadline_s"):
        ReceiverConfig(deadline_s=float("inf"))
    with pytest.raises(ValueError, match="max_requests"):
        ReceiverConfig(max_requests=0)
    for bad in (-0.01, 2, float("nan"), "0.02", True):
        with pytest.raises(ValueError, match="ack_delay_s"):
            ReceiverConfig(ack_delay_s=bad)
    assert "xxxx" not in repr(SenderConfig(port=1, secret=b"x" * 16))  # never logged


def test_frames_stay_within_the_receivers_bound_for_their_tokens():
    """A frame's pages together stay within what the receiver accepts of a payload of their
    tokens (wire.max_data_payload: float32 K and V plus 64 KiB once), so pages that each pass
    are never grouped into a frame the receiver would refuse."""
    from types import SimpleNamespace

    from lynx_npu.transport.sender import Sender
    from lynx_npu.wire import ReceiveLimits, max_data_payload
    from lynx_npu.wire.limits import DEFAULT_LIMITS

    limits = ReceiveLimits.of(DEFAULT_LIMITS, 1 << 40)
    meta = {"num_kv_heads": 1, "head_dim": 1}
    n = 40_000  # one token's page: under its bound (65544), two of them over theirs (65552)
    assert n < max_data_payload(1, 1, 1) and 2 * n > max_data_payload(2, 1, 1)
    stream = [(SimpleNamespace(index=i, token_start=i, token_end=i + 1), memoryview(bytes(n)))
              for i in range(3)]
    sender = SimpleNamespace(config=SenderConfig(port=1))
    groups = list(Sender._frame_groups(sender, stream, limits, meta))
    assert [len(g) for g in groups] == [1, 1, 1]
    small = [(p, v[:1000]) for p, v in stream]  # far under: one frame
    assert [len(g) for g in Sender._frame_groups(sender, small, limits, meta)] == [3]
