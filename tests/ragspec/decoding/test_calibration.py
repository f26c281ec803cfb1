"""The verify-cost calibration is cached on disk per model and machine, and a bad cache never hurts."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

import ragspec.backends.pytorch as torch_backend
from ragspec.backends.pytorch.forward import prompt_in_blocks
from ragspec.decoding import calibration
from ragspec.decoding.generator import SpeculativeGenerator


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSPEC_CACHE_DIR", str(tmp_path))
    return tmp_path / "calibration"


@pytest.fixture
def forwards(monkeypatch):
    """Counts target forwards of every generator built in the test."""
    calls: list[int] = []
    make = torch_backend.make_forward

    def counting_make_forward(*args, **kwargs):
        forward = make(*args, **kwargs)

        class Counting:
            description = forward.description

            def __call__(self, ids, cache, last_only=False):
                calls.append(len(ids))
                return forward(ids, cache, last_only=last_only)

            def prompt(self, ids, cache, block, cancel=None):  # each block through __call__, counted
                return prompt_in_blocks(self, ids, cache, block, cancel)

            def new_cache(self, capacity):
                return forward.new_cache(capacity)

        return Counting()

    monkeypatch.setattr(torch_backend, "make_forward", counting_make_forward)
    return calls


def stored(cache_dir) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(cache_dir.glob("*.json"))]


def test_the_second_generator_reads_the_calibration_instead_of_timing(cache_dir, forwards, lc_tiny_model):
    first = SpeculativeGenerator(lc_tiny_model)
    measured = len(forwards)
    assert measured >= 20  # the calibration's timed forwards
    [entry] = stored(cache_dir)
    assert entry["key"]["model"] == "tiny" and entry["key"]["threads"] == torch.get_num_threads()
    assert entry["key"]["torch"] == torch.__version__ and entry["key"]["device"] == "cpu"
    forwards.clear()
    second = SpeculativeGenerator(lc_tiny_model)
    assert forwards == []
    assert second.policy.costs.measured() == first.policy.costs.measured() == {int(k): v for k, v in entry["seconds"].items()}


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\xff not json",
        b'{"key": {"model": "tiny"}, "seconds": {"0": 0.01}}',  # another key
        pickle.dumps({"seconds": {0: 1.0}}),  # never unpickled
        b"[]",
    ],
)
def test_a_corrupt_or_foreign_cache_file_is_measured_again(cache_dir, forwards, lc_tiny_model, content, caplog):
    SpeculativeGenerator(lc_tiny_model)
    [path] = cache_dir.glob("*.json")
    path.write_bytes(content)
    forwards.clear()
    gen = SpeculativeGenerator(lc_tiny_model)
    assert len(forwards) >= 20
    assert "measuring again" in caplog.text
    [entry] = stored(cache_dir)  # rewritten, valid again
    assert {int(k): v for k, v in entry["seconds"].items()} == gen.policy.costs.measured()


@pytest.mark.parametrize(
    "seconds",
    [{"0": -1.0}, {"0": "fast"}, {"0": float("nan")}, {"x": 1.0}, {"0": 1.0}],  # the last lacks lengths
)
def test_implausible_numbers_are_not_trusted(cache_dir, forwards, lc_tiny_model, seconds):
    SpeculativeGenerator(lc_tiny_model)
    [path] = cache_dir.glob("*.json")
    data = json.loads(path.read_text())
    data["seconds"] = seconds
    path.write_text(json.dumps(data))
    forwards.clear()
    SpeculativeGenerator(lc_tiny_model)
    assert len(forwards) >= 20


def test_a_calibration_taken_while_the_machine_was_busy_is_measured_again(cache_dir, forwards, lc_tiny_model):
    """Verify passes stored at 13x a plain step (seen after a busy run: 160 ms against 12) would keep drafting off."""
    SpeculativeGenerator(lc_tiny_model)
    [path] = cache_dir.glob("*.json")
    data = json.loads(path.read_text())
    data["seconds"] = {k: (0.012 if k == "0" else 0.16) for k in data["seconds"]}
    path.write_text(json.dumps(data))
    forwards.clear()
    gen = SpeculativeGenerator(lc_tiny_model)
    assert len(forwards) >= 20 and max(gen.policy.costs.measured().values()) < 0.16
    data["seconds"] = {k: (0.012 if k == "0" else 0.09) for k in data["seconds"]}  # 7.5x: plausible, kept
    path.write_text(json.dumps(data))
    forwards.clear()
    SpeculativeGenerator(lc_tiny_model)
    assert not forwards


def test_the_key_tells_models_and_machines_apart(cache_dir, lc_tiny_model, monkeypatch):
    import dataclasses

    from transformers import LlamaForCausalLM

    key = calibration.calibration_key(lc_tiny_model, "fwd", (0, 1), 128)
    assert calibration.calibration_key(lc_tiny_model, "fwd", (0, 1), 128) == key
    torch.manual_seed(99)
    other_weights = dataclasses.replace(lc_tiny_model, model=LlamaForCausalLM(lc_tiny_model.model.config).eval())
    assert calibration.calibration_key(other_weights, "fwd", (0, 1), 128)["weights"] != key["weights"]
    assert calibration.calibration_key(lc_tiny_model, "other forward", (0, 1), 128) != key
    assert calibration.calibration_key(lc_tiny_model, "fwd", (0, 1), 640) != key
    monkeypatch.setattr(torch, "get_num_threads", lambda: key["threads"] + 1)
    assert calibration.calibration_key(lc_tiny_model, "fwd", (0, 1), 128) != key


def test_an_unwritable_cache_only_costs_a_new_measurement(tmp_path, monkeypatch, forwards, lc_tiny_model, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("RAGSPEC_CACHE_DIR", str(blocker))
    SpeculativeGenerator(lc_tiny_model)
    assert "could not store the calibration" in caplog.text
    forwards.clear()
    SpeculativeGenerator(lc_tiny_model)
    assert len(forwards) >= 20
