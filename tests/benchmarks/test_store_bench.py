"""benchmarks/store_bench.py at a tiny size, on the session's PostgreSQL: the documented command runs and reports every store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("psycopg", reason="the postgres extra is not installed (scripts/install-postgres.sh)")


@pytest.mark.timeout(300)
def test_store_bench_runs_and_reports_each_store(pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import store_bench

    out = tmp_path / "store.json"
    assert store_bench.main(["--sizes", "300", "--queries", "8", "--url", pg_url, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    plain = [f"PostgreSQL {kind} table, HNSW built at once" for kind in ("vector", "halfvec")]
    assert [r["store"] for r in rows] == [
        "FAISS flat", "FAISS HNSW", "PostgreSQL HNSW", "PostgreSQL hybrid (HNSW + BM25)", *[p for p in plain for _ in range(3)]
    ]  # fmt: skip
    assert rows[0]["recall_at_10"] == 1.0 and rows[2]["recall_at_10"] >= 0.9  # exact search is exact; HNSW at 300 nearly
    assert all(r["n"] == 300 and r["chunks_per_s"] > 0 and 0 < r["p50_ms"] <= r["p95_ms"] for r in rows)
    tables = rows[4:]
    assert [r["ef_search"] for r in tables] == [40, 100, 200] * 2 and all(r["build_s"] > 0 for r in tables)
    assert all(r["recall_at_10"] >= 0.85 for r in tables)  # halfvec's rounding moves few neighbours at 300
    assert tables[3]["memory_mib"] < tables[0]["memory_mib"]  # halfvec: half the bytes per vector
    assert all(r["server_mib"] is not None and r["server_mib"] > 0 for r in rows[2:])  # the session's server runs here
    out_text = capsys.readouterr().out
    assert "| PostgreSQL HNSW | 300 | 100 |" in out_text and "| PostgreSQL halfvec table, HNSW built at once | 300 | 40 |" in out_text
