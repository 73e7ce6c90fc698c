"""The prompts of lynx eval quality, built from files in the real data's format."""
import pytest

from lynx_npu.eval import quality_tasks as qt

from .quality_fixtures import byte_tokenizer, data_dir


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return data_dir(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


def test_needle_goes_after_a_sentence_end_at_its_depth():
    hay = "One two. Three four. Five six."
    assert qt.insert_needle(hay, "N.", 0) == "N. One two. Three four. Five six."
    assert qt.insert_needle(hay, "N.", 1) == "One two. Three four. Five six. N."
    assert qt.insert_needle(hay, "N.", 0.7) == "One two. Three four. N. Five six."
    assert qt.insert_needle(hay, "N.", 0.6) == "One two. N. Three four. Five six."
    assert qt.insert_needle("no sentence end here", "N.", 0.5) == "N. no sentence end here"
    with pytest.raises(ValueError, match="depth"):
        qt.insert_needle(hay, "N.", 1.5)


def test_ppl_windows_have_the_asked_lengths_and_continue_the_text(data, tok):
    samples = qt.ppl_samples(data / "paul_graham_essays", tok, 3, (100, 300), 20)
    ids = qt.corpus_ids(data / "paul_graham_essays", tok)
    assert [len(s.context) for s in samples] == [100, 200, 300]
    assert all(len(s.continuation) == 20 for s in samples)
    text = "".join(tok.decode(ids))
    for s in samples:
        assert tok.decode(s.context + s.continuation) in text
    with pytest.raises(ValueError, match="too few"):
        qt.ppl_samples(data / "paul_graham_essays", tok, 2, (100, 10 ** 6), 20)


def test_needle_prompts_hold_the_needle_and_its_question(data, tok):
    samples = qt.needle_samples(data / "paul_graham_essays", tok, 5, [400, 600], [0, 1])
    for i, s in enumerate(samples):
        needle, question = qt.NEEDLES[i % len(qt.NEEDLES)]
        text = tok.decode(s.prompt)
        assert s.reference == needle and needle in text and question in text
        assert abs(len(s.prompt) - [400, 600][i % 2]) <= 8  # re-tokenising may move a few tokens
    assert qt.NEEDLES[2][0] + "\n\nAnswer" in tok.decode(samples[2].prompt)  # depth 1: the end
    assert tok.decode(samples[0].prompt).startswith("<s>user\n" + qt.NEEDLES[0][0])  # depth 0
    with pytest.raises(ValueError, match="too short"):
        qt.needle_samples(data / "paul_graham_essays", tok, 1, [100], [0])


def test_qmsum_reference_is_the_first_general_querys_answer(data, tok):
    from lynx_npu.eval.model import load_qmsum

    (sample,) = qt.qmsum_samples(data / "qmsum" / "val.jsonl", tok, 1, 600)
    meeting = load_qmsum(data / "qmsum" / "val.jsonl")[int(sample.id.split()[-1])]
    assert sample.reference == meeting.general_queries[0][1]
    assert meeting.general_queries[0][0] in tok.decode(sample.prompt) and len(sample.prompt) <= 600


def test_mmlu_prompt_ends_before_the_letter_and_knows_the_answer(data, tok):
    samples = qt.mmlu_samples(data / "mmlu_pro" / "mmlu_pro_dev3000.jsonl", tok, 2, 1)
    for s in samples:
        assert tok.decode(s.prompt).endswith("The answer is (")
        assert s.option_tokens[:3] == tok("ABC")["input_ids"]
        assert 0 <= s.answer < len(s.option_tokens)
    with pytest.raises(ValueError, match="--shots 50 needs"):
        qt.mmlu_samples(data / "mmlu_pro" / "mmlu_pro_dev3000.jsonl", tok, 2, 50)
