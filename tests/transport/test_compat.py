"""Peers check compatibility when they meet (real sockets on loopback): a receiver refuses a
sender of another payload format or with parameters it does not accept, and the sender raises
IncompatiblePeerError at once, naming both sides' values; a matching pair transfers."""
import socket
import threading
import time

import pytest

import lynx_npu
from lynx_npu.codec import PAYLOAD_FORMAT
from lynx_npu.transport import (AuthenticationError, IncompatiblePeerError, Receiver,
                                ReceiverConfig, Sender, SenderConfig)
from lynx_npu.transport.connection import (FrameSocket, _tag, _transcript, client_handshake,
                                           server_handshake)
from lynx_npu.wire import DEFAULT_LIMITS, NONCE_BYTES, Compat, Frame, Kind

from .helpers import assert_kv_equal, expected_kv, make_layers, small_codec

SECRET = b"0123456789abcdef-shared"
WAIT = 30  # a bound, never reached when the code works
SLOW = dict(deadline_s=60, connect_timeout_s=10)  # a refusal must not wait for either


@pytest.mark.parametrize("secret", [None, SECRET])
def test_a_matching_pair_transfers_as_before(secret):
    codec, other = small_codec("lynx"), small_codec("int8")
    layers = make_layers(2, 150)
    with Receiver(ReceiverConfig(codecs=(small_codec("lynx"), other), secret=secret)) as r, \
            Sender(SenderConfig(port=r.port, codecs=(codec,), secret=secret)) as s:
        sent = s.send(1, codec, layers)
        handle = r.request(1)
        assert handle.wait(WAIT) and sent.wait(WAIT)
        assert_kv_equal(handle, expected_kv(codec, layers))


@pytest.mark.parametrize("secret", [None, SECRET])
def test_a_parameter_mismatch_is_refused_at_connect(secret):
    with Receiver(ReceiverConfig(codecs=(lynx_npu.get_codec("lynx"),), secret=secret)) as r:
        start = time.monotonic()
        with pytest.raises(IncompatiblePeerError) as info:
            Sender(SenderConfig(port=r.port, secret=secret, **SLOW, codecs=(
                lynx_npu.get_codec("lynx", alpha_k=3.0, num_sink_tokens=0),)))
        assert time.monotonic() - start < 5
    assert str(info.value) == (
        "the receiver refused this sender: codec 'lynx' parameters differ from the receiver's:"
        " alpha_k: sender 3.0, receiver 0.25; num_sink_tokens: sender 0, receiver 4")


@pytest.mark.parametrize("sender_format", [1, 8, 10])
def test_a_payload_format_mismatch_is_refused_naming_both_versions(sender_format):
    """A peer of another payload format (emulated: its HELLO announces it) is refused; the
    receiver serves a matching sender right after."""
    with Receiver(ReceiverConfig()) as r:
        conn = FrameSocket(socket.create_connection(("127.0.0.1", r.port), timeout=10),
                           DEFAULT_LIMITS)
        with pytest.raises(IncompatiblePeerError,
                           match=f"the receiver refused this sender: payload format differs: "
                                 f"the sender's is {sender_format}, the receiver's "
                                 f"{PAYLOAD_FORMAT}"):
            client_handshake(conn, None, Compat(sender_format))
        assert conn.sock.recv(1) == b""  # and the receiver closed the connection
        conn.close()
        with Sender(SenderConfig(port=r.port)) as s:
            assert s.send(1, small_codec("int8"), make_layers(1, 20)).wait(WAIT)


def test_a_receiver_that_declares_codecs_refuses_a_sender_that_declares_none():
    with Receiver(ReceiverConfig(codecs=(small_codec("lynx"),))) as r:
        with pytest.raises(IncompatiblePeerError, match="the sender declares no codecs; the "
                                                        "receiver accepts only: lynx"):
            Sender(SenderConfig(port=r.port, **SLOW))


def test_a_sender_sends_only_the_codecs_it_declared():
    with Receiver(ReceiverConfig()) as r, \
            Sender(SenderConfig(port=r.port, codecs=(small_codec("lynx"),))) as s:
        with pytest.raises(ValueError, match="codec int8 .* was not declared in the handshake"):
            s.send(1, small_codec("int8"), make_layers(1, 20))
        assert s.send(2, small_codec("lynx"), make_layers(1, 20)).wait(WAIT)


def test_a_refusal_on_reconnect_fails_the_requests_at_once():
    """The receiver is replaced by one that does not accept this sender: the reconnect is
    refused and the request fails with that reason, long before its deadline."""
    codec = small_codec("lynx")
    first = Receiver(ReceiverConfig())
    port = first.port
    with Sender(SenderConfig(port=port, codecs=(codec,), reconnect_backoff_s=0.01, **SLOW)) as s:
        first.close()
        with Receiver(ReceiverConfig(port=port, codecs=(small_codec("int8"),))):
            start = time.monotonic()
            sent = s.send(1, codec, make_layers(1, 20))
            with pytest.raises(IncompatiblePeerError, match="codec 'lynx' is not accepted"):
                sent.wait(WAIT)
            assert time.monotonic() - start < 5


def test_the_descriptions_are_covered_by_the_hmac():
    """With a secret, a description altered in flight fails authentication on either side."""
    receiver_says, sender_says = Compat.of([small_codec("lynx")]), Compat()
    # Towards the receiver: the tag was computed over another description than the HELLO's.
    with Receiver(ReceiverConfig(secret=SECRET)) as r:
        conn = FrameSocket(socket.create_connection(("127.0.0.1", r.port), timeout=10),
                           DEFAULT_LIMITS)
        mine = bytes(NONCE_BYTES)
        conn.send(Frame(Kind.HELLO, payload=mine + sender_says.to_json()))
        hello = bytes(conn.read().payload)
        theirs, their_description = hello[:NONCE_BYTES], hello[NONCE_BYTES:]
        forged = _transcript(receiver_says.to_json(), their_description)
        conn.send(Frame(Kind.AUTH, payload=_tag(SECRET, b"sender", theirs, mine, forged)))
        reply = conn.read()
        conn.close()
    assert (reply.kind, reply.ref_kind) == (Kind.ERROR, Kind.AUTH)
    assert b"authentication failed" in bytes(reply.payload)
    # Towards the sender: a receiver that knows the secret but signs another description.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def fake_receiver():
            sock, _ = listener.accept()
            peer = FrameSocket(sock, DEFAULT_LIMITS)
            hello = bytes(peer.read().payload)
            nonce = bytes(range(NONCE_BYTES))
            peer.send(Frame(Kind.HELLO, payload=nonce + receiver_says.to_json()))
            peer.read()  # AUTH
            forged = _transcript(hello[NONCE_BYTES:], Compat().to_json())
            peer.send(Frame(Kind.AUTH_OK, payload=_tag(SECRET, b"receiver", hello[:NONCE_BYTES],
                                                       nonce, forged)))
            peer.close()

        thread = threading.Thread(target=fake_receiver, daemon=True)
        thread.start()
        conn = FrameSocket(socket.create_connection(listener.getsockname(), timeout=10),
                           DEFAULT_LIMITS)
        with pytest.raises(AuthenticationError, match="did not prove"):
            client_handshake(conn, SECRET, sender_says)
        conn.close()
        thread.join(WAIT)


def test_server_handshake_raises_what_it_refused():
    """The receiver's side of a refusal: it sends ERROR(ref_kind=HELLO) and raises too."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        errors = []

        def serve():
            sock, _ = listener.accept()
            conn = FrameSocket(sock, DEFAULT_LIMITS)
            try:
                server_handshake(conn, None, Compat.of([small_codec("int8")]))
            except IncompatiblePeerError as e:
                errors.append(e)
            conn.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        conn = FrameSocket(socket.create_connection(listener.getsockname(), timeout=10),
                           DEFAULT_LIMITS)
        with pytest.raises(IncompatiblePeerError):
            client_handshake(conn, None, Compat.of([small_codec("int4")]))
        conn.close()
        thread.join(WAIT)
    assert [str(e) for e in errors] == [
        "codec 'int4' is not accepted; the receiver accepts only: int8"]
