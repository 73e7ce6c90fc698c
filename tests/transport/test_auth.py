"""Optional shared-secret authentication of the sender and the receiver."""
import socket

import pytest

from lynx_npu.transport import AuthenticationError, Receiver, ReceiverConfig, Sender, SenderConfig
from lynx_npu.transport.connection import FrameSocket
from lynx_npu.wire import DEFAULT_LIMITS, Compat, Frame, Kind

from .helpers import assert_kv_equal, expected_kv, make_layers, small_codec

SECRET = b"0123456789abcdef-shared"


def test_matching_secret_transfers():
    codec, layers = small_codec("int4"), make_layers(1, 100)
    with Receiver(ReceiverConfig(secret=SECRET)) as r, \
            Sender(SenderConfig(port=r.port, secret=SECRET)) as s:
        s.send(1, codec, layers)
        handle = r.request(1)
        assert handle.wait(30)
        assert_kv_equal(handle, expected_kv(codec, layers))


@pytest.mark.parametrize("receiver_secret,sender_secret,match", [
    (SECRET, b"another-secret-of-16", "wrong or missing"),
    (SECRET, None, "wrong or missing"),
    (None, SECRET, "no shared secret"),
])
def test_mismatched_secrets_are_refused_at_connect(receiver_secret, sender_secret, match):
    with Receiver(ReceiverConfig(secret=receiver_secret)) as r:
        with pytest.raises(AuthenticationError, match=match):
            Sender(SenderConfig(port=r.port, secret=sender_secret, connect_timeout_s=5))


def test_unauthenticated_peer_cannot_send_data():
    """A client that skips the handshake and sends a data frame is dropped, not served."""
    with Receiver(ReceiverConfig(secret=SECRET, handshake_timeout_s=2)) as r:
        sock = socket.create_connection(("127.0.0.1", r.port), timeout=10)
        conn = FrameSocket(sock, DEFAULT_LIMITS)
        conn.send(Frame(Kind.HELLO, payload=bytes(32) + Compat().to_json()))
        conn.read()  # the receiver's HELLO
        conn.send(Frame(Kind.AUTH, payload=bytes(32)))  # a guessed tag
        reply = conn.read()
        assert (reply.kind, reply.ref_kind) == (Kind.ERROR, Kind.AUTH)
        assert b"authentication failed" in bytes(reply.payload)
        assert sock.recv(1) == b""  # then closed
        conn.close()
    assert not r._requests.handles()


def test_secret_must_be_long_enough():
    with pytest.raises(ValueError, match="secret"):
        ReceiverConfig(secret=b"short")
