"""What the vLLM tests share: flags, the bundled RAG prompts, a greedy completion, vLLM's counters.

The fixtures that start servers once for the whole session (vLLM without speculation, the
reference every speculative server is compared with) are in ``tests/apps/conftest.py``.
"""

from __future__ import annotations

from typing import Any

import httpx

N_PROMPTS = 12
MAX_TOKENS = 48
FLAGS = ["--max-model-len", "2048", "--max-num-seqs", "8", "--seed", "0", "-O0"]
"""-O0: no torch.compile, so a server starts in about a minute instead of compiling for several."""


def complete(base_url: str, ids: list[int], **params: Any) -> dict[str, Any]:
    body = {"model": "smol", "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0.0, "return_token_ids": True,
            **params}
    response = httpx.post(f"{base_url}/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def metrics(base_url: str) -> dict[str, float]:
    """vLLM's Prometheus counters and gauges, summed over their labels."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:"):
            name, value = line.rsplit(" ", 1)
            name = name.split("{")[0]
            found[name] = found.get(name, 0.0) + float(value)
    return found
