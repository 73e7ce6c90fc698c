"""Configuration of the Lynx KV connector, read from vLLM's ``kv_connector_extra_config``, and
the per-request ``kv_transfer_params`` a proxy attaches to each request.

Pure Python (no vLLM import), so it can be validated and tested on its own.

    --kv-transfer-config '{"kv_connector": "LynxConnector",
        "kv_connector_module_path": "lynx_npu.integration.vllm_ascend.connector",
        "kv_role": "kv_consumer", "kv_connector_extra_config": {"port": 17100}}'

Per request (``SamplingParams.extra_args["kv_transfer_params"]`` or the OpenAI API's
``kv_transfer_params`` field): ``{"lynx": {"transfer_id": 42}}`` on both instances, plus
optionally ``"codec"`` / ``"peer"`` on the prefill instance.

Parsing is strict, and every error names the key and the value (docs/deploy.md's table states
each rule):

- booleans are JSON booleans; the strings ``"true"`` and ``"false"`` (exactly, lower case)
  are read as them at the edge (``from_vllm`` / ``from_request``), anything else is an error
  (``"false"`` used to turn an option on, being a non-empty string);
- numbers are ints or floats (never bools), finite, in a stated range;
- hosts are an IP address or an ASCII host name (RFC 1123 labels), never empty (an empty
  listen address meant every interface: say ``0.0.0.0`` to mean that); peers are
  ``host:port`` or ``[ipv6]:port`` with an ASCII decimal port in [1, 65535] and no spaces,
  scheme or path;
- codec names are checked against the codec registry when the config is built;
- the shared secret needs real entropy, not only length (``check_secret``).
"""
from __future__ import annotations

import array
import collections
import dataclasses
import hashlib
import ipaddress
import math
import re
from dataclasses import dataclass

from lynx_npu.codec.registry import get_codec, list_codecs, parameter_names
from lynx_npu.transport.base import serde_for
from lynx_npu.transport.lmcache_sender import check_sizable
from lynx_npu.transport.lmcache_store import LMCacheConfig
from lynx_npu.transport.mooncake_engine import MooncakeConfig

ROLES = {"kv_producer": "producer", "kv_consumer": "consumer"}
PARAMS_KEY = "lynx"
WIRE_DTYPES = (None, "bfloat16", "float16")
TRANSPORTS = ("tcp", "mooncake", "lmcache")
BOOLS = {True: True, False: False, "true": True, "false": False}
MIN_SECRET_CHARS = 16
MIN_SECRET_BITS = 64.0
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_PORT = re.compile(r"[0-9]{1,5}")


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _bool_fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.type in ("bool", bool)}


def check_host(name: str, host) -> str:
    """An IP address or an ASCII host name -> itself (IPv6 without brackets)."""
    if not isinstance(host, str) or not host:
        raise ValueError(f"{name}={host!r} must be a host name or IP address (an empty host "
                         f"would mean every interface: write 0.0.0.0 for that)")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if (len(host) > 253 or not host.isascii() or not _HOSTNAME.fullmatch(host)
            or re.fullmatch(r"[0-9.]+", host)):
        raise ValueError(f"{name}={host!r} must be an IP address or an ASCII host name "
                         f"(letters, digits, '-' and '.')")
    return host


def parse_peer(peer: str, name: str = "peer") -> tuple[str, int]:
    """``"host:port"`` or ``"[ipv6]:port"`` -> (host, port), strictly (``check_host``)."""
    if not isinstance(peer, str) or ":" not in peer:
        raise ValueError(f"{name}={peer!r} must be 'host:port'")
    host, _, port = peer.rpartition(":")
    if not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
        raise ValueError(f"{name}={peer!r} must be 'host:port' with a decimal port in "
                         f"[1, 65535]")
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        try:
            if ipaddress.ip_address(inner).version == 6:
                return str(ipaddress.ip_address(inner)), int(port)
        except ValueError:
            pass
        raise ValueError(f"{name}={peer!r}: {host} must be an IPv6 address in brackets")
    try:
        if ":" in host:
            raise ValueError("an IPv6 address needs brackets")
        check_host(name, host)
    except ValueError:
        raise ValueError(f"{name}={peer!r} must be 'host:port' with an IP address or ASCII "
                         f"host name (no spaces, scheme or path; IPv6 as [addr]:port)") from None
    return check_host(name, host), int(port)


def check_number(name: str, value, low: float, high: float, *, integer: bool = False,
                 low_open: bool = False):
    """An int (or, unless ``integer``, a float), never a bool, finite, in [low, high]
    ((low, high] with ``low_open``)."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ValueError(f"{name}={value!r} must be {'an int' if integer else 'a number'}, "
                         f"got {type(value).__name__}")
    ok = math.isfinite(value) and (low < value if low_open else low <= value) and value <= high
    if not ok:
        raise ValueError(f"{name}={value!r} must be a finite number in "
                         f"{'(' if low_open else '['}{low:g}, {high:g}]")
    return value


def parse_bool(name: str, value) -> bool:
    """A JSON boolean, or exactly the string "true" / "false"."""
    if isinstance(value, (bool, str)) and value in BOOLS:
        return BOOLS[value]
    raise ValueError(f"{name}={value!r} must be true or false (a JSON boolean, or the string "
                     f"\"true\" / \"false\")")


def check_codec(name: str, codec) -> None:
    if not isinstance(codec, str) or codec not in list_codecs():
        raise ValueError(f"{name}={codec!r} is not a codec; codecs: {', '.join(list_codecs())}")


def check_lynx_plan(plan) -> dict:
    """A model's Lynx plan checked as the codec checks its parameters: the same dict, with the
    codec's own values (per-layer plans as tuples)."""
    if not isinstance(plan, dict):
        raise ValueError(f"lynx_plan={plan!r} must be a dict of Lynx codec parameters "
                         f"(what `lynx calibrate` writes), e.g. "
                         f"{{\"layer_anchor_bits\": [[18, 5, 4]]}}")
    unknown = set(plan) - parameter_names("lynx")
    if unknown:
        raise ValueError(f"lynx_plan has unknown Lynx parameter(s) {sorted(unknown, key=str)}; "
                         f"parameters: {sorted(parameter_names('lynx'))}")
    try:
        config = get_codec("lynx", **plan).config
    except (TypeError, ValueError) as e:
        raise ValueError(f"lynx_plan: {e}") from None
    return {name: getattr(config, name) for name in plan}


def declared_codecs(config: "LynxConnectorConfig | None" = None) -> tuple:
    """What both sides announce in the transport's handshake: every registered codec with the
    parameters this build and ``config`` give it (requests name codecs only by name). A prefill
    and a decode instance whose builds or per-layer plans differ in any codec parameter or in
    the payload format are refused at connection time, naming the difference, instead of
    exchanging frames."""
    return tuple(config.codec_for(name) if config is not None else get_codec(name)
                 for name in list_codecs())


def secret_bits(secret: str) -> float:
    """Estimated entropy of a secret: its length times the Shannon entropy of its own character
    frequencies (repeats and small alphabets count against it). A floor against careless
    secrets, not a proof of randomness."""
    counts = collections.Counter(secret)
    n = len(secret)
    return n * sum(c / n * math.log2(n / c) for c in counts.values())


def check_secret(secret) -> None:
    """At least 16 characters and an estimated entropy (``secret_bits``) of at least 64 bits:
    ``secrets.token_hex(16)`` (~120 bits by this estimate) passes; 16 spaces (0 bits),
    "aaaaaaaabbbbbbbb" (16 bits) or "password12345678" (~62 bits) do not."""
    if not isinstance(secret, str):
        raise ValueError(f"secret must be a string, got {type(secret).__name__}")
    bits = secret_bits(secret)
    if len(secret) < MIN_SECRET_CHARS or bits < MIN_SECRET_BITS:
        # the value itself is never echoed
        raise ValueError(f"secret has {len(secret)} characters and ~{bits:.0f} bits of "
                         f"estimated entropy; it needs >= {MIN_SECRET_CHARS} characters and "
                         f">= {MIN_SECRET_BITS:.0f} bits (e.g. python -c 'import secrets; "
                         f"print(secrets.token_hex(16))')")


@dataclass(frozen=True)
class LynxConnectorConfig:
    role: str                          # "producer" (prefill) or "consumer" (decode)
    # producer
    codec: str = "lynx"                # codec used when a request names none
    peer: str | None = None            # decode receiver "host:port" when a request names none
    # emulated link rate (benchmarks): tcp: the sender paces (set it on the prefill instance);
    # mooncake / lmcache: the receiver paces its reads (set it on the decode instance)
    gbps: float | None = None
    # Cast the KV to this dtype before encoding ("bfloat16" / "float16"; None: the cache's).
    # For engines that compute in float32 but whose deployments hold 16-bit KV (the CPU demo):
    # the codecs' page scalars and sink tokens are stored in the KV dtype.
    wire_dtype: str | None = None
    # tcp: TCP connections to each decode receiver (one reader thread each on the decode side;
    # on the H100's host two moved 25.0 Gbit/s against 20.7 for one: docs/benchmarks.md)
    num_connections: int = 1
    # consumer
    host: str = "127.0.0.1"            # receiver listen address (loopback unless configured)
    port: int = 0                      # receiver port; tensor-parallel rank r listens on port + r
    max_drafts: int = 64               # drafts per request before it waits for the residual
    residual_timeout_s: float = 30.0   # residual not complete this long after the anchor: recompute
    transfer_timeout_s: float = 600.0  # whole transfer (first frame or request to residual)
    sender_grace_s: float = 10.0       # a transfer whose sender has had no connection this long
                                       # fails and recomputes (its prefill died); tcp, mooncake
    num_decode_threads: int = 1        # receiver threads verifying and handing on pages
    # Dequantize residual pages only once the whole residual is in, so drafting on the anchor
    # does not share the host's CPU (and the GIL) with residual decoding (docs/demo.md).
    defer_residual: bool = True
    # A split-stream request (lynx) is scheduled once its anchor is expected within this long,
    # at the rate its pages have come; its first forward then waits for each layer's anchor
    # before reading it (at most 4x this long): that token is a draft, verified like all, so
    # this overlaps the first decode step with the anchor's last layers. 0: only once the
    # whole anchor is in (docs/demo.md, 2026-11-28).
    early_start_s: float = 0.05
    # both
    secret: str | None = None          # shared secret authenticating the peers (check_secret)
    # "tcp": the embedded split-stream transport; "mooncake": the Mooncake transfer engine
    # moves the pages (the decode side reads every anchor before any residual) and a control
    # connection to host:port (the same peer / port settings) says where they lie
    transport: str = "tcp"
    mooncake_protocol: str = "tcp"     # "tcp", "rdma", or "ascend" (the engine's NPU build)
    mooncake_host: str = "127.0.0.1"   # IP address this instance's engine serves on; the
                                       # prefill's must be the one its connections come from
    mooncake_device: str = ""          # RDMA NICs / NPU devices, comma separated; "" = all
    # "lmcache": the pages are LMCache objects in a directory both instances share (the
    # decode side reads every anchor before any residual; its port names its objects)
    lmcache_dir: str | None = None     # the shared L2 directory (required for lmcache)
    lmcache_l1_mb: int = 256           # this instance's LMCache L1 (host memory)
    # The model's Lynx plan, as `lynx calibrate` writes it: Lynx codec parameters, e.g.
    # {"layer_anchor_bits": [[18, 5, 4]], "v_chunk_size": 64, "layer_v_chunk_size": [[3, 32]]}
    # (docs/deploy.md), given to every Lynx codec. Both instances need the same plan: the
    # handshake refuses a difference.
    lynx_plan: dict | None = None

    def __post_init__(self):
        if self.role not in ROLES.values():
            raise ValueError(f"{self.role=} must be one of {sorted(ROLES.values())}")
        check_codec("codec", self.codec)
        if self.peer is not None:
            parse_peer(self.peer)
        if self.wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"{self.wire_dtype=} must be one of {list(WIRE_DTYPES)}")
        if self.gbps is not None:
            check_number("gbps", self.gbps, 0, 1e5, low_open=True)
        check_host("host", self.host)
        check_number("port", self.port, 0, 65535, integer=True)
        # vLLM verifies at most 128 spec tokens per step; keep headroom for its padding.
        check_number("max_drafts", self.max_drafts, 0, 120, integer=True)
        check_number("residual_timeout_s", self.residual_timeout_s, 0, 3600, low_open=True)
        check_number("transfer_timeout_s", self.transfer_timeout_s, 0, 86400, low_open=True)
        check_number("sender_grace_s", self.sender_grace_s, 0, 3600, low_open=True)
        check_number("num_decode_threads", self.num_decode_threads, 1, 64, integer=True)
        check_number("num_connections", self.num_connections, 1, 16, integer=True)
        if not isinstance(self.defer_residual, bool):
            raise ValueError(f"{self.defer_residual=} must be a bool")
        check_number("early_start_s", self.early_start_s, 0, 10)
        if self.secret is not None:
            check_secret(self.secret)
        if self.transport not in TRANSPORTS:
            raise ValueError(f"{self.transport=} must be one of {list(TRANSPORTS)}")
        if self.lynx_plan is not None:
            object.__setattr__(self, "lynx_plan", check_lynx_plan(self.lynx_plan))
        self.mooncake_config()  # checks mooncake_host, mooncake_protocol, mooncake_device
        if self.gbps is not None and self.transport == "mooncake" and self.role == "producer":
            raise ValueError(f"gbps={self.gbps!r} on the prefill instance: over Mooncake the "
                             f"decode instance reads the pages, set gbps there")
        if self.transport == "lmcache":
            self.lmcache_config()  # checks lmcache_dir, lmcache_l1_mb
            if self.gbps is not None and self.role == "producer":
                raise ValueError(f"gbps={self.gbps!r} on the prefill instance: over LMCache the "
                                 f"decode instance reads the objects, set gbps there")
            if self.role == "consumer" and self.port == 0:
                raise ValueError("port=0 with transport='lmcache': the decode instance's port "
                                 "names its LMCache objects, give the one in the prefill's peer")
            if self.role == "producer":
                try:
                    check_sizable(serde_for(self.codec_for(self.codec)))
                except ValueError as e:
                    raise ValueError(f"codec={self.codec!r} with transport='lmcache': {e}") from None

    def mooncake_config(self) -> MooncakeConfig:
        """This instance's Mooncake engine settings (the receiver's reads paced at gbps)."""
        try:
            return MooncakeConfig(host=self.mooncake_host, protocol=self.mooncake_protocol,
                                  device_name=self.mooncake_device,
                                  gbps=self.gbps if self.role == "consumer" else None)
        except ValueError as e:
            raise ValueError(str(e).replace("self.host", "mooncake_host").replace(
                "self.protocol", "mooncake_protocol").replace(
                "self.device_name", "mooncake_device")) from None

    def lmcache_config(self) -> LMCacheConfig:
        """This instance's LMCache store settings (the receiver's reads paced at gbps)."""
        if self.lmcache_dir is None:
            raise ValueError("transport='lmcache' needs lmcache_dir: the L2 directory the "
                             "prefill and decode instances share")
        try:
            return LMCacheConfig(directory=self.lmcache_dir, l1_mb=self.lmcache_l1_mb,
                                 gbps=self.gbps if self.role == "consumer" else None)
        except ValueError as e:
            raise ValueError(str(e).replace("directory=", "lmcache_dir=").replace(
                "l1_mb=", "lmcache_l1_mb=")) from None

    @classmethod
    def from_vllm(cls, kv_role: str, extra: dict | None) -> "LynxConnectorConfig":
        if kv_role not in ROLES:
            raise ValueError(f"{kv_role=} must be one of {sorted(ROLES)} for the Lynx connector")
        if extra is not None and not isinstance(extra, dict):
            raise ValueError(f"kv_connector_extra_config must be a dict, got "
                             f"{type(extra).__name__}")
        extra = dict(extra or {})
        unknown = (set(extra) - _fields(cls)) | ({"role"} & set(extra))
        if unknown:
            raise ValueError(f"unknown kv_connector_extra_config keys for the Lynx connector: "
                             f"{sorted(unknown, key=str)}; known: "
                             f"{sorted(_fields(cls) - {'role'})}")
        for name in _bool_fields(cls):
            if name in extra:
                extra[name] = parse_bool(name, extra[name])
        return cls(role=ROLES[kv_role], **extra)

    def codec_for(self, name: str):
        """Codec ``name`` as this instance uses it: a Lynx codec with the model's plan."""
        if self.lynx_plan and set(self.lynx_plan) <= parameter_names(name):
            return get_codec(name, **self.lynx_plan)
        return get_codec(name)

    @property
    def secret_bytes(self) -> bytes | None:
        return self.secret.encode() if self.secret is not None else None


@dataclass(frozen=True)
class TransferParams:
    """The ``kv_transfer_params["lynx"]`` of one request."""

    transfer_id: int                  # shared by the prefill and the decode request (< 2**63)
    codec: str | None = None          # producer: overrides the configured codec
    peer: str | None = None           # producer: overrides the configured decode receiver
    drop_residual: bool = False       # producer fault injection: never send the residual stream
    withhold_layers: int = 0          # producer fault injection: never send the last N layers
    fail_layer: int | None = None     # producer fault injection: encoding layer N fails
    max_drafts: int | None = None     # consumer: lower the instance's draft cap for this request

    def __post_init__(self):
        if (not isinstance(self.transfer_id, int) or isinstance(self.transfer_id, bool)
                or not 0 < self.transfer_id < 2**63):
            raise ValueError(f"{self.transfer_id=} must be an int in [1, 2**63)")
        if self.peer is not None:
            parse_peer(self.peer)
        if self.codec is not None:
            check_codec("codec", self.codec)
        if not isinstance(self.drop_residual, bool):
            raise ValueError(f"{self.drop_residual=} must be a bool")
        check_number("withhold_layers", self.withhold_layers, 0, 1 << 16, integer=True)
        if self.fail_layer is not None:
            check_number("fail_layer", self.fail_layer, 0, 1 << 16, integer=True)
        if self.max_drafts is not None:
            check_number("max_drafts", self.max_drafts, 0, 120, integer=True)

    @classmethod
    def from_request(cls, kv_transfer_params: dict | None) -> "TransferParams | None":
        """None when the request carries no Lynx parameters (it is then served locally)."""
        if kv_transfer_params is None:
            return None
        if not isinstance(kv_transfer_params, dict):
            raise ValueError(f"kv_transfer_params must be a dict, got "
                             f"{type(kv_transfer_params).__name__}")
        if PARAMS_KEY not in kv_transfer_params:
            return None
        raw = kv_transfer_params[PARAMS_KEY]
        if not isinstance(raw, dict):
            raise ValueError(f"kv_transfer_params[{PARAMS_KEY!r}] must be a dict, got "
                             f"{type(raw).__name__} {raw!r:.60}")
        unknown = set(raw) - _fields(cls)
        if unknown:
            raise ValueError(f"unknown kv_transfer_params[{PARAMS_KEY!r}] keys "
                             f"{sorted(unknown, key=str)}; known: {sorted(_fields(cls))}")
        if "transfer_id" not in raw:
            raise ValueError(f"kv_transfer_params[{PARAMS_KEY!r}] needs a transfer_id")
        raw = {k: parse_bool(k, v) if k in _bool_fields(cls) else v for k, v in raw.items()}
        return cls(**raw)

    def to_dict(self) -> dict:
        return {PARAMS_KEY: {k: v for k, v in dataclasses.asdict(self).items()
                             if v is not None and v is not False}}

    def key(self, prompt_token_ids) -> int:
        """The id this request's KV travels under: the transfer id bound to the prompt.

        One client request can become several engine requests carrying the same
        ``kv_transfer_params``: a list of prompts (``/v1/completions``) gives one per prompt,
        ``n > 1`` one per sample. Keyed by the transfer id alone, prompt B's request would
        load prompt A's KV (or none, and decode on whatever its blocks held). Keyed by (id,
        prompt tokens), each prompt pairs with its own transfer on both instances, samples of
        one prompt share one, and KV of another prompt can never be taken for this one."""
        if prompt_token_ids is None:   # prompt embeddings: no tokens to bind to
            return self.transfer_id
        h = hashlib.blake2b(self.transfer_id.to_bytes(8, "little"), digest_size=8)
        h.update(len(prompt_token_ids).to_bytes(8, "little"))
        tokens = array.array("i", prompt_token_ids)   # int32: a 32K-token prompt in ~1 ms
        if tokens.itemsize != 4:
            raise RuntimeError("array('i') is not 32-bit here")
        h.update(tokens.tobytes())   # little-endian on every host vLLM runs on
        return int.from_bytes(h.digest(), "little") >> 1 or 1   # in [1, 2**63)
