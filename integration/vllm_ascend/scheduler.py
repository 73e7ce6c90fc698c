"""LynxScheduler: the decode instance's scheduler, vLLM's own plus speculative decoding on the
anchor (``scheduler_cls="lynx_npu.integration.vllm_ascend.scheduler.LynxScheduler"``).

Per Lynx request (DESIGN §6, §8; draft bookkeeping: lynx_npu.speculative.DraftState):

* anchor in the cache -> DRAFTING: every sampled token is appended to the request as usual (so
  the model runner stays in step) but withheld from the client; a draft that meets a stop
  condition is undone and the request parks; at ``max_drafts`` it parks
  (``next_decode_eligible_step``) until the residual is in. Under a grammar (structured output)
  each draft also advances the request's grammar, so the next draft is sampled under its mask.
* residual in the cache -> VERIFY: at the top of ``schedule()`` the drafts move from the output
  into ``spec_token_ids`` and the request rewinds to its last prompt token (and its grammar to
  before the drafts), so the next step runs [last prompt token, d_1..d_t] on the refined cache;
  vLLM's rejection sampler keeps the longest prefix the target agrees with (under the grammar's
  mask at each position) plus one corrected (or bonus) token, and rolls the rest back.
* residual lost, or preempted while drafting -> RECOMPUTE: drafts dropped, blocks freed, the
  prompt recomputed locally (exact, slow, never a hang).

Greedy output is token for token the output of decoding from the full-precision cache; with
temperature > 0 the rejection sampler applies the exact rule of DESIGN §6 (drafts as
deterministic proposals).
"""
from __future__ import annotations

import time

from lynx_npu.speculative import Phase, Verdict

from .connector import LynxConnector
from .decode_state import LynxDecodeRequest
from .vllm_compat import (Scheduler, check_stop, drop_output_tokens, ensure_grammar_rows,
                          get_logger, grammar_accept_draft, grammar_rollback,
                          hide_from_spec_metrics, is_running, park, set_verify, undo_stop,
                          unpark)

log = get_logger(__name__)

PROPOSER = "lynx_npu.integration.vllm_ascend.proposer.NullProposer"


class LynxScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.connector, LynxConnector) or self.connector.config.role != "consumer":
            raise ValueError("LynxScheduler needs kv_transfer_config with kv_connector="
                             "'LynxConnector' and kv_role='kv_consumer'")
        spec = self.vllm_config.speculative_config
        if spec is None or spec.method != "custom_class" or spec.model != PROPOSER \
                or self.num_spec_tokens != 1:
            raise ValueError(f"LynxScheduler needs speculative_config={{'method': "
                             f"'custom_class', 'model': '{PROPOSER}', "
                             f"'num_speculative_tokens': 1}}; got {spec}")
        self.lynx = self.connector.scheduler_half

    # -- the protocol --------------------------------------------------------------------------
    def schedule(self, *args, **kwargs):
        for req_id, lr in list(self.lynx.decode.items()):
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            if lr.loaded is not None and lr.phase is Phase.WAITING_ANCHOR:
                lr.start_decoding()
            if lr.phase is not Phase.DRAFTING:
                continue
            if lr.lost is not None:
                self._recompute(request, lr)
            elif lr.residual_in_cache:
                self._start_verify(request, lr)
            elif lr.stop_parked or not lr.drafts.can_draft():
                park(request, self.current_step)
        return super().schedule(*args, **kwargs)

    def _start_verify(self, request, lr: LynxDecodeRequest) -> None:
        if not lr.drafts.drafts:
            lr.start_decoding_exact()  # refined before the first draft: nothing to verify
            return
        if not is_running(request):
            return  # drafts exist only for running requests; wait until it is scheduled again
        drafts = drop_output_tokens(request, self.hash_block_size)
        if drafts != lr.drafts.drafts:
            raise RuntimeError(f"Lynx: request {request.request_id} holds output {drafts}, "
                               f"its draft state {lr.drafts.drafts}")
        self._rewind_grammar(request, lr)
        lr.drafts.on_residual_ready()
        hide_from_spec_metrics(request)
        set_verify(request, drafts)
        unpark(request)
        lr.stop_parked = False

    def _recompute(self, request, lr: LynxDecodeRequest) -> None:
        if not is_running(request):
            return  # loaded but not yet scheduled: act once it runs
        if request.request_id in getattr(self, "prev_step_scheduled_req_ids", ()):
            # vLLM (0.23) asserts that a request resumed in a step did not run in the step
            # before; one lost in the forward that ran it (an early start whose anchor
            # stalled) sits this step out first.
            park(request, self.current_step)
            return
        log.warning("Lynx: recomputing request %s locally (%s)", request.request_id, lr.lost)
        drop_output_tokens(request, self.hash_block_size)
        self._rewind_grammar(request, lr)
        lr.drafts.on_residual_lost()
        self.lynx.stats.record_recompute()
        unpark(request)
        self.running.remove(request)
        self._preempt_request(request, time.monotonic())
        self.lynx.release(request.request_id)

    @staticmethod
    def _rewind_grammar(request, lr: LynxDecodeRequest) -> None:
        """The drafts left the output: so do they the request's grammar."""
        grammar_rollback(request, lr.grammar_steps)
        lr.grammar_steps = 0

    def _draft_under_grammar(self, request, lr: LynxDecodeRequest, token: int) -> bool:
        """Advance a structured-output request's grammar by a draft; False if the grammar
        rejected it (never under its own mask): the request then recomputes, exact."""
        if not request.use_structured_output:
            return True
        step = grammar_accept_draft(request, token)
        if step is None:
            lr.lost = lr.lost or f"its grammar rejected draft token {token}"
            return False
        lr.grammar_steps += step
        return True

    # -- vLLM hooks ----------------------------------------------------------------------------
    def get_grammar_bitmask(self, scheduler_output):
        if scheduler_output.has_structured_output_requests:
            spec = scheduler_output.scheduled_spec_decode_tokens
            ensure_grammar_rows(self.structured_output_manager, sum(
                1 + len(spec.get(rid, ())) for rid in scheduler_output.num_scheduled_tokens
                if (r := self.requests.get(rid)) is not None and r.use_structured_output))
        return super().get_grammar_bitmask(scheduler_output)

    def _update_request_with_output(self, request, new_token_ids, is_stale=False):
        lr = self.lynx.decode.get(request.request_id)
        if lr is None:
            return super()._update_request_with_output(request, new_token_ids, is_stale)
        now = time.monotonic()
        if lr.phase is Phase.DRAFTING:
            for token in new_token_ids:
                # The step ran, so the runner already holds the token: keep it in step.
                request.append_output_token_ids(token)
                lr.drafts.add_draft(token)
                lr.draft_times.append(now)
                if not self._draft_under_grammar(request, lr, token):
                    park(request, self.current_step)  # recomputed at the next schedule()
                    break
                if check_stop(request, self.max_model_len):
                    undo_stop(request)  # re-checked on the verified tokens
                    lr.stop_parked = True
                    break
            return [], False  # drafts never reach the client
        times = [now] * len(new_token_ids)
        if lr.phase is Phase.VERIFY:
            verdict = Verdict(len(new_token_ids) - 1, int(new_token_ids[-1]))
            drafts = list(lr.drafts.drafts)
            emitted = lr.drafts.verify(verdict)
            if emitted != list(new_token_ids):
                raise RuntimeError(f"Lynx: verifier output {list(new_token_ids)} is not a "
                                   f"prefix of the drafts {drafts} plus one token")
            lr.verified_at = now
            times = lr.draft_times[:verdict.num_accepted] + [now]
        out, stopped = super()._update_request_with_output(request, new_token_ids, is_stale)
        lr.token_times += times[:len(out)]
        return out, stopped

    def make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens,
                                 num_accepted_tokens, num_invalid_spec_tokens, request_id):
        # A Lynx verification checks up to max_drafts tokens in one step; vLLM's stats are
        # sized for num_speculative_tokens=1 and assert on more (stats.py): count it as ours.
        lr = self.lynx.decode.get(request_id)
        if lr is not None and lr.phase is Phase.VERIFY:
            self.lynx.stats.record_verification(num_draft_tokens, num_accepted_tokens)
            return spec_decoding_stats
        return super().make_spec_decoding_stats(spec_decoding_stats, num_draft_tokens,
                                                num_accepted_tokens, num_invalid_spec_tokens,
                                                request_id)

    def update_draft_token_ids(self, draft_token_ids) -> None:
        # The null proposer proposes nothing; keep the drafts queued for verification.
        keep = {rid: self.requests[rid].spec_token_ids for rid, lr in self.lynx.decode.items()
                if lr.phase is Phase.VERIFY and rid in self.requests}
        super().update_draft_token_ids(draft_token_ids)
        for rid, spec in keep.items():
            self.requests[rid].spec_token_ids = spec

    def _preempt_request(self, request, timestamp, drop_stale_output=False):
        lr = self.lynx.decode.get(request.request_id)
        if lr is not None and lr.phase in (Phase.DRAFTING, Phase.VERIFY):
            # The drafts' KV goes with the freed blocks; the resumed request recomputes its
            # prompt locally and decodes exactly.
            log.info("Lynx: request %s preempted while drafting: drafts dropped",
                     request.request_id)
            drop_output_tokens(request, self.hash_block_size)
            self._rewind_grammar(request, lr)
            lr.drafts.on_residual_lost()
            lr.lost = lr.lost or "preempted while drafting"
            self.lynx.stats.record_recompute()
            self.lynx.release(request.request_id)
        super()._preempt_request(request, timestamp, drop_stale_output)
