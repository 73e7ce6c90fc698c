"""Frame format v5: a fixed 58-byte little-endian header, the codec parameters, the payload.

    offset size field          meaning
    0      4    magic          b"LYNX"
    4      1    version        5
    5      1    kind           Kind (ANCHOR / RESIDUAL data; HELLO AUTH AUTH_OK ACK NACK ERROR)
    6      2    extra_pages    u16, data frames: pages after the first (0: one page); else 0
    8      8    request_id     u64, chosen by the sender
    16     2    layer          u16, < num_layers
    18     2    num_layers     u16, layers in the request
    20     4    page           u32, page index within the layer (of the frame's first page)
    24     4    token_start    u32, first token of the (first) page
    28     4    token_end      u32, one past the last token of the (last) page (> token_start)
    32     4    num_tokens     u32, tokens in the request (>= token_end)
    36     2    codec_id       u16, lynx_npu.codec.CODEC_IDS
    38     1    dtype          DTYPE_CODES: 1 float16, 2 bfloat16, 3 float32 (the KV dtype)
    39     1    ref_kind       ACK/NACK: the stream kind acknowledged; ERROR: the handshake
                               frame refused (HELLO: incompatible, AUTH: authentication) or 0
    40     2    num_kv_heads   u16
    42     2    head_dim       u16
    44     2    params_len     u16, bytes of canonical JSON that follow the header
    46     4    payload_len    u32, bytes of payload after the parameters
    50     4    payload_crc    CRC32C of the payload
    54     4    header_crc     CRC32C of bytes 0..53 and the parameters
    58     params_len          data frames: lynx_npu.codec.wire_params(codec) as canonical
                               JSON (sorted keys, no spaces, ASCII): the payload format
                               and every codec parameter; control frames: none
    ..     payload_len         the page's anchor or residual bytes (EncodedPage.anchor/.residual);
                               with extra_pages > 0, a page table first (below); HELLO: a
                               32-byte nonce, then the peer's compatibility description
                               (wire/compat.py)

A data frame with extra_pages = n > 0 carries n + 1 consecutive pages (indices page .. page + n)
of one layer and stream: its payload starts with a page table of n + 1 entries (u32 token_end,
u32 nbytes), one per page in order, then the pages' bytes back to back. Page i covers
[previous token_end (token_start for the first), its token_end); the last token_end is the
header's. ``frame_pages`` splits such a frame and checks its table. One frame per page costs
the receiver its per-frame work once per page: on the H100's host 1 MiB frames moved a
median 25.0 Gbit/s on two connections where 315 KB one-page frames moved 15.7
(docs/benchmarks.md).

Version 5 (from 4): a sender may send ERROR too, after the handshake: it failed that request
on its side (encoding failed, a page the receiver would refuse), and the receiver fails
it at once instead of at its own deadline; a v4 receiver would have closed the connection on
it. The bytes of every frame are v4's but for the version.
Version 4 (from 3): the header's reserved ``flags`` became ``extra_pages`` (multi-page data
frames; v3 frames always carried one page, and flags were 0).
Version 3 (from 2): the compatibility description a HELLO carries names the sender's session
(a sender) or the receiver's limits (a receiver); see wire/compat.py. Version 2 (from 1):
HELLO carries the compatibility description after its nonce, ERROR may name the refused
handshake frame in ref_kind, and data frames' parameters carry "payload_format" and every
parameter (codec/registry.py). The header layout is the same in all five (v4 names a field
that was reserved).

Two CRCs instead of one so that a corrupt payload (header intact: NACK, re-request that frame)
is told apart from a corrupt header (lengths cannot be trusted: drop the connection); the
header CRC covers payload_crc, so together they cover header + payload. Fields a kind does not
use are sent as 0 (ref_kind is checked, the others ignored). Nothing here unpickles; every
length is checked against WireLimits before the bytes it announces are read. A field error
found after the header CRC checked out carries that header (FrameFieldError.header), so the
receiver can refuse that request by id and skip its payload instead of dropping the link.
"""
from __future__ import annotations

import enum
import functools
import json
import struct
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..codec.registry import CODEC_IDS
from .crc import crc32c
from .errors import (ChecksumError, FrameFieldError, TruncatedFrameError, UnknownCodecError,
                     UnsupportedVersionError, WireError)
from .limits import DEFAULT_LIMITS, WireLimits, max_data_payload

MAGIC = b"LYNX"
VERSION = 5
HEADER = struct.Struct("<4sBBHQHHIIIIHBBHHHIII")
PAGE_ENTRY = struct.Struct("<II")  # a multi-page frame's page table: (token_end, nbytes)
HEADER_SIZE = HEADER.size  # 58
_CRC_COVERED = HEADER_SIZE - 4
NONCE_BYTES = 32  # HELLO nonces and AUTH / AUTH_OK HMAC-SHA256 tags


class Kind(enum.IntEnum):
    ANCHOR = 1     # data: the anchor stream of one page of one layer
    RESIDUAL = 2   # data: the residual stream of one page of one layer
    HELLO = 16     # handshake: a 32-byte random nonce + compatibility description, each side
    AUTH = 17      # handshake, sender: HMAC-SHA256 over both HELLOs (empty without a secret)
    AUTH_OK = 18   # handshake, receiver: its own HMAC (empty without a secret)
    ACK = 32       # (request_id, ref_kind, layer, page) received intact
    NACK = 33      # that frame's payload failed its CRC: send it again
    ERROR = 48     # request_id failed (from the receiver, 0: the whole connection; from the
                   # sender, v5: it failed that request); payload: UTF-8 reason;
                   # ref_kind: the handshake frame refused (HELLO or AUTH), else 0


DATA_KINDS = (Kind.ANCHOR, Kind.RESIDUAL)
DTYPE_CODES: dict[torch.dtype, int] = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3}
DTYPES: dict[int, torch.dtype] = {v: k for k, v in DTYPE_CODES.items()}
_KNOWN_CODEC_IDS = frozenset(CODEC_IDS.values())


def params_to_json(params: dict) -> bytes:
    """codec.params() -> the canonical JSON the header carries (one codec, one byte string)."""
    try:
        return json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                          allow_nan=False).encode("ascii")
    except (TypeError, ValueError) as e:
        raise ValueError(f"codec params {params!r} are not JSON-able: {e}") from None


def params_from_json(raw: bytes) -> dict:
    """Parse and check the header's parameters: a canonical JSON object of plain values."""
    _check_params(bytes(raw))
    return json.loads(bytes(raw).decode("ascii"))


@functools.lru_cache(maxsize=64)
def _check_params(raw: bytes) -> None:
    """Every frame of a request repeats the same parameters: check each distinct string once
    (only successes are cached; a bad string raises every time)."""
    try:
        params = json.loads(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise FrameFieldError("params", f"not ASCII JSON: {bytes(raw[:64])!r}") from None
    if not isinstance(params, dict):
        raise FrameFieldError("params", f"must be a JSON object, got {type(params).__name__}")
    for key, value in params.items():
        if not isinstance(value, (str, int, float, bool)) and value is not None:
            raise FrameFieldError("params", f"value of {key!r} must be a scalar, got "
                                            f"{type(value).__name__}")
    try:
        canonical = params_to_json(params)
    except ValueError:
        raise FrameFieldError("params", "holds a non-finite number") from None
    if canonical != bytes(raw):
        raise FrameFieldError("params", "is not canonical JSON (sorted keys, no spaces)")


@dataclass(frozen=True)
class Frame:
    """One frame. ``payload`` is any bytes-like object (bytes, bytearray, memoryview)."""

    kind: Kind
    request_id: int = 0
    layer: int = 0
    num_layers: int = 0
    page: int = 0
    token_start: int = 0
    token_end: int = 0
    num_tokens: int = 0
    codec_id: int = 0
    dtype: int = 0
    ref_kind: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    params: bytes = b""
    payload: bytes | bytearray | memoryview = field(default=b"", repr=False)
    extra_pages: int = 0      # data frames: pages after the first (their table opens payload)

    @property
    def key(self) -> tuple[int, int, int, int]:
        """(request_id, stream kind, layer, page): what ACK/NACK refer to."""
        kind = self.ref_kind if self.kind in (Kind.ACK, Kind.NACK) else int(self.kind)
        return (self.request_id, kind, self.layer, self.page)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def params_dict(self) -> dict:
        return params_from_json(self.params)


def pack_header(frame: Frame, payload_crc: int | None = None,
                payload_len: int | None = None) -> bytes:
    """Header + parameters of ``frame`` (the payload is sent as is after it). A payload sent
    in pieces (a page table and pages: ``page_table``) passes its CRC and length instead."""
    if payload_len is None:
        payload = memoryview(frame.payload).cast("B")
        payload_len = payload.nbytes
        if payload_crc is None:
            payload_crc = crc32c(payload)
    elif payload_crc is None:
        raise ValueError("a payload given by its length needs its CRC too")
    try:
        fixed = HEADER.pack(MAGIC, VERSION, int(frame.kind), frame.extra_pages,
                            frame.request_id, frame.layer,
                            frame.num_layers, frame.page, frame.token_start, frame.token_end,
                            frame.num_tokens, frame.codec_id, frame.dtype, frame.ref_kind,
                            frame.num_kv_heads, frame.head_dim, len(frame.params),
                            payload_len, payload_crc, 0)
    except struct.error as e:
        raise ValueError(f"a field of {frame!r} does not fit its header slot: {e}") from None
    crc = crc32c(frame.params, crc32c(fixed[:_CRC_COVERED]))
    return fixed[:_CRC_COVERED] + crc.to_bytes(4, "little") + frame.params


def encode_frame(frame: Frame) -> bytes:
    """The complete frame as one bytes object (header, parameters, payload)."""
    return pack_header(frame) + bytes(frame.payload)


ReadExact = Callable[[int], "bytes | bytearray | memoryview"]


def read_frame(read_exact: ReadExact, limits: WireLimits = DEFAULT_LIMITS) -> Frame:
    """Read one frame through ``read_exact(n)`` (returns exactly n bytes, or raises
    TruncatedFrameError). Raises only WireError subclasses for malformed input; a corrupt
    payload raises ChecksumError("payload") carrying the verified header so it can be NACKed.
    """
    fixed = bytes(read_exact(HEADER_SIZE))
    (magic, version, kind, extra_pages, request_id, layer, num_layers, page, token_start, token_end,
     num_tokens, codec_id, dtype, ref_kind, num_kv_heads, head_dim, params_len, payload_len,
     payload_crc, header_crc) = HEADER.unpack(fixed)
    if magic != MAGIC:
        raise FrameFieldError("magic", f"expected {MAGIC!r}, got {magic!r}")
    if version != VERSION:
        raise UnsupportedVersionError("version", f"format version {version} is not supported "
                                                 f"(this decoder reads version {VERSION})")
    if params_len > limits.max_params_bytes:
        raise FrameFieldError("params_len", f"{params_len} exceeds "
                                            f"max_params_bytes={limits.max_params_bytes}")
    params = bytes(read_exact(params_len)) if params_len else b""
    actual = crc32c(params, crc32c(fixed[:_CRC_COVERED]))
    if actual != header_crc:
        raise ChecksumError("header", header_crc, actual)
    try:
        kind = Kind(kind)
    except ValueError:
        raise FrameFieldError("kind", f"unknown frame kind {kind}") from None
    frame = Frame(kind, request_id, layer, num_layers, page, token_start, token_end, num_tokens,
                  codec_id, dtype, ref_kind, num_kv_heads, head_dim, params,
                  extra_pages=extra_pages)
    try:
        _check_fields(frame, params_len, payload_len, limits)
    except FrameFieldError as e:  # the header is intact: its request can be refused by id
        e.header, e.payload_len = frame, payload_len
        raise
    payload = read_exact(payload_len) if payload_len else b""
    actual = crc32c(payload)
    if actual != payload_crc:
        raise ChecksumError("payload", payload_crc, actual, header=frame)
    if kind == Kind.ERROR:
        try:
            bytes(payload).decode("utf-8")
        except UnicodeDecodeError:
            raise FrameFieldError("payload", "ERROR text is not UTF-8") from None
    object.__setattr__(frame, "payload", payload)  # the frame is new and not yet shared
    return frame


def _check_fields(f: Frame, params_len: int, payload_len: int, limits: WireLimits) -> None:
    def bad(name: str, message: str) -> FrameFieldError:
        return FrameFieldError(name, message)

    if f.kind in DATA_KINDS:
        if f.codec_id not in _KNOWN_CODEC_IDS:
            raise UnknownCodecError("codec_id", f"unknown codec id {f.codec_id}; known ids: "
                                                f"{sorted(_KNOWN_CODEC_IDS)}")
        if f.dtype not in DTYPES:
            raise bad("dtype", f"unknown dtype code {f.dtype}; known: {sorted(DTYPES)}")
        if not 1 <= f.num_layers <= limits.max_layers:
            raise bad("num_layers", f"{f.num_layers} must be in [1, "
                                    f"max_layers={limits.max_layers}]")
        if f.layer >= f.num_layers:
            raise bad("layer", f"{f.layer} must be < num_layers={f.num_layers}")
        if not 1 <= f.num_tokens <= limits.max_tokens:
            raise bad("num_tokens", f"{f.num_tokens} must be in [1, "
                                    f"max_tokens={limits.max_tokens}]")
        if not f.token_start < f.token_end <= f.num_tokens:
            raise bad("token_end", f"token range [{f.token_start}, {f.token_end}) must be "
                                   f"non-empty and within num_tokens={f.num_tokens}")
        if f.page > f.token_start:  # every page holds >= 1 token, so page i starts at >= i
            raise bad("page", f"page {f.page} cannot start at token {f.token_start}")
        if f.extra_pages >= f.token_end - f.token_start:
            raise bad("extra_pages", f"{f.extra_pages + 1} pages cannot share the "
                                     f"{f.token_end - f.token_start} tokens "
                                     f"[{f.token_start}, {f.token_end})")
        if not 1 <= f.num_kv_heads <= limits.max_kv_heads:
            raise bad("num_kv_heads", f"{f.num_kv_heads} must be in [1, "
                                      f"max_kv_heads={limits.max_kv_heads}]")
        if not 1 <= f.head_dim <= limits.max_head_dim:
            raise bad("head_dim", f"{f.head_dim} must be in [1, "
                                  f"max_head_dim={limits.max_head_dim}]")
        if f.ref_kind != 0:
            raise bad("ref_kind", f"must be 0 on a data frame, got {f.ref_kind}")
        _check_params(f.params)
        cap = min(limits.max_payload_bytes,
                  max_data_payload(f.token_end - f.token_start, f.num_kv_heads, f.head_dim)
                  + table_nbytes(f.extra_pages))
        if not 1 <= payload_len <= cap:
            raise bad("payload_len", f"{payload_len} must be in [1, {cap}] for this page "
                                     f"(max_payload_bytes={limits.max_payload_bytes})")
        return
    if f.extra_pages:
        raise bad("extra_pages", f"must be 0 on a {f.kind.name} frame, got {f.extra_pages}")
    if params_len:
        raise bad("params_len", f"must be 0 on a {f.kind.name} frame, got {params_len}")
    if f.kind in (Kind.ACK, Kind.NACK):
        if f.ref_kind not in (Kind.ANCHOR, Kind.RESIDUAL):
            raise bad("ref_kind", f"{f.kind.name} must name a stream kind (1 or 2), "
                                  f"got {f.ref_kind}")
    elif f.kind == Kind.ERROR:
        if f.ref_kind not in (0, Kind.HELLO, Kind.AUTH):
            raise bad("ref_kind", f"ERROR must name the refused handshake frame (HELLO 16 or "
                                  f"AUTH 17) or none (0), got {f.ref_kind}")
    elif f.ref_kind != 0:
        raise bad("ref_kind", f"must be 0 on a {f.kind.name} frame, got {f.ref_kind}")
    if f.kind == Kind.HELLO:
        if not NONCE_BYTES < payload_len <= NONCE_BYTES + limits.max_compat_bytes:
            raise bad("payload_len", f"HELLO payload must be a {NONCE_BYTES}-byte nonce and a "
                                     f"compatibility description of 1 to "
                                     f"{limits.max_compat_bytes} bytes, got {payload_len} bytes")
    elif f.kind == Kind.ERROR:
        if payload_len > limits.max_error_bytes:
            raise bad("payload_len", f"ERROR text of {payload_len} bytes exceeds "
                                     f"{limits.max_error_bytes}")
    else:
        expected = (0,) if f.kind in (Kind.ACK, Kind.NACK) else (0, NONCE_BYTES)  # AUTH(_OK)
        if payload_len not in expected:
            raise bad("payload_len", f"{f.kind.name} payload must be "
                                     f"{' or '.join(map(str, expected))} bytes, got {payload_len}")


def table_nbytes(extra_pages: int) -> int:
    """Bytes of a data frame's page table (none for a one-page frame)."""
    return PAGE_ENTRY.size * (extra_pages + 1) if extra_pages else 0


def page_table(token_ends: list[int], sizes: list[int]) -> bytes:
    """The page table that opens a multi-page frame's payload (pages in order)."""
    return b"".join(PAGE_ENTRY.pack(e, n) for e, n in zip(token_ends, sizes, strict=True))


@dataclass(frozen=True)
class FramePage:
    """One page of a data frame: its index, token range and bytes (a view of the payload)."""

    page: int
    token_start: int
    token_end: int
    payload: memoryview


def frame_pages(frame: Frame) -> list[FramePage]:
    """The pages a data frame carries, checked against its header: a one-page frame is its
    payload; a multi-page frame's table must tile the header's token range with non-empty
    pages and its byte counts the rest of the payload exactly. Raises FrameFieldError
    ("payload") naming the first inconsistency."""
    view = memoryview(frame.payload).cast("B")
    if not frame.extra_pages:
        return [FramePage(frame.page, frame.token_start, frame.token_end, view)]
    n = frame.extra_pages + 1
    head = PAGE_ENTRY.size * n
    if view.nbytes < head:
        raise FrameFieldError("payload", f"{view.nbytes} bytes cannot hold the table of {n} "
                                         f"pages ({head} bytes)")
    pages, start, off = [], frame.token_start, head
    for i, (end, nbytes) in enumerate(PAGE_ENTRY.iter_unpack(view[:head])):
        last = i == n - 1
        if not start < end <= frame.token_end or last != (end == frame.token_end):
            raise FrameFieldError("payload", f"page table entry {i} ends at token {end}; pages "
                                             f"must tile [{frame.token_start}, "
                                             f"{frame.token_end}) in order, each non-empty")
        if not 0 < nbytes <= view.nbytes - off:
            raise FrameFieldError("payload", f"page table entry {i} claims {nbytes} bytes; "
                                             f"{view.nbytes - off} remain")
        pages.append(FramePage(frame.page + i, start, end, view[off:off + nbytes]))
        start, off = end, off + nbytes
    if off != view.nbytes:
        raise FrameFieldError("payload", f"the page table covers {off} of {view.nbytes} bytes")
    return pages


class BufferReader:
    """``read_exact`` over an in-memory buffer (tests, fuzzing, golden fixtures)."""

    def __init__(self, data: bytes | bytearray | memoryview):
        self.view = memoryview(data).cast("B")
        self.pos = 0

    def __call__(self, n: int) -> memoryview:
        if self.pos + n > len(self.view):
            raise TruncatedFrameError(f"needed {n} bytes at offset {self.pos}, only "
                                      f"{len(self.view) - self.pos} left")
        out = self.view[self.pos:self.pos + n]
        self.pos += n
        return out


def decode_frame(data: bytes | bytearray | memoryview,
                 limits: WireLimits = DEFAULT_LIMITS) -> Frame:
    """Decode a buffer holding exactly one frame."""
    reader = BufferReader(data)
    frame = read_frame(reader, limits)
    if reader.pos != len(reader.view):
        raise WireError(f"{len(reader.view) - reader.pos} trailing bytes after the frame")
    return frame


def frame_nbytes(frame: Frame) -> int:
    """Bytes the frame takes on the wire."""
    return HEADER_SIZE + len(frame.params) + memoryview(frame.payload).nbytes

