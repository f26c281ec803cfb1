"""Load test of ``ragspec serve``'s OpenAI-compatible API: many clients at once against one server.

Starts ``ragspec serve`` (the default model, on a free loopback port) in a subprocess, warms it
up with one request, then runs ``--clients`` threads that each send ``--requests`` chat
completions back to back (streamed and not streamed, alternately), each with its own question.
No client retries: a 429 (queue full) or 503 (waited too long) counts as *rejected*, which is a
clean answer; anything else (a connection error, a 5xx, a broken stream, a wrong body) counts
as *failed*. The server's resident memory is sampled throughout.

Reports completed / rejected / failed, latency percentiles of the completed requests, the
server's RSS after warm-up, at its peak and at the end, and whether it is still healthy. Exits 1
when a request failed or the server died. The target: 0 failed, the server alive, memory flat.

    python benchmarks/load_test.py                                  # 16 clients x 5 requests
    python benchmarks/load_test.py --clients 4 --requests 2 --max-tokens 8   # a quick check
    python benchmarks/load_test.py --url http://127.0.0.1:8000 --api-key KEY   # a running server
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOPICS = [
    "the tides", "a lighthouse", "bread", "the moon", "rivers", "bees", "winter", "trains", "maps", "tea",
    "volcanoes", "owls", "libraries", "bridges", "clouds", "chess",
]  # fmt: skip


@dataclass
class Outcome:
    kind: str
    """``completed``, ``rejected`` or ``failed``."""
    seconds: float
    status: int | None = None
    detail: str = ""


@dataclass
class Results:
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)


def one_request(http: httpx.Client, body: dict[str, object]) -> Outcome:
    """Send one chat completion; classify what came back."""
    start = time.monotonic()
    try:
        if body.get("stream"):
            with http.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    return classify(r, start)
                text, finished, usage = "", False, None
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        break
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return Outcome("failed", time.monotonic() - start, 200, f"in-stream error: {chunk['error']}")
                    for choice in chunk.get("choices", []):
                        text += choice.get("delta", {}).get("content") or ""
                        finished = finished or bool(choice.get("finish_reason"))
                    usage = chunk.get("usage") or usage
                if not finished or usage is None:
                    return Outcome("failed", time.monotonic() - start, 200, "stream ended without finish_reason or usage")
                return Outcome("completed", time.monotonic() - start, 200)
        r = http.post("/v1/chat/completions", json=body)
        if r.status_code == 200:
            data = r.json()
            if not data["choices"][0]["message"]["content"] and data["usage"]["completion_tokens"] > 0:
                return Outcome("failed", time.monotonic() - start, 200, "empty content")
            return Outcome("completed", time.monotonic() - start, 200)
        return classify(r, start)
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as e:
        return Outcome("failed", time.monotonic() - start, None, f"{type(e).__name__}: {e}")


def classify(r: httpx.Response, start: float) -> Outcome:
    seconds = time.monotonic() - start
    clean = r.status_code in (429, 503) and "retry-after" in r.headers and "error" in r.json()
    return Outcome("rejected" if clean else "failed", seconds, r.status_code, r.text[:200])


def client(index: int, args: argparse.Namespace, base: str, headers: dict[str, str], results: Results) -> None:
    with httpx.Client(base_url=base, headers=headers, timeout=args.client_timeout) as http:
        for n in range(args.requests):
            topic = TOPICS[(index + n) % len(TOPICS)]
            body = {
                "model": "default",
                "messages": [{"role": "user", "content": f"Write two sentences about {topic}. (client {index}, request {n})"}],
                "max_tokens": args.max_tokens,
                "stream": (index + n) % 2 == 0,
                **({"stream_options": {"include_usage": True}} if (index + n) % 2 == 0 else {}),
            }
            results.add(one_request(http, body))


def rss_mib(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=5, help="requests per client (default: 5)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per answer (default: 32)")
    parser.add_argument("--max-queue", type=int, default=16, help="the server's --max-queue (default: 16, its default)")
    parser.add_argument("--queue-timeout", type=float, default=120.0, help="the server's --queue-timeout (default: 120)")
    parser.add_argument("--client-timeout", type=float, default=600.0)
    parser.add_argument("--url", default=None, help="test a server that is already running instead of starting one")
    parser.add_argument("--api-key", default=os.environ.get("RAGSPEC_API_KEY"))
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)

    server: subprocess.Popen[bytes] | None = None
    log = None
    if args.url is None:
        from tests.apps.ragspec_server import free_port

        port = free_port()
        base = f"http://127.0.0.1:{port}"
        log = open(os.devnull, "wb")  # noqa: SIM115 - closed below
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        command = [
            sys.executable, "-m", "apps.cli", "serve", "--port", str(port), "--max-queue", str(args.max_queue),
            "--queue-timeout", str(args.queue_timeout), "--max-tokens", str(max(args.max_tokens, 1)),
        ]  # fmt: skip
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    else:
        base = args.url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        deadline = time.monotonic() + 600
        while True:
            if server is not None and server.poll() is not None:
                print(f"the server exited with {server.returncode} before it was ready", file=sys.stderr)
                return 1
            try:
                if httpx.get(f"{base}/api/health", headers=headers, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                print("the server did not become ready in 600 s", file=sys.stderr)
                return 1
            time.sleep(0.5)
        with httpx.Client(base_url=base, headers=headers, timeout=args.client_timeout) as http:
            warm = one_request(http, {"model": "default", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})
        if warm.kind != "completed":
            print(f"the warm-up request failed: {warm}", file=sys.stderr)
            return 1

        pid = server.pid if server is not None else None
        rss_start = rss_mib(pid) if pid else float("nan")
        peak = [rss_start]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.2):
                if pid:
                    try:
                        peak[0] = max(peak[0], rss_mib(pid))
                    except Exception:  # noqa: BLE001 - the server died; reported below
                        return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        results = Results()
        started = time.monotonic()
        threads = [threading.Thread(target=client, args=(i, args, base, headers, results)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - started
        time.sleep(1.0)
        done.set()
        sampler.join()
        alive = server is None or server.poll() is None
        try:
            health = httpx.get(f"{base}/api/health", headers=headers, timeout=10).json()
        except httpx.HTTPError as e:
            health = {"error": str(e)}
        rss_end = rss_mib(pid) if pid and alive else float("nan")
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
        if log is not None:
            log.close()

    kinds = {k: [o for o in results.outcomes if o.kind == k] for k in ("completed", "rejected", "failed")}
    latencies = [o.seconds for o in kinds["completed"]]
    report = {
        "clients": args.clients,
        "requests_per_client": args.requests,
        "max_tokens": args.max_tokens,
        "max_queue": args.max_queue,
        "queue_timeout_s": args.queue_timeout,
        "completed": len(kinds["completed"]),
        "rejected": len(kinds["rejected"]),
        "rejected_by_status": {str(s): sum(o.status == s for o in kinds["rejected"]) for s in (429, 503)},
        "failed": len(kinds["failed"]),
        "failures": [f"{o.status}: {o.detail}" for o in kinds["failed"][:10]],
        "latency_p50_s": round(percentile(latencies, 0.5), 2),
        "latency_p95_s": round(percentile(latencies, 0.95), 2),
        "latency_mean_s": round(statistics.fmean(latencies), 2) if latencies else None,
        "wall_s": round(wall, 1),
        "server_rss_mib": {"after_warm_up": round(rss_start, 1), "peak": round(peak[0], 1), "end": round(rss_end, 1)},
        "server_alive": alive,
        "server_health_at_end": health,
    }
    print(json.dumps(report, indent=2))
    print(
        f"\n{report['completed']} completed, {report['rejected']} rejected (429/503, with Retry-After), "
        f"{report['failed']} failed of {args.clients * args.requests}; latency p50 {report['latency_p50_s']} s, "
        f"p95 {report['latency_p95_s']} s; server RSS {rss_start:.0f} MiB after warm-up, {peak[0]:.0f} peak, "
        f"{rss_end:.0f} at the end; server {'alive' if alive else 'DEAD'}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["failed"] == 0 and alive else 1


if __name__ == "__main__":
    sys.exit(main())
