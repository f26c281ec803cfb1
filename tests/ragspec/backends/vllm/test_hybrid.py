"""The hybrid's choice rule (``ragspec.engine.planning.plan_sources``) and its draft folders, without vLLM."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ragspec.engine.planning import plan, plan_sources


def _plan(lengths, p1, q, model_caps, model_p1, model_q, model_step, slope=0.05, margin=0.03):
    rows = len(lengths)
    lengths = np.asarray(lengths, np.int64)
    kinds = np.zeros(rows, np.int64)
    cost = 1.0 + slope * np.arange(int(lengths.sum() + np.sum(model_caps)) + 1)
    model_cost = np.array([0.0] + [model_step * j for j in range(1, max(model_caps, default=0) + 1)])
    ks, from_model = np.zeros(rows, np.int64), np.zeros(rows, np.int64)
    drafted, steps = plan_sources(np.full(rows, p1), np.full(rows, q), lengths, kinds, 1, model_p1, model_q,
                                  np.asarray(model_caps, np.int64), cost, model_cost, margin, ks, from_model)
    return drafted, steps, ks.tolist(), from_model.tolist()


def test_long_likely_ngram_drafts_win_and_the_batch_pays_no_model_step() -> None:
    drafted, steps, ks, from_model = _plan([8, 8], 0.9, 0.95, [8, 8], 0.6, 0.7, model_step=0.05)
    assert steps == 0 and from_model == [0, 0] and ks == [8, 8] and drafted == 16


def test_the_model_fills_rows_without_a_match_and_only_as_many_steps_as_it_pays() -> None:
    drafted, steps, ks, from_model = _plan([8, 0], 0.9, 0.95, [8, 8], 0.8, 0.8, model_step=0.02)
    assert ks[0] == 8 and from_model == [0, 1] and 0 < ks[1] == steps <= 8 and drafted == 8 + steps


def test_a_costly_or_poor_model_is_not_run_and_a_poor_batch_drafts_nothing() -> None:
    _, steps, ks, from_model = _plan([6, 0], 0.9, 0.9, [8, 8], 0.8, 0.8, model_step=2.0)
    assert steps == 0 and from_model == [0, 0] and ks == [6, 0]
    assert _plan([0, 0], 0.9, 0.9, [8, 8], 0.02, 0.1, model_step=0.01)[:2] == (0, 0)


def test_without_a_model_it_is_plan() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        rows = int(rng.integers(1, 9))
        lengths = rng.integers(0, 9, rows)
        p1, q = float(rng.uniform(0.05, 0.95)), float(rng.uniform(0.05, 0.95))
        cost = 1.0 + rng.uniform(0.0, 0.3) * np.arange(int(lengths.sum()) + 1)
        want = np.zeros(rows, np.int64)
        plan(np.full(rows, p1), np.full(rows, q), lengths, np.zeros(rows, np.int64), 1, cost, 0.03, rows, want)
        ks, from_model = np.zeros(rows, np.int64), np.zeros(rows, np.int64)
        drafted, steps = plan_sources(np.full(rows, p1), np.full(rows, q), lengths, np.zeros(rows, np.int64), 1, 0.9, 0.9,
                                      np.zeros(rows, np.int64), cost, np.zeros(1), 0.03, ks, from_model)
        assert ks.tolist() == want.tolist() and steps == 0 and drafted == want.sum()
