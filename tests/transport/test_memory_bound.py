"""The receiver's memory against hostile peers, measured as the OS sees it (issue 18).

A real Receiver runs in a subprocess of its own (``python -m tests.transport.test_memory_bound
serve``), a fresh one per attack, so its resident set is its own. Hostile peers on loopback then send what could cost
it memory - headers announcing the largest payload, frames left half sent, hundreds of
connections, thousands of refused requests, tiny frames claiming huge pages - and the rise of
its peak RSS (``VmHWM`` of /proc/<pid>/status, reset before each attack through clear_refs)
over its RSS before the attack must stay under the bound the receiver's configuration sets:

    per connection: READ_BUFFER + min(max(FIRST_CHUNK, 3 x bytes of the frame that arrived),
                                      HEADER_SIZE + max_params_bytes + max_payload_bytes)
    in total:       (max_connections + max_handshakes) x that, with the whole frame arrived
    requests:       what their pages decode to (at most max_request_bytes each)

plus SLACK for the threads and the allocator. After every attack an honest Sender must still
be served, bit-identical. ``python -m pytest -q -s tests/transport/test_memory_bound.py``
prints the figures (docs/transport.md records them)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import pytest

from lynx_npu.transport import ReceiverConfig, Sender, SenderConfig
from lynx_npu.wire import (HEADER_SIZE, NONCE_BYTES, Compat, Frame, Kind, WireLimits,
                           encode_frame)

from .helpers import expected_kv, make_layers, small_codec
from .hostile_peer import RawPeer, frames_of, header_claiming, with_fields

KiB, MiB = 1 << 10, 1 << 20
ROOT = pathlib.Path(__file__).resolve().parents[2]
LIMITS = WireLimits(max_payload_bytes=8 * MiB)
CONFIG = dict(max_connections=8, max_handshakes=8, max_requests=32, max_finished_requests=32,
              max_request_bytes=128 * MiB, handshake_timeout_s=5.0, idle_timeout_s=10.0,
              deadline_s=2.0)
READ_BUFFER = 64 * KiB  # SocketReader's buffered file (connection.py)
FIRST_CHUNK = 64 * KiB  # a frame's first allocation (connection.py _FIRST_CHUNK)
SLACK = 16 * MiB        # thread stacks, sockets, the allocator's arenas
FRAME_CAP = HEADER_SIZE + LIMITS.max_params_bytes + LIMITS.max_payload_bytes
N_SLOTS = CONFIG["max_connections"] + CONFIG["max_handshakes"]
FIGURES: list[tuple[str, int, int, int]] = []  # (attack, bytes sent, rise, bound)


def conn_bound(arrived: int) -> int:
    """What one connection may hold while ``arrived`` bytes of its frame are in: the buffer
    holds at most twice what arrived, and while it grows the zero block it is extended by
    (connection.SocketReader: ``buf.extend(bytes(...))``) exists beside it for a moment."""
    return READ_BUFFER + min(max(FIRST_CHUNK, 3 * arrived), FRAME_CAP)


TOTAL_BOUND = N_SLOTS * conn_bound(FRAME_CAP) + SLACK


# -- the receiver process ---------------------------------------------------------------------
def _digest(layers) -> str:
    """SHA-256 of [(k, v), ...] layer by layer, as raw bytes."""
    import torch
    h = hashlib.sha256()
    for k, v in layers:
        for t in (k, v):
            h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def serve() -> None:
    """The subprocess: a Receiver; stdin commands ``digest RID`` (wait for the request, print
    the SHA-256 of its KV), ``stats``, ``quit``."""
    import torch

    from lynx_npu.transport import Receiver
    torch.set_num_threads(1)
    receiver = Receiver(ReceiverConfig(limits=LIMITS, **CONFIG))
    print(receiver.port, flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "digest":
            handle = receiver.request(int(args[0]))
            try:
                handle.wait(30)
                print(_digest([(handle.k[i], handle.v[i]) for i in sorted(handle.k)]),
                      flush=True)
            except Exception as e:  # noqa: BLE001 - reported to the test
                print(f"error {type(e).__name__}: {e}", flush=True)
            receiver.release(int(args[0]))
        elif cmd == "stats":
            print(json.dumps({"connections": receiver.num_connections,
                              "buffered": receiver.buffered_bytes(),
                              "active": receiver.num_active_requests}), flush=True)
        elif cmd == "quit":
            break
    receiver.close()


class _Process:
    def __init__(self):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.transport.test_memory_bound", "serve"], cwd=ROOT,
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.port = int(self._line(60))
        self.rid = 1000

    def _line(self, timeout_s: float) -> str:
        result: list[str] = []
        t = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()),
                             daemon=True)
        t.start()
        t.join(timeout_s)
        assert result and result[0], "the receiver process did not answer"
        return result[0].strip()

    def ask(self, command: str, timeout_s: float = 40) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._line(timeout_s)

    def stats(self) -> dict:
        return json.loads(self.ask("stats"))

    def status(self) -> dict[str, int]:
        """VmHWM and VmRSS of the receiver process, in bytes."""
        out = {}
        for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(value.split()[0]) * KiB
        return out

    def reset_peak(self) -> None:
        pathlib.Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS

    def serves_an_honest_sender(self) -> None:
        self.rid += 1
        codec, layers = small_codec("lynx"), make_layers(2, 130, seed=self.rid)
        with Sender(SenderConfig(port=self.port, deadline_s=30)) as s:
            assert s.send(self.rid, codec, layers).wait(30)
        assert self.ask(f"digest {self.rid}") == _digest(expected_kv(codec, layers))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module", autouse=True)
def _print_figures():
    yield
    if FIGURES:
        print("\nattack | bytes sent | peak RSS rise MiB | bound MiB")
        for name, sent, rise, bound in FIGURES:
            print(f"{name} | {sent:,} | {rise / MiB:.1f} | {bound / MiB:.1f}")
        print(f"total bound (every slot holding a whole frame): {TOTAL_BOUND / MiB:.1f} MiB")


@pytest.fixture
def receiver():
    """A fresh receiver process per attack: memory the allocator kept from an earlier attack
    would otherwise absorb the next one's and hide it from the RSS."""
    p = _Process()
    try:
        p.serves_an_honest_sender()  # warm: codecs built, torch's allocator primed
        p.serves_an_honest_sender()
        yield p
        assert p.proc.poll() is None, "the receiver process died"
    finally:
        p.close()


def _until(condition, timeout_s: float = 20.0) -> None:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "condition not reached"
        time.sleep(0.02)


@contextlib.contextmanager
def _measured(p: _Process, name: str, bound: int):
    """Peak RSS rise of the receiver over the block (the block waits for the attack to take
    hold); asserted under ``bound`` and TOTAL_BOUND. The block sets sent[0] to its bytes."""
    time.sleep(0.2)
    before = p.status()["VmRSS"]
    p.reset_peak()
    sent = [0]
    yield sent
    time.sleep(0.3)  # let every connection's thread take what it will
    rise = p.status()["VmHWM"] - before
    FIGURES.append((name, sent[0], rise, bound))
    assert rise <= bound, f"{name}: the receiver's peak RSS rose {rise / MiB:.1f} MiB, " \
                          f"bound {bound / MiB:.1f} MiB"
    assert rise <= TOTAL_BOUND


def _data_frame(rid: int = 5) -> Frame:
    """A real bf16 frame reshaped so its page may carry up to 64 MiB (512 tokens x 128 heads x
    128): a header announcing max_payload_bytes passes every check but the payload's arrival."""
    frame = frames_of(rid, small_codec("bf16"), make_layers(1, 64))[0]
    return Frame(**{**frame.__dict__, "token_end": 512, "num_tokens": 512, "num_kv_heads": 128,
                    "head_dim": 128})


def _hello() -> bytes:
    session = "0123456789abcdef0123456789abcdef"
    return encode_frame(Frame(Kind.HELLO, payload=bytes(NONCE_BYTES)
                              + Compat(session=session).to_json()))


def _close_all(peers) -> None:
    for peer in peers:
        with contextlib.suppress(OSError):
            peer.close()


# -- the attacks ------------------------------------------------------------------------------
def test_headers_announcing_the_largest_payload_hold_only_what_arrived(receiver):
    """All established slots but one (a full house refuses new connections outright) send a
    header announcing max_payload_bytes (8 MiB) and no payload; every handshake slot the
    header of a HELLO."""
    frame = header_claiming(_data_frame(), LIMITS.max_payload_bytes)
    hello = _hello()
    peers = [RawPeer(receiver.port) for _ in range(CONFIG["max_connections"] - 1)]
    socks = [socket.create_connection(("127.0.0.1", receiver.port), timeout=10)
             for _ in range(CONFIG["max_handshakes"])]
    try:
        with _measured(receiver, "headers announcing 8 MiB (15 connections)",
                       N_SLOTS * conn_bound(HEADER_SIZE) + SLACK) as sent:
            for peer in peers:
                peer.send_raw(frame)
            for sock in socks:
                sock.sendall(hello[:HEADER_SIZE])
            sent[0] = len(frame) * len(peers) + HEADER_SIZE * len(socks)
            _until(lambda: receiver.stats()["buffered"]
                   >= len(peers) * FIRST_CHUNK + len(socks) * (len(hello) - HEADER_SIZE))
    finally:
        _close_all(peers)
        for sock in socks:
            sock.close()
    receiver.serves_an_honest_sender()


def test_frames_left_half_sent_hold_about_twice_what_arrived(receiver):
    """Every established slot announces 8 MiB and sends 1 MiB of it, then stops (before the
    fix each would have held the 8 MiB announced: 64 MiB, over the bound)."""
    arrived = 1 * MiB
    frame = header_claiming(_data_frame(), LIMITS.max_payload_bytes)
    peers = [RawPeer(receiver.port) for _ in range(CONFIG["max_connections"])]
    try:
        with _measured(receiver, "8 MiB frames, 1 MiB of each sent (8 connections)",
                       len(peers) * conn_bound(arrived) + SLACK) as sent:
            for peer in peers:
                peer.send_raw(frame + bytes(arrived))
            sent[0] = (len(frame) + arrived) * len(peers)
            _until(lambda: receiver.stats()["buffered"] >= len(peers) * arrived)
    finally:
        _close_all(peers)
    receiver.serves_an_honest_sender()


def test_hundreds_of_connections_cost_only_their_slots(receiver):
    """300 connections opened at once, each a few bytes into its HELLO, beside 7 that
    finished the handshake and then stay silent: the receiver holds at most max_handshakes
    of the 300 at a time, evicting the oldest."""
    hello = _hello()
    established = [RawPeer(receiver.port) for _ in range(CONFIG["max_connections"] - 1)]
    socks = []
    try:
        with _measured(receiver, "300 connections in the handshake + 7 idle",
                       N_SLOTS * conn_bound(HEADER_SIZE) + SLACK) as sent:
            for _ in range(300):
                with contextlib.suppress(OSError):
                    sock = socket.create_connection(("127.0.0.1", receiver.port), timeout=10)
                    socks.append(sock)
                    sock.sendall(hello[:20])
            sent[0] = 20 * len(socks)
            time.sleep(0.5)
            assert receiver.stats()["connections"] <= N_SLOTS
    finally:
        _close_all(established)
        for sock in socks:
            sock.close()
    _until(lambda: receiver.stats()["connections"] == 0, timeout_s=10)
    receiver.serves_an_honest_sender()


def test_thousands_of_refused_requests_cost_only_the_request_table(receiver):
    """One peer sends 1,500 frames past a limit (head_dim) and 1,500 one-frame requests that
    never complete (max_requests=32 are admitted, the rest refused); the admitted ones fail
    at their deadline and free their slots, and a transfer is served after."""
    codec = small_codec("int8")
    good = frames_of(1, codec, make_layers(1, 64))[0]
    peer = RawPeer(receiver.port)
    replies = []

    def read_replies():
        with contextlib.suppress(Exception):
            while len(replies) < 3000:
                replies.append(peer.read().kind)

    reader = threading.Thread(target=read_replies, daemon=True)
    reader.start()
    kv_per_request = 2 * 2 * 128 * 16 * 2  # K and V of the 128 tokens each request claims
    bound = (CONFIG["max_requests"] + CONFIG["max_finished_requests"]) * kv_per_request + SLACK
    try:
        with _measured(receiver, "3,000 refused or abandoned requests", bound) as sent:
            for i in range(1500):
                bad = with_fields(good, request_id=10_000 + i, head_dim=2000)
                one = with_fields(good, request_id=20_000 + i, num_tokens=128)  # half of it
                peer.send_raw(bad + one)
                sent[0] += len(bad) + len(one)
            reader.join(30)
        assert len(replies) == 3000
        acked = replies.count(Kind.ACK)  # 32, more if some were abandoned while sending
        assert CONFIG["max_requests"] <= acked < 1500  # the slots filled: some refused
        assert replies.count(Kind.ERROR) == 3000 - acked
    finally:
        peer.close()
    _until(lambda: receiver.stats()["active"] == 0, timeout_s=10)  # abandoned: freed
    receiver.serves_an_honest_sender()


def test_tiny_frames_claiming_huge_pages_allocate_nothing_large(receiver):
    """16 frames of a 64-token page's payload (4 each of int8, kivi4 and quantspec, decoded
    by TensorCodec.decode_page or its serde, and lynx), each claiming 16 heads x 8192 tokens
    x 128 (64 MiB of bf16 KV; the zero template the decoder once built for such a claim cost
    ~10x that): refused or failed at decode, before anything of the claimed size exists."""
    import lynx_npu

    frames = []
    for name in ("int8", "kivi4", "quantspec", "lynx"):
        codec = lynx_npu.get_codec(name, page_size=8192)  # the claimed page fits the codec
        good = frames_of(1, codec, make_layers(1, 64))[0]
        for _ in range(4):
            frames.append(with_fields(good, request_id=30_000 + len(frames), token_end=8192,
                                      num_tokens=8192, num_kv_heads=16, head_dim=128))
    peer = RawPeer(receiver.port)
    try:
        with _measured(receiver, "16 tiny frames claiming 64 MiB pages", SLACK) as sent:
            for raw in frames:
                sent[0] += len(raw)
                peer.send_raw(raw)
                assert peer.read().kind in (Kind.ACK, Kind.ERROR)
            _until(lambda: receiver.stats()["active"] == 0, timeout_s=10)  # all failed
    finally:
        peer.close()
    receiver.serves_an_honest_sender()


if __name__ == "__main__" and sys.argv[1:] == ["serve"]:
    serve()
