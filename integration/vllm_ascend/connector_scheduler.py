"""The Lynx connector's scheduler half: decides what each worker saves or loads, and records what
the workers report for the Lynx scheduler (decode_state.py) to act on.

Producer (prefill): when a request's prompt completes in a step, its blocks are named in that
step's metadata so the workers send the KV of all but the last prompt token (the decode
instance recomputes that one, as vLLM does after any full-prompt KV load).

Consumer (decode): a request with ``kv_transfer_params["lynx"]`` is an asynchronous KV load of
``num_prompt_tokens - 1`` tokens; it leaves WAITING_FOR_REMOTE_KVS when the anchor is in its
blocks. The refine and a lost residual arrive later through the workers' metadata.
"""
from __future__ import annotations

import collections
import dataclasses

from .config import LynxConnectorConfig, TransferParams
from .decode_state import LynxDecodeRequest, new_decode_request
from .messages import LoadJob, LynxConnectorMeta, LynxWorkerMeta, SaveJob
from .stats import LynxStats
from .vllm_compat import RequestBlocks, failed_recving, get_logger, grammar_draft_refusal

log = get_logger(__name__)


def _params(request) -> TransferParams | None:
    try:
        return TransferParams.from_request(request.kv_transfer_params)
    except ValueError as e:  # a bad request must not take the engine down: serve it locally
        log.error("Lynx: request %s has invalid kv_transfer_params (%s); serving it without "
                  "a KV transfer", request.request_id, e)
        return None


def _wants_prompt_logprobs(request) -> bool:
    return getattr(request.sampling_params, "prompt_logprobs", None) is not None


def _is_structured(request) -> bool:
    """The request's output follows a grammar (``response_format``, ``structured_outputs``)."""
    return getattr(request.sampling_params, "structured_outputs", None) is not None


class ConnectorScheduler:
    def __init__(self, config: LynxConnectorConfig, world_size: int, reasoning_parser: str = ""):
        self.config, self.world_size = config, world_size
        self.reasoning_parser = reasoning_parser  # the server's ("" if none): no grammar drafts
        self.blocks = RequestBlocks()  # block ids of each request (producer)
        # producer
        self._to_save: dict[str, tuple[object, TransferParams]] = {}
        # keys being saved or sent lately: the samples of one prompt (n > 1) send its KV once
        self._saving: collections.OrderedDict[int, None] = collections.OrderedDict()
        # consumer
        self.decode: dict[str, LynxDecodeRequest] = {}
        self._loads: list[LoadJob] = []
        self._load_blocks: dict[str, tuple[int, ...]] = {}  # blocks of each requested load
        self._releases: list[str] = []
        self._discards: list[int] = []   # transfer keys no request will load
        self.stats = LynxStats()  # this interval's counters, taken by vLLM every step

    # -- both -------------------------------------------------------------------------------
    def on_new_request(self, request) -> None:
        params = _params(request)
        if params is None:
            return
        key = params.key(request.prompt_token_ids)
        if self.config.role == "producer":
            if key in self._saving:
                log.debug("Lynx: request %s: transfer %d's prompt is sent already (another "
                          "sample of it)", request.request_id, params.transfer_id)
                return
            self._saving[key] = None
            while len(self._saving) > 4096:
                self._saving.popitem(last=False)
            self._to_save[request.request_id] = (request, dataclasses.replace(
                params, transfer_id=key))
            self.blocks.follow(request.request_id)
        else:
            cap = self.config.max_drafts
            if params.max_drafts is not None:
                cap = min(cap, params.max_drafts)
            refusal = (grammar_draft_refusal(request, self.reasoning_parser)
                       if _is_structured(request) else None)
            if refusal is not None and cap > 0:
                # The Lynx scheduler drafts under a grammar by advancing it itself and rolling
                # it back before verification (vllm_compat); where that cannot be done, the
                # request starts on the full-precision KV instead, without drafts.
                log.info("Lynx: request %s decodes without drafts: %s", request.request_id,
                         refusal)
                cap = 0
            self.decode[request.request_id] = new_decode_request(
                request.request_id, params.transfer_id, key, self.world_size, cap)

    def build_meta(self, scheduler_output) -> LynxConnectorMeta:
        meta = LynxConnectorMeta()
        if self.config.role == "producer":
            self.blocks.observe(scheduler_output)
            meta.saves = self._completed_prompts(scheduler_output)
        meta.loads, self._loads = self._loads, []
        meta.releases, self._releases = self._releases, []
        meta.discards, self._discards = self._discards, []
        meta.scheduled_early = [rid for rid in scheduler_output.num_scheduled_tokens
                                if (lr := self.decode.get(rid)) is not None
                                and lr.loaded is not None and lr.loaded.early]
        return meta

    def request_finished(self, request) -> tuple[bool, dict | None]:
        rid = request.request_id
        self._to_save.pop(rid, None)
        self.blocks.forget(rid)
        self._load_blocks.pop(rid, None)
        lr = self.decode.pop(rid, None)
        if lr is None:
            return False, None
        if lr.load_requested:
            self._releases.append(rid)
        elif all(other.transfer_key != lr.transfer_key for other in self.decode.values()):
            self._discards.append(lr.transfer_key)   # (samples of its prompt may still load it)
        return False, {"lynx": lr.stats()}

    # -- producer ------------------------------------------------------------------------------
    def _completed_prompts(self, scheduler_output) -> list[SaveJob]:
        jobs = []
        computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        for rid, before in computed.items():
            entry = self._to_save.get(rid)
            if entry is None:
                continue
            request, params = entry
            prompt = request.num_prompt_tokens
            if before + scheduler_output.num_scheduled_tokens.get(rid, 0) < prompt:
                continue  # the prompt is not complete after this step yet
            del self._to_save[rid]
            block_ids = self.blocks.get(rid)
            self.blocks.forget(rid)
            if prompt < 2:
                continue  # nothing to send: the decode side recomputes the last token
            jobs.append(SaveJob(rid, params, tuple(block_ids), prompt - 1))
        return jobs

    # -- consumer ------------------------------------------------------------------------------
    def num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        lr = self.decode.get(request.request_id)
        num_tokens = request.num_prompt_tokens - 1
        if lr is not None and lr.lost is None and _wants_prompt_logprobs(request):
            # Prompt logprobs come from the prompt's forward, which a load skips: vLLM 0.32
            # refuses the load for them (its transfer then lay in the inbox for good), 0.23
            # loads it and its scheduler asserts (EngineDeadError): compute the prompt here.
            lr.lost = "prompt logprobs need the prompt computed on this instance"
            lr.drafts.on_residual_lost()
            log.info("Lynx: request %s: %s; its transfer is dropped", request.request_id,
                     lr.lost)
        if (lr is None or lr.load_requested or num_computed_tokens != 0 or num_tokens < 1
                or lr.lost is not None):
            return 0, False
        return num_tokens, True

    def after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        lr = self.decode.get(request.request_id)
        if lr is None or num_external_tokens == 0:
            return
        (block_ids,) = blocks.get_block_ids()
        lr.load_requested = True
        self._load_blocks[request.request_id] = tuple(block_ids)
        self._loads.append(LoadJob(request.request_id, lr.transfer_key, tuple(block_ids),
                                   num_external_tokens, wait_full=lr.drafts.max_drafts == 0))

    def on_worker_output(self, output) -> None:
        meta = getattr(output, "kv_connector_worker_meta", None)
        if isinstance(meta, LynxWorkerMeta):
            for rid, rep in meta.loaded.items():
                if rid in self.decode:
                    self.decode[rid].on_load_report(rep)
            for rid, rep in meta.refined.items():
                if rid in self.decode:
                    self.decode[rid].on_refine_report(rep)
            for rid, why in meta.lost.items():
                if rid in self.decode and self.decode[rid].lost is None:
                    self.decode[rid].lost = why
        for rid in failed_recving(output, self._load_blocks):
            lr = self.decode.get(rid)
            if lr is not None:  # vLLM recomputes the prompt locally (kv_load_failure_policy)
                lr.lost = lr.lost or "the KV transfer failed before the anchor arrived"
                lr.drafts.on_residual_lost()

    def release(self, req_id: str) -> None:
        """The request no longer uses transferred KV (recompute or preemption)."""
        self._releases.append(req_id)
