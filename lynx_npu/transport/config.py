"""Configuration of the split-stream transport (frozen, validated on construction)."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from ..wire import DEFAULT_LIMITS, CodecSpec, Compat, ReceiveLimits, WireLimits
from .priority import check_nice

LOOPBACK = "127.0.0.1"


def _positive(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r} must be a positive finite number")


def _check_secret(secret) -> None:
    if secret is not None and (not isinstance(secret, bytes) or len(secret) < 16):
        raise ValueError("secret must be bytes of length >= 16 (or None for no authentication)")


def _codec_specs(codecs) -> tuple[CodecSpec, ...]:
    """``codecs`` (codecs from get_codec, or CodecSpecs) -> CodecSpecs that fit a HELLO."""
    if not isinstance(codecs, (tuple, list)):
        raise ValueError(f"codecs={codecs!r} must be a tuple of codecs (lynx_npu.get_codec)")
    return Compat.of(codecs).codecs


@dataclass(frozen=True)
class SenderConfig:
    port: int                            # the receiver's port
    host: str = LOOPBACK                 # the receiver's address
    num_connections: int = 1             # parallel TCP connections sharing one rate limit
    gbps: float | None = None            # emulated link rate for all bytes sent; None = no limit
    burst_s: float = 0.025               # token-bucket depth in link time. While frames are
                                         # queued, a writer that was descheduled may catch up
                                         # by this much, as a NIC keeps draining its queue
                                         # while the CPU is elsewhere; an empty queue forfeits
                                         # it (TokenBucket.mark_idle)
    early_s: float = 0.0005              # a write may leave this much before its time:
                                         # one sleep per ~ms instead of one per chunk
    chunk_bytes: int = 256 << 10         # rate-limited writes are at most this large
    frame_bytes: int = 4 << 20           # a data frame carries consecutive pages of one layer
                                         # and stream up to this many bytes (always at least
                                         # one page): the receiver's work is per frame
    frame_s: float = 0.005               # paced (gbps set): a frame also carries at most this
                                         # much link time, since a new request's anchor can
                                         # overtake residual bytes only between frames (20 ms
                                         # frames: no TTFT gain in lynx demo, docs/demo.md)
    thread_nice: int = 10                # the writers' nice value at least this (Linux;
                                         # transport/priority.py): a host's model threads first
    deadline_s: float = 60.0             # a request not fully acknowledged by then fails
    # While requests wait, no connection to the receiver for this long (down, unreachable)
    # fails them all (and the next ones, while it lasts), instead of holding their KV in
    # memory to their deadlines; the receiver gives up on them after its own sender_grace_s.
    receiver_grace_s: float = 10.0
    retransmit_s: float = 5.0            # resend a frame unacknowledged for this long
    connect_timeout_s: float = 5.0       # TCP connect, and then the whole handshake
    handshake_attempts: int = 3          # Sender(): a handshake cut or corrupted in transit is
                                         # retried this often in all, then HandshakeError
    reconnect_backoff_s: float = 0.02    # first retry delay; doubles up to 1 s
    send_buffer_bytes: int | None = None  # SO_SNDBUF; on a real link set it near the
                                         # bandwidth-delay product, so residual bytes already
                                         # in the kernel cannot hold a new anchor back long
    secret: bytes | None = field(default=None, repr=False)  # shared-secret HMAC handshake
    # The codecs (lynx_npu.get_codec(...), every parameter counts) this sender will send,
    # announced in the handshake: a receiver that declares codecs refuses a sender whose
    # codecs it does not accept, and send() refuses a codec not declared here. () declares
    # none: any codec may be sent (and a receiver that declares codecs refuses the sender).
    codecs: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "codecs", _codec_specs(self.codecs))
        _check_secret(self.secret)
        if not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise ValueError(f"{self.port=} must be a TCP port in [1, 65535]")
        check_nice("thread_nice", self.thread_nice)
        if not isinstance(self.num_connections, int) or not 1 <= self.num_connections <= 64:
            raise ValueError(f"{self.num_connections=} must be an int in [1, 64]")
        if type(self.handshake_attempts) is not int or not 1 <= self.handshake_attempts <= 100:
            raise ValueError(f"{self.handshake_attempts=} must be an int in [1, 100]")
        _positive("gbps", self.gbps, allow_none=True)
        for name in ("deadline_s", "receiver_grace_s", "retransmit_s", "connect_timeout_s",
                     "reconnect_backoff_s", "burst_s", "early_s", "frame_s"):
            _positive(name, getattr(self, name))
        if self.send_buffer_bytes is not None and (
                not isinstance(self.send_buffer_bytes, int) or self.send_buffer_bytes < 4096):
            raise ValueError(f"{self.send_buffer_bytes=} must be an int >= 4096 or None")
        if not isinstance(self.chunk_bytes, int) or self.chunk_bytes < 1024:
            raise ValueError(f"{self.chunk_bytes=} must be an int >= 1024")
        if type(self.frame_bytes) is not int or self.frame_bytes < 1:
            raise ValueError(f"{self.frame_bytes=} must be a positive int (1: one page a frame)")

    @property
    def frame_limit(self) -> int:
        """Bytes of pages a frame may carry: ``frame_bytes``, and ``frame_s`` of a paced
        link's time (a frame still takes at least one page)."""
        if self.gbps is None:
            return self.frame_bytes
        return max(1, min(self.frame_bytes, int(self.gbps * 1e9 / 8 * self.frame_s)))

    @property
    def burst_bytes(self) -> int:
        """Bucket depth in bytes: ``burst_s`` of link time, and at least one write."""
        if self.gbps is None:
            return self.chunk_bytes
        return max(self.chunk_bytes, int(self.gbps * 1e9 / 8 * self.burst_s))

    @functools.cached_property
    def compat(self) -> Compat:
        """What this sender announces in its handshake (lynx_npu.wire.compat)."""
        return Compat.of(self.codecs)


@dataclass(frozen=True)
class ReceiverConfig:
    host: str = LOOPBACK                 # listen address: loopback unless configured
    port: int = 0                        # 0 = an ephemeral port (see Receiver.port)
    deadline_s: float = 60.0             # from a request's first frame (or Receiver.request)
    dequantize: bool = True              # False: verify and keep frames only (link benchmarks)
    # Decode residual pages only once the whole residual stream is in: while the decode
    # instance drafts on the anchor, dequantizing beside the model steals its CPU (and GIL).
    defer_residual: bool = False
    num_decode_threads: int = 1
    max_connections: int = 16            # connections past the handshake; more are refused
    max_handshakes: int = 16             # connections in the handshake; one more closes the
                                         # oldest, so slow handshakes cannot lock senders out
    max_requests: int = 256              # requests in progress that frames opened
    max_finished_requests: int = 256     # completed or failed ones kept for request() until
                                         # released; beyond it the oldest is forgotten
    max_request_bytes: int = 8 << 30     # destination KV of one request (all layers, K and V)
    handshake_timeout_s: float = 5.0     # the whole handshake, however slowly bytes come
    idle_timeout_s: float = 60.0         # a connection silent this long is closed (an idle
                                         # sender reconnects when it next has frames)
    sender_grace_s: float = 10.0         # a request whose sender has had no connection this
                                         # long fails (the sender died; a live one reconnects
                                         # within ~1 s), instead of at its deadline
    thread_nice: int = 10                # connection readers and page decoders run at least
                                         # this nice (Linux; transport/priority.py): the
                                         # decode instance's model threads first
    ack_delay_s: float = 0.02            # an ACK waits up to this long for the frames behind
                                         # it (or for a full batch): on a paced link every frame
                                         # arrives alone, and a send per frame made the decode
                                         # process's model thread wait for the GIL (lynx demo:
                                         # the first token ~10 ms later). 0: one send per frame
    limits: WireLimits = DEFAULT_LIMITS
    secret: bytes | None = field(default=None, repr=False)
    # The codecs (lynx_npu.get_codec(...), every parameter counts) this receiver accepts: a
    # sender must declare some, each with exactly one's parameters, or the handshake refuses
    # it. () accepts any codec of this payload format that it can build.
    codecs: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "codecs", _codec_specs(self.codecs))
        if not isinstance(self.port, int) or not 0 <= self.port < 65536:
            raise ValueError(f"{self.port=} must be a TCP port in [0, 65535]")
        check_nice("thread_nice", self.thread_nice)
        for name in ("deadline_s", "handshake_timeout_s", "idle_timeout_s", "sender_grace_s"):
            _positive(name, getattr(self, name))
        if not isinstance(self.ack_delay_s, (int, float)) or isinstance(self.ack_delay_s, bool) \
                or not 0 <= self.ack_delay_s <= 1:
            raise ValueError(f"ack_delay_s={self.ack_delay_s!r} must be a number in [0, 1] "
                             "(seconds; the sender retransmits what stays unacknowledged)")
        for name in ("num_decode_threads", "max_connections", "max_handshakes", "max_requests",
                     "max_finished_requests", "max_request_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if not isinstance(self.limits, WireLimits):
            raise ValueError(f"limits={self.limits!r} must be a WireLimits")
        _check_secret(self.secret)

    @functools.cached_property
    def compat(self) -> Compat:
        """What this receiver announces and accepts in the handshake (lynx_npu.wire.compat):
        its codecs and its limits."""
        return Compat.of(self.codecs,
                         limits=ReceiveLimits.of(self.limits, self.max_request_bytes))
