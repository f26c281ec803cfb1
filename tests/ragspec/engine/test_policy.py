"""The cost-driven policy against a direct evaluation of its own formula."""

from __future__ import annotations

import pytest

from ragspec.engine.drafting import Draft, DraftSource
from ragspec.engine.policy import AdaptivePolicy


def test_calibrated_costs_are_interpolated() -> None:
    policy = AdaptivePolicy()
    assert policy.needs_calibration
    policy.calibrate({0: 0.05, 2: 0.10, 4: 0.08, 8: 0.09})
    assert not policy.needs_calibration
    assert policy.costs.relative(2) == pytest.approx(2.0)
    assert policy.costs.relative(3) == pytest.approx(1.8)  # between 2.0 at k=2 and 1.6 at k=4
    assert policy.costs.relative(10) == pytest.approx(1.8 + 2 * policy.prior_cost_slope)
    with pytest.raises(ValueError, match="k=0"):
        policy.calibrate({4: 0.1})


def test_choice_maximises_expected_tokens_per_cost_and_learns_to_stop() -> None:
    policy = AdaptivePolicy(max_draft=8)
    policy.calibrate({0: 0.05, 1: 0.1, 2: 0.1, 4: 0.07, 8: 0.09})
    draft = Draft(tuple(range(8)), DraftSource.PASSAGE, match_length=8)
    gains = {k: policy.expected_yield(draft, k) / policy.costs.relative(k) for k in range(1, 9)}
    best = max(gains, key=gains.get)
    assert policy.choose(draft) == (best if gains[best] > 1 + policy.margin else 0)
    for _ in range(60):  # the target keeps rejecting the first token of such drafts
        policy.record(draft.truncated(4), 0, 0.07, 0.0)
    assert policy.choose(draft) == 0
    # Other sources and match lengths keep their own statistics.
    assert policy.choose(Draft(tuple(range(8)), DraftSource.OUTPUT, match_length=8)) > 0


def test_useless_draft_model_is_only_re_tried_periodically() -> None:
    policy = AdaptivePolicy(explore_every=10)
    policy.calibrate({0: 0.05, 4: 0.07})
    tries = 0
    for _ in range(100):
        k = policy.choose_model(8)
        if k:
            tries += 1
            policy.record(Draft(tuple(range(k)), DraftSource.MODEL), 0, 0.07, 0.03 * k)
        else:
            policy.record(None, 0, 0.05, 0.0)
    assert 5 <= tries <= 15, tries


def test_choose_draft_is_the_candidate_cut_to_the_chosen_length() -> None:
    from ragspec.engine.policy import FixedPolicy, choose_draft

    candidate = Draft(tuple(range(10)), DraftSource.PASSAGE, match_length=5, reference=2)
    assert choose_draft(FixedPolicy(k=4), candidate) == candidate.truncated(4)
    assert choose_draft(FixedPolicy(k=4, min_match=6), candidate) is None  # the policy verifies none of it
    assert choose_draft(FixedPolicy(k=4), None) is None
    adaptive = AdaptivePolicy(max_draft=8)
    adaptive.calibrate({0: 0.05, 4: 0.06, 8: 0.07})
    chosen = choose_draft(adaptive, candidate)
    assert chosen is not None and len(chosen) == adaptive.choose(candidate) and chosen.reference == 2
