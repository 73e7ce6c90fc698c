"""What a peer announces when it meets another: the payload format it speaks and the codec
parameter sets it sends (a sender) or accepts (a receiver). Checked once per connection, in
the handshake (lynx_npu/transport/connection.py), before any data frame.

A HELLO frame carries the description after its 32-byte nonce, as canonical JSON (sorted keys,
no spaces, ASCII), e.g. for a sender that will send the default split Lynx codec:

    {"codecs":[["lynx",{"alpha_k":0.25,"alpha_v":0.5,...,"payload_format":2,...}]],
     "payload_format":2,"session":"9f2c...(32 hex digits)"}

and for a receiver, its limits instead of a session (frame format 3):

    {"codecs":[],"limits":{"max_head_dim":1024,...,"max_request_bytes":8589934592,...},
     "payload_format":2}

A sender's session is random and the same on all its connections: the receiver binds every
request id to the session (and peer address) that sent its first frame, and refuses frames of
it from any other. A receiver's limits (wire/limits.py ReceiveLimits) let the sender refuse a
request the receiver would refuse before sending any of it.

Each codec is its registry name and exactly the parameters its frames carry
(codec.registry.wire_params). Full parameter sets rather than a hash of them (vLLM's NIXL
connector sends a hash): they cost a few hundred bytes per codec, let a refusal name the
parameter that differs with both values, and let a receiver check that it can build every
declared codec. The receiver judges (``Compat.refusal``):

1. the payload formats must be equal (a description of another format is read no further);
2. every codec the sender declares must build here (``codec_from_params``: no missing or
   unknown parameter, every value of the right type and range);
3. a receiver that declares codecs accepts only those: the sender must declare at least one,
   and each with exactly the parameters of one the receiver declared.

The handshake also requires a sender to name a session (transport/connection.py).

A receiver that declares none accepts any codec it can build. A sender that declares codecs
sends no other (``check_declared``); one that declares none may send any codec, and frames
are then checked one request at a time (codec_from_wire).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..codec.registry import CODEC_IDS, FORMAT_KEY, PAYLOAD_FORMAT, codec_from_params, wire_params
from .frame import params_to_json
from .limits import DEFAULT_LIMITS, ReceiveLimits

_CODECS_KEY, _SESSION_KEY, _LIMITS_KEY = "codecs", "session", "limits"
_SESSION = re.compile(r"[0-9a-f]{32}")  # 128 random bits, lower-case hex


@dataclass(frozen=True)
class CodecSpec:
    """A codec as the wire describes it: registry name and its frames' canonical parameters."""

    name: str
    params: bytes  # params_to_json(wire_params(codec)): what every frame of it carries

    @classmethod
    def of(cls, codec) -> "CodecSpec":
        """The spec of a codec built by ``lynx_npu.get_codec`` (a CodecSpec is returned as is)."""
        if isinstance(codec, CodecSpec):
            return codec
        name = getattr(codec, "name", None)
        if getattr(codec, "codec_id", None) is None or CODEC_IDS.get(name) != codec.codec_id:
            raise ValueError(f"{codec!r} is not a registered codec: build it with "
                             f"lynx_npu.get_codec(name)")
        return cls(name, params_to_json(wire_params(codec)))

    def params_dict(self) -> dict:
        return json.loads(self.params)

    def __str__(self) -> str:
        return f"{self.name} {self.params.decode('ascii')}"


@dataclass(frozen=True)
class Compat:
    """One peer's side of the compatibility check (see the module docstring)."""

    payload_format: int = PAYLOAD_FORMAT
    codecs: tuple[CodecSpec, ...] = ()
    session: str = ""                    # a sender's session id; "" for a receiver
    limits: ReceiveLimits | None = None  # a receiver's limits; None for a sender

    def __post_init__(self):
        if type(self.payload_format) is not int or self.payload_format < 1:
            raise ValueError(f"payload_format={self.payload_format!r} must be a positive int")
        if not all(isinstance(c, CodecSpec) for c in self.codecs):
            raise ValueError("codecs must be CodecSpecs (use Compat.of(codecs))")
        if self.session and not (isinstance(self.session, str)
                                 and _SESSION.fullmatch(self.session)):
            raise ValueError(f"session={self.session!r:.80} must be 32 lower-case hex digits")
        if self.limits is not None and not isinstance(self.limits, ReceiveLimits):
            raise ValueError(f"limits={self.limits!r:.80} must be ReceiveLimits or None")
        object.__setattr__(self, "codecs", tuple(dict.fromkeys(self.codecs)))  # no repeats

    @classmethod
    def of(cls, codecs=(), *, session: str = "",
           limits: ReceiveLimits | None = None) -> "Compat":
        """This build's description declaring ``codecs`` (codecs from ``get_codec`` or
        CodecSpecs); raises ValueError if one is not a registered codec or the description
        would not fit a HELLO frame."""
        compat = cls(PAYLOAD_FORMAT, tuple(CodecSpec.of(c) for c in codecs), session, limits)
        size = len(compat.to_json())
        if size > DEFAULT_LIMITS.max_compat_bytes:
            raise ValueError(f"the compatibility description of {len(compat.codecs)} codecs is "
                             f"{size} bytes; a HELLO frame carries at most "
                             f"{DEFAULT_LIMITS.max_compat_bytes} (WireLimits.max_compat_bytes)")
        return compat

    def to_json(self) -> bytes:
        obj = {FORMAT_KEY: self.payload_format,
               _CODECS_KEY: [[c.name, c.params_dict()] for c in self.codecs]}
        if self.session:
            obj[_SESSION_KEY] = self.session
        if self.limits is not None:
            obj[_LIMITS_KEY] = self.limits.to_dict()
        return params_to_json(obj)

    @classmethod
    def from_json(cls, raw: bytes) -> "Compat":
        """Parse a peer's description; ValueError names what is malformed. A description of
        another payload format is read no further than its version."""
        try:
            obj = json.loads(bytes(raw).decode("ascii"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise ValueError(f"compatibility description is not ASCII JSON: "
                             f"{bytes(raw[:64])!r}") from None
        if not isinstance(obj, dict):
            raise ValueError("compatibility description must be a JSON object")
        if FORMAT_KEY not in obj:
            raise ValueError(f"compatibility description lacks {FORMAT_KEY!r}")
        fmt = obj[FORMAT_KEY]
        if type(fmt) is not int or fmt < 1:
            raise ValueError(f"compatibility description: {FORMAT_KEY}={fmt!r} must be a "
                             f"positive int")
        if fmt != PAYLOAD_FORMAT:
            return cls(fmt)
        unknown = sorted(set(obj) - {FORMAT_KEY, _CODECS_KEY, _SESSION_KEY, _LIMITS_KEY})
        if unknown:
            raise ValueError(f"compatibility description has unknown key(s) {unknown}")
        if _CODECS_KEY not in obj:
            raise ValueError(f"compatibility description lacks {_CODECS_KEY!r}")
        if not isinstance(obj[_CODECS_KEY], list):
            raise ValueError(f"compatibility description: {_CODECS_KEY!r} must be a list")
        specs = []
        for entry in obj[_CODECS_KEY]:
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                    and isinstance(entry[1], dict)):
                raise ValueError(f"compatibility description: each of {_CODECS_KEY!r} must be "
                                 f"[name, {{parameters}}], got {entry!r:.80}")
            name, params = entry
            for key, value in params.items():
                if not isinstance(value, (str, int, float, bool)):
                    raise ValueError(f"compatibility description: codec {name!r} parameter "
                                     f"{key!r} must be a scalar, got {type(value).__name__}")
            specs.append(CodecSpec(name, params_to_json(params)))
        session = obj.get(_SESSION_KEY, "")
        if not isinstance(session, str) or (session and not _SESSION.fullmatch(session)):
            raise ValueError(f"compatibility description: {_SESSION_KEY}={session!r:.80} must "
                             f"be 32 lower-case hex digits")
        try:
            limits = (ReceiveLimits.from_dict(obj[_LIMITS_KEY]) if _LIMITS_KEY in obj
                      else None)
        except (TypeError, ValueError) as e:
            raise ValueError(f"compatibility description: {e}") from None
        return cls(fmt, tuple(specs), session, limits)

    def check_declared(self, codec) -> None:
        """A sender sends only codecs it declared (when it declared any): ValueError if not."""
        spec = CodecSpec.of(codec)
        if self.codecs and spec not in self.codecs:
            raise ValueError(f"codec {spec} was not declared in the handshake; this sender "
                             f"declared: {'; '.join(map(str, self.codecs))}")

    def refusal(self, sender: "Compat") -> str | None:
        """Why this receiver refuses ``sender``, naming both sides' values; None if it
        accepts it."""
        if sender.payload_format != self.payload_format:
            return (f"payload format differs: the sender's is {sender.payload_format}, the "
                    f"receiver's {self.payload_format}")
        for spec in sender.codecs:
            try:
                codec_from_params(spec.name, spec.params_dict())
            except ValueError as e:
                return f"the sender's codec {spec.name!r} cannot be built here: {e}"
        if not self.codecs:
            return None
        accepted = ", ".join(c.name for c in self.codecs)
        if not sender.codecs:
            return f"the sender declares no codecs; the receiver accepts only: {accepted}"
        for spec in sender.codecs:
            if spec in self.codecs:
                continue
            mine = [c for c in self.codecs if c.name == spec.name]
            if not mine:
                return f"codec {spec.name!r} is not accepted; the receiver accepts only: {accepted}"
            diffs = min((_differences(spec, c) for c in mine), key=len)
            return (f"codec {spec.name!r} parameters differ from the receiver's: "
                    + "; ".join(diffs))
        return None


def _differences(sender: CodecSpec, receiver: CodecSpec) -> list[str]:
    """``key: sender X, receiver Y`` for every parameter the two specs do not share."""
    ours, theirs = sender.params_dict(), receiver.params_dict()

    def show(params: dict, key: str) -> str:
        return json.dumps(params[key]) if key in params else "(none)"

    return [f"{key}: sender {show(ours, key)}, receiver {show(theirs, key)}"
            for key in sorted(ours.keys() | theirs.keys())
            if show(ours, key) != show(theirs, key)]
