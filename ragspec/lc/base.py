"""Settings and call handling shared by ``RagSpecLLM`` and ``ChatRagSpec``.

Per-call options (keyword arguments of ``invoke``/``stream``/``batch``/``ainvoke``/``astream``,
or of ``.bind(...)``):

- ``references``: passages for the drafter, each its own reference (``str``, ``Document`` or token
  ids). Without them the prompt is the reference: the generator always indexes the prompt, so a
  ``retriever | format | prompt | llm`` chain is sped up with no extra code.
- ``model``, ``max_tokens``, ``temperature``, ``top_k``, ``top_p``, ``seed``, ``speculation``:
  override the field of the same name for one call.
- ``response_format``: the answer must match a JSON Schema, JSON or a grammar (constrained
  decoding; see ``ragspec.lc.tools``). ``ChatRagSpec`` also takes ``tools`` and ``tool_choice``
  (``bind_tools``).

``stop`` given at call time is added to the ``stop`` field; generation ends before the first of
them, streamed or not.

Construction is strict: an unknown or misspelt field is an error that names it (and the field it
probably meant). There is no ``model_kwargs``: every generation setting is a typed field above,
validated when the object is built, and the decoding loop takes nothing else.

Both models are serializable the LangChain way (``dumpd``/``dumps``, ``load``/``loads``): the
fields are the constructor arguments, except ``generator`` (a live object), which is left out.
Loading needs ``valid_namespaces=["ragspec"]`` and an allowlist that names the ragspec classes;
see ``load_options``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

from langchain_core.documents import Document
from langchain_core.messages.ai import UsageMetadata
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from ragspec import registry
from ragspec.backends import check_backend
from ragspec.engine.config import (
    CallOptions,
    GenerationConfig,
    Speculation,
    call_options,
    speculation_setting,
)
from retrievers.extras import require

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from ragspec.chat_request import ChatRequest
    from ragspec.decoding.generator import SpeculativeGenerator
    from ragspec.engine.results import GenerationResult, TextGenerator
    from ragspec.remote import RemoteModel

Reference = Union[str, Document, Sequence[int]]
"""A passage for the drafter: text, a LangChain ``Document`` or token ids."""

_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
_DTYPES = ("auto", "bf16-prompts", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
_PENALTIES = ("frequency_penalty", "presence_penalty", "repeat_penalty", "repeat_last_n", "repetition_stop")
CALL_OPTIONS = ("references", "model", "max_tokens", "temperature", "top_k", "top_p", "seed", *_PENALTIES, "speculation",
                "response_format")  # fmt: skip
_GENERATION_FIELDS = ("max_tokens", "temperature", "top_k", "top_p", "seed", *_PENALTIES, "stop", "speculation", "max_draft")
_DEFAULT = GenerationConfig()
"""The generation fields' defaults are ``GenerationConfig``'s (written once, there)."""
LC_NAMESPACE = ["ragspec", "lc"]
"""Where ``dumpd`` records the ragspec classes: ``["ragspec", "lc", "ChatRagSpec"]``."""
_LC_CLASSES = ("ChatRagSpec", "RagSpecLLM")


def load_options() -> dict[str, Any]:
    """Keyword arguments for ``langchain_core.load.load``/``loads`` that revive ragspec models.

    langchain-core only revives classes on an allowlist; its ``"core"`` and ``"all"`` lists name
    langchain-core's classes and the partner packages it knows, not ragspec. This keeps the
    ``"core"`` list (prompts, parsers, runnables, messages) and adds the two ragspec models::

        chain = loads(dumps(prompt | ChatRagSpec()), **load_options())

    Only load what you serialized yourself: loading builds objects. No secrets are involved.
    """
    paths = {(*LC_NAMESPACE, name): (*LC_NAMESPACE, name) for name in _LC_CLASSES}
    return {"valid_namespaces": LC_NAMESPACE[:1], "allowed_objects": "core", "additional_import_mappings": paths}


def to_reference(ref: object) -> str | list[int]:
    """One reference as the generator takes it: text or token ids."""
    if isinstance(ref, Document):
        return ref.page_content
    if isinstance(ref, str):
        return ref
    if isinstance(ref, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in ref):
        return list(ref)
    raise ValueError(
        f"a reference must be a str, a langchain Document or a list of token ids, got {type(ref).__name__}"
    )


def usage(result: GenerationResult) -> UsageMetadata:
    """LangChain's token usage of one generation."""
    s = result.stats
    return UsageMetadata(
        input_tokens=s.prompt_tokens, output_tokens=s.new_tokens, total_tokens=s.prompt_tokens + s.new_tokens
    )


def response_metadata(result: GenerationResult) -> dict[str, Any]:
    """``response_metadata`` / ``generation_info`` of one generation."""
    return {"model_name": result.model, "finish_reason": result.finish_reason, "speculative": result.stats.as_dict()}


class LangChainModel:
    """What the LLM and the chat model answer alike to LangChain (a mixin, before LangChain's base class):
    serializable under ``LC_NAMESPACE``, token ids by the model's own tokenizer."""

    @classmethod
    def is_lc_serializable(cls) -> bool:
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        return list(LC_NAMESPACE)

    def get_token_ids(self: RagSpecParams, text: str) -> list[int]:  # type: ignore[misc]  # a mixin of RagSpecParams' classes
        """Token ids of ``text`` by the model's own tokenizer (loads the model on first use)."""
        return self.model_token_ids(text)


class RagSpecParams(BaseModel):
    """Fields and call handling shared by the LLM and the chat model (a mixin)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model: str = Field(default="default", validation_alias=AliasChoices("model", "model_name"))
    """Target model: ``"default"`` (the embedded SmolLM2-135M-Instruct), a local model directory, a ``.gguf`` file, or a Hugging Face id available offline (``model_name=`` is the same, as in ChatOpenAI)."""
    speculation: Union[bool, dict[str, Any], Speculation] = True
    """Draft tokens from the references and verify them in one forward; ``False`` (or ``{"enabled": False}``) decodes one token per forward (same output, slower), ``{"max_draft": 4}`` caps the drafted tokens per step."""
    max_draft: int = Field(default=16, ge=1, le=256)
    """Most tokens proposed per verify step (the adaptive policy often proposes fewer)."""
    max_tokens: int = _DEFAULT.max_tokens
    """Most new tokens per answer (at least 1)."""
    temperature: float = _DEFAULT.temperature
    """Sampling temperature; 0 is greedy decoding."""
    top_k: int = _DEFAULT.top_k
    """Sample only among the k most likely tokens; 0 keeps every token."""
    top_p: float = _DEFAULT.top_p
    """Sample only from the smallest set of tokens whose probability reaches top_p; 1 keeps every token."""
    seed: int | None = _DEFAULT.seed
    """Seed for sampling; None draws a fresh one (drafts change which random numbers are used, so only the same drafts repeat a sample)."""
    frequency_penalty: float = _DEFAULT.frequency_penalty
    """Lowers a token's logit by this for each time it occurs in the answer so far (-2 to 2, as OpenAI); the passages are not counted."""
    presence_penalty: float = _DEFAULT.presence_penalty
    """Lowers a token's logit by this once it occurs in the answer so far (-2 to 2, as OpenAI)."""
    repeat_penalty: float = _DEFAULT.repeat_penalty
    """Divides the logit of a token among the last ``repeat_last_n`` answer tokens by this, as llama.cpp and Ollama do; 1 is off."""
    repeat_last_n: int = _DEFAULT.repeat_last_n
    """How many of the answer's latest tokens ``repeat_penalty`` looks at; -1: the whole answer, 0: off."""
    repetition_stop: int = _DEFAULT.repetition_stop
    """Once the answer repeats this many of its own tokens verbatim it ends where the repeat begins (finish reason ``"repetition"``); 0 is off."""
    stop: list[str] | None = None
    """Stop strings: the answer ends before the first one (call-time ``stop`` is added to these)."""
    device: str = "auto"
    """``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``."""
    dtype: str = "auto"
    """``"auto"`` (bf16 on CUDA; on a CPU ``"bf16-prompts"``), ``"bf16-prompts"`` (fp32 with prompts in bf16 where
    the CPU has AMX or AVX512-BF16, fp32 elsewhere), ``"float32"``, ``"bfloat16"`` or ``"float16"`` (on a CPU these
    two decode without drafts, to stay exact: ``LoadedModel.verify_matches_steps``)."""
    backend: str = "auto"
    """What runs the model: ``"torch"``, ``"llamacpp"`` (GGUF files, ``pip install 'ragspec[llamacpp]'``) or ``"auto"`` (llama.cpp for GGUF models on a CPU when installed)."""
    generator: Any = Field(default=None, exclude=True)
    """A ready ``SpeculativeGenerator`` to use instead of loading ``model`` (e.g. one with a custom drafter)."""
    base_url: str | None = None
    """An OpenAI-compatible server to generate on (vLLM, llama.cpp's server, Ollama, ``ragspec serve``) instead of loading ``model`` here; ``model`` is then the server's name for it (see ``ragspec.remote``)."""
    api_key: SecretStr | None = Field(default=None, exclude=True)
    """With ``base_url``: the server's API key (default: the ``RAGSPEC_GENERATOR_API_KEY`` environment variable); never serialized."""
    tokenizer: str | None = None
    """With ``base_url``: the served model's tokenizer, which builds the prompt here (default: ``model``; ``"default"`` for ragspec's embedded model)."""
    timeout: float | None = Field(default=None, gt=0)
    """With ``base_url``: seconds to wait for the server (to connect, and between two pieces of an answer); default 300."""
    max_retries: int | None = Field(default=None, ge=0)
    """With ``base_url``: how often a request that could not reach the server, or that it answered 408/409/5xx before any text, is sent again (backing off 0.5 s, 1 s, 2 s, ...); default 2."""

    @model_validator(mode="before")
    @classmethod
    def _v_known_fields(cls, data: Any) -> Any:
        """Unknown constructor arguments are an error that names them (pydantic's ``extra="forbid"``
        would too; this says which field was probably meant)."""
        if isinstance(data, Mapping) and (problems := _unknown_fields(cls, data)):
            raise ValueError(f"{cls.__name__}: " + "; ".join(problems))
        return data

    @model_validator(mode="after")
    def _v_generation(self) -> RagSpecParams:
        call_options(self.model, GenerationConfig(), None, self._generation_fields())  # GenerationConfig's rules, a request's
        return self

    @field_validator("device")
    @classmethod
    def _v_device(cls, v: str) -> str:
        if not _DEVICE.match(v):
            raise ValueError(f"unknown device {v!r}: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
        return v

    @field_validator("dtype")
    @classmethod
    def _v_dtype(cls, v: str) -> str:
        if v not in _DTYPES:
            raise ValueError(f"unknown dtype {v!r}: use one of {', '.join(_DTYPES)}")
        return v

    @field_validator("backend")
    @classmethod
    def _v_backend(cls, v: str) -> str:
        if check_backend(v) == "llamacpp":
            require("llamacpp", "backend='llamacpp'")  # now, not when the model loads
        return v

    @model_validator(mode="after")
    def _v_generator(self) -> RagSpecParams:
        if self.generator is not None:
            from ragspec.decoding.generator import SpeculativeGenerator

            if not isinstance(self.generator, SpeculativeGenerator):
                raise ValueError(
                    f"generator must be a ragspec SpeculativeGenerator, got {type(self.generator).__name__}; "
                    "to pick a model by name, pass model=... instead"
                )
        if self.base_url is not None:
            from ragspec.remote import api_base

            if self.generator is not None:
                raise ValueError("pass either base_url (a remote generator) or generator (a local one), not both")
            api_base(self.base_url)  # a clear error for an address that is not http(s)://host[:port][/path]
        else:
            remote_only = [name for name in ("timeout", "max_retries") if getattr(self, name) is not None]
            if remote_only:
                raise ValueError(
                    f"{' and '.join(remote_only)} apply to a model on a server (base_url=...); a model loaded here "
                    "has no requests to time out or retry"
                )
        return self

    # -- loading --------------------------------------------------------------------------------
    def load(self, model: str | None = None) -> TextGenerator:
        """The generator for ``model`` (default: this object's), loaded on first use and shared.

        With ``base_url`` it is a ``RemoteGenerator`` on that server, called the same way.
        """
        if self.generator is not None and model in (None, self.model):
            return self.generator
        if self.base_url is not None:
            return self.remote_model().load(model or self.model)
        return registry.get_generator(model or self.model, self.device, self.dtype, self.max_draft, self.backend)

    def remote_model(self) -> RemoteModel:
        """``base_url``, ``model``, ``api_key`` and ``tokenizer`` as a ``ragspec.remote.RemoteModel``."""
        from ragspec.remote import RemoteModel

        if self.base_url is None:
            raise ValueError("remote_model() needs base_url")
        key = self.api_key.get_secret_value() if self.api_key is not None else None
        network = {"timeout_s": self.timeout, "max_retries": self.max_retries}
        return RemoteModel(self.base_url, model=self.model, api_key=key, tokenizer=self.tokenizer,
                           **{k: v for k, v in network.items() if v is not None})

    # -- tokens ---------------------------------------------------------------------------------
    def model_token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` by the model's own tokenizer (no special tokens added).

        Loads the model on first use (shared, as for a call); ``custom_get_token_ids`` wins when set.
        """
        custom = getattr(self, "custom_get_token_ids", None)
        if custom is not None:
            return list(custom(text))
        return self.load().encode(text, special_tokens=False)

    @property
    def model_name(self) -> str:
        """Name reported in metadata: the injected generator's model name, else ``model``."""
        return self.generator.model_name if self.generator is not None else self.model

    # -- calls ----------------------------------------------------------------------------------
    def _generation_fields(self) -> dict[str, Any]:
        names = [name for name in _GENERATION_FIELDS if name != "max_draft"]
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def generation_config(self) -> GenerationConfig:
        """The fields as a validated ``GenerationConfig``."""
        return GenerationConfig(**self._generation_fields())

    def call_options(self, stop: Sequence[str] | None, kwargs: Mapping[str, Any]) -> CallOptions:
        """Merge fields with call-time options; unknown options are an error, not ignored.

        Call-time ``stop`` strings are added to the ``stop`` field's.
        """
        kwargs = {k: v for k, v in kwargs.items() if k != "stream"}  # LangChain's own streaming switch, already applied
        unknown = sorted(set(kwargs) - set(CALL_OPTIONS))
        if unknown:
            raise ValueError(
                f"{type(self).__name__} got unsupported option(s) {', '.join(unknown)}; "
                f"supported per call: stop, {', '.join(CALL_OPTIONS)}"
            )
        options = {k: v for k, v in kwargs.items() if k not in ("references", "response_format")}
        if kwargs.get("response_format") is not None:  # checked and compiled here, before any generation
            from ragspec.lc.tools import response_constraint

            options["constraint"] = response_constraint(kwargs["response_format"])
        call = call_options(self.model, self.generation_config(), stop, options)
        refs = kwargs.get("references") or ()
        if isinstance(refs, (str, Document)):
            refs = [refs]
        if not isinstance(refs, Sequence):
            raise ValueError(f"references must be a str, a Document or a list of them (or of token id lists), got {refs!r}")
        return CallOptions(call.model, call.config, tuple(to_reference(r) for r in refs))

    def events(self, model: str, build: Callable[[TextGenerator], ChatRequest]) -> Iterator[str | GenerationResult]:
        """Text deltas of one generation, then its ``GenerationResult``.

        ``build`` turns the loaded generator (of ``model``) into the request: a
        ``ragspec.chat_request.ChatRequest`` (the prompt as text or token ids, the config, the
        references). Closing this iterator early ends the generation.
        """
        generator = self.load(model)
        with build(generator).stream(generator) as stream:
            yield from stream
        assert stream.result is not None
        yield stream.result

    def ls_params(self, stop: Sequence[str] | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """LangSmith's standard parameters, honouring per-call overrides."""
        model = kwargs.get("model")
        temperature = kwargs.get("temperature", self.temperature)
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        params: dict[str, Any] = {
            "ls_provider": "ragspec",
            "ls_model_name": model if isinstance(model, str) else self.model_name,
        }
        if isinstance(temperature, (int, float)):
            params["ls_temperature"] = float(temperature)
        if isinstance(max_tokens, int):
            params["ls_max_tokens"] = max_tokens
        merged = [*(self.stop or []), *(stop or [])]
        if merged:
            params["ls_stop"] = merged
        return params

    @property
    def identifying_params(self) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "speculation": speculation_setting(self.speculation).as_dict(),
            "max_draft": self.max_draft,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": self.stop,
            "device": self.device,
            "dtype": self.dtype,
            "backend": self.backend,
            "base_url": self.base_url,
            "timeout": self.timeout,
            "max_retries": self.max_retries,
        }


def _unknown_fields(cls: type[BaseModel], data: Mapping[str, Any]) -> list[str]:
    """What is wrong with each argument of ``data`` that is none of ``cls``' fields (or their aliases)."""
    known = {name for name, f in cls.model_fields.items()} | {
        f.alias for f in cls.model_fields.values() if f.alias
    } | {choice for f in cls.model_fields.values() if isinstance(f.validation_alias, AliasChoices)
         for choice in f.validation_alias.choices if isinstance(choice, str)}
    problems = []
    for name in (k for k in data if k not in known):
        if name == "model_kwargs":
            problems.append(
                "model_kwargs is not supported: every generation setting is a field "
                f"({', '.join(_GENERATION_FIELDS)}), checked when the model is built; pass them directly "
                "(or per call, e.g. .bind(temperature=0.7))"
            )
            continue
        close = difflib.get_close_matches(str(name), sorted(known), n=1, cutoff=0.75)
        problems.append(f"unknown field {name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return problems
