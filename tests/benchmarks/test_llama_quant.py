"""benchmarks/llama_quant.py: its arithmetic and argument checks (the measurement itself is a benchmark run)."""

from __future__ import annotations

import pytest

from benchmarks.llama_quant import LENGTHS, TypeResult, agreement, main, table


@pytest.mark.parametrize(("answer", "reference", "share"), [
    ([1, 2, 3, 4], [1, 2, 3, 4], 1.0),
    ([1, 2, 9, 4], [1, 2, 3, 4], 0.5),
    ([5], [1, 2, 3, 4], 0.0),
    ([1, 2], [1, 2, 3, 4], 0.5),  # stopped early: the rest counts as different
    ([1, 2, 3, 4, 5], [1, 2, 3, 4], 1.0),  # every reference token matched before the answer went on
])
def test_agreement_is_the_share_before_the_first_difference(answer: list[int], reference: list[int], share: float) -> None:
    assert agreement(answer, reference) == share


def test_table_has_one_row_per_type_and_every_r() -> None:
    result = TypeResult(kind="Q8_0", file_mb=138.1, exact=True, step_ms=9.5, prefill_ms=900.0,
                        r={k: 1 + k / 10 for k in LENGTHS}, identical=7, questions=8, agreement=0.93)
    lines = table([result]).splitlines()
    assert len(lines) == 3 and lines[0].count("r(") == len(LENGTHS)
    assert lines[2].startswith("| Q8_0 | 138.1 | True |") and "| 1.8 |" in lines[2] and "7/8" in lines[2]


def test_unknown_types_are_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--kinds", "Q4_1,Q9_9"])
