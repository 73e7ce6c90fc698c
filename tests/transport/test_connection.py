"""Connections against hostile or broken peers, over real sockets on loopback (issue 18 items
2, 3 and 7): reads hold what arrived, not what a header announced; silent connections and slow
handshakes are closed by their deadline, and cannot lock an honest sender out; a handshake
corrupted in transit is retried, then reported as a HandshakeError."""
import select
import socket
import threading
import time
import tracemalloc

import pytest
import torch

import lynx_npu
from lynx_npu.transport import HandshakeError, Receiver, ReceiverConfig, Sender, SenderConfig
from lynx_npu.transport.connection_slots import ConnectionSlots
from lynx_npu.wire import HEADER_SIZE, NONCE_BYTES, Compat, Frame, Kind, encode_frame

from .helpers import assert_kv_equal, expected_kv, make_layers, small_codec
from .hostile_peer import RawPeer, frames_of, header_claiming

SECRET = b"0123456789abcdef-shared"
WAIT = 30  # a bound, never reached when the code works
MiB = 1 << 20


def _until(condition, timeout_s: float = 10.0) -> float:
    """Poll ``condition`` until true; returns the seconds it took (fails after timeout_s)."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "condition not reached"
        time.sleep(0.01)
    return time.monotonic() - start


# -- item 2: memory bounded by what arrived; an idle timeout on every connection -------------
def test_headers_announcing_64_MiB_hold_only_what_arrived_and_idle_peers_are_closed():
    """16 peers each send a header announcing a 64 MiB payload (960 bytes in all), then
    nothing: before the fix the receiver allocated ~1 GiB at once and held every slot for
    ever. Now each holds one 64 KiB piece, and all are closed after idle_timeout_s."""
    frame = frames_of(5, small_codec("bf16"), make_layers(1, 64))[0]
    big = Frame(**{**frame.__dict__, "token_end": 512, "num_tokens": 512, "num_kv_heads": 128,
                   "head_dim": 128})
    header = header_claiming(big, 64 * MiB)  # the most the page shape and the limits allow
    with Receiver(ReceiverConfig(idle_timeout_s=1.0, max_connections=16)) as r:
        peers = [RawPeer(r.port) for _ in range(16)]
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            sent_at = time.monotonic()
            for peer in peers:
                peer.send_raw(header)
            _until(lambda: r.buffered_bytes() == 16 * (64 << 10))
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert r.buffered_bytes() == MiB       # 16 x 64 KiB, not 16 x 64 MiB
        assert grown < 4 * MiB, grown          # every Python allocation on every thread
        assert r.num_connections == 16         # every slot taken...
        _until(lambda: r.num_connections == 0)  # ...until the idle timeout frees them all
        assert 0.95 < time.monotonic() - sent_at < 5.0
        assert r.buffered_bytes() == 0
        for peer in peers:
            assert peer.sock.recv(1) == b""
            peer.close()
        codec, layers = small_codec("int8"), make_layers(2, 150)
        with Sender(SenderConfig(port=r.port)) as s:  # the real sender is served
            assert s.send(1, codec, layers).wait(WAIT)
        handle = r.request(1)
        assert handle.wait(WAIT)
        assert_kv_equal(handle, expected_kv(codec, layers))


def test_a_large_payload_is_read_whole_in_growing_pieces():
    """One 1 MiB frame (bf16, 8 heads x 256 tokens x 128) arrives exact."""
    codec = lynx_npu.get_codec("bf16")
    g = torch.Generator().manual_seed(1)
    layers = [(torch.randn(8, 256, 128, generator=g).bfloat16(),
               torch.randn(8, 256, 128, generator=g).bfloat16())]
    with Receiver(ReceiverConfig()) as r, Sender(SenderConfig(port=r.port)) as s:
        assert s.send(1, codec, layers).wait(WAIT)
        handle = r.request(1)
        assert handle.wait(WAIT)
        assert_kv_equal(handle, expected_kv(codec, layers))


def test_an_idle_sender_is_closed_and_reconnects_when_it_has_frames():
    codec = small_codec("int8")
    with Receiver(ReceiverConfig(idle_timeout_s=0.5)) as r, \
            Sender(SenderConfig(port=r.port)) as s:
        assert s.send(1, codec, make_layers(1, 64)).wait(WAIT)
        _until(lambda: r.num_connections == 0)  # silent for 0.5 s: closed
        time.sleep(0.5)
        assert r.num_connections == 0           # and not reopened while there is nothing
        layers = make_layers(2, 100, seed=3)
        assert s.send(2, codec, layers).wait(WAIT) and r.request(2).wait(WAIT)
        assert_kv_equal(r.request(2), expected_kv(codec, layers))


# -- item 3: a total handshake deadline; slow handshakes cannot lock senders out -------------
def _hello_bytes() -> bytes:
    return encode_frame(Frame(Kind.HELLO, payload=bytes(NONCE_BYTES) + Compat().to_json()))


def _drip(socks: list[socket.socket], stop: threading.Event, every_s: float) -> None:
    """Send the next byte of a valid HELLO on every socket every ``every_s`` seconds (each
    recv of the receiver gets a byte well within any per-recv timeout)."""
    hello, i = _hello_bytes(), 0
    while not stop.wait(every_s) and i < len(hello):
        for sock in socks:
            try:
                sock.send(hello[i:i + 1])
            except OSError:
                pass
        i += 1


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_dripped_handshake_is_closed_at_its_total_deadline():
    """One byte every 0.3 s with handshake_timeout_s=1: before the fix the 1 s timeout was
    per recv and never fired; now the connection is closed ~1 s after it opened."""
    with Receiver(ReceiverConfig(handshake_timeout_s=1.0)) as r:
        sock = socket.create_connection(("127.0.0.1", r.port), timeout=10)
        start, stop = time.monotonic(), threading.Event()
        dripper = threading.Thread(target=_drip, args=([sock], stop, 0.3), daemon=True)
        dripper.start()
        try:
            _until(lambda: r.num_connections == 1)  # accepted (else 0 is read before it is)
            _until(lambda: r.num_connections == 0, timeout_s=5)
            assert 0.95 < time.monotonic() - start < 4.0
            assert _closed(sock)
        finally:
            stop.set()
            dripper.join()
            sock.close()


def test_slow_handshakes_cannot_lock_an_authenticated_sender_out():
    """16 connections drip their handshakes (max_handshakes=16): an authenticated sender
    still connects at once (the oldest drip is evicted) and transfers; the drips are all
    closed by their deadline although they keep dripping."""
    cfg = ReceiverConfig(secret=SECRET, handshake_timeout_s=4.0, max_handshakes=16)
    with Receiver(cfg) as r:
        socks = [socket.create_connection(("127.0.0.1", r.port), timeout=10) for _ in range(16)]
        stop = threading.Event()
        dripper = threading.Thread(target=_drip, args=(socks, stop, 0.2), daemon=True)
        dripper.start()
        try:
            _until(lambda: r.num_connections == 16)
            start = time.monotonic()
            codec, layers = small_codec("int8"), make_layers(2, 150)
            with Sender(SenderConfig(port=r.port, secret=SECRET)) as s:
                assert time.monotonic() - start < 3.0  # before any deadline freed a slot
                assert s.send(1, codec, layers).wait(WAIT)
                handle = r.request(1)
                assert handle.wait(WAIT)
                assert_kv_equal(handle, expected_kv(codec, layers))
                _until(lambda: r.num_connections == 1, timeout_s=10)  # only the sender's
            assert sum(_closed(sock) for sock in socks) == 16
        finally:
            stop.set()
            dripper.join()
            for sock in socks:
                sock.close()


# -- item 7: a corrupted handshake is retried, then a clear HandshakeError -------------------
class _HandshakeCorrupter:
    """A TCP proxy in front of a receiver that flips one bit of the receiver's HELLO on the
    first ``num_corrupt`` connections (the payload CRC then fails on the sender)."""

    def __init__(self, target_port: int, num_corrupt: int):
        self.target_port, self.num_corrupt = target_port, num_corrupt
        self.num_connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            corrupt = self.num_connections < self.num_corrupt
            self.num_connections += 1
            self._socks += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, corrupt),
                             daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, corrupt: bool) -> None:
        seen = 0
        try:
            while data := src.recv(65536):
                if corrupt and seen <= HEADER_SIZE + 40 < seen + len(data):
                    data = bytearray(data)
                    data[HEADER_SIZE + 40 - seen] ^= 0x04  # inside the HELLO's description
                seen += len(data)
                dst.sendall(bytes(data))
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        for s in self._socks:
            s.close()


def test_a_handshake_corrupted_once_is_retried_and_the_transfer_is_exact():
    with Receiver(ReceiverConfig()) as r:
        proxy = _HandshakeCorrupter(r.port, num_corrupt=1)
        try:
            codec, layers = small_codec("lynx"), make_layers(2, 150)
            with Sender(SenderConfig(port=proxy.port)) as s:
                assert proxy.num_connections == 2  # the corrupted one, then a clean one
                assert s.send(1, codec, layers).wait(WAIT)
            handle = r.request(1)
            assert handle.wait(WAIT)
            assert_kv_equal(handle, expected_kv(codec, layers))
        finally:
            proxy.close()


def test_a_handshake_corrupted_every_time_ends_in_a_handshake_error():
    """Before the fix Sender() raised the raw ChecksumError of its first attempt."""
    with Receiver(ReceiverConfig()) as r:
        proxy = _HandshakeCorrupter(r.port, num_corrupt=100)
        try:
            start = time.monotonic()
            with pytest.raises(HandshakeError, match=r"the handshake with 127\.0\.0\.1:\d+ "
                                                     r"failed 3 times; last: ChecksumError: "
                                                     r"payload CRC32C mismatch"):
                Sender(SenderConfig(port=proxy.port, handshake_attempts=3))
            assert time.monotonic() - start < 5
            assert proxy.num_connections == 3
        finally:
            proxy.close()


def test_handshake_attempts_is_validated():
    with pytest.raises(ValueError, match="handshake_attempts"):
        SenderConfig(port=1, handshake_attempts=0)
    with pytest.raises(ValueError, match="idle_timeout_s"):
        ReceiverConfig(idle_timeout_s=float("inf"))
    with pytest.raises(ValueError, match="max_handshakes"):
        ReceiverConfig(max_handshakes=0)


def test_connection_slots_evict_the_oldest_handshake_and_bound_the_established():
    slots = ConnectionSlots(max_connections=2, max_handshakes=2)
    assert slots.admit("a") == (True, None) and slots.admit("b") == (True, None)
    assert slots.admit("c") == (True, "a")       # the oldest handshake makes room
    assert not slots.establish("a")              # evicted: it cannot come back
    assert slots.establish("b") and slots.establish("c")
    assert slots.admit("d") == (False, None)     # every established slot is taken
    slots.remove("b")
    assert slots.admit("d") == (True, None)
    assert (slots.num_handshaking, slots.num_established) == (1, 1)


# -- delayed acknowledgements ----------------------------------------------------------------
def test_acks_wait_ack_delay_s_for_the_frames_behind_them_and_go_out_together():
    """On a paced link frames arrive one by one; the receiver answers them in one batch once
    the oldest has waited ack_delay_s, not with a send per frame (each send cost the decode
    process's model thread the GIL: docs/transport.md). With ack_delay_s=0 a frame is
    answered as soon as no other is waiting."""
    frames = frames_of(3, small_codec("int8"), make_layers(1, 200))[:3]
    with Receiver(ReceiverConfig(ack_delay_s=1.0)) as r:
        peer = RawPeer(r.port)
        start = time.monotonic()
        peer.send(frames[0])
        time.sleep(0.2)
        peer.send(frames[1])
        # 0.6 s after the first frame: both still held, nothing to read
        assert select.select([peer.sock], [], [], 0.4)[0] == []
        replies = [peer.read(), peer.read()]
        assert time.monotonic() - start >= 1.0
        assert [(f.kind, f.page) for f in replies] == [(Kind.ACK, frames[0].page),
                                                        (Kind.ACK, frames[1].page)]
        peer.close()
    with Receiver(ReceiverConfig(ack_delay_s=0)) as r:
        peer = RawPeer(r.port)
        start = time.monotonic()
        peer.send(frames[2])
        assert peer.read().kind == Kind.ACK
        assert time.monotonic() - start < 0.8  # not held (the batch above waited 1 s)
        peer.close()
