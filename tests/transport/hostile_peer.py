"""A hostile (or broken) peer: a raw socket client that speaks the wire format itself, so a test
can send what no Sender would (issue 18: headers that announce payloads never sent, frames
past the receiver's limits, junk under another sender's request id)."""
from __future__ import annotations

import socket
import struct

from lynx_npu.codec import wire_params
from lynx_npu.transport.connection import FrameSocket, client_handshake
from lynx_npu.wire import (DEFAULT_LIMITS, DTYPE_CODES, HEADER_SIZE, Compat, Frame, Kind,
                           crc32c, encode_frame, pack_header, params_to_json)


class RawPeer:
    """One connection to a receiver; ``handshake=False`` leaves the socket fresh."""

    def __init__(self, port: int, handshake: bool = True, secret: bytes | None = None,
                 timeout_s: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.conn = FrameSocket(self.sock, DEFAULT_LIMITS)
        self.receiver = client_handshake(self.conn, secret, Compat()) if handshake else None

    def send(self, frame: Frame) -> None:
        self.conn.send(frame)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> Frame:
        return self.conn.read()

    def exchange(self, frame: Frame) -> Frame:
        """Send one frame, return the receiver's reply to it (ACK or ERROR)."""
        self.send(frame)
        return self.read()

    def close(self) -> None:
        self.conn.close()


def frames_of(rid: int, codec, layers) -> list[Frame]:
    """The data frames a Sender makes of ``layers`` (every page's anchor, then its residual)."""
    params = params_to_json(wire_params(codec))
    out = []
    for index, (k, v) in enumerate(layers):
        heads, tokens, dim = k.shape
        for p in codec.encode_pages(k, v):
            for kind, data in ((Kind.ANCHOR, p.anchor), (Kind.RESIDUAL, p.residual)):
                if data is None:
                    continue
                out.append(Frame(kind, rid, index, len(layers), p.index, p.token_start,
                                 p.token_end, tokens, codec.codec_id, DTYPE_CODES[k.dtype], 0,
                                 heads, dim, params, data.numpy().tobytes()))
    return out


def header_claiming(frame: Frame, payload_len: int) -> bytes:
    """``frame``'s header and parameters, announcing ``payload_len`` payload bytes (header CRC
    re-sealed, so the receiver trusts it), without the payload."""
    raw = bytearray(pack_header(frame))
    struct.pack_into("<I", raw, 46, payload_len)
    raw[54:58] = crc32c(bytes(raw[HEADER_SIZE:]), crc32c(bytes(raw[:54]))).to_bytes(4, "little")
    return bytes(raw)


def with_fields(frame: Frame, **fields) -> bytes:
    """``frame`` encoded with header fields replaced (CRC sealed over the new values)."""
    return encode_frame(Frame(**{**frame.__dict__, **fields}))
