import pytest

from lynx_npu.speculative import DraftState, Phase, Verdict, accept_greedy


def test_lifecycle_withholds_drafts_until_verified():
    s = DraftState("r", max_drafts=3)
    assert not s.can_draft()
    s.on_anchor_ready()
    for t in (10, 11, 12):
        s.add_draft(t)
    assert not s.can_draft()  # parked at the cap
    with pytest.raises(RuntimeError, match="cannot draft"):
        s.add_draft(13)
    s.on_residual_ready()
    assert s.phase is Phase.VERIFY
    out = s.verify(accept_greedy(s.drafts, [10, 11, 99, 5]))
    assert out == [10, 11, 99]
    assert (s.stats.proposed, s.stats.accepted, s.phase) == (3, 2, Phase.EXACT)


def test_residual_before_anchor_verifies_nothing():
    s = DraftState("r")
    s.on_residual_ready()
    s.on_anchor_ready()
    assert s.phase is Phase.VERIFY and s.verify(Verdict(0, 7)) == [7]


def test_lost_residual_drops_drafts_and_preemption_too():
    s = DraftState("r")
    s.on_anchor_ready()
    s.add_draft(1)
    s.preempted()
    assert s.drafts == []
    s.add_draft(2)
    s.on_residual_lost()
    assert s.phase is Phase.RECOMPUTE and s.drafts == []


def test_bad_verdict_and_phase_errors():
    s = DraftState("r")
    with pytest.raises(RuntimeError, match="expected phase"):
        s.verify(Verdict(0, 1))
    s.on_anchor_ready()
    s.on_residual_ready()
    with pytest.raises(ValueError, match="accepts"):
        s.verify(Verdict(2, 1))
    with pytest.raises(ValueError, match="max_drafts"):
        DraftState("x", max_drafts=-1)
