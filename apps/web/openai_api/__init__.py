"""The OpenAI-compatible API of ``ragspec serve``: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``.

One module per job: ``parse`` (the body into an ``ApiRequest``), ``jobs`` (prepare: the prompt, config and
references as one ``ragspec.chat_request.ChatRequest``, the grammar compiled in the queue), ``routes`` (an
``APIRouter``; the queue ticket held in one ``async with``), ``render`` (whole responses and stream chunks),
``errors`` (OpenAI error objects).

Any OpenAI client (the ``openai`` package, LangChain's ``ChatOpenAI``, curl, editors, agents)
talks to the served model through these routes; docs/serving.md is the reference. In short:

- Requests map onto one ``GenerationConfig``: ``max_tokens`` / ``max_completion_tokens``,
  ``temperature`` (default 0, greedy: ragspec's default, not OpenAI's 1), ``top_p``, ``seed``,
  ``stop``, ``frequency_penalty``, ``presence_penalty``, and the extensions ``top_k``,
  ``repeat_penalty``, ``repeat_last_n`` (llama.cpp's names), ``repetition_stop``, ``speculation`` (``false``, ``{"enabled": false}`` or ``{"max_draft": 4}``) and ``references``
  (passages the drafter copies from: ``extra_body={"references": [...]}`` in the ``openai`` client), and
  vLLM's ``cache_salt``: only requests with the same salt reuse each other's prompt prefixes
  (``request_scope``; docs/threat-model.md).
  ``response_format`` (``json_object``, ``json_schema``) constrains the output with a grammar
  (``ragspec.engine.constraints``), on both routes. ``tools`` / ``tool_choice`` / ``parallel_tool_calls``
  list functions in the system turn and constrain the answer to well-formed calls with the same
  grammar as ``ChatRagSpec.bind_tools`` (``ragspec.engine.tool_calls``); calls come back as OpenAI's
  ``tool_calls`` (whole, and in stream deltas as each call completes), and ``tool`` messages and
  assistant ``tool_calls`` enter the conversation. ``retrieval`` (chat) answers the conversation over the
  server's documents as ``DocumentQA`` does (``apps.web.retrieval_api``). ``prediction`` (OpenAI's Predicted
  Outputs, ``{"type": "content", "content": ...}``) is drafted from as one more reference: the output is
  unchanged, and ``usage.completion_tokens_details`` counts the prediction's drafted tokens the model
  accepted and rejected (``prediction_details``). A bad value is a 400 naming the parameter; so is
  anything ragspec does not do yet (``n`` > 1, logprobs, ``logit_bias``, legacy ``functions``) and any
  argument OpenAI does not define.
- Every response has ``usage``, and a ``ragspec`` object beside the standard fields with the
  speculative statistics (tokens per forward, acceptance, by draft source), the finish reason in
  ragspec's terms (``eos``, ``stop``, ``length`` or ``repetition``) and the seconds spent in the queue;
  figures the engine did not measure are left out (behind vLLM: forwards, by source, draft time), never
  sent as zeros. A request that drafted also has vLLM's per-request ``metrics.speculative_decoding``
  (``GenerationStats.speculative_decoding``), from either engine. Streams (``stream: true``) send both
  in the chunk that carries the ``finish_reason``; with ``stream_options: {"include_usage": true}``
  one more chunk carries ``usage``.
- Errors are OpenAI error objects ``{"error": {"message", "type", "param", "code"}}`` with
  OpenAI's status codes, the security guard's own rejections included (``openai_error_body``).
- Generation goes through the app's one ``ModelQueue``, shared with the web page's questions: a
  full queue is a 429 with ``Retry-After``, a request that waited ``queue_timeout_s`` a 503 with
  ``Retry-After``, an answer longer than ``answer_timeout_s`` is cut (``finish_reason: "length"``,
  ``ragspec.finish_reason: "timeout"``), and a client that disconnects, streaming or not, stops
  its generation and frees the model at once.
"""

from __future__ import annotations

from apps.web.openai_api.errors import OpenAIError, error_object, generation_error, json_body, openai_error_body
from apps.web.openai_api.jobs import ApiSettings, Job, compile_constraint, prepare, request_constraint
from apps.web.openai_api.parse import ApiRequest, parse_request
from apps.web.openai_api.render import prediction_details
from apps.web.openai_api.routes import Source, add_openai_routes

__all__ = [
    "ApiRequest", "ApiSettings", "Job", "OpenAIError", "Source", "add_openai_routes", "compile_constraint", "error_object",
    "generation_error", "json_body", "openai_error_body", "parse_request", "prediction_details", "prepare",
    "request_constraint",
]  # fmt: skip
