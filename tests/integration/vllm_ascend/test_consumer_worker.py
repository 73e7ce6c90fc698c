"""The decode worker's bookkeeping of transfers no request follows (consumer_worker.py): pages
that come before their request wait in the inbox, but not forever and not without bound, and a
request whose transfer was dropped recomputes at once. The pages enter where the receiver's
threads hand them on (``PageInbox.on_page``); the receiver is the real embedded one."""
import logging
import time

import pytest

from lynx_npu.integration.vllm_ascend.config import LynxConnectorConfig
from lynx_npu.integration.vllm_ascend.consumer_worker import ConsumerWorker, PageInbox, log
from lynx_npu.integration.vllm_ascend.messages import LoadJob
from lynx_npu.ops import WirePage


def _page(start: int = 0) -> WirePage:
    return WirePage(0, start, start + 16, memoryview(b"a" * 8), None)


def test_inbox_drops_unfollowed_transfers_past_the_age_limit_only():
    inbox = PageInbox()
    for rid in (1, 2, 3):
        inbox.on_page(rid, 0, _page(), "anchor")
    now = time.monotonic()
    # young, or followed: kept
    assert inbox.sweep({2}, now, max_age_s=60.0, max_waiting=8) == []
    dropped = inbox.sweep({2}, now + 61.0, max_age_s=60.0, max_waiting=8)
    assert sorted(rid for rid, _ in dropped) == [1, 3]
    assert all("within 60 s" in why for _, why in dropped)
    assert inbox.take(1) == [] and inbox.take(3) == [] and len(inbox.take(2)) == 1
    inbox.on_page(1, 0, _page(), "residual")   # late pages of a dropped transfer: dropped
    assert inbox.take(1) == [] and inbox.num_transfers() == 0


def test_inbox_keeps_at_most_max_waiting_unfollowed_transfers_oldest_dropped_first():
    inbox = PageInbox()
    for rid in (10, 11, 12, 13):
        inbox.on_page(rid, 0, _page(), "anchor")
        time.sleep(0.002)   # distinct arrival times
    dropped = inbox.sweep(set(), time.monotonic(), max_age_s=60.0, max_waiting=2)
    assert [rid for rid, _ in dropped] == [10, 11]
    assert "2 newer transfers" in dropped[0][1]
    assert inbox.num_transfers() == 2


@pytest.fixture
def worker():
    w = ConsumerWorker(LynxConnectorConfig(role="consumer", transfer_timeout_s=0.2), 0, 1)
    yield w
    w.close()


def test_a_transfer_no_request_loads_is_dropped_and_its_request_recomputes_at_once(worker):
    worker.receiver.request(77)   # a slot, as the first frame of a transfer would take
    worker.inbox.on_page(77, 0, _page(), "anchor")
    worker.bind([], [])           # followed by nothing, younger than transfer_timeout_s
    assert worker.inbox.num_transfers() == 1
    time.sleep(0.3)
    worker.bind([], [])
    state = worker.leak_state()
    assert state["inbox"] == 0 and state["receiver_active_requests"] == 0, state
    # its request, come too late, does not wait out a transfer timeout for pages now gone
    worker.bind([LoadJob("late", 77, (1, 2), 20)], [])
    assert worker.finish_step(set()) == ({"late"}, {"late"})
    assert worker.leak_state()["transfers"] == {}


def test_the_scheduler_discards_a_transfer_its_request_will_not_load(worker):
    worker.inbox.on_page(5, 0, _page(), "anchor")
    worker.receiver.request(5)
    worker.bind([LoadJob("a", 6, (1,), 20)], [])
    worker.bind([], [], discards=[5, 6])   # 6 is followed: kept
    state = worker.leak_state()
    assert state["inbox"] == 0 and list(state["streams"]) == [6], state
    assert state["receiver_active_requests"] == 1   # only 6's


def test_a_residual_completed_inside_a_step_refines_in_that_step():
    """The refine starts at the step's next layer wait (wait_for_layer), not at the next
    step's bind, and is reported at that step's finish_step: the scheduler verifies one step
    sooner. Real sender, real receiver, a real paged cache."""
    import torch

    import lynx_npu
    from lynx_npu.integration.vllm_ascend.transports import Senders
    from lynx_npu.ops import KV_CACHE_LAYOUTS, PagedKVCache
    from tests.transport.helpers import D, H, make_layers

    lay, bs, tokens = KV_CACHE_LAYOUTS["vllm_cpu"], 16, 100
    w = ConsumerWorker(LynxConnectorConfig(role="consumer"), 0, 1)
    w.register(PagedKVCache.build(lay, [lay.allocate(8, bs, H, D, torch.bfloat16, fill=0.0)
                                        for _ in range(2)]))
    # a slow link: the residual (~13 KB) completes ~1 s after the anchor
    senders = Senders(LynxConnectorConfig.from_vllm("kv_producer", {"gbps": 1e-4}))
    try:
        codec, layers = lynx_npu.get_codec("lynx"), make_layers(2, tokens)
        job = LoadJob("r", 5, tuple(range(7)), tokens)
        handle = w.receiver.request(5)
        senders.get("127.0.0.1", w.port).send(5, codec, layers)
        assert handle.anchor_ready.wait(30)
        w.bind([job], [])                       # step 1: the anchor is loaded
        assert w.finish_step(set()) == ({"r"}, set())
        w.take_meta()
        w.bind([], [])                          # step 2 begins before the residual is in
        assert not handle.residual_ready.is_set()
        assert not any(what == "refine" for _, what, _ in w._jobs)
        assert handle.residual_ready.wait(30)
        w.wait_for_layer(0)                     # ... and its forward sees it complete
        assert [what for rid, what, _ in w._jobs if rid == "r"][-1:] == ["refine"]
        w.finish_step(set())
        meta = w.take_meta()
        assert meta is not None and "r" in meta.refined
        assert w.leak_state()["transfers"] == {}
    finally:
        senders.close()
        w.close()


def test_a_residual_completed_after_the_last_layer_wait_refines_at_finish_step():
    """A residual completing after the forward's last layer wait (its last layer, the logits)
    refines at that step's finish_step, not at the next step's bind; a request that finished in
    the step does not. Real sender, real receiver, a real paged cache."""
    import torch

    import lynx_npu
    from lynx_npu.integration.vllm_ascend.transports import Senders
    from lynx_npu.ops import KV_CACHE_LAYOUTS, PagedKVCache
    from tests.transport.helpers import D, H, make_layers

    lay, bs, tokens = KV_CACHE_LAYOUTS["vllm_cpu"], 16, 100
    w = ConsumerWorker(LynxConnectorConfig(role="consumer"), 0, 1)
    w.register(PagedKVCache.build(lay, [lay.allocate(16, bs, H, D, torch.bfloat16, fill=0.0)
                                        for _ in range(2)]))
    # a slow link: each residual (~13 KB) completes ~1 s after its anchor
    senders = Senders(LynxConnectorConfig.from_vllm("kv_producer", {"gbps": 1e-4}))
    try:
        codec, layers = lynx_npu.get_codec("lynx"), make_layers(2, tokens)
        sender = senders.get("127.0.0.1", w.port)
        for key, req_id, blocks in ((5, "r", range(7)), (6, "gone", range(7, 14))):
            handle = w.receiver.request(key)
            sender.send(key, codec, layers)
            assert handle.anchor_ready.wait(30)
            w.bind([LoadJob(req_id, key, tuple(blocks), tokens)], [])  # its anchor is loaded
            assert w.finish_step(set()) == ({req_id}, set())
            w.take_meta()
            w.bind([], [])                      # a step begins before the residual is in
            assert not handle.residual_ready.is_set()
            w.wait_for_layer(1)                 # ... its forward's last layer wait
            assert not any(what == "refine" for _, what, _ in w._jobs)
            assert handle.residual_ready.wait(30)
            w.finish_step({"gone"} if req_id == "gone" else set())
            meta = w.take_meta()
            if req_id == "r":
                assert meta is not None and "r" in meta.refined
            else:                               # finished in the step: never refined
                assert meta is None or "gone" not in meta.refined
        assert w.leak_state()["transfers"] == {}
    finally:
        senders.close()
        w.close()


@pytest.mark.parametrize("sent", [(1, 2, 64), (2, 4, 32)])
def test_a_transfer_of_another_shape_than_the_cache_is_recomputed_not_loaded(sent):
    """A producer whose model differs from the consumer's (fewer layers, or 4 KV heads of 32
    where the cache has 2 of 64: the same page sizes) sends a transfer of the right token
    count: loaded, it would leave the cache's other layers as whatever the blocks held before,
    or scramble the heads. The load fails and the request recomputes instead of being reported
    loaded. Real sender, real receiver, a real paged cache."""
    import torch

    import lynx_npu
    from lynx_npu.integration.vllm_ascend.transports import Senders
    from lynx_npu.ops import KV_CACHE_LAYOUTS, PagedKVCache

    lay, bs, tokens = KV_CACHE_LAYOUTS["vllm_cpu"], 16, 100
    num_layers, heads, dim = sent
    w = ConsumerWorker(LynxConnectorConfig(role="consumer"), 0, 1)
    w.register(PagedKVCache.build(lay, [lay.allocate(8, bs, 2, 64, torch.bfloat16, fill=0.0)
                                        for _ in range(2)]))
    senders = Senders(LynxConnectorConfig.from_vllm("kv_producer", {}))
    try:
        g = torch.Generator().manual_seed(0)
        layers = [tuple(torch.randn(heads, tokens, dim, generator=g).to(torch.bfloat16)
                        for _ in "kv") for _ in range(num_layers)]
        handle = w.receiver.request(5)
        senders.get("127.0.0.1", w.port).send(5, lynx_npu.get_codec("lynx"), layers)
        assert handle.wait(30)
        seen = _Records()
        log.addHandler(seen)
        try:
            w.bind([LoadJob("r", 5, tuple(range(7)), tokens)], [])
        finally:
            log.removeHandler(seen)
        assert w.finish_step(set()) == ({"r"}, {"r"})   # failed: recomputed locally
        assert (f"transfer 5 carries {num_layers} layers of {heads} KV heads x {dim}, the "
                f"cache has 2 layers of 2 KV heads x 64") in seen.text
        assert w.leak_state()["transfers"] == {}
    finally:
        senders.close()
        w.close()


@pytest.mark.parametrize("transport", ["tcp", "lmcache"])
def test_a_transfer_its_producer_fails_recomputes_at_once_not_at_the_timeout(transport, tmp_path):
    """The producer's sender cannot encode the KV (an infinite K in layer 1, after layer 0 was
    sent): it fails the request and tells the receiver (over TCP an ERROR frame, frame format
    5; over LMCache an abort object), so the request recomputes now; before, the receiver
    heard nothing and the request waited out transfer_timeout_s (600 s). Real sender, real
    receiver, a real paged cache."""
    import math

    import torch

    import lynx_npu
    from lynx_npu.integration.vllm_ascend.transports import Senders
    from lynx_npu.ops import KV_CACHE_LAYOUTS, PagedKVCache
    from lynx_npu.transport import RemoteError
    from lynx_npu.transport.lmcache_store import unavailable_reason

    extra = {}
    if transport == "lmcache":
        if unavailable_reason():
            pytest.skip(unavailable_reason())
        extra = {"transport": "lmcache", "lmcache_dir": str(tmp_path), "lmcache_l1_mb": 64,
                 "port": 18131}
    lay, bs, tokens = KV_CACHE_LAYOUTS["vllm_cpu"], 16, 100
    w = ConsumerWorker(LynxConnectorConfig.from_vllm("kv_consumer", extra), 0, 1)
    w.register(PagedKVCache.build(lay, [lay.allocate(8, bs, 2, 64, torch.bfloat16, fill=0.0)
                                        for _ in range(2)]))
    senders = Senders(LynxConnectorConfig.from_vllm("kv_producer", extra))
    try:
        g = torch.Generator().manual_seed(0)
        layers = [tuple(torch.randn(2, tokens, 64, generator=g).to(torch.bfloat16)
                        for _ in "kv") for _ in range(2)]
        layers[1][0][0, 3, 0] = math.inf
        handle = w.receiver.request(6)
        sent = senders.get("127.0.0.1", w.port).send(6, lynx_npu.get_codec("lynx"), layers)
        with pytest.raises(RemoteError, match="request 6: the sender failed it: .*encoding "
                                              "failed"):
            handle.wait(30)  # within 30 s, where transfer_timeout_s is 600
        assert sent.failed
        seen = _Records()
        log.addHandler(seen)
        try:
            w.bind([LoadJob("r", 6, tuple(range(7)), tokens)], [])
        finally:
            log.removeHandler(seen)
        assert w.finish_step(set()) == ({"r"}, {"r"})   # failed: recomputed locally
        assert "transfer failed before its anchor" in seen.text
        assert "the sender failed it" in seen.text
        assert w.leak_state()["transfers"] == {}
    finally:
        senders.close()
        w.close()


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.text = ""

    def emit(self, record):
        self.text += record.getMessage() + "\n"
