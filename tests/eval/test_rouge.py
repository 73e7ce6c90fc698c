"""Rouge-L F1 on known strings."""
import pytest

from lynx_npu.eval.rouge import lcs_length, rouge_l_f, words


def test_words_are_lowercase_alphanumeric_runs():
    assert words("The cat, sat-on THE mat!  2x") == ["the", "cat", "sat", "on", "the", "mat", "2x"]


def test_lcs_of_known_sequences():
    assert lcs_length(list("ABCBDAB"), list("BDCABA")) == 4
    assert lcs_length(list("BDCABA"), list("ABCBDAB")) == 4
    assert lcs_length([], list("abc")) == 0
    assert lcs_length(list("abc"), list("xyz")) == 0


def test_rouge_l_f_on_known_strings():
    assert rouge_l_f("The cat sat on the mat.", "the cat sat on the mat") == 1.0
    # LCS "the cat on the mat" = 5 of 6 words each side: P = R = F = 5/6
    assert rouge_l_f("the cat sat on the mat", "the cat is on the mat") == pytest.approx(5 / 6)
    # candidate 2 words, both in the 4-word reference in order: P 1, R 0.5, F 2/3
    assert rouge_l_f("police killed", "police killed the gunman") == pytest.approx(2 / 3)
    # order matters: "b a" against "a b" shares only one word in sequence
    assert rouge_l_f("b a", "a b") == pytest.approx(0.5)
    assert rouge_l_f("nothing shared", "entirely different words") == 0.0
    assert rouge_l_f("", "a reference") == 0.0 and rouge_l_f("an answer", "...") == 0.0
