"""vLLM engine arguments for a Lynx prefill instance and a Lynx decode instance.

The same settings as the ``vllm serve`` flags in docs/deploy.md, as keyword arguments for
``vllm.LLM(...)`` / ``EngineArgs(...)``. Pure Python: nothing here imports vLLM.
"""
from __future__ import annotations

CONNECTOR = {"kv_connector": "LynxConnector",
             "kv_connector_module_path": "lynx_npu.integration.vllm_ascend.connector"}
SCHEDULER = "lynx_npu.integration.vllm_ascend.scheduler.LynxScheduler"
PROPOSER = "lynx_npu.integration.vllm_ascend.proposer.NullProposer"


def _plan(lynx_plan):
    """The model's Lynx plan as JSON values (kv_connector_extra_config is JSON: per-layer
    plans as lists); None: no plan. Both instances must be given the same one (the handshake
    refuses a difference)."""
    if not lynx_plan:
        return None
    return {k: [list(t) for t in v] if isinstance(v, (tuple, list)) else v
            for k, v in dict(lynx_plan).items()}


def prefill_engine_args(model: str, *, peer: str | None = None, codec: str = "lynx",
                        gbps: float | None = None, wire_dtype: str | None = None,
                        secret: str | None = None, transport: str = "tcp",
                        lmcache_dir: str | None = None, lynx_plan=None,
                        **engine) -> dict:
    """The prefill instance: stock vLLM plus the Lynx connector as KV producer. Prefix caching
    stays on (a prompt computed once is sent again for free). ``gbps``: the emulated link;
    over ``transport="mooncake"`` or ``"lmcache"`` the decode side paces its reads, so it is left
    out here (give it to ``decode_engine_args``). ``lmcache_dir``: the directory both instances
    share over ``transport="lmcache"``."""
    extra = {"codec": codec}
    if transport != "tcp":
        extra["transport"] = transport
        gbps = None
    if transport == "lmcache":
        extra["lmcache_dir"] = lmcache_dir
    for key, value in (("peer", peer), ("gbps", gbps), ("wire_dtype", wire_dtype),
                       ("secret", secret), ("lynx_plan", _plan(lynx_plan))):
        if value is not None:
            extra[key] = value
    return {"model": model,
            "kv_transfer_config": {**CONNECTOR, "kv_role": "kv_producer",
                                   "kv_connector_extra_config": extra},
            **engine}


def decode_engine_args(model: str, *, port: int, host: str = "127.0.0.1", max_drafts: int = 64,
                       residual_timeout_s: float = 30.0, transfer_timeout_s: float = 600.0,
                       secret: str | None = None, transport: str = "tcp",
                       gbps: float | None = None, lmcache_dir: str | None = None,
                       lynx_plan=None, early_start_s: float | None = None, **engine) -> dict:
    """The decode instance: the Lynx connector as KV consumer, the Lynx scheduler, the null
    proposer (which turns on vLLM's verification machinery) and no prefix caching (blocks with
    anchor-precision KV must never be shared). ``gbps`` paces the reads over
    ``transport="mooncake"`` or ``"lmcache"`` (over tcp the prefill side paces; here it is then
    unused)."""
    extra = {"host": host, "port": port, "max_drafts": max_drafts,
             "residual_timeout_s": residual_timeout_s, "transfer_timeout_s": transfer_timeout_s}
    if transport != "tcp":
        extra["transport"] = transport
        if gbps is not None:
            extra["gbps"] = gbps
    if transport == "lmcache":
        extra["lmcache_dir"] = lmcache_dir
    if secret is not None:
        extra["secret"] = secret
    if early_start_s is not None:
        extra["early_start_s"] = early_start_s
    if lynx_plan:
        extra["lynx_plan"] = _plan(lynx_plan)
    return {"model": model,
            # A transfer that fails before its anchor: vLLM recomputes the prompt locally.
            "kv_transfer_config": {**CONNECTOR, "kv_role": "kv_consumer",
                                   "kv_load_failure_policy": "recompute",
                                   "kv_connector_extra_config": extra},
            "scheduler_cls": SCHEDULER,
            "speculative_config": {"method": "custom_class", "model": PROPOSER,
                                   "num_speculative_tokens": 1},
            "enable_prefix_caching": False,
            **engine}
