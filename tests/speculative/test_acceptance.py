import pytest
import torch

from lynx_npu.speculative import Verdict, accept_greedy, accept_sample


def test_greedy_accepts_the_agreeing_prefix():
    assert accept_greedy([5, 6, 7], [5, 6, 9, 1]) == Verdict(2, 9)
    assert accept_greedy([5, 6, 7], [5, 6, 7, 1]) == Verdict(3, 1)  # bonus token
    assert accept_greedy([], [4]) == Verdict(0, 4)
    assert accept_greedy([3], [4, 8]).emitted([3]) == [4]


def test_greedy_rejects_a_wrong_target_count():
    with pytest.raises(ValueError, match="target tokens"):
        accept_greedy([1, 2], [1, 2])


def test_sampling_is_exactly_the_target_distribution():
    """The first emitted token is distributed as p whatever the draft: chi-square test."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    probs = torch.stack([p, torch.full((4,), 0.25)])
    g = torch.Generator().manual_seed(0)
    n = 6000
    for draft in (0, 3):  # a likely and an unlikely draft
        counts = torch.zeros(4)
        for _ in range(n):
            v = accept_sample([draft], probs, g)
            first = draft if v.num_accepted == 1 else v.next_token
            counts[first] += 1
        expected = p * n
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < 16.3, (draft, counts)  # 3 dof, p = 0.001


def test_sampling_accepts_certain_drafts_and_checks_shapes():
    probs = torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    assert accept_sample([1, 1], probs) == Verdict(2, 0)
    with pytest.raises(ValueError, match="target_probs"):
        accept_sample([1], probs)
