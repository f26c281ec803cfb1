"""vLLM with ragspec's proposer, for real: vLLM servers on 127.0.0.1 in the venv that
scripts/install-vllm.sh makes (scripts/test.sh runs it; locally the tests skip without it).

Two servers run one after the other, never together (2 cores): vLLM without speculation answers
the bundled RAG prompts greedily with its top-2 logprobs (the reference), then vLLM with ragspec's
proposer serves every other test. Both use the same flags, so their compiled graphs share vLLM's
cache (~/.cache/vllm) and only the first start of a machine compiles.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragspec.backends.vllm.proposer import STATS_ENV
from ragspec.backends.vllm.server import (
    PYTHON_ENV,
    VllmError,
    VllmServer,
    check_model_folder,
    find_python,
    group_members,
    speculative_config,
)
from tests.apps.vllm_common import FLAGS, MAX_TOKENS, N_PROMPTS, complete, metrics
from tests.ragspec.backends.vllm.processes import children


def _vllm_python() -> Path | None:
    try:
        return find_python()
    except VllmError:
        return None


VLLM_PYTHON = _vllm_python()
needs_vllm = pytest.mark.skipif(
    VLLM_PYTHON is None, reason="vLLM is not installed here: scripts/install-vllm.sh makes .venv-vllm (scripts/test.sh runs it)"
)
DRAFT_TOKENS = 8
HISTORY_TOKENS = 512
GAP_TOLERANCE = 1e-3
"""A greedy divergence is accepted only where vLLM's own top-2 logprobs were this close."""


@pytest.fixture(scope="module")
def spec_server(served_folder, tmp_path_factory) -> Iterator[VllmServer]:
    """vLLM with ragspec's proposer. The greedy test asks for ``reference`` first, so the server
    without speculation has answered and stopped before this one starts."""
    folder = tmp_path_factory.mktemp("vllm")
    env = {STATS_ENV: str(folder / "proposer.json"), "RAGSPEC_PROPOSER_HISTORY_TOKENS": str(HISTORY_TOKENS)}
    with VllmServer(served_folder, speculation=speculative_config(DRAFT_TOKENS), extra_args=FLAGS, served_name="smol",
                    env=env, log=folder / "spec.log") as server:
        yield server


def proposer_stats(server: VllmServer) -> dict[str, Any]:
    return json.loads(Path(server.env[STATS_ENV]).read_text())


@needs_vllm
@pytest.mark.timeout(1500)
def test_greedy_outputs_equal_vllm_without_speculation(reference, spec_server, rag_ids) -> None:
    before = metrics(spec_server.base_url)
    identical, divergences = 0, []
    for ids, ref in zip(rag_ids, reference):
        got = complete(spec_server.base_url, ids)["token_ids"]
        want = ref["token_ids"]
        if got == want:
            identical += 1
            continue
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        top = sorted(ref["logprobs"]["top_logprobs"][at].values(), reverse=True)
        divergences.append((at, top[0] - top[1] if len(top) > 1 else float("inf")))
    after = metrics(spec_server.base_url)
    assert all(gap < GAP_TOLERANCE for _, gap in divergences), f"greedy diverged where vLLM's top-2 gap was not tiny: {divergences}"
    assert identical >= N_PROMPTS - 2, divergences
    # The proposer drafted and vLLM accepted some of it: this compared speculative decoding, not plain twice.
    assert after["vllm:spec_decode_num_draft_tokens_total"] > before.get("vllm:spec_decode_num_draft_tokens_total", 0)
    assert after["vllm:spec_decode_num_accepted_tokens_total"] > before.get("vllm:spec_decode_num_accepted_tokens_total", 0)


@needs_vllm
@pytest.mark.timeout(900)
def test_ragspec_through_vllm_answers_as_its_own_engine_does(spec_server, served_folder, rag_ids) -> None:
    """The same prompt ids, greedy, fp32: ragspec's local greedy and vLLM's (through RemoteGenerator) agree."""
    from ragspec.engine.config import GenerationConfig
    from ragspec.decoding.generator import SpeculativeGenerator
    from ragspec.remote import RemoteGenerator

    config = GenerationConfig(max_new_tokens=MAX_TOKENS, speculation=False)
    local = SpeculativeGenerator("default", backend="torch", dtype="float32")
    remote = RemoteGenerator(spec_server.base_url, tokenizer=str(served_folder))
    for ids in rag_ids[:4]:
        here, there = local.generate(ids, config), remote.generate(ids, config)
        assert there.token_ids == here.token_ids and there.text == here.text
        assert there.finish_reason == here.finish_reason


@needs_vllm
@pytest.mark.timeout(600)
def test_speculation_is_set_per_request_in_one_batch(reference, spec_server, rag_ids) -> None:
    """Two requests at once: one with speculation off (``vllm_xargs``, as ``RemoteGenerator`` sends a
    ``GenerationConfig(speculation=False)``), one on. Both answer as vLLM without speculation; the
    first is never indexed, only the second is drafted for."""
    from ragspec.engine.config import VLLM_MAX_DRAFT_ARG

    before, drafted = proposer_stats(spec_server), metrics(spec_server.base_url)
    results: dict[str, Any] = {}
    off = threading.Thread(target=lambda: results.__setitem__(
        "off", complete(spec_server.base_url, rag_ids[5], vllm_xargs={VLLM_MAX_DRAFT_ARG: 0})))
    on = threading.Thread(target=lambda: results.__setitem__("on", complete(spec_server.base_url, rag_ids[6])))
    off.start()
    on.start()
    for t in (off, on):
        t.join(timeout=500)
    after = proposer_stats(spec_server)
    assert results["off"]["token_ids"] == reference[5]["token_ids"]
    assert results["on"]["token_ids"] == reference[6]["token_ids"]
    assert after["undrafted_requests_seen"] == before["undrafted_requests_seen"] + 1
    assert after["requests_seen"] == before["requests_seen"] + 1
    assert metrics(spec_server.base_url)["vllm:spec_decode_num_draft_tokens_total"] > drafted["vllm:spec_decode_num_draft_tokens_total"]


@needs_vllm
@pytest.mark.timeout(600)
def test_seeded_sampling_is_reproducible_and_well_formed(spec_server, rag_ids, lc_tokenizer) -> None:
    """Seeded requests get no drafts (see ``BatchDrafter.step``); unseeded ones are drafted."""
    unseeded = complete(spec_server.base_url, rag_ids[3], temperature=0.8, max_tokens=32)
    assert unseeded["finish_reason"] in ("stop", "length") and _decoded(lc_tokenizer, unseeded) == unseeded["text"]
    params = {"temperature": 0.8, "top_p": 0.95, "max_tokens": 32}
    first = complete(spec_server.base_url, rag_ids[0], seed=7, **params)
    again = complete(spec_server.base_url, rag_ids[0], seed=7, **params)
    other = complete(spec_server.base_url, rag_ids[0], seed=8, **params)
    assert first["token_ids"] == again["token_ids"] and first["text"] == again["text"]
    assert first["finish_reason"] in ("stop", "length") and 0 < len(first["token_ids"]) <= 32
    assert all(0 <= t < len(lc_tokenizer) for t in first["token_ids"] + other["token_ids"])
    assert _decoded(lc_tokenizer, first) == first["text"]


def _decoded(tokenizer: Any, choice: dict[str, Any]) -> str:
    """The text vLLM returns for ``choice``: its token ids keep the EOS that ended a sampled
    answer, while its text leaves special tokens out (``skip_special_tokens`` defaults to true)."""
    return tokenizer.decode(choice["token_ids"], skip_special_tokens=True)


def _stream(base_url: str, ids: list[int], max_tokens: int, out: list[Any]) -> None:
    body = {"model": "smol", "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    text, finish = "", None
    with httpx.stream("POST", f"{base_url}/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"][0]
                text += choice.get("text") or ""
                finish = choice.get("finish_reason") or finish
    out.append((text, finish))


@needs_vllm
@pytest.mark.timeout(600)
def test_eight_concurrent_streaming_clients_all_complete(spec_server, rag_ids) -> None:
    results: list[Any] = []
    threads = [threading.Thread(target=_stream, args=(spec_server.base_url, rag_ids[i], 32, results)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=500)
    assert len(results) == 8
    assert all(text and finish in ("stop", "length") for text, finish in results)


@needs_vllm
@pytest.mark.timeout(300)
def test_a_client_that_disconnects_frees_its_request(spec_server, rag_ids) -> None:
    body = {"model": "smol", "prompt": rag_ids[1], "max_tokens": 1000, "temperature": 0.0, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", f"{spec_server.base_url}/completions", json=body, timeout=300) as response:
        chunks = 0
        for line in response.iter_lines():
            chunks += line.startswith("data: ")
            if chunks >= 3:
                break  # leaving the block closes the connection mid-answer
    deadline = time.monotonic() + 60
    while metrics(spec_server.base_url).get("vllm:num_requests_running", 0) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert metrics(spec_server.base_url).get("vllm:num_requests_running", 0) == 0
    complete(spec_server.base_url, rag_ids[2], max_tokens=2)  # the proposer sees the batch without it
    assert proposer_stats(spec_server)["live_requests"] <= 1


@needs_vllm
@pytest.mark.timeout(900)
def test_proposer_state_stays_bounded_over_200_sequential_requests(spec_server, lc_tokenizer) -> None:
    seen = []
    for n in range(200):
        ids = lc_tokenizer.encode(f"Count from {n} to {n + 5}: {n}, {n + 1},")
        complete(spec_server.base_url, ids, max_tokens=4)
        if n % 50 == 49:
            seen.append(proposer_stats(spec_server))
    assert seen[-1]["requests_seen"] - seen[0]["requests_seen"] >= 150
    assert all(s["live_requests"] <= 2 for s in seen)
    assert all(s["history_tokens"] <= HISTORY_TOKENS + 1 for s in seen)


def test_missing_vllm_too_old_and_unservable_folders_fail_clearly(tmp_path, monkeypatch, served_folder) -> None:
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "nowhere" / "python"))
    with pytest.raises(VllmError, match="no Python at"):
        find_python()
    fake = tmp_path / "python"  # a Python whose vLLM is too old
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("__version__ = '0.6.3'\n")
    fake.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path} exec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    with pytest.raises(VllmError, match="vLLM 0.6.3 is too old"):
        VllmServer(served_folder, python=fake).start()
    nothing = tmp_path / "python-without-vllm"
    nothing.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    nothing.chmod(0o755)
    with pytest.raises(VllmError, match="cannot import vLLM"):
        VllmServer(served_folder, python=nothing).start()
    with pytest.raises(VllmError, match="no config.json"):
        check_model_folder(tmp_path)
    bad = tmp_path / "model"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"architectures": None, "model_type": "llama"}))
    with pytest.raises(VllmError, match="names no architectures"):
        check_model_folder(bad)
    check_model_folder(served_folder)  # the converted default model is served as it is


def test_vllm_is_asked_for_per_request_drafting_figures_whenever_it_drafts(tmp_path) -> None:
    """``--per-request-spec-decode-metrics`` (vLLM refuses it without speculation); a caller's own setting wins."""
    flag = "--per-request-spec-decode-metrics"
    drafting = VllmServer(tmp_path, python=Path(sys.executable)).command()
    assert drafting[drafting.index(flag) + 1] == "summary"
    assert flag not in VllmServer(tmp_path, speculation=None, python=Path(sys.executable)).command()
    own = VllmServer(tmp_path, extra_args=[f"{flag}=detailed"], python=Path(sys.executable)).command()
    assert [a for a in own if a.startswith(flag)] == [f"{flag}=detailed"]


@needs_vllm
@pytest.mark.timeout(600)
def test_a_folder_vllm_cannot_load_is_a_clear_error(tmp_path, served_folder, spec_server) -> None:
    """Started after the other servers' tests (it needs the proposer server's fixture order)."""
    bad = tmp_path / "model"
    bad.mkdir()
    config = json.loads((served_folder / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModelForCausalLM"]}))
    (bad / "model.safetensors").write_bytes(b"not weights")
    spec_server.stop()  # one vLLM at a time
    with pytest.raises(VllmError, match="vLLM exited with status"):
        VllmServer(bad, speculation=None, extra_args=FLAGS, log=tmp_path / "bad.log").start()


@needs_vllm
@pytest.mark.timeout(600)
def test_a_vllm_server_killed_mid_stream_leaves_no_engine_or_worker_once_stopped(
    tmp_path, served_folder, spec_server, rag_ids
) -> None:
    """Issue 30: after a SIGKILL of the API server, its EngineCore and Worker lived on under PID 1;
    ``stop`` ends the server's whole process group. (After the other servers' tests.)"""
    spec_server.stop()  # one vLLM at a time
    server = VllmServer(served_folder, speculation=None, extra_args=FLAGS, served_name="smol", log=tmp_path / "killed.log")
    server.start()
    assert server.process is not None
    group = server.process.pid
    try:
        assert len(group_members(group)) >= 2, server.log_tail()  # the API server and its EngineCore at least
        body = {"model": "smol", "prompt": rag_ids[0], "max_tokens": 1000, "temperature": 0.0, "stream": True,
                "ignore_eos": True}
        with pytest.raises(httpx.HTTPError), httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=60) as response:
            for n, _ in enumerate(response.iter_lines()):
                if n == 3:
                    os.kill(group, signal.SIGKILL)
        server.process.wait(timeout=60)
    finally:
        server.stop()
    assert group_members(group) == []


def test_vllm_serves_without_torchvision_torchaudio_torchcodec() -> None:
    if VLLM_PYTHON is None:
        pytest.skip("vLLM is not installed here: scripts/install-vllm.sh makes .venv-vllm")
    probe = ("import importlib.util as u; import vllm.entrypoints.openai.api_server; "
             "print([m for m in ('torchvision', 'torchaudio', 'torchcodec') if u.find_spec(m)])")
    done = subprocess.run([str(VLLM_PYTHON), "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"  # and the servers above ran without them


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--engine", "vllm", "--generator-url", "http://127.0.0.1:9/v1"], "use one of them"),
        (["serve", "--engine", "vllm", "--backend", "llamacpp"], "--backend picks"),
        (["serve", "--", "--tensor-parallel-size", "2"], "need --engine vllm"),
        (["serve", "--vllm-draft-tokens", "4"], "need --engine vllm"),
    ],
)
def test_serve_engine_vllm_usage_errors(argv, message, monkeypatch, capsys) -> None:
    from apps.cli import main

    monkeypatch.setattr("apps.web.server.serve", lambda *a, **k: pytest.fail("the server started"))
    assert main(argv) == 1
    assert message in capsys.readouterr().err


def test_serve_engine_vllm_without_vllm_says_how_to_install_it(tmp_path, monkeypatch, capsys) -> None:
    from apps.cli import main

    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "python"))
    monkeypatch.setattr("apps.web.server.serve", lambda *a, **k: pytest.fail("the server started"))
    assert main(["serve", "--engine", "vllm"]) == 1
    err = capsys.readouterr().err
    assert "ragspec: error: no Python at" in err and PYTHON_ENV in err


@needs_vllm
@pytest.mark.timeout(900)
def test_serve_engine_vllm_answers_through_vllm_and_stops_it(spec_server, tmp_path) -> None:
    """The whole command: ragspec's app and /v1 in front of a vLLM it started (after the other servers)."""
    from ragspec.backends.vllm.server import free_port

    spec_server.stop()  # one vLLM at a time
    port = free_port()
    command = [sys.executable, "-m", "apps.cli", "serve", "--engine", "vllm", "--port", str(port), "--max-tokens", "16",
               "--", *FLAGS]
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2])
    try:
        deadline = time.monotonic() + 800
        while time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(2)
        listed = [m["id"] for m in httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"]]
        assert listed[:2] == ["default", "SmolLM2-135M-Instruct"]  # as without --engine: --model as given, the model's own
        for name in listed[:2]:
            body = {"model": name, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
            answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=300)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"] and answer.json()["model"] == name
        # vLLM's own per-request drafting figures, passed on in its shape; what vLLM does not count is absent
        drafting, extension = answer.json()["metrics"]["speculative_decoding"], answer.json()["ragspec"]
        assert drafting["num_spec_tokens"] == 8 and sum(drafting["acceptance_histogram"]) == drafting["num_spec_steps"]
        assert (drafting["num_draft_tokens"], drafting["num_accepted_draft_tokens"]) == (
            extension["drafted_tokens"], extension["accepted_tokens"])
        assert "forward_passes" not in extension and "by_source" not in extension and "tokens_per_forward" not in extension
        vllm_group = children(process.pid)[0]  # the vLLM server, leader of its process group
    finally:
        process.terminate()
        process.wait(timeout=120)
        log.close()
    assert group_members(vllm_group) == []  # no EngineCore or Worker left behind
    text = (tmp_path / "serve.log").read_text()
    assert "generating on vLLM at http://127.0.0.1:" in text
    vllm_port = int(text.split("generating on vLLM at http://127.0.0.1:")[1].split("/")[0])
    with pytest.raises(httpx.HTTPError):  # vLLM went with it
        httpx.get(f"http://127.0.0.1:{vllm_port}/health", timeout=2)

