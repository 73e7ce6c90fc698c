"""Configuration of the Lynx KV connector, read from vLLM's ``kv_connector_extra_config``, and
the per-request ``kv_transfer_params`` a proxy attaches to each request.

Pure Python (no vLLM import), so it can be validated and tested on its own.

    --kv-transfer-config '{"kv_connector": "LynxConnector",
        "kv_connector_module_path": "lynx_npu.integration.vllm_ascend.connector",
        "kv_role": "kv_consumer", "kv_connector_extra_config": {"port": 17100}}'

Per request (``SamplingParams.extra_args["kv_transfer_params"]`` or the OpenAI API's
``kv_transfer_params`` field): ``{"lynx": {"transfer_id": 42}}`` on both instances, plus
optionally ``"codec"`` / ``"peer"`` on the prefill instance.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

ROLES = {"kv_producer": "producer", "kv_consumer": "consumer"}
PARAMS_KEY = "lynx"
WIRE_DTYPES = (None, "bfloat16", "float16")


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def parse_peer(peer: str) -> tuple[str, int]:
    """``"host:port"`` -> (host, port)."""
    if not isinstance(peer, str) or ":" not in peer:
        raise ValueError(f"{peer=} must be 'host:port'")
    host, _, port = peer.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{peer=} must be 'host:port' with a port in [1, 65535]")
    return host, int(port)


@dataclass(frozen=True)
class LynxConnectorConfig:
    role: str                          # "producer" (prefill) or "consumer" (decode)
    # producer
    codec: str = "lynx"                # codec used when a request names none
    peer: str | None = None            # decode receiver "host:port" when a request names none
    gbps: float | None = None          # emulated link rate of the sender; None = unlimited
    precompress: bool = False          # encode every layer before the first byte is sent
    # Cast the KV to this dtype before encoding ("bfloat16" / "float16"; None: the cache's).
    # For engines that compute in float32 but whose deployments hold 16-bit KV (the CPU demo):
    # the codecs' page scalars and sink tokens are stored in the KV dtype.
    wire_dtype: str | None = None
    # consumer
    host: str = "127.0.0.1"            # receiver listen address (loopback unless configured)
    port: int = 0                      # receiver port; tensor-parallel rank r listens on port + r
    max_drafts: int = 64               # drafts per request before it waits for the residual
    residual_timeout_s: float = 30.0   # residual not complete this long after the anchor: recompute
    transfer_timeout_s: float = 600.0  # whole transfer (first frame or request to residual)
    num_decode_threads: int = 1        # receiver threads dequantizing pages
    fast_decode: bool = True           # Lynx pages through lynx_npu.ops, not the reference
    # Dequantize residual pages only once the whole residual is in, so drafting on the anchor
    # does not share the host's CPU (and the GIL) with residual decoding (docs/demo.md).
    defer_residual: bool = True
    # both
    secret: str | None = None          # shared secret (>= 16 chars) authenticating the peers

    def __post_init__(self):
        if self.role not in ROLES.values():
            raise ValueError(f"{self.role=} must be one of {sorted(ROLES.values())}")
        if not isinstance(self.codec, str) or not self.codec:
            raise ValueError(f"{self.codec=} must be a codec name")
        if self.peer is not None:
            parse_peer(self.peer)
        if self.wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"{self.wire_dtype=} must be one of {list(WIRE_DTYPES)}")
        if self.gbps is not None and not (isinstance(self.gbps, (int, float))
                                          and math.isfinite(self.gbps) and self.gbps > 0):
            raise ValueError(f"{self.gbps=} must be a positive number or None")
        if not isinstance(self.port, int) or not 0 <= self.port < 65536:
            raise ValueError(f"{self.port=} must be a TCP port in [0, 65535]")
        if not isinstance(self.max_drafts, int) or not 0 <= self.max_drafts <= 120:
            # vLLM verifies at most 128 spec tokens per step; keep headroom for its padding.
            raise ValueError(f"{self.max_drafts=} must be an int in [0, 120]")
        for name in ("residual_timeout_s", "transfer_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name}={value!r} must be > 0")
        if not isinstance(self.num_decode_threads, int) or self.num_decode_threads < 1:
            raise ValueError(f"{self.num_decode_threads=} must be an int >= 1")
        if self.secret is not None and (not isinstance(self.secret, str) or len(self.secret) < 16):
            raise ValueError("secret must be a string of at least 16 characters")

    @classmethod
    def from_vllm(cls, kv_role: str, extra: dict | None) -> "LynxConnectorConfig":
        if kv_role not in ROLES:
            raise ValueError(f"{kv_role=} must be one of {sorted(ROLES)} for the Lynx connector")
        extra = dict(extra or {})
        unknown = (set(extra) - _fields(cls)) | ({"role"} & set(extra))
        if unknown:
            raise ValueError(f"unknown kv_connector_extra_config keys for the Lynx connector: "
                             f"{sorted(unknown)}; known: {sorted(_fields(cls) - {'role'})}")
        return cls(role=ROLES[kv_role], **extra)

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
    max_drafts: int | None = None     # consumer: lower the instance's draft cap for this request

    def __post_init__(self):
        if (not isinstance(self.transfer_id, int) or isinstance(self.transfer_id, bool)
                or not 0 < self.transfer_id < 2**63):
            raise ValueError(f"{self.transfer_id=} must be an int in [1, 2**63)")
        if self.peer is not None:
            parse_peer(self.peer)
        if self.codec is not None and (not isinstance(self.codec, str) or not self.codec):
            raise ValueError(f"{self.codec=} must be a codec name")
        if not isinstance(self.drop_residual, bool):
            raise ValueError(f"{self.drop_residual=} must be a bool")
        if self.max_drafts is not None and (not isinstance(self.max_drafts, int)
                                            or not 0 <= self.max_drafts <= 120):
            raise ValueError(f"{self.max_drafts=} must be an int in [0, 120] or None")

    @classmethod
    def from_request(cls, kv_transfer_params: dict | None) -> "TransferParams | None":
        """None when the request carries no Lynx parameters (it is then served locally)."""
        if not kv_transfer_params or PARAMS_KEY not in kv_transfer_params:
            return None
        raw = kv_transfer_params[PARAMS_KEY]
        if not isinstance(raw, dict):
            raise ValueError(f"kv_transfer_params[{PARAMS_KEY!r}] must be a dict, got {raw!r}")
        unknown = set(raw) - _fields(cls)
        if unknown:
            raise ValueError(f"unknown kv_transfer_params[{PARAMS_KEY!r}] keys {sorted(unknown)}; "
                             f"known: {sorted(_fields(cls))}")
        if "transfer_id" not in raw:
            raise ValueError(f"kv_transfer_params[{PARAMS_KEY!r}] needs a transfer_id")
        return cls(**raw)

    def to_dict(self) -> dict:
        return {PARAMS_KEY: {k: v for k, v in dataclasses.asdict(self).items()
                             if v is not None and v is not False}}
