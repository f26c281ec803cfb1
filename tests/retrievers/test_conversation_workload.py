"""The follow-up workloads (benchmarks/conversation_bench.py's, and the held-out set of benchmarks/support_answers.py's
layouts): every gold answer is in the corpus text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from retrievers import load_documents, split_documents

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"


@pytest.mark.parametrize(("name", "at_least"), [("conversations.json", 10), ("followup_conversations.json", 6)])
def test_every_turn_is_answerable_from_one_chunk_and_its_gold_is_in_the_text(corpus_dir: Path, name: str, at_least: int) -> None:
    loaded = load_documents(corpus_dir)
    texts = {Path(d.metadata["source"]).name: d.page_content for d in loaded.documents}
    chunks = split_documents(loaded.documents)
    conversations = json.loads((DATA / name).read_text(encoding="utf-8"))["conversations"]
    assert len(conversations) >= at_least and len({c["id"] for c in conversations}) == len(conversations)
    for c in conversations:
        assert len(c["turns"]) == 3, c["id"]
        for turn in c["turns"]:
            span, gold = turn["span"], turn["gold"]
            assert turn["question"].strip() and gold, c["id"]
            assert span in texts[c["source"]], (c["id"], span)
            assert re.search(rf"\b{re.escape(gold[0].lower())}\b", span.lower().replace("`", " ")), (c["id"], gold[0])
            assert any(Path(ch.metadata["source"]).name == c["source"] and span in ch.page_content for ch in chunks), span
