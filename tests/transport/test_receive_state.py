"""A page's write runs outside the request's lock (receive_state.ReceiveHandle.apply): the
readers keep admitting frames while the consumer writes, and a release returns only once no
write is in progress, after which none starts."""
from __future__ import annotations

import threading
import time

from .helpers import make_layers, pair, small_codec

WAIT = 10.0
HOLD = 60.0  # the blocked consumer's own limit: longer than any wait of the test


def _blocking_consumer():
    """An on_page that blocks on its first call until ``go`` is set; counts its calls."""
    go, entered, calls = threading.Event(), threading.Event(), []

    def on_page(*args):
        calls.append(args[:4])
        entered.set()
        go.wait(HOLD)
    return on_page, go, entered, calls


def _wait_until(predicate, timeout: float = WAIT) -> bool:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_frames_are_admitted_while_the_consumer_writes():
    on_page, go, entered, _ = _blocking_consumer()
    codec, layers = small_codec("lynx"), make_layers(3, 300)
    frames = 2 * sum(len(codec.encode_pages(k, v)) for k, v in layers)
    with pair(on_page=on_page) as (receiver, sender, _):
        handle = receiver.request(1)
        sender.send(1, codec, layers)
        assert entered.wait(WAIT)
        # the consumer still holds the first page: every frame must get in meanwhile
        arrived = _wait_until(lambda: len(handle.arrivals) == frames)
        go.set()
        assert arrived, f"{len(handle.arrivals)} of {frames} frames admitted while a page " \
                        f"was being written"
        assert handle.residual_ready.wait(WAIT)


def test_release_waits_for_the_write_in_progress_and_stops_later_ones():
    on_page, go, entered, calls = _blocking_consumer()
    with pair(on_page=on_page) as (receiver, sender, _):
        receiver.request(1)
        sender.send(1, small_codec("lynx"), make_layers(3, 300))
        assert entered.wait(WAIT)
        released = threading.Thread(target=receiver.release, args=(1,))
        released.start()
        released.join(0.3)
        assert released.is_alive(), "release returned while a page was being written"
        go.set()
        released.join(WAIT)
        assert not released.is_alive()
        seen = len(calls)
        time.sleep(0.3)  # frames still queued for the decode thread must not be written
        assert len(calls) == seen


def _consumer_blocking_at(n: int):
    """An on_page that blocks on its ``n``-th call (1-based) until ``go`` is set."""
    go, entered, calls = threading.Event(), threading.Event(), []

    def on_page(*args):
        calls.append(args[:4])
        if len(calls) == n:
            entered.set()
            go.wait(HOLD)
    return on_page, go, entered


def test_a_layer_waits_for_its_anchor_and_the_eta_follows_the_pages():
    """What a decode worker that starts a request early relies on (consumer_worker.py): a
    layer's anchor is "in" once every anchor page of it was handed on; the anchor's ETA is
    None before any page is, finite while some are, 0 once all are."""
    on_page, go, entered = _consumer_blocking_at(2)
    codec, layers = small_codec("lynx"), make_layers(3, 300)
    with pair(on_page=on_page) as (receiver, sender, _):
        handle = receiver.request(1)
        assert handle.anchor_eta() is None and not handle.layer_anchor_in(0)
        sender.send(1, codec, layers)
        assert entered.wait(WAIT)  # one page handed on, the second held by the consumer
        eta, share = handle.anchor_eta(), handle.anchor_share()
        assert handle.two_stream and eta is not None and 0 < eta < float("inf")
        assert 0 < share < 1
        assert not handle.layer_anchor_in(2) and not handle.wait_layer_anchor(2, 0.05)
        go.set()
        assert handle.wait_layer_anchor(2, WAIT) and handle.layer_anchor_in(0)
        assert handle.anchor_ready.wait(WAIT) and handle.anchor_eta() == 0.0
        assert handle.anchor_share() == 1.0


def test_a_failed_request_wakes_whoever_waits_for_a_layer():
    on_page, go, entered = _consumer_blocking_at(1)
    with pair(on_page=on_page) as (receiver, sender, _):
        handle = receiver.request(1)
        sender.send(1, small_codec("lynx"), make_layers(3, 300))
        assert entered.wait(WAIT)
        woke = []
        waiter = threading.Thread(target=lambda: woke.append(handle.wait_layer_anchor(2, HOLD)))
        waiter.start()
        failer = threading.Thread(target=handle.fail, args=(RuntimeError("peer gone"),))
        failer.start()  # returns only after the held write; the waiter must not wait for it
        waiter.join(WAIT)
        alive = waiter.is_alive()
        go.set()
        failer.join(WAIT)
        assert not alive and woke == [True]
