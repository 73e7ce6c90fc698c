"""A fault-injecting TCP proxy on loopback, between a Sender and a Receiver.

It cuts the sender->receiver byte stream at frame boundaries (reading the frame header's length
fields) and applies, per data frame, an action chosen by ``plan(conn_no, frame_no, kind)``:

    pass             forward the frame
    delay            sleep DELAY_S, then forward
    reorder          hold the frame and forward it after the next one
    drop_frame       swallow the frame silently (the sender's retransmit timer recovers it)
    duplicate        forward the frame twice (the receiver acknowledges both, applies it once)
    corrupt_payload  flip one payload bit (the receiver NACKs, the sender resends)
    corrupt_header   flip one header/params bit (the receiver drops the connection)
    truncate         forward half the frame, then cut both directions
    drop_conn        cut both directions before the frame

``by_frame(conn_no, key)`` instead chooses by the frame's key, (request, kind, layer, page), so
a test can fault chosen frames of chosen requests, e.g. each first transmission only.
Receiver->sender bytes (ACK/NACK/ERROR) are forwarded as they come. Every socket has a
timeout and every thread ends when either side closes, so a test cannot hang on the proxy.
"""
from __future__ import annotations

import random
import socket
import struct
import threading
import time
from typing import Callable

from lynx_npu.wire import HEADER_SIZE, Kind

DELAY_S = 0.05
ACTIONS = ("delay", "reorder", "drop_frame", "corrupt_payload", "corrupt_header", "truncate",
           "drop_conn")
ALL_ACTIONS = ACTIONS + ("duplicate",)  # ACTIONS is what test_mooncake.py parametrizes over
_LENGTHS = struct.Struct("<HI")  # params_len, payload_len at offset 44
_KEY = struct.Struct("<QHHI")    # request_id, layer, num_layers, page at offset 8

Plan = Callable[[int, int, int], str]
Key = tuple[int, int, int, int]  # (request_id, kind, layer, page)
ByFrame = Callable[[int, Key], str]


def random_plan(seed: int, p: float = 0.15, max_cuts: int = 3) -> Plan:
    """Faults on a fraction ``p`` of data frames; at most ``max_cuts`` connection cuts."""
    rng = random.Random(seed)
    cuts = [0]

    def plan(conn_no: int, frame_no: int, kind: int) -> str:
        if rng.random() >= p:
            return "pass"
        action = rng.choice(ACTIONS)
        if action in ("truncate", "drop_conn", "corrupt_header"):
            if cuts[0] >= max_cuts:
                return "delay"
            cuts[0] += 1
        return action

    return plan


class FaultProxy:
    def __init__(self, target_port: int, plan: Plan | None = None, *,
                 by_frame: ByFrame | None = None):
        if (plan is None) == (by_frame is None):
            raise ValueError("give plan or by_frame")
        self.target_port = target_port
        self.plan = plan
        self.by_frame = by_frame
        self.log: list[tuple[int, int, int, int, str]] = []  # (conn, frame, kind, rid, action)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._socks: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._conn_no = 0
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def actions(self) -> list[str]:
        with self._lock:
            return [a for *_, a in self.log if a != "pass"]

    def faulted(self) -> list[tuple[int, str]]:
        """(request id, action) of every fault injected, in order."""
        with self._lock:
            return [(rid, a) for *_, rid, a in self.log if a != "pass"]

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            _close(s)
        self._thread.join(timeout=5)

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                _close(client)
                continue
            for s in (client, server):
                s.settimeout(30)  # generous; the test's own deadlines are far shorter
            with self._lock:
                self._socks += [client, server]
                conn_no = self._conn_no
                self._conn_no += 1
            threading.Thread(target=self._pump_frames, args=(conn_no, client, server),
                             daemon=True).start()
            threading.Thread(target=self._pump_bytes, args=(server, client),
                             daemon=True).start()

    def _pump_bytes(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        _close(src)
        _close(dst)

    def _pump_frames(self, conn_no: int, src: socket.socket, dst: socket.socket) -> None:
        held: bytes | None = None
        frame_no = 0
        try:
            while True:
                header = _recv_exact(src, HEADER_SIZE)
                if header is None:
                    break
                params_len, payload_len = _LENGTHS.unpack_from(header, 44)
                rest = _recv_exact(src, params_len + payload_len)
                if rest is None:
                    break
                frame = bytearray(header + rest)
                kind = header[5]
                if kind not in (Kind.ANCHOR, Kind.RESIDUAL):
                    dst.sendall(frame)  # handshake frames pass untouched
                    continue
                rid, layer, _, page = _KEY.unpack_from(header, 8)
                if self.by_frame is not None:
                    action = self.by_frame(conn_no, (rid, kind, layer, page))
                else:
                    action = self.plan(conn_no, frame_no, kind)
                with self._lock:
                    self.log.append((conn_no, frame_no, kind, rid, action))
                frame_no += 1
                if action == "drop_conn":
                    break
                if action == "truncate":
                    dst.sendall(frame[:len(frame) // 2])
                    break
                if action == "drop_frame":
                    continue
                if action == "corrupt_payload":
                    frame[HEADER_SIZE + params_len + (frame_no * 7) % payload_len] ^= 0x04
                elif action == "corrupt_header":
                    frame[8 + (frame_no * 5) % (HEADER_SIZE - 8 + params_len)] ^= 0x01
                elif action == "duplicate":
                    dst.sendall(frame)
                elif action == "delay":
                    time.sleep(DELAY_S)
                elif action == "reorder" and held is None:
                    held = bytes(frame)
                    continue
                dst.sendall(frame)
                if held is not None:
                    dst.sendall(held)
                    held = None
        except OSError:
            pass
        _close(src)
        _close(dst)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        data = sock.recv(n - len(buf))
        if not data:
            return None
        buf += data
    return bytes(buf)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
