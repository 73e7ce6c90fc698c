"""Where one stream of one page lies in the sender's registered memory: the payload of the data
frames the Mooncake transport's control connection carries (lynx_npu/transport/mooncake.py).

Over Mooncake the page bytes do not cross the control connection: the sender registers them
with its transfer engine and sends, per page and stream, an ANCHOR / RESIDUAL data frame of
frame format v2 (lynx_npu/wire/frame.py) whose header says which request, layer, page, tokens,
codec and parameters (checked by read_frame as for any data frame) and whose payload is this
descriptor instead of the bytes. The receiver reads the bytes with its own engine.

    offset size field      meaning
    0      4    magic      b"LYMC"
    4      1    version    1
    5      1    seg_len    bytes of the segment name that follow the fixed part (1..255)
    6      2    reserved   0
    8      8    address    u64, virtual address of the bytes in the sender's engine segment
    16     4    length     u32, bytes of this stream of this page (what the TCP transport's
                           frame would carry as its payload)
    20     4    crc32c     CRC32C of those bytes (checked after the engine read)
    24     seg_len         the sender engine's segment name, ASCII "ip:port" ([ipv6]:port)

Everything a peer controls is bounded before it is used: ``length`` by the same cap the frame
decoder puts on a data frame's payload (wire.max_data_payload of the page, WireLimits), so a
descriptor cannot make the receiver allocate more than a page may hold; the address range must
not wrap; the segment must be an IP literal and a port. The engine itself refuses a read outside
the memory the sender registered.
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from ..wire import Frame, WireError, WireLimits, max_data_payload

MAGIC = b"LYMC"
VERSION = 1
FIXED = struct.Struct("<4sBBHQII")
FIXED_SIZE = FIXED.size  # 24
MAX_SEGMENT_BYTES = 255


class DescriptorError(WireError):
    """A page descriptor this receiver refuses; ``field`` names the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"Mooncake page descriptor field {field!r}: {message}")
        self.field = field


@dataclass(frozen=True)
class PageDescriptor:
    segment: str   # the sender engine's segment ("ip:port")
    address: int   # where the bytes start in it
    length: int    # how many
    crc: int       # CRC32C of them

    def pack(self) -> bytes:
        segment = self.segment.encode("ascii")
        if not 1 <= len(segment) <= MAX_SEGMENT_BYTES:
            raise ValueError(f"segment {self.segment!r} must be 1..{MAX_SEGMENT_BYTES} bytes")
        try:
            return FIXED.pack(MAGIC, VERSION, len(segment), 0, self.address, self.length,
                              self.crc) + segment
        except struct.error as e:
            raise ValueError(f"{self!r} does not fit the descriptor: {e}") from None


def split_segment(segment: str) -> tuple[str, int]:
    """``"ip:port"`` / ``"[ipv6]:port"`` -> (ip, port); ValueError naming what is wrong."""
    host, sep, port = segment.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit():
        raise ValueError(f"segment {segment!r} must be ip:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ipaddress.ip_address(host).version != 6:
            raise ValueError(f"segment {segment!r}: only an IPv6 address goes in brackets")
    elif ":" in host:
        raise ValueError(f"segment {segment!r}: an IPv6 address must be in brackets")
    ipaddress.ip_address(host)  # ValueError names the host
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"segment {segment!r}: port must be in [1, 65535]")
    return host, int(port)


def join_segment(host: str, port: int) -> str:
    """(ip, port) -> the segment name the engine answers to."""
    return f"[{host}]:{port}" if ipaddress.ip_address(host).version == 6 else f"{host}:{port}"


def max_length(frame: Frame, limits: WireLimits) -> int:
    """The most bytes a descriptor of ``frame``'s page may announce (the TCP frame's cap)."""
    return min(limits.max_payload_bytes,
               max_data_payload(frame.token_end - frame.token_start, frame.num_kv_heads,
                                frame.head_dim))


def parse_descriptor(payload, frame: Frame, limits: WireLimits) -> PageDescriptor:
    """The descriptor a data frame carries (its header already checked by read_frame)."""
    raw = bytes(payload)
    if len(raw) < FIXED_SIZE:
        raise DescriptorError("payload", f"{len(raw)} bytes, fewer than the "
                                        f"{FIXED_SIZE}-byte descriptor: is the sender using the "
                                        f"tcp transport against a Mooncake receiver?")
    magic, version, seg_len, reserved, address, length, crc = FIXED.unpack_from(raw)
    if magic != MAGIC:
        raise DescriptorError("magic", f"expected {MAGIC!r}, got {magic!r}: is the sender "
                                       f"using the tcp transport against a Mooncake receiver?")
    if version != VERSION:
        raise DescriptorError("version", f"descriptor version {version} is not supported "
                                         f"(this receiver reads version {VERSION})")
    if reserved != 0:
        raise DescriptorError("reserved", f"must be 0, got {reserved:#06x}")
    if seg_len < 1 or len(raw) != FIXED_SIZE + seg_len:
        raise DescriptorError("seg_len", f"{seg_len} does not match the {len(raw)}-byte "
                                         f"payload (expected {FIXED_SIZE} + a 1..255-byte name)")
    cap = max_length(frame, limits)
    if not 1 <= length <= cap:
        raise DescriptorError("length", f"{length} must be in [1, {cap}] for a page of "
                                        f"{frame.token_end - frame.token_start} tokens x "
                                        f"{frame.num_kv_heads} heads x {frame.head_dim}")
    if address == 0 or address + length > 1 << 64:
        raise DescriptorError("address", f"{address:#x} + {length} is not a valid range")
    try:
        segment = raw[FIXED_SIZE:].decode("ascii")
        split_segment(segment)
    except (UnicodeDecodeError, ValueError) as e:
        raise DescriptorError("segment", f"{raw[FIXED_SIZE:]!r:.80}: {e}") from None
    return PageDescriptor(segment, address, length, crc)
