"""What a sender checks of a request before sending any of it, shared by the TCP Sender
(sender.py), the MooncakeSender (mooncake_sender.py) and the LMCacheSender (lmcache_sender.py:
no handshake, so no receiver limits).

``request_meta``: the codec and dtype, the codecs this sender declared in its handshake, and
the request's shape and size against the limits the receiver announced in its HELLO
(wire.ReceiveLimits.request_refusal); ``send()`` raises ValueError naming the limit.
``page_refused``: one page payload (a TCP frame's, or the bytes a Mooncake descriptor points
at) against ``max_payload_bytes`` and the page's shape bound (ReceiveLimits.page_refusal); the
request fails with TransferError naming it before that page is offered.

The receiver runs the same checks (wire.read_frame, receive_state.py, mooncake_descriptor.py)
and would refuse what fails here: refusing first fails the request at once, nothing of it on
the wire. ``limits`` is None while the receiver has announced none: nothing is checked then.

``DownClock``: how long a sender with requests waiting has had no connection to its receiver
(SenderConfig.receiver_grace_s).

``abort_key`` / ``abort_bytes``: what a sender sends when it fails a request for a reason the
receiver cannot see (encoding failed, a page it would refuse): an ERROR frame for the request
(frame format 5), so that the receiver fails it at once instead of at its deadline.
"""
from __future__ import annotations

from ..codec import wire_params
from ..wire import DTYPE_CODES, Compat, Frame, Kind, ReceiveLimits, encode_frame, params_to_json
from .errors import TransferError


def request_meta(compat: Compat, codec, num_layers: int, num_tokens: int, num_kv_heads: int,
                 head_dim: int, dtype, limits: ReceiveLimits | None) -> dict:
    """The header fields every frame of the request carries; ValueError if the request cannot
    be sent (not a wire codec, an unknown dtype, a codec not declared, past ``limits``)."""
    if not hasattr(codec, "codec_id") or not hasattr(codec, "params"):
        raise ValueError(f"{codec!r} has no codec_id/params(): build it with "
                         f"lynx_npu.get_codec(name)")
    if dtype not in DTYPE_CODES:
        raise ValueError(f"{dtype=} must be one of {list(DTYPE_CODES)}")
    compat.check_declared(codec)  # the receiver agreed to these codecs only
    meta = dict(num_layers=num_layers, num_tokens=int(num_tokens), codec_id=codec.codec_id,
                dtype=DTYPE_CODES[dtype], num_kv_heads=int(num_kv_heads),
                head_dim=int(head_dim), params=params_to_json(wire_params(codec)))
    refusal = limits and limits.request_refusal(
        num_layers, meta["num_tokens"], meta["num_kv_heads"], meta["head_dim"],
        dtype.itemsize, len(meta["params"]))
    if refusal:  # the receiver would refuse it: say so now, send nothing
        raise ValueError(f"the receiver would refuse this request: {refusal}")
    return meta


def page_refused(limits: ReceiveLimits | None, request_id: int, meta: dict, layer: int,
                 page: int, kind: Kind, num_tokens: int, payload_len: int) -> TransferError | None:
    """The error to fail the request with if the receiver would refuse this page payload
    (``num_tokens`` tokens from page index ``page`` on, ``payload_len`` bytes), else None."""
    refusal = limits and limits.page_refusal(num_tokens, meta["num_kv_heads"],
                                             meta["head_dim"], payload_len)
    if not refusal:
        return None
    return TransferError(f"request {request_id}: layer {layer} page {page} "
                         f"{Kind(kind).name.lower()}: {refusal}")


ABORT_TEXT_BYTES = 256  # of the reason: far within any receiver's max_error_bytes


def abort_key(request_id: int) -> tuple[int, int, int, int]:
    """The send-queue key of request ``request_id``'s abort (one per request)."""
    return (request_id, int(Kind.ERROR), 0, 0)


def abort_bytes(request_id: int, error: BaseException) -> bytes:
    """The ERROR frame telling the receiver that this sender failed the request, and why."""
    text = str(error).encode("utf-8", errors="replace")[:ABORT_TEXT_BYTES]
    return encode_frame(Frame(Kind.ERROR, request_id,
                              payload=text.decode("utf-8", errors="ignore").encode()))


class DownClock:
    """Since when a sender has had requests waiting and no connection to its receiver: a
    sender with nothing to send may be disconnected (the receiver closes idle connections)."""

    def __init__(self, grace_s: float):
        self.grace_s, self.since = grace_s, None

    def gone(self, now: float, waiting: bool, connected: bool) -> float:
        """-> the seconds it has lasted once past the grace, else 0."""
        if connected or not waiting:
            self.since = None
            return 0.0
        if self.since is None:
            self.since = now
        lasted = now - self.since
        return lasted if lasted > self.grace_s else 0.0
