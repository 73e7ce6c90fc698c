"""Fuzz the handshake over real sockets on loopback (issue 18): whatever bytes a peer sends a
real Receiver - arbitrary bytes, a valid HELLO mutated, cut or followed by junk, a HELLO whose
description is mutated behind a valid CRC, junk after a complete handshake - the receiver
answers only well-formed frames, closes the connection by its deadline, never lets an
exception escape a thread, and keeps serving an honest Sender. Whatever a peer posing as the
receiver answers, Sender() returns or raises HandshakeError, by its connect timeout."""
from __future__ import annotations

import contextlib
import itertools
import json
import pathlib
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lynx_npu
from lynx_npu.transport import (HandshakeError, Receiver, ReceiverConfig, Sender,
                                SenderConfig)
from lynx_npu.wire import (HEADER_SIZE, NONCE_BYTES, BufferReader, Compat, Frame, Kind,
                           WireError, decode_frame, encode_frame, read_frame)

from .helpers import assert_kv_equal, expected_kv, make_layers, small_codec
from .hostile_peer import RawPeer

HANDSHAKE_S, IDLE_S = 1.0, 2.0
CLOSE_SLACK_S = 1.5   # scheduling on a loaded 2-core machine, and the watchdog's tick
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "wire" / "golden"
DATA_FRAMES = [(GOLDEN / f"{n}.bin").read_bytes()
               for n in ("anchor_lynx", "residual_lynx", "anchor_int8_fp16")]
SESSION = "0123456789abcdef0123456789abcdef"
SECRET = b"fuzz-0123456789abcdef"
SENDER_DESCRIPTION = Compat.of((lynx_npu.get_codec("lynx"),), session=SESSION).to_json()
_rids = itertools.count(1)


def _hello(description: bytes = SENDER_DESCRIPTION, nonce: bytes = bytes(NONCE_BYTES)) -> bytes:
    return encode_frame(Frame(Kind.HELLO, payload=nonce + description))


AUTH = encode_frame(Frame(Kind.AUTH, payload=b""))  # no secret: the tag is empty
VALID = _hello() + AUTH


class _Escaped:
    """Exceptions that escape any thread while installed (threading.excepthook)."""

    def __init__(self):
        self.errors: list[str] = []
        self._previous = None

    def __enter__(self):
        self._previous = threading.excepthook
        threading.excepthook = lambda args: self.errors.append(
            f"{args.thread.name}: {args.exc_type.__name__}: {args.exc_value}")
        return self

    def __exit__(self, *exc):
        threading.excepthook = self._previous


@pytest.fixture(scope="module")
def receiver():
    cfg = ReceiverConfig(handshake_timeout_s=HANDSHAKE_S, idle_timeout_s=IDLE_S, deadline_s=2.0)
    with _Escaped() as escaped, Receiver(cfg) as r:
        r.escaped = escaped
        yield r
    assert not escaped.errors, escaped.errors


def _replies(data: bytes) -> list[Frame]:
    """The receiver's byte stream -> its frames; every one must be well-formed."""
    frames, reader = [], BufferReader(data)
    while reader.pos < len(data):
        frames.append(read_frame(reader))
    return frames


def _probe(r: Receiver, data: bytes, half_close: bool = True, handshake: bool = False,
           bound_s: float | None = None) -> list[Frame]:
    """Send ``data`` (after a full handshake if ``handshake``), then half-close (or just wait)
    and read until the receiver closes; it must close within ``bound_s``."""
    bound_s = bound_s or (HANDSHAKE_S if half_close else max(HANDSHAKE_S, IDLE_S)) + CLOSE_SLACK_S
    peer = RawPeer(r.port, handshake=handshake, timeout_s=5.0)
    sock, got, closed, start = peer.sock, bytearray(), False, time.monotonic()
    try:
        with contextlib.suppress(OSError):  # it may close before taking every byte
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        while (left := bound_s - (time.monotonic() - start)) > 0:
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                break
            except OSError:  # reset: closed with our bytes unread
                chunk = b""
            if not chunk:
                closed = True
                break
            got += chunk
    finally:
        sock.close()
    assert closed, f"still open after {bound_s} s"
    _until(lambda: r.num_connections == 0)
    assert not r.escaped.errors, r.escaped.errors
    return _replies(bytes(got))


def _until(condition, timeout_s: float = 10.0) -> None:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "condition not reached"
        time.sleep(0.005)


def _serves(r: Receiver) -> None:
    """An honest sender still transfers bit-identical KV through ``r``."""
    rid, codec, layers = next(_rids), small_codec("lynx"), make_layers(2, 130, seed=3)
    with Sender(SenderConfig(port=r.port, deadline_s=20)) as s:
        assert s.send(rid, codec, layers).wait(20)
    handle = r.request(rid)
    assert handle.wait(20)
    assert_kv_equal(handle, expected_kv(codec, layers))
    r.release(rid)


def _mutate(raw: bytes, flips, cut: int) -> bytes:
    b = bytearray(raw)
    for pos, val in flips:
        b[pos % len(b)] = val
    return bytes(b[:len(b) - cut % (len(b) + 1)])


FLIPS = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4)
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                    | st.floats(allow_nan=True) | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


def _descriptions():
    """Compatibility descriptions near a valid one: a key's value replaced by any JSON, a key
    dropped or added, a codec parameter changed, or raw bytes."""
    valid = json.loads(SENDER_DESCRIPTION)
    keys = st.sampled_from(sorted(valid) + ["limits", "extra"])
    replaced = st.builds(lambda k, v: {**valid, k: v}, keys, JSON)
    dropped = st.builds(lambda k: {key: v for key, v in valid.items() if key != k}, keys)
    params = valid["codecs"][0][1]
    param = st.builds(lambda k, v: {**valid, "codecs": [["lynx", {**params, k: v}]]},
                      st.sampled_from(sorted(params) + ["bogus"]), JSON)
    name = st.builds(lambda n: {**valid, "codecs": [[n, params]]}, st.text(max_size=12))
    as_bytes = st.one_of(replaced, dropped, param, name).map(
        lambda obj: json.dumps(obj, sort_keys=True, separators=(",", ":")).encode())
    return st.one_of(as_bytes, st.binary(max_size=200))


# -- the receiver ---------------------------------------------------------------------------
@FUZZ
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_are_closed_on(receiver, data):
    _probe(receiver, data)


@FUZZ
@given(flips=FLIPS, cut=st.integers(0, 400), junk=st.binary(max_size=80))
def test_mutated_hello_and_junk_after_it_are_closed_on(receiver, flips, cut, junk):
    for frame in _probe(receiver, _mutate(VALID, flips, cut) + junk):
        assert frame.kind in (Kind.HELLO, Kind.AUTH_OK, Kind.ERROR), frame.kind


@FUZZ
@given(description=_descriptions(), nonce_len=st.sampled_from([0, 5, NONCE_BYTES]))
def test_mutated_description_behind_a_valid_crc_is_refused_or_served(receiver, description,
                                                                      nonce_len):
    """The HELLO reaches Compat.from_json and the compatibility check: the answer is the
    receiver's HELLO then AUTH_OK (a description it accepts) or an ERROR naming why; a HELLO
    the frame decoder itself refuses (shorter than its nonce, say) is closed on at once."""
    hello = _hello(description, bytes(nonce_len))
    try:
        decode_frame(hello)
        answers = ([Kind.HELLO, Kind.AUTH_OK], [Kind.HELLO, Kind.ERROR], [Kind.ERROR])
    except WireError:
        answers = ([],)
    kinds = [f.kind for f in _probe(receiver, hello + AUTH)]
    assert kinds in answers, kinds


@FUZZ
@given(raw=st.sampled_from(DATA_FRAMES), flips=FLIPS, cut=st.integers(0, 400),
       junk=st.binary(max_size=80))
def test_junk_after_a_complete_handshake_is_closed_on(receiver, raw, flips, cut, junk):
    for frame in _probe(receiver, _mutate(raw, flips, cut) + junk, handshake=True):
        assert frame.kind in (Kind.ACK, Kind.NACK, Kind.ERROR), frame.kind


@pytest.fixture(scope="module")
def secret_receiver():
    cfg = ReceiverConfig(handshake_timeout_s=HANDSHAKE_S, idle_timeout_s=IDLE_S,
                         secret=SECRET)
    with _Escaped() as escaped, Receiver(cfg) as r:
        r.escaped = escaped
        yield r
    assert not escaped.errors, escaped.errors


@FUZZ
@given(description=_descriptions(), tag=st.one_of(st.just(b""), st.binary(min_size=32,
                                                                             max_size=32)),
       flips=FLIPS)
def test_without_the_secret_no_hello_is_ever_accepted(secret_receiver, description, tag,
                                                       flips):
    """A receiver with a secret: whatever HELLO (valid, mutated, resealed) and whatever tag
    a peer without the secret sends, it never gets AUTH_OK, and is closed."""
    stream = _hello(description) + encode_frame(Frame(Kind.AUTH, payload=tag))
    kinds = [f.kind for f in _probe(secret_receiver, _mutate(stream, flips, 0))]
    assert Kind.AUTH_OK not in kinds, kinds


def test_a_sender_with_the_secret_still_gets_in(secret_receiver):
    with Sender(SenderConfig(port=secret_receiver.port, secret=SECRET)) as s:
        assert s.receiver_limits is not None  # the handshake completed


def test_hostile_handshakes_that_never_end_are_closed_by_their_deadline(receiver):
    """16 connections at once, none half-closed: cut HELLOs, a HELLO and nothing more, bytes
    of no frame. Each is closed by handshake_timeout_s (idle_timeout_s if its bytes happen to
    complete a handshake), then an honest sender is served."""
    prefixes = [VALID[:n] for n in (1, 30, HEADER_SIZE, HEADER_SIZE + 10, len(_hello()))]
    prefixes += [_mutate(VALID, [(i * 37, i)], 3 * i) for i in range(6)]
    prefixes += [bytes([i]) * (i * 13) for i in range(1, 6)]
    results: list = [None] * len(prefixes)

    def run(i):
        try:
            results[i] = _probe(receiver, prefixes[i], half_close=False)
        except BaseException as e:  # noqa: BLE001 - reported below
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prefixes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(isinstance(x, list) for x in results), results
    _serves(receiver)


def test_the_receiver_still_serves_an_honest_sender(receiver):
    """Run after the fuzzing above (the module's receiver has taken every example)."""
    _serves(receiver)
    assert not receiver.escaped.errors


# -- a peer posing as the receiver ----------------------------------------------------------
RECEIVER_STREAM = (encode_frame(Frame(Kind.HELLO, payload=bytes(NONCE_BYTES)
                                      + ReceiverConfig().compat.to_json()))
                   + encode_frame(Frame(Kind.AUTH_OK, payload=b"")))


class _FakeReceiver:
    """Answers every connection with ``stream`` (whatever the sender says), half-closes, and
    drains what the sender sends until it closes."""

    def __init__(self):
        self.stream = b""
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(sock, self.stream), daemon=True).start()

    @staticmethod
    def _answer(sock: socket.socket, stream: bytes):
        sock.settimeout(5)
        with contextlib.suppress(OSError), sock:
            sock.sendall(stream)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self._listener.close()


@pytest.fixture(scope="module")
def fake():
    f = _FakeReceiver()
    yield f
    f.close()


def _connect(fake: _FakeReceiver, stream: bytes) -> None:
    """Sender() against ``stream``: it returns or raises HandshakeError, by its timeout."""
    fake.stream = stream
    start = time.monotonic()
    try:
        sender = Sender(SenderConfig(port=fake.port, handshake_attempts=1,
                                     connect_timeout_s=1.0, reconnect_backoff_s=0.05))
    except HandshakeError as e:
        assert str(e)
    else:
        sender.close()
    assert time.monotonic() - start < 1.0 + CLOSE_SLACK_S


def test_the_fake_receiver_is_a_valid_one(fake):
    """The unmutated stream is a complete handshake (so the mutations below are near it)."""
    fake.stream = RECEIVER_STREAM
    Sender(SenderConfig(port=fake.port, handshake_attempts=1)).close()


@FUZZ
@given(flips=FLIPS, cut=st.integers(0, 400), junk=st.binary(max_size=40))
def test_a_mutated_receiver_hello_raises_handshake_error(fake, flips, cut, junk):
    with _Escaped() as escaped:
        _connect(fake, _mutate(RECEIVER_STREAM, flips, cut) + junk)
    assert not escaped.errors, escaped.errors


@FUZZ
@given(description=_descriptions(), kind=st.sampled_from(list(Kind)),
       tail=st.sampled_from([b"", encode_frame(Frame(Kind.AUTH_OK, payload=b"")),
                             encode_frame(Frame(Kind.ERROR, ref_kind=Kind.HELLO,
                                                payload=b"refused"))]))
def test_a_resealed_receiver_hello_raises_handshake_error(fake, description, kind, tail):
    """Frames with valid CRCs: a HELLO (or a frame of any other kind) carrying a mutated
    description, then AUTH_OK, an ERROR, or nothing."""
    try:
        first = encode_frame(Frame(kind, payload=bytes(NONCE_BYTES) + description))
    except (WireError, ValueError):
        return  # not a frame the encoder makes (e.g. an ERROR text that is not UTF-8)
    with _Escaped() as escaped:
        _connect(fake, first + tail)
    assert not escaped.errors, escaped.errors


# -- who can connect at all ---------------------------------------------------------------
def _outward_address() -> str | None:
    """This host's address toward other hosts (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only a route lookup
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_the_receiver_listens_on_loopback_only_by_default():
    """ReceiverConfig() (and the connector's default host) bind 127.0.0.1: the port is not
    reachable through this host's other addresses."""
    from integration.vllm_ascend.config import LynxConnectorConfig

    assert ReceiverConfig().host == "127.0.0.1"
    assert LynxConnectorConfig.from_vllm("kv_consumer", {"port": 17100}).host == "127.0.0.1"
    with Receiver(ReceiverConfig()) as r:
        assert r.host == "127.0.0.1"
        outward = _outward_address()
        if outward is not None:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((outward, r.port), timeout=5).close()
        _serves(r)
