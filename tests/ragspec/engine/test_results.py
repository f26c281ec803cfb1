"""GenerationStats.reported: what a surface shows of a generation's figures."""

from __future__ import annotations

from ragspec.engine.results import DRAFTING, ENGINE_COUNTED, GenerationStats


def test_own_engine_reports_every_figure() -> None:
    stats = GenerationStats(new_tokens=6, forward_passes=3, drafted_tokens=4, accepted_tokens=3, acceptance_histogram=[0, 1, 1])
    shown = stats.reported()
    assert shown == stats.as_dict()
    assert shown["tokens_per_forward"] == 2.0


def test_an_engine_that_counts_no_forwards_shows_no_zeros() -> None:
    # vLLM behind RemoteGenerator with per-request metrics: drafting figures, no forwards.
    stats = GenerationStats(new_tokens=6, drafted_tokens=4, accepted_tokens=3, acceptance_histogram=[0, 1, 1])
    shown = stats.reported()
    assert not set(ENGINE_COUNTED) & set(shown)
    assert shown["acceptance_rate"] == 0.75 and shown["accepted_by_position"] == [2, 1]
    assert shown["new_tokens"] == 6


def test_no_drafting_reported_leaves_out_drafting_figures() -> None:
    shown = GenerationStats(new_tokens=6, wall_s=1.0).reported()
    assert not (set(ENGINE_COUNTED) | set(DRAFTING)) & set(shown)
    assert {"new_tokens", "wall_s", "decode_tokens_per_s", "ttft_s"} <= set(shown)
