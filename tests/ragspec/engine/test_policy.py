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


_FIRST_POLICY_IN_A_PROCESS = """
import json
import numpy as np
from ragspec.engine import planning
from ragspec.engine.drafting import Draft, DraftSource
from ragspec.engine.planning import Acceptance
from ragspec.engine.policy import AdaptivePolicy

def loaded():
    return {name: len(f.signatures) for name, f in vars(planning).items() if hasattr(f, "signatures")}

policy = AdaptivePolicy(max_draft=8)
fresh = policy.needs_calibration and policy.costs.measured() == {} and policy._model_token_cost is None and (
    np.array_equal(policy.acceptance.counts, Acceptance(policy.decay).counts))
before = loaded()
policy.calibrate({0: 0.05, 1: 0.06, 4: 0.07})
for source in (DraftSource.PASSAGE, DraftSource.OUTPUT):
    draft = Draft(tuple(range(6)), source, match_length=5)
    policy.record(draft.truncated(policy.choose(draft) or 1), 2, 0.07, 0.0)
policy.record(Draft((1, 2), DraftSource.MODEL), 1, 0.06, 0.01)
policy.choose(Draft(tuple(range(6)), DraftSource.PASSAGE, match_length=5))
policy.choose_model(4)
print(json.dumps({"fresh": bool(fresh), "before": before, "after": loaded()}))
"""


@pytest.mark.timeout(120)
def test_a_policy_loads_the_planning_kernels_when_made_and_forgets_doing_so() -> None:
    """numba loads a kernel's code at its first call in a process (~0.5 s): the first policy runs each kernel a
    request runs, with a request's argument types, so that none is loaded (or compiled for new types) inside a
    request; and the policy it returns has learnt nothing from that run. In a fresh process, since this one may
    have loaded the kernels already."""
    pytest.importorskip("numba")
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FIRST_POLICY_IN_A_PROCESS], capture_output=True, text=True,
                          timeout=110, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["fresh"]
    assert seen["after"] == seen["before"]
    assert seen["before"]["plan"] >= 1 and seen["before"]["plan_sources"] >= 1
