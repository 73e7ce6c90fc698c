"""The LMCache transport (lynx_npu/transport/lmcache*.py) with the real LMCache 0.5.6
StorageManager and its fs_native L2 on a temporary directory: sender and receiver each own a
StorageManager, as two instances would (one test puts the sender in a second process)."""
import os

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")

import math  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
import pathlib  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from lynx_npu.transport import (ReceiverConfig, RemoteError, SenderConfig,  # noqa: E402
                                TransferDeadlineError, TransferError, TransportClosed)
from lynx_npu.transport.lmcache_store import LMCacheConfig, unavailable_reason  # noqa: E402
from tests.transport.helpers import (assert_kv_equal, expected_kv, make_layers,  # noqa: E402
                                     small_codec)

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))
REPO = pathlib.Path(__file__).resolve().parents[2]
PORT = 18123  # names the receiver's objects; nothing listens on it


@pytest.fixture
def lmc(tmp_path):
    """-> make(receiver_kw, sender_kw, store_kw) building a receiver and a sender (each its own
    StorageManager) on one directory; all closed at the end."""
    from lynx_npu.transport.lmcache import LMCacheReceiver, LMCacheSender
    made = []

    def make(receiver_kw=None, sender_kw=None, store_kw=None, sender=True):
        store = LMCacheConfig(directory=str(tmp_path), l1_mb=64, **(store_kw or {}))
        rx = LMCacheReceiver(ReceiverConfig(port=PORT, **(receiver_kw or {})), store)
        made.append(rx)
        if not sender:
            return rx, None
        tx = LMCacheSender(SenderConfig(port=PORT, **(sender_kw or {})), store)
        made.append(tx)
        return rx, tx

    yield make
    for x in reversed(made):
        x.close()


def object_path(directory, request_id, kind, layer=0, page=0) -> pathlib.Path:
    """The fs_native file of an object (LMCacheStore.key's fields)."""
    salt = {0: "header", 1: "anchor", 2: "residual", 48: "abort"}[kind]
    digest = struct.pack(">QHI", request_id, layer, page).hex()
    return pathlib.Path(directory) / f"lynx-{PORT}@0x00000000@0@{digest}@{salt}.data"


@pytest.mark.parametrize("name", ["lynx", "lynx-int4", "int8", "bf16", "lynx-plan"])
def test_round_trip_is_exact(lmc, name):
    rx, tx = lmc()
    codec, layers = small_codec(name), make_layers(num_layers=3, num_tokens=300)
    handle = rx.request(1)
    sent = tx.send(1, codec, layers)
    assert handle.wait(60) and sent.wait(30)
    assert handle.anchor_ready.is_set() and sent.anchor_acked.is_set()
    assert_kv_equal(handle, expected_kv(codec, layers))
    if len(codec.stages) > 1:  # the anchor stream alone was complete first
        assert handle.anchor_ready_at <= handle.residual_ready_at


def test_every_anchor_read_before_any_residual(lmc, tmp_path):
    """Three requests stored before the receiver asks: it reads every anchor of the three
    before any residual; each request's arrivals are anchors first."""
    rx, tx = lmc()
    codec = small_codec("lynx")
    data = {rid: make_layers(num_layers=2, num_tokens=200, seed=rid) for rid in (1, 2, 3)}
    for rid, layers in data.items():
        assert tx.send(rid, codec, layers).wait(30)
    handles = {rid: rx.request(rid) for rid in data}
    for rid, h in handles.items():
        assert h.wait(60)
        assert_kv_equal(h, expected_kv(codec, data[rid]))
        kinds = [a[1] for a in h.arrivals]
        assert kinds.index(2) == kinds.count(1) == 2 * 4  # 2 layers x 4 pages of 64 tokens
    order = [kind for _, kind in rx.read_order]
    assert order == [1] * 24 + [2] * 24


def test_sender_in_a_second_process(lmc, tmp_path):
    rx, _ = lmc(sender=False)
    codec, layers = small_codec("lynx"), make_layers(num_layers=2, num_tokens=300, seed=5)
    handle = rx.request(9)
    script = textwrap.dedent(f"""
        import os, sys
        os.environ["LMCACHE_TRACK_USAGE"] = "false"
        from lynx_npu.transport import SenderConfig
        from lynx_npu.transport.lmcache import LMCacheConfig, LMCacheSender
        from tests.transport.helpers import make_layers, small_codec
        with LMCacheSender(SenderConfig(port={PORT}),
                           LMCacheConfig(directory=sys.argv[1], l1_mb=64)) as tx:
            h = tx.send(9, small_codec("lynx"), make_layers(num_layers=2, num_tokens=300,
                                                             seed=5))
            assert h.wait(60)
            print("stored", h.num_frames)
    """)
    child = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.split()[-1] == str(1 + 2 * 2 * 5)  # header + 2 layers x 5 pages x 2
    assert handle.wait(60)
    assert_kv_equal(handle, expected_kv(codec, layers))


def test_release_deletes_the_objects(lmc, tmp_path):
    rx, tx = lmc()
    codec = small_codec("lynx")
    for rid in (4, 5):
        handle = rx.request(rid)
        assert tx.send(rid, codec, make_layers(num_layers=2, num_tokens=100)).wait(30)
        assert handle.wait(30)
    names = lambda rid: [p for p in tmp_path.iterdir()  # noqa: E731
                         if f"{struct.pack('>Q', rid).hex()}" in p.name]
    assert len(names(4)) == len(names(5)) == 1 + 2 * 2 * 2
    rx.release(4)
    assert names(4) == [] and len(names(5)) == 9  # only what was released
    rx.release(5)
    assert list(tmp_path.iterdir()) == []


def test_stale_objects_are_swept_by_a_new_receiver(lmc, tmp_path):
    rx, tx = lmc()
    assert tx.send(6, small_codec("lynx"), make_layers(num_layers=1, num_tokens=64)).wait(30)
    assert len(list(tmp_path.iterdir())) == 3
    rx.close()
    rx2, _ = lmc(sender=False)
    assert list(tmp_path.iterdir()) == []
    handle = rx2.request(6, deadline_s=0.5)
    with pytest.raises(TransferDeadlineError, match="header object was never stored"):
        handle.wait(10)


def test_corrupt_object_fails_its_request_only(lmc, tmp_path):
    rx, tx = lmc()
    codec = small_codec("lynx")
    for rid in (11, 12):
        assert tx.send(rid, codec, make_layers(num_layers=2, num_tokens=200, seed=rid)).wait(30)
    path = object_path(tmp_path, 11, 1, layer=1, page=2)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40  # a page byte: the frame's payload CRC32C no longer matches
    path.write_bytes(bytes(data))
    bad, good = rx.request(11), rx.request(12)
    t0 = time.monotonic()
    with pytest.raises(TransferError, match=r"request 11: layer 1 page 2 ANCHOR object: "
                                            r".*payload"):
        bad.wait(30)
    assert time.monotonic() - t0 < 10  # at once, not at the deadline
    assert good.wait(30)
    assert_kv_equal(good, expected_kv(codec, make_layers(num_layers=2, num_tokens=200,
                                                         seed=12)))


def test_corrupt_header_fails_clearly(lmc, tmp_path):
    rx, tx = lmc()
    assert tx.send(13, small_codec("lynx"), make_layers(num_layers=1, num_tokens=64)).wait(30)
    path = object_path(tmp_path, 13, 0)
    data = bytearray(path.read_bytes())
    data[20] ^= 1  # the layer count: the header CRC fails
    path.write_bytes(bytes(data))
    with pytest.raises(TransferError, match="request 13: header object: .*header"):
        rx.request(13).wait(30)


@pytest.mark.parametrize("fault", ["missing", "truncated"])
def test_missing_or_truncated_residual_fails_by_the_deadline(lmc, tmp_path, fault):
    """The anchor stream completes; a residual object that is gone, or shorter than the codec
    says, is never read: the request fails at its deadline naming what was not stored."""
    rx, tx = lmc()
    codec = small_codec("lynx")
    assert tx.send(14, codec, make_layers(num_layers=2, num_tokens=200)).wait(30)
    path = object_path(tmp_path, 14, 2, layer=0, page=1)
    if fault == "missing":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[:-100])
    handle = rx.request(14, deadline_s=2.0)
    assert handle.anchor_ready.wait(10)
    t0 = time.monotonic()
    with pytest.raises(TransferDeadlineError, match=r"request 14: deadline passed .* 0 anchor "
                                                    r"and 1 residual objects not stored"):
        handle.wait(30)
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("layer", [0, 2], ids=["before_any_object", "after_two_layers"])
def test_a_request_the_sender_fails_fails_on_the_receiver_at_once(lmc, tmp_path, layer):
    """A request whose KV does not encode (an infinite K in ``layer``): the sender stores an
    abort object for it, and the receiver fails the request with the sender's reason at once,
    whether it asked before or after, instead of waiting out its deadline (60 s here, the vLLM
    connector's transfer_timeout_s 600 s). Before the abort object it learnt nothing: the
    RemoteError below was a wait that ran out."""
    rx, tx = lmc()
    codec = small_codec("lynx")
    layers = make_layers(num_layers=3, num_tokens=300)
    layers[layer][0][0, 5, 0] = math.inf
    asked = rx.request(21) if layer else None  # before the sender fails; else after it did
    with pytest.raises(TransferError, match="request 21: encoding failed"):
        tx.send(21, codec, layers).wait(30)
    handle = asked or rx.request(21)
    with pytest.raises(RemoteError, match=r"request 21: the sender failed it: request 21: "
                                          r"encoding failed"):
        handle.wait(30)
    assert object_path(tmp_path, 21, 48).exists()
    rx.release(21)
    assert not object_path(tmp_path, 21, 48).exists()  # released with its request
    layers = make_layers(num_layers=2, num_tokens=100, seed=3)  # the pair serves the next one
    assert tx.send(22, codec, layers).wait(30) and rx.request(22).wait(30)
    assert_kv_equal(rx.request(22), expected_kv(codec, layers))


def test_an_unreadable_abort_object_fails_its_request_only(lmc):
    """An abort object that is not an ERROR frame of its request still says its sender failed
    it (no sender stores one otherwise): that request fails, naming it; the others are read."""
    rx, tx = lmc()
    codec, layers = small_codec("int8"), make_layers(num_layers=2, num_tokens=100)
    bad, good = rx.request(23), rx.request(24)
    tx.store.put([(tx.store.key(tx.space, 23, 48), bytes(4096))], lambda key: None)
    with pytest.raises(TransferError, match="request 23: its abort object is unreadable"):
        bad.wait(30)
    assert tx.send(24, codec, layers).wait(30) and good.wait(30)
    assert_kv_equal(good, expected_kv(codec, layers))


def test_sender_fails_at_its_deadline(lmc):
    """A request not in L2 by the sender's deadline fails there, naming what was missing."""
    rx, tx = lmc()
    codec = small_codec("lynx")
    serde = tx._serde(codec, tx._meta(codec, 2, 64, 2, 16, torch.bfloat16))
    layers = make_layers(num_layers=2, num_tokens=64)

    def slow():  # the second layer comes after the deadline
        yield serde.encode(*layers[0])
        time.sleep(0.5)
        yield serde.encode(*layers[1])
    handle = tx.send_layers(15, codec, slow(), num_layers=2, num_tokens=64, num_kv_heads=2,
                            head_dim=16, dtype=torch.bfloat16, deadline_s=0.1)
    with pytest.raises(TransferDeadlineError, match="request 15: deadline passed with .* "
                                                    "objects not yet stored in LMCache's L2"):
        handle.wait(30)


def test_config_and_receiver_refusals(tmp_path):
    from lynx_npu.transport.lmcache import LMCacheReceiver, LMCacheSender
    for kw, match in [({"directory": ""}, "directory='' must be a non-empty path"),
                      ({"directory": "d", "l1_mb": 8}, "l1_mb=8 must be an int >= 16"),
                      ({"directory": "d", "gbps": 0}, "gbps=0 must be a positive"),
                      ({"directory": "d", "poll_interval_s": float("nan")}, "poll_interval_s")]:
        with pytest.raises(ValueError, match=match):
            LMCacheConfig(**kw)
    store = LMCacheConfig(directory=str(tmp_path), l1_mb=16)
    with pytest.raises(ValueError, match="port=0"):
        LMCacheReceiver(ReceiverConfig(port=0), store)
    with pytest.raises(ValueError, match="gbps"):
        LMCacheSender(SenderConfig(port=PORT, gbps=1.0), store)


def test_close_fails_waiters(lmc):
    rx, _ = lmc(sender=False)
    handle = rx.request(16)
    rx.close()
    with pytest.raises(TransportClosed):
        handle.wait(5)


def test_a_header_whose_objects_cannot_be_sized_fails_its_request_only(lmc):
    """A header object naming a codec whose page sizes depend on the values (cachegen): the
    sender refuses to store one, and when another writes it anyway the receiver cannot size its
    objects, so that request fails at once, naming why, and the requests beside it are still
    read (the fetcher's pass used to raise on that header every time, so no other request's
    anchors were ever read again)."""
    import threading

    import lynx_npu
    from lynx_npu.codec import wire_params
    from lynx_npu.transport.lmcache_sender import HEADER_KIND, header_frame
    from lynx_npu.wire import DTYPE_CODES, params_to_json

    rx, tx = lmc()
    codec = small_codec("lynx")
    layers = make_layers(num_layers=2, num_tokens=200, seed=22)
    cachegen = lynx_npu.get_codec("cachegen")
    with pytest.raises(ValueError, match=r"over LMCache .* value-dependent page sizes; send it "
                                         r"over tcp or mooncake"):
        tx.send(21, cachegen, layers)
    assert tx.send(22, codec, layers).wait(30)
    meta = dict(num_layers=2, num_tokens=200, codec_id=cachegen.codec_id,
                dtype=DTYPE_CODES[torch.bfloat16], num_kv_heads=2, head_dim=16,
                params=params_to_json(wire_params(cachegen)))
    stored = threading.Event()
    key = tx.store.key(tx.space, 21, HEADER_KIND)
    assert tx.store.put([(key, header_frame(21, meta, True))], lambda _: stored.set()) == []
    assert stored.wait(30)
    bad, good = rx.request(21), rx.request(22)
    with pytest.raises(TransferError, match=r"request 21: header object: .*cachegen.* "
                                            r"value-dependent page sizes"):  # not the deadline's
        bad.wait(30)
    assert good.wait(30)
    assert_kv_equal(good, expected_kv(codec, layers))


def test_a_header_naming_millions_of_objects_fails_its_request_at_once(lmc):
    """One 4 KiB header within max_request_bytes (one KV head of one dim, 4096 layers of 512K
    tokens) names 8.4M page objects; planning them held the shared fetch thread for minutes.
    The receiver counts them first and fails that request, naming the count; the request beside
    it is still read."""
    import threading

    import lynx_npu
    from lynx_npu.codec import wire_params
    from lynx_npu.transport.lmcache_receiver import MAX_REQUEST_OBJECTS
    from lynx_npu.transport.lmcache_sender import HEADER_KIND, header_frame
    from lynx_npu.wire import DTYPE_CODES, params_to_json

    rx, tx = lmc()
    codec = small_codec("lynx")
    layers = make_layers(num_layers=2, num_tokens=200, seed=24)
    assert tx.send(24, codec, layers).wait(30)
    int8 = lynx_npu.get_codec("int8")
    meta = dict(num_layers=4096, num_tokens=1 << 19, codec_id=int8.codec_id,
                dtype=DTYPE_CODES[torch.bfloat16], num_kv_heads=1, head_dim=1,
                params=params_to_json(wire_params(int8)))
    stored = threading.Event()
    key = tx.store.key(tx.space, 23, HEADER_KIND)
    assert tx.store.put([(key, header_frame(23, meta, True))], lambda _: stored.set()) == []
    assert stored.wait(30)
    bad, good = rx.request(23), rx.request(24)
    with pytest.raises(TransferError, match=rf"request 23: header object: it names \d+ objects "
                                            rf"\(4096 layers x \d+ pages x 1 streams\), over the "
                                            rf"receiver's {MAX_REQUEST_OBJECTS} per request"):
        bad.wait(60)  # before the cap: no error within the minute (the planning still ran)
    assert good.wait(30)
    assert_kv_equal(good, expected_kv(codec, layers))
