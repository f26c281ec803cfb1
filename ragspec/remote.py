"""Generation on an OpenAI-compatible server: vLLM, llama.cpp's server, Ollama, another ``ragspec serve``.

``RemoteGenerator`` is a ``ragspec.engine.results.TextGenerator`` like the local one (``generate`` / ``stream`` with
a ``GenerationConfig``, ``references=``, a stream that is a context manager with live ``stats``
and a ``result``), so ``DocumentQA``, ``ChatRagSpec`` and the apps use it where they would use a
``SpeculativeGenerator``. ``RemoteModel`` is the matching ``GenerationSource`` (a settings object
whose ``load()`` returns the shared generator), like ``ragspec.registry.LocalModel``.

What stays local: retrieval, the prompt (ragspec applies the model's chat template itself, with
the model's own tokenizer), context budgeting, citations. What runs remotely: decoding, and any
drafting the server does (vLLM's n-gram speculation, ragspec's own).

The prompt travels as **token ids** on ``POST /v1/completions`` (``prompt_format="tokens"``, the
default): the server decodes exactly the ids the local generator would, so under greedy decoding
with the same model and precision the answer is the same. vLLM, llama.cpp's server and ragspec
accept token-id prompts; for servers that take text only (Ollama), ``prompt_format="text"``
sends the decoded prompt, which the server tokenizes again (it may add a BOS token of its own).

Statistics: ``usage`` gives prompt and answer token counts; a ragspec server also returns its
speculative statistics (forwards, drafted and accepted tokens, by source), which fill the same
``GenerationStats`` fields as a local run. vLLM started with ``--per-request-spec-decode-metrics``
(``ragspec serve --engine vllm`` starts it so) returns each finished request's drafting figures as
``metrics.speculative_decoding`` (drafts, drafted and accepted tokens, the acceptance histogram),
and so does a ragspec server: they fill ``drafted_tokens``, ``accepted_tokens`` and
``acceptance_histogram``. Times (``ttft_s``, ``wall_s``) are measured here, so they include the
network and the server's queue. Servers other than ragspec count no forwards (``forward_passes``
stays 0: not measured), and without those metrics no drafting figures either.

Errors: a request that cannot reach the server (connection refused, a timeout) or that it answers
408, 409 or 5xx is sent again up to ``max_retries`` times (default 2), after 0.5 s, 1 s, 2 s, ...
(or the server's ``Retry-After``), as OpenAI's client does; never once an answer has started
streaming (that would repeat text). ``timeout_s`` bounds each wait for the server: to connect
(at most 10 s) and for each piece of an answer. 429 (the server's queue is full) is retried after
its ``Retry-After`` until ``busy_timeout_s`` has passed, then ``GeneratorBusyError``, as a busy
local generator does; a
prompt over the context window is ``PromptTooLongError``; anything else the server refuses is a
``RemoteGenerationError`` with the server's message. The API key is sent as
``Authorization: Bearer KEY`` and never appears in a message, a log or a ``repr``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Generator as StepGenerator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from ragspec.engine.cancel import check as check_cancelled
from ragspec.engine.config import VLLM_MAX_DRAFT_ARG, CallOptions, GenerationConfig, call_options
from ragspec.engine.results import (
    GenerationResult,
    GenerationStats,
    GenerationStream,
    GeneratorBusyError,
    ModelLoadError,
    PromptTooLongError,
    SourceStats,
    TextGenerator,
)
from ragspec.engine.tenancy import current_cache_scope, scope_salt
from ragspec.engine.text import StopTextAssembler, clean_text

if TYPE_CHECKING:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

API_KEY_ENV = "RAGSPEC_GENERATOR_API_KEY"
"""Environment variable read for the API key when none is given."""
PROMPT_FORMATS = ("tokens", "text")
FALLBACK_CONTEXT = 2048
"""Context window assumed when neither the caller nor the server says (see ``RemoteGenerator``)."""

__all__ = ["API_KEY_ENV", "RemoteGenerationError", "RemoteGenerator", "RemoteModel"]


class RemoteGenerationError(RuntimeError):
    """The server could not be reached, refused the request or broke off; the message says which."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class _Served:
    """What the server says of its model (asked once): name, tokenizer, context window, and which server it is."""

    name: str
    tokenizer: PreTrainedTokenizerBase
    context_length: int
    server: str
    """``"ragspec"`` when the server is a ragspec server (it takes the ``references`` extension), ``"vllm"`` for
    vLLM (it returns the answer's token ids), else ``"openai"``."""


def api_base(url: str) -> str:
    """The API root of a server address: ``http://host:8000`` and ``http://host:8000/v1`` both give ``.../v1``."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"a generator URL looks like 'http://127.0.0.1:8000/v1', got {url!r}")
    if parts.username or parts.password:
        raise ValueError("put the API key in api_key (or RAGSPEC_GENERATOR_API_KEY), not in the URL")
    path = parts.path.rstrip("/")
    return f"{parts.scheme}://{parts.netloc}{path if path else '/v1'}"


_tokenizers: dict[str, PreTrainedTokenizerBase] = {}
_tokenizers_lock = threading.Lock()


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """A model's tokenizer without its weights: ``"default"``, a ``.gguf`` file, a local folder or a hub id."""
    with _tokenizers_lock:
        if name not in _tokenizers:
            from ragspec.backends.models import DEFAULT_MODEL, default_gguf_path

            if name == DEFAULT_MODEL:
                tokenizer = _gguf_tokenizer(default_gguf_path())
            elif name.endswith(".gguf") and Path(name).expanduser().is_file():
                tokenizer = _gguf_tokenizer(Path(name).expanduser())
            else:
                from transformers import AutoTokenizer

                try:
                    tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True)  # never downloaded
                except (OSError, ValueError) as e:
                    raise ModelLoadError(
                        f"could not load a tokenizer for {name!r}: ragspec builds the prompt locally with the "
                        "model's own tokenizer; pass tokenizer= (--generator-tokenizer) naming the served model's "
                        "Hugging Face id (in the local hub cache), a local folder or its .gguf file"
                    ) from e
            _tokenizers[name] = tokenizer
        return _tokenizers[name]


def _gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer stored in a GGUF file, without its weights.

    ``ragspec.backends.models.gguf_tokenizer`` keeps it in ragspec's cache where that function exists;
    otherwise transformers reads it from the file (a few seconds, once per process).
    """
    try:
        from ragspec.backends.models import gguf_tokenizer
    except ImportError:
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        except Exception as e:  # gguf raises a variety of errors for damaged files
            raise ModelLoadError(f"could not read the tokenizer of GGUF file {path}: {e}") from e
    return gguf_tokenizer(path)


class _Http:
    """HTTP to an OpenAI-compatible server: retries (a failure to connect, 408/409/5xx; a full queue, 429)
    and the server's errors as ragspec's (``PromptTooLongError``, ``GeneratorBusyError``, ``RemoteGenerationError``)."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float, busy_timeout_s: float, max_retries: int) -> None:
        self.base_url, self.busy_timeout_s, self.max_retries = base_url, busy_timeout_s, max_retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            headers=headers, timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)), follow_redirects=False
        )

    def send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        """``request``'s response, sent again after a failure to connect or a 408/409/5xx, up to ``max_retries`` times."""
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                response = self._client.send(request, stream=stream)
            except httpx.TransportError as e:
                if last:
                    raise RemoteGenerationError(
                        f"could not reach the generator at {self.base_url}: {_describe_error(e)}"
                        + (f" (tried {attempt + 1} times)" if attempt else "")
                    ) from e
                time.sleep(_backoff(attempt, None))
                continue
            except httpx.HTTPError as e:
                raise RemoteGenerationError(f"could not reach the generator at {self.base_url}: {_describe_error(e)}") from e
            if last or not (response.status_code in (408, 409) or response.status_code >= 500):
                return response
            try:
                response.read()
            finally:
                response.close()
            time.sleep(_backoff(attempt, response))
        raise AssertionError("unreachable")  # pragma: no cover - the last attempt returns or raises

    def open_stream(self, body: dict[str, Any]) -> Any:
        """The streamed response of ``POST /completions``, retrying a full queue (429) up to ``busy_timeout_s``."""
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            request = self._client.build_request("POST", f"{self.base_url}/completions", json=body)
            response = self.send(request, stream=True)
            if response.status_code == 200:
                return _Closing(response)
            try:
                response.read()
            finally:
                response.close()
            if response.status_code == 429:
                wait = _retry_after(response)
                if time.monotonic() + wait < deadline:
                    time.sleep(wait)
                    continue
                raise GeneratorBusyError(
                    f"the generator at {self.base_url} stayed busy for {self.busy_timeout_s:g} s: {_error_message(_json(response))}"
                )
            self.raise_for(response)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self.send(self._client.build_request(method, f"{self.base_url}{path}", **kwargs))
        if response.status_code != 200:
            self.raise_for(response)
        return response

    def raise_for(self, response: httpx.Response) -> None:
        body = _json(response)
        message = _error_message(body) or response.reason_phrase
        status = response.status_code
        code = body.get("error", {}).get("code") if isinstance(body.get("error"), dict) else None
        if code == "context_length_exceeded":
            raise PromptTooLongError(f"{self.base_url}: {message}")
        if status == 503:
            raise GeneratorBusyError(f"the generator at {self.base_url} is busy: {message}")
        hint = ""
        if status == 401:
            hint = f" (set the key with api_key=, --generator-api-key or {API_KEY_ENV})"
        elif status == 404:
            hint = " (check the URL and the model name: GET /v1/models lists what the server serves)"
        raise RemoteGenerationError(f"the generator at {self.base_url} answered {status}: {message}{hint}", status)

    def close(self) -> None:
        self._client.close()


class RemoteGenerator(TextGenerator):
    """Decoding on an OpenAI-compatible server, called like a local ``SpeculativeGenerator``.

    ``model`` is the name the server knows the model by ("": the first it lists at
    ``GET /v1/models``). ``tokenizer`` names the same model's tokenizer for the local prompt
    (default: ``model``; ``"default"`` for ragspec's embedded model). ``context_length`` defaults
    to what the server lists (vLLM's and ragspec's ``max_model_len``, llama.cpp's ``n_ctx_train``),
    else the tokenizer's ``model_max_length``, else ``FALLBACK_CONTEXT``. Safe to share between
    threads: each call is its own HTTP request, and the server queues them.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str = "",
        api_key: str | None = None,
        tokenizer: str | None = None,
        context_length: int | None = None,
        prompt_format: str = "tokens",
        timeout_s: float = 300.0,
        busy_timeout_s: float = 300.0,
        max_retries: int = 2,
        config: GenerationConfig | None = None,
    ) -> None:
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format must be one of {', '.join(PROMPT_FORMATS)}, got {prompt_format!r}")
        if context_length is not None and context_length < 2:
            raise ValueError(f"context_length must be >= 2, got {context_length}")
        for name, value in (("timeout_s", timeout_s), ("busy_timeout_s", busy_timeout_s)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be a whole number >= 0, got {max_retries!r}")
        self.base_url = api_base(base_url)
        self.http = _Http(self.base_url, api_key, timeout_s, busy_timeout_s, max_retries)
        self.model = model
        self.prompt_format = prompt_format
        self.config = config if config is not None else GenerationConfig()
        """Defaults of every call; per-call options merge into it."""
        self._tokenizer_name = tokenizer
        self._context_length = context_length
        self._info: _Served | None = None
        self._info_lock = threading.Lock()

    @property
    def busy_timeout_s(self) -> float:
        """How long a request waits out a full queue (429) before ``GeneratorBusyError``."""
        return self.http.busy_timeout_s

    def __repr__(self) -> str:
        return f"RemoteGenerator({self.base_url!r}, model={self.model!r})"

    # -- the model --------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        """The served model's name (like ``tokenizer`` and ``context_length``, asked of the server on first use)."""
        return self._served().name

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._served().tokenizer

    @property
    def context_length(self) -> int:
        return self._served().context_length

    def _served(self) -> _Served:
        if self._info is None:
            with self._info_lock:
                if self._info is None:
                    self._info = self._describe()
        return self._info

    def models(self) -> list[dict[str, Any]]:
        """The server's ``GET /v1/models`` entries."""
        response = self.http.request("GET", "/models")
        try:
            body = response.json()
        except ValueError:  # not JSON (an HTML page, a proxy's error)
            body = None
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise RemoteGenerationError(f"{self.base_url}/models did not answer with an OpenAI model list")
        return [m for m in data if isinstance(m, dict)]

    def _describe(self) -> _Served:
        try:
            listed = self.models()
        except RemoteGenerationError as e:
            if not self.model or e.status != 404:  # unreachable, refused, or nothing to fall back on
                raise
            listed = []  # a server without /models; the caller named the model
        entry = next((m for m in listed if m.get("id") == self.model), None)
        if not self.model:
            if not listed:
                raise RemoteGenerationError(f"{self.base_url}/models lists no model: pass model= (--generator-model)")
            entry = listed[0]
            self.model = str(entry.get("id"))
        tokenizer = load_tokenizer(self._tokenizer_name or self.model)
        context = self._context_length or _listed_context(entry) or _tokenizer_context(tokenizer) or FALLBACK_CONTEXT
        owner = entry.get("owned_by") if entry is not None else None
        server = owner if owner in ("ragspec", "vllm") else "openai"
        return _Served(name=self.model, tokenizer=tokenizer, context_length=context, server=server)

    def encode(self, text: str | Sequence[int], *, special_tokens: bool) -> list[int]:
        """Token ids of ``text`` by the model's tokenizer; ids pass through."""
        if isinstance(text, str):
            return list(self.tokenizer.encode(clean_text(text), add_special_tokens=special_tokens))
        return [int(t) for t in text]

    # -- calls ------------------------------------------------------------------------------------
    def _start(
        self, prompt: str | Sequence[int], config: GenerationConfig, references: Sequence[str | Sequence[int]]
    ) -> GenerationStream:
        """The stream of one request: its deltas as the server sends them (the request is sent on the first ``next``)."""
        info = self._served()
        constrained = _constraint_fields(config, info.server)
        prompt_ids = self._prompt_ids(prompt)
        budget = min(config.max_tokens, info.context_length - len(prompt_ids))
        body: dict[str, Any] = {
            "model": info.name,
            "prompt": prompt_ids if self.prompt_format == "tokens" else info.tokenizer.decode(prompt_ids),
            "max_tokens": budget,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if config.stop:
            body["stop"] = list(config.stop)
        if config.seed is not None:
            body["seed"] = config.seed
        if config.top_k:
            body["top_k"] = config.top_k  # vLLM, llama.cpp and ragspec take it; others ignore it
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(config, name):
                body[name] = getattr(config, name)
        if config.repeat_penalty != 1:  # llama.cpp's and ragspec's names (llama.cpp's window also holds the prompt)
            body["repeat_penalty"], body["repeat_last_n"] = config.repeat_penalty, config.repeat_last_n
        body.update(constrained)
        if info.server in ("vllm", "ragspec"):  # their prefix caches are salted per user (ragspec.engine.tenancy)
            body["cache_salt"] = scope_salt(current_cache_scope())
        if info.server == "vllm":
            body["return_token_ids"] = True  # the answer's own ids, not the text encoded again here
            if config.speculation.limit is not None:  # to ragspec's proposer, in the request's sampling params
                body["vllm_xargs"] = {VLLM_MAX_DRAFT_ARG: config.speculation.limit}
        if info.server == "ragspec":  # extensions only where they are understood
            if references:
                body["references"] = [r if isinstance(r, str) else [int(t) for t in r] for r in references]
            if config.speculation.as_dict():
                body["speculation"] = config.speculation.as_dict()
            if config.repetition_stop:
                body["repetition_stop"] = config.repetition_stop
        stats = GenerationStats(prompt_tokens=len(prompt_ids))
        cancel = threading.Event()
        return GenerationStream(self._run(body, config, stats, cancel), stats, cancel)

    # -- HTTP -------------------------------------------------------------------------------------
    def _run(
        self, body: dict[str, Any], config: GenerationConfig, stats: GenerationStats, cancel: threading.Event
    ) -> StepGenerator[str, None, GenerationResult]:
        """The request's deltas; ``cancel`` (``GenerationStream.cancel``) is checked at each event."""
        start = time.perf_counter()
        text, finish, remote_finish = "", None, None
        server_ids: list[int] = []  # vLLM's own ids of the answer, when it sends them
        stop_reason: tuple[object] | None = None  # vLLM's stop_reason, when the server sends one
        # vLLM has no repetition stop: it is applied here, on the ids vLLM streams (see ``_repeat_cut``).
        repeats = StopTextAssembler(self.tokenizer, (), config.repetition_stop) if _cuts_repeats(config, self._served().server) else None
        if body["max_tokens"] > 0:
            with self.http.open_stream(body) as response:
                for event in _sse_events(response):
                    check_cancelled(cancel)
                    if "error" in event:
                        raise RemoteGenerationError(f"{self.base_url} stopped the answer: {_error_message(event)}")
                    for choice in event.get("choices") or ():
                        new_ids = [int(t) for t in choice.get("token_ids") or ()]
                        server_ids += new_ids
                        delta = choice.get("text") or ""
                        if choice.get("finish_reason"):
                            finish = choice["finish_reason"]
                            if "stop_reason" in choice:  # vLLM: the stop string, a stop token id, or None (EOS)
                                stop_reason = (choice["stop_reason"],)
                        if repeats is not None:
                            update = repeats.add(new_ids)
                            delta = update.delta + (repeats.flush() if finish and not update.stopped else "")
                            if update.stopped:
                                finish, remote_finish = "stop", "repetition"
                        if delta:
                            text += delta
                            stats.wall_s = time.perf_counter() - start
                            if not stats.ttft_s:
                                stats.ttft_s = stats.wall_s
                            yield delta
                        if remote_finish == "repetition":
                            break
                    if remote_finish == "repetition":
                        break  # leaving the stream closes it, which ends the request in vLLM
                    if isinstance(event.get("usage"), dict):
                        usage = event["usage"]
                        stats.prompt_tokens = int(usage.get("prompt_tokens") or stats.prompt_tokens)
                        stats.new_tokens = int(usage.get("completion_tokens") or 0)
                    if isinstance(event.get("ragspec"), dict):
                        remote_finish = _apply_ragspec_stats(stats, event["ragspec"])
                    if isinstance(event.get("metrics"), dict):  # vLLM's per-request metrics (and ragspec's)
                        _apply_spec_metrics(stats, event["metrics"].get("speculative_decoding"))
            if finish is None:  # a server always ends with one; the connection closed before it
                raise RemoteGenerationError(
                    f"the answer from {self.base_url} ended without a finish_reason after {len(text)} characters: "
                    "the server stopped or the connection was closed mid-answer"
                )
        if repeats is not None and remote_finish == "repetition":
            text, ids = repeats.text, repeats.ids
            stats.new_tokens = len(server_ids)  # generated, including the repeat that was cut
        elif server_ids:  # vLLM's ids end with the EOS token when it stopped there; ragspec's results leave it out
            eos = self.tokenizer.eos_token_id
            ended_by_eos = finish == "stop" and stop_reason in (None, (None,)) and server_ids[-1] == eos
            ids = server_ids[:-1] if ended_by_eos else server_ids
        else:
            ids = self.encode(text, special_tokens=False) if text else []
        if not stats.new_tokens:
            stats.new_tokens = len(ids)
        stats.wall_s = time.perf_counter() - start
        if not stats.ttft_s:
            stats.ttft_s = stats.wall_s
        return GenerationResult(text, ids, _finish_reason(finish or "length", remote_finish, stop_reason, config), stats,
                                self.model_name)

    def close(self) -> None:
        """Close the HTTP connections (a later call opens new ones)."""
        self.http.close()


def _cuts_repeats(config: GenerationConfig, server: str) -> bool:
    """Whether ``config.repetition_stop`` is applied here: a ragspec server applies it itself,
    vLLM has none but streams the answer's ids (``return_token_ids``), so it is applied to those
    and the stream is closed where the answer starts repeating, which ends the request there.
    Other servers send text only; there the option has no effect (README, "Answers that end")."""
    return bool(config.repetition_stop) and server == "vllm"


@dataclass(frozen=True)
class RemoteModel:
    """A model on an OpenAI-compatible server, with the defaults of its calls: a ``GenerationSource``.

    ``DocumentQA(retriever, llm=RemoteModel("http://gpu-box:8000/v1", model="Qwen/Qwen2.5-7B-Instruct"))``
    answers with the same retrieval, prompts and citations as with a local model. ``api_key``
    defaults to the ``RAGSPEC_GENERATOR_API_KEY`` environment variable. See ``RemoteGenerator``
    for the other fields.
    """

    base_url: str
    model: str = ""
    """The server's name for the model; "" is the first one it lists."""
    api_key: str | None = field(default=None, repr=False)
    tokenizer: str | None = None
    context_length: int | None = None
    prompt_format: str = "tokens"
    timeout_s: float = 300.0
    busy_timeout_s: float = 300.0
    max_retries: int = 2
    config: GenerationConfig = field(default_factory=GenerationConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", api_base(self.base_url))
        if self.api_key is None and os.environ.get(API_KEY_ENV):
            object.__setattr__(self, "api_key", os.environ[API_KEY_ENV])
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format must be one of {', '.join(PROMPT_FORMATS)}, got {self.prompt_format!r}")

    def load(self, model: str | None = None) -> RemoteGenerator:
        """The generator for ``model`` (default: this object's), shared by equal settings."""
        settings = replace(self, model=model) if model and model != self.model else self
        with _generators_lock:
            generator = _generators.get(settings)
            if generator is None:
                generator = _generators[settings] = RemoteGenerator(
                    settings.base_url,
                    model=settings.model,
                    api_key=settings.api_key,
                    tokenizer=settings.tokenizer,
                    context_length=settings.context_length,
                    prompt_format=settings.prompt_format,
                    timeout_s=settings.timeout_s,
                    busy_timeout_s=settings.busy_timeout_s,
                    max_retries=settings.max_retries,
                    config=settings.config,
                )
            return generator

    def call_options(self, stop: Sequence[str] | None = None, options: Mapping[str, Any] | None = None) -> CallOptions:
        """These defaults with ``options`` (generation options, ``model=``) merged in; ``stop`` is added."""
        return call_options(self.model, self.config, stop, options)


_generators: dict[RemoteModel, RemoteGenerator] = {}
_generators_lock = threading.Lock()


# -- helpers ----------------------------------------------------------------------------------------


class _Closing:
    """A streamed httpx response as a context manager that always closes it."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response

    def __enter__(self) -> httpx.Response:
        return self.response

    def __exit__(self, *exc: object) -> None:
        self.response.close()


def _sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON payloads of a server-sent event stream, up to ``data: [DONE]``."""
    data: list[str] = []
    try:
        for line in response.iter_lines():
            if line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
            elif line == "" and data:
                payload, data = "\n".join(data), []
                if payload == "[DONE]":
                    return
                try:
                    event = json.loads(payload)
                except json.JSONDecodeError as e:
                    raise RemoteGenerationError(f"the generator sent an event that is not JSON: {payload[:200]!r}") from e
                if isinstance(event, dict):
                    yield event
    except httpx.HTTPError as e:
        raise RemoteGenerationError(f"the connection to the generator broke off: {_describe_error(e)}") from e
    if data and "\n".join(data) != "[DONE]":  # a last event without its blank line
        try:
            event = json.loads("\n".join(data))
        except json.JSONDecodeError as e:
            raise RemoteGenerationError(f"the generator's last event is not JSON (cut off?): {data[-1][:200]!r}") from e
        if isinstance(event, dict):
            yield event


def _constraint_fields(config: GenerationConfig, server: str) -> dict[str, Any]:
    """The request fields that carry ``config.constraint`` to ``server``: JSON as OpenAI's
    ``response_format`` (ragspec and vLLM constrain completions with it); to vLLM, a Lark grammar
    (the tool-call format of ``ragspec.engine.tool_calls`` is one) or a regex as its own
    ``structured_outputs`` (vLLM hands a grammar with llguidance's ``%json`` to its llguidance
    back end). Anything else is a ``ConstraintError``: the server has no way to take it."""
    from ragspec.engine.constraints import ConstraintError

    constraint = config.constraint
    if constraint is None:
        return {}
    if constraint.kind == "json":
        return {"response_format": {"type": "json_object"}}
    if constraint.kind == "json_schema":
        schema = json.loads(constraint.source)
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}}
    if server == "vllm" and constraint.kind in ("lark", "regex"):
        return {"structured_outputs": {"grammar" if constraint.kind == "lark" else "regex": constraint.source}}
    raise ConstraintError(
        f"a {constraint.kind} constraint cannot be sent to this generator: its OpenAI API carries JSON Schemas "
        "(response_format) only (vLLM also takes grammars and regexes); use a JSON Schema, or generate locally"
    )


def _apply_ragspec_stats(stats: GenerationStats, remote: Mapping[str, Any]) -> str | None:
    """Copy a ragspec server's speculative statistics into ``stats``; returns its finish reason."""
    for name in ("cached_prompt_tokens", "forward_passes", "decoded_tokens", "drafted_tokens", "accepted_tokens"):
        value = remote.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            setattr(stats, name, value)
    draft_s = remote.get("draft_s")
    if isinstance(draft_s, (int, float)):
        stats.draft_s = float(draft_s)
    by_source = remote.get("by_source")
    if isinstance(by_source, dict):
        stats.by_source = {
            str(name): SourceStats(
                int(s.get("drafted", 0)), int(s.get("accepted", 0)), int(s.get("verify_steps", 0))
            )
            for name, s in by_source.items()
            if isinstance(s, dict)
        }
    finish = remote.get("finish_reason")
    return finish if finish in ("stop", "eos", "length") else None


def _apply_spec_metrics(stats: GenerationStats, metrics: object) -> None:
    """Copy a server's per-request drafting figures (vLLM's ``metrics.speculative_decoding``) into
    ``stats``; anything not in that shape is ignored, so ``stats`` then has no drafting figures."""
    if not isinstance(metrics, dict):
        return
    hist, drafted = metrics.get("acceptance_histogram"), metrics.get("num_draft_tokens")
    if not (isinstance(hist, list) and hist and all(_is_count(c) for c in hist) and _is_count(drafted)):
        return
    stats.acceptance_histogram = [int(c) for c in hist]
    stats.drafted_tokens = int(drafted)  # type: ignore[arg-type]
    stats.accepted_tokens = sum(j * int(c) for j, c in enumerate(hist))


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _finish_reason(
    finish: str, remote_finish: str | None, stop_reason: tuple[object] | None, config: GenerationConfig
) -> str:
    """The local generator's finish reason (``stop``, ``eos``, ``length``) from what the server said.

    OpenAI's ``"stop"`` covers both a stop string and the end-of-sequence token. A ragspec server
    says which; vLLM's ``stop_reason`` is the stop string that matched (else EOS); with other
    servers a ``"stop"`` counts as a stop string when the request had any.
    """
    if remote_finish is not None:
        return remote_finish
    if finish == "length":
        return "length"
    if stop_reason is not None:
        return "stop" if isinstance(stop_reason[0], str) else "eos"
    return "stop" if config.stop else "eos"


def _listed_context(entry: Mapping[str, Any] | None) -> int | None:
    if entry is None:
        return None
    for value in (entry.get("max_model_len"), entry.get("context_length"), (entry.get("meta") or {}).get("n_ctx_train")):
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return value
    return None


def _tokenizer_context(tokenizer: PreTrainedTokenizerBase) -> int | None:
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 1 < value < 10**7 else None


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, httpx.ResponseNotRead):
        return {}
    return body if isinstance(body, dict) else {}


def _error_message(body: Mapping[str, Any]) -> str:
    """The message of an OpenAI error object (``{"error": {"message": ...}}``), or of a plain one."""
    error = body.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or "")[:500]
    if isinstance(error, str):
        return error[:500]
    detail = body.get("detail")
    return str(detail)[:500] if detail else ""


def _backoff(attempt: int, response: httpx.Response | None) -> float:
    """Seconds before retry ``attempt + 1``: the server's ``Retry-After`` when it sent one, else 0.5 s doubling, at most 8 s."""
    if response is not None and response.headers.get("retry-after"):
        return _retry_after(response)
    return min(0.5 * 2**attempt, 8.0)


def _retry_after(response: httpx.Response) -> float:
    value = response.headers.get("retry-after", "")
    try:
        return min(max(float(value), 0.1), 60.0)
    except ValueError:
        return 1.0


def _describe_error(e: httpx.HTTPError) -> str:
    """An httpx error in words, without the request's headers (the API key)."""
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
