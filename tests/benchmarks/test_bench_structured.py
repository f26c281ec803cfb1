"""The structured-extraction benchmark's arithmetic, schema and options (the measurements are not tests)."""

from __future__ import annotations

import pytest

from benchmarks.bench import main
from benchmarks.bench_structured import EXTRACTION_SCHEMA, Run, format_table, summarize
from ragspec.engine.constraints import Constraint


def test_summary_ratios_forced_share_mask_time_and_identity() -> None:
    same = [1, 2, 3]
    runs = {
        "constrained_speculative": [Run(11, 1.5, 0.5, forwards=4, forced=5, mask_s=0.002, masks=20, token_ids=same, text='{"a": 1}')],
        "constrained_plain": [Run(11, 3.0, 1.0, forwards=11, mask_s=0.001, masks=11, token_ids=same, text='{"a": 1}')],
        "unconstrained_plain": [Run(11, 2.5, 0.5, forwards=11, token_ids=[9], text="free text")],
        "hf_llguidance": [Run(11, 4.0, 2.0, mask_s=0.0011, masks=11, token_ids=same, text='{"a": 1}')],
    }
    rows = {s.method: s for s in summarize(runs)}
    spec, plain = rows["constrained_speculative"], rows["constrained_plain"]
    assert plain.decode_tokens_per_s == pytest.approx(10 / 2.0) and spec.decode_tokens_per_s == pytest.approx(10 / 1.0)
    assert spec.ratio_vs_constrained_plain == pytest.approx(2.0)
    assert spec.tokens_per_forward == pytest.approx(11 / 4, abs=0.01) and spec.forced_share == pytest.approx(5 / 11, abs=1e-3)
    assert spec.mask_us_per_token == pytest.approx(100.0) and rows["hf_llguidance"].mask_us_per_token == pytest.approx(100.0)
    assert rows["unconstrained_plain"].mask_us_per_token is None and rows["unconstrained_plain"].valid_json == 0
    assert (spec.identical, rows["hf_llguidance"].identical, rows["unconstrained_plain"].identical) == (1, 1, 0)
    table = format_table([vars(s) for s in rows.values()])
    assert "| constrained_speculative | 10.0 | 2.0 |" in table and "1/1" in table


def test_the_schema_has_four_to_eight_fields_and_compiles() -> None:
    assert 4 <= len(EXTRACTION_SCHEMA["properties"]) <= 8
    assert Constraint.json_schema(EXTRACTION_SCHEMA).kind == "json_schema"


def test_a_negative_structured_count_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as e:
        main(["--structured", "-1"])
    assert e.value.code == 2
